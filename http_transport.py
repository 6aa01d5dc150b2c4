"""The HTTP transport: Streamable HTTP at /mcp behind the credentials the guard accepts (the static
bearer token, named tokens, OAuth: auth/), with DNS-rebinding protection, /health, limits on slow
and idle connections, and a stop within 0.1 s of SIGTERM that lets the calls being answered finish.
server.py builds the MCP server; this serves it.
"""
from __future__ import annotations

import asyncio
import errno
import json
import socket
import sys
from typing import Any, Callable

import anyio
import uvicorn
from mcp.server.auth.middleware.auth_context import AuthContextMiddleware
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, BearerAuthBackend
from mcp.server.transport_security import TransportSecuritySettings
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse

import proxmox_client
from auth import principal
from config import Config
from errors import ToolFailure
from masking import mask


class Authenticated:
    """Pure ASGI middleware (SSE streams pass unbuffered) inside the SDK's bearer middleware, which
    has checked the credential (auth.verifier) and put the principal on the request: every HTTP
    request but the guard's public paths (GET /health, and with OAuth its metadata and endpoints)
    needs a credential it accepted. A refusal is 401; with OAuth it names the resource metadata
    (RFC 9728), without it names nothing, so that a static-token client is never sent looking."""

    def __init__(self, app: Any, guard: Any):
        self.app = app
        self.guard = guard

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or not self.guard.required or scope["path"] in self.guard.public or \
                isinstance(scope.get("user"), AuthenticatedUser):
            return await self.app(scope, receive, send)
        presented = b"authorization" in dict(scope.get("headers") or [])
        challenge = "Bearer" + (' error="invalid_token",' if presented else "")
        if self.guard.metadata_url:
            challenge += f' resource_metadata="{self.guard.metadata_url}"'
        detail = "send Authorization: Bearer <token>" + (" or authorize through OAuth (the resource metadata "
                                                         "names the authorization server)" if self.guard.metadata_url
                                                         else "")
        body = json.dumps({"error": "unauthorized", "detail": detail}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"),
                                (b"www-authenticate", challenge.rstrip(",").encode()),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def authenticating(app: Any, guard: Any) -> Any:
    """The SDK's bearer middleware (each credential checked by the guard's verifier, the principal kept
    for the request: mcp.server.auth), then Authenticated."""
    return AuthenticationMiddleware(AuthContextMiddleware(Authenticated(app, guard)),
                                    backend=BearerAuthBackend(guard.verifier))


class AllowedHostsHint:
    """ASGI middleware: the SDK's `421 Invalid Host header` (DNS-rebinding protection) names the
    Host the client used and the variable that allows it."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        host = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")[:200]
        body = json.dumps({"error": "invalid_host", "detail": f"this server does not answer to the name {host!r}; "
                           f"add it to MCP_ALLOWED_HOSTS (comma list) and restart"}).encode()
        refused = False

        async def hinted(message: dict) -> None:
            nonlocal refused
            if message["type"] == "http.response.start" and message["status"] == 421:
                refused = True
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() not in (b"content-length",
                                                                                               b"content-type")]
                message = message | {"headers": headers + [(b"content-type", b"application/json"),
                                                           (b"content-length", str(len(body)).encode())]}
            elif message["type"] == "http.response.body" and refused:
                message = {"type": "http.response.body", "body": body if message.get("more_body") is not True
                           else b"", "more_body": message.get("more_body", False)}
            await send(message)
        await self.app(scope, receive, hinted)


def http_app(config: Config, server, bind_host: str):
    from auth.guard import guard_for  # the OAuth parts (sqlite3 among them): loaded in HTTP mode only
    guard = guard_for(config)
    for route in guard.routes:  # with OAuth: its metadata and endpoints (auth/routes.py)
        server.custom_route(route.path, methods=sorted(route.methods or ()))(route.endpoint)

    @server.custom_route("/health", methods=["GET"])
    async def health(request: Request) -> JSONResponse:
        body: dict[str, Any] = {"status": "ok", "version": server.version}
        user = request.scope.get("user")
        if isinstance(user, AuthenticatedUser):  # host reachability only for a bearer holder, of its hosts
            reach = principal.reach_of(user.access_token)
            hosts = await anyio.to_thread.run_sync(host_reachability)
            body["hosts"] = {k: v for k, v in hosts.items() if reach is None or reach.reaches(k.split(":", 1)[1])}
        return JSONResponse(body)

    loopback_names = ["127.0.0.1", "localhost", "[::1]"]
    allowed = [f"{name}:*" for name in loopback_names] + loopback_names
    for name in config.allowed_hosts:
        allowed += [name] if ":" in name.strip("[]").split("]")[-1] else [name, f"{name}:*"]
    origins = [f"{scheme}://{name.split(':')[0] if not name.startswith('[') else name}:*"
               for scheme in ("http", "https") for name in loopback_names + config.allowed_hosts]
    origins += [f"{scheme}://{name}" for scheme in ("http", "https") for name in loopback_names + config.allowed_hosts]
    security = TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=allowed,
                                         allowed_origins=origins)
    app = server.streamable_http_app(streamable_http_path="/mcp", transport_security=security, host=bind_host)
    return authenticating(AllowedHostsHint(app), guard)


def host_reachability() -> dict[str, str]:
    result = {}
    for product in ("pve", "pbs"):
        for label in proxmox_client.configured(product):
            try:
                version = proxmox_client.client_for(product, label).get("/version") or {}
                result[f"{product}:{label}"] = f"ok {version.get('version', '')}".strip()
            except ToolFailure as exc:
                result[f"{product}:{label}"] = "unreachable: " + mask(str(exc))[:200]
    return result


# Limits of the built-in HTTP server (slow or half-sent requests, idle and too many connections):
# a request must arrive whole within `request_seconds` of its first byte (or of the connection),
# a kept-alive connection closes after `idle_seconds` without a request, at most `connections`
# are served at once (more get 503 with Retry-After), and a request's headers may take `header_bytes`
# (431 beyond, however they arrive). At the cap, the oldest connection that has not sent a request head makes
# room for a new one: sockets that say nothing (unauthenticated: the bearer is in the head) cannot
# hold every place.
HTTP_LIMITS = {"request_seconds": 10.0, "idle_seconds": 5, "connections": 64, "header_bytes": 16 * 1024}


def timed_protocol(request_seconds: float, header_bytes: int = HTTP_LIMITS["header_bytes"]) -> type:
    """uvicorn's h11 protocol with the limits of `Limited` (imported here: only HTTP mode loads it)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol
    return type("TimedH11Protocol", (Limited, H11Protocol), {"request_seconds": request_seconds,
                                                              "header_bytes": header_bytes})


class Limited:
    """Limits on top of uvicorn's h11 protocol: a connection whose request (headers and body) has not
    fully arrived `request_seconds` after it began is closed (uvicorn arms no timer before the first
    request); a request head over `header_bytes` is refused with 431 (h11 bounds only a head that
    arrives in pieces); at the connection cap, the oldest connection still waiting for a head makes
    room (make_room) when a request begins, and a request beyond it is answered 503 with Retry-After. Only connections
    count: uvicorn's own `limit_concurrency` check counts request tasks too (one still finishing after
    its answer was sent, a stream of notifications for as long as it is open) and answered 503 to 8-12 %
    of the calls of 50 clients under a cap of 64 (issue 31), so it is turned off on each connection."""
    request_seconds: float
    header_bytes: int
    retry_after = 1  # seconds, in the 503 beyond the cap
    _refused = False
    cap: int | None = None
    _request_timer: Any = None
    _head: bytearray | None = None  # the request head so far, while it has not ended
    _began = 0.0
    conn: Any
    loop: Any
    transport: Any

    def connection_made(self, transport: Any) -> None:
        self._began = self.loop.time()
        super().connection_made(transport)  # type: ignore[misc]
        self.cap, self.limit_concurrency = self.limit_concurrency, None  # uvicorn's check off: see above
        self._arm()

    def data_received(self, data: bytes) -> None:
        import h11
        if self._refused:
            return  # answered 503: what else it sends is not read
        if self.conn.their_state is h11.IDLE and self._head is None:  # a request begins: is there room?
            if not make_room(self, _waiting):
                self._refuse()
                return
        if self.conn.their_state is h11.IDLE and not self._head_begins(data):
            return
        super().data_received(data)  # type: ignore[misc]
        if self.conn.their_state not in (h11.IDLE, h11.SEND_BODY):
            self._disarm()  # the whole request arrived (or the connection is closing)

    def _head_begins(self, data: bytes) -> bool:
        """A request head arrives: the timer runs (the next request on a kept-alive connection
        begins), and a head over the limit is refused; False when it was."""
        if self._request_timer is None:
            self._arm()
        self._head = (self._head or bytearray()) + data[:self.header_bytes + 4]
        if head_within(self._head, self.header_bytes):
            if b"\r\n\r\n" in self._head:
                self._head = None  # the head ended: the next one starts afresh
            return True
        body = f"request headers exceed {self.header_bytes} bytes\n".encode()
        self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain\r\n"
                             b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        self.transport.close()
        return False

    def _refuse(self) -> None:
        """503 to a request beyond the cap, with when to try again; then this side of the connection ends
        (closing it at once with the request unread would reset it, and the client could lose the answer);
        the client closes it, or the request timer does."""
        self._refused = True
        if self.transport.is_closing():
            return
        body = f"too many connections ({self.cap}); try again in {self.retry_after} s\n".encode()
        self.transport.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\nretry-after: %d\r\n"
                             b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (self.retry_after, len(body), body))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        else:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)  # type: ignore[misc]

    def _arm(self) -> None:
        self._request_timer = self.loop.call_later(self.request_seconds, self._too_slow)

    def _disarm(self) -> None:
        if self._request_timer is not None:
            self._request_timer.cancel()
            self._request_timer = None

    def _too_slow(self) -> None:
        self._request_timer = None
        if not self.transport.is_closing():
            self.transport.close()


