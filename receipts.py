"""Receipts: what each tool call that reached Proxmox changed, kept in the state database
(receipt_store.py) so that it can be listed (list_changes), compared (what_changed) and taken
back (write_undo_change, through undo.py).

One receipt per tool call (and host): every request the call sent is one of its steps, in order.
The policy's admission step calls `start` just before it sends a write (after the dry run and the
user's yes, before the audit line) and `Pending.finish` after a successful send:

  start    reads the state of what the request changes where one GET shows it (RECEIPT_RULES: guest
           config, NICs, tags, notes, protection flags, cloud-init settings, firewall rules and
           options, backup and PBS jobs, HA rules, PBS notes and protection), and takes a safety
           snapshot first before a rollback or a config change that can lose data (SAFETY_STORAGES);
           the safety snapshots beyond the rule (PROXMOX_SAFETY_KEEP, _DAYS) are removed then
  finish   reads the state after, adds the step to the call's receipt and keeps it: masked like the
           audit log (a secret that changed is recorded as changed, never its value), signed, bounded
           in count and age

A safety snapshot and the removals of the rule are steps of the receipt marked `safety`: an undo
leaves them alone. What cannot be taken back says why (NOT_INVERTIBLE). Nothing here sends a
write but the safety snapshot and its rule's removals, and only through the client (so through the
policy, which declared them in the plan the user was asked about: `follow_ups`).
"""
from __future__ import annotations

import re
import secrets as random_ids
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import calls
import catalog
import config_diff
import state
from errors import InvalidArgument, ProxmoxError, ToolFailure
from job_edits import delete_names
from masking import MASK, audit_view, mask, secret_param
from receipt_store import IMPORTED, SAFETY_NAME, Store
from settings import Keeping


def open_store(audit_path: Path) -> Store:
    """The receipts of a server whose audit log is `audit_path`: in the state database beside it;
    the files an earlier version kept in `<log>.receipts/` are imported on first use."""
    return Store(state.Database(state.path_for(audit_path)), audit_path.with_name(audit_path.stem + ".receipts"),
                 row_of)


SAFETY_CHOICES = ("off", "rollback", "all")
RECEIPT_ID = re.compile(r"rc-[0-9a-f]{8}")
GUEST = r"/nodes/\{node\}/(qemu|lxc)/\{vmid\}"
FIREWALL = rf"(/cluster|/nodes/\{{node\}}|{GUEST})/firewall"


@dataclass(frozen=True)
class Rule:
    """How one kind of write is recorded and taken back: `kind` (see undo.py), the methods and
    the catalog template it matches."""
    kind: str
    methods: str
    pattern: str


