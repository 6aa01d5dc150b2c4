"""Proxmox VE tools: inventory, guests, storage and tasks.

Each tool is a plain function that returns a dict; server.py registers them, encodes the
answer as compact JSON and turns a ToolFailure into a tool error. Lists come as
{"columns": [...], "rows": [[...], ...]} to keep answers small (answers.py); guests, nodes
and storages are looked up by inventory.py.
"""
import re
import time
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context
from pydantic import Field

import policy
from answers import (ConfirmArg, DryRunArg, Host, Limit, Node, Offset, OptionalVmid, Vmid, Volid,
                     WaitArg, compact, human_bytes, human_duration, iso_time, percent, table)
from config_diff import config_and_pending
from errors import InvalidArgument, ProxmoxError, TaskFailed
from inventory import (HA_FAILED, VOLUME_KEY, archive_node, backup_storages, backup_volumes, bridges, bridges_hidden,
                       check_bridge, check_node, disk_size, existing_snapshot, free_vmid, guest_path, guest_resources,
                       ha_failure, node_names, resolve_guest, storage_node, storage_rows, storages_on,
                       volume_storages)
from proxmox_client import ProxmoxClient, agent_result, client_for, encode_params, poll, pve_client, task_outcome
from tasks import TASK_GOING, log_page, run_task, task_report, upid_product

EMPTY_HINT = ("Nothing visible. A privilege-separated API token holds only what both it and its user are "
              "granted, and sees empty lists without: grant the role (e.g. PVEAuditor on /) to the user and the "
              "token, or check server_info.")


# ---------------------------------------------------------------- tools

def cluster_status(host: Host = None) -> dict:
    """Quorum, nodes online."""
    client = pve_client(host)
    entries = client.get("/cluster/status") or []
    cluster = next((e for e in entries if e.get("type") == "cluster"), None)
    nodes = [compact({"node": e["name"], "online": bool(e.get("online")), "ip": e.get("ip"),
                      "local": bool(e.get("local")) or None})
             for e in entries if e.get("type") == "node"]
    result = {"cluster": cluster["name"] if cluster else None, "standalone": cluster is None,
              "quorate": bool(cluster["quorate"]) if cluster else True, "nodes": nodes}
    offline = [n["node"] for n in nodes if not n["online"]]
    if offline:
        result["offline"] = offline
    return compact(result) | {"standalone": cluster is None, "quorate": result["quorate"]}


def list_nodes(host: Host = None) -> dict:
    """Status, CPU, memory, uptime."""
    client = pve_client(host)
    rows = []
    for node in sorted(client.get("/nodes") or [], key=lambda n: n["node"]):
        rows.append({"node": node["node"], "status": node.get("status"),
                     # maxcpu counts logical CPUs, threads (docs/PROXMOX-BEHAVIOUR.md#guest-status)
                     "cpu_pct": percent(node.get("cpu"), 1), "cpus": node.get("maxcpu"),
                     "mem_used": human_bytes(node.get("mem")), "mem_total": human_bytes(node.get("maxmem")),
                     "mem_pct": percent(node.get("mem"), node.get("maxmem")),
                     "uptime": human_duration(node.get("uptime"))})
    result = table(["node", "status", "cpu_pct", "cpus", "mem_used", "mem_total", "mem_pct", "uptime"], rows)
    if rows and all(r["cpus"] is None for r in rows if r["status"] == "online"):
        result["note"] = "No usage figures: the token lacks Sys.Audit on /nodes."
    return result


# a guest row's status; unknown: no status data for it (docs/PROXMOX-BEHAVIOUR.md#cluster-resources)
GuestStatus = Literal["running", "stopped", "unknown", "locked"]  # locked: any guest with a lock


def guest_tags(guest: dict) -> set[str]:
    """A guest's tags as PVE reads them: split on `;`, `,` and spaces, compared in lower case
    (docs/PROXMOX-BEHAVIOUR.md#tags)."""
    return {tag.lower() for tag in re.split(r"[;,\s]+", guest.get("tags") or "") if tag}


def _guest_filters(node: str | None, type: str | None, status: str | None, tag: str | None,
                   name: str | None) -> dict[str, Any]:
    """Each filter given, as `name=value` and the test a guest must pass."""
    tests = {"node": (node, lambda g: g.get("node") == node), "type": (type, lambda g: g.get("type") == type),
             "status": (status, lambda g: bool(g.get("lock")) if status == "locked" else g.get("status") == status),
             "tag": (tag, lambda g: tag.lower() in guest_tags(g)),
             "name": (name, lambda g: name.lower() in (g.get("name") or "").lower())}
    return {f"{key}={value}": test for key, (value, test) in tests.items() if value}


def _no_match(client: ProxmoxClient, guests: list[dict], filters: dict[str, Any], node: str | None,
              tag: str | None) -> str:
    """Why no guest matched: an unknown node is an error (with the node names); a filter that alone
    matches no guest says which values are in use; else the combination is what matches nothing."""
    if not guests:
        return EMPTY_HINT
    if node and not any(g.get("node") == node for g in guests):
        check_node(client, node)  # raises for a node the cluster does not have
    alone = [f for f, test in filters.items() if not any(test(g) for g in guests)]
    if not alone:
        return f"No guest matches {', '.join(filters)} together, though each alone matches some."
    key = alone[0].split("=", 1)[0]
    values = sorted({t for g in guests for t in guest_tags(g)}) if key == "tag" \
        else sorted({str(g.get(key)) for g in guests if g.get(key)})
    what = f"tag '{tag}'" if key == "tag" else alone[0]
    kind = "statuses" if key == "status" else f"{key}s"
    return f"No guest has {what}; {kind} in use: {', '.join(values[:30]) or 'none'}."


