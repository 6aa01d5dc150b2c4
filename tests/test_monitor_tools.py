"""The monitor toolset against the simulator: metrics (RRD history summarized), node_logs (syslog,
journal, firewall log, newest first and paged), node_disks (SMART, ZFS, LVM) and node_updates
(pending packages, kernel), each with the reader token of the README unless a test says why not."""
import json
import threading
import time

import pytest

import inventory
import monitor_tools
import rrd
import simulator
from conftest import requests_during, tool_session
from simulator.pve_monitor import add_pool, firewall_line, monitor, pending_update, smart_off, upgrade


@pytest.fixture(scope="module")
def sim():
    lab = simulator.Lab.homelab()
    lab.task_seconds = 0
    # the README's optional grant for node_logs: a role holding only Sys.Syslog, on / beside PVEAuditor
    # (an entry on a deeper path would replace the user's PVEAuditor there)
    lab.custom_roles["pve"]["LogReader"] = frozenset({"Sys.Syslog"})
    user = lab.pve_tokens["mcp@pve!reader"].owner
    user.acl.append(("/", "LogReader", True))
    lab.pve_tokens["mcp@pve!logs"] = simulator.Token("77777777-6666-5555-4444-333333333333",
                                                     [("/", "PVEAuditor", True), ("/", "LogReader", True)],
                                                     owner=user)
    with simulator.Simulator(lab) as running:
        yield running
        assert running.lab.schema_rejections == [], running.lab.schema_rejections


@pytest.fixture(scope="module")
def session(sim):
    with tool_session(sim.env() | {"PROXMOX_TOOLSETS": "default,monitor"}, log_name="monitor") as running:
        yield running


@pytest.fixture(scope="module")
def logs(sim):
    """The reader token plus the README's optional LogReader grant (node_logs needs Sys.Syslog)."""
    with tool_session(sim.env(pve_token="mcp@pve!logs") | {"PROXMOX_TOOLSETS": "monitor"},
                      log_name="monitor-logs") as running:
        yield running


def answer_bytes(answer: dict) -> int:
    return len(json.dumps(answer, separators=(",", ":"), ensure_ascii=False).encode())


def proxmox_answer(sim, path: str, **params) -> list:
    """What PVE itself answers the reader token, read past the tools."""
    secret = sim.lab.pve_tokens["mcp@pve!reader"].secret
    return simulator.api.handle(sim.lab, "pve", "GET", path, params, f"PVEAPIToken=mcp@pve!reader={secret}")


# ---------------------------------------------------------------- metrics

def test_metrics_of_a_guest_is_a_summary_per_series_not_the_points(session):
    answer = session.ok("metrics", {"vmid": 100})
    assert (answer["vmid"], answer["node"], answer["points"], answer["step_s"]) == (100, "pve1", 60, 60)
    cpu, mem = answer["series"]["cpu"], answer["series"]["mem"]
    assert cpu["of"] == "2 cores" and cpu["avg"].endswith("%") and cpu["trend"] in ("rising", "falling", "steady")
    assert mem["of"] == "4.0 GiB" and mem["max"].endswith("GiB") and 0 < mem["last_pct"] < 100
    assert answer["series"]["netin"]["last"].endswith("/s") and 0 < len(cpu["spark"]) <= 24
    assert "disk" not in answer["series"]  # a VM reports no disk use: always 0
    assert "rows" not in answer and answer_bytes(answer) < 1500


def test_metrics_of_a_node_over_a_day_at_its_peaks(session):
    answer = session.ok("metrics", {"node": "pve2", "timeframe": "day", "cf": "MAX"})
    assert answer["points"] == 1440 and answer["cf"] == "MAX"  # PVE 9 keeps a day at one minute
    assert {"cpu", "iowait", "load", "mem", "swap", "rootfs", "netin", "netout"} <= set(answer["series"])
    assert answer["series"]["cpu"]["of"] == "8 cores" and len(answer["series"]["mem"]["spark"]) == 24
    assert answer_bytes(answer) < 2500


def test_metrics_of_a_storage_needs_its_node_unless_shared(session):
    answer = session.ok("metrics", {"storage": "local-lvm", "node": "pve2"})
    assert answer["series"]["used"]["of"] == "400.0 GiB" and answer["series"]["used"]["last_pct"] == 30.0
    shared = session.ok("metrics", {"storage": "pbs"})
    assert shared["node"] in ("pve1", "pve2", "pve3")


def test_metrics_of_a_stopped_guest_says_it_was_off(session):
    answer = session.ok("metrics", {"vmid": 103})  # media, a stopped container
    assert "cpu" not in answer["series"] and "not running" in answer["note"]
    assert answer["series"]["disk"]["of"] == "32.0 GiB"  # a container reports its disk use


