"""The protected-guest list as the design says: `protected-vms.json` ships in the repository (empty,
with a comment), a configured list that is missing or broken refuses every guest write, an empty one
protects nothing but says so loudly; guests are protected as Proxmox marks them too: by a tag of
PROXMOX_PROTECTED_TAGS, and, for what destroys, by PVE's own `protection` flag. Each is tried as a
user meets it: the README's least-privilege tokens (the reader reads, the operator's write token
writes), through the tools, with nothing sent when refused."""
import hashlib
import json

import pytest

import config as config_module
from config import load_config
from conftest import ROOT, in_process, requests_during, run_server
from protection import Protected, entry_mismatches, parse_protected

TAG = "mcp-protected"


def operator_env(sim, tmp, listed=None, **extra) -> dict:
    """Reads with the reader token, writes with the operator's write token, destructive tier open."""
    (tmp / "protected.json").write_text(json.dumps(listed if listed is not None else []))
    secret = sim.lab.pve_tokens["ops@pve!operator"].secret
    return sim.env() | {"PROXMOX_LAB_WRITE_TOKEN": f"ops@pve!operator={secret}", "PROXMOX_ACCESS": "destructive",
                        "PROXMOX_PROTECTED_VMS_FILE": str(tmp / "protected.json"),
                        "PROXMOX_AUDIT_LOG": str(tmp / "audit.jsonl")} | extra


def writes(sent: list) -> list:
    return [r for r in sent if r[1] != "GET"]


# ---------------------------------------------------------------- the file the repository ships

# protected-vms.json is tracked, and users keep their edits through `git pull` with
# `git update-index --skip-worktree protected-vms.json` (README). That holds only while the repository
# never changes the file: a commit that changes it makes every such pull fail. Never change it.
PINNED = "23166a0f3af32733719fa6728dd896945a592230edc9d5593b24f338e174bc80"


def test_the_shipped_list_never_changes_so_that_skip_worktree_keeps_every_users_edits():
    text = (ROOT / "protected-vms.json").read_text()
    assert parse_protected(json.loads(text)) == []
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED, "protected-vms.json must never change (see above)"


@pytest.mark.parametrize("text, problem", [
    ('{"protected_vm": []}', "expected a list"),  # a misspelt key protects nothing: fails closed
    ('{"comment": "x"}', "expected a list"),
    ('{"comment": "x", "protected_vms": [], "extra": 1}', "expected a list"),
    ('[{"host": "home"}]', "objects"),
    ('[{"vmid": 99}]', "not a guest id"),
])
def test_a_list_of_another_shape_fails_closed(tmp_path, text, problem):
    (tmp_path / "list.json").write_text(text)
    loaded = load_config({"PROXMOX_PROTECTED_VMS_FILE": str(tmp_path / "list.json")}).settings.protected
    assert problem in loaded.error and loaded.entries == []


def test_the_comment_beside_the_list_is_read_as_proxmox_ve_mcp_writes_it(tmp_path):
    (tmp_path / "list.json").write_text(json.dumps({"comment": "mine", "protected_vms": [
        {"host": "Home ", "vmid": 100, "name": "router", "reason": "internet"}]}))
    loaded = load_config({"PROXMOX_PROTECTED_VMS_FILE": str(tmp_path / "list.json")}).settings.protected
    assert [(e["host"], e["vmid"]) for e in loaded.entries] == [("home", 100)] and loaded.error is None


# ---------------------------------------------------------------- failing closed

@pytest.mark.parametrize("content", [None, "[{broken"])
def test_a_configured_list_that_is_missing_or_broken_refuses_every_guest_write(sim, tmp_path, content):
    env = operator_env(sim, tmp_path, PROXMOX_PROTECTED_VMS_FILE=str(tmp_path / "mine.json"))
    if content is not None:
        (tmp_path / "mine.json").write_text(content)
    with in_process(env, log_name="protected-fail-closed") as session:
        assert session.ok("list_guests")["total"] == 6  # reads still work
        info = session.ok("server_info")
        assert info["protected_list_error"] and info["protected_list"] == str(tmp_path / "mine.json")
        for tool, arguments in [("write_power_guest", {"vmid": 105, "action": "start"}),
                                ("write_create_snapshot", {"vmid": 104, "name": "before_upgrade"}),
                                ("write_configure_guest", {"vmid": 104, "set": {"memory": 4096}}),
                                ("write_delete_guest", {"vmid": 103, "confirm": True})]:
            message, sent = requests_during(sim, lambda t=tool, a=arguments: session.error(t, a))
            assert "protected-guest list could not be read" in message and writes(sent) == [], tool
    started = run_server(["--list-tools"], env)
    assert "PROTECTED GUEST LIST UNREADABLE" in started.stderr and str(tmp_path / "mine.json") in started.stderr


