"""Proxmox Backup Server tools: datastores, namespaces, groups, snapshots, jobs, tasks, and the
writes around them (prune, forget, protect, notes, garbage collection, verify, run a job).

Same shape as pve_tools: plain functions returning dicts, one client, the policy in front.
"""
import re
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context
from pydantic import Field

from answers import (ConfirmArg, DryRunArg, Host, Limit, WaitArg, capped, compact, human_bytes, iso_time, percent,
                     table)
from errors import ConfirmationNeeded, InvalidArgument, TaskFailed, ToolFailure
from fanout import in_parallel
from pbs_state import (JOB_KINDS, S3_NOTE, full_by, gc_run, gc_runs, is_s3, job_result, jobs_of, offers,
                       release_name, s3_stores)
from proxmox_client import ProxmoxClient, pbs_client
from tasks import TASK_GOING, run_task

Store = str
Ns = str | None
GroupType = Literal["vm", "ct", "host"]
GroupId = Annotated[str, Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9._\-]*$")]
Time = Annotated[int, Field(ge=1)]
KEEP_OPTIONS = ("keep_last", "keep_hourly", "keep_daily", "keep_weekly", "keep_monthly", "keep_yearly")


def _store_names(client: ProxmoxClient) -> list[str]:
    return [d["store"] for d in client.get("/admin/datastore") or []]


def _check_store(client: ProxmoxClient, store: str) -> None:
    names = _store_names(client)
    if store not in names:
        raise InvalidArgument(f"No datastore '{store}' on PBS host '{client.host.label}'. Datastores: "
                              f"{', '.join(names) or 'none visible (the token needs Datastore.Audit)'}.")


def _group_params(backup_type: str, backup_id: str, ns: str | None) -> dict[str, Any]:
    return {"backup-type": backup_type, "backup-id": backup_id, "ns": ns or None}


# ---------------------------------------------------------------- reads

def pbs_list_datastores(host: Host = None, store: Store | None = None) -> dict:
    """Use, fill %, full date, last GC; store: its counts and GC state too."""
    client = pbs_client(host)
    if store:
        return datastore_status(client, store)
    usage = client.get("/status/datastore-usage") or []
    # gc-status has counters only; the last run's time and result are the GC job's, one read for
    # every store (docs/PROXMOX-BEHAVIOUR.md#garbage-collection)
    runs, note = gc_runs(client, usage) if usage else ({}, None)
    s3 = s3_stores(client, usage) if usage else set()
    rows = []
    for ds in usage:
        gc, counters = runs.get(ds["store"]) or {}, ds.get("gc-status") or {}
        # a store that cannot be opened (offline, unmounted) comes with `error` and no figures
        rows.append({"store": ds["store"], "used": human_bytes(ds.get("used")), "total": human_bytes(ds.get("total")),
                     "used_pct": percent(ds.get("used"), ds.get("total")), "full_by": full_by(ds, s3),
                     "last_gc": iso_time(gc.get("ended") or gc.get("started")), "gc_result": gc.get("result"),
                     "gc_freed": human_bytes(counters.get("removed-bytes")), "unavailable": ds.get("error"),
                     "backend": "s3" if ds["store"] in s3 else None})
    answer = table(["store", "used", "total", "used_pct", "full_by", "last_gc", "gc_result", "gc_freed",
                    "unavailable", "backend"], rows)
    notes = [text for text in (note, S3_NOTE if s3 else None) if text]
    return answer | ({"note": " ".join(notes)} if notes else {})


