"""Real Proxmox behaviour around PBS, tasks and access (issue 15), each modelled in the simulator
after the source cited in docs/PROXMOX-BEHAVIOUR.md and checked here through the tool functions,
called in this process against a simulator of the test's own."""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator

import pytest

import calls
import config as config_module
import health
import pbs_tools
import policy
import privileges
import provisioning
import proxmox_client
import pve_tools
import runtime
import simulator
import workflows
from answers import human_bytes, iso_time
from errors import PolicyError, ProxmoxError, ToolFailure
from simulator.pbs import store_unavailable

LABEL = "real"  # a label of its own: privileges read here never mix with other tests' hosts


@contextmanager
def tools_on(sim: simulator.Simulator, tmp_path: Any, pve_token: str = "mcp@pve!reader",
             pbs_token: str = "mcp@pbs!reader", **env: str) -> Iterator[None]:
    """The tool functions of this process pointed at `sim` (host label `real`), with a server's state of
    their own (runtime.py): what they read (privileges, versions) is gone afterwards."""
    settings = config_module.load_config(sim.env(LABEL, pve_token=pve_token, pbs_token=pbs_token) | {
        "PROXMOX_AUDIT_LOG": str(tmp_path / "audit.jsonl")} | env)
    outside = runtime.install(runtime.Runtime())
    try:
        proxmox_client.configure_hosts(settings.hosts)
        policy.configure(settings.settings)
        yield
    finally:
        runtime.install(outside)


def rows(answer: dict) -> list[dict]:
    return [dict(zip(answer["columns"], row, strict=True)) for row in answer["rows"]]


@pytest.fixture()
def lab() -> simulator.Lab:
    return simulator.Lab.homelab()


@pytest.fixture()
def sim(lab: simulator.Lab) -> Iterator[simulator.Simulator]:
    with simulator.Simulator(lab) as running:
        yield running
        assert running.lab.schema_rejections == [], running.lab.schema_rejections


def findings(report: dict, area: str) -> list[str]:
    return [f["finding"] for f in report["findings"] if f["area"] == area]


# ---------------------------------------------------------------- 1, 2: PBS job states and garbage collection

def test_healthy_verify_job_is_not_reported_failed(sim, tmp_path):
    with tools_on(sim, tmp_path):
        report = health.health_check()
    assert not [f for f in findings(report, "pbs") if "verify job" in f], report["findings"]


def test_failed_and_warning_verify_jobs(sim, lab, tmp_path):
    job = lab.pbs_jobs["verify"][0]
    with tools_on(sim, tmp_path):
        job["last-run-state"] = "WARNINGS: 2"
        assert not [f for f in findings(health.health_check(), "pbs") if "verify job" in f]
        job["last-run-state"] = "verification failed - please check the log for details"
        failed = [f for f in findings(health.health_check(), "pbs") if "verify job" in f]
    assert failed and "verification failed" in failed[0]


def test_gc_times_come_from_the_gc_job(sim, lab, tmp_path):
    ran = lab.datastores["backup"]["gc_job"]["last-run-endtime"]
    with tools_on(sim, tmp_path):
        before = len(lab.requests)
        stores = rows(pbs_tools.pbs_list_datastores())
        asked = [path for _, _, path in lab.requests[before:] if path not in ("/access/permissions", "/version")]
        status = pbs_tools.pbs_list_datastores(store="backup")
        report = health.health_check()
    assert stores[0]["last_gc"] == iso_time(ran) and stores[0]["gc_result"] == "OK"
    assert asked == ["/status/datastore-usage", "/admin/gc"]  # one extra read for every store
    assert status["gc"]["last_run"] == iso_time(ran) and status["gc"]["state"] == "OK"
    assert status["gc"]["next_run"]
    assert not [f for f in findings(report, "pbs") if "garbage collection" in f], report["findings"]


def test_old_or_failed_gc_is_reported(sim, lab, tmp_path):
    gc = lab.datastores["backup"]["gc_job"]
    gc["last-run-endtime"] = int(time.time()) - 20 * 86400
    with tools_on(sim, tmp_path):
        assert [f for f in findings(health.health_check(), "pbs") if "garbage collection" in f]
        gc |= {"last-run-endtime": int(time.time()) - 3600, "last-run-state": "TASK ERROR: out of space"}
        failed = [f for f in findings(health.health_check(), "pbs") if "garbage collection" in f]
    assert failed and "out of space" in failed[0]


