"""Proxmox VE: what a node tells about itself beyond its status: RRD history (node, guest, storage),
the system log and journal, the firewall log, disks with SMART, ZFS pools, LVM, pending package
updates, the node's clock and certificates. `MONITOR_HANDLERS` joins `pve.PVE_HANDLERS`.

The state lives in `Monitor`, kept on the lab (`monitor(lab)`) and made on first use from the
lab's nodes and guests: a fresh install's disk layout (one SSD with the `pve` volume group and
its `data` thin pool behind `local-lvm`, no ZFS pool), a few pending updates, three days of
log lines. Tests change it to show a failing disk, a degraded pool or a secret in a log line.
Each answer follows the official return schema and the behaviour in docs/PROXMOX-BEHAVIOUR.md#node-monitoring.
"""
from __future__ import annotations

import calendar
import math
import re
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

from .call import ApiError, Call, _guest, _node
from .lab import GiB, Lab

# ---------------------------------------------------------------- RRD history

# (resolution in seconds, points) per timeframe, as PVE::RRD::create_rrd_data fetches them: the
# PVE 9 files (pve-*-9.0) and the older pve2 ones (pve-cluster src/PVE/RRD.pm)
RRD_SETUP = {9: {"hour": (60, 60), "day": (60, 1440), "week": (1800, 336), "month": (1800, 1440),
                 "year": (21600, 1440), "decade": (604800, 570)},
             8: {"hour": (60, 60), "day": (1800, 70), "week": (10800, 70), "month": (43200, 70),
                 "year": (604800, 70)}}
PRESSURES = ("pressurecpusome", "pressureiosome", "pressureiofull", "pressurememorysome", "pressurememoryfull")
SAMPLES = 24  # wave readings consolidated into one row of a coarse step


def _wave(seed: str, when: float, period: float = 86400.0) -> float:
    """A repeatable value between 0 and 1 that rises and falls over a day."""
    phase = zlib.crc32(seed.encode()) % 1000 / 1000 * 2 * math.pi
    return 0.5 + 0.4 * math.sin(2 * math.pi * when / period + phase) + 0.1 * math.sin(when / 700 + phase)


