"""Flat as the homelab grows (issue 31), counted, not timed: at 50 nodes and 1,000 guests the answer
times on each workflow's path (fanout.counting: a request starts after the answers it followed and once
a lane of its node is free) and the requests it sends, within what each node serves at once; the
simulator's own count of requests in flight per node. How fast that is at 50 ms an answer is
bench/flat.py's business."""
import gc
import threading
import tracemalloc

import pytest

import fanout
import simulator
from conftest import tool_session

# answer times on the path, at 50 nodes / 1,000 guests (issue 31)
TARGETS = {"security_audit": 12, "dashboard": 12, "health_check": 10, "backup_coverage": 8, "what_changed": 4}
ARGUMENTS = {"what_changed": {"vmid": 100}, "dashboard": {}}


@pytest.fixture(scope="module")
def large():
    """50 nodes, 1,000 guests, every guest backed up once to its node's `local`; the reader token with
    the recipe's backup grant, and the monitor toolset for the dashboard."""
    lab = simulator.Lab.homelab(nodes=50, guests=1000)
    lab.task_seconds = 0
    with simulator.Simulator(lab) as running, tool_session(
            running.env(pve_token="mcp@pve!backups") | {"PROXMOX_TOOLSETS": "default,monitor,changes"},
            log_name="flat") as session:
        yield running, session
        assert running.lab.schema_rejections == []


def measured(large, tool: str) -> tuple[int, int]:
    sim, session = large
    session.ok(tool, ARGUMENTS.get(tool))  # the first call also reads the token's privileges
    before = len(sim.lab.requests)
    with fanout.counting() as count:
        session.ok(tool, ARGUMENTS.get(tool))
    return count.longest, len(sim.lab.requests) - before


@pytest.mark.parametrize("tool", sorted(TARGETS))
def test_answer_times_on_the_path_stay_within_the_target_at_50_nodes(large, tool):
    longest, requests = measured(large, tool)
    print(f"{tool}: {longest} answer times on the path, {requests} requests")  # shown with pytest -s
    assert 1 <= longest <= TARGETS[tool], f"{tool}: {longest} answer times on the path, {requests} requests"
    assert max(large[0].lab.most_at_once.values()) <= fanout.PER_NODE  # no node served more than its workers


def test_what_changed_reads_the_guests_node_and_the_shared_storages_only(large):
    """The newest backup is looked for where vzdump writes it (the shared storages and the guest's node's
    own), filtered by vmid: not every storage of every node."""
    sim, session = large
    _, requests = measured(large, "what_changed")
    assert requests <= 10
    listed = [path for _, _, path in sim.lab.requests[-requests:] if path.endswith("/content")]
    node = sim.lab.guests[100]["node"]
    assert listed and all(path.startswith(f"/nodes/{node}/") or "/local/" not in path for path in listed)


def test_the_dashboard_reads_the_inventory_once(large):
    sim, session = large
    before = len(sim.lab.requests)
    session.ok("dashboard")
    inventory = [path for _, _, path in sim.lab.requests[before:] if path == "/cluster/resources"]
    assert len(inventory) == 1


def test_the_dashboards_memory_stays_near_its_answer(large):
    """At 1,000 guests one dashboard call's Python memory (the simulator's, in this process, included) peaks
    within a few MiB and keeps little once answered: the inventory is read once and not kept."""
    _, session = large
    session.ok("dashboard")
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        session.ok("dashboard")
        gc.collect()
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (peak - base) / 2 ** 20 <= 16 and (held - base) / 2 ** 20 <= 8, (peak - base, held - base)


def test_a_node_gets_no_more_requests_at_once_than_it_has_lanes(sim):
    """Six reads of one node side by side: three at a time, the fourth waits for a lane: two rounds."""
    sim.lab.most_at_once.clear()
    with tool_session(sim.env(), log_name="flat-lanes") as session:
        session.ok("list_nodes")
        with session.local.installed():
            import proxmox_client
            client = proxmox_client.pve_client(None)
            paths = [f"/nodes/pve1/{p}" for p in ("status", "version", "time", "dns", "status", "version")]
            with fanout.counting() as count:
                answers = fanout.in_parallel([lambda p=p: client.get(p) for p in paths],
                                             nodes=["pve1"] * len(paths))
    assert all(not isinstance(a, Exception) for a in answers)
    assert sim.lab.most_at_once[("pve", "pve1")] <= fanout.PER_NODE
    assert count.longest == 2 and count.requests == 6  # two rounds of three


def test_the_lanes_bound_requests_across_tool_calls_too():
    """Eight callers on one node at once (as eight tool calls would be): the lanes in the request path let
    three send, the others wait for a lane."""
    active, peak, changed, released = [0], [0], threading.Condition(), threading.Event()

    def send() -> None:
        with changed:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
            changed.notify_all()
        released.wait(20)
        with changed:
            active[0] -= 1
    threads = [threading.Thread(target=fanout.sent, args=("lanes-test", "/nodes/pve9/status", send))
               for _ in range(8)]
    for thread in threads:
        thread.start()
    with changed:
        assert changed.wait_for(lambda: active[0] == fanout.PER_NODE, 20)
    released.set()
    for thread in threads:
        thread.join(20)
    assert peak[0] == fanout.PER_NODE and active[0] == 0
