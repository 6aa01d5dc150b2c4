"""Monitoring tools: what the homelab is doing. `metrics` (the RRD history of a guest, a node or a
storage as a compact summary), `node_logs` (syslog, journal, firewall log; newest first, paged),
`node_disks` (disks with SMART, ZFS pools, LVM) and `node_updates` (pending packages, kernel).

All reads (toolset "monitor"). What Proxmox answers and why each reading is right:
docs/PROXMOX-BEHAVIOUR.md#node-monitoring.
"""
import calendar
import re
import time
from typing import Annotated, Any, Callable, Literal

from pydantic import Field

import policy
from answers import Host, Node, Offset, OptionalVmid, compact, human_bytes, iso_time, percent, table
from errors import InvalidArgument, ProxmoxError, ToolFailure
from inventory import (check_node, disk_problem, kernels, node_names, pending_updates, pool_problem, resolve_guest,
                       vdevs, wearout_left)
from masking import mask
from proxmox_client import ProxmoxClient, in_parallel, pve_client
from rrd import read_history

# ================================================================ metrics

def metrics(vmid: OptionalVmid = None, node: Node = None, storage: str | None = None, host: Host = None,
            timeframe: Literal["hour", "day", "week", "month", "year"] = "hour",
            cf: Literal["AVERAGE", "MAX"] = "AVERAGE", raw: bool = False, offset: Offset = 0) -> dict:
    """Of a guest (vmid), node or storage+node: min/avg/max/last, trend, sparkline; raw: points."""
    history = read_history(pve_client(host), vmid, node, storage, timeframe, cf)
    return history.raw(offset) if raw else history.summary()


# ================================================================ logs

LOG_SOURCES = ("syslog", "journal", "firewall")
LOG_LINES = 50  # lines per page, newest first
LINE_CHARS = 300  # a longer line is cut
LOG_BYTES = 8000  # line text per answer
SCAN_LINES = 2000  # lines read per call while looking for `grep` matches
JOURNAL_LINE = re.compile(r"^\w{3} \d{2} \d{2}:\d{2}:\d{2} \S+ ([^\s\[:]+)")  # time, host, identifier
RELATIVE = re.compile(r"^(\d+)([mhd])$")
ABSOLUTE = {10: "%Y-%m-%d", 16: "%Y-%m-%d %H:%M", 19: "%Y-%m-%d %H:%M:%S"}
SYSLOG_GRANT = ("needs Sys.Syslog on /nodes/{node}, which PVEAuditor lacks (pve-manager PVE/API2/Nodes.pm and "
                "pve-firewall check it). Grant a role holding only that, on / beside PVEAuditor (an entry on a "
                "deeper path would replace it there), to the user and the token: pveum role add LogReader --privs "
                "Sys.Syslog; pveum acl modify / --users '{user}' --roles LogReader; pveum acl modify / --tokens "
                "'{token}' --roles LogReader.")


def _node_offset(client: ProxmoxClient, node: str) -> int:
    """Seconds the node's clock is ahead of UTC: `localtime` is its wall clock read as UTC
    (pve-manager PVE/API2/Nodes.pm, time); journalctl reads --since in that local time."""
    clock = client.cached(f"clock:{node}", lambda: client.get(f"/nodes/{node}/time") or {}, 3600)
    return int(clock.get("localtime", 0)) - int(clock.get("time", 0))


def _moment(text: str | None, client: ProxmoxClient, node: str, what: str) -> int | None:
    """An epoch from `2h`/`30m`/`3d` (ago) or `YYYY-MM-DD[ HH:MM[:SS]]` in the node's local time."""
    if not text:
        return None
    text = text.strip()
    relative = RELATIVE.match(text)
    if relative:
        return int(time.time()) - int(relative.group(1)) * {"m": 60, "h": 3600, "d": 86400}[relative.group(2)]
    shape = ABSOLUTE.get(len(text))
    try:
        if shape is None:
            raise ValueError
        local = calendar.timegm(time.strptime(text, shape))
    except ValueError:
        raise InvalidArgument(f"node_logs: {what} '{text}' is neither a time ago like '2h', '30m', '3d' nor "
                              f"'YYYY-MM-DD HH:MM' (the node's local time). Nothing was sent.") from None
    return local - _node_offset(client, node)