def list_guests(host: Host = None,
                node: Node = None,
                type: Literal["qemu", "lxc"] | None = None,
                status: GuestStatus | None = None,
                tag: str | None = None,
                name: str | None = None,
                sort_by: Literal["cpu", "mem", "disk", "netin", "netout"] | None = None,
                limit: Limit = 50, offset: Offset = 0) -> dict:
    """VMs and CTs: vmid, name, node, status, tags."""
    client = pve_client(host)
    guests = sorted(guest_resources(client, fresh=True), key=lambda g: g["vmid"])
    filters = _guest_filters(node, type, status, tag, name)
    protected = policy.settings().protected
    rows = []
    if sort_by:  # busiest first; disk by the allocated size, as a VM reports no use (SORT_KEYS)
        guests.sort(key=lambda g: -(g.get(SORT_KEYS.get(sort_by, sort_by)) or 0))
    for guest in guests:
        if not all(test(guest) for test in filters.values()):
            continue
        listed = protected.find(client.host.label, guest["vmid"], "pve")
        rows.append({"vmid": guest["vmid"], "name": guest.get("name"), "type": guest.get("type"),
                     "node": guest.get("node"), "status": guest.get("status"),
                     "maxmem": human_bytes(guest.get("maxmem")), "tags": guest.get("tags") or None,
                     "lock": guest.get("lock"), "template": 1 if guest.get("template") else None,
                     "protected": (listed.get("reason") or "yes") if listed else None}
                    | _usage(guest, sort_by))
    columns = ["vmid", "name", "type", "node", "status", "maxmem", "tags"] + list(_usage({}, sort_by))
    for optional in ("lock", "template", "protected"):
        if any(r[optional] for r in rows):
            columns.append(optional)
    result = table(columns, rows, limit=limit, offset=offset)
    if not rows:
        result["note"] = _no_match(client, guests, filters, node, tag) if filters else EMPTY_HINT
    elif sort_by in SORT_NOTES:
        result["note"] = SORT_NOTES[sort_by]
    return result


# A VM's `disk` is always 0 in PVE's status and a stopped container's too, so disk ranks by the
# allocated size (docs/PROXMOX-BEHAVIOUR.md#guest-status).
SORT_KEYS = {"disk": "maxdisk"}
SORT_NOTES = {
    "netin": "netin: bytes since each guest started; metrics gives the rate over time.",
    "netout": "netout: bytes since each guest started; metrics gives the rate over time.",
    "disk": "disk: ranked by allocated size (a VM's boot disk, a container's root disk): Proxmox reports a VM's "
            "disk use as always 0 (QEMU cannot see inside), and a container's only while it runs."}


def _usage(guest: dict, sort_by: str | None) -> dict:
    """The column list_guests sorts by: CPU as a share of the guest's cores, disk as allocated (and
    used, where PVE reports it), the rest in bytes (/cluster/resources: docs/PROXMOX-BEHAVIOUR.md#cluster-resources)."""
    if not sort_by:
        return {}
    if sort_by == "cpu":
        return {"cpu_pct": percent(guest.get("cpu"), 1)}
    if sort_by == "disk":
        used = guest.get("disk") if guest.get("type") == "lxc" and guest.get("status") == "running" else None
        return {"disk": f"{human_bytes(used)} used of {human_bytes(guest.get('maxdisk'))}" if used
                else f"{human_bytes(guest.get('maxdisk'))} allocated"}
    return {sort_by: human_bytes(guest.get(sort_by))}


GUEST_STATUS_FIELDS = ("status", "qmpstatus", "lock", "cpus", "uptime", "ha", "agent", "pid", "tags",
                       "running-qemu", "running-machine")
PAUSED = ("paused", "suspended", "prelaunch")  # qmpstatus of a VM that is `running` but not running


def get_guest(vmid: Vmid, host: Host = None) -> dict:
    """Status, config, pending changes, snapshots."""
    client = pve_client(host)
    row = resolve_guest(client, vmid)
    base = f"/nodes/{row['node']}/{row['type']}/{vmid}"
    status = client.get(f"{base}/status/current") or {}
    config, pending = config_and_pending(client.get(f"{base}/pending") or [])
    snapshots = _snapshots(client, base)
    summary = {key: status.get(key) for key in GUEST_STATUS_FIELDS if key in status}
    if not (status.get("ha") or {}).get("managed"):
        summary.pop("ha", None)  # every guest has one; only an HA resource's says something
    summary |= {"vmid": vmid, "name": status.get("name") or row.get("name"), "type": row["type"],
                "node": row["node"], "uptime": human_duration(status.get("uptime")),
                "paused": True if status.get("qmpstatus") in PAUSED else None,
                "cpu_pct": percent(status.get("cpu"), 1),
                # bytes readable under the name, exact as name_bytes (docs/CONVENTIONS.md)
                "mem_used": human_bytes(status.get("mem")), "mem_used_bytes": status.get("mem"),
                "maxmem": human_bytes(status.get("maxmem")), "maxmem_bytes": status.get("maxmem"),
                "maxdisk": human_bytes(status.get("maxdisk")), "maxdisk_bytes": status.get("maxdisk")}
    listed = policy.settings().protected.find(client.host.label, vmid, "pve")
    if listed:  # on the protected list: no request that changes it is admitted
        summary["protected"] = listed.get("reason") or "yes"
    return compact(summary) | {"config": config} | ({"pending": pending} if pending else {}) | \
        ({"snapshots": snapshots} if snapshots["rows"] else {})


def list_storage(host: Host = None, node: Node = None) -> dict:
    """Type, content, use, fill %."""
    client = pve_client(host)
    merged: dict[str, dict] = {}
    for entry in client.get("/cluster/resources", type="storage") or []:
        if node and entry.get("node") != node:
            continue
        key = entry["storage"] if entry.get("shared") else f"{entry['node']}/{entry['storage']}"
        row = merged.setdefault(key, {
            "storage": entry["storage"], "node": "(shared)" if entry.get("shared") else entry.get("node"),
            "type": entry.get("plugintype"), "content": entry.get("content"), "status": entry.get("status"),
            "used": human_bytes(entry.get("disk")), "total": human_bytes(entry.get("maxdisk")),
            "used_pct": percent(entry.get("disk"), entry.get("maxdisk"))})
        if entry.get("status") != "available":
            row["status"] = entry.get("status")
    rows = sorted(merged.values(), key=lambda r: (r["node"], r["storage"]))
    result = table(["storage", "node", "type", "content", "status", "used", "total", "used_pct"], rows)
    if not rows:
        result["note"] = EMPTY_HINT
    return result


