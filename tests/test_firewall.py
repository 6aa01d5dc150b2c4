"""The firewall tools and the lockout guard, through the MCP client against the simulator: what the
firewall holds and whether it filters, each change working, and each refusal (the guard, a closed
gate, a protected guest, a missing privilege, bad input) with nothing sent. The guard's model of an
edit is checked against the simulator's, and its verdicts against pve-firewall's rules, table-driven."""
import copy
import ipaddress
import json

import pytest

import firewall_guard
import firewall_tools
from answers import LIST_CAP
from conftest import everything_open, requests_during, tool_session
from simulator import Lab, handle

PROTECTED = [{"host": "lab", "vmid": 101, "name": "db", "reason": "the production database"}]
ADMIN = "PVEAPIToken=root@pam!admin=aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
LAN = "192.0.2.50"  # on the nodes' own network (vmbr0 192.0.2.0/24): in the management IP set
OUTSIDE = "198.51.100.7"  # a VPN or another site: let in by no default


@pytest.fixture(autouse=True)
def fresh_firewall(sim):
    """Each test starts from the lab's firewall: on, no rules, default policies."""
    before = copy.deepcopy(sim.lab.firewall)
    yield
    sim.lab.firewall = before


def session_for(sim, tmp_path_factory, name, **extra):
    """Every gate open (the firewall of the cluster and nodes is elevated), guest 101 protected."""
    tmp = tmp_path_factory.mktemp(name)
    (tmp / "protected.json").write_text(json.dumps(PROTECTED))
    return tool_session(everything_open(sim, tmp, **extra), log_name=f"firewall-{name}")


@pytest.fixture(scope="module")
def admin(sim, tmp_path_factory):
    # the address a node sees is named: the test world reaches the simulator through loopback
    with session_for(sim, tmp_path_factory, "lan", PROXMOX_SOURCE_ADDRESS=LAN) as session:
        yield session


@pytest.fixture(scope="module")
def remote(sim, tmp_path_factory):
    with session_for(sim, tmp_path_factory, "outside", PROXMOX_SOURCE_ADDRESS=OUTSIDE) as session:
        yield session


@pytest.fixture(scope="module")
def unknown(sim, tmp_path_factory):
    with session_for(sim, tmp_path_factory, "unknown") as session:  # the default: the address is found, loopback
        yield session


def rows(answer):
    return [dict(zip(answer["columns"], row, strict=True)) for row in answer["rows"]]


def cluster_rules(sim):
    return sim.lab.firewall["cluster"]["rules"]


def writes(sim, action):
    return requests_during(sim, action, writes=True)


DROP_SSH = {"type": "in", "action": "DROP", "proto": "tcp", "dport": "22"}


# ---------------------------------------------------------------- reads

def test_firewall_rules_says_where_it_filters(admin, sim):
    sim.lab.firewall["cluster"]["rules"] = [{"type": "in", "action": "ACCEPT", "macro": "SSH", "enable": 1}]
    sim.lab.firewall["cluster"]["ipsets"]["management"] = {"entries": [{"cidr": "10.9.0.0/16"},
                                                                      {"cidr": "10.9.9.9", "nomatch": 1}]}
    sim.lab.firewall["hosts"]["pve2"] = {"options": {"enable": 0}, "rules": []}
    cluster = admin.ok("firewall_rules")
    assert cluster["level"] == "cluster" and cluster["options"] == {"enable": 1}
    assert cluster["filtering"] == {"cluster": True, "nodes": {"pve1": True, "pve2": False, "pve3": True},
                                    "filters": True}
    assert rows(cluster["rules"])[0] | {"pos": 0} == {"pos": 0, "type": "in", "action": "ACCEPT", "match": "SSH",
                                                      "source": "", "dest": "", "iface": "", "enable": 1,
                                                      "comment": ""}
    assert cluster["ipsets"] == {"management": ["10.9.0.0/16", "!10.9.9.9"]} and cluster["digest"]
    node = admin.ok("firewall_rules", {"node": "pve2"})
    assert node["filtering"] == {"cluster": True, "node": False, "filters": False}
    guest = admin.ok("firewall_rules", {"vmid": 100})
    assert guest["filtering"] == {"cluster": True, "guest": False, "nics": {"net0": False}, "filters": []}


