"""Workflows: the questions operators ask, answered in one call by reading across nodes, guests,
storage, PVE and PBS. A section that cannot be read is listed under `unavailable` with the
reason and never counts as healthy; thresholds are arguments and are echoed in the answer.
Resources and prompts for MCP clients are defined here too.
"""
import json
import re
import time
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable

from mcp.server.mcpserver import Context
from pydantic import Field

import config_diff
import pbs_state
import pbs_tools
import policy
import proxmox_client
import pve_tools
import runtime
from answers import (LIST_CAP, ConfirmArg, DryRunArg, GuestName, Host, Node, Offset, OptionalVmid, Vmid, Volid, WaitArg,
                     capped, compact, human_bytes, iso_time, more, percent, table)
from errors import InvalidArgument, ProxmoxError, ToolFailure
from inventory import (HA_FAILED, SMART_OFF, archive_node, backup_storages, backup_volumes, bridges, bridges_hidden,
                       check_node, cluster_resources, disk_problem, guest_resources, ha_failure, hidden_backups,
                       hidden_note, job_selects, kernels, next_vmid, pbs_backed_storages, pending_updates,
                       pool_problem, resolve_guest, storage_rows, vmid_set, wearout_left)
from fanout import in_parallel
from proxmox_client import ProxmoxClient, pbs_client, poll, pve_client
from tasks import run_task, task_report

SEVERITY = {"critical": 0, "warning": 1, "info": 2}


class Report:
    """Findings with evidence and a next step; sections that could not be read."""

    def __init__(self, thresholds: dict[str, Any]):
        self.findings: list[dict] = []
        self.unavailable: list[dict] = []
        self.checked: list[str] = []
        self.thresholds = thresholds

    def add(self, severity: str, area: str, finding: str, evidence: Any, next_step: str, *,
            kind: str | None = None, subject: Any = None) -> None:
        """One finding. Findings of one `kind` (default: alike in area) fold together past the first
        few; `subject` is what a folded one is listed by (default: its text)."""
        self.findings.append({"severity": severity, "area": area, "finding": finding, "evidence": evidence,
                              "next": next_step, "_kind": kind or f"like these ({area})",
                              "_subject": subject if subject is not None else finding[:60]})

    def section(self, name: str, read: Callable[[], Any]) -> Any:
        """Run one section; a failure is recorded as unavailable, never as healthy."""
        try:
            result = read()
        except ToolFailure as exc:
            result = exc
        return self.record(name, result)

    def sections(self, reads: list[tuple[str, Callable[[], Any]]], nodes: list[str] | None = None) -> list[Any]:
        """Sections that do not depend on each other, read side by side (where `nodes` names the node each
        reads from, within what that node serves at once: fanout.PER_NODE) and recorded in the order given,
        as `section` records one (docs/BENCHMARKS.md#workflows-as-the-cluster-grows)."""
        results = in_parallel([read for _, read in reads], nodes=nodes)
        return [self.record(name, result) for (name, _), result in zip(reads, results, strict=True)]

    def merge(self, other: "Report") -> None:
        """What a part read beside this report (another host's sections), after this report's own."""
        self.findings += other.findings
        self.unavailable += other.unavailable
        self.checked += other.checked

    def record(self, name: str, result: Any) -> Any:
        if isinstance(result, ToolFailure):
            self.unavailable.append({"section": name, "reason": str(result)[:300]})
            return None
        self.checked.append(name)
        return result

    def drop_checked(self, name: str) -> None:
        """A section that found nothing to read (no PBS host configured) was not checked."""
        if name in self.checked:
            self.checked.remove(name)

    def answer(self, **extra: Any) -> dict:
        """Counts first, then the findings worst first; findings of one kind beyond the first few are
        summarised in one that counts them, lists the first ones and names the call that lists them all,
        so that the answer stays small however large the cluster and no finding is dropped
        (docs/BENCHMARKS.md#workflows-as-the-cluster-grows)."""
        findings = sorted(self.findings, key=lambda f: SEVERITY[f["severity"]])
        counts = {s: sum(f["severity"] == s for f in findings) for s in SEVERITY}
        return {"summary": counts | {"unavailable": len(self.unavailable)}, "findings": folded(findings),
                "unavailable": self.unavailable[:LIST_CAP] + more(self.unavailable, {"section": "..."}),
                "checked": self.checked[:LIST_CAP] + more(self.checked, ""), "thresholds": self.thresholds} | extra


FOLD_AFTER = 3  # findings of one kind shown one by one before the rest are summarised

# The call that lists every finding of an area one by one, named in a summary of them.
LISTS_ALL = {"locks": "list_guests status=locked", "ha": "api_read path=/cluster/ha/status/current",
             "tasks": "list_tasks errors=true limit=500", "disks": "node_disks node=<each node named>",
             "zfs": "node_disks node=<each node named>", "storage": "list_storage", "updates": "node_updates",
             "certificates": "api_read path=/nodes/<node>/certificates/info",
             "replication": "api_read path=/nodes/<node>/replication",
             "backups": "backup_coverage (offset pages through every guest)",
             "pbs": "pbs_list_jobs and pbs_list_datastores", "guests": "guest_config vmid=<each vmid named>"}


def _summary(severity: str, area: str, kind: str, group: list[dict]) -> dict:
    """Findings of one kind past the first few, in one: how many, the first LIST_CAP by subject, and
    the call that lists them all."""
    steps = {f["next"] for f in group}
    call = LISTS_ALL.get(area, "the first ones are named; look at each")
    return {"severity": severity, "area": area, "finding": f"{len(group)} more {kind}",
            "evidence": {"count": len(group), "first": [f["_subject"] for f in group[:LIST_CAP]], "all": call},
            "next": steps.pop() if len(steps) == 1 else f"each has its own next step; {call} lists them",
            "_kind": kind}


def folded(findings: list[dict]) -> list[dict]:
    """Findings of one severity, area and kind keep their first FOLD_AFTER; the rest become one
    summary after them. Nothing is dropped: the summary counts them all and names the call that lists them."""
    shown: list[dict] = []
    rest: dict[tuple[str, str, str], list[dict]] = {}
    for finding in findings:
        key = (finding["severity"], finding["area"], finding["_kind"])
        if sum(1 for f in shown if (f["severity"], f["area"], f["_kind"]) == key) < FOLD_AFTER:
            shown.append(finding)
        else:
            rest.setdefault(key, []).append(finding)
    for key, group in rest.items():
        position = max(i for i, f in enumerate(shown) if (f["severity"], f["area"], f["_kind"]) == key)
        shown.insert(position + 1, _summary(*key, group))
    return [{k: v for k, v in f.items() if not k.startswith("_")} for f in shown]


def _pbs(label: str | None) -> ProxmoxClient | None:
    if label is None and len(proxmox_client.configured("pbs")) != 1:
        return None
    return pbs_client(label)


