"""Workflows: the questions operators ask, answered in one call by reading across nodes, guests,
storage, PVE and PBS. A section that cannot be read is listed under `unavailable` with the
reason and never counts as healthy; thresholds are arguments and are echoed in the answer.
Resources and prompts for MCP clients are defined here too.
"""
import time
from typing import Annotated, Any, Callable

from mcp.server.mcpserver import Context
from pydantic import Field

import pbs_tools
import policy
import proxmox_client
import pve_tools
from answers import (ConfirmArg, DryRunArg, GuestName, Host, OptionalVmid, Vmid, Volid, WaitArg, human_bytes,
                     iso_time, percent)
from errors import InvalidArgument, ProxmoxError, ToolFailure
from inventory import bridges, check_node, guest_resources, next_vmid, resolve_guest
from proxmox_client import ProxmoxClient, pbs_client, pve_client, run_task, task_report
SEVERITY = {"critical": 0, "warning": 1, "info": 2}
RUNTIME: dict[str, Any] = {"transport": "stdio"}  # set by server.py: how this server is reached


class Report:
    """Findings with evidence and a next step; sections that could not be read."""

    def __init__(self, thresholds: dict[str, Any]):
        self.findings: list[dict] = []
        self.unavailable: list[dict] = []
        self.checked: list[str] = []
        self.thresholds = thresholds

    def add(self, severity: str, area: str, finding: str, evidence: Any, next_step: str) -> None:
        self.findings.append({"severity": severity, "area": area, "finding": finding, "evidence": evidence,
                              "next": next_step})

    def section(self, name: str, read: Callable[[], Any]) -> Any:
        """Run one section; a failure is recorded as unavailable, never as healthy."""
        try:
            result = read()
            self.checked.append(name)
            return result
        except ToolFailure as exc:
            self.unavailable.append({"section": name, "reason": str(exc)[:300]})
            return None

    def answer(self, **extra: Any) -> dict:
        findings = sorted(self.findings, key=lambda f: SEVERITY[f["severity"]])
        counts = {s: sum(f["severity"] == s for f in findings) for s in SEVERITY}
        return {"summary": counts | {"unavailable": len(self.unavailable)}, "findings": findings,
                "unavailable": self.unavailable, "checked": self.checked, "thresholds": self.thresholds} | extra


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


