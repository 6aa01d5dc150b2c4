"""A batch is judged as it runs: each request on the state the earlier ones left.

`POST /nodes/{node}/execute` runs its commands in order, each on what the earlier ones left, and runs
the next after one that failed (docs/PROXMOX-BEHAVIOUR.md#nested-execute); a tool that declares its
steps (policy.plan_steps) sends them in order and stops at the first that fails. So the policy judges
such a sequence through an `Overlay`: a reader that answers the reads a judgement makes (the firewall,
a stored job, rule or group, a guest's config, a pool's members, the HA resources) from the state
before the sequence with its earlier writes folded in, each computed as Proxmox's own handler computes
it (firewall_guard.apply, job_edits.after, `config_after`, `pool_after`). A read of something an
earlier write changed that cannot be computed so is refused: the sequence is then sent one by one.

`end_states` gives every state a batch can leave a folded object in (each write applied or not, in
order): `check_firewall` has the firewall guard judge each against the state before the batch.
"""
from __future__ import annotations

import copy
import itertools
import re
from typing import Any, Callable

import firewall_guard
import job_edits
from errors import PolicyError
from protection import numbers, truthy

Read = Callable[..., Any]
MAX_FOLDED = 6  # a batch's writes to the firewall whose every end state is judged (2**6 of them)
CONFIG = re.compile(r"/nodes/\{node\}/(qemu|lxc)/\{vmid\}/config")
DRIVE = re.compile(r"(ide|sata|scsi|virtio|efidisk|tpmstate)\d+|rootfs|mp\d+")
POOL = re.compile(r"/pools(/\{poolid\})?")
HA_RESOURCES = re.compile(r"/cluster/ha/resources(/\{sid\})?")


def _touches(written: str, read: str) -> bool:
    """Whether a read may answer what a write to `written` changed: the same path, or one under the other."""
    return read == written or read.startswith(written.rstrip("/") + "/") or written.startswith(read.rstrip("/") + "/")


class Overlay:
    """The reads of a judgement as the sequence's earlier writes (`fold`) left what they touch."""

    def __init__(self, read: Read | None, product: str = "pve"):
        self.base, self.product = read, product
        self.writes: list[Any] = []  # the earlier writes, as the policy classified them (Decision)
        self.kept: dict[str, Any] = {}  # answers computed since the last fold

    def fold(self, decision: Any) -> None:
        if decision.method not in ("GET", "SSH"):
            self.writes.append(decision)
            self.kept.clear()

    def read(self, path: str, *args: Any, **params: Any) -> Any:
        if self.base is None:
            raise PolicyError(f"{path} would have to be read to judge this request, and cannot be here.")
        if path in self.kept and not args and not params:
            return copy.deepcopy(self.kept[path])
        for answer in (self._firewall, self._config, self._job, self._pool, self._ha_resources):
            found = answer(path) if not args and not params else None
            if found is not None:
                self.kept[path] = found[0]
                return copy.deepcopy(found[0])
        changed = [w for w in self.writes if _touches(w.path, path)]
        if changed:
            raise PolicyError(f"{changed[0].method} {changed[0].path} changes what {path} answers, and a later "
                              f"request of the same batch is judged by it, which cannot be computed here: send them "
                              f"one by one.")
        return self.base(path, *args, **params)

    def _of(self, test: Callable[[Any], bool]) -> list[Any]:
        return [w for w in self.writes if test(w)]

    # ---- each kind of object the policy can fold, its answer as a one-tuple (None: not this kind)

    def _firewall(self, path: str) -> tuple[Any] | None:
        writes = self._of(lambda w: firewall_guard.guards("pve", w.method, w.template))
        if not writes or not firewall_guard.GET_PATHS.fullmatch(path):
            return None
        if "firewall" not in self.kept:
            state = firewall_guard.read_firewall(self.base, None)
            for write in writes:
                state = firewall_guard.apply(state, write.method, write.template, write.path_params, write.params)
            self.kept["firewall"] = state
        answer = firewall_guard.served(self.kept["firewall"], path)
        return None if answer is None else (answer,)

    def _config(self, path: str) -> tuple[Any] | None:
        writes = self._of(lambda w: CONFIG.fullmatch(w.template) and w.path == path)
        if not writes:
            return None
        config = dict(self.base(path) or {})
        for write in writes:
            config = config_after(config, write.params)
        return (config,)

    def _job(self, path: str) -> tuple[Any] | None:
        """A stored job, rule or group (job_edits.KINDS), or the list of them, after the earlier writes."""
        for kind in job_edits.KINDS:
            writes = self._of(lambda w, k=kind: k.item is not None and (
                job_edits.operation(self.product, w.method, w.template) or (None,))[0] is k)
            if not writes:
                continue
            names = sorted({job_edits.ident(kind, w.path_params, w.params) for w in writes})
            items = {kind.item.replace("{" + kind.key + "}", name): name for name in names}
            if path in items:
                return (self._object(kind, items[path], writes),)
            if path == kind.create:
                rows = [r for r in (self.base(path) or []) if r.get(kind.key) not in names]
                return (rows + [obj | {kind.key: name} for name in names
                                if (obj := self._object(kind, name, writes)) is not None],)
        return None

    def _object(self, kind: Any, name: str, writes: list[Any]) -> dict | None:
        mine = [w for w in writes if job_edits.ident(kind, w.path_params, w.params) == name]
        ops = [job_edits.operation(self.product, w.method, w.template)[1] for w in mine]
        stored = None if ops[0] == "create" else self.base(kind.item.replace("{" + kind.key + "}", name))
        for write, op in zip(mine, ops, strict=True):
            stored = job_edits.after(kind, op, stored, write.params)
        return stored

    def _pool(self, path: str) -> tuple[Any] | None:
        writes = self._of(lambda w: POOL.fullmatch(w.template) and w.method == "PUT")
        match = re.fullmatch(r"/pools/([^/]+)", path)
        if not writes or not match:
            return None
        pool = dict(self.base(path) or {"members": []})
        for write in writes:
            pool = pool_after(pool, match.group(1), write.path_params.get("poolid") or write.params.get("poolid"),
                              write.params)
        return (pool,)

    def _ha_resources(self, path: str) -> tuple[Any] | None:
        writes = self._of(lambda w: HA_RESOURCES.fullmatch(w.template) and w.method != "GET")
        if not writes or path != "/cluster/ha/resources":
            return None
        rows = copy.deepcopy(self.base(path) or [])
        for write in writes:
            rows = ha_resources_after(rows, write.method, write.path_params.get("sid"), write.params)
        return (rows,)


