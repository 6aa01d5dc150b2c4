"""Proxmox VE tools: inventory, guests, storage and tasks.

Each tool is a plain function that returns a dict; server.py registers them, encodes the
answer as compact JSON and turns ProxmoxError into a tool error. Lists come as
{"columns": [...], "rows": [[...], ...]} to keep answers small.
"""
import threading
import time
from datetime import datetime, timezone
from typing import Annotated, Any, Callable, Literal

from pydantic import Field

import anyio.from_thread
from mcp.server.mcpserver import Context

from proxmox_client import ProxmoxClient, ProxmoxError, parse_upid, pve_client

Host = Annotated[str | None, Field(description="Host label (list_hosts); optional with one host.")]
Vmid = Annotated[int, Field(ge=100, le=999999999, description="Guest id (VM or container).")]
Limit = Annotated[int, Field(ge=1, le=1000, description="Rows per page.")]
Offset = Annotated[int, Field(ge=0, description="Rows to skip, for paging.")]

EMPTY_HINT = ("Nothing visible. A privilege-separated API token without its own ACLs sees empty lists: "
              "grant the token a role (e.g. PVEAuditor on /) or check server_info.")


# ---------------------------------------------------------------- formatting

def human_bytes(value: float | int | None) -> str | None:
    if value is None:
        return None
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return None


def human_duration(seconds: float | int | None) -> str | None:
    if not seconds:
        return None
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {secs}s" if minutes else f"{secs}s"


def iso_time(epoch: int | float | None) -> str | None:
    if not epoch:
        return None
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def percent(used: float | None, total: float | None) -> float | None:
    return round(100 * used / total, 1) if used is not None and total else None


def table(columns: list[str], rows: list[dict], *, limit: int | None = None, offset: int = 0) -> dict:
    """Rows as lists under one header; paging with a `truncated` marker and the next offset."""
    page = rows[offset:offset + limit] if limit else rows[offset:]
    result: dict[str, Any] = {"columns": columns, "rows": [[row.get(c) for c in columns] for row in page]}
    result["total"] = len(rows)
    if limit and offset + limit < len(rows):
        result["truncated"] = True
        result["next_offset"] = offset + limit
    return result


def compact(data: dict) -> dict:
    """Drop None and empty values; answers carry no nulls."""
    return {k: v for k, v in data.items() if v is not None and v != "" and v != []}


def progress_reporter(ctx: Context | None) -> Callable[[float | None, str], None] | None:
    """A callback that sends MCP progress notifications from a sync tool's worker thread.
    Percentages only grow; a line without one repeats the last value."""
    if ctx is None:
        return None
    last = [0.0]

    def report(pct: float | None, message: str) -> None:
        last[0] = max(last[0], pct if pct is not None else last[0])
        try:
            anyio.from_thread.run(ctx.report_progress, last[0], 100.0, message[:200])
        except Exception:  # progress is best effort: a gone client must not fail the task
            pass
    return report


# ---------------------------------------------------------------- resolving guests

_RESOURCES_TTL = 10.0
_resources_cache: dict[str, tuple[float, list[dict]]] = {}
_cache_lock = threading.Lock()


def guest_resources(client: ProxmoxClient, *, fresh: bool = False) -> list[dict]:
    """All guests from one /cluster/resources call, cached for a few seconds per host."""
    label = client.host.label
    with _cache_lock:
        cached = _resources_cache.get(label)
        if cached and not fresh and time.monotonic() - cached[0] < _RESOURCES_TTL:
            return cached[1]
    guests = client.get("/cluster/resources", type="vm") or []
    for guest in guests:
        guest["vmid"] = int(guest["vmid"])  # PVE < 8.2 sends an LXC vmid as a string
    with _cache_lock:
        _resources_cache[label] = (time.monotonic(), guests)
    return guests


def resolve_guest(client: ProxmoxClient, vmid: int) -> dict:
    """The /cluster/resources row of a guest; refreshed once on a miss; an unknown vmid
    answers with the closest existing ones."""
    for fresh in (False, True):
        for guest in guest_resources(client, fresh=fresh):
            if guest["vmid"] == vmid:
                return guest
    known = sorted(guest_resources(client), key=lambda g: abs(g["vmid"] - vmid))[:5]
    close = ", ".join(f"{g['vmid']} ({g.get('name', '?')})" for g in known)
    raise ProxmoxError(f"No guest with vmid {vmid} on host '{client.host.label}'. "
                       + (f"Closest existing: {close}. " if close else "No guests are visible. ")
                       + "Use list_guests to see them all.")


# ---------------------------------------------------------------- tools

def cluster_status(host: Host = None) -> dict:
    """Cluster name, quorum and which nodes are online. Start here to learn node names."""
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
    """Nodes with status, CPU and memory use and uptime."""
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
                node: Annotated[str | None, Field(description="Only guests on this node.")] = None,
                type: Annotated[Literal["qemu", "lxc"] | None, Field(description="qemu (VM) or lxc (container).")] = None,
                status: Annotated[str | None, Field(description="running, stopped, paused...")] = None,
                tag: Annotated[str | None, Field(description="Only guests with this tag.")] = None,
                name: Annotated[str | None, Field(description="Substring of the guest name.")] = None,
                limit: Limit = 100, offset: Offset = 0) -> dict:
    """All VMs and containers (one API call, any cluster size): vmid, name, type, node, status,
    memory, tags. Use it to find a vmid; never guess one."""
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
                     "mem": human_bytes(guest.get("maxmem")), "tags": guest.get("tags") or None,
                     "lock": guest.get("lock"), "template": 1 if guest.get("template") else None})
    columns = ["vmid", "name", "type", "node", "status", "mem", "tags"]
    for optional in ("lock", "template"):
        if any(r[optional] for r in rows):
            columns.append(optional)
    result = table(columns, rows, limit=limit, offset=offset)
    if not rows and not any((node, type, status, tag, name)):
        result["note"] = EMPTY_HINT
    return result


