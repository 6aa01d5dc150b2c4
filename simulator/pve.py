"""Proxmox VE: the handlers behind the PVE API paths the simulator keeps state for,
and `PVE_HANDLERS`, the table from (METHOD, path template) to handler.

A handler gets the `Call` and the path parameters by name; it returns the `data` of the
answer or raises `ApiError`. Paths without a handler get an empty answer of the schema's
type from `api.generic`.
"""
from __future__ import annotations

import re
import time
from typing import Callable

from .call import ApiError, Call, _permissions
from .lab import GiB, Task


def _node(call: Call, name: str) -> dict:
    """Resolve a node as pveproxy does: a down node gives 595; a wrong-case name resolves through
    DNS to a member and is refused as a proxy loop; an unknown one fails its hostname lookup
    (docs/PROXMOX-BEHAVIOUR.md#node-names-and-forwarding)."""
    lab = call.lab
    if name in lab.nodes:
        if name in lab.down_nodes:
            raise ApiError(595, "Connection refused")
        return lab.nodes[name]
    if name.lower() in {n.lower() for n in lab.nodes}:
        raise ApiError(500, "proxy loop detected")
    raise ApiError(500, f"hostname lookup '{name}' failed - failed to get address info for: {name}: "
                        f"Name or service not known")


def _guest(call: Call, node: str, vmid: str, kind: str) -> dict:
    _node(call, node)
    guest = call.lab.guests.get(int(vmid))
    if not guest or guest["node"] != node or guest["type"] != kind:
        folder = "qemu-server" if kind == "qemu" else "lxc"
        raise ApiError(500, f"Configuration file 'nodes/{node}/{folder}/{vmid}.conf' does not exist")
    return guest



# ---------------------------------------------------------------- PVE handlers

PVE_VERSIONS = {8: ("8.4.14", "8.4"), 9: ("9.2.1", "9.2")}  # pve-manager version, release, by major


def pve_version(call: Call, **_: str) -> dict:
    version, release = PVE_VERSIONS[call.lab.pve_major]
    return {"version": version, "release": release, "repoid": "0d3f1c6ba8d1e2a7"}


def pve_cluster_status(call: Call, **_: str) -> list:
    lab = call.lab
    rows: list[dict] = []
    if len(lab.nodes) > 1:  # a standalone node has no cluster entry (docs/PROXMOX-BEHAVIOUR.md#cluster-status)
        online = len(lab.nodes) - len(lab.down_nodes)
        rows.append({"type": "cluster", "id": "cluster", "name": lab.cluster_name, "nodes": len(lab.nodes),
                     "quorate": int(online * 2 > len(lab.nodes)), "version": 7})
    for index, name in enumerate(lab.nodes):
        rows.append({"type": "node", "id": f"node/{name}", "name": name, "nodeid": index + 1,
                     "online": int(name not in lab.down_nodes), "local": int(index == 0),
                     "ip": f"192.0.2.{11 + index}", "level": ""})
    return rows


def _guest_row(guest: dict) -> dict:
    kind = guest["type"]
    cfg = guest["config"]
    maxmem = int(cfg.get("memory", 512)) * 1024 * 1024
    running = guest["status"] == "running"
    row = {"id": f"{kind}/{guest['vmid']}", "type": kind, "vmid": guest["vmid"], "node": guest["node"],
           "name": guest["name"], "status": guest["status"], "template": guest["template"],
           "maxcpu": int(cfg.get("cores", 1)), "cpu": guest["cpu"] if running else 0,
           "maxmem": maxmem, "mem": int(maxmem * 0.45) if running else 0, "maxdisk": guest["maxdisk"],
           "disk": int(guest["maxdisk"] * 0.3) if kind == "lxc" and running else 0,
           "uptime": guest["uptime"] if running else 0, "netin": 0, "netout": 0, "diskread": 0, "diskwrite": 0}
    if kind == "qemu":
        row["memhost"] = row["mem"]  # PVE 9
    for key in ("tags", "lock", "pool"):  # only when set (docs/PROXMOX-BEHAVIOUR.md#cluster-resources)
        if guest.get(key):
            row[key] = guest[key]
    if guest.get("ha"):  # HA resources only (docs/PROXMOX-BEHAVIOUR.md#ha-managed-guests)
        row["hastate"] = guest["ha"]["state"]
    return row


def _node_resources(call: Call) -> list[dict]:
    lab = call.lab
    rows = []
    for name, node in lab.nodes.items():
        row = {"id": f"node/{name}", "type": "node", "node": name, "level": node["level"],
               "status": "offline" if name in lab.down_nodes else "online"}
        # without Sys.Audit the node comes back bare, and a down node has no stats
        # (docs/PROXMOX-BEHAVIOUR.md#cluster-resources)
        if call.can(f"/nodes/{name}", "Sys.Audit") and name not in lab.down_nodes:
            stats = ("cpu", "maxcpu", "mem", "maxmem", "disk", "maxdisk", "uptime", "level")
            row |= {k: node[k] for k in stats} | {"cgroup-mode": 2}
        rows.append(row)
    return rows


def _guest_resources(call: Call) -> list[dict]:
    rows = []
    for vmid, guest in sorted(call.lab.guests.items()):
        if call.can(f"/vms/{vmid}", "VM.Audit"):
            row = _guest_row(guest)
            if guest["node"] in call.lab.down_nodes:
                row["status"] = "unknown"
            rows.append(row)
    return rows


def _storage_resources(call: Call) -> list[dict]:
    lab = call.lab
    rows = []
    for storage in lab.storages.values():
        if not call.can(f"/storage/{storage['storage']}", "Datastore.Audit"):
            continue
        for name in lab.storage_nodes(storage):
            row = {"id": f"storage/{name}/{storage['storage']}", "type": "storage", "node": name,
                   "storage": storage["storage"], "plugintype": storage["type"], "status": "unknown",
                   "content": storage["content"], "shared": storage["shared"]}
            # usage and `available` only when the node reported it (docs/PROXMOX-BEHAVIOUR.md#cluster-resources)
            if name not in lab.down_nodes and (name, storage["storage"]) not in lab.offline_storages:
                row |= {"status": "available", "disk": storage["used"], "maxdisk": storage["total"]}
            rows.append(row)
    return rows


def _pool_resources(call: Call) -> list[dict]:
    return [{"id": f"/pool/{pool}", "type": "pool", "pool": pool}
            for pool in call.lab.pools if call.can(f"/pool/{pool}", "Pool.Audit")]


def _sdn_resources(call: Call) -> list[dict]:
    if not call.can("/sdn/zones/localnetwork", "SDN.Audit"):
        return []
    return [{"id": f"sdn/{name}/localnetwork", "type": "sdn", "sdn": "localnetwork", "node": name, "status": "ok"}
            for name in call.lab.nodes]


# The rows of /cluster/resources in their order, each with the `type` filter that keeps them;
# pools (None) are listed only when no type is asked for.
RESOURCE_ROWS: tuple[tuple[str | None, Callable[[Call], list[dict]]], ...] = (
    ("node", _node_resources), ("vm", _guest_resources), ("storage", _storage_resources),
    (None, _pool_resources), ("sdn", _sdn_resources))


def pve_cluster_resources(call: Call, **_: str) -> list:
    wanted = call.arg("type")
    return [row for kind, rows in RESOURCE_ROWS if wanted in (None, kind) for row in rows(call)]


NODE_FINGERPRINT = ("AA:BB:CC:DD:EE:FF:00:11:22:33:44:55:66:77:88:99:"
                    "AA:BB:CC:DD:EE:FF:00:11:22:33:44:55:66:77:88:99")


def pve_nodes(call: Call, **_: str) -> list:
    rows = []
    for name, node in call.lab.nodes.items():
        row = {"node": name, "status": "offline" if name in call.lab.down_nodes else "online",
               "type": "node", "id": f"node/{name}",
               "ssl_fingerprint": NODE_FINGERPRINT}
        if call.can(f"/nodes/{name}", "Sys.Audit") and name not in call.lab.down_nodes:
            row |= {k: node[k] for k in ("cpu", "maxcpu", "mem", "maxmem", "disk", "maxdisk", "uptime", "level")}
        rows.append(row)
    return rows


