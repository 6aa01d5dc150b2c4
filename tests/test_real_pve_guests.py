"""PVE guests, storage and networks as real Proxmox behaves (issue 15; facts and sources in
docs/PROXMOX-BEHAVIOUR.md): live migration with local disks, per-node `local` backups, clones,
cloud images, bridges and SDN vnets, pending config, restores and MAC addresses, HA-managed
guests, paused VMs, health without data, and answers a model cannot misread.

The lab is the homelab plus what these behaviours need: a VM on a storage only pve1 has, HA
resources, a container template, an SDN vnet, a routed bridge on pve2 (and no isolated one
there), backups on pve2's own `local`, an offline storage, and a token without Sys.Audit."""
import json
import time

import pytest

import simulator
from conftest import requests_during, stdio_session

GiB = 1024 ** 3
PROTECTED = [{"host": "lab", "vmid": 101, "name": "db", "reason": "the production database"}]
DEBIAN_TEMPLATE = "local:vztmpl/debian-13-standard_13.1-2_amd64.tar.zst"
STAMP = time.strftime("%Y_%m_%d-%H_%M_%S", time.gmtime())
LOCAL_VM_BACKUP = f"local:backup/vzdump-qemu-104-{STAMP}.vma.zst"  # on pve2's own `local` only
LOCAL_CT_BACKUP = f"local:backup/vzdump-lxc-105-{STAMP}.tar.zst"


@pytest.fixture(scope="module")
def sim():
    lab = simulator.Lab.homelab()
    lab.task_seconds, lab.ha_seconds = 0.3, 0.3
    now = int(time.time())
    lab.add_storage("local-zfs", "zfspool", "images,rootdir", node="pve1", total=200 * GiB, used=20 * GiB)
    zfs = lab.add_guest(120, "qemu", "pve1", "zfs-vm", status="running")
    zfs["config"]["scsi0"] = "local-zfs:vm-120-disk-0,size=32G"
    lab.add_guest(121, "qemu", "pve2", "ha-vm", status="stopped")["ha"] = {"state": "stopped"}
    lab.add_guest(122, "lxc", "pve3", "ha-ct", status="running")["ha"] = {"state": "started"}
    template = lab.add_guest(123, "lxc", "pve1", "ct-tpl")
    template["template"], template["config"]["template"] = 1, 1
    lab.vnets["labnet"] = {"zone": "simple1", "vlanaware": 0, "alias": "sdn lab"}
    lab.networks["pve2"] = [n for n in lab.networks["pve2"] if n["iface"] != "vmbr1"] + [
        {"iface": "vmbr2", "type": "bridge", "active": 1, "autostart": 1, "bridge_ports": "",
         "cidr": "10.10.10.1/24", "comments": "NAT for lab guests\n"}]
    lab.add_volume("local", LOCAL_VM_BACKUP, "backup", 2 * GiB, vmid=104, ctime=now - 600, node="pve2")
    lab.add_volume("local", LOCAL_CT_BACKUP, "backup", GiB, vmid=105, ctime=now - 300, node="pve2")
    lab.add_volume("local", "local:import/noble.qcow2", "import", 3 * GiB, node="pve1")
    lab.pve_tokens["mcp@pve!nosys"] = simulator.Token("12121212-3434-5656-7878-909090909090",
                                                      [("/", "PVEVMUser", True), ("/", "PVEDatastoreUser", True)])
    with simulator.Simulator(lab) as running:
        yield running
        assert running.lab.schema_rejections == []


