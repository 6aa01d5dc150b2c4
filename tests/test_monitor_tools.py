"""The monitor toolset against the simulator: metrics (RRD history summarized), node_logs (syslog,
journal, firewall log, newest first and paged), node_disks (SMART, ZFS, LVM) and node_updates
(pending packages, kernel), each with the reader token of the README unless a test says why not."""
import json

import pytest

import monitor_tools
import simulator
from conftest import requests_during, tool_session
from simulator.pve_monitor import add_pool, firewall_line, monitor


@pytest.fixture(scope="module")
def sim():
    lab = simulator.Lab.homelab()
    lab.task_seconds = 0
    with simulator.Simulator(lab) as running:
        yield running
        assert running.lab.schema_rejections == [], running.lab.schema_rejections


@pytest.fixture(scope="module")
def session(sim):
    with tool_session(sim.env() | {"PROXMOX_TOOLSETS": "default,monitor"}, log_name="monitor") as running:
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
    series = monitor_tools.summarize(points, "guest")
    assert series["cpu"]["avg"] == "50.0%" and series["cpu"]["of"] == "4 cores"
    assert series["mem"]["last_pct"] == 50.0 and " " in series["cpu"]["spark"]  # the gap shows
    assert monitor_tools.sparkline([1, 2, 3, 4, 5, 6, 7, 8]) == "▁▂▃▄▅▆▇█"
    assert monitor_tools.trend([1, 1, 1, 5, 5, 5]) == "rising" and monitor_tools.trend([3, 3, 3]) == "steady"