def health_check(host: Host = None, pbs_host: Host = None,
                 thresholds: Annotated[dict[str, int] | None, Field(description="overrides, named as in the answer")] = None
                 ) -> dict:
    """Cluster health in one call (nodes, storage, tasks, HA, certs, PBS): findings by severity."""
    client = pve_client(host)
    limits = health_thresholds(thresholds)
    storage_warn_pct, storage_crit_pct = limits["storage_warn_pct"], limits["storage_crit_pct"]
    node_mem_warn_pct, node_cpu_warn_pct = limits["node_mem_warn_pct"], limits["node_cpu_warn_pct"]
    failed_task_hours, cert_warn_days = limits["failed_task_hours"], limits["cert_warn_days"]
    gc_max_days, verify_max_days = limits["gc_max_days"], limits["verify_max_days"]
    report = Report(limits)
    status = report.section("quorum", lambda: client.get("/cluster/status")) or []
    cluster = next((e for e in status if e.get("type") == "cluster"), None)
    if cluster and not cluster.get("quorate"):
        report.add("critical", "quorum", "the cluster has lost quorum", cluster, "bring nodes back; writes are blocked")
    for node in (e for e in status if e.get("type") == "node" and not e.get("online")):
        report.add("critical", "nodes", f"node {node['name']} is offline", node, "check its power and network")
    resources = report.section("resources", lambda: client.get("/cluster/resources")) or []
    online = []
    for node in (r for r in resources if r.get("type") == "node"):
        if node.get("status") == "online":
            online.append(node["node"])
            load = percent(node.get("cpu"), 1)
            if load is not None and load >= node_cpu_warn_pct:
                report.add("warning", "cpu", f"node {node['node']} runs at {load}% CPU",
                           {"cpu_pct": load, "cores": node.get("maxcpu")}, "find the busy guests (list_guests) and spread them")
            used = percent(node.get("mem"), node.get("maxmem"))
            if used is not None and used >= node_mem_warn_pct:
                report.add("warning", "memory", f"node {node['node']} uses {used}% of its memory",
                           {"mem": human_bytes(node.get("mem")), "maxmem": human_bytes(node.get("maxmem"))},
                           "migrate or stop guests, or add memory")
    for storage in (r for r in resources if r.get("type") == "storage" and r.get("maxdisk")):
        used = percent(storage.get("disk"), storage.get("maxdisk"))
        if used >= storage_warn_pct:
            severity = "critical" if used >= storage_crit_pct else "warning"
            report.add(severity, "storage", f"{storage['storage']} on {storage['node']} is {used}% full",
                       {"used": human_bytes(storage.get("disk")), "total": human_bytes(storage.get("maxdisk"))},
                       "prune backups (list_backups), delete unused volumes or grow the storage")
    for guest in (r for r in resources if r.get("type") in ("qemu", "lxc")):
        if guest.get("lock"):
            report.add("warning", "locks", f"guest {guest['vmid']} ({guest.get('name')}) is locked ({guest['lock']})",
                       {"vmid": guest["vmid"], "lock": guest["lock"]}, "check list_tasks for the task holding it")
        if guest.get("hastate") in ("error", "fence"):
            report.add("critical", "ha", f"HA resource {guest['vmid']} is in state {guest['hastate']}",
                       {"vmid": guest["vmid"]}, "see the HA status in the web UI; clear the error once fixed")
    since = time.time() - failed_task_hours * 3600
    tasks = report.section("tasks", lambda: client.get("/cluster/tasks")) or []
    for task in tasks:
        if task.get("starttime", 0) >= since and task.get("status") not in (None, "OK", "running") \
                and not str(task.get("status")).startswith("WARNINGS"):
            report.add("warning", "tasks", f"{task.get('type')} {task.get('id') or ''} on {task.get('node')} failed",
                       {"upid": task["upid"], "status": task.get("status"), "start": iso_time(task.get("starttime"))},
                       "read it with task_log")
    for node in online:
        for job in report.section(f"replication {node}", lambda n=node: client.get(f"/nodes/{n}/replication")) or []:
            if job.get("error") or job.get("fail_count"):
                report.add("warning", "replication", f"replication {job.get('id')} on {node} is failing",
                           {k: job.get(k) for k in ("id", "target", "error", "fail_count", "last_sync")},
                           "check the target node and storage; run it again from the web UI")
        certs = report.section(f"certificates {node}", lambda n=node: client.get(f"/nodes/{n}/certificates/info")) or []
        for cert in certs:
            days = (cert.get("notafter", 0) - time.time()) / 86400
            if days < cert_warn_days:
                report.add("critical" if days < 7 else "warning", "certificates",
                           f"{cert.get('filename')} on {node} expires in {int(days)} days",
                           {"notafter": iso_time(cert.get("notafter"))}, "renew it (ACME or pvecm updatecerts)")
    pbs = report.section("pbs host", lambda: _pbs(pbs_host))
    if pbs is not None:
        _pbs_health(pbs, report, storage_warn_pct, storage_crit_pct, gc_max_days, verify_max_days)
    elif "pbs host" in report.checked:
        report.checked.remove("pbs host")
    return report.answer(nodes_online=online)


def _pbs_health(pbs: ProxmoxClient, report: Report, warn: int, crit: int, gc_days: int, verify_days: int) -> None:
    now = time.time()
    for ds in report.section("pbs datastores", lambda: pbs.get("/status/datastore-usage")) or []:
        used = percent(ds.get("used"), ds.get("total")) or 0
        if used >= warn:
            report.add("critical" if used >= crit else "warning", "pbs", f"datastore {ds['store']} is {used}% full",
                       {"full_by": iso_time(ds.get("estimated-full-date"))}, "prune (write_pbs_prune) and run GC")
        last_gc = (ds.get("gc-status") or {}).get("last-run-endtime") or 0
        if now - last_gc > gc_days * 86400:
            report.add("warning", "pbs", f"garbage collection of {ds['store']} last ran {iso_time(last_gc) or 'never'}",
                       {"last_gc": iso_time(last_gc)}, "write_pbs_gc, and schedule it")
    for job in report.section("pbs verify jobs", lambda: pbs.get("/admin/verify")) or []:
        age = now - (job.get("last-run-endtime") or 0)
        if age > verify_days * 86400 or job.get("last-run-state") not in (None, "ok"):
            report.add("warning", "pbs", f"verify job {job['id']} last ran {iso_time(job.get('last-run-endtime')) or 'never'} "
                       f"with {job.get('last-run-state')}", job, "write_pbs_run_job kind=verify")


