"""Protected guests: the list no agent may touch, and every guest a request reaches.

The list is `protected-vms.json`: a bare list of `{"host", "vmid", "name", "reason"}` objects,
or proxmox-ve-mcp's `{"protected_vms": [...]}` with the same entries (and, beside them, a `comment`
saying what to put there: the file the repository ships). Host labels are compared as the
configuration spells them (lower case, no spaces); `"*"` or no host means every host. An unreadable
list fails closed: every request that changes a guest is refused.

Guests are also protected as Proxmox marks them (`marked_guests`): a tag of PROXMOX_PROTECTED_TAGS,
read from /cluster/resources once per call, and PVE's own `protection` flag, read from the guest's
config, for requests that destroy (docs/PROXMOX-BEHAVIOUR.md#the-protection-flag).

`named_guests` finds a guest wherever a request names it (path, vmid parameters and lists,
disk and backup volume ids, HA resource ids and lists, replication ids, PBS backup groups);
`bulk_scope` says when a request acts on guests it does not list. The policy refuses both
for protected guests (policy.check_protected); what a backup job, HA rule or group edit does to
them is job_edits.py.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import catalog
import runtime
from calls import Call
from errors import PolicyError, ToolFailure

LIST_KEY = "protected_vms"  # proxmox-ve-mcp's form: {"protected_vms": [...]}
COMMENT_KEY = "comment"  # beside LIST_KEY: what the file is for (the repository's copy says what to put there)


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
    tags: tuple[str, ...] = ()  # PROXMOX_PROTECTED_TAGS, lower case: a guest carrying one is protected
    source: str = ""  # where the list was read from, for --check and server_info

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
    """The entries of either form of the file, labels normalised; ValueError when it is neither (a key
    beside the list that is not the comment, such as a misspelt `protected_vm`, fails closed too)."""
    if isinstance(data, dict) and LIST_KEY in data and set(data) <= {LIST_KEY, COMMENT_KEY}:
        data = data[LIST_KEY]
    if not isinstance(data, list):
        raise ValueError(f'expected a list of {{"host", "vmid", "name", "reason"}} objects, '
                         f'or {{"{LIST_KEY}": [...]}} (with an optional "{COMMENT_KEY}")')
    return [_entry(raw) for raw in data]


def load_protected(path: Path) -> Protected:
    """The list in `path`; a file that is missing or cannot be parsed is an error (fail closed)."""
    try:
        return Protected(entries=parse_protected(json.loads(path.read_text())), source=str(path))
    except FileNotFoundError:
        return Protected(error=f"{path} does not exist", source=str(path))
    except (OSError, ValueError, TypeError) as exc:
        return Protected(error=f"{path}: {exc}", source=str(path))


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


# ================================================================ node paths that name a guest

# A node's files that are a guest's, as named_guests finds a guest in an API path (docs/SECURITY.md#node-files;
# docs/PROXMOX-BEHAVIOUR.md#guest-files-on-the-node): (regex searched in the normalised path, kind). A
# guest's config names it; its data (a disk, a container's root, its backups) is the guest's files.
NODE_PATHS: list[tuple[re.Pattern, str]] = [
    (re.compile(r"^/etc/pve/(?:local/|nodes/[^/]+/)?(?:qemu-server|lxc|openvz)/(\d+)\.conf$"), "config"),
    (re.compile(r"^/etc/pve/(?:local/|nodes/[^/]+/)?firewall/(\d+)\.fw$"), "config"),
    (re.compile(r"(?:^|/)images/(\d+)(?:/|$)"), "data"),  # a directory storage's disks: images/<vmid>/
    (re.compile(r"(?:^|/)(?:vm|base|subvol|basevol)-(\d+)-(?:disk|cloudinit|state)"), "data"),  # volumes, ZFS subvols
    (re.compile(r"(?:^|/)var/lib/lxc/(\d+)(?:/|$)"), "data"),  # a container's root as LXC mounts it
    (re.compile(r"(?:^|/)(?:vm|ct)/(\d+)(?:/|$)"), "data"),  # a PBS datastore's backup group
    (re.compile(r"vzdump-(?:qemu|lxc|openvz)-(\d+)-"), "data"),  # a vzdump archive
]


def node_path_guests(path: str) -> dict[int, str]:
    """The guests a node path is a part of: vmid -> "config" or "data" (data wins)."""
    found: dict[int, str] = {}
    for pattern, kind in NODE_PATHS:
        for vmid in pattern.findall(path):
            found[int(vmid)] = "data" if kind == "data" else found.get(int(vmid), kind)
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


# ================================================================ guests Proxmox itself marks as protected

TAG_SEPARATORS = re.compile(r"[;,\s]+")  # a tag list splits on all three (docs/PROXMOX-BEHAVIOUR.md#tags)
# How the policy reads what Proxmox says of a guest: a function from a PVE host label to its client
# (anything with `get(path, **params)`; the reads pass the admission step as reads). server.py sets it.
_client_for = runtime.slot("protection.client_for", lambda: None)


def read_guests_with(client_for: Any) -> None:
    _client_for.set(client_for)


def tags_of(row: dict) -> set[str]:
    """A /cluster/resources row's tags, in lower case (as a default cluster writes and compares them)."""
    return {tag.lower() for tag in TAG_SEPARATORS.split(str(row.get("tags") or "")) if tag}


def parse_tags(value: str) -> tuple[str, ...]:
    """PROXMOX_PROTECTED_TAGS: a comma list of PVE tags (`[a-z0-9_][a-z0-9_+.-]*`, any case); ValueError
    naming the first that is not one."""
    tags = [tag.strip().lower() for tag in value.split(",") if tag.strip()]
    bad = [tag for tag in tags if not re.fullmatch(r"[a-z0-9_][a-z0-9_+.\-]*", tag)]
    if bad:
        raise ValueError(f"{bad[0]!r} is not a Proxmox tag (letters, digits, _ + . -; e.g. mcp-protected)")
    return tuple(dict.fromkeys(tags))


