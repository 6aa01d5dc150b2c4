"""receipts.py, table-driven: which writes are recorded as what, the inverse requests of the kinds the
simulator does not keep (firewall rules and options, HA rules, PBS jobs: their engineers' tools use
these paths), each a valid call of the official schema, and the safety snapshot's storage judgement
(docs/PROXMOX-BEHAVIOUR.md#snapshots-and-rollback)."""
from types import SimpleNamespace

import pytest
import calls

import catalog
import receipts
import undo
from errors import InvalidArgument, ProxmoxError, ToolFailure
from masking import MASK
from settings import Keeping

# (product, method, concrete path, kind): what each config-like change of issue 24 is recorded as
RECORDED = [
    ("pve", "PUT", "/nodes/pve1/qemu/100/config", "settings"),  # config, NICs, tags, notes, protection, cloud-init
    ("pve", "POST", "/nodes/pve1/qemu/100/config", "settings"),
    ("pve", "PUT", "/nodes/pve1/lxc/101/config", "settings"),
    ("pve", "PUT", "/nodes/pve1/qemu/100/firewall/options", "settings"),
    ("pve", "PUT", "/nodes/pve1/firewall/options", "settings"),
    ("pve", "PUT", "/cluster/firewall/options", "settings"),
    ("pve", "PUT", "/nodes/pve1/lxc/101/firewall/rules/3", "rules"),  # the list, read whole
    ("pve", "POST", "/cluster/firewall/rules", "rules"),
    ("pve", "DELETE", "/nodes/pve1/qemu/100/firewall/rules/2", "rules"),
    ("pve", "PUT", "/cluster/backup/backup-nightly", "settings"),
    ("pve", "POST", "/cluster/backup", "created"),
    ("pve", "DELETE", "/cluster/backup/backup-nightly", "deleted"),
    ("pve", "PUT", "/cluster/ha/rules/keep-apart", "settings"),
    ("pve", "POST", "/cluster/ha/rules", "created"),
    ("pve", "DELETE", "/cluster/ha/resources/vm:100", "deleted"),
    ("pve", "PUT", "/nodes/pve1/storage/nfs-backup/content/nfs-backup:backup/vzdump-qemu-100-x.vma.zst", "settings"),
    ("pbs", "PUT", "/config/sync/s-backup", "settings"),
    ("pbs", "POST", "/config/prune", "created"),
    ("pbs", "DELETE", "/config/verify/v-backup", "deleted"),
    ("pbs", "PUT", "/admin/datastore/backup/notes", "value"),
    ("pbs", "PUT", "/admin/datastore/backup/protected", "value"),
    ("pve", "POST", "/nodes/pve1/qemu/100/snapshot", "snapshot"),
    ("pve", "POST", "/nodes/pve1/lxc/101/status/start", "power"),
    ("pve", "POST", "/nodes/pve1/qemu/100/snapshot/before/rollback", "rollback"),
    ("pve", "PUT", "/nodes/pve1/qemu/100/resize", None),
    ("pve", "DELETE", "/nodes/pve1/qemu/100", None),
    ("pve", "POST", "/nodes/pve1/qemu/100/status/reset", None),
    ("pbs", "POST", "/admin/datastore/backup/prune", None),
]


@pytest.mark.parametrize("product, method, path, kind", RECORDED, ids=[f"{r[1]} {r[2]}" for r in RECORDED])
def test_each_write_is_recorded_as_its_kind(product, method, path, kind):
    template = catalog.find_path(product, path)[0]
    rule = receipts.rule_for(method, template)
    assert (rule.kind if rule else None) == kind
    if kind is None:
        assert not receipts.why_not(method, template).startswith("no inverse is known")


class Reads:
    """A client that answers GETs from a table (what Proxmox would answer now)."""

    def __init__(self, product: str, answers: dict):
        self.host = SimpleNamespace(product=product, label="lab")
        self.answers = answers

    def get(self, path: str, **_params):
        if path not in self.answers:
            raise ProxmoxError(f"{path} does not exist")
        return self.answers[path]

    read = get  # the reads the policy makes for its own judgement (ProxmoxClient.read)


