"""health_check: what needs attention on a cluster and its Backup Server, read across nodes, guests,
storage, certificates, disks, services and PBS jobs in one call. A section that cannot be read is
listed under `unavailable` with the reason and never counts as healthy; thresholds are arguments
and are echoed in the answer (findings.py: the report).
"""
import re
import time
from dataclasses import dataclass, field
from typing import Annotated, Callable

from pydantic import Field

import pbs_state
import policy
import privileges
import proxmox_client
from answers import Host, compact, human_bytes, iso_time, percent
from errors import InvalidArgument, ToolFailure
from fanout import in_parallel
from findings import Report
from inventory import (HA_FAILED, SMART_OFF, cluster_resources, disk_problem, ha_failure, kernels, pbs_of,
                       pending_updates, pool_problem,
                       wearout_left)
from proxmox_client import ProxmoxClient, pve_client


# name: (default, lowest, highest)
HEALTH_THRESHOLDS = {"storage_warn_pct": (80, 1, 100), "storage_crit_pct": (90, 1, 100),
                     "node_mem_warn_pct": (90, 1, 100), "node_cpu_warn_pct": (90, 1, 100),
                     "failed_task_hours": (24, 1, 720), "cert_warn_days": (30, 1, 365),
                     "gc_max_days": (7, 1, 365), "verify_max_days": (30, 1, 365)}


def health_thresholds(overrides: dict[str, int] | None) -> dict[str, int]:
    """The defaults with the caller's overrides; an unknown name or a value out of range is refused."""
    chosen = {name: default for name, (default, _, _) in HEALTH_THRESHOLDS.items()}
    for name, value in (overrides or {}).items():
        if name not in HEALTH_THRESHOLDS:
            raise InvalidArgument(f"thresholds: unknown '{name}'. Known: " +
                                  ", ".join(f"{n} (default {d})" for n, (d, _, _) in HEALTH_THRESHOLDS.items()) + ".")
        low, high = HEALTH_THRESHOLDS[name][1:]
        if not low <= value <= high:
            raise InvalidArgument(f"thresholds: {name} must be from {low} to {high}, not {value}.")
        chosen[name] = value
    return chosen


@dataclass
class Health:
    """What the health checks share: the report, the thresholds, and the reads several use."""
    client: ProxmoxClient
    report: Report
    limits: dict[str, int]
    pbs_host: str | None
    resources: list[dict] = field(default_factory=list)
    status: list[dict] = field(default_factory=list)  # /cluster/status
    tasks: list[dict] = field(default_factory=list)  # /cluster/tasks
    online: list[str] = field(default_factory=list)  # nodes, filled by _node_load
    smart: bool = True  # read the disks (SMART: smartctl wakes a disk asleep); the dashboard does not


def _cluster_reads(h: Health) -> None:
    """The cluster's own reads, side by side: its status, the inventory, the tasks."""
    h.status, h.resources, h.tasks = [r or [] for r in h.report.sections([
        ("quorum", lambda: h.client.get("/cluster/status")), ("resources", lambda: cluster_resources(h.client)),
        ("tasks", lambda: h.client.get("/cluster/tasks"))])]


def _quorum(h: Health) -> None:
    status = h.status
    cluster = next((e for e in status if e.get("type") == "cluster"), None)
    if cluster and not cluster.get("quorate"):
        h.report.add("critical", "quorum", "the cluster has lost quorum", cluster,
                     "bring nodes back; writes are blocked")
    for node in (e for e in status if e.get("type") == "node" and not e.get("online")):
        h.report.add("critical", "nodes", f"node {node['name']} is offline", node, "check its power and network")


def _node_load(h: Health) -> None:
    blind = []
    for node in (r for r in h.resources if r.get("type") == "node"):
        if node.get("status") != "online":
            continue
        h.online.append(node["node"])
        if node.get("maxmem") is None:  # no figures without Sys.Audit (docs/PROXMOX-BEHAVIOUR.md#cluster-resources)
            blind.append(node["node"])
        load = percent(node.get("cpu"), 1)
        if load is not None and load >= h.limits["node_cpu_warn_pct"]:
            h.report.add("warning", "cpu", f"node {node['node']} runs at {load}% CPU",
                         {"cpu_pct": load, "cpus": node.get("maxcpu")},
                         "find the busy guests (list_guests) and spread them")
        used = percent(node.get("mem"), node.get("maxmem"))
        if used is not None and used >= h.limits["node_mem_warn_pct"]:
            h.report.add("warning", "memory", f"node {node['node']} uses {used}% of its memory",
                         {"mem": human_bytes(node.get("mem")), "maxmem": human_bytes(node.get("maxmem"))},
                         "migrate or stop guests, or add memory")
    if blind:
        h.report.unavailable.append({"section": "node load", "reason": f"no CPU or memory figures for "
                                     f"{', '.join(blind)}: the token lacks Sys.Audit on /nodes"})


