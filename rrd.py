"""A guest's, node's or storage's RRD history (`rrddata`), read once and answered as a summary per
series (min, avg, max, last, trend, sparkline) or as raw points, newest first and paged. metrics
and the dashboard share it (docs/PROXMOX-BEHAVIOUR.md#rrd-history).
"""
from dataclasses import dataclass
from typing import Any

from answers import compact, human_bytes, iso_time, percent, table
from errors import InvalidArgument
from inventory import check_node, resolve_guest, storage_node
from proxmox_client import ProxmoxClient

# What each kind of target records (pve-cluster src/pmxcfs/status.c): (answer name, RRD source,
# unit, the source holding its ceiling). cpu is a fraction of the target's cores; net and disk
# I/O are DERIVE sources, i.e. bytes per second (docs/PROXMOX-BEHAVIOUR.md#rrd-history).
SERIES = {
    "guest": [("cpu", "cpu", "cores", "maxcpu"), ("mem", "mem", "bytes", "maxmem"),
              ("disk", "disk", "bytes", "maxdisk"), ("netin", "netin", "rate", None),
              ("netout", "netout", "rate", None), ("diskread", "diskread", "rate", None),
              ("diskwrite", "diskwrite", "rate", None)],
    "node": [("cpu", "cpu", "cores", "maxcpu"), ("iowait", "iowait", "share", None),
             ("load", "loadavg", "number", None), ("mem", "memused", "bytes", "memtotal"),
             ("swap", "swapused", "bytes", "swaptotal"),
             ("rootfs", "rootused", "bytes", "roottotal"), ("netin", "netin", "rate", None),
             ("netout", "netout", "rate", None)],
    "storage": [("used", "used", "bytes", "total")],
}
SPARK = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 24


def _format(value: float, unit: str) -> Any:
    if unit in ("cores", "share"):
        return f"{value * 100:.1f}%"
    if unit == "bytes":
        return human_bytes(value)
    if unit == "rate":
        return f"{human_bytes(value)}/s"
    return round(value, 2)