def _local_text(epoch: int | None, client: ProxmoxClient, node: str) -> str | None:
    if epoch is None:
        return None
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(epoch + _node_offset(client, node)))


def _clean(text: str) -> str:
    text = mask(text)  # log lines carry what programs print, secrets included
    return text if len(text) <= LINE_CHARS else text[:LINE_CHARS] + "…"


class Page:
    """Lines collected newest first until the limit or the byte budget is reached; `keep` and
    `grep` choose the lines (then the logs are read in larger windows)."""

    def __init__(self, limit: int, grep: str | None):
        self.limit, self.lines, self.bytes = limit, [], 0
        self.pattern = grep.lower() if grep else None
        self.keep: Callable[[str], bool] | None = None

    @property
    def filtering(self) -> bool:
        return bool(self.pattern or self.keep)

    def offer(self, text: str) -> bool:
        """Take a line if it is wanted; False once the page is full (the line was not taken)."""
        if (self.keep and not self.keep(text)) or (self.pattern and self.pattern not in text.lower()):
            return True
        line = _clean(text)
        if len(self.lines) >= self.limit or self.bytes + len(line) > LOG_BYTES:
            return False
        self.lines.append(line)
        self.bytes += len(line)
        return True


def _numbered_log(client: ProxmoxClient, path: str, params: dict, page: Page, before: int | None) -> int | None:
    """A log whose lines are numbered from the oldest (`n`, the envelope's `total` counting them all):
    read backwards in windows from line `before` (exclusive; the end without it). Answers the line
    number to continue below, None once the oldest line was read."""
    if before is None:
        first, total = client.get_counted(path, start=0, limit=1, **params)
        empty = not first or (total == 1 and first[0].get("t") == "no content")  # dump_logfile's filler
        before = 1 if empty else (total or len(first)) + 1
    scanned = 0
    while before > 1 and scanned < SCAN_LINES:
        window = min(before - 1, 500 if page.filtering else page.limit)
        start = before - 1 - window
        for line in sorted(client.get(path, start=start, limit=window, **params) or [], key=lambda x: -x.get("n", 0)):
            if not page.offer(str(line.get("t", ""))):
                return int(line.get("n", start)) + 1
        before, scanned = start + 1, scanned + window
    return before if before > 1 else None


def _syslog(client: ProxmoxClient, node: str, ask: dict, page: Page) -> Any:
    params = {"service": ask["service"], "since": _local_text(ask["since"], client, node),
              "until": _local_text(ask["until"], client, node)}
    return _numbered_log(client, f"/nodes/{node}/syslog", params, page, ask["position"])


def _firewall(client: ProxmoxClient, node: str, ask: dict, page: Page) -> Any:
    """The node's firewall log, or a guest's: the guest's own endpoint needs VM.Console (which also
    opens its console); without it, the node's log filtered the same way, by the vmid each line
    starts with (pve-firewall src/PVE/API2/Firewall/VM.pm, log)."""
    path, vmid = f"/nodes/{node}/firewall/log", ask["vmid"]
    if vmid and policy.holds(client.host, "VM.Console", f"/vms/{vmid}") is not False:
        path = f"/nodes/{node}/{resolve_guest(client, vmid)['type']}/{vmid}/firewall/log"
    elif vmid:
        page.keep = lambda text: text.startswith(f"{vmid} ")
    return _numbered_log(client, path, {"since": ask["since"], "until": ask["until"]}, page, ask["position"])


def _journal(client: ProxmoxClient, node: str, ask: dict, page: Page) -> Any:
    """The journal backwards. Position `cursor~k`: the k newest entries before that journal cursor
    (before `until` without one) were shown. Without `since`, windows of the last N entries before
    it, each next one before the first entry of the last; with `since` (the reader refuses N with a
    start), the whole range up to `until`, fixed at the first page (docs/PROXMOX-BEHAVIOUR.md#system-logs)."""
    end_cursor, _, skipped = (ask["position"] or "~0").rpartition("~")
    skip, scanned = int(skipped or 0), 0
    while scanned < SCAN_LINES:
        window = 500 if page.filtering else page.limit
        params: dict[str, Any] = {"endcursor": end_cursor or None, "until": None if end_cursor else ask["until"]}
        params |= {"since": ask["since"]} if ask["since"] else {"lastentries": skip + window}
        answer = client.get(f"/nodes/{node}/journal", **params) or []
        lines = answer[1:-1]  # the first and the last are cursors
        candidates = lines[:max(0, len(lines) - skip)]
        for taken, text in enumerate(reversed(candidates)):
            if not page.offer(text):
                return f"{end_cursor}~{skip + taken}"
        if ask["since"] or len(lines) < skip + window or not answer:
            return None
        end_cursor, skip, scanned = answer[0], 0, scanned + window
    return f"{end_cursor}~{skip}"


