"""Proxmox Backup Server: the handlers behind the PBS API paths the simulator keeps state
for, PBS's prune selection, and `PBS_HANDLERS`, the table from (METHOD, path template) to
handler."""
from __future__ import annotations

import time
from datetime import datetime
from typing import Callable
from zoneinfo import ZoneInfo

from .call import ApiError, Call, _permissions
from .file_restore import PBS_FILE_HANDLERS
from .lab import GiB, Lab, Task

# What a Backup Server release offers, by the first release that has it (docs/PROXMOX-BEHAVIOUR.md#pbs-releases)
SINCE = {"gc-jobs": (3, 2, 0),  # GET /admin/gc; job times in GET /admin/datastore/{store}/gc
         "sync-direction": (3, 2, 11),  # the parameter of GET /admin/sync, push sync jobs
         "mount-status": (3, 2, 12),  # removable datastores
         "s3": (4, 0, 0),  # datastores with an S3 backend
         "backend-type": (4, 1, 2)}  # `backend-type` in the status answers (first release not verified)
PATHS_SINCE = {("GET", "/admin/gc"): "gc-jobs"}
PARAMS_SINCE = {("GET", "/admin/sync"): {"sync-direction": "sync-direction"}}


def has(lab: Lab, feature: str) -> bool:
    return lab.pbs_release >= SINCE[feature]


def as_release(lab: Lab, release: tuple[int, int, int]) -> Lab:
    """Make the lab's Backup Server an older (or newer) release, without what that one cannot hold:
    push sync jobs before they existed, S3 datastores before 4.0."""
    lab.pbs_release = release
    if not has(lab, "sync-direction"):
        lab.pbs_jobs["sync"] = [j for j in lab.pbs_jobs.get("sync", []) if j.get("sync-direction") != "push"]
    if not has(lab, "s3"):
        lab.datastores = {name: ds for name, ds in lab.datastores.items() if ds.get("backend") != "s3"}
    return lab


def check_release(lab: Lab, method: str, template: str, path: str, params: dict) -> None:
    """Refuse what this release does not have, as it would: a path it lacks is 404 `Path ... not found.`
    (proxmox-rest-server src/rest.rs), a parameter it lacks 400 (additional properties are refused by the
    schema); both count as schema rejections, the project sent something this server does not take."""
    feature = PATHS_SINCE.get((method, template))
    if feature and not has(lab, feature):
        lab.schema_rejections.append(("pbs", method, path, {"path": f"not in PBS {lab.pbs_release}"}))
        raise ApiError(404, f"Path '/api2/json{path}' not found.")
    unknown = {name: "schema does not allow additional properties"
               for name, feature in PARAMS_SINCE.get((method, template), {}).items()
               if name in params and not has(lab, feature)}
    if unknown:
        lab.schema_rejections.append(("pbs", method, path, unknown))
        raise ApiError(400, "parameter verification failed", unknown)


def pbs_version(call: Call, **_: str) -> dict:
    """`version` is major.minor, `release` the package's patch number (proxmox-backup src/api2/version.rs)."""
    major, minor, patch = call.lab.pbs_release
    return {"version": f"{major}.{minor}", "release": str(patch), "repoid": "5a1e0c5f"}


def pbs_permissions(call: Call, **_: str) -> dict:
    return _permissions(call, bool)


def _datastore(call: Call, store: str, *, opened: bool = True) -> dict:
    """A datastore by name; `opened`: one that can be read (not offline or unmounted)."""
    found = call.lab.datastores.get(store)
    if found is None:
        raise ApiError(400, f"unable to get datastore '{store}' - datastore '{store}' does not exist")
    if opened and found["error"]:
        raise ApiError(400, found["error"])
    return found


def _visible(call: Call, name: str) -> bool:
    # stores the caller may Audit or Backup (docs/PROXMOX-BEHAVIOUR.md#datastores-and-namespaces)
    return call.can(f"/datastore/{name}", "Datastore.Audit") or call.can(f"/datastore/{name}", "Datastore.Backup")


