"""Workflows as the cluster grows (issue 22, section 2): health_check and backup_coverage on 3 and on
20 nodes at a 50 ms answer delay, and the bytes of their answers at 1,000 guests. Prints the figures
(and returns them for bench/run.py); nothing here asserts. Run from the project root:

    python bench/workflows_scale.py [--rounds N]

Each call goes over MCP (stdio) to a server pointed at the simulator with the README's reader
tokens; the simulator sleeps `DELAY` before answering each request (`Lab.delay`), as a real host
takes its time. The medians of N calls per size are reported, after one warm-up call (the first
call also reads the token's privileges).
"""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import simulator  # noqa: E402
from clients import StdioServer  # noqa: E402
from side_by_side import PROJECT, server_env  # noqa: E402

DELAY = 0.05
WORKFLOWS = ("health_check", "backup_coverage")
BOUNDED = WORKFLOWS + ("security_audit",)  # answers that must stay small at 1,000 guests


def answer_bytes(result: dict) -> int:
    return len(json.dumps(result, separators=(",", ":")).encode())


def timed(server: StdioServer, tool: str, rounds: int) -> float:
    server.ok(tool)  # warm-up: privileges read, connections open
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        server.ok(tool)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def per_size(nodes: int, workdir: str, rounds: int) -> dict:
    lab = simulator.Lab.homelab(nodes=nodes)
    with simulator.Simulator(lab) as sim, StdioServer(PROJECT, server_env(sim.env(), workdir), workdir) as server:
        server.initialize()
        lab.delay = DELAY
        figures = {}
        for tool in WORKFLOWS:
            before = len(lab.requests)
            figures[f"{tool}_s"] = round(timed(server, tool, rounds), 3)
            figures[f"{tool}_requests"] = (len(lab.requests) - before) // (rounds + 1)
        return figures


def answers_at(guests: int, workdir: str) -> dict:
    lab = simulator.Lab.homelab(nodes=20, guests=guests)
    with simulator.Simulator(lab) as sim, StdioServer(PROJECT, server_env(sim.env(), workdir), workdir) as server:
        server.initialize()
        return {f"{tool}_bytes": answer_bytes(server.ok(tool)) for tool in BOUNDED}


def run(rounds: int = 5) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-") as workdir:
        small, large = per_size(3, workdir, rounds), per_size(20, workdir, rounds)
        figures = {"answer_delay_s": DELAY, "3_nodes": small, "20_nodes": large,
                   "ratio_20_to_3": {tool: round(large[f"{tool}_s"] / small[f"{tool}_s"], 2) for tool in WORKFLOWS},
                   "answers_1000_guests_20_nodes": answers_at(1000, workdir)}
    return figures


if __name__ == "__main__":
    count = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 5
    print(json.dumps(run(count), indent=1))
