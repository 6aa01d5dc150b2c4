"""Changes: the receipts of what this server changed (list_changes), what changed on a guest since a
backup, a snapshot or a receipt (what_changed), and taking a change back (write_undo_change).

The receipts themselves are written by the policy's admission step (receipts.py) into the state
database (receipt_store.py), one per tool call; the diff is config_diff.py's, shared with the restore
drill. write_undo_change takes back only a receipt that verifies and was made on this host, and
sends the inverse requests (undo.py) through the same policy as any write: declared first as one
plan (gates, protected guests, a dry run and the user's question showing each request, asked once
for the whole undo), then sent one by one.
"""
import re
from typing import Annotated, Any

from mcp.server.mcpserver import Context
from pydantic import Field

import config_diff
import policy
import receipts
import undo
from answers import LIST_CAP, ConfirmArg, DryRunArg, Host, Limit, Offset, OptionalVmid, Vmid, WaitArg, iso_time, table
from errors import InvalidArgument, ProxmoxError, ToolFailure
from fanout import in_parallel
from job_edits import delete_names
from masking import mask_params
from state import StateError
from inventory import (archive_node, backup_storages, backup_volumes, guest_path, hidden_backups, hidden_note,
                       storage_rows)
from proxmox_client import client_for, pve_client
from tasks import run_task

ReceiptId = Annotated[str, Field(pattern=r"^rc-[0-9a-f]{8}$")]
MAX_LINES = 60  # changed keys listed by what_changed; the rest are counted
COLUMNS = ["receipt", "time", "host", "tool", "by", "guests", "change", "undo"]


SAFETY_COLUMNS = ["name", "vmid", "host", "taken", "receipt", "storage"]


def reached() -> frozenset[str] | None:
    """The hosts the caller may use (its reach), None for every host: stored state of another host is
    neither listed nor read (docs/REVIEW-SECURITY.md F11)."""
    reach = policy.current_call().reach
    return reach.hosts if reach is not None else None


def list_changes(vmid: OptionalVmid = None, limit: Limit = 20, offset: Offset = 0) -> dict:
    """This server's writes, newest first, with receipts; safety snapshots kept."""
    keeping = policy.settings().receipts
    if keeping.store is None:
        return table(COLUMNS, [])
    try:
        rows, total = keeping.store.page(vmid, limit, offset, reached())
        safety, kept = keeping.store.safety_page(vmid, LIST_CAP, reached())
    except StateError as exc:
        raise ProxmoxError(f"The receipts cannot be read: {exc}.") from None
    for row in rows:
        if not row.pop("verified"):
            row["undo"] = "no: it does not verify (changed outside this server)"
    columns = COLUMNS + (["principal"] if any(row.get("principal") for row in rows) else [])
    answer = table(columns, rows) | {"total": total}
    if offset + limit < total:
        answer |= {"truncated": True, "next_offset": offset + limit}
    if safety:
        answer["safety_snapshots"] = table(SAFETY_COLUMNS, [s | {"taken": iso_time(s["epoch"])} for s in safety]) | {
            "total": kept, "rule": f"the newest {keeping.safety_keep} of a guest, none older than "
                                    f"{keeping.safety_days} days (PROXMOX_SAFETY_KEEP, PROXMOX_SAFETY_DAYS); "
                                    f"write_delete_snapshot removes one"}
    return answer


# ---------------------------------------------------------------- what changed

Since = Annotated[str | None, Field(description="snapshot, receipt or volid; default: newest backup")]


def what_changed(vmid: Vmid, since: Since = None, host: Host = None) -> dict:
    """A guest's config now vs a backup, snapshot or receipt, key by key."""
    client = pve_client(host)
    # side by side where one read does not need another: the guest and the storages; then the backups
    # near the guest and its config now; then the config in the newest backup (docs/BENCHMARKS.md#flat)
    (base, row), rows = _all(in_parallel([lambda: guest_path(client, vmid),
                                          lambda: storage_rows(client) if since is None else []]))
    (old, source, skip), now_rows = _all(in_parallel([lambda: _source(client, base, row, since, rows),
                                                      lambda: client.get(f"{base}/pending") or []]))
    now, pending = config_diff.config_and_pending(now_rows)
    lines = config_diff.changed_lines(old, now, pending, skip=skip)
    answer: dict[str, Any] = {"vmid": vmid, "since": source, "changes": lines[:MAX_LINES] or ["nothing changed"]}
    if len(lines) > MAX_LINES:
        answer["more"] = len(lines) - MAX_LINES
    if pending:
        answer["pending"] = f"{len(pending)} change(s) apply at the next restart"
    return answer