# First match wins. settings: an object one GET reads at the same path, changed key by key;
# value: one PBS snapshot attribute; rules: a firewall rule list, read whole before and after (a
# rule's position moves with every edit); created / deleted: an item of a collection; snapshot,
# power, rollback: a guest's snapshot list, its state, its safety snapshot.
RECEIPT_RULES = [
    Rule("settings", "PUT|POST", rf"{GUEST}/config"),
    Rule("settings", "PUT", rf"{FIREWALL}/options"),
    Rule("rules", "POST", rf"{FIREWALL}/rules"),
    Rule("rules", "PUT|DELETE", rf"{FIREWALL}/rules/\{{pos\}}"),
    Rule("settings", "PUT", r"/cluster/backup/\{id\}|/cluster/ha/(rules/\{rule\}|resources/\{sid\})"),
    Rule("settings", "PUT", r"/config/(sync|prune|verify)/\{id\}"),
    Rule("settings", "PUT", r"/nodes/\{node\}/storage/\{storage\}/content/\{volume\}"),
    Rule("value", "PUT", r"/admin/datastore/\{store\}/(notes|protected)"),
    Rule("created", "POST", r"/cluster/backup|/cluster/ha/(rules|resources)"),
    Rule("created", "POST", r"/config/(sync|prune|verify)"),
    Rule("snapshot", "POST", rf"{GUEST}/snapshot"),
    Rule("deleted", "DELETE", r"/cluster/backup/\{id\}"),
    Rule("deleted", "DELETE", r"/cluster/ha/(rules/\{rule\}|resources/\{sid\})|/config/(sync|prune|verify)/\{id\}"),
    Rule("power", "POST", rf"{GUEST}/status/(start|stop|shutdown|suspend|resume)"),
    Rule("rollback", "POST", rf"{GUEST}/snapshot/\{{snapname\}}/rollback"),
]
# Why the rest cannot be taken back: (template regex, reason); the first match names it. Every write
# the every-tool test sends has a rule above or a reason here (tests/test_every_tool_over_mcp.py).
NOT_INVERTIBLE = [
    (rf"{GUEST}", "a deleted guest's disks are gone"),
    (rf"{GUEST}/snapshot/\{{snapname\}}", "a deleted snapshot's state is gone"),
    (rf"{GUEST}/resize", "disks only grow: Proxmox cannot shrink a disk back"),
    (rf"{GUEST}/agent/.*|/nodes/\{{node\}}/execute", "what ran or was written inside a guest cannot be taken back"),
    (r"/nodes/\{node\}/storage/\{storage\}/content/\{volume\}", "a deleted volume is gone"),
    (r"/admin/datastore/\{store\}/(prune|prune-datastore|snapshots|groups)|/admin/prune/.*",
     "pruned or forgotten backups are gone"),
    (r"/nodes/\{node\}/vzdump", "a backup run can prune older backups; delete the new one with write_delete_volume"),
    (rf"{GUEST}/status/(reboot|reset)", "the guest runs as before; what ran in it was restarted"),
    (rf"{GUEST}/(clone|template|migrate)|/nodes/\{{node\}}/(qemu|lxc)",
     "it made or moved a guest: delete or migrate it back with its own tool"),
    (rf"{GUEST}/cloudinit", "it regenerated the cloud-init drive; take back the config change instead"),
    (r"/nodes/\{node\}/aplinfo|/nodes/\{node\}/storage/\{storage\}/(download-url|oci-registry-pull|upload)",
     "it added a file to a storage: delete it with write_delete_volume"),
    (r"/admin/datastore/\{store\}/gc", "garbage collection frees only chunks no backup uses: nothing to put back"),
    (r"/admin/datastore/\{store\}/verify|/admin/verify/\{id\}/run",
     "a verification changes no backup, it records whether each one reads back whole"),
]
# POSTs that change nothing: guest agent questions (the schema's agent commands that only read).
UNCHANGING = re.compile(rf"{GUEST}/agent/(ping|info|fsfreeze-status|network-get-interfaces|get-[\w-]+)")
STATE_AFTER = {"start": "running", "stop": "stopped", "shutdown": "stopped", "suspend": "paused", "resume": "running"}
UNUSED = re.compile(r"unused\d+")
DISK = re.compile(r"(scsi|virtio|sata|ide|efidisk|tpmstate|mp)\d+|rootfs")
RULE_ROW = ("digest", "pos")  # what a firewall rule list adds to each rule: not the rule itself

# Storage types whose volumes take snapshots (None: any format), as pve-storage's plugins answer
# volume_has_feature('snapshot', current); and those that roll back only to the newest snapshot
# (volume_rollback_is_possible), where a safety snapshot would block the rollback
# (docs/PROXMOX-BEHAVIOUR.md#snapshots-and-rollback).
SAFETY_STORAGES: dict[str, frozenset[str] | None] = {
    "lvmthin": None, "zfspool": None, "zfs": None, "rbd": None,
    "btrfs": frozenset({"qcow2", "raw", "subvol"}),
    "dir": frozenset({"qcow2"}), "nfs": frozenset({"qcow2"}), "cifs": frozenset({"qcow2"}),
    "glusterfs": frozenset({"qcow2"}), "lvm": frozenset({"qcow2"}),
}
NEWEST_ONLY = ("zfspool", "zfs", "lvm")


def rule_for(method: str, template: str) -> Rule | None:
    return next((r for r in RECEIPT_RULES if method in r.methods.split("|") and re.fullmatch(r.pattern, template)),
                None)


def why_not(method: str, template: str) -> str:
    for pattern, why in NOT_INVERTIBLE:
        if re.fullmatch(pattern, template):
            return why
    return f"no inverse is known for {method} {template}"


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ================================================================ what is kept

def stored(key: str, value: Any) -> Any:
    """A value as a receipt keeps it: secrets masked by name and by shape."""
    if value in (None, ""):
        return value
    if secret_param(key):
        return MASK
    return mask(value) if isinstance(value, str) else value


def stored_object(data: Any, key: str = "value") -> Any:
    """An object as a receipt keeps it: every secret masked by its name, at any depth."""
    if isinstance(data, dict):
        return {k: stored_object(v, k) for k, v in data.items()}
    if isinstance(data, list):
        return [stored_object(v, key) for v in data]
    return stored(key, data) if isinstance(data, str) else data