def _mount_status(ds: dict) -> str:
    if not ds.get("removable"):
        return "nonremovable"
    return "notmounted" if ds["error"] else "mounted"


def store_unavailable(lab: Lab, store: str, why: str, message: str = "disk swap") -> None:
    """A store PBS cannot open, with the text its status row carries as `error`: `unmounted` (a
    removable store whose drive is not mounted), `offline` (offline maintenance), `broken` (its chunk
    store is gone) (pbs-datastore src/datastore.rs lookup_datastore, chunk_store.rs open; pbs-api-types
    src/maintenance.rs check: PBS 4 says "is unavailable:", 3.x "is in")."""
    ds, path = lab.datastores[store], f'"/mnt/datastore/{store}/.chunks"'
    texts = {"unmounted": f"datastore '{store}' is not mounted",
             "offline": f"datastore '{store}' is {'unavailable:' if lab.pbs_release >= (4, 0, 0) else 'in'} "
                        f"offline maintenance mode: {message}",
             "broken": f"unable to open chunk store '{store}' at {path} - No such file or directory (os error 2)"}
    ds["error"], ds["removable"] = texts[why], why == "unmounted" or ds.get("removable", False)


def _release_fields(call: Call, ds: dict) -> dict:
    """What a store's rows carry besides its figures, as the release has them: `mount-status` from
    removable datastores on, `backend-type` (an S3 store's figures are its local cache's:
    docs/PROXMOX-BEHAVIOUR.md#s3-datastores)."""
    fields = {}
    if has(call.lab, "mount-status"):
        fields["mount-status"] = _mount_status(ds)
    if has(call.lab, "backend-type"):
        fields["backend-type"] = ds.get("backend", "filesystem")
    return fields


def pbs_datastores(call: Call, **_: str) -> list:
    return [{"store": name, "comment": ""} | _release_fields(call, ds)
            for name, ds in call.lab.datastores.items() if _visible(call, name)]


def _full_date(ds: dict, now: int) -> int:
    """estimated-full-date from the month's trend: 0 when usage is flat, in the past when it shrinks
    (proxmox-backup src/api2/status/mod.rs, datastore_status; docs/PROXMOX-BEHAVIOUR.md#datastores-and-namespaces)."""
    growth = ds.get("growth", 5 * GiB)  # bytes per day
    return 0 if growth == 0 else now + (ds["total"] - ds["used"]) // growth * 86400


def pbs_datastore_usage(call: Call) -> list:
    now = int(time.time())
    rows = []
    for name, ds in call.lab.datastores.items():
        if not _visible(call, name):
            continue
        if ds["error"]:  # cannot be opened: a bare row (docs/PROXMOX-BEHAVIOUR.md#datastores-and-namespaces)
            rows.append({"store": name, "error": ds["error"]} | _release_fields(call, ds))
            continue
        rows.append({"store": name, "total": ds["total"], "used": ds["used"], "avail": ds["total"] - ds["used"],
                     "estimated-full-date": _full_date(ds, now), "history-start": now - 30 * 86400,
                     "history-delta": 86400, "gc-status": dict(ds["gc"])} | _release_fields(call, ds))
    return rows


def pbs_datastore_status(call: Call, store: str) -> dict:
    ds = _datastore(call, store)
    result = {"total": ds["total"], "used": ds["used"], "avail": ds["total"] - ds["used"]}
    if has(call.lab, "backend-type"):
        result["backend-type"] = ds.get("backend", "filesystem")
    if str(call.arg("verbose", "0")) == "1":
        counts: dict[str, dict] = {}
        for (_, kind, _), snaps in ds["groups"].items():
            entry = counts.setdefault(kind, {"groups": 0, "snapshots": 0})
            entry["groups"] += 1
            entry["snapshots"] += len(snaps)
        result |= {"counts": counts, "gc-status": dict(ds["gc"])}
    return result