def _task_row(task: dict) -> dict:
    # a running task has no status in /cluster/tasks and RUNNING in a node's list; `user` comes
    # without the token, `tokenid` apart (docs/PROXMOX-BEHAVIOUR.md#pve-tasks)
    status = task.get("status")
    if "endtime" not in task and status in (None, "running", "RUNNING"):
        status = "running"
    user = task.get("user")
    if user and task.get("tokenid"):
        user = f"{user}!{task['tokenid']}"
    return {"upid": task["upid"], "node": task.get("node"), "type": task.get("type"), "id": task.get("id") or None,
            "user": user, "start": iso_time(task.get("starttime")), "status": status,
            "duration": human_duration((task.get("endtime") or 0) - task.get("starttime", 0))
            if task.get("endtime") else None}


def list_tasks(host: Host = None,
               node: Node = None,
               vmid: OptionalVmid = None,
               errors: bool = False,
               running: bool = False,
               limit: Annotated[int, Field(ge=1, le=500)] = 20) -> dict:
    """Newest first, with result."""
    client = pve_client(host)
    tasks = _listed_tasks(client, node, vmid, errors and not running, running, limit)
    rows = [_task_row(t) for t in sorted(tasks, key=lambda t: -t.get("starttime", 0))]
    rows = [r for r in rows if (vmid is None or r["id"] == str(vmid))
            and (not errors or r["status"] != "running" and task_outcome(r["status"]) in ("failed", "unknown"))
            and (not running or r["status"] == "running")]
    return table(["upid", "node", "type", "id", "user", "start", "status", "duration"], rows, limit=limit)


def _listed_tasks(client: ProxmoxClient, node: str | None, vmid: int | None, failed: bool, running: bool,
                  limit: int) -> list[dict]:
    """limit=0 lists nothing here; running tasks come from source=active, finished ones from the archive.
    Failures are picked by statusfilter, before the limit: errors=1 keeps warnings, which are no failure, so
    a page of them came back empty; and /cluster/tasks holds only each node's recent tasks, so failures are
    read from every online node (docs/PROXMOX-BEHAVIOUR.md#pve-tasks)."""
    if not node and not failed:
        return client.get("/cluster/tasks") or []
    where = {"source": "archive", "statusfilter": "error,unknown"} if failed else \
        {"source": "active" if running else "all"}
    nodes = [node] if node else [n["node"] for n in client.get("/nodes") or [] if n.get("status") == "online"]
    return [task for name in nodes
            for task in client.get(f"/nodes/{name}/tasks", limit=limit, vmid=vmid, **where) or []]


def get_task(upid: str,
             host: Host = None,
             wait_seconds: Annotated[int, Field(ge=0, le=3600)] = 0,
             log_lines: Annotated[int, Field(ge=0, le=500)] = 20,
             start: Annotated[int | None, Field(ge=0)] = None,
             ctx: Context | None = None) -> dict:
    """PVE or PBS: result, log (last log_lines, or from start)."""
    client = client_for(upid_product(upid), host)
    report = task_report(client, upid, wait_seconds, 0 if start is not None else log_lines, ctx, "get_task")
    if start is None:
        return report
    return report | log_page(client, upid, start, log_lines or 100)


# ================================================================ more reads

def node_status(node: str, host: Host = None,
                timeframe: Literal["hour", "day", "week", "month", "year"] | None = None) -> dict:
    """Load, CPU, memory, disk, versions; timeframe adds RRD averages."""
    client = pve_client(host)
    check_node(client, node)
    status = client.get(f"/nodes/{node}/status") or {}
    memory, rootfs = status.get("memory") or {}, status.get("rootfs") or {}
    result = compact({"node": node, "version": status.get("pveversion"), "kernel": status.get("kversion"),
                      "uptime": human_duration(status.get("uptime")), "loadavg": status.get("loadavg"),
                      "cpu_pct": percent(status.get("cpu"), 1), "cpus": (status.get("cpuinfo") or {}).get("cpus"),
                      "cpu_model": (status.get("cpuinfo") or {}).get("model"),
                      "mem_used": human_bytes(memory.get("used")), "mem_total": human_bytes(memory.get("total")),
                      "mem_pct": percent(memory.get("used"), memory.get("total")),
                      "rootfs_used": human_bytes(rootfs.get("used")), "rootfs_total": human_bytes(rootfs.get("total")),
                      "rootfs_pct": percent(rootfs.get("used"), rootfs.get("total"))})
    if timeframe:
        points = client.get(f"/nodes/{node}/rrddata", timeframe=timeframe, cf="AVERAGE") or []
        def mean(key: str) -> float | None:
            values = [p[key] for p in points if isinstance(p.get(key), (int, float))]
            return sum(values) / len(values) if values else None
        result["rrd"] = compact({"timeframe": timeframe, "points": len(points), "cpu_pct": percent(mean("cpu"), 1),
                                 "mem_used": human_bytes(mean("memused")), "load": round(mean("loadavg") or 0, 2),
                                 # RRD netin/netout are bytes per second (docs/PROXMOX-BEHAVIOUR.md#guest-status)
                                 "net_in": f"{human_bytes(mean('netin') or 0)}/s",
                                 "net_out": f"{human_bytes(mean('netout') or 0)}/s",
                                 "iowait_pct": percent(mean("iowait"), 1)})
    return result


def guest_config(vmid: Vmid, host: Host = None,
                 snapshot: str | None = None) -> dict:
    """Full config, digest."""
    client = pve_client(host)
    base, row = guest_path(client, vmid)
    config = client.get(f"{base}/config", snapshot=snapshot) or {}
    return {"vmid": vmid, "type": row["type"], "node": row["node"], "config": config}


def _snapshots(client: ProxmoxClient, base: str) -> dict:
    """A guest's snapshots: time, parent, RAM saved (the list's `current` is the running state, no snapshot)."""
    rows = [{"name": s["name"], "time": iso_time(s.get("snaptime")), "parent": s.get("parent"),
             "vmstate": 1 if s.get("vmstate") else None, "description": (s.get("description") or "").strip() or None}
            for s in client.get(f"{base}/snapshot") or [] if s["name"] != "current"]
    return table(["name", "time", "parent", "vmstate", "description"], rows)


def list_backups(host: Host = None, vmid: OptionalVmid = None,
                 storage: str | None = None,
                 limit: Limit = 100) -> dict:
    """On all storages, newest first."""
    rows, notes = backup_volumes(pve_client(host), vmid, storage)
    return table(["volid", "vmid", "storage", "node", "size", "time", "notes", "protected", "verify"], rows,
                 limit=limit) | notes


StorageContent = Literal["images", "rootdir", "iso", "vztmpl", "backup", "snippets", "import"]


