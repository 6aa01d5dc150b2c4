"""Backup jobs through the MCP client against the simulator: what each job selects and keeps, each
change working as Proxmox's update_job applies it, each refusal (closed gate, protected guest, a
missing privilege, bad input) with nothing sent, and backup_coverage's job changes that
write_edit_backup_job applies."""
import copy
import json

import pytest

import backup_jobs
from conftest import everything_open, requests_during, tool_session

PROTECTED = [{"host": "lab", "vmid": 101, "name": "db", "reason": "the production database"}]
NIGHTLY = "backup-nightly"  # the lab's job: all guests but 104, to pbs, snapshot mode


@pytest.fixture(autouse=True)
def fresh_jobs(sim):
    before = copy.deepcopy(sim.lab.backup_jobs)
    yield
    sim.lab.backup_jobs[:] = before


def session(sim, tmp_path_factory, name, protected):
    tmp = tmp_path_factory.mktemp(name)
    (tmp / "protected.json").write_text(json.dumps(protected))
    return tool_session(everything_open(sim, tmp), log_name=f"jobs-{name}")


@pytest.fixture(scope="module")
def ops(sim, tmp_path_factory):
    """Every gate open, no guest protected: the changes themselves."""
    with session(sim, tmp_path_factory, "ops", []) as running:
        yield running


@pytest.fixture(scope="module")
def guarded(sim, tmp_path_factory):
    with session(sim, tmp_path_factory, "guarded", PROTECTED) as running:
        yield running


def rows(answer):
    return [dict(zip(answer["columns"], row, strict=True)) for row in answer["rows"]]


def job(sim, job_id):
    return next((j for j in sim.lab.backup_jobs if j["id"] == job_id), None)


def writes(sim, action):
    return requests_during(sim, action, writes=True)


def test_backup_jobs_says_what_each_selects_and_keeps(ops, sim):
    sim.lab.storages["pbs"]["config"]["prune-backups"] = "keep-last=3"
    answer = ops.ok("backup_jobs")
    assert rows(answer) == [{"id": NIGHTLY, "enabled": 1, "schedule": "02:00", "next_run": "", "storage": "pbs",
                             "mode": "snapshot", "selects": "all except 104", "guests": 5,
                             "retention": "the storage's: keep-last=3", "notes": ""}]
    assert answer["uncovered"] == [104] and answer["uncovered_total"] == 1
    del sim.lab.storages["pbs"]["config"]["prune-backups"]


def test_a_jobs_own_retention_is_read_as_proxmox_answers_it(ops, sim):
    """GET /cluster/backup answers prune-backups as an object (docs/PROXMOX-BEHAVIOUR.md#backup-jobs-after-an-edit)."""
    job(sim, NIGHTLY)["prune-backups"] = "keep-daily=7,keep-weekly=4"
    assert ops.ok("api_read", {"path": f"/cluster/backup/{NIGHTLY}"})["data"]["prune-backups"] == {"keep-daily": 7,
                                                                                             "keep-weekly": 4}
    assert rows(ops.ok("backup_jobs"))[0]["retention"] == "keep-daily=7,keep-weekly=4"


def test_create_update_and_delete_a_job(ops, sim):
    created = ops.ok("write_edit_backup_job", {"action": "create", "job_id": "weekly-win", "vmids": [104],
                                               "schedule": "sat 03:00", "storage": "pbs", "mode": "stop",
                                               "notes": "{{guestname}}"})
    assert created["selects"] == "vmids 104" and created["guests"] == [104]
    assert job(sim, "weekly-win") == {"id": "weekly-win", "type": "vzdump", "vmid": "104", "schedule": "sat 03:00",
                                           "storage": "pbs", "mode": "stop", "notes-template": "{{guestname}}",
                                           "enabled": 1}
    assert ops.ok("backup_jobs")["uncovered"] == []
    switched = ops.ok("write_edit_backup_job", {"action": "update", "job_id": "weekly-win", "pool": "prod"})
    assert switched["selects"] == "pool prod" and switched["was"] == "vmids 104"
    assert "vmid" not in job(sim, "weekly-win")  # a pool drops the vmid list (update_job)
    everything = ops.ok("write_edit_backup_job", {"action": "update", "job_id": NIGHTLY, "all_except": []})
    assert everything["selects"] == "all" and everything["guests_total"] == 6 and "exclude" not in job(sim, NIGHTLY)
    deleted = ops.ok("write_edit_backup_job", {"action": "delete", "job_id": NIGHTLY, "confirm": True})
    assert deleted["was"] == "all" and deleted["now_uncovered"] == [102, 103, 104, 105]  # prod stays covered


