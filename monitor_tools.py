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

import privileges
from answers import Host, Node, Offset, OptionalVmid, capped, compact, human_bytes, iso_time, percent, table
from errors import InvalidArgument, ProxmoxError, ToolFailure
from inventory import (check_node, device_problem, disk_problem, kernels, node_names, pending_updates, pool_devices,
                       pool_problem, resolve_guest, wearout_left)
from masking import mask
from fanout import in_parallel
from proxmox_client import ProxmoxClient, pve_client
from rrd import read_history

# ================================================================ metrics

def metrics(vmid: OptionalVmid = None, node: Node = None, storage: str | None = None, host: Host = None,
            timeframe: Literal["hour", "day", "week", "month", "year"] = "hour",
            cf: Literal["AVERAGE", "MAX"] = "AVERAGE", raw: bool = False, offset: Offset = 0) -> dict:
    """A guest, node or storage+node: min/avg/max/last, trend, sparkline; raw: points."""
    history = read_history(pve_client(host), vmid, node, storage, timeframe, cf)
    return history.raw(offset) if raw else history.summary()


# ================================================================ logs

LOG_SOURCES = ("syslog", "journal", "firewall")
LOG_LINES = 50  # lines per page, newest first
LINE_CHARS = 300  # a longer line is cut
LOG_BYTES = 8000  # line text per answer
SCAN_LINES = 2000  # lines read per call while looking for `grep` matches
# Reads that name a time range cost the node the whole range (journalctl, mini-journalreader): such a
# log is read newest first in windows of time, each sized to hold about WINDOW_TARGET lines
# (docs/PROXMOX-BEHAVIOUR.md#system-logs). The syslog reaches back LOOKBACK without `since`.
FIRST_SPAN, MIN_SPAN, MAX_SPAN = 600, 60, 7 * 86400  # seconds a window covers
WINDOW_TARGET, WINDOW_LINES = 400, 500  # lines a window should hold; most lines one syslog read brings
WINDOW_READS = 12  # reads per call at most
# The one line of a range without entries: journalctl's, and dump_journal's filler when nothing came
# (docs/PROXMOX-BEHAVIOUR.md#system-logs)
NOTHING = ("-- No entries --", "no content")
LOOKBACK = 7 * 86400  # the syslog read without `since`: its last 7 days
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

    @property
    def full(self) -> bool:
        """Whether the page holds its lines: the next window is the next page's to read."""
        return len(self.lines) >= self.limit

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
    while before > 1 and scanned < SCAN_LINES and not page.full:
        window = min(before - 1, 500 if page.filtering else page.limit)
        start = before - 1 - window
        for line in sorted(client.get(path, start=start, limit=window, **params) or [], key=lambda x: -x.get("n", 0)):
            if not page.offer(str(line.get("t", ""))):
                return int(line.get("n", start)) + 1
        before, scanned = start + 1, scanned + window
    return before if before > 1 else None


def _syslog(client: ProxmoxClient, node: str, ask: dict, page: Page) -> Any:
    """The syslog in windows of time: `since` and `until` in the node's local time (journalctl reads
    entries from `since` up to `until`), the first WINDOW_LINES of a window with its count; a window
    holding more is read again for its newest unshown lines."""
    def window(low: int, high: int, skip: int) -> tuple[list[str], int, bool]:
        params = {"service": ask["service"], "since": _local_text(low, client, node),
                  "until": _local_text(high, client, node)}
        rows, total = client.get_counted(f"/nodes/{node}/syslog", start=0, limit=WINDOW_LINES, **params)
        if total == 1 and rows and rows[0].get("t") in NOTHING:
            return [], 0, True
        total = total or len(rows)
        left = total - skip
        if left > len(rows):  # the newest unshown lines lie beyond the first WINDOW_LINES
            rows = client.get(f"/nodes/{node}/syslog", start=left - WINDOW_TARGET, limit=WINDOW_TARGET,
                              **params) or []
            return [str(r.get("t", "")) for r in rows], total, False
        return [str(r.get("t", "")) for r in rows[:max(0, left)]], total, True
    return _windows(ask, page, window)