# ================================================================ how Proxmox changes each object

def config_after(config: dict, params: dict[str, Any]) -> dict:
    """A guest config after PUT/POST .../config as GET answers it (pending values shown): the deleted
    options go, a deleted disk is kept as the next free `unusedN` unless `force` frees it, the given
    options are set (qemu-server API2/Qemu.pm `$update_vm_api`, QemuServer.pm
    `vmconfig_delete_or_detach_drive`, `vmconfig_register_unused_drive`; pve-container
    LXC/Config.pm `vmconfig_apply_pending`)."""
    after = {k: v for k, v in config.items() if k != "digest"}
    for name in job_edits.delete_names(params.get("delete")):
        value = after.pop(name, None)
        volume = str(value or "").split(",")[0].removeprefix("file=").removeprefix("volume=")
        if DRIVE.fullmatch(name) and ":" in volume and "media=cdrom" not in str(value) and not truthy(
                params.get("force", "0")):
            after[next(f"unused{n}" for n in itertools.count() if f"unused{n}" not in after)] = volume
    return after | {k: v for k, v in params.items() if k not in ("delete", "digest", "force", "skiplock",
                                                                  "background_delay", "revert")}


def pool_after(pool: dict, name: str, edited: str | None, params: dict[str, Any]) -> dict:
    """A pool's members after PUT /pools (or /pools/{poolid}): the listed guests added, or with
    `delete` removed; `allow-move` takes a guest out of its other pool (pve-manager PVE/API2/Pool.pm
    `update_pool`)."""
    members = [dict(m) for m in pool.get("members", [])]
    listed = set(numbers(params.get("vms", "")))
    if edited == name and truthy(params.get("delete", "0")):
        members = [m for m in members if m.get("vmid") not in listed]
    elif edited == name:
        members += [{"vmid": vmid, "type": "guest", "id": f"/vms/{vmid}"} for vmid in sorted(listed)
                    if vmid not in {m.get("vmid") for m in members}]
    elif truthy(params.get("allow-move", "0")) and not truthy(params.get("delete", "0")):
        members = [m for m in members if m.get("vmid") not in listed]
    return pool | {"members": members}


def ha_resources_after(rows: list[dict], method: str, sid: str | None, params: dict[str, Any]) -> list[dict]:
    """The HA resources after a create, edit or delete of one (pve-ha-manager API2/HA/Resources.pm
    `create`, `update`, `delete`: `delete` names options to drop)."""
    sid = sid or str(params.get("sid", ""))
    kept = [r for r in rows if r.get("sid") != sid]
    if method == "DELETE":
        return kept
    row = next((dict(r) for r in rows if r.get("sid") == sid), {"sid": sid})
    for name in job_edits.delete_names(params.get("delete")):
        row.pop(name, None)
    return kept + [row | {k: v for k, v in params.items() if k not in ("delete", "digest", "sid")}]


# ================================================================ every way a batch can end

def end_states(writes: list[Any], start: Any, apply: Callable[[Any, Any], Any]) -> list[tuple[list[int], Any]]:
    """(the writes applied, by index, and the state they leave) for each non-empty subset of `writes`,
    in order: Proxmox runs each command of a batch whether the ones before it failed or not."""
    if len(writes) > MAX_FOLDED:
        raise PolicyError(f"The batch writes the firewall {len(writes)} times; more than {MAX_FOLDED} writes to it "
                          f"cannot be judged in every way the batch can end. Send them in smaller batches.")
    found = []
    for size in range(1, len(writes) + 1):
        for chosen in itertools.combinations(range(len(writes)), size):
            state = start
            for index in chosen:
                state = apply(state, writes[index])
            found.append((list(chosen), state))
    return found


def check_firewall(host: Any, what: str, writes: list[Any], read: Read | None, configured_source: str | None,
                   backup_servers: tuple[str, ...]) -> None:
    """Refuse a batch whose firewall writes (in order) can leave a management port cut that is reachable
    now, judged by the firewall guard for every way the batch can end (`end_states`)."""
    nodes = {w.path_params.get("node") for w in writes}
    before = firewall_guard.read_before(what, read, nodes.pop() if len(nodes) == 1 else None)
    ends = end_states(writes, before, lambda fw, w: firewall_guard.apply(fw, w.method, w.template, w.path_params,
                                                                           w.params))
    firewall_guard.compare(host, configured_source, before, [(_commands(what, writes, chosen), writes[chosen[-1]],
                                                              state) for chosen, state in ends], backup_servers)


def _commands(what: str, writes: list[Any], chosen: list[int]) -> str:
    named = ", ".join(f"{writes[n].method} {writes[n].path}" for n in chosen)
    if len(chosen) == len(writes):
        return f"{what} (its commands {named}, in order)"
    return (f"{what}, if only {named} of its firewall writes take{'s' * (len(chosen) == 1)} effect (Proxmox runs "
            f"each command even when one before it fails),")