# ---------------------------------------------------------------- health

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
                         "read it with task_log", kind="failed tasks")


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
              if policy.holds(h.client.host, "Sys.Modify", f"/nodes/{node}") is True]
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
    pbs = h.report.section("pbs host", lambda: _pbs(h.pbs_host))
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
                     f"read its log (pbs_get_task with the upid), fix the cause, then write_pbs_run_job kind={kind} "
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
                     "read its log (pbs_get_task), fix the cause, run write_pbs_run_gc",
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
    smart = policy.current_call().get("tool") not in NO_SMART_IN
    limits = health_thresholds(thresholds)
    health = health_report(pve_client(host), limits, pbs_host, smart)
    return health.report.answer(nodes_online=health.online) | ({} if smart else {"disks": DISKS_NOT_READ})


# Reading a node's disk list runs smartctl on each disk unless skipsmart, which spins up a disk asleep
# (docs/PROXMOX-BEHAVIOUR.md#disks-and-smart): health_check, asked for health, reads it; inside these
# tools, which show its findings each time they open, it reads no disk list.
NO_SMART_IN = ("dashboard",)
DISKS_NOT_READ = ("not read here: reading SMART wakes sleeping disks; health_check and node_disks read disk "
                  "health when asked")


# ---------------------------------------------------------------- backups: PVE and PBS against each other

def _jobs_for(guest: dict, jobs: list[dict], unseen_pools: set[str] = frozenset()) -> tuple[list[str], list[str]]:
    """The jobs that back a guest up and those that exclude it; a job selecting a pool this token
    cannot see (no Pool.Audit: /cluster/resources leaves `pool` out) is listed as `<job>?`, unknown."""
    covering, excluding = [], []
    for job in jobs:
        if not job.get("enabled", 1):
            continue
        if job.get("pool") in unseen_pools and (not job.get("node") or job["node"] == guest.get("node")):
            covering.append(f"{job['id']}?")
            continue
        selects, excludes = job_selects(job, guest)
        if selects:
            covering.append(job["id"])
        elif excludes:
            excluding.append(job["id"])
    return covering, excluding


@dataclass
class Coverage:
    """What the coverage steps share: the inventory, the jobs, and the newest backup of each guest."""
    client: ProxmoxClient
    report: Report
    max_age_hours: int
    pbs_host: str | None
    resources: list[dict] = field(default_factory=list)
    jobs: list[dict] | None = None  # None: the backup jobs could not be read
    pbs: ProxmoxClient | None = None
    pbs_targets: set[tuple[str, str]] = field(default_factory=set)  # (datastore, namespace) read on PBS itself
    read_on_pbs: set[str] = field(default_factory=set)  # PVE storages whose backups those are
    newest: dict[int, dict] = field(default_factory=dict)  # vmid -> ctime, where, verify
    pbs_groups: set[tuple[str, int]] = field(default_factory=set)
    unseen: dict[str, list[int]] = field(default_factory=dict)  # where -> guests whose backups were not seen
    hidden: dict[str, list[int]] = field(default_factory=dict)  # those of them hidden from this token
    unseen_pools: set[str] = field(default_factory=set)  # pools that jobs select and this token cannot see
    rows: list[dict] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    job_changes: list[dict] = field(default_factory=list)  # write_edit_backup_job calls that cover the uncovered

    @property
    def guests(self) -> list[dict]:
        return [r for r in self.resources if r.get("type") in ("qemu", "lxc") and not r.get("template")]

    def consider(self, vmid: int, when: int, where: str, verify: str | None) -> None:
        if vmid not in self.newest or when > self.newest[vmid]["ctime"]:
            self.newest[vmid] = {"ctime": when, "where": where, "verify": verify}


def _guests_and_jobs(c: Coverage) -> None:
    """The inventory, the backup jobs and which PVE storages write to the configured Backup Server
    (with its privileges), side by side."""
    c.pbs = c.report.section("pbs host", lambda: _pbs(c.pbs_host))
    reads = [("guests", lambda: cluster_resources(c.client)),
             ("backup jobs", lambda: c.client.get("/cluster/backup") or [])]
    if c.pbs is not None:
        reads.append(("pbs storages", lambda: in_parallel([c.pbs.ensure_permissions,
                                                           lambda: pbs_backed_storages(c.client, c.pbs)])[1]))
    results = c.report.sections(reads)
    c.resources, c.jobs = results[0] or [], results[1]
    # pools whose members this token cannot see: without Pool.Audit the rows carry no `pool`
    # (docs/PROXMOX-BEHAVIOUR.md#cluster-resources)
    c.unseen_pools = {j["pool"] for j in c.jobs or [] if j.get("pool")
                      and policy.holds(c.client.host, "Pool.Audit", f"/pool/{j['pool']}") is False}
    # PBS-backed storages are read on PBS itself, exactly there; the others through PVE
    # (docs/PROXMOX-BEHAVIOUR.md#pbs-backed-volumes)
    targets = results[2] if len(results) > 2 and not isinstance(results[2], ToolFailure) else {}
    c.pbs_targets = set((targets or {}).values())
    c.read_on_pbs = set(targets or {})


def _pve_targets(c: Coverage) -> list[tuple[str, str, str]]:
    """One read per backup storage: a shared one once, a local one on each node (each node's `local`
    is a different disk); PBS-backed storages through PBS itself when it is configured here. A
    storage that hides some guests' backups from this token leaves them unseen
    (docs/PROXMOX-BEHAVIOUR.md#who-sees-which-volume). (where, storage, node) of each read."""
    rows = [r for r in c.resources if r.get("type") == "storage" and r.get("storage") not in c.read_on_pbs]
    vmids = sorted(int(g["vmid"]) for g in c.guests)
    keys = []
    for name, node, shared in backup_storages(c.client, rows):
        hidden = hidden_backups(c.client, name, vmids)
        if hidden:
            c.unseen[name] = c.hidden[name] = hidden
        if len(hidden) < len(vmids):
            keys.append((name if shared else f"{name}@{node}", name, node))
    return keys


def _pbs_targets(c: Coverage) -> list[tuple[str, str, str]]:
    """(where, datastore, namespace) to list on PBS. Without `ns` a snapshot list is the root namespace
    only; without Datastore.Audit there it holds only the token's own groups
    (docs/PROXMOX-BEHAVIOUR.md#datastores-and-namespaces)."""
    pbs = c.pbs
    if pbs is None:
        c.report.drop_checked("pbs host")
        return []
    targets = [(f"pbs:{store}/{ns}" if ns else f"pbs:{store}", store, ns) for store, ns in sorted(c.pbs_targets)]
    for where, store, ns in targets:
        acl_path = f"/datastore/{store}/{ns}" if ns else f"/datastore/{store}"
        if policy.holds(pbs.host, "Datastore.Audit", acl_path) is False:
            c.unseen[where] = sorted(int(g["vmid"]) for g in c.guests)
            c.report.unavailable.append({"section": where, "reason": "partly: the token lacks Datastore.Audit on "
                                         f"{acl_path}, so PBS lists only the groups it owns. "
                                         + policy.grant_hint(pbs.host, "Datastore.Audit", acl_path)})
    return targets


