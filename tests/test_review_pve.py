"""Review against Proxmox's source (docs/REVIEW-PROXMOX.md): where the simulator shares a belief with a
tool that a real Proxmox does not hold. Each test makes the simulator (or a tool over it) do what
Proxmox does. A test marked DIFFERS fails until its fix lands (strict xfail, so the suite stays green
and a fix shows as XPASS): the one fixing it removes the mark. None is left marked: all are fixed."""
import json

import pytest

import simulator
from conftest import tool_session
from simulator.call import ApiError

READER = "mcp@pve!reader"
DIFFERS = pytest.mark.xfail(strict=True, reason="Proxmox differs here: docs/REVIEW-PROXMOX.md")


def call(lab, method, path, token=READER, **params):
    secret = lab.pve_tokens[token].secret
    return simulator.api.handle(lab, "pve", method, path, params, f"PVEAPIToken={token}={secret}")


def test_cluster_options_answers_ha_as_an_object():
    """GET /cluster/options answers datacenter.cfg as parsed: `ha` (like crs, migration, next-id) is
    a hash, so JSON gives {"shutdown_policy": "migrate"}, not the property string (pve-cluster
    src/PVE/DataCenterConfig.pm parse_datacenter_config: `$res->{ha} = parse_property_string($ha_format,
    ...)`; pve-manager PVE/API2/Cluster.pm get_options returns it; www/manager6/Utils.js
    render_dc_ha_opts prints it back with printPropertyString)."""
    lab = simulator.Lab.homelab()
    lab.datacenter["ha"] = "shutdown_policy=migrate"  # the line as datacenter.cfg stores it
    assert call(lab, "GET", "/cluster/options")["ha"] == {"shutdown_policy": "migrate"}


def test_cluster_options_without_sys_audit_is_a_short_answer_not_a_403():
    """permissions {user: all, check: [Sys.Audit on /]}: check_api2_permissions returns 1 on
    user=all before any check (pve-access-control src/PVE/RPCEnvironment.pm), and get_options
    answers only console, tag-style and allowed-tags without Sys.Audit (pve-manager Cluster.pm)."""
    lab = simulator.Lab.homelab()
    lab.datacenter["ha"] = "shutdown_policy=migrate"
    answer = call(lab, "GET", "/cluster/options", token="mcp@pve!empty")
    assert "ha" not in answer and "allowed-tags" in answer


def test_ha_groups_cannot_be_listed_on_pve9_once_there_are_none():
    """pve-ha-manager 5.0.2+ (PVE 9.0): GET /cluster/ha/groups dies `cannot index groups: ha groups
    have been migrated to rules` when groups.cfg holds no group (have_groups_been_migrated is true
    for an empty or missing file: every fresh PVE 9 cluster, and every one whose CRM migrated them)
    (src/PVE/API2/HA/Groups.pm index, src/PVE/HA/Config.pm have_groups_been_migrated, 849ef84)."""
    lab = simulator.Lab.homelab()
    assert lab.pve_major == 9 and not lab.ha_groups
    with pytest.raises(ApiError) as refused:
        call(lab, "GET", "/cluster/ha/groups")
    assert refused.value.status == 500 and "migrated to rules" in refused.value.message


def test_ha_rules_do_not_exist_on_pve8():
    """pve-ha-manager 4.x has no /cluster/ha/rules: pveproxy answers 501 `Method 'GET
    /cluster/ha/rules' not implemented` (pve-manager PVE/HTTPServer.pm rest_handler)."""
    lab = simulator.Lab.homelab(pve_major=8)
    with pytest.raises(ApiError) as refused:
        call(lab, "GET", "/cluster/ha/rules")
    assert refused.value.status == 501


def test_execute_is_for_root_at_pam_only_never_a_token():
    """POST /nodes/{node}/execute has no `permissions`: check_api2_permissions lets only the user
    root@pam through (`raise_perm_exc('user != root@pam') if !$perm`), and a token's user is its
    token id, root@pam!admin included (pve-access-control RPCEnvironment.pm check_api2_permissions;
    pve-manager PVE/HTTPServer.pm auth_handler: "the token-ID ... is the user")."""
    lab = simulator.Lab.homelab()
    commands = json.dumps([{"method": "GET", "path": "status"}])
    with pytest.raises(ApiError) as refused:
        call(lab, "POST", "/nodes/pve1/execute", token="root@pam!admin", commands=commands)
    assert refused.value.status == 403 and "user != root@pam" in refused.value.message