def pbs_datastore_config(call: Call, **_: str) -> list:
    """GET /config/datastore: the configuration of the stores the caller may audit; an S3 store names
    its backend as `type=s3,client=...,bucket=...` (proxmox-backup src/api2/config/datastore.rs,
    list_datastores; docs/PROXMOX-BEHAVIOUR.md#s3-datastores)."""
    return [_store_config(name, ds) for name, ds in call.lab.datastores.items()
            if call.can(f"/datastore/{name}", "Datastore.Audit")]


def _store_config(name: str, ds: dict) -> dict:
    row = {"name": name, "path": f"/mnt/datastore/{name}", "gc-schedule": ds["gc_job"]["schedule"]}
    if ds.get("backend") == "s3":
        row["backend"] = f"bucket={name}-bucket,client=s3-endpoint,type=s3"
    return row


def pbs_store_config(call: Call, name: str) -> dict:
    return _store_config(name, _datastore(call, name, opened=False))


def _ns(call: Call) -> str:
    return call.arg("ns", "") or ""


def pbs_namespaces(call: Call, store: str) -> list:
    ds = _datastore(call, store)
    return [{"ns": ns, "comment": comment} if ns else {"ns": ""} for ns, comment in ds["namespaces"].items()]


def _owned_only(call: Call, store: str) -> bool:
    """Whether a group or snapshot list shows only the caller's own groups: with Datastore.Audit on the
    namespace it shows all, with Datastore.Backup its own, without either it is refused (proxmox-backup
    src/backup/hierarchy.rs, check_ns_privs_full; docs/PROXMOX-BEHAVIOUR.md#datastores-and-namespaces)."""
    path = f"/datastore/{store}" + (f"/{_ns(call)}" if _ns(call) else "")
    if call.can(path, "Datastore.Audit"):
        return False
    if call.can(path, "Datastore.Backup"):
        return True
    raise ApiError(403, f"permission check failed - missing Datastore.Audit|Datastore.Backup on {path}")


def _listed(call: Call, owned_only: bool, owner: str) -> bool:
    """The caller's own: owned by it, or by one of its tokens when it is a user (pbs-datastore
    src/datastore.rs, check_backup_owner)."""
    return not owned_only or owner == call.token_id or owner.split("!")[0] == call.token_id


def pbs_groups(call: Call, store: str) -> list:
    ds = _datastore(call, store)
    owned_only = _owned_only(call, store)
    rows = []
    for (ns, kind, item), snaps in sorted(ds["groups"].items()):
        if ns != _ns(call) or not snaps or not _listed(call, owned_only, snaps[0]["owner"]):
            continue
        rows.append({"backup-type": kind, "backup-id": item, "last-backup": max(x["backup-time"] for x in snaps),
                     "backup-count": len(snaps), "owner": snaps[0]["owner"],
                     "files": ["index.json.blob", "drive-scsi0.img.fidx"]})
    return rows


def pbs_snapshots(call: Call, store: str) -> list:
    ds = _datastore(call, store)
    owned_only = _owned_only(call, store)
    rows = []
    for (ns, kind, item), snaps in sorted(ds["groups"].items()):
        if ns != _ns(call) or call.arg("backup-type") not in (None, kind) or call.arg("backup-id") not in (None, item):
            continue
        if snaps and not _listed(call, owned_only, snaps[0]["owner"]):
            continue
        for snap in snaps:
            row = {"backup-type": kind, "backup-id": item, "backup-time": snap["backup-time"], "size": snap["size"],
                   "protected": snap["protected"], "owner": snap["owner"],
                   "comment": snap["comment"].split("\n")[0] or None,  # the notes' first line
                   "files": [{"filename": "index.json.blob", "crypt-mode": snap["crypt-mode"], "size": 512}]}
            if snap["verification"]:
                row["verification"] = snap["verification"]
            rows.append({k: v for k, v in row.items() if v is not None})
    return rows


def _group(call: Call, ds: dict) -> list[dict]:
    key = (_ns(call), call.arg("backup-type"), call.arg("backup-id"))
    if key not in ds["groups"]:
        raise ApiError(400, f"group '{key[1]}/{key[2]}' does not exist")
    return ds["groups"][key]


