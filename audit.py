"""The audit log: one JSON line per record, each chained to the line before by a SHA-256 hash,
and the chain's head (the last hash and the number of lines) kept beside it in `<log>.head`.

`python server.py --verify-audit` recomputes the chain and compares its end with the head, so
it finds a line that was altered, removed, reordered or added, trailing lines cut off, and a
log rewritten with a freshly computed chain. It cannot tell when both files were rewritten
together by someone who can write both (the server's own user, root): copy the head elsewhere,
or ship the log off the machine, to prove more than that.

A line's hash covers its bytes as written (everything before `,"hash":`), so a line that parses
to the same record but reads differently (a key given twice, which one parser takes first and
another last) does not verify; lines with a key given twice are refused outright. A head that
was started for a log that already had lines (its head file was missing) is reported as a
failure: lines cut off before it cannot be ruled out. The log and its head are created readable
by their owner only (0600).

This module keeps the file and its chain; what goes into a record (masked parameters, contents
as size and hash, the tool, the verdict) is decided by `policy.audit`, which every write, exec,
refusal and dry run passes. Several server processes may share one file: appends hold an
exclusive lock on it, and the head is replaced atomically under that lock.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import threading
from pathlib import Path
from typing import IO, Any

GENESIS = "0" * 64  # the `prev` of the first line
PRIVATE = 0o600  # the log and its head: readable and writable by their owner only
LINE = re.compile(rb'(?P<body>\{.*),"hash":"(?P<hash>[0-9a-f]{64})"\}')  # the hash is the last key
_lock = threading.Lock()


def _private(path: str, flags: int) -> int:
    """open()'s opener: files this module creates are 0600."""
    return os.open(path, flags, PRIVATE)


def head_path(path: Path) -> Path:
    return path.with_name(path.name + ".head")


def _line_hash(previous: str, body: bytes) -> str:
    """The hash of a line: the previous line's hash and this line's bytes before `,"hash":`."""
    return hashlib.sha256(previous.encode() + body).hexdigest()


def _legacy_hash(previous: str, record: dict) -> str:
    """How lines were hashed before the hash covered their bytes (the parsed record, keys sorted):
    such lines still verify, as long as no key is given twice."""
    body = json.dumps(record, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256((previous + body).encode()).hexdigest()


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("a key is given twice")
    return dict(pairs)


def _read_head(path: Path) -> dict | None:
    try:
        head = json.loads(head_path(path).read_text())
        return head if isinstance(head, dict) and {"hash", "count"} <= set(head) else {}
    except FileNotFoundError:
        return None
    except ValueError:
        return {}  # present but unreadable: verify reports it


def _tail(handle: IO[str]) -> tuple[str, int]:
    """The last hash and the number of lines, read from the log itself (to start a missing head)."""
    handle.seek(0)
    last, count = GENESIS, 0
    for line in handle:
        count += 1
        try:
            last = json.loads(line)["hash"]
        except (ValueError, KeyError):
            continue
    return last, count


def _write_head(path: Path, head: dict) -> None:
    temporary = head_path(path).with_name(head_path(path).name + ".tmp")
    with open(temporary, "w", opener=_private) as handle:
        handle.write(json.dumps(head, separators=(",", ":")) + "\n")
    os.replace(temporary, head_path(path))


def open_log(path: Path) -> None:
    """Make sure the log and its head can be written (at start): raises OSError when not."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not os.access(path.parent, os.W_OK):  # the head is replaced by a rename in that directory
        raise PermissionError(13, "Permission denied", str(path.parent))
    with _lock, open(path, "a+", opener=_private) as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            if _read_head(path) is None:
                last, count = _tail(handle)
                _write_head(path, {"hash": last, "count": count, "started_at": count})
            elif not os.access(head_path(path), os.W_OK):
                raise PermissionError(13, "cannot write", str(head_path(path)))
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def append(path: Path, record: dict) -> None:
    """Add `record` as the next line of the chain (it gains `prev` and `hash`) and move the head."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _lock, open(path, "a+", opener=_private) as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # other server processes may share the file
        try:
            head = _read_head(path)
            if not head:  # a new log, or one from before heads were kept: its current end starts the head
                last, count = _tail(handle)
                head = {"hash": last, "count": count, "started_at": count}
            record.pop("hash", None)
            record["prev"] = head["hash"]
            body = json.dumps(record, separators=(",", ":"))
            record["hash"] = _line_hash(record["prev"], body.encode())
            handle.seek(0, os.SEEK_END)
            handle.write(body[:-1] + f',"hash":"{record["hash"]}"}}\n')
            handle.flush()
            _write_head(path, head | {"hash": record["hash"], "count": head["count"] + 1})
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _check_line(number: int, raw: bytes, previous: str) -> tuple[str | None, str]:
    """(the problem with line `number`, or None; its hash)."""
    match = LINE.fullmatch(raw.rstrip(b"\n"))
    try:
        body = match["body"] + b"}" if match else b""
        record = json.loads(body, object_pairs_hook=_unique_keys) if match else None
    except ValueError:
        record = None
    if not isinstance(record, dict):
        return f"line {number} is not an audit record (or gives a key twice)", previous
    claimed = match["hash"].decode()
    if record.get("prev") != previous:
        return f"line {number} does not follow line {number - 1} (a line was removed or reordered)", previous
    if claimed not in (_line_hash(previous, body), _legacy_hash(previous, record)):
        return f"line {number} was altered", previous
    return None, claimed


def _check_lines(path: Path) -> tuple[int, int | None, str, str]:
    """(lines, first bad line or None, message, last hash) of the chain itself."""
    previous, count = GENESIS, 0
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            count = number
            problem, previous = _check_line(number, raw, previous)
            if problem:
                return count, number, problem, previous
    return count, None, "", previous


def verify(path: Path) -> tuple[int, int | None, str]:
    """Check the chain and its head: (lines checked, first bad line number or None, message)."""
    count, bad, message, last = _check_lines(path)
    if bad is not None:
        return count, bad, message
    head = _read_head(path)
    if head is None:
        return count, count + 1, (f"{count} lines chain up, but the head file {head_path(path)} is missing: "
                                  f"lines cut off at the end, or a rewritten log, cannot be ruled out")
    if not head:
        return count, count + 1, f"the head file {head_path(path)} is not readable"
    if head["count"] != count:
        return count, min(count, head["count"]) + 1, (f"the log has {count} lines but its head says "
                                                      f"{head['count']}: lines were cut off at the end"
                                                      if count < head["count"] else
                                                      f"the log has {count} lines but its head says "
                                                      f"{head['count']}: lines were added after the last write")
    if head["hash"] != last:
        return count, count, "the chain does not end where the head says: the log was rewritten"
    if head.get("started_at"):  # the head file was missing while the log had lines
        started = head["started_at"]
        return count, started + 1, (f"{count} lines chain up and match the head, but the head was started at line "
                                    f"{started} for a log that already had lines: lines cut off before then cannot "
                                    f"be ruled out. Keep this log as evidence and start a new one (move both files "
                                    f"aside)")
    return count, None, f"{count} lines, chain intact, head matches"
