"""The dashboard: one picture of a cluster (node CPU, memory and storage; the busiest guests'
charts; backup coverage; health findings). Clients that render MCP Apps views draw it with
views/dashboard.html; every client gets the same content as compact JSON. It composes the answers of
health_check and backup_coverage and the guests' history (rrd.py, as metrics reads it) with one read of
/cluster/resources, and is bounded at any size: each part shows its first rows and says how many more there are.
"""
from functools import partial
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context

import health
import workflows
from answers import Host, OptionalVmid, View, human_bytes, human_duration, percent, renders_views
from errors import ToolFailure
from inventory import resolve_guest, sharing_resources
from fanout import in_parallel
from proxmox_client import pve_client
from rrd import read_history

# served as ui://proxmox/dashboard.html (tool_meta.view_uri)
VIEW_HTML = Path(__file__).with_name("views") / "dashboard.html"
# How much of each part is shown; the rest is counted ("more"). The text answer stays a few KB
# at a thousand guests (tests/test_dashboard.py).
SHOWN = {"nodes": 16, "storages": 16, "guests": 4, "backups": 20, "jobs": 6, "findings": 10}
# The guest history shown: metrics' series (per point: cpu_pct, mem in bytes, rates in bytes/s).
HISTORY = ("cpu", "mem", "netin", "netout")


def _more(total: int, shown: int) -> dict[str, int]:
    return {"more": total - shown} if total > shown else {}


def _rows(table: dict) -> list[dict]:
    """A {"columns", "rows"} answer of another tool as dicts."""
    return [dict(zip(table.get("columns", []), row, strict=True)) for row in table.get("rows", [])]


# ---------------------------------------------------------------- nodes and storage

def _nodes(resources: list[dict]) -> dict:
    nodes = sorted((r for r in resources if r.get("type") == "node"), key=lambda r: r["node"])
    rows = [[n["node"], n.get("status") or "unknown", percent(n.get("cpu"), 1), n.get("maxcpu"),
             percent(n.get("mem"), n.get("maxmem")), human_bytes(n.get("mem")), human_bytes(n.get("maxmem")),
             human_duration(n.get("uptime"))] for n in nodes[:SHOWN["nodes"]]]
    # a node without Sys.Audit comes without figures (docs/PROXMOX-BEHAVIOUR.md#cluster-resources)
    rows = [["" if cell is None else cell for cell in row] for row in rows]
    return {"columns": ["node", "status", "cpu_pct", "cores", "mem_pct", "mem", "maxmem", "uptime"], "rows": rows,
            "total": len(nodes)} | _more(len(nodes), SHOWN["nodes"])


def _storages(resources: list[dict]) -> dict:
    """Each storage once: a shared one under "(shared)", a local one per node (each node's `local`
    is its own disk: docs/PROXMOX-BEHAVIOUR.md#per-node-storages). Fullest first."""
    merged: dict[tuple[str, str], dict] = {}
    for entry in (r for r in resources if r.get("type") == "storage"):
        where = "(shared)" if entry.get("shared") else entry.get("node", "")
        row = merged.setdefault((where, entry["storage"]), dict(entry))
        if entry.get("status") != "available":  # seen unavailable anywhere: shown so
            row["status"] = entry.get("status")
    def fill(item: tuple[tuple[str, str], dict]) -> tuple[float, str, str]:
        (where, name), entry = item
        return -(percent(entry.get("disk"), entry.get("maxdisk")) or -1), where, name
    ordered = sorted(merged.items(), key=fill)
    rows = [[name, where, entry.get("plugintype") or "", entry.get("status") or "unknown",
             percent(entry.get("disk"), entry.get("maxdisk")) if entry.get("status") == "available" else "",
             human_bytes(entry.get("disk")) or "", human_bytes(entry.get("maxdisk")) or ""]
            for (where, name), entry in ordered[:SHOWN["storages"]]]
    rows = [["" if cell is None else cell for cell in row] for row in rows]
    return {"columns": ["storage", "node", "type", "status", "used_pct", "used", "total"], "rows": rows,
            "total": len(ordered)} | _more(len(ordered), SHOWN["storages"])


# ---------------------------------------------------------------- guests

