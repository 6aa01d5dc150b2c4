"""The one admission step (policy.admit) as users meet it: the user always has the last word when
the client can ask; confirm=true only stands in for clients that cannot; elevated calls are
confirmed like destructive and exec ones; the exec allow-list holds for every way into a guest;
and the legitimate calls still work (an ACME plugin read with the sensitive gate open, a prune
with confirmation, a job edit at the destructive tier)."""
import base64
import json

import pytest

from conftest import User, everything_open, requests_during, run_server, stdio_session

PROTECTED = [{"host": "lab", "vmid": 101, "name": "db", "reason": "the production database"}]


def env_for(sim, tmp, **extra) -> dict:
    (tmp / "protected.json").write_text(json.dumps(PROTECTED))
    return everything_open(sim, tmp, **extra)


def writes(sent: list) -> list:
    return [r for r in sent if r[1] != "GET"]


# Every confirmation test runs on both protocol revisions: the SDK client's default (2026-07-28)
# and the initialize handshake.
REVISIONS = ["auto", "legacy"]


@pytest.fixture(scope="module", params=REVISIONS)
def plain(request, sim, tmp_path_factory):
    """A client that cannot ask its user (no elicitation): confirm=true stands in."""
    tmp = tmp_path_factory.mktemp("plain")
    with stdio_session(env_for(sim, tmp), mode=request.param, log_name="admission-plain") as session:
        session.tmp = tmp
        yield session


@pytest.fixture(scope="module", params=REVISIONS)
def asking(request, sim, tmp_path_factory):
    """A client that asks its user (elicitation)."""
    user = User()
    with stdio_session(env_for(sim, tmp_path_factory.mktemp("asking")), mode=request.param,
                       log_name="admission-asking", elicitation_callback=user) as session:
        session.user = user
        yield session


# ---------------------------------------------------------------- the user has the last word

def test_an_asking_client_asks_even_with_confirm_true_and_the_user_decides(asking, sim):
    stop = {"method": "POST", "path": "/nodes/pve3/lxc/105/status/stop", "confirm": True}
    asking.user.answers = ["decline"]
    message, sent = requests_during(sim, lambda: asking.error("write_call_api", stop))
    assert "did not confirm" in message and writes(sent) == []
    assert "ci-runner (vmid 105)" in asking.user.asked[-1] and "DESTRUCTIVE" in asking.user.asked[-1]
    asking.user.answers = ["accept"]
    done, sent = requests_during(sim, lambda: asking.ok("write_call_api", stop))
    assert done["data"].startswith("UPID:") and ("pve", "POST", "/nodes/pve3/lxc/105/status/stop") in sent
    sim.lab.tick()  # the stop is done; then 105 runs again, as it was, for the other revision's run
    sim.lab.guests[105]["status"] = "running"


def test_curated_tools_ask_the_user_too(asking, sim):
    snapshot = sim.lab.datastores["backup"]["groups"][("", "vm", "100")][-1]["backup-time"]
    forget = {"store": "backup", "backup_type": "vm", "backup_id": "100", "backup_time": snapshot, "confirm": True}
    asked = len(asking.user.asked)
    asking.user.answers = ["decline"]
    message, sent = requests_during(sim, lambda: asking.error("write_pbs_forget_snapshot", forget))
    assert "did not confirm" in message and writes(sent) == [] and len(asking.user.asked) == asked + 1
    asking.user.answers = ["decline"]
    assert "did not confirm" in asking.error("write_configure_guest", {"vmid": 104, "delete": ["unused0"],
                                                                       "confirm": True})
    assert "DESTRUCTIVE" in asking.user.asked[-1] and "unused0" in asking.user.asked[-1]


def test_a_client_that_cannot_ask_needs_confirm_true(plain, sim):
    sim.lab.guests[103]["snapshots"].append({"name": "admission", "snaptime": 1})
    delete = {"method": "DELETE", "path": "/nodes/pve1/lxc/103/snapshot/admission"}
    message, sent = requests_during(sim, lambda: plain.error("write_call_api", delete))
    assert "Confirmation needed" in message and "confirm=true" in message and writes(sent) == []
    assert plain.ok("write_call_api", delete | {"confirm": True})["data"].startswith("UPID:")


def test_elevated_calls_are_confirmed(plain, sim):
    reboot = {"method": "POST", "path": "/nodes/pve1/status", "params": {"command": "reboot"}}
    message, sent = requests_during(sim, lambda: plain.error("write_call_api", reboot))
    assert "ELEVATED" in message and "confirm=true" in message and writes(sent) == []
    _, sent = requests_during(sim, lambda: plain.ok("write_call_api", reboot | {"confirm": True}))
    assert ("pve", "POST", "/nodes/pve1/status") in sent
    sim.lab.later.clear()  # the reboot itself (simulator/pve_node_power.py) would take pve1 away from the next tests