def test_metrics_raw_points_newest_first_and_paged(session):
    answer = session.ok("metrics", {"vmid": 101, "raw": True})
    assert answer["columns"][:3] == ["time", "cpu_pct", "mem"] and "disk" not in answer["columns"]
    assert len(answer["rows"]) == 60 and answer["rows"][0][0] > answer["rows"][-1][0]
    day = session.ok("metrics", {"vmid": 101, "raw": True, "timeframe": "day", "offset": 60})
    assert day["total"] == 1440 and day["next_offset"] == 120 and len(day["rows"]) == 60


def test_metrics_without_a_target_or_with_two_sends_nothing(session, sim):
    message, sent = requests_during(sim, lambda: session.error("metrics", {}))
    assert "needs a vmid, a node, or a storage" in message and sent == []
    message = session.error("metrics", {"vmid": 100, "storage": "local"})
    assert "not both" in message
    assert "No guest with vmid 999" in session.error("metrics", {"vmid": 999})


def test_metrics_reads_pve8_history_with_its_coarser_steps():
    """PVE 8's pve2 files keep a day as 70 half-hour steps and have no memhost or pressure."""
    lab = simulator.Lab.homelab(pve_major=8)
    with simulator.Simulator(lab) as old, tool_session(old.env() | {"PROXMOX_TOOLSETS": "monitor"},
                                                       log_name="monitor-pve8") as session:
        answer = session.ok("metrics", {"vmid": 100, "timeframe": "day"})
        assert answer["points"] in (69, 70) and answer["step_s"] == 1800
        assert set(answer["series"]) == {"cpu", "mem", "netin", "netout", "diskread", "diskwrite"}
        assert old.lab.schema_rejections == []


def test_summary_of_real_shaped_points_with_gaps():
    """RRD leaves a source out of a step that has no value (PVE::RRD): a guest off for a while."""
    points = [{"time": 60 * i, "maxcpu": 4, "maxmem": 2 ** 30} | (
        {"cpu": 0.5, "mem": 2 ** 29, "netin": 1000.0} if i < 10 or i >= 20 else {}) for i in range(30)]
    series = rrd.summarize(points, "guest")
    assert series["cpu"]["avg"] == "50.0%" and series["cpu"]["of"] == "4 cores"
    assert series["mem"]["last_pct"] == 50.0 and " " in series["cpu"]["spark"]  # the gap shows
    assert rrd.sparkline([1, 2, 3, 4, 5, 6, 7, 8]) == "▁▂▃▄▅▆▇█"
    assert rrd.trend([1, 1, 1, 5, 5, 5]) == "rising" and rrd.trend([3, 3, 3]) == "steady"


def test_summary_across_the_seam_of_an_upgrade():
    """Three weekly rows, the old file's unfinished week (only `time`, later than the next rows),
    then a week of 6-hourly rows: each row weighs what it covers (docs/PROXMOX-BEHAVIOUR.md#rrd-history)."""
    week, six_hours = 7 * 86400, 6 * 3600
    points = [{"time": week * k, "cpu": 0.8, "maxcpu": 4} for k in (1, 2, 3)] + [{"time": week * 4}] + [
        {"time": week * 3 + six_hours * j, "cpu": 0.2, "maxcpu": 4} for j in range(1, 29)]
    assert [step for _, _, step in rrd.runs(points)] == [week, six_hours]
    series = rrd.summarize(points, "node")
    assert series["cpu"]["avg"] == "65.0%" and series["cpu"]["trend"] == "falling"  # (3 × 80 % + 20 %) / 4


def test_metrics_after_an_upgrade_from_pve8_weigh_each_point_by_its_own_interval(session, sim):
    """A node upgraded to PVE 9 120 days ago, busier before: its year is the old pve2 file's weekly
    rows, then the new file's 6-hourly ones (pve-cluster PVE/RRD.pm create_rrd_data), so a plain mean
    of the rows counts each of the last 120 days 28 times more than a day before them."""
    upgrade(sim.lab, "pve1", days_ago=120, load_before=4.0)
    try:
        rows = proxmox_answer(sim, "/nodes/pve1/rrddata", timeframe="year")
        answer = session.ok("metrics", {"node": "pve1", "timeframe": "year"})
        raw = session.ok("metrics", {"node": "pve1", "timeframe": "year", "raw": True})
        since = monitor(sim.lab).upgraded["pve1"][0]
    finally:
        monitor(sim.lab).upgraded.clear()
    assert {b["time"] - a["time"] for a, b in zip(rows, rows[1:], strict=False)} >= {604800, 21600}  # mixed steps
    # each row covers the step before its time (rrdtool labels a row with its interval's end)
    cpu = [(row["cpu"], 604800 if row["time"] <= since else 21600) for row in rows if "cpu" in row]
    weighted = sum(value * weight for value, weight in cpu) / sum(weight for _, weight in cpu)
    assert weighted > 2 * sum(value for value, _ in cpu) / len(cpu)  # a plain mean would be far off
    assert abs(float(answer["series"]["cpu"]["avg"].rstrip("%")) - weighted * 100) <= 0.1
    assert answer["step_s"] == 21600 and [s["step_s"] for s in answer["steps"]] == [604800, 21600]
    assert answer["steps"][1]["points"] == len([1 for value, weight in cpu if weight == 21600])
    assert "PVE 8" in answer["note"] and answer["points"] == len(cpu) == raw["total"]
    # the sparkline and the trend run on time: 370 busy days, then 120 quieter ones
    spark = answer["series"]["cpu"]["spark"]
    assert spark[0] in "▇█" and spark[-1] in "▁▂▃" and answer["series"]["cpu"]["trend"] == "falling"