def _waiting(connection: Any) -> bool:
    import h11
    return connection.conn.their_state is h11.IDLE


def head_within(head: bytearray, limit: int) -> bool:
    """Whether a request head received so far (up to its blank line) is within `limit` bytes."""
    end = head.find(b"\r\n\r\n")
    return (end if end >= 0 else len(head)) <= limit


def make_room(newcomer: Any, waiting: Callable[[Any], bool]) -> bool:
    """Whether a request that begins on `newcomer` has a place: the connections serving a request
    (the others not `waiting` for a head) leave one within the cap. Beyond the cap, the oldest
    connections older than the newcomer that are waiting (silent, slow, or idle between requests) are
    closed until it is within it: sockets that say nothing cannot hold every place."""
    cap = newcomer.cap
    if cap is None:
        return True
    others = [c for c in newcomer.connections if c is not newcomer and not c.transport.is_closing()]
    if sum(1 for c in others if not waiting(c)) + 1 > cap:
        return False
    idle = sorted((c for c in others if waiting(c) and c._began <= newcomer._began), key=lambda c: c._began)
    for oldest in idle[:max(0, len(others) + 1 - cap)]:
        oldest.transport.close()
        newcomer.connections.discard(oldest)
    return True


def http_server(app: Any, bind_host: str, port: int, limits: dict = HTTP_LIMITS) -> Any:
    """The uvicorn server for `app`, with HTTP_LIMITS."""
    config = uvicorn.Config(app, host=bind_host.strip("[]"), port=port, log_level="warning",
                            http=timed_protocol(limits["request_seconds"], limits["header_bytes"]),
                            timeout_keep_alive=limits["idle_seconds"], limit_concurrency=limits["connections"],
                            h11_max_incomplete_event_size=limits["header_bytes"])
    return uvicorn.Server(config)