def test_a_datastore_pbs_cannot_open_is_a_finding(sim, lab, tmp_path):
    """A store whose status row carries `error` (its removable drive not mounted, offline maintenance,
    a chunk store gone) is something to act on, each with its own next step
    (docs/PROXMOX-BEHAVIOUR.md#datastores-and-namespaces)."""
    for name, why in (("usb", "unmounted"), ("old", "offline"), ("nas", "broken")):
        lab.add_datastore(name, total=1000 * simulator.GiB, used=10 * simulator.GiB)
        store_unavailable(lab, name, why)
    with tools_on(sim, tmp_path, pbs_token="root@pam!admin"):
        stores = {r["store"]: r for r in rows(pbs_tools.pbs_list_datastores())}
        report = health.health_check()
        with pytest.raises(ToolFailure, match="not mounted"):
            pbs_tools.pbs_list_datastores(store="usb")
    assert stores["usb"]["unavailable"] == "datastore 'usb' is not mounted" and stores["usb"]["used"] == ""
    assert stores["backup"]["unavailable"] == ""
    found = {f["finding"]: f for f in report["findings"] if f["area"] == "pbs"}
    usb = found["datastore usb: its removable drive is not mounted"]
    assert usb["severity"] == "warning" and "plug in the drive" in usb["next"]
    assert usb["evidence"]["error"] == "datastore 'usb' is not mounted"
    assert found["datastore old: it is in maintenance"]["severity"] == "warning"
    assert found["datastore nas: it cannot be opened"]["severity"] == "critical"
    assert "proxmox-backup-manager datastore show nas" in found["datastore nas: it cannot be opened"]["next"]
    assert not any("usb" in u["section"] for u in report["unavailable"])  # read, and found wanting


def test_push_sync_jobs_are_listed_and_run(sim, lab, tmp_path):
    with tools_on(sim, tmp_path, pbs_token="root@pam!admin", PROXMOX_ACCESS="lifecycle"):
        jobs = {r["id"]: r for r in rows(pbs_tools.pbs_list_jobs())}
        ran = pbs_tools.write_pbs_run_job("sync", "push-backup", wait_seconds=0)
    assert jobs["push-backup"]["direction"] == "push" and jobs["s-backup"]["direction"] == "pull"
    assert ran["task"] == "started" and "status" not in ran


# ---------------------------------------------------------------- 4, 16, 18: task lists, logs and UPIDs

def test_node_task_list_shows_running_tasks_and_failures_apart(sim, lab, tmp_path):
    running = lab.start_task("pve1", "qmclone", "100", duration=600, user="root@pam!admin")
    with tools_on(sim, tmp_path, pve_token="root@pam!admin"):
        active = rows(pve_tools.list_tasks(node="pve1", running=True))
        recent = {r["upid"]: r for r in rows(pve_tools.list_tasks(node="pve1"))}
        failed = rows(pve_tools.list_tasks(node="pve1", errors=True))
    assert [r["upid"] for r in active] == [running] and active[0]["status"] == "running"
    assert recent[running]["status"] == "running" and recent[running]["user"] == "root@pam!admin"
    assert [r["status"] for r in failed] == ["job errors"]  # the running task is no failure


def test_pbs_task_list_errors_and_running(sim, lab, tmp_path):
    running = lab.start_task("pbs", "verificationjob", "backup:v-backup", duration=600, product="pbs",
                             user="mcp@pbs!reader")
    failed = lab.start_task("pbs", "syncjob", "backup:s-backup", exitstatus="sync failed - remote unreachable",
                            finished=True, product="pbs")
    lab.start_task("pbs", "garbage_collection", "backup", finished=True, product="pbs")
    with tools_on(sim, tmp_path):
        errors = rows(pbs_tools.pbs_list_tasks(errors=True))
        active = rows(pbs_tools.pbs_list_tasks(running=True))
        task = pve_tools.get_task(running)
    assert [r["upid"] for r in errors] == [failed] and errors[0]["status"] == "sync failed - remote unreachable"
    assert [r["upid"] for r in active] == [running] and active[0]["status"] == "running"
    assert active[0]["user"] == "mcp@pbs!reader" and task["user"] == "mcp@pbs!reader"
    assert task["id"] == "backup:v-backup"