def _cores_in_use(guest: dict) -> float:
    # a guest's `cpu` is a share of its own cores (docs/PROXMOX-BEHAVIOUR.md#guest-cpu-figures)
    return (guest.get("cpu") or 0) * (guest.get("maxcpu") or 0)


def _picked_guests(client: Any, resources: list[dict], vmid: int | None) -> tuple[str, list[dict]]:
    if vmid is not None:
        return f"vmid {vmid}", [resolve_guest(client, vmid)]
    running = [r for r in resources if r.get("type") in ("qemu", "lxc") and r.get("status") == "running"
               and not r.get("template")]
    return "busiest by CPU now", sorted(running, key=lambda g: (-_cores_in_use(g), int(g["vmid"])))[:SHOWN["guests"]]


def _guest_row(guest: dict) -> list:
    row = [int(guest["vmid"]), guest.get("name") or "", guest.get("type"), guest.get("node"),
           guest.get("status"), percent(guest.get("cpu"), 1), guest.get("maxcpu"),
           percent(guest.get("mem"), guest.get("maxmem")), human_bytes(guest.get("mem"))]
    return ["" if cell is None else cell for cell in row]


def _summary(series: dict) -> dict[str, str]:
    """metrics' series in a line each: CPU and memory now, their peak, trend and sparkline; the
    network's two directions now and at their peak."""
    lines = {name: f"{series[name]['last']} now, max {series[name]['max']}, {series[name]['trend']} "
                   f"{series[name]['spark']}" for name in ("cpu", "mem") if name in series}
    if "netin" in series and "netout" in series:
        lines["net"] = (f"in {series['netin']['last']}, out {series['netout']['last']} now; max in "
                        f"{series['netin']['max']}, out {series['netout']['max']}")
    return lines


def _points(raw: dict, guest: dict) -> dict[str, list]:
    """metrics' raw points (newest first) as series oldest first; memory as a share of the guest's."""
    rows = [dict(zip(raw["columns"], row, strict=True)) for row in reversed(raw["rows"])]
    top = guest.get("maxmem")
    def value(row: dict, name: str) -> float | None:  # as precise as a chart 200 points wide can show
        if name == "cpu":
            return round(row["cpu_pct"], 1) if isinstance(row.get("cpu_pct"), (int, float)) else None
        if name == "mem":
            return percent(row["mem"], top) if isinstance(row.get("mem"), (int, float)) and top else None
        return round(row[name]) if isinstance(row.get(name), (int, float)) else None
    return {name: [value(row, name) for row in rows] for name in HISTORY}


def _history(client: Any, guests: list[dict]) -> tuple[list[dict], list[dict]]:
    """The last hour of each shown guest, read once each and side by side: its summary line per series
    (for every client) and its points (for the view). A guest whose history cannot be read says why."""
    histories = in_parallel([partial(read_history, client, int(g["vmid"]), row=g) for g in guests])
    lines, charts = [], []
    for guest, history in zip(guests, histories, strict=True):
        vmid = int(guest["vmid"])
        if isinstance(history, ToolFailure):
            lines.append({"vmid": vmid, "unavailable": str(history)})
            continue
        summary, raw = history.summary(), history.raw()
        series = summary.get("series") or {}
        lines.append({"vmid": vmid} | _summary(series) | ({"note": summary["note"]} if summary.get("note") else {}))
        charts.append({"vmid": vmid, "timeframe": summary["timeframe"], "step_s": summary.get("step_s"),
                       "last": {name: series[name]["last"] for name in HISTORY if name in series},
                       "series": _points(raw, guest)})
    return lines, charts


def _guests(client: Any, resources: list[dict], vmid: int | None) -> tuple[dict, list[dict]]:
    """The busiest or the chosen guests with their last hour, and the points the view draws."""
    picked, guests = _picked_guests(client, resources, vmid)
    running = sum(1 for r in resources if r.get("type") in ("qemu", "lxc") and r.get("status") == "running")
    total = sum(1 for r in resources if r.get("type") in ("qemu", "lxc"))
    lines, charts = _history(client, guests)
    return {"picked": picked, "running": running, "total": total,
                       "columns": ["vmid", "name", "type", "node", "status", "cpu_pct", "cores", "mem_pct", "mem"],
                       "rows": [_guest_row(g) for g in guests], "last_hour": lines}, charts