def test_deleting_a_job_names_the_guests_it_leaves_uncovered_within_a_bound(ops, sim, monkeypatch):
    monkeypatch.setattr(backup_jobs, "SHOWN_UNCOVERED", 2)  # the bound, met by the lab's six guests
    deleted = ops.ok("write_edit_backup_job", {"action": "delete", "job_id": NIGHTLY, "confirm": True})
    assert deleted["now_uncovered"] == [100, 101] and deleted["now_uncovered_total"] == 5


def test_a_retention_that_prunes_is_confirmed(ops, sim):
    message, sent = writes(sim, lambda: ops.error("write_edit_backup_job", {"action": "update", "job_id": NIGHTLY,
                                                                            "keep": "keep-daily=7"}))
    assert "destructive" in message.lower() and "prunes backups" in message and "confirm" in message and sent == []
    ops.ok("write_edit_backup_job", {"action": "update", "job_id": NIGHTLY, "keep": "keep-daily=7", "confirm": True})
    assert job(sim, NIGHTLY)["prune-backups"] == "keep-daily=7"
    ops.ok("write_edit_backup_job", {"action": "update", "job_id": NIGHTLY, "keep": ""})  # the storage's again
    assert "prune-backups" not in job(sim, NIGHTLY)


def test_a_dry_run_sends_nothing(ops, sim):
    plan, sent = writes(sim, lambda: ops.ok("write_edit_backup_job", {"action": "update", "job_id": NIGHTLY,
                                                                      "all_except": [104, 105], "dry_run": True}))
    assert plan["dry_run"] is True and plan["request"]["params"] == {"all": 1, "exclude": "104,105"} and sent == []


@pytest.mark.parametrize("arguments, expected", [
    ({"action": "create", "job_id": "x1", "vmids": [100], "pool": "prod", "schedule": "02:00", "storage": "local"},
     "Give one selection, not vmids and pool"),
    ({"action": "create", "job_id": "x1", "vmids": [100], "storage": "pbs"}, "needs schedule"),
    ({"action": "create", "job_id": "x1", "schedule": "02:00", "storage": "pbs"}, "needs its guests"),
    ({"action": "create", "job_id": "x1", "vmids": [100], "schedule": "02:00", "storage": "local-lvm"},
     "does not hold backups"),
    ({"action": "create", "job_id": NIGHTLY, "vmids": [100], "schedule": "02:00", "storage": "local"},
     "exists already"),
    ({"action": "update", "job_id": "nosuch", "mode": "stop"}, "does not exist. Jobs: backup-nightly"),
    ({"action": "update", "job_id": NIGHTLY, "vmids": [999]}, "No guest with vmid 999"),
    ({"action": "update", "job_id": NIGHTLY, "pool": "nosuch"}, "No pool 'nosuch'"),
    ({"action": "update", "job_id": NIGHTLY}, "Nothing to change"),
    ({"action": "update", "job_id": NIGHTLY, "keep": "keep-often=3", "confirm": True}, "keep-daily=7,keep-weekly"),
])
def test_bad_input_is_refused_with_nothing_sent(ops, sim, arguments, expected):
    message, sent = writes(sim, lambda: ops.error("write_edit_backup_job", arguments))
    assert expected in message and sent == []


def test_a_job_that_would_stop_a_protected_guest_is_refused(guarded, sim):
    for arguments in ({"action": "update", "job_id": NIGHTLY, "mode": "stop"},
                      {"action": "create", "job_id": "db-cold", "vmids": [101], "schedule": "sun 04:00",
                       "storage": "pbs", "mode": "stop"}):
        message, sent = writes(sim, lambda a=arguments: guarded.error("write_edit_backup_job", a))
        assert "protected" in message and "101" in message and sent == []
    assert job(sim, NIGHTLY)["mode"] == "snapshot" and job(sim, "db-cold") is None