def _storage_fill(h: Health) -> None:
    # a storage without usage is `unknown`, not healthy (docs/PROXMOX-BEHAVIOUR.md#cluster-resources)
    for storage in (r for r in h.resources if r.get("type") == "storage" and r.get("node") in h.online
                    and r.get("status") != "available"):
        h.report.unavailable.append({"section": f"storage {storage['storage']} on {storage['node']}",
                                     "reason": f"status {storage.get('status')}: the node reports no usage "
                                               f"(storage offline, disabled or not mounted)"})
    # a shared storage has a row per node but one disk: one finding (docs/PROXMOX-BEHAVIOUR.md#cluster-resources)
    rows = {(r["storage"], "" if r.get("shared") else r["node"]): r for r in h.resources
            if r.get("type") == "storage" and r.get("maxdisk")}
    for (name, node), storage in sorted(rows.items()):
        used = percent(storage.get("disk"), storage.get("maxdisk"))
        if used >= h.limits["storage_warn_pct"]:
            severity = "critical" if used >= h.limits["storage_crit_pct"] else "warning"
            where = f"{name} on {node}" if node else f"{name} (shared)"
            h.report.add(severity, "storage", f"{where} is {used}% full",
                         {"used": human_bytes(storage.get("disk")), "total": human_bytes(storage.get("maxdisk"))},
                         "prune backups (list_backups), delete unused volumes or grow the storage",
                         kind="storages filling up", subject=where)


def _guest_states(h: Health) -> None:
    for guest in (r for r in h.resources if r.get("type") in ("qemu", "lxc")):
        if guest.get("lock"):
            h.report.add("warning", "locks", f"guest {guest['vmid']} ({guest.get('name')}) is locked ({guest['lock']})",
                         {"vmid": guest["vmid"], "lock": guest["lock"]},
                         proxmox_client.lock_advice(guest["lock"], guest["vmid"], guest.get("type", "qemu")),
                         kind=f"guests locked ({guest['lock']})", subject=guest["vmid"])
        if guest.get("hastate") in HA_FAILED:  # docs/PROXMOX-BEHAVIOUR.md#ha-managed-guests
            what, way_out = ha_failure(guest).split(": ", 1)
            h.report.add("critical", "ha", what, {"vmid": guest["vmid"], "node": guest.get("node")}, way_out,
                         kind=f"HA resources in state {guest['hastate']}", subject=guest["vmid"])


def _failed_tasks(h: Health) -> None:
    since = time.time() - h.limits["failed_task_hours"] * 3600
    for task in h.tasks:
        # running rows have no status (docs/PROXMOX-BEHAVIOUR.md#pve-tasks); warnings are a success
        if task.get("starttime", 0) >= since \
                and proxmox_client.task_outcome(task.get("status")) in ("failed", "unknown"):
            h.report.add("warning", "tasks", f"{task.get('type')} {task.get('id') or ''} on {task.get('node')} failed",
                         {"upid": task["upid"], "status": task.get("status"), "start": iso_time(task.get("starttime"))},
                         "read it with get_task start=0", kind="failed tasks")


def _replication(h: Health, node: str, jobs: list[dict]) -> None:
    for job in jobs:
        if job.get("error") or job.get("fail_count"):
            h.report.add("warning", "replication", f"replication {job.get('id')} on {node} is failing",
                         {k: job.get(k) for k in ("id", "target", "error", "fail_count", "last_sync")},
                         "check the target node and storage; run it again from the web UI",
                         kind="replication jobs failing", subject=f"{job.get('id')} on {node}")


# Certificates that renew themselves: pveupdate renews pve-ssl.pem once under 14 days are left and an
# ACME pveproxy-ssl.pem (the node's config sets up ACME) once under 30; it runs daily at 01:00 plus up to 5 h
# (pve-daily-update.timer), so runs can be 29 h apart and a renewal is overdue only after that
# (pve-manager bin/pveupdate, services/pve-daily-update.timer; docs/PROXMOX-BEHAVIOUR.md#node-certificates)
RENEWS_AT = {"pve-ssl.pem": 14, "acme": 30}