def _all(results: list[Any]) -> list[Any]:
    """Reads side by side, each one's answer; the first that failed is raised."""
    for result in results:
        if isinstance(result, ToolFailure):
            raise result
    return results


def _source(client: Any, base: str, row: dict, since: str | None, rows: list[dict]) -> tuple[dict, str, Any]:
    """The config to compare with, its name, and the keys it cannot hold: a receipt's before, a
    snapshot's section, or a backup's config (newest when `since` is None)."""
    if since and receipts.RECEIPT_ID.fullmatch(since):
        return _receipt_config(receipts.load(policy.settings().receipts, since, reached()), base, row["vmid"]), \
            f"before receipt {since}", None
    if since and ":" not in since:
        names = [s["name"] for s in client.get(f"{base}/snapshot") or [] if s.get("name") != "current"]
        if since not in names:
            raise InvalidArgument(f"Guest {row['vmid']} has no snapshot '{since}'. Snapshots: "
                                  f"{', '.join(names) or 'none'}; or give a backup volid (list_backups) or a "
                                  f"receipt (list_changes).")
        return client.get(f"{base}/snapshot/{since}/config") or {}, f"snapshot {since}", config_diff.skip_for_snapshot
    if since is None:
        volume, node = newest_backup(client, row["vmid"], row["node"], rows)
    else:
        volume, node = since, backup_node(client, row["vmid"], since)
    return config_diff.read_backup_config(client, node, volume), f"backup {volume}", config_diff.skip_for_backup


def _receipt_config(receipt: dict, base: str, vmid: int) -> dict:
    """The guest's config before the call: the `before` of its first step that read that config."""
    config = re.compile(rf"/nodes/[^/]+/{base.split('/')[3]}/{vmid}/config")
    before = next((step.get("before") for step in receipts.acting_steps(receipt)
                   if config.fullmatch(str(step.get("object"))) and isinstance(step.get("before"), dict)), None)
    if before is None:
        first = (receipts.acting_steps(receipt) or receipt.get("steps") or [{}])[0]
        raise InvalidArgument(f"Receipt {receipt['id']} ({first.get('method')} {first.get('path')}) holds no config "
                              f"of guest {vmid}; give a receipt of a config change, a snapshot or a backup.")
    return before


def newest_backup(client: Any, vmid: int, node: str, rows: list[dict] | None = None) -> tuple[str, str]:
    """The newest backup of a guest whose config this token can read, and a node that sees it (each
    node's `local` is its own: docs/PROXMOX-BEHAVIOUR.md#per-node-storages): on the shared storages and
    those of the guest's node, where vzdump writes them."""
    found, _ = backup_volumes(client, vmid, near=node, rows=rows)
    # the config inside a backup asks what listing it asks; a PBS-backed one may have been listed on
    # PBS itself (docs/PROXMOX-BEHAVIOUR.md#configs-inside-backups)
    readable = [r for r in found if not hidden_backups(client, r["storage"], [vmid])]
    if readable:
        newest = readable[0]
        return newest["volid"], newest["node"] or newest.get("read_on") or archive_node(client, newest["volid"], None)
    hidden = sorted({name for name, _, _ in backup_storages(client) if hidden_backups(client, name, [vmid])})
    if hidden:
        raise _unreadable(client, vmid, hidden)
    raise ProxmoxError(f"Guest {vmid} has no backup; compare with a snapshot (since=<name>) or a receipt instead.")


def backup_node(client: Any, vmid: int, volume: str) -> str:
    """A node that sees a backup: any for a shared storage, the one whose disk holds it for a node's
    own `local` (inventory.archive_node)."""
    storage = volume.split(":", 1)[0]
    if hidden_backups(client, storage, [vmid]):
        raise _unreadable(client, vmid, [storage])
    return archive_node(client, volume, None)