# ---------------------------------------------------------------- the tools on what Proxmox answers

@pytest.fixture()
def protected_env(sim, tmp_path):
    (tmp_path / "protected.json").write_text(json.dumps([{"host": "lab", "vmid": 101, "name": "db"}]))
    admin = sim.lab.pve_tokens["root@pam!admin"].secret
    return sim.env() | {"PROXMOX_LAB_WRITE_TOKEN": f"root@pam!admin={admin}", "PROXMOX_ACCESS": "destructive",
                        "PROXMOX_ALLOW_ELEVATED": "true", "PROXMOX_TOOLSETS": "all",
                        "PROXMOX_PROTECTED_VMS_FILE": str(tmp_path / "protected.json"),
                        "PROXMOX_AUDIT_LOG": str(tmp_path / "audit.jsonl")}


def test_an_ha_rule_for_an_unprotected_guest_passes_on_pve9_without_groups(sim, protected_env):
    """With the groups index refused as on PVE 9 (above), an HA rule that places no protected guest is
    still sent: the placement judgement must take the refusal as "no groups", as it takes PVE 8's 501
    as "no rules" (job_edits._ha_list)."""
    with tool_session(protected_env, log_name="review-ha") as session:
        done = session.ok("write_call_api", {"method": "POST", "path": "/cluster/ha/rules", "confirm": True,
                                             "params": {"rule": "review-keep", "type": "node-affinity",
                                                        "resources": "ct:102", "nodes": "pve3"}})
    sim.lab.ha_rules.pop("review-keep", None)
    assert "error" not in json.dumps(done).lower()


def test_a_batch_with_a_token_only_says_it_is_for_root_at_pam(sim, protected_env):
    """With tokens only, Proxmox refuses execute (above): the answer says so and how to send it."""
    commands = json.dumps([{"method": "GET", "path": "status"}])
    with tool_session(protected_env, log_name="review-execute") as session:
        message = session.error("write_call_api", {"method": "POST", "path": "/nodes/pve1/execute",
                                                   "params": {"commands": commands}, "confirm": True})
    assert "root@pam only" in message and "PROXMOX_LAB_USER=root@pam" in message


@pytest.fixture(scope="module", params=[9, 8], ids=["pve9", "pve8"])
def readme_world(request, tmp_path_factory):
    """The README's split on PVE 9 and PVE 8 (VM.Monitor for every agent call): reads with the reader
    (PVEAuditor), writes with the operator token (PVEVMAdmin, PVEDatastoreUser)."""
    lab = simulator.Lab.homelab(pve_major=request.param)
    lab.task_seconds = 0
    with simulator.Simulator(lab) as running:
        operator = lab.pve_tokens["ops@pve!operator"].secret
        yield running, running.env() | {
            "PROXMOX_LAB_WRITE_TOKEN": f"ops@pve!operator={operator}", "PROXMOX_ACCESS": "write",
            "PROXMOX_ALLOW_EXEC": "true", "PROXMOX_TOOLSETS": "all",
            "PROXMOX_AUDIT_LOG": str(tmp_path_factory.mktemp("audit") / "audit.jsonl")}
        assert lab.schema_rejections == [], lab.schema_rejections


def test_vm_exec_with_the_readme_tokens(readme_world):
    """GET .../agent/exec-status needs VM.GuestAgent.Unrestricted (PVE 9; VM.Monitor on PVE 8), and
    get-osinfo VM.Monitor on PVE 8: PVEAuditor holds neither (schema; pve-access-control
    AccessControl.pm $privgroups), so the exec's output is read with the token that started it."""
    sim, env = readme_world
    with tool_session(env, log_name="review-exec") as session:
        result = session.ok("write_exec_guest", {"vmid": 100, "command": "true", "confirm": True})
    assert result["exit_code"] == 0


def test_a_vm_update_with_the_readme_tokens(readme_world):
    """write_update_guests on a VM starts the whole upgrade with the write token, then polls its
    exec-status: with the reader Proxmox refuses it (above), the upgrade runs on unobserved and the
    call reports a failure."""
    sim, env = readme_world
    before = list(sim.lab.guests[100]["snapshots"])
    try:
        with tool_session(env, log_name="review-update") as session:
            done = session.ok("write_update_guests", {"vmids": [100], "confirm": True})
    finally:
        sim.lab.guests[100]["snapshots"] = before
    assert done["updated"] == 1