CERT_KINDS = {"pve-ssl.pem": "node certificates not renewed", "acme": "ACME certificates not renewed",
              "custom": "custom certificates expiring", "unknown": "certificates expiring"}


BETWEEN_RUNS_DAYS = 29 / 24


PROXY_CERT = "pveproxy-ssl.pem"


RENEW_FAILED = {"pve-ssl.pem": "its automatic renewal failed: run pvecm updatecerts --force on the node",
                "acme": "its ACME renewal failed: run pvenode acme cert renew on the node, and read the node's log "
                        "(node_logs grep='ACME') for why the daily run could not",
                "custom": "a custom certificate is not renewed by Proxmox: upload the new one (pvenode cert set)",
                "unknown": "renew it (ACME: pvenode acme cert renew; a custom one: upload the new one); whether "
                           "ACME renews it could not be read (the node's config needs Sys.Audit on /)"}


def _kind(name: str, acme: bool | None) -> str:
    """How a certificate is renewed: pve-ssl.pem by pveupdate, pveproxy-ssl.pem by ACME when the node's
    config sets it up (else it is a custom one), `unknown` when that config could not be read."""
    if name != PROXY_CERT:
        return name
    return "unknown" if acme is None else "acme" if acme else "custom"


def _certificates(h: Health, node: str, certs: list[dict], acme: bool | None) -> None:
    for cert in certs:
        days = (cert.get("notafter", 0) - time.time()) / 86400
        if days >= h.limits["cert_warn_days"]:
            continue
        name, kind = cert.get("filename"), _kind(str(cert.get("filename")), acme)
        renews_at = RENEWS_AT.get(kind)
        evidence = {"notafter": iso_time(cert.get("notafter"))} | ({"renews_itself_at_days": renews_at}
                                                                   if renews_at else {})
        if renews_at and days >= renews_at - BETWEEN_RUNS_DAYS:
            h.report.add("info", "certificates", f"{name} on {node} expires in {int(days)} days", evidence,
                         f"nothing yet: pveupdate renews it at its next daily run (from {renews_at} days before "
                         f"it expires)", kind="certificates renewing themselves", subject=f"{name} on {node}")
            continue
        h.report.add("critical" if days < 7 else "warning", "certificates",
                     f"{name} on {node} expires in {int(days)} days", evidence,
                     RENEW_FAILED.get(kind, "renew it or replace it"), kind=CERT_KINDS.get(kind, "certificates"),
                     subject=f"{name} on {node}")


def _acme_reads(h: Health, got: dict) -> list[tuple[str, str, str]]:
    """Whether ACME renews a node's pveproxy-ssl.pem is in the node's config, read only where that
    certificate is inside the warning window (`acme` or an `acmedomain<N>` set: pve-manager
    bin/pveupdate, PVE/NodeConfig.pm get_acme_conf): (node, section, path) of those reads."""
    soon = time.time() + h.limits["cert_warn_days"] * 86400
    return [(node, f"config {node}", f"/nodes/{node}/config") for node in h.online
            if any(c.get("filename") == PROXY_CERT and c.get("notafter", 0) < soon
                   for c in got.get((node, "certificates")) or [])]


def _acme(config: dict | None) -> bool | None:
    """Whether a node's config sets up ACME; None where it could not be read."""
    return None if config is None else any(k == "acme" or k.startswith("acmedomain") for k in config)


def _disks(h: Health, node: str, disks: list[dict]) -> None:
    """SMART health that is not PASSED/OK, or an SSD under 20 % of its rated life; SMART turned off is
    said as info (docs/PROXMOX-BEHAVIOUR.md#disks-and-smart)."""
    for disk in disks:
        problem = disk_problem(disk)
        if disk.get("health") == SMART_OFF:
            h.report.add("info", "disks",
                         f"{disk.get('devpath')} on {node}: SMART is off, so its health is not watched",
                         {"model": disk.get("model"), "health": disk.get("health")},
                         f"turn it on: smartctl -s on {disk.get('devpath')} on the node",
                         kind="disks with SMART off", subject=f"{disk.get('devpath')} on {node}")
        if problem:
            failing = problem.startswith("SMART")
            h.report.add("critical" if failing else "warning", "disks", f"{disk.get('devpath')} on {node}: {problem}",
                         {"model": disk.get("model"), "health": disk.get("health"),
                          "life_left_pct": wearout_left(disk), "used": disk.get("used")},
                         "replace the disk soon; node_disks smart=<disk> shows its SMART values" if failing
                         else "plan its replacement; node_disks shows the others",
                         kind="failing disks" if failing else "worn disks", subject=f"{disk.get('devpath')} on {node}")


