"""Every tool once over MCP: one stdio server with every gate open, each tool called with valid
arguments through the SDK's client, and it answers. Domain behaviour is tested in process
(conftest.in_process); this is the MCP edge of each tool: registered, offered, its arguments
accepted as a client sends them, its answer carried back. The SSH tools are called over MCP next to
the sshd they need: test_shell_tools.py, test_terminals.py, test_lxc_admin.py, test_node_files.py."""
import json
import sqlite3

import pytest

import catalog
import receipts
import server
from conftest import everything_open, stdio_session

DEBIAN_ISO = "local:iso/debian-13.1.0-amd64-netinst.iso"
DEBIAN_TEMPLATE = "local:vztmpl/debian-13-standard_13.1-2_amd64.tar.zst"
CLOUD_IMAGE = "local:import/debian-13.qcow2"
SSH_TOOLS = {spec.function.__name__ for spec in server.TOOLS if spec.ssh}


def pbs_snapshot(lab, vmid: str, index: int) -> dict:
    time = lab.datastores["backup"]["groups"][("", "vm", vmid)][index]["backup-time"]
    return {"store": "backup", "backup_type": "vm", "backup_id": vmid, "backup_time": time}


def pbs_backed(lab, vmid: int) -> str:
    """The newest backup of a guest on the PVE storage `pbs`."""
    return max((v for v in lab.pbs_volumes("pbs") if v["vmid"] == vmid), key=lambda v: v["ctime"])["volid"]


def pve_backup(lab, vmid: int) -> str:
    return next(v["volid"] for v in lab.volumes["local"] if v.get("vmid") == vmid)


def newest_receipt(lab, tool: str) -> dict:
    """The receipt of the last call of a tool (the server keeps them beside its audit log)."""
    with sqlite3.connect(lab.mcp_receipts) as db:
        kept = [json.loads(body) for body, in db.execute("SELECT body FROM receipts")]
    return {"receipt": max((r for r in kept if r["tool"] == tool), key=lambda r: r["epoch"])["id"]}


