"""The project's own share of a call, inside one process (no MCP transport): list_hosts through
the tool edge (server.as_tool: policy call context, JSON, masking), the masking alone, and
cluster_status through the edge against the same GET made directly, both from this process.

    python bench/edge.py
"""
from __future__ import annotations

import statistics
import sys
import time
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import config  # noqa: E402
import policy  # noqa: E402
import proxmox_client  # noqa: E402
import pve_tools  # noqa: E402
import server  # noqa: E402
import simulator  # noqa: E402
from masking import mask, register_secret  # noqa: E402
from side_by_side import direct_get  # noqa: E402


def microseconds(action, number: int = 5000) -> float:
    return round(min(timeit.repeat(action, number=number, repeat=5)) / number * 1e6, 1)


def main() -> None:
    with simulator.Simulator(simulator.Lab.homelab()) as sim:
        configured = config.load_config(sim.env())
        for secret in configured.secrets:
            register_secret(secret)
        proxmox_client.configure_hosts(configured.hosts)
        policy.configure(configured.settings)
        list_hosts = server.as_tool(server.list_hosts)
        answer = list_hosts()
        print(f"as_tool(list_hosts): {microseconds(list_hosts)} us; its answer ({len(answer)} characters) "
              f"masked: {microseconds(lambda: mask(answer))} us")
        actions = {"tool edge": server.as_tool(pve_tools.cluster_status), "direct GET": direct_get(sim)}
        samples: dict[str, list[float]] = {name: [] for name in actions}
        for action in actions.values():
            action()
        for index in range(300):
            for name, action in list(actions.items())[::-1 if index % 2 else 1]:
                started = time.perf_counter()
                action()
                samples[name].append(time.perf_counter() - started)
        print("; ".join(f"{name}: {statistics.median(values) * 1000:.2f} ms" for name, values in samples.items())
              + " (cluster_status, median of 300 each, in turn)")


if __name__ == "__main__":
    main()
