"""What a newcomer stumbled on, each as they met it: the bearer token the README's container section
makes, a start that fails in a client, opt-in toolsets and the values that open them, what the
server reads at start, and pvemcp's instances.json (the protected list's items and --check are in
tests/test_protected_list.py and tests/test_cli.py)."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dotenv import dotenv_values

import config as config_module
from config import load_config, parse_toolsets
from errors import ConfigError
from conftest import ROOT, in_process, log_dir, run_server, server_env, stdio_session

README = (ROOT / "README.md").read_text()


# ---------------------------------------------------------------- the bearer token

@pytest.mark.parametrize("token, why", [
    ("$(openssl rand -hex 32)", "shell command"),  # what the container section's .env line used to leave there
    ("`openssl rand -hex 32`", "shell command"),
    ("a" * 20 + " " + "b" * 20, "whitespace"),
    ("0123456789abcdef0123456789abcde", "31 characters"),
])
def test_a_bearer_token_that_is_no_token_stops_the_server_with_the_command_that_writes_one(token, why, tmp_path):
    with pytest.raises(ConfigError, match=why) as refused:
        load_config({"MCP_AUTH_TOKEN": token})
    message = str(refused.value)
    assert config_module.WRITE_AUTH_TOKEN in message
    assert token not in message.replace(config_module.WRITE_AUTH_TOKEN, "")
    (tmp_path / "token").write_text(token + "\n")
    with pytest.raises(ConfigError, match=f"MCP_AUTH_TOKEN_FILE .*{why}"):
        load_config({"MCP_AUTH_TOKEN_FILE": str(tmp_path / "token")})
    assert load_config({"MCP_AUTH_TOKEN": "f" * 32}).auth_token == "f" * 32


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_the_readmes_container_command_writes_a_token_the_server_takes(tmp_path):
    """The line the README's container section gives, run as a user runs it: in a shell, in the folder
    of the .env."""
    section = README.split("## Container", 1)[1].split("\n## ", 1)[0]
    assert config_module.WRITE_AUTH_TOKEN in section
    (tmp_path / ".env").write_text("PROXMOX_ACCESS=read\n")
    subprocess.run(["sh", "-c", config_module.WRITE_AUTH_TOKEN], cwd=tmp_path, check=True, timeout=30)
    written = dotenv_values(tmp_path / ".env")  # as the server and docker compose read it
    assert written["PROXMOX_ACCESS"] == "read" and len(load_config(written).auth_token) == 64


# ---------------------------------------------------------------- a start that fails, in a client

def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"a failed start said {len(lines)} lines: {stderr[-1500:]}"
    assert lines[0].startswith("proxmox-guard-mcp: ") and "Traceback" not in stderr
    return lines[0]


@pytest.mark.parametrize("env, names", [
    ({"PROXMOX_ACCESS": "writ"}, "PROXMOX_ACCESS"),
    ({"PROXMOX_TOOLSETS": "default,monitoring"}, "monitor"),
    ({"PROXMOX_LAB_URL": "https://pve1:8006"}, "PROXMOX_LAB_TOKEN"),
    ({"PROXMOX_PROTECTED_TAGS": "no spaces"}, "PROXMOX_PROTECTED_TAGS"),
])
def test_a_start_that_fails_is_one_line_naming_what_to_change(env, names):
    """What a client shows of a server that does not start is its stderr: one line, the variable, the fix."""
    started = run_server([], env)
    assert started.returncode == 2 and started.stdout == ""
    assert names in one_line(started.stderr)


def test_a_client_started_with_the_wrong_python_gets_one_line_too(tmp_path):
    """A Claude Desktop entry with the system's `python3` instead of the venv's: no packages (here:
    `-S`, no site-packages), one line saying which Python and what to run."""
    done = subprocess.run([sys.executable, "-S", str(ROOT / "server.py")], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path, env=server_env({}), stdin=subprocess.DEVNULL)
    line = one_line(done.stderr)
    assert done.returncode != 0 and "is not installed for" in line and "-m pip install -r requirements.txt" in line


@pytest.mark.mcp
def test_the_client_meets_a_failed_start_as_a_closed_connection_and_its_log_has_the_line():
    import anyio
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters, stdio_client
    log = log_dir() / "failed-start.log"
    params = StdioServerParameters(command=sys.executable, args=[str(ROOT / "server.py")],
                                   env=server_env({"PROXMOX_ACCESS": "writ"}), cwd=str(log_dir()))

    async def connect() -> None:
        with open(log, "w") as errlog:
            async with Client(stdio_client(params, errlog=errlog)):
                pass
    with pytest.raises(Exception):  # noqa: B017 - the SDK says the connection closed, in its own words
        anyio.run(connect)
    assert "PROXMOX_ACCESS='writ' is not one of read" in one_line(log.read_text())


# ---------------------------------------------------------------- opt-in toolsets

def test_server_info_names_each_hidden_tools_toolset_and_the_value_that_opens_it(sim):
    with in_process(sim.env(), log_name="newcomer-toolsets") as session:
        hidden = session.ok("server_info")["hidden_tools"]
    by_toolset = {why: names for why, names in hidden.items() if "toolset" in why}
    monitor = next(why for why, names in by_toolset.items() if "dashboard" in names)
    assert monitor == ("in the monitor toolset, not in PROXMOX_TOOLSETS=default: PROXMOX_TOOLSETS=default,monitor "
                       "offers it")
    for why, names in by_toolset.items():  # the value each line gives takes them out of the toolset's reason
        value = re.search(r": PROXMOX_TOOLSETS=(\S+) offers it", why).group(1)
        with in_process(sim.env() | {"PROXMOX_TOOLSETS": value}, log_name="newcomer-toolsets") as opened:
            still = opened.ok("server_info")["hidden_tools"]
        assert not [name for reason, hidden in still.items() if "toolset" in reason for name in hidden if name in names]
        if "it also needs this" not in why:  # else that is said, and the toolset alone opens none of them
            assert any(name not in {n for hidden in still.values() for n in hidden} for name in names), why


def test_every_toolset_value_the_docs_show_works_and_a_wrong_one_lists_the_right_ones():
    shown = set()
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / ".env.example",
                *sorted((ROOT / "examples").glob("*.env"))]:
        shown |= set(re.findall(r"PROXMOX_TOOLSETS=([a-z][a-z,]*[a-z])", doc.read_text()))
    assert {"default,monitor", "compact", "all", "default,changes"} <= shown, shown
    for value in shown:
        assert parse_toolsets(value), value
    with pytest.raises(ConfigError) as wrong:
        parse_toolsets("default,monitoring")
    assert "unknown monitoring" in str(wrong.value)
    assert all(name in str(wrong.value) for name in config_module.TOOLSET_NAMES)


# ---------------------------------------------------------------- what the server reads at start

def test_at_start_it_reads_each_hosts_version_and_privileges_and_nothing_else(sim):
    """README: it reads each host's version and its tokens' privileges at start (so that the list offers
    what the tokens may do), and sends nothing else until a tool is called."""
    assert "reads each host's version and the privileges of its tokens" in " ".join(README.split())
    before = len(sim.lab.requests)
    with stdio_session(sim.env(), log_name="newcomer-start") as client:
        client.tools()
        client.ok("list_hosts")  # answers from the configuration
    read = {(product, path) for product, _method, path in sim.lab.requests[before:]}
    assert read <= {("pve", "/access/permissions"), ("pve", "/version"), ("pbs", "/access/permissions")}, read


# ---------------------------------------------------------------- pvemcp's instances.json

INSTANCES = {"instances": {
    "Home Lab": {"url": "https://192.168.1.10:8006", "token": "${PVE_HOME_TOKEN}",
                 "fingerprint": "AB:" * 31 + "AB", "allow_writes": True, "allow_exec": False,
                 "protected_vmids": [100, 101], "local_dir": "C:/pvemcp", "verify_ssl": False,
                 "ssh": {"nodes": {"pve1": "10.0.0.11"}, "fingerprints": {"pve1": "SHA256:" + "A" * 43},
                         "user": "root"}},
    "office": {"url": "https://10.1.0.5:8006", "credentials_file": "office.token", "protected_vmids": "200"}}}


def test_pvemcps_instances_file_becomes_the_env_that_says_the_same(tmp_path, monkeypatch):
    (tmp_path / "instances.json").write_text(json.dumps(INSTANCES))
    (tmp_path / "office.token").write_text("mcp@pve!pvemcp=44444444-3333-2222-1111-000000000000\n")
    printed = run_server(["--from-pvemcp", str(tmp_path / "instances.json")], {})
    assert printed.returncode == 0 and printed.stderr == ""
    text = printed.stdout
    assert "PROXMOX_HOME_LAB_TOKEN=${PVE_HOME_TOKEN}" in text  # the secret stays in the environment
    assert "# PROXMOX_HOME_LAB_ACCESS=write" in text and "\nPROXMOX_HOME_LAB_ACCESS" not in text  # opened on purpose
    assert "verify_ssl: false is not carried over" in text and "local_dir: nothing to set" in text
    # the printed file, read as the server reads an operator's .env
    (tmp_path / ".env").write_text(text.replace("office.token", str(tmp_path / "office.token")))
    monkeypatch.setattr(config_module, "SOURCE_TREE", True)
    monkeypatch.setattr(config_module, "INSTALL_DIR", tmp_path)
    monkeypatch.setenv("PVE_HOME_TOKEN", "mcp@pve!pvemcp=55555555-4444-3333-2222-111111111111")
    env, _ = config_module.read_env_files(dict(os.environ), cwd=tmp_path)
    loaded = load_config({k: v for k, v in env.items() if k != "PROXMOX_PROTECTED_VMS_FILE"}
                         | {"PROXMOX_PROTECTED_VMS_FILE": str(ROOT / "protected-vms.json")})
    assert {(h.label, h.url, h.token_id) for h in loaded.hosts} == {
        ("home_lab", "https://192.168.1.10:8006", "mcp@pve!pvemcp"),
        ("office", "https://10.1.0.5:8006", "mcp@pve!pvemcp")}
    assert loaded.settings.hosts[("pve", "home_lab")].access == "read"
    assert [(e["host"], e["vmid"]) for e in loaded.settings.protected.entries] == [
        ("home_lab", 100), ("home_lab", 101), ("office", 200)]
    assert [t.label for t in loaded.ssh] == ["home_lab"]


@pytest.mark.parametrize("content", ["[1, 2]", "{broken", '{"instances": []}'])
def test_a_file_that_is_not_pvemcps_is_one_line(tmp_path, content):
    (tmp_path / "instances.json").write_text(content)
    printed = run_server(["--from-pvemcp", str(tmp_path / "instances.json")], {})
    assert printed.returncode == 2 and "is not pvemcp's instances file" in one_line(printed.stderr)


def test_the_readme_says_where_an_installed_copy_reads_its_settings():
    text = " ".join(README.split())
    assert "~/.config/proxmox-guard-mcp/.env" in text and "~/.config/proxmox-guard-mcp/protected-vms.json" in text
    assert Path(config_module.settings_dir()) == ROOT  # a clone: beside server.py