def test_closed_gate_and_missing_privilege(sim, tmp_path):
    # the admin token first: only the closed gate may refuse; the missing privilege comes with a login below
    env = sim.env(pve_token="root@pam!admin") | {"PROXMOX_ACCESS": "lifecycle", "PROXMOX_TOOLSETS": "backups,api",
                                                 "PROXMOX_AUDIT_LOG": str(tmp_path / "audit.jsonl")}
    with tool_session(env, log_name="jobs-lifecycle") as running:  # a tool whose gate is closed is not offered
        hidden = running.ok("server_info")["hidden_tools"]
        assert any("write gate is closed" in why and "write_edit_backup_job" in tools for why, tools in hidden.items())
        message, sent = writes(sim, lambda: running.error("write_call_api", {
            "method": "DELETE", "path": f"/cluster/backup/{NIGHTLY}"}))
        assert "PROXMOX_ACCESS=destructive" in message and sent == []
    ops_login = {"PROXMOX_LAB_URL": sim.pve_url, "PROXMOX_LAB_USER": "ops@pve", "PROXMOX_LAB_PASSWORD":
                 "sim-ops-password-4711", "PROXMOX_LAB_FINGERPRINT": sim.fingerprint, "PROXMOX_ACCESS": "write",
                 "PROXMOX_TOOLSETS": "backups,api", "PROXMOX_AUDIT_LOG": str(tmp_path / "audit2.jsonl")}
    with tool_session(ops_login, log_name="jobs-ops-login") as running:  # PVEVMAdmin: no Sys.Modify
        assert "no configured token holds Sys.Modify" in running.error("write_edit_backup_job", {
            "action": "update", "job_id": NIGHTLY, "mode": "stop"})
        message, sent = writes(sim, lambda: running.error("write_call_api", {
            "method": "PUT", "path": f"/cluster/backup/{NIGHTLY}", "params": {"mode": "stop"}}))
        assert "lacks Sys.Modify on /" in message and sent == []


# ---------------------------------------------------------------- backup_coverage offers the change

def test_backup_coverage_offers_the_job_change_that_covers_a_guest(ops, sim):
    changes = ops.ok("backup_coverage")["job_changes"]
    assert changes == [{"write_edit_backup_job": {"action": "update", "job_id": NIGHTLY, "all_except": []},
                        "covers": [104]}]
    arguments = changes[0]["write_edit_backup_job"]
    plan, sent = writes(sim, lambda: ops.ok("write_edit_backup_job", arguments | {"dry_run": True}))
    assert plan["dry_run"] is True and sent == []
    ops.ok("write_edit_backup_job", arguments)
    assert ops.ok("backup_coverage")["job_changes"] == []


def test_backup_coverage_adds_to_a_vmid_job_or_creates_one(ops, sim):
    sim.lab.backup_jobs[:] = [{"id": "some", "type": "vzdump", "vmid": "100,101", "schedule": "03:00",
                               "storage": "pbs", "enabled": 1}]
    changes = ops.ok("backup_coverage")["job_changes"]
    assert changes == [{"write_edit_backup_job": {"action": "update", "job_id": "some",
                                             "vmids": [100, 101, 102, 103, 104, 105]}, "covers": [102, 103, 104, 105]}]
    sim.lab.backup_jobs[:] = []
    changes = ops.ok("backup_coverage")["job_changes"]
    create = changes[0]["write_edit_backup_job"]
    # every guest is uncovered: the new job selects all (the shorter list), not each of them
    assert create == {"action": "create", "job_id": "backup-uncovered", "all_except": [],
                      "schedule": "02:00", "storage": create["storage"]} and create["storage"]
    assert changes[0]["covers"] == [100, 101, 102, 103, 104, 105]
    ops.ok("write_edit_backup_job", create)
    assert ops.ok("backup_coverage")["job_changes"] == []
