"""A batch is judged as it runs (docs/PROXMOX-BEHAVIOUR.md#nested-execute): POST /nodes/{node}/execute
runs its commands in order, each on the state the earlier ones left, and runs the next after one that
failed. Through the generic tool against the simulator (which runs batches as pve-manager does): two
harmless-looking commands that cut the API off are refused with nothing sent, as the same requests one
by one are; a batch whose every way of ending keeps this server in passes, and the simulator applies it."""
import copy
import json

import pytest

from conftest import everything_open, requests_during, tool_session

PROTECTED = [{"host": "lab", "vmid": 101, "name": "db", "reason": "the production database"}]
LAN = "192.0.2.50"  # on the nodes' own network: in the management IP set
OUTSIDE = "198.51.100.7"  # let in by an ACCEPT rule only
DROP_API = {"type": "in", "action": "DROP", "proto": "tcp", "dport": "8006"}
LET_IN = {"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "8006", "source": OUTSIDE, "enable": 1}


@pytest.fixture(autouse=True)
def fresh_firewall(sim):
    before = copy.deepcopy(sim.lab.firewall)
    yield
    sim.lab.firewall = before


@pytest.fixture(scope="module")
def remote(sim, tmp_path_factory):
    """Every gate open, this server seen from outside the management network."""
    tmp = tmp_path_factory.mktemp("batches")
    (tmp / "protected.json").write_text(json.dumps(PROTECTED))
    with tool_session(everything_open(sim, tmp, PROXMOX_SOURCE_ADDRESS=OUTSIDE), log_name="batches") as session:
        yield session


def node_rules(sim, node="pve1"):
    return sim.lab.firewall["hosts"].setdefault(node, {"options": {}, "rules": []})["rules"]


def execute(session, sim, commands, node="pve1"):
    """write_call_api with a batch; (the answer or the error, the writes the simulator received)."""
    call = {"method": "POST", "path": f"/nodes/{node}/execute", "params": {"commands": json.dumps(commands)},
            "confirm": True}
    return requests_during(sim, lambda: session.call("write_call_api", call), writes=True)


def let_outside_in(sim):
    """The only way in from OUTSIDE: a node rule ACCEPT 8006 and 22 from it (the cluster's policy drops)."""
    node_rules(sim)[:] = [LET_IN | {"dport": port} for port in ("8006", "22")]


BATCHES = {  # name -> commands; each, sent one by one, has its second request refused
    "a disabled DROP added, then enabled": [
        {"method": "POST", "path": "firewall/rules", "args": DROP_API},
        {"method": "PUT", "path": "firewall/rules/0", "args": {"enable": 1}}],
    "a disabled DROP added, the ACCEPT moved below it, then the DROP enabled": [
        {"method": "POST", "path": "firewall/rules", "args": DROP_API},
        {"method": "PUT", "path": "firewall/rules/1", "args": {"moveto": 3}},
        {"method": "PUT", "path": "firewall/rules/0", "args": {"enable": 1}}],
    "a rule added on top, then the ACCEPT below it deleted by its new position": [
        {"method": "POST", "path": "firewall/rules", "args": DROP_API | {"dport": "3128"}},
        {"method": "DELETE", "path": "firewall/rules/1"}],
}


@pytest.mark.parametrize("name", BATCHES)
def test_a_batch_that_cuts_the_api_is_refused_with_nothing_sent(remote, sim, name):
    let_outside_in(sim)
    before = copy.deepcopy(node_rules(sim))
    answer, sent = execute(remote, sim, BATCHES[name])
    text = answer.content[0].text
    assert answer.is_error and "would cut" in text and "from 198.51.100.7" in text, text
    assert sent == [] and node_rules(sim) == before


def test_the_same_requests_one_by_one_are_refused_at_the_second(remote, sim):
    let_outside_in(sim)
    first, then = BATCHES["a disabled DROP added, then enabled"]
    remote.ok("write_call_api", {"method": first["method"], "path": f"/nodes/pve1/{first['path']}",
                                 "params": first["args"], "confirm": True})
    message = remote.error("write_call_api", {"method": then["method"], "path": f"/nodes/pve1/{then['path']}",
                                              "params": then["args"], "confirm": True})
    assert "would cut the API (8006) on node pve1 from 198.51.100.7" in message


def test_a_batch_that_keeps_this_server_in_is_sent_and_applied(remote, sim):
    """A DROP for everyone else, added below the ACCEPT that lets this server in: every way the batch
    can end (either command may fail on its own) keeps 8006 open from here."""
    let_outside_in(sim)
    commands = [{"method": "POST", "path": "firewall/rules", "args": DROP_API},
                {"method": "PUT", "path": "firewall/rules/0", "args": {"moveto": 3}},
                {"method": "PUT", "path": "firewall/rules/2", "args": {"enable": 1}}]
    answer, sent = execute(remote, sim, commands)
    assert not answer.is_error, answer.content[0].text
    assert [r["status"] for r in json.loads(answer.content[0].text)["data"]] == [200, 200, 200]
    assert sent == [("pve", "POST", "/nodes/pve1/execute")]
    assert [(r["action"], r.get("source"), r["enable"]) for r in node_rules(sim)] == [
        ("ACCEPT", OUTSIDE, 1), ("ACCEPT", OUTSIDE, 1), ("DROP", None, 1)]


def test_a_command_that_may_fail_does_not_stand_for_one_that_keeps_the_way_in(remote, sim):
    """The first command adds another ACCEPT on top, with a digest that may not match: Proxmox then
    refuses it and runs the next command, so the second (delete rule 1: the old ACCEPT of 8006 after
    the first, the ACCEPT of SSH without it) is judged both ways."""
    let_outside_in(sim)
    commands = [{"method": "POST", "path": "firewall/rules", "args": LET_IN | {"digest": "0" * 40}},
                {"method": "DELETE", "path": "firewall/rules/1"}]
    answer, sent = execute(remote, sim, commands)
    assert answer.is_error and "would cut SSH (22)" in answer.content[0].text and sent == []

