"""A batch is judged as it runs (docs/PROXMOX-BEHAVIOUR.md#nested-execute): POST /nodes/{node}/execute
runs its commands in order, each on the state the earlier ones left, and runs the next after one that
failed. Through the generic tool against the simulator (which runs batches as pve-manager does): two
harmless-looking commands that cut the API off are refused with nothing sent, as the same requests one
by one are; a batch whose every way of ending keeps this server in passes, and the simulator applies it."""
import copy
import json

import pytest

import calls
from conftest import everything_open, requests_during, tool_session
from settings import HostPolicy, Settings

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
    # execute is for root@pam only, never a token (docs/PROXMOX-BEHAVIOUR.md#nested-execute): its login beside it
    root = {"PROXMOX_LAB_USER": "root@pam", "PROXMOX_LAB_PASSWORD": sim.lab.logins["pve"]["root@pam"][0]}
    with tool_session(everything_open(sim, tmp, PROXMOX_SOURCE_ADDRESS=OUTSIDE, **root), log_name="batches") as session:
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
    assert [s for s in sent if s[2] != "/access/ticket"] == [("pve", "POST", "/nodes/pve1/execute")]  # root's login
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



# ---------------------------------------------------------------- the overlay, in process

def overlay_admit(steps, stored, *, protected=(101,)):
    """policy.plan_steps over a dict of stored objects, everything open: the decisions, or the refusal."""
    from types import SimpleNamespace

    import policy
    from protection import Protected
    host = SimpleNamespace(product="pve", label="lab", token_id="root@pam!admin", write_token_id=None)
    rules = HostPolicy("destructive", frozenset({"exec", "elevated", "sensitive"}))
    original = policy.settings()
    policy.configure(Settings(hosts={("pve", "lab"): rules}, protected=Protected(
        [{"host": "lab", "vmid": v, "reason": "test"} for v in protected])))
    token = policy.CALL.set(calls.Call(tool="test", confirm=lambda *_: None))
    try:
        return policy.plan_steps(host, steps, "test", read=stored.get)
    finally:
        policy.CALL.reset(token)
        policy.configure(original)


RESOURCES = [{"type": "qemu", "vmid": 101, "node": "pve2"}, {"type": "qemu", "vmid": 104, "node": "pve2"}]


def test_a_declared_step_is_judged_on_the_job_the_step_before_leaves():
    """A job that keeps 101 out: switching it to stop mode changes nothing for 101, and dropping the
    exclude of a snapshot-mode job that never prunes would not either; one after the other, 101 is
    backed up in stop mode."""
    from errors import PolicyError
    stored = {"/cluster/backup/safe": {"id": "safe", "all": 1, "exclude": "101", "mode": "snapshot", "remove": 0,
                                       "enabled": 1, "schedule": "daily"}, "/cluster/resources": RESOURCES}
    overlay_admit([("PUT", "/cluster/backup/safe", {"mode": "stop"})], stored)
    overlay_admit([("PUT", "/cluster/backup/safe", {"delete": "exclude"})], stored)
    with pytest.raises(PolicyError, match="changes protected guest 101.*mode stop"):
        overlay_admit([("PUT", "/cluster/backup/safe", {"mode": "stop"}),
                       ("PUT", "/cluster/backup/safe", {"delete": "exclude"})], stored)


def test_a_batch_names_what_it_frees_as_the_commands_before_leave_the_config():
    """Detaching scsi1 makes it unused0 (qemu-server vmconfig_delete_or_detach_drive); the next command
    frees unused0: the question names scsi1's volume, not what unused0 held before the batch."""
    import policy
    from test_bypass_corpus import PVE, settings_for
    stored = {"/nodes/pve2/qemu/104/config": {"scsi0": "local-lvm:vm-104-disk-0,size=32G",
                                              "scsi1": "local-lvm:vm-104-disk-1,size=4G"},
              "/nodes/pve2/storage/local-lvm/content/local-lvm:vm-104-disk-1": {"size": 4 << 30}}
    commands = [{"method": "PUT", "path": "qemu/104/config", "args": {"delete": "scsi1"}},
                {"method": "PUT", "path": "qemu/104/config", "args": {"delete": "unused0"}}]
    original = policy.settings()
    policy.configure(settings_for("open"))
    try:
        decision = policy.classify(PVE, "POST", "/nodes/pve2/execute", {"commands": json.dumps(commands)},
                                   read=stored.get)
    finally:
        policy.configure(original)
    assert any("frees unused0: local-lvm:vm-104-disk-1 (4.0 GiB)" in r for r in decision.reasons), decision.reasons


def test_a_later_read_of_what_an_earlier_write_changed_that_cannot_be_computed_is_refused():
    import batch
    from errors import PolicyError
    from policy import Decision
    overlay = batch.Overlay({"/nodes/pve1/qemu/104/snapshot": []}.get)
    overlay.fold(Decision("POST", "/nodes/pve1/qemu/104/snapshot", {"snapname": "a"},
                          "/nodes/{node}/qemu/{vmid}/snapshot"))
    with pytest.raises(PolicyError, match="send them one by one"):
        overlay.read("/nodes/pve1/qemu/104/snapshot")
    assert overlay.read("/nodes/pve1/qemu/105/snapshot") is None  # another guest's: read as it is
