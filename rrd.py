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


def _render(buckets: list[float | None]) -> str:
    """Bucket values from ▁ to █; a bucket without any value (the guest was off) is a space."""
    known = [b for b in buckets if b is not None]
    if not known:
        return " " * len(buckets)
    low, high = min(known), max(known)
    span = (high - low) or 1.0
    return "".join(" " if b is None else SPARK[min(7, int((b - low) / span * 8))] if high > low else SPARK[0]
                   for b in buckets)


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
    return _render(buckets)


def _direction(delta: float, scale: float) -> str:
    return "rising" if delta > 0.2 * scale else "falling" if delta < -0.2 * scale else "steady"


def trend(values: list[float]) -> str:
    """rising, falling or steady: the mean of the last third against the first third, by a fifth
    of the largest value."""
    third = max(1, len(values) // 3)
    delta = sum(values[-third:]) / third - sum(values[:third]) / third
    return _direction(delta, max(abs(v) for v in values) or 1.0)


# ---------------------------------------------------------------- each point's own interval
# A row covers the step before its time (rrdtool labels a row with its interval's end), and one
# answer can hold rows of two steps: after an upgrade from PVE 8, the old pve2 file's coarse rows
# come first (docs/PROXMOX-BEHAVIOUR.md#rrd-history). So every mean is weighted by time.

def runs(points: list[dict]) -> list[list[int]]:
    """[first, end, step] of each stretch of rows at one step, in the answer's order: a different
    step, or a row no later than the one before it, starts the next; a lone row takes the step of a
    stretch beside it."""
    found: list[list[int]] = []
    times = [int(p.get("time") or 0) for p in points]
    for index, moment in enumerate(times):
        gap = moment - times[index - 1] if index else 0
        if found and gap > 0 and found[-1][2] in (0, gap):
            found[-1][1:] = [index + 1, gap]
        else:
            found.append([index, index + 1, 0])
    for position, run in enumerate(found):
        if not run[2]:
            beside = [r[2] for r in found[max(0, position - 1):position + 2] if r[2]]
            run[2] = beside[0] if beside else 0
    return found


def spans(points: list[dict]) -> list[tuple[int, int]]:
    """(start, end) of the interval each row covers."""
    steps = [step for first, end, step in runs(points) for _ in range(first, end)]
    return [(int(p.get("time") or 0) - step, int(p.get("time") or 0)) for p, step in zip(points, steps, strict=True)]


def _pieces(column: list[float | None], covered: list[tuple[int, int]]) -> list[tuple[float, int, int]]:
    """(value, start, end) of each row with a value; where rows overlap (at the seam between the
    old and the new file) the later one keeps only what the earlier did not cover."""
    pieces, reached = [], None
    for value, (start, end) in zip(column, covered, strict=True):
        if value is None:
            continue
        start = start if reached is None else max(start, reached)
        if end > start:
            pieces.append((value, start, end))
            reached = end
    return pieces


def _buckets(pieces: list[tuple[float, int, int]], low: float, high: float, count: int) -> list[float | None]:
    """The time-weighted mean of the values in each of `count` equal slices of [low, high]."""
    width = (high - low) / count or 1.0
    sums, weights = [0.0] * count, [0.0] * count
    for value, start, end in pieces:
        for k in range(max(0, int((start - low) // width)), min(count, int((end - low) // width) + 1)):
            overlap = min(end, low + (k + 1) * width) - max(start, low + k * width)
            if overlap > 0:
                sums[k] += value * overlap
                weights[k] += overlap
    return [total / weight if weight else None for total, weight in zip(sums, weights, strict=True)]


def _weighted(values: list[float], pieces: list[tuple[float, int, int]]) -> float:
    weight = sum(end - start for _, start, end in pieces)
    if not weight:
        return sum(values) / len(values)
    return sum(value * (end - start) for value, start, end in pieces) / weight


def _shape(values: list[float], pieces: list[tuple[float, int, int]], window: tuple[int, int],
           width: int) -> tuple[str, str]:
    """The trend (last third of the time against the first) and the sparkline, both over time."""
    thirds = _buckets(pieces, *window, 3) if pieces else [None]
    if thirds[0] is None or thirds[-1] is None:
        direction = trend(values)
    else:
        direction = _direction(thirds[-1] - thirds[0], max(abs(v) for v in values) or 1.0)
    return direction, _render(_buckets(pieces, *window, width)) if pieces else sparkline(values, width)


def summarize(points: list[dict], kind: str, *, skip_disk: bool = False) -> dict:
    """Per series: min, avg, max, last, trend and a sparkline, in human units; the average, trend and
    sparkline weigh each point by the interval it covers. `of` is the ceiling (the target's cores,
    memory, disk) at the last point. Series without any value are left out."""
    series = {}
    covered = spans(points)
    window = (covered[0][0], max(end for _, end in covered)) if covered else (0, 0)
    for name, source, unit, ceiling in SERIES[kind]:
        column = [p.get(source) if isinstance(p.get(source), (int, float)) else None for p in points]
        values = [v for v in column if v is not None]
        if not values or (skip_disk and name == "disk"):
            continue
        pieces = _pieces(column, covered)
        direction, spark = _shape(values, pieces, window, min(SPARK_WIDTH, len(column)))
        entry = {"min": _format(min(values), unit), "avg": _format(_weighted(values, pieces), unit),
                 "max": _format(max(values), unit), "last": _format(values[-1], unit), "trend": direction,
                 "spark": spark}
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
    for point in reversed([p for p in points if len(p) > 1]):  # a row of only `time` holds nothing
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


MIXED = ("{steps} steps: what was recorded before the node's upgrade from PVE 8 comes from its old RRD files, "
         "at a coarser step (pve-cluster PVE/RRD.pm); averages, trend and sparkline weigh each point by its own "
         "interval.")


def _steps(points: list[dict]) -> list[dict]:
    """The stretches of one step each that hold values, oldest first (a seam between two of the same
    step is one)."""
    found: list[dict] = []
    for first, end, step in runs(points):
        valued = [p for p in points[first:end] if len(p) > 1]
        if not valued:
            continue
        if found and found[-1]["step_s"] == step:
            found[-1] |= {"to": iso_time(valued[-1].get("time")), "points": found[-1]["points"] + len(valued)}
            continue
        found.append({"step_s": step, "from": iso_time(valued[0].get("time")), "to": iso_time(valued[-1].get("time")),
                      "points": len(valued)})
    return found


@dataclass
class History:
    """One read of a target's RRD history, answered as metrics' summary or as its raw points."""
    kind: str
    header: dict  # the target, the timeframe, how many points, from, to, step(s)
    points: list[dict]  # as PVE answered them, rows of only `time` included (they tell the step)
    skip_disk: bool  # QEMU reports no disk use inside a VM: its `disk` is always 0 (qemu-server vmstatus)

    def summary(self) -> dict:
        answer = self.header | {"series": summarize(self.points, self.kind, skip_disk=self.skip_disk)}
        notes = [MIXED.format(steps=" then ".join(f"{s['step_s']} s" for s in self.header["steps"]))] \
            if "steps" in self.header else []
        if self.kind == "guest" and "cpu" not in answer["series"]:
            # a stopped guest's steps hold only its sizes (pve-manager PVE/Service/pvestatd.pm)
            notes.append("No CPU, memory or I/O values: the guest was not running in this timeframe.")
        return answer | ({"note": " ".join(notes)} if notes else {})

    def raw(self, offset: int = 0) -> dict:
        return self.header | _raw(self.points, self.kind, RAW_PAGE, offset, self.skip_disk)


def read_history(client: ProxmoxClient, vmid: int | None = None, node: str | None = None, storage: str | None = None,
                 timeframe: str = "hour", cf: str = "AVERAGE", row: dict | None = None) -> History:
    """A guest's, node's or storage's RRD history, read once (docs/PROXMOX-BEHAVIOUR.md#rrd-history);
    `row`: the guest's /cluster/resources row, when the caller has it. `step_s` is the newest step;
    `steps` lists each one when the answer holds more than one."""
    kind, path, facts = _target(client, vmid, node, storage, row)
    points = [p for p in client.get(path, timeframe=timeframe, cf=cf) or [] if isinstance(p, dict) and "time" in p]
    valued = [p for p in points if len(p) > 1]
    header = facts | {"timeframe": timeframe, "cf": cf, "points": len(valued)}
    if valued:
        steps = _steps(points)
        header |= {"from": iso_time(valued[0].get("time")), "to": iso_time(valued[-1].get("time")),
                   "step_s": steps[-1]["step_s"]} | ({"steps": steps} if len(steps) > 1 else {})
    return History(kind, header, points, facts.get("type") == "qemu")
