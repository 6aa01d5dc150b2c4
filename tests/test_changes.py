"""Receipts, undo, the safety snapshot and what_changed (issue 24), in process.

First what the simulator does that they rely on, each as Proxmox does it (configs inside backups
and snapshots, rollback, the snapshot feature by storage type, detached disks, pending values,
PBS notes, backup job edits); then the receipts, each kind of undo and each refusal, and the diff.
End to end through an MCP client, on both protocol revisions: test_changes_over_mcp.py."""
import json
import sqlite3
import time

import pytest
import requests

import simulator
from conftest import everything_open, requests_during, tool_session

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
    """A receipt as the state database beside the audit log keeps it (receipt_store.py)."""
    with sqlite3.connect(tmp / "state" / "state.sqlite3") as db:
        return json.loads(db.execute("SELECT body FROM receipts WHERE id = ?", (receipt_id,)).fetchone()[0])


def acting(kept):
    """The steps of a receipt that made the change (not its safety snapshot)."""
    return [step for step in kept["steps"] if not step.get("safety")]


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


def test_a_storages_status_is_its_space_on_that_node(sim):
    """What a safety snapshot takes from (a snapshot has no size of its own): pve-storage
    API2/Storage/Status.pm read_status, with the schema's permission (the reader token holds
    Datastore.Audit); a storage the node does not have is a parameter error."""
    status = raw(sim, "/nodes/pve2/storage/local-zfs/status", token="mcp@pve!reader").json()["data"]
    assert status == {"type": "zfspool", "content": "images,rootdir", "shared": 0, "active": 1, "enabled": 1,
                      "total": 400 * 1024 ** 3, "used": 0, "avail": 400 * 1024 ** 3}
    missing = raw(sim, "/nodes/pve1/storage/local-zfs/status")
    assert missing.status_code == 400 and "No such storage." in missing.text


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
    assert kept["principal"] is None  # the single-user form names no principal
    step, = kept["steps"]
    # stored normalised: sorted (docs/PROXMOX-BEHAVIOUR.md#tags)
    assert step["changes"] == ["tags added: test;undo"]
    assert step["before"].get("tags") is None and step["after"]["tags"] == "test;undo" and step["undo"] is True
    lines = [json.loads(line) for line in (tmp / "audit.jsonl").read_text().splitlines()]
    sending = next(line for line in lines if line.get("receipt") == done["receipt"])
    assert sending["verdict"] == "sending" and step["audit"] == sending["hash"]  # each names the other
    row = next(r for r in ops.ok("list_changes", {"vmid": 200})["rows"] if r[0] == done["receipt"])
    assert row[3] == "write_configure_guest" and row[-1] == "yes"
    assert ops.ok("write_undo_change", {"receipt": done["receipt"]})["result"] == "ok"
    assert "tags" not in sim.lab.guests[200]["config"]


def test_a_receipt_keeps_no_secret_and_cannot_bring_one_back(ops, sim, tmp):
    done = ops.ok("write_configure_guest", {"vmid": 200, "set": {"cipassword": "hunter2-very-secret"}})
    stored = b"".join(path.read_bytes() for path in (tmp / "state").glob("state.sqlite3*"))
    assert b"hunter2" not in stored and receipt(tmp, done["receipt"])["steps"][0]["changes"] == ["cipassword changed"]
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
        with sqlite3.connect(tmp_path / "state" / "state.sqlite3") as db:  # two days old
            db.execute("UPDATE receipts SET epoch = ? WHERE id = ?", (time.time() - 2 * 86400, first))
        for n in range(1, 12):
            session.ok("write_configure_guest", {"vmid": 205, "set": {"description": str(n)}})
        with sqlite3.connect(tmp_path / "state" / "state.sqlite3") as db:
            kept = [row[0] for row in db.execute("SELECT id FROM receipts")]
            guests = db.execute("SELECT count(*) FROM receipt_guests").fetchone()[0]
        assert len(kept) == 10 and first not in kept and guests == 10
        assert "No receipt" in session.error("write_undo_change", {"receipt": first})
        assert session.ok("list_changes", {})["total"] == 10
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
    noted = ops.ok("write_pbs_edit_snapshot", where | {"notes": "keep me"})
    protected = ops.ok("write_pbs_edit_snapshot", where | {"protected": True})
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
    kept = receipt(tmp, rolled["receipt"])
    assert "receipts" not in rolled and [s["kind"] for s in kept["steps"]] == ["snapshot", "rollback"]
    step, = acting(kept)  # the safety snapshot is a step of the same receipt, which undo leaves alone
    safety = step["safety_snapshot"]
    assert safety.startswith("mcp-safety-") and step["undo"] is True and step["before"] == "running"
    local_lvm = sim.lab.storages["local-lvm"]
    free = f"{(local_lvm['total'] - local_lvm['used']) / 1024 ** 3:.1f} GiB free"
    assert rolled["safety_snapshot"]["name"] == safety and "(copy-on-write)" in rolled["safety_snapshot"]["cost"]
    assert f"on storage local-lvm: {100 * local_lvm['used'] / local_lvm['total']:.0f}% used, {free}" in \
        rolled["safety_snapshot"]["cost"]  # GET /nodes/{node}/storage/{storage}/status (the snapshot has no size)
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
    assert kept["steps"][-1]["safety_snapshot"].startswith("none: zfspool storage rolls back only to the newest")
    assert "safety_snapshot" not in rolled
    message = ops.error("write_undo_change", {"receipt": kept["id"], "confirm": True})
    assert "no safety snapshot was taken" in message
    ops.ok("write_delete_snapshot", {"vmid": 203, "name": "only", "confirm": True})


