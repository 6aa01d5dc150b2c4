"""Proxmox VE: the handlers for the cluster, nodes, storage, networks and tasks, and
`PVE_HANDLERS`, the table from (METHOD, path template) to handler (the guest handlers
come from `pve_guests.py`).

A handler gets the `Call` and the path parameters by name; it returns the `data` of the
answer or raises `ApiError`. Paths without a handler get an empty answer of the schema's
type from `api.generic`.
"""
from __future__ import annotations

import re
import time
from typing import Callable

from .call import ApiError, Call, _guest, _node, _permissions
from .file_restore import PVE_FILE_HANDLERS
from .lab import GiB, Task, size_bytes
from .pve_history import pve_extractconfig, pve_snapshot_config
from .pve_backup import pve_vzdump, visible_volume
from .pve_backup_jobs import BACKUP_JOB_HANDLERS
from .pve_cloudinit import PVE_CLOUDINIT_HANDLERS
from .pve_firewall import FIREWALL_HANDLERS
from .pve_guests import (pve_agent, pve_agent_exec, pve_agent_exec_status, pve_agent_file_read, pve_agent_file_write,
                         pve_agent_ping, pve_clone, pve_config_update, pve_create, pve_destroy, pve_guest_config,
                         pve_guest_pending, pve_lxc_interfaces, pve_migrate, pve_power, pve_resize, pve_rollback,
                         pve_snapshot_create, pve_snapshot_delete, pve_snapshots, pve_template)
from .pve_ha_manager import pve_ha_resource_update
from .pve_monitor import MONITOR_HANDLERS, monitor
from .pve_node_power import NODE_POWER_HANDLERS
from .pve_templates import PVE_TEMPLATE_HANDLERS


# ---------------------------------------------------------------- PVE handlers

# pve-manager version, release, by major; 7 stands for 7.2, before the task log's limit=0 meant all
PVE_VERSIONS = {7: ("7.2-11", "7.2"), 8: ("8.4.14", "8.4"), 9: ("9.2.1", "9.2")}


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
    for key in ("tags", "lock"):  # only when set (docs/PROXMOX-BEHAVIOUR.md#cluster-resources)
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
            # `pool` only with Pool.Audit on it (pve-manager PVE/API2/Cluster.pm resources)
            if guest.get("pool") and call.can(f"/pool/{guest['pool']}", "Pool.Audit"):
                row["pool"] = guest["pool"]
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
                row["cpus"] = row.pop("maxcpu")  # vmstatus names it cpus (docs/PROXMOX-BEHAVIOUR.md#guest-status)
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
        row["cpus"] = row.pop("maxcpu")  # vmstatus names it cpus (docs/PROXMOX-BEHAVIOUR.md#guest-status)
        if kind == "qemu":
            row["qmpstatus"] = "paused" if guest["paused"] else guest["status"]
        if kind == "qemu" and guest["config"].get("agent"):
            row["agent"] = 1
        row["ha"] = {"managed": 1, "state": guest["ha"]["state"]} if guest.get("ha") else {"managed": 0}
        return row
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
            rows.append(_storage_status(call, node, storage) | {"storage": storage["storage"]})
    return rows


def _storage_status(call: Call, node: str, storage: dict) -> dict:
    """A storage as PVE::Storage::storage_info answers it on a node: its space only while active."""
    row = {"type": storage["type"], "content": storage["content"], "shared": storage["shared"], "active": 0,
           "enabled": 1}
    if (node, storage["storage"]) not in call.lab.offline_storages:
        row |= {"active": 1, "total": storage["total"], "used": storage["used"],
                "avail": storage["total"] - storage["used"],
                "used_fraction": round(storage["used"] / storage["total"], 4)}
    return row


def pve_storage_status(call: Call, node: str, storage: str) -> dict:
    """One storage's status on a node (pve-storage PVE/API2/Storage/Status.pm read_status: the
    storage_info row, "No such storage." for one the node does not have; the permission check is the
    schema's: Datastore.Audit or Datastore.AllocateSpace on /storage/{storage})."""
    _node(call, node)
    found = call.lab.storages.get(storage)
    if found is None or node not in call.lab.storage_nodes(found):
        raise ApiError(400, "Parameter verification failed.", {"storage": "No such storage."})
    return {k: v for k, v in _storage_status(call, node, found).items() if k != "used_fraction"}


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
    if not limit and call.lab.pve_major < 8:  # limit=0 means all since pve-common 7.3 (Nov 2022); before: none
        return []
    return rows[start:start + limit] if limit else rows[start:]


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
    # a caller sees only what check_volume_access lets it (docs/PROXMOX-BEHAVIOUR.md#who-sees-which-volume)
    return [{k: val for k, val in v.items() if not k.startswith("_")} for v in rows  # _node, _oci: the lab's own
            if (content is None or v["content"] == content) and (vmid is None or v.get("vmid") == int(vmid))
            and visible_volume(call, storage, v)]


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
    # bridges only to callers with SDN.Audit or SDN.Use on them (docs/PROXMOX-BEHAVIOUR.md#networks); a
    # bridge only in the pending configuration (interfaces.new) comes without `active`
    rows = [r for r in rows if r["type"] not in ("bridge", "OVSBridge") or _bridge_visible(call, r["iface"])]
    return [{k: v for k, v in row.items() if v is not None} for row in rows]


