"""Proxmox Backup Server: the handlers behind the PBS API paths the simulator keeps state
for, PBS's prune selection, and `PBS_HANDLERS`, the table from (METHOD, path template) to
handler."""
from __future__ import annotations

import time
from typing import Callable

from .call import ApiError, Call, _permissions
from .lab import GiB, Task


def pbs_version(_call: Call, **_: str) -> dict:
    return {"version": "4.2", "release": "1", "repoid": "5a1e0c5f"}


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
    return "notmounted" if ds["error"] else "nonremovable"


def pbs_datastores(call: Call, **_: str) -> list:
    return [{"store": name, "comment": "", "mount-status": _mount_status(ds)}
            for name, ds in call.lab.datastores.items() if _visible(call, name)]


def pbs_datastore_usage(call: Call) -> list:
    now = int(time.time())
    rows = []
    for name, ds in call.lab.datastores.items():
        if not _visible(call, name):
            continue
        if ds["error"]:  # cannot be opened: a bare row (docs/PROXMOX-BEHAVIOUR.md#datastores-and-namespaces)
            rows.append({"store": name, "error": ds["error"], "mount-status": _mount_status(ds)})
            continue
        growth = 5 * GiB  # per day, so that an estimate exists
        rows.append({"store": name, "total": ds["total"], "used": ds["used"], "avail": ds["total"] - ds["used"],
                     "estimated-full-date": now + (ds["total"] - ds["used"]) // growth * 86400,
                     "history-start": now - 30 * 86400, "history-delta": 86400, "mount-status": _mount_status(ds),
                     "backend-type": "filesystem", "gc-status": dict(ds["gc"])})
    return rows


def pbs_datastore_status(call: Call, store: str) -> dict:
    ds = _datastore(call, store)
    result = {"total": ds["total"], "used": ds["used"], "avail": ds["total"] - ds["used"], "backend-type": "filesystem"}
    if str(call.arg("verbose", "0")) == "1":
        counts: dict[str, dict] = {}
        for (_, kind, _), snaps in ds["groups"].items():
            entry = counts.setdefault(kind, {"groups": 0, "snapshots": 0})
            entry["groups"] += 1
            entry["snapshots"] += len(snaps)
        result |= {"counts": counts, "gc-status": dict(ds["gc"])}
    return result


def _ns(call: Call) -> str:
    return call.arg("ns", "") or ""


def pbs_namespaces(call: Call, store: str) -> list:
    ds = _datastore(call, store)
    return [{"ns": ns, "comment": comment} if ns else {"ns": ""} for ns, comment in ds["namespaces"].items()]


def pbs_groups(call: Call, store: str) -> list:
    ds = _datastore(call, store)
    rows = []
    for (ns, kind, item), snaps in sorted(ds["groups"].items()):
        if ns != _ns(call) or not snaps:
            continue
        rows.append({"backup-type": kind, "backup-id": item, "last-backup": max(x["backup-time"] for x in snaps),
                     "backup-count": len(snaps), "owner": "root@pam",
                     "files": ["index.json.blob", "drive-scsi0.img.fidx"]})
    return rows


def pbs_snapshots(call: Call, store: str) -> list:
    ds = _datastore(call, store)
    rows = []
    for (ns, kind, item), snaps in sorted(ds["groups"].items()):
        if ns != _ns(call) or call.arg("backup-type") not in (None, kind) or call.arg("backup-id") not in (None, item):
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


def _period_of(snap: dict, period: str | None) -> str:
    """The period a snapshot falls in for one keep option; with keep-last each snapshot is its own."""
    moment = snap["backup-time"]
    return str(moment) if period is None else time.strftime(period, time.gmtime(moment))


def prune_marks(snapshots: list[dict], options: dict[str, int]) -> dict[int, str]:
    """PBS's prune selection (proxmox-backup, prune.rs): newest first; each keep option keeps
    the newest snapshot of its next N periods, skipping periods an earlier option already
    covered and snapshots already marked; protected snapshots are always kept; with no keep
    option everything is kept. Returns backup-time -> keep | remove | protected."""
    ordered = sorted(snapshots, key=lambda x: -x["backup-time"])
    if not any(options.get(name) for name, _ in PRUNE_PERIODS):
        return {x["backup-time"]: "protected" if x["protected"] else "keep" for x in ordered}
    mark: dict[int, str] = {}
    for name, period in PRUNE_PERIODS:
        keep = options.get(name)
        if not keep:
            continue
        already = {_period_of(x, period) for x in ordered if mark.get(x["backup-time"]) == "keep"}
        included: set[str] = set()
        for snap in ordered:
            if snap["backup-time"] in mark:
                continue
            if snap["protected"]:
                mark[snap["backup-time"]] = "protected"
                continue
            selected = _period_of(snap, period)
            if selected in already:
                continue
            if selected not in included:
                if len(included) >= keep:
                    break
                included.add(selected)
                mark[snap["backup-time"]] = "keep"
            else:
                mark[snap["backup-time"]] = "remove"
    return {x["backup-time"]: "protected" if x["protected"] else mark.get(x["backup-time"], "remove") for x in ordered}