def storage_content(storage: str, host: Host = None,
                    node: Node = None,
                    content: StorageContent | None = None,
                    vmid: OptionalVmid = None,
                    limit: Limit = 100) -> dict:
    """ISOs, templates, disks, backups."""
    client = pve_client(host)
    asked = node
    node = storage_node(client, storage, node)
    rows = [{"volid": v["volid"], "content": v.get("content"), "format": v.get("format"),
             "size": human_bytes(v.get("size")), "vmid": v.get("vmid"), "time": iso_time(v.get("ctime"))}
            for v in client.get(f"/nodes/{node}/storage/{storage}/content", content=content, vmid=vmid) or []]
    result = table(["volid", "content", "format", "size", "vmid", "time"], rows, limit=limit)
    places = [r["node"] for r in storage_rows(client) if r.get("storage") == storage and not r.get("shared")]
    if places:  # each node's copy is its own disk (docs/PROXMOX-BEHAVIOUR.md#per-node-storages)
        result["node"] = node
        others = [n for n in places if n != node]
        if others and not asked:
            result["note"] = (f"'{storage}' is local to each node; this is {node}'s. Give node= for "
                              f"{', '.join(others)}.")
    return result


def list_networks(host: Host = None, node: Node = None) -> dict:
    """Bridges, vnets: uplinked, routed, isolated."""
    client = pve_client(host)
    if node:
        rows, not_read = bridges(client, check_node(client, node)), []
    else:  # a node that is down must not hide the others' networks
        rows, not_read = [], []
        for name in node_names(client):
            try:
                rows += bridges(client, name)
            except ProxmoxError as exc:
                not_read.append(str(exc)[:200])
    columns = ["node", "bridge", "segment", "uplink", "vlan_aware", "cidr", "gateway", "comment"]
    result = table(columns + (["pending"] if any(r["pending"] for r in rows) else []),
                   [r | {"pending": r["pending"] or None} for r in rows])
    if not_read:
        result["not_read"] = not_read
    if not any(r["segment"] != "sdn-vnet" for r in rows) and bridges_hidden(client):
        result["note"] = bridges_hidden(client)
    return result


def list_pools(host: Host = None) -> dict:
    """With their guests."""
    client = pve_client(host)
    members: dict[str, list[int]] = {}
    for guest in guest_resources(client, fresh=True):
        if guest.get("pool"):
            members.setdefault(guest["pool"], []).append(guest["vmid"])
    rows = [{"pool": p["poolid"], "comment": p.get("comment") or None, "guests": sorted(members.get(p["poolid"], []))}
            for p in client.get("/pools") or []]
    return table(["pool", "comment", "guests"], rows)


def cluster_log(host: Host = None, limit: Annotated[int, Field(ge=1, le=500)] = 50) -> dict:
    """Newest first."""
    client = pve_client(host)
    rows = [{"time": iso_time(e.get("time")), "node": e.get("node"), "user": e.get("user"), "tag": e.get("tag"),
             "msg": (e.get("msg") or "")[:300]} for e in client.get("/cluster/log", max=limit) or []]
    return table(["time", "node", "user", "tag", "msg"], rows)


def guest_agent_info(vmid: Vmid, host: Host = None) -> dict:
    """OS, hostname, IPs."""
    client = pve_client(host)
    base, row = guest_path(client, vmid)
    if row["type"] == "lxc":
        addresses = [compact({"iface": i["name"], "ipv4": i.get("inet"), "ipv6": i.get("inet6")})
                     for i in client.get(f"{base}/interfaces") or [] if i["name"] != "lo"]
        return {"vmid": vmid, "type": "lxc", "hostname": row.get("name"), "interfaces": addresses}
    answers, errors = {}, {}
    for command in ("get-osinfo", "get-host-name", "network-get-interfaces"):
        answers[command], error = agent_result(client.get(f"{base}/agent/{command}"))
        if error:
            errors[command] = error
    osinfo = answers["get-osinfo"] or {}
    interfaces = []
    for iface in answers["network-get-interfaces"] or []:
        if iface.get("name") == "lo":
            continue
        ips = [f"{a['ip-address']}/{a.get('prefix')}" for a in iface.get("ip-addresses", [])]
        interfaces.append(compact({"iface": iface.get("name"), "mac": iface.get("hardware-address"), "ips": ips}))
    hostname = (answers["get-host-name"] or {}).get("host-name")
    return compact({"vmid": vmid, "type": "qemu", "os": osinfo.get("pretty-name") or osinfo.get("name"),
                    "kernel": osinfo.get("kernel-release"), "hostname": hostname,
                    "agent_errors": errors}) | {"interfaces": interfaces}


# ================================================================ writes

POWER_ACTIONS = ("start", "shutdown", "stop", "reboot", "reset", "suspend", "resume")
STATE_AFTER = {"start": "running", "reboot": "running", "reset": "running", "resume": "running",
               "stop": "stopped", "shutdown": "stopped", "suspend": "paused"}
# The state a task that ended well leaves the guest in, without reading it again: a stop or shutdown task
# ends only once the guest's process is gone (docs/PROXMOX-BEHAVIOUR.md#power-and-locks)
ENDED_IN = {"stop": "stopped", "shutdown": "stopped"}
HA_ACTIONS = ("start", "stop", "shutdown")  # requests to the HA manager (docs/PROXMOX-BEHAVIOUR.md#ha-managed-guests)


def _guest_state(status: dict) -> str:
    """running, stopped or paused: a paused VM is `running` with qmpstatus paused
    (docs/PROXMOX-BEHAVIOUR.md#guest-status)."""
    return "paused" if status.get("qmpstatus") in PAUSED else status.get("status", "unknown")


def _ha_managed(row: dict) -> bool:
    """A guest the HA manager acts for (an `ignored` resource is left to the API)."""
    return row.get("hastate") not in (None, "ignored")


HA_SETTLED = {"running": "started", "stopped": "stopped"}  # the HA state a request ends in when it worked


def _ha_row(client: ProxmoxClient, vmid: int, wanted: str, seconds: float) -> dict:
    """The guest's /cluster/resources row, read until the HA manager has done the request, has
    failed, or `seconds` have passed; the row names the node it is on now (after a relocation or a
    recovery it is another one)."""
    def settled(row: dict) -> bool:
        return row.get("status") == wanted and row.get("hastate") == HA_SETTLED[wanted] \
            or row.get("hastate") in HA_FAILED
    row, _ = poll(lambda: next((g for g in guest_resources(client, fresh=True) if g["vmid"] == vmid), {}), settled,
                  seconds, pause=0.5)  # waiting for the HA manager to carry out a request
    return row