def _bridge_visible(call: Call, bridge: str) -> bool:
    """pve-manager PVE/API2/Network.pm $can_access_vnet: root@pam, or SDN.Audit or SDN.Use on
    /sdn/zones/localnetwork/<bridge> (pve-access-control RPCEnvironment.pm check_sdn_bridge)."""
    path = f"/sdn/zones/localnetwork/{bridge}"
    return call.token_id == "root@pam" or call.can(path, "SDN.Audit") or call.can(path, "SDN.Use")



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


def pve_volume(call: Call, node: str, storage: str, volume: str) -> dict:
    """GET .../content/{volume}: a volume's format, path, size and (backups) notes and protection, to
    a caller with read access to it (pve-storage API2/Storage/Content.pm `info`: check_volume_access).
    A guest's disk is found in its config (an unusedN entry's size is the size it had when attached)."""
    _node(call, node)
    volid = volume if ":" in volume else f"{storage}:{volume}"
    found = next((v for v in call.lab.volumes.get(storage, []) if v["volid"] == volid), None)
    for guest in call.lab.guests.values() if found is None else ():
        for value in (v for v in guest["config"].values() if isinstance(v, str) and v.split(",")[0] == volid):
            found = {"volid": volid, "vmid": guest["vmid"], "format": "raw",
                     "content": "images" if guest["type"] == "qemu" else "rootdir",
                     "size": size_bytes(value) or guest.get("detached", {}).get(volid, 0)}
    if found is None:
        raise ApiError(500, f"unable to parse volume ID '{volid}'" if ":" not in volid else
                       f"volume '{volid}' does not exist")
    if not visible_volume(call, storage, found):
        raise ApiError(403, f"Permission check failed (/storage/{storage}, Datastore.Audit)")
    return {"format": found.get("format", "raw"), "path": f"/var/lib/vz/{volid.split(':', 1)[1]}",
            "size": found["size"], "used": found["size"]} | {
        k: found[k] for k in ("notes", "protected") if k in found}


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


def pve_cluster_log(call: Call) -> list:
    now = int(time.time())
    rows = [{"n": i + 1, "time": now - 600 * i, "node": node, "pid": 1000 + i, "user": "root@pam", "tag": "pvedaemon",
             "pri": 6, "uid": f"{i:08X}", "msg": f"<root@pam> end task {task.upid} {task.exitstatus}"}
            for i, (node, task) in enumerate((t.node, t) for t in call.lab.tasks.values())]
    limit = int(call.arg("max", 50))
    return rows[:limit]


def pve_certificates(call: Call, node: str) -> list:
    """The cluster CA, the node's pve-ssl.pem and, when one is installed, pveproxy-ssl.pem (custom
    or ACME) (pve-manager PVE/API2/Certificates.pm, info)."""
    _node(call, node)
    now = int(time.time())

    def cert(filename: str, days: float, lifetime: int, issuer: str) -> dict:
        return {"filename": filename, "subject": f"/CN={node}.lab" if filename != "pve-root-ca.pem" else
                "/CN=Proxmox Virtual Environment", "issuer": issuer, "notafter": int(now + days * 86400),
                "notbefore": int(now + days * 86400) - lifetime * 86400, "fingerprint": "AB:" * 31 + "AB"}
    ca = "/CN=Proxmox Virtual Environment"
    certs = [cert("pve-root-ca.pem", 3000, 3650, ca), cert("pve-ssl.pem", call.lab.cert_days.get(node, 300), 730, ca)]
    proxy_days = monitor(call.lab).proxy_certs.get(node)
    if proxy_days is not None:
        certs.append(cert("pveproxy-ssl.pem", proxy_days, 90, "/C=US/O=Let's Encrypt/CN=R11"))
    return certs


def pve_replication(call: Call, node: str) -> list:
    _node(call, node)
    return [dict(job) for job in call.lab.replication.get(node, [])]


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


def pve_nextid(call: Call, **_: str) -> str:
    vmid = 100
    while vmid in call.lab.guests:
        vmid += 1
    return str(vmid)  # a string, though the schema says integer (docs/PROXMOX-BEHAVIOUR.md#next-free-vmid)


def pve_permissions(call: Call, **_: str) -> dict:
    return _permissions(call, int)


