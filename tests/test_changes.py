"""Receipts, undo, the safety snapshot and what_changed (issue 24), in process.

First what the simulator does that they rely on, each as Proxmox does it (configs inside backups
and snapshots, rollback, the snapshot feature by storage type, detached disks, pending values,
PBS notes, backup job edits); then the receipts, each kind of undo and each refusal, and the diff.
End to end through an MCP client, on both protocol revisions: test_changes_over_mcp.py."""
import json
import os
import time

import pytest
import requests

import simulator
from conftest import requests_during, tool_session

ADMIN = "root@pam!admin"


@pytest.fixture(scope="module")
def sim():
    lab = simulator.Lab.homelab()
    lab.task_seconds = 0  # as in conftest's sim
    # guests of this module's own, so that each test finds them as it left them
    lab.add_guest(200, "qemu", "pve1", "undo-vm", status="running", memory_mib=4096)
    lab.add_guest(201, "lxc", "pve1", "undo-ct", status="running", memory_mib=1024)
    lab.add_guest(202, "qemu", "pve1", "rollback-vm", status="running")
    lab.add_guest(203, "qemu", "pve2", "zfs-vm", status="stopped")
    lab.add_storage("local-zfs", "zfspool", "images,rootdir", node="pve2", total=400 * 1024 ** 3, used=0)
    lab.guests[203]["config"]["scsi0"] = "local-zfs:vm-203-disk-0,size=32G"
    lab.add_guest(204, "qemu", "pve1", "dir-vm", status="stopped")
    lab.guests[204]["config"]["scsi0"] = "local:204/vm-204-disk-0.raw,size=8G"
    lab.add_guest(205, "qemu", "pve1", "power-vm", status="stopped")
    lab.add_guest(206, "qemu", "pve1", "disk-vm", status="running")
    lab.guests[206]["config"]["scsi1"] = "local-lvm:vm-206-disk-1,size=8G"
    with simulator.Simulator(lab) as running:
        yield running
        assert running.lab.schema_rejections == []


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    path = tmp_path_factory.mktemp("changes")
    (path / "protected.json").write_text("[]")
    (path / "protects-200.json").write_text(json.dumps([{"host": "lab", "vmid": 200, "reason": "now protected"}]))
    return path


def operator_env(sim, tmp, **extra):
    # writes need a token that may write: the lab's admin token (the reader tokens hold PVEAuditor only)
    return sim.env(pve_token=ADMIN, pbs_token=ADMIN) | {
        "PROXMOX_TOOLSETS": "all", "PROXMOX_ACCESS": "destructive", "PROXMOX_AUDIT_LOG": str(tmp / "audit.jsonl"),
        "PROXMOX_PROTECTED_VMS_FILE": str(tmp / "protected.json")} | extra


@pytest.fixture(scope="module")
def ops(sim, tmp):
    with tool_session(operator_env(sim, tmp), log_name="changes") as session:
        yield session


@pytest.fixture(scope="module")
def reader(sim, tmp):
    """The user's default world: the README's read-only tokens, the changes toolset opened."""
    env = sim.env() | {"PROXMOX_TOOLSETS": "default,changes", "PROXMOX_AUDIT_LOG": str(tmp / "audit.jsonl"),
                       "PROXMOX_PROTECTED_VMS_FILE": str(tmp / "protected.json")}
    with tool_session(env, log_name="changes-reader") as session:
        yield session


def raw(sim, path, method="GET", product="pve", token=ADMIN, **params):
    secret = (sim.lab.pve_tokens if product == "pve" else sim.lab.pbs_tokens)[token].secret
    header = f"PVEAPIToken={token}={secret}" if product == "pve" else f"PBSAPIToken={token}:{secret}"
    kwargs = {"params": params} if method in ("GET", "DELETE") else {"data": params}
    return requests.request(method, sim.url(product) + "/api2/json" + path, headers={"Authorization": header},
                            verify=str(sim.cert_file), timeout=10, **kwargs)


def task_of(sim, response):
    """The simulated task a write started, after it ran."""
    sim.lab.tick()
    return sim.lab.tasks[response.json()["data"]]


def receipt(tmp, receipt_id):
    return json.loads((tmp / "audit.receipts" / f"{receipt_id}.json").read_text())