def pve_node_status(call: Call, node: str) -> dict:
    info = _node(call, node)
    version = PVE_VERSIONS[call.lab.pve_major][0]
    return {"uptime": info["uptime"], "loadavg": info["loadavg"], "cpu": info["cpu"], "wait": 0.001,
            "kversion": info["kversion"], "pveversion": f"pve-manager/{version}/0d3f1c6ba8d1e2a7",
            "cpuinfo": {"cpus": info["maxcpu"], "model": "AMD Ryzen 7 5800U", "sockets": 1,
                        "cores": info["maxcpu"] // 2},
            "memory": {"total": info["maxmem"], "used": info["mem"], "free": info["maxmem"] - info["mem"]},
            "rootfs": {"total": info["maxdisk"], "used": info["disk"], "avail": info["maxdisk"] - info["disk"]},
            "swap": {"total": 8 * GiB, "used": 0, "free": 8 * GiB},
            "boot-info": {"mode": "efi", "secureboot": 0}, "current-kernel": {"release": "6.14.11-2-pve"}}


def pve_guest_list(kind: str) -> Callable:
    def handler(call: Call, node: str) -> list:
        _node(call, node)
        rows = []
        for vmid, guest in sorted(call.lab.guests.items()):
            if guest["node"] == node and guest["type"] == kind and call.can(f"/vms/{vmid}", "VM.Audit"):
                row = _guest_row(guest)
                row.pop("id"), row.pop("node")
                if kind == "lxc":
                    row["vmid"] = str(vmid) if call.lab.legacy_errors else vmid  # PVE < 8.2 sent a string
                rows.append(row)
        return rows
    return handler


def pve_guest_status(kind: str) -> Callable:
    """status/current: `status` running or stopped only, `qmpstatus` paused for a paused VM, and
    always an `ha` object (docs/PROXMOX-BEHAVIOUR.md#guest-status)."""
    def handler(call: Call, node: str, vmid: str) -> dict:
        guest = _guest(call, node, vmid, kind)
        row = _guest_row(guest)
        row.pop("id"), row.pop("node"), row.pop("hastate", None)
        if kind == "qemu":
            row["qmpstatus"] = "paused" if guest["paused"] else guest["status"]
        if kind == "qemu" and guest["config"].get("agent"):
            row["agent"] = 1
        row["ha"] = {"managed": 1, "state": guest["ha"]["state"]} if guest.get("ha") else {"managed": 0}
        return row
    return handler


def pve_guest_config(kind: str) -> Callable:
    """GET config: pending values taken in unless current=1 (docs/PROXMOX-BEHAVIOUR.md#pending-config)."""
    def handler(call: Call, node: str, vmid: str) -> dict:
        guest = _guest(call, node, vmid, kind)
        config = dict(guest["config"])
        if str(call.arg("current", "0")) != "1":
            for key, value in guest["pending"].items():
                if value is None:
                    config.pop(key, None)
                else:
                    config[key] = value
        return config
    return handler


def pve_guest_pending(kind: str) -> Callable:
    """GET pending: every key with its current `value`, and `pending` or `delete` where a change
    waits for the next start (docs/PROXMOX-BEHAVIOUR.md#pending-config)."""
    def handler(call: Call, node: str, vmid: str) -> list:
        guest = _guest(call, node, vmid, kind)
        rows = []
        for key, value in guest["config"].items():
            row = {"key": key, "value": value}
            if key in guest["pending"]:
                row |= {"delete": 1} if guest["pending"][key] is None else {"pending": guest["pending"][key]}
            rows.append(row)
        rows += [{"key": key, "pending": value} for key, value in guest["pending"].items()
                 if key not in guest["config"] and value is not None]
        return rows
    return handler


def pve_storage_list(call: Call, **_: str) -> list:
    """GET /storage: the storage configuration, a PBS storage's server, datastore and namespace
    included (docs/PROXMOX-BEHAVIOUR.md#pbs-backed-volumes)."""
    rows = []
    for storage in call.lab.storages.values():
        if call.arg("type") not in (None, storage["type"]):
            continue
        if call.can(f"/storage/{storage['storage']}", "Datastore.Audit"):
            row = {"storage": storage["storage"], "type": storage["type"], "content": storage["content"],
                   "shared": storage["shared"], "digest": "0" * 40} | storage.get("config", {})
            if not storage["shared"]:
                row["nodes"] = ",".join(storage["nodes"])
            rows.append(row)
    return rows


def pve_node_storage(call: Call, node: str) -> list:
    _node(call, node)
    rows = []
    for storage in call.lab.storages.values():
        if node in call.lab.storage_nodes(storage) and call.can(f"/storage/{storage['storage']}", "Datastore.Audit"):
            content = call.arg("content")
            if content and content not in storage["content"].split(","):
                continue
            row = {"storage": storage["storage"], "type": storage["type"], "content": storage["content"],
                   "shared": storage["shared"], "active": 0, "enabled": 1}
            if (node, storage["storage"]) not in call.lab.offline_storages:
                row |= {"active": 1, "total": storage["total"], "used": storage["used"],
                        "avail": storage["total"] - storage["used"],
                        "used_fraction": round(storage["used"] / storage["total"], 4)}
            rows.append(row)
    return rows


def _task_row(task: Task, now: float) -> dict:
    """A task as PVE lists it: `user` without the token, `tokenid` apart (pve-manager PVE/API2/Tasks.pm,
    $convert_token_task); running tasks have no status or endtime (docs/PROXMOX-BEHAVIOUR.md#pve-tasks)."""
    parts = task.upid.split(":")
    user, _, tokenid = task.user.partition("!")
    row = {"upid": task.upid, "node": task.node, "pid": int(parts[2], 16), "pstart": int(parts[3], 16),
           "starttime": int(task.started), "type": task.type, "id": task.id, "user": user}
    if tokenid:
        row["tokenid"] = tokenid
    if not task.running(now):
        row |= {"endtime": int(task.started + task.duration), "status": task.exitstatus}
    return row


def _visible_task(call: Call, task: Task) -> bool:
    """A token sees only its own tasks unless it has Sys.Audit on the node (docs/PROXMOX-BEHAVIOUR.md#pve-tasks)."""
    return task.user == call.token_id or call.can(f"/nodes/{task.node}", "Sys.Audit")


def _status_type(status: str | None) -> str:
    """ok, warning, error or unknown; a running task (no status) is unknown (pve-common src/PVE/UPID.pm,
    normalize_status_type)."""
    if not status or status == "unexpected status":
        return "unknown"
    if status == "OK":
        return "ok"
    return "warning" if re.fullmatch(r"WARNINGS: \d+", status) else "error"


def _wanted_states(call: Call) -> set[str]:
    """`errors=1` drops only tasks that ended OK; else `statusfilter` picks (pve-manager PVE/API2/Tasks.pm)."""
    if str(call.arg("errors", "0")) == "1":
        return {"warning", "error", "unknown"}
    if call.arg("statusfilter"):
        return {s.strip().lower() for s in re.split(r"[,;\s]+", str(call.arg("statusfilter"))) if s.strip()}
    return {"ok", "warning", "error", "unknown"}


def _task_selected(call: Call, task: Task, running: bool) -> bool:
    source = call.arg("source", "archive")
    vmid = call.arg("vmid")
    if (source == "archive" and running) or (source == "active" and not running):
        return False
    if vmid is not None and task.id != str(vmid):
        return False
    if call.arg("typefilter") and task.type != call.arg("typefilter"):
        return False
    return _status_type(None if running else task.exitstatus) in _wanted_states(call)


def pve_tasks(call: Call, node: str) -> list:
    """GET /nodes/{node}/tasks: running tasks (source active or all) say RUNNING; `limit=0` lists
    nothing, unlike the task log (docs/PROXMOX-BEHAVIOUR.md#pve-tasks)."""
    _node(call, node)
    now = time.time()
    rows = []
    for task in sorted(call.lab.tasks.values(), key=lambda t: -t.started):
        running = task.running(now)
        if task.node == node and _visible_task(call, task) and _task_selected(call, task, running):
            rows.append(_task_row(task, now) | ({"status": "RUNNING"} if running else {}))
    start, limit = int(call.arg("start", 0)), int(call.arg("limit", 50))
    return rows[start:start + limit] if limit > 0 else []


def pve_cluster_tasks(call: Call) -> list:
    """Recent tasks of every node, running ones included."""
    now = time.time()
    tasks = sorted(call.lab.tasks.values(), key=lambda t: -t.started)
    return [_task_row(t, now) for t in tasks if _visible_task(call, t)][:50]


def _task(call: Call, node: str, upid: str) -> Task:
    _node(call, node)
    task = call.lab.tasks.get(upid)
    if task is None or task.node != node:
        raise ApiError(400, "Parameter verification failed.", {"upid": "no such task"})
    if not _visible_task(call, task):
        raise ApiError(403, f"Permission check failed (/nodes/{node}, Sys.Audit)")
    return task


def pve_task_status(call: Call, node: str, upid: str) -> dict:
    task = _task(call, node, upid)
    row = _task_row(task, time.time())
    row.pop("endtime", None)  # the status endpoint has no endtime (docs/PROXMOX-BEHAVIOUR.md#pve-tasks)
    if task.running(time.time()):
        row["status"] = "running"
    else:
        row |= {"status": "stopped", "exitstatus": task.exitstatus}
    return row


def pve_task_log(call: Call, node: str, upid: str) -> list:
    task = _task(call, node, upid)
    lines = task.log(time.time()) or ["no content"]
    start = int(call.arg("start", 0))
    limit = int(call.arg("limit", 50))
    rows = [{"n": i + 1, "t": text} for i, text in enumerate(lines)]
    return rows[start:start + limit] if limit else rows[start:]


# ---- guest power: async tasks that fail later, as the real ones do (docs/PROXMOX-BEHAVIOUR.md#power-and-locks)

TASK_TYPE = {("qemu", "suspend"): "qmpause"}  # the rest: qm<action> / vz<action>


def _apply_pending(call: Call, guest: dict) -> None:
    """A start applies what waited in `pending` (docs/PROXMOX-BEHAVIOUR.md#pending-config)."""
    for key, value in guest["pending"].items():
        if value is None:
            guest["config"].pop(key, None)
        else:
            guest["config"][key] = value
    if guest["pending"]:
        guest["pending"] = {}
        guest["config"]["digest"] = call.lab._digest(guest["vmid"])


def _resumes(action: str, guest: dict) -> bool:
    """A hibernated VM (lock `suspended`, no task) is resumed by a start (qemu-server QemuServer.pm, vm_start)."""
    return action == "start" and guest["lock"] == "suspended"


def _power_effect(call: Call, guest: dict, action: str) -> Callable[[], None]:
    resumes = _resumes(action, guest)

    def apply() -> None:
        if resumes:
            guest["lock"] = None
        if action in ("start", "reboot", "reset", "resume"):
            guest["status"], guest["paused"] = "running", False
            if action in ("start", "reboot"):
                _apply_pending(call, guest)
        elif action in ("stop", "shutdown"):
            guest["status"], guest["paused"] = "stopped", False
        elif action == "suspend":
            guest["paused"] = True
        guest["uptime"] = 1 if guest["status"] == "running" else 0
    return apply


def _refused_before_task(kind: str, action: str, guest: dict, call: Call) -> str | None:
    """The checks the API handler makes before it forks a worker: a 500 with nothing started
    (qemu-server API2/Qemu.pm vm_shutdown/vm_reboot/vm_reset/vm_suspend/vm_resume, pve-container
    API2/LXC/Status.pm; docs/PROXMOX-BEHAVIOUR.md#power-and-locks)."""
    vmid, running, paused = guest["vmid"], guest["status"] == "running", guest["paused"]
    if kind == "qemu":
        if (action == "reboot" and paused) or (action == "shutdown" and paused
                                               and str(call.arg("forceStop", "0")) != "1"):
            return "VM is paused - cannot shutdown"
        if action in ("reboot", "reset", "suspend", "resume") and not running:
            return f"VM {vmid} not running"
        return None
    if action in ("start", "resume") and running and not paused:
        return f"CT {vmid} already running"
    if action in ("stop", "shutdown", "suspend") and not running:
        return f"CT {vmid} not running"
    if action == "reboot" and not running:
        return f"VM {vmid} not running"  # sic: pve-container's reboot says VM
    return None


def _in_task_error(kind: str, action: str, guest: dict, call: Call) -> str:
    label = "VM" if kind == "qemu" else "CT"
    if guest["lock"] and str(call.arg("skiplock", "0")) != "1" and not _resumes(action, guest):
        return f"{label} is locked ({guest['lock']})"
    if action == "start" and guest["status"] == "running":
        return f"{label} {guest['vmid']} already running"
    return "OK"  # stopping or shutting down a stopped VM ends OK (qemu-server QemuServer.pm vm_stop)


def _ha_request(call: Call, node: str, kind: str, action: str, guest: dict) -> str:
    """An HA resource's start/stop/shutdown only queues a request: the hastart/hastop task ends OK at
    once; the HA manager acts later and a stop stays in force (docs/PROXMOX-BEHAVIOUR.md#ha-managed-guests)."""
    label = "VM" if kind == "qemu" else "CT"
    starting = action == "start"
    ha = guest["ha"]

    def queued() -> None:
        if starting and guest["status"] == "running":
            ha["state"] = "started"
            return
        ha["state"] = "request_start" if starting else "request_stop"
        call.lab.schedule(call.lab.ha_seconds, crm)

    def crm() -> None:
        ha["state"] = "started" if starting else "stopped"
        _power_effect(call, guest, "start" if starting else "stop")()
    line = f"Requesting HA {'start' if starting else 'stop'} for {label} {guest['vmid']}"
    return call.lab.start_task(node, "hastart" if starting else "hastop", str(guest["vmid"]), user=call.token_id,
                               lines=[line], on_done=queued)


def pve_power(kind: str, action: str) -> Callable:
    task_type = TASK_TYPE.get((kind, action), f"{'qm' if kind == 'qemu' else 'vz'}{action}")

    def handler(call: Call, node: str, vmid: str) -> str:
        guest = _guest(call, node, vmid, kind)
        refused = _refused_before_task(kind, action, guest, call)
        if refused:
            raise ApiError(500, refused)
        if guest.get("ha") and action in ("start", "stop", "shutdown"):
            return _ha_request(call, node, kind, action, guest)
        return call.lab.start_task(node, task_type, vmid, user=call.token_id,
                                   exitstatus=_in_task_error(kind, action, guest, call),
                                   on_done=_power_effect(call, guest, action))
    return handler


def pve_snapshots(kind: str) -> Callable:
    def handler(call: Call, node: str, vmid: str) -> list:
        guest = _guest(call, node, vmid, kind)
        rows = [dict(snap) for snap in guest["snapshots"]]
        parent = rows[-1]["name"] if rows else None
        current = {"name": "current", "description": "You are here!", "running": int(guest["status"] == "running")}
        if parent:
            current["parent"] = parent
        return rows + [current]
    return handler


def pve_snapshot_create(kind: str) -> Callable:
    def handler(call: Call, node: str, vmid: str) -> str:
        guest = _guest(call, node, vmid, kind)
        name = call.arg("snapname")
        error = "OK"
        if any(s["name"] == name for s in guest["snapshots"]):
            error = f"snapshot name '{name}' already used"
        elif guest["lock"]:
            error = f"{'VM' if kind == 'qemu' else 'CT'} is locked ({guest['lock']})"

        def apply() -> None:
            snap = {"name": name, "snaptime": int(time.time()), "description": call.arg("description", "")}
            if guest["snapshots"]:
                snap["parent"] = guest["snapshots"][-1]["name"]
            if kind == "qemu" and str(call.arg("vmstate", "0")) == "1":
                snap["vmstate"] = 1
            guest["snapshots"].append(snap)
        return call.lab.start_task(node, "qmsnapshot" if kind == "qemu" else "vzsnapshot", vmid,
                                   user=call.token_id, exitstatus=error, on_done=apply)
    return handler


def pve_snapshot_delete(kind: str) -> Callable:
    def handler(call: Call, node: str, vmid: str, snapname: str) -> str:
        guest = _guest(call, node, vmid, kind)
        if not any(s["name"] == snapname for s in guest["snapshots"]):
            raise ApiError(500, f"snapshot '{snapname}' does not exist")

        def apply() -> None:
            guest["snapshots"] = [s for s in guest["snapshots"] if s["name"] != snapname]
        return call.lab.start_task(node, "qmdelsnapshot" if kind == "qemu" else "vzdelsnapshot", vmid,
                                   user=call.token_id, on_done=apply)
    return handler


def pve_storage_content(call: Call, node: str, storage: str) -> list:
    _node(call, node)
    entry = call.lab.storages.get(storage)
    if entry is None or node not in call.lab.storage_nodes(entry):
        raise ApiError(500, f"storage '{storage}' does not exist")
    rows = [v for v in call.lab.volumes.get(storage, []) if v.get("_node", node) == node]
    rows += call.lab.guest_disks(storage, node)
    if entry["type"] == "pbs":
        rows += call.lab.pbs_volumes(storage)
    content, vmid = call.arg("content"), call.arg("vmid")
    return [{k: val for k, val in v.items() if k != "_node"} for v in rows
            if (content is None or v["content"] == content) and (vmid is None or v.get("vmid") == int(vmid))]


def _vnet_rows(call: Call) -> list[dict]:
    """SDN vnets as pve-network's get_local_vnets lists them: no ports, `vlanaware` 0/1, the
    vnet's alias as comment."""
    return [{"iface": name, "type": "vnet", "active": "1", "ipam": 0, "vlanaware": int(bool(vnet.get("vlanaware"))),
             "comments": vnet.get("alias")} for name, vnet in sorted(call.lab.vnets.items())]


def pve_network(call: Call, node: str) -> list:
    """`any_bridge` lists Linux and OVS bridges and SDN vnets, `any_local_bridge` the bridges only,
    `vnet` the vnets, `include_sdn` everything (docs/PROXMOX-BEHAVIOUR.md#networks)."""
    _node(call, node)
    wanted = call.arg("type")
    rows = [dict(r) for r in call.lab.networks.get(node, [])]
    if wanted in ("any_bridge", "any_local_bridge"):
        rows = [r for r in rows if r["type"] in ("bridge", "OVSBridge")]
    elif wanted not in (None, "include_sdn"):
        rows = [r for r in rows if r["type"] == wanted]
    if wanted in ("any_bridge", "include_sdn", "vnet"):
        rows += _vnet_rows(call)
    return [{k: v for k, v in row.items() if v is not None} for row in rows]



# ---- guest changes: config, disks, snapshots, backups, clones, migration, templates, deletion

def _locked(guest: dict, kind: str) -> str | None:
    return f"{'VM' if kind == 'qemu' else 'CT'} is locked ({guest['lock']})" if guest["lock"] else None


# Options a running guest takes at once; everything else waits in `pending` for the next start
# (docs/PROXMOX-BEHAVIOUR.md#pending-config): qemu-server QemuServer.pm ($fast_plug_option,
# vmconfig_hotplug_pending with the default hotplug "network,disk,usb"), pve-container
# LXC/Config.pm ($LXC_FASTPLUG_OPTIONS, vmconfig_hotplug_pending).
HOTPLUG = {
    "qemu": re.compile(r"description|hookscript|lock|migrate_downtime|migrate_speed|name|onboot|protection"
                       r"|shares|startup|tags|vmstatestorage|cpuunits|cpulimit|agent|balloon"),
    "lxc": re.compile(r"description|onboot|startup|protection|hostname|hookscript|cores|tags|lock|cpulimit"
                      r"|cpuunits|memory|swap|net\d+|mp\d+|dev\d+"),
}
QEMU_HOTPLUG_FEATURE = (("network", re.compile(r"net\d+")), ("usb", re.compile(r"usb\d+|tablet")),
                        ("disk", re.compile(r"(scsi|virtio|sata|ide)\d+")), ("memory", re.compile(r"memory")),
                        ("cpu", re.compile(r"vcpus")))
CONFIG_CALL_KEYS = ("delete", "digest", "skiplock", "revert", "background_delay", "node", "vmid")


def _hot_pluggable(kind: str, guest: dict, key: str) -> bool:
    if HOTPLUG[kind].fullmatch(key):
        return True
    if kind != "qemu":
        return False
    features = str(guest["config"].get("hotplug", "network,disk,usb"))
    features = "network,disk,usb" if features == "1" else features
    return any(name in features.split(",") and pattern.fullmatch(key) for name, pattern in QEMU_HOTPLUG_FEATURE)


def pve_config_update(kind: str) -> Callable:
    def handler(call: Call, node: str, vmid: str) -> None:
        guest = _guest(call, node, vmid, kind)
        config = guest["config"]
        if call.arg("digest") and call.arg("digest") != config["digest"]:
            raise ApiError(500, "detected modified configuration - file changed by other user? Try again.")
        if _locked(guest, kind) and str(call.arg("skiplock", "0")) != "1":
            raise ApiError(500, _locked(guest, kind))
        changes: dict[str, object] = {key: None for key in re.split(r"[,;\s]+", str(call.arg("delete", ""))) if key}
        changes |= {key: value[0] if isinstance(value, list) and len(value) == 1 else value
                    for key, value in call.params.items() if key not in CONFIG_CALL_KEYS}
        running = guest["status"] == "running"
        for key, value in changes.items():
            if running and not _hot_pluggable(kind, guest, key):
                guest["pending"][key] = value
            elif value is None:
                config.pop(key, None)
            else:
                config[key] = value
        if "name" in config or "hostname" in config:
            guest["name"] = config.get("name") or config.get("hostname")
        guest["tags"] = config.get("tags", "")
        config["digest"] = call.lab._digest(int(vmid))
    return handler


def pve_resize(kind: str) -> Callable:
    def handler(call: Call, node: str, vmid: str) -> str:
        guest = _guest(call, node, vmid, kind)
        disk, size = call.arg("disk"), str(call.arg("size"))
        value = guest["config"].get(disk)
        if value is None:
            raise ApiError(500, f"disk '{disk}' does not exist")
        current = int(re.search(r"size=(\d+)G", value).group(1))
        wanted = current + int(size[1:-1]) if size.startswith("+") else int(size.rstrip("G"))
        if wanted < current:
            raise ApiError(500, "shrinking disks is not supported")

        def apply() -> None:
            guest["config"][disk] = re.sub(r"size=\d+G", f"size={wanted}G", guest["config"][disk])
            guest["maxdisk"] = wanted * GiB
        return call.lab.start_task(node, "resize", vmid, user=call.token_id, exitstatus=_locked(guest, kind) or "OK",
                                   on_done=apply)
    return handler


def pve_rollback(kind: str) -> Callable:
    def handler(call: Call, node: str, vmid: str, snapname: str) -> str:
        guest = _guest(call, node, vmid, kind)
        if not any(s["name"] == snapname for s in guest["snapshots"]):
            raise ApiError(500, f"snapshot '{snapname}' does not exist")
        return call.lab.start_task(node, "qmrollback" if kind == "qemu" else "vzrollback", vmid, user=call.token_id,
                                   exitstatus=_locked(guest, kind) or "OK", lock=(guest, "rollback"))
    return handler


def pve_vzdump(call: Call, node: str) -> str:
    _node(call, node)
    vmid = int(str(call.arg("vmid", "0")).split(",")[0] or 0)
    guest = call.lab.guests.get(vmid)
    if guest is None or guest["node"] != node:
        return call.lab.start_task(node, "vzdump", "", user=call.token_id, exitstatus="job errors",
                                   lines=[f"ERROR: guest {vmid} is not on node {node}"])
    storage = call.arg("storage", "local")
    kind = "qemu" if guest["type"] == "qemu" else "lxc"
    stamp = time.strftime("%Y_%m_%d-%H_%M_%S", time.gmtime())
    ext = "vma.zst" if kind == "qemu" else "tar.zst"
    volid = f"{storage}:backup/vzdump-{kind}-{vmid}-{stamp}.{ext}"
    lines = [f"INFO: starting new backup job: vzdump {vmid} --storage {storage} --mode {call.arg('mode', 'snapshot')}",
             f"INFO: Starting Backup of VM {vmid} ({kind})"] + \
        [f"INFO: {p}% ({p * 20 // 100} GiB of 20 GiB) in {p // 10}s" for p in (10, 35, 60, 85, 100)] + \
        [f"INFO: Finished Backup of VM {vmid}"]

    def apply() -> None:
        call.lab.add_volume(storage, volid, "backup", 2 * GiB, vmid=vmid, node=guest["node"])
        if call.arg("notes-template"):
            call.lab.volumes[storage][-1]["notes"] = call.arg("notes-template")
    return call.lab.start_task(node, "vzdump", str(vmid), user=call.token_id, lines=lines,
                               exitstatus=_locked(guest, kind) or "OK", on_done=apply, lock=(guest, "backup"))


# The create parameters the simulated guest keeps in its config.
CREATE_KEEPS = re.compile(r"(net|ipconfig|scsi|ide|sata|virtio|mp)\d+|ciuser|sshkeys|nameserver|tags|ostype|rootfs"
                          r"|unprivileged|description")
DISK_KEY = re.compile(r"(scsi|virtio|sata|ide|efidisk|tpmstate|mp)\d+|rootfs")
MAC = re.compile(r"(?i)\b([0-9a-f]{2}:){5}[0-9a-f]{2}\b")


def _volume_storages(guest: dict) -> list[str]:
    """The storages of a guest's volumes, CD-ROM images included (`none` and `cdrom` are no volume)."""
    found = []
    for key, value in guest["config"].items():
        volume = str(value).split(",")[0]
        if DISK_KEY.fullmatch(key) and ":" in volume:
            found.append(volume.split(":")[0])
    return found


def _shared(call: Call, storage: str) -> bool:
    return bool(call.lab.storages.get(storage, {}).get("shared"))


def _new_macs(call: Call, config: dict) -> dict:
    """Every NIC with a fresh random MAC address, as clones and `unique` restores get."""
    def fresh(_match: re.Match) -> str:
        return "BC:24:11:" + ":".join(f"{call.lab.random.randrange(256):02X}" for _ in range(3))
    return {k: MAC.sub(fresh, str(v)) if re.fullmatch(r"net\d+", k) else v for k, v in config.items()}


def _allocate_disks(call: Call, vmid: int, params: dict) -> dict:
    """`<storage>:<GiB>` becomes a new volume of that size; `<storage>:0,import-from=<volid>` one the
    size of the source image (docs/PROXMOX-BEHAVIOUR.md#downloads-and-imports)."""
    disks = {}
    for index, key in enumerate(k for k in sorted(params) if DISK_KEY.fullmatch(k)):
        value = str(params[key][0] if isinstance(params[key], list) else params[key])
        parts = value.split(",")
        match = re.fullmatch(r"([\w.-]+):(\d+(?:\.\d+)?)", parts[0])
        if not match:
            continue
        options = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
        size = float(match.group(2))
        source = options.pop("import-from", None)
        if source:
            found = [v for v in call.lab.volumes.get(source.split(":")[0], []) if v["volid"] == source]
            size = max(1, -(-found[0]["size"] // GiB)) if found else 2
        disks[key] = ",".join([f"{match.group(1)}:vm-{vmid}-disk-{index}", *(f"{k}={v}" for k, v in options.items()),
                               f"size={int(size)}G"])
    return disks


def _archive_here(call: Call, archive: str, node: str) -> bool:
    storage = archive.split(":")[0]
    if call.lab.storages.get(storage, {}).get("type") == "pbs":
        return True
    return any(v["volid"] == archive and v.get("_node", node) == node for v in call.lab.volumes.get(storage, []))


def _restored_source(call: Call, archive: str) -> dict | None:
    match = re.search(r"vzdump-(?:qemu|lxc)-(\d+)-|/(?:vm|ct)/(\d+)/", archive)
    return call.lab.guests.get(int(match.group(1) or match.group(2))) if match else None


def pve_create(kind: str) -> Callable:
    """Create a guest, or restore one from a backup archive (qemu: archive=, lxc: restore=1)."""
    def handler(call: Call, node: str) -> str:
        _node(call, node)
        vmid = int(call.arg("vmid"))
        label = "VM" if kind == "qemu" else "CT"
        if kind == "qemu":
            archive = call.arg("archive")
        else:
            archive = call.arg("ostemplate") if str(call.arg("restore", "0")) == "1" else None
        exists = vmid in call.lab.guests
        if exists and not (archive and str(call.arg("force", "0")) == "1"):
            raise ApiError(500, f"unable to create {label} {vmid}: config file already exists")
        missing = archive and not _archive_here(call, archive, node)
        if missing and kind == "qemu":  # a backup on another node's `local` is not here
            raise ApiError(500, f"can't find file '{archive}'")  # docs/PROXMOX-BEHAVIOUR.md#restore
        name = call.arg("name") or call.arg("hostname") or f"{'vm' if kind == 'qemu' else 'ct'}{vmid}"
        disks = _allocate_disks(call, vmid, call.params)
        source = _restored_source(call, archive) if archive else None
        nics = {k: v for k, v in (source or {}).get("config", {}).items() if re.fullmatch(r"net\d+", k)}
        if str(call.arg("unique", "0")) == "1":
            nics = _new_macs(call, nics)

        def apply() -> None:
            memory_mib = int(str(call.arg("memory", 2048)).split(",")[0].split("=")[-1])
            guest = call.lab.add_guest(vmid, kind, node, name, memory_mib=memory_mib, cores=int(call.arg("cores", 1)))
            for key, value in call.params.items():
                if CREATE_KEEPS.fullmatch(key):
                    guest["config"][key] = value
            # a restore keeps the backed-up MAC addresses unless unique=1 (docs/PROXMOX-BEHAVIOUR.md#restore)
            guest["config"] |= disks | nics
            sizes = [int(m.group(1)) for v in disks.values() if (m := re.search(r"size=(\d+)G", v))]
            guest["maxdisk"] = sizes[0] * GiB if sizes else guest["maxdisk"]
            if str(call.arg("start", "0")) == "1":
                guest["status"] = "running"
        prefix = "qm" if kind == "qemu" else "vz"
        lines = [f"restore {archive}"] + [f"progress {p}%" for p in (25, 50, 75, 100)] if archive else None
        return call.lab.start_task(node, f"{prefix}{'restore' if archive else 'create'}", str(vmid),
                                   user=call.token_id, lines=lines, on_done=apply,
                                   exitstatus=f"can't find file '{archive}'" if missing else "OK")
    return handler


def _clone_refusal(call: Call, kind: str, source: dict, target: str | None, full: bool) -> str | None:
    """What clone_vm dies with before its worker starts (docs/PROXMOX-BEHAVIOUR.md#clone)."""
    label = "VM" if kind == "qemu" else "CT"
    storage, snapname = call.arg("storage"), call.arg("snapname")
    if storage and target and not _shared(call, storage):
        return f"can't clone to non-shared storage '{storage}'"
    if storage and not full:
        return "parameter 'storage' not allowed for linked clones"
    if snapname and not any(s["name"] == snapname for s in source["snapshots"]):
        return f"snapshot '{snapname}' does not exist"
    if kind == "lxc" and full and source["status"] == "running" and not snapname:
        return "Full clone of a running container is only possible from a snapshot"
    # qemu judges the source's volumes; a container the volumes as they will be (on `storage` if given)
    storages = _volume_storages(source) if kind == "qemu" or not storage else [storage]
    if target and not all(_shared(call, s) for s in storages):
        return f"can't clone {label} to node '{target}' ({label} uses local storage)"
    return None


def pve_clone(kind: str) -> Callable:
    def handler(call: Call, node: str, vmid: str) -> str:
        source = _guest(call, node, vmid, kind)
        newid = int(call.arg("newid"))
        label = "VM" if kind == "qemu" else "CT"
        target = call.arg("target")
        target = None if target in (node, "localhost") else target
        if target:
            _node(call, target)
        full = str(call.arg("full")) == "1" if call.arg("full") is not None else not source["template"]
        refused = _clone_refusal(call, kind, source, target, full)
        if refused:
            raise ApiError(500, refused)
        if newid in call.lab.guests:
            raise ApiError(500, f"unable to create {label} {newid}: config file already exists")
        name = call.arg("name") or call.arg("hostname") or f"copy-of-{source['name']}"

        def apply() -> None:
            clone = call.lab.add_guest(newid, kind, target or node, name)
            config = {k: v for k, v in source["config"].items() if k not in ("digest", "template")}
            clone["config"] = _new_macs(call, config) | {  # a clone always gets new MACs
                "digest": call.lab._digest(newid), ("name" if kind == "qemu" else "hostname"): name}
        how = "full" if full else "linked"
        lines = [f"create {how} clone of drive scsi0 (local-lvm:vm-{vmid}-disk-0)"] + \
            [f"transferred {p * 32 // 100}.0 GiB of 32.0 GiB ({p}.00%)" for p in (20, 40, 60, 80, 100)]
        return call.lab.start_task(node, "qmclone" if kind == "qemu" else "vzclone", vmid, user=call.token_id,
                                   lines=lines, exitstatus=_locked(source, kind) or "OK", on_done=apply,
                                   lock=(source, "clone"))
    return handler


def _storage_map(value: str | None) -> dict[str, str]:
    """targetstorage: one storage for all, `src:dst` pairs, or `1` for each to itself."""
    if not value or value == "1":
        return {}
    pairs = [p.split(":", 1) for p in value.split(",")]
    return {src: dst for src, dst in pairs} if all(len(p) == 2 for p in pairs) else {"*": value}


def _migrate_refusal(call: Call, kind: str, guest: dict, target: str, node: str) -> ApiError | None:
    """What migrate_vm refuses before any task (docs/PROXMOX-BEHAVIOUR.md#migrate)."""
    running = guest["status"] == "running"
    if target == node:
        return ApiError(400, "Parameter verification failed.", {"target": "target is local node."})
    if kind == "lxc":
        if running and str(call.arg("online", "0")) != "1" and str(call.arg("restart", "0")) != "1":
            return ApiError(500, "can't migrate running container without --online or --restart")
        return None
    if _locked(guest, kind):
        return ApiError(500, _locked(guest, kind))
    if running and str(call.arg("online", "0")) != "1":
        return ApiError(500, "can't migrate running VM without --online")
    mapping = _storage_map(call.arg("targetstorage"))
    for storage in _volume_storages(guest):
        wanted = mapping.get(storage, mapping.get("*", storage))
        entry = call.lab.storages.get(wanted)
        if entry is None or target not in call.lab.storage_nodes(entry):
            return ApiError(500, f"storage '{wanted}' is not available on node '{target}'")
    return None


def _migrate_error(call: Call, kind: str, guest: dict) -> tuple[str, list[str]]:
    """What the migration task itself ends with, and the log lines that say why."""
    if kind == "lxc":
        if guest["status"] == "running" and str(call.arg("restart", "0")) != "1":
            return "lxc live migration is currently not implemented", []
        return _locked(guest, kind) or "OK", []
    local = [str(v).split(",")[0] for k, v in guest["config"].items() if DISK_KEY.fullmatch(k)
             and "media=cdrom" not in str(v) and ":" in str(v) and not _shared(call, str(v).split(":")[0])]
    if guest["status"] == "running" and local and str(call.arg("with-local-disks", "0")) != "1":
        # qemu-server QemuMigrate.pm scan_local_volumes, pve-guest-common AbstractMigrate.pm
        return "migration aborted", [
            *(f"can't migrate local disk '{v}': can't live migrate attached local disks without "
              f"with-local-disks option" for v in local),
            "ERROR: migration aborted (duration 00:00:01): can't migrate VM - check log"]
    return "OK", []


def _moved(call: Call, guest: dict, target: str) -> Callable[[], None]:
    mapping = _storage_map(call.arg("targetstorage") or call.arg("target-storage"))

    def apply() -> None:
        guest["node"] = target
        for key, value in guest["config"].items():
            storage = str(value).split(":")[0]
            if DISK_KEY.fullmatch(key) and ":" in str(value) and (storage in mapping or "*" in mapping):
                guest["config"][key] = mapping.get(storage, mapping.get("*")) + str(value)[len(storage):]
    return apply


def _ha_migrate(call: Call, node: str, kind: str, guest: dict, target: str) -> str:
    """An HA resource's migration is a request to the HA manager (docs/PROXMOX-BEHAVIOUR.md#ha-managed-guests)."""
    ha = guest["ha"]
    before = ha["state"]

    def queued() -> None:
        ha["state"] = "migrate"
        call.lab.schedule(call.lab.ha_seconds, crm)

    def crm() -> None:
        guest["node"], ha["state"] = target, before
    line = f"Requesting HA migration for {'VM' if kind == 'qemu' else 'CT'} {guest['vmid']} to node {target}"
    return call.lab.start_task(node, "hamigrate", str(guest["vmid"]), user=call.token_id, lines=[line],
                               on_done=queued)


def pve_migrate(kind: str) -> Callable:
    def handler(call: Call, node: str, vmid: str) -> str:
        guest = _guest(call, node, vmid, kind)
        target = call.arg("target")
        _node(call, target)
        refused = _migrate_refusal(call, kind, guest, target, node)
        if refused:
            raise refused
        if guest.get("ha"):
            return _ha_migrate(call, node, kind, guest, target)
        error, why = _migrate_error(call, kind, guest)
        lines = [f"starting migration of {kind.upper()} {vmid} to node '{target}'"] + why + \
            ([f"migration active, transferred {p * 4 // 100} GiB of 4 GiB VM-state ({p}%)" for p in (25, 50, 75, 100)]
             if error == "OK" else [])
        return call.lab.start_task(node, "qmigrate" if kind == "qemu" else "vzmigrate", vmid, user=call.token_id,
                                   lines=lines, exitstatus=error, on_done=_moved(call, guest, target),
                                   lock=(guest, "migrate"))
    return handler


def pve_template(kind: str) -> Callable:
    def handler(call: Call, node: str, vmid: str) -> str | None:
        guest = _guest(call, node, vmid, kind)
        if guest["status"] == "running":
            raise ApiError(500, f"you can't convert a {'VM' if kind == 'qemu' else 'CT'} to template if it is running")

        def apply() -> None:
            guest["template"] = 1
            guest["config"]["template"] = 1
        if kind == "lxc":  # synchronous for containers (the schema returns null)
            apply()
            return None
        return call.lab.start_task(node, "qmtemplate", vmid, user=call.token_id, on_done=apply)
    return handler


def pve_destroy(kind: str) -> Callable:
    def handler(call: Call, node: str, vmid: str) -> str:
        guest = _guest(call, node, vmid, kind)
        label = "VM" if kind == "qemu" else "CT"
        running = f"{label} {vmid} is running - destroy failed"
        error = _locked(guest, kind) or ("OK" if guest["status"] == "stopped" else running)

        def apply() -> None:
            call.lab.guests.pop(int(vmid), None)
        return call.lab.start_task(node, "qmdestroy" if kind == "qemu" else "vzdestroy", vmid, user=call.token_id,
                                   exitstatus=error, on_done=apply)
    return handler


# The file names download-url accepts per content type (docs/PROXMOX-BEHAVIOUR.md#downloads-and-imports;
# pve-storage API2/Storage/Status.pm download_url with Storage.pm's $ISO_EXT_RE_0, $VZTMPL_EXT_RE_1,
# $UPLOAD_IMPORT_EXT_RE_1).
DOWNLOAD_NAMES = {
    "iso": (re.compile(r"[^/]+\.(?:iso|img)", re.I), "wrong file extension"),
    "vztmpl": (re.compile(r"[^/]+\.(?:tar|tar\.(?:gz|xz|zst|bz2))", re.I), "wrong file extension"),
    "import": (re.compile(r"[A-Za-z0-9_.+=-]+\.(?:ova|qcow2|raw|vmdk)"), "invalid filename or wrong extension"),
}


def pve_download_url(call: Call, node: str, storage: str) -> str:
    _node(call, node)
    entry = call.lab.storages.get(storage)
    content = call.arg("content")
    if entry is None or content not in entry["content"].split(","):
        raise ApiError(500, f"storage '{storage}' does not support content-type '{content}'")
    filename = str(call.arg("filename"))
    if not DOWNLOAD_NAMES[content][0].fullmatch(filename):
        raise ApiError(400, "Parameter verification failed.", {"filename": DOWNLOAD_NAMES[content][1]})
    folder = {"iso": "iso", "vztmpl": "vztmpl", "import": "import"}[content]
    volid = f"{storage}:{folder}/{filename}"
    lines = [f"downloading {call.arg('url')} to /var/lib/vz/template/{folder}/{call.arg('filename')}"] + \
        [f"{p}% [{'=' * (p // 10)}] 600.0M" for p in (10, 40, 70, 100)] + ["download of file finished"]
    if call.arg("checksum"):
        lines.append("calculating checksum... OK, checksum verified")

    def apply() -> None:
        # an import image's size is what it holds (a cloud image: about 3 GiB), not the file's
        call.lab.add_volume(storage, volid, content, 3 * GiB if content == "import" else 600 * 1024 ** 2, node=node)
    return call.lab.start_task(node, "download", storage, user=call.token_id, lines=lines, on_done=apply)


def pve_delete_volume(call: Call, node: str, storage: str, volume: str) -> str:
    _node(call, node)
    volid = volume if ":" in volume else f"{storage}:{volume}"
    volumes = call.lab.volumes.get(storage, [])
    disk = next((v for v in call.lab.guest_disks(storage, node) if v["volid"] == volid), None)
    if disk is not None:
        raise ApiError(500, f"volume '{volid}' is in use by guest {disk['vmid']}")
    if not any(v["volid"] == volid for v in volumes):
        raise ApiError(500, f"volume '{volid}' does not exist")

    def apply() -> None:
        call.lab.volumes[storage] = [v for v in volumes if v["volid"] != volid]
    return call.lab.start_task(node, "imgdel", "", user=call.token_id, on_done=apply)


LINUX_OSINFO = {"id": "debian", "name": "Debian GNU/Linux", "pretty-name": "Debian GNU/Linux 13 (trixie)",
                "kernel-release": "6.12.48+deb13-amd64", "machine": "x86_64"}
# what qemu-guest-agent reports on Windows (docs/PROXMOX-BEHAVIOUR.md#guest-agent; not from Proxmox's source)
WINDOWS_OSINFO = {"id": "mswindows", "name": "Microsoft Windows", "pretty-name": "Windows 11 Pro",
                  "version": "Microsoft Windows 11", "kernel-release": "22631", "machine": "x86-64"}


def _windows(guest: dict) -> bool:
    return str(guest["config"].get("ostype", "")).startswith("win")


def pve_agent(command: str) -> Callable:
    def handler(call: Call, node: str, vmid: str) -> dict:
        guest = _agent_ready(call, node, vmid)
        # an agent error without `desc` comes back as a success (docs/PROXMOX-BEHAVIOUR.md#guest-agent)
        if command in guest.get("agent_errors", {}):
            return {"result": {"error": guest["agent_errors"][command]}}
        address = f"192.0.2.{100 + int(vmid) % 100}"
        answers = {
            "get-osinfo": {"result": WINDOWS_OSINFO if _windows(guest) else LINUX_OSINFO},
            "get-host-name": {"result": {"host-name": guest["name"]}},
            "network-get-interfaces": {"result": [
                {"name": "lo", "ip-addresses": [{"ip-address": "127.0.0.1", "ip-address-type": "ipv4", "prefix": 8}]},
                {"name": "eth0", "hardware-address": "bc:24:11:00:00:01",
                 "ip-addresses": [{"ip-address": address, "ip-address-type": "ipv4", "prefix": 24},
                                  {"ip-address": "fe80::be24:11ff:fe00:1", "ip-address-type": "ipv6", "prefix": 64}]}]},
        }
        return answers[command]
    return handler


def _agent_ready(call: Call, node: str, vmid: str) -> dict:
    guest = _guest(call, node, vmid, "qemu")
    if not guest["config"].get("agent"):
        raise ApiError(500, "No QEMU guest agent configured")
    if guest["status"] != "running":
        raise ApiError(500, f"VM {vmid} is not running")
    # right after boot the agent's ping fails for a while (docs/PROXMOX-BEHAVIOUR.md#guest-agent)
    if guest.get("agent_boot_pings", 0) > 0:
        guest["agent_boot_pings"] -= 1
        raise ApiError(500, "QEMU guest agent is not running")
    return guest


def pve_agent_ping(call: Call, node: str, vmid: str) -> None:
    _agent_ready(call, node, vmid)


def pve_agent_exec(call: Call, node: str, vmid: str) -> dict:
    """Runs nothing: answers like the agent would for `sh -c "<script>"`, echoing the script,
    with `exit N` in it as the exit code and `sleep N` making it take that long."""
    guest = _agent_ready(call, node, vmid)
    command = call.params.get("command")
    argv = command if isinstance(command, list) else [command]
    if _windows(guest) and argv[0] == "/bin/sh":  # no /bin/sh on Windows (not verified in Proxmox's source)
        raise ApiError(500, "Agent error: Failed to execute child process \"/bin/sh\" (No such file or directory)")
    wrapped = argv[:2] in (["/bin/sh", "-c"], ["cmd.exe", "/c"])
    script = argv[-1] if wrapped else " ".join(argv)
    guest.setdefault("agent_pids", {})
    pid = 4000 + len(guest["agent_pids"])
    code = re.search(r"exit (\d+)", script)
    pause = re.search(r"sleep (\d+)", script)
    guest["agent_pids"][pid] = {"done_at": time.time() + (int(pause.group(1)) if pause else 0),
                                "exitcode": int(code.group(1)) if code else 0, "out": f"ran: {script}\n"}
    return {"pid": pid}


def pve_agent_exec_status(call: Call, node: str, vmid: str) -> dict:
    guest = _agent_ready(call, node, vmid)
    process = guest.get("agent_pids", {}).get(int(call.arg("pid")))
    if process is None:
        raise ApiError(500, "Agent error: Invalid parameter 'pid'")
    if time.time() < process["done_at"]:
        return {"exited": 0}  # only this while running (docs/PROXMOX-BEHAVIOUR.md#guest-agent)
    return {"exited": 1, "exitcode": process["exitcode"], "out-data": process["out"]}


def pve_agent_file_read(call: Call, node: str, vmid: str) -> dict:
    guest = _agent_ready(call, node, vmid)
    files = guest.setdefault("files", {"/etc/hostname": guest["name"] + "\n"})
    path = call.arg("file")
    if path not in files:
        raise ApiError(500, f"Agent error: Failed to open file '{path}': No such file or directory")
    return {"content": files[path], "bytes-read": len(files[path])}


def pve_agent_file_write(call: Call, node: str, vmid: str) -> None:
    guest = _agent_ready(call, node, vmid)
    content = call.arg("content")
    if str(call.arg("encode", "1")) == "0":
        import base64
        content = base64.b64decode(content).decode()
    guest.setdefault("files", {})[call.arg("file")] = content


def pve_lxc_interfaces(call: Call, node: str, vmid: str) -> list:
    guest = _guest(call, node, vmid, "lxc")
    if guest["status"] != "running":
        raise ApiError(500, f"CT {vmid} not running")
    return [{"name": "lo", "inet": "127.0.0.1/8", "hwaddr": "00:00:00:00:00:00"},
            {"name": "eth0", "inet": f"192.0.2.{100 + int(vmid) % 100}/24", "inet6": "fe80::1/64",
             "hwaddr": "bc:24:11:00:00:01"}]


def pve_cluster_log(call: Call) -> list:
    now = int(time.time())
    rows = [{"n": i + 1, "time": now - 600 * i, "node": node, "pid": 1000 + i, "user": "root@pam", "tag": "pvedaemon",
             "pri": 6, "uid": f"{i:08X}", "msg": f"<root@pam> end task {task.upid} {task.exitstatus}"}
            for i, (node, task) in enumerate((t.node, t) for t in call.lab.tasks.values())]
    limit = int(call.arg("max", 50))
    return rows[:limit]


def pve_rrddata(call: Call, node: str) -> list:
    info = _node(call, node)
    now = int(time.time())
    return [{"time": now - 60 * i, "cpu": info["cpu"], "maxcpu": info["maxcpu"], "memused": info["mem"],
             "memtotal": info["maxmem"], "loadavg": float(info["loadavg"][0]), "netin": 1200.5, "netout": 800.25,
             "iowait": 0.01} for i in range(5)]


def pve_certificates(call: Call, node: str) -> list:
    _node(call, node)
    notafter = int(time.time()) + call.lab.cert_days.get(node, 300) * 86400
    return [{"filename": "pve-ssl.pem", "subject": f"/CN={node}.lab", "notafter": notafter,
             "notbefore": notafter - 730 * 86400, "fingerprint": "AB:" * 31 + "AB"}]


def pve_replication(call: Call, node: str) -> list:
    _node(call, node)
    return [dict(job) for job in call.lab.replication.get(node, [])]


def pve_backup_jobs(call: Call) -> list:
    return [dict(job) for job in call.lab.backup_jobs]


def pve_backup_job(call: Call, id: str) -> dict:
    """One backup job as stored (pve-manager PVE/API2/Backup.pm `read_job`)."""
    job = next((j for j in call.lab.backup_jobs if j["id"] == id), None)
    if job is None:
        raise ApiError(400, "Parameter verification failed.", {"id": f"No such job '{id}'"})
    return dict(job)


def pve_acme_plugins(call: Call, id: str | None = None) -> list | dict:
    """ACME plugins with their stored config, `data` included (pve-manager PVE/API2/ACMEPlugin.pm)."""
    if id is None:
        return [dict(p) for p in call.lab.acme_plugins]
    plugin = next((p for p in call.lab.acme_plugins if p["plugin"] == id), None)
    if plugin is None:
        raise ApiError(500, f"ACME plugin '{id}' not defined")
    return dict(plugin)


def pve_users(call: Call) -> list:
    full = str(call.arg("full", "0")) == "1"
    return [{k: v for k, v in u.items() if full or k != "tokens"} for u in call.lab.users]


def pve_acl(call: Call) -> list:
    return [dict(entry) for entry in call.lab.acl]


def pve_firewall_options(scope: str) -> Callable:
    def handler(call: Call, node: str | None = None, vmid: str | None = None) -> dict:
        key = "cluster" if scope == "cluster" else (vmid if vmid else node)
        return {"enable": call.lab.firewall.get(key, 0), "policy_in": "DROP" if scope == "cluster" else "ACCEPT"}
    return handler


def pve_nextid(call: Call, **_: str) -> str:
    vmid = 100
    while vmid in call.lab.guests:
        vmid += 1
    return str(vmid)  # a string, though the schema says integer (docs/PROXMOX-BEHAVIOUR.md#next-free-vmid)


def pve_permissions(call: Call, **_: str) -> dict:
    return _permissions(call, int)


def pve_pools(call: Call, **_: str) -> list:
    return [{"poolid": p["poolid"], "comment": p.get("comment", "")} for name, p in call.lab.pools.items()
            if call.can(f"/pool/{name}", "Pool.Audit")]


PVE_HANDLERS: dict[tuple[str, str], Callable] = {
    ("GET", "/version"): pve_version,
    ("GET", "/cluster/status"): pve_cluster_status,
    ("GET", "/cluster/resources"): pve_cluster_resources,
    ("GET", "/cluster/nextid"): pve_nextid,
    ("GET", "/cluster/tasks"): pve_cluster_tasks,
    ("GET", "/nodes"): pve_nodes,
    ("GET", "/nodes/{node}/status"): pve_node_status,
    ("GET", "/nodes/{node}/qemu"): pve_guest_list("qemu"),
    ("GET", "/nodes/{node}/lxc"): pve_guest_list("lxc"),
    ("GET", "/nodes/{node}/qemu/{vmid}/status/current"): pve_guest_status("qemu"),
    ("GET", "/nodes/{node}/lxc/{vmid}/status/current"): pve_guest_status("lxc"),
    ("GET", "/nodes/{node}/qemu/{vmid}/config"): pve_guest_config("qemu"),
    ("GET", "/nodes/{node}/lxc/{vmid}/config"): pve_guest_config("lxc"),
    ("GET", "/nodes/{node}/qemu/{vmid}/pending"): pve_guest_pending("qemu"),
    ("GET", "/nodes/{node}/lxc/{vmid}/pending"): pve_guest_pending("lxc"),
    ("GET", "/storage"): pve_storage_list,
    ("GET", "/nodes/{node}/storage"): pve_node_storage,
    ("GET", "/nodes/{node}/tasks"): pve_tasks,
    ("GET", "/nodes/{node}/tasks/{upid}/status"): pve_task_status,
    ("GET", "/nodes/{node}/tasks/{upid}/log"): pve_task_log,
    ("GET", "/access/permissions"): pve_permissions,
    ("GET", "/pools"): pve_pools,
    ("GET", "/nodes/{node}/storage/{storage}/content"): pve_storage_content,
    ("GET", "/nodes/{node}/network"): pve_network,
    ("POST", "/nodes/{node}/vzdump"): pve_vzdump,
    ("POST", "/nodes/{node}/storage/{storage}/download-url"): pve_download_url,
    ("DELETE", "/nodes/{node}/storage/{storage}/content/{volume}"): pve_delete_volume,
    ("GET", "/nodes/{node}/lxc/{vmid}/interfaces"): pve_lxc_interfaces,
    ("GET", "/cluster/log"): pve_cluster_log,
    ("GET", "/nodes/{node}/certificates/info"): pve_certificates,
    ("GET", "/cluster/backup"): pve_backup_jobs,
    ("GET", "/cluster/backup/{id}"): pve_backup_job,
    ("GET", "/cluster/acme/plugins"): pve_acme_plugins,
    ("GET", "/cluster/acme/plugins/{id}"): pve_acme_plugins,
    ("GET", "/nodes/{node}/replication"): pve_replication,
    ("GET", "/access/users"): pve_users,
    ("GET", "/access/acl"): pve_acl,
    ("GET", "/cluster/firewall/options"): pve_firewall_options("cluster"),
    ("GET", "/nodes/{node}/firewall/options"): pve_firewall_options("node"),
    ("GET", "/nodes/{node}/qemu/{vmid}/firewall/options"): pve_firewall_options("guest"),
    ("GET", "/nodes/{node}/lxc/{vmid}/firewall/options"): pve_firewall_options("guest"),
    ("GET", "/nodes/{node}/rrddata"): pve_rrddata,
}
PVE_HANDLERS |= {("POST", "/nodes/{node}/qemu/{vmid}/agent/exec"): pve_agent_exec,
                 ("POST", "/nodes/{node}/qemu/{vmid}/agent/ping"): pve_agent_ping,
                 ("GET", "/nodes/{node}/qemu/{vmid}/agent/exec-status"): pve_agent_exec_status,
                 ("GET", "/nodes/{node}/qemu/{vmid}/agent/file-read"): pve_agent_file_read,
                 ("POST", "/nodes/{node}/qemu/{vmid}/agent/file-write"): pve_agent_file_write}
for _command in ("get-osinfo", "get-host-name", "network-get-interfaces"):
    PVE_HANDLERS[("GET", f"/nodes/{{node}}/qemu/{{vmid}}/agent/{_command}")] = pve_agent(_command)
for _kind in ("qemu", "lxc"):
    for _action in ("start", "stop", "shutdown", "reboot", "reset", "suspend", "resume"):
        if _kind == "lxc" and _action == "reset":
            continue  # containers have no reset
        PVE_HANDLERS[("POST", f"/nodes/{{node}}/{_kind}/{{vmid}}/status/{_action}")] = pve_power(_kind, _action)
    PVE_HANDLERS[("GET", f"/nodes/{{node}}/{_kind}/{{vmid}}/snapshot")] = pve_snapshots(_kind)
    PVE_HANDLERS[("POST", f"/nodes/{{node}}/{_kind}/{{vmid}}/snapshot")] = pve_snapshot_create(_kind)
    PVE_HANDLERS[("DELETE", f"/nodes/{{node}}/{_kind}/{{vmid}}/snapshot/{{snapname}}")] = pve_snapshot_delete(_kind)
    PVE_HANDLERS[("POST", f"/nodes/{{node}}/{_kind}/{{vmid}}/snapshot/{{snapname}}/rollback")] = pve_rollback(_kind)
    PVE_HANDLERS[("PUT", f"/nodes/{{node}}/{_kind}/{{vmid}}/config")] = pve_config_update(_kind)
    PVE_HANDLERS[("PUT", f"/nodes/{{node}}/{_kind}/{{vmid}}/resize")] = pve_resize(_kind)
    PVE_HANDLERS[("POST", f"/nodes/{{node}}/{_kind}")] = pve_create(_kind)
    PVE_HANDLERS[("POST", f"/nodes/{{node}}/{_kind}/{{vmid}}/clone")] = pve_clone(_kind)
    PVE_HANDLERS[("POST", f"/nodes/{{node}}/{_kind}/{{vmid}}/migrate")] = pve_migrate(_kind)
    PVE_HANDLERS[("POST", f"/nodes/{{node}}/{_kind}/{{vmid}}/template")] = pve_template(_kind)
    PVE_HANDLERS[("DELETE", f"/nodes/{{node}}/{_kind}/{{vmid}}")] = pve_destroy(_kind)

