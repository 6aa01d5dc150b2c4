"""The PVE side of the user's default world (issue 21): a fresh install's storage, the README's
reader token for reads, an operator's write token for writes (examples/operator.env), and what
Proxmox does there that the tools must say (facts and sources in docs/PROXMOX-BEHAVIOUR.md)."""
import json
import re
import time

import pytest

import simulator
import simulator.pve_ha_manager
from conftest import requests_during, tool_session

GiB = 1024 ** 3
PROTECTED = [{"host": "lab", "vmid": 101, "name": "db", "reason": "the production database"}]


@pytest.fixture(scope="module", params=[9, 8], ids=["pve9", "pve8"])
def sim(request):
    """A fresh PVE 9 install, and a PVE 8 one (no `import` content on `local`, VM.Monitor for agents)."""
    lab = simulator.Lab.homelab(pve_major=request.param)
    lab.task_seconds = 0  # as in conftest's sim
    with simulator.Simulator(lab) as running:
        yield running
        assert running.lab.schema_rejections == [], running.lab.schema_rejections


@pytest.fixture(scope="module")
def reader(sim):
    """The README's read-only token (PVEAuditor) and PBS reader."""
    with tool_session(sim.env(), log_name="default-world-reader") as session:
        yield session


@pytest.fixture(scope="module")
def operator(sim, tmp_path_factory):
    """Reads with the reader token, writes with an operator's write token (PVEVMAdmin and
    PVEDatastoreUser): writes need more than the reader holds."""
    tmp = tmp_path_factory.mktemp("default-world")
    (tmp / "protected.json").write_text(json.dumps(PROTECTED))
    secret = sim.lab.pve_tokens["ops@pve!operator"].secret
    env = sim.env() | {"PROXMOX_LAB_WRITE_TOKEN": f"ops@pve!operator={secret}", "PROXMOX_ACCESS": "destructive",
                       "PROXMOX_PROTECTED_VMS_FILE": str(tmp / "protected.json"),
                       "PROXMOX_AUDIT_LOG": str(tmp / "audit.jsonl")}
    with tool_session(env, log_name="default-world-operator") as session:
        yield session


def rows(answer):
    return [dict(zip(answer["columns"], row, strict=True)) for row in answer["rows"]]


def backups_of(lab, storage, vmid):
    return [v for v in lab.volumes.get(storage, []) if v.get("vmid") == vmid and v["content"] == "backup"]


def writes(sim, action):
    return requests_during(sim, action, writes=True)


# ---------------------------------------------------------------- backups now: remove, retention, notes

def test_a_backup_now_prunes_nothing_unless_asked(operator, sim):
    """vzdump prunes by the storage's retention unless remove=0, which the GUI's Backup now sends; with
    remove=0 a retention is a limit, and a guest at it is refused."""
    lab = sim.lab
    lab.storages["local"]["config"] = {"prune-backups": "keep-last=1"}
    try:
        before = [v["volid"] for v in backups_of(lab, "local", 100)]
        message = operator.error("write_backup_guest", {"vmid": 100, "storage": "local"})
        assert "max backup limit of 1" in message and "prune=true" in message and "nothing was deleted" in message
        assert [v["volid"] for v in backups_of(lab, "local", 100)] == before
        done = operator.ok("write_backup_guest", {"vmid": 100, "storage": "local", "prune": True})
        after = [v["volid"] for v in backups_of(lab, "local", 100)]
        assert done["result"] == "ok" and len(after) == 1 and after != before
        assert done["pruning"] == ["prune older backups with retention: keep-last=1",
                                   "pruned 1 backup(s) not covered by keep-retention policy"]
    finally:
        lab.storages["local"].pop("config", None)


