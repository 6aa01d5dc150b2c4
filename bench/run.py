"""Benchmarks: prints the figures and writes them to bench/results.json. Not tests: nothing
here asserts a timing. Run from the project root:

    python bench/run.py [--quick]

Figures: the side-by-side ratios of bench/side_by_side.py (start, exit, a tool that sends no
request, a read tool against a direct GET at three answer delays); tool-list bytes (default,
everything, compact); the bytes of a "list all guests" answer as the client receives it; API
requests per action; list_guests on a 20-node, 5,000-guest cluster; health_check and backup_coverage
on 3 and 20 nodes and their answers at 1,000 guests (bench/workflows_scale.py), the dashboard likewise
(bench/dashboard_scale.py); 50 HTTP clients at once; answer times on the path at 50 nodes (bench/flat.py);
memory after many calls; the time each fault of tests/test_faults.py takes to be answered.
The measuring process speaks MCP through bench/clients.py and never imports the SDK.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Callable, Iterator


ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "tests")]

import side_by_side  # noqa: E402
import simulator  # noqa: E402
import dashboard_scale  # noqa: E402
import workflows_scale  # noqa: E402
from clients import HttpSession, StdioServer  # noqa: E402
from side_by_side import PROJECT, free_port, server_env, wait_until_serving  # noqa: E402
from test_faults import FAULTS, READ_TIMEOUT, arguments_for, fault_envs  # noqa: E402

PIN = "SHA256:" + "A" * 43
TOKEN = "bench-bearer-token-0123456789abcdef"


# ---------------------------------------------------------------- what the model pays for

def tool_list(env: dict[str, str], workdir: str) -> dict:
    """`server.py --list-tools --json`: each tool's bytes and the whole list's."""
    out = subprocess.run([*PROJECT, "--list-tools", "--json"], env=server_env(env, workdir), cwd=workdir,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def tool_list_sizes(workdir: str) -> dict:
    hosts = {"PROXMOX_LAB_URL": "https://192.0.2.1", "PROXMOX_LAB_TOKEN": "a@pve!t=" + "s" * 36,
             "PBS_LAB_URL": "https://192.0.2.2", "PBS_LAB_TOKEN": "a@pbs!t:" + "s" * 36}
    ssh = {"PROXMOX_LAB_SSH_NODES": "pve1=192.0.2.1", "PROXMOX_LAB_SSH_FINGERPRINTS": f"pve1={PIN}",
           "PBS_LAB_SSH_HOST": "192.0.2.2", "PBS_LAB_SSH_FINGERPRINT": PIN}
    everything = {"PROXMOX_ACCESS": "destructive", "PROXMOX_ALLOW_EXEC": "true", "PROXMOX_ALLOW_ELEVATED": "true",
                  "PROXMOX_ALLOW_SENSITIVE": "true"}
    compact = {"PROXMOX_TOOLSETS": "compact"}
    second_pve = {"PROXMOX_B_URL": "https://192.0.2.3", "PROXMOX_B_TOKEN": "a@pve!t=" + "s" * 36}
    configurations = {
        "default (read, PVE+PBS, no SSH)": hosts,
        "everything (all gates, PVE+PBS+SSH)": hosts | ssh | everything,
        "compact toolset (read)": hosts | compact,
        "compact toolset (all gates)": hosts | everything | compact,
        # with two PVE hosts every PVE tool takes `host` (left out when there is only one)
        "default, two PVE hosts": hosts | second_pve,
    }
    lists = {name: tool_list(env, workdir) for name, env in configurations.items()}
    largest = max(lists["everything (all gates, PVE+PBS+SSH)"]["tools"], key=lambda tool: tool["bytes"])
    return {name: listed["total_bytes"] for name, listed in lists.items()} | {
        "largest tool": f"{largest['name']} {largest['bytes']}"}


def answer_bytes(result: dict) -> int:
    """Everything the client receives for one call: the result (content and flags) as sent."""
    return len(json.dumps(result, separators=(",", ":")))


# ---------------------------------------------------------------- requests per action

def counted(sim: simulator.Simulator, action: Callable[[], object], product: str | None = None) -> int:
    """API requests an action sends (background reads of the token's privileges left out)."""
    before = len(sim.lab.requests)
    action()
    return len([r for r in sim.lab.requests[before:] if r[2] != "/access/permissions"
                and (product is None or r[0] == product)])


def coverage_label(lab: simulator.Lab) -> str:
    """backup_coverage's budget: 2 + storages + datastores, counting each node's own `local` as a
    storage (PBS-backed storages included: they are read through PBS)."""
    storages = sum(1 if entry["shared"] else len(lab.storage_nodes(entry)) for entry in lab.storages.values()
                   if "backup" in entry["content"].split(","))
    return f"backup_coverage ({storages} backup storages, {len(lab.datastores)} datastore(s): " \
           f"budget {2 + storages + len(lab.datastores)})"


def per_action(sim: simulator.Simulator, workdir: str) -> dict:
    with StdioServer(PROJECT, server_env(sim.env(), workdir), workdir) as server:
        server.initialize()
        server.ok("list_hosts")
        figures = {"list_guests_6_answer_bytes": answer_bytes(server.ok("list_guests"))}
        figures["requests_per_action"] = {
            "list_guests": counted(sim, lambda: server.ok("list_guests")),
            "get_guest": counted(sim, lambda: server.ok("get_guest", {"vmid": 102})),
            # cluster status, resources, tasks; each node's replication, certificates, disks, ZFS pools and
            # package versions (read side by side: bench/workflows_scale.py)
            "health_check PVE requests (3 nodes: budget 3 + 5 x nodes = 18)": counted(
                sim, lambda: server.ok("health_check"), "pve"),
            "health_check PBS requests": counted(sim, lambda: server.ok("health_check"), "pbs"),
            coverage_label(sim.lab): counted(sim, lambda: server.ok("backup_coverage")),
        }
    return figures


# ---------------------------------------------------------------- faults and scale

def timed_call(server: StdioServer, tool: str, arguments: dict | None = None) -> dict:
    """Seconds to the answer, whether it was an error, and whether the next call is served."""
    started = time.perf_counter()
    result = server.call(tool, arguments)
    elapsed = time.perf_counter() - started
    return {"s": round(elapsed, 2), "error": bool(result.get("isError")), "next_call_served": None}


def fault_timings(sim: simulator.Simulator, workdir: str) -> dict:
    """Seconds from call to clear error for each fault; the budget is the read timeout + 1 s."""
    envs = fault_envs(sim)
    timings = {}
    with ExitStack() as stack:
        servers = {name: stack.enter_context(StdioServer(PROJECT, server_env(envs[name], workdir), workdir))
                   for name in ("reader", "operator")}
        for server in servers.values():
            server.initialize()
        for fault in FAULTS:
            server = servers[fault.env]
            fault.start(sim.lab)
            try:
                timings[fault.name] = timed_call(server, fault.tool, arguments_for(fault, sim.lab))
            finally:
                fault.stop(sim.lab)
            timings[fault.name]["next_call_served"] = not server.call("list_guests").get("isError")
    for name in ("host down", "certificate changed"):
        with StdioServer(PROJECT, server_env(envs[name], workdir), workdir) as server:
            server.initialize()
            server.request("tools/list")
            timings[name] = timed_call(server, "list_guests")
            timings[name]["next_call_served"] = not server.call("list_hosts").get("isError")
    return {"budget_s": READ_TIMEOUT + 1, "faults": timings}


def scale(workdir: str) -> dict:
    """list_guests on 20 nodes and 5,000 guests: the default page, and every guest by paging."""
    with simulator.Simulator(simulator.Lab.scale(nodes=20, guests=5000)) as big, \
            StdioServer(PROJECT, server_env(big.env(), workdir), workdir) as server:
        server.initialize()
        server.ok("list_hosts")
        started = time.perf_counter()
        page = server.ok("list_guests")
        elapsed = time.perf_counter() - started
        seen, offset = 0, 0
        while True:
            chunk = json.loads(server.ok("list_guests", {"limit": 1000, "offset": offset})["content"][0]["text"])
            seen += len(chunk["rows"])
            if not chunk.get("truncated"):
                break
            offset = chunk["next_offset"]
    return {"default_page_s": round(elapsed, 3), "default_page_bytes": answer_bytes(page),
            "guests_reached_by_paging": seen}


# ---------------------------------------------------------------- HTTP

@contextmanager
def http_server(env: dict[str, str], workdir: str) -> Iterator[tuple[subprocess.Popen, str]]:
    """server.py --http with the bearer token; yields the process and its base URL once it answers."""
    port = free_port()
    process = subprocess.Popen([*PROJECT, "--http", "--port", str(port)], cwd=workdir,
                               env=server_env(env | {"MCP_AUTH_TOKEN": TOKEN}, workdir),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(base, process)
        yield process, base
    finally:
        process.terminate()
        process.wait(timeout=10)


def http_concurrency(workdir: str, clients: int = 50, calls: int = 20) -> dict:
    """50 MCP clients over Streamable HTTP, 20 list_guests calls each, all at once."""
    latencies: list[float] = []
    errors: list[str] = []

    def one(base: str) -> None:
        session = HttpSession(base, TOKEN)
        try:
            session.initialize()
            for _ in range(calls):
                started = time.perf_counter()
                result = session.call("list_guests")
                latencies.append(time.perf_counter() - started)
                if result.get("isError"):
                    errors.append(result["content"][0]["text"])
        finally:
            session.close()

    with simulator.Simulator(simulator.Lab.homelab()) as sim, http_server(sim.env(), workdir) as (_, base):
        threads = [threading.Thread(target=one, args=(base,)) for _ in range(clients)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - started
    latencies.sort()
    return {"calls": len(latencies), "errors": len(errors) + clients * calls - len(latencies),
            "wall_s": round(wall, 2), "p50_ms": round(statistics.median(latencies) * 1000, 1),
            "p95_ms": round(latencies[int(len(latencies) * 0.95)] * 1000, 1)}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def memory_after_calls(workdir: str, calls: int) -> dict:
    """RSS of the server process after half and after all of many read calls over HTTP."""
    samples: dict[str, float] = {}
    with simulator.Simulator(simulator.Lab.homelab()) as sim, http_server(sim.env(), workdir) as (process, base):
        session = HttpSession(base, TOKEN)
        session.initialize()
        samples["start_mb"] = rss_mb(process.pid)
        for index in range(calls):
            session.call("list_guests" if index % 2 else "cluster_status")
            if index == calls // 2:
                samples["half_mb"] = rss_mb(process.pid)
        samples["end_mb"] = rss_mb(process.pid)
        session.close()
    return {"calls": calls} | samples


# ---------------------------------------------------------------- all of it

def main() -> None:
    quick = "--quick" in sys.argv
    figures = side_by_side.run(quick)  # first, while nothing else of the bench has run
    side_by_side.print_ratios(figures)
    with tempfile.TemporaryDirectory(prefix="bench-") as workdir:
        figures["tool_list_bytes"] = tool_list_sizes(workdir)
        with simulator.Simulator(simulator.Lab.homelab()) as sim:
            figures |= per_action(sim, workdir)
            figures["fault_answers"] = fault_timings(sim, workdir)
        figures["scale_20_nodes_5000_guests"] = scale(workdir)
        figures["workflows_3_and_20_nodes"] = workflows_scale.run(3 if quick else 7)
        figures["dashboard_3_and_20_nodes"] = dashboard_scale.run(3 if quick else 5)
        figures["http_50_clients_x_20_calls"] = http_concurrency(workdir)
        import flat  # here: it takes its HTTP helpers from this module
        figures["flat_50_nodes"] = flat.run(2 if quick else 3)
        figures["memory_after_calls"] = memory_after_calls(workdir, 2000 if quick else 10_000)
    assert "mcp" not in sys.modules, "the measuring process must not hold the SDK"
    (ROOT / "bench" / "results.json").write_text(json.dumps(figures, indent=1) + "\n")
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
