"""The project against its floor, side by side in one interleaved run (issue 17), printed as
ratios of medians. The measuring process speaks JSON-RPC itself (bench/clients.py) and never
imports the SDK; the simulator serves in this process.

- start: launch to the tools/list answer (initialize, initialized, tools/list), the project
  against bench/baseline_server.py, a one-tool server on the same SDK; with the floor under
  both (Python alone, importing mcp.server.mcpserver);
- exit: stdin closed to the process gone, for both; and for the project over HTTP with a
  session open, SIGTERM (a container stop) to the process gone;
- a tool that sends no request: the project's list_hosts against the baseline's noop;
- a read tool: the project's cluster_status against the same GET /cluster/status made directly
  (requests.Session, keep-alive, the same pinned certificate), at a simulator answer delay of
  0, 10 and 20 ms.

    python bench/side_by_side.py [--quick]
"""
from __future__ import annotations

import compileall
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import requests
from requests.adapters import HTTPAdapter

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import simulator  # noqa: E402
from clients import HttpSession, StdioServer  # noqa: E402

PYTHON = sys.executable
BASELINE = [PYTHON, str(ROOT / "bench" / "baseline_server.py")]
PROJECT = [PYTHON, str(ROOT / "server.py")]
DELAYS_MS = (0, 10, 20)
# issue 17's targets: (figure, the most it may be)
TARGETS = {"start_ratio": 1.10, "exit_s": 0.1, "http_exit_s": 0.1, "no_request_ratio": 1.15, "read_ratio_10ms": 1.5}


def median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 2)


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def compile_project() -> None:
    """Bytecode for our modules, as the SDK's already has in site-packages: the container compiles
    at build time, and any other install writes it on its first start."""
    for path in ROOT.glob("*.py"):
        compileall.compile_file(path, quiet=1)
    compileall.compile_dir(ROOT / "simulator", quiet=1)


def server_env(extra: dict[str, str], workdir: str) -> dict[str, str]:
    """The environment of a server: no PROXMOX_/PBS_/MCP_ variables from outside, an audit log in
    the run's temporary directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PROXMOX_", "PBS_", "MCP_"))}
    return env | {"PROXMOX_AUDIT_LOG": str(Path(workdir) / "audit.jsonl")} | extra


def cpu_seconds(pid: int) -> float:
    """CPU time a process has used so far, all threads (user + system; 10 ms resolution). Less
    sensitive than wall time to what else runs on the machine."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_and_list(command: list[str], env: dict[str, str], cwd: str) -> tuple[float, float, float]:
    """(seconds from launch to the tools/list answer, the server's CPU seconds until then,
    seconds from closing stdin to exit)."""
    with StdioServer(command, env, cwd) as server:
        server.initialize()
        server.request("tools/list")
        started = time.perf_counter() - server.started
        cpu = cpu_seconds(server.process.pid)
        return started, cpu, server.close()


def python_alone() -> tuple[float, float, float]:
    """Wall seconds of `python -c pass`, start to exit (as start_and_list answers; no CPU or exit figure)."""
    return timed(lambda: subprocess.run([PYTHON, "-c", "pass"], check=True)), 0.0, 0.0


def import_sdk() -> tuple[float, float, float]:
    """Seconds the import of mcp.server.mcpserver takes, timed inside a fresh interpreter."""
    code = "import time; t = time.perf_counter(); import mcp.server.mcpserver; print(time.perf_counter() - t)"
    out = subprocess.run([PYTHON, "-c", code], check=True, capture_output=True, text=True).stdout
    return float(out), 0.0, 0.0


def start_and_exit(sim: simulator.Simulator, workdir: str, rounds: int) -> dict:
    """Each round runs all four, the order turned around every other round."""
    env = server_env(sim.env(), workdir)
    runs: dict[str, Callable[[], tuple[float, float, float]]] = {
        "python_alone": python_alone,
        "import_sdk": import_sdk,
        "baseline": lambda: start_and_list(BASELINE, env, workdir),
        "project": lambda: start_and_list(PROJECT, env, workdir),
    }
    samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in runs}
    for index in range(rounds):
        for name in list(runs)[::-1 if index % 2 else 1]:
            samples[name].append(runs[name]())
    start, cpu, exit_ = ({name: median_ms([sample[part] for sample in values]) for name, values in samples.items()}
                         for part in range(3))
    return {"rounds": rounds,
            "floor_ms": {"python alone (start to exit)": start["python_alone"],
                         "import mcp.server.mcpserver (inside the process)": start["import_sdk"],
                         "one-tool server (bench/baseline_server.py) to tools/list": start["baseline"]},
            "project_to_tools_list_ms": start["project"],
            "start_ratio": round(start["project"] / start["baseline"], 3),
            "server_cpu_to_tools_list_ms": {"project": cpu["project"], "baseline": cpu["baseline"]},
            "start_cpu_ratio": round(cpu["project"] / cpu["baseline"], 3),
            "exit_after_stdin_closes_ms": {"project": exit_["project"], "baseline": exit_["baseline"]},
            "exit_s": round(exit_["project"] / 1000, 3)}


