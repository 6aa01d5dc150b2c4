"""Proxmox VE backup jobs (`/cluster/backup`): create, update and delete as pve-manager's
PVE/API2/Backup.pm does them, with PVE/VZDump.pm verify_vzdump_parameters for the selection
(docs/PROXMOX-BEHAVIOUR.md#backup-jobs-and-vzdump-prune), and the list and the read with their
property strings as objects (docs/PROXMOX-BEHAVIOUR.md#backup-jobs-after-an-edit).
"""
from __future__ import annotations

import re
import uuid
from typing import Any, Callable

from .call import ApiError, Call

SELECTION = ("vmid", "all", "exclude", "pool")
DELETABLE = ("comment", "repeat-missed")  # besides every vzdump option (update_job $deletable)
# taken as property strings, answered as objects (Backup.pm $backup_job_return_schema; pve-guest-common
# src/PVE/VZDump/JobBase.pm decode_value)
PROPERTY_STRINGS = ("prune-backups", "fleecing", "performance")


def answered(job: dict[str, Any]) -> dict[str, Any]:
    """A stored job as GET answers it: its property strings as objects, numbers as numbers."""
    shown = dict(job)
    for name in PROPERTY_STRINGS:
        if isinstance(shown.get(name), str):
            parts = (part.partition("=") for part in shown[name].split(",") if part.strip())
            shown[name] = {k.strip(): int(v) if v.strip().isdigit() else v for k, _, v in parts}
    return shown


def _job(call: Call, id: str) -> dict:
    job = next((j for j in call.lab.backup_jobs if j["id"] == id), None)
    if job is None:
        raise ApiError(500, "no such vzdump job")
    return job


def _values(call: Call) -> dict[str, Any]:
    return {name: call.arg(name) for name in call.params if name not in ("id", "delete", "digest")}


def _verify(job: dict[str, Any], check_missing: bool) -> None:
    """verify_vzdump_parameters: vmid excludes all, exclude and pool; an exclude without a pool
    means all; a job must select something."""
    for other in ("all", "exclude", "pool"):
        if str(job.get(other) or "0") not in ("0", "") and job.get("vmid"):
            raise ApiError(400, "Parameter verification failed.", {other: "option conflicts with option 'vmid'"})
    if job.get("exclude") is not None and not job.get("pool"):
        job["all"] = 1
    if check_missing and not (str(job.get("all", "0")) == "1" or job.get("pool") or job.get("vmid")):
        raise ApiError(400, "Parameter verification failed.", {"vmid": "property is missing"})


def _check_pool(call: Call, values: dict[str, Any]) -> None:
    if values.get("pool") and values["pool"] not in call.lab.pools:
        raise ApiError(500, f"pool '{values['pool']}' does not exist")


def backup_jobs(call: Call) -> list:
    return [answered(job) for job in call.lab.backup_jobs]


def backup_job(call: Call, id: str) -> dict:
    """One backup job (pve-manager PVE/API2/Backup.pm `read_job`)."""
    job = next((j for j in call.lab.backup_jobs if j["id"] == id), None)
    if job is None:
        raise ApiError(400, "Parameter verification failed.", {"id": f"No such job '{id}'"})
    return answered(job)


def backup_job_create(call: Call) -> None:
    """create_job: a schedule is required, `enabled` defaults to 1, an id that exists is refused."""
    values = _values(call)
    _check_pool(call, values)
    if not values.get("schedule"):
        raise ApiError(400, "Parameter verification failed.",
                       {"schedule": "neither 'starttime' nor 'schedule' were set"})
    job_id = call.arg("id") or str(uuid.uuid4())
    if any(j["id"] == job_id for j in call.lab.backup_jobs):
        raise ApiError(500, f"Job '{job_id}' already exists")
    values.setdefault("enabled", 1)
    _verify(values, True)
    call.lab.backup_jobs.append({"id": job_id, "type": "vzdump"} | values)


def backup_job_update(call: Call, id: str) -> None:
    """update_job: `delete` first, then the given options; then the selection as the edit leaves it:
    a vmid drops all, exclude and pool; all=1 drops vmid and pool; a pool drops vmid, all and exclude."""
    values = _values(call)
    deleted = [k for k in re.split(r"[,;\s]+", str(call.arg("delete") or "")) if k]
    if not values and not deleted:
        raise ApiError(500, "no options specified")
    _check_pool(call, values)
    job = _job(call, id)
    edited = {k: v for k, v in job.items() if k not in deleted}
    edited |= values
    if edited.get("exclude") is not None and not edited.get("pool"):
        edited["all"] = 1
    dropped = (("all", "exclude", "pool") if values.get("vmid") is not None else
               ("vmid", "pool") if str(values.get("all", "0")) == "1" else
               ("vmid", "all", "exclude") if edited.get("pool") else ())
    for key in dropped:
        edited.pop(key, None)
    _verify(edited, True)
    job.clear()
    job.update(edited)


def backup_job_delete(call: Call, id: str) -> None:
    before = len(call.lab.backup_jobs)
    call.lab.backup_jobs[:] = [j for j in call.lab.backup_jobs if j["id"] != id]
    if len(call.lab.backup_jobs) == before:
        raise ApiError(400, "Parameter verification failed.", {"id": f"No such job '{id}'"})


BACKUP_JOB_HANDLERS: dict[tuple[str, str], Callable] = {
    ("GET", "/cluster/backup"): backup_jobs,
    ("GET", "/cluster/backup/{id}"): backup_job,
    ("POST", "/cluster/backup"): backup_job_create,
    ("PUT", "/cluster/backup/{id}"): backup_job_update,
    ("DELETE", "/cluster/backup/{id}"): backup_job_delete,
}
