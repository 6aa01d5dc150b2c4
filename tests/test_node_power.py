"""Rebooting and shutting down a node (write_node_power, node_tools.py): the plan names every guest there
and what happens to it, as Proxmox does it (power_effects.py, docs/PROXMOX-BEHAVIOUR.md#node-power: the
HA shutdown policy and maintenance mode, stop-all and onboot), and the simulator carries it out
(simulator/pve_node_power.py). The policy refuses it while a protected guest there would be changed,
unless HA moves that guest away first; the same holds for the same request through write_call_api.

Reads go with the README's reader token; the writes with a token of their own that holds
Sys.PowerMgmt (the operator token of the README has no Sys.* privilege, and a node's power needs it)."""
import json

import pytest

from conftest import User, requests_during, stdio_session, tool_session

PROTECTED = [{"host": "lab", "vmid": 101, "name": "db", "reason": "the production database"}]


def power_env(sim, tmp, **extra) -> dict:
    (tmp / "protected.json").write_text(json.dumps(PROTECTED))
    admin = sim.lab.pve_tokens["root@pam!admin"].secret
    return sim.env() | {"PROXMOX_LAB_WRITE_TOKEN": f"root@pam!admin={admin}", "PROXMOX_ACCESS": "destructive",
                        "PROXMOX_ALLOW_ELEVATED": "true", "PROXMOX_TOOLSETS": "all",
                        "PROXMOX_PROTECTED_VMS_FILE": str(tmp / "protected.json"),
                        "PROXMOX_AUDIT_LOG": str(tmp / "audit.jsonl")} | extra


@pytest.fixture(scope="module")
def power(sim, tmp_path_factory):
    sim.lab.node_command_seconds = sim.lab.reboot_seconds = sim.lab.ha_seconds = 0  # effects at the next ticks
    with tool_session(power_env(sim, tmp_path_factory.mktemp("power")), log_name="node-power") as session:
        yield session


@pytest.fixture()
def lab(sim):
    """The homelab as it was, each test changing what it needs (HA, onboot, the shutdown policy)."""
    saved = {vmid: (g["node"], g["status"], g["ha"], dict(g["config"])) for vmid, g in sim.lab.guests.items()}
    yield sim.lab
    for vmid, (node, status, ha, config) in saved.items():
        guest = sim.lab.guests[vmid]
        guest["node"], guest["status"], guest["ha"], guest["config"] = node, status, ha, config
    sim.lab.down_nodes.clear()
    sim.lab.ha_maintenance.clear()
    sim.lab.ha_rules.clear()
    sim.lab.datacenter.pop("ha", None)
    sim.lab.later.clear()


def plan(session, node: str, action: str = "reboot") -> dict[int, str]:
    answer = session.ok("write_node_power", {"node": node, "action": action, "dry_run": True})
    assert answer["dry_run"] is True
    rows = answer["guests"]
    return {row[0]: row[rows["columns"].index("what_happens")] for row in rows["rows"]}


def writes(sent: list) -> list:
    return [r for r in sent if r[1] != "GET"]


def test_guests_without_ha_are_shut_down_and_onboot_ones_start_again(power, lab, sim):
    lab.guests[100]["config"]["onboot"] = 1
    lab.guests[103]["config"] |= {"onboot": 1, "startup": "order=2,down=60"}
    seen, sent = requests_during(sim, lambda: plan(power, "pve1"))
    assert seen == {100: "shut down by the node's stop-all (hard stop after 180 s); started again at boot (onboot=1)",
                    103: "stopped now; started at boot (onboot=1)"}
    assert writes(sent) == []  # a dry run reads
    shutdown = plan(power, "pve1", "shutdown")
    assert shutdown[100].endswith("stays off until the node is powered on, then starts (onboot=1)")
    assert 103 not in shutdown  # stopped, and nothing starts it


@pytest.mark.parametrize("policy, action, expected", [
    (None, "reboot", "stopped and frozen by HA; started again on this node after the reboot"),
    (None, "shutdown", "stopped by HA; recovered (started) on another node once this one is fenced"),
    ("freeze", "shutdown", "stopped and frozen by HA; stays stopped until the node returns"),
    ("failover", "reboot", "stopped by HA; recovered (started) on another node once this one is fenced"),
    ("migrate", "reboot", "relocated (stopped, moved, started) by HA to another node (likely pve1) before the node "
                          "goes down; moved back when it returns"),
])
def test_ha_resources_follow_the_shutdown_policy(power, lab, policy, action, expected):
    lab.guests[102]["ha"] = {"state": "started"}
    if policy:
        lab.datacenter["ha"] = f"shutdown_policy={policy}"
    assert plan(power, "pve3", action)[102].startswith(expected)