def test_firewall_rules_stays_small_with_long_lists(admin, sim):
    """Many rules, a long IP set and a long security group: each cut, with what was left out counted."""
    fw = sim.lab.firewall["cluster"]
    fw["rules"] = [{"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": str(1000 + n), "enable": 1}
                   for n in range(firewall_tools.SHOWN_RULES + 5)]
    fw["ipsets"]["blocked"] = {"entries": [{"cidr": f"203.0.113.{n}"} for n in range(LIST_CAP + 3)]}
    fw["groups"]["web"] = [{"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": str(8000 + n), "enable": 1}
                           for n in range(LIST_CAP + 4)]
    cluster = admin.ok("firewall_rules")
    assert len(cluster["rules"]["rows"]) == firewall_tools.SHOWN_RULES and cluster["rules"]["truncated"]
    assert cluster["rules"]["total"] == firewall_tools.SHOWN_RULES + 5 and "/cluster/firewall/rules" in \
        cluster["rules"]["next"] and "next_offset" not in cluster["rules"]
    assert len(cluster["ipsets"]["blocked"]) == LIST_CAP + 1 and cluster["ipsets"]["blocked"][-1] == "+3 more"
    assert len(cluster["groups"]["web"]) == LIST_CAP + 1 and cluster["groups"]["web"][-1] == "+4 more"


def test_a_guest_filters_only_with_its_option_and_the_nic_flag(admin, sim):
    sim.lab.firewall["guests"][100] = {"options": {"enable": 1}, "rules": [], "ipsets": {}, "aliases": {}}
    assert admin.ok("firewall_rules", {"vmid": 100})["filtering"]["filters"] == []  # net0 lacks firewall=1
    nic = sim.lab.guests[100]["config"]["net0"]
    admin.ok("write_set_nic", {"vmid": 100, "firewall": True})
    assert admin.ok("firewall_rules", {"vmid": 100})["filtering"]["filters"] == ["net0"]
    sim.lab.guests[100]["config"]["net0"] = nic


# ---------------------------------------------------------------- changes

