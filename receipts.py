"""Receipts: what each write that reached Proxmox changed, kept beside the audit log so that it can
be listed (list_changes), compared (what_changed) and taken back (write_undo_change).

The policy's admission step calls `start` just before it sends a write (after the dry run and
the user's yes, before the audit line) and `Pending.finish` after a successful send:

  start    gives the write its receipt id, reads the state of what it changes where one GET shows
           it (RULES: guest config, NICs, tags, notes, protection flags, cloud-init settings,
           firewall rules and options, backup and PBS jobs, HA rules, PBS notes and protection),
           and takes a safety snapshot first before a rollback or a config change that can lose
           data (Keeping.safety, SAFETY_STORAGES)
  finish   reads the state after, and keeps the receipt: masked like the audit log (a secret
           that changed is recorded as changed, never its value), bounded in count and age

`undo_plan` turns a receipt into the requests that take the change back, after checking that
the object is still as the change left it; write_undo_change sends them through the same policy.
What cannot be taken back says why (NOT_INVERTIBLE). Nothing here sends a write but the safety
snapshot, and only through the client (so through the policy).
"""
from __future__ import annotations

import json
import os
import re
import secrets as random_ids
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import catalog
import config_diff
from job_edits import delete_names, property_string
from errors import InvalidArgument, ProxmoxError, ToolFailure
from masking import MASK, audit_view, mask, secret_param


@dataclass
class Keeping:
    """Where receipts live and for how long, and when a safety snapshot is taken (config.py)."""
    directory: Path | None = None  # beside the audit log; None: no receipts (no audit log either)
    keep: int = 1000  # PROXMOX_RECEIPTS_KEEP
    days: int = 30  # PROXMOX_RECEIPTS_DAYS
    safety: str = "rollback"  # PROXMOX_SAFETY_SNAPSHOT: off, rollback, or all (rollback and risky config)


SAFETY_CHOICES = ("off", "rollback", "all")
RECEIPT_ID = re.compile(r"rc-[0-9a-f]{8}")
GUEST = r"/nodes/\{node\}/(qemu|lxc)/\{vmid\}"
FIREWALL = rf"(/cluster|/nodes/\{{node\}}|{GUEST})/firewall"


@dataclass(frozen=True)
class Rule:
    """How one kind of write is recorded and taken back: `kind` (see undo_plan), the methods and
    the catalog template it matches."""
    kind: str
    methods: str
    pattern: str


# First match wins. settings: an object one GET reads at the same path, changed key by key;
# value: one PBS snapshot attribute; created / deleted: an item of a collection; snapshot, power,
# rollback: a guest's snapshot list, its state, its safety snapshot.
RULES = [
    Rule("settings", "PUT|POST", rf"{GUEST}/config"),
    Rule("settings", "PUT", rf"{FIREWALL}/options"),
    Rule("settings", "PUT", rf"{FIREWALL}/rules/\{{pos\}}"),
    Rule("settings", "PUT", r"/cluster/backup/\{id\}|/cluster/ha/(rules/\{rule\}|resources/\{sid\})"),
    Rule("settings", "PUT", r"/config/(sync|prune|verify)/\{id\}"),
    Rule("settings", "PUT", r"/nodes/\{node\}/storage/\{storage\}/content/\{volume\}"),
    Rule("value", "PUT", r"/admin/datastore/\{store\}/(notes|protected)"),
    Rule("created", "POST", rf"{FIREWALL}/rules|/cluster/backup|/cluster/ha/(rules|resources)"),
    Rule("created", "POST", r"/config/(sync|prune|verify)"),
    Rule("snapshot", "POST", rf"{GUEST}/snapshot"),
    Rule("deleted", "DELETE", rf"{FIREWALL}/rules/\{{pos\}}|/cluster/backup/\{{id\}}"),
    Rule("deleted", "DELETE", r"/cluster/ha/(rules/\{rule\}|resources/\{sid\})|/config/(sync|prune|verify)/\{id\}"),
    Rule("power", "POST", rf"{GUEST}/status/(start|stop|shutdown|suspend|resume)"),
    Rule("rollback", "POST", rf"{GUEST}/snapshot/\{{snapname\}}/rollback"),
]
# Why the rest cannot be taken back: (template regex, reason); the first match names it.
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
]
# POSTs that change nothing: guest agent questions (the schema's agent commands that only read).
UNCHANGING = re.compile(rf"{GUEST}/agent/(ping|info|fsfreeze-status|network-get-interfaces|get-[\w-]+)")
INVERSE_POWER = {"start": "shutdown", "stop": "start", "shutdown": "start", "suspend": "resume", "resume": "suspend"}
STATE_AFTER = {"start": "running", "stop": "stopped", "shutdown": "stopped", "suspend": "paused", "resume": "running"}
CONTROL = {"delete", "digest", "skiplock", "revert", "background_delay", "force", "moveto"}
UNUSED = re.compile(r"unused\d+")
DISK = re.compile(r"(scsi|virtio|sata|ide|efidisk|tpmstate|mp)\d+|rootfs")

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
    return next((r for r in RULES if method in r.methods.split("|") and re.fullmatch(r.pattern, template)), None)