def writes(sent):
    return [r for r in sent if r[1] != "GET"]


# ================================================================ what the simulator does (as Proxmox)

def test_a_backup_holds_its_config_as_text_readable_with_vm_backup(sim):
    """extractconfig answers the config file's text; a PVEAuditor token lacks VM.Backup (403)
    (docs/PROXMOX-BEHAVIOUR.md#configs-inside-backups)."""
    local = next(v["volid"] for v in sim.lab.volumes["local"] if v.get("vmid") == 100 and v["content"] == "backup")
    text = raw(sim, "/nodes/pve1/vzdump/extractconfig", volume=local).json()["data"]
    assert "memory: 4096\n" in text and "#qmdump#map:scsi0:drive-scsi0:local-lvm:raw:" in text
    assert "digest" not in text and "parent" not in text
    pbs_volume = next(v["volid"] for v in sim.lab.pbs_volumes("pbs") if v["vmid"] == 102)
    assert "hostname: dns\n" in raw(sim, "/nodes/pve1/vzdump/extractconfig", volume=pbs_volume).json()["data"]
    denied = raw(sim, "/nodes/pve1/vzdump/extractconfig", token="mcp@pve!reader", volume=local)
    assert denied.status_code == 403 and "VM.Backup" in denied.reason or "Datastore.AllocateSpace" in denied.reason
    missing = raw(sim, "/nodes/pve1/vzdump/extractconfig", volume="local:backup/vzdump-qemu-999-x.vma.zst")
    assert missing.status_code == 500 and "can't find file" in missing.reason


def test_a_rollback_restores_the_snapshots_config_and_leaves_the_guest_stopped(sim):
    guest, base = sim.lab.guests[100], "/nodes/pve1/qemu/100"
    saved = json.loads(json.dumps(guest))
    try:
        raw(sim, f"{base}/config", method="PUT", description="the web server")
        task_of(sim, raw(sim, f"{base}/snapshot", method="POST", snapname="sim1"))
        section = raw(sim, f"{base}/snapshot/sim1/config").json()["data"]
        assert section["memory"] == 4096 and "description" not in section and section["snaptime"]
        assert guest["config"]["parent"] == "sim1"  # the current state's parent
        raw(sim, f"{base}/config", method="PUT", memory=8192, description="changed since")
        assert task_of(sim, raw(sim, f"{base}/snapshot/sim1/rollback", method="POST")).exitstatus == "OK"
        config = raw(sim, f"{base}/config").json()["data"]
        assert config["memory"] == 4096 and config["description"] == "changed since"  # the description stays
        assert guest["status"] == "stopped" and guest["pending"] == {}
        raw(sim, f"{base}/config", method="PUT", memory=8192)
        task_of(sim, raw(sim, f"{base}/snapshot/sim1/rollback", method="POST", start=1))
        assert guest["status"] == "running" and guest["config"]["memory"] == 4096
    finally:
        guest.clear()
        guest.update(saved)


def test_a_snapshot_needs_storage_that_can_take_one(sim):
    """A raw disk on a directory storage cannot; the task fails (docs/PROXMOX-BEHAVIOUR.md#snapshots-and-rollback)."""
    failed = task_of(sim, raw(sim, "/nodes/pve1/qemu/204/snapshot", method="POST", snapname="nope"))
    assert failed.exitstatus == "snapshot feature is not available" and sim.lab.guests[204]["snapshots"] == []


def test_zfs_rolls_back_only_to_the_newest_snapshot(sim):
    base, guest = "/nodes/pve2/qemu/203", sim.lab.guests[203]
    for name in ("z1", "z2"):
        assert task_of(sim, raw(sim, f"{base}/snapshot", method="POST", snapname=name)).exitstatus == "OK"
    refused = task_of(sim, raw(sim, f"{base}/snapshot/z1/rollback", method="POST"))
    assert "is not most recent snapshot" in refused.exitstatus
    assert task_of(sim, raw(sim, f"{base}/snapshot/z2/rollback", method="POST")).exitstatus == "OK"
    for name in ("z2", "z1"):
        task_of(sim, raw(sim, f"{base}/snapshot/{name}", method="DELETE"))
    assert guest["snapshots"] == [] and "parent" not in guest["config"]


