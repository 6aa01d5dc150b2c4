"""Proxmox VE tools: inventory, guests, storage and tasks.

Each tool is a plain function that returns a dict; server.py registers them, encodes the
answer as compact JSON and turns a ToolFailure into a tool error. Lists come as
{"columns": [...], "rows": [[...], ...]} to keep answers small (answers.py); guests, nodes
and storages are looked up by inventory.py.
"""
import re
import time
from typing import Annotated, Any, Literal
from urllib.parse import quote

from mcp.server.mcpserver import Context
from pydantic import Field

import policy
from answers import (ConfirmArg, DryRunArg, GuestName, Host, Limit, Node, Offset, OptionalVmid, Vmid, Volid,
                     WaitArg, compact, human_bytes, human_duration, iso_time, percent, table)
from config_diff import config_and_pending
from errors import InvalidArgument, ProxmoxError, ToolFailure
from inventory import (archive_node, backup_storages, bridges, check_node, guest_path, guest_resources, next_vmid,
                       node_names, online_node, resolve_guest, storage_node, storage_rows, storages_on)
from proxmox_client import (ProxmoxClient, agent_result, encode_params, log_page, pve_client, run_task, task_outcome,
                            task_report)

EMPTY_HINT = ("Nothing visible. A privilege-separated API token holds only what both it and its user are "
              "granted, and sees empty lists without: grant the role (e.g. PVEAuditor on /) to the user and the "
              "token, or check server_info.")


# ---------------------------------------------------------------- tools

def cluster_status(host: Host = None) -> dict:
    """Cluster name, quorum, nodes online."""
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
    """Nodes: status, CPU, memory, uptime."""
    client = pve_client(host)
    rows = []
    for node in sorted(client.get("/nodes") or [], key=lambda n: n["node"]):
        rows.append({"node": node["node"], "status": node.get("status"),
                     "cpu_pct": percent(node.get("cpu"), 1), "cores": node.get("maxcpu"),
                     "mem_used": human_bytes(node.get("mem")), "mem_total": human_bytes(node.get("maxmem")),
                     "mem_pct": percent(node.get("mem"), node.get("maxmem")),
                     "uptime": human_duration(node.get("uptime"))})
    result = table(["node", "status", "cpu_pct", "cores", "mem_used", "mem_total", "mem_pct", "uptime"], rows)
    if rows and all(r["cores"] is None for r in rows if r["status"] == "online"):
        result["note"] = "No usage figures: the token lacks Sys.Audit on /nodes."
    return result


def list_guests(host: Host = None,
                node: Node = None,
                type: Literal["qemu", "lxc"] | None = None,
                status: str | None = None,
                tag: str | None = None,
                name: str | None = None,
                limit: Limit = 50, offset: Offset = 0) -> dict:
    """Every VM and container: vmid, name, type, node, status, maxmem, tags. Find vmids here."""
    client = pve_client(host)
    rows = []
    for guest in sorted(guest_resources(client, fresh=True), key=lambda g: g["vmid"]):
        tags = (guest.get("tags") or "").split(";")
        if (node and guest.get("node") != node) or (type and guest.get("type") != type) \
                or (status and guest.get("status") != status) or (tag and tag not in tags) \
                or (name and name.lower() not in (guest.get("name") or "").lower()):
            continue
        rows.append({"vmid": guest["vmid"], "name": guest.get("name"), "type": guest.get("type"),
                     "node": guest.get("node"), "status": guest.get("status"),
                     "maxmem": human_bytes(guest.get("maxmem")), "tags": guest.get("tags") or None,
                     "lock": guest.get("lock"), "template": 1 if guest.get("template") else None})
    columns = ["vmid", "name", "type", "node", "status", "maxmem", "tags"]
    for optional in ("lock", "template"):
        if any(r[optional] for r in rows):
            columns.append(optional)
    result = table(columns, rows, limit=limit, offset=offset)
    if not rows and not any((node, type, status, tag, name)):
        result["note"] = EMPTY_HINT
    return result


GUEST_STATUS_FIELDS = ("status", "qmpstatus", "lock", "cpus", "uptime", "ha", "agent", "pid", "tags",
                       "running-qemu", "running-machine")
PAUSED = ("paused", "suspended", "prelaunch")  # qmpstatus of a VM that is `running` but not running


def get_guest(vmid: Vmid, host: Host = None) -> dict:
    """Status, config and pending changes of one guest."""
    client = pve_client(host)
    row = resolve_guest(client, vmid)
    base = f"/nodes/{row['node']}/{row['type']}/{vmid}"
    status = client.get(f"{base}/status/current") or {}
    config, pending = config_and_pending(client.get(f"{base}/pending") or [])
    summary = {key: status.get(key) for key in GUEST_STATUS_FIELDS if key in status}
    if not (status.get("ha") or {}).get("managed"):
        summary.pop("ha", None)  # every guest has one; only an HA resource's says something
    summary |= {"vmid": vmid, "name": status.get("name") or row.get("name"), "type": row["type"],
                "node": row["node"], "uptime": human_duration(status.get("uptime")),
                "paused": True if status.get("qmpstatus") in PAUSED else None,
                "cpu_pct": percent(status.get("cpu"), 1),
                "mem_used": status.get("mem"), "mem_used_human": human_bytes(status.get("mem")),
                "maxmem": status.get("maxmem"), "maxmem_human": human_bytes(status.get("maxmem")),
                "maxdisk": status.get("maxdisk"), "maxdisk_human": human_bytes(status.get("maxdisk"))}
    return compact(summary) | {"config": config} | ({"pending": pending} if pending else {})


