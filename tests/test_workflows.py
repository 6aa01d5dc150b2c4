"""Workflows against a lab built to contain the findings they must report (and not others):
health_check, backup_coverage, security_audit, provisioning, the restore drill, get_task waiting,
resources and prompts."""
import json
import time

import pytest

import simulator
from conftest import in_process, requests_during, tool_session
from simulator.pve_monitor import add_pool, monitor, smart_off

GiB = 1024 ** 3


@pytest.fixture(scope="module")
def sim():
    lab = simulator.Lab.homelab()
    lab.task_seconds = 0  # as in conftest's sim
    now = int(time.time())
    lab.storages["pbs"]["used"] = 3800 * GiB  # 95 %: a full storage (shared)
    lab.acl.append({"path": "/", "type": "user", "ugid": "ops@pve", "roleid": "Administrator", "propagate": 1})
    lab.cert_days["pve3"] = 10  # an expiring certificate
    lab.nodes["pve2"]["cpu"] = 0.97  # a node at full load
    lab.replication["pve1"] = [{"id": "100-0", "guest": 100, "target": "pve2", "fail_count": 3,
                                "error": "storage 'local-lvm' is not available on node 'pve2'", "last_sync": 0}]
    lab.guests[100]["config"]["hookscript"] = "local:snippets/hook.sh"
    lab.guests[101]["config"]["hostpci0"] = "0000:01:00.0"
    lab.guests[101]["lock"] = "backup"  # a guest stuck locked
    # guest 102: its newest backups are five days old (stale)
    store = lab.datastores["backup"]["groups"]
    store[("", "ct", "102")] = [lab.pbs_snapshot(now - 5 * 86400 - d * 86400) for d in range(3)]
    lab.volumes["local"] = [v for v in lab.volumes["local"] if v.get("vmid") != 102]
    store[("", "vm", "999")] = [lab.pbs_snapshot(now - 86400)]  # a group whose guest is gone
    lab.add_volume("local", "local:import/debian-13.qcow2", "import", 600 * 1024 ** 2)
    with simulator.Simulator(lab) as running:
        yield running
        assert running.lab.schema_rejections == []