def test_without_sys_audit_the_shutdown_policy_is_unknown_not_conditional():
    """GET /cluster/options answers only console, tag-style and allowed-tags to a token without
    Sys.Audit on / (pve-manager API2/Cluster.pm get_options): the plan says the policy is unknown."""
    import power_effects
    answers = {"/cluster/resources": [{"type": "lxc", "vmid": 102, "node": "pve3", "status": "running"},
                                      {"type": "node", "node": "pve1", "status": "online"}],
               "/cluster/ha/resources": [{"sid": "ct:102", "state": "started"}],
               "/cluster/options": {"allowed-tags": []}}
    [effect] = power_effects.effects(answers.get, "pve3", "reboot")
    assert "could not be read" in effect.how and effect.changes
    answers["/cluster/options"] = {"ha": {"shutdown_policy": "migrate"}, "allowed-tags": []}
    assert power_effects.effects(answers.get, "pve3", "reboot")[0].how.startswith("relocated")


def test_maintenance_mode_moves_them_whatever_the_policy_and_a_strict_rule_can_pin_them(power, lab):
    """Manual maintenance outlives the reboot, so nothing moves back (Manager.pm select_service_node); what
    HA cannot move is stopped under a policy other than migrate, and waited for under migrate (LRM.pm
    shutdown_request: `$maintenance` only for migrate, else request_stop for every service there)."""
    lab.guests[102]["ha"] = {"state": "started"}
    lab.ha_maintenance.add("pve3")
    assert plan(power, "pve3")[102].startswith("relocated (stopped, moved, started) by HA to another node (likely "
                                               "pve1) before the node goes down; it stays there until")
    lab.ha_rules["pin"] = {"type": "node-affinity", "resources": "ct:102", "nodes": "pve3", "strict": 1}
    assert plan(power, "pve3")[102].startswith("HA cannot move it (no other allowed node is online), so HA stops it")
    lab.datacenter["ha"] = "shutdown_policy=migrate"
    assert plan(power, "pve3")[102].startswith("HA cannot move it (no other allowed node is online), so the node's "
                                               "shutdown waits")


def test_a_stuck_resource_under_manual_maintenance_is_stopped_and_nothing_moves_back(power, lab):
    lab.guests[102]["ha"], lab.guests[100]["ha"] = {"state": "started"}, {"state": "started"}
    lab.ha_maintenance.add("pve1")
    lab.ha_rules["pin"] = {"type": "node-affinity", "resources": "ct:102", "nodes": "pve1", "strict": 1}
    lab.guests[102]["node"] = "pve1"
    power.ok("write_node_power", {"node": "pve1", "action": "reboot", "confirm": True})
    lab.tick()  # down: 100 moved away, 102 (pinned) stopped by the LRM
    assert lab.guests[100]["node"] != "pve1" and lab.guests[102]["status"] == "stopped"
    lab.tick()  # back, still in maintenance: 100 stays where HA put it
    assert "pve1" not in lab.down_nodes and lab.guests[100]["node"] != "pve1"


@pytest.mark.parametrize("mode, expected", [
    ("ignore", "shut down by the node's stop-all"),  # unmanaged while so disarmed: a clean shutdown
    ("freeze", "HA is disarmed (freeze): stop-all skips HA resources, so it is killed"),
])
def test_disarmed_ha_ignore_is_a_clean_shutdown_freeze_kills(power, lab, mode, expected):
    """HA/Config.pm `$service_check_ha_state`: disarmed with `ignore`, resources count as unmanaged."""
    lab.guests[102]["ha"] = {"state": "started"}
    lab.ha_disarm = mode
    try:
        assert plan(power, "pve3")[102].startswith(expected)
    finally:
        lab.ha_disarm = None


def test_the_plan_says_a_running_backup_is_aborted(power, lab):
    """pve-guests.service stops vzdump (`ExecStop=-/usr/bin/vzdump -stop`) before its guests."""
    answer = power.ok("write_node_power", {"node": "pve3", "action": "reboot", "dry_run": True})
    assert "backup running on the node is aborted" in json.dumps(answer)


