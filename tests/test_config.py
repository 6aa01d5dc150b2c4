"""Configuration: hosts by label, tokens, TLS, strictness, and what the command line does with it."""
import ast
import json
import re

import pytest

import config as config_module
import foreign_env
from config import INSTALL_DIR, default_audit_path, load_config
from errors import ConfigError
import server
from conftest import ROOT, run_server

SPECS = {spec.function.__name__: spec for spec in server.TOOLS}

TOKEN = "mcp@pve!reader=11111111-2222-3333-4444-555555555555"


def hosts_of(env: dict) -> dict:
    return {(h.product, h.label): h for h in load_config(env).hosts}


def test_labelled_hosts_of_both_products():
    hosts = hosts_of({
        "PROXMOX_HOME_URL": "https://pve.home:8006", "PROXMOX_HOME_TOKEN": TOKEN,
        "PROXMOX_OFFICE_URL": "https://10.0.0.5", "PROXMOX_OFFICE_TOKEN": "a@pam!t:secretvalue",
        "PBS_HOME_URL": "https://pbs.home", "PBS_HOME_TOKEN": "backup@pbs!mcp=pbssecretvalue",
    })
    assert set(hosts) == {("pve", "home"), ("pve", "office"), ("pbs", "home")}
    assert hosts[("pve", "office")].url == "https://10.0.0.5:8006"  # default port per product
    assert hosts[("pbs", "home")].url == "https://pbs.home:8007"
    assert hosts[("pve", "office")].token_id == "a@pam!t"  # colon accepted between id and secret
    assert hosts[("pbs", "home")].token_secret == "pbssecretvalue"  # '=' accepted for PBS too


def test_the_backup_servers_urls_reach_the_firewall_guard():
    """The guard keeps 8007 open on a node that is a Backup Server; it is handed their URLs (policy
    settings), so that it needs not the client, which needs the policy (no import cycle)."""
    config = load_config({"PROXMOX_URL": "https://pve.home", "PROXMOX_TOKEN": TOKEN,
                          "PBS_HOME_URL": "https://pbs.home", "PBS_HOME_TOKEN": "backup@pbs!mcp=pbssecretvalue"})
    assert config.settings.backup_servers == ("https://pbs.home:8007",)


def test_unlabelled_variables_mean_host_default():
    hosts = hosts_of({"PROXMOX_URL": "https://pve:8006/api2/json/", "PROXMOX_TOKEN": TOKEN})
    assert list(hosts) == [("pve", "default")]
    assert hosts[("pve", "default")].url == "https://pve:8006"


def test_token_file_keeps_the_secret_out_of_the_environment(tmp_path):
    secret_file = tmp_path / "token"
    secret_file.write_text(TOKEN + "\n")
    hosts = hosts_of({"PROXMOX_LAB_URL": "https://pve", "PROXMOX_LAB_TOKEN_FILE": str(secret_file)})
    assert hosts[("pve", "lab")].token_secret == "11111111-2222-3333-4444-555555555555"


def test_tls_options():
    fingerprint = ":".join(["AB"] * 32)
    hosts = hosts_of({"PROXMOX_A_URL": "https://a", "PROXMOX_A_TOKEN": TOKEN, "PROXMOX_A_FINGERPRINT": fingerprint,
                      "PROXMOX_B_URL": "https://b", "PROXMOX_B_TOKEN": TOKEN, "PROXMOX_B_VERIFY_TLS": "false"})
    assert hosts[("pve", "a")].fingerprint == "ab" * 32
    assert hosts[("pve", "b")].verify_tls is False
    config = load_config({"PROXMOX_VERIFY_TLS": "false", "PROXMOX_URL": "https://x", "PROXMOX_TOKEN": TOKEN})
    assert any("PROXMOX_VERIFY_TLS=false" in w for w in config.warnings)


def test_timeouts_are_configurable():
    host = hosts_of({"PROXMOX_URL": "https://x", "PROXMOX_TOKEN": TOKEN, "PROXMOX_CONNECT_TIMEOUT": "2",
                     "PROXMOX_READ_TIMEOUT": "90"})[("pve", "default")]
    assert (host.connect_timeout, host.read_timeout) == (2.0, 90.0)


