"""Backup job tools (`/cluster/backup`): what each job backs up, when, where and how long it keeps
it, the guests no job selects, and changes to one job. Every change passes the policy, which judges
the job as the edit leaves it (docs/PROXMOX-BEHAVIOUR.md#backup-jobs-and-vzdump-prune).
"""
import re
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context
from pydantic import Field

from answers import ConfirmArg, DryRunArg, Host, compact, iso_time, table
from errors import InvalidArgument
from inventory import backup_storages, guest_resources, job_selects, vmid_set
from job_edits import property_string
from proxmox_client import ProxmoxClient, pve_client

JOB_COLUMNS = ["id", "enabled", "schedule", "next_run", "storage", "mode", "selects", "guests", "retention", "notes"]
SHOWN_UNCOVERED = 50  # the answer stays small on a large cluster; the total is always given
VmidList = list[int]  # each checked in _check_names (a bound per item would cost tool-list bytes)


def selection(job: dict) -> str:
    """A job's selection in words, as vzdump reads it (pool, else vmid, else all but exclude)."""
    if job.get("pool"):
        words = f"pool {job['pool']}"
    elif job.get("vmid"):
        words = f"vmids {job['vmid']}"
    elif str(job.get("all", 0)) == "1":
        words = f"all except {job['exclude']}" if job.get("exclude") else "all"
    else:
        words = "nothing"
    return words + (f" on node {job['node']}" if job.get("node") else "")


def retention(job: dict, storages: dict[str, dict]) -> str:
    """What a run deletes afterwards: the job's prune-backups, else its storage's, unless remove=0
    (docs/PROXMOX-BEHAVIOUR.md#backup-jobs-and-vzdump-prune)."""
    if str(job.get("remove", 1)) == "0":
        return "none (remove=0)"
    if job.get("prune-backups"):  # GET answers it as an object (docs/PROXMOX-BEHAVIOUR.md#backup-jobs-after-an-edit)
        return property_string(job["prune-backups"])
    stored = storages.get(job.get("storage", ""), {}).get("prune-backups")
    return f"the storage's: {property_string(stored) if stored else 'keep-all=1'}"


def _guests(client: ProxmoxClient) -> list[dict]:
    return [g for g in guest_resources(client, fresh=True) if not g.get("template")]


def selected(job: dict, guests: list[dict]) -> list[int]:
    return sorted(g["vmid"] for g in guests if job_selects(job, g)[0])


def uncovered(jobs: list[dict], guests: list[dict]) -> list[int]:
    """The guests no enabled job selects."""
    enabled = [j for j in jobs if str(j.get("enabled", 1)) != "0"]
    return sorted(g["vmid"] for g in guests if not any(job_selects(j, g)[0] for j in enabled))


def backup_jobs(host: Host = None) -> dict:
    """Schedule, storage, mode, retention, guests; guests no job selects."""
    client = pve_client(host)
    jobs = client.get("/cluster/backup") or []
    guests = _guests(client)
    storages = {s["storage"]: s for s in client.get("/storage") or []}
    rows = [{"id": j["id"], "enabled": int(str(j.get("enabled", 1)) != "0"), "schedule": j.get("schedule"),
             "next_run": iso_time(j.get("next-run")), "storage": j.get("storage"), "mode": j.get("mode", "snapshot"),
             "selects": selection(j), "guests": len(selected(j, guests)), "retention": retention(j, storages),
             "notes": j.get("notes-template")} for j in jobs]
    missing = uncovered(jobs, guests)
    return table(JOB_COLUMNS, rows) | {"uncovered": missing[:SHOWN_UNCOVERED], "uncovered_total": len(missing)}


# ---------------------------------------------------------------- changes

def _selection_params(vmids: list[int] | None, pool: str | None, all_except: list[int] | None,
                      job: dict | None) -> dict[str, Any]:
    """The API's selection for one of vmids, pool or all_except; `all` drops vmid and pool, a vmid
    drops all, exclude and pool (PVE/API2/Backup.pm update_job)."""
    given = [name for name, value in (("vmids", vmids), ("pool", pool), ("all_except", all_except))
             if value is not None]
    if len(given) > 1:
        raise InvalidArgument(f"Give one selection, not {' and '.join(given)}: vmids (these guests), pool (the "
                              f"pool's guests) or all_except (every guest but these; [] for all).")
    if vmids is not None:
        if not vmids:
            raise InvalidArgument("vmids is empty; give guests, or all_except=[] for every guest.")
        return {"vmid": ",".join(map(str, sorted(set(vmids))))}
    if pool is not None:
        return {"pool": pool}
    if all_except is None:
        return {}
    params: dict[str, Any] = {"all": 1}
    if all_except:
        params["exclude"] = ",".join(map(str, sorted(set(all_except))))
    elif job and job.get("exclude"):
        params["delete"] = "exclude"
    return params


