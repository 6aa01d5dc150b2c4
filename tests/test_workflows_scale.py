"""Cost that does not grow with the cluster (issue 22, section 2), checked without timing anything:
reads of different nodes go side by side and never more than the bound at once, each in the
caller's context; the shared session keeps enough connections; workflow answers stay small and
paged at 1,000 guests. How fast is bench/workflows_scale.py's business."""
import json
import threading

import pytest

import calls
import findings
import fanout
import policy
import proxmox_client
import simulator
import workflows
from answers import LIST_CAP
from conftest import tool_session
from errors import ProxmoxError


def test_in_parallel_keeps_order_bound_and_failures_in_place():
    active, peak, lock = [0], [0], threading.Lock()
    together = threading.Barrier(4, timeout=20)  # each round of four must really run at once

    def read(index: int):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        together.wait()
        with lock:
            active[0] -= 1
        if index == 5:
            raise ProxmoxError("node pve6 is unreachable")
        return index * 10
    results = fanout.in_parallel([lambda i=i: read(i) for i in range(12)], limit=4)
    assert results[:5] == [0, 10, 20, 30, 40] and isinstance(results[5], ProxmoxError) and results[11] == 110
    assert peak[0] == 4  # four at once, never more


def test_in_parallel_runs_in_the_callers_context_and_nests():
    token = policy.CALL.set(calls.Call(tool="health_check", dry_run=False))
    together = threading.Barrier(4, timeout=20)  # the four inner reads really run at once

    def leaf() -> str:
        together.wait()
        return policy.current_call().tool
    try:
        def inner() -> tuple[str, list]:
            return policy.current_call().tool, fanout.in_parallel([leaf, leaf])
        results = fanout.in_parallel([inner, inner])
    finally:
        policy.CALL.reset(token)
    for tool, nested in results:
        assert tool == "health_check" and nested == ["health_check"] * 2  # the call state reached every worker


def test_one_session_per_host_keeps_connections_for_the_reads_in_flight(sim):
    with tool_session(sim.env(), log_name="scale-pool") as session:
        session.ok("list_nodes")
        with session.local.installed():
            client = proxmox_client.pve_client(None)
            adapter = client.session.get_adapter(client.base)
    assert adapter._pool_maxsize >= fanout.THREADS


@pytest.fixture(scope="module")
def big():
    """20 nodes and 1,000 guests, the README's reader tokens; on PVE with the recipe's optional backup
    grant (BackupReader), without which no backup on `local` is listed and coverage says "unknown"."""
    lab = simulator.Lab.homelab(nodes=20, guests=1000)
    lab.task_seconds = 0
    for vmid in range(100, 160):
        lab.guests[vmid]["lock"] = "backup"  # many findings alike
    with simulator.Simulator(lab) as running, tool_session(running.env(pve_token="mcp@pve!backups"),
                                                           log_name="scale") as session:
        yield running, session
        assert running.lab.schema_rejections == []


def answer_bytes(answer: dict) -> int:
    return len(json.dumps(answer, separators=(",", ":"), ensure_ascii=False).encode())


def test_health_check_reads_nodes_side_by_side_within_the_bound(big, monkeypatch):
    sim, session = big
    active, peak, lock = [0], [0], threading.Lock()
    original = simulator.api._slow_down

    def counted(lab, path):  # the simulator's answer time, with the requests in flight counted
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        try:
            original(lab, path)
        finally:
            with lock:
                active[0] -= 1
    monkeypatch.setattr(simulator.api, "_slow_down", counted)
    sim.lab.delay = 0.05
    try:
        report = session.ok("health_check")
    finally:
        sim.lab.delay = 0.0
    assert len(report["checked"]) <= LIST_CAP + 1 and report["checked"][-1].startswith("+")
    assert fanout.PER_NODE < peak[0] <= fanout.THREADS  # nodes side by side
    assert max(sim.lab.most_at_once.values()) <= fanout.PER_NODE  # each node within what it serves


