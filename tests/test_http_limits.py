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
        with socket.create_connection(("127.0.0.1", port)) as first:  # a request being answered holds the place
            first.sendall(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10\r\n\r\n{")
            with socket.create_connection(("127.0.0.1", port)) as second:
                second.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                second.settimeout(30)
                answer = second.recv(1024)
                assert answer.startswith(b"HTTP/1.1 503") and b"\r\nretry-after: 1\r\n" in answer.lower()
                assert closed_by_server(second)


def test_no_503_within_the_cap_while_requests_are_in_flight():
    """Every place serves: with requests being answered on the others, the last connection within the cap
    is answered too (uvicorn's own check counted request tasks and refused it), the next one is not."""
    with running(connections=3, request_seconds=30) as port:
        busy = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
        try:
            for sock in busy:  # requests in flight: their bodies have not all arrived
                sock.sendall(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10\r\n\r\n{")
            with socket.create_connection(("127.0.0.1", port)) as last:
                last.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                last.settimeout(30)
                assert last.recv(1024).startswith(b"HTTP/1.1 200")
                last.sendall(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10\r\n\r\n{")  # busy too
                with socket.create_connection(("127.0.0.1", port)) as beyond:
                    beyond.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                    beyond.settimeout(30)
                    assert beyond.recv(1024).startswith(b"HTTP/1.1 503")
        finally:
            for sock in busy:
                sock.close()


def test_headers_over_the_limit_are_refused_even_in_one_write():
    """h11 bounds only a head that arrives in pieces; one write of a large head is refused too (431)."""
    with running() as port:
        for head in (b"X-Big: " + b"a" * 20000 + b"\r\n",
                     b"".join(b"X-H%d: %s\r\n" % (i, b"a" * 1000) for i in range(40))):
            with socket.create_connection(("127.0.0.1", port)) as big:
                big.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + head + b"\r\n")
                big.settimeout(30)
                assert big.recv(1024).startswith(b"HTTP/1.1 431"), head[:20]
                assert closed_by_server(big)
        with socket.create_connection(("127.0.0.1", port)) as small:  # a body of any size is not a header
            small.sendall(b"POST /health HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 30000\r\n\r\n" + b"x" * 30000)
            small.settimeout(30)
            assert not small.recv(1024).startswith(b"HTTP/1.1 431")


def test_silent_connections_cannot_hold_every_place():
    """At the cap, the oldest connection that has not sent a whole request makes room for a new one:
    sockets that say nothing cannot lock the owner out (issue 20)."""
    with running(connections=4, request_seconds=30) as port:
        silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(8)]
        try:
            with socket.create_connection(("127.0.0.1", port)) as owner:
                owner.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                owner.settimeout(30)
                assert owner.recv(1024).startswith(b"HTTP/1.1 200")
            assert closed_by_server(silent[0])  # the oldest silent one made room
        finally:
            for sock in silent:
                sock.close()
