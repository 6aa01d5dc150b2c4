"""Protected guests: the list no agent may touch, and every guest a request reaches.

The list is `protected-vms.json`: a bare list of `{"host", "vmid", "name", "reason"}` objects,
or proxmox-ve-mcp's `{"protected_vms": [...]}` with the same entries. Host labels are compared
as the configuration spells them (lower case, no spaces); `"*"` or no host means every host.
An unreadable list fails closed: every request that changes a guest is refused.

`named_guests` finds a guest wherever a request names it (path, vmid parameters and lists,
disk and backup volume ids, HA resource ids and lists, replication ids, PBS backup groups);
`bulk_scope` says when a request acts on guests it does not list. The policy refuses both
for protected guests (policy.check_protected); what a backup job, HA rule or group edit does to
them is job_edits.py.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import catalog

LIST_KEY = "protected_vms"  # proxmox-ve-mcp's form: {"protected_vms": [...]}


def normalise_label(label: Any) -> str | None:
    """A host label as the configuration spells it: `"DEMO "` is `demo`; None or "*" is every host."""
    if label is None:
        return None
    text = str(label).strip().lower()
    return text or None


@dataclass
class Protected:
    entries: list[dict] = field(default_factory=list)
    error: str | None = None  # set when the file could not be read: fail closed

    def find(self, host_label: str, vmid: int, product: str) -> dict | None:
        for entry in self.entries:
            # a PBS backup group carries no PVE host label: any entry with that vmid protects it
            if (product == "pbs" or _covers(entry, host_label)) and int(entry["vmid"]) == vmid:
                return entry
        return None

    def for_host(self, host_label: str, product: str) -> list[dict]:
        return [e for e in self.entries if product == "pbs" or _covers(e, host_label)]

    def unknown_hosts(self, labels: set[str]) -> list[dict]:
        """Entries whose host is no configured label: they protect nothing."""
        return [e for e in self.entries if e.get("host") not in (None, "*") and e["host"] not in labels]

    def problems(self, labels: set[str]) -> list[str]:
        """What makes the list not do what it says: unreadable, or entries naming no configured host."""
        if self.error:
            return [f"the protected-guest list could not be read ({self.error}); every request that changes a "
                    f"guest is refused until it is fixed"]
        return [f"protected guest {e['vmid']} names host '{e['host']}', which is not configured "
                f"(configured: {', '.join(sorted(labels)) or 'none'}); it protects nothing"
                for e in self.unknown_hosts(labels)]


def _covers(entry: dict, host_label: str) -> bool:
    return entry.get("host") in (None, "*", host_label)


def _entry(raw: Any) -> dict:
    if not isinstance(raw, dict) or "vmid" not in raw:
        raise ValueError('expected {"host", "vmid", "name", "reason"} objects')
    vmid = int(raw["vmid"])
    if not 100 <= vmid <= 999999999:
        raise ValueError(f"vmid {raw['vmid']!r} is not a guest id (100 to 999999999)")
    return {**raw, "host": normalise_label(raw.get("host")), "vmid": vmid}


def parse_protected(data: Any) -> list[dict]:
    """The entries of either form of the file, labels normalised; ValueError when it is neither."""
    if isinstance(data, dict) and set(data) == {LIST_KEY}:
        data = data[LIST_KEY]
    if not isinstance(data, list):
        raise ValueError(f'expected a list of {{"host", "vmid", "name", "reason"}} objects, '
                         f'or {{"{LIST_KEY}": [...]}}')
    return [_entry(raw) for raw in data]


def load_protected(path: Path) -> Protected:
    try:
        return Protected(entries=parse_protected(json.loads(path.read_text())))
    except (OSError, ValueError, TypeError) as exc:
        return Protected(error=f"{path}: {exc}")


# ================================================================ guests a request names

VOLUME_OWNER = re.compile(r"(?:^|[:/,=])(?:vm|base|subvol|basevol)-(\d+)-")  # local-lvm:vm-101-disk-0
BACKUP_FILE = re.compile(r"vzdump-(?:qemu|lxc|openvz)-(\d+)-")  # nfs:backup/vzdump-qemu-101-....vma.zst
# PBS-backed volumes and PBS group or snapshot names: pbs:backup/vm/101/2026-..., vm/101
# (docs/PROXMOX-BEHAVIOUR.md#pbs-backed-volumes)
BACKUP_GROUP = re.compile(r"(?:^|[:/=])(?:vm|ct)/(\d+)(?=/|$|,)")
HA_SID = re.compile(r"(?<![\w-])(?:vm|ct):(\d+)(?![\w-])")  # vm:101, and each of "vm:100,vm:101"
REPLICATION_ID = re.compile(r"^(\d+)-\d+$")
VMID_PARAMS = ("vmid", "newid", "target-vmid", "vms", "vmids", "guest", "sid", "sids")
VMID_FORMATS = ("pve-vmid", "pve-vmid-list", "pve-ha-resource-or-vm-id")
EXCLUDING = ("exclude",)  # a vmid list of guests a backup leaves out: named, but not reached
# Parameters that only name what a request reads: restoring a protected guest's backup to a NEW
# vmid leaves the guest alone (a restore over it is still caught by `vmid`).
SOURCE_PARAMS = {r"/nodes/\{node\}/(qemu|lxc)": ("archive", "ostemplate")}


def numbers(value: Any) -> list[int]:
    """Every number in a value or list of values, leading zeros dropped (0101 is guest 101)."""
    values = value if isinstance(value, list) else [value]
    return [int(n) for v in values for n in re.findall(r"\d+", str(v))]


def _texts(values: dict[str, Any]) -> list[str]:
    return [str(v) for value in values.values() for v in (value if isinstance(value, list) else [value])]


def _vmid_params(entry: dict | None, values: dict[str, Any]) -> list[str]:
    """Parameters that hold vmids: by name, or by their format in the schema."""
    spec = (entry or {}).get("params", {})
    return [name for name in values if name not in EXCLUDING and (
        name in VMID_PARAMS or (catalog.spec_for(spec, name) or {}).get("format") in VMID_FORMATS)]


def named_guests(product: str, template: str, path_params: dict[str, str], params: dict[str, Any],
                 entry: dict | None = None) -> set[int]:
    """Every vmid a request names, wherever it hides."""
    for pattern, names in SOURCE_PARAMS.items():
        if re.fullmatch(pattern, template):
            params = {k: v for k, v in params.items() if k not in names}
    everything = {**params, **path_params}  # the path wins, as in Proxmox (a conflict is refused anyway)
    found = {n for name in _vmid_params(entry, everything) for n in numbers(everything[name])}
    for text in _texts(everything):
        for pattern in (VOLUME_OWNER, BACKUP_FILE, BACKUP_GROUP, HA_SID):
            found.update(int(n) for n in pattern.findall(text))
    if "replication" in template:
        match = REPLICATION_ID.match(str(everything.get("id", "")))
        if match:
            found.add(int(match.group(1)))
    backup_id = str(everything.get("backup-id", ""))
    if product == "pbs" and everything.get("backup-type") in ("vm", "ct") and backup_id.isdigit():
        found.add(int(backup_id))
    return found


# ================================================================ requests that act on guests they do not list

# (template, the parameter that lists the guests (None: none does), when it applies: "always", or
# "deletes" when the call deletes data (a prune, a remove-vanished, destroy-data...).
BULK: list[tuple[str, str | None, str]] = [
    (r"/nodes/\{node\}/(startall|stopall|suspendall|migrateall)", "vms", "always"),
    (r"/cluster/bulk-action/guest/.*", "vms", "always"),
    (r"/nodes/\{node\}/storage/\{storage\}/prunebackups", "vmid", "always"),
    (r"/admin/datastore/\{store\}/prune-datastore", None, "always"),
    # a storage's own retention prunes every guest's backups on it
    # (docs/PROXMOX-BEHAVIOUR.md#backup-jobs-and-vzdump-prune)
    (r"/storage(/\{storage\})?", None, "deletes"),
    # PBS: what deletes backups without naming one group acts on every group of its datastore or namespace
    (r"/admin/datastore/\{store\}(/.*)?|/config/datastore(/\{name\})?|/pull|/push"
     r"|/(config|admin)/(sync|prune)(/\{id\}(/run)?)?", "backup-id", "deletes"),
]


def truthy(value: Any) -> bool:
    """A boolean's true spellings, in any case (PBS: proxmox-schema `parse_boolean`; PVE property strings)."""
    return str(value).strip().lower() in ("1", "true", "yes", "on")


@dataclass
class Scope:
    """The guests a request reaches without listing them: why (None: it lists them all)."""
    bulk: str | None = None


def bulk_scope(template: str, params: dict[str, Any], deletes: bool) -> Scope:
    """Why a request acts on guests without listing them (bulk actions, prunes of a whole
    datastore, storage retention), as a Scope."""
    scope = Scope()
    for pattern, list_param, when in BULK:
        if not re.fullmatch(pattern, template) or (when == "deletes" and not deletes):
            continue
        if list_param is None or list_param not in params:
            scope.bulk = "deletes backups of every guest in its scope" if when == "deletes" else \
                "acts on every guest without an explicit list"
    return scope