def test_add_update_move_and_delete_a_guest_rule(admin, sim):
    web = {"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "80", "comment": "web"}
    added = admin.ok("write_edit_firewall_rule", {"vmid": 100, "action": "add", "rule": web})
    assert added["pos"] == 0 and added["rule"]["enable"] == 1  # Proxmox would add it disabled
    assert added["note"] == ("The firewall of guest 100 filters nothing now: guest 100's option enable is off; "
                             "no NIC has firewall=1 (write_set_nic firewall=true).")
    admin.ok("write_edit_firewall_rule", {"vmid": 100, "action": "add", "rule": web | {"dport": "443"}})
    rules = sim.lab.firewall["guests"][100]["rules"]
    assert [r["dport"] for r in rules] == ["443", "80"]  # a new rule goes on top
    admin.ok("write_edit_firewall_rule", {"vmid": 100, "action": "add", "pos": 1,
                                          "rule": {"type": "in", "action": "DROP", "proto": "tcp", "dport": "25"}})
    assert [(r["dport"], r["enable"]) for r in rules] == [("443", 1), ("25", 1), ("80", 1)]
    updated = admin.ok("write_edit_firewall_rule", {"vmid": 100, "action": "update", "pos": 2,
                                                    "rule": {"dport": "8080", "delete": "comment"}})
    assert updated["rule"]["match"] == "tcp 8080" and "comment" not in rules[2]
    moved = admin.ok("write_edit_firewall_rule", {"vmid": 100, "action": "move", "pos": 0, "rule": {"moveto": 2}})
    assert moved["pos"] == 2 and [r["dport"] for r in rules] == ["25", "8080", "443"]
    deleted = admin.ok("write_edit_firewall_rule", {"vmid": 100, "action": "delete", "pos": 0, "confirm": True})
    assert deleted["deleted"]["match"] == "tcp 25" and [r["dport"] for r in rules] == ["8080", "443"]


def test_a_stale_digest_is_refused_with_nothing_sent(admin, sim):
    admin.ok("write_edit_firewall_rule", {"vmid": 100, "action": "add", "rule": DROP_SSH})
    digest = admin.ok("firewall_rules", {"vmid": 100})["digest"]
    admin.ok("write_edit_firewall_rule", {"vmid": 100, "action": "add", "rule": DROP_SSH | {"dport": "23"}})
    message, sent = writes(sim, lambda: admin.error("write_edit_firewall_rule", {
        "vmid": 100, "action": "delete", "pos": 0, "digest": digest, "confirm": True}))
    assert "changed since you read them" in message and sent == []


@pytest.mark.parametrize("arguments, expected", [
    ({"action": "add"}, "`rule` is needed"),
    ({"action": "add", "rule": {"type": "in", "action": "ACCEPT", "port": "22"}}, "Unknown rule field(s) port"),
    ({"action": "update", "rule": {"dport": "22"}}, "`pos` is needed"),
    ({"action": "delete", "pos": 7, "confirm": True}, "No rule at pos 7"),
    ({"action": "move", "pos": 0}, "moveto"),
    ({"action": "add", "rule": {"type": "in", "action": "ALLOW"}}, "ACCEPT, DROP or REJECT"),
    ({"action": "add", "rule": {"type": "sideways", "action": "DROP"}}, "type"),  # the schema's check
])
def test_bad_rule_input_is_refused_with_nothing_sent(admin, sim, arguments, expected):
    message, sent = writes(sim, lambda: admin.error("write_edit_firewall_rule", {"vmid": 100} | arguments))
    assert expected in message and sent == []


def test_an_unknown_node_is_refused_with_nothing_sent(admin, sim):
    message, sent = writes(sim, lambda: admin.error("write_edit_firewall_rule", {
        "node": "PVE1", "action": "add", "rule": DROP_SSH, "confirm": True}))
    assert "did you mean 'pve1'" in message and sent == []


def test_options_enable_a_guest_and_refuse_a_node_policy(admin, sim):
    answer = admin.ok("write_set_firewall_options", {"vmid": 100, "enable": True, "policy_in": "DROP"})
    assert answer["options"] == {"enable": 1, "policy_in": "DROP"} and answer["filtering"]["guest"] is True
    message, sent = writes(sim, lambda: admin.error("write_set_firewall_options",
                                                    {"node": "pve1", "policy_in": "DROP"}))
    assert "cluster's policy_in" in message and sent == []
    assert "Nothing to change" in admin.error("write_set_firewall_options", {"vmid": 100})


# ---------------------------------------------------------------- the lockout guard

@pytest.mark.mcp  # a refusal as the client sees it
def test_a_rule_that_cuts_ssh_from_this_server_is_refused(admin, sim):
    message, sent = writes(sim, lambda: admin.error("write_edit_firewall_rule", {"action": "add", "rule": DROP_SSH,
                                                                                 "confirm": True}))
    assert "would cut SSH (22) on node pve1 from 192.0.2.50" in message and sent == []
    assert "cluster rule 0 (in DROP tcp 22 from anywhere)" in message  # what cuts it
    assert "management IP set" in message  # what lets it in now
    assert '"source": "192.0.2.50"' in message and "pos=1" in message  # the rule that keeps it open, and where


def test_a_rule_that_spares_this_server_is_allowed(admin, sim):
    admin.ok("write_edit_firewall_rule",
             {"action": "add", "rule": DROP_SSH | {"source": "10.0.0.0/8"}, "confirm": True})
    keep = {"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "22", "source": LAN}
    admin.ok("write_edit_firewall_rule", {"action": "add", "rule": keep, "confirm": True})
    added = admin.ok("write_edit_firewall_rule", {"action": "add", "pos": 1, "rule": DROP_SSH, "confirm": True})
    assert added["pos"] == 1 and [r.get("source") for r in cluster_rules(sim)] == [LAN, None, "10.0.0.0/8"]
    message = admin.error("write_edit_firewall_rule", {"action": "move", "pos": 0, "rule": {"moveto": 2},
                                                       "confirm": True})
    assert "would cut SSH (22)" in message  # moving the ACCEPT below the DROP


def test_a_node_rule_is_judged_for_that_node(admin, sim):
    cut_api = {"type": "in", "action": "REJECT", "proto": "tcp", "dport": "8000:8010", "source": "192.0.2.0/24"}
    message = admin.error("write_edit_firewall_rule",
                          {"node": "pve2", "action": "add", "rule": cut_api, "confirm": True})
    assert "would cut the API (8006) on node pve2" in message and "node=pve2" in message
    assert sim.lab.firewall["hosts"].get("pve2", {}).get("rules", []) == []


def test_write_call_api_cannot_bypass_the_guard(admin, sim):
    request = {"method": "POST", "path": "/cluster/firewall/rules", "confirm": True,
               "params": {"type": "in", "action": "DROP", "macro": "PMG", "enable": 1}}
    message, sent = writes(sim, lambda: admin.error("write_call_api", request))
    assert "would cut the API (8006)" in message and sent == []
    request["params"].pop("enable")  # Proxmox adds it disabled: it cuts nothing
    admin.ok("write_call_api", request)
    assert cluster_rules(sim)[0]["enable"] == 0


def test_enabling_the_firewall_from_outside_needs_a_rule_first(remote, sim):
    sim.lab.firewall["cluster"]["options"] = {}  # off, as on a fresh install
    message, sent = writes(sim, lambda: remote.error("write_set_firewall_options", {"enable": True, "confirm": True}))
    assert "would cut the API (8006) on node pve1 from 198.51.100.7" in message and sent == []
    assert "the input policy DROP" in message and '"source": "198.51.100.7"' in message
    for port in ("8006", "22"):
        remote.ok("write_edit_firewall_rule", {"action": "add", "confirm": True, "rule": {
            "type": "in", "action": "ACCEPT", "proto": "tcp", "dport": port, "source": OUTSIDE}})
    assert remote.ok("write_set_firewall_options", {"enable": True, "confirm": True})["filtering"]["filters"] is True


def test_the_management_ip_set_counts_and_is_guarded(remote, sim):
    sim.lab.firewall["cluster"]["ipsets"]["management"] = {"entries": [{"cidr": OUTSIDE}]}
    call = {"method": "DELETE", "path": f"/cluster/firewall/ipset/management/{OUTSIDE}", "confirm": True}
    assert "would cut the API (8006)" in remote.error("write_call_api", call)
    # the management IP set is let in before the policy applies
    assert remote.ok("write_set_firewall_options", {"policy_in": "REJECT", "confirm": True})["result"] == "ok"


def test_an_unknown_source_is_judged_for_every_address_let_in(unknown, sim):
    message = unknown.error("write_edit_firewall_rule", {"action": "add", "rule": DROP_SSH, "confirm": True})
    assert "PROXMOX_SOURCE_ADDRESS" in message and "192.0.2." in message


def test_a_disabled_node_firewall_cuts_nothing(admin, sim):
    sim.lab.firewall["hosts"] = {name: {"options": {"enable": 0}, "rules": []} for name in ("pve1", "pve2", "pve3")}
    admin.ok("write_edit_firewall_rule", {"action": "add", "rule": DROP_SSH, "confirm": True})
    message = admin.error("write_set_firewall_options", {"node": "pve3", "enable": True, "confirm": True})
    assert "would cut SSH (22) on node pve3" in message


def test_on_nodes_with_the_nftables_backend_management_is_let_in_before_any_rule(admin, remote, sim):
    """Issue 29: a node whose firewall option `nftables` is on runs proxmox-firewall, which accepts the
    management IP set on 8006, 22, 3128 and 5900-5999 before the node's and the cluster's rules
    (proxmox-firewall resources/proxmox-firewall.nft: default-in jumps to accept-management first).
    From the LAN (in the management set) a DROP of SSH cuts nothing there; from outside it still cuts."""
    for node in ("pve1", "pve2", "pve3"):
        admin.ok("write_call_api", {"method": "PUT", "path": f"/nodes/{node}/firewall/options",
                                    "params": {"nftables": 1}, "confirm": True})
    assert sim.lab.firewall["hosts"]["pve1"]["options"]["nftables"] == 1
    admin.ok("write_edit_firewall_rule", {"action": "add", "rule": DROP_SSH, "confirm": True})
    assert cluster_rules(sim)[0] == DROP_SSH | {"enable": 1}
    remote.ok("write_edit_firewall_rule", {"action": "add", "confirm": True, "rule": {
        "type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "8006", "source": OUTSIDE}})
    message = remote.error("write_edit_firewall_rule", {"action": "add", "confirm": True, "rule": {
        "type": "in", "action": "DROP", "proto": "tcp", "dport": "8006"}})
    assert "would cut the API (8006) on node pve1 from 198.51.100.7" in message


def test_switching_a_node_to_nftables_is_judged_too(admin, sim):
    """The blacklist IP set drops before the rules under pve-firewall; proxmox-firewall has none, so a node
    switched to nftables lets a blacklisted address in through the management set: a switch back that
    would drop this server again is refused."""
    sim.lab.firewall["cluster"]["ipsets"]["blacklist"] = {"entries": [{"cidr": LAN}]}
    sim.lab.firewall["hosts"]["pve1"] = {"options": {"nftables": 1}, "rules": []}
    message = admin.error("write_call_api", {"method": "PUT", "path": "/nodes/pve1/firewall/options",
                                             "params": {"nftables": 0}, "confirm": True})
    assert "would cut the API (8006) on node pve1 from 192.0.2.50" in message and "blacklist" in message


# ---------------------------------------------------------------- gates, protection, privileges

def test_the_cluster_firewall_needs_the_elevated_gate(sim, tmp_path):
    # the admin token: only the gates decide here, not a missing privilege
    env = sim.env(pve_token="root@pam!admin") | {"PROXMOX_ACCESS": "destructive", "PROXMOX_TOOLSETS": "firewall",
                                                 "PROXMOX_AUDIT_LOG": str(tmp_path / "audit.jsonl")}
    with tool_session(env, log_name="firewall-no-elevated") as session:
        message, sent = writes(sim, lambda: session.error("write_edit_firewall_rule",
                                                          {"action": "add", "rule": DROP_SSH}))
        assert "elevated" in message and "PROXMOX_ALLOW_ELEVATED" in message and sent == []
        session.ok("write_edit_firewall_rule", {"vmid": 100, "action": "add", "rule": DROP_SSH})  # a guest's: write


def test_a_protected_guests_firewall_is_refused(admin, sim):
    for tool, arguments in [("write_edit_firewall_rule", {"action": "add", "rule": DROP_SSH}),
                            ("write_set_firewall_options", {"enable": False})]:
        message, sent = writes(sim, lambda t=tool, a=arguments: admin.error(t, a | {"vmid": 101}))
        assert "Guest 101 (db) is protected" in message and sent == []


def test_what_a_protected_guests_firewall_uses_is_protected(admin, sim):
    fw = sim.lab.firewall
    fw["cluster"]["groups"] |= {"dbaccess": [], "web": []}
    fw["cluster"]["aliases"]["dbclients"] = {"name": "dbclients", "cidr": "192.0.2.0/28"}
    fw["guests"][101] = {"options": {"enable": 1}, "ipsets": {}, "aliases": {}, "rules": [
        {"type": "group", "action": "dbaccess", "enable": 1},
        {"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "5432", "source": "dbclients", "enable": 1}]}
    rule = {"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "80"}
    for call in ({"method": "POST", "path": "/cluster/firewall/groups/dbaccess", "params": rule},
                 {"method": "PUT", "path": "/cluster/firewall/aliases/dbclients", "params": {"cidr": "0.0.0.0/1"}}):
        message, sent = writes(sim, lambda c=call: admin.error("write_call_api", c | {"confirm": True}))
        assert "Guest 101 (db) is protected" in message and sent == []
    message = admin.error("write_set_firewall_options", {"enable": False, "confirm": True})  # its firewall needs this
    assert "Guest 101 (db) is protected" in message and fw["cluster"]["options"]["enable"] == 1
    admin.ok("write_call_api", {"method": "POST", "path": "/cluster/firewall/groups/web", "params": rule,
                                "confirm": True})  # a group it does not use


def test_a_token_without_sys_modify_is_refused(sim, tmp_path):
    # ops@pve holds PVEVMAdmin (VM.Config.Network: the tool is offered) and PVEAuditor, not Sys.Modify
    env = {"PROXMOX_LAB_URL": sim.pve_url, "PROXMOX_LAB_USER": "ops@pve", "PROXMOX_LAB_PASSWORD":
           "sim-ops-password-4711", "PROXMOX_LAB_FINGERPRINT": sim.fingerprint, "PROXMOX_ACCESS": "write",
           "PROXMOX_ALLOW_ELEVATED": "true", "PROXMOX_TOOLSETS": "firewall",
           "PROXMOX_AUDIT_LOG": str(tmp_path / "audit.jsonl")}
    with tool_session(env, log_name="firewall-ops") as session:
        message, sent = writes(sim, lambda: session.error("write_set_firewall_options", {"enable": False,
                                                                                         "confirm": True}))
        assert "lacks Sys.Modify on /" in message and "pveum acl modify" in message and sent == []
    with tool_session(sim.env() | {"PROXMOX_ACCESS": "write", "PROXMOX_TOOLSETS": "firewall"},
                      log_name="firewall-reader") as session:  # the reader token holds neither: not offered
        assert "no configured token holds VM.Config.Network or Sys.Modify" in session.error(
            "write_edit_firewall_rule", {"action": "add", "rule": DROP_SSH})


def test_a_dry_run_sends_nothing_and_still_meets_the_guard(admin, sim):
    plan, sent = writes(sim, lambda: admin.ok("write_edit_firewall_rule", {"vmid": 100, "action": "add", "pos": 2,
                                                                           "rule": DROP_SSH, "dry_run": True}))
    assert plan["dry_run"] is True and sent == [] and "moved to pos 0, then enabled" in plan["plan"]
    base = "/nodes/pve1/qemu/100/firewall/rules"
    assert [step["run"] for step in plan["steps"]] == [base, f"{base}/0", f"{base}/0"]  # every step, declared
    assert "would cut" in admin.error("write_edit_firewall_rule", {"action": "add", "rule": DROP_SSH, "dry_run": True})


# ---------------------------------------------------------------- the guard's model against the simulator

def read_lab(lab):
    return lambda path, **params: handle(lab, "pve", "GET", path, params, ADMIN)


EDITS = [  # (method, path, params): each is applied by the guard's model and by the simulator
    ("POST", "/cluster/firewall/rules", {"type": "in", "action": "DROP", "proto": "tcp", "dport": "22"}),
    ("POST", "/cluster/firewall/rules", {"type": "in", "action": "ACCEPT", "macro": "SSH", "enable": "1"}),
    ("PUT", "/cluster/firewall/rules/0", {"moveto": "3"}),
    ("PUT", "/cluster/firewall/rules/1", {"moveto": "0"}),
    ("PUT", "/cluster/firewall/rules/0", {"source": "192.0.2.0/24", "comment": "lan", "enable": "1"}),
    ("PUT", "/cluster/firewall/rules/0", {"delete": "comment", "dport": ""}),
    ("DELETE", "/cluster/firewall/rules/1", {}),
    ("POST", "/nodes/pve2/firewall/rules", {"type": "in", "action": "REJECT", "proto": "tcp", "enable": "1"}),
    ("PUT", "/nodes/pve2/firewall/options", {"enable": "0"}),
    ("PUT", "/cluster/firewall/options", {"policy_in": "ACCEPT", "delete": "enable"}),
    ("POST", "/cluster/firewall/groups", {"group": "web"}),
    ("POST", "/cluster/firewall/groups/web", {"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "80"}),
    ("POST", "/cluster/firewall/rules", {"type": "group", "action": "web", "enable": "1"}),
    ("POST", "/cluster/firewall/groups", {"group": "www", "rename": "web"}),
    ("POST", "/cluster/firewall/ipset", {"name": "management"}),
    ("POST", "/cluster/firewall/ipset/management", {"cidr": "10.0.0.0/8"}),
    ("POST", "/cluster/firewall/ipset/management", {"cidr": "10.1.2.3", "nomatch": "1"}),
    ("DELETE", "/cluster/firewall/ipset/management/10.1.2.3", {}),
    ("POST", "/cluster/firewall/aliases", {"name": "Office", "cidr": "198.51.100.0/24"}),
    ("PUT", "/cluster/firewall/aliases/office", {"cidr": "198.51.100.0/25", "rename": "branch"}),
    ("DELETE", "/cluster/firewall/aliases/branch", {}),
]


def test_the_guards_model_of_each_edit_matches_the_simulator():
    import catalog
    lab = Lab.homelab()
    for method, path, params in EDITS:
        template, _, where = catalog.find_path("pve", path)
        before = firewall_guard.read_firewall(read_lab(lab), None)
        predicted = firewall_guard.apply(before, method, template, where, params)
        handle(lab, "pve", method, path, dict(params), ADMIN)
        actual = firewall_guard.read_firewall(read_lab(lab), None)
        for fw in (predicted, actual):
            fw.options.pop("digest", None)
            for host in fw.hosts.values():
                host["options"].pop("digest", None)
        assert predicted == actual, (method, path, params)
    assert lab.schema_rejections == []


# ---------------------------------------------------------------- verdicts, as pve-firewall's input chain decides

HOST = {"options": {}, "rules": [], "ip": "192.0.2.11", "iface": "vmbr0", "localnet": "192.0.2.0/24"}


def firewall(rules=(), node_rules=(), options=None, ipsets=None, aliases=None, groups=None, host=None):
    return firewall_guard.Firewall(options={"enable": 1} | (options or {}), rules=list(rules),
                                   groups=groups or {}, ipsets=ipsets or {}, aliases=aliases or {},
                                   hosts={"pve1": HOST | {"rules": list(node_rules)} | (host or {})})


def rule(action="DROP", **fields):
    return {"type": "in", "action": action, "enable": 1} | fields


VERDICTS = [  # (firewall, source, port, let in, why (a part of it))
    (firewall(options={"enable": 0}), OUTSIDE, 22, True, "cluster firewall is off"),
    (firewall(host={"options": {"enable": 0}}), OUTSIDE, 22, True, "firewall is off"),
    (firewall(), LAN, 8006, True, "management IP set"),
    (firewall(), LAN, 8007, False, "input policy DROP"),  # 8007 is no management port
    (firewall(), OUTSIDE, 22, False, "input policy DROP"),
    (firewall(options={"policy_in": "ACCEPT"}), OUTSIDE, 22, True, "input policy ACCEPT"),
    (firewall(), "192.0.2.11", 22, True, "(lo)"),
    (firewall([rule(proto="tcp", dport="22")]), LAN, 22, False, "cluster rule 0"),
    (firewall([rule(proto="udp", dport="22")]), LAN, 22, True, "management"),
    (firewall([rule(macro="SSH")]), LAN, 22, False, "cluster rule 0"),
    (firewall([rule(macro="HTTPS")]), LAN, 8006, True, "management"),
    (firewall([rule(proto="tcp", dport="ssh")]), LAN, 22, False, "cluster rule 0"),
    (firewall([rule(proto="tcp", dport="8000:8010")]), LAN, 8006, False, "cluster rule 0"),
    (firewall([rule()]), LAN, 8006, False, "cluster rule 0"),  # any protocol
    (firewall([rule(enable=0)]), LAN, 8006, True, "management"),
    (firewall([rule(source="10.0.0.0/8")]), LAN, 22, True, "management"),
    (firewall([rule(source="192.0.2.40-192.0.2.60")]), LAN, 22, False, "cluster rule 0"),
    (firewall([rule(source="2001:db8::/32")]), LAN, 22, True, "management"),  # another IP version
    (firewall([rule(source="office")], aliases={"office": "192.0.2.0/24"}), LAN, 22, False, "cluster rule 0"),
    (firewall([rule(source="nosuchalias")]), LAN, 22, True, "management"),  # fails to compile: skipped
    (firewall([rule(source="local_network")]), LAN, 22, False, "cluster rule 0"),  # defined at compile time
    (firewall([rule(source="+admins")], ipsets={"admins": [{"cidr": "192.0.2.0/24"},
                                                           {"cidr": LAN, "nomatch": 1}]}), LAN, 22, True, "manage"),
    (firewall([rule(iface="vmbr1")]), LAN, 22, True, "management"),
    (firewall([rule(iface="vmbr0")]), LAN, 22, False, "cluster rule 0"),
    (firewall([rule(sport="1024:65535", proto="tcp")]), LAN, 22, False, "cluster rule 0"),  # cannot tell: worse way
    (firewall([rule("ACCEPT", sport="1024:65535", proto="tcp")]), OUTSIDE, 22, False, "policy DROP"),
    (firewall([rule("ACCEPT", source=OUTSIDE)]), OUTSIDE, 22, True, "cluster rule 0"),
    (firewall([rule()], [rule("ACCEPT", macro="SSH")]), LAN, 22, True, "node rule 0"),  # node rules first
    (firewall([rule(type="group", action="guard")], groups={"guard": [rule(proto="tcp", dport="22")]}), LAN, 22,
     False, "cluster rule 0"),
    (firewall([rule(type="group", action="guard"), rule()], groups={"guard": [rule("ACCEPT")]}), LAN, 22, True,
     "cluster rule 0"),
    (firewall([rule(type="out")]), LAN, 22, True, "management"),
    (firewall(ipsets={"management": [{"cidr": OUTSIDE}]}), OUTSIDE, 22, True, "management"),
    (firewall(ipsets={"blacklist": [{"cidr": "192.0.2.0/24"}]}), LAN, 22, False, "blacklist"),
    (firewall(aliases={"local_network": "10.0.0.0/8"}), LAN, 22, False, "policy DROP"),  # the alias replaces it
]


NFT = {"options": {"nftables": 1}}
VERDICTS += [  # nodes on the nftables backend (proxmox-firewall), as its input chain decides
    (firewall([rule(proto="tcp", dport="22")], host=NFT), LAN, 22, True, "before any rule"),
    (firewall([], [rule(proto="tcp", dport="8006")], host=NFT), LAN, 8006, True, "before any rule"),
    (firewall([rule(proto="tcp", dport="22")], host=NFT), OUTSIDE, 22, False, "cluster rule 0"),
    (firewall([rule("ACCEPT", source=OUTSIDE)], host=NFT), OUTSIDE, 22, True, "cluster rule 0"),
    (firewall(ipsets={"blacklist": [{"cidr": "192.0.2.0/24"}]}, host=NFT), LAN, 22, True, "management"),
    (firewall([rule()], host=NFT), LAN, 8007, False, "cluster rule 0"),  # 8007 is no management port there either
    # nftables takes a nomatch entry anywhere as excluding (`saddr != @management-nomatch`), pve-firewall's
    # ipset the most specific entry
    (firewall(ipsets={"management": [{"cidr": LAN}, {"cidr": "192.0.2.0/24", "nomatch": 1}]},
              aliases={"local_network": "10.0.0.0/8"}, host=NFT), LAN, 22, False, "policy DROP"),
    (firewall(ipsets={"management": [{"cidr": LAN}, {"cidr": "192.0.2.0/24", "nomatch": 1}]},
              aliases={"local_network": "10.0.0.0/8"}), LAN, 22, True, "management"),
]


@pytest.mark.parametrize("fw, source, port, let_in, why", VERDICTS)
def test_verdicts_follow_pve_firewall(fw, source, port, let_in, why):
    verdict = firewall_guard.verdict(fw, "pve1", ipaddress.ip_address(source), port)
    assert verdict[0] is let_in and why in verdict[1], verdict


def test_port_8007_is_guarded_where_a_backup_server_runs_on_the_node():
    servers = firewall_guard.backup_server_hosts(("https://192.0.2.11:8007",))
    assert firewall_guard.node_ports(firewall(), "pve1", servers) == {8006: "the API (8006)", 22: "SSH (22)",
                                                                      8007: "the Backup Server (8007)"}
    assert 8007 not in firewall_guard.node_ports(firewall(), "pve1", {"pbs.example", "192.0.2.99"})
    assert 8007 in firewall_guard.node_ports(firewall(), "pve1", {"pve1"})  # by the node's name