# ---------------------------------------------------------------- logs

def test_syslog_newest_first_and_paged_back_with_a_cursor(logs, sim):
    first = logs.ok("node_logs", {"node": "pve1"})
    assert first["untrusted"] is True and len(first["lines"]) == 50
    lines = [entry["msg"] for entry in monitor(sim.lab).syslog["pve1"]]
    assert first["lines"][0].endswith(lines[-1]) and first["lines"][49].endswith(lines[-50])  # newest first
    second = logs.ok("node_logs", {"node": "pve1", "cursor": first["next_cursor"]})
    assert second["lines"][0].endswith(lines[-51]) and second["lines"][0] not in first["lines"][-1:]
    seen, cursor = len(first["lines"]) + len(second["lines"]), second["next_cursor"]
    while cursor:
        page = logs.ok("node_logs", {"node": "pve1", "cursor": cursor})
        seen, cursor = seen + len(page["lines"]), page.get("next_cursor")
    assert seen == len(lines)  # every line once, then no cursor
    assert "(7 days); since= reads further" in page["note"]  # where the syslog read without since ends


def test_syslog_filters_by_service_and_text_and_time(logs):
    ssh = logs.ok("node_logs", {"node": "pve2", "service": "sshd"})  # PVE maps sshd to the ssh unit
    assert ssh["lines"] and all("sshd[" in line for line in ssh["lines"])
    found = logs.ok("node_logs", {"node": "pve2", "grep": "TIMED OUT", "since": "1d"})
    assert 6 <= len(found["lines"]) <= 8 and all("timed out" in line for line in found["lines"])
    recent = logs.ok("node_logs", {"node": "pve2", "since": "2h"})
    assert 0 < len(recent["lines"]) <= 7 and "next_cursor" not in recent
    old = logs.ok("node_logs", {"node": "pve2", "until": "2d"})
    assert old["lines"] and not set(old["lines"]) & set(recent["lines"])


def test_journal_newest_first_by_cursor_and_by_identifier(logs, sim):
    first = logs.ok("node_logs", {"node": "pve3", "source": "journal"})
    assert len(first["lines"]) == 50 and first["next_cursor"].startswith("journal|")
    second = logs.ok("node_logs", {"node": "pve3", "cursor": first["next_cursor"]})
    lines = [entry["msg"] for entry in monitor(sim.lab).syslog["pve3"]]
    assert second["lines"][0].endswith(lines[-51]) and len(second["lines"]) == 50
    mail = logs.ok("node_logs", {"node": "pve3", "source": "journal", "service": "postfix/smtp"})
    assert mail["lines"] and all("postfix/smtp[" in line for line in mail["lines"])
    ranged = logs.ok("node_logs", {"node": "pve3", "source": "journal", "since": "3h"})
    assert 0 < len(ranged["lines"]) <= 10


@pytest.fixture()
def busy_journal(sim):
    """pve2's journal as a busy node's: 20,000 entries over the same three days (one every 13 s)."""
    entries = monitor(sim.lab).syslog["pve2"]
    kept = list(entries)
    now = int(time.time())
    entries[:] = [{"time": now - 260_000 + i * 13, "ident": "pvestatd" if i % 7 else "sshd", "pid": 800 + i % 50,
                   "unit": "pvestatd" if i % 7 else "ssh", "msg": f"status update {i}"} for i in range(20_000)]
    yield entries
    entries[:] = kept


@pytest.fixture()
def dense_journal(sim):
    """pve2's journal with an entry in every second: each window of time ends on one."""
    entries = monitor(sim.lab).syslog["pve2"]
    kept = list(entries)
    now = int(time.time())
    entries[:] = [{"time": now - 5_000 + i, "ident": "pvestatd", "pid": 800, "unit": "pvestatd",
                   "msg": f"status update {i}"} for i in range(5_000)]
    yield entries
    entries[:] = kept