def _snapshot(call: Call, ds: dict) -> dict:
    for snap in _group(call, ds):
        if snap["backup-time"] == int(call.arg("backup-time")):
            return snap
    raise ApiError(400, "snapshot does not exist")


PRUNE_PERIODS = (("keep-last", None), ("keep-hourly", "%Y/%m/%d/%H"), ("keep-daily", "%Y/%m/%d"),
                 ("keep-weekly", "%G/%V"), ("keep-monthly", "%Y/%m"), ("keep-yearly", "%Y"))


def _period_of(snap: dict, period: str | None, zone: str) -> str:
    """The period a snapshot falls in for one keep option, in the server's local time (prune.rs:
    strftime_local); with keep-last each snapshot is its own."""
    moment = snap["backup-time"]
    return str(moment) if period is None else datetime.fromtimestamp(moment, ZoneInfo(zone)).strftime(period)


def prune_marks(snapshots: list[dict], options: dict[str, int], zone: str = "UTC") -> dict[int, str]:
    """PBS's prune selection (proxmox-backup, prune.rs): newest first; each keep option keeps
    the newest snapshot of its next N periods of local time in `zone`, skipping periods an earlier
    option already covered and snapshots already marked; protected snapshots are always kept; with
    no keep option everything is kept. Returns backup-time -> keep | remove | protected, oldest first."""
    ordered = sorted(snapshots, key=lambda x: -x["backup-time"])
    if not any(options.get(name) for name, _ in PRUNE_PERIODS):
        return {x["backup-time"]: "protected" if x["protected"] else "keep" for x in ordered}
    mark: dict[int, str] = {}
    for name, period in PRUNE_PERIODS:
        keep = options.get(name)
        if not keep:
            continue
        already = {_period_of(x, period, zone) for x in ordered if mark.get(x["backup-time"]) == "keep"}
        included: set[str] = set()
        for snap in ordered:
            if snap["backup-time"] in mark:
                continue
            if snap["protected"]:
                mark[snap["backup-time"]] = "protected"
                continue
            selected = _period_of(snap, period, zone)
            if selected in already:
                continue
            if selected not in included:
                if len(included) >= keep:
                    break
                included.add(selected)
                mark[snap["backup-time"]] = "keep"
            else:
                mark[snap["backup-time"]] = "remove"
    return {x["backup-time"]: "protected" if x["protected"] else mark.get(x["backup-time"], "remove")
            for x in reversed(ordered)}


def pbs_prune(call: Call, store: str) -> list | str:
    """The group's snapshots with their marks, oldest first as PBS deletes them (datastore.rs prune:
    `prune_info.reverse()`; docs/PROXMOX-BEHAVIOUR.md#prune-and-forget)."""
    ds = _datastore(call, store)
    snaps = _group(call, ds)
    options = {name: int(call.arg(name)) for name, _ in PRUNE_PERIODS if call.arg(name) is not None}
    marks = prune_marks(snaps, options, call.lab.pbs_timezone)
    rows = [{"backup-type": call.arg("backup-type"), "backup-id": call.arg("backup-id"), "backup-time": t,
             "keep": verdict != "remove", "protected": verdict == "protected"} for t, verdict in marks.items()]
    if str(call.arg("dry-run", "0")) != "1":
        ds["groups"][(_ns(call), call.arg("backup-type"), call.arg("backup-id"))] = [
            x for x in snaps if marks[x["backup-time"]] != "remove"]
    return rows


def pbs_forget(call: Call, store: str) -> None:
    ds = _datastore(call, store)
    snap = _snapshot(call, ds)
    if snap["protected"]:
        raise ApiError(400, "cannot remove protected snapshot")
    _group(call, ds).remove(snap)


def pbs_set_protected(call: Call, store: str) -> None:
    _snapshot(call, _datastore(call, store))["protected"] = str(call.arg("protected")) in ("1", "true")


def pbs_set_notes(call: Call, store: str) -> None:
    _snapshot(call, _datastore(call, store))["comment"] = str(call.arg("notes"))


def pbs_get_notes(call: Call, store: str) -> str:
    """A snapshot's notes, whole; "" when it has none (proxmox-backup src/api2/admin/datastore.rs get_notes)."""
    return _snapshot(call, _datastore(call, store))["comment"] or ""