def _backups(c: Coverage) -> None:
    """Every backup storage's listing and every PBS namespace's, side by side; then the newest of each guest."""
    pve, pbs = _pve_targets(c), _pbs_targets(c)
    listings = c.report.sections(
        [(f"storage {key}", lambda n=node, s=name: c.client.get(f"/nodes/{n}/storage/{s}/content", content="backup"))
         for key, name, node in pve] +
        [(where, lambda s=store, n=ns: c.pbs.get(f"/admin/datastore/{s}/snapshots", ns=n or None))
         for where, store, ns in pbs], nodes=[node for _, _, node in pve] + [None] * len(pbs))
    vmids = sorted(int(g["vmid"]) for g in c.guests)
    for (key, _, _), volumes in zip(pve, listings, strict=False):
        if volumes is None:
            c.unseen[key] = vmids
        for volume in volumes or []:
            if volume.get("vmid"):
                c.consider(int(volume["vmid"]), volume.get("ctime") or 0, key,
                           (volume.get("verification") or {}).get("state"))
    for (where, _, _), snapshots in zip(pbs, listings[len(pve):], strict=True):
        if snapshots is None:
            c.unseen[where] = vmids
        for snap in snapshots or []:
            if snap.get("backup-type") in ("vm", "ct") and str(snap.get("backup-id", "")).isdigit():
                vmid = int(snap["backup-id"])
                c.pbs_groups.add((snap["backup-type"], vmid))
                c.consider(vmid, snap["backup-time"], where, (snap.get("verification") or {}).get("state", "none"))


def _guest_rows(c: Coverage) -> None:
    now = time.time()
    for guest in sorted(c.guests, key=lambda g: g["vmid"]):
        c.rows.append(_guest_row(c, guest, now))
    unknown = [r["vmid"] for r in c.rows if r["state"] == "unknown"]
    if unknown:  # said once, with the grant, instead of a finding per guest
        why = hidden_note(c.client, c.hidden, len(c.guests)) if c.hidden else {}
        c.report.add("warning", "backups", f"the backup state of {len(unknown)} guest(s) is unknown: backups on "
                     f"{', '.join(capped(sorted(c.unseen)))} cannot be seen", {"guests": capped(unknown)} | why,
                     "grant the role in `grant` to the user and the token, then run backup_coverage again"
                     if why else "see `unavailable` for why those storages could not be read")


def _coverage_why(covering: list[str], jobs_read: bool) -> str:
    sure = [j for j in covering if not j.endswith("?")]
    if sure:
        return f"covered by {', '.join(sure)}"
    if covering:
        return (f"job(s) {', '.join(j.rstrip('?') for j in covering)} select a pool this token cannot see (it "
                f"lacks Pool.Audit), so whether they cover it is unknown")
    return "no job covers it" if jobs_read else "the backup jobs could not be read"


def _guest_row(c: Coverage, guest: dict, now: float) -> dict:
    """A guest's newest backup against the age limit and its jobs; a finding when it is not ok. A
    guest with no recent backup in sight whose backups some storage hides is unknown, never missing."""
    vmid = int(guest["vmid"])
    covering, excluding = _jobs_for(guest, c.jobs or [], c.unseen_pools)
    last = c.newest.get(vmid)
    age = round((now - last["ctime"]) / 3600, 1) if last else None
    state = "missing" if not last else ("stale" if age > c.max_age_hours else "ok")
    if last and last["verify"] in ("failed",):
        state = "verify_failed"
    if state in ("missing", "stale") and any(vmid in hidden for hidden in c.unseen.values()):
        state = "unknown"
    if state not in ("ok", "unknown"):
        severity = "critical" if state in ("missing", "verify_failed") else "warning"
        why = _coverage_why(covering, c.jobs is not None)
        c.report.add(severity, "backups", f"guest {vmid} ({guest.get('name')}) backup is {state}; {why}",
                     {"newest": iso_time(last["ctime"]) if last else None, "excluded_by": excluding},
                     "write_backup_guest now, and add it to a backup job", kind=f"guests whose backup is {state}",
                     subject=vmid)
    return {"vmid": vmid, "name": guest.get("name"), "newest": iso_time(last["ctime"]) if last else "",
            "age_h": age if age is not None else "", "where": last["where"] if last else "",
            "verify": (last or {}).get("verify") or "", "jobs": ",".join(covering),
            "excluded_by": ",".join(excluding), "state": state}


def _orphan_groups(c: Coverage) -> None:
    known = {int(g["vmid"]) for g in c.guests}
    c.orphans = sorted(f"{kind}/{vmid}" for kind, vmid in c.pbs_groups if vmid not in known)
    for group in c.orphans:
        c.report.add("info", "backups", f"PBS group {group} has no guest any more", {"group": group},
                     "keep it as an archive or prune it (write_pbs_prune_group)", kind="PBS groups without a guest",
                     subject=group)


def _fits(job: dict, guest: dict) -> bool:
    return str(job.get("enabled", 1)) != "0" and job.get("node") in (None, "", guest.get("node"))


def _job_change(c: Coverage, guest: dict, changes: dict[str, dict]) -> None:
    """The one job change that covers a guest: take it out of an all-job's exclude, else add it to a
    vmid job, else a new job (with the schedule and storage the jobs use). Changes of one job merge."""
    vmid, jobs = int(guest["vmid"]), c.jobs or []
    excluding = next((j for j in jobs if _fits(j, guest) and job_selects(j, guest)[1]), None)
    listing = next((j for j in jobs if _fits(j, guest) and j.get("vmid") and not j.get("pool")), None)
    if excluding is not None:
        change = changes.setdefault(excluding["id"], {"write_edit_backup_job": {
            "action": "update", "job_id": excluding["id"], "all_except": sorted(vmid_set(excluding.get("exclude")))},
            "covers": []})
        change["write_edit_backup_job"]["all_except"].remove(vmid)
    elif listing is not None:
        change = changes.setdefault(listing["id"], {"write_edit_backup_job": {
            "action": "update", "job_id": listing["id"], "vmids": sorted(vmid_set(listing["vmid"]))}, "covers": []})
        change["write_edit_backup_job"]["vmids"].append(vmid)
    else:
        model = next((j for j in jobs if j.get("storage")), {})
        storage = model.get("storage") or next((name for name, _, _ in backup_storages(c.client)), None)
        change = changes.setdefault("", {"write_edit_backup_job": {
            "action": "create", "job_id": "backup-uncovered", "vmids": [], "schedule": model.get("schedule") or
            "02:00", "storage": storage}, "covers": []})
        change["write_edit_backup_job"]["vmids"].append(vmid)
    change["covers"].append(vmid)


