"""The audit log: one JSON line per record, each chained to the line before by a SHA-256 hash,
so that an altered, removed or reordered line shows (`python server.py --verify-audit`).

This module keeps the file and its chain; what goes into a record (masked parameters, the
tool, the verdict) is decided by `policy.audit`, which every write, exec, refusal and dry run
passes. Several server processes may share one file: appends hold an exclusive file lock.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import threading
from pathlib import Path
from typing import IO

GENESIS = "0" * 64  # the `prev` of the first line
_lock = threading.Lock()


def _line_hash(previous: str, record: dict) -> str:
    body = json.dumps(record, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256((previous + body).encode()).hexdigest()


def _last_hash(handle: IO[str]) -> str:
    handle.seek(0, os.SEEK_END)
    size = handle.tell()
    handle.seek(max(0, size - 65536))
    lines = handle.read().splitlines()
    for line in reversed(lines):
        try:
            return json.loads(line)["hash"]
        except (ValueError, KeyError):
            continue
    return GENESIS


def append(path: Path, record: dict) -> None:
    """Add `record` as the next line of the chain (it gains `prev` and `hash`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _lock, open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # other server processes may share the file
        try:
            record["prev"] = _last_hash(handle)
            record["hash"] = _line_hash(record["prev"], record)
            handle.seek(0, os.SEEK_END)
            handle.write(json.dumps(record, separators=(",", ":")) + "\n")
            handle.flush()
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def verify(path: Path) -> tuple[int, int | None, str]:
    """Check the chain: (lines checked, first bad line number or None, message)."""
    previous = GENESIS
    count = 0
    with open(path) as handle:
        for number, line in enumerate(handle, 1):
            count = number
            try:
                record = json.loads(line)
                claimed = record.pop("hash")
            except (ValueError, KeyError):
                return count, number, f"line {number} is not an audit record"
            if record.get("prev") != previous:
                return count, number, (f"line {number} does not follow line {number - 1} "
                                       f"(a line was removed or reordered)")
            if _line_hash(previous, record) != claimed:
                return count, number, f"line {number} was altered"
            previous = claimed
    return count, None, f"{count} lines, chain intact"