# (tool, arguments or a function of the lab giving them), in the order they run: reads, then
# writes on guests and volumes that later calls do not need, destructive ones last.
CALLS = [
    ("list_hosts", {}), ("server_info", {}), ("cluster_status", {}), ("list_nodes", {}), ("list_guests", {}),
    ("get_guest", {"vmid": 100}), ("list_storage", {}), ("list_tasks", {}),
    ("get_task", lambda lab: {"upid": lab.mcp_upids["pve"]}),
    ("cluster_log", {}), ("node_status", {"node": "pve1"}), ("guest_config", {"vmid": 100}),
    ("guest_agent_info", {"vmid": 100}), ("list_backups", {}),
    ("storage_content", {"storage": "local"}), ("list_networks", {}), ("list_pools", {}),
    ("pbs_list_datastores", {}), ("pbs_list_groups", {"store": "backup"}),
    ("pbs_list_snapshots", {"store": "backup", "backup_type": "vm", "backup_id": "100"}),
    ("pbs_list_jobs", {}), ("pbs_list_tasks", {}),
    ("health_check", {}), ("backup_coverage", {}), ("security_audit", {}),
    ("metrics", {"vmid": 100}), ("node_logs", {"node": "pve1"}), ("node_disks", {"node": "pve1"}),
    ("node_updates", {}), ("dashboard", {}),
    ("api_search", {"query": "snapshot rollback"}),
    ("api_describe", {"path": "/nodes/{node}/qemu/{vmid}/status/start", "method": "POST"}),
    ("api_read", {"path": "/version"}), ("firewall_rules", {}), ("backup_jobs", {}),
    ("list_templates", {}), ("backup_files", lambda lab: {"backup": pbs_backed(lab, 102)}),
    ("list_changes", {}), ("what_changed", {"vmid": 100}),
    ("write_power_guest", {"vmid": 104, "action": "start"}),
    ("write_create_snapshot", {"vmid": 100, "name": "mcp1"}),
    ("write_backup_guest", {"vmid": 102, "storage": "local"}),
    ("write_configure_guest", {"vmid": 103, "set": {"memory": 1024}}),
    ("write_set_nic", {"vmid": 103, "vlan": 30}),
    ("write_undo_change", lambda lab: newest_receipt(lab, "write_set_nic")),
    ("write_resize_disk", {"vmid": 100, "disk": "scsi0", "size": "+1G"}),
    ("write_clone_guest", {"vmid": 100, "newid": 150, "name": "mcp-clone"}),
    ("write_migrate_guest", {"vmid": 150, "target": "pve3"}),
    ("write_make_template", {"vmid": 150}),
    ("write_restore_backup", lambda lab: {"archive": pve_backup(lab, 100), "vmid": 151}),
    ("write_download_url", {"url": "https://cloud.debian.org/debian-13-genericcloud-amd64.qcow2",
                            "storage": "local", "filename": "debian-13.qcow2", "content": "import"}),
    ("write_create_lxc", {"start": True, "hostname": "mcp-prov", "template": DEBIAN_TEMPLATE}),
    ("write_download_template", {"template": "debian-12-standard_12.12-1_amd64.tar.zst"}),
    ("write_pull_oci", {"reference": "docker.io/library/nginx:1.29"}),
    ("write_set_cloudinit", {"vmid": 100, "user": "debian", "ip": {"net0": "dhcp"}}),
    ("write_restore_file", lambda lab: {"backup": pbs_backed(lab, 102), "path": "/root.pxar.didx/etc/hostname"}),
    ("write_create_vm", {"start": True, "name": "mcp-prov-vm", "cloud_image": CLOUD_IMAGE}),
    ("write_exec_guest", {"vmid": 100, "command": "true", "confirm": True}),
    ("write_guest_file", {"vmid": 100, "path": "/etc/motd", "content": "over mcp\n", "confirm": True}),
    ("write_call_api", {"method": "POST", "path": "/nodes/pve2/qemu/101/snapshot", "params": {"snapname": "mcp2"}}),
    ("write_edit_firewall_rule", {"vmid": 100, "action": "add",
                                  "rule": {"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "80"}}),
    ("write_set_firewall_options", {"vmid": 100, "enable": True}),
    ("write_edit_backup_job", {"action": "create", "job_id": "mcp-job", "vmids": [102], "schedule": "03:00",
                               "storage": "pbs"}),
    ("write_pbs_run_gc", {"store": "backup"}), ("write_pbs_verify_backups", {"store": "backup"}),
    ("write_pbs_run_job", {"kind": "verify", "job_id": "v-backup"}),
    ("write_pbs_edit_snapshot", lambda lab: pbs_snapshot(lab, "100", 0) | {"protected": True, "notes": "over mcp"}),
    ("write_update_guests", {"vmids": [100], "confirm": True}),  # a VM, through its guest agent
    ("write_node_power", {"node": "pve2", "action": "reboot", "dry_run": True}),  # its plan: the lab keeps its node
    ("write_pbs_prune_group", {"store": "backup", "backup_type": "vm", "backup_id": "101", "keep_last": 2,
                               "confirm": True}),
    ("write_pbs_forget_snapshot", lambda lab: pbs_snapshot(lab, "101", -1) | {"confirm": True}),
    ("write_rollback_snapshot", {"vmid": 100, "name": "mcp1", "start": True, "confirm": True}),
    ("write_delete_snapshot", {"vmid": 100, "name": "mcp1", "confirm": True}),
    ("write_delete_guest", {"vmid": 151, "confirm": True}),
    ("write_delete_volume", {"volid": CLOUD_IMAGE, "confirm": True}),
    ("write_drill_restore", {"vmid": 100, "confirm": True}),
]


@pytest.fixture(scope="module")
def admin(sim, tmp_path_factory):
    """One server over stdio with every gate open and no SSH, as an operator's would be."""
    tmp = tmp_path_factory.mktemp("every-tool")
    (tmp / "protected.json").write_text(json.dumps([{"host": "lab", "vmid": 105, "reason": "not used here"}]))
    sim.lab.guests[100]["config"]["ide2"] = "local-lvm:vm-100-cloudinit,media=cdrom"  # for write_set_cloudinit
    sim.lab.mcp_upids = {"pve": sim.lab.start_task("pve1", "vzdump", "100", finished=True),
                         "pbs": sim.lab.start_task("localhost", "verify", "backup", finished=True, product="pbs")}
    sim.lab.mcp_receipts = tmp / "state" / "state.sqlite3"
    sim.lab.mcp_first_request = len(sim.lab.requests)  # what this module's calls send (test_every_write_...)
    env = everything_open(sim, tmp)
    with stdio_session(env, log_name="every-tool") as session:
        yield session


def test_every_tool_but_the_ssh_ones_is_called_once():
    names = [name for name, _ in CALLS]
    assert len(names) == len(set(names))
    assert set(names) == set(server.TOOL_NAMES) - SSH_TOOLS


def test_the_list_offers_them(admin):
    assert {t.name for t in admin.tools()} == set(server.TOOL_NAMES) - SSH_TOOLS


@pytest.mark.parametrize("name, arguments", CALLS, ids=[name for name, _ in CALLS])
def test_tool_answers_over_mcp(admin, sim, name, arguments):
    answer = admin.ok(name, arguments(sim.lab) if callable(arguments) else arguments)
    assert isinstance(answer, dict) and answer.get("result") != "failed", answer
    assert sim.lab.schema_rejections == []


def undo_of(product: str, method: str, path: str) -> str:
    """How a change sent is taken back: its receipt rule, or why it cannot be (receipts.NOT_INVERTIBLE)."""
    found = catalog.find_path(product, path.split("?", 1)[0])
    template = found[0] if found else path
    rule = receipts.rule_for(method, template)
    if rule is not None:
        return f"receipt: {rule.kind}"
    if receipts.UNCHANGING.fullmatch(template):
        return "changes nothing"
    why = receipts.why_not(method, template)
    return "" if why.startswith("no inverse is known") else why


def test_every_write_sent_can_be_undone_or_says_why(admin, sim):
    """Each non-GET request the calls above sent (every tool but the SSH ones) is one a receipt can take
    back (receipts.RECEIPT_RULES) or one whose reason it cannot be is stated (receipts.NOT_INVERTIBLE): a new
    write tool fails here until it has one of them (README: How to add a tool)."""
    sent = {(product, method, path) for product, method, path in sim.lab.requests[sim.lab.mcp_first_request:]
            if method != "GET"}
    assert sent
    unknown = sorted({f"{method} {path} ({product})" for product, method, path in sent
                      if not undo_of(product, method, path)})
    assert unknown == [], f"writes neither a receipt rule nor a reason covers: {unknown}"