def _job_changes(c: Coverage) -> None:
    """For the guests no enabled job selects, the write_edit_backup_job arguments that cover them (try them
    with dry_run first); the policy judges each when it is sent. A new job selects every guest but the
    others when that is the shorter list; a list still longer than LIST_CAP is cut, and the change says so."""
    if c.jobs is None:
        return
    changes: dict[str, dict] = {}
    for guest in sorted(c.guests, key=lambda g: int(g["vmid"])):
        if not any(_fits(j, guest) and job_selects(j, guest)[0] for j in c.jobs):
            _job_change(c, guest, changes)
    if "" in changes:
        arguments = changes[""]["write_edit_backup_job"]
        others = sorted(set(int(r["vmid"]) for r in c.resources if r.get("type") in ("qemu", "lxc"))
                        - set(arguments["vmids"]))
        if len(others) < len(arguments["vmids"]):
            arguments["all_except"] = others
            del arguments["vmids"]
    c.job_changes = [_cut(change) for change in changes.values()]


def _cut(change: dict) -> dict:
    """A job change whose lists stay small: a cut argument cannot be sent as it is, and the note says so."""
    arguments = change["write_edit_backup_job"]
    for key in ("vmids", "all_except"):
        if len(arguments.get(key) or []) > LIST_CAP:
            change["note"] = (f"cut: {key} names {len(arguments[key])} guests, too many to show; send the whole "
                              f"list (the job's own guests and those `covers` counts), or select by pool")
            arguments[key] = capped(arguments[key])
    return change | {"covers": capped(change["covers"])}


COVERAGE_STEPS: list[Callable[[Coverage], None]] = [_guests_and_jobs, _backups, _guest_rows, _orphan_groups,
                                                     _job_changes]


COVERAGE_PAGE = 25  # guests per answer, those needing attention first
STATE_RANK = {"missing": 0, "verify_failed": 1, "stale": 2, "ok": 9}  # other states between


def backup_coverage(host: Host = None, pbs_host: Host = None,
                    max_age_hours: Annotated[int, Field(ge=1, le=8760)] = 26, offset: Offset = 0) -> dict:
    """Per guest: newest backup, age, verify, jobs; orphan PBS groups; jobs for the rest."""
    coverage = Coverage(pve_client(host), Report({"max_age_hours": max_age_hours}), max_age_hours, pbs_host)
    for step in COVERAGE_STEPS:
        step(coverage)
    columns = ["vmid", "name", "newest", "age_h", "where", "verify", "jobs", "excluded_by", "state"]
    # counts first, then the guests worst first, a page at a time (docs/BENCHMARKS.md#workflows-as-the-cluster-grows)
    states: dict[str, int] = {}
    for row in coverage.rows:
        states[row["state"]] = states.get(row["state"], 0) + 1
    ranked = sorted(coverage.rows, key=lambda r: (STATE_RANK.get(r["state"], 5), r["vmid"]))
    guests = table(columns, ranked, limit=COVERAGE_PAGE, offset=offset)
    orphans = capped(coverage.orphans)
    return coverage.report.answer(states=states, guests=guests, orphan_pbs_groups=orphans,
                                  job_changes=coverage.job_changes)


# ---------------------------------------------------------------- security

@dataclass
class Security:
    """What the security checks share: the report and the inventory."""
    client: ProxmoxClient
    report: Report
    max_guests: int
    resources: list[dict] = field(default_factory=list)
    users: list[dict] | None = None
    acl: list[dict] | None = None
    cluster_fw: dict | None = None

    @property
    def guests(self) -> list[dict]:
        return [r for r in self.resources if r.get("type") in ("qemu", "lxc")]


def _audit_reads(a: Security) -> None:
    """The cluster's own reads, side by side: users and tokens, the ACL, the datacenter firewall, the inventory."""
    a.users, a.acl, a.cluster_fw, resources = a.report.sections([
        ("users and tokens", lambda: a.client.get("/access/users", full=1)),
        ("acl", lambda: a.client.get("/access/acl")),
        ("datacenter firewall", lambda: a.client.get("/cluster/firewall/options")),
        ("inventory", lambda: cluster_resources(a.client))])
    a.resources = resources or []


def _tokens(a: Security) -> None:
    for user in a.users or []:
        for token in user.get("tokens") or []:
            name = f"{user['userid']}!{token['tokenid']}"
            if not token.get("expire"):
                a.report.add("warning", "tokens", f"token {name} never expires", token, "set an expiry date")
            if not token.get("privsep"):
                a.report.add("warning", "tokens",
                             f"token {name} has privilege separation off (all of its user's rights)",
                             token, "recreate it with --privsep 1 and its own ACL")
            if user["userid"] == "root@pam":
                a.report.add("critical", "tokens", f"token {name} belongs to root@pam", token,
                             "use a dedicated user with only the roles it needs")


def _acl(a: Security) -> None:
    for entry in a.acl or []:
        if entry.get("path") == "/" and entry.get("roleid") in ("Administrator", "PVEAdmin") \
                and entry.get("ugid") != "root@pam":
            a.report.add("warning", "acl", f"{entry['ugid']} holds {entry['roleid']} on / (everything)", entry,
                         "grant narrower roles on narrower paths")


def _firewalls(a: Security) -> None:
    """The datacenter's firewall; then every online node's and the guests' (their configs, and the firewall
    options of those whose NICs filter), all side by side, each node's within what it serves at once."""
    if "datacenter firewall" in a.report.checked and not (a.cluster_fw or {}).get("enable"):
        a.report.add("warning", "firewall", "the datacenter firewall is off", a.cluster_fw,
                     "enable it after adding rules")
    nodes = [r["node"] for r in a.resources if r.get("type") == "node" and r.get("status") == "online"]
    guests = a.guests[:a.max_guests]
    reads = [lambda n=node: a.client.get(f"/nodes/{n}/firewall/options") for node in nodes]
    reads += [lambda g=guest: _guest_reads(a, g) for guest in guests]
    results = in_parallel(reads, nodes=nodes + [g["node"] for g in guests])
    for node, options in zip(nodes, results, strict=False):
        options = a.report.record(f"firewall {node}", options)
        if options is not None and not options.get("enable", 1):
            a.report.add("info", "firewall", f"the firewall of node {node} is off", options, "enable it per node")
    for guest, got in zip(guests, results[len(nodes):], strict=True):
        _guest_findings(a, guest, got)
    a.report.checked.append(f"configs of {len(guests)} guests")


def _base(guest: dict) -> str:
    return f"/nodes/{guest['node']}/{guest['type']}/{guest['vmid']}"