def test_backup_files_carry_local_time_and_the_compression(operator, sim, monkeypatch):
    monkeypatch.setenv("TZ", "Pacific/Auckland")
    time.tzset()
    try:
        operator.ok("write_backup_guest", {"vmid": 102, "storage": "local", "compress": "gzip"})
        newest = max(backups_of(sim.lab, "local", 102), key=lambda v: v["ctime"])
        stamp = time.strftime("%Y_%m_%d-%H_%M_%S", time.localtime(newest["ctime"]))
        assert newest["volid"] == f"local:backup/vzdump-lxc-102-{stamp}.tar.gz"
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_a_backup_to_pbs_is_a_pbs_snapshot_not_a_file(operator, sim):
    groups = sim.lab.datastores["backup"]["groups"]
    count = len(groups[("", "vm", "100")])
    operator.ok("write_backup_guest", {"vmid": 100, "storage": "pbs", "notes": "before {{guestname}} upgrade"})
    assert len(groups[("", "vm", "100")]) == count + 1 and not sim.lab.volumes.get("pbs")
    assert groups[("", "vm", "100")][-1]["comment"] == "before web upgrade"


def test_notes_are_sent_escaped_and_unknown_variables_refused(operator, sim):
    operator.ok("write_backup_guest", {"vmid": 105, "storage": "local", "notes": "C:\\temp\nsecond line"})
    newest = max(backups_of(sim.lab, "local", 105), key=lambda v: v["ctime"])
    assert newest["notes"] == "C:\\temp\nsecond line"
    message, sent = writes(sim, lambda: operator.error("write_backup_guest", {
        "vmid": 105, "storage": "local", "notes": "for {{owner}}"}))
    assert "{{owner}}" in message and "{{guestname}}" in message and sent == []


# ---------------------------------------------------------------- backups the reader token cannot see

def test_backups_hidden_from_the_reader_are_said_and_pbs_is_read_directly(reader, sim):
    found = reader.ok("list_backups", {"vmid": 100})
    # PVE hides every backup from PVEAuditor; the PBS-backed storage is read on the Backup Server itself
    snapshots = sim.lab.datastores["backup"]["groups"][("", "vm", "100")]
    assert {r["storage"] for r in rows(found)} == {"pbs"} and len(rows(found)) == len(snapshots)
    assert all(re.fullmatch(r"pbs:backup/vm/100/\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", r["volid"]) for r in rows(found))
    assert found["not_visible"] == ["local (every guest)"] and "Datastore.AllocateSpace" in found["why"]
    assert "says nothing about whether they exist" in found["why"]
    assert found["grant"] == ("pveum role add BackupReader --privs Datastore.AllocateSpace,VM.Backup; "
                              "pveum acl modify / --users 'mcp@pve' --roles BackupReader; "
                              "pveum acl modify / --tokens 'mcp@pve!reader' --roles BackupReader")


def test_the_readme_grant_shows_the_backups(sim):
    with tool_session(sim.env(pve_token="mcp@pve!backups"), log_name="default-world-backups") as session:
        found = session.ok("list_backups", {"vmid": 100})
    assert {r["storage"] for r in rows(found)} == {"local", "pbs"} and "not_visible" not in found


def test_coverage_says_unknown_not_missing_when_backups_are_hidden(reader, sim):
    report = reader.ok("backup_coverage")
    state = {r[0]: dict(zip(report["guests"]["columns"], r, strict=True)) for r in report["guests"]["rows"]}
    assert state[100]["state"] == "ok" and state[100]["where"] == "pbs:backup"  # read on PBS directly
    assert state[103]["state"] == "unknown" and state[104]["state"] == "unknown"  # not "missing"
    assert not any("missing" in f["finding"] for f in report["findings"])
    unknown = next(f for f in report["findings"] if "unknown" in f["finding"])
    assert unknown["evidence"]["guests"] == [103, 104] and "BackupReader" in unknown["evidence"]["grant"]
    assert "local" in unknown["finding"]


# ---------------------------------------------------------------- container restores on a fresh install

def pbs_archive(lab, kind, vmid):
    newest = max(s["backup-time"] for s in lab.datastores["backup"]["groups"][("", kind, str(vmid))])
    return f"pbs:backup/{kind}/{vmid}/" + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(newest))


def test_a_container_restore_goes_to_a_storage_that_takes_containers(operator, sim):
    """Without `storage` Proxmox restores a container to `local`, which takes no containers on a fresh install."""
    archive = pbs_archive(sim.lab, "ct", 105)
    restored = operator.ok("write_restore_backup", {"archive": archive})
    guest = sim.lab.guests[restored["vmid"]]
    assert restored["result"] == "ok"
    assert guest["config"]["rootfs"].startswith(f"local-lvm:vm-{restored['vmid']}-disk-0")
    refused = {"archive": archive, "storage": "local"}
    message, sent = writes(sim, lambda: operator.error("write_restore_backup", refused))
    assert "takes no container volumes" in message and "local-lvm" in message and sent == []
    operator.ok("write_delete_guest", {"vmid": restored["vmid"], "confirm": True})