def test_pbs_task_log_pages_without_repeating_a_line(sim, lab, tmp_path):
    upid = lab.start_task("pbs", "verify", "backup", finished=True, product="pbs",
                          lines=[f"line {n}" for n in range(1, 8)])
    with tools_on(sim, tmp_path):
        first = pve_tools.get_task(upid, start=0, log_lines=3)
        second = pve_tools.get_task(upid, start=first["next_start"], log_lines=3)
        third = pve_tools.get_task(upid, start=second["next_start"], log_lines=3)
    assert first["lines"] + second["lines"] + third["lines"] == [f"line {n}" for n in range(1, 8)] + ["TASK OK"]
    assert "next_start" not in third


def test_pbs_worker_ids_are_systemd_escaped_and_decoded(sim, lab, tmp_path):
    lab.datastores["backup"]["groups"][("", "vm", "100")][0]["verification"] = None
    with tools_on(sim, tmp_path, pbs_token="root@pam!admin", PROXMOX_ACCESS="lifecycle"):
        started = pbs_tools.write_pbs_verify_backups("backup", backup_type="vm", backup_id="100", wait_seconds=0)
        task = pve_tools.get_task(started["upid"])
    # the worker id as PBS builds it: store, then the namespace path (empty at the root), type and id
    assert ":vm-100:" not in started["upid"] and "verify_group:backup\\x3a-vm-100:" in started["upid"]
    assert task["id"] == "backup:/vm/100"
    parsed = proxmox_client.parse_upid(
        "UPID:pbs:000003E8:0000A1B2:00000012:6745B3C1:syncjob:remote\\x2dstore\\x3aa-b:root@pam!x:", "pbs")
    assert parsed["id"] == "remote-store:a/b" and parsed["user"] == "root@pam!x"


@pytest.mark.parametrize("upid, product", [
    ("UPID::000A1B2C:0000ABCD:6745B3C1:qmstart:100:root@pam:", "pve"),  # no node
    ("UPID:pve1:000A1B2C:0000ABCD:6745B3C1:qm start:100:root@pam:", "pve"),  # a space in the type
    ("UPID:pve1:000A1B2C:0000ABCD:6745B3C1:qmstart:100:root@pam", "pve"),  # no trailing colon
    ("UPID:pve1:0A1B2C:0000ABCD:6745B3C1:qmstart:100:root@pam:", "pve"),  # short pid
    ("UPID:pve1:000A1B2C:0000ABCD:6745B3C1:qmstart:1/0:root@pam:", "pve"),  # '/' in the id
    ("UPID:-pbs:000003E8:0000A1B2:00000012:6745B3C1:verify:store:root@pam:", "pbs"),  # bad node
    ("UPID:pbs:000003E8:0000A1B2:00000012:6745B3C1:ver ify:store:root@pam:", "pbs"),
    ("UPID:pbs:000003E8:0000A1B2:012:6745B3C1:verify:store:root@pam:", "pbs"),  # short counter
])
def test_malformed_upids_are_refused(upid, product):
    with pytest.raises(ProxmoxError, match="not a"):
        proxmox_client.parse_upid(upid, product)


def test_a_still_running_pbs_write_names_get_task(sim, lab, tmp_path):
    lab.task_seconds = 30
    with tools_on(sim, tmp_path, pbs_token="root@pam!admin", PROXMOX_ACCESS="lifecycle"):
        outcome = pbs_tools.write_pbs_run_gc("backup", wait_seconds=1)
    assert outcome["task"] == "still_running" and "get_task" in outcome["next"] and "status" not in outcome


# ---------------------------------------------------------------- 6, 16: backup coverage

def coverage_rows(report: dict) -> dict[int, dict]:
    return {r["vmid"]: r for r in rows(report["guests"])}


