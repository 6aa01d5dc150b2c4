"""HTTP mode: bearer token, DNS-rebinding checks, /health, refusals to start, and the tools
through the SDK's Streamable HTTP client."""
import socket
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest
import requests
from anyio.from_thread import start_blocking_portal

from conftest import ROOT, Session, everything_open, log_dir, requests_during, run_server, server_env, stdio_fork_server

TOKEN = "test-bearer-token-0123456789abcdef"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def http_server(env: dict, *args: str, port: int | None = None):
    """`python server.py --http` with this environment, forked from the process that imported the
    server once (tests/fork_server.py, as stdio sessions are); stopped with SIGTERM."""
    port = port or free_port()
    with open(log_dir() / "http.log", "a") as log:
        process = subprocess.Popen([sys.executable, str(ROOT / "tests" / "stdio_launcher.py"), "--http", "--port",
                                    str(port), *args],
                                   env=server_env(env) | {"FORK_SERVER_SOCKET": stdio_fork_server()},
                                   stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=str(log_dir()))
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 30
            while True:  # readiness: poll until the port answers (not a synchronisation sleep)
                assert process.poll() is None, "server exited"
                try:
                    requests.get(base + "/health", timeout=1)
                    break
                except requests.ConnectionError:
                    assert time.monotonic() < deadline, "server did not start"
                    time.sleep(0.1)
            yield base
        finally:
            process.terminate()
            process.wait(timeout=10)


@pytest.fixture(scope="module")
def http(sim):
    with http_server(sim.env() | {"MCP_AUTH_TOKEN": TOKEN}) as base:
        yield base


@contextmanager
def http_session(url: str, token: str = TOKEN, mode: str = "auto", **client_kw):
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    with start_blocking_portal() as portal:
        transport = streamable_http_client(url, http_client=create_mcp_http_client(
            headers={"Authorization": f"Bearer {token}"}))
        with portal.wrap_async_context_manager(Client(transport, mode=mode, **client_kw)) as client:
            yield Session(portal, client)


INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "t", "version": "1"}}}
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def test_requests_without_or_with_a_wrong_bearer_get_401(http):
    assert requests.post(http + "/mcp", json=INIT, headers=HEADERS, timeout=10).status_code == 401
    wrong = HEADERS | {"Authorization": "Bearer not-the-token-at-all-000000"}
    assert requests.post(http + "/mcp", json=INIT, headers=wrong, timeout=10).status_code == 401
    basic = HEADERS | {"Authorization": f"Basic {TOKEN}"}
    assert requests.post(http + "/mcp", json=INIT, headers=basic, timeout=10).status_code == 401
    right = HEADERS | {"Authorization": f"Bearer {TOKEN}"}
    assert requests.post(http + "/mcp", json=INIT, headers=right, timeout=10).status_code == 200


def test_foreign_host_and_origin_are_refused(http):
    auth = HEADERS | {"Authorization": f"Bearer {TOKEN}"}
    response = requests.post(http + "/mcp", json=INIT, headers=auth | {"Host": "evil.example"}, timeout=10)
    assert response.status_code == 421
    response = requests.post(http + "/mcp", json=INIT, headers=auth | {"Origin": "http://evil.example"}, timeout=10)
    assert response.status_code == 403


def test_health_answers_without_secrets_and_shows_hosts_to_a_bearer_holder(http, sim):
    public = requests.get(http + "/health", timeout=10).json()
    assert public["status"] == "ok" and "hosts" not in public
    private = requests.get(http + "/health", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10).json()
    assert private["hosts"]["pve:lab"].startswith("ok 9.2") and private["hosts"]["pbs:lab"].startswith("ok")
    assert sim.lab.pve_tokens["mcp@pve!reader"].secret not in str(private)


def test_tools_over_http_in_both_eras(http):
    for mode in ("legacy", "auto"):
        with http_session(http + "/mcp", mode=mode) as session:
            assert "list_guests" in {t.name for t in session.tools()}
            assert session.ok("list_guests", {"status": "running"})["total"] == 4
            assert "No guest with vmid 999" in session.error("get_guest", {"vmid": 999})


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_the_user_is_asked_over_http_on_both_revisions(sim, tmp_path, mode):
    """docs/SECURITY.md#confirmation: over HTTP too, an eliciting client's user decides, whatever
    confirm says (2026-07-28: the input-required round trip; before: a request mid-call)."""
    from mcp_types import ElicitResult
    asked = []

    async def user(_context, params):
        asked.append(params.message)
        return ElicitResult(action="decline")
    (tmp_path / "protected.json").write_text("[]")
    with http_server(everything_open(sim, tmp_path) | {"MCP_AUTH_TOKEN": TOKEN}) as base:
        with http_session(base + "/mcp", mode=mode, elicitation_callback=user) as session:
            stop = {"vmid": 105, "action": "stop", "confirm": True}
            message, sent = requests_during(sim, lambda: session.error("write_power_guest", stop))
    assert "did not confirm" in message and [r for r in sent if r[1] != "GET"] == []
    assert len(asked) == 1 and "ci-runner (vmid 105)" in asked[0]


def test_progress_over_http(http, sim):
    upid = sim.lab.start_task("pve1", "vzdump", "100", duration=1.2)
    with http_session(http + "/mcp") as session:
        progress = []
        assert session.ok("get_task", {"upid": upid, "wait_seconds": 30}, progress=progress)["result"] == "ok"
        assert progress


@pytest.mark.parametrize("env, args, expected", [
    ({}, [], "MCP_AUTH_TOKEN"),
    ({"MCP_AUTH_REQUIRED": "false"}, ["--host", "0.0.0.0"], "non-loopback"),
    ({}, ["--host", "0.0.0.0"], "non-loopback"),
])
def test_refuses_to_start_without_a_token(env, args, expected):
    result = run_server(["--http", *args], env)
    assert result.returncode == 2 and expected in result.stderr


def test_loopback_opt_out_starts_with_a_warning(sim):
    with http_server(sim.env() | {"MCP_AUTH_REQUIRED": "false"}) as base:
        assert requests.post(base + "/mcp", json=INIT, headers=HEADERS, timeout=10).status_code == 200
    assert "MCP_AUTH_REQUIRED=false" in (log_dir() / "http.log").read_text()


def test_allowed_hosts_admit_the_names_clients_use(sim):
    env = sim.env() | {"MCP_AUTH_TOKEN": TOKEN, "MCP_ALLOWED_HOSTS": "mcp.home.arpa"}
    with http_server(env) as base:
        auth = HEADERS | {"Authorization": f"Bearer {TOKEN}"}
        port = base.rsplit(":", 1)[1]
        ok = requests.post(base + "/mcp", json=INIT, headers=auth | {"Host": f"mcp.home.arpa:{port}"}, timeout=10)
        assert ok.status_code == 200
        bad = requests.post(base + "/mcp", json=INIT, headers=auth | {"Host": "other.home.arpa"}, timeout=10)
        assert bad.status_code == 421