def test_the_drill_restores_a_container_where_containers_go(operator, sim):
    drill = operator.ok("write_drill_restore", {"vmid": 105, "backup": pbs_archive(sim.lab, "ct", 105),
                                                "storage": "local-lvm", "confirm": True})
    assert drill["result"] == "ok"
    message, sent = writes(sim, lambda: operator.error("write_drill_restore", {
        "vmid": 105, "backup": pbs_archive(sim.lab, "ct", 105), "storage": "local", "confirm": True}))
    assert "takes no container volumes" in message and sent == []


# ---------------------------------------------------------------- security_audit and the guest firewall

def test_a_guest_is_filtered_only_when_its_own_firewall_option_is_on(reader, sim):
    """pve-firewall filters a NIC with firewall=1 only when the guest's firewall option enable=1 (default 0)."""
    lab = sim.lab
    saved = {vmid: lab.guests[vmid]["config"]["net0"] for vmid in (100, 101)}
    for vmid in (100, 101):
        lab.guests[vmid]["config"]["net0"] += ",firewall=1"
    guests_fw = lab.firewall["guests"]  # the guest's own firewall options (simulator/pve_firewall.py)
    guests_fw.setdefault(101, {"options": {}, "rules": [], "ipsets": {}, "aliases": {}})["options"]["enable"] = 1
    try:
        report = reader.ok("security_audit")
    finally:
        for vmid, net in saved.items():
            lab.guests[vmid]["config"]["net0"] = net
        guests_fw[101]["options"].pop("enable")
    about = {f["finding"]: f for f in report["findings"] if f["area"] == "firewall"}
    off = about["guest 100 (web) filters nothing: its NICs have firewall=1 but its own firewall option is off"]
    assert off["severity"] == "warning" and off["evidence"] == {"enable": 0, "nics": ["net0"]}
    assert not any(f.startswith("guest 101 ") for f in about)
    assert "guest 102 (dns) has no NIC with the firewall on" in about


# ---------------------------------------------------------------- new VMs as the GUI makes them

DEBIAN_ISO = "local:iso/debian-13.1.0-amd64-netinst.iso"
DEBIAN_TEMPLATE = "local:vztmpl/debian-13-standard_13.1-2_amd64.tar.zst"


def test_a_new_vm_gets_the_guis_cpu_and_a_linux_bus(operator, sim):
    vm = operator.ok("write_create_vm", {"name": "alma", "iso": DEBIAN_ISO})
    config = sim.lab.guests[vm["vmid"]]["config"]
    # without cpu qemu-server uses kvm64, on which RHEL 9 family guests do not boot
    assert config["cpu"] == "x86-64-v2-AES" and config["ostype"] == "l26"
    assert config["scsi0"].startswith(f"local-lvm:vm-{vm['vmid']}-disk-") and config["net0"].startswith("virtio,")
    operator.ok("write_delete_guest", {"vmid": vm["vmid"], "confirm": True})


def test_a_windows_installer_gets_a_disk_it_can_see(operator, sim):
    vm = operator.ok("write_create_vm", {"name": "win11", "iso": DEBIAN_ISO, "ostype": "win11"})
    config = sim.lab.guests[vm["vmid"]]["config"]
    assert config["ide0"].startswith("local-lvm:") and "scsi0" not in config and config["net0"].startswith("e1000,")
    assert (config["machine"], config["bios"], config["cpu"]) == ("q35", "ovmf", "x86-64-v2-AES")
    assert "efitype=4m" in config["efidisk0"] and "version=v2.0" in config["tpmstate0"]
    assert config["boot"] == "order=ide0;ide2"
    operator.ok("write_delete_guest", {"vmid": vm["vmid"], "confirm": True})


# ---------------------------------------------------------------- rollback