READERS = {"syslog": _syslog, "journal": _journal, "firewall": _firewall}


def _parse_cursor(cursor: str | None) -> dict:
    """`source|position|since|until|service|vmid`, as the previous page answered it."""
    if not cursor:
        return {}
    parts = cursor.split("|")
    try:
        source, position, since, until, service, vmid = parts
        if source not in LOG_SOURCES:
            raise ValueError
        return {"source": source, "position": (int(position) if source != "journal" else position) or None,
                "since": int(since) if since else None, "until": int(until) if until else None,
                "service": service or None, "vmid": int(vmid) if vmid else None}
    except ValueError:
        raise InvalidArgument("node_logs: cursor is not one this tool answered; pass next_cursor as it came. "
                              "Nothing was sent.") from None


CURSOR_FIELDS = ("source", "position", "since", "until", "service", "vmid")


def _as_cursor(ask: dict, position: Any) -> str:
    values = ask | {"position": position}
    return "|".join("" if values.get(k) is None else str(values[k]) for k in CURSOR_FIELDS)


def _syslog_grant(client: ProxmoxClient, node: str) -> ProxmoxError:
    user, _, token = client.host.token_id.partition("!")
    return ProxmoxError(f"Reading the log of node '{node}' " + SYSLOG_GRANT.format(
        node=node, user=user, token=client.host.token_id if token else user), status=403)


def _needs_syslog(client: ProxmoxClient, ask: dict) -> bool:
    """Every log read needs Sys.Syslog on the node, but a guest's firewall log read through the
    guest's own endpoint (VM.Console) (docs/PROXMOX-BEHAVIOUR.md#system-logs)."""
    return not (ask["vmid"] and policy.holds(client.host, "VM.Console", f"/vms/{ask['vmid']}") is not False)


def node_logs(node: Node = None, host: Host = None,
              source: Literal["syslog", "journal", "firewall"] = "syslog",
              vmid: OptionalVmid = None,
              since: Annotated[str | None, Field(description="2h or YYYY-MM-DD HH:MM")] = None,
              until: str | None = None, service: str | None = None, grep: str | None = None,
              cursor: str | None = None) -> dict:
    """Syslog, journal or firewall log of a node (or vmid's), newest first; cursor pages back."""
    client = pve_client(host)
    ask = _parse_cursor(cursor) or {"source": "firewall" if vmid else source, "service": service, "vmid": vmid,
                                    "position": None}
    if ask["vmid"]:
        node = resolve_guest(client, ask["vmid"])["node"]
    elif not node:
        raise InvalidArgument("node_logs needs the node (or vmid for a guest's firewall log). Nothing was sent.")
    node = check_node(client, node)
    if not cursor:
        ask["since"], ask["until"] = _moment(since, client, node, "since"), _moment(until, client, node, "until")
        if ask["source"] == "journal" and ask["since"] and not ask["until"]:
            ask["until"] = int(time.time())  # the range read again for each page must not grow
    page = Page(LOG_LINES, grep)
    if ask["source"] == "journal" and ask["service"]:  # this API's journal takes no service: its identifier
        wanted = ask["service"].removesuffix(".service")
        page.keep = lambda text: (m := JOURNAL_LINE.match(text)) is not None and m.group(1) == wanted  # noqa: E731
    if _needs_syslog(client, ask) and policy.holds(client.host, "Sys.Syslog", f"/nodes/{node}") is False:
        raise _syslog_grant(client, node)  # known before sending: say the one grant it takes
    try:
        position = READERS[ask["source"]](client, node, ask, page)
    except ProxmoxError as exc:
        if exc.status == 403 and _needs_syslog(client, ask):  # privileges not read: Proxmox refused
            raise _syslog_grant(client, node) from None
        raise
    answer = compact({"node": node, "source": ask["source"], "vmid": ask["vmid"],
                      "next_cursor": _as_cursor(ask, position) if position is not None else None}) | {
        "lines": page.lines, "untrusted": True}
    if not page.lines:
        answer["note"] = "nothing matched in this range" if page.filtering else "the log is empty in this range"
    return answer