def test_exec_in_a_protected_vm_is_refused_without_ssh(plain, sim):
    """The guest agent's exec goes through the API (no sshd needed): refused for a protected guest."""
    message, sent = requests_during(sim, lambda: plain.error("write_exec_guest", {"vmid": 101, "command": "true",
                                                                               "confirm": True}))
    assert "protected" in message and writes(sent) == []


def test_a_guest_file_read_is_confirmed_like_exec(plain, sim):
    read = {"vmid": 104, "path": "/etc/hostname"}
    sim.lab.guests[104]["status"] = "running"
    try:
        message, sent = requests_during(sim, lambda: plain.error("write_guest_file", read))
        assert "confirm=true" in message and not any(r[2].endswith("file-read") for r in sent)
        assert plain.ok("write_guest_file", read | {"confirm": True})["content"] == "win11\n"
    finally:
        sim.lab.guests[104]["status"] = "stopped"


# ---------------------------------------------------------------- the exec allow-list, every way in

def test_the_exec_allow_list_holds_for_every_way_into_a_guest(sim, tmp_path):
    with stdio_session(env_for(sim, tmp_path, PROXMOX_EXEC_ALLOWED_VMIDS="105"), log_name="admission-allowed") as s:
        attempts = [("write_call_api", {"method": "POST", "path": "/nodes/pve1/qemu/100/agent/exec",
                                        "params": {"command": ["id"]}}),
                    ("write_call_api", {"method": "POST", "path": "/nodes/pve1/qemu/100/agent/file-write",
                                        "params": {"file": "/etc/motd", "content": "x"}}),
                    ("api_read", {"path": "/nodes/pve1/qemu/100/agent/file-read", "params": {"file": "/etc/hostname"}}),
                    ("write_guest_file", {"vmid": 100, "path": "/etc/motd", "content": "x"}),
                    ("write_guest_file", {"vmid": 100, "path": "/etc/hostname"}),
                    ("write_exec_guest", {"vmid": 100, "command": "id"})]
        for tool, arguments in attempts:
            message, sent = requests_during(sim, lambda t=tool, a=arguments: s.error(t, a | {"confirm": True}))
            assert "PROXMOX_EXEC_ALLOWED_VMIDS" in message, (tool, message)
            assert not any(r[2].endswith(("/agent/exec", "/agent/file-write", "/agent/file-read"))
                           for r in sent), (tool, sent)


# ---------------------------------------------------------------- legitimate calls still work

def test_an_acme_plugin_is_read_with_the_sensitive_gate_open_its_credentials_masked(plain, sim):
    sim.lab.acme_plugins = [{"plugin": "dns1", "type": "dns", "api": "cf", "data": "CF_Token=cf-secret-4711",
                             "digest": "d1"}]
    one = plain.ok("api_read", {"path": "/cluster/acme/plugins/dns1"})["data"]
    assert one == {"plugin": "dns1", "type": "dns", "api": "cf", "data": "***", "digest": "d1"}
    listed = plain.ok("api_read", {"path": "/cluster/acme/plugins"})["data"]
    assert listed[0]["data"] == "***" and "cf-secret-4711" not in json.dumps(listed)


@pytest.fixture()
def snapshots_kept(sim):
    """The datastore's snapshots as they were, after a test that prunes them."""
    groups = sim.lab.datastores["backup"]["groups"]
    kept = {key: list(snapshots) for key, snapshots in groups.items()}
    yield
    groups.clear()
    groups.update(kept)


def test_a_prune_with_confirmation(plain, sim, snapshots_kept):
    prune = {"store": "backup", "backup_type": "vm", "backup_id": "100", "keep_last": 1}
    preview = plain.ok("write_pbs_prune_group", prune)
    assert preview["removed"] == 0 and len(preview["remove"]) >= 1 and "confirm=true" in preview["next"]
    done, sent = requests_during(sim, lambda: plain.ok("write_pbs_prune_group", prune | {"confirm": True}))
    assert done["removed"] == len(preview["remove"])
    assert ("pbs", "POST", "/admin/datastore/backup/prune") in sent
    assert "protected" in plain.error("write_pbs_prune_group", prune | {"backup_id": "101", "confirm": True})