def list_storage(host: Host = None, node: Node = None) -> dict:
    """Storages: type, content, use, fill %."""
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
    """Recent tasks, newest first, with result."""
    client = pve_client(host)
    if node:
        # limit=0 lists nothing here; running tasks come from source=active, finished ones from
        # the archive (docs/PROXMOX-BEHAVIOUR.md#pve-tasks)
        source = "active" if running else ("archive" if errors else "all")
        tasks = client.get(f"/nodes/{node}/tasks", limit=limit, source=source, errors=errors or None, vmid=vmid) or []
    else:
        tasks = client.get("/cluster/tasks") or []
    rows = [_task_row(t) for t in sorted(tasks, key=lambda t: -t.get("starttime", 0))]
    rows = [r for r in rows if (vmid is None or r["id"] == str(vmid))
            and (not errors or r["status"] != "running" and task_outcome(r["status"]) in ("failed", "unknown"))
            and (not running or r["status"] == "running")]
    return table(["upid", "node", "type", "id", "user", "start", "status", "duration"], rows, limit=limit)


def get_task(upid: str,
             host: Host = None,
             wait_seconds: Annotated[int, Field(ge=0, le=600)] = 0,
             log_lines: Annotated[int, Field(ge=0, le=500)] = 20,
             ctx: Context | None = None) -> dict:
    """A task's status, result and last log lines; wait_seconds waits for the end."""
    return task_report(pve_client(host), upid, wait_seconds, log_lines, ctx, "get_task")


# ================================================================ more reads

def node_status(node: str, host: Host = None,
                timeframe: Annotated[Literal["hour", "day", "week", "month", "year"] | None,
                                     Field(description="Add RRD averages.")] = None) -> dict:
    """A node's load, CPU, memory, disk, kernel, version, uptime."""
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
                 snapshot: Annotated[str | None, Field(description="As saved in it.")] = None) -> dict:
    """A guest's full config and digest."""
    client = pve_client(host)
    base, row = guest_path(client, vmid)
    config = client.get(f"{base}/config", snapshot=snapshot) or {}
    return {"vmid": vmid, "type": row["type"], "node": row["node"], "config": config}


def list_snapshots(vmid: Vmid, host: Host = None) -> dict:
    """A guest's snapshots: time, parent, RAM saved."""
    client = pve_client(host)
    base, _ = guest_path(client, vmid)
    rows = [{"name": s["name"], "time": iso_time(s.get("snaptime")), "parent": s.get("parent"),
             "vmstate": 1 if s.get("vmstate") else None, "description": (s.get("description") or "").strip() or None}
            for s in client.get(f"{base}/snapshot") or [] if s["name"] != "current"]
    return table(["name", "time", "parent", "vmstate", "description"], rows)


def list_backups(host: Host = None, vmid: OptionalVmid = None,
                 storage: str | None = None,
                 limit: Limit = 100) -> dict:
    """Backups on every storage, PBS included, newest first: volid, guest, size, time, verify."""
    client = pve_client(host)
    rows, unread = [], []
    everything = storage_rows(client)
    for name, node, shared in backup_storages(client, everything):
        if storage and name != storage:
            continue
        for volume in client.get(f"/nodes/{node}/storage/{name}/content", content="backup", vmid=vmid) or []:
            rows.append({"volid": volume["volid"], "vmid": volume.get("vmid"), "storage": name,
                         "node": None if shared else node,  # each node's `local` is its own disk
                         "size": human_bytes(volume.get("size")), "time": iso_time(volume.get("ctime")),
                         "ctime": volume.get("ctime") or 0, "notes": volume.get("notes"),
                         "protected": 1 if volume.get("protected") else None,
                         "verify": (volume.get("verification") or {}).get("state")})
    for entry in everything:
        if "backup" in (entry.get("content") or "").split(",") and entry.get("status") != "available" \
                and (not storage or entry["storage"] == storage):
            unread.append(f"{entry['storage']} on {entry['node']} ({entry.get('status')})")
    rows.sort(key=lambda r: -r["ctime"])
    result = table(["volid", "vmid", "storage", "node", "size", "time", "notes", "protected", "verify"], rows,
                   limit=limit)
    if unread:
        result["not_read"] = unread
    return result


StorageContent = Literal["images", "rootdir", "iso", "vztmpl", "backup", "snippets", "import"]


def storage_content(storage: str, host: Host = None,
                    node: Node = None,
                    content: StorageContent | None = None,
                    vmid: OptionalVmid = None,
                    limit: Limit = 100) -> dict:
    """Volumes on a storage (ISOs, templates, disks, backups): size, owner."""
    client = pve_client(host)
    node = storage_node(client, storage, node)
    rows = [{"volid": v["volid"], "content": v.get("content"), "format": v.get("format"),
             "size": human_bytes(v.get("size")), "vmid": v.get("vmid"), "time": iso_time(v.get("ctime"))}
            for v in client.get(f"/nodes/{node}/storage/{storage}/content", content=content, vmid=vmid) or []]
    return table(["volid", "content", "format", "size", "vmid", "time"], rows, limit=limit)