def pbs_get_protection(call: Call, store: str) -> bool:
    """Whether a snapshot is protected (datastore.rs get_protection)."""
    return bool(_snapshot(call, _datastore(call, store))["protected"])


def _gc_job(name: str, ds: dict) -> dict:
    """GET /admin/gc row and GET /admin/datastore/{store}/gc: the counters and the job's times; while a
    collection runs, the job has no last-run fields (docs/PROXMOX-BEHAVIOUR.md#garbage-collection)."""
    return {"store": name, **ds["gc"], **ds["gc_job"]}


def pbs_gc_status(call: Call, store: str) -> dict:
    """Before the GC jobs (3.2.0) this answered the counters alone (docs/PROXMOX-BEHAVIOUR.md#pbs-releases)."""
    ds = _datastore(call, store)
    return _gc_job(store, ds) if has(call.lab, "gc-jobs") else dict(ds["gc"])


def _run_as_job(call: Call, job: dict, upid: str, on_finish: Callable[[str], None] | None = None) -> str:
    """A job's state follows its task: while it runs only `last-run-upid`, then the task's state and end
    (proxmox-backup src/server/jobstate.rs, compute_schedule_status; docs/PROXMOX-BEHAVIOUR.md#pbs-jobs)."""
    task = call.lab.tasks[upid]
    for key in ("last-run-state", "last-run-endtime", "duration"):
        job.pop(key, None)
    job["last-run-upid"] = upid

    def finish() -> None:
        job.update({"last-run-state": task.exitstatus, "last-run-endtime": int(time.time())})
        if on_finish:
            on_finish(task.exitstatus)
    task.on_end = finish
    return upid


def pbs_gc_start(call: Call, store: str) -> str:
    ds = _datastore(call, store)
    removed = int(1.2 * GiB)
    lines = ["starting garbage collection on store " + store, "Start GC phase1 (mark used chunks)"] + \
        [f"marked {p}% ({p * 120 // 100} of 120 index files)" for p in (25, 50, 75, 100)] + \
        ["Start GC phase2 (sweep unused chunks)", "Removed garbage: 1.2 GiB", "Removed chunks: 612",
         "Pending removals: 0 B (in 0 chunks)"]
    upid = call.lab.start_task("pbs", "garbage_collection", store, user=call.token_id, lines=lines, product="pbs")

    def counters(_state: str) -> None:  # the finished run's counters, under its UPID (datastore.rs)
        ds["used"] -= removed
        ds["gc"] |= {"upid": upid, "removed-bytes": removed, "removed-chunks": 612, "pending-bytes": 0,
                     "pending-chunks": 0, "disk-bytes": ds["used"]}
    return _run_as_job(call, ds["gc_job"], upid, counters)


def _snapshot_name(ns: str, kind: str, item: str, backup_time: int) -> str:
    """A snapshot as PBS prints it: type/id/RFC 3339 time in UTC, after `ns/<name>` outside the root
    (pbs-api-types print_ns_and_snapshot)."""
    name = f"{kind}/{item}/{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(backup_time))}"
    return "/".join(f"ns/{part}" for part in ns.split("/")) + "/" + name if ns else name


def _verify_targets(call: Call, ds: dict) -> list[tuple[tuple[str, str, str], dict]]:
    ns = _ns(call)
    if call.arg("backup-time"):
        return [((ns, call.arg("backup-type"), call.arg("backup-id")), _snapshot(call, ds))]
    if call.arg("backup-id"):
        return [((ns, call.arg("backup-type"), call.arg("backup-id")), snap) for snap in _group(call, ds)]
    return [(key, snap) for key, snaps in sorted(ds["groups"].items()) for snap in snaps if key[0] == ns]