def log_reads(sim, action) -> tuple[dict, list[int]]:
    """An action's answer and the journal entries each of its log reads went through on the node."""
    reads = monitor(sim.lab).log_reads
    before = len(reads)
    answer = action()
    return answer, [entries for _, _, entries in reads[before:]]


@pytest.mark.parametrize("arguments", [
    {"source": "syslog"}, {"source": "syslog", "grep": "status update 19"}, {"source": "syslog", "service": "sshd"},
    {"source": "syslog", "since": "2d"}, {"source": "journal"}, {"source": "journal", "since": "2d"},
    {"source": "journal", "grep": "no such line"}])
def test_every_log_read_is_bounded_on_a_busy_node(logs, sim, busy_journal, arguments):
    """journalctl reads the whole range of each syslog read, and mini-journalreader the whole range (or all
    of the journal) without -n (docs/PROXMOX-BEHAVIOUR.md#system-logs): each read a page costs stays a
    small part of a busy journal, on the first page and on the next."""
    first, reads = log_reads(sim, lambda: logs.ok("node_logs", {"node": "pve2", **arguments}))
    assert reads and max(reads) <= 2_500 and sum(reads) <= 6_000, reads
    if first.get("next_cursor"):
        _, reads = log_reads(sim, lambda: logs.ok("node_logs", {"node": "pve2", "cursor": first["next_cursor"]}))
        assert reads and max(reads) <= 2_500 and sum(reads) <= 6_000, reads
    if "grep" not in arguments:
        assert len(first["lines"]) == 50


@pytest.mark.parametrize("arguments", [{"source": "journal"}, {"source": "firewall"}])
def test_a_full_page_reads_no_window_beyond_it(logs, sim, busy_journal, arguments):
    """A page filled by one read ends there: the next window is read by the next page."""
    monitor(sim.lab).firewall["pve2"][:] = [firewall_line(0, int(time.time()) - 3_000 + i, f"policy DROP {i}")
                                            for i in range(500)]
    try:
        reads = monitor(sim.lab).log_reads
        first, sent = requests_during(sim, lambda: logs.ok("node_logs", {"node": "pve2", **arguments}))
        assert len(first["lines"]) == 50
        logged = [r for r in sent if r[2].endswith(("/journal", "/firewall/log"))]
        assert len(logged) == (2 if arguments["source"] == "firewall" else 1), sent  # the firewall's count first
        assert reads[-1][2] == 50 or arguments["source"] == "firewall"
    finally:
        monitor(sim.lab).firewall["pve2"][:] = []


@pytest.mark.parametrize("source", ["syslog", "journal"])
def test_a_busy_log_pages_back_newest_first_without_gaps(logs, sim, dense_journal, source):
    """Windows of time meet without a line lost or shown twice (journalctl and mini-journalreader read
    from `since` up to, not including, `until`), however many lines a window holds."""
    wanted = [f"status update {i}" for i in range(4_999, 4_999 - 700, -1)]
    shown, cursor = [], None
    while len(shown) < 700:
        page = logs.ok("node_logs", {"node": "pve2", "source": source, "since": "3h"} if cursor is None
                       else {"node": "pve2", "cursor": cursor})
        shown += [line.rsplit(": ", 1)[1] for line in page["lines"]]
        cursor = page["next_cursor"]
    assert shown[:700] == wanted


def test_log_text_is_masked_and_cut(logs, sim):
    entries = monitor(sim.lab).syslog["pve1"]
    entries.append({"time": entries[-1]["time"] + 1, "ident": "backup-script", "unit": "cron", "pid": 99,
                    "msg": "curl -H 'Authorization: PVEAPIToken=root@pam!ci=0f0e0d0c-aaaa-bbbb' password=hunter2 "
                           + "x" * 500})
    newest = logs.ok("node_logs", {"node": "pve1"})["lines"][0]
    assert "hunter2" not in newest and "0f0e0d0c-aaaa-bbbb" not in newest and "***" in newest
    assert len(newest) <= 301
    entries.pop()