def list_networks(host: Host = None, node: Node = None) -> dict:
    """Bridges and SDN vnets per node: uplinked, routed or isolated; VLAN-aware; CIDR."""
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
    result = table(["node", "bridge", "segment", "uplink", "vlan_aware", "cidr", "gateway", "comment"], rows)
    if not_read:
        result["not_read"] = not_read
    return result


def list_pools(host: Host = None) -> dict:
    """Pools and their guests."""
    client = pve_client(host)
    members: dict[str, list[int]] = {}
    for guest in guest_resources(client, fresh=True):
        if guest.get("pool"):
            members.setdefault(guest["pool"], []).append(guest["vmid"])
    rows = [{"pool": p["poolid"], "comment": p.get("comment") or None, "guests": sorted(members.get(p["poolid"], []))}
            for p in client.get("/pools") or []]
    return table(["pool", "comment", "guests"], rows)


def task_log(upid: str, host: Host = None,
             start: Annotated[int, Field(ge=0)] = 0, limit: Limit = 100) -> dict:
    """A task's log from line `start`; next_start pages on."""
    return log_page(pve_client(host), upid, start, limit)


def cluster_log(host: Host = None, limit: Annotated[int, Field(ge=1, le=500)] = 50) -> dict:
    """Recent cluster log, newest first."""
    client = pve_client(host)
    rows = [{"time": iso_time(e.get("time")), "node": e.get("node"), "user": e.get("user"), "tag": e.get("tag"),
             "msg": (e.get("msg") or "")[:300]} for e in client.get("/cluster/log", max=limit) or []]
    return table(["time", "node", "user", "tag", "msg"], rows)


def guest_agent_info(vmid: Vmid, host: Host = None) -> dict:
    """A running guest's OS, hostname and IPs."""
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
HA_ACTIONS = ("start", "stop", "shutdown")  # requests to the HA manager (docs/PROXMOX-BEHAVIOUR.md#ha-managed-guests)


def _guest_state(status: dict) -> str:
    """running, stopped or paused: a paused VM is `running` with qmpstatus paused
    (docs/PROXMOX-BEHAVIOUR.md#guest-status)."""
    return "paused" if status.get("qmpstatus") in PAUSED else status.get("status", "unknown")


def _ha_managed(row: dict) -> bool:
    """A guest the HA manager acts for (an `ignored` resource is left to the API)."""
    return row.get("hastate") not in (None, "ignored")


def _poll_state(client: ProxmoxClient, base: str, wanted: str, seconds: float) -> dict:
    """The guest's status/current, read until it is in `wanted` or `seconds` have passed."""
    deadline = time.monotonic() + seconds
    while True:
        status = client.get(f"{base}/status/current") or {}
        if _guest_state(status) == wanted or time.monotonic() >= deadline:
            return status
        time.sleep(0.5)  # waiting for the HA manager to carry out a request


def _ha_outcome(answer: dict, status: dict, action: str, wanted: str) -> dict:
    """An HA request ended OK at once; say so, and what the HA manager has done since."""
    state = answer["guest_state"]
    answer |= {"requested_through": "HA", "ha_state": (status.get("ha") or {}).get("state")}
    if state != wanted:
        return answer | {"result": "requested",
                         "note": f"The HA manager has the request (HA state {answer['ha_state']}); the guest is "
                                 f"{state} so far. get_guest shows when it is {wanted}."}
    if action in ("stop", "shutdown"):
        answer["note"] = ("Through HA the guest stays stopped until it is started again "
                          "(write_guest_power action=start).")
    return answer


def write_guest_power(vmid: Vmid, action: Annotated[Literal[POWER_ACTIONS], Field(
                          description="stop, reset: hard.")],
                      host: Host = None, wait_seconds: WaitArg = 30, dry_run: DryRunArg = False,
                      confirm: ConfirmArg = False, ctx: Context | None = None) -> dict:
    """Start, stop, shut down, reboot, reset, suspend or resume a guest."""
    client = pve_client(host)
    base, row = guest_path(client, vmid, fresh=True)
    if row["type"] == "lxc" and action == "reset":
        raise InvalidArgument("Containers have no reset; use action=reboot (or stop, then start).")
    started = time.monotonic()
    answer = run_task(client, "POST", f"{base}/status/{action}", {}, wait_seconds, ctx, f"{action} {vmid}")
    task = answer.pop("status", None)
    if task in ("started", "still_running"):  # the task's own state, not the guest's
        return answer | {"task": task}
    answer["task"] = answer.pop("exitstatus", "OK")
    ha = _ha_managed(row) and action in HA_ACTIONS
    wanted = STATE_AFTER[action]
    status = _poll_state(client, base, wanted, wait_seconds - (time.monotonic() - started) if ha else 0)
    answer["guest_state"] = _guest_state(status)
    if ha:
        return _ha_outcome(answer, status, action, wanted)
    return answer


def write_guest_config(vmid: Vmid, host: Host = None,
                       set: Annotated[dict[str, Any] | None, Field(
                           description="e.g. {\"memory\": 4096, \"net\": {\"0\": \"...\"}}")] = None,
                       delete: list[str] | None = None,
                       digest: Annotated[str | None, Field(description="From guest_config.")] = None,
                       dry_run: DryRunArg = False, confirm: ConfirmArg = False, ctx: Context | None = None) -> dict:
    """Set or delete guest config options (digest guards concurrent edits)."""
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
                          f"restarts it (write_guest_power action=reboot, or shutdown then start).")
    return answer