def test_a_rollback_says_the_guest_is_stopped_or_starts_it_when_asked(operator, sim):
    guest = sim.lab.guests[100]
    guest["snapshots"] = [{"name": "disk-only", "snaptime": 1}, {"name": "with-ram", "snaptime": 2, "vmstate": 1}]
    try:
        stopped = operator.ok("write_rollback_snapshot", {"vmid": 100, "name": "disk-only", "confirm": True})
        assert stopped["guest_state"] == "stopped" and guest["status"] == "stopped"
        assert "is stopped now" in stopped["note"] and "start=true" in stopped["note"]
        started = operator.ok("write_rollback_snapshot", {"vmid": 100, "name": "disk-only", "start": True,
                                                          "confirm": True})
        assert started["guest_state"] == "running" and "note" not in started
        ram = operator.ok("write_rollback_snapshot", {"vmid": 100, "name": "with-ram", "confirm": True})
        assert ram["guest_state"] == "running"  # a snapshot with RAM resumes where it was
    finally:
        guest["snapshots"], guest["status"] = [], "running"


# ---------------------------------------------------------------- migration of local things

def migrate_fails_in_task(operator, sim, vmid, target):
    """The simulator's own refusal, through write_call_api (the tool now refuses before sending)."""
    return operator.ok("write_call_api", {"method": "POST", "path": f"/nodes/{sim.lab.guests[vmid]['node']}/qemu/"
                                          f"{vmid}/migrate", "params": {"target": target}})


def test_migration_refuses_an_iso_on_local_storage_before_sending(operator, sim):
    guest = sim.lab.guests[104]  # win11, stopped, on pve2
    guest["config"]["ide2"] = "local:iso/debian-13.1.0-amd64-netinst.iso,media=cdrom"
    try:
        message, sent = writes(sim, lambda: operator.error("write_migrate_guest", {"vmid": 104, "target": "pve3"}))
        assert "ide2 (local:iso/debian-13.1.0-amd64-netinst.iso)" in message and "none,media=cdrom" in message
        assert sent == []
        upid = migrate_fails_in_task(operator, sim, 104, "pve3")["data"]  # what Proxmox itself does
        assert sim.lab.tasks[upid].exitstatus == "migration aborted" and guest["node"] == "pve2"
        assert "local cdrom image" in " ".join(sim.lab.tasks[upid].lines)
    finally:
        guest["config"].pop("ide2")


def test_migration_refuses_snapshots_on_lvmthin_before_sending(operator, sim):
    guest = sim.lab.guests[104]
    guest["snapshots"] = [{"name": "pre-update", "snaptime": 1}]
    try:
        message, sent = writes(sim, lambda: operator.error("write_migrate_guest", {"vmid": 104, "target": "pve3"}))
        assert "pre-update" in message and "lvmthin" in message and "write_delete_snapshot" in message
        assert sent == []
        upid = migrate_fails_in_task(operator, sim, 104, "pve3")["data"]
        assert "non-migratable snapshot exists" in " ".join(sim.lab.tasks[upid].lines)
    finally:
        guest["snapshots"] = []


def test_a_replicated_running_vm_migrates_only_to_its_replication_target(operator, sim):
    sim.lab.replication["pve1"] = [{"id": "100-0", "guest": 100, "target": "pve2", "fail_count": 0}]
    try:
        message = operator.error("write_migrate_guest", {"vmid": 100, "target": "pve3"})
        assert "Cannot live-migrate replicated VM to node 'pve3' - not a replication target" in message
    finally:
        sim.lab.replication.clear()


# ---------------------------------------------------------------- HA: relocation, error, fence

@pytest.fixture()
def ha_guest(sim):
    """Container 103 (stopped, on pve1) as an HA resource; put back afterwards."""
    guest = sim.lab.guests[103]
    guest["ha"] = {"state": "stopped"}
    yield guest
    sim.lab.down_nodes.clear()
    sim.lab.later.clear()
    guest.update(ha=None, node="pve1", status="stopped")


def test_an_ha_start_that_fails_is_relocated_and_polled_where_the_guest_is_now(operator, ha_guest):
    ha_guest["ha"]["fails_on"] = {"pve1"}
    started = operator.ok("write_power_guest", {"vmid": 103, "action": "start"})
    assert started["guest_state"] == "running" and started["node"] == "pve2" and started["ha_state"] == "started"
    assert "failed on pve1" in started["note"]