# ---------------------------------------------------------------- backups: PVE and PBS against each other

def _jobs_for(vmid: int, pool: str | None, jobs: list[dict]) -> tuple[list[str], list[str]]:
    covering, excluding = [], []
    for job in jobs:
        if not job.get("enabled", 1):
            continue
        listed = {int(v) for v in str(job.get("vmid", "")).split(",") if v.strip().isdigit()}
        excluded = {int(v) for v in str(job.get("exclude", "")).split(",") if v.strip().isdigit()}
        if vmid in excluded:
            excluding.append(job["id"])
        elif str(job.get("all", 0)) == "1" or vmid in listed or (pool and job.get("pool") == pool):
            covering.append(job["id"])
    return covering, excluding


def backup_coverage(host: Host = None, pbs_host: Host = None,
                    max_age_hours: Annotated[int, Field(ge=1, le=8760)] = 26) -> dict:
    """Per guest: newest backup (PVE and PBS), age, verify, covering jobs; orphan PBS groups."""
    client = pve_client(host)
    report = Report({"max_age_hours": max_age_hours})
    resources = report.section("guests", lambda: client.get("/cluster/resources")) or []
    guests = [r for r in resources if r.get("type") in ("qemu", "lxc") and not r.get("template")]
    jobs = report.section("backup jobs", lambda: client.get("/cluster/backup")) or []
    newest: dict[int, dict] = {}

    def consider(vmid: int, when: int, where: str, verify: str | None) -> None:
        if vmid not in newest or when > newest[vmid]["ctime"]:
            newest[vmid] = {"ctime": when, "where": where, "verify": verify}
    pbs = report.section("pbs host", lambda: _pbs(pbs_host))
    # One read per backup storage: a shared one once, a local one on each node (each node's `local`
    # is a different disk); PBS-backed storages through PBS itself when it is configured here.
    storages = {}
    for storage in (r for r in resources if r.get("type") == "storage" and "backup" in (r.get("content") or "")
                    and r.get("status") == "available" and not (pbs and r.get("plugintype") == "pbs")):
        key = storage["storage"] if storage.get("shared") else f"{storage['storage']}@{storage['node']}"
        storages.setdefault(key, (storage["storage"], storage["node"]))
    for key, (name, node) in sorted(storages.items()):
        for volume in report.section(f"storage {key}", lambda n=node, s=name: client.get(
                f"/nodes/{n}/storage/{s}/content", content="backup")) or []:
            if volume.get("vmid"):
                consider(int(volume["vmid"]), volume.get("ctime") or 0, key,
                         (volume.get("verification") or {}).get("state"))
    pbs_groups: set[tuple[str, int]] = set()
    if pbs is not None:
        for ds in report.section("pbs datastores", lambda: pbs.get("/admin/datastore")) or []:
            for snap in report.section(f"pbs {ds['store']}", lambda s=ds["store"]: pbs.get(
                    f"/admin/datastore/{s}/snapshots")) or []:
                if snap.get("backup-type") in ("vm", "ct") and str(snap.get("backup-id", "")).isdigit():
                    vmid = int(snap["backup-id"])
                    pbs_groups.add((snap["backup-type"], vmid))
                    consider(vmid, snap["backup-time"], f"pbs:{ds['store']}",
                             (snap.get("verification") or {}).get("state", "none"))
    elif "pbs host" in report.checked:
        report.checked.remove("pbs host")
    rows, now = [], time.time()
    for guest in sorted(guests, key=lambda g: g["vmid"]):
        vmid = int(guest["vmid"])
        covering, excluding = _jobs_for(vmid, guest.get("pool"), jobs)
        last = newest.get(vmid)
        age = round((now - last["ctime"]) / 3600, 1) if last else None
        state = "missing" if not last else ("stale" if age > max_age_hours else "ok")
        if last and last["verify"] in ("failed",):
            state = "verify_failed"
        rows.append({"vmid": vmid, "name": guest.get("name"), "newest": iso_time(last["ctime"]) if last else "",
                     "age_h": age if age is not None else "", "where": last["where"] if last else "",
                     "verify": (last or {}).get("verify") or "", "jobs": ",".join(covering),
                     "excluded_by": ",".join(excluding), "state": state})
        if state != "ok":
            severity = "critical" if state in ("missing", "verify_failed") else "warning"
            why = "no job covers it" if not covering else f"covered by {', '.join(covering)}"
            report.add(severity, "backups", f"guest {vmid} ({guest.get('name')}) backup is {state}; {why}",
                       {"newest": iso_time(last["ctime"]) if last else None, "excluded_by": excluding},
                       "write_backup_guest now, and add it to a backup job")
    known = {int(g["vmid"]) for g in guests}
    orphans = sorted(f"{kind}/{vmid}" for kind, vmid in pbs_groups if vmid not in known)
    for group in orphans:
        report.add("info", "backups", f"PBS group {group} has no guest any more", {"group": group},
                   "keep it as an archive or prune it (write_pbs_prune)")
    columns = ["vmid", "name", "newest", "age_h", "where", "verify", "jobs", "excluded_by", "state"]
    return report.answer(guests={"columns": columns, "rows": [[r[c] for c in columns] for r in rows]},
                         orphan_pbs_groups=orphans)