def _disk_gib(value: str) -> int | None:
    match = re.search(r"size=(\d+(?:\.\d+)?)([KMGT])", value or "")
    if not match:
        return None
    return int(float(match.group(1)) * {"K": 1 / 1024 ** 2, "M": 1 / 1024, "G": 1, "T": 1024}[match.group(2)])


def write_resize_disk(vmid: Vmid, disk: Annotated[str, Field(description="e.g. scsi0, rootfs")],
                      size: Annotated[str, Field(pattern=r"^\+?\d+G$", description="40G or +10G")],
                      host: Host = None, wait_seconds: WaitArg = 30, dry_run: DryRunArg = False,
                      ctx: Context | None = None) -> dict:
    """Grow a guest disk (never shrinks)."""
    client = pve_client(host)
    base, _ = guest_path(client, vmid)
    config = client.get(f"{base}/config") or {}
    if disk not in config:
        disks = [k for k in config
                 if re.fullmatch(r"(scsi|virtio|sata|ide|mp)\d+|rootfs", k) and "media=cdrom" not in str(config[k])]
        raise InvalidArgument(f"Guest {vmid} has no disk '{disk}'. Disks: {', '.join(disks)}.")
    current = _disk_gib(str(config[disk]))
    if not size.startswith("+") and current is not None and int(size[:-1]) <= current:
        raise InvalidArgument(f"{disk} of guest {vmid} is {current}G; {size} would not grow it. Disks only grow; "
                              f"give a larger size or +NG.")
    return run_task(client, "PUT", f"{base}/resize", {"disk": disk, "size": size}, wait_seconds, ctx,
                    f"resize {vmid} {disk}")


SnapName = Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_\-]{1,39}$")]


def write_snapshot_create(vmid: Vmid, name: SnapName, host: Host = None,
                          description: Annotated[str | None, Field(max_length=1000)] = None,
                          vmstate: Annotated[bool, Field(description="Save RAM (VM)")] = False,
                          wait_seconds: WaitArg = 30, dry_run: DryRunArg = False, ctx: Context | None = None) -> dict:
    """Snapshot a guest (before risky changes)."""
    client = pve_client(host)
    base, row = guest_path(client, vmid)
    params = {"snapname": name, "description": description}
    if vmstate:
        if row["type"] != "qemu":
            raise InvalidArgument("vmstate (RAM) snapshots exist only for VMs.")
        params["vmstate"] = True
    return run_task(client, "POST", f"{base}/snapshot", params, wait_seconds, ctx, f"snapshot {vmid} {name}")


def _existing_snapshot(client: ProxmoxClient, base: str, vmid: int, name: str) -> None:
    names = [s["name"] for s in client.get(f"{base}/snapshot") or [] if s["name"] != "current"]
    if name not in names:
        raise InvalidArgument(f"Guest {vmid} has no snapshot '{name}'. Snapshots: {', '.join(names) or 'none'}.")


def write_snapshot_rollback(vmid: Vmid, name: SnapName, host: Host = None, wait_seconds: WaitArg = 30,
                            dry_run: DryRunArg = False, confirm: ConfirmArg = False,
                            ctx: Context | None = None) -> dict:
    """Roll a guest back to a snapshot; later changes are lost."""
    client = pve_client(host)
    base, _ = guest_path(client, vmid)
    _existing_snapshot(client, base, vmid, name)
    return run_task(client, "POST", f"{base}/snapshot/{name}/rollback", {}, wait_seconds, ctx,
                    f"rollback {vmid} {name}")


def write_snapshot_delete(vmid: Vmid, name: SnapName, host: Host = None, wait_seconds: WaitArg = 30,
                          dry_run: DryRunArg = False, confirm: ConfirmArg = False, ctx: Context | None = None) -> dict:
    """Delete a guest snapshot."""
    client = pve_client(host)
    base, _ = guest_path(client, vmid)
    _existing_snapshot(client, base, vmid, name)
    return run_task(client, "DELETE", f"{base}/snapshot/{name}", {}, wait_seconds, ctx,
                    f"delete snapshot {vmid} {name}")


def _backup_storage(client: ProxmoxClient, storage: str) -> None:
    ok = sorted({name for name, _, _ in backup_storages(client)})
    if storage not in ok:
        raise InvalidArgument(f"Storage '{storage}' does not hold backups. Backup storages: {', '.join(ok)}.")


def write_backup_guest(vmid: Vmid, storage: str,
                       host: Host = None,
                       mode: Literal["snapshot", "suspend", "stop"] = "snapshot",
                       compress: Literal["zstd", "lzo", "gzip", "0"] = "zstd",
                       notes: Annotated[str | None, Field(max_length=1000)] = None,
                       wait_seconds: WaitArg = 120, dry_run: DryRunArg = False, ctx: Context | None = None) -> dict:
    """Back up a guest now (vzdump) to a storage, PBS included."""
    client = pve_client(host)
    _, row = guest_path(client, vmid)
    _backup_storage(client, storage)
    params = {"vmid": str(vmid), "storage": storage, "mode": mode, "compress": compress, "notes-template": notes}
    return run_task(client, "POST", f"/nodes/{row['node']}/vzdump", params, wait_seconds, ctx, f"backup {vmid}")