def test_a_detached_disk_becomes_unused_and_attaching_it_again_drops_that(sim):
    config, base = sim.lab.guests[204]["config"], "/nodes/pve1/qemu/204"
    volume = config["scsi0"]
    raw(sim, f"{base}/config", method="PUT", delete="scsi0")
    assert "scsi0" not in config and config["unused0"] == volume.split(",")[0]
    raw(sim, f"{base}/config", method="PUT", scsi0=volume)
    assert config["scsi0"] == volume and "unused0" not in config


def test_a_pending_value_set_back_to_the_running_one_is_dropped(sim):
    """cleanup_pending (docs/PROXMOX-BEHAVIOUR.md#pending-config)."""
    guest, base = sim.lab.guests[101], "/nodes/pve2/qemu/101"
    raw(sim, f"{base}/config", method="PUT", memory=16384)
    assert guest["pending"] == {"memory": "16384"}
    raw(sim, f"{base}/config", method="PUT", memory=8192)
    assert guest["pending"] == {}


def test_pbs_notes_are_kept_whole_and_listed_by_their_first_line(sim):
    snap = sim.lab.datastores["backup"]["groups"][("", "vm", "101")][0]
    where = {"backup-type": "vm", "backup-id": "101", "backup-time": snap["backup-time"]}
    raw(sim, "/admin/datastore/backup/notes", method="PUT", product="pbs", notes="first\nsecond", **where)
    assert raw(sim, "/admin/datastore/backup/notes", product="pbs", **where).json()["data"] == "first\nsecond"
    listed = raw(sim, "/admin/datastore/backup/snapshots", product="pbs", **{"backup-type": "vm", "backup-id": "101"})
    assert {s["comment"] for s in listed.json()["data"] if s["backup-time"] == snap["backup-time"]} == {"first"}
    assert raw(sim, "/admin/datastore/backup/protected", product="pbs", **where).json()["data"] is False
    raw(sim, "/admin/datastore/backup/notes", method="PUT", product="pbs", notes="", **where)


def test_a_backup_job_edit_merges_as_update_job_does(sim):
    job = dict(sim.lab.backup_jobs[0])
    try:
        raw(sim, "/cluster/backup/backup-nightly", method="PUT", vmid="100,101")
        assert "all" not in sim.lab.backup_jobs[0] and "exclude" not in sim.lab.backup_jobs[0]
        raw(sim, "/cluster/backup/backup-nightly", method="PUT", all=1, exclude="104", delete="vmid")
        assert {k: str(sim.lab.backup_jobs[0].get(k)) for k in ("all", "exclude", "vmid")} == \
            {"all": "1", "exclude": "104", "vmid": "None"}
    finally:
        sim.lab.backup_jobs[0] = job


# ================================================================ receipts

def test_every_write_answers_with_a_receipt_kept_beside_the_audit_log(ops, sim, tmp):
    done = ops.ok("write_configure_guest", {"vmid": 200, "set": {"tags": "undo;test"}})
    kept = receipt(tmp, done["receipt"])
    assert kept["tool"] == "write_configure_guest" and kept["by"] == ADMIN and kept["guests"] == [200]
    # stored normalised: sorted (docs/PROXMOX-BEHAVIOUR.md#tags)
    assert kept["changes"] == ["tags added: test;undo"]
    assert kept["before"].get("tags") is None and kept["after"]["tags"] == "test;undo" and kept["undo"] is True
    lines = [json.loads(line) for line in (tmp / "audit.jsonl").read_text().splitlines()]
    sending = next(line for line in lines if line.get("receipt") == done["receipt"])
    assert sending["verdict"] == "sending" and kept["audit"] == sending["hash"]  # each names the other
    row = next(r for r in ops.ok("list_changes", {"vmid": 200})["rows"] if r[0] == done["receipt"])
    assert row[3] == "write_configure_guest" and row[-1] == "yes"
    assert ops.ok("write_undo_change", {"receipt": done["receipt"]})["result"] == "ok"
    assert "tags" not in sim.lab.guests[200]["config"]


