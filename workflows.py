"""Workflows: the questions operators ask, answered in one call by reading across nodes, guests,
storage, PVE and PBS: backup coverage, the security audit, waiting for any task, the restore drill
(health_check is health.py; making guests, provisioning.py). A section that cannot be read is
listed under `unavailable` with the reason and never counts as healthy (findings.py: the report).
Resources and prompts for MCP clients are defined here too.
"""
import json
import time
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable

from mcp.server.mcpserver import Context
from pydantic import Field

import config_diff
import pbs_tools
import policy
import privileges
import health
import pve_tools
import runtime
from answers import LIST_CAP, ConfirmArg, DryRunArg, Host, Offset, OptionalVmid, Vmid, capped, iso_time, table
from errors import InvalidArgument, ProxmoxError, ToolFailure
from findings import Report
from inventory import (archive_node, backup_storages, backup_volumes, bridges, cluster_resources, guest_resources,
                       hidden_backups,
                       hidden_note, job_selects, next_vmid, pbs_backed_storages, pbs_of, pick_node, resolve_guest,
                       storage_rows, vmid_set)
from fanout import in_parallel
from proxmox_client import ProxmoxClient, poll, pve_client
from settings import HostPolicy
from tasks import Steps, run_task


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
    c.pbs = c.report.section("pbs host", lambda: pbs_of(c.pbs_host))
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
                      and privileges.holds(c.client.host, "Pool.Audit", f"/pool/{j['pool']}") is False}
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
        if privileges.holds(pbs.host, "Datastore.Audit", acl_path) is False:
            c.unseen[where] = sorted(int(g["vmid"]) for g in c.guests)
            c.report.unavailable.append({"section": where, "reason": "partly: the token lacks Datastore.Audit on "
                                         f"{acl_path}, so PBS lists only the groups it owns. "
                                         + privileges.grant_hint(pbs.host, "Datastore.Audit", acl_path)})
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
    rules = policy.settings().hosts.get(("pve", label), HostPolicy())
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
    return archive_node(client, backup, pick_node(client, 512)[0] if shared else None)


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
                        storage: Annotated[str | None, Field(description="for its disks")] = None,
                        answer_seconds: Annotated[int, Field(ge=5, le=1800)] = 120,
                        dry_run: DryRunArg = False, confirm: ConfirmArg = False, ctx: Context | None = None) -> dict:
    """Prove a backup restores: scratch vmid, offline; boot, time, delete."""
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
    return _json(health.health_check(host=host))


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
            f"for failed tasks and get_task start=0 of the newest failure; for a running VM guest_agent_info; "
            f"node_status of its node. Report the cause with evidence. Before any change, show the exact "
            f"write with dry_run=true and ask the user.")


def provision_lxc() -> str:
    """Create a container safely."""
    return ("Ask for hostname, size and purpose. storage_content content=vztmpl to pick a template "
            "(write_download_url if none), list_networks to pick a bridge with an uplink. Then "
            "write_create_lxc with start=true and dry_run=true, show it, and run it after the user agrees.")


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