def test_firewall_log_of_a_guest_and_of_its_node(logs, sim):
    now = int(time.time())
    monitor(sim.lab).firewall["pve1"] += [firewall_line(0, now - 300, "policy DROP: IN=vmbr0 SRC=198.51.100.7"),
                                          firewall_line(100, now - 200, "policy REJECT: IN=fwbr100i0 DPT=22"),
                                          firewall_line(100, now - 100, "policy REJECT: IN=fwbr100i0 DPT=23")]
    guest = logs.ok("node_logs", {"vmid": 100})
    assert guest["node"] == "pve1" and guest["source"] == "firewall"
    assert [line.split("DPT=")[1] for line in guest["lines"]] == ["23", "22"]  # newest first, this guest's only
    node = logs.ok("node_logs", {"node": "pve1", "source": "firewall", "since": "4m"})
    assert len(node["lines"]) == 2  # the host line is older than 4 minutes
    empty = logs.ok("node_logs", {"node": "pve2", "source": "firewall"})
    assert empty["lines"] == [] and "empty" in empty["note"]


def test_logs_without_sys_syslog_name_the_one_grant_and_send_nothing(session, sim):
    message, sent = requests_during(sim, lambda: session.error("node_logs", {"node": "pve1"}))
    assert "needs Sys.Syslog on /nodes/pve1" in message and "PVEAuditor lacks" in message
    assert "pveum role add LogReader --privs Sys.Syslog" in message and "pveum acl modify / --tokens" in message
    assert not any("/syslog" in path for _, _, path in sent)  # the policy knew: nothing was sent


def test_logs_refuse_bad_times_and_cursors_before_sending(logs, sim):
    message, sent = requests_during(sim, lambda: logs.error("node_logs", {"node": "pve1", "since": "yesterday"}))
    assert "'2h'" in message and "Nothing was sent" in message and sent == []
    assert "cursor is not one this tool answered" in logs.error("node_logs", {"node": "pve1", "cursor": "x|y"})
    assert "needs the node" in logs.error("node_logs", {})
    assert "Unknown node 'PVE1'" in logs.error("node_logs", {"node": "PVE1"})


# ---------------------------------------------------------------- disks

def test_disks_of_a_fresh_install(session):
    answer = session.ok("node_disks", {"node": "pve1"})
    disks = dict(zip(answer["disks"]["columns"], answer["disks"]["rows"][0], strict=True))
    assert disks["disk"] == "/dev/sda" and disks["health"] == "PASSED" and disks["life_left_pct"] == 98.0
    assert "problem" not in answer["disks"]["columns"] and answer["zfs_pools"] == []
    assert answer["volume_groups"][0]["vg"] == "pve" and answer["thin_pools"][0]["pool"] == "pve/data"
    assert answer["thin_pools"][0]["used_pct"] == 30.0


def test_disks_with_smart_off_are_not_failing(session, sim):
    """`SMART Disabled` says smartctl cannot judge the disk, not that it fails
    (docs/PROXMOX-BEHAVIOUR.md#disks-and-smart)."""
    smart_off(sim.lab, "pve1", "/dev/sda")
    try:
        answer = session.ok("node_disks", {"node": "pve1", "smart": "/dev/sda"})
    finally:
        smart_off(sim.lab, "pve1", "/dev/sda", off=False)
    disks = dict(zip(answer["disks"]["columns"], answer["disks"]["rows"][0], strict=True))
    assert disks["health"] == "SMART Disabled" and "problem" not in disks
    assert answer["smart"] == {"disk": "/dev/sda", "health": "SMART Disabled"}
    assert inventory.disk_problem({"health": "SMART Disabled", "wearout": "N/A"}) is None


def test_disks_show_a_failing_disk_a_worn_ssd_and_a_degraded_pool(session, sim):
    world = monitor(sim.lab)
    world.disks["pve2"] += [{"devpath": "/dev/sdb", "type": "hdd", "size": 4 * 10 ** 12, "model": "WDC WD40EFRX",
                             "health": "FAILED!", "wearout": "N/A", "gpt": 1, "rpm": 5400, "used": "ZFS"},
                            {"devpath": "/dev/nvme0n1", "type": "nvme", "size": 10 ** 12, "model": "NVME 1",
                             "health": "PASSED", "wearout": 12, "gpt": 1, "rpm": 0}]
    add_pool(sim.lab, "pve2", "tank", state="DEGRADED", bad_disk="/dev/disk/by-id/ata-WDC_2-part1")
    answer = session.ok("node_disks", {"node": "pve2", "smart": "/dev/nvme0n1"})
    problems = {row[0]: row[-1] for row in answer["disks"]["rows"]}
    assert problems["/dev/sdb"] == "SMART health FAILED!" and problems["/dev/nvme0n1"] == "12% of its rated life left"
    pool = answer["zfs_pools"][0]
    assert pool["pool"] == "tank" and pool["state"] == "DEGRADED" and pool["problem"].startswith("state DEGRADED")
    assert pool["bad_devices"][0]["name"].endswith("WDC_2-part1") and pool["bad_devices"][0]["cksum"] == 12
    assert answer["smart"]["text"] == ["Percentage Used:                    88%"]