def test_a_receipt_keeps_no_secret_and_cannot_bring_one_back(ops, sim, tmp):
    done = ops.ok("write_configure_guest", {"vmid": 200, "set": {"cipassword": "hunter2-very-secret"}})
    text = (tmp / "audit.receipts" / f"{done['receipt']}.json").read_text()
    assert "hunter2" not in text and receipt(tmp, done["receipt"])["changes"] == ["cipassword changed"]
    message, sent = requests_during(sim, lambda: ops.error("write_undo_change", {"receipt": done["receipt"]}),
                                    writes=True)
    assert "never keep a secret" in message and "hunter2" not in message and sent == []
    for where in ("config", "pending"):  # cloud-init values are set at once (docs/PROXMOX-BEHAVIOUR.md#cloud-init)
        sim.lab.guests[200][where].pop("cipassword", None)


def test_receipts_are_bounded_in_count_and_age(sim, tmp_path):
    (tmp_path / "protected.json").write_text("[]")
    env = operator_env(sim, tmp_path, PROXMOX_RECEIPTS_KEEP="10", PROXMOX_RECEIPTS_DAYS="1")
    with tool_session(env, log_name="changes-bounded") as session:
        first = session.ok("write_configure_guest", {"vmid": 205, "set": {"description": "0"}})["receipt"]
        old = tmp_path / "audit.receipts" / f"{first}.json"
        os.utime(old, (time.time() - 2 * 86400, time.time() - 2 * 86400))  # two days old
        for n in range(1, 12):
            session.ok("write_configure_guest", {"vmid": 205, "set": {"description": str(n)}})
        kept = list((tmp_path / "audit.receipts").glob("rc-*.json"))
        assert len(kept) == 10 and not old.exists()
        assert "No receipt" in session.error("write_undo_change", {"receipt": first})
    sim.lab.guests[205]["config"].pop("description")


# ================================================================ undo, each kind

def test_undo_of_a_config_change_on_a_running_vm_takes_the_pending_change_away(ops, sim):
    guest = sim.lab.guests[200]
    nic = guest["config"]["net0"]
    done = ops.ok("write_configure_guest",
                  {"vmid": 200, "set": {"memory": 8192, "net0": nic.replace("vmbr0", "vmbr1")}})
    assert guest["pending"] == {"memory": "8192"} and "vmbr1" in guest["config"]["net0"]
    changed = ops.ok("list_changes", {"vmid": 200})["rows"][0]
    assert changed[0] == done["receipt"] and changed[6] == "memory 4 -> 8 GiB; net0 moved to vmbr1 (was vmbr0)"
    undone = ops.ok("write_undo_change", {"receipt": done["receipt"]})
    assert undone["result"] == "ok" and guest["pending"] == {} and guest["config"]["net0"] == nic
    assert guest["config"]["memory"] == 4096
    assert ops.ok("list_changes", {"vmid": 200})["rows"][1][-1] == f"undone by {undone['receipt']}"
    again = ops.error("write_undo_change", {"receipt": done["receipt"]})
    assert "taken back already" in again and undone["receipt"] in again


def test_undo_of_an_undo_redoes_the_change(ops, sim):
    done = ops.ok("write_configure_guest", {"vmid": 201, "set": {"cores": 3}})
    undone = ops.ok("write_undo_change", {"receipt": done["receipt"]})
    assert str(sim.lab.guests[201]["config"]["cores"]) == "2" and undone["receipt"] in undone["redo"]
    ops.ok("write_undo_change", {"receipt": undone["receipt"]})
    assert str(sim.lab.guests[201]["config"]["cores"]) == "3"
    ops.ok("write_configure_guest", {"vmid": 201, "set": {"cores": 2}})


def test_undo_of_a_backup_job_edit_restores_its_selection(ops, sim):
    """Proxmox rewrites the selection on an edit (update_job); the undo reads what it became."""
    job = dict(sim.lab.backup_jobs[0])
    try:
        edit = {"method": "PUT", "path": "/cluster/backup/backup-nightly", "params": {"vmid": "100"}}
        done = ops.ok("write_call_api", edit)
        assert sim.lab.backup_jobs[0].get("vmid") == "100" and "all" not in sim.lab.backup_jobs[0]
        assert ops.ok("write_undo_change", {"receipt": done["receipt"]})["result"] == "ok"
        assert {k: str(sim.lab.backup_jobs[0].get(k)) for k in ("all", "exclude", "vmid")} == \
            {"all": "1", "exclude": "104", "vmid": "None"}
    finally:
        sim.lab.backup_jobs[0] = job


