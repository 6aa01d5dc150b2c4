"""The first run as a newcomer meets it (issue 16): the demo that writes, settings found where
users put them, the variables of other Proxmox MCP servers answered, and errors that say more."""
from __future__ import annotations

import errno
import json
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

import config
from config import load_config
from errors import ConfigError
from conftest import ROOT, log_dir, run_server, server_env, stdio_session
from errors import ProxmoxError

# ---------------------------------------------------------------- the demo


def test_demo_writes_refuses_a_protected_guest_and_asks_for_confirmation():
    with stdio_session({}, args=["--demo"], log_name="demo-write") as demo:
        first = {t.name for t in demo.tools()}
        info = demo.ok("server_info")
        audit_log = Path(info["audit_log"])
        assert audit_log.parent.name.startswith("pve-sim-")  # the lab's own temporary directory, not the user's
        unheld = [names for why, names in info["hidden_tools"].items() if "no configured token holds" in why]
        assert unheld == [] and "write_pbs_run_gc" in first  # admin tokens on both products
        assert {t.name for t in demo.tools()} == first  # the privilege read changed nothing: it came first

        short = demo.error("write_create_snapshot", {"vmid": 100, "name": "a"})
        assert "\n" not in short and "validation error" not in short and "argument 'name'" in short
        assert 'e.g. "before_upgrade"' in short and "Nothing was sent" in short
        made = demo.ok("write_create_snapshot", {"vmid": 100, "name": "before_upgrade"})
        assert "before_upgrade" in {row[0] for row in demo.ok("get_guest", {"vmid": 100})["snapshots"]["rows"]}, made
        assert "protected" in demo.error("write_create_snapshot", {"vmid": 101, "name": "before_upgrade"})
        asked = demo.error("write_power_guest", {"vmid": 100, "action": "stop"})
        assert "Confirmation needed" in asked and "confirm=true" in asked
        demo.ok("write_power_guest", {"vmid": 100, "action": "stop", "confirm": True})
        assert demo.ok("get_guest", {"vmid": 100})["status"] == "stopped"
        assert demo.ok("write_pbs_run_gc", {"store": "backup"})
        audited = [json.loads(line) for line in audit_log.read_text().splitlines()]
        assert [(a["verdict"], a.get("tool")) for a in audited if a["verdict"] == "sent"][-2:] == [
            ("sent", "write_power_guest"), ("sent", "write_pbs_run_gc")]


def test_demo_on_stdio_says_where_it_serves_and_how_to_connect():
    done = subprocess.run([sys.executable, str(ROOT / "server.py"), "--demo"], env=server_env({}), input="",
                          capture_output=True, text=True, timeout=60, cwd=str(log_dir()))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 0 and done.stdout == ""  # stdout carries only MCP
    assert len(lines) == 1, lines
    assert "serving MCP on stdio, waiting for a client" in lines[0]
    assert f"claude mcp add proxmox-demo -- {sys.executable} {ROOT / 'server.py'} --demo" in lines[0]


def read_lines(stream, found: queue.Queue) -> None:
    for line in stream:
        found.put(line)


def test_demo_over_http_on_loopback_makes_a_token_and_prints_the_client_line():
    from test_http import free_port, http_session
    port = free_port()
    process = subprocess.Popen([sys.executable, str(ROOT / "server.py"), "--demo", "--http", "--port", str(port)],
                               env=server_env({}), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                               cwd=str(log_dir()))
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=read_lines, args=(process.stderr, lines), daemon=True).start()
    try:
        line = ""
        while "claude mcp add" not in line:
            line = lines.get(timeout=60)
        command = re.search(r'claude mcp add --transport http proxmox-demo-http (\S+) --header "Authorization: Bearer '
                            r'([^"]+)"', line)
        assert command and command.group(1) == f"http://127.0.0.1:{port}/mcp", line
        url, token = command.groups()
        deadline = time.monotonic() + 30
        while True:  # readiness: the line is printed just before the port opens
            try:
                requests.get(url.removesuffix("/mcp") + "/health", timeout=1)
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline and process.poll() is None
                time.sleep(0.1)
        assert requests.post(url, json={}, timeout=10).status_code == 401  # the token is required
        with http_session(url, token=token) as session:
            assert session.ok("list_hosts")["rows"][0][0] == "demo"
    finally:
        process.terminate()
        process.wait(timeout=10)


