"""The PVE tools through the MCP client against the simulator: each read answers, each write
works, is refused by the policy, and refuses bad input with no write sent; task tools report
progress and answer still_running at their deadline."""
import json
from functools import partial

import pytest

import server
from conftest import in_process, requests_during, tool_session
from gates import TIERS

PROTECTED = [{"host": "lab", "vmid": 101, "name": "db", "reason": "the production database"}]
# The PVE write tools of the guests, storage and network toolsets, from the tool table (a new one joins by itself).
WRITE_TOOLS = {spec.function.__name__: spec.gate for spec in server.TOOLS
               if spec.product == "pve" and spec.toolset in ("guests", "storage", "network")
               and spec.function.__name__.startswith("write_")}
DEBIAN_ISO = "local:iso/debian-13.1.0-amd64-netinst.iso"  # files on the simulated `local` storage
DEBIAN_TEMPLATE = "local:vztmpl/debian-13-standard_13.1-2_amd64.tar.zst"


@pytest.fixture(scope="module")
def ops(sim, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ops")
    (tmp / "protected.json").write_text(json.dumps(PROTECTED))
    # every write tool at work (and backups and disks listed): more than the README's reader holds; the
    # reader and an operator's write token: tests/test_default_world.py
    env = sim.env(pve_token="root@pam!admin") | {
        "PROXMOX_ACCESS": "destructive", "PROXMOX_PROTECTED_VMS_FILE": str(tmp / "protected.json"),
        "PROXMOX_AUDIT_LOG": str(tmp / "audit.jsonl")}
    with tool_session(env, log_name="pve-ops") as session:
        yield session


def rows(answer):
    return [dict(zip(answer["columns"], row, strict=True)) for row in answer["rows"]]


# ---------------------------------------------------------------- reads

def test_node_status_with_rrd(ops):
    status = ops.ok("node_status", {"node": "pve1", "timeframe": "hour"})
    assert status["version"].startswith("pve-manager/9") and status["mem_total"] == "64.0 GiB"
    assert status["rrd"]["points"] == 60 and "cpu_pct" in status["rrd"]  # an hour at one-minute steps (PVE::RRD)
    assert "Nodes: pve1, pve2, pve3" in ops.error("node_status", {"node": "pve9"})
    assert "did you mean 'pve1'" in ops.error("node_status", {"node": "PVE1"})


def test_guest_config_and_snapshots(ops, sim):
    config = ops.ok("guest_config", {"vmid": 100})
    assert config["node"] == "pve1" and config["config"]["scsi0"].startswith("local-lvm:vm-100-disk-0")
    sim.lab.guests[102]["snapshots"] = [{"name": "base", "snaptime": 1700000000, "description": "clean install"}]
    snaps = rows(ops.ok("get_guest", {"vmid": 102})["snapshots"])
    assert snaps == [{"name": "base", "time": "2023-11-14T22:13:20Z", "parent": "", "vmstate": "",
                      "description": "clean install"}]


def test_backups_storage_content_networks_pools(ops):
    backups = rows(ops.ok("list_backups", {"vmid": 100}))
    on_local = [b for b in backups if b["storage"] == "local"]  # last night's, on pve1's own disk
    assert len(on_local) == 1 and on_local[0]["size"] == "2.0 GiB" and on_local[0]["node"] == "pve1"
    assert len([b for b in backups if b["storage"] == "pbs"]) == 3  # a PBS storage lists its datastore's snapshots
    isos = rows(ops.ok("storage_content", {"storage": "local", "content": "iso"}))
    assert [r["volid"] for r in isos] == ["local:iso/debian-13.1.0-amd64-netinst.iso"]
    assert "Storages:" in ops.error("storage_content", {"storage": "nowhere"})
    networks = rows(ops.ok("list_networks", {"node": "pve2"}))
    by_bridge = {r["bridge"]: r for r in networks}
    assert by_bridge["vmbr0"]["segment"] == "uplinked" and by_bridge["vmbr0"]["vlan_aware"] is True
    assert by_bridge["vmbr1"]["segment"] == "isolated" and by_bridge["vmbr1"]["vlan_aware"] is False
    assert len(rows(ops.ok("list_networks"))) == 6
    pools = rows(ops.ok("list_pools"))
    assert pools == [{"pool": "prod", "comment": "production", "guests": [100, 101]}]
    assert "null" not in json.dumps(ops.ok("list_guests")) + json.dumps(ops.ok("list_backups"))


def test_task_and_cluster_logs(ops, sim):
    upid = sim.lab.start_task("pve1", "vzdump", "100", finished=True)
    first = ops.ok("get_task", {"upid": upid, "start": 0, "log_lines": 3})
    assert first["lines"][0].startswith("starting") and first["next_start"] == 3 and first["result"] == "ok"
    rest = ops.ok("get_task", {"upid": upid, "start": 3})
    assert rest["lines"][-1] == "TASK OK" and "next_start" not in rest
    log = rows(ops.ok("cluster_log", {"limit": 5}))
    assert log and all(r["tag"] == "pvedaemon" for r in log)


def test_guest_agent_info(ops):
    vm = ops.ok("guest_agent_info", {"vmid": 100})
    assert vm["os"] == "Debian GNU/Linux 13 (trixie)" and vm["hostname"] == "web"
    assert vm["interfaces"][0]["ips"][0] == "192.0.2.100/24"
    ct = ops.ok("guest_agent_info", {"vmid": 102})
    assert ct["interfaces"] == [{"iface": "eth0", "ipv4": "192.0.2.102/24", "ipv6": "fe80::1/64"}]
    message = ops.error("guest_agent_info", {"vmid": 104})
    assert "not running" in message and "write_power_guest" in message


# ---------------------------------------------------------------- writes that work

@pytest.mark.mcp  # progress notifications
def test_power_cycle_with_progress(ops, sim):
    progress = []
    started = ops.ok("write_power_guest", {"vmid": 104, "action": "start"}, progress=progress)
    assert started["result"] == "ok" and sim.lab.guests[104]["status"] == "running"
    stopped = ops.ok("write_power_guest", {"vmid": 104, "action": "stop", "confirm": True})
    assert stopped["result"] == "ok" and sim.lab.guests[104]["status"] == "stopped"
    message = ops.error("write_power_guest", {"vmid": 104, "action": "stop"})  # destructive: confirm
    assert "confirm=true" in message and "win11 (vmid 104)" in message
    # shutting down a stopped VM ends OK in Proxmox (docs/PROXMOX-BEHAVIOUR.md#power-and-locks)
    assert ops.ok("write_power_guest", {"vmid": 104, "action": "shutdown"})["guest_state"] == "stopped"
    assert "VM 104 not running" in ops.error("write_power_guest", {"vmid": 104, "action": "reboot"})
    sim.lab.guests[104]["lock"] = "backup"
    try:
        failed = ops.error("write_power_guest", {"vmid": 104, "action": "start"})
    finally:
        sim.lab.guests[104]["lock"] = None
    assert "VM is locked (backup)" in failed and "TASK ERROR" in failed


def test_config_with_digest_and_nic(ops, sim):
    done = ops.ok("write_configure_guest", {"vmid": 103, "set": {"memory": 4096, "description": "media box"},
                                            "delete": ["swap"]})
    assert done["changed"] == ["description", "memory"]
    config = sim.lab.guests[103]["config"]
    assert config["memory"] == "4096" and "swap" not in config
    stale = ops.error("write_configure_guest", {"vmid": 103, "set": {"cores": 4}, "digest": "0" * 40})
    assert "modified configuration" in stale
    nic = ops.ok("write_set_nic", {"vmid": 103, "vlan": 30, "firewall": True})
    assert nic["net0"].startswith("name=eth0,bridge=vmbr0") and "tag=30" in nic["net0"] and "firewall=1" in nic["net0"]
    assert "tag=30" in sim.lab.guests[103]["config"]["net0"]


def test_resize_snapshot_rollback_delete(ops, sim):
    grown = ops.ok("write_resize_disk", {"vmid": 100, "disk": "scsi0", "size": "+8G"})
    assert grown["result"] == "ok" and "size=40G" in sim.lab.guests[100]["config"]["scsi0"]
    ops.ok("write_create_snapshot", {"vmid": 100, "name": "pre-upgrade", "description": "before apt upgrade"})
    assert [s["name"] for s in sim.lab.guests[100]["snapshots"]] == ["pre-upgrade"]
    rolled = ops.ok("write_rollback_snapshot", {"vmid": 100, "name": "pre-upgrade", "start": True, "confirm": True})
    assert rolled["result"] == "ok" and rolled["guest_state"] == "running"  # a rollback alone leaves it stopped
    assert "receipts" not in rolled  # one receipt: the safety snapshot and the rollback (docs/SECURITY.md#undo)
    assert rolled["safety_snapshot"]["name"].startswith("mcp-safety-")
    safety = [s["name"] for s in sim.lab.guests[100]["snapshots"] if s["name"] != "pre-upgrade"]
    assert safety and safety[0].startswith("mcp-safety-")
    for name in ("pre-upgrade", safety[0]):
        assert ops.ok("write_delete_snapshot", {"vmid": 100, "name": name, "confirm": True})["result"] == "ok"
    assert sim.lab.guests[100]["snapshots"] == []


@pytest.mark.mcp  # progress notifications
@pytest.mark.usefixtures("running_tasks")
def test_backup_restore_clone_migrate_template_delete(ops, sim):
    progress = []
    backup = ops.ok("write_backup_guest", {"vmid": 105, "storage": "local", "notes": "before the move"},
                    progress=progress)
    assert backup["result"] == "ok" and any(p for p, _, _ in progress if p)
    volid = next(v["volid"] for v in sim.lab.volumes["local"] if v.get("vmid") == 105)
    restored = ops.ok("write_restore_backup", {"archive": volid})
    assert restored["result"] == "ok" and sim.lab.guests[restored["vmid"]]["type"] == "lxc"
    # a guest on local storage clones on its own node only (docs/PROXMOX-BEHAVIOUR.md#clone)
    clone = ops.ok("write_clone_guest", {"vmid": 100, "name": "web-test"}, progress=progress)
    assert clone["result"] == "ok" and sim.lab.guests[clone["newid"]]["node"] == "pve1"
    assert sim.lab.guests[clone["newid"]]["name"] == "web-test"
    moved = ops.ok("write_migrate_guest", {"vmid": clone["newid"], "target": "pve3"})
    assert moved["result"] == "ok" and sim.lab.guests[clone["newid"]]["node"] == "pve3"
    assert ops.ok("write_make_template", {"vmid": clone["newid"]})["result"] == "ok"
    assert sim.lab.guests[clone["newid"]]["template"] == 1
    linked = ops.ok("write_clone_guest", {"vmid": clone["newid"], "full": False})
    assert linked["result"] == "ok"
    deleted = ops.ok("write_delete_guest", {"vmid": linked["newid"], "confirm": True})
    assert deleted["result"] == "ok" and linked["newid"] not in sim.lab.guests


def test_write_answers_say_the_tasks_outcome_and_the_guests_state_after_it(ops, sim):
    """A finished task's "status":"stopped" next to a running guest reads as a stopped guest: a write
    answers the task's outcome as `task` and the guest's state after it (a migration also the node it
    is on now; a deletion that the guest is gone), as write_power_guest does."""
    running = ops.ok("write_create_snapshot", {"vmid": 100, "name": "answer_shape"})
    assert running["task"] == "OK" and running["guest_state"] == "running" and "status" not in running
    assert "exitstatus" not in running and running["result"] == "ok"
    dropped = ops.ok("write_delete_snapshot", {"vmid": 100, "name": "answer_shape", "confirm": True})
    assert dropped["task"] == "OK" and dropped["guest_state"] == "running" and "status" not in dropped
    backup = ops.ok("write_backup_guest", {"vmid": 100, "storage": "local", "mode": "snapshot"})
    assert backup["task"] == "OK" and backup["guest_state"] == "running" and "status" not in backup
    clone = ops.ok("write_clone_guest", {"vmid": 103, "name": "answer-shape"})  # a stopped container
    assert clone["task"] == "OK" and "status" not in clone
    moved = ops.ok("write_migrate_guest", {"vmid": clone["newid"], "target": "pve3"})
    assert moved["node"] == "pve3" == sim.lab.guests[clone["newid"]]["node"]
    assert moved["task"] == "OK" and moved["guest_state"] == "stopped" and "status" not in moved
    deleted = ops.ok("write_delete_guest", {"vmid": clone["newid"], "confirm": True})
    assert deleted["task"] == "OK" and deleted["guest_state"] == "deleted" and "status" not in deleted


def test_provisioning(ops, sim):
    vm = ops.ok("write_create_vm", {"name": "install-me", "iso": "local:iso/debian-13.1.0-amd64-netinst.iso",
                                    "vlan": 20})
    guest = sim.lab.guests[vm["vmid"]]
    assert guest["type"] == "qemu" and "tag=20" in guest["config"]["net0"]
    assert guest["config"]["ide2"] == "local:iso/debian-13.1.0-amd64-netinst.iso,media=cdrom"
    download = ops.ok("write_download_url", {"url": "https://cloud.debian.org/debian-13-genericcloud-amd64.qcow2",
                                             "storage": "local", "filename": "debian-13.qcow2", "content": "import",
                                             "checksum": "ab" * 32})
    assert download["result"] == "ok" and download["volid"] == "local:import/debian-13.qcow2"
    cloud = ops.ok("write_create_vm", {"name": "cloudy", "cloud_image": "local:import/debian-13.qcow2",
                                       "ciuser": "admin", "ssh_keys": "ssh-ed25519 AAAAC3Nz admin@laptop",
                                       "ip": "ip=192.0.2.50/24,gw=192.0.2.1"})
    config = sim.lab.guests[cloud["vmid"]]["config"]
    assert config["ide2"] == "local-lvm:cloudinit" and config["ciuser"] == "admin"
    assert config["sshkeys"].startswith("ssh-ed25519%20AAAA") and config["ipconfig0"].startswith("ip=192.0.2.50/24")
    ct = ops.ok("write_create_lxc", {"hostname": "pihole", "template": DEBIAN_TEMPLATE,
                                     "ip": "192.0.2.53/24", "gateway": "192.0.2.1", "start": True})
    guest = sim.lab.guests[ct["vmid"]]
    assert guest["config"]["unprivileged"] == "1" and guest["status"] == "running"
    removed = ops.ok("write_delete_volume", {"volid": "local:import/debian-13.qcow2", "confirm": True})
    assert removed["result"] == "ok"


def test_create_without_a_node_picks_one_that_is_online(ops, sim):
    sim.lab.down_nodes.add("pve1")
    try:
        ct = ops.ok("write_create_lxc", {"hostname": "elsewhere", "template": DEBIAN_TEMPLATE})
        assert ct["result"] == "ok" and ct["node"] != "pve1"
    finally:
        sim.lab.down_nodes.clear()
    ops.ok("write_delete_guest", {"vmid": ct["vmid"], "confirm": True})


# ---------------------------------------------------------------- refused by the policy

GUEST_WRITES = [
    ("write_power_guest", {"action": "start"}), ("write_configure_guest", {"set": {"memory": 1024}}),
    ("write_set_nic", {"bridge": "vmbr0"}), ("write_resize_disk", {"disk": "scsi0", "size": "+1G"}),
    ("write_create_snapshot", {"name": "x1"}), ("write_backup_guest", {"storage": "pbs", "mode": "stop"}),
    ("write_backup_guest", {"storage": "pbs", "prune": True}),
    ("write_clone_guest", {}), ("write_migrate_guest", {"target": "pve3"}),
    ("write_delete_guest", {"confirm": True}), ("write_make_template", {}),
]


@pytest.mark.parametrize("tool, arguments", GUEST_WRITES, ids=[f"{t}-{i}" for i, (t, _) in enumerate(GUEST_WRITES)])
def test_protected_guest_is_refused_with_no_write_sent(ops, sim, tool, arguments):
    if tool in ("write_delete_guest", "write_make_template"):
        sim.lab.guests[101]["status"] = "stopped"  # past the tool's own "stop it first" check
    try:
        message, sent = requests_during(sim, writes=True, action=lambda: ops.error(tool, {"vmid": 101} | arguments))
    finally:
        sim.lab.guests[101]["status"] = "running"
    assert "protected" in message and "production database" in message
    assert sent == []


def test_a_protected_guests_disk_is_not_deleted(ops, sim):
    """An unused disk of protected guest 101 (no config names it, so the tool's own in-use check passes)."""
    sim.lab.add_volume("local-lvm", "local-lvm:vm-101-disk-9", "images", 1 << 30, vmid=101, node="pve2")
    try:
        message, sent = requests_during(sim, writes=True, action=lambda: ops.error(
            "write_delete_volume", {"volid": "local-lvm:vm-101-disk-9", "node": "pve2", "confirm": True}))
    finally:
        volumes = sim.lab.volumes["local-lvm"]
        volumes[:] = [v for v in volumes if v["volid"] != "local-lvm:vm-101-disk-9"]
    assert "protected" in message and sent == []


def test_a_protected_guest_is_backed_up_in_snapshot_mode_without_pruning(ops, sim):
    """write_backup_guest's defaults (snapshot mode, remove=0) change nothing on the guest: allowed for a
    protected one (docs/SECURITY.md, issue 25); stop mode or pruning are refused (above)."""
    done, sent = requests_during(sim, writes=True, action=lambda: ops.ok("write_backup_guest",
                                                                          {"vmid": 101, "storage": "pbs"}))
    assert done["task"] == "OK" and sent == [("pve", "POST", "/nodes/pve2/vzdump")]


def test_snapshot_and_restore_refusals_for_protected(ops, sim):
    sim.lab.guests[101]["snapshots"] = [{"name": "keep", "snaptime": 1}]
    for tool in ("write_rollback_snapshot", "write_delete_snapshot"):
        refused = partial(ops.error, tool, {"vmid": 101, "name": "keep", "confirm": True})
        message, sent = requests_during(sim, refused, writes=True)
        assert "protected" in message and sent == []
    archive = next(v["volid"] for v in sim.lab.volumes["local"] if v.get("vmid") == 101)  # on pve2, as 101
    message, sent = requests_during(sim, writes=True, action=lambda: ops.error("write_restore_backup", {
        "archive": archive, "vmid": 101, "overwrite": True, "confirm": True}))
    assert "protected" in message and sent == []


def test_unprivileged_false_needs_the_elevated_gate(ops, sim):
    message, sent = requests_during(sim, writes=True, action=lambda: ops.error("write_create_lxc", {
        "hostname": "rooty", "template": DEBIAN_TEMPLATE, "unprivileged": False}))
    assert "elevated" in message and "PROXMOX_ALLOW_ELEVATED" in message and sent == []


def test_tiers_decide_which_write_tools_exist(sim, tmp_path):
    offered = {}
    for tier in ("read", "lifecycle", "write"):
        # the admin token: only the gates decide here, not privileges read in the background
        env = sim.env(pve_token="root@pam!admin") | {"PROXMOX_ACCESS": tier,
                                                     "PROXMOX_AUDIT_LOG": str(tmp_path / "a.jsonl")}
        with in_process(env, log_name=f"tier-{tier}") as session:
            offered[tier] = {t.name for t in session.tools()} & set(WRITE_TOOLS)
    for tier, names in offered.items():  # each tier offers the tools whose gate it reaches
        assert names == {name for name, gate in WRITE_TOOLS.items() if TIERS.index(gate) <= TIERS.index(tier)}
    assert offered["read"] == set() and "write_power_guest" in offered["lifecycle"]
    assert "write_create_vm" in offered["write"] and "write_delete_guest" not in offered["write"]


def test_stop_at_the_lifecycle_tier_is_refused(sim, tmp_path):
    # the tool offered (the reader lacks VM.PowerMgmt, which would hide it): the tier must refuse
    env = sim.env(pve_token="root@pam!admin") | {"PROXMOX_ACCESS": "lifecycle",
                                                  "PROXMOX_AUDIT_LOG": str(tmp_path / "a.jsonl")}
    with in_process(env, log_name="tier-stop") as session:
        stop = partial(session.error, "write_power_guest", {"vmid": 100, "action": "stop", "confirm": True})
        message, sent = requests_during(sim, stop, writes=True)
        assert "destructive" in message and "PROXMOX_ACCESS=destructive" in message and sent == []


# ---------------------------------------------------------------- bad input, nothing written

BAD_INPUT = [
    ("write_power_guest", {"vmid": 102, "action": "reset"}, "Containers have no reset"),
    ("write_power_guest", {"vmid": 150, "action": "start"}, "No guest with vmid 150"),
    ("write_power_guest", {"vmid": 100, "action": "explode"}, "action"),
    ("write_configure_guest", {"vmid": 100}, "Nothing to change"),
    ("write_configure_guest", {"vmid": 100, "set": {"colour": "red"}}, "colour"),
    ("write_resize_disk", {"vmid": 100, "disk": "scsi0", "size": "8G"}, "Disks only grow"),
    ("write_resize_disk", {"vmid": 100, "disk": "scsi9", "size": "+1G"}, "Disks: scsi0"),
    ("write_resize_disk", {"vmid": 100, "disk": "scsi0", "size": "-1G"}, "size"),
    ("write_create_snapshot", {"vmid": 100, "name": "has space"}, "name"),
    ("write_create_snapshot", {"vmid": 102, "name": "s1", "vmstate": True}, "only for VMs"),
    ("write_rollback_snapshot", {"vmid": 100, "name": "nope", "confirm": True}, "no snapshot 'nope'"),
    ("write_delete_snapshot", {"vmid": 100, "name": "nope", "confirm": True}, "no snapshot 'nope'"),
    ("write_backup_guest", {"vmid": 100, "storage": "local-lvm"}, "does not hold backups"),
    # its example is a storage that holds backups on a fresh install (docs/PROXMOX-BEHAVIOUR.md#per-node-storages)
    ("write_backup_guest", {"vmid": 100, "storage": 7}, 'argument \'storage\' must be text (got 7), e.g. "local"'),
    ("write_restore_backup", {"archive": "local:iso/x.iso"}, "does not look like a backup"),
    ("write_restore_backup", {"archive": "pbs:backup/vm/100/2026-01-01T02:00:01Z", "vmid": 102}, "is taken"),
    ("write_clone_guest", {"vmid": 100, "newid": 102}, "is taken"),
    ("write_clone_guest", {"vmid": 100, "full": False}, "needs a template"),
    ("write_clone_guest", {"vmid": 100, "target": "pve9"}, "Unknown node"),
    ("write_migrate_guest", {"vmid": 100, "target": "pve1"}, "already on pve1"),
    ("write_migrate_guest", {"vmid": 100, "target": "Pve2"}, "did you mean 'pve2'"),
    ("write_make_template", {"vmid": 100}, "shut it down first"),
    ("write_delete_guest", {"vmid": 100, "confirm": True}, "stop it first"),
    ("write_create_vm", {"name": "x1"}, "exactly one of iso"),
    ("write_create_vm", {"name": "x1", "iso": "local:iso/missing.iso"}, "not on storage local"),
    ("write_create_vm", {"name": "x1", "iso": DEBIAN_ISO, "bridge": "vmbr9"}, "no bridge 'vmbr9'"),
    ("write_create_vm", {"name": "x1", "iso": DEBIAN_ISO, "bridge": "vmbr1", "vlan": 5}, "not VLAN-aware"),
    ("write_create_vm", {"name": "bad name!", "iso": DEBIAN_ISO}, "name"),
    ("write_create_lxc", {"hostname": "x1", "template": "local:vztmpl/nope.tar.zst"}, "not on storage local"),
    ("write_create_lxc", {"hostname": "x1", "template": DEBIAN_TEMPLATE, "vmid": 100}, "is taken"),
    ("write_download_url", {"url": "ftp://x/y.iso", "storage": "local", "filename": "y.iso"}, "url"),
    ("write_download_url", {"url": "https://x/y.iso", "storage": "nowhere", "filename": "y.iso"}, "Unknown storage"),
    ("write_download_url", {"url": "https://x/y.iso", "storage": "local-lvm", "filename": "y.iso"},
     "does not take iso"),
    ("write_delete_volume", {"volid": "local:iso/nope.iso", "confirm": True}, "No volume"),
    ("write_delete_volume", {"volid": "local-lvm:vm-100-disk-0", "confirm": True}, "in use by guest(s) 100"),
    ("write_set_nic", {"vmid": 100, "nic": "net3"}, "NICs: net0"),
    ("write_set_nic", {"vmid": 100, "bridge": "vmbr1", "vlan": 10}, "not VLAN-aware"),
    ("write_set_nic", {"vmid": 100, "bridge": "vmbr7"}, "no bridge 'vmbr7'"),
]


@pytest.mark.parametrize("tool, arguments, expected", BAD_INPUT, ids=[f"{t}-{e[:20]}" for t, _, e in BAD_INPUT])
def test_bad_input_is_refused_with_nothing_written(ops, sim, tool, arguments, expected):
    message, sent = requests_during(sim, writes=True, action=lambda: ops.error(tool, arguments))
    assert expected in message
    assert sent == []


def test_nic_changes_fail_closed_when_bridges_cannot_be_read(ops, sim):
    sim.lab.fail.append((r"/nodes/pve1/network$", 500, "network config unavailable"))
    try:
        set_vlan = partial(ops.error, "write_set_nic", {"vmid": 100, "vlan": 10})
        message, sent = requests_during(sim, set_vlan, writes=True)
        assert "refusing to change a NIC blind" in message and sent == []
    finally:
        sim.lab.fail.clear()


# ---------------------------------------------------------------- dry run and long tasks

def test_dry_run_of_tool_writes(ops, sim):
    reboot = partial(ops.ok, "write_power_guest", {"vmid": 100, "action": "reboot", "dry_run": True})
    plan, sent = requests_during(sim, reboot, writes=True)
    assert plan["request"] == {"method": "POST", "path": "/nodes/pve1/qemu/100/status/reboot", "params": {}}
    assert plan["gate"] == "lifecycle" and plan["current"]["status"] == "running" and sent == []
    delete = partial(ops.ok, "write_delete_guest", {"vmid": 103, "dry_run": True})
    plan, sent = requests_during(sim, delete, writes=True)
    assert plan["gate"] == "destructive" and plan["needs_confirmation"] is True and sent == []


@pytest.mark.mcp  # progress notifications
@pytest.mark.usefixtures("running_tasks")
def test_still_running_then_get_task_continues(ops, sim):
    # The tasks run until the test ends them, however slow the machine: the first one once get_task has
    # reported progress on it (a fixed duration let a loaded machine finish it before get_task asked).
    before, sim.lab.task_seconds = sim.lab.task_seconds, 3600
    upids = []
    try:
        first = ops.ok("write_create_snapshot", {"vmid": 102, "name": "slow", "wait_seconds": 1})
        upids.append(first["upid"])
        assert first["task"] == "still_running" and first["upid"].startswith("UPID:pve3:") and "status" not in first
        started = ops.ok("write_create_snapshot", {"vmid": 102, "name": "slow2", "wait_seconds": 0})
        upids.append(started["upid"])
        assert started["task"] == "started" and "status" not in started
        progress = EndsOnProgress(sim.lab.tasks[first["upid"]])
        done = ops.ok("get_task", {"upid": first["upid"], "wait_seconds": 60}, progress=progress)
        assert done["result"] == "ok" and progress
    finally:
        sim.lab.task_seconds = before
        for upid in upids:
            sim.lab.tasks[upid].duration = 0  # ends on the simulator's next tick


class EndsOnProgress(list):
    """The progress a client receives; the first notification ends `task` (the simulator's)."""

    def __init__(self, task):
        super().__init__()
        self.task = task

    def append(self, item) -> None:
        super().append(item)
        self.task.duration = 0