def test_undo_of_pbs_notes_and_protection(ops, sim):
    snap = sim.lab.datastores["backup"]["groups"][("", "vm", "100")][1]
    where = {"store": "backup", "backup_type": "vm", "backup_id": "100", "backup_time": snap["backup-time"]}
    noted = ops.ok("write_pbs_set_notes", where | {"notes": "keep me"})
    protected = ops.ok("write_pbs_protect_snapshot", where)
    assert snap["protected"] and snap["comment"] == "keep me"
    ops.ok("write_undo_change", {"receipt": protected["receipt"]})
    ops.ok("write_undo_change", {"receipt": noted["receipt"]})
    assert not snap["protected"] and snap["comment"] == ""


def test_undo_follows_a_guest_that_moved_to_another_node(ops, sim):
    done = ops.ok("write_configure_guest", {"vmid": 205, "set": {"onboot": 1}})
    ops.ok("write_migrate_guest", {"vmid": 205, "target": "pve2"})
    undone, sent = requests_during(sim, lambda: ops.ok("write_undo_change", {"receipt": done["receipt"]}), writes=True)
    assert undone["result"] == "ok" and writes(sent) == [("pve", "PUT", "/nodes/pve2/qemu/205/config")]
    assert "onboot" not in sim.lab.guests[205]["config"]
    ops.ok("write_migrate_guest", {"vmid": 205, "target": "pve1"})


def test_undo_of_a_start_shuts_the_guest_down(ops, sim):
    started = ops.ok("write_power_guest", {"vmid": 205, "action": "start"})
    assert sim.lab.guests[205]["status"] == "running"
    undone = ops.ok("write_undo_change", {"receipt": started["receipt"]})
    assert undone["steps"][0]["action"].endswith("/status/shutdown") and sim.lab.guests[205]["status"] == "stopped"


def test_undo_of_a_snapshot_deletes_it(ops, sim):
    made = ops.ok("write_create_snapshot", {"vmid": 201, "name": "undo_me"})
    plan = ops.ok("write_undo_change", {"receipt": made["receipt"], "dry_run": True})
    assert plan["needs_confirmation"] is True and plan["steps"][0]["run"].endswith("/snapshot/undo_me")
    assert ops.ok("write_undo_change", {"receipt": made["receipt"], "confirm": True})["result"] == "ok"
    assert sim.lab.guests[201]["snapshots"] == []


def test_a_rollback_takes_a_safety_snapshot_that_undo_returns_to(ops, sim, tmp):
    guest = sim.lab.guests[202]
    ops.ok("write_create_snapshot", {"vmid": 202, "name": "clean"})
    ops.ok("write_configure_guest", {"vmid": 202, "set": {"cores": 4}})  # running: pending
    plan, sent = requests_during(sim, lambda: ops.ok("write_rollback_snapshot", {"vmid": 202, "name": "clean",
                                                                                 "dry_run": True}), writes=True)
    assert any("safety snapshot is taken first" in why for why in plan["why"]) and sent == []
    rolled = ops.ok("write_rollback_snapshot", {"vmid": 202, "name": "clean", "confirm": True})
    kept = receipt(tmp, rolled["receipts"][-1])
    safety = kept["safety_snapshot"]
    assert safety.startswith("mcp-safety-") and kept["undo"] is True and kept["before"] == "running"
    assert safety in [s["name"] for s in guest["snapshots"]] and guest["status"] == "stopped"
    assert str(guest["config"]["cores"]) == "2"
    undone = ops.ok("write_undo_change", {"receipt": kept["id"], "confirm": True})
    assert undone["steps"][0]["action"].endswith(f"/snapshot/{safety}/rollback") and "started again" in undone["note"]
    assert guest["status"] == "running"  # as before the rollback
    # a snapshot keeps no pending change: the one that waited is gone (docs/PROXMOX-BEHAVIOUR.md#snapshots-and-rollback)
    assert guest["pending"] == {} and ops.ok("what_changed", {"vmid": 202, "since": "clean"})["changes"] == [
        "nothing changed"]


