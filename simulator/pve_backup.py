"""Proxmox VE backups: which volumes a storage listing shows to a caller (pve-storage's
check_volume_access), and vzdump: file names in local time, the compression, the notes
template, pruning by `remove` and the storage's retention, and PBS storages that write PBS
snapshots instead of files (docs/PROXMOX-BEHAVIOUR.md#backup-jobs-and-vzdump-prune).
"""
from __future__ import annotations

import re
import time
from typing import Callable

from .call import ApiError, Call, _node
from .lab import GiB, backup_config


# ---- what a storage listing shows (docs/PROXMOX-BEHAVIOUR.md#who-sees-which-volume)

def visible_volume(call: Call, storage: str, volume: dict) -> bool:
    """pve-storage src/PVE/Storage.pm check_volume_access, as the content index calls it (no vmid):
    Datastore.Allocate sees everything; ISOs, templates and imports need Datastore.Audit or
    AllocateSpace; a backup needs AllocateSpace on the storage and VM.Backup on its guest; a disk
    needs Datastore.Audit and VM.Config.Disk on its guest; anything else is hidden."""
    where = f"/storage/{storage}"
    if call.can(where, "Datastore.Allocate"):
        return True
    content, owner = volume.get("content"), volume.get("vmid")
    if content in ("iso", "vztmpl", "import"):
        return call.can(where, "Datastore.AllocateSpace") or call.can(where, "Datastore.Audit")
    if content == "backup" and owner:
        return call.can(where, "Datastore.AllocateSpace") and call.can(f"/vms/{owner}", "VM.Backup")
    if content in ("images", "rootdir") and owner:
        return call.can(where, "Datastore.Audit") and call.can(f"/vms/{owner}", "VM.Config.Disk")
    return False


# ---- retention (pve-storage src/PVE/Storage.pm prune_mark_backup_group)

# Each keep option with the local-time period it counts in (keep-last: every backup its own).
PERIODS = (("keep-last", None), ("keep-hourly", "%Y/%m/%d/%H"), ("keep-daily", "%Y/%m/%d"),
           ("keep-weekly", "%G/%V"), ("keep-monthly", "%Y/%m"), ("keep-yearly", "%Y"))


def retention(text: str | None) -> dict[str, int]:
    """A `prune-backups` property string as numbers; none given means keep-all."""
    options = dict(part.split("=", 1) for part in str(text or "keep-all=1").split(",") if "=" in part)
    return {key: int(value) for key, value in options.items()}


def pruned(backups: list[dict], keep: dict[str, int]) -> list[dict]:
    """The backups of one guest that a prune removes: newest first, each keep option keeps the newest
    backup of each of its next N periods (local time) not yet covered; protected backups stay; with
    keep-all or no positive option nothing goes."""
    if keep.get("keep-all") or not any(keep.get(name, 0) > 0 for name, _ in PERIODS):
        return []
    ordered = sorted(backups, key=lambda b: -b["ctime"])
    mark = {id(b): "protected" for b in ordered if b.get("protected")}
    for name, period in PERIODS:
        count = keep.get(name, 0)
        if count <= 0:
            continue

        def period_of(backup: dict, period: str | None = period) -> str:
            return str(backup["ctime"]) if period is None else time.strftime(period, time.localtime(backup["ctime"]))
        covered = {period_of(b) for b in ordered if mark.get(id(b)) == "keep"}
        included: set[str] = set()
        for backup in ordered:
            if id(backup) in mark or period_of(backup) in covered:
                continue
            if period_of(backup) not in included:
                if len(included) >= count:
                    break
                included.add(period_of(backup))
                mark[id(backup)] = "keep"
            else:
                mark[id(backup)] = "remove"
    return [b for b in ordered if mark.get(id(b), "remove") == "remove"]


# ---- vzdump

def notes_problem(template: str) -> str | None:
    """pve-manager PVE/VZDump.pm $verify_notes_template: no line feed, only the escapes \\n and \\\\,
    only the variables cluster, guestname, node and vmid."""
    if "\n" in template:
        return "contains a line feed"
    problems = [f"escape sequence '\\{m.group(1)}' at char {m.start()}" for m in re.finditer(r"\\(.)", template)
                if m.group(1) not in "n\\"]
    problems += [f"variable '{m.group(1)}' at char {m.start(1)}" for m in re.finditer(r"\{\{([^\s{}]+)\}\}", template)
                 if m.group(1) not in ("cluster", "guestname", "node", "vmid")]
    return "found unknown: " + ", ".join(problems) if problems else None


