"""Behaviour behind the figures of bench/ (issue 17), checked without timing anything: the
simulator's answer delay is applied, a stdio server exits when its client closes stdin, an
HTTP server stops on SIGTERM cleanly and lets a call already sent finish first. How fast is
bench/side_by_side.py's business."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import requests

import simulator
from conftest import ROOT, server_env
from test_http import TOKEN, free_port

INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                         "clientInfo": {"name": "test", "version": "0"}}}


def test_answer_delay_is_applied_before_each_answer(monkeypatch):
    waits = []
    with simulator.Simulator(simulator.Lab.homelab(), answer_delay=0.25) as sim:
        monkeypatch.setattr(simulator.https.time, "sleep", waits.append)  # record the wait instead of waiting
        secret = sim.lab.pve_tokens["mcp@pve!reader"].secret
        answer = requests.get(sim.pve_url + "/api2/json/version", verify=str(sim.cert_file), timeout=10,
                              headers={"Authorization": f"PVEAPIToken=mcp@pve!reader={secret}"})
        sim.answer_delay = 0.0  # changed while serving: no wait from now on
        missing = requests.get(sim.pve_url + "/nowhere", verify=str(sim.cert_file), timeout=10)
    assert answer.status_code == 200 and missing.status_code == 404
    assert waits == [0.25]


def test_stdio_server_exits_when_its_client_closes_stdin(sim, tmp_path):
    env = server_env(sim.env() | {"PROXMOX_AUDIT_LOG": str(tmp_path / "audit.jsonl")})
    process = subprocess.Popen([sys.executable, str(ROOT / "server.py")], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp_path)
    process.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
    process.stdin.flush()
    assert json.loads(process.stdout.readline())["id"] == 1  # serving
    process.stdin.close()
    assert process.wait(timeout=30) == 0  # a liveness check: it exits on its own, cleanly
    assert b"Traceback" not in process.stderr.read()
    process.stdout.close()
    process.stderr.close()


def start_http(env: dict, log, cwd: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    process = subprocess.Popen([sys.executable, str(ROOT / "server.py"), "--http", "--port", str(port)],
                               env=server_env(env), stdout=log, stderr=log, cwd=cwd)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:  # readiness: poll until the port answers (not a synchronisation sleep)
        assert process.poll() is None, "server exited"
        try:
            requests.get(base + "/health", timeout=1)
            return process, base
        except requests.ConnectionError:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.1)


def test_http_server_stops_on_sigterm_after_the_call_in_flight(sim, tmp_path):
    """A container stop while a write is being answered: the write completes, is audited, its
    answer reaches the client; then the server exits cleanly (status 0, no traceback)."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    audit_log = tmp_path / "audit.jsonl"
    env = sim.env(pve_token="root@pam!admin", pbs=False) | {  # a lifecycle call: more than the reader holds
        "MCP_AUTH_TOKEN": TOKEN, "PROXMOX_ACCESS": "lifecycle", "PROXMOX_AUDIT_LOG": str(audit_log)}
    log_path = tmp_path / "server.log"
    with open(log_path, "w") as log:
        process, base = start_http(env, log, tmp_path)
        try:
            async def call_then_stop() -> object:
                transport = streamable_http_client(base + "/mcp", http_client=create_mcp_http_client(
                    headers={"Authorization": f"Bearer {TOKEN}"}))
                async with Client(transport, mode="legacy") as client:
                    await client.list_tools()
                    sent = len(sim.lab.requests)
                    sim.answer_delay = 1.0  # the start's answer is on its way while the signal arrives
                    async with anyio.create_task_group() as group:
                        results = []

                        async def call() -> None:
                            results.append(await client.call_tool(
                                "write_power_guest", {"vmid": 104, "action": "start", "wait_seconds": 0}))
                        group.start_soon(call)
                        while not any(r[1] == "POST" for r in sim.lab.requests[sent:]):
                            await anyio.sleep(0.01)  # until the simulator has the POST
                        os.kill(process.pid, signal.SIGTERM)
                    return results[0]
            result = anyio.run(call_then_stop)
        finally:
            sim.answer_delay = 0.0
        status = process.wait(timeout=30)
    assert not result.is_error, result.content
    assert '"started"' in result.content[0].text
    assert status == 0
    sent = [json.loads(line) for line in audit_log.read_text().splitlines()]
    # the line written before sending, then the one after (docs/SECURITY.md, audit)
    assert [(e["path"].endswith("/qemu/104/status/start"), e["verdict"]) for e in sent] == [(True, "sending"),
                                                                                            (True, "sent")]
    assert "Traceback" not in log_path.read_text()