def test_a_pools_spares_cache_and_logs_are_its_own_sections(session, sim):
    """`zpool status` lists logs, cache and spares beside the pool's vdevs; a hot spare waiting is
    AVAIL, one that took over INUSE (docs/PROXMOX-BEHAVIOUR.md#zfs-pools)."""
    add_pool(sim.lab, "pve1", "tank", log=True, cache="ONLINE", spare="AVAIL")
    add_pool(sim.lab, "pve1", "spared", spare="INUSE")
    add_pool(sim.lab, "pve1", "fast", cache="UNAVAIL", spare="UNAVAIL")
    try:
        pools = {p["pool"]: p for p in session.ok("node_disks", {"node": "pve1"})["zfs_pools"]}
    finally:
        monitor(sim.lab).zfs["pve1"].clear()
    healthy = pools["tank"]
    assert "bad_devices" not in healthy and "problem" not in healthy
    assert healthy["spares"] == ["/dev/disk/by-id/ata-WDC_SPARE-part1 AVAIL"]
    assert healthy["cache"] == ["/dev/disk/by-id/nvme-CACHE_1-part1 ONLINE"] and len(healthy["logs"]) == 2
    assert "bad_devices" not in pools["spared"] and pools["spared"]["spares"][0].endswith("INUSE")
    broken = pools["fast"]
    assert [(d["section"], d["state"]) for d in broken["bad_devices"]] == [("cache", "UNAVAIL"), ("spares", "UNAVAIL")]
    assert broken["problem"] == "cache device /dev/disk/by-id/nvme-CACHE_1-part1 UNAVAIL; spare " \
                                "/dev/disk/by-id/ata-WDC_SPARE-part1 UNAVAIL"


def test_disks_without_zfs_tools_and_a_bad_smart_path(session, sim):
    monitor(sim.lab).zfs_missing.add("pve3")
    try:
        answer = session.ok("node_disks", {"node": "pve3"})
        assert "zfsutils-linux not installed" in answer["unavailable"]["zfs"] and "disks" in answer
    finally:
        monitor(sim.lab).zfs_missing.discard("pve3")
    message, sent = requests_during(sim, lambda: session.error("node_disks", {"node": "pve3", "smart": "sda; ls"}))
    assert "such as /dev/sda" in message and not any("smart" in path for _, _, path in sent)


def test_pool_problem_reads_real_zpool_status_shapes():
    assert inventory.pool_problem({"state": "ONLINE", "errors": "No known data errors"}) is None
    assert inventory.pool_problem({"state": "ONLINE", "errors": "2 data errors, use '-v' for a list"}) \
        == "errors: 2 data errors, use '-v' for a list"
    online_with_cksum = {"state": "ONLINE", "errors": "No known data errors", "children": [
        {"name": "rpool", "state": "ONLINE", "children": [{"name": "/dev/sda3", "state": "ONLINE", "cksum": 4}]}]}
    assert inventory.pool_problem(online_with_cksum) == "device errors on /dev/sda3"
    assert inventory.disk_problem({"health": "OK", "wearout": "100"}) is None  # SAS says OK
    assert inventory.disk_problem({"health": "UNKNOWN", "wearout": "N/A"}) is None  # no SMART: not judged


# ---------------------------------------------------------------- updates

def test_updates_with_the_reader_token_cover_proxmox_packages_and_kernel(session, sim):
    answer, sent = requests_during(sim, lambda: session.ok("node_updates", {}))
    assert [row["node"] for row in answer["nodes"]] == ["pve1", "pve2", "pve3"]
    row = answer["nodes"][0]
    assert row["pending"] == 1 and row["packages"] == ["pve-manager 9.2.1→9.2.2"] and "Sys.Modify" in row["covers"]
    assert row["kernel_running"] == row["kernel_newest"] == "6.14.11-2-pve" and "reboot_for_kernel" not in row
    assert row["list_refreshed"].endswith("Z")  # the newest aptupdate task
    # security updates are told by the changelogs, which need Sys.Modify too: said, and none is read
    assert "apt/changelog" in row["security"] and "Sys.Modify" in row["security"]
    assert not any("changelog" in path for _, _, path in sent)


def test_updates_count_proxmox_kernel_helper_once(session, sim):
    """APT.pm `versions` lists proxmox-kernel-helper among the kernel packages and again in its fixed
    list (docs/PROXMOX-BEHAVIOUR.md#pending-updates)."""
    pending_update(sim.lab, "pve1", "proxmox-kernel-helper", "Proxmox", "9.0.5", "9.0.4", "trixie")
    try:
        listed = proxmox_answer(sim, "/nodes/pve1/apt/versions")
        row = session.ok("node_updates", {"node": "pve1"})["nodes"][0]
    finally:
        monitor(sim.lab).updates["pve1"].pop()
    assert [p["Package"] for p in listed].count("proxmox-kernel-helper") == 2
    assert row["pending"] == 2 and row["by_origin"] == {"Proxmox": 2}
    assert sorted(row["packages"]) == ["proxmox-kernel-helper 9.0.4→9.0.5", "pve-manager 9.2.1→9.2.2"]