# ---------------------------------------------------------------- settings found where users put them

def test_env_files_are_read_beside_server_py_then_from_the_working_directory(tmp_path, monkeypatch):
    """The operator's .env beside server.py wins; a .env in the working directory (for Claude Code,
    the repository the agent edits) may only narrow access (tests/test_config.py has the rules)."""
    install, work = tmp_path / "install", tmp_path / "work"
    install.mkdir()
    work.mkdir()
    (install / ".env").write_text("A=install\nPROXMOX_ACCESS=write\n")
    (work / ".env").write_text("A=work\nPROXMOX_ACCESS=read\n")
    monkeypatch.setattr(config, "INSTALL_DIR", install)
    env, origins = config.read_env_files({"B": "environment"}, cwd=work)
    assert (env["A"], env["B"], env["PROXMOX_ACCESS"]) == ("install", "environment", "read")
    assert origins.files == [install / ".env", work / ".env"]


def test_check_states_the_order_of_settings(sim):
    result = run_server(["--check"], sim.env())
    assert "the environment first, then .env beside server.py" in result.stdout
    assert ".env in the working directory" in result.stdout and "may only narrow access" in result.stdout


def test_a_misspelt_variable_gets_the_closest_name():
    warned = " ".join(load_config({"PROXMOX_ACESS": "write", "PROXMOX_HOME_URL": "https://pve:8006",
                                   "PROXMOX_HOME_TOKEN": "a@pve!b=c", "PROXMOX_HOME_FINGERPRNT": "AB"}).warnings)
    assert "PROXMOX_ACESS ignored (did you mean PROXMOX_ACCESS?)" in warned
    assert "did you mean PROXMOX_HOME_FINGERPRINT?" in warned


@pytest.mark.parametrize("profile", sorted((ROOT / "examples").glob("*.env")) + [ROOT / ".env.example"],
                         ids=lambda p: p.name)
