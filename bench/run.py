"""Benchmarks: prints the figures and writes them to bench/results.json. Not tests: nothing
here asserts a timing. Run from the project root: .venv/bin/python bench/run.py [--quick]

Figures: tool-list bytes (default, everything, compact), the bytes of a "list all guests"
answer as the client receives it, start-up to tools/list (and the SDK import alone), per-call
overhead against a direct GET (and a tool that sends no request), API requests per action,
list_guests on a 20-node, 5,000-guest cluster, HTTP concurrency, memory, and the time each
fault of tests/test_faults.py takes to be answered.
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
from test_faults import FAULTS, READ_TIMEOUT, arguments_for, fault_envs  # noqa: E402

PIN = "SHA256:" + "A" * 43


def tool_list_bytes(env: dict) -> int:
    out = subprocess.run([sys.executable, str(ROOT / "server.py"), "--list-tools", "--json"], env=server_env(env),
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)["total_bytes"]


def median_seconds(command: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        times.append(time.perf_counter() - started)
    return round(statistics.median(times), 3)


def fault_timings(sim) -> dict:
    """Seconds from call to clear error for each fault; the budget is the read timeout + 1 s."""
    envs = fault_envs(sim)
    timings = {}
    with stdio_session(envs["reader"], log_name="bench-faults") as reader, \
            stdio_session(envs["operator"], log_name="bench-faults-op") as operator:
        sessions = {"reader": reader, "operator": operator}
        for fault in FAULTS:
            session = sessions[fault.env]
            fault.start(sim.lab)
            try:
                started = time.perf_counter()
                result = session.call(fault.tool, arguments_for(fault, sim.lab))
                elapsed = time.perf_counter() - started
            finally:
                fault.stop(sim.lab)
            served = not session.call("list_guests").is_error
            timings[fault.name] = {"s": round(elapsed, 2), "error": result.is_error, "next_call_served": served}
    for name in ("host down", "certificate changed"):
        with stdio_session(envs[name], log_name="bench-faults-" + name.split()[0]) as session:
            session.tools()
            started = time.perf_counter()
            result = session.call("list_guests")
            timings[name] = {"s": round(time.perf_counter() - started, 2), "error": result.is_error,
                             "next_call_served": not session.call("list_hosts").is_error}
    return {"budget_s": READ_TIMEOUT + 1, "faults": timings}


def overhead(sim, calls: int) -> dict:
    """A read tool over stdio against the same GET made directly, timed inside one event loop
    (no thread portal, no logging in the measured path)."""
    import anyio
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters, stdio_client

    secret = sim.lab.pve_tokens["mcp@pve!reader"].secret
    headers = {"Authorization": f"PVEAPIToken=mcp@pve!reader={secret}"}
    url = sim.pve_url + "/api2/json/cluster/status"
    http = requests.Session()
    samples: dict[str, list[float]] = {"tool": [], "direct": [], "no_request": [], "one_off": []}

    async def timed(name: str, action) -> None:
        started = time.perf_counter()
        result = action()
        if hasattr(result, "__await__"):
            result = await result
            assert not result.is_error, result
        samples[name].append(time.perf_counter() - started)

    async def run() -> None:
        params = StdioServerParameters(command=sys.executable, args=[str(ROOT / "server.py")],
                                       env=server_env(sim.env()))
        async with Client(stdio_client(params), mode="legacy") as client:
            await client.call_tool("list_hosts", {})
            for _ in range(calls):
                await timed("tool", lambda: client.call_tool("cluster_status", {}))
                await timed("direct", lambda: http.get(url, headers=headers, verify=str(sim.cert_file)))
                await timed("no_request", lambda: client.call_tool("list_hosts", {}))  # the MCP round trip alone
                await timed("one_off", lambda: requests.get(url, headers=headers, verify=str(sim.cert_file)))
    anyio.run(run)
    ms = {name: round(statistics.median(values) * 1000, 2) for name, values in samples.items()}
    return {"calls": calls, "tool_median_ms": ms["tool"], "direct_keepalive_median_ms": ms["direct"],
            "ratio": round(ms["tool"] / ms["direct"], 2), "direct_one_off_get_median_ms": ms["one_off"],
            "ratio_vs_one_off_get": round(ms["tool"] / ms["one_off"], 2),
            "mcp_round_trip_no_request_ms": ms["no_request"]}


def coverage_label(lab) -> str:
    """backup_coverage's budget: 2 + storages + datastores, counting each node's own `local` as a
    storage (PBS-backed storages included: they are read through PBS)."""
    storages = sum(1 if entry["shared"] else len(lab.storage_nodes(entry)) for entry in lab.storages.values()
                   if "backup" in entry["content"].split(","))
    return f"backup_coverage ({storages} backup storages, {len(lab.datastores)} datastore(s): " \
           f"budget {2 + storages + len(lab.datastores)})"


def answer_bytes(result) -> int:
    """Everything the client receives for one call: content and flags, as JSON."""
    return len(json.dumps(result.model_dump(mode="json", by_alias=True, exclude_none=True), separators=(",", ":")))


def counted(sim, action, product: str | None = None) -> int:
    before = len(sim.lab.requests)
    action()
    return len([r for r in sim.lab.requests[before:] if r[2] != "/access/permissions"
                and (product is None or r[0] == product)])


def http_concurrency(clients: int = 50, calls: int = 20) -> dict:
    """50 MCP clients over Streamable HTTP, 20 read calls each, all at once."""
    import anyio
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client
    from test_http import http_server

    token = "bench-bearer-token-0123456789abcdef"
    latencies: list[float] = []
    errors = [0]

    async def one(url: str) -> None:
        transport = streamable_http_client(url, http_client=create_mcp_http_client(
            headers={"Authorization": f"Bearer {token}"}))
        async with Client(transport, mode="legacy") as client:
            for _ in range(calls):
                started = time.perf_counter()
                result = await client.call_tool("list_guests", {})
                latencies.append(time.perf_counter() - started)
                errors[0] += int(result.is_error)

    async def run_all(url: str) -> None:
        async with anyio.create_task_group() as group:
            for _ in range(clients):
                group.start_soon(one, url)

    with simulator.Simulator(simulator.Lab.homelab()) as sim, \
            http_server(sim.env() | {"MCP_AUTH_TOKEN": token}) as base:
        started = time.perf_counter()
        anyio.run(run_all, base + "/mcp")
        wall = time.perf_counter() - started
    latencies.sort()
    return {"calls": len(latencies), "errors": errors[0], "wall_s": round(wall, 2),
            "p50_ms": round(latencies[len(latencies) // 2] * 1000, 1),
            "p95_ms": round(latencies[int(len(latencies) * 0.95)] * 1000, 1)}


def memory_after_calls(calls: int) -> dict:
    """RSS of the server process after half and after all of many read calls over HTTP."""
    import socket

    import anyio
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    def rss_mb(pid: int) -> float:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
        return 0.0

    token = "bench-bearer-token-0123456789abcdef"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    samples: dict[str, float] = {}
    with simulator.Simulator(simulator.Lab.homelab()) as sim:
        process = subprocess.Popen([sys.executable, str(ROOT / "server.py"), "--http", "--port", str(port)],
                                   env=server_env(sim.env() | {"MCP_AUTH_TOKEN": token}),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    requests.get(f"http://127.0.0.1:{port}/health", timeout=1)
                    break
                except requests.ConnectionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)

            async def run() -> None:
                transport = streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=create_mcp_http_client(
                    headers={"Authorization": f"Bearer {token}"}))
                async with Client(transport, mode="legacy") as client:
                    samples["start_mb"] = rss_mb(process.pid)
                    for index in range(calls):
                        await client.call_tool("list_guests" if index % 2 else "cluster_status", {})
                        if index == calls // 2:
                            samples["half_mb"] = rss_mb(process.pid)
                    samples["end_mb"] = rss_mb(process.pid)
            anyio.run(run)
        finally:
            process.terminate()
            process.wait(timeout=10)
    return {"calls": calls} | samples


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
        # with two PVE hosts every PVE tool takes `host` (left out when there is only one)
        "default, two PVE hosts": tool_list_bytes(hosts | {"PROXMOX_B_URL": "https://192.0.2.3",
                                                           "PROXMOX_B_TOKEN": "a@pve!t=" + "s" * 36}),
    }

    with simulator.Simulator(simulator.Lab.homelab()) as sim:
        with stdio_session(sim.env(), log_name="bench") as session:
            session.ok("list_hosts")
            figures["list_guests_6_answer_bytes"] = answer_bytes(session.call("list_guests"))
            figures["requests_per_action"] = {
                "list_guests": counted(sim, lambda: session.ok("list_guests")),
                "get_guest": counted(sim, lambda: session.ok("get_guest", {"vmid": 102})),
                "health_check PVE requests (3 nodes: budget 9)":
                    counted(sim, lambda: session.ok("health_check"), "pve"),
                "health_check PBS requests": counted(sim, lambda: session.ok("health_check"), "pbs"),
                coverage_label(sim.lab): counted(sim, lambda: session.ok("backup_coverage")),
            }
        figures["overhead"] = overhead(sim, 50 if quick else 200)

        starts = []
        for _ in range(3 if quick else 7):
            started = time.perf_counter()
            with stdio_session(sim.env(), log_name="bench-start") as fresh:
                fresh.tools()
            starts.append(time.perf_counter() - started)
        figures["startup_to_tools_list_median_s"] = round(statistics.median(starts), 3)
        runs = 3 if quick else 7
        figures["startup_parts_median_s"] = {
            "python alone": median_seconds([sys.executable, "-c", "pass"], runs),
            "import the mcp SDK (MCPServer)":
                median_seconds([sys.executable, "-c", "import mcp.server.mcpserver"], runs),
            "import server.py": median_seconds([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
                                                "import server"], runs),
        }
        figures["fault_answers"] = fault_timings(sim)

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

    figures["http_50_clients_x_20_calls"] = http_concurrency()
    figures["memory_after_calls"] = memory_after_calls(2000 if quick else 10_000)
    (ROOT / "bench" / "results.json").write_text(json.dumps(figures, indent=1) + "\n")
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