def test_a_reboot_is_carried_out_as_planned(power, lab):
    lab.guests[100]["config"]["onboot"] = 1
    done = power.ok("write_node_power", {"node": "pve1", "action": "reboot", "confirm": True})
    assert done["result"] == "requested" and lab.node_commands[-1] == ("pve1", "reboot")
    lab.tick()  # the node goes down: its guests shut down first
    assert "pve1" in lab.down_nodes and lab.guests[100]["status"] == "stopped"
    lab.tick()  # and it is back: the onboot guest starts again
    assert "pve1" not in lab.down_nodes and lab.guests[100]["status"] == "running"


def test_a_shutdown_with_failover_recovers_ha_guests_elsewhere(power, lab):
    lab.guests[102]["ha"] = {"state": "started"}
    power.ok("write_node_power", {"node": "pve3", "action": "shutdown", "confirm": True})
    for _ in range(4):  # down, fenced, recovered, started on another node
        lab.tick()
    assert "pve3" in lab.down_nodes and lab.guests[102]["node"] == "pve1" and lab.guests[102]["status"] == "running"
    assert lab.guests[105]["status"] == "stopped" and lab.guests[105]["node"] == "pve3"  # no HA: it stays off


def test_a_protected_guest_there_refuses_it_unless_ha_moves_it_away(power, lab, sim):
    message, sent = requests_during(sim, lambda: power.error("write_node_power", {"node": "pve2", "action": "reboot",
                                                                                "confirm": True}))
    assert "changes protected guest 101 (db) without naming it" in message and "stop-all" in message
    assert writes(sent) == []
    api = power.error("write_call_api", {"method": "POST", "path": "/nodes/pve2/status",
                                         "params": {"command": "shutdown"}, "confirm": True})
    assert "protected guest 101" in api  # the same request by another way: the same judgement
    lab.guests[101]["ha"] = {"state": "started"}
    lab.datacenter["ha"] = "shutdown_policy=migrate"
    done, sent = requests_during(sim, lambda: power.ok("write_node_power", {"node": "pve2", "action": "reboot",
                                                                          "confirm": True}))
    assert ("pve", "POST", "/nodes/pve2/status") in sent
    moved = dict(zip(done["guests"]["columns"], next(r for r in done["guests"]["rows"] if r[0] == 101), strict=True))
    assert moved["moved_to"] == "pve1" and moved["what_happens"].startswith("live-migrated by HA to another node "
                                                                            "(likely pve1)")


def test_bad_input_the_tiers_and_the_question(power, sim, tmp_path):
    assert "Unknown node 'pve9'" in power.error("write_node_power", {"node": "pve9", "action": "reboot"})
    assert "argument 'action'" in power.error("write_node_power", {"node": "pve1", "action": "halt"})
    asked = power.error("write_node_power", {"node": "pve1", "action": "reboot"})
    assert "confirm=true" in asked and "Reboot node pve1" in asked and "web (100)" in asked
    with tool_session(power_env(sim, tmp_path, PROXMOX_ACCESS="write"), log_name="node-power-write") as lower:
        assert "write_node_power" not in {t.name for t in lower.tools()}
        message = lower.error("write_call_api", {"method": "POST", "path": "/nodes/pve1/status",
                                                 "params": {"command": "reboot"}, "confirm": True})
        assert "'destructive' gate" in message


@pytest.mark.mcp
@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_the_user_is_asked_once_about_every_guest(sim, lab, tmp_path, mode):
    user = User()
    user.answers = ["accept"]
    lab.guests[102]["ha"] = {"state": "started"}
    with stdio_session(power_env(sim, tmp_path), mode=mode, log_name=f"node-power-{mode}",
                       elicitation_callback=user) as session:
        refused = session.error("write_node_power", {"node": "pve2", "action": "reboot"})
        assert "protected guest 101" in refused and user.asked == []  # nobody is asked about what is refused
        done = session.ok("write_node_power", {"node": "pve3", "action": "reboot", "confirm": True})
    assert done["result"] == "requested" and len(user.asked) == 1
    question = user.asked[0]
    assert "dns (102): stopped and frozen by HA" in question and "ci-runner (105): shut down by the node's stop-all" \
        in question and "DESTRUCTIVE + ELEVATED" in question