def _filtered_nics(config: dict) -> list[str]:
    return sorted(k for k, v in config.items() if k.startswith("net") and "firewall=1" in str(v))


def _guest_reads(a: Security, guest: dict) -> tuple[dict, Any]:
    """A guest's config, then its firewall options where a NIC filters (or the failure reading them)."""
    config = a.client.get(f"{_base(guest)}/config") or {}
    if not _filtered_nics(config):
        return config, None
    try:
        return config, a.client.get(f"{_base(guest)}/firewall/options")
    except ToolFailure as exc:
        return config, exc


def _guest_findings(a: Security, guest: dict, got: Any) -> None:
    """What a guest's config and firewall show; an unreadable one is listed as unavailable (one line for all
    configs read instead of a line each)."""
    if isinstance(got, ToolFailure):
        a.report.record(f"config {guest['vmid']}", got)
        return
    config, options = got
    _guest_config(a.report, guest, config)
    _guest_firewall(a, guest, config, options)


def _guest_firewall(a: Security, guest: dict, config: dict, options: Any) -> None:
    """A NIC is filtered only when it has firewall=1 AND the guest's own firewall option enable=1
    (default 0) (docs/PROXMOX-BEHAVIOUR.md#guest-firewall)."""
    label = f"guest {guest['vmid']} ({guest.get('name')})"
    nics = _filtered_nics(config)
    if not nics:
        a.report.add("info", "firewall", f"{label} has no NIC with the firewall on", {}, "write_set_nic firewall=true")
        return
    if isinstance(options, ToolFailure):
        a.report.record(f"firewall {guest['vmid']}", options)
        return
    if not options.get("enable"):
        a.report.add("warning", "firewall", f"{label} filters nothing: its NICs have firewall=1 but its own firewall "
                     f"option is off", {"enable": 0, "nics": nics},
                     f"turn it on: write_call_api PUT {_base(guest)}/firewall/options enable=1 (after adding its "
                     f"rules)")


def _guest_config(report: Report, guest: dict, config: dict) -> None:
    label = f"guest {guest['vmid']} ({guest.get('name')})"
    if guest["type"] == "lxc" and str(config.get("unprivileged", 0)) != "1":
        report.add("warning", "guests", f"{label} is a privileged container", {"unprivileged": 0},
                   "recreate it unprivileged (backup, restore with unprivileged=1)")
    devices = sorted(k for k in config if k.startswith(("hostpci", "usb", "dev")) and "spice" not in str(config[k]))
    if devices:
        report.add("info", "guests", f"{label} has host devices {', '.join(devices)}", {k: config[k] for k in devices},
                   "make sure the passthrough is intended")
    if config.get("hookscript"):
        report.add("warning", "guests", f"{label} runs hookscript {config['hookscript']} on the host",
                   {"hookscript": config["hookscript"]}, "review the script")


def _this_server(a: Security) -> None:
    label = a.client.host.label
    rules = policy.settings().hosts.get(("pve", label), policy.HostPolicy())
    for gate in ("exec", "elevated"):
        if gate in rules.allow:
            a.report.add("warning", "this server", f"the {gate} gate is open for host '{label}'",
                         {"gate": gate}, f"close it unless needed ({policy.how_to_open(gate, label, 'pve')})")
    if runtime.TRANSPORT.get() == "http":
        a.report.add("info", "this server", "this server speaks plain HTTP; put TLS in front for remote clients",
                     {"transport": "http"}, "use a reverse proxy with TLS")


SECURITY_CHECKS: list[Callable[[Security], None]] = [_audit_reads, _tokens, _acl, _firewalls, _this_server]
NOT_CHECKED = ["guest firewall rules themselves", "node SSH and OS hardening", "TLS certificates' issuers",
               "two-factor authentication of users"]


def security_audit(host: Host = None, max_guests: Annotated[int, Field(ge=0, le=1000)] = 200) -> dict:
    """Tokens, ACLs, firewalls, privileged CTs, devices, this server."""
    scan = Security(pve_client(host), Report({"max_guests": max_guests}), max_guests)
    for check in SECURITY_CHECKS:
        check(scan)
    not_checked = list(NOT_CHECKED)
    if len(scan.guests) > max_guests:
        not_checked.append(f"guests beyond the first {max_guests}")
    return scan.report.answer(not_checked=not_checked)


# ---------------------------------------------------------------- waiting for any task

def wait_task(upid: str,
              host: Host = None,
              wait_seconds: Annotated[int, Field(ge=1, le=3600)] = 60, ctx: Context | None = None) -> dict:
    """Until a task ends, with progress."""
    client = proxmox_client.client_for("pbs" if _looks_pbs(upid) else "pve", host)
    return task_report(client, upid, wait_seconds, 20, ctx, "wait_task")


def _looks_pbs(upid: str) -> bool:
    try:
        proxmox_client.parse_upid(upid, "pbs")
        return True
    except ProxmoxError:
        return False


# ---------------------------------------------------------------- provisioning in one call

def _holders(client: ProxmoxClient, nodes: list[str], volid: str | None) -> list[str]:
    """The nodes that can use a volume: all for shared storage, else those whose own disk holds it
    (docs/PROXMOX-BEHAVIOUR.md#per-node-storages)."""
    storage = (volid or "").split(":", 1)[0]
    rows = [r for r in storage_rows(client) if r.get("storage") == storage]
    if not volid or not rows or any(r.get("shared") for r in rows):
        return nodes
    on = {r["node"] for r in rows if r.get("status") == "available"}
    return [n for n in nodes if n in on and any(v.get("volid") == volid for v in client.get(
        f"/nodes/{n}/storage/{storage}/content") or [])]


def _pick_node(client: ProxmoxClient, memory_mb: int, volid: str | None = None) -> tuple[str, str | None]:
    """An online node that holds `volid` (when it is on a node's own storage) with the most free
    memory, and a note when free memory cannot be told: without Sys.Audit the nodes come without
    figures (docs/PROXMOX-BEHAVIOUR.md#cluster-resources), which says nothing about room."""
    online = {r["node"]: r for r in client.get("/cluster/resources", type="node") or [] if r.get("status") == "online"}
    nodes = _holders(client, sorted(online), volid)
    if not nodes:
        raise InvalidArgument(f"No online node holds {volid}; take one from storage_content, or download it to the "
                              f"node you want (write_download_url node=...).")
    if any(online[n].get("maxmem") is None for n in nodes):
        return nodes[0], (f"free memory not checked: the token lacks Sys.Audit on /nodes, so nodes come without "
                          f"figures; {nodes[0]} holds what it needs")
    free = {n: online[n]["maxmem"] - online[n].get("mem", 0) for n in nodes}
    best = max(nodes, key=free.get)
    if free[best] < memory_mb * 1024 * 1024:
        raise ProxmoxError(f"No online node that can use it has {memory_mb} MiB of free memory "
                           f"({', '.join(nodes)} checked); give a smaller memory_mb or free memory.")
    return best, None


