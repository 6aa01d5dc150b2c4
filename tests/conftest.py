"""Shared fixtures: one simulator and one MCP server session per test module.

Tests talk to the server the way a user's client does: the SDK's `Client` over stdio (or
HTTP), the server in its own process, Proxmox simulated by the `simulator` package in this process
so that tests can change its state and count the requests it received.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest
from anyio.from_thread import start_blocking_portal

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import simulator  # noqa: E402

LOG_DIR = ROOT / "tests" / ".logs"  # every server's stderr, scanned for secrets at the end


class Session:
    """A synchronous face on the SDK client, for plain test functions."""

    def __init__(self, portal: Any, client: Any):
        self.portal = portal
        self.client = client

    def call(self, name: str, arguments: dict | None = None, progress: list | None = None) -> Any:
        callback = None
        if progress is not None:
            async def callback(done: float, total: float | None, message: str | None) -> None:
                progress.append((done, total, message))
        result = self.portal.call(lambda: self.client.call_tool(name, arguments or {}, progress_callback=callback))
        with open(LOG_DIR / "tool-outputs.log", "a") as record:  # scanned for secrets by test_zz_secrets
            for block in result.content:
                record.write(getattr(block, "text", "") + "\n")
        return result

    def ok(self, name: str, arguments: dict | None = None, **kw: Any) -> Any:
        """Call a tool that must succeed; return its JSON answer."""
        result = self.call(name, arguments, **kw)
        text = result.content[0].text if result.content else ""
        assert not result.is_error, f"{name} failed: {text}"
        return json.loads(text)

    def error(self, name: str, arguments: dict | None = None) -> str:
        """Call a tool that must fail; return its message."""
        result = self.call(name, arguments)
        assert result.is_error, f"{name} should have failed: {result.content}"
        return result.content[0].text

    def tools(self) -> list:
        return self.portal.call(self.client.list_tools).tools


def requests_during(sim: Any, action: Any, *, writes: bool = False) -> tuple[Any, list]:
    """Run `action` and return its result with the requests the simulator received meanwhile
    (only non-GET ones with writes=True). Background reads of token privileges (and of the PVE
    version they depend on) are left out."""
    before = len(sim.lab.requests)
    result = action()
    sent = [r for r in sim.lab.requests[before:] if r[2] not in ("/access/permissions", "/version")
            and (not writes or r[1] != "GET")]
    return result, sent


def server_env(extra: dict[str, str]) -> dict[str, str]:
    """A clean environment for a server process: no PROXMOX_/PBS_/MCP_ variables from outside."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PROXMOX_", "PBS_", "MCP_"))}
    return env | extra


@contextmanager
def stdio_session(env: dict[str, str], *, mode: str = "legacy", log_name: str = "server",
                  args: list[str] | None = None, **client_kw: Any) -> Iterator[Session]:
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters, stdio_client

    LOG_DIR.mkdir(exist_ok=True)
    params = StdioServerParameters(command=sys.executable, args=[str(ROOT / "server.py"), *(args or [])],
                                   env=server_env(env), cwd=str(LOG_DIR))
    with open(LOG_DIR / f"{log_name}.log", "a") as errlog, start_blocking_portal() as portal:
        with portal.wrap_async_context_manager(
                Client(stdio_client(params, errlog=errlog), mode=mode, **client_kw)) as client:
            yield Session(portal, client)


@pytest.fixture(scope="session", autouse=True)
def own_state_directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Servers started by tests keep their default audit log in a temporary state directory, never
    in the user's ~/.local/state."""
    before = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("state"))
    yield
    if before is None:
        os.environ.pop("XDG_STATE_HOME", None)
    else:
        os.environ["XDG_STATE_HOME"] = before


@pytest.fixture(scope="module")
def sim() -> Iterator[simulator.Simulator]:
    with simulator.Simulator(simulator.Lab.homelab()) as running:
        yield running
        # every request the project sent must be one the official schema allows
        assert running.lab.schema_rejections == [], running.lab.schema_rejections


@pytest.fixture(scope="module")
def session(sim: simulator.Simulator, request: pytest.FixtureRequest) -> Iterator[Session]:
    """The server over stdio, pointed at the module's simulator with the reader tokens."""
    with stdio_session(sim.env(), log_name=request.module.__name__) as running:
        yield running


def run_server(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    """Run `server.py` with arguments to completion (for --list-tools, --check, bad config)."""
    return subprocess.run([sys.executable, str(ROOT / "server.py"), *args], env=server_env(env),
                          cwd=str(LOG_DIR if LOG_DIR.exists() else ROOT), capture_output=True, text=True,
                          timeout=timeout)
