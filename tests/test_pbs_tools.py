"""The PBS tools through the MCP client against the simulated Backup Server."""
import calendar
import json
import re
import time
from pathlib import Path

import pytest

import server
from answers import LIST_CAP
from conftest import in_process, requests_during, tool_session
from gates import TIERS
from simulator import Lab

PROTECTED = [{"host": "lab", "vmid": 101, "name": "db", "reason": "the production database"}]


def day(month: int, date: int) -> int:
    return calendar.timegm((2026, month, date, 2, 0, 0))


@pytest.fixture(scope="module")
def pbs(sim, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pbs")
    (tmp / "protected.json").write_text(json.dumps(PROTECTED))
    env = sim.env(pve_token="root@pam!admin", pbs_token="root@pam!admin") | {
        "PROXMOX_ACCESS": "destructive", "PROXMOX_PROTECTED_VMS_FILE": str(tmp / "protected.json"),
        "PROXMOX_AUDIT_LOG": str(tmp / "audit.jsonl")}
    # 70 daily backups of vm/200 at 02:00 UTC, 2026-09-21 .. 2026-11-29, one of them protected
    history = [Lab.pbs_snapshot(day(9, 21) + n * 86400) for n in range(70)]
    next(s for s in history if s["backup-time"] == day(10, 15))["protected"] = True
    sim.lab.datastores["backup"]["groups"][("", "vm", "200")] = history
    with tool_session(env, log_name="pbs") as session:
        yield session


def pbs_writes(sim, action):
    """Writes sent during `action`, leaving out the prune preview (a POST with dry-run)."""
    result, sent = requests_during(sim, action, writes=True)
    return result, [r for r in sent if not r[2].endswith("/prune")]


def rows(answer):
    return [dict(zip(answer["columns"], row, strict=True)) for row in answer["rows"]]




def test_datastores_status_namespaces_groups(pbs):
    stores = rows(pbs.ok("pbs_list_datastores"))
    assert stores[0]["store"] == "backup" and stores[0]["used_pct"] == 30.0 and stores[0]["full_by"] > "2026"
    status = pbs.ok("pbs_list_datastores", {"store": "backup"})
    assert status["counts"]["vm"]["groups"] == 3 and status["gc"]["state"] == "OK"
    assert pbs.ok("pbs_list_groups", {"store": "backup"})["namespaces"] == ["offsite"]
    assert "namespaces" not in pbs.ok("pbs_list_groups", {"store": "backup", "ns": "offsite"})
    groups = {r["group"]: r for r in rows(pbs.ok("pbs_list_groups", {"store": "backup"}))}
    assert set(groups) == {"vm/100", "vm/101", "ct/102", "ct/105", "vm/200"} and groups["vm/100"]["count"] == 3
    assert "Datastores: backup" in pbs.error("pbs_list_groups", {"store": "nope"})


def test_snapshots_with_verify_protected_encrypted(pbs, sim):
    sim.lab.datastores["backup"]["groups"][("", "ct", "105")][0] |= {"crypt-mode": "encrypt", "comment": "weekly"}
    snaps = rows(pbs.ok("pbs_list_snapshots", {"store": "backup", "backup_type": "ct", "backup_id": "105"}))
    assert len(snaps) == 3 and snaps[0]["encrypted"] == 1 and snaps[0]["comment"] == "weekly"
    assert all(s["verify"] == "ok" for s in snaps)
    protected = [s for s in rows(pbs.ok("pbs_list_snapshots", {"store": "backup", "backup_id": "200",
                                                               "backup_type": "vm"})) if s["protected"]]
    assert [s["backup_time"] for s in protected] == [day(10, 15)]
    assert [s["time"] for s in protected] == ["2026-10-15T02:00:00Z"]


@pytest.mark.mcp  # progress notifications
@pytest.mark.usefixtures("running_tasks")
def test_jobs_and_tasks(pbs):
    jobs = {(r["kind"], r["id"]): r for r in rows(pbs.ok("pbs_list_jobs"))}
    assert jobs[("sync", "s-backup")]["result"].startswith("sync failed")
    assert jobs[("gc", "backup")]["result"] == "OK" and ("verify", "v-backup") in jobs
    progress = []
    gc = pbs.ok("write_pbs_run_gc", {"store": "backup"}, progress=progress)
    assert gc["task"] == "OK" and progress
    assert gc["freed"] == "1.2 GiB" and gc["removed_chunks"] == 612 and gc["pending"] == "0 B"  # the run's counters
    tasks = rows(pbs.ok("pbs_list_tasks"))
    assert tasks[0]["type"] == "garbage_collection" and tasks[0]["status"] == "OK"
    task = pbs.ok("get_task", {"upid": gc["upid"]})  # a PBS task by its UPID's shape
    assert task["result"] == "ok" and task["log"][-1] == "TASK OK"
    log = pbs.ok("get_task", {"upid": gc["upid"], "start": 0, "log_lines": 2})
    assert log["lines"][0].startswith("starting garbage collection") and log["next_start"] == 2
    assert "not a task id (UPID) of Proxmox VE or Backup Server" in pbs.error("get_task", {"upid": "UPID:not-a-task"})


# ---------------------------------------------------------------- prune

EXPECTED_KEPT = [  # keep-last 2, keep-daily 5, keep-weekly 3, keep-monthly 2 over 2026-09-21 .. 11-29
    (11, 29), (11, 28),                       # last 2
    (11, 27), (11, 26), (11, 25), (11, 24), (11, 23),  # 5 more days
    (11, 22), (11, 15), (11, 8),              # 3 more ISO weeks (W48 is already covered by the days)
    (10, 31), (9, 30),                        # 2 more months (November is already covered)
    (10, 15),                                 # protected: always kept
]


def test_prune_follows_pbs_keep_rules_on_70_days(pbs, sim):
    answer = pbs.ok("write_pbs_prune_group", {"store": "backup", "backup_type": "vm", "backup_id": "200",
                                              "keep_last": 2, "keep_daily": 5, "keep_weekly": 3, "keep_monthly": 2})
    expected = sorted((f"2026-{m:02d}-{d:02d}T02:00:00Z" for m, d in EXPECTED_KEPT), reverse=True)
    # the lists are cut at LIST_CAP, newest first, with their totals (the answer stays small for any group)
    assert answer["keep"] == expected[:LIST_CAP] + [f"+{len(expected) - LIST_CAP} more"]
    assert answer["keep_total"] == len(expected) and answer["remove_total"] == 70 - len(expected)
    assert len(answer["remove"]) == LIST_CAP + 1 and answer["removed"] == 0
    assert "confirm=true" in answer["next"] and f"remove {70 - len(expected)} snapshot" in answer["next"]
    assert len(sim.lab.datastores["backup"]["groups"][("", "vm", "200")]) == 70


def test_prune_counts_days_in_the_servers_local_time(pbs, sim):
    # 22:30 and 23:30 UTC on New Year's Day are two days in Berlin (23:30, and 00:30 on the 2nd)
    moments = [calendar.timegm((2026, 1, 1, 22, 30, 0)), calendar.timegm((2026, 1, 1, 23, 30, 0)),
               calendar.timegm((2025, 12, 31, 12, 0, 0))]
    sim.lab.datastores["backup"]["groups"][("", "vm", "300")] = [Lab.pbs_snapshot(t) for t in moments]
    sim.lab.pbs_timezone = "Europe/Berlin"
    try:
        answer = pbs.ok("write_pbs_prune_group", {"store": "backup", "backup_type": "vm", "backup_id": "300",
                                                  "keep_daily": 2, "dry_run": True})
    finally:
        sim.lab.pbs_timezone = "UTC"
    assert answer["keep"] == ["2026-01-01T23:30:00Z", "2026-01-01T22:30:00Z"]
    assert answer["remove"] == ["2025-12-31T12:00:00Z"]  # in UTC it would be kept, and 22:30 removed


def test_prune_without_keep_options_keeps_everything(pbs):
    answer = pbs.ok("write_pbs_prune_group", {"store": "backup", "backup_type": "vm", "backup_id": "200"})
    assert answer["remove"] == [] and answer["keep_total"] == 70 and answer["options"].startswith("none")


def test_prune_removes_after_confirmation(pbs, sim):
    answer = pbs.ok("write_pbs_prune_group", {"store": "backup", "backup_type": "ct", "backup_id": "102",
                                              "keep_last": 1, "confirm": True})
    assert answer["removed"] == 2 and len(sim.lab.datastores["backup"]["groups"][("", "ct", "102")]) == 1


def test_protected_guest_backups_cannot_be_pruned_or_forgotten(pbs, sim):
    message, sent = pbs_writes(sim, lambda: pbs.error("write_pbs_prune_group", {
        "store": "backup", "backup_type": "vm", "backup_id": "101", "keep_last": 1, "confirm": True}))
    assert "protected" in message and "production database" in message
    assert len(sim.lab.datastores["backup"]["groups"][("", "vm", "101")]) == 3  # only the preview ran
    snap = sim.lab.datastores["backup"]["groups"][("", "vm", "101")][0]["backup-time"]
    message, sent = pbs_writes(sim, lambda: pbs.error("write_pbs_forget_snapshot", {
        "store": "backup", "backup_type": "vm", "backup_id": "101", "backup_time": snap, "confirm": True}))
    assert "protected" in message and sent == []
    assert len(sim.lab.datastores["backup"]["groups"][("", "vm", "101")]) == 3


# ---------------------------------------------------------------- the other writes

@pytest.mark.mcp  # progress notifications
@pytest.mark.usefixtures("running_tasks")
def test_forget_protect_notes_verify_run_job(pbs, sim):
    group = sim.lab.datastores["backup"]["groups"][("", "ct", "105")]
    oldest, newest = group[-1]["backup-time"], group[0]["backup-time"]
    pbs.ok("write_pbs_edit_snapshot", {"store": "backup", "backup_type": "ct", "backup_id": "105",
                                       "backup_time": oldest, "protected": True})
    assert group[-1]["protected"] is True
    refused = pbs.error("write_pbs_forget_snapshot", {"store": "backup", "backup_type": "ct", "backup_id": "105",
                                                      "backup_time": oldest, "confirm": True})
    assert "cannot remove protected snapshot" in refused
    pbs.ok("write_pbs_edit_snapshot", {"store": "backup", "backup_type": "ct", "backup_id": "105",
                                       "backup_time": newest, "notes": "before the upgrade"})
    assert group[0]["comment"] == "before the upgrade"
    forgotten = pbs.ok("write_pbs_forget_snapshot", {"store": "backup", "backup_type": "ct", "backup_id": "105",
                                                     "backup_time": newest, "confirm": True})
    assert forgotten["result"] == "ok" and len(group) == 2
    group[-1]["verification"] = {"state": "failed", "upid": ""}
    progress = []
    # a verify the user asks for checks again what was verified before, the failed snapshot too
    verified = pbs.ok("write_pbs_verify_backups", {"store": "backup", "backup_type": "ct", "backup_id": "105"},
                      progress=progress)
    assert verified["task"] == "OK" and verified["checked"] == 2 and verified["failed"] == [] and progress
    assert group[-1]["verification"]["state"] == "ok"
    ran = pbs.ok("write_pbs_run_job", {"kind": "verify", "job_id": "v-backup"})
    assert ran["task"] == "OK" and ran["job"] == "verify v-backup" and "status" not in ran


@pytest.mark.parametrize("tool, arguments, expected", [
    ("write_pbs_run_gc", {"store": "nope"}, "No datastore 'nope'"),
    ("write_pbs_verify_backups", {"store": "backup", "backup_type": "vm"}, "together"),
    ("write_pbs_verify_backups", {"store": "backup", "backup_time": 5}, "together"),
    ("write_pbs_run_job", {"kind": "sync", "job_id": "nope"}, "Jobs: s-backup"),
    ("write_pbs_run_job", {"kind": "backup", "job_id": "x"}, "kind"),
    ("write_pbs_prune_group", {"store": "backup", "backup_type": "vm", "backup_id": "../x", "keep_last": 1},
     "backup_id"),
    ("write_pbs_prune_group", {"store": "backup", "backup_type": "vm", "backup_id": "100", "keep_last": 0},
     "keep_last"),
    ("write_pbs_forget_snapshot", {"store": "backup", "backup_type": "vm", "backup_id": "100", "backup_time": 0},
     "backup_time"),
    ("write_pbs_edit_snapshot", {"store": "nope", "backup_type": "vm", "backup_id": "100", "backup_time": 5,
                                 "notes": "x"}, "No datastore"),
    ("write_pbs_edit_snapshot", {"store": "backup", "backup_type": "disk", "backup_id": "100", "backup_time": 5,
                                 "protected": True}, "backup_type"),
    ("write_pbs_edit_snapshot", {"store": "backup", "backup_type": "vm", "backup_id": "100", "backup_time": 5},
     "Nothing to change"),
])
def test_bad_input_sends_nothing(pbs, sim, tool, arguments, expected):
    message, sent = pbs_writes(sim, lambda: pbs.error(tool, arguments))
    assert expected in message and sent == []


def test_tiers_decide_which_pbs_writes_exist(sim, tmp_path):
    writes = {spec.function.__name__: spec.gate for spec in server.TOOLS if spec.product == "pbs"
              and spec.function.__name__.startswith("write_")}  # from the tool table: a new one joins by itself
    offered = {}
    for tier in ("read", "lifecycle", "write"):
        env = sim.env(pbs_token="root@pam!admin") | {"PROXMOX_ACCESS": tier,
                                                     "PROXMOX_AUDIT_LOG": str(tmp_path / "a.jsonl")}
        with in_process(env, log_name=f"pbs-tier-{tier}") as session:
            offered[tier] = {t.name for t in session.tools()} & set(writes)
    for tier, names in offered.items():  # each tier offers the tools whose gate it reaches
        assert names == {name for name, gate in writes.items() if TIERS.index(gate) <= TIERS.index(tier)}
    assert offered["read"] == set() and "write_pbs_run_gc" in offered["lifecycle"]
    assert "write_pbs_edit_snapshot" in offered["write"] - offered["lifecycle"]


def test_generic_api_reaches_pbs(pbs):
    usage = pbs.ok("api_read", {"path": "/status/datastore-usage", "host": "lab", "product": "pbs"})
    assert usage["data"][0]["store"] == "backup"


@pytest.mark.usefixtures("running_tasks")
def test_verify_answers_what_it_checked_failed_and_skipped(pbs, sim):
    group = sim.lab.datastores["backup"]["groups"][("", "vm", "100")]
    group[0]["corrupt"] = True  # its chunks are damaged: verifying it fails
    rechecked = pbs.ok("write_pbs_verify_backups", {"store": "backup", "backup_type": "vm", "backup_id": "100"})
    name = "vm/100/" + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(group[0]["backup-time"]))
    # the task's own exit status (docs/PROXMOX-BEHAVIOUR.md#verify), not a word of ours
    assert rechecked["task"] == "verification failed - please check the log for details"
    assert rechecked["checked"] == 3 and rechecked["ok"] == 2
    assert rechecked["failed"] == [name] and "do not restore" in rechecked["next"]
    assert group[0]["verification"]["state"] == "failed"
    # without reverify PBS skips what was verified before, and the answer says so
    skipped = pbs.ok("write_pbs_verify_backups", {"store": "backup", "backup_type": "vm", "backup_id": "100",
                                                  "reverify": False})
    assert skipped["checked"] == 0 and skipped["skipped"] == 3 and "reverify=true" in skipped["skipped_why"]