def why_not(method: str, template: str) -> str:
    for pattern, why in NOT_INVERTIBLE:
        if re.fullmatch(pattern, template):
            return why
    return f"no inverse is known for {method} {template}"


def fill(template: str, values: dict[str, str]) -> str:
    return re.sub(r"\{([\w-]+)\}", lambda m: values.get(m.group(1), m.group(0)), template)


# ================================================================ the store

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


def path_of(keeping: Keeping, receipt_id: str) -> Path:
    assert keeping.directory is not None
    return keeping.directory / f"{receipt_id}.json"


def save(keeping: Keeping, receipt: dict) -> None:
    """Write one receipt (owner-only), then drop those beyond the count or older than the age."""
    keeping.directory.mkdir(parents=True, exist_ok=True)
    target = path_of(keeping, receipt["id"])
    temporary = target.with_suffix(".tmp")
    handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(handle, "w") as out:
        json.dump(receipt, out, separators=(",", ":"), default=str)
    os.replace(temporary, target)
    os.utime(target, (receipt["epoch"], receipt["epoch"]))  # age is the change's, not the file's
    prune(keeping)


def prune(keeping: Keeping) -> None:
    files = sorted(keeping.directory.glob("rc-*.json"), key=_mtime, reverse=True)
    oldest = time.time() - keeping.days * 86400
    for index, found in enumerate(files):
        if index >= keeping.keep or _mtime(found) < oldest:
            found.unlink(missing_ok=True)


def _mtime(found: Path) -> float:
    try:
        return found.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def load(keeping: Keeping, receipt_id: str) -> dict:
    """One receipt by id; InvalidArgument naming why there is none."""
    if keeping.directory is None:
        raise InvalidArgument("No receipts are kept: the server has no audit log (PROXMOX_AUDIT_LOG).")
    try:
        return json.loads(path_of(keeping, receipt_id).read_text())
    except (FileNotFoundError, ValueError):
        raise InvalidArgument(f"No receipt {receipt_id}. list_changes shows those kept (the newest "
                              f"{keeping.keep}, at most {keeping.days} days old).") from None


def recent(keeping: Keeping) -> list[dict]:
    """Every receipt kept, newest first."""
    if keeping.directory is None or not keeping.directory.is_dir():
        return []
    found = []
    for item in sorted(keeping.directory.glob("rc-*.json"), key=_mtime, reverse=True):
        try:
            found.append(json.loads(item.read_text()))
        except (OSError, ValueError):
            continue  # pruned meanwhile, or half written by another process
    return found