def datastore_status(client: ProxmoxClient, store: str) -> dict:
    """One datastore: use, group and snapshot counts, GC state."""
    _check_store(client, store)
    status = client.get(f"/admin/datastore/{store}/status", verbose=True) or {}
    # the GC's times and result; before 3.2.0 its counters alone (docs/PROXMOX-BEHAVIOUR.md#garbage-collection)
    gc = client.get(f"/admin/datastore/{store}/gc") or {}
    run = gc_run(gc, offers(client, "gc-jobs"))
    s3 = is_s3(client, store, status)
    return compact({"store": store, "backend": "s3" if s3 else None, "note": S3_NOTE if s3 else None,
                    "used": human_bytes(status.get("used")), "used_bytes": status.get("used"),
                    "total": human_bytes(status.get("total")), "total_bytes": status.get("total"),
                    "used_pct": percent(status.get("used"), status.get("total")), "counts": status.get("counts"),
                    "gc": compact({"state": run.get("result"), "last_run": iso_time(run.get("ended")),
                                   "last_started": iso_time(run.get("started")),
                                   "next_run": iso_time(gc.get("next-run")),
                                   "freed": human_bytes(gc.get("removed-bytes")),
                                   "pending": human_bytes(gc.get("pending-bytes"))})})


def pbs_list_groups(store: Store, host: Host = None, ns: Ns = None) -> dict:
    """Last backup, count, owner; at the root, the store's namespaces."""
    client = pbs_client(host)
    _check_store(client, store)
    reads = [lambda: client.get(f"/admin/datastore/{store}/groups", ns=ns) or []]
    if not ns:  # at the root, its namespaces beside (the list names the root too, as "":
        # docs/PROXMOX-BEHAVIOUR.md#datastores-and-namespaces)
        reads.append(lambda: client.get(f"/admin/datastore/{store}/namespace") or [])
    found = in_parallel(reads)
    failed = next((f for f in found if isinstance(f, ToolFailure)), None)
    if failed:
        raise failed
    rows = [{"group": f"{g['backup-type']}/{g['backup-id']}", "last": iso_time(g.get("last-backup")),
             "count": g.get("backup-count"), "owner": g.get("owner"), "comment": g.get("comment")} for g in found[0]]
    answer = table(["group", "last", "count", "owner", "comment"], rows)
    namespaces = [n["ns"] for n in found[1] if n.get("ns")] if len(found) > 1 else []
    return answer | ({"namespaces": namespaces} if namespaces else {})


def pbs_list_snapshots(store: Store, host: Host = None, ns: Ns = None,
                       backup_type: Literal["vm", "ct", "host"] | None = None,
                       backup_id: str | None = None,
                       since: Annotated[int | None, Field(description="epoch")] = None,
                       limit: Limit = 100) -> dict:
    """Newest first: size, verify, protected."""
    client = pbs_client(host)
    _check_store(client, store)
    snaps = client.get(f"/admin/datastore/{store}/snapshots", ns=ns, **{"backup-type": backup_type,
                                                                       "backup-id": backup_id}) or []
    rows = []
    for snap in sorted(snaps, key=lambda x: -x["backup-time"]):
        if since and snap["backup-time"] < since:
            continue
        files = snap.get("files") or []
        # backup_time: the epoch that names the snapshot in the other tools' arguments; time: when, readable
        rows.append({"group": f"{snap['backup-type']}/{snap['backup-id']}", "backup_time": snap["backup-time"],
                     "time": iso_time(snap["backup-time"]), "size": human_bytes(snap.get("size")),
                     "verify": (snap.get("verification") or {}).get("state", "none"),
                     "protected": 1 if snap.get("protected") else None,
                     "encrypted": 1 if any(f.get("crypt-mode") == "encrypt" for f in files) else None,
                     "comment": snap.get("comment")})
    return table(["group", "backup_time", "time", "size", "verify", "protected", "encrypted", "comment"], rows,
                 limit=limit)