def _windows(ask: dict, page: Page, window: Callable[[int, int, int], tuple[list[str], int, bool]]) -> str | None:
    """A log read newest first in windows of time from `until` (now) back to `since`. Position
    `high~skip~span`: the `skip` newest lines before `high` were shown, and the next window reaches
    `span` seconds back from `high`. `window(low, high, skip)` answers the window's lines that were
    not shown yet (oldest first; the newest of them when `complete` is False), and how many it
    holds: what the read cost the node, which sizes the next window."""
    high, skip, span = (int(part) for part in ask["position"].split("~")) if ask["position"] else \
        (ask["until"] or int(time.time()) + 1, 0, FIRST_SPAN)
    for _ in range(WINDOW_READS):
        if page.full:
            break
        low = max(ask["since"], high - span)
        lines, total, complete = window(low, high, skip)
        for taken, text in enumerate(reversed(lines)):
            if not page.offer(text):
                return f"{high}~{skip + taken}~{span}"
        # at most four times as long: a quiet hour says little about the day before it
        span = min(MAX_SPAN, span * 4, max(MIN_SPAN, span * WINDOW_TARGET // max(total, 1)))
        if not complete:  # older lines of this window are left: the same end, a shorter window
            skip += len(lines)
            continue
        if low <= ask["since"]:
            return None
        high, skip = low, max(0, skip - total)
    return f"{high}~{skip}~{span}"


def _firewall(client: ProxmoxClient, node: str, ask: dict, page: Page) -> Any:
    """The node's firewall log, or a guest's: the guest's own endpoint needs VM.Console (which also
    opens its console); without it, the node's log filtered the same way, by the vmid each line
    starts with (pve-firewall src/PVE/API2/Firewall/VM.pm, log)."""
    path, vmid = f"/nodes/{node}/firewall/log", ask["vmid"]
    if vmid and privileges.holds(client.host, "VM.Console", f"/vms/{vmid}") is not False:
        path = f"/nodes/{node}/{resolve_guest(client, vmid)['type']}/{vmid}/firewall/log"
    elif vmid:
        page.keep = lambda text: text.startswith(f"{vmid} ")
    return _numbered_log(client, path, {"since": ask["since"], "until": ask["until"]}, page, ask["position"])


def _journal(client: ProxmoxClient, node: str, ask: dict, page: Page) -> Any:
    """The journal backwards. Without `since`: position `cursor~k`, the k newest entries before that
    journal cursor (before `until` without one) were shown; windows of the last N entries before
    it, each next one before the first entry of the last (mini-journalreader -n, which costs N).
    With `since` (the reader refuses N with a start, and a range costs all of it), windows of time
    as the syslog's (docs/PROXMOX-BEHAVIOUR.md#system-logs)."""
    if ask["since"]:
        def window(low: int, high: int, skip: int) -> tuple[list[str], int, bool]:
            answer = client.get(f"/nodes/{node}/journal", since=low, until=high) or []
            lines = answer[1:-1]  # the first and the last are cursors
            return lines[:max(0, len(lines) - skip)], len(lines), True
        return _windows(ask, page, window)
    end_cursor, _, skipped = (ask["position"] or "~0").rpartition("~")
    skip, scanned = int(skipped or 0), 0
    while scanned < SCAN_LINES and not page.full:
        window = 500 if page.filtering else page.limit
        params: dict[str, Any] = {"endcursor": end_cursor or None, "until": None if end_cursor else ask["until"],
                                  "lastentries": skip + window}
        answer = client.get(f"/nodes/{node}/journal", **params) or []
        lines = answer[1:-1]  # the first and the last are cursors
        candidates = lines[:max(0, len(lines) - skip)]
        for taken, text in enumerate(reversed(candidates)):
            if not page.offer(text):
                return f"{end_cursor}~{skip + taken}"
        if len(lines) < skip + window or not answer:
            return None
        end_cursor, skip, scanned = answer[0], 0, scanned + window
    return f"{end_cursor}~{skip}"


READERS = {"syslog": _syslog, "journal": _journal, "firewall": _firewall}


WINDOW_POSITION = re.compile(r"\d+~\d+~\d+")  # high~skip~span (_windows)


def _parse_cursor(cursor: str | None) -> dict:
    """`source|position|since|until|service|vmid|lookback`, as the previous page answered it."""
    if not cursor:
        return {}
    try:
        source, position, since, until, service, vmid, lookback = cursor.split("|")
        windowed = source == "syslog" or (source == "journal" and since)
        if source not in LOG_SOURCES or (windowed and position and not WINDOW_POSITION.fullmatch(position)):
            raise ValueError
        return {"source": source, "position": (int(position) if source == "firewall" else position) or None,
                "since": int(since) if since else None, "until": int(until) if until else None,
                "service": service or None, "vmid": int(vmid) if vmid else None, "lookback": bool(lookback)}
    except ValueError:
        raise InvalidArgument("node_logs: cursor is not one this tool answered; pass next_cursor as it came. "
                              "Nothing was sent.") from None


CURSOR_FIELDS = ("source", "position", "since", "until", "service", "vmid", "lookback")


def _as_cursor(ask: dict, position: Any) -> str:
    values = ask | {"position": position, "lookback": "1" if ask.get("lookback") else None}
    return "|".join("" if values.get(k) is None else str(values[k]) for k in CURSOR_FIELDS)


def _syslog_grant(client: ProxmoxClient, node: str) -> ProxmoxError:
    user, _, token = client.host.token_id.partition("!")
    return ProxmoxError(f"Reading the log of node '{node}' " + SYSLOG_GRANT.format(
        node=node, user=user, token=client.host.token_id if token else user), status=403)


def _needs_syslog(client: ProxmoxClient, ask: dict) -> bool:
    """Every log read needs Sys.Syslog on the node, but a guest's firewall log read through the
    guest's own endpoint (VM.Console) (docs/PROXMOX-BEHAVIOUR.md#system-logs)."""
    return not (ask["vmid"] and privileges.holds(client.host, "VM.Console", f"/vms/{ask['vmid']}") is not False)


def node_logs(node: Node = None, host: Host = None,
              source: Literal["syslog", "journal", "firewall"] = "syslog",
              vmid: OptionalVmid = None,
              since: Annotated[str | None, Field(description="2h or YYYY-MM-DD HH:MM")] = None,
              until: str | None = None, service: str | None = None, grep: str | None = None,
              cursor: str | None = None) -> dict:
    """A node's (or vmid's) log, newest first; cursor pages back."""
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
        if ask["source"] == "syslog" and not ask["since"]:  # a syslog read always names its range
            ask["since"], ask["lookback"] = (ask["until"] or int(time.time())) - LOOKBACK, True
    page = Page(LOG_LINES, grep)
    if ask["source"] == "journal" and ask["service"]:  # this API's journal takes no service: its identifier
        wanted = ask["service"].removesuffix(".service")
        page.keep = lambda text: (m := JOURNAL_LINE.match(text)) is not None and m.group(1) == wanted  # noqa: E731
    if _needs_syslog(client, ask) and privileges.holds(client.host, "Sys.Syslog", f"/nodes/{node}") is False:
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
    if position is None and ask.get("lookback"):
        answer["note"] = (answer.get("note", "") + "; " * bool(answer.get("note")) +
                          f"read back to {_local_text(ask['since'], client, node)} (7 days); since= reads further")
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
            devices = pool_devices(detail)
            bad = [compact({"name": d["name"], "section": None if section == "data" else section}
                           | {k: d.get(k) for k in ("state", "read", "write", "cksum", "msg")})
                   for section, d in devices if device_problem(section, d)]
            row |= compact({"errors": detail.get("errors"), "scan": detail.get("scan"), "action": detail.get("action"),
                            "problem": pool_problem(detail), "bad_devices": capped(bad)} | _sections(devices))
        rows.append(compact(row))
    return rows


def _sections(devices: list[tuple[str, dict]]) -> dict:
    """The devices a pool lists beside its vdevs, by section: `logs`, `cache`, `spares`
    (docs/PROXMOX-BEHAVIOUR.md#zfs-pools)."""
    by_section: dict[str, list[str]] = {}
    for section, device in devices:
        if section != "data":
            by_section.setdefault(section, []).append(f"{device['name']} {device.get('state') or ''}".strip())
    return {section: capped(names) for section, names in by_section.items()}


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


def node_update_status(client: ProxmoxClient, node: str) -> tuple[dict, list[dict]]:
    """One node's pending packages, kernel and list age, and the packages whose changelogs tell
    security updates apart. The whole list needs Sys.Modify (APT.pm list_updates checks it); without
    it, the packages `versions` covers (Proxmox's own and the kernels), which needs Sys.Audit."""
    full = privileges.holds(client.host, "Sys.Modify", f"/nodes/{node}") is True
    calls = [lambda: client.get(f"/nodes/{node}/apt/versions") or [], lambda: _refreshed(client, node)]
    if full:
        calls.append(lambda: client.get(f"/nodes/{node}/apt/update") or [])
    versions, refreshed, *everything = in_parallel(calls)
    for result in (versions, *everything):
        if isinstance(result, ToolFailure):
            raise result
    row = {"node": node} | kernels(versions) | (refreshed if isinstance(refreshed, dict) else {})
    if full:
        return row | _pending(versions, everything[0]), [p for p in everything[0] if p.get("Origin") == "Debian"]
    return row | _pending(versions, None) | {
        "covers": "Proxmox packages and kernels only: the full list needs Sys.Modify",
        "security": SECURITY_UNREAD.format(node=node)}, []


# Security updates: their Origin is Debian like any other, only the changelog's first line names the
# distribution (`openssl (3.5.1-1+deb13u1) trixie-security; urgency=medium`). Each read makes the node
# download the changelog (apt-get changelog, 10 s timeout): a few per node, two at once, of its three
# API workers (docs/PROXMOX-BEHAVIOUR.md#pending-updates).
CHANGELOG_CAP = 8
CHANGELOG_LANES = 2
CHANGELOG_HEAD = re.compile(r"^\S+ \([^)]*\) ([^;]+);")
SECURITY_UNREAD = ("not told: only a package's changelog names Debian's security archive, and reading it "
                   "(GET /nodes/{node}/apt/changelog) needs Sys.Modify on /nodes/{node}, as the full list does")


def _changelog(client: ProxmoxClient, node: str, package: dict) -> bool | str:
    """True when the candidate comes from a `-security` distribution, False when not, or why its
    changelog could not be read (APT.pm answers apt's output and `RC: <code>` then)."""
    try:
        text = str(client.get(f"/nodes/{node}/apt/changelog", name=package.get("Package"),
                              version=package.get("Version")) or "")
    except ToolFailure as exc:
        return str(exc)[:120]
    head = CHANGELOG_HEAD.match(text)
    if head is None or "\nRC: " in text:
        return text.strip().splitlines()[0][:120] if text.strip() else "empty changelog"
    return any(suite.endswith("-security") for suite in head.group(1).split())


def _security(checked: list[tuple[dict, bool | str]], total: int) -> dict:
    """How many of the checked packages are security updates, and what was not checked or read."""
    found = [p.get("Package") for p, result in checked if result is True]
    failed = [result for _, result in checked if isinstance(result, str)]
    answer = {"updates": len(found), "packages": capped(found),
              "checked": f"{len(checked) - len(failed)} of {total} Debian packages"}
    if total > len(checked):
        answer["not_checked"] = (f"{total - len(checked)}: at most {CHANGELOG_CAP} changelogs are read per node "
                                 f"(each is a download by the node)")
    if failed:
        answer["unreadable"] = f"{len(failed)}: {failed[0]}"
    return compact(answer)


def _lanes(client: ProxmoxClient, node: str, packages: list[dict]) -> list[Callable[[], list]]:
    """A node's changelog reads as CHANGELOG_LANES lanes, each read one after the other."""
    chosen = list(enumerate(packages[:CHANGELOG_CAP]))
    return [lambda lane=chosen[start::CHANGELOG_LANES]: [(i, p, _changelog(client, node, p)) for i, p in lane]
            for start in range(min(CHANGELOG_LANES, len(chosen)))]


def node_updates(node: Node = None, host: Host = None) -> dict:
    """Per node: pending, running vs newest kernel, list refresh time."""
    client = pve_client(host)
    nodes = [check_node(client, node)] if node else node_names(client)
    results = in_parallel([lambda n=n: node_update_status(client, n) for n in nodes], nodes=nodes)
    read = {n: r for n, r in zip(nodes, results, strict=True) if isinstance(r, tuple)}
    # then the changelogs of every node read, side by side, CHANGELOG_LANES at most on each node
    lanes = [(n, lane) for n, (_, debian) in read.items() if debian for lane in _lanes(client, n, debian)]
    checked: dict[str, list] = {n: [] for n in read}
    for (name, _), outcome in zip(lanes, in_parallel([lane for _, lane in lanes], nodes=[n for n, _ in lanes]),
                                  strict=True):
        checked[name] += outcome
    rows = []
    for name, (row, debian) in read.items():
        if "security" not in row:  # told when the changelogs could be read
            row["security"] = _security([(p, result) for _, p, result in sorted(checked[name], key=lambda c: c[0])],
                                        len(debian))
        rows.append(row)
    answer: dict[str, Any] = {"nodes": rows}
    failed = {n: str(r)[:200] for n, r in zip(nodes, results, strict=True) if isinstance(r, ToolFailure)}
    if failed:
        answer["unavailable"] = failed
    return answer