def _guest_rows(label: str, call: Call, why: str) -> dict[int, dict]:
    """The host's guests from /cluster/resources, read at most once per tool call (kept in `call`, the
    running calls.Call, across the call's writes) and shared with the tool's own lookups: the
    client's kept "guests" (inventory.guest_resources) when this call read them already, else read now
    and kept there for them."""
    kept = call.protection_rows
    if label not in kept:
        def read() -> list[dict]:
            guests = client.read("/cluster/resources", type="vm") or []
            for guest in guests:
                guest["vmid"] = int(guest["vmid"])  # as inventory keeps them (PVE < 8.2 sends an LXC's as a string)
            return guests
        try:
            client = _client_for.get()(label)
            age = time.monotonic() - (call.started or time.monotonic())  # reuse only a read of this call
            rows = client.cached("guests", read, age, until_write=True) if hasattr(client, "cached") else read()
        except ToolFailure as exc:  # what decides cannot be read: fail closed
            raise PolicyError(f"The guests' {why} could not be read from /cluster/resources on host '{label}' "
                              f"({exc}), so this request is refused. The read token needs VM.Audit on the guests "
                              f"(PVEAuditor on /).") from None
        kept[label] = {int(row["vmid"]): row for row in rows if str(row.get("vmid", "")).isdigit()}
    return kept[label]


def _protection_flag(label: str, row: dict, call: Call) -> bool:
    """Whether PVE's own `protection` flag is set in the guest's config, read once per guest and call."""
    kept = call.protection_flags
    key = (label, int(row["vmid"]))
    if key not in kept:
        path = f"/nodes/{row['node']}/{row.get('type', 'qemu')}/{row['vmid']}/config"
        try:
            config = _client_for.get()(label).read(path) or {}
        except ToolFailure as exc:  # what decides cannot be read: fail closed
            raise PolicyError(f"Guest {row['vmid']}'s Proxmox protection flag could not be read ({exc}), so this "
                              f"request, which destroys, is refused. The read token needs VM.Audit on the guest "
                              f"(PVEAuditor on /).") from None
        kept[key] = truthy(config.get("protection", 0))
    return kept[key]


def marked_guests(host: Any, guests: list[int], destructive: bool, protected: Protected, call: Call) -> dict[int, str]:
    """The guests of a PVE request that Proxmox marks as protected, with why: a tag of
    PROXMOX_PROTECTED_TAGS (any request that changes them), or PVE's own `protection` flag (a request
    that destroys: Proxmox itself refuses only removing the guest or its disks and restoring over it).
    A guest /cluster/resources does not list (one the request creates) carries no mark. What decides
    and cannot be read refuses the request (PolicyError)."""
    if host.product != "pve" or not guests or not (protected.tags or destructive) or _client_for.get() is None:
        return {}
    rows = _guest_rows(host.label, call, "tags (PROXMOX_PROTECTED_TAGS)" if protected.tags else
                       "nodes (to read their protection flag)")
    marks = {}
    for vmid in (v for v in guests if v in rows):
        tagged = sorted(tags_of(rows[vmid]) & set(protected.tags))
        if tagged:
            marks[vmid] = f"it carries the tag '{tagged[0]}' (PROXMOX_PROTECTED_TAGS)"
        elif destructive and _protection_flag(host.label, rows[vmid], call):
            marks[vmid] = "its Proxmox protection flag is set (protection=1 in its options)"
    return marks


def tagged_guests(host: Any, protected: Protected, call: Call) -> list[int]:
    """Every guest of a PVE host that carries a protected tag (for what reaches guests without naming
    them: bulk actions, backup jobs, firewall groups)."""
    if host.product != "pve" or not protected.tags or _client_for.get() is None:
        return []
    rows = _guest_rows(host.label, call, "tags (PROXMOX_PROTECTED_TAGS)")
    return sorted(vmid for vmid, row in rows.items() if tags_of(row) & set(protected.tags))


def entry_mismatches(protected: Protected, guests: dict[str, dict[int, dict]]) -> list[str]:
    """--check: list entries that protect nothing as meant: a vmid no configured PVE host has, or a name
    that is not the guest's (`guests`: label -> vmid -> /cluster/resources row, as the read token sees
    them; a host whose token sees no guest is not judged). Entries naming no configured host are
    Protected.problems."""
    seen = {label: rows for label, rows in guests.items() if rows}
    found = []
    for entry in protected.entries:
        labels = list(seen) if entry.get("host") in (None, "*") else [entry["host"]] if entry["host"] in seen else []
        if not labels:
            continue
        rows = [(label, seen[label][entry["vmid"]]) for label in labels if entry["vmid"] in seen[label]]
        where = f"host '{labels[0]}'" if len(labels) == 1 else f"any of the hosts {', '.join(labels)}"
        listed = f" ({entry['name']})" if entry.get("name") else ""
        if not rows:
            found.append(f"protected guest {entry['vmid']}{listed} does not exist on {where}; a guest made later "
                         f"with that vmid would be protected instead: fix or remove the entry")
        elif entry.get("name") and all(str(row.get("name", "")).lower() != str(entry["name"]).lower()
                                       for _, row in rows):
            actual = ", ".join(f"'{row.get('name', '')}' on host '{label}'" for label, row in rows)
            found.append(f"protected guest {entry['vmid']} is named {actual}, the list says '{entry['name']}': "
                         f"check that the entry protects the guest you mean")
    return found