def _consolidated(seed: str, end: int, step: int, cf: str) -> float:
    """The wave over one row's interval (end - step, end], as RRD consolidates it: the mean
    (AVERAGE) or the largest reading (MAX); a 60 s row is one reading, so both agree there."""
    count = max(1, min(SAMPLES, step // 60))
    readings = [_wave(seed, end - step * i / count) for i in range(count)]
    return max(readings) if cf == "MAX" else sum(readings) / count


def _fetch(start: int, end: int, step: int) -> list[int]:
    """The rows `rrdtool fetch -s start -e end -r step` answers, by the time each one ends: start is
    rounded down and end up to the step, and each row is labelled with the end of its interval
    (rrdtool src/rrd_fetch.c, bindings/perl-shared/RRDs.xs: the first row is start + step)."""
    start -= start % step
    end += step - end % step
    return list(range(start + step, end + 1, step))


def upgrade(lab: Lab, node: str, days_ago: float, load_before: float = 1.0) -> None:
    """The node was upgraded from PVE 8 to 9 `days_ago`: its guests', storages' and its own history
    before then stays in the old pve2 files (their last update is the upgrade), which PVE 9 reads
    first (pve-cluster src/PVE/RRD.pm, create_rrd_data; docs/PROXMOX-BEHAVIOUR.md#rrd-history).
    `load_before` scales what the node and its guests did before the upgrade."""
    monitor(lab).upgraded[node] = (int(time.time() - days_ago * 86400), load_before)


def _rows(lab: Lab, node: str, timeframe: str) -> list[tuple[int, int, float]]:
    """(end time, step, load factor) of each row create_rrd_data answers, oldest first: on a node
    upgraded within the timeframe, the old file's rows from its own start up to its last update,
    then the new file's from there on."""
    major = 9 if lab.pve_major >= 9 else 8
    if timeframe not in RRD_SETUP[major]:
        timeframe = "year"  # pve2 files hold a year at most; `decade` reads that (PVE::RRD)
    step, count = RRD_SETUP[major][timeframe]
    now = int(time.time())
    ctime = step * (now // step)
    begin, rows = ctime - step * count, []
    last_old, before = monitor(lab).upgraded.get(node, (None, 1.0)) if major >= 9 else (None, 1.0)
    if last_old is not None and begin < last_old:
        if timeframe not in RRD_SETUP[8]:  # $setup_pve2->{decade} is undef: Perl dies dereferencing it
            raise ApiError(500, "Can't use an undefined value as an ARRAY reference at "
                                "/usr/share/perl5/PVE/RRD.pm line 92.")
        old_step, old_count = RRD_SETUP[8][timeframe]
        old_begin = old_step * (now // old_step) - old_step * old_count
        stored = last_old - last_old % old_step  # the old file's newest full row; later ones are unknown
        rows = [(end, old_step, before if end <= stored else math.nan) for end in _fetch(old_begin, last_old, old_step)]
        begin = last_old
    return rows + [(end, step, 1.0) for end in _fetch(begin, ctime - 1, step)]


def _points(call: Call, node: str, seed: str, fields: Callable[[float], dict]) -> list[dict]:
    """`time` and the data sources of each step, oldest first; a source without a value is left
    out, and the newest step is dropped when it holds nothing but `time` (PVE::RRD). `fields` makes a
    row's sources from its consolidated load (0 to about 1)."""
    cf = call.arg("cf") or "AVERAGE"
    rows = []
    for end, step, scale in _rows(call.lab, node, call.arg("timeframe")):
        row = {"time": end}
        if not math.isnan(scale):
            row |= fields(_consolidated(seed, end, step, cf) * scale)
        rows.append(row)
    if rows and len(rows[-1]) == 1:
        rows.pop()
    return rows


def pve_node_rrddata(call: Call, node: str) -> list:
    info = _node(call, node)
    total, swap, root = info["maxmem"], 8 * GiB, info["maxdisk"]

    def fields(load: float) -> dict:
        used = int(info["mem"] * (0.9 + 0.2 * load))
        row = {"cpu": round(min(1.0, info["cpu"] * 2 * load), 4), "maxcpu": info["maxcpu"],
               "iowait": round(0.02 * load, 4), "loadavg": round(info["maxcpu"] * info["cpu"] * 2 * load, 2),
               "memtotal": total, "memused": used, "swaptotal": swap, "swapused": int(swap * 0.02),
               "roottotal": root, "rootused": info["disk"], "netin": round(150_000 * load, 2),
               "netout": round(60_000 * load, 2)}
        if call.lab.pve_major >= 9:  # pve-node-9.0 (pve-cluster src/pmxcfs/status.c)
            row |= {"memavailable": total - row["memused"], "arcsize": 0} | {p: round(3 * load, 2) for p in PRESSURES}
        return row
    return _points(call, node, node, fields)


def pve_guest_rrddata(kind: str) -> Callable:
    """A guest's history: a stopped guest's steps carry only its sizes (pve-manager PVE/Service/pvestatd.pm)."""
    def handler(call: Call, node: str, vmid: str) -> list:
        guest = _guest(call, node, vmid, kind)
        config = guest["config"]
        cores, maxmem = int(config.get("cores", 1)), int(config.get("memory", 512)) * 1024 ** 2
        lxc_disk = int(guest["maxdisk"] * 0.3) if kind == "lxc" else 0  # QEMU reports no guest disk use
        running = guest["status"] == "running"

        def fields(load: float) -> dict:
            row: dict[str, Any] = {"maxcpu": cores, "maxmem": maxmem, "maxdisk": guest["maxdisk"], "disk": lxc_disk}
            if not running:
                return row
            row |= {"cpu": round(min(1.0, (guest["cpu"] or 0.05) * 2 * load), 4),
                    "mem": int(maxmem * (0.3 + 0.3 * load)), "netin": round(40_000 * load, 2),
                    "netout": round(25_000 * load, 2), "diskread": round(200_000 * load, 2),
                    "diskwrite": round(120_000 * load, 2)}
            if call.lab.pve_major >= 9:  # pve-vm-9.0: the host's view of the memory, and pressure
                row |= {"memhost": int(row["mem"] * 1.05)} | {p: round(2 * load, 2) for p in PRESSURES}
            return row
        return _points(call, node, str(vmid), fields)
    return handler


def pve_storage_rrddata(call: Call, node: str, storage: str) -> list:
    _node(call, node)
    entry = call.lab.storages.get(storage)
    if entry is None or node not in call.lab.storage_nodes(entry):
        raise ApiError(500, f"storage '{storage}' does not exist")
    return _points(call, node, storage, lambda _load: {"total": entry["total"], "used": entry["used"]})


# ---------------------------------------------------------------- the node's world

SIM_TIMEZONE = ("Etc/GMT-1", 3600)  # the simulated nodes' clock: UTC+1 all year


@dataclass
class Monitor:
    """What the nodes report about their disks, packages and logs."""
    disks: dict[str, list[dict]] = field(default_factory=dict)  # node -> /disks/list rows (+ "_smart")
    smart_reads: dict[str, int] = field(default_factory=dict)  # node -> smartctl runs (each wakes a sleeping disk)
    zfs: dict[str, list[dict]] = field(default_factory=dict)  # node -> pools (list row + "_detail")
    zfs_missing: set[str] = field(default_factory=set)  # nodes without zfsutils-linux
    vgs: dict[str, list[dict]] = field(default_factory=dict)  # node -> volume groups with their PVs
    thinpools: dict[str, list[dict]] = field(default_factory=dict)  # node -> LVM thin pools
    updates: dict[str, list[dict]] = field(default_factory=dict)  # node -> apt/update rows
    changelog_reads: dict[str, int] = field(default_factory=dict)  # node -> apt/changelog reads (each fetches)
    changelog_offline: set[str] = field(default_factory=set)  # nodes whose changelog server cannot be reached
    upgraded: dict[str, tuple[int, float]] = field(default_factory=dict)  # node -> PVE 9 since, load before
    kernels: dict[str, list[str]] = field(default_factory=dict)  # node -> installed kernel releases, newest first
    running_kernel: dict[str, str] = field(default_factory=dict)
    syslog: dict[str, list[dict]] = field(default_factory=dict)  # node -> entries {time, ident, unit, pid, msg}
    firewall: dict[str, list[str]] = field(default_factory=dict)  # node -> /var/log/pve-firewall.log lines
    proxy_certs: dict[str, float] = field(default_factory=dict)  # node -> days left of its pveproxy-ssl.pem
    acme: dict[str, str] = field(default_factory=dict)  # node -> its config's `acme` (ACME renews pveproxy-ssl.pem)
    # what each log read cost the node: (node, endpoint, journal entries journalctl or mini-journalreader
    # went through), as the range a read names costs (docs/PROXMOX-BEHAVIOUR.md#system-logs)
    log_reads: list[tuple[str, str, int]] = field(default_factory=list)


def monitor(lab: Lab) -> Monitor:
    """The lab's Monitor, made from its nodes on first use."""
    with lab.lock:
        found = getattr(lab, "_monitor", None)
        if found is None:
            found = Monitor()
            for name in lab.nodes:
                _add_node(lab, found, name)
            lab._monitor = found  # type: ignore[attr-defined]
        for name in lab.nodes:  # nodes added later
            if name not in found.disks:
                _add_node(lab, found, name)
        return found


KERNELS = {9: ["6.14.11-2-pve", "6.14.8-2-pve"], 8: ["6.8.12-11-pve", "6.8.12-9-pve"]}


def _add_node(lab: Lab, world: Monitor, name: str) -> None:
    """A fresh install: one SSD holding the `pve` volume group and its `data` thin pool, no ZFS pool."""
    thin = lab.storages.get("local-lvm")
    size = 512 * GiB
    world.disks[name] = [{"devpath": "/dev/sda", "type": "ssd", "size": size, "model": "Samsung SSD 870 EVO 500GB",
                          "serial": f"S6PXNS0T{zlib.crc32(name.encode()) % 10 ** 6:06d}", "vendor": "ATA",
                          "wwn": "0x5002538f00000000", "health": "PASSED", "wearout": "98", "gpt": 1, "rpm": 0,
                          "used": "LVM", "osdid": -1, "osdid-list": None,
                          "_smart": [_smart_attr(177, "Wear_Leveling_Count", 98, 0, "12"),
                                     _smart_attr(5, "Reallocated_Sector_Ct", 100, 10, "0"),
                                     _smart_attr(194, "Temperature_Celsius", 67, 0, "33")]}]
    world.zfs[name] = []
    world.vgs[name] = [{"name": "pve", "size": size - GiB, "free": 16 * GiB, "lvcount": 4, "leaf": 0,
                        "children": [{"name": "/dev/sda3", "size": size - GiB, "free": 16 * GiB, "leaf": 1}]}]
    used = thin["used"] if thin else 0
    world.thinpools[name] = [{"lv": "data", "vg": "pve", "lv_size": thin["total"] if thin else 400 * GiB,
                              "used": used, "metadata_size": 4 * GiB, "metadata_used": int(4 * GiB * 0.02),
                              "lv_state": "a", "lv_type": "t", "ctime": int(time.time()) - 90 * 86400}]
    kernels = KERNELS[9 if lab.pve_major >= 9 else 8]
    world.kernels[name] = list(kernels)
    world.running_kernel[name] = kernels[0]
    release = "trixie" if lab.pve_major >= 9 else "bookworm"
    world.updates[name] = [_package("libssl3t64" if lab.pve_major >= 9 else "libssl3", "Debian", "3.5.1-1+deb13u1",
                                    "3.5.1-1", "libs", suite=f"{release}-security"),
                           _package("pve-manager", "Proxmox", "9.2.2" if lab.pve_major >= 9 else "8.4.15",
                                    "9.2.1" if lab.pve_major >= 9 else "8.4.14", "admin", suite=release)]
    world.syslog[name] = _log_lines(name)
    world.firewall[name] = []


def _smart_attr(number: int, name: str, value: int, threshold: int, raw: str) -> dict:
    """An ATA attribute as PVE parses `smartctl -A -f brief` (pve-storage src/PVE/Diskmanage.pm, get_smart_data)."""
    return {"id": f"{number:3d}", "name": name, "flags": "PO--CK", "value": value, "normalized": value,
            "worst": value, "threshold": threshold, "fail": "-", "raw": raw}


def _package(name: str, origin: str, version: str, old: str, section: str, suite: str | None = None) -> dict:
    """An apt/update row; `suite` is the distribution its candidate's changelog names (Debian's
    security archive: `<release>-security`), told by apt/changelog only."""
    row = {"Package": name, "Title": f"{name} package", "Description": f"The {name} package.", "Origin": origin,
           "Version": version, "OldVersion": old, "Priority": "optional", "Section": section, "Arch": "amd64"}
    return row | ({"_suite": suite} if suite else {})


def pending_update(lab: Lab, node: str, name: str, origin: str, version: str, old: str, suite: str) -> None:
    """One more package with an update pending on a node (`suite`: what its changelog names)."""
    monitor(lab).updates[node].append(_package(name, origin, version, old, "libs", suite=suite))


def _leaf(name: str, state: str = "ONLINE", cksum: int = 0, msg: str = "") -> dict:
    return {"name": name, "state": state, "read": 0, "write": 0, "cksum": cksum, "msg": msg, "leaf": 1}


def _section(name: str, devices: list[dict]) -> dict:
    """A section of `zpool status` beside the pool's own vdevs (logs, cache, spares): its line has a
    name and nothing else, its devices are its children (OpenZFS cmd/zpool/zpool_main.c,
    print_class_vdevs, print_l2cache, print_spares; pve-storage src/PVE/API2/Disks/ZFS.pm, detail)."""
    return {"name": name, "msg": "", "leaf": 0, "children": devices}


def add_pool(lab: Lab, node: str, name: str, *, state: str = "ONLINE", errors: str = "No known data errors",
             bad_disk: str | None = None, size: int = 1000 * GiB, alloc: int = 400 * GiB,
             log: bool = False, cache: str | None = None, spare: str | None = None) -> dict:
    """A ZFS mirror of two disks on a node, as `zpool list` and `zpool status -P` show it
    (pve-storage src/PVE/API2/Disks/ZFS.pm); `bad_disk` names the vdev that is not ONLINE. `log` adds a
    mirrored log, `cache` a cache device in that state, `spare` a hot spare in that state (AVAIL,
    INUSE, UNAVAIL): a spare's line has no error counts, and INUSE is followed by "currently in use",
    which PVE's parser reads as the three counts, each 0 (Perl numifies the words)."""
    disks = ["/dev/disk/by-id/ata-WDC_1-part1", "/dev/disk/by-id/ata-WDC_2-part1"]
    leaves = [_leaf(disk, "FAULTED", 12, "too many errors") if disk == bad_disk else _leaf(disk) for disk in disks]
    top = [{"name": name, "state": state, "read": 0, "write": 0, "cksum": 0, "msg": "", "leaf": 0,
            "children": [{"name": "mirror-0", "state": state, "read": 0, "write": 0, "cksum": 0,
                          "msg": "", "leaf": 0, "children": leaves}]}]
    if log:
        top.append(_section("logs", [{"name": "mirror-1", "state": "ONLINE", "read": 0, "write": 0, "cksum": 0,
                                      "msg": "", "leaf": 0,
                                      "children": [_leaf("/dev/disk/by-id/nvme-LOG_1-part1"),
                                                   _leaf("/dev/disk/by-id/nvme-LOG_2-part1")]}]))
    if cache:
        top.append(_section("cache", [_leaf("/dev/disk/by-id/nvme-CACHE_1-part1", cache)]))
    if spare:
        device = {"name": "/dev/disk/by-id/ata-WDC_SPARE-part1", "state": spare, "msg": "", "leaf": 1}
        top.append(_section("spares", [device | ({"read": 0, "write": 0, "cksum": 0} if spare == "INUSE" else {})]))
    detail = {"name": name, "state": state, "errors": errors, "leaf": 0,
              "scan": "scrub repaired 0B in 00:12:31 with 0 errors on Sun Jan 11 00:36:32 2026", "children": top}
    if state != "ONLINE":
        detail |= {"status": "One or more devices are faulted in response to persistent errors.",
                   "action": "Replace the faulted device, or use 'zpool clear' to mark the device repaired."}
    pool = {"name": name, "size": size, "alloc": alloc, "free": size - alloc, "frag": 3, "dedup": 1.0,
            "health": state, "_detail": detail}
    monitor(lab).zfs[node].append(pool)
    return pool


def _log_lines(node: str) -> list[dict]:
    """Three days of a quiet node's journal, oldest first: timers, the API daemons, a login, a failing unit."""
    now = int(time.time())
    entries = []
    pattern = [("CRON", "cron", "pam_unix(cron:session): session opened for user root(uid=0) by root(uid=0)"),
               ("pvedaemon", "pvedaemon", "<root@pam> successful auth for user 'root@pam'"),
               ("pveproxy", "pveproxy", "worker 4711 finished"),
               ("systemd", "init.scope", "Starting pve-daily-update.service - Daily PVE download activities..."),
               ("pvestatd", "pvestatd", "status update time (0.512 seconds)"),
               ("sshd", "ssh", "Accepted publickey for root from 192.0.2.50 port 51514 ssh2: ED25519 SHA256:abc"),
               ("smartd", "smartd", "Device: /dev/sda [SAT], SMART Usage Attribute: 194 Temperature_Celsius changed"),
               ("kernel", "", "vmbr0: port 2(tap100i0) entered forwarding state"),
               ("pve-ha-lrm", "pve-ha-lrm", "successfully acquired lock 'ha_agent_" + node + "_lock'"),
               ("postfix/smtp", "postfix@-", "connect to mail.example.org[192.0.2.25]:25: Connection timed out")]
    for index in range(216):  # one line every 20 minutes
        ident, unit, message = pattern[index % len(pattern)]
        entries.append({"time": now - (216 - index) * 1200, "ident": ident, "unit": unit,
                        "pid": 1000 + index * 7 if ident != "kernel" else None, "msg": message})
    return entries


# ---------------------------------------------------------------- logs

def _journal_text(node: str, entry: dict) -> str:
    """A line as `journalctl -o short` and mini-journalreader print it: local time, host, identifier[pid]: text."""
    stamp = time.strftime("%b %d %H:%M:%S", time.gmtime(entry["time"] + SIM_TIMEZONE[1]))
    pid = f"[{entry['pid']}]" if entry.get("pid") else ""
    return f"{stamp} {node} {entry['ident']}{pid}: {entry['msg']}"


def _local_epoch(text: str) -> int:
    """A `YYYY-MM-DD[ HH:MM[:SS]]` of the node's local time as an epoch (journalctl --since)."""
    shape = {10: "%Y-%m-%d", 16: "%Y-%m-%d %H:%M", 19: "%Y-%m-%d %H:%M:%S"}[len(text)]
    return calendar.timegm(time.strptime(text, shape)) - SIM_TIMEZONE[1]


class Counted(list):
    """An answer list whose envelope carries `total` (the front adds it)."""
    total = 0


def pve_syslog(call: Call, node: str) -> list:
    """journalctl -o short [--unit] [--since] [--until], oldest first; `start` skips lines, `limit`
    keeps them (0 or none: 50); `n` counts from the first line of the whole output, `total` is its
    length; a range without entries is the one line journalctl prints then, `-- No entries --`
    (pve-common src/PVE/Tools.pm, dump_journal, whose "no content" filler comes only when journalctl
    prints nothing; systemd journalctl; the aliases sshd and postfix: pve-manager PVE/API2/Nodes.pm,
    syslog)."""
    _node(call, node)
    service = call.arg("service")
    unit = {"sshd": "ssh", "postfix": "postfix@-"}.get(service, service)
    since = _local_epoch(call.arg("since")) if call.arg("since") else None
    until = _local_epoch(call.arg("until")) if call.arg("until") else None
    world = monitor(call.lab)
    lines = [_journal_text(node, e) for e in world.syslog[node]
             if (not unit or e["unit"] in (unit, f"{unit}.service")) and (since is None or e["time"] >= since)
             and (until is None or e["time"] < until)]  # an entry's microseconds lie past its second
    # journalctl goes through the whole range (the unit's entries: a journal match) whatever start and
    # limit keep of it, once per read (pve-common src/PVE/Tools.pm, dump_journal)
    world.log_reads.append((node, "syslog", len(lines)))
    lines = lines or ["-- No entries --"]  # journalctl without -q (systemd src/journal/journalctl.c)
    start, limit = int(call.arg("start") or 0), int(call.arg("limit") or 0) or 50
    answer = Counted({"n": index + 1, "t": text} for index, text in enumerate(lines) if start <= index < start + limit)
    answer.total = len(lines)
    return answer


def _cursor(node: str, index: int, entry: dict) -> str:
    return f"s=sim{node};i={index:x};b=b00t;m={index:x};t={entry['time'] * 1_000_000:x};x={index:x}"


def pve_journal(call: Call, node: str) -> list:
    """mini-journalreader's output: the cursor of the first entry printed, the entries oldest first,
    the cursor where it stopped. `lastentries` takes the last N before `until` or before
    `endcursor` (which is not printed); `since` and `startcursor` (exclusive) start a range; N with a
    start is refused by the reader (proxmox-mini-journalreader; pve-manager PVE/API2/Nodes.pm, journal)."""
    _node(call, node)
    entries = monitor(call.lab).syslog[node]
    if not entries:
        return []
    number = int(call.arg("lastentries") or 0)
    since, until = int(call.arg("since") or 0), int(call.arg("until") or 0)
    start_at, end_at = call.arg("startcursor"), call.arg("endcursor")
    if number and (since or start_at):
        raise ApiError(500, "mini-journalreader: -n conflicts with -b and/or -f")
    cursors = [_cursor(node, i, e) for i, e in enumerate(entries)]
    stop = cursors.index(end_at) if end_at in cursors else len(entries)
    if until:
        stop = min(stop, next((i for i, e in enumerate(entries) if e["time"] >= until), len(entries)))
    if number:
        first = max(0, stop - number)
    elif start_at in cursors:
        first = cursors.index(start_at) + 1
    else:
        first = next((i for i, e in enumerate(entries) if e["time"] >= since), len(entries))
    chosen = range(first, max(first, stop))
    # -n N seeks to the end (or endcursor) and N entries back; a range reads from its start to its end
    # (none: the whole journal) (proxmox-mini-journalreader src/mini-journalreader.c, main)
    monitor(call.lab).log_reads.append((node, "journal", len(chosen)))
    if not chosen:
        return [cursors[min(first, len(entries) - 1)]]
    return [cursors[first]] + [_journal_text(node, entries[i]) for i in chosen] + [cursors[min(stop, len(entries) - 1)]]


def _fw_time(line: str) -> int:
    return calendar.timegm(time.strptime(line.split(" ")[3], "%d/%b/%Y:%H:%M:%S")) - SIM_TIMEZONE[1]


def firewall_line(vmid: int, when: int, text: str) -> str:
    """A line of /var/log/pve-firewall.log: vmid (0: the host), level, chain, local time, text
    (pve-firewall src/pvefw-logger.c)."""
    stamp = time.strftime("%d/%b/%Y:%H:%M:%S", time.gmtime(when + SIM_TIMEZONE[1]))
    chain = f"tap{vmid}i0-IN" if vmid else "PVEFW-HOST-IN"
    return f"{vmid} 6 {chain} {stamp} +0100 {text}"


def pve_firewall_log(scope: str) -> Callable:
    """The firewall log, oldest first: a guest's lines start with its vmid; since/until compare each
    line's time; `limit` 0 reads to the end, none 50; `total` counts the matching lines
    (pve-firewall src/PVE/Firewall/Helpers.pm, dump_fw_logfile; src/PVE/API2/Firewall/VM.pm, log)."""
    def handler(call: Call, node: str, vmid: str | None = None) -> list:
        if vmid is not None:
            _guest(call, node, vmid, scope)
        else:
            _node(call, node)
        since, until = int(call.arg("since") or 0), int(call.arg("until") or 0)
        lines = [line for line in monitor(call.lab).firewall[node]
                 if (vmid is None or line.startswith(f"{vmid} ")) and (not since or _fw_time(line) >= since)
                 and (not until or _fw_time(line) <= until)]
        start, limit = int(call.arg("start") or 0), call.arg("limit")
        limit = 50 if limit is None else int(limit)
        answer = Counted({"n": i + 1, "t": t} for i, t in enumerate(lines)
                         if i >= start and (not limit or i < start + limit))
        answer.total = len(lines)
        if not lines:
            answer.append({"n": 1, "t": "no content"})
            answer.total = 1
        return answer
    return handler


def pve_node_config(call: Call, node: str) -> dict:
    """The node's config (`/etc/pve/nodes/<node>/config`): `acme` when ACME is set up for the node,
    which is what makes the daily pveupdate renew its pveproxy-ssl.pem (pve-manager PVE/API2/NodeConfig.pm,
    bin/pveupdate); `property` picks one key."""
    _node(call, node)
    config = {"acme": monitor(call.lab).acme[node]} if node in monitor(call.lab).acme else {}
    wanted = call.arg("property")
    return {k: v for k, v in config.items() if wanted in (None, "all", k)} | {"digest": f"{len(config):040x}"}


def pve_time(call: Call, node: str) -> dict:
    """`localtime` is the node's wall clock read as UTC (pve-manager PVE/API2/Nodes.pm, time)."""
    _node(call, node)
    now = int(time.time())
    return {"timezone": SIM_TIMEZONE[0], "time": now, "localtime": now + SIM_TIMEZONE[1]}


# ---------------------------------------------------------------- disks

def _public(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith("_")}


def pve_disks(call: Call, node: str) -> list:
    """Disks with SMART health (`UNKNOWN` when skipped or unreadable) and, for SSDs, `wearout`: the
    percent of life left, or `N/A` (pve-storage src/PVE/Diskmanage.pm, get_disks)."""
    _node(call, node)
    rows, world = [], monitor(call.lab)
    skip = str(call.arg("skipsmart", "0")) == "1"
    for disk in world.disks[node]:
        row = _public(disk)
        if disk.get("_smart_off"):  # smartctl prints "SMART Disabled" and no attributes to read the wear from
            row |= {"health": "SMART Disabled", "wearout": "N/A"}
        if skip:
            row |= {"health": "UNKNOWN", "wearout": "N/A"}
        else:  # smartctl -H -A without -n standby: a disk asleep is spun up (Diskmanage.pm get_smart_data)
            world.smart_reads[node] = world.smart_reads.get(node, 0) + 1
        rows.append(row)
    return rows


def smart_off(lab: Lab, node: str, devpath: str, off: bool = True) -> None:
    """SMART turned off on a disk (`smartctl -s off`): PVE then reports its health as `SMART Disabled`
    (pve-storage src/PVE/Diskmanage.pm, get_smart_data)."""
    disk = next(d for d in monitor(lab).disks[node] if d["devpath"] == devpath)
    disk["_smart_off"] = off


def pve_smart(call: Call, node: str) -> dict:
    _node(call, node)
    world = monitor(call.lab)
    disk = next((d for d in world.disks[node] if d["devpath"] == call.arg("disk")), None)
    if disk is None:
        raise ApiError(500, f"disk '{call.arg('disk')}' is not a block device")  # Diskmanage assert_blockdev
    world.smart_reads[node] = world.smart_reads.get(node, 0) + 1
    if disk.get("_smart_off"):  # no data section: `type` stays undefined (Diskmanage.pm, get_smart_data)
        return {"health": "SMART Disabled", "type": None}
    if str(call.arg("healthonly", "0")) == "1":
        return {"health": disk["health"]}
    if disk["type"] == "nvme":
        return {"health": disk["health"], "type": "text", "wearout": disk.get("wearout"),
                "text": f"Percentage Used:                    {100 - int(disk.get('wearout') or 100)}%\n"}
    return {"health": disk["health"], "type": "ata", "attributes": disk.get("_smart", [])}


def _zfs_tools(call: Call, node: str) -> list[dict]:
    _node(call, node)
    world = monitor(call.lab)
    if node in world.zfs_missing:
        raise ApiError(500, "zfsutils-linux not installed")
    return world.zfs[node]


def pve_zfs_list(call: Call, node: str) -> list:
    return [_public(pool) for pool in _zfs_tools(call, node)]


def pve_zfs_detail(call: Call, node: str, name: str) -> dict:
    pool = next((p for p in _zfs_tools(call, node) if p["name"] == name), None)
    if pool is None:
        raise ApiError(500, f"command '/sbin/zpool status -P {name}' failed: exit code 1")
    return dict(pool["_detail"])


def pve_lvm(call: Call, node: str) -> dict:
    _node(call, node)
    return {"leaf": 0, "children": [dict(vg) for vg in monitor(call.lab).vgs[node]]}


def pve_lvmthin(call: Call, node: str) -> list:
    _node(call, node)
    return [dict(pool) for pool in monitor(call.lab).thinpools[node]]


# ---------------------------------------------------------------- packages

def pve_apt_updates(call: Call, node: str) -> list:
    """Every upgradable package, candidate `Version` and installed `OldVersion`, with its repository's
    `Origin` only (pve-manager PVE/API2/APT.pm, list_updates)."""
    _node(call, node)
    return [_public(p) for p in monitor(call.lab).updates[node]]


def pve_apt_changelog(call: Call, node: str) -> str:
    """`apt-get changelog -qq -- name[=version]`: the node fetches the changelog from its repository's
    changelog server (10 s timeout), whose first line names the version and its distribution
    (`trixie-security` for Debian's security archive). A failure is apt's output and `RC: <code>`,
    still a 200 (pve-manager PVE/API2/APT.pm, changelog). apt's error text is not verified."""
    _node(call, node)
    world = monitor(call.lab)
    world.changelog_reads[node] = world.changelog_reads.get(node, 0) + 1
    name, version = call.arg("name"), call.arg("version")
    package = next((p for p in world.updates[node] if p["Package"] == name), None)
    if package is None or node in world.changelog_offline or version not in (None, package["Version"]):
        return (f"E: Failed to fetch changelog:/{name}.changelog  Changelog unavailable for {name}={version}\n"
                f"RC: 100")
    return (f"{name} ({package['Version']}) {package.get('_suite', 'unstable')}; urgency=medium\n\n"
            f"  * New upstream release.\n\n -- Maintainer <maintainer@example.org>  Mon, 01 Sep 2025 10:00:00 +0000\n")


def pve_apt_versions(call: Call, node: str) -> list:
    """proxmox-ve (with RunningKernel), pve-manager (with ManagerVersion), the installed kernels
    newest first, then a fixed list; `Version` is the candidate, `OldVersion` what is installed
    (pve-manager PVE/API2/APT.pm, versions)."""
    _node(call, node)
    world = monitor(call.lab)
    pending = {p["Package"]: p for p in world.updates[node]}
    major = call.lab.pve_major

    def row(name: str, installed: str, **extra: Any) -> dict:
        candidate = pending.get(name, {}).get("Version", installed)
        return _package(name, "Proxmox", candidate, installed, "admin") | {"CurrentState": "Installed"} | extra
    manager = "9.2.1" if major >= 9 else "8.4.14"
    rows = [row("proxmox-ve", f"{major}.1.0", RunningKernel=world.running_kernel[node]),
            row("pve-manager", manager, ManagerVersion=f"pve-manager/{manager}/0d3f1c6ba8d1e2a7")]
    # installed packages named like a kernel, by version, newest first: proxmox-kernel-helper among them
    helper = row("proxmox-kernel-helper", "9.0.4" if major >= 9 else "8.1.4")
    kernels = [row(f"proxmox-kernel-{release}-signed", release.removesuffix("-pve")) for release in world.kernels[node]]
    rows += sorted(kernels + [helper], key=lambda r: [int(n) for n in re.findall(r"\d+", r["OldVersion"])],
                   reverse=True)
    # then the fixed list by name, proxmox-kernel-helper a second time
    rows += [dict(helper), row("qemu-server", "9.0.23" if major >= 9 else "8.3.14"),
             row("zfsutils-linux", "2.3.4-pve1")]
    return rows


MONITOR_HANDLERS: dict[tuple[str, str], Callable] = {
    ("GET", "/nodes/{node}/rrddata"): pve_node_rrddata,
    ("GET", "/nodes/{node}/qemu/{vmid}/rrddata"): pve_guest_rrddata("qemu"),
    ("GET", "/nodes/{node}/lxc/{vmid}/rrddata"): pve_guest_rrddata("lxc"),
    ("GET", "/nodes/{node}/storage/{storage}/rrddata"): pve_storage_rrddata,
    ("GET", "/nodes/{node}/syslog"): pve_syslog,
    ("GET", "/nodes/{node}/journal"): pve_journal,
    ("GET", "/nodes/{node}/firewall/log"): pve_firewall_log("node"),
    ("GET", "/nodes/{node}/qemu/{vmid}/firewall/log"): pve_firewall_log("qemu"),
    ("GET", "/nodes/{node}/lxc/{vmid}/firewall/log"): pve_firewall_log("lxc"),
    ("GET", "/nodes/{node}/time"): pve_time,
    ("GET", "/nodes/{node}/config"): pve_node_config,
    ("GET", "/nodes/{node}/disks/list"): pve_disks,
    ("GET", "/nodes/{node}/disks/smart"): pve_smart,
    ("GET", "/nodes/{node}/disks/zfs"): pve_zfs_list,
    ("GET", "/nodes/{node}/disks/zfs/{name}"): pve_zfs_detail,
    ("GET", "/nodes/{node}/disks/lvm"): pve_lvm,
    ("GET", "/nodes/{node}/disks/lvmthin"): pve_lvmthin,
    ("GET", "/nodes/{node}/apt/update"): pve_apt_updates,
    ("GET", "/nodes/{node}/apt/versions"): pve_apt_versions,
    ("GET", "/nodes/{node}/apt/changelog"): pve_apt_changelog,
}