def test_profiles_ship_no_empty_value_that_stops_the_server(profile):
    active = [line for line in profile.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#")]
    empty = [line for line in active if not line.split("#")[0].partition("=")[2].strip()]
    assert empty == []
    assert "pvenode cert info" in profile.read_text() or "FINGERPRINT" not in profile.read_text()


def test_the_default_audit_log_never_depends_on_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    for where in ("/", tmp_path):
        monkeypatch.chdir(where)
        assert load_config({}).settings.audit_path == tmp_path / "state" / "proxmox-mcp" / "audit.jsonl"


def test_test_servers_keep_their_audit_log_out_of_the_users_state(session):
    audit_log = Path(session.ok("server_info")["audit_log"])
    assert Path.home() / ".local" / "state" not in audit_log.parents


# ---------------------------------------------------------------- coming from another Proxmox MCP server

FOREIGN = {  # each variable a user of another server brings -> what our start-up line must name
    "PVE_HOST": "PROXMOX_URL=https://192.0.2.10:8006", "PVE_TOKEN_ID": "PROXMOX_TOKEN=mcp@pve!mcp=",
    "PVE_TOKEN_SECRET": "PROXMOX_TOKEN=", "PVE_VERIFY_SSL": "PROXMOX_FINGERPRINT=",
    "PVE_MCP_READ_ONLY": "PROXMOX_ACCESS", "PVE_MCP_ENABLE_EXEC": "PROXMOX_ALLOW_EXEC=true",
    "PVE_URL": "PROXMOX_URL=https://192.0.2.10:8006", "PVE_TOKEN": "PROXMOX_TOKEN=", "PVE_USER": "PROXMOX_USER=",
    "PVE_PASSWORD": "PROXMOX_PASSWORD=", "PVE_READONLY": "PROXMOX_ACCESS", "MCP_HTTP_TOKEN": "MCP_AUTH_TOKEN=",
    "PROXMOX_ALLOW_WRITES": "PROXMOX_ACCESS=write", "PROXMOX_ALLOW_SSH": "PROXMOX_SSH_NODES=",
    "PROXMOX_PROTECTED_VMIDS": "PROXMOX_PROTECTED_VMS=*:100", "PROXMOX_CREDENTIALS_FILE": "PROXMOX_TOKEN_FILE=",
    "PROXMOX_DEFAULT_NODE": "node=", "PVEHUB_MCP_AUTH_TOKEN": "MCP_AUTH_TOKEN=",
    "PVEHUB_PVE_URL": "PROXMOX_<LABEL>_URL",
}
VALUES = {"PVE_HOST": "https://192.0.2.10:8006", "PVE_URL": "https://192.0.2.10:8006", "PVE_TOKEN_ID": "mcp@pve!mcp",
          "PVE_TOKEN_SECRET": "secret-4242-do-not-show", "PVE_TOKEN": "mcp@pve!mcp=secret-4242-do-not-show",
          "PVE_PASSWORD": "secret-4242-do-not-show", "MCP_HTTP_TOKEN": "secret-4242-do-not-show-0123",
          "PVEHUB_MCP_AUTH_TOKEN": "secret-4242-do-not-show-0123", "PROXMOX_PROTECTED_VMIDS": "100",
          "PVE_MCP_READ_ONLY": "true", "PVE_READONLY": "1", "PVE_VERIFY_SSL": "false"}


@pytest.mark.parametrize("name", FOREIGN)
def test_each_foreign_variable_gets_one_line_saying_what_to_set(name):
    config_ = load_config({name: VALUES.get(name, "true")})
    lines = [w for w in config_.warnings if w.startswith(name + " ")]
    assert len(lines) == 1 and FOREIGN[name] in lines[0] and "Set instead:" in lines[0], config_.warnings
    assert "secret-4242" not in " ".join(config_.warnings)


def test_names_that_widen_access_are_never_honoured():
    opened = load_config({"PROXMOX_ALLOW_WRITES": "true", "PVE_MCP_ENABLE_EXEC": "true", "PROXMOX_ALLOW_SSH": "true",
                          "PVE_MCP_READ_ONLY": "false", "PVE_READONLY": "0", "MCP_HTTP_TOKEN": "t" * 32,
                          "PROXMOX_MCP_TOKEN": "t" * 32, "PVE_VERIFY_SSL": "false",
                          "PROXMOX_HOME_URL": "https://pve:8006", "PROXMOX_HOME_TOKEN": "a@pve!b=c"})
    rules = opened.settings.hosts[("pve", "home")]
    assert rules.access == "read" and not rules.allow and opened.verify_tls and opened.hosts[0].verify_tls
    assert opened.auth_token is None and not opened.ssh
    assert [h.label for h in opened.hosts] == ["home"]  # PROXMOX_MCP_TOKEN is no host labelled "mcp"


def test_names_that_narrow_access_keep_doing_so():
    kept = load_config({"PROXMOX_PROTECTED_VMIDS": "100,105"})
    assert [(e["host"], e["vmid"]) for e in kept.settings.protected.entries][-2:] == [("*", 100), ("*", 105)]
    with pytest.raises(ConfigError, match="PVE_READONLY=1 asks for read-only"):
        load_config({"PVE_READONLY": "1", "PROXMOX_ACCESS": "write"})


def test_a_pve_mcp_setup_starts_with_the_lines_to_change():
    result = run_server(["--list-tools"], {"PVE_HOST": "https://192.0.2.10:8006", "PVE_TOKEN_ID": "mcp@pve!mcp",
                                           "PVE_TOKEN_SECRET": "secret-4242-do-not-show"})
    assert result.returncode == 0
    assert "PVE_HOST is pve-mcp's setting" in result.stderr and "PROXMOX_URL=https://192.0.2.10:8006" in result.stderr
    assert "secret-4242" not in result.stderr + result.stdout


# ---------------------------------------------------------------- errors that say more

def test_http_on_the_tls_port_says_the_port_speaks_tls(sim):
    env = sim.env(pbs=False)
    env["PROXMOX_LAB_URL"] = env["PROXMOX_LAB_URL"].replace("https://", "http://")
    with stdio_session(env, log_name="plain-http") as session:
        message = session.error("list_guests")
    assert "speaks TLS" in message and f"PROXMOX_LAB_URL={sim.pve_url}" in message
    with pytest.raises(ConfigError, match="port 8006 speaks TLS"):
        load_config({"PROXMOX_HOME_URL": "http://pve:8006", "PROXMOX_HOME_TOKEN": "a@pve!b=c"})


def test_an_unreachable_address_is_tried_once_and_named(monkeypatch):
    import proxmox_client
    import urllib3.util.connection
    tried = []

    def no_route(address, *args, **kwargs):
        tried.append(address)
        raise OSError(errno.EHOSTUNREACH, "No route to host")

    monkeypatch.setattr(urllib3.util.connection, "create_connection", no_route)
    monkeypatch.setattr(proxmox_client, "SLOW_CONNECT_FAILURE", 0.0)  # every failure counts as slow here
    host = load_config({"PROXMOX_X_URL": "https://192.0.2.77:8006", "PROXMOX_X_TOKEN": "a@pve!b=c"}).hosts[0]
    with pytest.raises(ProxmoxError, match="no route to host") as caught:
        proxmox_client.ProxmoxClient(host).get("/cluster/resources")  # the privilege read first, then the request
    assert len(tried) == 1, tried  # neither retried nor tried again by the request after the privilege read
    assert "192.0.2.77" in str(caught.value)


def test_argument_errors_are_one_line_with_the_rule_and_an_example(session):
    message = session.error("get_guest", {"vmid": 5})
    assert message == "get_guest: argument 'vmid' must be at least 100 (got 5), e.g. 100. Nothing was sent."


def test_every_tool_explains_every_argument_it_refuses():
    """For every tool: a missing required argument and a value breaking each argument's rule give
    one line naming the argument and an example."""
    from pydantic import ValidationError

    import server
    from argument_errors import argument_error
    from mcp.server.mcpserver.tools import Tool
    bad = {"integer": "not-a-number", "boolean": "maybe", "string": 12345, "object": "x", "array": "x"}
    for spec in server.TOOLS:
        tool = Tool.from_function(server.as_tool(spec.function), name=spec.function.__name__)
        schema = tool.fn_metadata.arg_model.model_json_schema()
        cases = [(name, {name: breaking(prop, bad)}) for name, prop in schema.get("properties", {}).items()]
        for name in schema.get("required", []):
            cases.append((name, {}))
        for name, arguments in cases:
            try:
                tool.fn_metadata.validate_arguments(arguments)
            except ValidationError as exc:
                message = argument_error(tool.name, exc, schema)
                named = next(part for part in message.split("; ") if f"argument '{name}'" in part)
                assert "\n" not in message and "e.g." in named, (
                    f"{message} -- give '{name}' a description with 'e.g. <value>' (or add the name to "
                    f"argument_errors.NAMED_EXAMPLES) so that a refusal can show a valid value")


def breaking(prop: dict, bad: dict):
    """A value that breaks an argument's rule: a pattern it cannot match, a bound it exceeds, or the
    wrong type."""
    variant = next((v for v in prop.get("anyOf") or [prop] if v.get("type") != "null"), prop)
    if "pattern" in variant:
        return "\u00e9 !"
    if "minimum" in variant:
        return variant["minimum"] - 1
    if "maximum" in variant:
        return variant["maximum"] + 1
    return bad.get(variant.get("type"), {"an": "object"})


def test_a_host_name_not_allowed_gets_421_naming_the_variable(sim):
    from test_http import HEADERS, INIT, TOKEN, http_server
    with http_server(sim.env() | {"MCP_AUTH_TOKEN": TOKEN}) as base:
        refused = requests.post(base + "/mcp", json=INIT, timeout=10,
                                headers=HEADERS | {"Authorization": f"Bearer {TOKEN}", "Host": "mcp.home.arpa"})
    assert refused.status_code == 421
    assert "MCP_ALLOWED_HOSTS" in refused.json()["detail"] and "mcp.home.arpa" in refused.json()["detail"]


def test_the_simulator_prints_variables_to_paste():
    process = subprocess.Popen([sys.executable, "-m", "simulator", "--admin"], cwd=str(ROOT), text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=server_env({}))
    try:
        lines = [process.stdout.readline().strip() for _ in range(6)]
    finally:
        process.terminate()
        process.wait(timeout=10)
    variables = dict(line.split("=", 1) for line in lines)
    assert set(variables) == {"PROXMOX_LAB_URL", "PROXMOX_LAB_TOKEN", "PROXMOX_LAB_FINGERPRINT", "PBS_LAB_URL",
                              "PBS_LAB_TOKEN", "PBS_LAB_FINGERPRINT"}
    assert variables["PROXMOX_LAB_TOKEN"].startswith("root@pam!admin=") and not json.dumps(lines).count("{")
    assert load_config(variables).hosts