def acting_steps(receipt: dict) -> list[dict]:
    """The steps that made the call's change: not its safety snapshot nor the rule's removals."""
    return [step for step in receipt.get("steps") or [] if not step.get("safety")]


def undo_state(receipt: dict) -> str | bool:
    """True when every step can be taken back, else why not (list_changes' `undo` column)."""
    if receipt.get("imported"):
        return IMPORTED
    steps = acting_steps(receipt)
    if not steps:
        return "only its safety snapshot was kept: the change itself was not sent"
    return next((step.get("undo") or "its change was not recorded" for step in steps if step.get("undo") is not True),
                True)


def summary(receipt: dict) -> str:
    """What the call changed, in words (list_changes' `change` column)."""
    said = "; ".join(line for step in acting_steps(receipt) for line in step.get("changes") or []) or \
        "; ".join(f"{s['method']} {s['path']}" for s in acting_steps(receipt))
    taken = [s["safety_snapshot"] for s in receipt.get("steps") or [] if s.get("safety_snapshot")]
    if taken:
        said += f" [safety snapshot: {', '.join(taken)}]"
    return said if len(said) <= 200 else said[:199] + "…"


def row_of(receipt: dict) -> dict:
    """The row list_changes shows of a receipt (kept beside it, so that a page reads no receipt)."""
    if receipt.get("undone_by"):
        undo = f"undone by {', '.join(receipt['undone_by'])}"
    else:
        state_now = undo_state(receipt)
        undo = "yes" if state_now is True else f"no: {state_now}"
    return {"time": receipt["time"], "host": receipt["host"], "tool": receipt.get("tool"), "by": receipt.get("by"),
            "principal": receipt.get("principal"), "guests": ",".join(map(str, receipt.get("guests") or [])),
            "change": summary(receipt), "undo": undo}


def load(keeping: Keeping, receipt_id: str, hosts: frozenset[str] | None = None) -> dict:
    """One receipt by id, verified, of one of `hosts` when given (the caller's reach: another host's is
    as none); InvalidArgument naming why there is none."""
    if keeping.store is None:
        raise InvalidArgument("No receipts are kept: the server has no audit log (PROXMOX_AUDIT_LOG).")
    try:
        found = keeping.store.load(receipt_id, hosts)
    except state.StateError as exc:
        raise ProxmoxError(f"The receipts cannot be read: {exc}.") from None
    if found is None:
        raise InvalidArgument(f"No receipt {receipt_id}. list_changes shows those kept (the newest "
                              f"{keeping.keep}, at most {keeping.days} days old).")
    return found


def save(keeping: Keeping, receipt: dict) -> None:
    keeping.store.save(receipt, keeping.keep, keeping.days)


def mark_undone(keeping: Keeping, receipt: dict, by: list[str]) -> None:
    save(keeping, receipt | {"undone_by": by, "undone_at": now_iso()})


# ================================================================ recording a call

@dataclass
class Record:
    """The receipt of one tool call on one host while the call runs."""
    receipt: dict
    housekeeping: set[tuple[str, str]] = field(default_factory=set)  # (method, path): the safety steps
    answer: dict = field(default_factory=dict)  # what the call's answer says of its safety snapshots

    @property
    def id(self) -> str:
        return self.receipt["id"]

    def safety_name(self) -> str:
        """The next safety snapshot's name: mcp-safety-<receipt>, then -2, -3 in the same call."""
        taken = sum(1 for step in self.receipt["steps"] if step.get("safety_snapshot", "").startswith("mcp-"))
        return f"mcp-safety-{self.id[3:]}" + (f"-{taken + 1}" if taken else "")


def record_for(host: Any, call: calls.Call) -> Record:
    """The receipt of the running call on this host (a new one for a request outside a call)."""
    records = call.receipt_records
    key = (host.product, host.label)
    if key not in records:
        records[key] = Record({
            "id": f"rc-{random_ids.token_hex(4)}", "time": now_iso(), "epoch": time.time(), "host": host.label,
            "product": host.product, "url": getattr(host, "url", None), "tool": call.tool,
            "by": getattr(host, "write_token_id", None) or host.token_id, "principal": call.principal,
            "guests": [], "steps": []})
    return records[key]


