"""Shared fixtures: one simulator per test module, and two ways to reach the server's tools.

- `stdio_session`: the way a user's client does, the SDK's `Client` over stdio (HTTP in
  test_http.py), the server in its own process. For what only MCP has (progress
  notifications, elicitation, resources, prompts, the tool list a client sees) and the
  end-to-end suites.
- `in_process`: the same interface (`call`, `ok`, `error`, `tools`) in this process, for domain
  behaviour (filters, messages, multi-step writes): the configuration comes from the same
  variables through the same steps as `server.main`, and each call goes through the same edge
  (tool-list middleware, the SDK's argument model, `server.as_tool`), without a process and a
  transport per module.

Proxmox is simulated by the `simulator` package in this process, so that tests can change its
state and count the requests it received. Its tasks finish at once unless a test asks for
running tasks (the `running_tasks` fixture, or `duration=` on `lab.start_task`).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from contextlib import ExitStack, contextmanager
from pathlib import Path
import dataclasses
from typing import Any, Iterator

import pytest
from anyio.from_thread import start_blocking_portal

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# The simulator is on loopback: never through a proxy, and requests then skips reading the proxy
# variables of the environment on every request (about a quarter of its cost).
os.environ["no_proxy"] = ",".join(filter(None, [os.environ.get("no_proxy") or os.environ.get("NO_PROXY"),
                                                "127.0.0.1", "localhost"]))

import config  # noqa: E402
import proxmox_client  # noqa: E402
import runtime  # noqa: E402
import server  # noqa: E402
import simulator  # noqa: E402
import visibility  # noqa: E402

STATE_DIR: Path | None = None  # this run's temporary state (audit logs), set by the state_dir fixture
LOGS: Path | None = None  # this run's logs: every server's stderr and every tool answer, set by state_dir too


def pytest_configure(config: pytest.Config) -> None:
    """Every server process the tests start reads the .env beside server.py (config.read_env_files),
    where the README tells users to keep their settings: its hosts would join the simulator's and
    be contacted. Stop before any test runs, naming the file."""
    if (ROOT / ".env").is_file():
        raise pytest.UsageError(f"{ROOT / '.env'} would be read by every server the tests start (its hosts "
                                f"would be contacted): move it out of the tree while the tests run, e.g. "
                                f"`mv .env ../proxmox-mcp.env`.")


# ---------------------------------------------------------------- in parallel (pytest-xdist, `-n auto`)
# Each test module runs whole on one worker: its module fixtures (simulator, servers, sshd, browser) are
# set up once, and its tests keep their order. The workers take the modules longest first (a long one
# taken last would leave the other worker idle meanwhile); the others follow in collection order.
# The ranks are these modules' shares of a whole run (the slowest tests: --durations=25).
LONGEST_FIRST = ("test_container", "test_fuzz", "test_workflows_scale", "test_real_pbs_and_tasks", "test_policy",
                 "test_default_world", "test_layout", "test_catalog_walk", "test_shell_tools", "test_dashboard_view",
                 "test_config", "test_dashboard", "test_changes_over_mcp", "test_monitor_tools")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With -n and no --dist of another kind than xdist's default: a module a worker (see LONGEST_FIRST)."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadFileScheduling
    config.option.loadscopereorder = False  # keep the order the workers collected (not by number of tests)
    return LoadFileScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a worker (pytest-xdist) the modules of LONGEST_FIRST come first; a run without -n keeps the order."""
    if hasattr(config, "workerinput"):
        rank = {name: place for place, name in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(item.module.__name__ if item.module else "", len(rank)))


def log_dir() -> Path:
    """Where this run's servers write their stderr and the tool answers are kept (inside pytest's
    temporary directory, scanned for secrets when the run ends: no_secret_in_any_output)."""
    assert LOGS is not None, "log_dir() is for tests and fixtures (the session's state_dir makes it)"
    return LOGS


def record(result: Any) -> None:
    """Keep a tool's answer, so that the end of the run can scan every answer for secrets."""
    with open(log_dir() / "tool-outputs.log", "a") as log:
        for block in result.content:
            log.write(getattr(block, "text", "") + "\n")


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
        record(result)
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


@dataclasses.dataclass(frozen=True)
class InProcessRequest:
    """What the middleware sees of a request, as the SDK's ServerRequestContext (a dataclass the
    middleware rewrites with dataclasses.replace)."""
    method: str
    params: dict | None
    session: Any