@pytest.fixture
def many_debian_updates(sim):
    """Ten more Debian packages pending on pve1, three from Debian's security archive (Origin is
    Debian for all: only their changelogs name trixie-security)."""
    world = monitor(sim.lab)
    before = list(world.updates["pve1"])
    for index in range(10):
        suite = "trixie-security" if index in (2, 5, 9) else "trixie"
        pending_update(sim.lab, "pve1", f"libdebian{index}", "Debian", f"1.{index}-2", f"1.{index}-1", suite)
    world.changelog_reads.clear()
    yield world
    world.updates["pve1"][:] = before
    world.changelog_offline.clear()


def test_updates_with_sys_modify_count_security_updates_in_bounded_reads(sim, many_debian_updates, monkeypatch):
    """With Sys.Modify: the first CHANGELOG_CAP Debian packages' changelogs are read, at most two at
    once per node, and the answer says how many of how many were checked."""
    active, peak, lock = [0], [0], threading.Lock()
    original = simulator.api._slow_down

    def counted(lab, path):  # the changelog reads in flight at once
        busy = path.endswith("/apt/changelog")
        with lock:
            active[0] += busy
            peak[0] = max(peak[0], active[0])
        try:
            original(lab, path)
        finally:
            with lock:
                active[0] -= busy
    monkeypatch.setattr(simulator.api, "_slow_down", counted)
    sim.lab.delay = 0.02
    try:
        with tool_session(sim.env(pve_token="root@pam!admin") | {"PROXMOX_TOOLSETS": "monitor"},
                          log_name="monitor-security") as admin:
            row = admin.ok("node_updates", {"node": "pve1"})["nodes"][0]
    finally:
        sim.lab.delay = 0.0
    security = row["security"]
    assert row["pending"] == 12 and row["by_origin"] == {"Debian": 11, "Proxmox": 1}
    # libssl3t64 and libdebian0..6 were checked; libdebian9, also a security update, was not
    assert security["updates"] == 3 and security["packages"] == ["libssl3t64", "libdebian2", "libdebian5"]
    assert security["checked"] == "8 of 11 Debian packages" and "at most 8" in security["not_checked"]
    assert many_debian_updates.changelog_reads["pve1"] == monitor_tools.CHANGELOG_CAP == 8
    assert 1 < peak[0] <= monitor_tools.CHANGELOG_LANES  # side by side, within the per-node limit


def test_updates_say_when_changelogs_cannot_be_read(sim, many_debian_updates):
    many_debian_updates.changelog_offline.add("pve1")  # the node cannot reach its changelog server
    with tool_session(sim.env(pve_token="root@pam!admin") | {"PROXMOX_TOOLSETS": "monitor"},
                      log_name="monitor-security-offline") as admin:
        security = admin.ok("node_updates", {"node": "pve1"})["nodes"][0]["security"]
    assert security["updates"] == 0 and security["checked"] == "0 of 11 Debian packages"
    assert security["unreadable"].startswith("8: E: Failed to fetch changelog:/libssl3t64.changelog")


def test_updates_with_sys_modify_list_everything_and_a_pending_kernel(sim):
    """An operator token (root@pam!admin) holds Sys.Modify, which the whole update list needs."""
    world = monitor(sim.lab)
    world.kernels["pve1"].insert(0, "6.14.11-3-pve")  # installed, not booted yet
    try:
        with tool_session(sim.env(pve_token="root@pam!admin") | {"PROXMOX_TOOLSETS": "monitor"},
                          log_name="monitor-admin") as admin:
            row = admin.ok("node_updates", {"node": "pve1"})["nodes"][0]
    finally:
        world.kernels["pve1"].pop(0)
    assert row["pending"] == 2 and row["by_origin"] == {"Debian": 1, "Proxmox": 1}
    assert row["security"] == {"updates": 1, "packages": ["libssl3t64"], "checked": "1 of 1 Debian packages"}
    assert "covers" not in row
    assert row["kernel_newest"] == "6.14.11-3-pve" and row["reboot_for_kernel"] is True


# ---------------------------------------------------------------- a node that is down