def pve_pools(call: Call, **_: str) -> list:
    """GET /pools: the pools the caller may audit; with `poolid` that pool with its members (pve-manager
    PVE/API2/Pool.pm `index`: the guests of the pool that exist, as extract_vm_stats gives them)."""
    poolid = call.arg("poolid")
    if poolid is None:
        return [{"poolid": p["poolid"], "comment": p.get("comment", "")} for name, p in call.lab.pools.items()
                if call.can(f"/pool/{name}", "Pool.Audit")]
    if poolid not in call.lab.pools:
        raise ApiError(500, f"pool '{poolid}' does not exist")
    wanted = call.arg("type")
    members = [_guest_row(g) for _, g in sorted(call.lab.guests.items())
               if g.get("pool") == poolid and wanted in (None, g["type"])]
    return [{"poolid": poolid, "comment": call.lab.pools[poolid].get("comment", ""), "members": members}]


def pve_pool(call: Call, poolid: str) -> dict:
    """GET /pools/{poolid} (deprecated, the same as /pools?poolid=; Pool.pm `read_pool`)."""
    call.params = dict(call.params) | {"poolid": poolid}
    return pve_pools(call)[0]


def pve_pool_update(call: Call, poolid: str | None = None) -> None:
    """PUT /pools (and /pools/{poolid}): the listed guests added, or with `delete` removed; a guest in
    another pool moves only with `allow-move` (Pool.pm `update_pool`)."""
    poolid = poolid or call.arg("poolid")
    if poolid not in call.lab.pools:
        raise ApiError(500, f"update pools failed: pool '{poolid}' does not exist")
    if call.arg("comment") is not None:
        call.lab.pools[poolid]["comment"] = call.arg("comment")
    for vmid in (int(v) for v in re.split(r"[,;\s]+", str(call.arg("vms") or "")) if v):
        guest = call.lab.guests.get(vmid)
        if str(call.arg("delete", "0")) == "1":
            if guest is None or guest.get("pool") != poolid:
                raise ApiError(500, f"update pools failed: VM {vmid} is not a pool member")
            guest["pool"] = None
        elif guest is not None and guest.get("pool") == poolid:
            raise ApiError(500, f"update pools failed: VM {vmid} is already a pool member")
        elif guest is not None and guest.get("pool") and str(call.arg("allow-move", "0")) != "1":
            raise ApiError(500, f"update pools failed: VM {vmid} belongs already to pool '{guest['pool']}' and "
                                f"'allow-move' is not set")
        elif guest is not None:
            guest["pool"] = poolid


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
    ("GET", "/nodes/{node}/storage/{storage}/status"): pve_storage_status,
    ("GET", "/nodes/{node}/tasks"): pve_tasks,
    ("GET", "/nodes/{node}/tasks/{upid}/status"): pve_task_status,
    ("GET", "/nodes/{node}/tasks/{upid}/log"): pve_task_log,
    ("GET", "/access/permissions"): pve_permissions,
    ("GET", "/pools"): pve_pools,
    ("GET", "/pools/{poolid}"): pve_pool,
    ("PUT", "/pools"): pve_pool_update,
    ("PUT", "/pools/{poolid}"): pve_pool_update,
    ("GET", "/nodes/{node}/storage/{storage}/content"): pve_storage_content,
    ("GET", "/nodes/{node}/network"): pve_network,
    ("POST", "/nodes/{node}/vzdump"): pve_vzdump,
    ("POST", "/nodes/{node}/storage/{storage}/download-url"): pve_download_url,
    ("DELETE", "/nodes/{node}/storage/{storage}/content/{volume}"): pve_delete_volume,
    ("GET", "/nodes/{node}/storage/{storage}/content/{volume}"): pve_volume,
    ("GET", "/nodes/{node}/lxc/{vmid}/interfaces"): pve_lxc_interfaces,
    ("GET", "/cluster/log"): pve_cluster_log,
    ("GET", "/nodes/{node}/certificates/info"): pve_certificates,
    ("GET", "/nodes/{node}/vzdump/extractconfig"): pve_extractconfig,
    ("GET", "/cluster/acme/plugins"): pve_acme_plugins,
    ("GET", "/cluster/acme/plugins/{id}"): pve_acme_plugins,
    ("GET", "/nodes/{node}/replication"): pve_replication,
    ("GET", "/access/users"): pve_users,
    ("GET", "/access/acl"): pve_acl,
    ("PUT", "/cluster/ha/resources/{sid}"): pve_ha_resource_update,
}
PVE_HANDLERS |= PVE_TEMPLATE_HANDLERS | PVE_CLOUDINIT_HANDLERS | PVE_FILE_HANDLERS
PVE_HANDLERS |= FIREWALL_HANDLERS | BACKUP_JOB_HANDLERS | NODE_POWER_HANDLERS
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
    PVE_HANDLERS[("GET", f"/nodes/{{node}}/{_kind}/{{vmid}}/snapshot/{{snapname}}/config")] = pve_snapshot_config(_kind)
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
PVE_HANDLERS |= MONITOR_HANDLERS  # metrics, logs, disks, packages, the node's clock (pve_monitor.py)