def _uplinked_bridge(client: ProxmoxClient, node: str) -> str:
    found = bridges(client, node)
    uplinked = [b["bridge"] for b in found if b["segment"] == "uplinked" and not b["pending"]]
    if not uplinked:
        raise ProxmoxError(f"Node {node} has no bridge with an uplink port; give bridge explicitly. "
                           + ((bridges_hidden(client) or "") if not found else ""))
    return uplinked[0]


class Steps:
    """Each step of a recipe: done, skipped, warning, failed or still_running."""

    def __init__(self) -> None:
        self.steps: list[dict] = []
        self.created: list[str] = []

    def record(self, step: str, state: str, **detail: Any) -> None:
        self.steps.append({"step": step, "state": state} | {k: v for k, v in detail.items() if v is not None})

    def answer(self, ok: bool, **extra: Any) -> dict:
        result = {"result": "ok" if ok else "failed", "steps": self.steps}
        if not ok and policy.current_call().get("receipts"):  # what was sent, to take back (write_undo_change)
            result["receipts"] = list(policy.current_call()["receipts"])
        if not ok:
            result["created"] = self.created
            result["note"] = ("Nothing was deleted. " + (f"Left behind: {', '.join(self.created)}." if self.created
                                                        else "Nothing was created."))
        return result | extra

    def failure(self, what: str, **extra: Any) -> ProxmoxError:
        """A failed recipe is a tool error (isError) that carries the whole step report."""
        failed = next((s for s in reversed(self.steps) if s["state"] == "failed"), {})
        done = [s["step"] for s in self.steps if s["state"] == "done"]
        where = f" at '{failed['step']}'" if failed.get("step", "error") != "error" else \
            (f" after '{done[-1]}'" if done else "")
        answer = self.answer(False, **extra)
        report = json.dumps(answer, separators=(",", ":"), default=str)
        return ProxmoxError(f"{what} failed{where}: {str(failed.get('detail', '')).rstrip('.')}. {answer['note']} "
                            f"Step report: {report}")


def _wait_for_address(client: ProxmoxClient, base: str, kind: str, seconds: int) -> str | None:
    def address() -> str | None:
        try:
            if kind == "lxc":
                for iface in client.get(f"{base}/interfaces") or []:
                    if iface.get("name") != "lo" and iface.get("inet"):
                        return iface["inet"]
            else:
                result, _ = proxmox_client.agent_result(client.get(f"{base}/agent/network-get-interfaces"))
                for iface in result or []:
                    for found in iface.get("ip-addresses", []):
                        if iface.get("name") != "lo" and found.get("ip-address-type") == "ipv4":
                            return found["ip-address"]
        except ProxmoxError:
            pass  # not up yet
        return None
    return poll(address, lambda found: found is not None, seconds)[0]  # polling the guest for an address


def _provision(kind: str, create: Callable[[str, int, str], dict], memory_mb: int, host: str | None,
               node: str | None, bridge: str | None, wait_seconds: int, ctx: Context | None, volid: str) -> dict:
    client = pve_client(host)
    steps = Steps()
    try:
        node, unchecked = (check_node(client, node), None) if node else _pick_node(client, memory_mb, volid)
        steps.record("pick node", "done", node=node, detail=unchecked)
        vmid = next_vmid(client)
        steps.record("next vmid", "done", vmid=vmid)
        bridge = bridge or _uplinked_bridge(client, node)
        steps.record("pick bridge", "done", bridge=bridge)
        created = create(node, vmid, bridge)
        steps.created.append(f"{kind} {vmid} on {node}")
        steps.record("create", "still_running" if created.get("task") == "still_running" else "done",
                     upid=created.get("upid"))
        if created.get("task") == "still_running":
            return steps.answer(True, vmid=vmid, node=node, note="creation still running; get_task follows it")
        base = f"/nodes/{node}/{kind}/{vmid}"
        run_task(client, "POST", f"{base}/status/start", {}, wait_seconds, ctx, f"start {vmid}")
        steps.record("start", "done")
        address = _wait_for_address(client, base, kind, max(5, wait_seconds))
        steps.record("wait for address", "done" if address else "warning", address=address,
                     detail=None if address else "no address yet (DHCP, or no guest agent)")
        return steps.answer(True, vmid=vmid, node=node, address=address)
    except ToolFailure as exc:
        steps.record("error", "failed", detail=str(exc)[:300])
        raise steps.failure(f"Provisioning {kind}") from None


def write_provision_lxc(hostname: GuestName,
                        template: Volid,
                        host: Host = None, node: Node = None,
                        memory_mb: Annotated[int, Field(ge=16)] = 1024, cores: Annotated[int, Field(ge=1, le=64)] = 1,
                        disk_gb: Annotated[int, Field(ge=1)] = 8, storage: str = "local-lvm",
                        bridge: str | None = None,
                        ssh_keys: str | None = None,
                        onboot: bool = False,
                        wait_seconds: WaitArg = 120, dry_run: DryRunArg = False, ctx: Context | None = None) -> dict:
    """Create and start a DHCP container; answers its IP and each step."""

    def create(node: str, vmid: int, bridge: str) -> dict:
        return pve_tools.write_create_lxc(hostname, template, host=host, node=node, vmid=vmid, memory_mb=memory_mb,
                                          cores=cores, disk_gb=disk_gb, storage=storage, bridge=bridge,
                                          ssh_keys=ssh_keys, onboot=onboot,
                                          wait_seconds=wait_seconds, ctx=ctx)
    return _provision("lxc", create, memory_mb, host, node, bridge, wait_seconds, ctx, template)


def write_provision_vm(name: GuestName,
                       cloud_image: Volid,
                       host: Host = None, node: Node = None,
                       memory_mb: Annotated[int, Field(ge=64)] = 2048, cores: Annotated[int, Field(ge=1, le=64)] = 2,
                       disk_gb: Annotated[int, Field(ge=1)] = 32, storage: str = "local-lvm",
                       bridge: str | None = None,
                       ciuser: str | None = None, ssh_keys: str | None = None, wait_seconds: WaitArg = 180,
                       dry_run: DryRunArg = False, ctx: Context | None = None) -> dict:
    """Create and start a cloud-init VM; answers its IP and each step."""

    def create(node: str, vmid: int, bridge: str) -> dict:
        return pve_tools.write_create_vm(name, host=host, node=node, vmid=vmid, cloud_image=cloud_image,
                                         memory_mb=memory_mb, cores=cores, disk_gb=disk_gb, storage=storage,
                                         bridge=bridge, ciuser=ciuser, ssh_keys=ssh_keys,
                                         wait_seconds=wait_seconds, ctx=ctx)
    return _provision("qemu", create, memory_mb, host, node, bridge, wait_seconds, ctx, cloud_image)