def pbs_list_jobs(host: Host = None, store: str | None = None) -> dict:
    """Sync, verify, prune, GC: schedule, last and next run."""
    client = pbs_client(host)
    rows = []
    for kind in JOB_KINDS:
        for job in jobs_of(client, kind, store):
            rows.append({"kind": kind, "id": job.get("id"), "store": job.get("store"), "schedule": job.get("schedule"),
                         "direction": job.get("sync-direction", "pull") if kind == "sync" else None,
                         "last_run": iso_time(job.get("last-run-endtime")), "result": job_result(job),
                         "next_run": iso_time(job.get("next-run"))})
    note = None
    if offers(client, "gc-jobs"):
        for job in client.get("/admin/gc", store=store) or []:
            run = gc_run(job, True)
            rows.append({"kind": "gc", "id": job.get("store"), "store": job.get("store"),
                         "schedule": job.get("schedule"), "last_run": iso_time(run.get("ended")),
                         "result": run.get("result"), "next_run": iso_time(job.get("next-run"))})
    else:
        note = f"{release_name(client)} lists no GC jobs (3.2.0 and later do); pbs_list_datastores shows each " \
               f"store's last collection."
    answer = table(["kind", "id", "store", "schedule", "direction", "last_run", "result", "next_run"], rows)
    return answer | ({"note": note} if note else {})


def pbs_list_tasks(host: Host = None, errors: bool = False,
                   running: bool = False,
                   limit: Annotated[int, Field(ge=1, le=500)] = 20) -> dict:
    """Newest first."""
    client = pbs_client(host)
    # errors=1 keeps running tasks and warnings; statusfilter keeps finished tasks of those states
    # only (docs/PROXMOX-BEHAVIOUR.md#pbs-tasks); limit=0 would mean all here
    failed = ["error", "unknown"] if errors else None
    tasks = client.get("/nodes/localhost/tasks", limit=limit, statusfilter=failed, running=running or None) or []
    rows = [{"upid": t["upid"], "type": t.get("worker_type"), "id": t.get("worker_id"), "user": t.get("user"),
             "start": iso_time(t.get("starttime")), "status": t.get("status") or "running"} for t in tasks]
    return table(["upid", "type", "id", "user", "start", "status"], rows)


# ---------------------------------------------------------------- writes

def write_pbs_prune_group(store: Store, backup_type: GroupType, backup_id: GroupId, host: Host = None, ns: Ns = None,
                    keep_last: Annotated[int | None, Field(ge=1)] = None,
                    keep_hourly: Annotated[int | None, Field(ge=1)] = None,
                    keep_daily: Annotated[int | None, Field(ge=1)] = None,
                    keep_weekly: Annotated[int | None, Field(ge=1)] = None,
                    keep_monthly: Annotated[int | None, Field(ge=1)] = None,
                    keep_yearly: Annotated[int | None, Field(ge=1)] = None,
                    dry_run: DryRunArg = False, confirm: ConfirmArg = False, ctx: Context | None = None) -> dict:
    """By keep rules: previews, then removes on confirm."""
    client = pbs_client(host)
    _check_store(client, store)
    keeps = (keep_last, keep_hourly, keep_daily, keep_weekly, keep_monthly, keep_yearly)
    options = {name.replace("_", "-"): value for name, value in zip(KEEP_OPTIONS, keeps, strict=True) if value}
    params = _group_params(backup_type, backup_id, ns) | options
    # PBS answers oldest first (the order it deletes in); the lists read newest first
    # (docs/PROXMOX-BEHAVIOUR.md#prune-and-forget)
    preview = client.request("POST", f"/admin/datastore/{store}/prune", params | {"dry-run": True}) or []
    preview = sorted(preview, key=lambda p: -p["backup-time"])
    kept = [iso_time(p["backup-time"]) for p in preview if p.get("keep")]
    removed = [iso_time(p["backup-time"]) for p in preview if not p.get("keep")]
    # the lists cut at LIST_CAP, with their totals: a group can hold years of snapshots
    result: dict[str, Any] = {"group": f"{backup_type}/{backup_id}", "options": options or "none: keeps everything",
                              "keep": capped(kept), "keep_total": len(kept), "remove": capped(removed),
                              "remove_total": len(removed)}
    if not removed or dry_run:
        return result | {"removed": 0, "dry_run": True}
    try:
        client.request("POST", f"/admin/datastore/{store}/prune", params)
    except ConfirmationNeeded:
        return result | {"removed": 0, "next": f"Show the user these lists; if they agree to remove {len(removed)} "
                                               f"snapshot(s), call again with confirm=true."}
    return result | {"removed": len(removed)}