def _skips(call: Call, snap: dict) -> bool:
    """With ignore-verified (the default) a snapshot verified before, whatever the result, is skipped
    unless outdated-after says its verification is too old (proxmox-backup src/backup/verify.rs, verify_filter)."""
    if str(call.arg("ignore-verified", "1")).lower() in ("0", "false", "no", "off") or not snap["verification"]:
        return False
    outdated = call.arg("outdated-after")
    upid = snap["verification"].get("upid") or ""
    verified = int(upid.split(":")[5], 16) if upid.count(":") > 5 else time.time()  # the verify task's start
    return outdated is None or (time.time() - verified) // 86400 <= int(outdated)


def _verify_worker(call: Call, store: str) -> tuple[str, str]:
    """The task's type and worker id (proxmox-backup src/api2/admin/datastore.rs, verify)."""
    ns, kind, item = _ns(call), call.arg("backup-type"), call.arg("backup-id")
    path = "/".join(f"ns/{part}" for part in ns.split("/")) if ns else ""
    if call.arg("backup-time"):
        return "verify_snapshot", f"{store}:{path}/{kind}/{item}/{int(call.arg('backup-time')):08X}"
    if item:
        return "verify_group", f"{store}:{path}/{kind}/{item}"
    return "verify", f"{store}:{path}" if ns else store


def pbs_verify(call: Call, store: str) -> str:
    """Checks each target snapshot, logging as PBS does; a snapshot whose data is corrupt (`corrupt` in
    the lab) fails, and the task then ends in an error naming the failed ones (src/backup/verify.rs)."""
    ds = _datastore(call, store)
    targets = _verify_targets(call, ds)
    lines, failed, checked = [f"verify datastore {store}"] if not call.arg("backup-id") else [], [], []
    for done, ((ns, kind, item), snap) in enumerate(targets, 1):
        name = _snapshot_name("", kind, item, snap["backup-time"])
        if _skips(call, snap):
            lines.append(f"SKIPPED: verify {store}:{name} (recently verified)")
            continue
        lines += [f"verify {store}:{name}", "  check index.json.blob", "  check drive-scsi0.img.fidx"]
        checked.append(snap)
        if snap.get("corrupt"):
            lines.append(f"verify {store}:{name}/drive-scsi0.img.fidx failed: chunks could not be verified")
            failed.append(_snapshot_name(ns, kind, item, snap["backup-time"]))
        lines.append(f"percentage done: {100 * done // len(targets)}% ({done} of {len(targets)} snapshots)")
    exitstatus = "OK"
    if failed:
        lines += ["Failed to verify the following snapshots/groups:"] + [f"\t{name}" for name in failed]
        exitstatus = "verification failed - please check the log for details"
    kind, worker = _verify_worker(call, store)
    started: list[str] = []

    def apply() -> None:
        for snap in checked:
            state = "failed" if snap.get("corrupt") else "ok"
            snap["verification"] = {"state": state, "upid": started[0]}
    started.append(call.lab.start_task("pbs", kind, worker, user=call.token_id, lines=lines, exitstatus=exitstatus,
                                       product="pbs"))
    call.lab.tasks[started[0]].on_end = apply  # the snapshots' states are written even when some failed
    return started[0]


def _direction_wanted(call: Call, kind: str, job: dict) -> bool:
    """GET /admin/sync lists pull jobs unless sync-direction is push or all (docs/PROXMOX-BEHAVIOUR.md#pbs-jobs)."""
    wanted = call.arg("sync-direction", "pull")
    return kind != "sync" or wanted in ("all", job.get("sync-direction", "pull"))


def _job_row(job: dict) -> dict:
    return {k: v for k, v in job.items() if not k.startswith("_")}  # `_exitstatus`: how its next run ends


def pbs_jobs(kind: str) -> Callable:
    def handler(call: Call, **_: str) -> list:
        store = call.arg("store")
        return [_job_row(job) for job in call.lab.pbs_jobs.get(kind, [])
                if store in (None, job["store"]) and _direction_wanted(call, kind, job)]
    return handler


def pbs_job_config(kind: str) -> Callable:
    """A job's stored configuration, without its run state (proxmox-backup src/api2/config/sync.rs)."""
    def handler(call: Call, id: str) -> dict:
        job = next((j for j in call.lab.pbs_jobs.get(kind, []) if j["id"] == id), None)
        if job is None:
            raise ApiError(400, f"no such {kind} job '{id}'")
        return {k: v for k, v in _job_row(job).items() if not k.startswith(("last-run", "next-run"))}
    return handler