def test_an_empty_list_is_allowed_with_a_loud_start_up_line(sim, tmp_path):
    env = operator_env(sim, tmp_path)
    started = run_server(["--list-tools"], env)
    assert started.returncode == 0
    line = next(line for line in started.stderr.splitlines() if "NO GUEST IS PROTECTED" in line)
    assert str(tmp_path / "protected.json") in line and "PROXMOX_PROTECTED_TAGS" in line
    assert "NO GUEST IS PROTECTED" not in run_server(["--list-tools"], env | {"PROXMOX_PROTECTED_TAGS": TAG}).stderr


def test_an_installed_copy_keeps_its_list_and_env_where_the_user_can_edit_them(tmp_path, monkeypatch):
    """pipx, uvx and the Desktop extension install the server where nobody edits files (a venv's
    site-packages): their .env and protected-vms.json live in the user's config directory, and every
    line about them names that directory, never the install."""
    monkeypatch.setattr(config_module, "SOURCE_TREE", False)
    monkeypatch.setattr(config_module, "PROTECTED_FILE", None)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    home = tmp_path / "config" / "proxmox-guard-mcp"
    assert config_module.settings_dir() == home
    fresh = load_config({})
    assert fresh.settings.protected.error is None and fresh.settings.protected.entries == []
    line = next(w for w in fresh.warnings if "NO GUEST IS PROTECTED" in w)
    assert str(home / "protected-vms.json") in line and "(create it)" in line and "site-packages" not in line
    home.mkdir(parents=True)
    (home / "protected-vms.json").write_text('[{"host": "*", "vmid": 100}]')
    (home / ".env").write_text("PROXMOX_ACCESS=lifecycle\n")
    assert [e["vmid"] for e in load_config({}).settings.protected.entries] == [100]
    work = tmp_path / "work"
    work.mkdir()
    (work / ".env").write_text("PROXMOX_ACCESS=destructive\n")  # a working directory may only narrow
    env, origins = config_module.read_env_files({}, cwd=work)
    assert env["PROXMOX_ACCESS"] == "lifecycle" and origins.set_by["PROXMOX_ACCESS"].startswith(str(home / ".env"))
    assert str(home / ".env") in origins.warning() and "beside server.py" not in origins.warning()


# ---------------------------------------------------------------- protected by tag

@pytest.fixture()
def tagged(sim):
    """Guest 104 (win11, a stopped VM) carries the tag, in the case a user typed it."""
    guest = sim.lab.guests[104]
    before = guest["tags"]
    guest["tags"] = guest["config"]["tags"] = "MCP-Protected;lab"
    yield guest
    guest["tags"] = before
    guest["config"].pop("tags", None)


def test_a_guest_tagged_in_proxmox_is_protected_and_its_neighbours_are_not(sim, tmp_path, tagged):
    with in_process(operator_env(sim, tmp_path, PROXMOX_PROTECTED_TAGS=f"{TAG},keep"),
                    log_name="protected-tags") as session:
        assert session.ok("server_info")["protected_tags"] == [TAG, "keep"]
        for tool, arguments in [("write_power_guest", {"vmid": 104, "action": "start"}),
                                ("write_create_snapshot", {"vmid": 104, "name": "before_upgrade"}),
                                ("write_configure_guest", {"vmid": 104, "set": {"memory": 4096}}),
                                ("write_call_api", {"method": "POST", "path": "/nodes/pve2/qemu/104/status/start"})]:
            message, sent = requests_during(sim, lambda t=tool, a=arguments: session.error(t, a))
            assert f"carries the tag '{TAG}'" in message and writes(sent) == [], (tool, message)
            resources = [r for r in sent if r[2] == "/cluster/resources"]
            assert len(resources) <= 1, f"{tool}: the tags are read once per call ({len(resources)})"
        # a bulk action reaches every guest, the tagged one too
        message, sent = requests_during(sim, lambda: session.error("write_call_api", {
            "method": "POST", "path": "/nodes/pve2/startall", "confirm": True}))
        assert "protected" in message and writes(sent) == []
        # the untagged neighbour, and the tagged guest's reads
        done, sent = requests_during(sim, lambda: session.ok("write_create_snapshot",
                                                             {"vmid": 103, "name": "before_upgrade"}))
        assert [r for r in writes(sent) if r[2].endswith("/snapshot")]
        assert session.ok("get_guest", {"vmid": 104})["name"] == "win11"
        kept = sim.lab.guests[103]["snapshots"]
        kept[:] = [s for s in kept if s["name"] != "before_upgrade"]


