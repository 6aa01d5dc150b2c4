"""The dashboard as the cluster grows (issue 22, section 3): one call on 3 and on 20 nodes at a 50 ms
answer delay, its requests, and the bytes of its answer (the text every client gets, and the result as
sent) at 1,000 guests. Prints the figures;
nothing here asserts. Run from the project root:

    python bench/dashboard_scale.py [--rounds N]

As bench/workflows_scale.py (whose helpers it uses): over MCP (stdio) to a server pointed at the
simulator with the README's reader tokens, the monitor toolset open; medians of N calls after a
warm-up call.
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import simulator  # noqa: E402
from clients import StdioServer  # noqa: E402
from side_by_side import PROJECT, server_env  # noqa: E402
from workflows_scale import DELAY, answer_bytes, timed  # noqa: E402

MONITOR = {"PROXMOX_TOOLSETS": "default,monitor"}


def measured(nodes: int, guests: int, workdir: str, rounds: int) -> dict:
    lab = simulator.Lab.homelab(nodes=nodes, guests=guests)
    with simulator.Simulator(lab) as sim, \
            StdioServer(PROJECT, server_env(sim.env() | MONITOR, workdir), workdir) as server:
        server.initialize()
        lab.delay = DELAY
        before = len(lab.requests)
        seconds = timed(server, "dashboard", rounds)
        requests = (len(lab.requests) - before) // (rounds + 1)
        lab.delay = 0.0
        result = server.ok("dashboard")
        text = result["content"][0]["text"]
        return {"seconds": round(seconds, 3), "requests": requests, "text_bytes": len(text.encode()),
                "result_bytes": answer_bytes(result)}


def run(rounds: int = 5) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-") as workdir:
        small, large = measured(3, 6, workdir, rounds), measured(20, 60, workdir, rounds)
        return {"answer_delay_s": DELAY, "3_nodes": small, "20_nodes": large,
                "ratio_20_to_3": round(large["seconds"] / small["seconds"], 2),
                "1000_guests_20_nodes": measured(20, 1000, workdir, 1)}


if __name__ == "__main__":
    count = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 5
    print(json.dumps(run(count), indent=1))