@dataclass
class Pending:
    """A request about to be sent: its step of the call's receipt, with the state before."""
    step: dict
    rule: Rule | None
    decision: Any
    client: Any
    keeping: Keeping
    record: Record
    read: dict = field(default_factory=dict)  # how the object is read: path and params

    @property
    def id(self) -> str:
        return self.record.id

    def finish(self, result: Any, audit_line: str | None) -> str:
        """After a successful send: the state after, what changed, whether it can be taken back;
        the step added to the call's receipt, which is kept."""
        self.step["audit"] = audit_line
        try:
            with calls.current().reads.fresh():  # never a read kept from before the write (calls.Reads)
                _after(self, result)
        except ToolFailure as exc:
            self.step["undo"] = f"its state after the change could not be read ({str(exc)[:200]})"
        receipt = self.record.receipt
        receipt["steps"].append(self.step)
        receipt["guests"] = sorted(set(receipt["guests"]) | set(self.step["guests"]))
        save(self.keeping, receipt)
        return self.id


def start(keeping: Keeping, host: Any, decision: Any, client: Any, call: calls.Call) -> Pending | None:
    """A step of the call's receipt for a write about to be sent, with the state before it; a
    safety snapshot first when one is due (which raises when it fails: then nothing is sent)."""
    if keeping.store is None or decision.method == "GET" or UNCHANGING.fullmatch(decision.template) \
            or set(decision.gates) <= {"read", "sensitive"}:  # a read over SSH (a node's file) changes nothing
        return None
    record = record_for(host, call)
    rule = rule_for(decision.method, decision.template) if client is not None else None
    step = {"method": decision.method, "path": decision.path, "template": decision.template,
            "params": audit_view(decision.params), "guests": decision.guests, "kind": rule.kind if rule else "none"}
    if (decision.method, decision.path) in record.housekeeping:
        step["safety"] = True  # the safety snapshot of another step, or a removal by the rule
    pending = Pending(step, rule, decision, client, keeping, record)
    if rule is None:
        step["undo"] = why_not(decision.method, decision.template) if client is not None else \
            "a command run in a guest or on a node cannot be taken back"
        return pending
    try:
        _before(pending)
    except ToolFailure as exc:
        step["undo"] = f"its state before the change could not be read ({str(exc)[:200]})"
        pending.rule = None
    if pending.rule is not None and not step.get("safety") and safety_due(keeping, pending):
        take_safety_snapshot(pending)
    return pending


def _before(p: Pending) -> None:
    d, kind = p.decision, p.rule.kind
    base = _guest_base(d.path)
    if kind in ("settings", "value"):
        selectors = _selectors(p.client.host.product, d) if kind == "value" else {}
        p.read = {"path": d.path, "params": selectors}
        p.step |= {"object": d.path, "selectors": selectors,
                   "before": stored_object(p.client.read(d.path, **selectors))}
        _judge_settings(p)
    elif kind == "rules":
        collection = d.path if d.method == "POST" else d.path.rsplit("/", 1)[0]
        p.read = {"path": collection, "params": {}}
        p.step |= {"object": collection, "pos": None if d.method == "POST" else int(d.path_params["pos"]),
                   "before": stored_object(p.client.read(collection) or [])}
    elif kind == "created":
        p.read = {"path": d.path}
        p.step |= {"object": d.path, "before": _ids(p.client.read(d.path))}
    elif kind == "deleted":
        p.step |= {"object": d.path, "before": stored_object(p.client.read(d.path))}
    elif kind == "snapshot":
        p.step |= {"object": f"{base}/snapshot", "snapshot": d.params.get("snapname")}
    elif kind in ("power", "rollback"):
        status = p.client.read(f"{base}/status/current") or {}
        p.step |= {"object": f"{base}/status/current", "before": power_state(status)}
        if kind == "rollback":
            p.step["snapshot"] = d.path_params.get("snapname")
            p.step["undo"] = "no safety snapshot was taken before the rollback"


def _judge_settings(p: Pending) -> None:
    """A config edit that frees a volume (delete=unusedN, vmstate) cannot be taken back; one that
    deletes an option has its old value in `before`."""
    deleted = delete_names(p.decision.params.get("delete"))
    if any(UNUSED.fullmatch(k) or k == "vmstate" for k in deleted):
        p.step["undo"] = "it freed a volume (unusedN or vmstate), whose data is gone"