def mark_undone(keeping: Keeping, receipt: dict, by: list[str]) -> None:
    save(keeping, receipt | {"undone_by": by, "undone_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})


# ================================================================ recording a write

@dataclass
class Pending:
    """A write about to be sent: its receipt, with the state before."""
    receipt: dict
    rule: Rule | None
    decision: Any
    client: Any
    keeping: Keeping
    read: dict = field(default_factory=dict)  # how the object is read: path and params

    @property
    def id(self) -> str:
        return self.receipt["id"]

    def finish(self, result: Any, audit_line: str | None) -> str:
        """After a successful send: the state after, what changed, whether it can be taken back."""
        self.receipt["audit"] = audit_line
        try:
            _after(self, result)
        except ToolFailure as exc:
            self.receipt["undo"] = f"its state after the change could not be read ({str(exc)[:200]})"
        save(self.keeping, self.receipt)
        return self.id


def start(keeping: Keeping, host: Any, decision: Any, client: Any, tool: str | None) -> Pending | None:
    """A receipt for a write about to be sent, with the state before it; a safety snapshot first
    when one is due (which raises when it fails: then nothing is sent)."""
    if keeping.directory is None or decision.method == "GET" or UNCHANGING.fullmatch(decision.template) \
            or set(decision.gates) <= {"read", "sensitive"}:  # a read over SSH (a node's file) changes nothing
        return None
    rule = rule_for(decision.method, decision.template) if client is not None else None
    receipt = {"id": f"rc-{random_ids.token_hex(4)}", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "epoch": time.time(), "host": host.label, "product": host.product, "tool": tool,
               "by": getattr(host, "write_token_id", None) or host.token_id, "method": decision.method,
               "path": decision.path, "template": decision.template, "params": audit_view(decision.params),
               "guests": decision.guests, "kind": rule.kind if rule else "none"}
    pending = Pending(receipt, rule, decision, client, keeping)
    if rule is None:
        receipt["undo"] = why_not(decision.method, decision.template) if client is not None else \
            "a command run in a guest or on a node cannot be taken back"
        return pending
    try:
        _before(pending)
    except ToolFailure as exc:
        receipt["undo"] = f"its state before the change could not be read ({str(exc)[:200]})"
        pending.rule = None
    if pending.rule is not None and safety_due(keeping, pending):
        take_safety_snapshot(pending)
    return pending


def _before(p: Pending) -> None:
    d, kind = p.decision, p.rule.kind
    base = _guest_base(d.path)
    if kind in ("settings", "value"):
        selectors = _selectors(p.client.host.product, d) if kind == "value" else {}
        p.read = {"path": d.path, "params": selectors}
        p.receipt |= {"object": d.path, "selectors": selectors,
                      "before": stored_object(p.client.get(d.path, **selectors))}
        _judge_settings(p)
    elif kind == "created":
        p.read = {"path": d.path}
        p.receipt |= {"object": d.path, "before": _ids(p.client.get(d.path))}
    elif kind == "deleted":
        p.receipt |= {"object": d.path, "before": stored_object(p.client.get(d.path))}
    elif kind == "snapshot":
        p.receipt |= {"object": f"{base}/snapshot", "snapshot": d.params.get("snapname")}
    elif kind in ("power", "rollback"):
        status = p.client.get(f"{base}/status/current") or {}
        p.receipt |= {"object": f"{base}/status/current", "before": _state(status)}
        if kind == "rollback":
            p.receipt["snapshot"] = d.path_params.get("snapname")
            p.receipt["undo"] = "no safety snapshot was taken before the rollback"


def _judge_settings(p: Pending) -> None:
    """A config edit that frees a volume (delete=unusedN, vmstate) or moves a firewall rule cannot
    be taken back; one that deletes an option has its old value in `before`."""
    d = p.decision
    deleted = delete_names(d.params.get("delete"))
    if any(UNUSED.fullmatch(k) or k == "vmstate" for k in deleted):
        p.receipt["undo"] = "it freed a volume (unusedN or vmstate), whose data is gone"
    if "moveto" in d.params:
        p.receipt["undo"] = "it moved a firewall rule; move it back with the same call and the old position"


def _after(p: Pending, result: Any) -> None:
    kind = p.rule.kind if p.rule else None
    if kind in ("settings", "value"):
        if isinstance(result, str) and result.startswith("UPID:"):  # qemu's POST config runs as a task
            p.client.wait_task(result, timeout=p.client.host.read_timeout)
        after = stored_object(p.client.get(p.read["path"], **p.read["params"]))
        p.receipt["after"] = after
        p.receipt["changes"] = _changes(p.receipt["before"], after)
        p.receipt.setdefault("undo", True if p.receipt["changes"] else "nothing changed")
    elif kind == "created":
        p.receipt |= _created(p)
    elif kind == "deleted":
        p.receipt |= {"changes": [f"{p.decision.path} deleted"], "undo": True}
    elif kind == "snapshot":
        p.receipt |= {"changes": [f"snapshot {p.receipt['snapshot']} created"], "undo": True}
    elif kind == "power":
        action = p.decision.path.rsplit("/", 1)[1]
        p.receipt["after"] = STATE_AFTER[action]
        same = p.receipt["before"] == STATE_AFTER[action]
        p.receipt |= {"changes": [f"{action} (was {p.receipt['before']})"],
                      "undo": "the guest was already " + p.receipt["before"] if same else True}
    elif kind == "rollback":
        p.receipt["changes"] = [f"rolled back to snapshot {p.receipt['snapshot']} (was {p.receipt['before']})"]


def _created(p: Pending) -> dict:
    """The item a POST made: named by its id parameter, or found as the one new in the list (a
    firewall rule is put first: docs/PROXMOX-BEHAVIOUR.md#firewall-rules)."""
    d = p.decision
    after = _ids(p.client.get(d.path))
    if re.search(r"/firewall/rules$", d.path):
        item = "0"
    else:
        name = _item_param(p.client.host.product, d.template)
        item = str(d.params.get(name) or next(iter(sorted(set(after) - set(p.receipt["before"]))), ""))
    if not item or item not in after:
        return {"undo": "the new item could not be found after the change", "changes": []}
    path = f"{d.path}/{item}"
    return {"item": path, "after": stored_object(p.client.get(path)), "changes": [f"{path} created"], "undo": True}


def _changes(before: Any, after: Any) -> list[str]:
    if isinstance(before, dict) and isinstance(after, dict):
        return config_diff.changed_lines(before, after)
    return [] if before == after else [config_diff.describe("value", before, after)]


def _ids(listing: Any) -> list[str]:
    """The ids of a collection's items: `id`, `rule`, `sid`, or a firewall rule's `pos`."""
    ids = []
    for item in listing or []:
        for key in ("id", "rule", "sid", "pos", "name"):
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


def _state(status: dict) -> str:
    """running, stopped or paused (a paused VM is `running` with qmpstatus paused)."""
    return "paused" if status.get("qmpstatus") in ("paused", "suspended", "prelaunch") else status.get("status", "?")


# ================================================================ the safety snapshot

def announce(keeping: Keeping, decision: Any) -> list[str]:
    """What a dry run and the user's question say about the safety snapshot an admitted request gets."""
    rollback = re.fullmatch(rf"{GUEST}/snapshot/\{{snapname\}}/rollback", decision.template)
    config = re.fullmatch(rf"{GUEST}/config", decision.template) and decision.method != "GET"
    deleted = delete_names(decision.params.get("delete"))
    risky = any(DISK.fullmatch(k) for k in [*deleted, *decision.params]) or \
        {"cpu", "machine"} & {*deleted, *decision.params}
    if rollback and keeping.safety != "off":
        return ["a safety snapshot is taken first where the guest's storage can (PROXMOX_SAFETY_SNAPSHOT)"]
    if config and keeping.safety == "all" and risky:  # what safety_due decides when it knows the config
        return ["a safety snapshot is taken first if this detaches or replaces a disk, or changes the CPU type or "
                "machine of a running VM, where the guest's storage can (PROXMOX_SAFETY_SNAPSHOT=all)"]
    return []


def safety_due(keeping: Keeping, p: Pending) -> bool:
    """Before a rollback (unless PROXMOX_SAFETY_SNAPSHOT=off), and with `all` before a guest config
    change that can lose data: a disk detached or replaced, CPU type or machine changed on a running VM."""
    if p.rule.kind == "rollback":
        return keeping.safety != "off"
    if keeping.safety != "all" or not re.fullmatch(rf"{GUEST}/config", p.decision.template):
        return False
    return bool(risky_keys(p.decision, p.receipt.get("before") or {}, p.client))


def risky_keys(decision: Any, before: dict, client: Any) -> list[str]:
    deleted = delete_names(decision.params.get("delete"))
    risky = [k for k in deleted if DISK.fullmatch(k) and "media=cdrom" not in str(before.get(k, ""))]
    risky += [k for k, v in decision.params.items() if DISK.fullmatch(k) and k in before
              and str(v).split(",")[0] != str(before[k]).split(",")[0]]
    cpu = [k for k in ("cpu", "machine") if k in decision.params or k in deleted]
    if cpu and "/qemu/" in decision.path:
        status = client.get(f"{_guest_base(decision.path)}/status/current") or {}
        risky += cpu if status.get("status") == "running" else []
    return risky


def take_safety_snapshot(p: Pending) -> None:
    """Snapshot the guest before the change, when its storage can (else say why in the receipt);
    a snapshot that fails stops the change (raises)."""
    base = _guest_base(p.decision.path)
    try:
        why = cannot_snapshot(p.client, p.client.get(f"{base}/config") or {}, rollback=p.rule.kind == "rollback")
    except ToolFailure as exc:
        why = f"the guest's storage could not be read ({str(exc)[:200]})"
    if why:
        p.receipt["safety_snapshot"] = f"none: {why}"
        return
    name = f"mcp-safety-{p.id[3:]}"
    upid = p.client.request("POST", f"{base}/snapshot", {
        "snapname": name, "description": f"proxmox-mcp safety snapshot before receipt {p.id}"})
    try:
        p.client.wait_task(upid, timeout=max(60.0, p.client.host.read_timeout))
    except ToolFailure as exc:
        raise ProxmoxError(f"The safety snapshot {name} of {base} failed ({str(exc)[:300]}), so "
                           f"{p.decision.method} {p.decision.path} was NOT sent. Fix the cause, or set "
                           f"PROXMOX_SAFETY_SNAPSHOT=off to change it without one.") from None
    p.receipt["safety_snapshot"] = name
    if p.rule.kind == "rollback":
        p.receipt["undo"] = True
    _renew_digest(p, base)


def _renew_digest(p: Pending, base: str) -> None:
    """The snapshot rewrote the config file (its `parent`), so the digest the change carries, read
    before it, is stale: when nothing else changed since `before` (which was read with that
    digest), the change carries the new one (docs/PROXMOX-BEHAVIOUR.md#pending-config)."""
    params, before = p.decision.params, p.receipt.get("before") or {}
    if "digest" not in params or params["digest"] != before.get("digest"):
        return  # no digest, or one that was stale already: Proxmox judges it
    now = stored_object(p.client.get(f"{base}/config") or {})
    if all(config_diff.same(before.get(k), now.get(k)) for k in set(before) | set(now)
           if not config_diff.BOOKKEEPING.fullmatch(k)):
        params["digest"] = now.get("digest")


def cannot_snapshot(client: Any, config: dict, rollback: bool) -> str | None:
    """Why the guest's volumes cannot take a safety snapshot (or, before a rollback, why one would
    block it), from the storage types (GET /storage) and volume formats."""
    if str(config.get("template", "0")) == "1":
        return "a template takes no snapshots"
    storages = {s["storage"]: s for s in client.get("/storage") or []}
    for key, value in config.items():
        volume = str(value).split(",")[0]
        if not DISK.fullmatch(key) or "media=cdrom" in str(value) or volume in ("none", "cdrom", ""):
            continue
        storage = volume.split(":", 1)[0] if ":" in volume else None
        config = storages.get(storage) or {}
        kind = config.get("type")
        formats = SAFETY_STORAGES.get(kind, frozenset())
        if kind not in SAFETY_STORAGES or (formats is not None and _format(volume) not in formats):
            return f"{key} is on {storage or 'a host path'} ({kind or 'unknown type'}), which cannot snapshot it"
        if rollback and (kind in NEWEST_ONLY or str(config.get("snapshot-as-volume-chain", "0")) == "1"):
            return f"{kind} storage rolls back only to the newest snapshot, so a safety snapshot would block this one"
    return None


def _format(volume: str) -> str:
    name = volume.split(":", 1)[-1]
    match = re.search(r"\.(qcow2|raw|vmdk)$", name)
    return match.group(1) if match else ("subvol" if re.search(r"(^|/)subvol-", name) else "raw")


# ================================================================ taking a change back

@dataclass
class Undo:
    """The requests that take a receipt's change back, and the plan in words."""
    steps: list[tuple[str, str, dict[str, Any]]]
    summary: str


def undo_plan(receipt: dict, client: Any) -> Undo:
    """The inverse of a receipt's change, after checking that its object is as the change left it
    (raises ProxmoxError when it changed since, InvalidArgument when it cannot be taken back)."""
    rid = receipt["id"]
    if receipt.get("undone_by"):
        raise InvalidArgument(f"Receipt {rid} was taken back already (receipt {', '.join(receipt['undone_by'])}); "
                              f"take that one back to redo the change.")
    if receipt.get("undo") is not True:
        raise InvalidArgument(f"Receipt {rid} ({receipt['method']} {receipt['path']}) cannot be taken back: "
                              f"{receipt.get('undo') or 'its change was not recorded'}.{_safety_hint(receipt)}")
    steps = PLANNERS[receipt["kind"]](_follow_guest(receipt, client), client)
    what = "; ".join(receipt.get("changes") or [f"{receipt['method']} {receipt['path']}"])
    return Undo(steps, f"Take back receipt {rid} ({receipt.get('tool') or receipt['method']} at {receipt['time']}: "
                       f"{what[:300]}).")


def _follow_guest(receipt: dict, client: Any) -> dict:
    """A receipt of a guest that has moved to another node since, with its paths on that node."""
    match = re.match(r"/nodes/([^/]+)/(qemu|lxc)/(\d+)(/|$)", receipt["object"])
    if not match:
        return receipt
    try:
        rows = client.get("/cluster/resources", type="vm") or []
    except ToolFailure:
        return receipt  # where it was: reading it there says what is wrong
    node = next((r.get("node") for r in rows if str(r.get("vmid")) == match.group(3)), match.group(1))
    if node == match.group(1):
        return receipt
    moved = {k: v.replace(f"/nodes/{match.group(1)}/", f"/nodes/{node}/", 1) for k, v in receipt.items()
             if k in ("object", "item", "path") and isinstance(v, str)}
    return receipt | moved


def _safety_hint(receipt: dict) -> str:
    name = receipt.get("safety_snapshot")
    if name and not str(name).startswith("none"):
        return f" Its safety snapshot {name} holds the guest as it was: write_rollback_snapshot returns to it."
    return ""


def _unchanged_since(receipt: dict, after: Any, now: Any) -> None:
    """Refuse when the object is not as the change left it: another digest and other values (a
    restart that applied pending values changes the digest, not the values)."""
    if isinstance(after, dict) and isinstance(now, dict):
        if after.get("digest") and after.get("digest") == now.get("digest"):
            return
        differ = sorted(k for k in set(after) | set(now)
                        if not config_diff.BOOKKEEPING.fullmatch(k) and not config_diff.same(after.get(k), now.get(k)))
    else:
        differ = [] if after == now else ["its value"]
    if differ:
        raise ProxmoxError(f"{receipt.get('item') or receipt['object']} changed since receipt {receipt['id']}: "
                           f"another digest, and {', '.join(differ[:8])} differ from what the change left, so taking "
                           f"it back would overwrite that. Nothing was sent; read it again and change it with the "
                           f"tools." + _safety_hint(receipt))


def _current(receipt: dict, client: Any, path: str | None = None) -> Any:
    return stored_object(client.get(path or receipt["object"], **(receipt.get("selectors") or {})))


def _undo_settings(receipt: dict, client: Any) -> list:
    now = _current(receipt, client)
    _unchanged_since(receipt, receipt["after"], now)
    template = receipt["template"]
    method = "PUT" if catalog.entry_for(receipt["product"], "PUT", template) else receipt["method"]
    accepted = (catalog.entry_for(receipt["product"], method, template) or {}).get("params", {})
    params = restore_params(receipt["before"], receipt["after"], accepted)
    for name, spec in accepted.items():  # what the method requires besides the path (an HA rule's type)
        if not spec.get("optional") and f"{{{name}}}" not in template and name not in params and name in now:
            params[name] = now[name]
    if "digest" in accepted and now.get("digest"):
        params["digest"] = now["digest"]  # Proxmox refuses it if the object changes before it arrives
    return [(method, receipt["object"], params)]


def restore_params(before: dict, after: dict, accepted: dict) -> dict[str, Any]:
    """The parameters that set every changed option back: its old value, or its deletion; never an
    unusedN entry (Proxmox drops it when its volume is attached again: docs/PROXMOX-BEHAVIOUR.md#pending-config)."""
    keys = [k for k in sorted(set(before) | set(after)) if not config_diff.same(before.get(k), after.get(k))
            and not config_diff.BOOKKEEPING.fullmatch(k) and k not in CONTROL and catalog.spec_for(accepted, k)]
    secret = [k for k in keys if secret_param(k) or MASK in str(before.get(k, ""))]
    if secret:
        raise InvalidArgument(f"{', '.join(secret)} changed, and receipts never keep a secret's old value: set it "
                              f"again yourself. Nothing was sent.")
    params = {k: sendable(accepted, k, before[k]) for k in keys if k in before}
    gone = [k for k in keys if k not in before and not UNUSED.fullmatch(k)]
    if gone and "delete" in accepted:
        params["delete"] = gone if accepted["delete"].get("type") == "array" else ",".join(gone)
    for key in gone if "delete" not in accepted else ():
        params[key] = 0 if (catalog.spec_for(accepted, key) or {}).get("type") == "boolean" else ""
    if not params:
        raise InvalidArgument("Nothing to take back: the change left every option as it was.")
    return params


def sendable(accepted: dict, key: str, value: Any) -> Any:
    """A value as the write takes it: an object GET answered for a property string (a backup job's
    `prune-backups`: docs/PROXMOX-BEHAVIOUR.md#backup-jobs-after-an-edit) written as one."""
    if isinstance(value, dict) and (catalog.spec_for(accepted, key) or {}).get("type") == "string":
        return property_string(value)
    return value


def _undo_value(receipt: dict, client: Any) -> list:
    _unchanged_since(receipt, receipt["after"], _current(receipt, client))
    name = receipt["object"].rsplit("/", 1)[1]  # notes or protected
    before = receipt["before"]
    if MASK in str(before):
        raise InvalidArgument(f"The old {name} held something secret-looking, which receipts never keep. "
                              f"Nothing was sent.")
    value = int(bool(before)) if name == "protected" else (before or "")
    return [("PUT", receipt["object"], dict(receipt.get("selectors") or {}) | {name: value})]


def _undo_created(receipt: dict, client: Any) -> list:
    item = receipt["item"]
    try:
        now = _current(receipt, client, item)
    except ToolFailure:
        raise ProxmoxError(f"{item} no longer exists: nothing to take back.") from None
    _unchanged_since(receipt, receipt["after"], now)
    template = receipt["template"] + "/" + _item_template_tail(receipt)
    accepted = (catalog.entry_for(receipt["product"], "DELETE", template) or {}).get("params", {})
    return [("DELETE", item, {"digest": now["digest"]} if "digest" in accepted and now.get("digest") else {})]


def _item_template_tail(receipt: dict) -> str:
    items = catalog.item_templates(receipt["product"], receipt["template"])
    return items[0].rsplit("/", 1)[1] if items else "{id}"


def _undo_deleted(receipt: dict, client: Any) -> list:
    """The item made again from what it was (a firewall rule is put first, then moved back where it
    was)."""
    collection, item = receipt["object"].rsplit("/", 1)
    id_name = re.search(r"\{([\w-]+)\}$", receipt["template"]).group(1)
    if id_name != "pos":
        try:
            client.get(receipt["object"])
        except ToolFailure:
            pass
        else:
            raise ProxmoxError(f"{receipt['object']} exists again since receipt {receipt['id']}; nothing was sent.")
    accepted = (catalog.entry_for(receipt["product"], "POST", receipt["template"].rsplit("/", 1)[0]) or {}).get(
        "params", {})
    before = receipt["before"] if isinstance(receipt["before"], dict) else {}
    params = {k: sendable(accepted, k, v) for k, v in before.items() if catalog.spec_for(accepted, k)
              and k not in CONTROL | {"pos"}
              and not config_diff.BOOKKEEPING.fullmatch(k)}
    if any(MASK in str(v) for v in params.values()):
        raise InvalidArgument("It held something secret-looking, which receipts never keep. Nothing was sent.")
    steps: list = [("POST", collection, params | ({} if id_name == "pos" else {id_name: item}))]
    if id_name == "pos" and item != "0":  # before the rule now at pos+1 (docs/PROXMOX-BEHAVIOUR.md#firewall-rules)
        steps.append(("PUT", f"{collection}/0", {"moveto": int(item) + 1}))
    return steps


def _snapshots(client: Any, base: str) -> list[str]:
    return [s["name"] for s in client.get(f"{base}/snapshot") or [] if s.get("name") != "current"]


def _undo_snapshot(receipt: dict, client: Any) -> list:
    name = receipt["snapshot"]
    if name not in _snapshots(client, receipt["object"].rsplit("/", 1)[0]):
        raise ProxmoxError(f"Snapshot {name} no longer exists (or was never made): nothing to take back.")
    return [("DELETE", f"{receipt['object']}/{name}", {})]


def _undo_power(receipt: dict, client: Any) -> list:
    state = _state(client.get(receipt["object"]) or {})
    base = receipt["object"].rsplit("/status", 1)[0]
    if state != receipt["after"]:
        raise ProxmoxError(f"Guest {base.rsplit('/', 1)[1]} is {state} now, not {receipt['after']} as the change "
                           f"left it: nothing was sent.")
    action = receipt["path"].rsplit("/", 1)[1]
    return [("POST", f"{base}/status/{INVERSE_POWER[action]}", {})]


def _undo_rollback(receipt: dict, client: Any) -> list:
    name = receipt["safety_snapshot"]
    base = receipt["object"].rsplit("/status", 1)[0]
    if name not in _snapshots(client, base):
        raise ProxmoxError(f"The safety snapshot {name} no longer exists, so the state before the rollback is gone.")
    return [("POST", f"{base}/snapshot/{name}/rollback", {"start": 1} if receipt["before"] == "running" else {})]


PLANNERS = {"settings": _undo_settings, "value": _undo_value, "created": _undo_created, "deleted": _undo_deleted,
            "snapshot": _undo_snapshot, "power": _undo_power, "rollback": _undo_rollback}
