"""`python server.py ARGS` for the tests, many times, without paying for the imports each time
(about 1.3 s of CPU): this process imports server.py once, then runs each request in a forked
child that takes the request's environment, working directory and arguments, writes stdout and
stderr to the given files and exits with main's code. Used by conftest.run_server.

One JSON line in per run: {"args", "env", "cwd", "stdout", "stderr", "timeout"}; one line out
when the child has ended: {"returncode", "timed_out"}.
"""
import json
import os
import signal
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import server  # noqa: E402  (what every run shares)


def become_server(request: dict) -> int:
    """In the child: `python server.py ARGS` with this environment and directory; its exit code."""
    signal.alarm(int(request["timeout"]))  # the default action ends the child
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY),
                            (2, request["stderr"], os.O_WRONLY)):
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)
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


if __name__ == "__main__":
    serve()