class InProcess(Session):
    """Session's interface (call, ok, error, tools) on tools in this process; see in_process.
    Each call takes the steps a call over MCP takes in the server: the arguments as JSON, the
    tool-list middleware (hidden tools, unknown arguments), the SDK's argument model of the tool
    build_server registered, server.as_tool (dry run, confirmation, masking, the ToolError edge),
    the answer as JSON."""

    def __init__(self, portal: Any):
        self.portal = portal
        self.runtime = runtime.Runtime()  # this server's own state (runtime.py), installed around each call
        self.server: Any = None

    @contextmanager
    def installed(self) -> Iterator[None]:
        """This server's state in place while a call runs; what was there before after."""
        outside = runtime.install(self.runtime)
        try:
            yield
        finally:
            runtime.install(outside)

    def call(self, name: str, arguments: dict | None = None, progress: list | None = None) -> Any:
        from mcp_types import CallToolResult
        assert progress is None, "progress notifications are an MCP feature: mark the test @pytest.mark.mcp"
        params = {"name": name, "arguments": json.loads(json.dumps(arguments or {}))}  # as a client sends them
        with self.installed():
            result = self.portal.call(self._request, "tools/call", params)
        result = CallToolResult.model_validate_json(result.model_dump_json(by_alias=True, exclude_none=True))
        record(result)
        return result

    def tools(self) -> list:
        with self.installed():
            return self.portal.call(self._request, "tools/list", None).tools

    async def _request(self, method: str, params: dict | None) -> Any:
        """One request through the server's middleware (visibility.py) to its handler."""
        request = InProcessRequest(method, params, self)
        return await visibility.current()(request, self._handle)

    async def _handle(self, request: Any) -> Any:
        from mcp.shared.exceptions import MCPError
        from mcp_types import CallToolResult, ListToolsResult, TextContent
        if request.method == "tools/list":
            return ListToolsResult(tools=await self.server.list_tools())
        try:
            return await self.server.call_tool(request.params["name"], request.params["arguments"])
        except MCPError:
            raise
        except Exception as exc:  # what MCPServer._handle_call_tool answers for a failed call
            return CallToolResult(content=[TextContent(type="text", text=str(exc))], is_error=True)


@contextmanager
def in_process(env: dict[str, str], *, log_name: str = "in-process") -> Iterator[InProcess]:
    """The tools of a server configured by `env`, in this process: configured as server.main
    does (load_configuration, apply_configuration, build_server), the privileges main reads in
    the background read before the first call, the audit log in this run's temporary state
    unless `env` names one."""
    variables = server_env({"PROXMOX_AUDIT_LOG": str(STATE_DIR / f"{log_name}-audit.jsonl")} | env)
    with start_blocking_portal() as portal:
        session = InProcess(portal)  # a fresh server's state (runtime.py), so that several can be open at once
        with session.installed():
            config = server.load_configuration(variables)
            server.apply_configuration(config)
            session.server = server.build_server(config)
            for product in ("pve", "pbs"):
                for label in proxmox_client.configured(product):
                    proxmox_client.client_for(product, label).ensure_permissions()
        yield session


class ToolSession:
    """A module's server, in process for its tests, and over MCP for its tests marked
    @pytest.mark.mcp (progress, elicitation, resources, prompts): a stdio server with the same
    variables, started before the first such test runs."""

    def __init__(self, env: dict[str, str], log_name: str, stack: ExitStack):
        self.env, self.log_name, self.stack = env, log_name, stack
        self.local = stack.enter_context(in_process(env, log_name=log_name))
        self.remote: Session | None = None

    def current(self) -> Session:
        if not OVER_MCP:
            return self.local
        if self.remote is None:
            self.remote = self.stack.enter_context(stdio_session(self.env, log_name=self.log_name))
        return self.remote

    def __getattr__(self, name: str) -> Any:  # call, ok, error, tools (and portal, client over MCP)
        return getattr(self.current(), name)


@contextmanager
def tool_session(env: dict[str, str], *, log_name: str) -> Iterator[ToolSession]:
    """The fixture most test modules use: see ToolSession."""
    with ExitStack() as stack:
        opened = ToolSession(env, log_name, stack)
        OPEN.append(opened)
        try:
            yield opened
        finally:
            OPEN.remove(opened)


OVER_MCP = False  # whether the running test is marked @pytest.mark.mcp
OPEN: list[ToolSession] = []  # the tool sessions of the running module


@pytest.fixture(autouse=True)
def _transport(request: pytest.FixtureRequest) -> Iterator[None]:
    """Tests marked mcp talk to their module's servers over MCP, started before the test runs
    (the module's fixtures, of a higher scope, are set up already)."""
    global OVER_MCP
    OVER_MCP = request.node.get_closest_marker("mcp") is not None
    if OVER_MCP:
        for opened in OPEN:
            opened.current()
    yield
    OVER_MCP = False


