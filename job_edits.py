"""Jobs, rules and groups judged as they will be after the request.

A stored object that acts later by itself (a PVE backup job, a PBS sync or prune job, an HA rule
or group) changes with requests that need not name what they change:
`PUT /cluster/backup/nightly {"delete": "exclude", "mode": "stop"}` names no guest, yet drops the
exclude that kept a protected guest out and stops that guest for every backup. So for every
create, edit, delete or run of such an object, and for a one-shot vzdump, the policy reads the
stored object, computes the object after the request as Proxmox does (each KINDS row's `merge`
names the upstream function), and judges what changes between the two
(docs/PROXMOX-BEHAVIOUR.md#job-edits):

- deletion: when it acts, the object after the request deletes backups (a prune, a
  remove-vanished) and the object before did not, or not the same way (any field but the
  `harmless` ones differs, being enabled included): the destructive gate. A run deletes what the
  stored object deletes. On PBS every backup group in the object's datastore scope is reached.
- guests: for every protected guest, what the object does to it (its treatment: covered or not,
  and the object's settings but the harmless and selection fields). A change is refused unless
  the guest ends up treated in a way that changes nothing on it (`safe`): a backup in snapshot
  mode that never prunes (remove=0) of a VM, or of a container whose volumes can snapshot.

policy.classify calls `judge`; policy.check_protected refuses the guests `Verdict.changed` names.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import catalog
from errors import PolicyError, ProxmoxError, ToolFailure
from protection import numbers, truthy

Read = Callable[..., Any]


def delete_names(value: Any) -> list[str]:
    """The option names a `delete` lists: PVE a pve-configid-list string, PBS an array."""
    values = value if isinstance(value, list) else [value]
    return [name for item in values if item is not None for name in re.split(r"[,;\s]+", str(item)) if name]


# ================================================================ what the stored objects know

class World:
    """The reads a judgement needs beyond the object itself, each read once, through the policy's
    own `read` (a GET that passes the admission step)."""

    def __init__(self, read: Read | None):
        self.read = read
        self.kept: dict[str, Any] = {}
        self.assumed: dict[str, bool] = {}  # pool -> whether it holds the guest judged, where unreadable

    def pool_members(self, pool: str) -> set[int] | None:
        """The guests of a pool that exist, as vzdump takes them (pve-manager PVE/API2Tools.pm
        `get_resource_pool_guest_members`, read as GET /pools/{poolid} answers them: Pool.pm `read_pool`);
        None when they cannot be read."""
        try:
            answer = self._pool(pool)
        except (ToolFailure, PolicyError):
            return None
        if not isinstance(answer, dict) or not isinstance(answer.get("members"), list):
            return None
        return {int(m["vmid"]) for m in answer["members"] if str(m.get("vmid", "")).isdigit()}

    def _pool(self, pool: str) -> Any:
        """A nested pool (`a/b`, PVE 8.1+) through GET /pools?poolid= only: /pools/{poolid} cannot name it
        (pve-manager PVE/API2/Pool.pm `read_pool`: "deprecated, no support for nested pools")."""
        if "/" not in pool:
            return self.get(f"/pools/{pool}")
        key = f"/pools?poolid={pool}"
        if key not in self.kept:
            if self.read is None:
                raise PolicyError(f"{key} would have to be read to judge this request, and cannot be here.")
            rows = self.read("/pools", poolid=pool)
            self.kept[key] = rows[0] if isinstance(rows, list) and rows else None
        return self.kept[key]

    def get(self, path: str) -> Any:
        if path not in self.kept:
            if self.read is None:
                raise PolicyError(f"{path} would have to be read to judge this request, and cannot be here.")
            self.kept[path] = self.read(path)
        return self.kept[path]

    def resources(self) -> list[dict]:
        rows = self.get("/cluster/resources")
        return rows if isinstance(rows, list) else []

    def guest(self, vmid: int) -> dict | None:
        return next((r for r in self.resources() if r.get("vmid") == vmid and r.get("type") in ("qemu", "lxc")), None)

    def storage_type(self, storage: str) -> str | None:
        return next((r.get("plugintype") for r in self.resources()
                     if r.get("type") == "storage" and r.get("storage") == storage), None)


# Storage types whose volumes can take the snapshot a container backup in snapshot mode needs
# (pve-storage `volume_has_feature` 'snapshot' for a container's raw or subvol volume: LvmThinPlugin,
# ZFSPoolPlugin, RBDPlugin, BTRFSPlugin; the directory-like plugins and LVM snapshot qcow2 only).
SNAPSHOT_STORAGE = ("lvmthin", "zfspool", "rbd", "btrfs")


def _backed_up_volumes(config: dict) -> list[str]:
    """The volumes of a container that its backup includes: rootfs, and mount points that are volumes
    with backup=1 (pve-container LXC/Config.pm `mountpoint_backup_enabled`)."""
    volumes = []
    for key, value in config.items():
        if key != "rootfs" and not re.fullmatch(r"mp\d+", key):
            continue
        parts = dict(p.partition("=")[::2] if "=" in p else ("volume", p) for p in str(value).split(","))
        volume = parts.get("volume", "")
        if key == "rootfs" or (not volume.startswith("/") and truthy(parts.get("backup", "0"))):
            volumes.append(volume)
    return volumes


def container_cannot_snapshot(world: World, vmid: int) -> str | None:
    """Why a snapshot-mode backup of this guest would suspend it instead, or None: vzdump tries
    the container's snapshot and falls back to suspend mode when a volume cannot snapshot
    (pve-container VZDump/LXC.pm `prepare`: "mode failure"; pve-manager VZDump.pm `exec_backup_task`)."""
    try:
        guest = world.guest(vmid)
        if guest is None:
            return "its type and storage could not be read"
        if guest["type"] != "lxc":
            return None
        config = world.get(f"/nodes/{guest['node']}/lxc/{vmid}/config") or {}
        for volume in _backed_up_volumes(config):
            kind = world.storage_type(volume.split(":", 1)[0]) if ":" in volume else None
            if kind not in SNAPSHOT_STORAGE:
                return (f"its volume {volume} is on {kind or 'unknown'} storage, which cannot snapshot a container "
                        f"volume, so vzdump would suspend it instead")
    except ToolFailure as exc:
        return f"its configuration could not be read ({exc})"
    return None


# ================================================================ PVE backup jobs and vzdump

def backup_selection(job: dict, given: dict) -> dict:
    """The selection made consistent as pve-manager does: an `exclude` without a `pool` means all;
    a given `vmid` drops all, exclude and pool; a given `all` drops vmid and pool; a pool drops vmid,
    all and exclude (PVE/API2/Backup.pm `update_job`; PVE/VZDump.pm `verify_vzdump_parameters`)."""
    job = dict(job)
    if job.get("exclude") is not None and not job.get("pool"):
        job["all"] = 1
    if "vmid" in given:
        dropped = ("all", "exclude", "pool")
    elif truthy(given.get("all", "0")):
        dropped = ("vmid", "pool")
    elif job.get("pool"):
        dropped = ("vmid", "all", "exclude")
    else:
        dropped = ()
    return {k: v for k, v in job.items() if k not in dropped}


def merge_backup_job(stored: dict, given: dict, deleted: list[str]) -> dict:
    """PUT /cluster/backup/{id} (pve-manager PVE/API2/Backup.pm `update_job`): the deleted options
    go, the given ones are set, then the selection is made consistent."""
    return backup_selection({k: v for k, v in stored.items() if k not in deleted} | given, given)


def given_selection(given: dict) -> dict:
    """A selection as POST /cluster/backup stores it and vzdump takes it: nothing dropped, an `exclude`
    without a `pool` means all (PVE/VZDump.pm `verify_vzdump_parameters`; Backup.pm `create_job`,
    API2/VZDump.pm `vzdump`). With a pool, vzdump takes its members and ignores all and exclude."""
    return dict(given) | ({"all": 1} if given.get("exclude") is not None and not given.get("pool") else {})


def created_backup_job(given: dict) -> dict:
    """POST /cluster/backup (Backup.pm `create_job`): enabled unless said otherwise."""
    return given_selection({"enabled": 1} | given)


def backup_covers(job: dict, vmid: int, world: World, _ident: str) -> bool:
    """Whether the job backs the guest up (pve-manager PVE/VZDump.pm `get_included_guests`: a pool's
    members, its `exclude` ignored; else vmid; else all but exclude;
    docs/PROXMOX-BEHAVIOUR.md#backups-by-pool). A pool's members are read; where they cannot be, `judge`
    tries the guest both in and out of it. `node` only narrows, and is not counted on."""
    if job.get("pool"):
        members = world.pool_members(str(job["pool"]))
        return vmid in members if members is not None else world.assumed.get(str(job["pool"]), True)
    if job.get("vmid"):
        return vmid in numbers(job["vmid"])
    return truthy(job.get("all", "0")) and vmid not in numbers(job.get("exclude", ""))


def property_string(value: Any) -> str:
    """A property string in one spelling: PUT takes `keep-last=1,keep-daily=7`, GET answers the same
    as an object (pve-manager PVE/API2/Backup.pm: `prune-backups`, `fleecing`, `performance`)."""
    parts = value.items() if isinstance(value, dict) else (p.partition("=")[::2] for p in str(value).split(","))
    return ",".join(sorted(f"{k.strip()}={int(v) if isinstance(v, bool) else v}" for k, v in parts if k.strip()))


def backup_prunes(job: dict) -> list[str]:
    """vzdump prunes after the backup with the job's `prune-backups` unless remove=0 or keep-all
    (PVE/VZDump.pm `new`, `exec_backup_task`). The storage's own retention is the operator's choice
    (gates.UNCERTAIN), not counted here."""
    retention = property_string(job.get("prune-backups") or "")
    keep_all = any(part.startswith("keep-all=") and truthy(part.partition("=")[2]) for part in retention.split(","))
    if not retention or keep_all or not truthy(job.get("remove", "1")):
        return []
    return [f"prune-backups={retention}: prunes the backups of every guest it backs up"]


def backup_changes_guest(job: dict, vmid: int, world: World) -> str | None:
    """Why a backup changes something on a guest, or None: only mode=snapshot with remove=0, given
    explicitly (a node's /etc/vzdump.conf supplies what a job leaves out: PVE/VZDump.pm `new`),
    leaves the guest and its backups as they are; a container must be able to snapshot."""
    if job.get("mode") != "snapshot":
        mode = job.get("mode") or "not given (the node's vzdump.conf decides, suspend or stop are possible)"
        return f"backs it up with mode {mode}"
    if truthy(job.get("remove", "1")):
        return "prunes its older backups (remove is not 0)"
    cannot = container_cannot_snapshot(world, vmid)
    return f"backs it up, but {cannot}" if cannot else None


# ================================================================ PBS sync and prune jobs

def merge_pbs_job(stored: dict, given: dict, deleted: list[str]) -> dict:
    """PUT /config/sync/{id} (proxmox-backup src/api2/config/sync.rs `update_sync_job`) and
    /config/prune/{id} (src/api2/config/prune.rs `update_prune_job`): the deleted properties go,
    then the given ones are set; an empty namespace is the root (prune: `ns.is_root()`)."""
    job = {k: v for k, v in stored.items() if k not in deleted} | given
    return {k: v for k, v in job.items() if not (k == "ns" and v in ("", None))}


def sync_acts(job: dict) -> bool:
    """A sync job runs by itself on its schedule, or when its removable datastore is mounted
    (src/bin/proxmox-backup-proxy.rs `schedule_datastore_sync_jobs`; `run-on-mount`)."""
    return bool(job.get("schedule")) or truthy(job.get("run-on-mount", "0"))


def sync_removes(job: dict) -> list[str]:
    """remove-vanished: the sync deletes the groups and snapshots the source no longer has
    (src/server/pull.rs); a stored JSON false (what the GUI saves) is not removing."""
    if truthy(job.get("remove-vanished", "0")):
        return ["remove-vanished: removes the backups the source no longer has"]
    return []


KEEP = ("keep-last", "keep-hourly", "keep-daily", "keep-weekly", "keep-monthly", "keep-yearly")


def prune_removes(job: dict) -> list[str]:
    """A prune job removes what its keep options do not keep; with none set it keeps everything and
    is skipped (pbs-api-types jobs.rs `KeepOptions::keeps_something`; proxmox-backup-proxy.rs)."""
    keep = [f"{k}={job[k]}" for k in KEEP if str(job.get(k, "0")).isdigit() and int(job.get(k, 0)) > 0]
    return [f"{', '.join(keep)}: removes the backups its keep options do not keep"] if keep else []


# ================================================================ HA rules, groups and resources

def merge_ha_rule(stored: dict, given: dict, deleted: list[str]) -> dict:
    """PUT /cluster/ha/rules/{rule} (pve-ha-manager API2/HA/Rules.pm `update_rule`): a false
    `disable` is dropped (only `delete=disable` enables), the deleted options go, the given ones
    are set."""
    given = {k: v for k, v in given.items() if not (k == "disable" and not truthy(v))}
    return {k: v for k, v in stored.items() if k not in deleted} | given


def merge_ha_group(stored: dict, given: dict, deleted: list[str]) -> dict:
    """PUT /cluster/ha/groups/{group} (API2/HA/Groups.pm `update`) and /cluster/ha/resources/{sid}
    (HA/Config.pm `update_single_resource_config_inplace`): the given options are set first, then the
    deleted ones removed."""
    return {k: v for k, v in (stored | given).items() if k not in deleted}


HA_LISTS = {"HA rule": "/cluster/ha/rules", "HA group": "/cluster/ha/groups", "HA resource": "/cluster/ha/resources"}
HA_KEYS = {"HA rule": "rule", "HA group": "group", "HA resource": "sid"}


def _ha_list(world: World, path: str) -> list[dict]:
    """One of the HA lists; PVE 8 has no rules (501: not implemented, pve-ha-manager 4.x), and PVE 9
    refuses the groups index once there are none (500 "ha groups have been migrated to rules",
    API2/HA/Groups.pm since 849ef84): both are an empty list. Another failure refuses the request:
    the guest's placement cannot be judged."""
    try:
        rows = world.get(path)
    except ProxmoxError as exc:
        if exc.status == 501 or (exc.status == 500 and "migrated to rules" in str(exc)):
            return []
        raise PolicyError(f"{path} could not be read to judge where the HA manager places the protected guests "
                          f"({exc}); nothing was sent.") from None
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def _nodes(text: Any) -> frozenset:
    """A rule's or group's `nodes`: (node, priority) pairs, 0 where none is given (HA/Tools.pm
    `parse_node_priority`; NodeAffinity.pm `get_node_affinity`: `priority // 0`)."""
    pairs = (item.partition(":") for item in re.split(r"[,;\s]+", str(text or "")) if item)
    return frozenset((name, int(priority) if priority.isdigit() else 0) for name, _, priority in pairs)


def _placing_rules(rules: list[dict], groups: list[dict], resources: list[dict]) -> list[tuple]:
    """The rules the HA manager places guests by, comparable, each by its name (two rules alike are two:
    a guest in two node affinity rules has both dropped, NodeAffinity.pm
    `check_single_resource_reference`): the enabled rules (Rules.pm `foreach_rule` with
    exclude_disabled_rules) and each HA group a resource names as the node affinity rule it becomes
    (Groups.pm `migrate_groups_to_rules`: `ha-group-<name>`, strict is `restricted`)."""
    placing = [(str(r.get("rule")), frozenset(numbers(r.get("resources", ""))), r.get("type"), _nodes(r.get("nodes")),
                int(truthy(r.get("strict", 0))), str(r.get("affinity") or "")) for r in rules
               if not truthy(r.get("disable", 0))]
    by_name = {g.get("group"): g for g in groups}
    for name in sorted({r.get("group") for r in resources if r.get("group") in by_name}):
        users = frozenset(n for r in resources if r.get("group") == name for n in numbers(r.get("sid", "")))
        placing.append((f"ha-group-{name}", users, "node-affinity", _nodes(by_name[name].get("nodes")),
                        int(truthy(by_name[name].get("restricted", 0))), ""))
    return placing


def _failback(resource: dict, groups: list[dict]) -> int:
    """A resource fails back to its preferred node unless `failback` is 0, or its group's `nofailback`
    is set (HA/Config.pm `read_and_check_resources_config`: default 1; Groups.pm
    `migrate_groups_to_resources`)."""
    group = next((g for g in groups if resource.get("group") and g.get("group") == resource["group"]), None)
    if group is not None:
        return int(not truthy(group.get("nofailback", 0)))
    return int(truthy(resource.get("failback", 1)))


def ha_placement(label: str, obj: dict | None, vmid: int, world: World, name: str) -> frozenset | None:
    """What decides where the HA manager runs a guest, with the judged rule, group or resource as
    `obj` (None: deleted), comparable; None when nothing places it. The HA manager places a guest by
    its node affinity, the guests it must run with or apart from and its failback (Manager.pm
    `select_service_node`: get_node_affinity, get_resource_affinity, `failback`), after dropping rules
    that conflict and handing a rule to positive partners (Rules.pm `transform`, `check_feasibility`,
    `create_implicit_positive_resource_affinity_node_affinity_rules`), which only ever relate rules
    that share a guest. So the placement of a guest is every rule reaching the guests linked to it
    through shared rules, and their failback: a change to any of them may move it
    (docs/PROXMOX-BEHAVIOUR.md#ha-placement)."""
    lists = {kind: _ha_list(world, path) for kind, path in HA_LISTS.items()}
    key = HA_KEYS[label]
    lists[label] = [r for r in lists[label] if str(r.get(key)) != name] + ([obj | {key: name}] if obj else [])
    placing = _placing_rules(lists["HA rule"], lists["HA group"], lists["HA resource"])
    linked, grown = {vmid}, True
    while grown:
        reached = {v for rule in placing if rule[1] & linked for v in rule[1]}
        grown, linked = bool(reached - linked), linked | reached
    rules = frozenset(rule for rule in placing if rule[1] & linked)
    if not rules:
        return None
    failback = frozenset((n, _failback(r, lists["HA group"])) for r in lists["HA resource"]
                         for n in numbers(r.get("sid", "")) if n in linked)
    return frozenset({("rules", rules), ("failback", failback)})


def places_guest(_obj: dict, _vmid: int, _world: World) -> str:
    return ("changes where the HA manager may run it (its node affinity, the guests it runs with or apart from, "
            "or its failback)")


# ================================================================ the kinds

@dataclass(frozen=True)
class Kind:
    """One kind of stored object that acts by itself, and how Proxmox edits it."""
    label: str
    product: str
    item: str | None  # the object's own path: GET reads it, PUT edits it, DELETE removes it
    create: str  # POST creates one (for vzdump: runs one backup now)
    key: str  # the path (and create) parameter naming it
    merge: Callable[[dict, dict, list[str]], dict]
    acts: Callable[[dict], bool]  # whether it acts by itself (enabled, scheduled)
    deletes: Callable[[dict], list[str]]  # why it deletes backups when it acts
    harmless: frozenset[str]  # fields whose change never changes what it does
    run: str | None = None  # POST runs it once now, as stored
    created: Callable[[dict], dict] = dict
    covers: Callable[[dict, int, World, str], bool] | None = None  # the guests it acts on
    selection: frozenset[str] = frozenset()  # the fields that choose them (covers reads them)
    changes_guest: Callable[[dict, int, World], str | None] | None = None  # why its treatment changes a guest
    whole_scope: str | None = None  # PBS: deleting reaches every backup group in the job's scope
    # what it does to a guest, comparable, with this object as given (None: nothing); in place of covers
    treats: Callable[[str, dict | None, int, World, str], frozenset | None] | None = None


BACKUP_HARMLESS = frozenset({"id", "type", "digest", "comment", "notes-template", "mailto", "mailnotification",
                             "notification-mode", "bwlimit", "ionice", "lockwait", "pigz", "zstd", "compress",
                             "performance", "fleecing", "quiet", "repeat-missed", "exclude-path", "stdexcludes",
                             "protected", "next-run"})
BACKUP_SELECTION = frozenset({"vmid", "all", "exclude", "pool", "node"})
PBS_SCOPE = "removes backups of every group in its datastore scope"
KINDS = (
    Kind("backup job", "pve", "/cluster/backup/{id}", "/cluster/backup", "id", merge_backup_job,
         lambda job: truthy(job.get("enabled", "1")), backup_prunes, BACKUP_HARMLESS, created=created_backup_job,
         covers=backup_covers, selection=BACKUP_SELECTION, changes_guest=backup_changes_guest),
    Kind("backup", "pve", None, "/nodes/{node}/vzdump", "", merge_backup_job, lambda _job: True,
         lambda _job: [], BACKUP_HARMLESS, created=given_selection,
         covers=backup_covers, selection=BACKUP_SELECTION, changes_guest=backup_changes_guest),
    Kind("sync job", "pbs", "/config/sync/{id}", "/config/sync", "id", merge_pbs_job, sync_acts, sync_removes,
         frozenset({"id", "digest", "comment", "rate-in", "rate-out", "burst-in", "burst-out", "worker-threads",
                    "next-run"}),
         run="/admin/sync/{id}/run", whole_scope=PBS_SCOPE),
    Kind("prune job", "pbs", "/config/prune/{id}", "/config/prune", "id", merge_pbs_job,
         lambda job: not truthy(job.get("disable", "0")), prune_removes,
         frozenset({"id", "digest", "comment", "next-run"}), run="/admin/prune/{id}/run", whole_scope=PBS_SCOPE),
    Kind("HA rule", "pve", "/cluster/ha/rules/{rule}", "/cluster/ha/rules", "rule", merge_ha_rule,
         lambda _rule: True, lambda _rule: [], frozenset({"rule", "digest", "comment", "order", "errors"}),
         changes_guest=places_guest, treats=ha_placement),
    Kind("HA group", "pve", "/cluster/ha/groups/{group}", "/cluster/ha/groups", "group", merge_ha_group,
         lambda _group: True, lambda _group: [], frozenset({"group", "type", "digest", "comment"}),
         changes_guest=places_guest, treats=ha_placement),
    Kind("HA resource", "pve", "/cluster/ha/resources/{sid}", "/cluster/ha/resources", "sid", merge_ha_group,
         lambda _resource: True, lambda _resource: [], frozenset({"sid", "type", "digest", "comment"}),
         changes_guest=places_guest, treats=ha_placement),
)


def operation(product: str, method: str, template: str) -> tuple[Kind, str] | None:
    """The kind a request acts on and how: create, edit, delete or run; None for other requests."""
    for kind in KINDS:
        if kind.product != product:
            continue
        if (method, template) == ("POST", kind.create):
            return kind, "create"
        if (method, template) == ("PUT", kind.item):
            return kind, "edit"
        if (method, template) == ("DELETE", kind.item):
            return kind, "delete"
        if (method, template) == ("POST", kind.run):
            return kind, "run"
    return None


# ================================================================ the judgement

@dataclass
class Verdict:
    gates: set[str] = field(default_factory=set)
    reasons: list[str] = field(default_factory=list)
    whole_scope: str | None = None  # PBS: deleting reaches every group in scope
    changed: dict[int, str] | None = None  # protected guest -> what the request changes for it
    before: Any = None  # the object as stored when it was judged (the user's yes is for it as it was)


def _types(kind: Kind) -> dict[str, str]:
    """Each field's schema type, from the methods that create and edit the object."""
    types: dict[str, str] = {}
    for method, template in (("POST", kind.create), ("PUT", kind.item)):
        entry = catalog.entry_for(kind.product, method, template) if template else None
        types |= {name: spec.get("type", "string") for name, spec in (entry or {}).get("params", {}).items()}
    return types


PROPERTY_STRINGS = ("prune-backups", "fleecing", "performance")


def _normal(kind: Kind, obj: dict, leave_out: frozenset[str]) -> frozenset:
    """The object's fields but `leave_out`, as comparable values: booleans 0/1 (a stored JSON false
    equals a form 0), numbers as numbers, lists in order, property strings in one spelling."""
    types = _types(kind)
    items = []
    for name, value in obj.items():
        if name in leave_out or value is None:
            continue
        kind_of = types.get(name)
        if name in PROPERTY_STRINGS:
            value = property_string(value)
        elif kind_of == "boolean" or isinstance(value, bool):
            value = int(truthy(value))
        elif kind_of == "integer" and str(value).lstrip("-").isdigit():
            value = int(value)
        elif isinstance(value, list):
            value = tuple(sorted(map(str, value)))
        else:
            value = str(value)
        items.append((name, value))
    return frozenset(items)


def _deleting(kind: Kind, obj: dict | None) -> frozenset | None:
    """What and how the object deletes when it acts, comparable; None when it deletes nothing."""
    if obj is None or not kind.acts(obj) or not kind.deletes(obj):
        return None
    return _normal(kind, obj, kind.harmless)


def _treatment(kind: Kind, obj: dict | None, vmid: int, world: World, ident: str) -> frozenset | None:
    """What the object does to one guest, comparable; None when it does nothing to it."""
    if kind.treats is not None:
        return kind.treats(kind.label, obj, vmid, world, ident)
    if obj is None or kind.covers is None or not kind.acts(obj) or not kind.covers(obj, vmid, world, ident):
        return None
    return _normal(kind, obj, kind.harmless | kind.selection)


def _stored(kind: Kind, ident: str, world: World, what: str) -> dict:
    path = (kind.item or "").replace("{" + kind.key + "}", ident)
    try:
        stored = world.get(path)
    except (ToolFailure, PolicyError) as exc:
        raise PolicyError(f"{what} depends on the {kind.label} {path}, which could not be read ({exc}); "
                          f"nothing was sent.") from None
    if not isinstance(stored, dict) or not stored:
        raise PolicyError(f"{what} depends on the {kind.label} {path}, which could not be read; nothing was sent.")
    return stored


def ident(kind: Kind, path_params: dict[str, str], params: dict[str, Any]) -> str:
    """The name of the object a request acts on: in its path, or (a create) among its parameters."""
    return path_params.get(kind.key) or str(params.get(kind.key, ""))


def after(kind: Kind, op: str, before: dict | None, params: dict[str, Any]) -> dict | None:
    """The object after a create, edit, delete or run of it, as Proxmox's handler leaves it (KINDS'
    `merge` and `created` name the handlers); a run leaves it as stored."""
    given = {k: v for k, v in params.items() if k not in (kind.key, "delete", "digest")}
    if op == "create":
        return kind.created(given)
    if op == "edit":
        return kind.merge(before or {}, given, delete_names(params.get("delete")))
    return None if op == "delete" else before


def judge(product: str, method: str, template: str, path_params: dict[str, str], params: dict[str, Any],
          read: Read | None, protected: list[int], what: str) -> Verdict | None:
    """The verdict on a request that creates, edits, deletes or runs a KINDS object (None for any
    other request): the gates and reasons its deletion adds, and the protected guests it changes."""
    found = operation(product, method, template)
    if found is None:
        return None
    kind, op = found
    world = World(read)
    name = ident(kind, path_params, params)
    before = None if op == "create" else _stored(kind, name, world, what)
    after_it = after(kind, op, before, params)
    verdict = Verdict(before=before)
    removes = kind.deletes(before) if op == "run" else (
        kind.deletes(after_it) if _deleting(kind, after_it) not in (None, _deleting(kind, before)) else [])
    if removes:
        verdict.gates.add("destructive")
        verdict.reasons += [f"the {kind.label} {'as stored' if op == 'run' else 'after this request'}: {r}"
                            for r in removes]
        verdict.whole_scope = kind.whole_scope
    if kind.covers is not None or kind.treats is not None:
        verdict.changed = {}
        for vmid in protected:
            problem = _change_for(kind, before, after_it, vmid, world, name)
            if problem:
                verdict.changed[vmid] = f"the {kind.label}{' ' + repr(name) if name else ''} after it {problem}"
    return verdict


def _change_for(kind: Kind, before: dict | None, after_it: dict | None, vmid: int, world: World, name: str
                ) -> str | None:
    """What the request changes for one guest that is not safe, or None. A pool whose members cannot be
    read is tried both ways, holding the guest and not (the worst case in each direction)."""
    unread = sorted({str(o["pool"]) for o in (before, after_it) if o and o.get("pool")
                     and kind.covers is backup_covers and world.pool_members(str(o["pool"])) is None})
    for assumed in itertools.product((True, False), repeat=len(unread)):
        world.assumed = dict(zip(unread, assumed, strict=True))
        try:
            if _treatment(kind, before, vmid, world, name) == _treatment(kind, after_it, vmid, world, name):
                continue
            problem = ("no longer acts on it" if _treatment(kind, after_it, vmid, world, name) is None
                       else kind.changes_guest(after_it, vmid, world))
        finally:
            world.assumed = {}
        if problem:
            guess = ", ".join(f"pool {p} {'holding' if a else 'not holding'} it" for p, a in zip(unread, assumed,
                                                                                                strict=True))
            return f"{problem} (judged with {guess}: its members could not be read)" if unread else problem
    return None
