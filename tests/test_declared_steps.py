"""Every step of a multi-request tool is declared before the first (docs/SECURITY.md#confirmation): on
2026-07-28 the user's yes can only be asked before the call runs, so a tool that sends a request
needing the yes after another write must name it first (client.plan -> policy.plan_steps), or it can
never complete for a client that asks its user. This walks every tool once (the calls of
test_every_tool_over_mcp, plus the firewall rule added lower down at the cluster level), takes the plan
a client that asks its user would be asked about before each call, runs the call, and proves: every
write it sends that needs the yes was in that plan."""
import inspect
import json

import pytest

import policy
import server
from conftest import everything_open, in_process
from test_every_tool_over_mcp import CALLS

EXTRA = [("write_edit_firewall_rule", {"action": "add", "pos": 1, "confirm": True,
                                       "rule": {"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "80"}})]


@pytest.fixture(scope="module")
def walked(sim, tmp_path_factory):
    """For each call: the approval keys of the plan a client that asks its user is asked about before
    the call runs (policy.plan_call: the tool run as far as its first write or its declared steps, as
    confirmation.plan_resolver runs it), and each write the call then sends (approval key, needs the
    yes, method and path)."""
    tmp = tmp_path_factory.mktemp("declared-steps")
    (tmp / "protected.json").write_text(json.dumps([{"host": "lab", "vmid": 105, "reason": "not used here"}]))
    sim.lab.guests[100]["config"]["ide2"] = "local-lvm:vm-100-cloudinit,media=cdrom"
    sim.lab.mcp_upids = {"pve": sim.lab.start_task("pve1", "vzdump", "100", finished=True),
                         "pbs": sim.lab.start_task("localhost", "verify", "backup", finished=True, product="pbs")}
    sim.lab.mcp_receipts = tmp / "state" / "state.sqlite3"
    sim.lab.firewall["cluster"]["rules"] = [{"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "443",
                                             "enable": 1}]
    functions = {spec.function.__name__: spec.function for spec in server.TOOLS}
    sent: list = []
    admit = policy.admit

    def admitting(host, method, path, params, send, **kw):
        def sending(decision):
            if decision.gates != ("read",) and not policy.follows_confirmed(host, decision):  # not exec output
                what = f"{decision.method} {decision.path}"
                sent.append((policy.approval_key(host, decision), decision.confirm, what))
            return send(decision)
        return admit(host, method, path, params, sending, **kw)

    calls = {}
    with in_process(everything_open(sim, tmp, PROXMOX_SOURCE_ADDRESS="192.0.2.50"), log_name="declared-steps") \
            as session:
        policy.admit = admitting
        try:
            for name, arguments in CALLS + EXTRA:
                arguments = arguments(sim.lab) if callable(arguments) else arguments
                plan = policy.Plan()
                if "ctx" in inspect.signature(functions[name]).parameters:  # the tools that can need the yes
                    with session.installed():
                        plan = policy.plan_call(functions[name], arguments | {"ctx": None}, name)
                del sent[:]
                session.call(name, arguments)
                planned = {policy.approval_key(host, decision) for host, decision in plan.decisions}
                calls[(name, json.dumps(arguments))] = (planned, list(sent))
        finally:
            policy.admit = admit
    return calls


def test_every_write_that_needs_the_yes_is_in_the_plan_asked_before_the_call(walked):
    several = {name for (name, _), (_, sent) in walked.items() if len(sent) > 1}
    # the walk reaches the tools that send more than one write (else it proves little)
    assert {"write_edit_firewall_rule", "write_drill_restore", "write_rollback_snapshot"} <= several, several
    unasked = {name: [what for key, confirm, what in sent if confirm and key not in planned]
               for (name, _), (planned, sent) in walked.items()}
    assert {name: found for name, found in unasked.items() if found} == {}


def test_the_cluster_rule_added_lower_down_declares_its_three_requests(walked):
    planned, sent = walked[("write_edit_firewall_rule", json.dumps(EXTRA[0][1]))]
    assert [what for _, _, what in sent] == ["POST /cluster/firewall/rules", "PUT /cluster/firewall/rules/0",
                                             "PUT /cluster/firewall/rules/1"]
    assert all(confirm and key in planned for key, confirm, _ in sent)
