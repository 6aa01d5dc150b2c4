"""Changes: the receipts of what this server changed (list_changes), what changed on a guest since a
backup, a snapshot or a receipt (what_changed), and taking a change back (write_undo_change).

The receipts themselves are written by the policy's admission step (receipts.py); the diff is
config_diff.py's, shared with the restore drill. write_undo_change sends the inverse requests through
the same policy as any write: declared first as one plan (gates, protected guests, dry run and
the user's yes for the whole undo), then sent one by one.
"""
import re
from typing import Annotated, Any

from mcp.server.mcpserver import Context
from pydantic import Field

import config_diff
import policy
import receipts
from answers import ConfirmArg, DryRunArg, Host, Limit, Offset, OptionalVmid, Vmid, WaitArg, table
from errors import InvalidArgument, ProxmoxError
from inventory import archive_node, backup_storages, backup_volumes, guest_path, hidden_backups, hidden_note
from proxmox_client import client_for, pve_client
from tasks import run_task

ReceiptId = Annotated[str, Field(pattern=r"^rc-[0-9a-f]{8}$")]
MAX_LINES = 60  # changed keys listed by what_changed; the rest are counted


def _undo_state(receipt: dict) -> str:
    if receipt.get("undone_by"):
        return f"undone by {', '.join(receipt['undone_by'])}"
    return "yes" if receipt.get("undo") is True else f"no: {receipt.get('undo') or 'not recorded'}"


def _summary(receipt: dict) -> str:
    said = "; ".join(receipt.get("changes") or []) or f"{receipt['method']} {receipt['path']}"
    if receipt.get("safety_snapshot"):
        said += f" [safety snapshot: {receipt['safety_snapshot']}]"
    return said if len(said) <= 200 else said[:199] + "…"


def list_changes(vmid: OptionalVmid = None, limit: Limit = 20, offset: Offset = 0) -> dict:
    """This server's, newest first: receipt, tool, guest, change, undoable."""
    rows = [{"receipt": r["id"], "time": r["time"], "host": r["host"], "tool": r.get("tool"), "by": r.get("by"),
             "guests": ",".join(map(str, r.get("guests") or [])), "change": _summary(r), "undo": _undo_state(r)}
            for r in receipts.recent(policy.settings().receipts) if vmid is None or vmid in (r.get("guests") or [])]
    columns = ["receipt", "time", "host", "tool", "by", "guests", "change", "undo"]
    return table(columns, rows, limit=limit, offset=offset)


# ---------------------------------------------------------------- what changed

Since = Annotated[str | None, Field(description="a snapshot, receipt or volid (default: newest backup), "
                                                "e.g. before_upgrade")]


def what_changed(vmid: Vmid, since: Since = None, host: Host = None) -> dict:
    """A guest's config now vs a backup, snapshot or receipt: a line per changed key."""
    client = pve_client(host)
    base, row = guest_path(client, vmid)
    old, source, skip = _source(client, base, row, since)
    now, pending = config_diff.config_and_pending(client.get(f"{base}/pending") or [])
    lines = config_diff.changed_lines(old, now, pending, skip=skip)
    answer: dict[str, Any] = {"vmid": vmid, "since": source, "changes": lines[:MAX_LINES] or ["nothing changed"]}
    if len(lines) > MAX_LINES:
        answer["more"] = len(lines) - MAX_LINES
    if pending:
        answer["pending"] = f"{len(pending)} change(s) apply at the next restart"
    return answer


def _source(client: Any, base: str, row: dict, since: str | None) -> tuple[dict, str, Any]:
    """The config to compare with, its name, and the keys it cannot hold: a receipt's before, a
    snapshot's section, or a backup's config (newest when `since` is None)."""
    if since and receipts.RECEIPT_ID.fullmatch(since):
        return _receipt_config(receipts.load(policy.settings().receipts, since), base, row["vmid"]), \
            f"before receipt {since}", None
    if since and ":" not in since:
        names = [s["name"] for s in client.get(f"{base}/snapshot") or [] if s.get("name") != "current"]
        if since not in names:
            raise InvalidArgument(f"Guest {row['vmid']} has no snapshot '{since}'. Snapshots: "
                                  f"{', '.join(names) or 'none'}; or give a backup volid (list_backups) or a "
                                  f"receipt (list_changes).")
        return client.get(f"{base}/snapshot/{since}/config") or {}, f"snapshot {since}", config_diff.skip_for_snapshot
    if since is None:
        volume, node = newest_backup(client, row["vmid"])
    else:
        volume, node = since, backup_node(client, row["vmid"], since)
    return config_diff.read_backup_config(client, node, volume), f"backup {volume}", config_diff.skip_for_backup


def _receipt_config(receipt: dict, base: str, vmid: int) -> dict:
    same_guest = re.fullmatch(rf"/nodes/[^/]+/{base.split('/')[3]}/{vmid}/config", str(receipt.get("object")))
    if not same_guest or not isinstance(receipt.get("before"), dict):
        raise InvalidArgument(f"Receipt {receipt['id']} ({receipt['method']} {receipt['path']}) holds no config of "
                              f"guest {vmid}; give a receipt of a config change, a snapshot or a backup.")
    return receipt["before"]


def newest_backup(client: Any, vmid: int) -> tuple[str, str]:
    """The newest backup of a guest whose config this token can read, and a node that sees it (each
    node's `local` is its own: docs/PROXMOX-BEHAVIOUR.md#per-node-storages)."""
    found, _ = backup_volumes(client, vmid)
    # the config inside a backup asks what listing it asks; a PBS-backed one may have been listed on
    # PBS itself (docs/PROXMOX-BEHAVIOUR.md#configs-inside-backups)
    readable = [r for r in found if not hidden_backups(client, r["storage"], [vmid])]
    if readable:
        return readable[0]["volid"], readable[0]["node"] or archive_node(client, readable[0]["volid"], None)
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
    found = receipts.load(keeping, receipt)
    client = client_for(found["product"], found["host"])
    undo = receipts.undo_plan(found, client)
    client.plan(undo.steps, undo.summary)
    steps = []
    for method, path, params in undo.steps:
        done = run_task(client, method, path, params, wait_seconds, ctx, f"{method} {path}")
        steps.append({k: v for k, v in done.items() if k in ("action", "result", "status", "upid", "exitstatus")})
    made = list(policy.current_call().get("receipts", []))
    receipts.mark_undone(keeping, found, made or ["(no receipt)"])
    answer = {"undone": receipt, "change": _summary(found), "steps": steps,
              "result": "ok" if all(s.get("result") in ("ok", "warnings") for s in steps) else "started"}
    redo = [r for r in made if receipts.load(keeping, r).get("undo") is True]
    if redo and len(redo) == len(made):
        answer["redo"] = f"write_undo_change receipt={redo[-1]} takes this undo back"
    if re.search(r"/snapshot/[^/]+/rollback$", undo.steps[-1][1]) and found.get("before") == "running":
        answer["note"] = "The guest was running before the rollback; it is started again."
    return answer