def _guest_after(client: ProxmoxClient, answer: dict, vmid: int, base: str | None = None) -> dict:
    """A write's answer with what the user cares about once its task has ended: the guest's state
    (`deleted` when it is gone) and, without `base` (after a migration), the node it is on now."""
    if answer.get("task") in TASK_GOING:
        return answer
    if base is None:
        row = next((g for g in guest_resources(client, fresh=True) if g["vmid"] == vmid), None)
        if row is None:
            return answer | {"guest_state": "deleted"}
        base, answer = f"/nodes/{row['node']}/{row['type']}/{vmid}", answer | {"node": row["node"]}
    return answer | {"guest_state": _guest_state(client.get(f"{base}/status/current") or {})}


def _ha_outcome(client: ProxmoxClient, before: dict, answer: dict, action: str, seconds: float) -> dict:
    """An HA request ended OK at once; say what the HA manager has done since, where, or why it failed."""
    vmid, wanted = before["vmid"], STATE_AFTER[action]
    row = _ha_row(client, vmid, wanted, max(seconds, 0))
    state, node = row.get("hastate"), row.get("node", before["node"])
    if state in HA_FAILED:
        raise ProxmoxError(f"The HA request to {action} guest {vmid} was queued, but " + ha_failure(row))
    answer |= {"requested_through": "HA", "ha_state": state, "guest_state": row.get("status"), "node": node}
    if node != before["node"]:
        answer["note"] = (f"The HA manager started it on {node}: the start failed on {before['node']}, and it "
                          f"moved it (relocation).")
    if row.get("status") != wanted:
        return answer | {"result": "requested",
                         "note": f"The HA manager has the request (HA state {state}); the guest is "
                                 f"{row.get('status')} so far. get_guest shows when it is {wanted}."}
    if action in ("stop", "shutdown"):
        answer["note"] = ("Through HA the guest stays stopped until it is started again "
                          "(write_power_guest action=start).")
    return answer


def write_power_guest(vmid: Vmid, action: Annotated[Literal[POWER_ACTIONS], Field(
                          description="stop, reset: hard.")],
                      host: Host = None, wait_seconds: WaitArg = 30, dry_run: DryRunArg = False,
                      confirm: ConfirmArg = False, ctx: Context | None = None) -> dict:
    """Answers the state the guest reached."""
    client = pve_client(host)
    base, row = guest_path(client, vmid, fresh=True)
    if row["type"] == "lxc" and action == "reset":
        raise InvalidArgument("Containers have no reset; use action=reboot (or stop, then start).")
    started = time.monotonic()
    answer = run_task(client, "POST", f"{base}/status/{action}", {}, wait_seconds, ctx, f"{action} {vmid}")
    if answer.get("task") in TASK_GOING:  # the guest's state comes when the task has ended
        return answer
    if _ha_managed(row) and action in HA_ACTIONS:
        return _ha_outcome(client, row, answer, action, wait_seconds - (time.monotonic() - started))
    ended = ENDED_IN.get(action) if task_outcome(answer.get("task")) in ("ok", "warnings") else None
    answer["guest_state"] = ended or _guest_state(client.get(f"{base}/status/current") or {})
    return answer


def write_configure_guest(vmid: Vmid, host: Host = None,
                       set: Annotated[dict[str, Any] | None, Field(
                           description="e.g. {\"memory\": 4096, \"net\": {\"0\": \"...\"}}")] = None,
                       delete: list[str] | None = None,
                       digest: Annotated[str | None, Field(description="From guest_config.")] = None,
                       dry_run: DryRunArg = False, confirm: ConfirmArg = False, ctx: Context | None = None) -> dict:
    """Set or delete options; says what waits for a restart."""
    client = pve_client(host)
    if not set and not delete:
        raise InvalidArgument("Nothing to change: give `set` and/or `delete`.")
    base, row = guest_path(client, vmid)
    if digest is None:
        digest = (client.get(f"{base}/config") or {}).get("digest")
    changes = encode_params(set)  # {"net": {"0": ...}} is net0, as Proxmox names it
    params: dict[str, Any] = changes | {"digest": digest}
    if delete:
        params["delete"] = ",".join(delete)
    client.request("PUT", f"{base}/config", params)
    # on a running guest what cannot be hot-plugged waits for a restart (docs/PROXMOX-BEHAVIOUR.md#pending-config)
    _, pending = config_and_pending(client.get(f"{base}/pending") or [])
    touched = sorted({*changes, *(delete or [])})  # (`set` is the argument here)
    waiting = {key: value for key, value in pending.items() if key in touched}
    answer = {"vmid": vmid, "changed": sorted(changes), "deleted": delete or [],
              "applied": [key for key in touched if key not in waiting], "pending": waiting,
              "result": "pending until restart" if waiting else "ok"}
    if waiting:
        answer["note"] = (f"Guest {vmid} runs with the old values of {', '.join(sorted(waiting))} until Proxmox "
                          f"restarts it (write_power_guest action=reboot, or shutdown then start).")
    return answer


def write_resize_disk(vmid: Vmid, disk: Annotated[str, Field(description="e.g. scsi0, rootfs")],
                      size: Annotated[str, Field(pattern=r"^\+?\d+G$", description="40G or +10G")],
                      host: Host = None, wait_seconds: WaitArg = 30, dry_run: DryRunArg = False,
                      ctx: Context | None = None) -> dict:
    """Grows a disk (never shrinks)."""
    client = pve_client(host)
    base, _ = guest_path(client, vmid)
    config = client.get(f"{base}/config") or {}
    if disk not in config:
        disks = [k for k in config
                 if re.fullmatch(r"(scsi|virtio|sata|ide|mp)\d+|rootfs", k) and "media=cdrom" not in str(config[k])]
        raise InvalidArgument(f"Guest {vmid} has no disk '{disk}'. Disks: {', '.join(disks)}.")
    current = disk_size(str(config[disk]))
    if not size.startswith("+") and current is not None and int(size[:-1]) <= current[0]:
        raise InvalidArgument(f"{disk} of guest {vmid} is {current[1]}; {size} would not grow it. Disks only grow; "
                              f"give a larger size or +NG.")
    return run_task(client, "PUT", f"{base}/resize", {"disk": disk, "size": size}, wait_seconds, ctx,
                    f"resize {vmid} {disk}")


