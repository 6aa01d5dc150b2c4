"""Flat as the homelab grows (issue 31): each figure side by side with its target. Prints them (and
returns them for bench/run.py); nothing here asserts. Run from the project root:

    python bench/flat.py [--rounds N] [--skip-http]

- Answer times on the path: how much longer one call takes when the simulator answers every request
  after 50 ms (`Lab.delay`, inside one of the node's 3 workers: simulator/api.py `_worker`) than when it
  answers at once, divided by 50 ms (the CPU time of the server and the simulator, which a loaded machine
  stretches, is in both and drops out); medians of N calls of each, taking turns, after a warm-up, on 3 nodes /
  6 guests and 50 nodes / 1,000 guests, over MCP (stdio) with the reader token holding the recipe's
  backup grant. Requests per call from the simulator's log.
  tests/test_fanout.py counts the same path without a clock (fanout.counting).
- The dashboard's memory: the server's RSS before and after its first and its second dashboard call at
  50 nodes / 1,000 guests, beside the answer's bytes.
- HTTP: 50 clients at once, 10 calls each, under the cap of 64 connections (errors and HTTP 503s); then
  the cap's 64 places held by requests in flight and 10 more requests (each should get 503 with Retry-After).
"""
from __future__ import annotations

import json
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "tests")]

import http_transport  # noqa: E402
import simulator  # noqa: E402
from clients import HttpSession, StdioServer  # noqa: E402
from run import TOKEN, http_server, rss_mb  # noqa: E402
from side_by_side import PROJECT, server_env  # noqa: E402
from workflows_scale import answer_bytes  # noqa: E402

DELAY = 0.05
TARGETS = {"security_audit": 12, "dashboard": 12, "health_check": 10, "backup_coverage": 8, "what_changed": 4}
REQUEST_TARGETS = {"what_changed": 10}
ARGUMENTS = {"what_changed": {"vmid": 100}}
ENV = {"PROXMOX_TOOLSETS": "default,monitor,changes"}


def answer_times(nodes: int, guests: int, workdir: str, rounds: int) -> dict:
    lab = simulator.Lab.homelab(nodes=nodes, guests=guests)
    with simulator.Simulator(lab) as sim, StdioServer(
            PROJECT, server_env(sim.env(pve_token="mcp@pve!backups") | ENV, workdir), workdir) as server:
        server.initialize()
        figures = {}
        for tool in TARGETS:
            server.ok(tool, ARGUMENTS.get(tool))  # warm-up: privileges read, connections open
            samples: dict[float, list[float]] = {0.0: [], DELAY: []}
            before = len(lab.requests)
            for round_ in range(rounds):  # the two delays take turns, the order turned round every other time
                for delay in (0.0, DELAY) if round_ % 2 else (DELAY, 0.0):
                    lab.delay = delay
                    started = time.perf_counter()
                    server.ok(tool, ARGUMENTS.get(tool))
                    samples[delay].append(time.perf_counter() - started)
            lab.delay = 0.0
            slow, fast = statistics.median(samples[DELAY]), statistics.median(samples[0.0])
            figures[tool] = {"seconds": round(slow, 3), "seconds_without_delay": round(fast, 3),
                             "answer_times": round((slow - fast) / DELAY, 1),
                             "requests": (len(lab.requests) - before) // (2 * rounds)}
        figures["most_at_once_per_node"] = max(lab.most_at_once.values())
        return figures


def dashboard_memory(workdir: str) -> dict:
    lab = simulator.Lab.homelab(nodes=50, guests=1000)
    with simulator.Simulator(lab) as sim, StdioServer(
            PROJECT, server_env(sim.env(pve_token="mcp@pve!backups") | ENV, workdir), workdir) as server:
        server.initialize()
        server.ok("list_nodes")
        before = rss_mb(server.process.pid)
        result = server.ok("dashboard")
        after = rss_mb(server.process.pid)
        server.ok("dashboard")
        again = rss_mb(server.process.pid)
        return {"rss_before_mb": before, "rss_after_first_mb": after, "rss_after_second_mb": again,
                "growth_first_mb": round(after - before, 1), "growth_second_mb": round(again - after, 1),
                "answer_bytes": answer_bytes(result)}


def http_clients(workdir: str, clients: int = 50, calls: int = 10) -> dict:
    """`clients` MCP sessions at once over Streamable HTTP, `calls` list_guests each; then the cap held."""
    failures: list[str] = []

    def one(base: str) -> None:
        session = HttpSession(base, TOKEN)
        try:
            session.initialize()
            for _ in range(calls):
                if session.call("list_guests").get("isError"):
                    failures.append("tool error")
        except Exception as exc:  # noqa: BLE001 - an HTTP 503 or a dropped connection is what is counted
            failures.append(str(exc)[:80])
        finally:
            session.close()

    cap = http_transport.HTTP_LIMITS["connections"]
    with simulator.Simulator(simulator.Lab.homelab()) as sim, http_server(sim.env(), workdir) as (_, base):
        threads = [threading.Thread(target=one, args=(base,)) for _ in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        port = int(base.rsplit(":", 1)[1])
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(cap)]
        for sock in held:  # a request in flight on every place: its body has not all arrived
            sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{")
        time.sleep(0.5)  # let the server read them (a bench, not a test)
        refused = with_retry_after = 0
        for _ in range(10):
            with socket.create_connection(("127.0.0.1", port)) as extra:
                extra.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                extra.settimeout(10)
                answer = extra.recv(4096).lower()
                refused += answer.startswith(b"http/1.1 503")
                with_retry_after += b"\r\nretry-after:" in answer
        for sock in held:
            sock.close()
    return {"clients": clients, "calls_each": calls, "errors": len(failures), "first_errors": failures[:3],
            "cap": cap, "beyond_cap_refused_503": refused, "with_retry_after": with_retry_after, "beyond_cap": 10}


def table(figures: dict) -> str:
    lines = ["| figure | 3 nodes / 6 guests | 50 nodes / 1,000 guests | target |", "|---|---|---|---|"]
    for tool, target in TARGETS.items():
        small, large = figures["3_nodes"][tool], figures["50_nodes"][tool]
        request_target = f", <= {REQUEST_TARGETS[tool]} requests" if tool in REQUEST_TARGETS else ""
        lines.append(f"| `{tool}` answer times (requests) | {small['answer_times']} ({small['requests']}) | "
                     f"**{large['answer_times']}** ({large['requests']}) | <= {target}{request_target} |")
    return "\n".join(lines)


def run(rounds: int = 3, http: bool = True) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-") as workdir:
        figures = {"answer_delay_s": DELAY, "3_nodes": answer_times(3, 6, workdir, rounds),
                   "50_nodes": answer_times(50, 1000, workdir, rounds), "dashboard_memory": dashboard_memory(workdir)}
        if http:
            figures["http"] = http_clients(workdir)
    return figures


if __name__ == "__main__":
    count = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 3
    result = run(count, "--skip-http" not in sys.argv)
    print(json.dumps(result, indent=1))
    print(table(result))