# ---------------------------------------------------------------- security

def security_audit(host: Host = None, max_guests: Annotated[int, Field(ge=0, le=1000)] = 200) -> dict:
    """Security findings: tokens, ACLs, firewalls, privileged CTs, devices, this server."""
    client = pve_client(host)
    report = Report({"max_guests": max_guests})
    for user in report.section("users and tokens", lambda: client.get("/access/users", full=1)) or []:
        for token in user.get("tokens") or []:
            name = f"{user['userid']}!{token['tokenid']}"
            if not token.get("expire"):
                report.add("warning", "tokens", f"token {name} never expires", token, "set an expiry date")
            if not token.get("privsep"):
                report.add("warning", "tokens", f"token {name} has privilege separation off (all of its user's rights)",
                           token, "recreate it with --privsep 1 and its own ACL")
            if user["userid"] == "root@pam":
                report.add("critical", "tokens", f"token {name} belongs to root@pam", token,
                           "use a dedicated user with only the roles it needs")
    for entry in report.section("acl", lambda: client.get("/access/acl")) or []:
        if entry.get("path") == "/" and entry.get("roleid") in ("Administrator", "PVEAdmin") and entry.get("ugid") != "root@pam":
            report.add("warning", "acl", f"{entry['ugid']} holds {entry['roleid']} on / (everything)", entry,
                       "grant narrower roles on narrower paths")
    cluster_fw = report.section("datacenter firewall", lambda: client.get("/cluster/firewall/options")) or {}
    if "datacenter firewall" in report.checked and not cluster_fw.get("enable"):
        report.add("warning", "firewall", "the datacenter firewall is off", cluster_fw, "enable it after adding rules")
    resources = report.section("inventory", lambda: client.get("/cluster/resources")) or []
    for node in (r["node"] for r in resources if r.get("type") == "node" and r.get("status") == "online"):
        options = report.section(f"firewall {node}", lambda n=node: client.get(f"/nodes/{n}/firewall/options"))
        if options is not None and not options.get("enable", 1):
            report.add("info", "firewall", f"the firewall of node {node} is off", options, "enable it per node")
    guests = [r for r in resources if r.get("type") in ("qemu", "lxc")][:max_guests]
    for guest in guests:
        base = f"/nodes/{guest['node']}/{guest['type']}/{guest['vmid']}"
        config = report.section(f"config {guest['vmid']}", lambda b=base: client.get(f"{b}/config"))
        if config is None:
            continue
        report.checked.pop()  # one line for all guest configs instead
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
        if not any("firewall=1" in str(v) for k, v in config.items() if k.startswith("net")):
            report.add("info", "firewall", f"{label} has no NIC with the firewall on", {}, "write_set_nic firewall=true")
    report.checked.append(f"configs of {len(guests)} guests")
    not_checked = ["guest firewall rules themselves", "node SSH and OS hardening", "TLS certificates' issuers",
                   "two-factor authentication of users"]
    if len(resources) and len([r for r in resources if r.get("type") in ("qemu", "lxc")]) > max_guests:
        not_checked.append(f"guests beyond the first {max_guests}")
    rules = policy.SETTINGS.hosts.get(("pve", client.host.label), policy.HostPolicy())
    for gate in ("exec", "elevated"):
        if gate in rules.allow:
            report.add("warning", "this server", f"the {gate} gate is open for host '{client.host.label}'",
                       {"gate": gate}, f"close it unless needed ({policy.how_to_open(gate, client.host.label, 'pve')})")
    if RUNTIME.get("transport") == "http":
        report.add("info", "this server", "this server speaks plain HTTP; put TLS in front for remote clients",
                   {"transport": "http"}, "use a reverse proxy with TLS")
    return report.answer(not_checked=not_checked)