GUEST_STATUS_FIELDS = ("status", "qmpstatus", "lock", "cpus", "uptime", "ha", "agent", "pid", "tags",
                       "running-qemu", "running-machine")


def get_guest(vmid: Vmid, host: Host = None) -> dict:
    """Status and configuration of one VM or container; the vmid alone is enough."""
    client = pve_client(host)
    row = resolve_guest(client, vmid)
    base = f"/nodes/{row['node']}/{row['type']}/{vmid}"
    status = client.get(f"{base}/status/current") or {}
    config = client.get(f"{base}/config") or {}
    summary = {key: status.get(key) for key in GUEST_STATUS_FIELDS if key in status}
    summary |= {"vmid": vmid, "name": status.get("name") or row.get("name"), "type": row["type"],
                "node": row["node"], "uptime": human_duration(status.get("uptime")),
                "cpu_pct": percent(status.get("cpu"), 1),
                "mem": status.get("mem"), "mem_human": human_bytes(status.get("mem")),
                "maxmem": status.get("maxmem"), "maxmem_human": human_bytes(status.get("maxmem")),
                "maxdisk": status.get("maxdisk"), "maxdisk_human": human_bytes(status.get("maxdisk"))}
    return compact(summary) | {"config": config}


def list_storage(host: Host = None, node: Annotated[str | None, Field(description="Only this node.")] = None) -> dict:
    """Storages with type, content types, use and fill percentage; shared ones once."""
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
    status = task.get("status")
    if "endtime" not in task and status in (None, "running"):
        status = "running"
    return {"upid": task["upid"], "node": task.get("node"), "type": task.get("type"), "id": task.get("id") or None,
            "user": task.get("user"), "start": iso_time(task.get("starttime")), "status": status,
            "duration": human_duration((task.get("endtime") or 0) - task.get("starttime", 0))
            if task.get("endtime") else None}


def list_tasks(host: Host = None,
               node: Annotated[str | None, Field(description="Only this node (default: all nodes).")] = None,
               vmid: Annotated[int | None, Field(ge=100, description="Only tasks of this guest.")] = None,
               errors: Annotated[bool, Field(description="Only failed tasks.")] = False,
               running: Annotated[bool, Field(description="Only running tasks.")] = False,
               limit: Annotated[int, Field(ge=1, le=500)] = 20) -> dict:
    """Recent tasks (backups, starts, migrations...) newest first, with their result."""
    client = pve_client(host)
    if node:
        params: dict[str, Any] = {"limit": limit if not running else 0,
                                  "source": "active" if running else "all", "errors": errors or None,
                                  "vmid": vmid}
        tasks = client.get(f"/nodes/{node}/tasks", **params) or []
    else:
        tasks = client.get("/cluster/tasks") or []
    rows = [_task_row(t) for t in sorted(tasks, key=lambda t: -t.get("starttime", 0))]
    rows = [r for r in rows if (vmid is None or r["id"] == str(vmid))
            and (not errors or r["status"] not in ("OK", "running") and not str(r["status"]).startswith("WARNINGS"))
            and (not running or r["status"] == "running")]
    return table(["upid", "node", "type", "id", "user", "start", "status", "duration"], rows, limit=limit)


def get_task(upid: Annotated[str, Field(description="Task id (UPID) from list_tasks or a write tool.")],
             host: Host = None,
             wait_seconds: Annotated[int, Field(ge=0, le=600, description="Wait up to this long for the task to end.")] = 0,
             log_lines: Annotated[int, Field(ge=0, le=500, description="Last log lines to include.")] = 20,
             ctx: Context | None = None) -> dict:
    """Status, result and last log lines of a task; with wait_seconds, waits for it to finish
    (progress is reported while it runs)."""
    client = pve_client(host)
    parse_upid(upid, "pve")
    if wait_seconds:
        outcome = client.wait_task(upid, timeout=wait_seconds, on_progress=progress_reporter(ctx))
        if outcome["status"] == "still_running":
            return outcome
    status = client.task_status(upid)
    result = compact({"upid": upid, "node": status.get("node"), "type": status.get("type"),
                      "id": status.get("id"), "user": status.get("user"), "status": status.get("status"),
                      "exitstatus": status.get("exitstatus"), "start": iso_time(status.get("starttime"))})
    if log_lines:
        lines = client.task_log(upid, limit=0)
        result["log"] = [line["t"] for line in lines[-log_lines:]]
    if status.get("status") == "stopped":
        exit_status = status.get("exitstatus", "")
        result["result"] = "ok" if exit_status == "OK" else (
            "warnings" if exit_status.startswith("WARNINGS") else "failed")
    return result
