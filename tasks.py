"""Tasks as the tools answer them: a write that starts a task, waited for with progress
notifications to the MCP client (`run_task`); a task's status and log (`task_report`, `log_page`);
the step report of a recipe of several (`Steps`: provisioning, the restore drill).
The waiting itself is the client's (`ProxmoxClient.wait_task`), which knows no MCP.
"""
from __future__ import annotations

import json
from typing import Any

from mcp.server.mcpserver import Context

import policy
from answers import compact, iso_time, progress_reporter
from errors import InvalidArgument, ProxmoxError
from masking import masked_lines
from proxmox_client import ProxmoxClient, parse_upid, task_outcome

TASK_GOING = ("started", "still_running")  # `task` of a write whose task has not ended yet


def run_task(client: ProxmoxClient, method: str, path: str, params: dict[str, Any], wait_seconds: int,
             ctx: Context | None, action: str) -> dict:
    """Send a write and, when it starts a task, wait for it with progress notifications. The
    answer says the task's outcome as `task` (its exit status `OK`, `WARNINGS: n`, or started,
    still_running): a task's own `status` ("stopped" when it ended) would read as the guest's
    (docs/CONVENTIONS.md). A failed task raises TaskFailed (a tool error with the last log lines)."""
    data = client.request(method, path, params)
    if not (isinstance(data, str) and data.startswith("UPID:")):
        return {"action": action, "result": "ok"}
    if not wait_seconds:
        return {"action": action, "task": "started", "upid": data,
                "next": f"{client.product.task_tool} with this upid and wait_seconds to follow it"}
    outcome = client.wait_task(data, timeout=wait_seconds, on_progress=progress_reporter(ctx))
    task = outcome.pop("exitstatus", None) or outcome.pop("status")
    outcome.pop("status", None)
    return {"action": action, "task": task} | outcome


def task_report(client: ProxmoxClient, upid: str, wait_seconds: int, log_lines: int, ctx: Context | None,
                again: str) -> dict:
    """A task's status, result and last log lines (both products); with wait_seconds, waits with
    progress and answers still_running at the deadline, naming the tool (`again`) to continue."""
    parse_upid(upid, client.host.product)
    if wait_seconds:
        outcome = client.wait_task(upid, timeout=wait_seconds, on_progress=progress_reporter(ctx))
        if outcome["status"] == "still_running":
            return outcome | {"next": f"call {again} with this upid and wait_seconds to keep waiting"}
    status = client.task_status(upid)
    user = status.get("user")  # without the token, which comes as `tokenid` (docs/PROXMOX-BEHAVIOUR.md#pve-tasks)
    if user and status.get("tokenid"):
        user = f"{user}!{status['tokenid']}"
    result = compact({"upid": upid, "node": status.get("node"), "type": status.get("type"),
                      "id": status.get("id"), "user": user, "status": status.get("status"),
                      "exitstatus": status.get("exitstatus"), "start": iso_time(status.get("starttime"))})
    if log_lines:
        lines = masked_lines([line.get("t", "") for line in client.task_log(upid, limit=0)], 0, 10 ** 9, True)[0]
        result["log"] = lines[-log_lines:]  # masked whole, then cut: the tail never starts inside a key
    if status.get("status") == "stopped":
        result["result"] = task_outcome(status.get("exitstatus")) or "unknown"
    return result


def upid_product(upid: str) -> str:
    """Which product a UPID is from: PBS's has a task-id field more (docs/PROXMOX-BEHAVIOUR.md#pbs-tasks)."""
    for product in ("pve", "pbs"):
        try:
            parse_upid(upid, product)
            return product
        except ProxmoxError:
            pass
    raise InvalidArgument(f"'{upid[:200]}' is not a task id (UPID) of Proxmox VE or Backup Server; take one "
                          f"from list_tasks, pbs_list_tasks or a write's answer.")


def log_page(client: ProxmoxClient, upid: str, start: int, limit: int) -> dict:
    """Log lines of a task from `start`, with `next_start` when there are more."""
    parse_upid(upid, client.host.product)
    wanted = start + limit + 1  # read from the first line: masked before paged (masking.masked_lines)
    lines = client.task_log(upid, start=0, limit=wanted)
    page, following = masked_lines([line.get("t", "") for line in lines], start, limit, len(lines) < wanted)
    result: dict[str, Any] = {"upid": upid, "lines": page}
    if following is not None:
        result["next_start"] = following
    return result


class Steps:
    """Each step of a recipe: done, skipped, warning, failed or still_running."""

    def __init__(self) -> None:
        self.steps: list[dict] = []
        self.created: list[str] = []

    def record(self, step: str, state: str, **detail: Any) -> None:
        self.steps.append({"step": step, "state": state} | {k: v for k, v in detail.items() if v is not None})

    def answer(self, ok: bool, **extra: Any) -> dict:
        result = {"result": "ok" if ok else "failed", "steps": self.steps}
        if not ok and policy.current_call().receipts:  # what was sent, to take back (write_undo_change)
            result["receipts"] = list(policy.current_call().receipts)
        if not ok:
            result["created"] = self.created
            result["note"] = ("Nothing was deleted. " + (f"Left behind: {', '.join(self.created)}." if self.created
                                                        else "Nothing was created."))
        return result | extra

    def failure(self, what: str, **extra: Any) -> ProxmoxError:
        """A failed recipe is a tool error (isError) that carries the whole step report."""
        failed = next((s for s in reversed(self.steps) if s["state"] == "failed"), {})
        done = [s["step"] for s in self.steps if s["state"] == "done"]
        where = f" at '{failed['step']}'" if failed.get("step", "error") != "error" else \
            (f" after '{done[-1]}'" if done else "")
        answer = self.answer(False, **extra)
        report = json.dumps(answer, separators=(",", ":"), default=str)
        return ProxmoxError(f"{what} failed{where}: {str(failed.get('detail', '')).rstrip('.')}. {answer['note']} "
                            f"Step report: {report}")
