"""The process an MCP client starts in the tests (conftest.stdio_session): it hands its stdin, stdout
and stderr to tests/fork_server.py --stdio, whose forked child serves MCP on them as `python server.py
ARGS` would, and ends with that server's exit code. It imports nothing heavy, so a session starts in
a fraction of the SDK's import time. The socket is named by FORK_SERVER_SOCKET (not passed on)."""
import json
import os
import signal
import socket
import sys


def main() -> int:
    path = os.environ.pop("FORK_SERVER_SOCKET")
    connection = socket.socket(socket.AF_UNIX)
    connection.connect(path)
    request = {"args": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd()}
    socket.send_fds(connection, [json.dumps(request).encode()], [0, 1, 2])
    pid = b""
    while len(pid) < 16:  # the server's pid: a SIGTERM to this process is passed on (an HTTP server's stop)
        part = connection.recv(16 - len(pid))
        if not part:
            return 1
        pid += part
    signal.signal(signal.SIGTERM, lambda *_: os.kill(int(pid), signal.SIGTERM))
    code = connection.recv(16)  # when the server has ended (b"" if its process was killed)
    return int(code) if code else 1


if __name__ == "__main__":
    sys.exit(main())