def _check_names(client: ProxmoxClient, params: dict[str, Any], storage: str | None) -> None:
    """Storage, pool and guests must exist; a wrong one is refused before anything is sent."""
    if storage is not None:
        names = sorted({name for name, _, _ in backup_storages(client)})
        if storage not in names:
            raise InvalidArgument(f"Storage '{storage}' does not hold backups. Backup storages: {', '.join(names)}.")
    if params.get("pool"):
        pools = sorted(p["poolid"] for p in client.get("/pools") or [])
        if params["pool"] not in pools:
            raise InvalidArgument(f"No pool '{params['pool']}'. Pools: {', '.join(pools) or 'none'}.")
    wanted = vmid_set(params.get("vmid")) | vmid_set(params.get("exclude"))
    unknown = sorted(wanted - {g["vmid"] for g in guest_resources(client, fresh=True)})
    if unknown:
        raise InvalidArgument(f"No guest with vmid {', '.join(map(str, unknown))}; list_guests shows them.")


KEEP = re.compile(r"keep-(all|last|hourly|daily|weekly|monthly|yearly)=\d+")  # the prune-backups format


def _job_params(schedule: str | None, storage: str | None, mode: str | None, keep: str | None,
                notes: str | None) -> dict[str, Any]:
    if keep and not all(KEEP.fullmatch(part.strip()) for part in keep.split(",")):
        raise InvalidArgument(f"keep={keep!r}: give keep-last, keep-hourly, keep-daily, keep-weekly, keep-monthly or "
                              f"keep-yearly with a count, comma separated (e.g. keep-daily=7,keep-weekly=4), or "
                              f"keep-all=1.")
    params = compact({"schedule": schedule, "storage": storage, "mode": mode, "notes-template": notes})
    if keep:
        params["prune-backups"] = keep
    elif keep is not None:
        params["delete"] = "prune-backups"  # the storage's retention applies again
    return params


def write_edit_backup_job(action: Literal["create", "update", "delete"],
                     job_id: Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_\-]{1,39}$")],
                     host: Host = None, vmids: VmidList | None = None, pool: str | None = None,
                     all_except: VmidList | None = None, schedule: str | None = None, storage: str | None = None,
                     mode: Literal["snapshot", "suspend", "stop"] | None = None, keep: str | None = None,
                     notes: str | None = None,
                     dry_run: DryRunArg = False, confirm: ConfirmArg = False, ctx: Context | None = None) -> dict:
    """Guests: vmids, pool or all_except ([]=all); keep: e.g. keep-daily=7 ("": the storage's)."""
    client = pve_client(host)
    jobs = {j["id"]: j for j in client.get("/cluster/backup") or []}
    job = jobs.get(job_id)
    if (job is None) != (action == "create"):
        raise InvalidArgument(f"Backup job '{job_id}' {'exists already' if job else 'does not exist'}. "
                              f"Jobs: {', '.join(sorted(jobs)) or 'none'}.")
    guests = _guests(client)
    if action == "delete":
        client.request("DELETE", f"/cluster/backup/{job_id}", {})
        left = [j for name, j in jobs.items() if name != job_id]
        now_uncovered = sorted(set(uncovered(left, guests)) & set(selected(job, guests)))
        return {"deleted": job_id, "was": selection(job), "now_uncovered": now_uncovered[:SHOWN_UNCOVERED],
                "now_uncovered_total": len(now_uncovered), "result": "ok"}
    selecting, options = _selection_params(vmids, pool, all_except, job), _job_params(schedule, storage, mode, keep,
                                                                                     notes)
    deleted = ",".join(filter(None, (selecting.pop("delete", None), options.pop("delete", None))))
    params = selecting | options | ({"delete": deleted} if deleted and action == "update" else {})
    if action == "create" and not (params.get("vmid") or params.get("pool") or params.get("all")):
        raise InvalidArgument("A new job needs its guests: vmids, pool, or all_except ([] for every guest).")
    if action == "create" and not (schedule and storage):
        raise InvalidArgument("A new job needs schedule (e.g. 02:00, sat 03:00, daily) and storage.")
    if not params:
        raise InvalidArgument("Nothing to change: give a selection, schedule, storage, mode, keep or notes.")
    _check_names(client, params, storage)
    if action == "create":
        client.request("POST", "/cluster/backup", params | {"id": job_id})
    else:
        client.request("PUT", f"/cluster/backup/{job_id}", params)
    after = client.get(f"/cluster/backup/{job_id}") or {}
    covered = selected(after, guests)
    return {"job": job_id, "selects": selection(after), "guests": covered[:SHOWN_UNCOVERED],
            "guests_total": len(covered), "was": selection(job) if job else None,
            "enabled": str(after.get("enabled", 1)) != "0", "result": "ok"}