# ---------------------------------------------------------------- waiting for any task

def wait_task(upid: str,
              host: Host = None,
              wait_seconds: Annotated[int, Field(ge=1, le=3600)] = 60, ctx: Context | None = None) -> dict:
    """Wait for a PVE or PBS task to end, with progress."""
    product = "pbs" if _looks_pbs(upid) else "pve"
    client = pbs_client(host) if product == "pbs" else pve_client(host)
    return task_report(client, upid, wait_seconds, 20, ctx, "wait_task")


def _looks_pbs(upid: str) -> bool:
    try:
        proxmox_client.parse_upid(upid, "pbs")
        return True
    except ProxmoxError:
        return False


# ---------------------------------------------------------------- provisioning in one call

def _node_with_room(client: ProxmoxClient, memory_mb: int) -> str:
    nodes = [r for r in client.get("/cluster/resources", type="node") or [] if r.get("status") == "online"]
    free = sorted(nodes, key=lambda n: (n.get("maxmem", 0) - n.get("mem", 0)), reverse=True)
    if not free or (free[0].get("maxmem", 0) - free[0].get("mem", 0)) < memory_mb * 1024 * 1024:
        raise ProxmoxError(f"No online node has {memory_mb} MiB of free memory.")
    return free[0]["node"]


def _uplinked_bridge(client: ProxmoxClient, node: str) -> str:
    uplinked = [b["bridge"] for b in bridges(client, node) if b["segment"] == "uplinked"]
    if not uplinked:
        raise ProxmoxError(f"Node {node} has no bridge with an uplink port; give bridge explicitly.")
    return uplinked[0]


class Steps:
    """Each step of a recipe: done, skipped, warning, failed or still_running."""

    def __init__(self) -> None:
        self.steps: list[dict] = []
        self.created: list[str] = []

    def record(self, step: str, state: str, **detail: Any) -> None:
        self.steps.append({"step": step, "state": state} | {k: v for k, v in detail.items() if v is not None})

    def answer(self, ok: bool, **extra: Any) -> dict:
        result = {"result": "ok" if ok else "failed", "steps": self.steps} | extra
        if not ok:
            result["created"] = self.created
            result["note"] = ("Nothing was deleted. " + (f"Left behind: {', '.join(self.created)}." if self.created
                                                        else "Nothing was created."))
        return result


def _wait_for_address(client: ProxmoxClient, base: str, kind: str, seconds: int) -> str | None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if kind == "lxc":
                for iface in client.get(f"{base}/interfaces") or []:
                    if iface.get("name") != "lo" and iface.get("inet"):
                        return iface["inet"]
            else:
                result = (client.get(f"{base}/agent/network-get-interfaces") or {}).get("result", [])
                for iface in result:
                    for address in iface.get("ip-addresses", []):
                        if iface.get("name") != "lo" and address.get("ip-address-type") == "ipv4":
                            return address["ip-address"]
        except ProxmoxError:
            pass  # not up yet
        time.sleep(1)  # polling the guest for an address
    return None


def _provision(kind: str, create: Callable[[str, int, str], dict], memory_mb: int, host: str | None,
               node: str | None, bridge: str | None, wait_seconds: int, ctx: Context | None) -> dict:
    client = pve_client(host)
    steps = Steps()
    try:
        node = check_node(client, node) if node else _node_with_room(client, memory_mb)
        steps.record("pick node", "done", node=node)
        vmid = next_vmid(client)
        steps.record("next vmid", "done", vmid=vmid)
        bridge = bridge or _uplinked_bridge(client, node)
        steps.record("pick bridge", "done", bridge=bridge)
        created = create(node, vmid, bridge)
        steps.created.append(f"{kind} {vmid} on {node}")
        steps.record("create", created.get("status", "done") if created.get("status") == "still_running" else "done",
                     upid=created.get("upid"))
        if created.get("status") == "still_running":
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
        return steps.answer(False)