def test_with_safety_all_a_disk_detach_is_snapshotted_first_and_undo_attaches_it_again(sim, tmp_path):
    (tmp_path / "protected.json").write_text("[]")
    guest = sim.lab.guests[206]
    with tool_session(operator_env(sim, tmp_path, PROXMOX_SAFETY_SNAPSHOT="all"), log_name="changes-all") as session:
        done = session.ok("write_configure_guest", {"vmid": 206, "delete": ["scsi1"]})
        kept = receipt(tmp_path, done["receipt"])
        step, = acting(kept)
        assert step["safety_snapshot"].startswith("mcp-safety-") and "unused0" in guest["config"]
        assert step["changes"] == ["scsi1 removed (was local-lvm:vm-206-disk-1,size=8G)",
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


# ================================================================ one receipt per call (issue 29)

def test_a_call_of_three_requests_keeps_one_receipt_whose_undo_restores_the_list(ops, sim):
    """write_edit_firewall_rule adds a rule lower down in three requests (POST on top disabled, move,
    enable); its one receipt holds all three, and its undo takes them back in reverse order."""
    rules = lambda: ops.ok("firewall_rules", {"vmid": 201}).get("rules")  # noqa: E731
    for port in ("91", "92"):
        ops.ok("write_edit_firewall_rule", {"vmid": 201, "action": "add",
                                            "rule": {"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": port}})
    before = json.dumps(rules())
    drop = {"type": "in", "action": "DROP", "proto": "tcp", "dport": "93"}
    added = ops.ok("write_edit_firewall_rule", {"vmid": 201, "action": "add", "pos": 1, "rule": drop})
    assert added["pos"] == 1 and "receipts" not in added
    row = next(r for r in ops.ok("list_changes", {"vmid": 201})["rows"] if r[0] == added["receipt"])
    assert row[-1] == "yes" and "rule added at pos 0" in row[6] and "moved to pos 1" in row[6]
    undone, sent = requests_during(sim, lambda: ops.ok("write_undo_change", {"receipt": added["receipt"],
                                                                             "confirm": True}), writes=True)
    base = "/nodes/pve1/lxc/201/firewall/rules"
    assert undone["result"] == "ok" and writes(sent) == [("pve", "PUT", f"{base}/1"), ("pve", "PUT", f"{base}/1"),
                                                         ("pve", "DELETE", f"{base}/0")]
    assert json.dumps(rules()) == before
    for _ in range(2):
        ops.ok("write_edit_firewall_rule", {"vmid": 201, "action": "delete", "pos": 0, "confirm": True})


LAN = "192.0.2.50"  # on the nodes' network: in the management IP set (tests/test_firewall.py)
DROP_SSH = {"type": "in", "action": "DROP", "proto": "tcp", "dport": "22"}


def test_a_deleted_cluster_rule_is_made_again_disabled_moved_then_enabled(sim, tmp_path):
    """A new rule lands on top (pve-firewall Rules.pm create_rule): made again enabled, a DROP that sat
    below an ACCEPT of this server's address would cut SSH from pos 0 until the move, and the lockout
    guard refuses that first step. Made as the tool adds one, it never filters out of place."""
    (tmp_path / "protected.json").write_text("[]")
    cluster = sim.lab.firewall["cluster"]
    saved = json.loads(json.dumps(cluster["rules"]))
    keep = {"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "22", "source": LAN}
    try:
        env = everything_open(sim, tmp_path, PROXMOX_SOURCE_ADDRESS=LAN)
        with tool_session(env, log_name="changes-guard") as admin:
            admin.ok("write_edit_firewall_rule", {"action": "add", "rule": keep, "confirm": True})
            admin.ok("write_edit_firewall_rule", {"action": "add", "pos": 1, "rule": DROP_SSH, "confirm": True})
            listed = json.dumps(cluster["rules"])
            deleted = admin.ok("write_edit_firewall_rule", {"action": "delete", "pos": 1, "confirm": True})
            undone, sent = requests_during(sim, lambda: admin.ok("write_undo_change", {
                "receipt": deleted["receipt"], "confirm": True}), writes=True)
            assert undone["result"] == "ok" and json.dumps(cluster["rules"]) == listed
            rules = "/cluster/firewall/rules"
            assert writes(sent) == [("pve", "POST", rules), ("pve", "PUT", f"{rules}/0"), ("pve", "PUT", f"{rules}/1")]
    finally:
        cluster["rules"] = saved


def test_a_rule_made_again_is_read_back_before_it_is_moved(sim, tmp_path, monkeypatch):
    """create_rule checks no digest (pve-firewall API2/Firewall/Rules.pm): a rule someone adds on top
    between the undo's POST and its move would be moved instead. The undo reads the list back first,
    and stops when rule 0 is not the rule it made."""
    (tmp_path / "protected.json").write_text("[]")
    cluster = sim.lab.firewall["cluster"]
    saved = json.loads(json.dumps(cluster["rules"]))
    keep = {"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "22", "source": LAN}
    other = {"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "8443", "enable": 0}
    create = simulator.api.HANDLERS["pve"][("POST", "/cluster/firewall/rules")]

    def and_someone_else(call, **where):
        answer = create(call, **where)
        cluster["rules"].insert(0, dict(other))  # another admin's rule, added meanwhile
        return answer
    try:
        env = everything_open(sim, tmp_path, PROXMOX_SOURCE_ADDRESS=LAN)
        with tool_session(env, log_name="changes-readback") as admin:
            admin.ok("write_edit_firewall_rule", {"action": "add", "rule": keep, "confirm": True})
            admin.ok("write_edit_firewall_rule", {"action": "add", "pos": 1, "rule": DROP_SSH, "confirm": True})
            deleted = admin.ok("write_edit_firewall_rule", {"action": "delete", "pos": 1, "confirm": True})
            monkeypatch.setitem(simulator.api.HANDLERS["pve"], ("POST", "/cluster/firewall/rules"), and_someone_else)
            message = admin.error("write_undo_change", {"receipt": deleted["receipt"], "confirm": True})
            assert "not the rule just made again" in message
            assert [r.get("dport") for r in cluster["rules"]][:2] == ["8443", "22"]  # nothing moved
            assert str(cluster["rules"][1].get("enable", 0)) == "0"  # the one made again is still off
            cluster["rules"].pop(0)  # and the tool's own add at a position reads the list back the same way
            added = admin.error("write_edit_firewall_rule", {"action": "add", "pos": 1, "rule": DROP_SSH | {
                "dport": "23"}, "confirm": True})
            assert "not the rule just added" in added and cluster["rules"][0].get("dport") == "8443"
    finally:
        cluster["rules"] = saved


def test_undo_on_a_running_vm_of_a_change_it_runs_with_waits_for_a_restart(ops, sim):
    """Set on a stopped VM, `cores` is applied; the VM starts; setting it back now goes to the
    pending config, as any write on a running VM that cannot be hot-plugged (qemu-server
    API2/Qemu.pm $update_vm_api: docs/PROXMOX-BEHAVIOUR.md#pending-config). The answer says so."""
    guest = sim.lab.guests[205]
    done = ops.ok("write_configure_guest", {"vmid": 205, "set": {"cores": 4}})
    assert done["result"] == "ok" and str(guest["config"]["cores"]) == "4"
    ops.ok("write_power_guest", {"vmid": 205, "action": "start"})
    try:
        undone = ops.ok("write_undo_change", {"receipt": done["receipt"]})
        assert undone["result"] == "pending until restart" and undone["pending"] == {"cores": "2"}
        assert "runs with the values it has now of cores until Proxmox restarts it" in undone["note"]
        assert str(guest["config"]["cores"]) == "4" and guest["pending"] == {"cores": "2"}
    finally:
        ops.ok("write_power_guest", {"vmid": 205, "action": "stop", "confirm": True})
    assert str(guest["config"]["cores"]) == "2" or guest["pending"] == {"cores": "2"}


def test_undo_of_a_change_still_pending_says_nothing_waits(ops, sim):
    """The neighbour: a change still pending on a running VM is taken away by its undo (cleanup_pending),
    so nothing waits for a restart and the answer says none."""
    done = ops.ok("write_configure_guest", {"vmid": 200, "set": {"memory": 6144}})
    assert sim.lab.guests[200]["pending"] == {"memory": "6144"}
    undone = ops.ok("write_undo_change", {"receipt": done["receipt"]})
    assert undone["result"] == "ok" and "pending" not in undone and "note" not in undone


def test_the_dry_run_and_the_question_of_an_undo_show_the_requests_it_sends(ops, sim):
    """Method, path and every parameter: built from the requests, not from what the receipt says."""
    done = ops.ok("write_configure_guest", {"vmid": 201, "set": {"description": "undo-dry"}})
    plan = ops.ok("write_undo_change", {"receipt": done["receipt"], "dry_run": True})
    step, = plan["steps"]
    assert step["method"] == "PUT" and step["run"] == "/nodes/pve1/lxc/201/config"
    assert step["params"]["delete"] == "description" and step["params"]["digest"]
    assert f"Take back receipt {done['receipt']}" in plan["plan"] and \
        'PUT /nodes/pve1/lxc/201/config {"delete":"description","digest":' in plan["plan"]
    ops.ok("write_undo_change", {"receipt": done["receipt"]})
    made = ops.ok("write_create_snapshot", {"vmid": 201, "name": "asked"})
    message = ops.error("write_undo_change", {"receipt": made["receipt"]})  # this caller cannot be asked
    assert "Confirmation needed" in message and "by sending 1 request(s): 1) DELETE " \
        "/nodes/pve1/lxc/201/snapshot/asked" in message
    ops.ok("write_undo_change", {"receipt": made["receipt"], "confirm": True})


# ================================================================ safety snapshots: named, listed, bounded

def test_safety_snapshots_are_listed_and_the_rule_keeps_the_newest(sim, tmp_path):
    """PROXMOX_SAFETY_KEEP=2: the third rollback's safety snapshot is taken, then the oldest one is
    deleted (declared in the question with the rollback); list_changes lists the kept ones. One older
    than PROXMOX_SAFETY_DAYS goes too."""
    (tmp_path / "protected.json").write_text("[]")
    guest = sim.lab.guests[202]
    names = lambda: [s["name"] for s in guest["snapshots"]]  # noqa: E731
    env = operator_env(sim, tmp_path, PROXMOX_SAFETY_KEEP="2", PROXMOX_SAFETY_DAYS="7")
    earlier = set(names())
    with tool_session(env, log_name="changes-safety") as session:
        session.ok("write_create_snapshot", {"vmid": 202, "name": "base2"})
        taken = []
        for _ in range(2):
            rolled = session.ok("write_rollback_snapshot", {"vmid": 202, "name": "base2", "confirm": True})
            taken.append(rolled["safety_snapshot"]["name"])
            assert "safety_snapshots_removed" not in rolled
        listed = session.ok("list_changes", {"vmid": 202})["safety_snapshots"]
        assert [row[0] for row in listed["rows"]] == taken[::-1] and listed["total"] == 2
        assert "PROXMOX_SAFETY_KEEP" in listed["rule"]
        plan = session.ok("write_rollback_snapshot", {"vmid": 202, "name": "base2", "dry_run": True})
        assert any(f"then older safety snapshots of this guest are deleted: {taken[0]}" in why for why in plan["why"])
        rolled = session.ok("write_rollback_snapshot", {"vmid": 202, "name": "base2", "confirm": True})
        assert rolled["safety_snapshots_removed"] == [taken[0]] and taken[0] not in names()
        assert set(names()) - earlier == {"base2", taken[1], rolled["safety_snapshot"]["name"]}
        kept = receipt(tmp_path, rolled["receipt"])
        assert [s["kind"] for s in kept["steps"]] == ["snapshot", "none", "rollback"]  # the removal is a step too
        assert kept["steps"][1]["safety"] and session.ok("list_changes", {"vmid": 202})["rows"][0][-1] == "yes"
        with sqlite3.connect(tmp_path / "state" / "state.sqlite3") as db:  # 8 days old: past PROXMOX_SAFETY_DAYS
            db.execute("UPDATE safety_snapshots SET epoch = ? WHERE name = ?", (time.time() - 8 * 86400, taken[1]))
        undo = session.ok("write_undo_change", {"receipt": rolled["receipt"], "dry_run": True})
        assert [(s.get("method"), s["run"].rsplit("/", 2)[-2:]) for s in undo["steps"]] == [
            ("POST", [rolled["safety_snapshot"]["name"], "rollback"]), (None, ["snapshot", taken[1]])]
        rolled = session.ok("write_rollback_snapshot", {"vmid": 202, "name": "base2", "confirm": True})
        assert rolled["safety_snapshots_removed"] == [taken[1]]
        for name in set(names()) - earlier:
            session.ok("write_delete_snapshot", {"vmid": 202, "name": name, "confirm": True})
    guest["status"] = "running"