SnapName = Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_\-]{1,39}$")]


def write_create_snapshot(vmid: Vmid, name: SnapName, host: Host = None,
                          description: Annotated[str | None, Field(max_length=1000)] = None,
                          vmstate: Annotated[bool, Field(description="Save RAM (VM)")] = False,
                          wait_seconds: WaitArg = 30, dry_run: DryRunArg = False, ctx: Context | None = None) -> dict:
    """Of a guest, before risky changes."""
    client = pve_client(host)
    base, row = guest_path(client, vmid)
    params = {"snapname": name, "description": description}
    if vmstate:
        if row["type"] != "qemu":
            raise InvalidArgument("vmstate (RAM) snapshots exist only for VMs.")
        params["vmstate"] = True
    return _guest_after(client, run_task(client, "POST", f"{base}/snapshot", params, wait_seconds, ctx,
                                         f"snapshot {vmid} {name}"), vmid, base)


def write_rollback_snapshot(vmid: Vmid, name: SnapName, host: Host = None,
                            start: Annotated[bool, Field(description="Start it after")] = False,
                            wait_seconds: WaitArg = 30, dry_run: DryRunArg = False, confirm: ConfirmArg = False,
                            ctx: Context | None = None) -> dict:
    """A guest to a snapshot; later changes are lost."""
    client = pve_client(host)
    base, _ = guest_path(client, vmid)
    existing_snapshot(client, base, vmid, name)
    answer = run_task(client, "POST", f"{base}/snapshot/{name}/rollback", {"start": start or None}, wait_seconds, ctx,
                      f"rollback {vmid} {name}")
    if answer.get("result") not in ("ok", "warnings"):
        return answer
    # a rollback stops the guest unless the snapshot holds RAM or start was asked
    # (docs/PROXMOX-BEHAVIOUR.md#snapshots-and-rollback)
    answer["guest_state"] = _guest_state(client.get(f"{base}/status/current") or {})
    if answer["guest_state"] == "stopped":
        answer["note"] = (f"Guest {vmid} is stopped now: the rollback stops it and '{name}' holds no RAM. Start it "
                          f"with write_power_guest action=start (or roll back with start=true).")
    return answer


def write_delete_snapshot(vmid: Vmid, name: SnapName, host: Host = None, wait_seconds: WaitArg = 30,
                          dry_run: DryRunArg = False, confirm: ConfirmArg = False, ctx: Context | None = None) -> dict:
    """Of a guest."""
    client = pve_client(host)
    base, _ = guest_path(client, vmid)
    existing_snapshot(client, base, vmid, name)
    return _guest_after(client, run_task(client, "DELETE", f"{base}/snapshot/{name}", {}, wait_seconds, ctx,
                                         f"delete snapshot {vmid} {name}"), vmid, base)


def _backup_storage(client: ProxmoxClient, storage: str) -> None:
    ok = sorted({name for name, _, _ in backup_storages(client)})
    if storage not in ok:
        raise InvalidArgument(f"Storage '{storage}' does not hold backups. Backup storages: {', '.join(ok)}.")


NOTES_VARIABLES = ("cluster", "guestname", "node", "vmid")


def _notes_template(notes: str) -> str:
    """Notes as vzdump's `notes-template` takes them: a backslash and a line break escaped, and only
    its four {{variables}} (docs/PROXMOX-BEHAVIOUR.md#backup-jobs-and-vzdump-prune)."""
    unknown = [m.group(0) for m in re.finditer(r"\{\{([^\s{}]+)\}\}", notes) if m.group(1) not in NOTES_VARIABLES]
    if unknown:
        known = ", ".join("{{" + name + "}}" for name in NOTES_VARIABLES)
        raise InvalidArgument(f"notes: Proxmox expands only {known} in backup notes and refuses {unknown[0]}; "
                              f"write it another way.")
    return notes.replace("\\", "\\\\").replace("\r\n", "\n").replace("\n", "\\n")


def _pruned(client: ProxmoxClient, answer: dict) -> dict:
    """What vzdump's prune step logged: the retention it applied and how many backups went."""
    lines = [line["t"] for line in client.task_log(answer["upid"], limit=0) if "prune" in line.get("t", "")]
    return {"pruning": [line.removeprefix("INFO: ") for line in lines] or ["no retention is set: nothing pruned"]}


def write_backup_guest(vmid: Vmid, storage: str,
                       host: Host = None,
                       mode: Literal["snapshot", "suspend", "stop"] = "snapshot",
                       compress: Literal["zstd", "lzo", "gzip", "0"] = "zstd",
                       notes: Annotated[str | None, Field(max_length=1000)] = None,
                       prune: Annotated[bool, Field(description="may prune old ones")] = False,
                       wait_seconds: WaitArg = 120, dry_run: DryRunArg = False, ctx: Context | None = None) -> dict:
    """Now (vzdump), to PBS too."""
    client = pve_client(host)
    base, row = guest_path(client, vmid)
    _backup_storage(client, storage)
    # vzdump prunes by the storage's retention unless remove=0, which the GUI's "Backup now" sends
    # (docs/PROXMOX-BEHAVIOUR.md#backup-jobs-and-vzdump-prune)
    params = {"vmid": str(vmid), "storage": storage, "mode": mode, "compress": compress, "remove": prune,
              "notes-template": _notes_template(notes) if notes else None}
    try:
        answer = run_task(client, "POST", f"/nodes/{row['node']}/vzdump", params, wait_seconds, ctx, f"backup {vmid}")
    except TaskFailed as exc:
        if "max backup limit" not in str(exc):
            raise
        raise TaskFailed(f"{exc} Storage '{storage}' keeps a set number of backups per guest and guest {vmid} has "
                         f"that many; nothing was deleted. Give prune=true to let its retention remove the oldest, "
                         f"or delete one (list_backups, write_delete_volume).", upid=exc.upid,
                         exit_status=exc.exit_status) from None
    if prune and answer.get("upid") and answer.get("result"):
        answer |= _pruned(client, answer)
    return _guest_after(client, answer, vmid, base)