def _pools(h: Health, node: str, details: list[dict]) -> None:
    """ZFS pools not ONLINE, with data errors, or with device errors (docs/PROXMOX-BEHAVIOUR.md#zfs-pools)."""
    for pool in details:
        problem = pool_problem(pool)
        if problem:
            # a pool that lost data or redundancy is critical; device errors, a cache or spare device down warn
            h.report.add("critical" if problem.startswith(("state", "errors")) else "warning", "zfs",
                         f"pool {pool.get('name')} on {node}: {problem}",
                         {k: pool.get(k) for k in ("state", "errors", "action", "scan") if pool.get(k)},
                         "node_disks shows the devices; replace a faulted one (zpool replace) or clear errors",
                         kind="pools", subject=f"{pool.get('name')} on {node}")


def _updates(h: Health, node: str, versions: list[dict], everything: list[dict] | None) -> None:
    """Pending updates (the whole list with Sys.Modify, Proxmox's packages without) and a newer
    kernel installed than the one running (docs/PROXMOX-BEHAVIOUR.md#pending-updates)."""
    booted = kernels(versions)
    if booted.get("reboot_for_kernel"):
        h.report.add("warning", "updates", f"{node} runs kernel {booted['kernel_running']}, "
                     f"{booted['kernel_newest']} is installed", booted,
                     "reboot the node (migrate its guests first) to run the newest kernel",
                     kind="nodes running an older kernel", subject=node)
    pending, origins = pending_updates(versions, everything)
    if pending:
        h.report.add("info", "updates", f"{len(pending)} package update{'s' * (len(pending) != 1)} pending on {node}",
                     {"by_origin": origins, "packages": [p.get("Package") for p in pending[:5]],
                      "security": "node_updates tells them apart (it reads their changelogs, with Sys.Modify)",
                      "covers": "all packages" if everything is not None else "Proxmox packages and kernels"},
                     "node_updates lists them; apply them (apt full-upgrade) in a quiet hour",
                     kind="nodes with updates pending", subject=node)


NODE_READS = {  # what health_check reads from every online node, side by side
    "replication": "/nodes/{node}/replication", "certificates": "/nodes/{node}/certificates/info",
    "disks": "/nodes/{node}/disks/list", "zfs": "/nodes/{node}/disks/zfs", "updates": "/nodes/{node}/apt/versions"}


def _node_services(h: Health) -> None:
    """Every online node's own reads side by side, as many at once as each node serves; then the ZFS
    pools' details and the configs of nodes with a certificate to renew; then the findings, node by node."""
    reads = [(node, name, path.format(node=node)) for node in h.online for name, path in NODE_READS.items()
             if h.smart or name != "disks"]
    # the whole update list needs Sys.Modify (pve-manager PVE/API2/APT.pm, list_updates): read it only when held
    reads += [(node, "all updates", f"/nodes/{node}/apt/update") for node in h.online
              if privileges.holds(h.client.host, "Sys.Modify", f"/nodes/{node}") is True]
    results = h.report.sections([(f"{name} {node}", lambda p=path: h.client.get(p) or [])
                                 for node, name, path in reads], nodes=[node for node, _, _ in reads])
    got = {(node, name): result for (node, name, _), result in zip(reads, results, strict=True)}
    pools = [(node, pool["name"]) for node in h.online for pool in got.get((node, "zfs")) or [] if pool.get("name")]
    # then, side by side, what those answers name: each pool's status, and the configs for ACME
    after = [(node, f"zfs {name} on {node}", f"/nodes/{node}/disks/zfs/{name}") for node, name in pools]
    after += _acme_reads(h, got)
    answers = h.report.sections([(section, lambda p=path: h.client.get(p) or {}) for _, section, path in after],
                                nodes=[node for node, _, _ in after])
    details, configs = answers[:len(pools)], answers[len(pools):]
    acme = {node: _acme(config) for (node, _, _), config in zip(after[len(pools):], configs, strict=True)}
    for node in h.online:
        _replication(h, node, got.get((node, "replication")) or [])
        _certificates(h, node, got.get((node, "certificates")) or [], acme.get(node))
        _disks(h, node, got.get((node, "disks")) or [])
        _pools(h, node, [d for (n, _), d in zip(pools, details, strict=True) if n == node and d])
        if got.get((node, "updates")) is not None:
            _updates(h, node, got[(node, "updates")], got.get((node, "all updates")))