def notes_text(call: Call, template: str, guest: dict) -> str:
    """The notes a template gives (pve-manager PVE/VZDump.pm $generate_notes)."""
    values = {"cluster": call.lab.cluster_name if len(call.lab.nodes) > 1 else "standalone node",
              "guestname": guest["name"], "node": guest["node"], "vmid": str(guest["vmid"])}
    text = re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), template)
    return re.sub(r"\{\{(cluster|guestname|node|vmid)\}\}", lambda m: values[m.group(1)], text)


# the archive's extension by `compress` (pve-manager PVE/VZDump.pm compressor_info); PBS ignores it
COMPRESSED = {"0": "", "1": ".lzo", "lzo": ".lzo", "gzip": ".gz", "zstd": ".zst"}


class Target:
    """Where a vzdump writes one guest's backup: files on a PVE storage or snapshots on PBS."""

    def __init__(self, call: Call, storage: str, guest: dict):
        self.call, self.storage, self.guest = call, storage, guest
        self.entry = call.lab.storages[storage]
        self.config = self.entry.get("config", {})
        self.kind = "qemu" if guest["type"] == "qemu" else "lxc"
        self.kept = backup_config(guest["config"])  # the config as the backup starts (#configs-inside-backups)

    @property
    def on_pbs(self) -> bool:
        return self.entry["type"] == "pbs"

    def group(self) -> list[dict]:
        """The guest's backups there, each with `ctime` and `protected`."""
        if self.on_pbs:
            return self._pbs_group()
        prefix = f"{self.storage}:backup/vzdump-{self.kind}-{self.guest['vmid']}-"
        return [v for v in self.call.lab.volumes.get(self.storage, [])
                if v["volid"].startswith(prefix) and v.get("_node", self.guest["node"]) == self.guest["node"]]

    def _pbs_group(self) -> list[dict]:
        ds = self.call.lab.datastores[self.config["datastore"]]
        key = (self.config.get("namespace", ""), "vm" if self.kind == "qemu" else "ct", str(self.guest["vmid"]))
        snaps = ds["groups"].setdefault(key, [])
        for snap in snaps:  # the names vzdump's prune reads
            snap["ctime"] = snap["backup-time"]
        return snaps

    def write(self, when: int, notes: str | None, protected: bool) -> str:
        if self.on_pbs:
            snap = self.call.lab.pbs_snapshot(when, protected=protected, state="", comment=notes or "",
                                              config=self.kept)
            snap["ctime"] = when
            self._pbs_group().append(snap)
            return f"{self.storage}:backup/{'vm' if self.kind == 'qemu' else 'ct'}/{self.guest['vmid']}/" + \
                time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))
        # file names carry the node's local time (pve-manager PVE/VZDump.pm: strftime ... localtime)
        stamp = time.strftime("%Y_%m_%d-%H_%M_%S", time.localtime(when))
        ext = ("vma" if self.kind == "qemu" else "tar") + COMPRESSED[str(self.call.arg("compress", "0"))]
        volid = f"{self.storage}:backup/vzdump-{self.kind}-{self.guest['vmid']}-{stamp}.{ext}"
        self.call.lab.add_volume(self.storage, volid, "backup", 2 * GiB, vmid=self.guest["vmid"], ctime=when,
                                 node=self.guest["node"])
        volume = self.call.lab.volumes[self.storage][-1]
        volume["_config"] = self.kept
        if notes:
            volume["notes"] = notes
        if protected:
            volume["protected"] = 1
        return volid

    def remove(self, gone: list[dict]) -> None:
        if self.on_pbs:
            group = self._pbs_group()
            group[:] = [s for s in group if not any(s is g for g in gone)]
        else:
            volumes = self.call.lab.volumes[self.storage]
            volumes[:] = [v for v in volumes if not any(v is g for g in gone)]


def _limit_error(target: Target, keep: dict[str, int], remove: bool) -> str | None:
    """With `remove=0` a retention is a limit: a guest that has that many backups is refused
    (pve-manager PVE/VZDump.pm exec_backup_task, "max backup limit")."""
    limit = 0 if keep.get("keep-all") else sum(v for k, v in keep.items() if k != "keep-all")
    count = sum(1 for b in target.group() if not b.get("protected"))
    if limit and not remove and count >= limit:
        return (f"There is a max backup limit of {limit} enforced by the target storage or the vzdump "
                f"parameters. Either increase the limit or delete old backups.")
    return None