@pytest.mark.parametrize("env, names", [
    ({"PROXMOX_ALLOW_EXEC": "ture"}, "PROXMOX_ALLOW_EXEC"),
    ({"PROXMOX_URL": "pve.home:8006", "PROXMOX_TOKEN": TOKEN}, "PROXMOX_URL"),
    ({"PROXMOX_URL": "https://pve", "PROXMOX_TOKEN": "root@pam"}, "PROXMOX_TOKEN"),
    ({"PROXMOX_URL": "https://pve"}, "PROXMOX_TOKEN"),
    ({"PROXMOX_LAB_TOKEN": TOKEN}, "PROXMOX_LAB_URL"),
    ({"PROXMOX_URL": "https://pve", "PROXMOX_TOKEN": TOKEN, "PROXMOX_FINGERPRINT": "abc"}, "PROXMOX_FINGERPRINT"),
    ({"PROXMOX_URL": "https://pve", "PROXMOX_TOKEN_FILE": "/nonexistent/token"}, "PROXMOX_TOKEN_FILE"),
    ({"PROXMOX_URL": "https://pve", "PROXMOX_TOKEN": TOKEN, "PROXMOX_CA_FILE": "/nonexistent"}, "PROXMOX_CA_FILE"),
    ({"PROXMOX_ACCESS": "everything"}, "PROXMOX_ACCESS"),
    ({"PROXMOX_READ_TIMEOUT": "soon"}, "PROXMOX_READ_TIMEOUT"),
    ({"MCP_AUTH_TOKEN": "short"}, "MCP_AUTH_TOKEN"),
    ({"MCP_HTTP_PORT": "99999"}, "MCP_HTTP_PORT"),
    ({"PROXMOX_SAFETY_KEEP": "0"}, "PROXMOX_SAFETY_KEEP"),
    ({"PROXMOX_SAFETY_DAYS": "forever"}, "PROXMOX_SAFETY_DAYS"),
])
def test_invalid_values_stop_with_the_variable_named(env, names):
    with pytest.raises(ConfigError) as caught:
        load_config(env)
    assert names in str(caught.value)
    assert "11111111" not in str(caught.value)  # a secret is never shown


def test_unknown_variables_are_warned_about():
    config = load_config({"PROXMOX_ALOW_EXEC": "true", "PBS_LAB_TOKN": "x", "MCP_AUTH_TOKN": "y"})
    warned = " ".join(config.warnings)
    assert "PROXMOX_ALOW_EXEC" in warned and "PBS_LAB_TOKN" in warned and "MCP_AUTH_TOKN" in warned


def test_bad_config_exits_with_one_line_naming_the_variable():
    result = run_server(["--list-tools"], {"PROXMOX_ALLOW_EXEC": "ture"})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "PROXMOX_ALLOW_EXEC" in lines[0] and "true or false" in lines[0]
    assert result.stdout == ""


def test_dotenv_is_loaded_and_the_real_environment_wins(tmp_path):
    """A working-directory .env is read (it may narrow), and the real environment wins over it."""
    (tmp_path / ".env").write_text("PROXMOX_READ_TIMEOUT=soon\nPROXMOX_DRY_RUN=maybe\n")
    result = run_server(["--list-tools", "--json"], {"PROXMOX_DRY_RUN": "true"}, cwd=tmp_path)
    assert result.returncode == 0, result.stderr  # the bad .env values lost to the real one, or were ignored
    assert json.loads(result.stdout)["tools"]


# ---------------------------------------------------------------- .env files: the operator's wins

@pytest.fixture()
def env_files(tmp_path, monkeypatch):
    """An operator's .env beside server.py and a working directory (the repository an agent edits)."""
    import config
    install, work = tmp_path / "install", tmp_path / "work"
    install.mkdir()
    work.mkdir()
    monkeypatch.setattr(config, "INSTALL_DIR", install)
    (install / ".env").write_text("PROXMOX_LAB_URL=https://pve.lab:8006\nPROXMOX_LAB_TOKEN=" + TOKEN + "\n"
                                  "PROXMOX_ACCESS=write\nPROXMOX_ALLOW_EXEC=true\nPROXMOX_ELICIT=true\n"
                                  "PROXMOX_PROTECTED_VMS=lab:100\nPROXMOX_EXEC_ALLOWED_VMIDS=104,105\n")

    def read(working_env: str, environment: dict | None = None):
        (work / ".env").write_text(working_env)
        return config.read_env_files(environment or {}, cwd=work)
    return read