def only_pbs_backups(lab: simulator.Lab, namespace: str) -> None:
    """This cluster backs up to namespace `namespace`; another cluster's guests, numbered alike,
    sit in namespace `office` of the same datastore (103 included, which this cluster never backed up)."""
    lab.volumes["local"] = [v for v in lab.volumes["local"] if v["content"] != "backup"]
    groups = lab.datastores["backup"]["groups"]
    ours = {(kind, item): snaps for (ns, kind, item), snaps in groups.items() if ns == ""}
    groups.clear()
    now = int(time.time())
    for (kind, item), snaps in ours.items():
        groups[(namespace, kind, item)] = snaps
    for kind, item in [("vm", "100"), ("ct", "103"), ("vm", "777")]:
        groups[("office", kind, item)] = [lab.pbs_snapshot(now - 3600)]
    lab.datastores["backup"]["namespaces"] = {"": "", namespace: "", "office": "the office cluster"}
    lab.storages["pbs"]["config"]["namespace"] = namespace


def test_coverage_reads_the_namespace_the_storage_writes_to(sim, lab, tmp_path):
    only_pbs_backups(lab, "homelab")
    # the README's backup grant, so that `local` is seen to hold none (the reader alone: unknown, not missing)
    with tools_on(sim, tmp_path, pve_token="mcp@pve!backups"):
        report = workflows.backup_coverage()
    guests = coverage_rows(report)
    assert {vmid for vmid, r in guests.items() if r["state"] == "ok"} == {100, 101, 102, 105}
    assert guests[100]["where"] == "pbs:backup/homelab"
    assert guests[103]["state"] == "missing"  # the office's ct/103 is another guest
    assert report["orphan_pbs_groups"] == []  # the office's groups are not ours to call orphans


def test_coverage_reads_a_pbs_storage_of_another_server_through_pve(sim, lab, tmp_path):
    only_pbs_backups(lab, "homelab")
    lab.storages["pbs"]["config"]["server"] = "pbs.elsewhere.example"
    # the reader with the README's backup grant: PVE lists a backup only to a caller who could make one
    with tools_on(sim, tmp_path, pve_token="mcp@pve!backups"):
        before = len(lab.requests)
        report = workflows.backup_coverage()
    guests = coverage_rows(report)
    assert {vmid for vmid, r in guests.items() if r["state"] == "ok"} == {100, 101, 102, 105}
    assert guests[100]["where"] == "pbs" and guests[103]["state"] == "missing"
    assert not [p for product, _, p in lab.requests[before:] if product == "pbs" and "snapshots" in p]


def test_coverage_without_the_jobs_does_not_say_no_job_covers_it(sim, lab, tmp_path):
    lab.fail.append((r"^/cluster/backup$", 403, "Permission check failed (/, Sys.Audit)"))
    with tools_on(sim, tmp_path, pve_token="mcp@pve!backups"):  # sees `local` (the reader alone: unknown)
        report = workflows.backup_coverage()
    missing = [f["finding"] for f in report["findings"] if "guest 103" in f["finding"]]
    assert missing and "no job covers it" not in missing[0] and "jobs could not be read" in missing[0]
    assert any(u["section"] == "backup jobs" for u in report["unavailable"])


def test_coverage_honours_job_node_and_exclude_only_with_all(sim, lab, tmp_path):
    lab.backup_jobs = [
        {"id": "pve2-all", "type": "vzdump", "schedule": "02:00", "enabled": 1, "all": 1, "node": "pve2",
         "storage": "pbs"},
        {"id": "listed", "type": "vzdump", "schedule": "03:00", "enabled": 1, "vmid": "103,105", "exclude": "103",
         "storage": "pbs"}]
    with tools_on(sim, tmp_path):
        guests = coverage_rows(workflows.backup_coverage())
    assert guests[101]["jobs"] == "pve2-all" and guests[104]["jobs"] == "pve2-all"  # the guests on pve2
    assert guests[100]["jobs"] == ""  # on pve1: not in a job limited to pve2
    assert guests[103]["jobs"] == "listed" and guests[103]["excluded_by"] == ""  # exclude needs all=1


# ---------------------------------------------------------------- 7, 14, 15: privileges as the version has them

AGENT_OPS = "ops@pve!agent"