def pbs_gc_jobs(call: Call, **_: str) -> list:
    """One row per visible store that can be opened; an offline store is left out (proxmox-backup
    src/api2/admin/gc.rs: filter_map of garbage_collection_status)."""
    store = call.arg("store")
    if store:
        return [_gc_job(store, _datastore(call, store))]
    return [_gc_job(name, ds) for name, ds in call.lab.datastores.items() if _visible(call, name) and not ds["error"]]


# Each job's task type and worker id (proxmox-backup src/server/sync.rs do_sync_job, verify_job.rs,
# prune_job.rs; docs/PROXMOX-BEHAVIOUR.md#pbs-jobs)
JOB_WORKERS: dict[str, tuple[str, Callable[[dict], str]]] = {
    "sync": ("syncjob", lambda job: f"{job.get('remote') or '-'}:{job['remote-store']}:{job['store']}:"
                                    f"{job.get('ns', '')}:{job['id']}"),
    "verify": ("verificationjob", lambda job: f"{job['store']}:{job['id']}"),
    "prune": ("prunejob", lambda job: f"{job['store']}:{job['ns']}" if job.get("ns") else job["store"]),
}


def pbs_run_job(kind: str) -> Callable:
    def handler(call: Call, id: str) -> str:
        job = next((j for j in call.lab.pbs_jobs.get(kind, []) if j["id"] == id), None)
        if job is None:
            raise ApiError(400, f"job '{id}' does not exist")
        task_type, worker = JOB_WORKERS[kind]
        upid = call.lab.start_task("pbs", task_type, worker(job), user=call.token_id, product="pbs",
                                   exitstatus=job.get("_exitstatus", "OK"))
        return _run_as_job(call, job, upid)
    return handler


def _pbs_task(call: Call, upid: str) -> Task:
    task = call.lab.tasks.get(upid)
    if task is None:
        raise ApiError(400, "no such task")
    return task


def _pbs_state_type(state: str) -> str:
    """ok, warning, error or unknown (proxmox-backup src/api2/node/tasks.rs, tasktype)."""
    if state == "OK":
        return "ok"
    if state.startswith("WARNINGS"):
        return "warning"
    return "unknown" if state == "unknown" else "error"


def _pbs_task_listed(call: Call, task: Task, running: bool) -> bool:
    """The filters of GET /nodes/{node}/tasks (proxmox-backup src/api2/node/tasks.rs, list_tasks):
    `running` keeps running tasks only, `errors` drops only tasks that ended OK (running ones stay),
    `statusfilter` keeps finished tasks of the states named (docs/PROXMOX-BEHAVIOUR.md#pbs-tasks)."""
    if str(call.arg("running", "0")) in ("1", "true") and not running:
        return False
    if str(call.arg("errors", "0")) in ("1", "true") and not running and task.exitstatus == "OK":
        return False
    wanted = call.params.get("statusfilter")
    if wanted is not None:
        wanted = wanted if isinstance(wanted, list) else [wanted]
        if running or _pbs_state_type(task.exitstatus) not in wanted:
            return False
    return not call.arg("typefilter") or call.arg("typefilter") in task.type


def pbs_tasks(call: Call, **_: str) -> list:
    now = time.time()
    rows = []
    for task in sorted(call.lab.tasks.values(), key=lambda t: -t.started):
        if not task.upid.startswith("UPID:pbs:") and task.node != "pbs":
            continue
        running = task.running(now)
        if not _pbs_task_listed(call, task, running):
            continue
        # node is "localhost", user the full auth id, worker_id unescaped (docs/PROXMOX-BEHAVIOUR.md#pbs-tasks)
        row = {"upid": task.upid, "node": "localhost", "pid": 1000, "pstart": 41394, "starttime": int(task.started),
               "worker_type": task.type, "worker_id": task.id, "user": task.user}
        if not running:
            row |= {"endtime": int(task.started + task.duration), "status": task.exitstatus}
        rows.append(row)  # running tasks are listed too
    start, limit = int(call.arg("start", 0)), int(call.arg("limit", 50))
    return rows[start:start + limit] if limit else rows[start:]  # limit=0: all