# ================================================================ disks

def _disk_rows(disks: list[dict]) -> dict:
    rows = [{"disk": d.get("devpath"), "type": d.get("type"), "size": human_bytes(d.get("size")),
             "model": d.get("model"), "health": d.get("health"),
             "life_left_pct": wearout_left(d), "used": d.get("used"), "problem": disk_problem(d)} for d in disks]
    columns = ["disk", "type", "size", "model", "health", "life_left_pct", "used"]
    return table(columns + (["problem"] if any(r["problem"] for r in rows) else []), rows)


def _pool_rows(pools: list[dict], details: list[Any]) -> list[dict]:
    rows = []
    for pool, detail in zip(pools, details, strict=True):
        row = {"pool": pool.get("name"), "state": pool.get("health"), "size": human_bytes(pool.get("size")),
               "used_pct": percent(pool.get("alloc"), pool.get("size")), "frag_pct": pool.get("frag")}
        if isinstance(detail, ToolFailure):
            row["detail"] = f"not read: {str(detail)[:150]}"
        else:
            bad = [compact({"name": d["name"], "state": d.get("state"), "read": d.get("read"), "write": d.get("write"),
                            "cksum": d.get("cksum"), "msg": d.get("msg")})
                   for d in vdevs(detail) if not d.get("children")
                   and (d.get("state") not in (None, "ONLINE") or d.get("read") or d.get("write") or d.get("cksum"))]
            row |= compact({"errors": detail.get("errors"), "scan": detail.get("scan"), "action": detail.get("action"),
                            "problem": pool_problem(detail), "bad_devices": bad[:6]})
        rows.append(compact(row))
    return rows


def _volume_groups(lvm: dict) -> list[dict]:
    return [{"vg": vg.get("name"), "size": human_bytes(vg.get("size")),
             "used_pct": percent((vg.get("size") or 0) - (vg.get("free") or 0), vg.get("size"))}
            for vg in lvm.get("children") or []]


def _thin_pools(pools: list[dict]) -> list[dict]:
    return [{"pool": f"{p.get('vg')}/{p.get('lv')}", "size": human_bytes(p.get("lv_size")),
             "used_pct": percent(p.get("used"), p.get("lv_size")),
             "metadata_pct": percent(p.get("metadata_used"), p.get("metadata_size"))} for p in pools]


def _smart(client: ProxmoxClient, node: str, disk: str) -> dict:
    if not re.fullmatch(r"/dev/[a-zA-Z0-9/]+", disk):
        raise InvalidArgument(f"node_disks: smart must be a disk's path such as /dev/sda (got {disk[:40]!r}). "
                              f"Nothing was sent.")
    data = client.get(f"/nodes/{node}/disks/smart", disk=disk) or {}
    result: dict[str, Any] = {"disk": disk, "health": data.get("health")}
    if data.get("attributes"):
        rows = [{k: a.get(k) for k in ("id", "name", "value", "worst", "threshold", "raw", "fail")}
                for a in data["attributes"]]
        result["attributes"] = table(["id", "name", "value", "worst", "threshold", "raw", "fail"], rows, limit=40)
    elif data.get("text"):  # NVMe and SAS: smartctl's own lines
        result["text"] = [line.strip() for line in str(data["text"]).splitlines() if line.strip()][:40]
    return result