def _unreadable(client: Any, vmid: int, storages: list[str]) -> ProxmoxError:
    note = hidden_note(client, {name: [vmid] for name in storages}, 1)
    return ProxmoxError(f"Guest {vmid}'s backups on {', '.join(storages)} cannot be read by this token: "
                        f"{note['why']} Grant: {note['grant']}. Or compare with a snapshot (since=<name>) or a "
                        f"receipt.")


# ---------------------------------------------------------------- undo

def write_undo_change(receipt: ReceiptId, wait_seconds: WaitArg = 120, dry_run: DryRunArg = False,
               confirm: ConfirmArg = False, ctx: Context | None = None) -> dict:
    """By its receipt (list_changes), under the same policy as any write."""
    keeping = policy.settings().receipts
    found = receipts.load(keeping, receipt, reached())  # verified: one changed outside this server is refused
    client = client_for(found["product"], found["host"])
    undo.check_host(found, client.host)
    plan = undo.undo_plan(found, client)
    _declare(client, plan)
    steps, made = [], None
    for method, path, params in plan.steps:
        params = params | undo.made_rule_check(client, made, method, path)
        made = undo.made_rule(method, path, params) or made
        done = run_task(client, method, path, params, wait_seconds, ctx, f"{method} {path}")
        steps.append({k: v for k, v in done.items() if k in ("action", "result", "status", "upid", "exitstatus")})
    made = list(policy.current_call().receipts)
    receipts.mark_undone(keeping, found, made or ["(no receipt)"])
    answer = {"undone": receipt, "change": receipts.summary(found), "steps": steps,
              "result": "ok" if all(s.get("result") in ("ok", "warnings") for s in steps) else "started"}
    if made and receipts.undo_state(receipts.load(keeping, made[-1], reached())) is True:
        answer["redo"] = f"write_undo_change receipt={made[-1]} takes this undo back"
    waiting, notes = _pending(client, plan.steps)
    if waiting:
        answer |= {"result": "pending until restart", "pending": waiting}
    rollback = [s for s in receipts.acting_steps(found) if s.get("kind") == "rollback"]
    if rollback and rollback[-1].get("before") == "running":
        notes.append("The guest was running before the rollback; it is started again.")
    return answer | ({"note": " ".join(notes)} if notes else {})


def _declare(client: Any, plan: undo.Undo) -> None:
    """The undo's requests declared before the first (judged, dry run, one question); a dry run
    shows each with its method and parameters."""
    try:
        client.plan(plan.steps, plan.summary)
    except policy.DryRun as dry:
        shown = dry.plan.get("steps") or []  # the undo's requests first, then what the policy adds after them
        for index, (method, _, params) in enumerate(plan.steps[:len(shown)]):
            shown[index] |= {"method": method, "params": mask_params(params)}
        raise


def _pending(client: Any, steps: list[tuple[str, str, dict]]) -> tuple[dict, list[str]]:
    """What the undo left waiting for a restart, and the note that says so: on a running guest a
    config option Proxmox cannot hot-plug is set back in `pending` (qemu-server `$update_vm_api`,
    pve-container `vmconfig_hotplug_pending`: docs/PROXMOX-BEHAVIOUR.md#pending-config)."""
    touched: dict[str, set[str]] = {}
    for method, path, params in steps:
        if method in ("PUT", "POST") and re.fullmatch(r"/nodes/[^/]+/(qemu|lxc)/\d+/config", path):
            keys = {k for k in params if k not in ("digest", "delete")} | set(delete_names(params.get("delete")))
            touched.setdefault(path.rsplit("/", 1)[0], set()).update(keys)
    waiting: dict[str, Any] = {}
    for base, keys in touched.items():
        try:
            _, pending = config_diff.config_and_pending(client.get(f"{base}/pending") or [])
        except ProxmoxError:
            continue
        waiting |= {key: value for key, value in pending.items() if key in keys}
    if not waiting:
        return {}, []
    guests = ", ".join(sorted({base.rsplit("/", 1)[1] for base in touched}))
    return waiting, [f"Guest {guests} runs with the values it has now of {', '.join(sorted(waiting))} until Proxmox "
                     f"restarts it (write_power_guest action=reboot, or shutdown then start): the undo set them back "
                     f"in its pending config."]
