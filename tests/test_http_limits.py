"""The built-in HTTP server's limits (http_transport.HTTP_LIMITS, applied by
http_transport.http_server, which serve_http uses): a half-sent request is closed, and connections
beyond the cap get 503."""
import socket
import threading
import time
from contextlib import contextmanager

import http_transport


async def app(scope, receive, send):
    """A plain ASGI app that reads the whole request before answering."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@contextmanager
def running(**limits):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    uvicorn_server = http_transport.http_server(app, "127.0.0.1", port, http_transport.HTTP_LIMITS | limits)
    thread = threading.Thread(target=uvicorn_server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uvicorn_server.started:  # readiness, not synchronisation
        assert thread.is_alive() and time.monotonic() < deadline
        time.sleep(0.02)
    try:
        yield port
    finally:
        uvicorn_server.should_exit = True
        thread.join(timeout=30)


def closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(30)
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True


def test_the_server_uses_the_limits():
    uvicorn_server = http_transport.http_server(app, "127.0.0.1", 1, http_transport.HTTP_LIMITS)
    config = uvicorn_server.config
    assert config.timeout_keep_alive == http_transport.HTTP_LIMITS["idle_seconds"]
    assert config.limit_concurrency == http_transport.HTTP_LIMITS["connections"]
    assert config.h11_max_incomplete_event_size == http_transport.HTTP_LIMITS["header_bytes"]
    assert config.http.__name__ == "TimedH11Protocol"


def test_a_half_sent_request_is_closed():
    with running(request_seconds=0.5) as port:
        headers = socket.create_connection(("127.0.0.1", port))
        headers.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # the headers never end
        body = socket.create_connection(("127.0.0.1", port))
        body.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{\"partial\":")
        silent = socket.create_connection(("127.0.0.1", port))  # connects and says nothing
        assert closed_by_server(headers) and closed_by_server(body) and closed_by_server(silent)
        with socket.create_connection(("127.0.0.1", port)) as whole:  # a whole request is answered
            whole.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            whole.settimeout(30)
            assert whole.recv(1024).startswith(b"HTTP/1.1 200")


def test_connections_beyond_the_cap_get_503():
    with running(connections=1, request_seconds=30) as port:
        with socket.create_connection(("127.0.0.1", port)) as first:
            first.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # holds the only place
            with socket.create_connection(("127.0.0.1", port)) as second:
                second.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                second.settimeout(30)
                assert second.recv(1024).startswith(b"HTTP/1.1 503")