# ---------------------------------------------------------------- restore drill

@dataclass
class Drill:
    """One restore drill: the scratch guest it restores, boots and destroys; its steps and timings."""
    client: ProxmoxClient
    host: str | None
    kind: str  # qemu or lxc, as the guest whose backup it is
    backup: str
    scratch: int
    answer_seconds: int
    ctx: Context | None
    steps: Steps = field(default_factory=Steps)
    timings: dict[str, float] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    storage: str | None = None  # where the scratch guest's volumes go (None: as Proxmox or the restore picks)
    node: str = ""
    base: str | None = None  # the scratch guest's API path, once it exists
    answered: bool = False


def _newest_backup(host: str | None, vmid: int) -> str:
    """The guest's newest backup on any storage (each read side by side): one on another node's own
    `local`, from before a migration, is still the newest to drill."""
    found, notes = backup_volumes(pve_client(host), vmid)
    if not found and notes.get("not_visible"):  # docs/PROXMOX-BEHAVIOUR.md#who-sees-which-volume
        raise ProxmoxError(f"No backup of guest {vmid} is visible to this token: backups on "
                           f"{', '.join(notes['not_visible'])} cannot be seen ({notes['grant']}). Give "
                           f"backup=<volid>, or grant that and call again.")
    if not found:
        raise ProxmoxError(f"Guest {vmid} has no backup to drill; back it up first (write_backup_guest).")
    return found[0]["volid"]


def _scratch_vmid(client: ProxmoxClient, scratch_vmid: int | None) -> int:
    taken = {g["vmid"] for g in guest_resources(client, fresh=True)}
    if scratch_vmid is not None and scratch_vmid in taken:
        raise InvalidArgument(f"Scratch vmid {scratch_vmid} exists; the drill only creates and destroys its own guest.")
    return scratch_vmid or next_vmid(client)


def _restore(d: Drill) -> None:
    restored = pve_tools.write_restore_backup(d.backup, host=d.host, vmid=d.scratch, node=d.node, storage=d.storage,
                                              wait_seconds=d.answer_seconds * 5, ctx=d.ctx)
    d.steps.created.append(f"{d.kind} {d.scratch} on {d.node} (scratch)")
    d.base = f"/nodes/{d.node}/{d.kind}/{d.scratch}"
    d.timings["restore_s"] = round(time.monotonic() - d.started, 1)
    d.steps.record("restore", "done", vmid=d.scratch, node=d.node, backup=d.backup, upid=restored.get("upid"))


def _drill_node(client: ProxmoxClient, backup: str) -> str:
    """Where the scratch guest is restored: a backup on a node's own `local` on that node; one on
    shared storage where there is room (docs/PROXMOX-BEHAVIOUR.md#per-node-storages)."""
    storage = backup.split(":", 1)[0]
    shared = any(r.get("shared") for r in storage_rows(client) if r["storage"] == storage)
    return archive_node(client, backup, _pick_node(client, 512)[0] if shared else None)


def _declare_drill(d: Drill, vmid: int) -> None:
    """The whole drill is put to the user before its first step: the restore, and the start, stop
    and delete of the scratch guest (docs/SECURITY.md#confirmation)."""
    base = f"/nodes/{d.node}/{d.kind}/{d.scratch}"
    d.client.plan([("POST", f"{base}/status/start", {}), ("POST", f"{base}/status/stop", {}),
                   ("DELETE", base, {"purge": True})],
                  f"Restore drill of guest {vmid}: restore {d.backup} as scratch guest {d.scratch} on {d.node}, take "
                  f"it off the network, start it, wait up to {d.answer_seconds} s for it to answer, then stop and "
                  f"delete the scratch guest.")


def _cut_nics(config: dict, kind: str, isolated: list[str]) -> dict[str, Any]:
    """The config change that takes the scratch guest off the network: VM links down, container
    NICs moved to an isolated bridge, or removed when the node has none."""
    cut: dict[str, Any] = {}
    for key, value in config.items():
        if key.startswith("net"):
            if kind == "qemu":
                cut[key] = str(value) + ",link_down=1"
            elif isolated:
                cut[key] = ",".join(p if not p.startswith("bridge=") else f"bridge={isolated[0]}"
                                    for p in str(value).split(","))
            else:
                cut.setdefault("delete", []).append(key)
    return cut


def _cut_network(d: Drill) -> None:
    config = d.client.get(f"{d.base}/config") or {}
    # only a bridge with neither ports nor a host address is cut off; routed bridges and SDN
    # vnets lead somewhere (docs/PROXMOX-BEHAVIOUR.md#networks)
    isolated = [b["bridge"] for b in bridges(d.client, d.node) if b["segment"] == "isolated"]
    cut = _cut_nics(config, d.kind, isolated)
    if cut:
        params = {k: v for k, v in cut.items() if k != "delete"} | {"digest": config.get("digest")}
        if cut.get("delete"):
            params["delete"] = ",".join(cut["delete"])
        d.client.request("PUT", f"{d.base}/config", params)
    d.steps.record("cut network", "done", how="link_down" if d.kind == "qemu" else (
        f"bridge {isolated[0]}" if isolated else "NICs removed"))


def _start(d: Drill) -> None:
    t0 = time.monotonic()
    run_task(d.client, "POST", f"{d.base}/status/start", {}, d.answer_seconds, d.ctx, f"start {d.scratch}")
    d.timings["start_s"] = round(time.monotonic() - t0, 1)
    d.steps.record("start", "done")


def _wait_for_answer(d: Drill) -> None:
    t0 = time.monotonic()
    d.answered = _guest_answers(d.client, d.base, d.kind, d.answer_seconds)
    d.timings["answer_s"] = round(time.monotonic() - t0, 1)
    d.steps.record("guest answers", "done" if d.answered else "failed",
                   detail=None if d.answered else f"no answer within {d.answer_seconds} s")


def _destroy_scratch(d: Drill) -> None:
    try:
        status = d.client.get(f"{d.base}/status/current") or {}
        if status.get("status") == "running":
            run_task(d.client, "POST", f"{d.base}/status/stop", {}, 60, d.ctx, f"stop {d.scratch}")
        run_task(d.client, "DELETE", d.base, {"purge": True}, 120, d.ctx, f"destroy scratch {d.scratch}")
        d.steps.created.clear()
        d.steps.record("destroy scratch", "done", vmid=d.scratch)
    except ToolFailure as exc:
        d.steps.record("destroy scratch", "failed", detail=str(exc)[:300])


DRILL_STEPS: list[Callable[[Drill], None]] = [_restore, _cut_network, _start, _wait_for_answer]