def _after(p: Pending, result: Any) -> None:
    kind = p.rule.kind if p.rule else None
    if kind in ("settings", "value"):
        if isinstance(result, str) and result.startswith("UPID:"):  # qemu's POST config runs as a task
            p.client.wait_task(result, timeout=p.client.host.read_timeout)
        after = stored_object(p.client.read(p.read["path"], **p.read["params"]))
        p.step["after"] = after
        p.step["changes"] = _changes(p.step["before"], after)
        p.step.setdefault("undo", True if p.step["changes"] else "nothing changed")
    elif kind == "rules":
        p.step |= _rules_after(p.step, stored_object(p.client.read(p.read["path"]) or []))
    elif kind == "created":
        p.step |= _created(p)
    elif kind == "deleted":
        p.step |= {"changes": [f"{p.decision.path} deleted"], "undo": True}
    elif kind == "snapshot":
        p.step |= {"changes": [f"snapshot {p.step['snapshot']} created"], "undo": True}
    elif kind == "power":
        action = p.decision.path.rsplit("/", 1)[1]
        p.step["after"] = STATE_AFTER[action]
        same = p.step["before"] == STATE_AFTER[action]
        p.step |= {"changes": [f"{action} (was {p.step['before']})"],
                   "undo": "the guest was already " + p.step["before"] if same else True}
    elif kind == "rollback":
        p.step["changes"] = [f"rolled back to snapshot {p.step['snapshot']} (was {p.step['before']})"]


def rule_fields(rule: Any) -> dict:
    """A firewall rule without what its list adds to it (the list's digest, its position)."""
    return {k: v for k, v in rule.items() if k not in RULE_ROW} if isinstance(rule, dict) else {}


def is_rule(listed: Any, given: dict) -> bool:
    """A listed firewall rule is the one sent with `given` (its fields, the control ones aside); without
    case, as a macro comes back in its preferred case (pve-firewall Firewall.pm parse_rule)."""
    listed = listed if isinstance(listed, dict) else {}
    return all(str(listed.get(k)).lower() == str(v).lower() for k, v in given.items()
               if k not in ("enable", "digest", "pos"))


def rule_words(rule: dict) -> str:
    words = [str(rule.get(k)) for k in ("type", "action", "macro", "proto", "dport") if rule.get(k)]
    if rule.get("source"):
        words.append(f"from {rule['source']}")
    return " ".join(words) + ("" if str(rule.get("enable", 0)) not in ("0", "") else " (disabled)")


def moved_to(pos: int, moveto: int, count: int) -> int:
    """Where PUT rules/{pos} moveto=N leaves the rule: before the rule at N, so one lower when it
    came from above (pve-firewall API2/Firewall/Rules.pm update_rule;
    docs/PROXMOX-BEHAVIOUR.md#firewall-rules)."""
    return moveto if moveto <= pos else min(moveto, count) - 1


def _rules_after(step: dict, after: list) -> dict:
    """A firewall rule list after one edit: what changed, in words, and whether it can be taken
    back (the list as the edit leaves it: one more, one fewer or as many rules)."""
    before, pos, params = step["before"], step.get("pos"), step["params"]
    grew = {"POST": 1, "DELETE": -1}.get(step["method"], 0)
    if len(after) != len(before) + grew:
        return {"after": after, "changes": [], "undo": "the rule list changed meanwhile by more than this edit"}
    if step["method"] == "POST":
        changes = [f"rule added at pos 0: {rule_words(after[0])}"]
    elif step["method"] == "DELETE":
        changes = [f"rule {pos} deleted: {rule_words(before[pos])}"]
    elif "moveto" in params and int(params["moveto"]) != pos:
        changes = [f"rule {pos} moved to pos {moved_to(pos, int(params['moveto']), len(before))}"]
    else:
        changes = [f"rule {pos}: {line}" for line in _changes(rule_fields(before[pos]), rule_fields(after[pos]))]
    return {"after": after, "changes": changes, "undo": True if changes else "nothing changed"}


def _created(p: Pending) -> dict:
    """The item a POST made: named by its id parameter, or found as the one new in the list."""
    d = p.decision
    after = _ids(p.client.read(d.path))
    name = _item_param(p.client.host.product, d.template)
    item = str(d.params.get(name) or next(iter(sorted(set(after) - set(p.step["before"]))), ""))
    if not item or item not in after:
        return {"undo": "the new item could not be found after the change", "changes": []}
    path = f"{d.path}/{item}"
    return {"item": path, "after": stored_object(p.client.read(path)), "changes": [f"{path} created"], "undo": True}


def _changes(before: Any, after: Any) -> list[str]:
    if isinstance(before, dict) and isinstance(after, dict):
        return config_diff.changed_lines(before, after)
    return [] if before == after else [config_diff.describe("value", before, after)]