def _backup_server(h: Health) -> None:
    pbs = h.report.section("pbs host", lambda: pbs_of(h.pbs_host))
    if pbs is None:
        h.report.drop_checked("pbs host")
        return
    now = time.time()
    # the datastores and the jobs side by side; then what the datastores' rows name
    usage, *jobs = h.report.sections([("pbs datastores", lambda: pbs.get("/status/datastore-usage"))] + [
        (f"pbs {kind} jobs", lambda k=kind: pbs_state.jobs_of(pbs, k)) for kind in pbs_state.JOB_KINDS])
    usage = usage or []
    # GC times and results are the GC jobs' (docs/PROXMOX-BEHAVIOUR.md#garbage-collection)
    runs, s3 = h.report.sections([("pbs garbage collection", lambda: pbs_state.gc_runs(pbs, usage)),
                                  ("pbs datastore backends", lambda: pbs_state.s3_stores(pbs, usage))]) \
        if usage else (({}, None), set())
    for ds in usage:
        _datastore_health(h, ds, runs[0] if runs else None, now, ds["store"] in (s3 or set()))
    for kind, kind_jobs in zip(pbs_state.JOB_KINDS, jobs, strict=True):
        for job in kind_jobs or []:
            _pbs_job_health(h, kind, job, now)


def _pbs_job_health(h: Health, kind: str, job: dict, now: float) -> None:
    """A sync, verify or prune job whose last run failed, with that run's evidence; a verify job that has
    not run for too long. A job that is running now has no last result yet (docs/PROXMOX-BEHAVIOUR.md#pbs-jobs)."""
    result = pbs_state.job_result(job)
    ended = iso_time(job.get("last-run-endtime"))
    if result == "running":
        return
    if proxmox_client.task_outcome(result) in ("failed", "unknown"):
        h.report.add("warning", "pbs", f"{kind} job {job['id']} failed: {result}",
                     compact({"job": job["id"], "store": job.get("store"), "ended": ended, "result": result,
                              "upid": job.get("last-run-upid")}),
                     f"read its log (get_task with the upid), fix the cause, then write_pbs_run_job kind={kind} "
                     f"job_id={job['id']}", kind=f"{kind} jobs failed", subject=job["id"])
    elif kind == "verify" and now - (job.get("last-run-endtime") or 0) > h.limits["verify_max_days"] * 86400:
        h.report.add("warning", "pbs", f"verify job {job['id']} last ran {ended or 'never'}",
                     compact({"job": job["id"], "store": job.get("store"), "ended": ended,
                              "schedule": job.get("schedule")}), "write_pbs_run_job kind=verify",
                     kind="verify jobs overdue", subject=job["id"])


def _datastore_fill(h: Health, ds: dict, s3: bool) -> None:
    """A store filling up; an S3 store's figures are its local cache's, which says nothing about the
    bucket (docs/PROXMOX-BEHAVIOUR.md#s3-datastores); an estimate in the past or 0 is no date."""
    used = percent(ds.get("used"), ds.get("total")) or 0
    if used < h.limits["storage_warn_pct"]:
        return
    if s3:
        h.report.add("info", "pbs", f"the local cache of S3 datastore {ds['store']} is {used}% full",
                     {"cache_used": human_bytes(ds.get("used")), "cache_total": human_bytes(ds.get("total"))},
                     "check the cache disk; the bucket's own use is reported by the S3 provider, not PBS",
                     kind="S3 caches filling up", subject=ds["store"])
        return
    h.report.add("critical" if used >= h.limits["storage_crit_pct"] else "warning", "pbs",
                 f"datastore {ds['store']} is {used}% full", compact({"full_by": pbs_state.full_by(ds, set())}),
                 "prune (write_pbs_prune_group) and run GC", kind="datastores filling up", subject=ds["store"])