def test_no_safety_snapshot_where_the_storage_cannot_take_one(ops, sim, tmp):
    """ZFS rolls back only to the newest snapshot: a safety snapshot would block the rollback; the
    receipt says why there is none, and undo is refused with that reason."""
    ops.ok("write_create_snapshot", {"vmid": 203, "name": "only"})
    rolled = ops.ok("write_rollback_snapshot", {"vmid": 203, "name": "only", "confirm": True})
    kept = receipt(tmp, rolled["receipt"])
    assert kept["safety_snapshot"].startswith("none: zfspool storage rolls back only to the newest")
    message = ops.error("write_undo_change", {"receipt": kept["id"], "confirm": True})
    assert "no safety snapshot was taken" in message
    ops.ok("write_delete_snapshot", {"vmid": 203, "name": "only", "confirm": True})


def test_with_safety_all_a_disk_detach_is_snapshotted_first_and_undo_attaches_it_again(sim, tmp_path):
    (tmp_path / "protected.json").write_text("[]")
    guest = sim.lab.guests[206]
    with tool_session(operator_env(sim, tmp_path, PROXMOX_SAFETY_SNAPSHOT="all"), log_name="changes-all") as session:
        done = session.ok("write_configure_guest", {"vmid": 206, "delete": ["scsi1"]})
        kept = json.loads((tmp_path / "audit.receipts" / f"{done['receipts'][-1]}.json").read_text())
        assert kept["safety_snapshot"].startswith("mcp-safety-") and "unused0" in guest["config"]
        assert kept["changes"] == ["scsi1 removed (was local-lvm:vm-206-disk-1,size=8G)",
                                   "unused0 added: local-lvm:vm-206-disk-1"]
        assert session.ok("write_undo_change", {"receipt": kept["id"]})["result"] == "ok"
        assert guest["config"]["scsi1"] == "local-lvm:vm-206-disk-1,size=8G" and "unused0" not in guest["config"]
        quiet = session.ok("write_configure_guest", {"vmid": 206, "set": {"tags": "x"}})  # loses nothing: no snapshot
        assert "receipt" in quiet and len(guest["snapshots"]) == 1


def test_safety_snapshot_off(sim, tmp_path):
    (tmp_path / "protected.json").write_text("[]")
    with tool_session(operator_env(sim, tmp_path, PROXMOX_SAFETY_SNAPSHOT="off"), log_name="changes-off") as session:
        session.ok("write_create_snapshot", {"vmid": 201, "name": "plain"})
        rolled = session.ok("write_rollback_snapshot", {"vmid": 201, "name": "plain", "confirm": True})
        assert "receipt" in rolled and [s["name"] for s in sim.lab.guests[201]["snapshots"]] == ["plain"]
        session.ok("write_delete_snapshot", {"vmid": 201, "name": "plain", "confirm": True})
    sim.lab.guests[201]["status"] = "running"


# ================================================================ refusals: nothing is sent

def test_undo_is_refused_when_the_object_changed_since(ops, sim):
    done = ops.ok("write_configure_guest", {"vmid": 201, "set": {"description": "mine"}})
    raw(sim, "/nodes/pve1/lxc/201/config", method="PUT", swap=1024)  # someone else's edit, after ours
    message, sent = requests_during(sim, lambda: ops.error("write_undo_change", {"receipt": done["receipt"]}),
                                    writes=True)
    assert "changed since receipt" in message and "swap" in message and sent == []
    raw(sim, "/nodes/pve1/lxc/201/config", method="PUT", swap=512)
    assert ops.ok("write_undo_change", {"receipt": done["receipt"]})["result"] == "ok"  # as the change left it again


@pytest.mark.parametrize("tool, arguments, why", [
    ("write_resize_disk", {"vmid": 204, "disk": "scsi0", "size": "+1G"}, "disks only grow"),
    ("write_backup_guest", {"vmid": 205, "storage": "local"}, "a backup run can prune"),
])
def test_undo_is_refused_for_what_cannot_be_taken_back(ops, sim, tool, arguments, why):
    done = ops.ok(tool, arguments)
    assert ops.ok("list_changes", {})["rows"][0][-1].startswith("no: ")
    message, sent = requests_during(sim, lambda: ops.error("write_undo_change", {"receipt": done["receipt"]}),
                                    writes=True)
    assert "cannot be taken back" in message and why in message and sent == []