def write_pbs_forget_snapshot(store: Store, backup_type: GroupType, backup_id: GroupId, backup_time: Time,
                              host: Host = None, ns: Ns = None, dry_run: DryRunArg = False,
                              confirm: ConfirmArg = False, ctx: Context | None = None) -> dict:
    """Deletes one backup snapshot."""
    client = pbs_client(host)
    _check_store(client, store)
    params = _group_params(backup_type, backup_id, ns) | {"backup-time": backup_time}
    client.request("DELETE", f"/admin/datastore/{store}/snapshots", params)
    return {"forgotten": f"{backup_type}/{backup_id}/{iso_time(backup_time)}", "result": "ok"}


def write_pbs_edit_snapshot(store: Store, backup_type: GroupType, backup_id: GroupId, backup_time: Time,
                            protected: bool | None = None, notes: Annotated[str | None, Field(max_length=4096)] = None,
                            host: Host = None, ns: Ns = None, dry_run: DryRunArg = False) -> dict:
    """Its protected flag, its notes."""
    if protected is None and notes is None:
        raise InvalidArgument("Nothing to change: give protected (true or false), notes, or both.")
    client = pbs_client(host)
    _check_store(client, store)
    snapshot = _group_params(backup_type, backup_id, ns) | {"backup-time": backup_time}
    # two endpoints, one field each (proxmox-backup src/api2/admin/datastore.rs: set_protection, set_notes)
    for field, value in (("protected", protected), ("notes", notes)):
        if value is not None:
            client.request("PUT", f"/admin/datastore/{store}/{field}", snapshot | {field: value})
    return compact({"snapshot": f"{backup_type}/{backup_id}/{iso_time(backup_time)}", "protected": protected,
                    "notes": "set" if notes is not None else None, "result": "ok"})


def write_pbs_run_gc(store: Store, host: Host = None, wait_seconds: WaitArg = 60, dry_run: DryRunArg = False,
                 ctx: Context | None = None) -> dict:
    """On a datastore; answers what it freed."""
    client = pbs_client(host)
    _check_store(client, store)
    outcome = run_task(client, "POST", f"/admin/datastore/{store}/gc", {}, wait_seconds, ctx, f"gc {store}")
    if outcome.get("task") in TASK_GOING:
        return outcome  # started, or still running at the deadline
    # the finished run's counters, under its UPID (docs/PROXMOX-BEHAVIOUR.md#garbage-collection)
    counters = client.get(f"/admin/datastore/{store}/gc") or {}
    if counters.get("upid") != outcome["upid"]:
        counters = {}
    return compact({"store": store, "task": outcome["task"], "warnings": outcome.get("warnings"),
                    "freed": human_bytes(counters.get("removed-bytes")), "removed_chunks": counters.get(
                        "removed-chunks"), "pending": human_bytes(counters.get("pending-bytes")),
                    "disk_used": human_bytes(counters.get("disk-bytes")), "upid": outcome["upid"]})


VERIFIED = re.compile(r"verify [^:\s]+:(\S+)")  # `verify <store>:<snapshot>`, one per snapshot checked