def _free_vmid(client: ProxmoxClient, vmid: int | None) -> int:
    if vmid is None:
        return next_vmid(client)
    taken = {g["vmid"]: g for g in guest_resources(client, fresh=True)}
    if vmid in taken:
        raise InvalidArgument(f"vmid {vmid} is taken by '{taken[vmid].get('name')}'. "
                              f"Leave vmid out to get the next free one.")
    return vmid


def write_restore_backup(archive: Volid,
                         host: Host = None,
                         vmid: OptionalVmid = None,
                         node: Node = None,
                         storage: str | None = None,
                         overwrite: Annotated[bool, Field(description="Replace guest vmid")] = False,
                         start: bool = False, wait_seconds: WaitArg = 300, dry_run: DryRunArg = False,
                         confirm: ConfirmArg = False, ctx: Context | None = None) -> dict:
    """Restore a backup to a new vmid, or over a guest (overwrite)."""
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
        vmid = _free_vmid(client, vmid)
    node = archive_node(client, archive, node)
    # a copy beside the original needs its own MAC addresses (docs/PROXMOX-BEHAVIOUR.md#restore)
    params: dict[str, Any] = {"vmid": vmid, "storage": storage, "start": start or None,
                              "force": True if overwrite else None, "unique": None if overwrite else True}
    if kind == "qemu":
        params["archive"] = archive
    else:
        params |= {"ostemplate": archive, "restore": True}
    result = run_task(client, "POST", f"/nodes/{node}/{kind}", params, wait_seconds, ctx, f"restore {archive}")
    return result | {"vmid": vmid, "node": node}


VOLUME_KEY = re.compile(r"(scsi|virtio|sata|ide|efidisk|tpmstate|mp)\d+|rootfs")


def _volume_storages(config: dict, disks_only: bool = False) -> list[str]:
    """The storages a guest's volumes are on (CD-ROM images too, unless disks_only)."""
    found = []
    for key, value in config.items():
        volume = str(value).split(",")[0]
        if VOLUME_KEY.fullmatch(key) and ":" in volume and not (disks_only and "media=cdrom" in str(value)):
            found.append(volume.split(":", 1)[0])
    return sorted(set(found))


def _clone_target_check(client: ProxmoxClient, base: str, row: dict, storage: str | None) -> None:
    """A clone to another node needs shared storage: for a VM all its volumes, for a container
    the storage its copy goes to (docs/PROXMOX-BEHAVIOUR.md#clone)."""
    shared = {r["storage"] for r in storage_rows(client) if r.get("shared")}
    if storage and storage not in shared:
        raise InvalidArgument(f"A clone to another node must go to a shared storage; '{storage}' is local to "
                              f"each node. Shared: {', '.join(sorted(shared)) or 'none'}.")
    used = [storage] if storage and row["type"] == "lxc" else _volume_storages(client.get(f"{base}/config") or {})
    local = [s for s in used if s not in shared]
    if local:
        also = " or give a shared storage" if row["type"] == "lxc" else ""
        raise InvalidArgument(f"Guest {row['vmid']} uses local storage ({', '.join(local)}), and Proxmox clones such "
                              f"a guest only on its own node: leave target out (clone on {row['node']}), then "
                              f"write_migrate_guest{also}.")


def _clone_checks(client: ProxmoxClient, base: str, row: dict, full: bool | None, storage: str | None,
                  snapshot: str | None, target: str | None) -> None:
    """What Proxmox refuses, refused first with what to do instead (docs/PROXMOX-BEHAVIOUR.md#clone)."""
    vmid = row["vmid"]
    linked = full is False or (full is None and bool(row.get("template")))
    if linked and not row.get("template"):
        raise InvalidArgument(f"A linked clone needs a template; guest {vmid} is not one "
                              f"(write_template, or full=true).")
    if storage and linked:
        raise InvalidArgument(f"storage applies to full clones only: guest {vmid} is a template, so its clone is "
                              f"linked unless full=true. Give full=true to copy it to {storage}, or leave storage out.")
    if snapshot:
        _existing_snapshot(client, base, vmid, snapshot)
    if row["type"] == "lxc" and not linked and row.get("status") == "running" and not snapshot:
        raise InvalidArgument(f"Container {vmid} is running: Proxmox copies a running container only from a "
                              f"snapshot. Take one (write_snapshot_create) and give snapshot=<name>, or shut it down.")
    if target:
        _clone_target_check(client, base, row, storage)


def write_clone_guest(vmid: Vmid, host: Host = None,
                      newid: OptionalVmid = None,
                      name: Annotated[str | None, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9.\-]{0,62}$")] = None,
                      target: Annotated[str | None, Field(description="node")] = None,
                      full: bool | None = None,
                      storage: str | None = None,
                      snapshot: str | None = None,
                      wait_seconds: WaitArg = 300, dry_run: DryRunArg = False, ctx: Context | None = None) -> dict:
    """Clone a guest: full, or linked (a template's default)."""
    client = pve_client(host)
    base, row = guest_path(client, vmid, fresh=True)
    target = None if target == row["node"] else target
    if target:
        check_node(client, target)
    _clone_checks(client, base, row, full, storage, snapshot, target)
    newid = _free_vmid(client, newid)
    params = {"newid": newid, "target": target, "full": full, "storage": storage, "snapname": snapshot,
              ("name" if row["type"] == "qemu" else "hostname"): name}
    result = run_task(client, "POST", f"{base}/clone", params, wait_seconds, ctx, f"clone {vmid} to {newid}")
    return result | {"newid": newid}