@pytest.fixture(scope="session", autouse=True)
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """This run's temporary state: in-process audit logs, and XDG_STATE_HOME of every server
    process, so that no test writes into the user's own audit log; and its logs (log_dir). When the
    run ends, no secret of the simulator or the tests may appear in any of them (whatever tests ran,
    in whatever order)."""
    global STATE_DIR, LOGS
    STATE_DIR = tmp_path_factory.mktemp("state")
    (STATE_DIR / "no-protected-guests.json").write_text("[]")
    config.PROTECTED_FILE = STATE_DIR / "no-protected-guests.json"  # and for load_config in this process (server_env)
    LOGS = tmp_path_factory.mktemp("logs")
    yield STATE_DIR
    written = sorted(LOGS.glob("*.log")) + sorted(tmp_path_factory.getbasetemp().rglob("*.jsonl"))
    found = secrets_in(written)
    assert not found, f"secrets in the run's outputs or logs: {found[:5]}"


# Every secret the simulator and the tests use: none may appear in a tool answer, a server log or an audit log.
SECRETS = ["11111111-2222-3333-4444-555555555555", "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
           "99999999-8888-7777-6666-555555555555", "pbs-reader-secret-0123456789", "pbs-admin-secret-9876543210",
           "test-bearer-token-0123456789abcdef", "s3cret!", "hunter2",
           "sim-ops-password-4711", "sim-tfa-password-4712", "sim-pbs-password-4713", "not-the-password",
           # passwords and tickets of the login tests
           "from-a-file", "changed-password-4714", "PVE:ops@pve:", "PBS:ops@pbs:",
           # ACME DNS credentials, a scanned server's password, guest file contents (admission tests)
           "cf-secret-4711", "cf-4712", "guess-me-123", "root-password-in-a-file", "hunter2-secret",
           # a container user's password (tests/test_lxc_admin.py): it travels on stdin only
           "ct-password-4715"]


def secrets_in(paths: list[Path]) -> list[str]:
    """`<secret prefix>... in <file>` for each secret of SECRETS found in these files."""
    found = []
    for path in paths:
        text = path.read_text(errors="replace")
        found += [f"{secret[:6]}... in {path}" for secret in SECRETS if secret in text]
    return found


@pytest.fixture()
def running_tasks(sim: simulator.Simulator) -> Iterator[None]:
    """Tasks the tools start run for a while (0.6 s), for tests about progress and waiting."""
    before, sim.lab.task_seconds = sim.lab.task_seconds, 0.6
    yield
    sim.lab.task_seconds = before


class User:
    """The person behind an eliciting client: answers each question from a script; `on_question`
    lets a test change the world while the user reads."""

    def __init__(self) -> None:
        self.answers: list[str] = []
        self.asked: list[str] = []
        self.on_question = None

    async def __call__(self, _context: Any, params: Any) -> Any:
        from mcp_types import ElicitResult
        self.asked.append(params.message)
        if self.on_question:
            self.on_question(len(self.asked))
        action = self.answers.pop(0) if self.answers else "decline"
        return ElicitResult(action=action, content={"confirm": True} if action == "accept" else None)


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
    if STATE_DIR is not None:
        env["XDG_STATE_HOME"] = str(STATE_DIR)  # the default audit log goes there, not to the user's
        # an empty list unless a test gives one: a user's own protected-vms.json in the tree is not the tests'
        env["PROXMOX_PROTECTED_VMS_FILE"] = str(STATE_DIR / "no-protected-guests.json")
    return env | extra


def everything_open(sim: Any, tmp: Path, **extra: str) -> dict[str, str]:
    """An operator's env with every tier, gate and toolset open and the admin tokens; the protected
    list and the audit log are `tmp`'s (the test writes protected.json there)."""
    return sim.env(pve_token="root@pam!admin", pbs_token="root@pam!admin") | {
        "PROXMOX_TOOLSETS": "all", "PROXMOX_ACCESS": "destructive", "PROXMOX_ALLOW_EXEC": "true",
        "PROXMOX_ALLOW_ELEVATED": "true", "PROXMOX_ALLOW_SENSITIVE": "true",
        "PROXMOX_PROTECTED_VMS_FILE": str(tmp / "protected.json"),
        "PROXMOX_AUDIT_LOG": str(tmp / "audit.jsonl"), "PROXMOX_RESTORE_DIR": str(tmp / "restored")} | extra


