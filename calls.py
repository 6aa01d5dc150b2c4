"""The running tool call as one typed object (`Call`), set by the MCP edge (server.as_tool) for the
call's duration and read through `current()`: who calls and what the call may do (the policy reads
it), and what it carries from one request to the next (the receipts it kept, the yes it was given,
the guests' rows protection read, the reads it shares). A leaf module: it imports nothing of ours.
"""
from __future__ import annotations

import contextvars
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

ReadKey = tuple[str, str, str, tuple]  # (product, host label, path, sorted params)


class Reads:
    """The answers of the GETs sent during one tool call, shared by everything that asks the same
    again in it (the tool, the firewall guard, protection, the receipts, job judgement): a read is
    sent once. Any write clears them all, since one write changes what several paths show (a stop
    changes the guest's status and /cluster/resources), and so does a wait, as it starts and as it
    ends (a task changes things while it runs); the reads of a wait and the receipt's state after a
    write are always sent (`fresh`)."""

    def __init__(self) -> None:
        self._kept: dict[ReadKey, tuple[Any, Any]] = {}  # key -> (data, the envelope's total)
        self._lock = threading.Lock()  # reads of one call run side by side (proxmox_client.in_parallel)
        self._fresh = threading.local()

    @staticmethod
    def key(product: str, label: str, path: str, params: dict[str, Any]) -> ReadKey:
        return product, label, path, tuple(sorted((k, str(v)) for k, v in params.items()))

    def get(self, key: ReadKey) -> tuple[Any, Any] | None:
        if getattr(self._fresh, "on", False):
            return None
        with self._lock:
            return self._kept.get(key)

    def keep(self, key: ReadKey, data: Any, total: Any = None) -> None:
        with self._lock:
            self._kept[key] = (data, total)

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()

    @contextmanager
    def fresh(self) -> Iterator[None]:
        """Reads in this block are sent (and kept for what follows)."""
        before, self._fresh.on = getattr(self._fresh, "on", False), True
        try:
            yield
        finally:
            self._fresh.on = before


@dataclass
class Call:
    """One tool call. Set by server.as_tool (and by policy.plan_call while it plans the call); a
    resource read carries only the principal."""
    tool: str | None = None
    dry_run: bool = False  # the caller's dry_run argument
    planning: bool = False  # policy.plan_call runs the tool to find what needs the user's yes
    started: float | None = None  # time.monotonic() when the call began
    confirm: Callable[..., None] | None = None  # the confirmation step (confirmation.confirmer)
    principal: str | None = None  # who calls over HTTP (auth.principal); None: the single user
    reach: Any = None  # the principal's policy.Reach
    approved: set[str] = field(default_factory=set)  # approval keys of the plan the user said yes to
    confirmed: list[tuple] = field(default_factory=list)  # (product, label, path, pid) of confirmed calls
    notes: list[str] = field(default_factory=list)  # for the answer (an audit line that failed after sending)
    receipts: list[str] = field(default_factory=list)  # ids of the receipts this call kept
    receipt_records: dict[tuple[str, str], Any] = field(default_factory=dict)  # (product, label) -> receipts.Record
    protection_rows: dict[str, dict[int, dict]] = field(default_factory=dict)  # label -> vmid -> resources row
    protection_flags: dict[tuple[str, int], bool] = field(default_factory=dict)  # (label, vmid) -> protection=1
    reads: Reads = field(default_factory=Reads)


CALL: contextvars.ContextVar[Call | None] = contextvars.ContextVar("call", default=None)


def current() -> Call:
    """The running tool call; outside one a fresh Call, which nothing keeps."""
    return CALL.get() or Call()


def in_call() -> bool:
    return CALL.get() is not None
