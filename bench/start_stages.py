"""Where the start goes: the server's CPU time at each stage of its start, the project against
the one-tool baseline, medians of interleaved runs. Copies of both get a line that prints
time.process_time() at each stage; the time at the tools/list answer is read from /proc.

    python bench/start_stages.py [--rounds N]
"""
from __future__ import annotations

import argparse
import compileall
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import simulator  # noqa: E402
from before_after import copy_tree  # noqa: E402
from clients import CLIENT_INFO, PROTOCOL  # noqa: E402
from side_by_side import PYTHON, cpu_seconds, server_env  # noqa: E402

MARK = 'print("STAGE {}", __import__("time").process_time(), file=__import__("sys").stderr, flush=True)\n'
# (file, the line the mark goes before, the stage it ends, indent)
PROJECT_MARKS = [("server.py", 'VERSION = "0.1.0"\n', "imports", ""),
                 ("server.py", "    setup_logging(config.log_level)\n", "configuration", "    "),
                 ("server.py", "    collect_from_now_on()\n", "build_server", "    ")]
BASELINE_MARKS = [("bench/baseline_server.py", 'server = MCPServer("baseline")\n', "imports", ""),
                  ("bench/baseline_server.py", '    server.run("stdio")\n', "build_server", "    ")]


def marked(tree: Path, marks: list[tuple[str, str, str, str]]) -> None:
    for name, anchor, stage, indent in marks:
        path = tree / name
        text = path.read_text()
        assert text.count(anchor) == 1, f"{name} no longer has {anchor!r}"
        path.write_text(text.replace(anchor, indent + MARK.format(stage) + anchor))
    compileall.compile_dir(tree, quiet=1)


def one_start(command: list[str], env: dict[str, str], cwd: str) -> dict[str, float]:
    messages = [{"jsonrpc": "2.0", "id": 1, "method": "initialize",
                 "params": {"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": CLIENT_INFO}},
                {"jsonrpc": "2.0", "method": "notifications/initialized"},
                {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}]
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=env, cwd=cwd)
    process.stdin.write("".join(json.dumps(m) + "\n" for m in messages).encode())
    process.stdin.flush()
    process.stdout.readline()
    process.stdout.readline()
    stages = {"tools/list answered": cpu_seconds(process.pid)}
    _, errors = process.communicate()
    for line in errors.decode().splitlines():
        if line.startswith("STAGE "):
            _, stage, seconds = line.split()
            stages[stage] = float(seconds)
    return stages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=11)
    rounds = parser.parse_args().rounds
    with tempfile.TemporaryDirectory(prefix="bench-") as workdir, \
            simulator.Simulator(simulator.Lab.homelab()) as sim:
        tree = copy_tree(Path(workdir) / "tree")
        marked(tree, PROJECT_MARKS + BASELINE_MARKS)
        commands = {"baseline": [PYTHON, str(tree / "bench" / "baseline_server.py")],
                    "project": [PYTHON, str(tree / "server.py")]}
        env = server_env(sim.env(), workdir)
        samples: dict[str, list[dict[str, float]]] = {name: [] for name in commands}
        for index in range(rounds):
            for name in list(commands)[::-1 if index % 2 else 1]:
                samples[name].append(one_start(commands[name], env, workdir))
    for name, runs in samples.items():
        order = ["imports", "configuration", "build_server", "tools/list answered"]
        medians = {stage: statistics.median(run[stage] for run in runs) * 1000 for stage in order if stage in runs[0]}
        print(f"{name:9} CPU ms at the end of each stage: "
              + ", ".join(f"{stage} {ms:.0f}" for stage, ms in medians.items()))


if __name__ == "__main__":
    main()