def with_agent_token(lab: simulator.Lab) -> None:
    """A token of ops@pve that may use the guest agent: PVEVMAdmin on the user and on the token."""
    user = simulator.Token("", [("/", "PVEVMAdmin", True), ("/", "PVEAuditor", True)])
    lab.pve_tokens[AGENT_OPS] = simulator.Token("77777777-6666-5555-4444-333333333333",
                                                [("/", "PVEVMAdmin", True), ("/", "PVEAuditor", True)], owner=user)




@pytest.mark.parametrize("pve_major", [8, 9])
def test_exec_is_offered_on_both_versions(pve_major, tmp_path):
    lab = simulator.Lab.homelab(pve_major=pve_major)
    with_agent_token(lab)
    with simulator.Simulator(lab) as sim, tools_on(sim, tmp_path, pve_token=AGENT_OPS,
                                                    PROXMOX_ALLOW_EXEC="true"):
        import server
        import visibility
        client = proxmox_client.pve_client()
        client.ensure_permissions()
        visible = visibility.ToolVisibility()
        visible.specs = [spec for spec in server.TOOLS if spec.function.__name__ == "write_exec_guest"]
        assert visible.hidden() == {}
        info = pve_tools.guest_agent_info(100)
    assert info["hostname"] == "web"


def test_agent_refusal_names_the_privilege_the_version_has(tmp_path):
    lab = simulator.Lab.homelab(pve_major=8)
    with simulator.Simulator(lab) as sim, tools_on(sim, tmp_path):
        before = len(lab.requests)
        with pytest.raises(PolicyError) as refused:
            pve_tools.guest_agent_info(100)
        sent = [p for _, _, p in lab.requests[before:] if "/agent/" in p]
    text = str(refused.value)
    assert "VM.Monitor" in text and "VM.GuestAgent" not in text and "--roles PVEVMAdmin" in text
    assert sent == []  # refused before sending


def test_a_token_holds_only_what_its_user_holds_too(sim, lab, tmp_path):
    lab.pve_tokens["mcp@pve!reader"].owner.acl.clear()  # the token keeps PVEAuditor, its user has nothing
    lab.pbs_tokens["mcp@pbs!reader"].owner.acl.clear()
    with tools_on(sim, tmp_path):
        guests = pve_tools.list_guests()
        stores = pbs_tools.pbs_list_datastores()
        assert privileges.permissions_of(proxmox_client.pve_client().host) == {}
    assert guests["rows"] == [] and "user" in guests["note"]
    assert stores["rows"] == []


def test_grant_hints_grant_the_user_and_the_token():
    from types import SimpleNamespace
    pve = SimpleNamespace(product="pve", label="p", token_id="mcp@pve!mcp")
    pbs = SimpleNamespace(product="pbs", label="b", token_id="mcp@pbs!mcp")
    hint = privileges.grant_hint(pve, "VM.Audit", "/vms/100")
    assert "pveum acl modify /vms/100 --users 'mcp@pve' --roles PVEAuditor" in hint
    assert "pveum acl modify /vms/100 --tokens 'mcp@pve!mcp' --roles PVEAuditor" in hint
    hint = privileges.grant_hint(pbs, "Datastore.Audit|Datastore.Backup", "/datastore/backup")
    assert "proxmox-backup-manager acl update /datastore/backup DatastoreAudit --auth-id 'mcp@pbs'" in hint
    assert "proxmox-backup-manager acl update /datastore/backup DatastoreAudit --auth-id 'mcp@pbs!mcp'" in hint
    assert "--tokens" not in privileges.grant_hint(SimpleNamespace(product="pve", label="u", token_id="ops@pve"),
                                               "VM.Audit", "/")  # a password login has no token


# ---------------------------------------------------------------- 18: locks, RRD, agent errors, file writes

def test_persistent_locks_are_not_tasks(sim, lab, tmp_path):
    lab.guests[100]["lock"] = "suspended"  # hibernated: no task holds it, a start resumes it
    lab.guests[101]["lock"] = "snapshot-delete"
    with tools_on(sim, tmp_path, pve_token="root@pam!admin", PROXMOX_ACCESS="write"):
        report = health.health_check()
        with pytest.raises(ToolFailure) as refused:
            pve_tools.write_configure_guest(101, set={"description": "x"})
        locks = {f["evidence"]["vmid"]: f for f in report["findings"] if f["area"] == "locks"}
    assert "hibernated" in locks[100]["next"] and "list_tasks" not in locks[100]["next"]
    assert "(snapshot-delete)" in locks[101]["finding"] and "snapshot-delete" in locks[101]["next"]
    assert "snapshot-delete" in str(refused.value) and "qm unlock 101" in str(refused.value)