def pve_vzdump(call: Call, node: str) -> str:
    """POST /nodes/{node}/vzdump: the guests the selection names that are on this node, each backed up
    in turn in one task (pve-manager PVE/API2/VZDump.pm `vzdump`, PVE/VZDump.pm `get_included_guests`)."""
    _node(call, node)
    template = call.arg("notes-template")
    problem = notes_problem(str(template)) if template else None
    if problem:  # checked before the worker starts (PVE/VZDump.pm verify_vzdump_parameters)
        raise ApiError(400, "Parameter verification failed.", {"notes-template": problem})
    guests = [g for g in included_guests(call) if g["node"] == node]
    if not guests:
        return call.lab.start_task(node, "vzdump", "", user=call.token_id, exitstatus="job errors",
                                   lines=[f"ERROR: guest {call.arg('vmid')} is not on node {node}"])
    item = str(guests[0]["vmid"]) if len(guests) == 1 else ""
    storage = call.arg("storage", "local")
    entry = call.lab.storages.get(storage)
    if entry is None or node not in call.lab.storage_nodes(entry):  # PVE/VZDump.pm new: storage_info
        return call.lab.start_task(node, "vzdump", item, user=call.token_id, exitstatus="job errors",
                                   lines=[f"ERROR: could not get storage information for '{storage}': "
                                          f"storage '{storage}' does not exist"])
    lines = [f"INFO: starting new backup job: vzdump {' '.join(str(g['vmid']) for g in guests)} --storage {storage} "
             f"--mode {call.arg('mode', 'snapshot')}"]
    done = [_back_up(call, Target(call, storage, guest), template, lines) for guest in guests]
    effects = [effect for effect in done if effect is not None]

    def apply() -> None:
        for effect in effects:
            effect()
    if len(effects) < len(done):  # a guest failed: the task ends in job errors, the others were backed up
        call.lab.schedule(call.lab.task_seconds, apply)
        return call.lab.start_task(node, "vzdump", item, user=call.token_id, exitstatus="job errors", lines=lines)
    return call.lab.start_task(node, "vzdump", item, user=call.token_id, lines=lines, on_done=apply,
                               lock=(guests[0], "backup") if len(guests) == 1 else None)


def included_guests(call: Call) -> list[dict]:
    """The guests a backup selects: a pool's members (its `exclude` ignored), else the listed vmids,
    else every guest but the excluded (PVE/VZDump.pm `get_included_guests`); `node` narrows them."""
    lab = call.lab
    if call.arg("pool"):
        chosen = [g for _, g in sorted(lab.guests.items()) if g.get("pool") == call.arg("pool")]
    elif call.arg("vmid"):
        chosen = [lab.guests[v] for v in _vmids(call.arg("vmid")) if v in lab.guests]
    elif str(call.arg("all", "0")) == "1" or call.arg("exclude") is not None:
        excluded = set(_vmids(call.arg("exclude")))
        chosen = [g for v, g in sorted(lab.guests.items()) if v not in excluded]
    else:
        chosen = []
    return [g for g in chosen if call.arg("node") in (None, g["node"])]


def _vmids(value: object) -> list[int]:
    return [int(v) for v in re.split(r"[,;\s]+", str(value or "")) if v]


def _back_up(call: Call, target: Target, template: object, lines: list[str]) -> Callable[[], None] | None:
    """One guest's backup: its log lines, and what it leaves when the task ends (None: it failed)."""
    guest, vmid = target.guest, target.guest["vmid"]
    # the job's retention, else the storage's own; keep-all turns `remove` off (PVE/VZDump.pm new)
    keep = retention(call.arg("prune-backups") or target.config.get("prune-backups"))
    remove = str(call.arg("remove", "1")) == "1" and not keep.get("keep-all")
    lines.append(f"INFO: Starting Backup of VM {vmid} ({target.kind})")
    label = "VM" if guest["type"] == "qemu" else "CT"
    refused = _limit_error(target, keep, remove) or (f"{label} is locked ({guest['lock']})" if guest["lock"] else None)
    if refused:
        lines.append(f"ERROR: Backup of VM {vmid} failed - {refused}")
        return None
    now = int(time.time())
    going = pruned(target.group() + [{"ctime": now, "new": True}], keep) if remove else []
    lines += [f"INFO: {p}% ({p * 20 // 100} GiB of 20 GiB) in {p // 10}s" for p in (10, 35, 60, 85, 100)]
    lines += [f"INFO: Finished Backup of VM {vmid}"]
    if remove:
        lines += ["INFO: prune older backups with retention: " + ",".join(f"{k}={v}" for k, v in sorted(keep.items())),
                  f"INFO: pruned {len(going)} backup(s)" + (" not covered by keep-retention policy" if going else "")]

    def apply() -> None:
        notes = notes_text(call, str(template), guest) if template else None
        target.write(now, notes, str(call.arg("protected", "0")) == "1")
        target.remove([b for b in going if not b.get("new")])
    return apply