def _ids(listing: Any) -> list[str]:
    """The ids of a collection's items: `id`, `rule`, `sid` or `name`."""
    ids = []
    for item in listing or []:
        for key in ("id", "rule", "sid", "name"):
            if isinstance(item, dict) and key in item:
                ids.append(str(item[key]))
                break
    return ids


def _item_param(product: str, template: str) -> str:
    items = catalog.item_templates(product, template)
    return re.search(r"\{([\w-]+)\}$", items[0]).group(1) if items else "id"


def _selectors(product: str, decision: Any) -> dict:
    """The parameters of a PUT that name what it changes (those its GET takes too: a PBS snapshot)."""
    entry = catalog.entry_for(product, "GET", decision.template) or {"params": {}}
    return {k: v for k, v in decision.params.items() if k in entry["params"] and k not in decision.path_params}


def _guest_base(path: str) -> str:
    match = re.match(r"/nodes/[^/]+/(qemu|lxc)/\d+", path)
    return match.group(0) if match else ""


def power_state(status: dict) -> str:
    """running, stopped or paused (a paused VM is `running` with qmpstatus paused)."""
    return "paused" if status.get("qmpstatus") in ("paused", "suspended", "prelaunch") else status.get("status", "?")


# ================================================================ the call's answer

def answer_fields(call: calls.Call) -> dict:
    """What a call's answer says of what it kept: its receipt (`receipts` too when it wrote to
    several hosts), the safety snapshot it took and what the rule removed (server.as_tool)."""
    kept = list(call.receipts)
    fields: dict[str, Any] = {"receipt": kept[-1]} | ({"receipts": kept} if len(kept) > 1 else {})
    for record in call.receipt_records.values():
        fields |= record.answer
    return fields


# ================================================================ the safety snapshot

def _rollback_target(decision: Any) -> str | None:
    return decision.path_params.get("snapname") if re.fullmatch(
        rf"{GUEST}/snapshot/\{{snapname\}}/rollback", decision.template) else None


def _may_take_one(keeping: Keeping, decision: Any) -> bool:
    """Whether a safety snapshot may be taken before this request (announce; safety_due decides)."""
    config = re.fullmatch(rf"{GUEST}/config", decision.template) and decision.method != "GET"
    deleted = delete_names(decision.params.get("delete"))
    risky = any(DISK.fullmatch(k) for k in [*deleted, *decision.params]) or \
        {"cpu", "machine"} & {*deleted, *decision.params}
    return bool(_rollback_target(decision) and keeping.safety != "off" or config and keeping.safety == "all" and risky)


def due_for_removal(keeping: Keeping, label: str, decision: Any) -> list[dict]:
    """The guest's safety snapshots the rule removes once a new one is taken: beyond the newest
    PROXMOX_SAFETY_KEEP (the new one counted) or older than PROXMOX_SAFETY_DAYS; never the snapshot
    a rollback returns to. Read from the store (what this server took and has not removed)."""
    match = re.match(r"/nodes/[^/]+/(qemu|lxc)/(\d+)", decision.path)
    if keeping.store is None or not match or not _may_take_one(keeping, decision):
        return []
    try:
        kept = keeping.store.safety_of(label, int(match.group(2)))
    except state.StateError:
        return []  # the removals wait for the next one: the change goes on
    oldest = time.time() - keeping.safety_days * 86400
    target = _rollback_target(decision)
    return [s for index, s in enumerate(kept) if s["name"] != target
            and (index >= keeping.safety_keep - 1 or s["epoch"] < oldest)]


def follow_ups(keeping: Keeping, label: str, decision: Any) -> list[tuple[str, str, dict]]:
    """The requests the admission sends after this one's yes, to be declared with it (the rule's
    removals of older safety snapshots: policy.admit asks about them in the same question)."""
    base = _guest_base(decision.path)
    return [("DELETE", f"{base}/snapshot/{s['name']}", {}) for s in due_for_removal(keeping, label, decision)]


def announce(keeping: Keeping, decision: Any, label: str | None = None) -> list[str]:
    """What a dry run and the user's question say about the safety snapshot an admitted request gets,
    and about the older ones the rule removes then."""
    if not _may_take_one(keeping, decision):
        return []
    if _rollback_target(decision):
        said = ["a safety snapshot is taken first where the guest's storage can (PROXMOX_SAFETY_SNAPSHOT)"]
    else:  # what safety_due decides when it knows the config
        said = ["a safety snapshot is taken first if this detaches or replaces a disk, or changes the CPU type or "
                "machine of a running VM, where the guest's storage can (PROXMOX_SAFETY_SNAPSHOT=all)"]
    due = due_for_removal(keeping, label, decision) if label is not None else []
    if due:
        said.append(f"then older safety snapshots of this guest are deleted: {', '.join(s['name'] for s in due)} "
                    f"(the newest {keeping.safety_keep} are kept, none older than {keeping.safety_days} days: "
                    f"PROXMOX_SAFETY_KEEP, PROXMOX_SAFETY_DAYS)")
    return said