@pytest.mark.parametrize("working, variable, effective, ignored", [
    # a working-directory file cannot raise the tier, open a gate, stop asking, empty the protected
    # list, point the audit log or the protected file elsewhere, add hosts or turn TLS off ...
    ("PROXMOX_ACCESS=destructive", "PROXMOX_ACCESS", "write", True),
    ("PROXMOX_LAB_ACCESS=destructive", "PROXMOX_LAB_ACCESS", None, True),
    ("PROXMOX_ALLOW_ELEVATED=true", "PROXMOX_ALLOW_ELEVATED", None, True),
    ("PROXMOX_ELICIT=false", "PROXMOX_ELICIT", "true", True),
    ("PROXMOX_PROTECTED_VMS_FILE=/dev/null", "PROXMOX_PROTECTED_VMS_FILE", None, True),
    ("PROXMOX_AUDIT_LOG=/tmp/elsewhere.jsonl", "PROXMOX_AUDIT_LOG", None, True),
    ("PROXMOX_EVIL_URL=https://evil:8006", "PROXMOX_EVIL_URL", None, True),
    ("PROXMOX_LAB_URL=https://evil:8006", "PROXMOX_LAB_URL", "https://pve.lab:8006", True),
    ("PROXMOX_VERIFY_TLS=false", "PROXMOX_VERIFY_TLS", None, True),
    ("PROXMOX_UNBLOCK=PUT /nodes/{node}/qemu/{vmid}/sendkey", "PROXMOX_UNBLOCK", None, True),
    ("PROXMOX_EXEC_ALLOWED_VMIDS=100,104", "PROXMOX_EXEC_ALLOWED_VMIDS", "104,105", True),
    # ... it may narrow: a lower tier, a gate closed, dry run, asking, more protected guests,
    # fewer guests for exec, more tools denied
    ("PROXMOX_ACCESS=read", "PROXMOX_ACCESS", "read", False),
    ("PROXMOX_LAB_ACCESS=lifecycle", "PROXMOX_LAB_ACCESS", "lifecycle", False),
    ("PROXMOX_ALLOW_EXEC=false", "PROXMOX_ALLOW_EXEC", "false", False),
    ("PROXMOX_DRY_RUN=true", "PROXMOX_DRY_RUN", "true", False),
    ("PROXMOX_PROTECTED_VMS=lab:101", "PROXMOX_PROTECTED_VMS", "lab:100,lab:101", False),
    ("PROXMOX_EXEC_ALLOWED_VMIDS=105", "PROXMOX_EXEC_ALLOWED_VMIDS", "105", False),
    ("PROXMOX_DENY_TOOLS=write_*", "PROXMOX_DENY_TOOLS", "write_*", False),
])
def test_a_working_directory_env_may_only_narrow_access(env_files, working, variable, effective, ignored):
    env, origins = env_files(working + "\n")
    assert env.get(variable) == effective
    assert (variable in origins.ignored) == ignored
    if not ignored:
        assert "working directory" in origins.set_by[variable]


def test_the_real_environment_still_wins_and_check_says_who_set_what(env_files):
    env, origins = env_files("PROXMOX_ACCESS=read\nPROXMOX_ALLOW_ELEVATED=true\n", {"PROXMOX_ACCESS": "lifecycle"})
    assert env["PROXMOX_ACCESS"] == "lifecycle" and origins.set_by["PROXMOX_ACCESS"] == "the environment"
    assert origins.set_by["PROXMOX_LAB_TOKEN"].endswith("install/.env (beside server.py)")
    lines = origins.report()
    assert any("PROXMOX_LAB_TOKEN" in line and "beside server.py" in line for line in lines)
    assert any("ignored" in line and "PROXMOX_ALLOW_ELEVATED" in line for line in lines)
    assert TOKEN.split("=")[1] not in " ".join(lines)  # names, never values