@contextmanager
def stdio_session(env: dict[str, str], *, mode: str = "auto", log_name: str = "server",
                  args: list[str] | None = None, fresh_process: bool = False, **client_kw: Any) -> Iterator[Session]:
    """An MCP client session with the server on stdio. The server is forked from a process that
    imported it once (tests/fork_server.py --stdio; its start is what `python server.py` does after
    the imports), unless `fresh_process` asks for a real `python server.py` (a test of the start)."""
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters, stdio_client

    if fresh_process:
        command, variables = [str(ROOT / "server.py")], server_env(env)
    else:
        command, variables = [str(ROOT / "tests" / "stdio_launcher.py")], server_env(env) | {
            "FORK_SERVER_SOCKET": stdio_fork_server()}
    params = StdioServerParameters(command=sys.executable, args=[*command, *(args or [])],
                                   env=variables, cwd=str(log_dir()))
    with open(log_dir() / f"{log_name}.log", "a") as errlog, start_blocking_portal() as portal:
        with portal.wrap_async_context_manager(
                Client(stdio_client(params, errlog=errlog), mode=mode, **client_kw)) as client:
            yield Session(portal, client)


@pytest.fixture(scope="module")
def sim() -> Iterator[simulator.Simulator]:
    lab = simulator.Lab.homelab()
    lab.task_seconds = 0  # tasks finish at once; see running_tasks
    with simulator.Simulator(lab) as running:
        yield running
        # every request the project sent must be one the official schema allows
        assert running.lab.schema_rejections == [], running.lab.schema_rejections


@pytest.fixture(scope="module")
def session(sim: simulator.Simulator, request: pytest.FixtureRequest) -> Iterator[ToolSession]:
    """The server pointed at the module's simulator with the reader tokens (see ToolSession)."""
    with tool_session(sim.env(), log_name=request.module.__name__) as running:
        yield running


FORK_SERVER: subprocess.Popen | None = None  # tests/fork_server.py, started on first use
STDIO_FORK_SERVER: tuple[subprocess.Popen, str] | None = None  # tests/fork_server.py --stdio and its socket


def stdio_fork_server() -> str:
    """The socket of the process stdio sessions are forked from (started on first use)."""
    global STDIO_FORK_SERVER
    if STDIO_FORK_SERVER is None:
        path = str(STATE_DIR / "stdio-fork.sock")
        process = subprocess.Popen([sys.executable, str(ROOT / "tests" / "fork_server.py"), "--stdio", path],
                                   env=server_env({}), stdout=subprocess.PIPE, text=True)
        assert process.stdout.readline().strip() == "ready", "tests/fork_server.py --stdio did not start"
        STDIO_FORK_SERVER = (process, path)
    return STDIO_FORK_SERVER[1]


def run_server(args: list[str], env: dict[str, str], timeout: float = 60,
               cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`python server.py ARGS` to completion (for --list-tools, --check, bad config): a process of
    its own with a clean environment, its stdout, stderr and exit code, in `cwd` (the run's log
    folder unless given), its stdin empty. It is forked from one that imported server.py once
    (tests/fork_server.py), as the imports cost more than the run."""
    global FORK_SERVER
    if FORK_SERVER is None:
        FORK_SERVER = subprocess.Popen([sys.executable, str(ROOT / "tests" / "fork_server.py")], env=server_env({}),
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        out.touch()
        err.touch()
        request = {"args": args, "env": server_env(env), "cwd": str(cwd or log_dir()),
                   "stdout": str(out), "stderr": str(err), "timeout": timeout}
        FORK_SERVER.stdin.write(json.dumps(request) + "\n")
        FORK_SERVER.stdin.flush()
        reply = json.loads(FORK_SERVER.stdout.readline())
        if reply["timed_out"]:
            raise subprocess.TimeoutExpired(["server.py", *args], timeout)
        return subprocess.CompletedProcess(["server.py", *args], reply["returncode"], out.read_text(), err.read_text())


@pytest.fixture(scope="session", autouse=True)
def _fork_server_ends() -> Iterator[None]:
    yield
    end_fork_servers()


def end_fork_servers() -> None:
    global FORK_SERVER, STDIO_FORK_SERVER
    if STDIO_FORK_SERVER is not None:
        STDIO_FORK_SERVER[0].terminate()
        STDIO_FORK_SERVER[0].wait(timeout=10)
    if FORK_SERVER is not None:
        FORK_SERVER.stdin.close()
        FORK_SERVER.wait(timeout=10)
    FORK_SERVER = STDIO_FORK_SERVER = None


@contextmanager
def as_a_script() -> Iterator[Path]:
    """What the session's fixtures give the tests, for a test file run as a script (the README's
    `python tests/test_dashboard_view.py docs/`): this run's state and logs in a temporary folder (no
    protected guests, no audit log of the user's), the forked servers ended when it is done."""
    global STATE_DIR, LOGS
    with tempfile.TemporaryDirectory() as folder:
        STATE_DIR, LOGS = Path(folder) / "state", Path(folder) / "logs"
        STATE_DIR.mkdir()
        LOGS.mkdir()
        (STATE_DIR / "no-protected-guests.json").write_text("[]")
        try:
            yield Path(folder)
        finally:
            end_fork_servers()
            STATE_DIR = LOGS = None