def node_disks(node: str, host: Host = None,
               smart: str | None = None) -> dict:
    """SMART health, life left; ZFS, LVM, thin pools; smart=/dev/sdX: its attributes."""
    client = pve_client(host)
    node = check_node(client, node)
    base = f"/nodes/{node}/disks"
    names = ("disks", "zfs", "lvm", "lvmthin")
    reads = in_parallel([lambda: client.get(f"{base}/list"), lambda: client.get(f"{base}/zfs"),
                         lambda: client.get(f"{base}/lvm"), lambda: client.get(f"{base}/lvmthin")])
    got = dict(zip(names, reads, strict=True))
    if all(isinstance(value, ToolFailure) for value in reads):
        raise reads[0]  # nothing could be read (the node is down, say): one clear error
    answer: dict[str, Any] = {"node": node}
    unread = {name: str(value)[:200] for name, value in got.items() if isinstance(value, ToolFailure)}
    if "disks" not in unread:
        answer["disks"] = _disk_rows(got["disks"] or [])
    if "zfs" not in unread:
        pools = got["zfs"] or []
        details = in_parallel([lambda p=p: client.get(f"{base}/zfs/{p['name']}") for p in pools])
        answer["zfs_pools"] = _pool_rows(pools, details)
    if "lvm" not in unread:
        answer["volume_groups"] = _volume_groups(got["lvm"] or {})
    if "lvmthin" not in unread:
        answer["thin_pools"] = _thin_pools(got["lvmthin"] or [])
    if smart:
        answer["smart"] = _smart(client, node, smart)
    if unread:
        answer["unavailable"] = unread
    return answer


# ================================================================ updates

def _pending(versions: list[dict], everything: list[dict] | None) -> dict:
    packages, by_origin = pending_updates(versions, everything)
    names = [f"{p.get('Package')} {p.get('OldVersion', '')}→{p.get('Version')}" for p in packages[:8]]
    return {"pending": len(packages), "by_origin": by_origin, "packages": names + (
        [f"+{len(packages) - 8} more"] if len(packages) > 8 else [])}


def _refreshed(client: ProxmoxClient, node: str) -> dict:
    """When the package list was last refreshed: the newest `aptupdate` task, which pveupdate runs
    daily (pve-manager bin/pveupdate, PVE/API2/APT.pm update_database)."""
    tasks = client.get(f"/nodes/{node}/tasks", typefilter="aptupdate", limit=1) or []
    if not tasks:
        return {"list_refreshed": "no aptupdate task in the node's task list"}
    task = tasks[0]
    return compact({"list_refreshed": iso_time(task.get("endtime") or task.get("starttime")),
                    "refresh_result": task.get("status") if task.get("status") not in (None, "OK") else None})


def node_update_status(client: ProxmoxClient, node: str) -> dict:
    """One node's pending packages, kernel and list age. The whole list needs Sys.Modify (APT.pm
    list_updates checks it); without it, the packages `versions` covers (Proxmox's own and the
    kernels), which needs Sys.Audit."""
    full = policy.holds(client.host, "Sys.Modify", f"/nodes/{node}") is True
    calls = [lambda: client.get(f"/nodes/{node}/apt/versions") or [], lambda: _refreshed(client, node)]
    if full:
        calls.append(lambda: client.get(f"/nodes/{node}/apt/update") or [])
    versions, refreshed, *everything = in_parallel(calls)
    for result in (versions, *everything):
        if isinstance(result, ToolFailure):
            raise result
    row = {"node": node} | kernels(versions) | (refreshed if isinstance(refreshed, dict) else {})
    if full:
        return row | _pending(versions, everything[0]) | {"security": SECURITY_UNKNOWN}
    return row | _pending(versions, None) | {"covers": "Proxmox packages and kernels only: the full list needs "
                                                       "Sys.Modify"}


SECURITY_UNKNOWN = "not told: each package names its origin (Debian, Proxmox), not the Debian-Security archive"


def node_updates(node: Node = None, host: Host = None) -> dict:
    """Per node: pending, running vs newest kernel, list refresh time."""
    client = pve_client(host)
    nodes = [check_node(client, node)] if node else node_names(client)
    results = in_parallel([lambda n=n: node_update_status(client, n) for n in nodes])
    rows = [r for r in results if isinstance(r, dict)]
    answer: dict[str, Any] = {"nodes": rows}
    failed = {n: str(r)[:200] for n, r in zip(nodes, results, strict=True) if isinstance(r, ToolFailure)}
    if failed:
        answer["unavailable"] = failed
    return answer