def pbs_task_status(call: Call, upid: str, **_: str) -> dict:
    task = _pbs_task(call, upid)
    user, _, tokenid = task.user.partition("!")  # the token apart, as in PVE (src/api2/node/tasks.rs)
    row = {"upid": upid, "node": task.node, "pid": 1000, "pstart": 41394, "starttime": int(task.started),
           "type": task.type, "id": task.id, "user": user}
    if tokenid:
        row["tokenid"] = tokenid
    if task.running(time.time()):
        return row | {"status": "running"}
    return row | {"status": "stopped", "exitstatus": task.exitstatus}


def pbs_task_log(call: Call, upid: str, **_: str) -> list:
    """Lines numbered from 1; `start` is 1-based (0 and 1 both begin at the first line), `limit=0`
    means all, and an empty log is empty (docs/PROXMOX-BEHAVIOUR.md#pbs-tasks)."""
    lines = _pbs_task(call, upid).log(time.time())
    start, limit = int(call.arg("start", 0)), int(call.arg("limit", 50))
    rows = [{"n": i + 1, "t": text} for i, text in enumerate(lines) if i + 1 >= start]
    return rows[:limit] if limit else rows


PBS_HANDLERS: dict[tuple[str, str], Callable] = {
    ("GET", "/version"): pbs_version,
    ("GET", "/access/permissions"): pbs_permissions,
    ("GET", "/admin/datastore"): pbs_datastores,
    ("GET", "/status/datastore-usage"): pbs_datastore_usage,
    ("GET", "/config/datastore"): pbs_datastore_config,
    ("GET", "/config/datastore/{name}"): pbs_store_config,
    ("GET", "/admin/datastore/{store}/status"): pbs_datastore_status,
    ("GET", "/admin/datastore/{store}/namespace"): pbs_namespaces,
    ("GET", "/admin/datastore/{store}/groups"): pbs_groups,
    ("GET", "/admin/datastore/{store}/snapshots"): pbs_snapshots,
    ("DELETE", "/admin/datastore/{store}/snapshots"): pbs_forget,
    ("POST", "/admin/datastore/{store}/prune"): pbs_prune,
    ("PUT", "/admin/datastore/{store}/protected"): pbs_set_protected,
    ("PUT", "/admin/datastore/{store}/notes"): pbs_set_notes,
    ("GET", "/admin/datastore/{store}/notes"): pbs_get_notes,
    ("GET", "/admin/datastore/{store}/protected"): pbs_get_protection,
    ("GET", "/admin/datastore/{store}/gc"): pbs_gc_status,
    ("POST", "/admin/datastore/{store}/gc"): pbs_gc_start,
    ("POST", "/admin/datastore/{store}/verify"): pbs_verify,
    ("GET", "/admin/sync"): pbs_jobs("sync"),
    ("GET", "/admin/verify"): pbs_jobs("verify"),
    ("GET", "/admin/prune"): pbs_jobs("prune"),
    ("GET", "/admin/gc"): pbs_gc_jobs,
    ("POST", "/admin/sync/{id}/run"): pbs_run_job("sync"),
    ("POST", "/admin/verify/{id}/run"): pbs_run_job("verify"),
    ("POST", "/admin/prune/{id}/run"): pbs_run_job("prune"),
    ("GET", "/config/sync/{id}"): pbs_job_config("sync"),
    ("GET", "/config/prune/{id}"): pbs_job_config("prune"),
    ("GET", "/nodes/{node}/tasks"): pbs_tasks,
    ("GET", "/nodes/{node}/tasks/{upid}/status"): pbs_task_status,
    ("GET", "/nodes/{node}/tasks/{upid}/log"): pbs_task_log,
}
PBS_HANDLERS |= PBS_FILE_HANDLERS
