"""Benchmarks: prints the figures and writes them to bench/results.json. Not tests: nothing
here asserts a timing. Run from the project root: .venv/bin/python bench/run.py [--quick]

Figures: tool-list bytes (default, everything, compact), the bytes of a "list all guests"
answer as the client receives it, start-up to tools/list, per-call overhead against a direct
GET, API requests per action, and list_guests on a 20-node, 5,000-guest cluster.
"""
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import simulator  # noqa: E402
from conftest import server_env, stdio_session  # noqa: E402

PIN = "SHA256:" + "A" * 43


def tool_list_bytes(env: dict) -> int:
    out = subprocess.run([sys.executable, str(ROOT / "server.py"), "--list-tools", "--json"], env=server_env(env),
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)["total_bytes"]


def answer_bytes(result) -> int:
    """Everything the client receives for one call: content and flags, as JSON."""
    return len(json.dumps(result.model_dump(mode="json", by_alias=True, exclude_none=True), separators=(",", ":")))


def counted(sim, action) -> int:
    before = len(sim.lab.requests)
    action()
    return len([r for r in sim.lab.requests[before:] if r[2] != "/access/permissions"])


def main() -> None:
    quick = "--quick" in sys.argv
    figures: dict = {}
    hosts = {"PROXMOX_LAB_URL": "https://192.0.2.1", "PROXMOX_LAB_TOKEN": "a@pve!t=" + "s" * 36,
             "PBS_LAB_URL": "https://192.0.2.2", "PBS_LAB_TOKEN": "a@pbs!t:" + "s" * 36}
    ssh = {"PROXMOX_LAB_SSH_NODES": "pve1=192.0.2.1", "PROXMOX_LAB_SSH_FINGERPRINTS": f"pve1={PIN}",
           "PBS_LAB_SSH_HOST": "192.0.2.2", "PBS_LAB_SSH_FINGERPRINT": PIN}
    everything = {"PROXMOX_ACCESS": "destructive", "PROXMOX_ALLOW_EXEC": "true", "PROXMOX_ALLOW_ELEVATED": "true",
                  "PROXMOX_ALLOW_SENSITIVE": "true"}
    figures["tool_list_bytes"] = {
        "default (read, PVE+PBS, no SSH)": tool_list_bytes(hosts),
        "everything (all gates, PVE+PBS+SSH)": tool_list_bytes(hosts | ssh | everything),
        "compact toolset (read)": tool_list_bytes(hosts | {"PROXMOX_TOOLSETS": "compact"}),
        "compact toolset (all gates)": tool_list_bytes(hosts | everything | {"PROXMOX_TOOLSETS": "compact"}),
    }

    with simulator.Simulator(simulator.Lab.homelab()) as sim:
        with stdio_session(sim.env(), log_name="bench") as session:
            session.ok("list_hosts")
            figures["list_guests_6_answer_bytes"] = answer_bytes(session.call("list_guests"))
            figures["requests_per_action"] = {
                "list_guests": counted(sim, lambda: session.ok("list_guests")),
                "get_guest": counted(sim, lambda: session.ok("get_guest", {"vmid": 102})),
                "health_check (3 nodes, PVE+PBS)": counted(sim, lambda: session.ok("health_check")),
                "backup_coverage (2 storages, 1 datastore)": counted(sim, lambda: session.ok("backup_coverage")),
            }
            calls = 50 if quick else 200
            tool, direct = [], []
            secret = sim.lab.pve_tokens["mcp@pve!reader"].secret
            headers = {"Authorization": f"PVEAPIToken=mcp@pve!reader={secret}"}
            http = requests.Session()
            for _ in range(calls):
                started = time.perf_counter()
                session.ok("cluster_status")
                tool.append(time.perf_counter() - started)
                started = time.perf_counter()
                http.get(sim.pve_url + "/api2/json/cluster/status", headers=headers, verify=str(sim.cert_file))
                direct.append(time.perf_counter() - started)
            figures["overhead"] = {"calls": calls, "tool_median_ms": round(statistics.median(tool) * 1000, 2),
                                   "direct_median_ms": round(statistics.median(direct) * 1000, 2),
                                   "ratio": round(statistics.median(tool) / statistics.median(direct), 2)}

        starts = []
        for _ in range(3 if quick else 7):
            started = time.perf_counter()
            with stdio_session(sim.env(), log_name="bench-start") as fresh:
                fresh.tools()
            starts.append(time.perf_counter() - started)
        figures["startup_to_tools_list_median_s"] = round(statistics.median(starts), 3)

    with simulator.Simulator(simulator.Lab.scale(nodes=20, guests=5000)) as big:
        with stdio_session(big.env(), log_name="bench-scale") as session:
            session.ok("list_hosts")
            started = time.perf_counter()
            page = session.call("list_guests")
            elapsed = time.perf_counter() - started
            seen, offset = 0, 0
            while True:
                chunk = session.ok("list_guests", {"limit": 1000, "offset": offset})
                seen += len(chunk["rows"])
                if not chunk.get("truncated"):
                    break
                offset = chunk["next_offset"]
            figures["scale_20_nodes_5000_guests"] = {"default_page_s": round(elapsed, 3),
                                                     "default_page_bytes": answer_bytes(page),
                                                     "guests_reached_by_paging": seen}

    (ROOT / "bench" / "results.json").write_text(json.dumps(figures, indent=1) + "\n")
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