def _migration_storage(client: ProxmoxClient, base: str, row: dict, target: str,
                       target_storage: str | None) -> bool:
    """Check the target has the guest's storages (or the given target_storage); True when disks
    are on storage local to the node (docs/PROXMOX-BEHAVIOUR.md#migrate)."""
    config = client.get(f"{base}/config") or {}
    rows = storage_rows(client)
    on_target = storages_on(rows, target)
    content = "images" if row["type"] == "qemu" else "rootdir"
    fits = sorted(n for n, r in on_target.items() if content in (r.get("content") or "").split(","))
    if target_storage and target_storage not in fits:
        raise InvalidArgument(f"target_storage '{target_storage}' is not a storage for guest disks on {target}. "
                              f"There: {', '.join(fits) or 'none'}.")
    missing = [s for s in _volume_storages(config) if s not in on_target]
    if missing and not target_storage:
        raise InvalidArgument(f"Guest {row['vmid']} has disks on {', '.join(missing)}, which node {target} lacks. "
                              f"Give target_storage, one of {target}'s storages for disks: "
                              f"{', '.join(fits) or 'none'}.")
    shared = {r["storage"] for r in rows if r.get("shared")}
    return any(s not in shared for s in _volume_storages(config, disks_only=True))


def _ha_moved(client: ProxmoxClient, vmid: int, target: str, seconds: float) -> dict:
    """Where an HA resource is after its migration request, read until it is on target."""
    deadline = time.monotonic() + seconds
    while True:
        node = next((g["node"] for g in guest_resources(client, fresh=True) if g["vmid"] == vmid), None)
        if node == target or time.monotonic() >= deadline:
            break
        time.sleep(0.5)  # waiting for the HA manager to carry out a request
    answer = {"requested_through": "HA", "node": node}
    if node != target:
        answer |= {"result": "requested", "note": f"The HA manager has the request; the guest is still on {node}. "
                                                  f"list_guests shows when it is on {target}."}
    return answer


def write_migrate_guest(vmid: Vmid, target: Annotated[str, Field(description="node")], host: Host = None,
                        target_storage: str | None = None,
                        wait_seconds: WaitArg = 300, dry_run: DryRunArg = False, ctx: Context | None = None) -> dict:
    """Move a guest to another node (live VM, restarted CT)."""
    client = pve_client(host)
    base, row = guest_path(client, vmid, fresh=True)
    check_node(client, target)
    if target == row["node"]:
        raise InvalidArgument(f"Guest {vmid} is already on {target}.")
    local_disks = _migration_storage(client, base, row, target, target_storage)
    running = row.get("status") == "running"
    if row["type"] == "qemu":  # a live migration copies local disks only when asked to
        params = {"target": target, "online": running or None, "with-local-disks": (running and local_disks) or None,
                  "targetstorage": target_storage}
    else:  # a running container can only be restarted on the target
        params = {"target": target, "restart": running or None, "target-storage": target_storage}
    started = time.monotonic()
    answer = run_task(client, "POST", f"{base}/migrate", params, wait_seconds, ctx, f"migrate {vmid} to {target}")
    if _ha_managed(row) and answer.get("result") == "ok":
        answer |= _ha_moved(client, vmid, target, wait_seconds - (time.monotonic() - started))
    return answer


def write_template(vmid: Vmid, host: Host = None, wait_seconds: WaitArg = 60, dry_run: DryRunArg = False,
                   ctx: Context | None = None) -> dict:
    """Turn a stopped guest into a template (irreversible)."""
    client = pve_client(host)
    base, row = guest_path(client, vmid, fresh=True)
    if row.get("status") != "stopped":
        raise ProxmoxError(f"Guest {vmid} is {row.get('status')}; shut it down first (write_guest_power).")
    return run_task(client, "POST", f"{base}/template", {}, wait_seconds, ctx, f"template {vmid}")


def write_delete_guest(vmid: Vmid, host: Host = None,
                       purge: Annotated[bool, Field(description="Also from jobs, HA")] = False,
                       wait_seconds: WaitArg = 60, dry_run: DryRunArg = False, confirm: ConfirmArg = False,
                       ctx: Context | None = None) -> dict:
    """Delete a stopped guest and its disks (not backups)."""
    client = pve_client(host)
    base, row = guest_path(client, vmid, fresh=True)
    params = {"purge": True if purge else None, "destroy-unreferenced-disks": True if purge else None}
    policy.check(client.host, "DELETE", base, encode_params(params))  # "protected" before "stop it first"
    if row.get("status") != "stopped":
        raise ProxmoxError(f"Guest {vmid} is {row.get('status')}; stop it first (write_guest_power action=shutdown).")
    return run_task(client, "DELETE", base, params, wait_seconds, ctx, f"delete {vmid}")


# ---------------------------------------------------------------- provisioning