def test_rrd_network_rates_are_bytes_per_second(sim, tmp_path):
    with tools_on(sim, tmp_path):
        rrd = pve_tools.node_status("pve1", timeframe="hour")["rrd"]
        points = proxmox_client.pve_client().get("/nodes/pve1/rrddata", timeframe="hour", cf="AVERAGE")
    mean = sum(p["netin"] for p in points) / len(points)  # DERIVE: bytes per second already, never times 8
    assert rrd["net_in"] == f"{human_bytes(mean)}/s" and "net_in_bps" not in rrd


def test_agent_errors_without_description_are_not_results(sim, lab, tmp_path):
    lab.guests[100]["agent_errors"] = {"network-get-interfaces": {"class": "CommandDisabled"}}
    with tools_on(sim, tmp_path):
        info = pve_tools.guest_agent_info(100)
        client = proxmox_client.pve_client()
        address = provisioning._wait_for_address(client, "/nodes/pve1/qemu/100", "qemu", 1)
    assert info["hostname"] == "web" and info["interfaces"] == []
    assert "CommandDisabled" in info["agent_errors"]["network-get-interfaces"]
    assert address is None


def test_vm_file_write_advertises_the_agent_limit(sim, lab, tmp_path):
    import inspect

    import shell_tools
    from pydantic import TypeAdapter
    schema = TypeAdapter(inspect.signature(shell_tools.write_guest_file)
                         .parameters["content"].annotation).json_schema()
    text = next(s for s in schema["anyOf"] if s.get("type") == "string")  # content is optional: absent reads
    assert text["maxLength"] == 46080  # 61,440 base64 characters (the schema's cap) hold 46,080 bytes
    confirmed = policy.CALL.set(calls.Call(confirm=lambda *_: None))
    try:
        with tools_on(sim, tmp_path, pve_token="root@pam!admin", PROXMOX_ALLOW_EXEC="true"):
            written = shell_tools.write_guest_file(100, "/tmp/big", "x" * 46080)
            before = len(lab.requests)
            with pytest.raises(ToolFailure, match="46080 bytes"):
                shell_tools.write_guest_file(100, "/tmp/wide", "é" * 30000)  # 60,000 bytes
            sent = lab.requests[before:]
    finally:
        policy.CALL.reset(confirmed)
    assert written["bytes"] == 46080 and lab.guests[100]["files"]["/tmp/big"] == "x" * 46080
    assert not [r for r in sent if r[1] == "POST"]


def test_default_paths_do_not_stop_the_privilege_precheck(sim, lab, tmp_path):
    with tools_on(sim, tmp_path, PROXMOX_ACCESS="lifecycle"):
        client = proxmox_client.pve_client()
        client.ensure_permissions()
        listed = privileges.permissions_of(client.host)
        before = len(lab.requests)
        with pytest.raises(PolicyError, match="lacks VM.PowerMgmt on /vms/100"):
            pve_tools.write_power_guest(100, "shutdown")
        sent = [r for r in lab.requests[before:] if r[1] != "GET"]
    assert {"/", "/access", "/nodes", "/pool", "/sdn", "/storage", "/vms", "/vms/100", "/vms/101"} <= set(listed)
    assert listed["/vms/100"]["VM.Audit"] == 1 and sent == []  # /vms/100: a member of pool prod


# ---------------------------------------------------------------- issue 21: PBS releases and job states

# 3.1 has no GC job list, 3.2 no sync-direction (push sync jobs came with 3.3), 3.4 both; 4.1 is current
PBS_RELEASES = {"3.1": (3, 1, 5), "3.2": (3, 2, 7), "3.4": (3, 4, 2), "4.1": (4, 1, 11)}


