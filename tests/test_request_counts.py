"""Reads made during one tool call are shared (calls.Reads): what one call sends, counted as the
simulator receives it, for the two calls issue 30 names. The whole table for every tool is
bench/requests_per_tool.py's (docs/BENCHMARKS.md#requests-per-tool-call-issue-30)."""
import json
from collections import Counter

import pytest

import policy
from conftest import everything_open, requests_during, tool_session

RULE = {"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "8443"}


@pytest.fixture(scope="module")
def admin(sim, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("counts")
    (tmp / "protected.json").write_text(json.dumps([{"host": "lab", "vmid": 105, "reason": "not used here"}]))
    with tool_session(everything_open(sim, tmp), log_name="request-counts") as session:
        yield session


def is_poll(request: tuple) -> bool:
    """A read of a task's status or log: how a tool waits for the task it started."""
    return "/tasks/" in request[2] and request[2].rsplit("/", 1)[-1] in ("status", "log")


def repeated(requests: list) -> list:
    return [request for request, count in Counter(requests).items() if count > 1]


def split_at_write(sent: list) -> tuple[list, list]:
    first = next(i for i, request in enumerate(sent) if request[1] != "GET")
    return sent[:first], sent[first + 1:]


def test_a_node_firewall_rule_added_at_a_position_sends_at_most_16_requests(admin, sim):
    answer, sent = requests_during(sim, lambda: admin.ok("write_edit_firewall_rule", {
        "node": "pve1", "action": "add", "pos": 0, "rule": RULE, "confirm": True}))
    assert answer["result"] == "ok" and answer["rule"]["dport"] == "8443"
    assert len(sent) <= 16, sent  # 16 on this homelab before issue 30 (which counted 44 elsewhere), 13 since
    before, after = split_at_write(sent)
    # the tool, the lockout guard and the receipt read the node's rules once before the write; the
    # receipt's state after and the tool's answer share one read after it
    rules = ("pve", "GET", "/nodes/pve1/firewall/rules")
    assert repeated(before) == [] and rules in before
    assert repeated(after) == [] and rules in after


def test_a_guest_stop_sends_at_most_4_requests_besides_polling_its_task(admin, sim):
    answer, sent = requests_during(sim, lambda: admin.ok("write_power_guest", {
        "vmid": 101, "action": "stop", "confirm": True}))
    assert answer["guest_state"] == "stopped" and sim.lab.guests[101]["status"] == "stopped"
    acting = [r for r in sent if not is_poll(r)]
    assert len(acting) <= 4, acting  # 5 at issue 30's start
    assert ("pve", "POST", "/nodes/pve2/qemu/101/status/stop") in acting


def test_the_guards_and_receipts_reads_are_not_admitted_again(admin, sim, monkeypatch):
    """What the lockout guard reads to judge a rule is read for the admission step, which does not
    classify each of those reads anew as a request of its own (only the tool's own requests are)."""
    classified = []

    def classify(host, method, path, *args, **kwargs):
        classified.append((method, path))
        return original(host, method, path, *args, **kwargs)
    original = policy.classify
    monkeypatch.setattr(policy, "classify", classify)
    _, sent = requests_during(sim, lambda: admin.ok("write_edit_firewall_rule", {
        "node": "pve2", "action": "add", "pos": 0, "rule": RULE, "confirm": True}))
    guard_reads = {("GET", path) for path in ("/cluster/firewall/rules", "/cluster/firewall/aliases",
                                              "/cluster/firewall/ipset", "/cluster/status", "/nodes/pve2/network")}
    assert guard_reads <= {(method, path) for _, method, path in sent}  # the guard read them
    assert not guard_reads & set(classified), classified  # but they were not admitted as requests
    assert ("POST", "/nodes/pve2/firewall/rules") in classified