def test_ignored_working_directory_settings_are_warned_about_at_start(tmp_path):
    (tmp_path / ".env").write_text("PROXMOX_ACCESS=destructive\nPROXMOX_ALLOW_EXEC=true\n")
    result = run_server(["--list-tools"], {}, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    warned = [line for line in result.stderr.splitlines() if "may only narrow access" in line]
    assert len(warned) == 1 and "PROXMOX_ACCESS" in warned[0] and "PROXMOX_ALLOW_EXEC" in warned[0]


def test_list_tools_without_any_host_connects_nowhere():
    result = run_server(["--list-tools", "--json"], {"PROXMOX_LAB_URL": "https://192.0.2.1:8006",
                                                     "PROXMOX_LAB_TOKEN": TOKEN, "PROXMOX_CONNECT_TIMEOUT": "30"})
    assert result.returncode == 0
    listing = json.loads(result.stdout)
    names = {t["name"] for t in listing["tools"]}
    assert {"list_hosts", "cluster_status", "list_nodes", "list_guests", "get_guest", "list_storage",
            "list_tasks", "get_task"} <= names
    assert listing["total_bytes"] == sum(t["bytes"] for t in listing["tools"]) + len('{"tools":[]}') + \
        len(listing["tools"]) - 1
    assert all(t["gate"] == "read" for t in listing["tools"])
    assert "unreachable" not in result.stderr and "192.0.2.1" not in result.stderr  # no connection tried
    human = run_server(["--list-tools"], {})
    assert "tools/list is" in human.stdout


def test_logs_never_go_to_stdout_in_list_mode():
    result = run_server(["--list-tools"], {"PROXMOX_FOO": "1"})
    assert "PROXMOX_FOO" in result.stderr and "PROXMOX_FOO" not in result.stdout


def test_toolsets_choose_the_tools():
    compact = json.loads(run_server(["--list-tools", "--json"], {"PROXMOX_TOOLSETS": "compact",
                                                                 "PROXMOX_ACCESS": "write"}).stdout)
    names = {t["name"] for t in compact["tools"]}
    # the api and workflows groups of the tool table up to the write gate, and the tools every set has
    expected = {spec.function.__name__ for spec in server.TOOLS if spec.toolset in ("api", "workflows", "always")
                and spec.gate in ("read", "lifecycle", "write") and not spec.ssh}
    assert names == expected and {"api_read", "health_check", "write_call_api"} <= names
    guests = json.loads(run_server(["--list-tools", "--json"], {"PROXMOX_TOOLSETS": "guests,tasks"}).stdout)
    assert "list_guests" in {t["name"] for t in guests["tools"]} and "pbs_list_groups" not in {
        t["name"] for t in guests["tools"]}
    bad = run_server(["--list-tools"], {"PROXMOX_TOOLSETS": "guests,everything"})
    assert bad.returncode == 2 and "unknown everything" in bad.stderr


def test_allow_and_deny_tools():
    denied = json.loads(run_server(["--list-tools", "--json"], {"PROXMOX_ACCESS": "destructive",
                                                                "PROXMOX_DENY_TOOLS": "write_*,api_read"}).stdout)
    names = {t["name"] for t in denied["tools"]}
    assert not any(n.startswith("write_") for n in names) and "api_read" not in names and "list_guests" in names
    allowed = json.loads(run_server(["--list-tools", "--json"], {"PROXMOX_ALLOW_TOOLS": "list_*,get_guest"}).stdout)
    # the read tools of the default toolsets whose names start list_, and get_guest
    expected = {name for name in server.TOOLSETS["default"] + server.ALWAYS_ON if name.startswith("list_")
                and SPECS[name].gate == "read" and not SPECS[name].ssh} | {"get_guest"}
    assert {t["name"] for t in allowed["tools"]} == expected and {"list_guests", "list_hosts"} <= expected
    typo = run_server(["--list-tools"], {"PROXMOX_DENY_TOOLS": "wirte_*"})
    assert typo.returncode == 2 and "wirte_* names no tool" in typo.stderr and "list_guests" in typo.stderr


@pytest.mark.parametrize("entry, denied", [
    ("write_guest_power", {"write_power_guest"}),  # an old name: its new one
    ("write_snapshot_*", {"write_create_snapshot", "write_rollback_snapshot", "write_delete_snapshot"}),
    ("write_pbs_*", {"write_pbs_run_gc", "write_pbs_verify_backups", "write_pbs_prune_group", "write_pbs_run_job",
                     "write_pbs_edit_snapshot", "write_pbs_forget_snapshot"}),
    ("pbs_task_log", {"get_task"}),  # merged: the tool that does it now
])
def test_settings_naming_tools_by_their_names_before_the_rename_keep_working(entry, denied):
    """0.2.0 named every write_ tool verb first (visibility.RENAMED_TOOLS): a deny list written before it
    denies the same tools (never fewer), with a start-up line saying so."""
    listed = run_server(["--list-tools", "--json"], {"PROXMOX_ACCESS": "destructive", "PROXMOX_DENY_TOOLS": entry})
    names = {t["name"] for t in json.loads(listed.stdout)["tools"]}
    assert listed.returncode == 0 and not names & denied and "write_clone_guest" in names
    assert ("now means" in listed.stderr) == (entry != "write_pbs_*")  # a pattern that matches them still says nothing


def test_protected_vms_variable_adds_to_the_file(tmp_path):
    listed = tmp_path / "protected.json"
    listed.write_text('[{"host": "home", "vmid": 100, "reason": "router"}]')
    config = load_config({"PROXMOX_PROTECTED_VMS_FILE": str(listed), "PROXMOX_PROTECTED_VMS": "home:105,*:200"})
    assert [(e["host"], e["vmid"]) for e in config.settings.protected.entries] == [("home", 100), ("home", 105),
                                                                                  ("*", 200)]
    broken = load_config({"PROXMOX_PROTECTED_VMS_FILE": str(tmp_path / "missing.json"),
                                 "PROXMOX_PROTECTED_VMS": "home:105"})
    assert broken.settings.protected.error  # still fails closed
    with pytest.raises(ConfigError, match="label:vmid"):
        load_config({"PROXMOX_PROTECTED_VMS": "home-100"})


@pytest.mark.parametrize("profile", ["readonly", "operator", "admin"])
def test_profiles_are_valid_configurations(profile, tmp_path):
    # read as `docker run --env-file` reads them: comment lines skipped, the rest of a line is the
    # value, word for word (no inline comments: their text would be part of the value)
    env = {}
    for line in (ROOT / "examples" / f"{profile}.env").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            assert value == value.strip() and "#" not in value, f"{profile}.env: {line!r}"
            env[key] = value
    token = tmp_path / "token"
    token.write_text("mcp@pve!mcp=11111111-2222-3333-4444-555555555555")
    key = tmp_path / "id"
    key.write_text("not a real key")
    env = {k: (str(token) if k.endswith("TOKEN_FILE") else str(key) if k.endswith("KEY_FILE") else v)
           for k, v in env.items() if v}
    env["PROXMOX_HOME_SSH_FINGERPRINTS"] = "pve1=SHA256:" + "A" * 43
    config = load_config({k: v for k, v in env.items() if profile == "admin" or "SSH" not in k})
    assert config.hosts[0].label == "home" and config.settings.hosts[("pve", "home")].access == env["PROXMOX_ACCESS"]


def test_the_repository_ships_the_protected_list_empty_and_a_missing_one_fails_closed(tmp_path, monkeypatch):
    """protected-vms.json is part of the repository (the design names it): an empty list with a comment
    saying what to put there, read as an empty list with a loud start-up line. In a clone it must be
    there: gone (or broken) refuses every guest write. tests/test_protected_list.py has the rest."""
    assert "protected-vms.json" not in (ROOT / ".gitignore").read_text().splitlines()
    shipped = json.loads((ROOT / "protected-vms.json").read_text())
    assert shipped["protected_vms"] == [] and "skip-worktree" in shipped["comment"]
    monkeypatch.setattr(config_module, "PROTECTED_FILE", ROOT / "protected-vms.json")
    fresh = load_config({})
    assert fresh.settings.protected.entries == [] and fresh.settings.protected.error is None
    assert any("NO GUEST IS PROTECTED" in w and "protected-vms.json" in w for w in fresh.warnings)
    monkeypatch.setattr(config_module, "PROTECTED_FILE", tmp_path / "protected-vms.json")
    gone = load_config({})
    assert "does not exist" in gone.settings.protected.error
    assert any("PROTECTED GUEST LIST UNREADABLE" in w for w in gone.warnings)
    (tmp_path / "protected-vms.json").write_text("{broken")
    assert load_config({}).settings.protected.error  # present but unreadable: fails closed


def test_audit_log_defaults_outside_the_install(monkeypatch, tmp_path):
    monkeypatch.chdir(INSTALL_DIR)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert default_audit_path() == tmp_path / "proxmox-mcp" / "audit.jsonl"
    monkeypatch.chdir(tmp_path)  # never the working directory: a GUI client may start the server in /
    assert default_audit_path() == tmp_path / "proxmox-mcp" / "audit.jsonl"


def test_parsing_has_no_side_effects_and_carries_the_secrets(tmp_path):
    from masking import _known_secrets
    passphrase, mcp_token = "ssh-passphrase-value", "m" * 32
    known = tmp_path / "known_hosts"
    known.write_text("")
    before = set(_known_secrets)
    config = load_config({"PROXMOX_URL": "https://x", "PROXMOX_TOKEN": TOKEN, "PROXMOX_USER": "ops@pve",
                          "PROXMOX_PASSWORD": "a-password", "PROXMOX_WRITE_TOKEN": "w@pve!w=write-secret-value",
                          "PROXMOX_SSH_NODES": "pve1=10.0.0.1", "PROXMOX_SSH_KNOWN_HOSTS": str(known),
                          "PROXMOX_SSH_KEY_PASSPHRASE": passphrase, "MCP_AUTH_TOKEN": mcp_token})
    assert _known_secrets == before  # server.main registers them, not the parser
    assert set(config.secrets) == {"11111111-2222-3333-4444-555555555555", "a-password", "write-secret-value",
                                   passphrase, mcp_token}
    assert "a-password" not in repr(config) and mcp_token not in repr(config)


def test_an_empty_token_without_a_password_login_is_refused():
    with pytest.raises(ConfigError, match="neither PROXMOX_TOKEN nor PROXMOX_TOKEN_FILE"):
        load_config({"PROXMOX_URL": "https://x", "PROXMOX_TOKEN": ""})


# ---------------------------------------------------------------- every variable is documented

def names_in_code() -> set[str]:
    """Every PROXMOX_*, PBS_* and MCP_* name written in the server's modules (the names it reads)."""
    found = set()
    for path in [*ROOT.glob("*.py"), *ROOT.glob("auth/*.py")]:
        found |= {node.value for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Constant)
                  and isinstance(node.value, str) and re.fullmatch(r"(PROXMOX|PBS|MCP)_[A-Z0-9_]+", node.value)}
    return found