def test_health_check_summarises_findings_of_a_kind_without_dropping_any(big):
    """60 locked guests: three shown, then one finding that counts the other 57, names the first of
    them and the call that lists them all; no "+N more" hides one."""
    _, session = big
    report = session.ok("health_check")
    locks = [f for f in report["findings"] if f["area"] == "locks"]
    assert len(locks) == findings.FOLD_AFTER + 1
    summary = locks[-1]
    assert summary["finding"] == "57 more guests locked (backup)" and summary["evidence"]["count"] == 57
    assert summary["evidence"]["first"] == list(range(103, 103 + LIST_CAP))
    assert summary["evidence"]["all"] == "list_guests status=locked"
    assert report["summary"]["warning"] >= 60  # the counts keep every finding
    assert answer_bytes(report) <= 4096
    listed = session.ok("list_guests", {"status": "locked", "limit": 100})  # the call it names
    assert listed["total"] == 60 and {row[0] for row in listed["rows"]} == set(range(100, 160))


def test_backup_coverage_answers_counts_then_the_worst_guests_paged(big):
    _, session = big
    report = session.ok("backup_coverage")
    assert answer_bytes(report) <= 4096
    states, guests = report["states"], report["guests"]
    assert sum(states.values()) == guests["total"] == 1000 and states["missing"] > 0
    assert len(guests["rows"]) == workflows.COVERAGE_PAGE and guests["next_offset"] == workflows.COVERAGE_PAGE
    assert guests["rows"][0][-1] == "missing"  # the worst first
    # pages follow one another (the first two), and the last ends the list: the offsets reach every guest
    second = session.ok("backup_coverage", {"offset": workflows.COVERAGE_PAGE})["guests"]
    last = session.ok("backup_coverage", {"offset": 1000 - 7})["guests"]
    assert second["rows"][0] != guests["rows"][-1] and len(last["rows"]) == 7 and "next_offset" not in last
    seen = {row[0] for page in (guests, second, last) for row in page["rows"]}
    assert len(seen) == 2 * workflows.COVERAGE_PAGE + 7


@pytest.fixture
def jobs_kept(big):
    sim, _ = big
    before = [dict(job) for job in sim.lab.backup_jobs]
    yield sim.lab.backup_jobs
    sim.lab.backup_jobs[:] = before


def test_backup_coverage_without_a_job_proposes_one_small_change(big, jobs_kept):
    """No backup job at all: one new job for every guest (all_except=[]), not a list of 1,000."""
    _, session = big
    jobs_kept.clear()
    report = session.ok("backup_coverage")
    assert answer_bytes(report) <= 4096
    [change] = report["job_changes"]
    assert change["write_edit_backup_job"]["all_except"] == [] and "vmids" not in change["write_edit_backup_job"]
    assert len(change["covers"]) == LIST_CAP + 1 and change["covers"][-1] == "+988 more"


def test_backup_coverage_cuts_a_long_job_change_and_says_it_is_cut(big, jobs_kept):
    """A vmid job of 500 guests and 500 guests no job selects: the arguments would name 1,000 guests."""
    _, session = big
    jobs_kept[:] = [{"id": "half", "type": "vzdump", "schedule": "02:00", "enabled": 1, "storage": "pbs",
                     "vmid": ",".join(map(str, range(100, 600)))}]
    report = session.ok("backup_coverage")
    assert answer_bytes(report) <= 4096
    [change] = report["job_changes"]
    vmids = change["write_edit_backup_job"]["vmids"]
    assert len(vmids) == LIST_CAP + 1 and vmids[-1] == "+988 more" and "cut" in change["note"]


def test_backup_coverage_with_the_reader_token_stays_small(big, jobs_kept):
    """The reader token sees no backup on `local`: the state of many guests is unknown, said once, bounded."""
    sim, _ = big
    with tool_session(sim.env(), log_name="scale-reader") as reader:
        report = reader.ok("backup_coverage")
        jobs_kept.clear()
        without_jobs = reader.ok("backup_coverage")
    for answer in (report, without_jobs):
        assert answer_bytes(answer) <= 4096
        unknown = next(f for f in answer["findings"] if "is unknown" in f["finding"])
        assert len(unknown["evidence"]["guests"]) == LIST_CAP + 1
        assert unknown["evidence"]["guests"][-1].startswith("+")