def write_provision_lxc(hostname: GuestName,
                        template: Volid,
                        host: Host = None, node: str | None = None,
                        memory_mb: Annotated[int, Field(ge=16)] = 1024, cores: Annotated[int, Field(ge=1, le=64)] = 1,
                        disk_gb: Annotated[int, Field(ge=1)] = 8, storage: str = "local-lvm",
                        bridge: str | None = None,
                        ssh_keys: str | None = None, wait_seconds: WaitArg = 120, dry_run: DryRunArg = False,
                        ctx: Context | None = None) -> dict:
    """Create and start a DHCP container in one call; answers its IP and each step."""

    def create(node: str, vmid: int, bridge: str) -> dict:
        return pve_tools.write_create_lxc(hostname, template, host=host, node=node, vmid=vmid, memory_mb=memory_mb,
                                          cores=cores, disk_gb=disk_gb, storage=storage, bridge=bridge,
                                          ssh_keys=ssh_keys, wait_seconds=wait_seconds, ctx=ctx)
    return _provision("lxc", create, memory_mb, host, node, bridge, wait_seconds, ctx)


def write_provision_vm(name: GuestName,
                       cloud_image: Volid,
                       host: Host = None, node: str | None = None,
                       memory_mb: Annotated[int, Field(ge=64)] = 2048, cores: Annotated[int, Field(ge=1, le=64)] = 2,
                       disk_gb: Annotated[int, Field(ge=1)] = 32, storage: str = "local-lvm",
                       bridge: str | None = None,
                       ciuser: str | None = None, ssh_keys: str | None = None, wait_seconds: WaitArg = 180,
                       dry_run: DryRunArg = False, ctx: Context | None = None) -> dict:
    """Create and start a cloud-init VM in one call; answers its IP and each step."""

    def create(node: str, vmid: int, bridge: str) -> dict:
        return pve_tools.write_create_vm(name, host=host, node=node, vmid=vmid, cloud_image=cloud_image,
                                         memory_mb=memory_mb, cores=cores, disk_gb=disk_gb, storage=storage,
                                         bridge=bridge, ciuser=ciuser, ssh_keys=ssh_keys,
                                         wait_seconds=wait_seconds, ctx=ctx)
    return _provision("qemu", create, memory_mb, host, node, bridge, wait_seconds, ctx)


# ---------------------------------------------------------------- restore drill