def http_stop(sim: simulator.Simulator, workdir: str, rounds: int) -> dict:
    """server.py --http with a session open: SIGTERM (what a container stop sends) to exit."""
    token = "bench-bearer-token-0123456789abcdef"
    samples = []
    for _ in range(rounds):
        port = free_port()
        process = subprocess.Popen([*PROJECT, "--http", "--port", str(port)], cwd=workdir,
                                   env=server_env(sim.env() | {"MCP_AUTH_TOKEN": token}, workdir),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            base = f"http://127.0.0.1:{port}"
            wait_until_serving(base, process)
            session = HttpSession(base, token)
            session.initialize()
            session.call("list_hosts")
            stopped = time.perf_counter()
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
            samples.append(time.perf_counter() - stopped)
            session.close()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    return {"rounds": rounds, "http_exit_s": round(statistics.median(samples), 3)}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_serving(base: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            raise RuntimeError("the HTTP server exited")
        try:
            requests.get(base + "/health", timeout=1)
            return
        except requests.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def no_request_call(sim: simulator.Simulator, workdir: str, calls: int) -> dict:
    """list_hosts (answered from configuration, through all of the project's call path: tool
    visibility, argument check, the policy's call context, JSON and masking) against a tool that
    returns a constant on the bare SDK."""
    with StdioServer(PROJECT, server_env(sim.env(), workdir), workdir) as project, \
            StdioServer(BASELINE, server_env({}, workdir), workdir) as baseline:
        pairs = [(project, "list_hosts"), (baseline, "noop")]
        for server, tool in pairs:
            server.initialize()
            for _ in range(20):  # warm: worker threads started, code paths run once
                server.ok(tool)
        samples: dict[str, list[float]] = {"list_hosts": [], "noop": []}
        cpu = {tool: -cpu_seconds(server.process.pid) for server, tool in pairs}
        for index in range(calls):
            for server, tool in pairs[::-1 if index % 2 else 1]:
                samples[tool].append(timed(lambda s=server, t=tool: s.ok(t)))
        cpu = {tool: (cpu[tool] + cpu_seconds(server.process.pid)) / calls * 1000 for server, tool in pairs}
    project_ms, baseline_ms = median_ms(samples["list_hosts"]), median_ms(samples["noop"])
    return {"calls": calls, "project_list_hosts_ms": project_ms, "baseline_noop_ms": baseline_ms,
            "no_request_ratio": round(project_ms / baseline_ms, 3),
            "server_cpu_per_call_ms": {"project": round(cpu["list_hosts"], 3), "baseline": round(cpu["noop"], 3)},
            "cpu_ratio": round(cpu["list_hosts"] / cpu["noop"], 3)}


class PinnedAdapter(HTTPAdapter):
    """The project's TLS setting for a pinned host: exactly this certificate (urllib3 checks the
    SHA-256 fingerprint), no CA verification."""

    def __init__(self, fingerprint: str):
        self.fingerprint = fingerprint.replace(":", "").lower()
        super().__init__()

    def init_poolmanager(self, *args, **kwargs) -> None:
        kwargs["assert_fingerprint"] = self.fingerprint
        super().init_poolmanager(*args, **kwargs)


def direct_get(sim: simulator.Simulator) -> Callable[[], object]:
    """GET /cluster/status with the reader token, on one keep-alive connection."""
    token = "mcp@pve!reader"
    session = requests.Session()
    session.mount(sim.pve_url, PinnedAdapter(sim.fingerprint))
    session.headers["Authorization"] = f"PVEAPIToken={token}={sim.lab.pve_tokens[token].secret}"
    url = sim.pve_url + "/api2/json/cluster/status"

    def get() -> object:
        response = session.get(url, verify=False, timeout=10)
        response.raise_for_status()
        return response.json()["data"]
    return get


def read_tool(sim: simulator.Simulator, workdir: str, calls: int, blocks: int = 5) -> dict:
    """cluster_status against the same GET made directly, the two sides call by call in turn.
    The delays take turns in blocks, not call by call: on this VM the first call after a 10-20 ms
    idle wait is slower (CPUs wake up), more so for the tool's several thread and process hops."""
    get = direct_get(sim)
    samples = {delay: {"tool": [], "direct": []} for delay in DELAYS_MS}
    with StdioServer(PROJECT, server_env(sim.env(), workdir), workdir) as project:
        project.initialize()
        actions = {"tool": lambda: project.ok("cluster_status"), "direct": get}
        for _ in range(20):
            for action in actions.values():
                action()
        for block in range(blocks):
            for delay in DELAYS_MS[::-1 if block % 2 else 1]:
                sim.answer_delay = delay / 1000
                for index in range(calls // blocks):
                    for side in list(actions)[::-1 if index % 2 else 1]:
                        samples[delay][side].append(timed(actions[side]))
    sim.answer_delay = 0.0
    result: dict = {"calls": calls}
    for delay, sides in samples.items():
        tool_ms, direct_ms = median_ms(sides["tool"]), median_ms(sides["direct"])
        result[f"{delay}ms"] = {"tool_ms": tool_ms, "direct_get_ms": direct_ms, "ratio": round(tool_ms / direct_ms, 3)}
        result[f"read_ratio_{delay}ms"] = round(tool_ms / direct_ms, 3)
    return result


def verdicts(figures: dict) -> dict:
    """Each issue-17 target, its figure and whether it was met."""
    found = {key: value for part in figures.values() if isinstance(part, dict)
             for key, value in part.items() if key in TARGETS}
    return {key: {"measured": found[key], "at_most": limit, "met": found[key] <= limit}
            for key, limit in TARGETS.items()}


def machine() -> dict:
    from importlib.metadata import version
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "?")
    return {"cpus": os.cpu_count(), "cpu": cpu, "python": sys.version.split()[0], "mcp": version("mcp"),
            "load_average_before": [round(x, 2) for x in os.getloadavg()]}


def run(quick: bool = False) -> dict:
    assert "mcp" not in sys.modules, "the measuring process must not hold the SDK"
    compile_project()
    figures: dict = {"machine": machine()}
    with tempfile.TemporaryDirectory(prefix="bench-") as workdir, \
            simulator.Simulator(simulator.Lab.homelab()) as sim:
        figures["start_and_exit"] = start_and_exit(sim, workdir, 5 if quick else 15)
        figures["http_stop"] = http_stop(sim, workdir, 5 if quick else 11)
        figures["no_request_tool"] = no_request_call(sim, workdir, 200 if quick else 1000)
        figures["read_tool"] = read_tool(sim, workdir, 100 if quick else 400)
    figures["machine"]["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    assert "mcp" not in sys.modules
    figures["targets"] = verdicts(figures)
    return figures


def print_ratios(figures: dict) -> None:
    load = figures["machine"]
    print(f"{load['cpus']} CPUs ({load['cpu']}), Python {load['python']}, mcp {load['mcp']}; load average "
          f"{load['load_average_before'][0]} before, {load['load_average_after'][0]} after")
    floor = figures["start_and_exit"]["floor_ms"]
    print("floor: " + "; ".join(f"{name} {ms:.0f} ms" for name, ms in floor.items()))
    for key, verdict in figures["targets"].items():
        print(f"{key:<18} {verdict['measured']:>7}  (at most {verdict['at_most']}: "
              f"{'met' if verdict['met'] else 'NOT MET'})")
    start, call = figures["start_and_exit"], figures["no_request_tool"]
    print(f"server CPU: to tools/list x{start['start_cpu_ratio']}, per no-request call x{call['cpu_ratio']}")
    read = figures["read_tool"]
    print("read tool / direct GET: " + ", ".join(f"x{read[f'read_ratio_{d}ms']} at {d} ms" for d in DELAYS_MS))


if __name__ == "__main__":
    result = run(quick="--quick" in sys.argv)
    print_ratios(result)
    print(json.dumps(result, indent=1))