def test_a_node_that_is_down_is_one_clear_error_and_does_not_hide_the_others(session, sim):
    sim.lab.down_nodes.add("pve3")
    try:
        for tool, arguments in (("metrics", {"node": "pve3"}), ("node_disks", {"node": "pve3"})):
            message = session.error(tool, arguments)
            assert "Node 'pve3' is unreachable" in message and "\n" not in message
        answer = session.ok("node_updates", {})
        assert [row["node"] for row in answer["nodes"]] == ["pve1", "pve2"]
        assert "unreachable" in answer["unavailable"]["pve3"]
    finally:
        sim.lab.down_nodes.discard("pve3")


def test_kernels_from_a_real_shaped_versions_answer():
    """APT.pm `versions`: proxmox-ve carries RunningKernel; kernel packages come newest first, meta
    packages and proxmox-kernel-helper among them."""
    versions = [{"Package": "proxmox-ve", "CurrentState": "Installed", "RunningKernel": "6.8.12-4-pve"},
                {"Package": "pve-manager", "CurrentState": "Installed", "ManagerVersion": "8.3.2"},
                {"Package": "proxmox-kernel-helper", "CurrentState": "Installed"},
                {"Package": "proxmox-kernel-6.8.12-5-pve-signed", "CurrentState": "Installed"},
                {"Package": "proxmox-kernel-6.8", "CurrentState": "Installed"},
                {"Package": "proxmox-kernel-6.8.12-4-pve-signed", "CurrentState": "Installed"}]
    assert inventory.kernels(versions) == {"kernel_running": "6.8.12-4-pve", "kernel_newest": "6.8.12-5-pve",
                                           "reboot_for_kernel": True}


# ---------------------------------------------------------------- list_guests sort_by

def test_list_guests_sorted_by_what_uses_the_most_now(session, sim):
    before, sim.lab.guests[105]["cpu"] = sim.lab.guests[105]["cpu"], 0.9  # ci-runner is busy
    try:
        answer = session.ok("list_guests", {"sort_by": "cpu", "limit": 3})
    finally:
        sim.lab.guests[105]["cpu"] = before
    assert answer["columns"][-1] == "cpu_pct" and answer["rows"][0][0] == 105 and answer["rows"][0][-1] == 90.0
    cpu = [row[-1] for row in answer["rows"]]
    assert cpu == sorted(cpu, reverse=True)
    by_memory = session.ok("list_guests", {"sort_by": "mem"})
    assert by_memory["columns"][-1] == "mem" and by_memory["rows"][0][-1].endswith("GiB")
    by_traffic = session.ok("list_guests", {"sort_by": "netin"})
    assert "since each guest started" in by_traffic["note"]  # /cluster/resources counts, not rates
    assert "cpu_pct" not in session.ok("list_guests")["columns"]


def test_list_guests_by_disk_ranks_by_allocated_size(session, sim):
    """A VM's `disk` is always 0 in PVE's status, a stopped container's too (qemu-server and
    pve-container vmstatus): ranking by it would show every VM at 0 B. So VMs and containers rank by
    their allocated size, and a running container also shows what it uses."""
    sizes = {vmid: sim.lab.guests[vmid]["maxdisk"] for vmid in (100, 104)}
    sim.lab.guests[104]["maxdisk"], sim.lab.guests[100]["maxdisk"] = 128 * 2 ** 30, 64 * 2 ** 30
    try:
        answer = session.ok("list_guests", {"sort_by": "disk", "limit": 4})
    finally:
        for vmid, size in sizes.items():
            sim.lab.guests[vmid]["maxdisk"] = size
    rows = {row[0]: row[-1] for row in answer["rows"]}
    assert [row[0] for row in answer["rows"][:2]] == [104, 100] and answer["columns"][-1] == "disk"
    assert rows[104] == "128.0 GiB allocated" and rows[100] == "64.0 GiB allocated"
    ci_runner = session.ok("list_guests", {"sort_by": "disk", "name": "ci-runner"})["rows"][0][-1]
    assert ci_runner == "9.6 GiB used of 32.0 GiB"  # a running container reports its root disk's use
    assert "always 0" in answer["note"] and "allocated" in answer["note"]


def test_logs_refused_by_proxmox_name_the_grant_too(sim):
    """When the token's privileges could not be read, Proxmox's 403 is answered the same way."""
    sim.lab.fail.append((r"^/access/permissions$", 500, "pvedaemon busy"))
    try:
        with tool_session(sim.env() | {"PROXMOX_TOOLSETS": "monitor"}, log_name="monitor-unknown") as unknown:
            message, sent = requests_during(sim, lambda: unknown.error("node_logs", {"node": "pve2"}))
    finally:
        sim.lab.fail.clear()
    assert any(path == "/nodes/pve2/syslog" for _, _, path in sent)  # it had to ask
    assert "needs Sys.Syslog on /nodes/pve2" in message and "pveum role add LogReader" in message