def write_restore_backup(archive: Volid,
                         host: Host = None,
                         vmid: OptionalVmid = None,
                         node: Node = None,
                         storage: str | None = None,
                         overwrite: Annotated[bool, Field(description="Replace guest vmid")] = False,
                         start: bool = False, wait_seconds: WaitArg = 300, dry_run: DryRunArg = False,
                         confirm: ConfirmArg = False, ctx: Context | None = None) -> dict:
    """To a new vmid, or over a guest (overwrite)."""
    client = pve_client(host)
    if re.search(r"vzdump-lxc-|/ct/|ct/\d+", archive):
        kind = "lxc"
    elif re.search(r"vzdump-qemu-|/vm/|vm/\d+", archive):
        kind = "qemu"
    else:
        raise InvalidArgument(f"'{archive}' does not look like a backup volid; take one from list_backups.")
    if overwrite:
        if vmid is None:
            raise InvalidArgument("overwrite=true needs the vmid of the guest to replace.")
        row = resolve_guest(client, vmid)
        node = node or row["node"]
    else:
        vmid = free_vmid(client, vmid)
    node = archive_node(client, archive, node)
    if kind == "lxc":
        storage = _rootdir_storage(client, node, storage)
    # a copy beside the original needs its own MAC addresses (docs/PROXMOX-BEHAVIOUR.md#restore)
    params: dict[str, Any] = {"vmid": vmid, "storage": storage, "start": start or None,
                              "force": True if overwrite else None, "unique": None if overwrite else True}
    if kind == "qemu":
        params["archive"] = archive
    else:
        params |= {"ostemplate": archive, "restore": True}
    result = run_task(client, "POST", f"/nodes/{node}/{kind}", params, wait_seconds, ctx, f"restore {archive}")
    return result | {"vmid": vmid, "node": node}


def _rootdir_storage(client: ProxmoxClient, node: str, storage: str | None) -> str:
    """Where a container's volumes can go on a node: the given storage if it takes rootdir, else the
    only one that does. Without it Proxmox picks `local`, which on a fresh install takes no
    containers (docs/PROXMOX-BEHAVIOUR.md#a-fresh-install)."""
    fits = sorted(name for name, row in storages_on(storage_rows(client), node).items()
                  if "rootdir" in (row.get("content") or "").split(","))
    if storage in fits or (storage is None and len(fits) == 1):
        return storage or fits[0]
    choices = f"Storages for containers on {node}: {', '.join(fits) or 'none'}"
    if storage:
        raise InvalidArgument(f"Storage '{storage}' takes no container volumes (rootdir) on {node}. {choices}.")
    raise InvalidArgument(f"Give storage for the container's volumes. {choices}.")


def _migration_blockers(client: ProxmoxClient, base: str, row: dict, config: dict, rows: list[dict]) -> None:
    """What Proxmox's migration refuses in its task, refused first with the way out: an ISO on a
    node's own storage, and snapshots of local disks on storage that cannot carry them (all but
    zfspool, btrfs and qcow2 files), or any local snapshot of a running VM (docs/PROXMOX-BEHAVIOUR.md#migrate)."""
    vmid, shared = row["vmid"], {r["storage"] for r in rows if r.get("shared")}
    types = {r["storage"]: r.get("plugintype") for r in rows}
    local = {k: str(v).split(",")[0] for k, v in config.items() if VOLUME_KEY.fullmatch(k) and ":" in str(v)
             and str(v).split(":")[0] not in shared and not re.search(r"vm-\d+-cloudinit", str(v))}
    isos = [f"{k} ({v})" for k, v in local.items() if "media=cdrom" in str(config[k])]
    if isos:
        raise InvalidArgument(f"Guest {vmid} has an ISO on storage local to {row['node']}: {', '.join(isos)}, which "
                              f"Proxmox will not migrate. Eject it first: write_configure_guest set "
                              f"{{\"{isos[0].split()[0]}\": \"none,media=cdrom\"}}.")
    disks = [v for k, v in local.items() if "media=cdrom" not in str(config[k])]
    live = row.get("status") == "running" and row["type"] == "qemu"
    stuck = [v for v in disks if live or (types.get(v.split(":")[0]) not in ("zfspool", "btrfs")
                                          and not v.endswith(".qcow2"))]
    snapshots = [s["name"] for s in client.get(f"{base}/snapshot") or [] if s["name"] != "current"] if stuck else []
    if snapshots:
        kinds = ", ".join(sorted({types.get(v.split(":")[0]) or "?" for v in stuck}))
        why = "a running VM's local snapshots" if live else f"snapshots on {kinds} storage"
        raise InvalidArgument(f"Guest {vmid} has snapshots ({', '.join(snapshots)}) of local disks "
                              f"({', '.join(stuck)}), and Proxmox cannot migrate {why}. Delete them first "
                              f"(write_delete_snapshot){', or shut it down' if live else ''}.")


def _migration_storage(config: dict, rows: list[dict], row: dict, target: str, target_storage: str | None) -> bool:
    """Check the target has the guest's storages (or the given target_storage); True when disks
    are on storage local to the node (docs/PROXMOX-BEHAVIOUR.md#migrate)."""
    on_target = storages_on(rows, target)
    content = "images" if row["type"] == "qemu" else "rootdir"
    fits = sorted(n for n, r in on_target.items() if content in (r.get("content") or "").split(","))
    if target_storage and target_storage not in fits:
        raise InvalidArgument(f"target_storage '{target_storage}' is not a storage for guest disks on {target}. "
                              f"There: {', '.join(fits) or 'none'}.")
    missing = [s for s in volume_storages(config) if s not in on_target]
    if missing and not target_storage:
        raise InvalidArgument(f"Guest {row['vmid']} has disks on {', '.join(missing)}, which node {target} lacks. "
                              f"Give target_storage, one of {target}'s storages for disks: "
                              f"{', '.join(fits) or 'none'}.")
    shared = {r["storage"] for r in rows if r.get("shared")}
    return any(s not in shared for s in volume_storages(config, disks_only=True))