def safety_due(keeping: Keeping, p: Pending) -> bool:
    """Before a rollback (unless PROXMOX_SAFETY_SNAPSHOT=off), and with `all` before a guest config
    change that can lose data: a disk detached or replaced, CPU type or machine changed on a running VM."""
    if p.rule.kind == "rollback":
        return keeping.safety != "off"
    if keeping.safety != "all" or not re.fullmatch(rf"{GUEST}/config", p.decision.template):
        return False
    return bool(risky_keys(p.decision, p.step.get("before") or {}, p.client))


def risky_keys(decision: Any, before: dict, client: Any) -> list[str]:
    deleted = delete_names(decision.params.get("delete"))
    risky = [k for k in deleted if DISK.fullmatch(k) and "media=cdrom" not in str(before.get(k, ""))]
    risky += [k for k, v in decision.params.items() if DISK.fullmatch(k) and k in before
              and str(v).split(",")[0] != str(before[k]).split(",")[0]]
    cpu = [k for k in ("cpu", "machine") if k in decision.params or k in deleted]
    if cpu and "/qemu/" in decision.path:
        status = client.read(f"{_guest_base(decision.path)}/status/current") or {}
        risky += cpu if status.get("status") == "running" else []
    return risky


def take_safety_snapshot(p: Pending) -> None:
    """Snapshot the guest before the change, when its storage can (else say why in the receipt);
    a snapshot that fails stops the change (raises). Then the rule removes the older ones."""
    base = _guest_base(p.decision.path)
    try:
        config = p.client.read(f"{base}/config") or {}
        why = cannot_snapshot(p.client, config, rollback=p.rule.kind == "rollback")
    except ToolFailure as exc:
        why = f"the guest's storage could not be read ({str(exc)[:200]})"
    if why:
        p.step["safety_snapshot"] = f"none: {why}"
        return
    name = p.record.safety_name()
    p.record.housekeeping.add(("POST", f"{base}/snapshot"))
    try:
        upid = p.client.request("POST", f"{base}/snapshot", {
            "snapname": name, "description": f"proxmox-mcp safety snapshot before receipt {p.id}"})
        p.client.wait_task(upid, timeout=max(60.0, p.client.host.read_timeout))
    except ToolFailure as exc:
        raise ProxmoxError(f"The safety snapshot {name} of {base} failed ({str(exc)[:300]}), so "
                           f"{p.decision.method} {p.decision.path} was NOT sent. Fix the cause, or set "
                           f"PROXMOX_SAFETY_SNAPSHOT=off to change it without one.") from None
    finally:
        p.record.housekeeping.discard(("POST", f"{base}/snapshot"))
    p.step["safety_snapshot"] = name
    if p.rule.kind == "rollback":
        p.step["undo"] = True
    _keep_safety(p, base, name, config)
    _renew_digest(p, base)


def _keep_safety(p: Pending, base: str, name: str, config: dict) -> None:
    """The new safety snapshot in the store and in the answer, with what it costs where that can be
    read; then the older ones the rule removes."""
    vmid = int(base.rsplit("/", 1)[1])
    storage = next((str(v).split(":", 1)[0] for k, v in sorted(config.items()) if DISK.fullmatch(k)
                    and ":" in str(v) and "media=cdrom" not in str(v)), None)
    removed, kept = _apply_rule(p, base)
    try:
        p.keeping.store.add_safety(p.client.host.label, vmid, name, base, p.id, storage)
    except state.StateError as exc:
        kept.append(f"{name} could not be recorded for the rule ({exc}); remove it with write_delete_snapshot")
    said = {"name": name, "guest": vmid, "cost": _cost(p.client, base, storage)}
    p.record.answer["safety_snapshot"] = {k: v for k, v in said.items() if v}
    if removed:
        p.record.answer["safety_snapshots_removed"] = p.record.answer.get("safety_snapshots_removed", []) + removed
    if kept:
        p.record.answer["safety_snapshots_note"] = "; ".join(kept)


