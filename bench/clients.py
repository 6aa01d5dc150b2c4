"""MCP clients made of the standard library, for bench/: newline-delimited JSON-RPC over a server
process's stdio, and Streamable HTTP over http.client. The measuring process holds no SDK, so
what it times is the server, not a client library."""
from __future__ import annotations

import http.client
import json
import subprocess
import time
from typing import Any
from urllib.parse import urlsplit

PROTOCOL = "2025-11-25"  # the initialize handshake today's clients speak
CLIENT_INFO = {"name": "bench", "version": "0"}


def _result(method: str, answer: dict) -> dict:
    if "error" in answer:
        raise RuntimeError(f"{method}: {answer['error']}")
    return answer["result"]


class StdioServer:
    """One server process spoken to over its stdin/stdout; `started` is when it was launched."""

    def __init__(self, command: list[str], env: dict[str, str] | None = None, cwd: str | None = None):
        # buffered pipes: an unbuffered one reads a line a byte at a time, which costs the
        # measuring side time in proportion to the answer's size
        self.started = time.perf_counter()
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, env=env, cwd=cwd)
        self.next_id = 0

    def send(self, message: dict) -> None:
        self.process.stdin.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
        self.process.stdin.flush()

    def request(self, method: str, params: dict | None = None) -> dict:
        """Send one request and return its result (notifications in between are skipped)."""
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params or {}})
        while True:
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError(f"the server closed its output while answering {method}")
            answer = json.loads(line)
            if answer.get("id") == self.next_id:
                return _result(method, answer)

    def initialize(self) -> dict:
        result = self.request("initialize", {"protocolVersion": PROTOCOL, "capabilities": {},
                                             "clientInfo": CLIENT_INFO})
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return result

    def call(self, name: str, arguments: dict[str, Any] | None = None) -> dict:
        """tools/call; the result as sent (content, isError)."""
        return self.request("tools/call", {"name": name, "arguments": arguments or {}})

    def ok(self, name: str, arguments: dict[str, Any] | None = None) -> dict:
        """A call that must succeed."""
        result = self.call(name, arguments)
        if result.get("isError"):
            raise RuntimeError(f"{name} failed: {result['content']}")
        return result

    def close(self, timeout: float = 30) -> float:
        """Close stdin, as a client does when it is done; seconds until the process has exited."""
        closed = time.perf_counter()
        self.process.stdin.close()
        self.process.wait(timeout=timeout)
        elapsed = time.perf_counter() - closed
        self.process.stdout.close()
        return elapsed

    def __enter__(self) -> StdioServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if not stream.closed:
                stream.close()


class HttpSession:
    """One MCP session over Streamable HTTP on one keep-alive connection: POST /mcp with the
    bearer token and the session id; each answer arrives as an SSE `data:` line."""

    def __init__(self, base: str, token: str):
        url = urlsplit(base)
        self.connection = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json",
                        "Accept": "application/json, text/event-stream"}
        self.next_id = 0

    def post(self, message: dict) -> tuple[http.client.HTTPResponse, bytes]:
        self.connection.request("POST", "/mcp", json.dumps(message).encode(), self.headers)
        response = self.connection.getresponse()
        return response, response.read()

    def request(self, method: str, params: dict | None = None) -> dict:
        self.next_id += 1
        response, body = self.post({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params or {}})
        if response.status != 200:
            raise RuntimeError(f"{method}: HTTP {response.status} {body[:200]!r}")
        if method == "initialize":
            self.headers["mcp-session-id"] = response.getheader("mcp-session-id") or ""
        for line in body.splitlines():
            if line.startswith(b"data:") and line[5:].strip():
                answer = json.loads(line[5:])
                if answer.get("id") == self.next_id:
                    return _result(method, answer)
        raise RuntimeError(f"{method}: no answer in {body[:200]!r}")

    def initialize(self) -> dict:
        result = self.request("initialize", {"protocolVersion": PROTOCOL, "capabilities": {},
                                             "clientInfo": CLIENT_INFO})
        self.headers["mcp-protocol-version"] = result["protocolVersion"]
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return result

    def call(self, name: str, arguments: dict[str, Any] | None = None) -> dict:
        return self.request("tools/call", {"name": name, "arguments": arguments or {}})

    def close(self) -> None:
        self.connection.close()