def test_undo_is_refused_when_the_inverse_needs_a_closed_gate(ops, sim, tmp):
    """The same receipts, read by a server whose operator opened only the write tier: deleting the
    snapshot needs the destructive gate."""
    made = ops.ok("write_create_snapshot", {"vmid": 205, "name": "gated"})
    env = operator_env(sim, tmp, PROXMOX_ACCESS="write")
    with tool_session(env, log_name="changes-write") as writer:
        message, sent = requests_during(sim, lambda: writer.error("write_undo_change", {"receipt": made["receipt"]}),
                                        writes=True)
    assert "needs the 'destructive' gate" in message and "PROXMOX_ACCESS=destructive" in message and sent == []
    assert [s["name"] for s in sim.lab.guests[205]["snapshots"]] == ["gated"]
    ops.ok("write_undo_change", {"receipt": made["receipt"], "confirm": True})


def test_undo_never_reaches_a_protected_guest(ops, sim, tmp):
    done = ops.ok("write_configure_guest", {"vmid": 200, "set": {"onboot": 1}})
    env = operator_env(sim, tmp, PROXMOX_PROTECTED_VMS_FILE=str(tmp / "protects-200.json"))
    with tool_session(env, log_name="changes-protected") as guarded:
        message, sent = requests_during(sim, lambda: guarded.error("write_undo_change", {"receipt": done["receipt"]}),
                                        writes=True)
    assert "Guest 200" in message and "protected" in message and sent == []
    ops.ok("write_undo_change", {"receipt": done["receipt"]})


def test_an_unknown_receipt_is_named(ops, sim):
    message, sent = requests_during(sim, lambda: ops.error("write_undo_change", {"receipt": "rc-00000000"}),
                                    writes=True)
    assert "No receipt rc-00000000" in message and sent == []
    assert "receipt id" in ops.error("write_undo_change", {"receipt": "../../etc/passwd"})


# ================================================================ what changed

def test_what_changed_since_the_newest_backup_marks_pending_changes(ops, sim):
    done = ops.ok("write_configure_guest", {"vmid": 100, "set": {"memory": 8192, "tags": "prod"}})
    changed = ops.ok("what_changed", {"vmid": 100})
    assert changed["since"].startswith("backup pbs:backup/vm/100/")  # the newest is on the Backup Server
    assert changed["changes"] == ["memory 4 -> 8 GiB (pending until restart)", "tags prod;web -> prod"]
    local = next(v["volid"] for v in sim.lab.volumes["local"] if v.get("vmid") == 100 and v["content"] == "backup")
    assert ops.ok("what_changed", {"vmid": 100, "since": local})["changes"] == changed["changes"]
    assert ops.ok("what_changed", {"vmid": 100, "since": done["receipt"]})["changes"] == changed["changes"]
    ops.ok("write_undo_change", {"receipt": done["receipt"]})
    assert ops.ok("what_changed", {"vmid": 100})["changes"] == ["nothing changed"]


def test_what_changed_since_a_snapshot(ops, sim):
    ops.ok("write_create_snapshot", {"vmid": 205, "name": "base"})
    done = ops.ok("write_configure_guest", {"vmid": 205, "set": {"cores": 4}, "delete": ["agent"]})
    assert ops.ok("what_changed", {"vmid": 205, "since": "base"})["changes"] == [
        "agent removed (was 1)", "cores 2 -> 4"]
    ops.ok("write_undo_change", {"receipt": done["receipt"]})
    assert "no snapshot 'nope'" in ops.error("what_changed", {"vmid": 205, "since": "nope"})


def test_what_changed_in_the_default_world(reader, ops, sim):
    """A backup's config needs VM.Backup and Datastore.AllocateSpace, which the reader token lacks:
    it is told which to grant (or that it sees no backup); a snapshot or a receipt it can compare."""
    message = reader.error("what_changed", {"vmid": 205})
    assert "Datastore.AllocateSpace" in message or "VM.Backup" in message
    # hidden backups are explained with the grant that shows them (docs/PROXMOX-BEHAVIOUR.md#who-sees-which-volume)
    local = next(v["volid"] for v in sim.lab.volumes["local"] if v.get("vmid") == 100 and v["content"] == "backup")
    for arguments in ({"vmid": 100}, {"vmid": 100, "since": local}):
        message = reader.error("what_changed", arguments)
        assert "pveum role add BackupReader" in message and "local" in message and "since=" in message
    assert reader.ok("what_changed", {"vmid": 205, "since": "base"})["changes"] == ["nothing changed"]
    done = ops.ok("write_configure_guest", {"vmid": 205, "set": {"cores": 3}})
    assert reader.ok("what_changed", {"vmid": 205, "since": done["receipt"]})["changes"] == ["cores 2 -> 3"]
    assert "holds no config of guest 205" in reader.error("what_changed", {"vmid": 205, "since": ops.ok(
        "list_changes", {"vmid": 200})["rows"][0][0]})
    ops.ok("write_undo_change", {"receipt": done["receipt"]})