def write_drill_restore(vmid: Vmid, host: Host = None,
                        backup: Annotated[str | None, Field(description="volid")] = None,
                        scratch_vmid: OptionalVmid = None,
                        storage: Annotated[str | None, Field(description="For its disks, e.g. local-lvm")] = None,
                        answer_seconds: Annotated[int, Field(ge=5, le=1800)] = 120,
                        dry_run: DryRunArg = False, confirm: ConfirmArg = False, ctx: Context | None = None) -> dict:
    """Prove a backup restores: to a scratch vmid, offline; boot, time, delete."""
    client = pve_client(host)
    row = resolve_guest(client, vmid)
    kind = row["type"]
    if backup is None:
        backup = _newest_backup(host, vmid)
    drill = Drill(client, host, kind, backup, _scratch_vmid(client, scratch_vmid), answer_seconds, ctx,
                  node=_drill_node(client, backup), storage=storage)
    _declare_drill(drill, vmid)
    try:
        for step in DRILL_STEPS:
            step(drill)
    except ToolFailure as exc:
        drill.steps.record("error", "failed", detail=str(exc)[:300])
        drill.answered = False
    if drill.base is not None:
        _destroy_scratch(drill)
    facts = {"vmid": vmid, "backup": backup, "scratch_vmid": drill.scratch,
             "config_since_backup": _config_since_backup(drill, row)}
    left = drill.steps.created  # a scratch guest that could not be destroyed fails the drill too
    if not drill.answered or left:
        note = (f"Left behind: {', '.join(left)}; delete it with write_delete_guest." if left else
                "The scratch guest was destroyed." if drill.base else "Nothing was created.")
        # the timings of the steps that ran, if any; an error's text holds no reading of the clock of its own
        timed = {"timings": drill.timings} if drill.timings else {}
        raise drill.steps.failure(f"The restore drill of guest {vmid}", note=note, **facts, **timed)
    drill.timings["total_s"] = round(time.monotonic() - drill.started, 1)
    return drill.steps.answer(True, **facts, timings=drill.timings)


def _config_since_backup(d: Drill, row: dict) -> list[str] | str:
    """What a restore of this backup would take back: the guest's config now against the one the
    backup holds, in the words of what_changed (config_diff)."""
    try:
        old = config_diff.read_backup_config(d.client, d.node, d.backup)
        now, pending = config_diff.config_and_pending(
            d.client.get(f"/nodes/{row['node']}/{row['type']}/{row['vmid']}/pending") or [])
    except ToolFailure as exc:
        return f"not read: {str(exc)[:200]}"
    return config_diff.changed_lines(old, now, pending, skip=config_diff.skip_for_backup) or ["nothing changed"]


def _guest_answers(client: ProxmoxClient, base: str, kind: str, seconds: int) -> bool:
    def answers() -> bool:
        try:
            if kind == "qemu":
                client.request("POST", f"{base}/agent/ping", {})
                return True
            running = (client.get(f"{base}/status/current") or {}).get("status") == "running"
            return bool(running and client.get(f"{base}/interfaces"))
        except ProxmoxError:
            return False
    return poll(answers, bool, seconds)[1]  # polling the scratch guest


# ---------------------------------------------------------------- resources and prompts

def _json(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), default=str)


def resource_cluster(host: str) -> str:
    """Cluster name, quorum and nodes."""
    return _json(pve_tools.cluster_status(host=host))


def resource_nodes(host: str) -> str:
    """Nodes with CPU, memory and uptime."""
    return _json(pve_tools.list_nodes(host=host))


def resource_guests(host: str) -> str:
    """Every VM and container (first 500)."""
    return _json(pve_tools.list_guests(host=host, limit=500))


def resource_storage(host: str) -> str:
    """Storages with fill."""
    return _json(pve_tools.list_storage(host=host))


def resource_tasks(host: str) -> str:
    """Recent tasks."""
    return _json(pve_tools.list_tasks(host=host, limit=50))


def resource_datastores(host: str) -> str:
    """PBS datastores with use and GC."""
    return _json(pbs_tools.pbs_list_datastores(host=host))


def resource_health(host: str) -> str:
    """Health summary: findings by severity."""
    return _json(health_check(host=host))


RESOURCES = [("proxmox://{host}/cluster", resource_cluster), ("proxmox://{host}/nodes", resource_nodes),
             ("proxmox://{host}/guests", resource_guests), ("proxmox://{host}/storage", resource_storage),
             ("proxmox://{host}/tasks", resource_tasks), ("proxmox://{host}/health", resource_health),
             ("pbs://{host}/datastores", resource_datastores)]
# What resources/list offers for each configured host, ready to attach to a conversation (the others are
# reached through their templates): the inventory and the health summary; a Backup Server's datastores.
ATTACHABLE = {"pve": (resource_guests, resource_health), "pbs": (resource_datastores,)}


def cluster_health_review() -> str:
    """Review the cluster's health and say what needs attention first."""
    return ("Call health_check. Go through the findings from critical to info; for each, quote the "
            "evidence and the next step. List the sections under `unavailable` as not checked - "
            "never as healthy. Propose fixes but make no change without the user's yes.")


def troubleshoot_guest(vmid: str) -> str:
    """Find out why a guest misbehaves."""
    return (f"Troubleshoot guest {vmid}: get_guest (status, lock, config), then list_tasks vmid={vmid} "
            f"for failed tasks and task_log of the newest failure; for a running VM guest_agent_info; "
            f"node_status of its node. Report the cause with evidence. Before any change, show the exact "
            f"write with dry_run=true and ask the user.")


def provision_lxc() -> str:
    """Create a container safely."""
    return ("Ask for hostname, size and purpose. storage_content content=vztmpl to pick a template "
            "(write_download_url if none), list_networks to pick a bridge with an uplink. Then "
            "write_provision_lxc with dry_run=true, show it, and run it after the user agrees.")


def safe_guest_change() -> str:
    """Change a guest without surprises."""
    return ("1. get_guest to see the current state; never guess a vmid (list_guests). 2. "
            "write_create_snapshot before risky changes. 3. Run the change with dry_run=true and show "
            "the request. 4. After the user agrees, run it. 5. Verify with get_guest; offer "
            "write_rollback_snapshot if it went wrong.")


def backup_review() -> str:
    """Check that every guest is backed up and restorable."""
    return ("Call backup_coverage. List guests that are missing, stale or failed verification, and the "
            "jobs that exclude them; name PBS groups without a guest. Suggest write_backup_guest for the "
            "gaps and a write_drill_restore for the most important guest; change nothing unasked.")


def security_review() -> str:
    """Review security settings."""
    return ("Call security_audit and server_info. Explain each finding in plain words with its fix, "
            "critical first. Say clearly what was not checked. Make no change.")


PROMPTS = [cluster_health_review, troubleshoot_guest, provision_lxc, safe_guest_change, backup_review,
           security_review]