def test_an_ha_error_is_a_failure_with_the_way_out_and_sticks(operator, ha_guest, sim):
    ha_guest["ha"]["fails_on"] = set(sim.lab.nodes)
    message = operator.error("write_power_guest", {"vmid": 103, "action": "start"})
    assert "is in state 'error'" in message and "ha-manager set ct:103 --state disabled" in message
    again = operator.error("write_power_guest", {"vmid": 103, "action": "start"})
    assert "is in state 'error'" in again and ha_guest["ha"]["state"] == "error"  # sticky until disabled
    health = operator.ok("health_check")
    assert any(f["finding"] == "HA resource ct:103 is in state 'error' on pve2" and "disabled" in f["next"]
               for f in health["findings"])


def test_a_lost_node_is_fence_then_recovery_not_success(operator, ha_guest, sim):
    ha_guest["ha"]["state"], ha_guest["status"] = "started", "running"
    sim.lab.schedule(0.1, lambda: simulator.pve_ha_manager.fence_node(sim.lab, "pve1"))  # while the tool waits
    message = operator.error("write_power_guest", {"vmid": 103, "action": "stop", "confirm": True})
    assert "is in state 'fence'" in message or "is in state 'recovery'" in message
    assert "another node" in message


# ---------------------------------------------------------------- tokens that lack a privilege the tools read

def token_session(sim, name, acl):
    """A session whose PVE token (and its user) holds `acl` only."""
    sim.lab.pve_tokens[name] = simulator.Token("13131313-2424-3535-4646-" + f"{len(name):012d}", acl,
                                               owner=simulator.Token("", acl))
    return tool_session(sim.env(pve_token=name), log_name=f"default-world-{name.split('!')[1]}")


def test_a_pool_job_is_unknown_coverage_without_pool_audit(sim):
    """ACLs on /vms, /storage and /nodes (and / itself, not below it) leave /pool out: no Pool.Audit."""
    acl = [("/", "PVEAuditor", False)] + [(path, role, True) for path in ("/vms", "/storage", "/nodes")
                                           for role in ("PVEAuditor", "BackupReader")]
    sim.lab.backup_jobs.append({"id": "backup-prod", "type": "vzdump", "schedule": "03:00", "enabled": 1,
                                "pool": "prod", "storage": "local"})
    groups, local = sim.lab.datastores["backup"]["groups"], sim.lab.volumes["local"]
    saved = groups.pop(("", "vm", "101"))  # 101 (in pool prod) lacks a recent backup
    sim.lab.volumes["local"] = [v for v in local if v.get("vmid") != 101]
    try:
        with token_session(sim, "mcp@pve!nopool", acl) as session:
            report = session.ok("backup_coverage")
    finally:
        sim.lab.backup_jobs.pop()
        groups[("", "vm", "101")], sim.lab.volumes["local"] = saved, local
    state = {r[0]: dict(zip(report["guests"]["columns"], r, strict=True)) for r in report["guests"]["rows"]}
    assert state[101]["jobs"] == "backup-nightly,backup-prod?"
    assert state[104]["jobs"] == "backup-prod?" and state[104]["excluded_by"] == "backup-nightly"
    finding = next(f["finding"] for f in report["findings"] if f["finding"].startswith("guest 104 "))
    assert finding == ("guest 104 (win11) backup is missing; job(s) backup-prod select a pool this token cannot "
                       "see (it lacks Pool.Audit), so whether they cover it is unknown")


# ---------------------------------------------------------------- provisioning on the node that has the template

ALPINE = "local:vztmpl/alpine-3.22-default_20250617_amd64.tar.xz"


def test_provisioning_picks_a_node_whose_own_storage_has_the_template(operator, sim):
    sim.lab.add_volume("local", ALPINE, "vztmpl", 3 * 1024 ** 2, node="pve2")  # only on pve2's own disk
    try:
        made = operator.ok("write_create_lxc", {"start": True, "hostname": "alpine", "template": ALPINE,
                                                "bridge": "vmbr0"})
        assert made["result"] == "ok" and made["node"] == "pve2" and sim.lab.guests[made["vmid"]]["node"] == "pve2"
        operator.ok("write_power_guest", {"vmid": made["vmid"], "action": "stop", "confirm": True})
        operator.ok("write_delete_guest", {"vmid": made["vmid"], "confirm": True})
    finally:
        sim.lab.volumes["local"] = [v for v in sim.lab.volumes["local"] if v["volid"] != ALPINE]