@pytest.mark.parametrize("value", ["mcp protected", "-x", "ok,bad!"])
def test_a_tag_that_proxmox_cannot_hold_stops_the_server(value):
    started = run_server(["--list-tools"], {"PROXMOX_PROTECTED_TAGS": value})
    assert started.returncode == 2 and "PROXMOX_PROTECTED_TAGS" in started.stderr
    assert "e.g. mcp-protected" in started.stderr


# ---------------------------------------------------------------- Proxmox's own protection flag

@pytest.fixture()
def flagged(sim):
    """Guest 103 (media, a stopped container) has Proxmox's protection flag set."""
    guest = sim.lab.guests[103]
    guest["config"]["protection"] = 1
    yield guest
    guest["config"].pop("protection", None)


def test_proxmox_itself_refuses_to_destroy_a_guest_with_the_flag(sim, flagged):
    """The simulator as Proxmox: qemu-server and pve-container refuse removing the guest or its disks
    (docs/PROXMOX-BEHAVIOUR.md#the-protection-flag)."""
    import requests
    secret = sim.lab.pve_tokens["root@pam!admin"].secret
    answer = requests.delete(sim.url("pve") + "/api2/json/nodes/pve1/lxc/103", timeout=10,
                             headers={"Authorization": f"PVEAPIToken=root@pam!admin={secret}"},
                             verify=str(sim.cert_file))
    assert answer.status_code == 500 and "can't remove CT 103 - protection mode enabled" in answer.reason
    assert 103 in sim.lab.guests


def test_the_flag_protects_a_guest_from_what_destroys_it_and_nothing_else(sim, tmp_path, flagged):
    with in_process(operator_env(sim, tmp_path), log_name="protected-flag") as session:
        for tool, arguments in [("write_delete_guest", {"vmid": 103, "confirm": True}),
                                ("write_call_api", {"method": "DELETE", "path": "/nodes/pve1/lxc/103",
                                                    "confirm": True}),
                                ("write_call_api", {"method": "DELETE", "confirm": True, "path":
                                                    "/nodes/pve1/storage/local-lvm/content/local-lvm:vm-103-disk-0"})]:
            message, sent = requests_during(sim, lambda t=tool, a=arguments: session.error(t, a))
            assert "protection flag is set" in message and writes(sent) == [], (tool, message)
        # what Proxmox allows on a protected guest, and what destroys nothing, passes
        done, sent = requests_during(sim, lambda: session.ok("write_create_snapshot",
                                                             {"vmid": 103, "name": "before_upgrade"}))
        assert writes(sent)
        done, sent = requests_during(sim, lambda: session.ok("write_configure_guest",
                                                             {"vmid": 103, "set": {"description": "photos"}}))
        assert writes(sent) and sim.lab.guests[103]["config"]["description"] == "photos"
    sim.lab.guests[103]["snapshots"] = []


# ---------------------------------------------------------------- --check knows the guests

def test_check_notices_entries_that_protect_nothing_as_meant(sim, tmp_path):
    listed = [{"host": "lab", "vmid": 100, "name": "web", "reason": "right"},
              {"host": "lab", "vmid": 101, "name": "database", "reason": "renamed since"},
              {"host": "*", "vmid": 777, "name": "old", "reason": "deleted long ago"}]
    checked = run_server(["--check"], operator_env(sim, tmp_path, listed))
    problems = [line for line in checked.stdout.splitlines() if line.startswith("PROTECTED GUEST LIST")]
    assert checked.returncode == 1 and len(problems) == 2, checked.stdout
    assert "guest 101 is named 'db' on host 'lab', the list says 'database'" in problems[0]
    assert "guest 777 (old) does not exist on host 'lab'" in problems[1]
    fixed = run_server(["--check"], operator_env(sim, tmp_path, listed[:1]))
    assert fixed.returncode == 0 and "PROTECTED GUEST LIST" not in fixed.stdout


def test_a_host_whose_token_sees_no_guest_is_not_judged():
    listed = Protected(entries=[{"host": "lab", "vmid": 100}, {"host": None, "vmid": 101}])
    assert entry_mismatches(listed, {"lab": {}}) == []
    assert len(entry_mismatches(listed, {"lab": {102: {"name": "x"}}})) == 2