@pytest.fixture(scope="module")
def ops(sim, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("real-pve")
    (tmp / "protected.json").write_text(json.dumps(PROTECTED))
    # writes of every kind, exec included: more than the README's reader holds
    env = sim.env(pve_token="root@pam!admin", pbs_token="root@pam!admin") | {
        "PROXMOX_ACCESS": "destructive", "PROXMOX_ALLOW_EXEC": "true",
        "PROXMOX_PROTECTED_VMS_FILE": str(tmp / "protected.json"), "PROXMOX_AUDIT_LOG": str(tmp / "audit.jsonl")}
    with stdio_session(env, log_name="real-pve-guests") as session:
        yield session


def rows(answer):
    return [dict(zip(answer["columns"], row, strict=True)) for row in answer["rows"]]


def writes(sim, action):
    return requests_during(sim, action, writes=True)


# ---------------------------------------------------------------- 3. migration

def test_live_migration_of_local_disks_sends_with_local_disks(ops, sim):
    moved = ops.ok("write_migrate_guest", {"vmid": 100, "target": "pve2"})
    assert moved["result"] == "ok" and sim.lab.guests[100]["node"] == "pve2"
    assert sim.lab.guests[100]["status"] == "running"


def test_migration_to_a_node_without_the_storage_needs_target_storage(ops, sim):
    message, sent = writes(sim, lambda: ops.error("write_migrate_guest", {"vmid": 120, "target": "pve3"}))
    assert "local-zfs" in message and "target_storage" in message and "local-lvm" in message and sent == []
    moved = ops.ok("write_migrate_guest", {"vmid": 120, "target": "pve3", "target_storage": "local-lvm"})
    assert moved["result"] == "ok" and sim.lab.guests[120]["node"] == "pve3"
    assert sim.lab.guests[120]["config"]["scsi0"].startswith("local-lvm:vm-120-disk-0")


def test_running_container_migrates_with_restart(ops, sim):
    moved = ops.ok("write_migrate_guest", {"vmid": 102, "target": "pve1"})
    assert moved["result"] == "ok" and sim.lab.guests[102]["node"] == "pve1"


# ---------------------------------------------------------------- 5. per-node local backups

def test_list_backups_reads_every_nodes_own_local(ops):
    found = rows(ops.ok("list_backups", {"vmid": 104}))
    assert [(r["volid"], r["storage"], r["node"]) for r in found] == [(LOCAL_VM_BACKUP, "local", "pve2")]
    found = rows(ops.ok("list_backups", {"vmid": 100}))
    # a shared storage (PBS) is read once, on any node: no volume twice, no node named
    shared = [r for r in found if r["storage"] == "pbs"]
    assert len(shared) == 3 and {r["node"] for r in shared} == {""} and len({r["volid"] for r in shared}) == 3
    assert [r["node"] for r in found if r["storage"] == "local"] == ["pve1"]


def test_restore_happens_on_the_node_that_holds_the_archive(ops, sim):
    restored = ops.ok("write_restore_backup", {"archive": LOCAL_VM_BACKUP})
    assert restored["result"] == "ok" and restored["node"] == "pve2"
    assert sim.lab.guests[restored["vmid"]]["node"] == "pve2"
    message, sent = writes(sim, lambda: ops.error("write_restore_backup", {"archive": LOCAL_VM_BACKUP,
                                                                           "node": "pve1"}))
    assert "pve2" in message and sent == []


def test_restore_drill_restores_where_the_backup_is(ops, sim):
    before = set(sim.lab.guests)
    drill = ops.ok("write_drill_restore", {"vmid": 104, "confirm": True})
    restore = next(s for s in drill["steps"] if s["step"] == "restore")
    assert drill["result"] == "ok" and restore["node"] == "pve2" and restore["backup"] == LOCAL_VM_BACKUP
    assert set(sim.lab.guests) == before


# ---------------------------------------------------------------- 8. clones

def test_container_template_clones_linked_by_default(ops, sim):
    clone = ops.ok("write_clone_guest", {"vmid": 123, "name": "from-tpl"})
    assert clone["result"] == "ok" and sim.lab.guests[clone["newid"]]["type"] == "lxc"
    assert any("linked clone" in line for line in sim.lab.tasks[clone["upid"]].lines)
    full = ops.ok("write_clone_guest", {"vmid": 123, "name": "full-copy", "full": True})
    assert any("full clone" in line for line in sim.lab.tasks[full["upid"]].lines)


CLONE_REFUSALS = [
    ({"vmid": 123, "storage": "local-lvm"}, "storage applies to full clones"),
    ({"vmid": 102}, "only from a snapshot"),
    ({"vmid": 100, "target": "pve3"}, "local storage"),
    ({"vmid": 105, "target": "pve1", "full": True, "snapshot": "nope"}, "no snapshot 'nope'"),
]


@pytest.mark.parametrize("arguments, expected", CLONE_REFUSALS, ids=[e[:20] for _, e in CLONE_REFUSALS])
def test_clone_refusals_before_sending(ops, sim, arguments, expected):
    message, sent = writes(sim, lambda: ops.error("write_clone_guest", arguments))
    assert expected in message and sent == []


def test_running_container_clones_from_a_snapshot(ops, sim):
    sim.lab.guests[105]["snapshots"] = [{"name": "base", "snaptime": 1}]
    clone = ops.ok("write_clone_guest", {"vmid": 105, "snapshot": "base"})
    assert clone["result"] == "ok" and sim.lab.guests[clone["newid"]]["node"] == sim.lab.guests[105]["node"]


# ---------------------------------------------------------------- 9. cloud images

def test_cloud_image_disk_is_grown_to_disk_gb(ops, sim):
    vm = ops.ok("write_create_vm", {"name": "noble", "cloud_image": "local:import/noble.qcow2", "node": "pve1",
                                    "disk_gb": 20})
    assert "size=20G" in sim.lab.guests[vm["vmid"]]["config"]["scsi0"]
    assert vm["disk"] == "scsi0 grown from 3G (the image) to 20G"
    small = ops.ok("write_create_vm", {"name": "tiny", "cloud_image": "local:import/noble.qcow2", "node": "pve1",
                                       "disk_gb": 2})
    assert "size=3G" in sim.lab.guests[small["vmid"]]["config"]["scsi0"] and "3G" in small["disk"]


@pytest.mark.parametrize("content, filename", [("import", "noble.img"), ("import", "noble.QCOW2"),
                                               ("iso", "debian.qcow2"), ("vztmpl", "alpine.tgz")])
def test_download_names_proxmox_refuses_are_refused_first(ops, sim, content, filename):
    message, sent = writes(sim, lambda: ops.error("write_download_url", {
        "url": "https://example.org/x", "storage": "local", "filename": filename, "content": content}))
    assert f"'{filename}'" in message and sent == []
    if content == "import":
        assert ".qcow2" in message and ".raw" in message


# ---------------------------------------------------------------- 10. bridges and vnets

def test_networks_tell_routed_bridges_and_vnets_from_isolated(ops):
    found = {r["bridge"]: r for r in rows(ops.ok("list_networks", {"node": "pve2"}))}
    assert found["vmbr0"]["segment"] == "uplinked"
    assert found["vmbr2"]["segment"] == "routed" and found["vmbr2"]["cidr"] == "10.10.10.1/24"
    assert found["labnet"]["segment"] == "sdn-vnet" and found["labnet"]["vlan_aware"] is False
    assert {r["segment"] for r in rows(ops.ok("list_networks", {"node": "pve1"}))} >= {"isolated"}


def test_nic_may_join_a_vnet(ops, sim):
    nic = ops.ok("write_set_nic", {"vmid": 103, "bridge": "labnet"})
    assert "bridge=labnet" in nic["net0"] and "bridge=labnet" in sim.lab.guests[103]["config"]["net0"]


def test_drill_never_attaches_the_copy_to_a_routed_bridge_or_vnet(ops, sim):
    drill = ops.ok("write_drill_restore", {"vmid": 105, "confirm": True})
    cut = next(s for s in drill["steps"] if s["step"] == "cut network")
    restore = next(s for s in drill["steps"] if s["step"] == "restore")
    assert restore["node"] == "pve2" and cut["how"] == "NICs removed"


# ---------------------------------------------------------------- 11. pending config

def test_config_change_on_a_running_vm_is_pending_until_restart(ops, sim):
    done = ops.ok("write_configure_guest", {"vmid": 100, "set": {"memory": 6144, "description": "web front"}})
    assert done["pending"] == {"memory": "6144"} and done["applied"] == ["description"]
    assert "restart" in done["note"] and done["result"] != "ok"
    assert sim.lab.guests[100]["config"]["memory"] == 4096
    guest = ops.ok("get_guest", {"vmid": 100})
    assert guest["pending"] == {"memory": "6144"} and guest["config"]["memory"] == 4096
    stopped = ops.ok("write_configure_guest", {"vmid": 103, "set": {"cores": 3}})
    assert stopped["pending"] == {} and stopped["applied"] == ["cores"] and stopped["result"] == "ok"


# ---------------------------------------------------------------- 12. restores keep MACs unless unique

def test_restore_to_a_new_vmid_gets_new_macs(ops, sim):
    archive = next(v["volid"] for v in sim.lab.volumes["local"] if v.get("vmid") == 101)
    restored = ops.ok("write_restore_backup", {"archive": archive})
    original = sim.lab.guests[101]["config"]["net0"]
    copy = sim.lab.guests[restored["vmid"]]["config"]["net0"]
    assert copy.split(",")[0] != original.split(",")[0]


# ---------------------------------------------------------------- 13. HA-managed guests

def test_ha_start_and_stop_are_requests_with_the_real_outcome(ops, sim):
    started = ops.ok("write_power_guest", {"vmid": 121, "action": "start"})
    assert started["requested_through"] == "HA" and started["guest_state"] == "running"
    assert started["ha_state"] == "started" and sim.lab.tasks[started["upid"]].type == "hastart"
    stopped = ops.ok("write_power_guest", {"vmid": 121, "action": "stop", "confirm": True})
    assert stopped["guest_state"] == "stopped" and stopped["ha_state"] == "stopped"
    assert "stays stopped" in stopped["note"]


def test_ha_request_not_acted_on_yet_says_so(ops, sim):
    sim.lab.ha_seconds = 30
    try:
        queued = ops.ok("write_power_guest", {"vmid": 121, "action": "start", "wait_seconds": 2})
    finally:
        sim.lab.ha_seconds = 0.3
    assert queued["result"] == "requested" and queued["guest_state"] == "stopped"
    assert queued["ha_state"] == "request_start" and "get_guest" in queued["note"]


def test_ha_migration_is_a_request_too(ops, sim):
    moved = ops.ok("write_migrate_guest", {"vmid": 122, "target": "pve1"})
    assert moved["requested_through"] == "HA" and moved["node"] == "pve1"
    assert sim.lab.tasks[moved["upid"]].type == "hamigrate" and sim.lab.guests[122]["node"] == "pve1"


# ---------------------------------------------------------------- 17. paused VMs

def test_suspend_and_resume_report_the_guest_state(ops, sim):
    paused = ops.ok("write_power_guest", {"vmid": 120, "action": "suspend"})
    assert paused["result"] == "ok" and paused["guest_state"] == "paused"
    guest = ops.ok("get_guest", {"vmid": 120})
    assert guest["status"] == "running" and guest["qmpstatus"] == "paused" and guest["paused"] is True
    assert [r["status"] for r in rows(ops.ok("list_guests", {"name": "zfs-vm"}))] == ["running"]
    resumed = ops.ok("write_power_guest", {"vmid": 120, "action": "resume"})
    assert resumed["guest_state"] == "running"


# ---------------------------------------------------------------- answers a model can misread

def test_power_answer_is_the_guest_state_not_the_task_status(ops, sim):
    started = ops.ok("write_power_guest", {"vmid": 104, "action": "start"})
    assert started["guest_state"] == "running" and started["task"] == "OK" and "status" not in started
    ops.ok("write_power_guest", {"vmid": 104, "action": "stop", "confirm": True})


def test_memory_is_named_for_what_it_is(ops):
    listed = ops.ok("list_guests")
    assert "maxmem" in listed["columns"] and "mem" not in listed["columns"]
    guest = ops.ok("get_guest", {"vmid": 102})
    assert "mem_used" in guest and "mem" not in guest and guest["maxmem_bytes"] == 512 * 1024 ** 2
    assert guest["maxmem"] == "512.0 MiB"  # readable under the name, exact beside it (docs/CONVENTIONS.md)


def test_guest_status_counts_cpus_as_proxmox_names_them(ops, sim):
    # status/current has `cpus`, not the /cluster/resources `maxcpu` (docs/PROXMOX-BEHAVIOUR.md#guest-status)
    guest = ops.ok("get_guest", {"vmid": 102})
    assert guest["cpus"] == int(sim.lab.guests[102]["config"].get("cores", 1)) and "maxcpu" not in guest


def test_protected_running_guest_is_refused_as_protected(ops, sim):
    assert sim.lab.guests[101]["status"] == "running"
    message, sent = writes(sim, lambda: ops.error("write_delete_guest", {"vmid": 101, "confirm": True}))
    assert "protected" in message and "stop it first" not in message and sent == []


def test_failed_provisioning_is_a_tool_error_with_the_steps(ops, sim):
    sim.lab.fail.append((r"/lxc/\d+/status/start$", 500, "startup for container failed"))
    try:
        message = ops.error("write_create_lxc", {"start": True, "hostname": "half", "template": DEBIAN_TEMPLATE,
                                                 "node": "pve1"})
    finally:
        sim.lab.fail.clear()
    report = json.loads(message.split("Step report: ", 1)[1])
    assert report["result"] == "failed" and [s["step"] for s in report["steps"]][-1] == "error"
    assert "startup for container failed" in message and report["created"]


def test_failed_drill_is_a_tool_error_with_the_steps(ops, sim):
    before = set(sim.lab.guests)
    sim.lab.fail.append((r"^/nodes/[^/]+/qemu$", 500, "restore failed - no space left on device"))
    try:
        message = ops.error("write_drill_restore", {"vmid": 101, "confirm": True})
    finally:
        sim.lab.fail.clear()
    report = json.loads(message.split("Step report: ", 1)[1])
    assert "no space left" in message and report["result"] == "failed" and report["steps"][-1]["step"] == "error"
    assert "Nothing was created" in report["note"] and set(sim.lab.guests) == before


# ---------------------------------------------------------------- 16. health without data

def test_health_check_says_what_it_could_not_see(sim, tmp_path):
    sim.lab.offline_storages.add(("pve3", "local"))
    env = sim.env(pve_token="mcp@pve!nosys", pbs=False) | {"PROXMOX_AUDIT_LOG": str(tmp_path / "a.jsonl")}
    try:
        with stdio_session(env, log_name="real-pve-nosys") as session:
            report = session.ok("health_check")
    finally:
        sim.lab.offline_storages.clear()
    unavailable = {u["section"]: u["reason"] for u in report["unavailable"]}
    assert "Sys.Audit" in unavailable["node load"] and "pve1" in unavailable["node load"]
    assert "unknown" in unavailable["storage local on pve3"]


# ---------------------------------------------------------------- agent: boot and Windows

def test_vm_exec_waits_for_the_agent_after_boot(ops, sim):
    sim.lab.guests[120]["agent_boot_pings"] = 1  # just booted: the agent is not up yet
    result = ops.ok("write_exec_guest", {"vmid": 120, "command": "true", "confirm": True})
    assert result["exit_code"] == 0


def test_vm_exec_on_windows_uses_cmd(ops, sim):
    sim.lab.guests[104]["status"] = "running"
    try:
        result = ops.ok("write_exec_guest", {"vmid": 104, "command": "ver", "confirm": True})
    finally:
        sim.lab.guests[104]["status"] = "stopped"
    assert result["exit_code"] == 0 and result["stdout"] == "ran: ver\n"