# ---------------------------------------------------------------- backups: the coverage matrix

def _job_cell(row: dict, job: str) -> str:
    if job in row.get("jobs", "").split(","):
        return "covers"
    return "excludes" if job in row.get("excluded_by", "").split(",") else ""


def _backups(coverage: dict) -> dict:
    """backup_coverage as a matrix: its counts by state, then a row per guest as it ranks them (those
    that need attention first): state, newest backup and where it is, and a column per backup job of
    those guests (covers, excludes or nothing)."""
    page = coverage.get("guests") or {}
    rows = _rows(page)[:SHOWN["backups"]]
    jobs = sorted({job for r in rows for job in (r.get("jobs", "") + "," + r.get("excluded_by", "")).split(",")
                   if job})
    shown_jobs = jobs[:SHOWN["jobs"]]
    columns = ["vmid", "name", "state", "age_h", "where", "verify", *shown_jobs]
    matrix = [[r["vmid"], r.get("name") or "", r.get("state"), r.get("age_h", ""), r.get("where", ""),
               r.get("verify", ""), *(_job_cell(r, job) for job in shown_jobs)] for r in rows]
    total = page.get("total", len(rows))
    answer = {"summary": coverage.get("states") or {}, "columns": columns, "rows": matrix,
              "total": total} | _more(total, len(rows))
    if len(jobs) > len(shown_jobs):
        answer["more_jobs"] = len(jobs) - len(shown_jobs)
    if coverage.get("orphan_pbs_groups"):  # cut by backup_coverage itself, with a "+N more" entry
        answer["orphan_pbs_groups"] = coverage["orphan_pbs_groups"]
    return answer | _unread(coverage)


# ---------------------------------------------------------------- health

def _unread(report: dict) -> dict:
    """The sections a workflow could not read, by name (its own answer has the reasons; it cuts the
    list with a "+N more" entry)."""
    sections = [u["section"] for u in report.get("unavailable") or []]
    return {"unavailable": sections} if sections else {}


def _health(report: dict) -> dict:
    """health_check's counts and its first findings, worst first (findings alike come folded into one
    that counts them: health_check's answer)."""
    findings = report.get("findings") or []
    rows = [[f["severity"], f["area"], f["finding"]] for f in findings[:SHOWN["findings"]]]
    return {"summary": report.get("summary") or {}, "columns": ["severity", "area", "finding"], "rows": rows,
            "total": len(findings)} | _more(len(findings), SHOWN["findings"]) | _unread(report) | (
        {"disks": report["disks"]} if report.get("disks") else {})


# ---------------------------------------------------------------- the tool

def dashboard(host: Host = None, pbs_host: Host = None, vmid: OptionalVmid = None,
              ctx: Context | None = None) -> View:
    """Nodes, busiest guests (or vmid's), backups, findings; MCP Apps clients draw it."""
    client = pve_client(host)
    if vmid is not None:
        resolve_guest(client, vmid)  # an unknown vmid is answered with the closest ones before anything else is read
    # The inventory once; then the guests' history, the health checks and the backup coverage side by side,
    # each reading side by side within (fanout: within what each node serves at once).
    with sharing_resources(client) as resources:
        parts = in_parallel([lambda: _guests(client, resources, vmid),
                             # reads no disk list here (health.NO_SMART_IN: SMART wakes sleeping disks)
                             lambda: health.health_check(host=host, pbs_host=pbs_host),
                             lambda: workflows.backup_coverage(host=host, pbs_host=pbs_host)])
    for part in parts:
        if isinstance(part, ToolFailure):
            raise part
    (guests, charts), findings, coverage = parts
    answer = {"host": client.host.label, "nodes": _nodes(resources), "storage": _storages(resources),
              "guests": guests, "backups": _backups(coverage), "health": _health(findings),
              "note": "each part shows its first rows and counts the rest (more); health_check, backup_coverage "
                      "(by offset) and list_guests show the rest"}
    return View(answer, {"charts": charts} if renders_views(ctx) else None)