def _cost(client: Any, base: str, storage: str | None) -> str:
    """What the snapshot costs: Proxmox reports no size of its own for a snapshot (the snapshot list
    has none), and copy-on-write makes it grow with what the guest writes after it; the storage's
    free space is what it takes from (docs/PROXMOX-BEHAVIOUR.md#snapshots-and-rollback)."""
    said = "no space when taken; it grows as the guest writes after it (copy-on-write)"
    if storage is None:
        return said
    try:
        status = client.read(f"{base.rsplit('/', 2)[0]}/storage/{storage}/status") or {}
    except ToolFailure:
        return f"{said}, on storage {storage}"
    total, used = status.get("total"), status.get("used")
    if not total or used is None:
        return f"{said}, on storage {storage}"
    free = status.get("avail", total - used)
    return f"{said}, on storage {storage}: {100 * used / total:.0f}% used, {_gib(free)} free"


def _gib(value: float) -> str:
    return f"{value / 1024 ** 3:.1f} GiB"


def _apply_rule(p: Pending, base: str) -> tuple[list[str], list[str]]:
    """Remove the guest's safety snapshots beyond the rule (due_for_removal), each through the
    policy (declared in the plan the user was asked about); one that cannot be removed is named."""
    removed, kept = [], []
    due = due_for_removal(p.keeping, p.client.host.label, p.decision)
    present = set(_snapshot_names(p.client, base)) if due else set()
    for snapshot in due:
        name, path = snapshot["name"], f"{base}/snapshot/{snapshot['name']}"
        if not SAFETY_NAME.fullmatch(name):
            continue
        p.record.housekeeping.add(("DELETE", path))
        try:
            if name in present:
                p.client.wait_task(p.client.request("DELETE", path, {}), timeout=max(60.0, p.client.host.read_timeout))
                removed.append(name)
            p.keeping.store.removed_safety(p.client.host.label, int(base.rsplit("/", 1)[1]), name)
        except (ToolFailure, state.StateError) as exc:
            kept.append(f"{name} is due for removal but was kept ({str(exc)[:160]}); write_delete_snapshot removes it")
        finally:
            p.record.housekeeping.discard(("DELETE", path))
    return removed, kept


def _snapshot_names(client: Any, base: str) -> list[str]:
    try:
        return [s["name"] for s in client.read(f"{base}/snapshot") or [] if s.get("name") != "current"]
    except ToolFailure:
        return []


def _renew_digest(p: Pending, base: str) -> None:
    """The snapshot rewrote the config file (its `parent`), so the digest the change carries, read
    before it, is stale: when nothing else changed since `before` (which was read with that
    digest), the change carries the new one (docs/PROXMOX-BEHAVIOUR.md#pending-config)."""
    params, before = p.decision.params, p.step.get("before") or {}
    if "digest" not in params or params["digest"] != before.get("digest"):
        return  # no digest, or one that was stale already: Proxmox judges it
    now = stored_object(p.client.read(f"{base}/config") or {})
    if all(config_diff.same(before.get(k), now.get(k)) for k in set(before) | set(now)
           if not config_diff.BOOKKEEPING.fullmatch(k)):
        params["digest"] = now.get("digest")


def cannot_snapshot(client: Any, config: dict, rollback: bool) -> str | None:
    """Why the guest's volumes cannot take a safety snapshot (or, before a rollback, why one would
    block it), from the storage types (GET /storage) and volume formats."""
    if str(config.get("template", "0")) == "1":
        return "a template takes no snapshots"
    storages = {s["storage"]: s for s in client.read("/storage") or []}
    for key, value in config.items():
        volume = str(value).split(",")[0]
        if not DISK.fullmatch(key) or "media=cdrom" in str(value) or volume in ("none", "cdrom", ""):
            continue
        storage = volume.split(":", 1)[0] if ":" in volume else None
        found = storages.get(storage) or {}
        kind = found.get("type")
        formats = SAFETY_STORAGES.get(kind, frozenset())
        if kind not in SAFETY_STORAGES or (formats is not None and _format(volume) not in formats):
            return f"{key} is on {storage or 'a host path'} ({kind or 'unknown type'}), which cannot snapshot it"
        if rollback and (kind in NEWEST_ONLY or str(found.get("snapshot-as-volume-chain", "0")) == "1"):
            return f"{kind} storage rolls back only to the newest snapshot, so a safety snapshot would block this one"
    return None


def _format(volume: str) -> str:
    name = volume.split(":", 1)[-1]
    match = re.search(r"\.(qcow2|raw|vmdk)$", name)
    return match.group(1) if match else ("subvol" if re.search(r"(^|/)subvol-", name) else "raw")