def pbs_prune(call: Call, store: str) -> list | str:
    ds = _datastore(call, store)
    snaps = _group(call, ds)
    options = {name: int(call.arg(name)) for name, _ in PRUNE_PERIODS if call.arg(name) is not None}
    marks = prune_marks(snaps, options)
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
    """GET /admin/gc row and GET /admin/datastore/{store}/gc: the counters and the job's times
    (docs/PROXMOX-BEHAVIOUR.md#garbage-collection)."""
    return {"store": name, **ds["gc"], **ds["gc_job"]}


def pbs_gc_status(call: Call, store: str) -> dict:
    return _gc_job(store, _datastore(call, store))


def pbs_gc_start(call: Call, store: str) -> str:
    ds = _datastore(call, store)
    lines = ["starting garbage collection on store " + store, "Start GC phase1 (mark used chunks)"] + \
        [f"marked {p}% ({p * 120 // 100} of 120 index files)" for p in (25, 50, 75, 100)] + \
        ["Start GC phase2 (sweep unused chunks)", "Removed garbage: 1.2 GiB", "Pending removals: 0 B"]

    started: list[str] = []

    def apply() -> None:
        ds["gc"]["upid"] = started[0]
        ds["gc_job"] |= {"last-run-state": "OK", "last-run-endtime": int(time.time())}
    started.append(call.lab.start_task("pbs", "garbage_collection", store, user=call.token_id, lines=lines,
                                       on_done=apply, product="pbs"))
    return started[0]


def pbs_verify(call: Call, store: str) -> str:
    ds = _datastore(call, store)
    if call.arg("backup-time"):
        targets = [_snapshot(call, ds)]
    elif call.arg("backup-id"):
        targets = list(_group(call, ds))
    else:
        targets = [x for snaps in ds["groups"].values() for x in snaps]
    count = len(targets)
    lines = [f"verify datastore {store}"] + [f"percentage done: {p}% ({p * count // 100}/{count} snapshots)"
                                             for p in (25, 50, 75, 100)]

    def apply() -> None:
        for snap in targets:
            snap["verification"] = {"state": "ok", "upid": ""}
    item = store if not call.arg("backup-id") else f"{store}:{call.arg('backup-type')}/{call.arg('backup-id')}"
    return call.lab.start_task("pbs", "verify", item, user=call.token_id, lines=lines, on_done=apply, product="pbs")


def _direction_wanted(call: Call, kind: str, job: dict) -> bool:
    """GET /admin/sync lists pull jobs unless sync-direction is push or all (docs/PROXMOX-BEHAVIOUR.md#pbs-jobs)."""
    wanted = call.arg("sync-direction", "pull")
    return kind != "sync" or wanted in ("all", job.get("sync-direction", "pull"))


def pbs_jobs(kind: str) -> Callable:
    def handler(call: Call, **_: str) -> list:
        store = call.arg("store")
        return [dict(job) for job in call.lab.pbs_jobs.get(kind, [])
                if store in (None, job["store"]) and _direction_wanted(call, kind, job)]
    return handler


def pbs_job_config(kind: str) -> Callable:
    """A job's stored configuration, without its run state (proxmox-backup src/api2/config/sync.rs)."""
    def handler(call: Call, id: str) -> dict:
        job = next((j for j in call.lab.pbs_jobs.get(kind, []) if j["id"] == id), None)
        if job is None:
            raise ApiError(400, f"no such {kind} job '{id}'")
        return {k: v for k, v in job.items() if not k.startswith(("last-run", "next-run"))}
    return handler


def pbs_gc_jobs(call: Call, **_: str) -> list:
    """One row per visible store that can be opened; an offline store is left out (proxmox-backup
    src/api2/admin/gc.rs: filter_map of garbage_collection_status)."""
    store = call.arg("store")
    if store:
        return [_gc_job(store, _datastore(call, store))]
    return [_gc_job(name, ds) for name, ds in call.lab.datastores.items() if _visible(call, name) and not ds["error"]]


def pbs_run_job(kind: str) -> Callable:
    def handler(call: Call, id: str) -> str:
        job = next((j for j in call.lab.pbs_jobs.get(kind, []) if j["id"] == id), None)
        if job is None:
            raise ApiError(400, f"job '{id}' does not exist")
        task_type = {"sync": "syncjob", "verify": "verificationjob", "prune": "prunejob"}[kind]
        return call.lab.start_task("pbs", task_type, f"{job['store']}:{id}", user=call.token_id, product="pbs")
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