def verify_summary(lines: list[str]) -> dict:
    """What a verify task did, from its log: snapshots checked, skipped (verified before), and those
    listed as failed at the end (proxmox-backup src/backup/verify.rs, src/api2/admin/datastore.rs verify;
    docs/PROXMOX-BEHAVIOUR.md#verify)."""
    checked, skipped, failed, listing = 0, 0, [], False
    for line in lines:
        if line.startswith("SKIPPED: verify "):
            skipped += 1
        elif VERIFIED.fullmatch(line):
            checked += 1
        elif line.startswith("Failed to verify the following"):
            listing = True
        elif listing and line.startswith("\t"):
            failed.append(line.strip())
    return {"checked": checked, "failed": failed, "skipped": skipped}


def write_pbs_verify_backups(store: Store, host: Host = None, ns: Ns = None,
                     backup_type: Literal["vm", "ct", "host"] | None = None,
                     backup_id: str | None = None,
                     backup_time: Annotated[int | None, Field(ge=1)] = None,
                     reverify: Annotated[bool, Field(description="also verified ones")] = True,
                     wait_seconds: WaitArg = 120, dry_run: DryRunArg = False, ctx: Context | None = None) -> dict:
    """A datastore, group or snapshot: checked, failed, skipped."""
    client = pbs_client(host)
    _check_store(client, store)
    if (backup_type is None) != (backup_id is None) or (backup_time and not backup_id):
        raise InvalidArgument("Give backup_type and backup_id together (and backup_time only with them).")
    # PBS skips snapshots verified before (even failed ones) unless ignore-verified is off (verify_filter)
    params = {"ns": ns, "backup-type": backup_type, "backup-id": backup_id, "backup-time": backup_time,
              "ignore-verified": not reverify}
    try:
        outcome = run_task(client, "POST", f"/admin/datastore/{store}/verify", params, wait_seconds, ctx,
                           f"verify {store}")
    except TaskFailed as exc:  # a failed verify still says what it checked: its log names the failed snapshots
        outcome = {"task": exc.exit_status, "upid": exc.upid, "failed": True}
    if outcome.get("task") in TASK_GOING:
        return outcome  # started, or still running at the deadline
    upid = outcome["upid"]
    summary = verify_summary([line["t"] for line in client.task_log(upid, limit=0)])
    if outcome.get("failed") and not summary["failed"]:
        raise TaskFailed(f"Verification task {upid} failed ({outcome['task']}) before checking its snapshots; read "
                         f"its log with get_task start=0.", upid=upid, exit_status=outcome["task"])
    answer = {"store": store, "task": outcome["task"], "checked": summary["checked"],
              "ok": summary["checked"] - len(summary["failed"]), "failed": capped(summary["failed"]),
              "skipped": summary["skipped"], "upid": upid}
    if summary["skipped"]:
        answer["skipped_why"] = "verified before; reverify=true checks them again"
    if summary["failed"]:
        answer["next"] = ("The failed snapshots have damaged or missing chunks: do not restore from them; back the "
                          "guests up again (a new backup re-uploads the missing chunks) and verify again.")
    return answer


def write_pbs_run_job(kind: Literal["sync", "verify", "prune"],
                      job_id: str,
                      host: Host = None, wait_seconds: WaitArg = 60, dry_run: DryRunArg = False,
                      confirm: ConfirmArg = False, ctx: Context | None = None) -> dict:
    """A sync, verify or prune job, now."""
    client = pbs_client(host)
    jobs = [j.get("id") for j in jobs_of(client, kind)]
    if job_id not in jobs:
        raise InvalidArgument(f"No {kind} job '{job_id}'. Jobs: {', '.join(jobs) or 'none'} (pbs_list_jobs).")
    outcome = run_task(client, "POST", f"/admin/{kind}/{job_id}/run", {}, wait_seconds, ctx, f"run {kind} job {job_id}")
    if outcome.get("task") in TASK_GOING:
        return outcome  # started, or still running at the deadline
    # the job's outcome, not the task's "stopped" (a failed run raises with its log lines)
    return compact({"job": f"{kind} {job_id}", "task": outcome["task"], "warnings": outcome.get("warnings"),
                    "upid": outcome["upid"]})