def test_the_restore_drill_says_what_a_restore_would_take_back(ops, sim):
    done = ops.ok("write_configure_guest", {"vmid": 102, "set": {"cores": 3}})
    drill = ops.ok("write_drill_restore", {"vmid": 102, "answer_seconds": 5, "confirm": True})
    assert drill["result"] == "ok" and drill["config_since_backup"] == ["cores 2 -> 3"]
    ops.ok("write_undo_change", {"receipt": done["receipt"]})


# ================================================================ undo of the firewall and backup job tools

def test_undo_of_a_firewall_rule_and_options(ops, sim):
    """A new rule is put first; its undo deletes position 0 with the list's digest; options go back
    key by key (docs/PROXMOX-BEHAVIOUR.md#firewall-rules)."""
    rules = lambda: ops.ok("firewall_rules", {"vmid": 201})  # noqa: E731
    before = json.dumps(rules().get("rules"))
    accept = {"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "8080"}
    added = ops.ok("write_edit_firewall_rule", {"vmid": 201, "action": "add", "rule": accept})
    assert json.dumps(rules().get("rules")) != before
    undone, sent = requests_during(sim, lambda: ops.ok("write_undo_change",
                                                        {"receipt": added["receipt"], "confirm": True}),
                                   writes=True)  # deleting a rule is destructive: asked
    assert undone["result"] == "ok" and writes(sent) == [("pve", "DELETE", "/nodes/pve1/lxc/201/firewall/rules/0")]
    assert json.dumps(rules().get("rules")) == before
    for port in ("81", "82", "83"):
        ops.ok("write_edit_firewall_rule", {"vmid": 201, "action": "add",
                                            "rule": {"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": port}})
    three = json.dumps(rules().get("rules"))
    deleted = ops.ok("write_edit_firewall_rule", {"vmid": 201, "action": "delete", "pos": 1, "confirm": True})
    ops.ok("write_undo_change", {"receipt": deleted["receipt"]})  # made again on top, then moved back to 1
    assert json.dumps(rules().get("rules")) == three
    enabled = ops.ok("write_set_firewall_options", {"vmid": 201, "enable": True, "policy_in": "DROP"})
    ops.ok("write_undo_change", {"receipt": enabled["receipt"]})
    options = ops.ok("api_read", {"path": "/nodes/pve1/lxc/201/firewall/options"})["data"]
    assert not options.get("enable") and options.get("policy_in") in (None, "ACCEPT")


def test_undo_of_a_backup_job_made_and_edited(ops, sim):
    made = ops.ok("write_edit_backup_job", {"action": "create", "job_id": "undo-job", "vmids": [205],
                                            "schedule": "04:00", "storage": "local"})
    edited = ops.ok("write_edit_backup_job", {"action": "update", "job_id": "undo-job", "schedule": "05:00"})
    job = lambda: next((j for j in sim.lab.backup_jobs if j["id"] == "undo-job"), None)  # noqa: E731
    assert job()["schedule"] == "05:00"
    ops.ok("write_undo_change", {"receipt": edited["receipt"]})
    assert job()["schedule"] == "04:00"
    assert ops.ok("write_undo_change", {"receipt": made["receipt"], "confirm": True})["result"] == "ok"
    assert job() is None


def test_list_changes_pages(ops):
    first = ops.ok("list_changes", {"limit": 2})
    assert len(first["rows"]) == 2 and first["truncated"] and first["next_offset"] == 2
    assert ops.ok("list_changes", {"limit": 2, "offset": 2})["rows"][0] != first["rows"][1]