def test_every_name_the_code_reads_is_a_known_setting():
    """A variable read anywhere is in config.GLOBALS (global) or is a host's (HOST_SUFFIXES), so that
    unknown_variables, .env.example and docs/CONFIGURATION.md know it; or another server's (FOREIGN)."""
    hosts = {f"{prefix}_{suffix}" for prefix in ("PROXMOX", "PBS") for suffix in config_module.HOST_SUFFIXES}
    foreign = set(foreign_env.FOREIGN) | {prefix for prefix, _, _ in foreign_env.FOREIGN_PREFIXES}
    assert sorted(names_in_code() - set(config_module.GLOBALS) - hosts - foreign) == []


@pytest.mark.parametrize("doc", [".env.example", "docs/CONFIGURATION.md"])
def test_every_setting_is_in_the_example_and_the_reference(doc):
    """README: How to add a setting. A host's variable may be written by its suffix (`_PASSWORD`)."""
    text = (ROOT / doc).read_text()
    missing = [name for name in config_module.GLOBALS if not re.search(rf"\b{name}\b", text)]
    missing += [f"<host>_{suffix}" for suffix in config_module.HOST_SUFFIXES if not re.search(rf"_{suffix}\b", text)]
    assert missing == [], f"{doc} does not name {missing}"


def test_another_servers_narrowing_variable_is_said_to_be_honoured():
    """foreign_env.HONOURED (once hidden by config's .env narrowing rules, which had the same name)."""
    honoured, ignored = foreign_env.foreign_variables({"PROXMOX_PROTECTED_VMIDS": "100", "PVE_HOST": "pve1"})[:2]
    assert "PVE_HOST" in ignored and "not read here" in ignored
    assert "PROXMOX_PROTECTED_VMIDS" in honoured and "honoured meanwhile" in honoured