def _ha_moved(client: ProxmoxClient, row: dict, target: str, seconds: float) -> dict:
    """Where an HA resource is after its migration request, read until it is on target or the HA
    manager failed (docs/PROXMOX-BEHAVIOUR.md#ha-managed-guests)."""
    vmid = row["vmid"]
    now, _ = poll(lambda: next((g for g in guest_resources(client, fresh=True) if g["vmid"] == vmid), {}),
                  lambda now: now.get("node") == target or now.get("hastate") in HA_FAILED, seconds,
                  pause=0.5)  # waiting for the HA manager to carry out a request
    node, state = now.get("node"), now.get("hastate")
    if state in HA_FAILED:
        raise ProxmoxError(f"The HA request to migrate guest {vmid} was queued, but " + ha_failure(now))
    answer = {"requested_through": "HA", "node": node}
    if node != target:
        answer |= {"result": "requested", "note": f"The HA manager has the request; the guest is still on {node}. "
                                                  f"list_guests shows when it is on {target}."}
    return answer


def write_migrate_guest(vmid: Vmid, target: Annotated[str, Field(description="node")], host: Host = None,
                        target_storage: str | None = None,
                        wait_seconds: WaitArg = 300, dry_run: DryRunArg = False, ctx: Context | None = None) -> dict:
    """To another node (live VM, restarted CT)."""
    client = pve_client(host)
    base, row = guest_path(client, vmid, fresh=True)
    check_node(client, target)
    if target == row["node"]:
        raise InvalidArgument(f"Guest {vmid} is already on {target}.")
    config, rows = client.get(f"{base}/config") or {}, storage_rows(client)
    _migration_blockers(client, base, row, config, rows)
    local_disks = _migration_storage(config, rows, row, target, target_storage)
    running = row.get("status") == "running"
    if row["type"] == "qemu":  # a live migration copies local disks only when asked to
        params = {"target": target, "online": running or None, "with-local-disks": (running and local_disks) or None,
                  "targetstorage": target_storage}
    else:  # a running container can only be restarted on the target
        params = {"target": target, "restart": running or None, "target-storage": target_storage}
    started = time.monotonic()
    answer = run_task(client, "POST", f"{base}/migrate", params, wait_seconds, ctx, f"migrate {vmid} to {target}")
    if _ha_managed(row) and answer.get("result") == "ok":
        answer |= _ha_moved(client, row, target, wait_seconds - (time.monotonic() - started))
    return _guest_after(client, answer, vmid)  # the node it is on now, and its state there


def write_delete_guest(vmid: Vmid, host: Host = None,
                       purge: Annotated[bool, Field(description="Also from jobs, HA")] = False,
                       wait_seconds: WaitArg = 60, dry_run: DryRunArg = False, confirm: ConfirmArg = False,
                       ctx: Context | None = None) -> dict:
    """A stopped one, with its disks (not backups)."""
    client = pve_client(host)
    base, row = guest_path(client, vmid, fresh=True)
    params = {"purge": True if purge else None, "destroy-unreferenced-disks": True if purge else None}
    policy.check(client.host, "DELETE", base, encode_params(params))  # "protected" before "stop it first"
    if row.get("status") != "stopped":
        raise ProxmoxError(f"Guest {vmid} is {row.get('status')}; stop it first (write_power_guest action=shutdown).")
    return _guest_after(client, run_task(client, "DELETE", base, params, wait_seconds, ctx, f"delete {vmid}"), vmid)


# ---------------------------------------------------------------- volumes and NICs (making guests: provisioning.py)

def write_delete_volume(volid: str, host: Host = None,
                        node: Node = None, wait_seconds: WaitArg = 60, dry_run: DryRunArg = False,
                        confirm: ConfirmArg = False, ctx: Context | None = None) -> dict:
    """One no guest uses: ISO, template, backup, disk."""
    client = pve_client(host)
    storage = volid.split(":", 1)[0]
    node = storage_node(client, storage, node)
    volumes = {v["volid"]: v for v in client.get(f"/nodes/{node}/storage/{storage}/content") or []}
    if volid not in volumes:
        raise InvalidArgument(f"No volume '{volid}' on {storage}. See storage_content.")
    users = _guests_using(client, volid, volumes[volid])
    if users:
        raise ProxmoxError(f"'{volid}' is in use by guest(s) {', '.join(users)}; "
                           f"detach it first (write_configure_guest delete=...).")
    return run_task(client, "DELETE", f"/nodes/{node}/storage/{storage}/content/{volid}", {}, wait_seconds, ctx,
                    f"delete {volid}")


def _guests_using(client: ProxmoxClient, volid: str, volume: dict) -> list[str]:
    """Guests whose config references a volume (disks by owner; ISOs and templates by scan)."""
    candidates = [g for g in guest_resources(client, fresh=True)
                  if volume.get("content") in ("iso", "vztmpl", "import") or g["vmid"] == volume.get("vmid")]
    users = []
    for guest in candidates:
        config = client.get(f"/nodes/{guest['node']}/{guest['type']}/{guest['vmid']}/config") or {}
        if any(str(v).split(",")[0] == volid for k, v in config.items() if not k.startswith("unused")):
            users.append(f"{guest['vmid']} ({guest.get('name')})")
    return users


def write_set_nic(vmid: Vmid, host: Host = None,
                  nic: Annotated[str, Field(pattern=r"^net\d+$")] = "net0",
                  bridge: str | None = None,
                  vlan: Annotated[int | None, Field(ge=0, le=4094, description="0 removes")] = None,
                  firewall: bool | None = None,
                  dry_run: DryRunArg = False) -> dict:
    """Bridge, VLAN tag or firewall flag of a guest's NIC."""
    client = pve_client(host)
    base, row = guest_path(client, vmid)
    config = client.get(f"{base}/config") or {}
    if nic not in config:
        nics = [k for k in config if re.fullmatch(r"net\d+", k)]
        raise InvalidArgument(f"Guest {vmid} has no {nic}. NICs: {', '.join(nics) or 'none'}.")
    parts = dict(p.split("=", 1) if "=" in p else (p, "") for p in str(config[nic]).split(","))
    if bridge is not None:
        parts["bridge"] = bridge
    if vlan is not None:
        if vlan:
            parts["tag"] = str(vlan)
        else:
            parts.pop("tag", None)
    if firewall is not None:
        parts["firewall"] = "1" if firewall else "0"
    check_bridge(client, row["node"], parts.get("bridge", ""), int(parts["tag"]) if parts.get("tag") else None)
    value = ",".join(f"{k}={v}" if v != "" else k for k, v in parts.items())
    client.request("PUT", f"{base}/config", {nic: value, "digest": config.get("digest")})
    return {"vmid": vmid, nic: value, "was": config[nic], "result": "ok"}