@pytest.fixture(scope="module")
def ops(sim, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("workflows")
    (tmp / "protected.json").write_text("[]")
    # provisioning and the drill create, start and destroy guests: more than the README's reader tokens
    env = sim.env(pve_token="root@pam!admin", pbs_token="root@pam!admin") | {
        "PROXMOX_ACCESS": "destructive", "PROXMOX_PROTECTED_VMS_FILE": str(tmp / "protected.json"),
        "PROXMOX_AUDIT_LOG": str(tmp / "audit.jsonl")}
    with tool_session(env, log_name="workflows") as session:
        yield session


def areas(report):
    return {(f["severity"], f["area"], f["finding"]) for f in report["findings"]}


def test_health_check_reports_what_is_wrong_and_only_that(session, sim):
    report, sent = requests_during(sim, lambda: session.ok("health_check"))
    found = areas(report)
    # a shared storage is one finding, not one per node that mounts it
    assert [f for f in found if f[1] == "storage"] == [("critical", "storage", "pbs (shared) is 95.0% full")]
    assert ("warning", "locks", "guest 101 (db) is locked (backup)") in found
    assert ("warning", "certificates", "pve-ssl.pem on pve3 expires in 9 days") in found \
        or ("warning", "certificates", "pve-ssl.pem on pve3 expires in 10 days") in found
    assert any(f[1] == "tasks" and "vzdump 104" in f[2] for f in found)
    assert ("warning", "cpu", "node pve2 runs at 97.0% CPU") in found
    assert ("warning", "replication", "replication 100-0 on pve1 is failing") in found
    assert not any(f[1] in ("quorum", "nodes", "memory", "ha") for f in found)
    # the lab's sync job failed its last run (remote unreachable); nothing else on PBS is wrong
    assert {f for f in found if f[1] == "pbs"} == {("warning", "pbs", "sync job s-backup failed: sync failed - "
                                                                       "remote unreachable")}
    assert report["summary"]["unavailable"] == 0 and report["thresholds"]["storage_warn_pct"] == 80
    assert [f["severity"] for f in report["findings"]] == sorted(
        (f["severity"] for f in report["findings"]), key=["critical", "warning", "info"].index)
    pve_requests = [r for r in sent if r[0] == "pve"]
    # status, resources, tasks; then per node replication, certificates, disks, ZFS pools, package
    # versions and, as this token holds Sys.Modify, the whole update list
    assert len(pve_requests) <= 3 + 6 * 3


def test_health_check_reports_disks_pools_kernels_certificates_and_updates(session, sim):
    """conftest's session: the README's read-only token (PVEAuditor), as a first conversation has it."""
    world = monitor(sim.lab)
    world.disks["pve1"].append({"devpath": "/dev/sdb", "type": "hdd", "size": 4 * 10 ** 12, "model": "WDC WD40EFRX",
                                "health": "FAILED!", "wearout": "N/A", "used": "ZFS"})
    world.disks["pve2"][0]["wearout"] = "15"
    smart_off(sim.lab, "pve3", "/dev/sda")
    add_pool(sim.lab, "pve3", "tank", state="DEGRADED", bad_disk="/dev/disk/by-id/ata-WDC_2-part1")
    healthy = add_pool(sim.lab, "pve3", "rpool")
    healthy["_detail"]["children"][0]["children"][0]["children"][0]["cksum"] = 3  # ONLINE, yet a device errs
    add_pool(sim.lab, "pve3", "fast", log=True, cache="ONLINE", spare="UNAVAIL")  # the spare could not take over
    world.kernels["pve2"].insert(0, "6.14.11-3-pve")
    world.proxy_certs["pve2"] = 20  # an ACME certificate that did not renew at 30 days
    world.acme["pve2"] = "domains=pve2.example.org"
    sim.lab.cert_days["pve1"] = 20  # pve-ssl.pem: renews itself at 14 days
    try:
        report = session.ok("health_check")
    finally:
        world.disks["pve1"].pop()
        world.disks["pve2"][0]["wearout"] = "98"
        smart_off(sim.lab, "pve3", "/dev/sda", off=False)
        world.zfs["pve3"].clear()
        world.kernels["pve2"].pop(0)
        world.proxy_certs.clear()
        world.acme.clear()
        sim.lab.cert_days["pve1"] = 300
    found = areas(report)
    assert ("critical", "disks", "/dev/sdb on pve1: SMART health FAILED!") in found
    assert ("warning", "disks", "/dev/sda on pve2: 15% of its rated life left") in found
    # SMART off is not a failing disk (docs/PROXMOX-BEHAVIOUR.md#disks-and-smart)
    assert [f for f in found if "pve3" in f[2] and f[1] == "disks"] == [
        ("info", "disks", "/dev/sda on pve3: SMART is off, so its health is not watched")]
    assert any(f[:2] == ("critical", "zfs") and f[2].startswith("pool tank on pve3: state DEGRADED") for f in found)
    assert ("warning", "zfs", "pool rpool on pve3: device errors on /dev/disk/by-id/ata-WDC_1-part1") in found
    assert ("warning", "zfs", "pool fast on pve3: spare /dev/disk/by-id/ata-WDC_SPARE-part1 UNAVAIL") in found
    assert ("warning", "updates", "pve2 runs kernel 6.14.11-2-pve, 6.14.11-3-pve is installed") in found
    assert ("info", "updates", "1 package update pending on pve1") in found  # Proxmox's: no Sys.Modify
    assert any(f[:2] == ("warning", "certificates") and f[2].startswith("pveproxy-ssl.pem on pve2") for f in found)
    assert any(f[:2] == ("info", "certificates") and f[2].startswith("pve-ssl.pem on pve1") for f in found)
    assert report["summary"]["unavailable"] == 0 and "disks pve1" in report["checked"]


def test_certificates_are_judged_by_how_and_when_they_renew(session, sim):
    """pveupdate renews an ACME pveproxy-ssl.pem once under 30 days are left and pve-ssl.pem under 14,
    at its daily run (01:00 plus up to 5 h): a day under the mark is its next run, not a failure. A
    custom certificate is never renewed (docs/PROXMOX-BEHAVIOUR.md#node-certificates)."""
    world = monitor(sim.lab)
    world.acme |= {"pve1": "domains=pve1.example.org", "pve2": "domains=pve2.example.org"}
    world.proxy_certs |= {"pve1": 29.5, "pve2": 28.5, "pve3": 29.5}  # pve3's is a custom certificate
    sim.lab.cert_days |= {"pve1": 13.5, "pve2": 12.5}
    try:
        report, sent = requests_during(sim, lambda: session.ok("health_check"))
    finally:
        world.acme.clear()
        world.proxy_certs.clear()
        sim.lab.cert_days |= {"pve1": 300, "pve2": 300}
    found = {f["finding"]: f for f in report["findings"] if f["area"] == "certificates"}
    assert found["pveproxy-ssl.pem on pve1 expires in 29 days"]["severity"] == "info"
    assert "next daily run" in found["pveproxy-ssl.pem on pve1 expires in 29 days"]["next"]
    assert found["pveproxy-ssl.pem on pve2 expires in 28 days"]["severity"] == "warning"
    assert "pvenode acme cert renew" in found["pveproxy-ssl.pem on pve2 expires in 28 days"]["next"]
    assert found["pveproxy-ssl.pem on pve3 expires in 29 days"]["severity"] == "warning"
    assert "not renewed" in found["pveproxy-ssl.pem on pve3 expires in 29 days"]["next"]
    assert found["pve-ssl.pem on pve1 expires in 13 days"]["severity"] == "info"
    assert found["pve-ssl.pem on pve2 expires in 12 days"]["severity"] == "warning"
    # a node's config (whether ACME is set up) is read only where a pveproxy-ssl.pem expires soon
    assert sorted(path for _, _, path in sent if path.endswith("/config") and "/nodes/pve" in path
                  and path.count("/") == 3) == ["/nodes/pve1/config", "/nodes/pve2/config", "/nodes/pve3/config"]


def test_unreadable_sections_are_unavailable_not_healthy(session, sim):
    sim.lab.fail.append((r"^/cluster/tasks$", 500, "pvestatd not responding"))
    try:
        report = session.ok("health_check")
    finally:
        sim.lab.fail.clear()
    assert report["unavailable"][0]["section"] == "tasks" and "pvestatd" in report["unavailable"][0]["reason"]
    assert "tasks" not in report["checked"]


def test_backup_coverage_checks_pve_and_pbs_against_each_other(ops, sim):
    # the admin token: PVE lists backups only to a caller holding Datastore.AllocateSpace and VM.Backup
    report, sent = requests_during(sim, lambda: ops.ok("backup_coverage"))
    rows = {r[0]: dict(zip(report["guests"]["columns"], r, strict=True)) for r in report["guests"]["rows"]}
    assert rows[100]["state"] == "ok" and rows[100]["where"] == "pbs:backup" and rows[100]["verify"] == "ok"
    assert rows[102]["state"] == "stale" and rows[102]["age_h"] > 100
    assert rows[103]["state"] == "missing" and rows[103]["jobs"] == "backup-nightly"
    assert rows[104]["state"] == "missing" and rows[104]["excluded_by"] == "backup-nightly" and rows[104]["jobs"] == ""
    assert rows[105]["state"] == "ok"
    assert report["orphan_pbs_groups"] == ["vm/999"]
    assert {f["finding"].split(" backup")[0] for f in report["findings"] if f["area"] == "backups"} >= {
        "guest 102 (dns)", "guest 103 (media)", "guest 104 (win11)"}
    # resources, jobs, `local` on each of 3 nodes, the PBS storage list (standing in for the PBS-backed
    # storage) and one datastore: 2 + storages (4) + datastores (1)
    assert len(sent) <= 2 + 4 + 1
    assert sum(1 for r in sent if r[2].endswith("/storage/local/content")) == 3


def test_backup_coverage_reads_each_nodes_own_local_storage(ops, sim):
    """`local` is a different disk on every node: a backup on pve3's counts, found on pve3."""
    stamp = time.strftime("%Y_%m_%d-%H_%M_%S", time.gmtime())
    sim.lab.add_volume("local", f"local:backup/vzdump-lxc-103-{stamp}.tar.zst", "backup", 1 << 30, vmid=103,
                       node="pve3")
    try:
        report = ops.ok("backup_coverage")
        rows = {r[0]: dict(zip(report["guests"]["columns"], r, strict=True)) for r in report["guests"]["rows"]}
        assert rows[103]["state"] == "ok" and rows[103]["where"] == "local@pve3"
    finally:
        sim.lab.volumes["local"] = [v for v in sim.lab.volumes["local"] if v.get("vmid") != 103]


def test_security_audit(session):
    report = session.ok("security_audit")
    found = {f["finding"] for f in report["findings"]}
    assert "token root@pam!admin belongs to root@pam" in found
    assert "token root@pam!admin has privilege separation off (all of its user's rights)" in found
    assert "ops@pve holds Administrator on / (everything)" in found
    assert "guest 100 (web) runs hookscript local:snippets/hook.sh on the host" in found
    assert "guest 101 (db) has host devices hostpci0" in found
    assert "the datacenter firewall is off" not in found  # it is on in the lab
    assert not any("mcp@pve!reader never expires" in f for f in found)
    assert "two-factor authentication of users" in report["not_checked"]


@pytest.mark.mcp  # progress notifications
def test_get_task_waits_for_both_products(ops, sim):
    pve = sim.lab.start_task("pve2", "qmstart", "101", duration=0.5)
    pbs = sim.lab.start_task("pbs", "verify", "backup", duration=0.5, product="pbs")
    progress = []
    assert ops.ok("get_task", {"upid": pve, "wait_seconds": 30}, progress=progress)["result"] == "ok"
    assert ops.ok("get_task", {"upid": pbs, "wait_seconds": 30})["result"] == "ok"


def test_provision_lxc_and_vm_in_one_call(ops, sim):
    ct = ops.ok("write_create_lxc", {"start": True, "hostname": "pihole", "template":
                                        "local:vztmpl/debian-13-standard_13.1-2_amd64.tar.zst"})
    assert ct["result"] == "ok" and [s["step"] for s in ct["steps"]] == [
        "pick node", "vmid", "pick bridge", "create", "start", "wait for address"]
    assert ct["address"].startswith("192.0.2.") and sim.lab.guests[ct["vmid"]]["status"] == "running"
    assert next(s for s in ct["steps"] if s["step"] == "pick bridge")["bridge"] == "vmbr0"  # the uplinked one
    vm = ops.ok("write_create_vm", {"start": True, "name": "cloudy", "cloud_image": "local:import/debian-13.qcow2",
                                       "ciuser": "admin"})
    assert vm["result"] == "ok" and vm["address"].startswith("192.0.2.")


def step_report(message):
    """A failed workflow is a tool error carrying its step report."""
    return json.loads(message.split("Step report: ", 1)[1])


@pytest.mark.parametrize("arguments, expected", [
    ({"name": "bad name!", "cloud_image": "local:import/debian-13.qcow2"}, "argument 'name'"),
    ({"name": "cloudy2", "cloud_image": "local:import/nothing.qcow2"}, "nothing.qcow2"),
    ({"name": "cloudy2", "cloud_image": "local:import/debian-13.qcow2", "memory_mb": 1}, "argument 'memory_mb'"),
])
def test_provision_vm_refuses_bad_input_with_nothing_sent(ops, sim, arguments, expected):
    arguments |= {"start": True}
    message, sent = requests_during(sim, writes=True, action=lambda: ops.error("write_create_vm", arguments))
    assert expected in message and sent == []


def test_provision_failure_says_what_exists_and_deletes_nothing(ops, sim):
    failed = step_report(ops.error("write_create_lxc", {"start": True, "hostname": "x1",
                                                           "template": "local:vztmpl/missing.tar.zst"}))
    assert failed["result"] == "failed" and failed["created"] == [] and "Nothing was created" in failed["note"]
    sim.lab.fail.append((r"/lxc/\d+/status/start$", 500, "startup for container failed"))
    before = set(sim.lab.guests)
    try:
        half = step_report(ops.error("write_create_lxc", {"start": True, "hostname": "half", "template":
                                                             "local:vztmpl/debian-13-standard_13.1-2_amd64.tar.zst"}))
    finally:
        sim.lab.fail.clear()
    made = set(sim.lab.guests) - before
    assert half["result"] == "failed" and len(made) == 1 and f"lxc {made.pop()}" in half["created"][0]
    assert "Nothing was deleted" in half["note"]


def test_restore_drill_proves_a_backup_and_cleans_up(ops, sim):
    before = set(sim.lab.guests)
    drill = ops.ok("write_drill_restore", {"vmid": 100, "confirm": True})
    assert drill["result"] == "ok" and set(sim.lab.guests) == before
    assert [s["step"] for s in drill["steps"]] == ["restore", "cut network", "start", "guest answers",
                                                   "destroy scratch"]
    assert next(s for s in drill["steps"] if s["step"] == "cut network")["how"] == "link_down"
    assert set(drill["timings"]) == {"restore_s", "start_s", "answer_s", "total_s"}
    ct = ops.ok("write_drill_restore", {"vmid": 105, "confirm": True})
    assert ct["result"] == "ok" and next(s for s in ct["steps"] if s["step"] == "cut network")["how"] == "bridge vmbr1"


def test_restore_drill_proves_a_protected_guests_backup(sim, tmp_path):
    """Restoring the backup to a scratch vmid leaves the protected guest alone, so it is allowed."""
    # a drill restores, starts and destroys: more than the README's reader holds
    env = sim.env(pve_token="root@pam!admin", pbs_token="root@pam!admin") | {
        "PROXMOX_ACCESS": "destructive", "PROXMOX_PROTECTED_VMS": "lab:100",
        "PROXMOX_AUDIT_LOG": str(tmp_path / "audit.jsonl")}
    with in_process(env, log_name="workflows-protected") as session:
        config_before = dict(sim.lab.guests[100]["config"]) if "config" in sim.lab.guests[100] else None
        drill = session.ok("write_drill_restore", {"vmid": 100, "confirm": True})
        assert drill["result"] == "ok"
        if config_before is not None:
            assert sim.lab.guests[100]["config"] == config_before
        assert "protected" in session.error("write_power_guest", {"vmid": 100, "action": "start"})


def test_restore_drill_failure_paths(ops, sim):
    assert "Scratch vmid 101 exists" in ops.error("write_drill_restore", {"vmid": 100, "scratch_vmid": 101,
                                                                          "confirm": True})
    assert "has no backup" in ops.error("write_drill_restore", {"vmid": 103, "confirm": True})
    before = set(sim.lab.guests)
    sim.lab.fail.append((r"/agent/ping$", 500, "QEMU guest agent is not running"))
    try:
        silent = step_report(ops.error("write_drill_restore", {"vmid": 100, "answer_seconds": 5, "confirm": True}))
    finally:
        sim.lab.fail.clear()
    assert silent["result"] == "failed" and set(sim.lab.guests) == before  # scratch destroyed anyway
    assert next(s for s in silent["steps"] if s["step"] == "guest answers")["state"] == "failed"
    sim.lab.fail.append((r"^/nodes/[^/]+/qemu$", 500, "restore failed - no space left on device"))
    try:
        broken = step_report(ops.error("write_drill_restore", {"vmid": 100, "confirm": True}))
    finally:
        sim.lab.fail.clear()
    assert broken["result"] == "failed" and "no space left" in broken["steps"][-1]["detail"]
    assert broken["created"] == [] and set(sim.lab.guests) == before
    # a drill refused before any step ran says so without a timing (its text is the same on every run)
    early = step_report(ops.error("write_drill_restore", {"vmid": 100, "backup": "not-a-backup", "confirm": True}))
    assert "timings" not in early and "does not look like a backup" in early["steps"][-1]["detail"]


def test_restore_drill_that_cannot_destroy_its_scratch_guest_is_an_error(ops, sim):
    before = set(sim.lab.guests)
    sim.lab.fail.append((r"/qemu/\d+$", 500, "unable to remove the disk"))  # the DELETE of the scratch VM
    try:
        stuck = step_report(ops.error("write_drill_restore", {"vmid": 100, "confirm": True}))
    finally:
        sim.lab.fail.clear()
    left = set(sim.lab.guests) - before
    for vmid in left:
        ops.ok("write_delete_guest", {"vmid": vmid, "confirm": True})
    assert stuck["result"] == "failed" and len(left) == 1 and f"qemu {left.pop()}" in stuck["created"][0]
    assert stuck["steps"][-1] == {"step": "destroy scratch", "state": "failed",
                                  "detail": stuck["steps"][-1]["detail"]} and "Left behind" in stuck["note"]


@pytest.mark.mcp  # resources and prompts
def test_resources_and_prompts(ops):
    resources = ops.portal.call(ops.client.list_resource_templates)
    uris = {t.uri_template for t in resources.resource_templates}
    assert {"proxmox://{host}/guests", "pbs://{host}/datastores", "proxmox://{host}/cluster"} <= uris
    guests = ops.portal.call(lambda: ops.client.read_resource("proxmox://lab/guests"))
    assert json.loads(guests.contents[0].text)["columns"][0] == "vmid"
    # resources/list offers each host's inventory and health summary, and the datastores, to attach
    listed = {str(r.uri): r for r in ops.portal.call(ops.client.list_resources).resources}
    assert set(listed) == {"proxmox://lab/guests", "proxmox://lab/health", "pbs://lab/datastores"}
    assert listed["proxmox://lab/health"].description and listed["proxmox://lab/health"].mime_type == "application/json"
    health = json.loads(ops.portal.call(lambda: ops.client.read_resource("proxmox://lab/health")).contents[0].text)
    assert {"summary", "findings"} <= set(health) and health["summary"]["critical"] >= 1  # this lab has some
    prompts = {p.name for p in ops.portal.call(ops.client.list_prompts).prompts}
    assert prompts == {"cluster_health_review", "troubleshoot_guest", "provision_lxc", "safe_guest_change",
                       "backup_review", "security_review"}
    text = ops.portal.call(lambda: ops.client.get_prompt("troubleshoot_guest", {"vmid": "101"}))
    assert "list_tasks vmid=101" in text.messages[0].content.text


def test_workflow_writes_are_refused_below_their_gate(sim, tmp_path):
    offered = {}
    for tier in ("lifecycle", "write"):
        # the admin token: only the gates decide here, not privileges read in the background
        env = sim.env(pve_token="root@pam!admin") | {"PROXMOX_ACCESS": tier,
                                                      "PROXMOX_AUDIT_LOG": str(tmp_path / "a.jsonl")}
        with in_process(env, log_name=f"workflows-{tier}") as session:
            offered[tier] = {t.name for t in session.tools()}
    assert not {"write_create_lxc", "write_create_vm", "write_drill_restore"} & offered["lifecycle"]
    assert {"write_create_lxc", "write_create_vm"} <= offered["write"]
    assert "write_drill_restore" not in offered["write"]  # it destroys its scratch guest: destructive


def test_provision_dry_run_sends_no_write(ops, sim):
    plan, sent = requests_during(sim, writes=True, action=lambda: ops.ok("write_create_lxc", {"start": True,
        "hostname": "preview", "template": "local:vztmpl/debian-13-standard_13.1-2_amd64.tar.zst", "dry_run": True}))
    assert sent == [] and plan["dry_run"] is True  # the answer is the first write it would send
    assert plan["request"]["path"].endswith("/lxc") and plan["request"]["params"]["hostname"] == "preview"
    assert plan["request"]["params"]["net0"].startswith("name=eth0,bridge=vmbr0")
