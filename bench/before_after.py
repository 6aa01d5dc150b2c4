"""What issue 17's start-up changes bought, measured side by side in one interleaved run: the
one-tool baseline, the project at an earlier commit, the project now without its gc lines, and
the project now. Launch to the tools/list answer, the server's CPU until then, and the exit
after stdin closes (medians).

    python bench/before_after.py [COMMIT] [--rounds N]     (COMMIT: default dcc09d3, before issue 17)
"""
from __future__ import annotations

import argparse
import compileall
import io
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import simulator  # noqa: E402
from clients import StdioServer  # noqa: E402
from side_by_side import BASELINE, PROJECT, PYTHON, compile_project, cpu_seconds, server_env  # noqa: E402

# the gc lines of server.py, and what replaces them in the "without" copy
GC_LINES = {"    gc.disable()\n": "    pass\n", "    gc.freeze()\n    gc.enable()\n": "    pass\n",
            "    gc.freeze()  # the imports": "    pass  # the imports"}


def tree(revision: str, into: Path) -> Path:
    """The project's files at a git revision (or the working tree's commit, HEAD), compiled."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision], check=True, capture_output=True).stdout
    tarfile.open(fileobj=io.BytesIO(archive)).extractall(into, filter="data")
    compileall.compile_dir(into, quiet=1)
    return into


def copy_tree(into: Path) -> Path:
    """A copy of the working tree's server (and bench/), to change and run."""
    for path in [*ROOT.glob("*.py"), *ROOT.glob("catalog/*.json"), *ROOT.glob("bench/*.py"),
                 ROOT / "protected-vms.json", ROOT / "pyproject.toml"]:
        target = into / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
    return into


def without_gc_lines(into: Path) -> Path:
    """A copy of the working tree whose server.py never touches the collector."""
    server = copy_tree(into) / "server.py"
    text = server.read_text()
    for line, replacement in GC_LINES.items():
        assert text.count(line) == 1, f"server.py no longer has {line!r}"
        text = text.replace(line, replacement)
    server.write_text(text)
    compileall.compile_dir(into, quiet=1)
    return into


def measure(commands: dict[str, list[str]], env: dict[str, str], workdir: str, rounds: int) -> dict:
    samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in commands}
    for index in range(rounds):
        for name in list(commands)[::-1 if index % 2 else 1]:
            with StdioServer(commands[name], env, workdir) as server:
                server.initialize()
                server.request("tools/list")
                started = time.perf_counter() - server.started
                cpu = cpu_seconds(server.process.pid)
                samples[name].append((started, cpu, server.close()))
    base = statistics.median(s[0] for s in samples["baseline"])
    return {name: {"start_ms": round(statistics.median(s[0] for s in values) * 1000),
                   "start_ratio": round(statistics.median(s[0] for s in values) / base, 3),
                   "cpu_ms": round(statistics.median(s[1] for s in values) * 1000),
                   "exit_ms": round(statistics.median(s[2] for s in values) * 1000)}
            for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revision", nargs="?", default="dcc09d3", help="the earlier commit (default: before issue 17)")
    parser.add_argument("--rounds", type=int, default=11)
    options = parser.parse_args()
    revision, rounds = options.revision, options.rounds
    compile_project()
    with tempfile.TemporaryDirectory(prefix="bench-") as workdir, \
            simulator.Simulator(simulator.Lab.homelab()) as sim:
        before = tree(revision, Path(workdir) / "before")
        no_gc = without_gc_lines(Path(workdir) / "no-gc")
        commands = {"baseline": BASELINE, f"project at {revision}": [PYTHON, str(before / "server.py")],
                    "project now without the gc lines": [PYTHON, str(no_gc / "server.py")], "project now": PROJECT}
        figures = measure(commands, server_env(sim.env(), workdir), workdir, rounds)
    for name, figure in figures.items():
        print(f"{name:34} start {figure['start_ms']:5} ms (x{figure['start_ratio']:.3f}), "
              f"CPU {figure['cpu_ms']:5} ms, exit after stdin closes {figure['exit_ms']:4} ms")


if __name__ == "__main__":
    main()