def receipt_for(product, method, path, **fields):
    """A receipt of one request (one step), as receipts.py keeps it."""
    template = catalog.find_path(product, path)[0]
    step = {"method": method, "path": path, "template": template, "params": fields.pop("params", {}), "undo": True,
            "kind": receipts.rule_for(method, template).kind, "object": path} | fields
    return {"id": "rc-12345678", "product": product, "host": "lab", "time": "2026-01-01T00:00:00Z",
            "tool": "write_call_api", "steps": [step]}


def plan(receipt, client):
    return undo.undo_plan(receipt, client).steps


def valid(product, steps):
    """Every step is a call the official schema accepts."""
    for method, path, params in steps:
        entry, path_params = catalog.find_method(product, method, path)
        assert catalog.check_params(entry, params, path_params=path_params, product=product) == {}, (method, path)
    return steps


RULE = {"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "22", "enable": 1}
OTHER = {"type": "in", "action": "DROP", "proto": "tcp", "dport": "8080", "enable": 1}


def listed(*rules, digest="d1"):
    """A firewall rule list as GET .../rules answers it: each rule with its pos and the list's digest."""
    return [rule | {"pos": pos, "digest": digest} for pos, rule in enumerate(rules)]


def test_firewall_options_are_set_back_with_the_digest():
    before = {"enable": 0, "policy_in": "ACCEPT", "digest": "d1"}
    after = {"enable": 1, "policy_in": "DROP", "log_level_in": "info", "digest": "d2"}
    path = "/nodes/pve1/qemu/100/firewall/options"
    steps = plan(receipt_for("pve", "PUT", path, before=before, after=after), Reads("pve", {path: after}))
    assert valid("pve", steps) == [("PUT", path, {"enable": 0, "policy_in": "ACCEPT", "delete": "log_level_in",
                                                  "digest": "d2"})]


def test_a_new_firewall_rule_is_deleted_at_the_top():
    rules = "/cluster/firewall/rules"
    after = listed(RULE | {"enable": 0}, OTHER, digest="d2")
    created = receipt_for("pve", "POST", rules, before=listed(OTHER), after=after, params=RULE | {"enable": 0})
    steps = plan(created, Reads("pve", {rules: after}))
    assert valid("pve", steps) == [("DELETE", f"{rules}/0", {"digest": "d2"})]


def test_a_deleted_firewall_rule_is_made_again_disabled_moved_then_enabled():
    """A new rule lands on top (pve-firewall Rules.pm create_rule): made enabled it would filter
    from pos 0 until the move, so it is made as write_edit_firewall_rule adds one."""
    rules = "/cluster/firewall/rules"
    deleted = receipt_for("pve", "DELETE", f"{rules}/1", pos=1, object=rules, before=listed(OTHER, RULE),
                          after=listed(OTHER, digest="d2"))
    steps = plan(deleted, Reads("pve", {rules: listed(OTHER, digest="d2")}))
    assert valid("pve", steps) == [
        # no digest: create_rule checks none; the move and enable get the list's, read back (made_rule_check)
        ("POST", rules, {"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "22", "enable": 0}),
        ("PUT", f"{rules}/0", {"moveto": 2}),  # before the rule now at 2: it lands at 1
        ("PUT", f"{rules}/1", {"enable": 1})]
    on_top = receipt_for("pve", "DELETE", f"{rules}/0", pos=0, object=rules, before=listed(RULE | {"enable": 0}),
                         after=[])
    assert valid("pve", plan(on_top, Reads("pve", {rules: []}))) == [
        ("POST", rules, {"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "22", "enable": 0})]


@pytest.mark.parametrize("pos, moveto, count, back", [(0, 3, 3, (2, 0)), (2, 0, 3, (0, 3)), (1, 9, 3, (2, 1)),
                                                      (2, 1, 4, (1, 3))])
def test_a_moved_firewall_rule_is_moved_back(pos, moveto, count, back):
    """moveto puts the rule before the one at that position (Rules.pm update_rule): from above it
    lands one lower, past the end it lands last."""
    rules = "/nodes/pve1/qemu/100/firewall/rules"
    before = listed(*[OTHER | {"dport": str(8000 + n)} for n in range(count)])
    moved = [dict(r) for r in before]
    moved.insert(receipts.moved_to(pos, moveto, count), moved.pop(pos))
    after = listed(*[{k: v for k, v in r.items() if k not in ("pos", "digest")} for r in moved], digest="d2")
    step = receipt_for("pve", "PUT", f"{rules}/{pos}", pos=pos, object=rules, before=before, after=after,
                       params={"moveto": moveto})
    where, to = back
    assert valid("pve", plan(step, Reads("pve", {rules: after}))) == [
        ("PUT", f"{rules}/{where}", {"moveto": to, "digest": "d2"})]


def test_a_changed_firewall_rule_is_set_back_and_a_list_changed_since_is_refused():
    rules = "/nodes/pve1/lxc/101/firewall/rules"
    after = listed(OTHER, RULE | {"enable": 0, "comment": "off"}, digest="d2")
    changed = receipt_for("pve", "PUT", f"{rules}/1", pos=1, object=rules, before=listed(OTHER, RULE), after=after,
                          params={"enable": 0, "comment": "off"})
    assert valid("pve", plan(changed, Reads("pve", {rules: after}))) == [
        ("PUT", f"{rules}/1", {"enable": 1, "delete": "comment", "digest": "d2"})]
    with pytest.raises(ProxmoxError, match="rules of .* changed since receipt rc-12345678"):
        plan(changed, Reads("pve", {rules: listed(RULE, OTHER, digest="d3")}))


def test_a_backup_jobs_retention_object_is_sent_back_as_a_property_string():
    """GET /cluster/backup answers prune-backups as an object, POST and PUT take a property string
    (docs/PROXMOX-BEHAVIOUR.md#backup-jobs-after-an-edit)."""
    path = "/cluster/backup/nightly"
    job = {"id": "nightly", "type": "vzdump", "schedule": "02:00", "all": 1, "storage": "pbs", "enabled": 1,
           "prune-backups": {"keep-daily": 7, "keep-weekly": 4}}
    steps = plan(receipt_for("pve", "DELETE", path, before=job), Reads("pve", {}))
    assert valid("pve", steps)[0][2]["prune-backups"] == "keep-daily=7,keep-weekly=4"
    edited = job | {"prune-backups": {"keep-last": 1}}
    steps = plan(receipt_for("pve", "PUT", path, before=job, after=edited),
                               Reads("pve", {path: edited}))
    assert valid("pve", steps) == [("PUT", path, {"prune-backups": "keep-daily=7,keep-weekly=4"})]


def test_agent_questions_get_no_receipt(tmp_path):
    """POST .../agent/ping asks the agent and changes nothing (the restore drill pings every second)."""
    decision = SimpleNamespace(method="POST", path="/nodes/pve1/qemu/100/agent/ping", guests=[100],
                               template="/nodes/{node}/qemu/{vmid}/agent/ping", params={}, path_params={})
    host = SimpleNamespace(product="pve", label="lab", token_id="t")
    keeping = Keeping(receipts.open_store(tmp_path / "audit.jsonl"))
    assert receipts.start(keeping, host, decision, Reads("pve", {}), calls.Call(tool="write_drill_restore")) is None


def test_ha_rules_and_pbs_jobs():
    rule = {"rule": "keep-apart", "type": "resource-affinity", "resources": "vm:100,vm:101", "affinity": "negative",
            "digest": "h1"}
    edited = rule | {"resources": "vm:100,vm:102", "comment": "new", "digest": "h2"}
    path = "/cluster/ha/rules/keep-apart"
    steps = plan(receipt_for("pve", "PUT", path, before=rule, after=edited),
                               Reads("pve", {path: edited}))
    assert valid("pve", steps) == [("PUT", path, {"resources": "vm:100,vm:101", "delete": "comment",
                                                  "type": "resource-affinity", "digest": "h2"})]
    steps = plan(receipt_for("pve", "DELETE", path, before=rule), Reads("pve", {}))
    assert valid("pve", steps) == [("POST", "/cluster/ha/rules", {
        "type": "resource-affinity", "resources": "vm:100,vm:101", "affinity": "negative", "rule": "keep-apart"})]
    job = {"id": "s-backup", "store": "backup", "remote": "office", "remote-store": "backup", "schedule": "weekly"}
    changed = job | {"schedule": "daily", "remove-vanished": True}
    steps = plan(receipt_for("pbs", "PUT", "/config/sync/s-backup", before=job, after=changed),
                               Reads("pbs", {"/config/sync/s-backup": changed}))
    assert valid("pbs", steps) == [("PUT", "/config/sync/s-backup", {"schedule": "weekly",
                                                                     "delete": ["remove-vanished"]})]


def test_backup_volume_notes_are_cleared_without_a_delete_parameter():
    path = "/nodes/pve1/storage/nfs-backup/content/nfs-backup:backup/vzdump-qemu-100-x.vma.zst"
    before, after = {"format": "vma.zst"}, {"format": "vma.zst", "notes": "keep", "protected": 1}
    steps = plan(receipt_for("pve", "PUT", path, before=before, after=after),
                               Reads("pve", {path: after}))
    assert valid("pve", steps) == [("PUT", path, {"notes": "", "protected": 0})]


def test_what_changed_since_is_named_and_nothing_is_planned():
    path = "/cluster/firewall/options"
    kept = receipt_for("pve", "PUT", path, before={"enable": 0}, after={"enable": 1, "digest": "a"})
    with pytest.raises(ProxmoxError, match="changed since receipt rc-12345678: another digest, and policy_in"):
        plan(kept, Reads("pve", {path: {"enable": 1, "policy_in": "DROP", "digest": "b"}}))
    kept["steps"][0]["undo"] = "disks only grow"
    with pytest.raises(InvalidArgument, match="cannot be taken back: disks only grow"):
        plan(kept, Reads("pve", {}))
    assert issubclass(InvalidArgument, ToolFailure)


# ---------------------------------------------------------------- the safety snapshot's storages

STORAGES = [{"storage": "local-lvm", "type": "lvmthin"}, {"storage": "local", "type": "dir"},
            {"storage": "local-zfs", "type": "zfspool"}, {"storage": "ceph", "type": "rbd"},
            {"storage": "chain", "type": "dir", "snapshot-as-volume-chain": 1}, {"storage": "san", "type": "iscsi"}]


@pytest.mark.parametrize("disk, rollback, why", [
    ("local-lvm:vm-100-disk-0,size=32G", True, None),
    ("ceph:vm-100-disk-0,size=32G", True, None),
    ("local:100/vm-100-disk-0.qcow2,size=32G", True, None),
    ("local:100/vm-100-disk-0.raw,size=32G", False, "cannot snapshot it"),
    ("san:0.0.1.scsi-36001405,size=32G", False, "cannot snapshot it"),
    ("/dev/sdb,size=32G", False, "a host path"),
    ("local-zfs:vm-100-disk-0,size=32G", False, None),
    ("local-zfs:vm-100-disk-0,size=32G", True, "rolls back only to the newest snapshot"),
    ("chain:100/vm-100-disk-0.qcow2,size=32G", True, "rolls back only to the newest snapshot"),
])
def test_which_guests_get_a_safety_snapshot(disk, rollback, why):
    config = {"scsi0": disk, "ide2": "local:iso/debian.iso,media=cdrom", "net0": "virtio,bridge=vmbr0"}
    found = receipts.cannot_snapshot(Reads("pve", {"/storage": STORAGES}), config, rollback=rollback)
    assert (found is None) if why is None else (why in found)


def test_a_template_gets_no_safety_snapshot():
    assert receipts.cannot_snapshot(Reads("pve", {"/storage": STORAGES}), {"template": 1}, rollback=True)


def test_a_secret_nested_in_a_stored_object_is_masked():
    """Objects a receipt keeps are masked at every depth, not only their top-level values."""
    kept = receipts.stored_object({"id": "m1", "otel": {"password": "hunter2-secret", "port": 4317},
                                   "endpoints": [{"token": "tok-0123456789", "url": "https://x"}]})
    assert kept["otel"] == {"password": MASK, "port": 4317} and kept["endpoints"][0]["token"] == MASK
    assert kept["endpoints"][0]["url"] == "https://x" and kept["id"] == "m1"
