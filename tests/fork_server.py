"""`python server.py ARGS` for the tests, many times, without paying for the imports each time
(about 1.3 s of CPU): this process imports server.py once, then runs each request in a forked
child that takes the request's environment, working directory and arguments, and exits with
main's code. Two ways in:

- `fork_server.py` (conftest.run_server): one JSON line in per run, {"args", "env", "cwd", "stdout",
  "stderr", "timeout"}, the child writing stdout and stderr to those files; one line out when it has
  ended: {"returncode", "timed_out"}.
- `fork_server.py --stdio SOCKET` (conftest.stdio_session): a server on stdio for an MCP client.
  tests/stdio_launcher.py, the process the client starts, connects to SOCKET and hands over its
  stdin, stdout and stderr with the request {"args", "env", "cwd"}; the forked child serves on them
  as `python server.py ARGS` would (stdio, or `--http` for test_http.http_server), sends its pid
  (16 bytes) and, when it ends, its exit code. Sessions run side by side (a child per connection).
"""
import json
import os
import signal
import socket
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import server  # noqa: E402  (what every run shares)


def become_server(request: dict) -> int:
    """In the child: `python server.py ARGS` with this environment and directory; its exit code."""
    signal.alarm(int(request["timeout"]))  # the default action ends the child
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY),
                            (2, request["stderr"], os.O_WRONLY)):
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)
    return run_main(request)


def run_main(request: dict) -> int:
    """server.main with the request's directory, environment and arguments, as the interpreter runs it."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = [str(ROOT / "server.py"), *request["args"]]
    try:
        return server.main(request["args"])
    except SystemExit as exc:  # as the interpreter ends on sys.exit
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except Exception:  # as the interpreter ends on an uncaught exception
        traceback.print_exc()
        return 1


def serve() -> None:
    replies = os.fdopen(os.dup(1), "w")  # the children's fd 1 is their stdout file
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        child = os.fork()
        if child == 0:
            code = become_server(request)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        _, status = os.waitpid(child, 0)
        timed_out = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGALRM
        replies.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status), "timed_out": timed_out}) + "\n")
        replies.flush()


def serve_stdio(path: str) -> None:
    """A forked server per connection, on the stdin, stdout and stderr the launcher handed over."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the children
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    while True:
        connection, _ = listener.accept()
        if os.fork() == 0:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # a server's own children are its to wait for
            os._exit(serve_connection(connection))
        connection.close()


def serve_connection(connection: socket.socket) -> int:
    message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
    for fd, target in zip(fds, (0, 1, 2), strict=True):
        os.dup2(fd, target)
        os.close(fd)
    connection.sendall(f"{os.getpid():<15}\n".encode())  # the launcher passes its SIGTERM on to this pid
    sys.stdin, sys.stdout, sys.stderr = (open(0, "r", closefd=False), open(1, "w", closefd=False),
                                         open(2, "w", closefd=False))
    code = run_main(json.loads(message))
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    connection.sendall(str(code).encode())
    return code


if __name__ == "__main__":
    if sys.argv[1:2] == ["--stdio"]:
        serve_stdio(sys.argv[2])
    else:
        serve()