def _check_bridge(client: ProxmoxClient, node: str, bridge: str, vlan: int | None) -> None:
    """Fail closed: an unknown bridge, a VLAN on a bridge that is not VLAN-aware, or a bridge list
    that cannot be read refuse the change."""
    try:
        known = {b["bridge"]: b for b in bridges(client, node)}
    except ToolFailure as exc:
        raise ProxmoxError(f"Cannot read the bridges of {node} ({exc}); refusing to change a NIC blind.") from None
    if bridge not in known:
        raise InvalidArgument(f"Node {node} has no bridge '{bridge}'. "
                              f"Bridges: {', '.join(known) or 'none'} (list_networks).")
    if vlan and not known[bridge]["vlan_aware"]:
        aware = ", ".join(b for b, v in known.items() if v["vlan_aware"]) or "none"
        raise InvalidArgument(f"Bridge {bridge} on {node} is not VLAN-aware; a tag there would not isolate anything. "
                              f"Use a VLAN-aware bridge: {aware}.")


def _volume_exists(client: ProxmoxClient, node: str, volid: str, content: str) -> None:
    storage = volid.split(":", 1)[0]
    node = storage_node(client, storage, node)
    found = [v["volid"] for v in client.get(f"/nodes/{node}/storage/{storage}/content", content=content) or []]
    if volid not in found:
        raise InvalidArgument(f"'{volid}' is not on storage {storage} ({content}). "
                              f"Available: {', '.join(found) or 'none'}; write_download_url can fetch one.")


Vlan = Annotated[int | None, Field(ge=1, le=4094)]


def write_create_vm(name: GuestName,
                    host: Host = None, node: Node = None,
                    vmid: OptionalVmid = None,
                    iso: Annotated[str | None, Field(description="volid")] = None,
                    cloud_image: Annotated[str | None, Field(description="volid")] = None,
                    memory_mb: Annotated[int, Field(ge=64)] = 2048, cores: Annotated[int, Field(ge=1, le=128)] = 2,
                    disk_gb: Annotated[int, Field(ge=1)] = 32, storage: str = "local-lvm", bridge: str = "vmbr0",
                    vlan: Vlan = None, ciuser: str | None = None,
                    ssh_keys: str | None = None,
                    ip: Annotated[str, Field(description="ipconfig0")] = "ip=dhcp",
                    start: bool = False, wait_seconds: WaitArg = 120, dry_run: DryRunArg = False,
                    ctx: Context | None = None) -> dict:
    """Create a VM from an ISO, or from a cloud image with cloud-init."""
    client = pve_client(host)
    if bool(iso) == bool(cloud_image):
        raise InvalidArgument("Give exactly one of iso (installer) or cloud_image (cloud-init).")
    node = check_node(client, node) if node else online_node(client)
    vmid = _free_vmid(client, vmid)
    _check_bridge(client, node, bridge, vlan)
    net = f"virtio,bridge={bridge}" + (f",tag={vlan}" if vlan else "")
    params: dict[str, Any] = {"vmid": vmid, "name": name, "memory": memory_mb, "cores": cores, "net0": net,
                              "ostype": "l26", "scsihw": "virtio-scsi-single", "agent": "1", "start": start or None}
    if iso:
        _volume_exists(client, node, iso, "iso")
        params |= {"ide2": f"{iso},media=cdrom", "scsi0": f"{storage}:{disk_gb}", "boot": "order=scsi0;ide2"}
    else:
        _volume_exists(client, node, cloud_image, "import")
        params |= {"scsi0": f"{storage}:0,import-from={cloud_image}", "ide2": f"{storage}:cloudinit",
                   "boot": "order=scsi0", "ipconfig0": ip, "ciuser": ciuser,
                   "sshkeys": quote(ssh_keys.strip(), safe="") if ssh_keys else None, "serial0": "socket"}
    result = run_task(client, "POST", f"/nodes/{node}/qemu", params, wait_seconds, ctx, f"create VM {vmid}")
    answer = result | {"vmid": vmid, "node": node}
    if cloud_image:
        answer["disk"] = _grow_imported_disk(client, f"/nodes/{node}/qemu/{vmid}", disk_gb, result, ctx)
    return answer


def _grow_imported_disk(client: ProxmoxClient, base: str, disk_gb: int, created: dict, ctx: Context | None) -> str:
    """An imported disk has the image's size; grow it to disk_gb (docs/PROXMOX-BEHAVIOUR.md#downloads-and-imports)."""
    if created.get("result") not in ("ok", "warnings"):
        return f"scsi0 keeps the image's size; once the VM exists, grow it with write_resize_disk size={disk_gb}G"
    size = _disk_gib(str((client.get(f"{base}/config") or {}).get("scsi0", "")))
    if size is None or disk_gb <= size:
        return f"scsi0 is {size}G, the image's own size; disk_gb={disk_gb} would not grow it, so it was left"
    run_task(client, "PUT", f"{base}/resize", {"disk": "scsi0", "size": f"{disk_gb}G"}, 120, ctx,
             f"resize {base.rsplit('/', 1)[1]} scsi0")
    return f"scsi0 grown from {size}G (the image) to {disk_gb}G"