def serve_http(config: Config, server, bind_host: str, port: int) -> None:
    app = Answering(http_app(config, server, bind_host))
    http = http_server(app, bind_host, port)
    try:
        asyncio.run(serve_until_stopped(http, app))
    except asyncio.CancelledError:
        return  # stopped by SIGTERM or Ctrl-C
    if not http.started:  # as uvicorn.run: the application did not start (uvicorn logged why)
        sys.exit(3)


class Answering:
    """ASGI wrapper that counts the POSTs being answered (every MCP request is one; the GET
    stream of server notifications is not), so that a stop lets them finish."""

    def __init__(self, app: Any):
        self.app = app
        self.count = 0

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        counted = scope["type"] == "http" and scope["method"] == "POST"
        self.count += counted
        try:
            await self.app(scope, receive, send)
        finally:
            self.count -= counted


async def serve_until_stopped(http: Any, app: Answering) -> None:
    """Serve until SIGTERM (a container stop) or Ctrl-C, then stop at once: no new connections,
    the requests being answered finish (a tool call and its answer), the application closes its
    sessions (the lifespan shutdown uvicorn sends too), and the serving task is cancelled. A second
    signal skips the wait. uvicorn's own stop would notice the signal on its next 0.1 s tick and
    then sleep 0.1 s before closing anything: issue 17 asks for an exit within 0.1 s."""
    loop, serving = asyncio.get_running_loop(), asyncio.current_task()
    signals: list[int] = []
    stopping: list[asyncio.Task] = []  # a reference, so the task is not collected while it runs

    async def stop() -> None:
        for listener in getattr(http, "servers", []):
            listener.close()
        while app.count:
            await asyncio.sleep(0.01)
        if hasattr(http, "lifespan"):  # absent only while uvicorn is still starting
            await http.lifespan.shutdown()
        serving.cancel()

    def on_signal(number: int, _frame: Any) -> None:
        signals.append(number)
        if len(signals) > 1:  # asked twice: stop without waiting
            loop.call_soon_threadsafe(serving.cancel)
        else:
            loop.call_soon_threadsafe(lambda: stopping.append(loop.create_task(stop())))

    http.handle_exit = on_signal  # uvicorn installs it for SIGTERM and SIGINT while it serves
    await http.serve()


def listen_problem(bind_host: str, port: int, given: str) -> str | None:
    """The one line that stops an HTTP server whose address cannot be listened on (a port in use, an
    address not on this machine), said before anything claims to serve; None when it can listen.
    `given` names where the port came from (--port or MCP_HTTP_PORT). The probe binds as uvicorn
    does (SO_REUSEADDR), then lets go."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(bind_host.strip("[]"), port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return (f"proxmox-guard-mcp: port {port} on {bind_host} is in use (another server, or another "
                    f"proxmox-guard-mcp); choose a free one with {given}.")
        return (f"proxmox-guard-mcp: cannot listen on {bind_host}:{port} ({exc.strerror or exc}); set MCP_HTTP_HOST "
                f"(or --host) to an address of this machine, and {given} to a free port.")
    return None