def sparkline(values: list[float | None], width: int = SPARK_WIDTH) -> str:
    """The values in at most `width` characters from ▁ to █ (each the mean of its share of the
    points); a share without any value (the guest was off) is a space."""
    if not values:
        return ""
    size = max(1, -(-len(values) // width))
    buckets = []
    for start in range(0, len(values), size):
        present = [v for v in values[start:start + size] if v is not None]
        buckets.append(sum(present) / len(present) if present else None)
    known = [b for b in buckets if b is not None]
    low, high = min(known), max(known)
    span = (high - low) or 1.0
    return "".join(" " if b is None else SPARK[min(7, int((b - low) / span * 8))] if high > low else SPARK[0]
                   for b in buckets)


def trend(values: list[float]) -> str:
    """rising, falling or steady: the mean of the last third against the first third, by a fifth
    of the largest value."""
    third = max(1, len(values) // 3)
    delta = sum(values[-third:]) / third - sum(values[:third]) / third
    scale = max(abs(v) for v in values) or 1.0
    return "rising" if delta > 0.2 * scale else "falling" if delta < -0.2 * scale else "steady"


def summarize(points: list[dict], kind: str, *, skip_disk: bool = False) -> dict:
    """Per series: min, avg, max, last, trend and a sparkline, in human units; `of` is the ceiling
    (the target's cores, memory, disk) at the last point. Series without any value are left out."""
    series = {}
    for name, source, unit, ceiling in SERIES[kind]:
        column = [p.get(source) if isinstance(p.get(source), (int, float)) else None for p in points]
        values = [v for v in column if v is not None]
        if not values or (skip_disk and name == "disk"):
            continue
        entry = {"min": _format(min(values), unit), "avg": _format(sum(values) / len(values), unit),
                 "max": _format(max(values), unit), "last": _format(values[-1], unit), "trend": trend(values),
                 "spark": sparkline(column)}
        top = next((p.get(ceiling) for p in reversed(points) if p.get(ceiling)), None) if ceiling else None
        if top:
            entry["of"] = f"{top:g} cores" if unit == "cores" else human_bytes(top)  # a CT may have 1.5
            if unit == "bytes":
                entry["last_pct"] = percent(values[-1], top)
        series[name] = entry
    return series


def _target(client: ProxmoxClient, vmid: int | None, node: str | None, storage: str | None,
            row: dict | None = None) -> tuple[str, str, dict]:
    """(kind, rrddata path, facts about the target) for a guest (its resources `row` when the caller
    has it), a storage (on a node) or a node."""
    if vmid is not None:
        if storage:
            raise InvalidArgument("metrics: give vmid or storage, not both.")
        row = row or resolve_guest(client, vmid)
        return "guest", f"/nodes/{row['node']}/{row['type']}/{vmid}/rrddata", compact(
            {"vmid": vmid, "name": row.get("name"), "type": row["type"], "node": row["node"],
             "status": row.get("status")})
    if storage:
        where = storage_node(client, storage, node)
        return "storage", f"/nodes/{where}/storage/{storage}/rrddata", {"storage": storage, "node": where}
    if node:
        return "node", f"/nodes/{check_node(client, node)}/rrddata", {"node": node}
    raise InvalidArgument("metrics needs a vmid, a node, or a storage (with node when it is not shared). "
                          "Nothing was sent.")


RAW_COLUMNS = {"cores": "{}_pct", "share": "{}_pct"}


def _raw(points: list[dict], kind: str, limit: int, offset: int, skip_disk: bool) -> dict:
    """The points newest first, paged; percentages as numbers, bytes and rates as they are."""
    rows = []
    for point in reversed(points):
        row: dict[str, Any] = {"time": iso_time(point.get("time"))}
        for name, source, unit, _ in SERIES[kind]:
            value = point.get(source)
            if isinstance(value, (int, float)) and not (skip_disk and name == "disk"):
                row[RAW_COLUMNS.get(unit, "{}").format(name)] = round(value * 100, 2) if unit in RAW_COLUMNS \
                    else round(value, 2)
        rows.append(row)
    columns = ["time"] + [RAW_COLUMNS.get(unit, "{}").format(name) for name, _, unit, _ in SERIES[kind]
                          if any(RAW_COLUMNS.get(unit, "{}").format(name) in r for r in rows)]
    return table(columns, rows, limit=limit, offset=offset)


RAW_PAGE = 60  # points per page of raw=true


@dataclass
class History:
    """One read of a target's RRD history, answered as metrics' summary or as its raw points."""
    kind: str
    header: dict  # the target, the timeframe, how many points, from, to, step
    points: list[dict]
    skip_disk: bool  # QEMU reports no disk use inside a VM: its `disk` is always 0 (qemu-server vmstatus)

    def summary(self) -> dict:
        answer = self.header | {"series": summarize(self.points, self.kind, skip_disk=self.skip_disk)}
        if self.kind == "guest" and "cpu" not in answer["series"]:
            # a stopped guest's steps hold only its sizes (pve-manager PVE/Service/pvestatd.pm)
            answer["note"] = "No CPU, memory or I/O values: the guest was not running in this timeframe."
        return answer

    def raw(self, offset: int = 0) -> dict:
        return self.header | _raw(self.points, self.kind, RAW_PAGE, offset, self.skip_disk)


def read_history(client: ProxmoxClient, vmid: int | None = None, node: str | None = None, storage: str | None = None,
                 timeframe: str = "hour", cf: str = "AVERAGE", row: dict | None = None) -> History:
    """A guest's, node's or storage's RRD history, read once (docs/PROXMOX-BEHAVIOUR.md#rrd-history);
    `row`: the guest's /cluster/resources row, when the caller has it."""
    kind, path, facts = _target(client, vmid, node, storage, row)
    points = [p for p in client.get(path, timeframe=timeframe, cf=cf) or [] if len(p) > 1]
    header = facts | {"timeframe": timeframe, "cf": cf, "points": len(points)}
    if points:
        step = points[1]["time"] - points[0]["time"] if len(points) > 1 else 0
        header |= {"from": iso_time(points[0].get("time")), "to": iso_time(points[-1].get("time")),
                   "step_s": step}
    return History(kind, header, points, facts.get("type") == "qemu")