# Why a datastore cannot be opened, from its status row's `error` (and PBS 4's `mount-status`):
# (pattern, severity, what, next step) (docs/PROXMOX-BEHAVIOUR.md#datastores-and-namespaces)
STORE_ERRORS = [
    (r"is not mounted", "warning", "its removable drive is not mounted",
     "plug in the drive and mount the datastore (its Mount button in the PBS web UI); backups and syncs to it fail "
     "until then"),
    (r"maintenance mode", "warning", "it is in maintenance",
     "end the maintenance when the work is done (the datastore's Options in the PBS web UI); backups to it fail "
     "meanwhile"),
    (r"being deleted", "info", "it is being deleted", "nothing: PBS is removing it"),
    (r"", "critical", "it cannot be opened",
     "check the disk and the mount behind its path on the Backup Server (proxmox-backup-manager datastore show "
     "<store>); backups to it fail"),
]


def _datastore_error(h: Health, ds: dict) -> None:
    """A store PBS cannot open (offline, unmounted, its removable drive missing) is a finding to act on."""
    text = "is not mounted" if ds.get("mount-status") == "notmounted" else str(ds["error"])
    _, severity, what, step = next(e for e in STORE_ERRORS if re.search(e[0], text))
    h.report.add(severity, "pbs", f"datastore {ds['store']}: {what}", {"error": str(ds["error"])[:300]},
                 step.replace("<store>", ds["store"]), kind=f"datastores: {what}", subject=ds["store"])


def _datastore_health(h: Health, ds: dict, runs: dict[str, dict] | None, now: float, s3: bool) -> None:
    if ds.get("error"):
        _datastore_error(h, ds)
        return
    _datastore_fill(h, ds, s3)
    if runs is None:
        return  # the GC jobs could not be read: listed as unavailable
    run = runs.get(ds["store"]) or {}
    result, last_gc = run.get("result"), run.get("ended") or run.get("started") or 0
    if result == "running":
        return
    if proxmox_client.task_outcome(result) in ("failed", "unknown"):
        h.report.add("warning", "pbs", f"garbage collection of {ds['store']} failed: {result}",
                     {"last_gc": iso_time(last_gc), "upid": run.get("upid")},
                     "read its log (get_task), fix the cause, run write_pbs_run_gc",
                     kind="garbage collections failed", subject=ds["store"])
    elif now - last_gc > h.limits["gc_max_days"] * 86400:
        h.report.add("warning", "pbs", f"garbage collection of {ds['store']} last ran {iso_time(last_gc) or 'never'}",
                     compact({"last_gc": iso_time(last_gc), "schedule": run.get("schedule")}),
                     "write_pbs_run_gc, and schedule it", kind="garbage collections overdue", subject=ds["store"])


HEALTH_CHECKS: list[Callable[[Health], None]] = [
    _cluster_reads, _quorum, _node_load, _storage_fill, _guest_states, _failed_tasks, _node_services]


def health_report(client: ProxmoxClient, limits: dict[str, int], pbs_host: str | None, smart: bool) -> Health:
    """The PVE checks and, beside them, the Backup Server's (another host: its findings come after)."""
    health = Health(client, Report(limits), limits, pbs_host, smart=smart)
    backup_server = Health(client, Report(limits), limits, pbs_host, smart=smart)

    def cluster() -> None:
        for check in HEALTH_CHECKS:
            check(health)
    for outcome in in_parallel([cluster, lambda: _backup_server(backup_server)]):
        if isinstance(outcome, ToolFailure):
            raise outcome
    health.report.merge(backup_server.report)
    return health


def health_check(host: Host = None, pbs_host: Host = None,
                 thresholds: Annotated[dict[str, int] | None,
                                       Field(description="named as in the answer")] = None) -> dict:
    """Cluster and PBS findings by severity."""
    smart = policy.current_call().tool not in NO_SMART_IN
    limits = health_thresholds(thresholds)
    health = health_report(pve_client(host), limits, pbs_host, smart)
    return health.report.answer(nodes_online=health.online) | ({} if smart else {"disks": DISKS_NOT_READ})


# Reading a node's disk list runs smartctl on each disk unless skipsmart, which spins up a disk asleep
# (docs/PROXMOX-BEHAVIOUR.md#disks-and-smart): health_check, asked for health, reads it; inside these
# tools, which show its findings each time they open, it reads no disk list.
NO_SMART_IN = ("dashboard",)


DISKS_NOT_READ = ("not read here: reading SMART wakes sleeping disks; health_check and node_disks read disk "
                  "health when asked")