@pytest.mark.usefixtures("running_tasks")
def test_a_verify_that_fails_before_checking_raises_with_its_exit_status(pbs, sim, monkeypatch):
    start = sim.lab.start_task

    def failing(*args, **kwargs):  # a task that ends in an error before checking anything (a fault of the test's)
        return start(*args, **kwargs | {"lines": ["verify datastore backup"], "exitstatus": "unable to open store"})
    monkeypatch.setattr(sim.lab, "start_task", failing)
    message = pbs.error("write_pbs_verify_backups", {"store": "backup"})
    assert "failed (unable to open store) before checking its snapshots" in message


@pytest.mark.usefixtures("running_tasks")
def test_verify_names_the_first_failed_snapshots_and_counts_the_rest(pbs, sim):
    damaged = [Lab.pbs_snapshot(day(8, 1) + n * 86400) | {"corrupt": True} for n in range(LIST_CAP + 3)]
    sim.lab.datastores["backup"]["groups"][("", "vm", "400")] = damaged
    try:
        verified = pbs.ok("write_pbs_verify_backups", {"store": "backup", "backup_type": "vm", "backup_id": "400"})
    finally:
        del sim.lab.datastores["backup"]["groups"][("", "vm", "400")]
    assert verified["checked"] == LIST_CAP + 3 and verified["ok"] == 0
    assert len(verified["failed"]) == LIST_CAP + 1 and verified["failed"][-1] == "+3 more"


def test_the_pbs_reader_token_is_the_readme_recipe_and_reads_no_backup_contents():
    from simulator.lab import ROLES
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    granted = {(path, role) for path, role, _who in re.findall(
        r"proxmox-backup-manager acl update (\S+) (\w+) --auth-id '(mcp@pbs(?:!mcp)?)'", readme)}
    lab = Lab.homelab()
    token = lab.pbs_tokens["mcp@pbs!reader"]
    assert {(path, role) for path, role, _ in token.acl} == granted == {(p, r) for p, r, _ in token.owner.acl}
    # listing and auditing, never reading what is inside a backup (Datastore.Read)
    assert not any("Datastore.Read" in ROLES[role] for _, role in granted)
