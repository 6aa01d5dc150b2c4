"""The monitor toolset against the simulator: metrics (RRD history summarized), node_logs (syslog,
journal, firewall log, newest first and paged), node_disks (SMART, ZFS, LVM) and node_updates
(pending packages, kernel), each with the reader token of the README unless a test says why not."""
import json
import time

import pytest

import inventory
import rrd
import simulator
from conftest import requests_during, tool_session
from simulator.pve_monitor import add_pool, firewall_line, monitor, smart_off


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
    answer = session.ok("node_updates", {})
    assert [row["node"] for row in answer["nodes"]] == ["pve1", "pve2", "pve3"]
    row = answer["nodes"][0]
    assert row["pending"] == 1 and row["packages"] == ["pve-manager 9.2.1→9.2.2"] and "Sys.Modify" in row["covers"]
    assert row["kernel_running"] == row["kernel_newest"] == "6.14.11-2-pve" and "reboot_for_kernel" not in row
    assert row["list_refreshed"].endswith("Z")  # the newest aptupdate task


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
    assert row["security"].startswith("not told") and "covers" not in row
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