@pytest.mark.parametrize("release", PBS_RELEASES.values(), ids=PBS_RELEASES.keys())
def test_pbs_tools_work_on_every_release(release, tmp_path):
    lab = simulator.pbs.as_release(simulator.Lab.homelab(), release)
    # running a job needs more than the README's reader token (Datastore.Backup, Remote.Read): the admin's
    with simulator.Simulator(lab) as sim, tools_on(sim, tmp_path, pbs_token="root@pam!admin",
                                                    PROXMOX_ACCESS="lifecycle"):
        stores = pbs_tools.pbs_list_datastores()
        status = pbs_tools.pbs_list_datastores(store="backup")
        listed = pbs_tools.pbs_list_jobs()
        ran = pbs_tools.write_pbs_run_job("sync", "s-backup", wait_seconds=10)
        report = health.health_check()
    assert lab.schema_rejections == [], lab.schema_rejections
    jobs = {(r["kind"], r["id"]) for r in rows(listed)}
    assert {("sync", "s-backup"), ("verify", "v-backup"), ("prune", "p-backup")} <= jobs
    assert (("sync", "push-backup") in jobs) == (release >= (3, 2, 11))
    assert (("gc", "backup") in jobs) == (release >= (3, 2, 0)) == ("note" not in listed) == ("note" not in stores)
    assert rows(stores)[0]["last_gc"] and (status["gc"].get("last_run") or status["gc"].get("last_started"))
    assert ran["task"] == "OK"
    assert not [u for u in report["unavailable"] if u["section"].startswith("pbs")], report["unavailable"]
    assert not [f for f in findings(report, "pbs") if "garbage" in f], report["findings"]


def test_a_running_job_is_running_not_never_run(sim, lab, tmp_path):
    lab.task_seconds = 30
    with tools_on(sim, tmp_path, pbs_token="root@pam!admin", PROXMOX_ACCESS="lifecycle"):
        pbs_tools.write_pbs_run_job("verify", "v-backup", wait_seconds=0)
        pbs_tools.write_pbs_run_gc("backup", wait_seconds=0)
        jobs = {(r["kind"], r["id"]): r for r in rows(pbs_tools.pbs_list_jobs())}
        stores = rows(pbs_tools.pbs_list_datastores())
        report = health.health_check()
    assert jobs[("verify", "v-backup")]["result"] == "running" and jobs[("gc", "backup")]["result"] == "running"
    assert stores[0]["gc_result"] == "running"
    assert not [f for f in findings(report, "pbs") if "never" in f or "v-backup" in f or "garbage" in f]


def test_failed_sync_and_prune_jobs_are_reported_with_their_run(sim, lab, tmp_path):
    failed = lab.start_task("pbs", "prunejob", "backup", exitstatus="prune failed - datastore is locked",
                            finished=True, product="pbs")
    lab.pbs_jobs["prune"][0] |= {"last-run-state": "prune failed - datastore is locked", "last-run-upid": failed}
    with tools_on(sim, tmp_path):
        found = {f["finding"]: f for f in health.health_check()["findings"] if f["area"] == "pbs"}
    sync = found["sync job s-backup failed: sync failed - remote unreachable"]
    prune = found["prune job p-backup failed: prune failed - datastore is locked"]
    assert "write_pbs_run_job kind=sync job_id=s-backup" in sync["next"] and sync["evidence"]["ended"]
    assert prune["evidence"]["upid"] == failed and "get_task" in prune["next"]


def test_job_tasks_carry_the_worker_ids_pbs_gives_them(sim, lab, tmp_path):
    confirmed = policy.CALL.set(calls.Call(confirm=lambda *_: None))  # a prune job is destructive
    try:
        with tools_on(sim, tmp_path, pbs_token="root@pam!admin", PROXMOX_ACCESS="destructive"):
            ids = {kind: pve_tools.get_task(pbs_tools.write_pbs_run_job(kind, job, wait_seconds=5)["upid"])["id"]
                   for kind, job in (("sync", "s-backup"), ("verify", "v-backup"), ("prune", "p-backup"))}
    finally:
        policy.CALL.reset(confirmed)
    # sync: remote, remote store, store, namespace, job; verify: store and job; prune: the store (and namespace)
    assert ids == {"sync": "office:backup:backup::s-backup", "verify": "backup:v-backup", "prune": "backup"}


