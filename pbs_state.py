"""What a Backup Server's stores, collections and jobs are doing, read as its release allows: the
shared reads under pbs_tools' answers and health_check's PBS findings (a release lacks what
`SINCE` names; docs/PROXMOX-BEHAVIOUR.md#pbs-releases)."""
import re
import time

from answers import iso_time
from errors import ProxmoxError, ToolFailure
from proxmox_client import ProxmoxClient, parse_upid

# What older Backup Servers lack, by the first release that has it (docs/PROXMOX-BEHAVIOUR.md#pbs-releases):
# GET /admin/gc and the job times of a store's GC; the sync-direction parameter (push sync jobs).
SINCE = {"gc-jobs": (3, 2, 0), "sync-direction": (3, 2, 11), "s3": (4, 0, 0)}


def offers(client: ProxmoxClient, feature: str) -> bool:
    """Whether the host's release has `feature`; a version that cannot be read counts as current."""
    release = client.release()
    return release is None or release >= SINCE[feature]


def release_name(client: ProxmoxClient) -> str:
    return "PBS " + ".".join(map(str, client.release() or ()))


def gc_run(row: dict | None, jobs: bool) -> dict:
    """A store's last garbage collection from its GC status row: the run's end and result from 3.2.0 on
    (`jobs`), none of them while one runs; before 3.2.0 only its counters, whose UPID says when it
    started (docs/PROXMOX-BEHAVIOUR.md#garbage-collection)."""
    row = row or {}
    if row.get("last-run-state") or not row.get("upid"):
        return {"ended": row.get("last-run-endtime"), "result": row.get("last-run-state")}
    if jobs:
        return {"result": "running"}
    try:
        return {"started": parse_upid(row["upid"], "pbs")["starttime"], "result": None}
    except ProxmoxError:
        return {"result": None}


def gc_runs(client: ProxmoxClient, usage: list[dict]) -> tuple[dict[str, dict], str | None]:
    """Every store's last collection in one read (GET /admin/gc, 3.2.0 on); before, from the counters
    in `usage` (GET /status/datastore-usage), with a note saying what that release does not tell."""
    if offers(client, "gc-jobs"):
        return {job.get("store"): gc_run(job, True) | {"schedule": job.get("schedule"), "upid": job.get("upid")}
                for job in client.get("/admin/gc") or []}, None
    runs = {ds["store"]: gc_run(ds.get("gc-status"), False) for ds in usage}
    return runs, f"{release_name(client)} keeps no GC results (3.2.0 and later do): last_gc is when the last " \
                 f"collection started."


S3_BACKEND = re.compile(r"(?:^|,)type=s3(?:,|$)")  # a store's `backend` property, e.g. type=s3,client=ep,bucket=b
S3_NOTE = "s3 stores: used, total and used_pct are their local cache's; PBS does not report the bucket's use."


def s3_stores(client: ProxmoxClient, usage: list[dict]) -> set[str]:
    """The datastores with an S3 backend (PBS 4.0 on): `backend-type` in the usage rows where the
    release gives it, else the stores' configuration, one read (docs/PROXMOX-BEHAVIOUR.md#s3-datastores)."""
    if any("backend-type" in ds for ds in usage) or not offers(client, "s3"):
        return {ds["store"] for ds in usage if ds.get("backend-type") == "s3"}
    return {c.get("name") for c in client.get("/config/datastore") or [] if S3_BACKEND.search(str(c.get("backend")))}


def is_s3(client: ProxmoxClient, store: str, status: dict) -> bool:
    """One store's backend: from its status where the release says, else from its configuration, which
    needs Datastore.Audit (without it the store counts as a plain one)."""
    if "backend-type" in status or not offers(client, "s3"):
        return status.get("backend-type") == "s3"
    try:
        return bool(S3_BACKEND.search(str((client.get(f"/config/datastore/{store}") or {}).get("backend"))))
    except ToolFailure:
        return False


def full_by(ds: dict, s3: set[str]) -> str | None:
    """The day PBS expects a store to fill up: only a date to come counts (0 means a flat trend, a past
    date a shrinking one), and not for an S3 store, whose figures are its cache's
    (docs/PROXMOX-BEHAVIOUR.md#datastores-and-namespaces)."""
    estimate = ds.get("estimated-full-date") or 0
    return iso_time(estimate)[:10] if estimate > time.time() and ds["store"] not in s3 else None


JOB_KINDS = ("sync", "verify", "prune")


def jobs_of(client: ProxmoxClient, kind: str, store: str | None = None) -> list[dict]:
    """The jobs of one kind. GET /admin/sync lists pull jobs only unless asked for all directions, a
    parameter releases before push sync (3.2.11) refuse (docs/PROXMOX-BEHAVIOUR.md#pbs-jobs)."""
    both = {"sync-direction": "all"} if kind == "sync" and offers(client, "sync-direction") else {}
    return client.get(f"/admin/{kind}", store=store, **both) or []


def job_result(job: dict) -> str | None:
    """The last run's state; while a run is in progress only its UPID is known (jobstate.rs)."""
    return job.get("last-run-state") or ("running" if job.get("last-run-upid") else None)