def write_restore_drill(vmid: Vmid, host: Host = None,
                        backup: Annotated[str | None, Field(description="volid")] = None,
                        scratch_vmid: OptionalVmid = None,
                        answer_seconds: Annotated[int, Field(ge=5, le=1800)] = 120,
                        dry_run: DryRunArg = False, confirm: ConfirmArg = False, ctx: Context | None = None) -> dict:
    """Prove a backup restores: restore offline to a scratch vmid, boot, time, delete it."""
    client = pve_client(host)
    source = resolve_guest(client, vmid)
    kind = source["type"]
    if backup is None:
        found = pve_tools.list_backups(host=host, vmid=vmid, limit=1)["rows"]
        if not found:
            raise ProxmoxError(f"Guest {vmid} has no backup to drill; back it up first (write_backup_guest).")
        backup = found[0][0]
    taken = {g["vmid"] for g in guest_resources(client, fresh=True)}
    if scratch_vmid is not None and scratch_vmid in taken:
        raise InvalidArgument(f"Scratch vmid {scratch_vmid} exists; the drill only creates and destroys its own guest.")
    scratch = scratch_vmid or next_vmid(client)
    steps, timings = Steps(), {}
    started = time.monotonic()
    base = None
    try:
        node = _node_with_room(client, 512)
        restored = pve_tools.write_restore_backup(backup, host=host, vmid=scratch, node=node, wait_seconds=answer_seconds * 5,
                                                  ctx=ctx)
        steps.created.append(f"{kind} {scratch} on {node} (scratch)")
        base = f"/nodes/{node}/{kind}/{scratch}"
        timings["restore_s"] = round(time.monotonic() - started, 1)
        steps.record("restore", "done", vmid=scratch, node=node, backup=backup, upid=restored.get("upid"))
        config = client.get(f"{base}/config") or {}
        cut = {}
        isolated = [b["bridge"] for b in bridges(client, node) if b["segment"] == "isolated"]
        for key, value in config.items():
            if key.startswith("net"):
                if kind == "qemu":
                    cut[key] = str(value) + ",link_down=1"
                elif isolated:
                    cut[key] = ",".join(p if not p.startswith("bridge=") else f"bridge={isolated[0]}"
                                        for p in str(value).split(","))
                else:
                    cut.setdefault("delete", []).append(key)
        if cut:
            params = {k: v for k, v in cut.items() if k != "delete"} | {"digest": config.get("digest")}
            if cut.get("delete"):
                params["delete"] = ",".join(cut["delete"])
            client.request("PUT", f"{base}/config", params)
        steps.record("cut network", "done", how="link_down" if kind == "qemu" else (
            f"bridge {isolated[0]}" if isolated else "NICs removed"))
        t0 = time.monotonic()
        run_task(client, "POST", f"{base}/status/start", {}, answer_seconds, ctx, f"start {scratch}")
        timings["start_s"] = round(time.monotonic() - t0, 1)
        steps.record("start", "done")
        t0 = time.monotonic()
        answered = _guest_answers(client, base, kind, answer_seconds)
        timings["answer_s"] = round(time.monotonic() - t0, 1)
        steps.record("guest answers", "done" if answered else "failed",
                     detail=None if answered else f"no answer within {answer_seconds} s")
        ok = answered
    except ToolFailure as exc:
        steps.record("error", "failed", detail=str(exc)[:300])
        ok = False
    if base is not None:
        try:
            status = client.get(f"{base}/status/current") or {}
            if status.get("status") == "running":
                run_task(client, "POST", f"{base}/status/stop", {}, 60, ctx, f"stop {scratch}")
            run_task(client, "DELETE", base, {"purge": True}, 120, ctx, f"destroy scratch {scratch}")
            steps.created.clear()
            steps.record("destroy scratch", "done", vmid=scratch)
        except ToolFailure as exc:
            steps.record("destroy scratch", "failed", detail=str(exc)[:300])
    timings["total_s"] = round(time.monotonic() - started, 1)
    return steps.answer(ok, vmid=vmid, backup=backup, scratch_vmid=scratch, timings=timings)


def _guest_answers(client: ProxmoxClient, base: str, kind: str, seconds: int) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if kind == "qemu":
                client.request("POST", f"{base}/agent/ping", {})
                return True
            if (client.get(f"{base}/status/current") or {}).get("status") == "running" and client.get(f"{base}/interfaces"):
                return True
        except ProxmoxError:
            pass
        time.sleep(1)  # polling the scratch guest
    return False


# ---------------------------------------------------------------- resources and prompts

def _json(data: Any) -> str:
    import json
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


RESOURCES = [("proxmox://{host}/cluster", resource_cluster), ("proxmox://{host}/nodes", resource_nodes),
             ("proxmox://{host}/guests", resource_guests), ("proxmox://{host}/storage", resource_storage),
             ("proxmox://{host}/tasks", resource_tasks), ("pbs://{host}/datastores", resource_datastores)]


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
            "write_snapshot_create before risky changes. 3. Run the change with dry_run=true and show "
            "the request. 4. After the user agrees, run it. 5. Verify with get_guest; offer "
            "write_snapshot_rollback if it went wrong.")


def backup_review() -> str:
    """Check that every guest is backed up and restorable."""
    return ("Call backup_coverage. List guests that are missing, stale or failed verification, and the "
            "jobs that exclude them; name PBS groups without a guest. Suggest write_backup_guest for the "
            "gaps and a write_restore_drill for the most important guest; change nothing unasked.")


def security_review() -> str:
    """Review security settings."""
    return ("Call security_audit and server_info. Explain each finding in plain words with its fix, "
            "critical first. Say clearly what was not checked. Make no change.")


PROMPTS = [cluster_health_review, troubleshoot_guest, provision_lxc, safe_guest_change, backup_review,
           security_review]