def test_a_full_date_in_the_past_or_zero_is_no_date(sim, lab, tmp_path):
    lab.datastores["backup"] |= {"used": 3500 * simulator.GiB, "growth": -2 * simulator.GiB}  # 87.5 %, shrinking
    lab.add_datastore("flat", total=100 * simulator.GiB, used=10 * simulator.GiB)
    lab.datastores["flat"]["growth"] = 0
    with tools_on(sim, tmp_path):
        stores = {r["store"]: r for r in rows(pbs_tools.pbs_list_datastores())}
        report = health.health_check()
    assert stores["backup"]["full_by"] == "" and stores["flat"]["full_by"] == ""
    full = next(f for f in report["findings"] if f["finding"] == "datastore backup is 87.5% full")
    assert "full_by" not in full["evidence"]


@pytest.mark.parametrize("release", [(4, 0, 22), (4, 1, 11)], ids=["4.0, from the config", "4.1, backend-type"])
def test_s3_datastores_figures_are_their_cache(release, tmp_path):
    lab = simulator.pbs.as_release(simulator.Lab.homelab(), release)
    lab.add_datastore("cloud", total=128 * simulator.GiB, used=122 * simulator.GiB)  # the local cache is 95 % full
    lab.datastores["cloud"]["backend"] = "s3"
    with simulator.Simulator(lab) as sim, tools_on(sim, tmp_path):
        stores = pbs_tools.pbs_list_datastores()
        status = pbs_tools.pbs_list_datastores(store="cloud")
        report = health.health_check()
    assert lab.schema_rejections == []
    cloud = {r["store"]: r for r in rows(stores)}["cloud"]
    assert cloud["backend"] == "s3" and cloud["full_by"] == "" and "local cache" in stores["note"]
    assert status["backend"] == "s3" and "local cache" in status["note"]
    pbs = {f["finding"]: f["severity"] for f in report["findings"] if f["area"] == "pbs"}
    assert pbs.get("the local cache of S3 datastore cloud is 95.3% full") == "info"
    assert "datastore cloud is 95.3% full" not in pbs


def test_coverage_says_unknown_where_pbs_could_not_be_read(sim, lab, tmp_path):
    only_pbs_backups(lab, "homelab")
    lab.fail.append((r"^/admin/datastore/backup/snapshots$", 500, "unable to open chunk store"))
    with tools_on(sim, tmp_path):
        report = workflows.backup_coverage()
    guests = coverage_rows(report)
    assert {r["state"] for r in guests.values()} == {"unknown"}  # never "missing" for backups it could not see
    assert any(u["section"] == "pbs:backup/homelab" and "chunk store" in u["reason"] for u in report["unavailable"])
    assert not [f for f in report["findings"] if "missing" in f["finding"]]


def test_coverage_knows_a_namespace_listing_without_audit_is_partial(sim, lab, tmp_path):
    only_pbs_backups(lab, "homelab")
    # the namespace's own ACL gives this token DatastoreBackup only: PBS then lists just the groups it owns
    acl = [("/", "Audit", True), ("/datastore/backup/homelab", "DatastoreBackup", True)]
    lab.pbs_tokens["mcp@pbs!ns"] = simulator.Token("pbs-ns-secret-0123456789", acl, owner=simulator.Token("", acl))
    with tools_on(sim, tmp_path, pbs_token="mcp@pbs!ns"):
        report = workflows.backup_coverage()
    assert {r["state"] for r in coverage_rows(report).values()} == {"unknown"}
    partial = next(u for u in report["unavailable"] if u["section"] == "pbs:backup/homelab")
    assert "Datastore.Audit on /datastore/backup/homelab" in partial["reason"] and "DatastoreAudit" in partial["reason"]


def test_failed_task_lists_are_not_cut_short_by_warnings(sim, lab, tmp_path):
    for _ in range(60):  # newer than the lab's failed backup, and no failures: warnings are a success
        lab.start_task("pve1", "vzdump", "100", exitstatus="WARNINGS: 1", duration=0)
    with tools_on(sim, tmp_path):
        on_node = rows(pve_tools.list_tasks(node="pve1", errors=True, limit=5))
        everywhere = rows(pve_tools.list_tasks(errors=True, limit=5))
    assert [r["status"] for r in on_node] == ["job errors"] == [r["status"] for r in everywhere]