def test_provisioning_without_sys_audit_does_not_claim_no_room(sim):
    """A read token without Sys.Audit sees nodes without memory figures: that is no lack of memory."""
    acl = [(path, "PVEAuditor", True) for path in ("/vms", "/storage", "/sdn")]
    sim.lab.pve_tokens["mcp@pve!nosys"] = simulator.Token("14141414-2424-3535-4646-575757575757", acl,
                                                          owner=simulator.Token("", acl))
    operator_secret = sim.lab.pve_tokens["ops@pve!operator"].secret
    env = sim.env(pve_token="mcp@pve!nosys") | {"PROXMOX_LAB_WRITE_TOKEN": f"ops@pve!operator={operator_secret}",
                                                 "PROXMOX_ACCESS": "write"}
    with tool_session(env, log_name="default-world-nosys") as session:
        plan = session.ok("write_create_lxc", {"start": True, "hostname": "blind", "template": DEBIAN_TEMPLATE,
                                                "dry_run": True})
    assert plan["dry_run"] is True and plan["request"]["path"] == "/nodes/pve1/lxc"


# ---------------------------------------------------------------- bridges: pending, and hidden without SDN privileges

def test_a_pending_bridge_is_shown_as_pending_and_not_used(operator, sim):
    """A bridge added in the GUI but not applied is only in interfaces.new: listed, without `active`."""
    sim.lab.networks["pve1"].append({"iface": "vmbr2", "type": "bridge", "autostart": 1, "bridge_ports": "eno2"})
    try:
        listed = {r["bridge"]: r for r in rows(operator.ok("list_networks", {"node": "pve1"}))}
        assert listed["vmbr2"]["pending"] is True and listed["vmbr0"]["pending"] == ""
        message, sent = writes(sim, lambda: operator.error("write_set_nic", {"vmid": 100, "bridge": "vmbr2"}))
        assert "not applied yet" in message and "ifreload -a" in message and sent == []
    finally:
        sim.lab.networks["pve1"].pop()


def test_bridges_hidden_without_sdn_privileges_are_said(sim):
    acl = [(path, "PVEAuditor", True) for path in ("/vms", "/storage", "/nodes")]  # nothing on /sdn
    with token_session(sim, "mcp@pve!nosdn", acl) as session:
        listed = session.ok("list_networks", {"node": "pve1"})
    assert listed["rows"] == [] and "SDN.Audit or SDN.Use" in listed["note"]
    assert "pveum acl modify /sdn/zones/localnetwork --tokens 'mcp@pve!nosdn' --roles PVEAuditor" in listed["note"]


# ---------------------------------------------------------------- imported disks keep the image's size

def test_an_imported_disk_keeps_a_size_like_2252M_and_is_grown_from_it(operator, sim):
    image = "local:import/rocky-9.qcow2"
    sim.lab.add_volume("local", image, "import", 2252 * 1024 ** 2, node="pve1")
    try:
        vm = operator.ok("write_create_vm", {"name": "rocky", "cloud_image": image, "node": "pve1", "disk_gb": 2})
        config = sim.lab.guests[vm["vmid"]]["config"]
        assert "size=2252M" in config["scsi0"]  # qemu-server writes the image's size as format_size does
        assert vm["disk"] == "scsi0 is 2252M, the image's own size; disk_gb=2 would not grow it, so it was left"
        grown = operator.ok("write_resize_disk", {"vmid": vm["vmid"], "disk": "scsi0", "size": "+1G"})
        assert grown["result"] == "ok" and "size=3276M" in config["scsi0"]
        message = operator.error("write_resize_disk", {"vmid": vm["vmid"], "disk": "scsi0", "size": "3G"})
        assert "is 3276M; 3G would not grow it" in message
        operator.ok("write_delete_guest", {"vmid": vm["vmid"], "confirm": True})
    finally:
        sim.lab.volumes["local"] = [v for v in sim.lab.volumes["local"] if v["volid"] != image]