def write_create_lxc(hostname: GuestName,
                     template: Volid,
                     host: Host = None, node: Node = None,
                     vmid: OptionalVmid = None,
                     memory_mb: Annotated[int, Field(ge=16)] = 1024, cores: Annotated[int, Field(ge=1, le=128)] = 1,
                     disk_gb: Annotated[int, Field(ge=1)] = 8, storage: str = "local-lvm", bridge: str = "vmbr0",
                     vlan: Vlan = None,
                     ip: Annotated[str, Field(description="dhcp or CIDR")] = "dhcp",
                     gateway: str | None = None,
                     ssh_keys: str | None = None,
                     unprivileged: bool = True,
                     start: bool = False, wait_seconds: WaitArg = 120, dry_run: DryRunArg = False,
                     confirm: ConfirmArg = False, ctx: Context | None = None) -> dict:
    """Create a container from a template."""
    client = pve_client(host)
    node = check_node(client, node) if node else online_node(client)
    vmid = _free_vmid(client, vmid)
    _check_bridge(client, node, bridge, vlan)
    _volume_exists(client, node, template, "vztmpl")
    net = f"name=eth0,bridge={bridge},ip={ip}" + (f",gw={gateway}" if gateway else "")
    net += f",tag={vlan}" if vlan else ""
    params = {"vmid": vmid, "hostname": hostname, "ostemplate": template, "memory": memory_mb, "cores": cores,
              "rootfs": f"{storage}:{disk_gb}", "net0": net, "unprivileged": unprivileged,
              "ssh-public-keys": ssh_keys, "start": start or None}
    result = run_task(client, "POST", f"/nodes/{node}/lxc", params, wait_seconds, ctx, f"create CT {vmid}")
    return result | {"vmid": vmid, "node": node}


# The names download-url accepts (docs/PROXMOX-BEHAVIOUR.md#downloads-and-imports).
DOWNLOAD_NAMES = {
    "iso": (re.compile(r"[^/]+\.(iso|img)", re.I), ".iso or .img"),
    "vztmpl": (re.compile(r"[^/]+\.(tar|tar\.(gz|xz|zst|bz2))", re.I), ".tar, .tar.gz, .tar.xz, .tar.zst or .tar.bz2"),
    "import": (re.compile(r"[A-Za-z0-9_.+=-]+\.(qcow2|raw|vmdk|ova)"), ".qcow2, .raw, .vmdk or .ova (lower case)"),
}
CHECKSUM_BY_LENGTH = {32: "md5", 40: "sha1", 56: "sha224", 64: "sha256", 96: "sha384", 128: "sha512"}


def write_download_url(url: Annotated[str, Field(pattern=r"^https?://\S+$")],
                       storage: str,
                       filename: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._\-]*$")],
                       content: Literal["iso", "vztmpl", "import"] = "iso",
                       host: Host = None, node: Node = None,
                       checksum: Annotated[str | None, Field(description="hex: md5 to sha512")] = None,
                       wait_seconds: WaitArg = 300, dry_run: DryRunArg = False, ctx: Context | None = None) -> dict:
    """Download an ISO, template or image from a URL into a storage."""
    algorithm = None
    if checksum:
        checksum = checksum.strip().lower()
        algorithm = CHECKSUM_BY_LENGTH.get(len(checksum)) if re.fullmatch(r"[0-9a-f]+", checksum) else None
        if not algorithm:
            raise InvalidArgument("checksum: give the hex digest of md5, sha1, sha224, sha256, sha384 or sha512 "
                                  "(the algorithm is told by its length).")
    pattern, allowed = DOWNLOAD_NAMES[content]
    if not pattern.fullmatch(filename):
        hint = " A cloud image published as .img is usually qcow2: name it e.g. 'noble.qcow2'." \
            if content == "import" else ""
        raise InvalidArgument(f"filename '{filename}': Proxmox saves {content} downloads only as {allowed}.{hint}")
    client = pve_client(host)
    node = storage_node(client, storage, node, content)
    params = {"url": url, "content": content, "filename": filename, "checksum": checksum,
              "checksum-algorithm": algorithm}
    return run_task(client, "POST", f"/nodes/{node}/storage/{storage}/download-url", params, wait_seconds, ctx,
                    f"download {filename}") | {"volid": f"{storage}:{content}/{filename}"}


def write_delete_volume(volid: str, host: Host = None,
                        node: Node = None, wait_seconds: WaitArg = 60, dry_run: DryRunArg = False,
                        confirm: ConfirmArg = False, ctx: Context | None = None) -> dict:
    """Delete a volume no guest uses (ISO, template, backup, disk)."""
    client = pve_client(host)
    storage = volid.split(":", 1)[0]
    node = storage_node(client, storage, node)
    volumes = {v["volid"]: v for v in client.get(f"/nodes/{node}/storage/{storage}/content") or []}
    if volid not in volumes:
        raise InvalidArgument(f"No volume '{volid}' on {storage}. See storage_content.")
    users = _guests_using(client, volid, volumes[volid])
    if users:
        raise ProxmoxError(f"'{volid}' is in use by guest(s) {', '.join(users)}; "
                           f"detach it first (write_guest_config delete=...).")
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
    """Change a guest NIC's bridge, VLAN tag or firewall flag."""
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
    _check_bridge(client, row["node"], parts.get("bridge", ""), int(parts["tag"]) if parts.get("tag") else None)
    value = ",".join(f"{k}={v}" if v != "" else k for k, v in parts.items())
    client.request("PUT", f"{base}/config", {nic: value, "digest": config.get("digest")})
    return {"vmid": vmid, nic: value, "was": config[nic], "result": "ok"}