def test_a_job_edit_at_the_destructive_tier(plain, sim, tmp_path):
    sim.lab.backup_jobs.append({"id": "backup-media", "type": "vzdump", "schedule": "03:00", "enabled": 1,
                                "vmid": "103,104", "storage": "local", "mode": "snapshot"})
    edit = {"method": "PUT", "path": "/cluster/backup/backup-media", "params": {"prune-backups": "keep-last=3"}}
    message = plain.error("write_call_api", edit)
    assert "DESTRUCTIVE" in message and "prune-backups" in message  # needs the user's yes
    _, sent = requests_during(sim, lambda: plain.ok("write_call_api", edit | {"confirm": True}))
    assert ("pve", "PUT", "/cluster/backup/backup-media") in sent
    # the same edit of the nightly job, which covers protected guest 101, is refused
    nightly = edit | {"path": "/cluster/backup/backup-nightly", "confirm": True}
    message, sent = requests_during(sim, lambda: plain.error("write_call_api", nightly))
    assert "protected guest 101" in message and writes(sent) == []
    # and below the destructive tier the edit is refused before the job is even read
    with stdio_session(env_for(sim, tmp_path, PROXMOX_ACCESS="write"), log_name="admission-write") as session:
        message, sent = requests_during(sim, lambda: session.error("write_call_api", edit | {"confirm": True}))
        assert "PROXMOX_ACCESS=destructive" in message and sent == []


def test_a_backup_that_prunes_its_own_guest(plain, sim):
    backup = {"method": "POST", "path": "/nodes/pve1/vzdump",
              "params": {"vmid": "103", "storage": "local", "prune-backups": "keep-last=2"}}
    assert "confirm=true" in plain.error("write_call_api", backup)
    assert plain.ok("write_call_api", backup | {"confirm": True})["data"].startswith("UPID:")


def test_a_protected_guest_is_backed_up_in_snapshot_mode_without_pruning(plain, sim):
    """Issue 25: a snapshot-mode backup that never prunes (remove=0) changes nothing on a protected VM;
    any other backup of it is refused, saying what would pass (docs/PROXMOX-BEHAVIOUR.md#job-edits)."""
    backup = {"method": "POST", "path": "/nodes/pve2/vzdump",
              "params": {"vmid": "101", "storage": "local", "mode": "snapshot", "remove": 0}}
    done, sent = requests_during(sim, lambda: plain.ok("write_call_api", backup))
    assert done["data"].startswith("UPID:") and ("pve", "POST", "/nodes/pve2/vzdump") in sent
    for params in ({"mode": "stop", "remove": 0}, {"mode": "snapshot"}, {}):
        call = backup | {"params": {"vmid": "101", "storage": "local"} | params}
        message, sent = requests_during(sim, lambda c=call: plain.error("write_call_api", c))
        assert "protected guest 101" in message and "mode=snapshot and remove=0" in message and writes(sent) == []


def test_dry_run_shows_every_gate_and_sends_nothing(plain, sim):
    call = {"method": "DELETE", "path": "/config/datastore/backup", "params": {"destroy-data": 1},
            "product": "pbs", "dry_run": True}
    with_protected = plain.error("write_call_api", call)  # the protected guests' backups are in its scope
    assert "protected" in with_protected
    plan, sent = requests_during(sim, lambda: plain.ok("write_call_api", call | {
        "method": "POST", "path": "/nodes/pve1/vzdump",
        "params": {"vmid": "103", "prune-backups": "keep-last=1"}, "product": "pve"}))
    assert plan["gate"] == "destructive" and plan["needs_confirmation"] is True and writes(sent) == []


# ---------------------------------------------------------------- contents never in the audit log

def test_audit_lines_hold_sizes_and_hashes_never_contents(plain, sim):
    sim.lab.guests[104]["status"] = "running"
    try:
        text = "root-password-in-a-file\n" * 3
        plain.ok("write_guest_file", {"vmid": 104, "path": "/etc/app.conf", "content": text, "confirm": True})
    finally:
        sim.lab.guests[104]["status"] = "stopped"
    plain.ok("write_call_api", {"method": "POST", "path": "/cluster/acme/plugins", "confirm": True,
                                "params": {"id": "dns2", "type": "dns", "api": "cf", "data": "CF_Token=cf-4712"}})
    log = (plain.tmp / "audit.jsonl").read_text()
    assert "root-password-in-a-file" not in log and base64.b64encode(text.encode()).decode()[:40] not in log
    assert "cf-4712" not in log
    lines = [json.loads(line) for line in log.splitlines()]
    write = next(line for line in lines if line["path"].endswith("file-write") and line["verdict"] == "sent")
    assert write["params"]["content"]["bytes"] == len(base64.b64encode(text.encode()))
    assert len(write["params"]["content"]["hmac_sha256"]) == 64  # keyed: docs/REVIEW-SECURITY.md F16
    assert [line["verdict"] for line in lines if line["path"] == "/cluster/acme/plugins"][-2:] == ["sending", "sent"]


def test_configuration_errors_never_echo_credentials_in_a_url():
    result = run_server(["--list-tools"], {"PROXMOX_X_URL": "https://root@pam:hunter2-secret@pve.example:8006",
                                           "PROXMOX_X_TOKEN": "a@pve!t=secret-value-0001"})
    assert result.returncode == 2 and "user name or password" in result.stderr
    assert "hunter2-secret" not in result.stderr and "root@pam" not in result.stderr