# ---------------------------------------------------------------- the simulator's own facts: tags, templates, clones

def test_tags_are_stored_normalised(operator, sim):
    saved = sim.lab.guests[103]["config"].get("tags")
    operator.ok("write_configure_guest", {"vmid": 103, "set": {"tags": "Web,prod web;DB"}})
    try:
        assert sim.lab.guests[103]["config"]["tags"] == "db;prod;web"
        listed = {r["vmid"]: r for r in rows(operator.ok("list_guests"))}
        assert listed[103]["tags"] == "db;prod;web"
    finally:
        sim.lab.guests[103]["config"].pop("tags", None)
        sim.lab.guests[103]["tags"] = saved or ""


def test_a_template_has_base_volumes_and_its_clones_their_own(operator, sim):
    vm = operator.ok("write_create_vm", {"name": "golden", "iso": DEBIAN_ISO})
    vmid = vm["vmid"]
    operator.ok("write_make_template", {"vmid": vmid})
    assert sim.lab.guests[vmid]["config"]["scsi0"].startswith(f"local-lvm:base-{vmid}-disk-")
    clone = operator.ok("write_clone_guest", {"vmid": vmid})  # linked, a template's default
    disk = sim.lab.guests[clone["newid"]]["config"]["scsi0"]
    assert disk.startswith(f"local-lvm:vm-{clone['newid']}-disk-") and "size=" in disk
    for gone in (clone["newid"], vmid):
        operator.ok("write_delete_guest", {"vmid": gone, "confirm": True})


def test_storage_content_of_a_node_local_storage_names_the_node(reader):
    found = reader.ok("storage_content", {"storage": "local", "content": "iso"})
    assert found["node"] == "pve1" and "pve2, pve3" in found["note"]
    elsewhere = reader.ok("storage_content", {"storage": "local", "node": "pve3", "content": "iso"})
    assert elsewhere["node"] == "pve3" and "note" not in elsewhere
    assert "node" not in reader.ok("storage_content", {"storage": "pbs"})


# ---------------------------------------------------------------- an older PVE

def test_task_logs_are_read_whole_on_pve_before_7_3(tmp_path):
    """limit=0 means every line only since pve-common 7.3 (Nov 2022); before, it gave none."""
    lab = simulator.Lab.homelab(pve_major=7)
    lab.task_seconds = 0
    with simulator.Simulator(lab) as old:
        upid = lab.start_task("pve1", "vzdump", "100", exitstatus="job errors", finished=True,
                              lines=["INFO: starting", "ERROR: Backup of VM 100 failed - disk full"])
        with tool_session(old.env(), log_name="default-world-pve7") as session:
            report = session.ok("get_task", {"upid": upid, "log_lines": 5})
        assert lab.schema_rejections == []
    assert report["log"][-2:] == ["ERROR: Backup of VM 100 failed - disk full", "TASK ERROR: job errors"]


def test_cloud_images_land_on_local_from_pve9_on(operator, sim):
    """The PVE 9 installer gives `local` the import content type; a PVE 8 install has none."""
    args = {"url": "https://cloud.debian.org/debian-13-genericcloud-amd64.qcow2", "storage": "local",
            "filename": "trixie.qcow2", "content": "import"}
    if sim.lab.pve_major >= 9:
        plan = operator.ok("write_download_url", args | {"dry_run": True})
        assert plan["request"]["path"] == "/nodes/pve1/storage/local/download-url"
        # the operator's write token lacks Datastore.AllocateTemplate: the grant names that token
        message = operator.error("write_download_url", args)
        assert "lacks Datastore.AllocateTemplate on /storage/local" in message
        assert "--tokens 'ops@pve!operator' --roles PVEDatastoreAdmin" in message
    else:
        message, sent = writes(sim, lambda: operator.error("write_download_url", args))
        assert "does not take import" in message and "pvesm set local --content iso,vztmpl,backup,import" in message
        assert sent == []


def test_a_drill_without_visible_backups_does_not_say_there_are_none(operator, sim):
    message = operator.error("write_drill_restore", {"vmid": 104, "confirm": True})  # 104: none it can see
    assert "has no backup" not in message and "cannot be seen" in message and "backup=<volid>" in message
