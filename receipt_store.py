"""Where receipts are kept: tables of the state database (state.py), one row per receipt, each
signed with the state's receipts key, plus the safety snapshots the server took.

    receipts          id, epoch, the row list_changes shows (JSON), the whole receipt (JSON), and
                      an HMAC-SHA256 over the three with the key in `receipts.key` beside the
                      database (0600), never in it: a row edited, swapped under another id or
                      copied from another server's store does not verify, and is never undone
    receipt_guests    (vmid, epoch, id): the guests a receipt names, for list_changes vmid=
    receipt_hosts     (host, epoch, id): the host a receipt reached, so that a principal limited to
                      some hosts pages and loads only theirs (`hosts=`)
    receipt_count     how many receipts are kept, so that a write never counts them
    safety_snapshots  each safety snapshot taken (host, guest, name, when, the receipt), and when
                      it was removed

Reads and pruning go through indexes: a write adds its row and drops what is older than the
age or beyond the count from the oldest end (an index range, not a scan; beyond the count in
batches of a hundredth of it), and list_changes reads one page. Receipts kept as files by earlier
versions (`<audit log>.receipts/rc-*.json`) are imported once, when the tables are made, and
marked as imported: a file anyone who could write the folder may have edited is listed and
compared, never undone.
"""
from __future__ import annotations

import hmac
import json
import re
import time
from pathlib import Path
from typing import Any, Callable

import state
from errors import InvalidArgument

# Version 2 adds receipt_hosts (docs/REVIEW-SECURITY.md F11); a version-1 file gets it filled from the
# receipts it holds (the last statement) the first time this version opens it (state.Database.ensure)
SCHEMA = state.Schema("receipts", 2, (
    "CREATE TABLE IF NOT EXISTS receipts (id TEXT PRIMARY KEY, epoch REAL NOT NULL, row TEXT NOT NULL, "
    "body TEXT NOT NULL, mac TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS receipts_by_epoch ON receipts (epoch)",
    "CREATE TABLE IF NOT EXISTS receipt_guests (vmid INTEGER NOT NULL, epoch REAL NOT NULL, id TEXT NOT NULL, "
    "PRIMARY KEY (vmid, epoch, id)) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS receipt_guests_by_id ON receipt_guests (id)",
    "CREATE TABLE IF NOT EXISTS receipt_count (total INTEGER NOT NULL)",
    "INSERT INTO receipt_count (total) SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM receipt_count)",
    "CREATE TRIGGER IF NOT EXISTS receipt_added AFTER INSERT ON receipts BEGIN "
    "UPDATE receipt_count SET total = total + 1; END",
    "CREATE TRIGGER IF NOT EXISTS receipt_removed AFTER DELETE ON receipts BEGIN "
    "UPDATE receipt_count SET total = total - 1; DELETE FROM receipt_guests WHERE id = old.id; END",
    "CREATE TABLE IF NOT EXISTS safety_snapshots (host TEXT NOT NULL, vmid INTEGER NOT NULL, name TEXT NOT NULL, "
    "epoch REAL NOT NULL, receipt TEXT, base TEXT NOT NULL, storage TEXT, removed REAL, "
    "PRIMARY KEY (host, vmid, name))",
    "CREATE INDEX IF NOT EXISTS safety_by_epoch ON safety_snapshots (removed, epoch)",
    "CREATE TABLE IF NOT EXISTS receipt_imports (folder TEXT PRIMARY KEY, epoch REAL NOT NULL, count INTEGER)",
    "CREATE TABLE IF NOT EXISTS receipt_hosts (host TEXT NOT NULL, epoch REAL NOT NULL, id TEXT NOT NULL, "
    "PRIMARY KEY (host, epoch, id)) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS receipt_hosts_by_id ON receipt_hosts (id)",
    "CREATE TRIGGER IF NOT EXISTS receipt_removed_hosts AFTER DELETE ON receipts BEGIN "
    "DELETE FROM receipt_hosts WHERE id = old.id; END",
    "INSERT OR IGNORE INTO receipt_hosts (host, epoch, id) SELECT json_extract(body, '$.host'), epoch, id "
    "FROM receipts WHERE json_type(body, '$.host') = 'text'",
))
KEY_NAME = "receipts"
SAFETY_NAME = re.compile(r"mcp-safety-[0-9a-f]{8}(-\d+)?")  # the only names the server removes by its rule
IMPORTED = "kept by an earlier version as a plain file, which could have been edited since"


class Unverified(InvalidArgument):
    """A receipt whose signature does not match: edited, swapped or copied from elsewhere."""


class Store:
    """The receipts of one server (see the module's docstring)."""

    def __init__(self, database: state.Database, legacy: Path | None, row_of: Callable[[dict], dict]):
        self.database = database
        self.legacy = legacy  # the folder of an earlier version's receipt files
        self.row_of = row_of  # the list row of a receipt (receipts.row_of)
        self._key: bytes | None = None

    def _ready(self) -> None:
        if self.database.ensure(SCHEMA) and self.legacy is not None:
            self.import_legacy()

    def _mac(self, receipt_id: str, row: str, body: str) -> str:
        if self._key is None:  # read once: a key replaced while the server runs is met at its next start
            self._key = self.database.key(KEY_NAME)
        return hmac.digest(self._key, "\n".join((receipt_id, row, body)).encode(), "sha256").hex()

    def _verified(self, receipt_id: str, row: str, body: str, mac: str) -> bool:
        return hmac.compare_digest(self._mac(receipt_id, row, body), mac)

    # ---------------------------------------------------------------- receipts

    def save(self, receipt: dict, keep: int, days: int) -> None:
        """Add a receipt or replace it (a call's later step, its undo), signed; then drop those
        older than `days` and beyond the newest `keep`."""
        self._ready()
        row = json.dumps(self.row_of(receipt), separators=(",", ":"), default=str)
        body = json.dumps(receipt, separators=(",", ":"), default=str)
        mac = self._mac(receipt["id"], row, body)
        with self.database.transaction() as db:
            db.execute("INSERT INTO receipts (id, epoch, row, body, mac) VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) "
                       "DO UPDATE SET row = excluded.row, body = excluded.body, mac = excluded.mac",
                       (receipt["id"], receipt["epoch"], row, body, mac))
            _index(db, receipt)
            _prune(db, keep, time.time() - days * 86400)

    def load(self, receipt_id: str, hosts: frozenset[str] | None = None) -> dict | None:
        """A receipt by id, verified (Unverified when it does not verify); None when there is none, or
        when it was made on a host outside `hosts` (the caller's reach: None is every host)."""
        self._ready()
        found = self.database.read("SELECT row, body, mac FROM receipts WHERE id = ?", (receipt_id,))
        if not found:
            return None
        row, body, mac = found[0]
        if not self._verified(receipt_id, row, body, mac):
            raise Unverified(f"Receipt {receipt_id} does not verify: its stored copy was changed outside this "
                             f"server (edited, or put there under another id or from another server's state) "
                             f"since it was kept, so it is not taken back. Nothing was sent. list_changes shows "
                             f"the receipts that verify.")
        receipt = json.loads(body)
        if receipt.get("id") != receipt_id:
            raise Unverified(f"Receipt {receipt_id} holds receipt {receipt.get('id')}: nothing was sent.")
        return receipt if hosts is None or receipt.get("host") in hosts else None

    def page(self, vmid: int | None, limit: int, offset: int,
             hosts: frozenset[str] | None = None) -> tuple[list[dict], int]:
        """One page of list rows, newest first (each with its id, and `verified`), and how many
        there are in all; only those of `hosts` when given (the caller's reach)."""
        self._ready()
        if hosts is not None:
            return self._page_of_hosts(vmid, limit, offset, sorted(hosts))
        if vmid is None:
            total = self.database.read("SELECT total FROM receipt_count")[0][0]
            found = self.database.read("SELECT id, row, body, mac FROM receipts ORDER BY epoch DESC LIMIT ? OFFSET ?",
                                       (limit, offset))
        else:
            total = self.database.read("SELECT count(*) FROM receipt_guests WHERE vmid = ?", (vmid,))[0][0]
            found = self.database.read(
                "SELECT r.id, r.row, r.body, r.mac FROM receipt_guests g JOIN receipts r ON r.id = g.id "
                "WHERE g.vmid = ? ORDER BY g.epoch DESC LIMIT ? OFFSET ?", (vmid, limit, offset))
        return self._rows(found), total

    def _page_of_hosts(self, vmid: int | None, limit: int, offset: int, hosts: list[str]) -> tuple[list[dict], int]:
        marks = ", ".join("?" * len(hosts))
        joined, where, args = "", f"h.host IN ({marks})", tuple(hosts)
        if vmid is not None:
            joined, where, args = "JOIN receipt_guests g ON g.id = h.id ", f"g.vmid = ? AND {where}", (vmid, *hosts)
        total = self.database.read(f"SELECT count(*) FROM receipt_hosts h {joined}WHERE {where}", args)[0][0]
        found = self.database.read(f"SELECT r.id, r.row, r.body, r.mac FROM receipt_hosts h {joined}JOIN receipts r "
                                   f"ON r.id = h.id WHERE {where} ORDER BY h.epoch DESC LIMIT ? OFFSET ?",
                                   (*args, limit, offset))
        return self._rows(found), total

    def _rows(self, found: list[tuple]) -> list[dict]:
        return [json.loads(row) | {"receipt": receipt_id, "verified": self._verified(receipt_id, row, body, mac)}
                for receipt_id, row, body, mac in found]

    def ids(self) -> list[str]:
        """Every receipt id kept, newest first (tests and the bench)."""
        self._ready()
        return [r[0] for r in self.database.read("SELECT id FROM receipts ORDER BY epoch DESC")]

    # ---------------------------------------------------------------- safety snapshots

    def add_safety(self, host: str, vmid: int, name: str, base: str, receipt: str, storage: str | None) -> None:
        self._ready()
        with self.database.transaction() as db:
            db.execute("INSERT OR REPLACE INTO safety_snapshots (host, vmid, name, epoch, receipt, base, storage) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?)", (host, vmid, name, time.time(), receipt, base, storage))

    def removed_safety(self, host: str, vmid: int, name: str) -> None:
        self._ready()
        with self.database.transaction() as db:
            db.execute("UPDATE safety_snapshots SET removed = ? WHERE host = ? AND vmid = ? AND name = ?",
                       (time.time(), host, vmid, name))

    def safety_of(self, host: str, vmid: int) -> list[dict]:
        """A guest's safety snapshots that were not removed, newest first."""
        self._ready()
        rows = self.database.read("SELECT name, epoch, base FROM safety_snapshots WHERE host = ? AND vmid = ? AND "
                                  "removed IS NULL ORDER BY epoch DESC", (host, vmid))
        return [{"name": name, "epoch": epoch, "base": base} for name, epoch, base in rows
                if SAFETY_NAME.fullmatch(name)]

    def safety_page(self, vmid: int | None, limit: int,
                    hosts: frozenset[str] | None = None) -> tuple[list[dict], int]:
        """The safety snapshots kept (not removed), newest first, and how many there are; only those
        of `hosts` when given."""
        self._ready()
        where, args = ("removed IS NULL", ()) if vmid is None else ("removed IS NULL AND vmid = ?", (vmid,))
        if hosts is not None:
            where, args = f"{where} AND host IN ({', '.join('?' * len(hosts))})", (*args, *sorted(hosts))
        total = self.database.read(f"SELECT count(*) FROM safety_snapshots WHERE {where}", args)[0][0]
        rows = self.database.read(f"SELECT host, vmid, name, epoch, receipt, storage FROM safety_snapshots WHERE "
                                  f"{where} ORDER BY epoch DESC LIMIT ?", (*args, limit))
        columns = ("host", "vmid", "name", "epoch", "receipt", "storage")
        return [dict(zip(columns, row, strict=True)) for row in rows], total

    # ---------------------------------------------------------------- the files of earlier versions

    def import_legacy(self) -> int:
        """Receipts an earlier version kept as files, imported once (marked `imported`); the files
        are left where they are."""
        folder = self.legacy
        if folder is None or not folder.is_dir() or self.database.read(
                "SELECT 1 FROM receipt_imports WHERE folder = ?", (str(folder),)):
            return 0
        found = [receipt for receipt in map(_legacy_receipt, sorted(folder.glob("rc-*.json"))) if receipt]
        with self.database.transaction() as db:
            for receipt in found:
                row = json.dumps(self.row_of(receipt), separators=(",", ":"), default=str)
                body = json.dumps(receipt, separators=(",", ":"), default=str)
                db.execute("INSERT OR IGNORE INTO receipts (id, epoch, row, body, mac) VALUES (?, ?, ?, ?, ?)",
                           (receipt["id"], receipt["epoch"], row, body, self._mac(receipt["id"], row, body)))
                _index(db, receipt)
            db.execute("INSERT INTO receipt_imports (folder, epoch, count) VALUES (?, ?, ?)",
                       (str(folder), time.time(), len(found)))
        return len(found)


def _index(db: Any, receipt: dict) -> None:
    """The guests a receipt names and the host it reached, for pages by guest and by reach."""
    db.executemany("INSERT OR IGNORE INTO receipt_guests (vmid, epoch, id) VALUES (?, ?, ?)",
                   [(int(vmid), receipt["epoch"], receipt["id"]) for vmid in receipt.get("guests") or []])
    if isinstance(receipt.get("host"), str):
        db.execute("INSERT OR IGNORE INTO receipt_hosts (host, epoch, id) VALUES (?, ?, ?)",
                   (receipt["host"], receipt["epoch"], receipt["id"]))


def _prune(db: Any, keep: int, oldest: float) -> None:
    """Drop receipts older than `oldest` and beyond the newest `keep`: index ranges from the oldest end,
    those beyond the count in batches of a hundredth of it (a store at its count pays one delete per
    hundred writes, not one per write)."""
    db.execute("DELETE FROM receipts WHERE epoch < ?", (oldest,))
    over = db.execute("SELECT total FROM receipt_count").fetchone()[0] - keep
    if over > keep // 100:
        db.execute("DELETE FROM receipts WHERE id IN (SELECT id FROM receipts ORDER BY epoch LIMIT ?)", (over,))


# What a receipt file of an earlier version held at its top level besides the request it records.
LEGACY_TOP = ("id", "time", "epoch", "host", "product", "tool", "by", "guests", "undone_by", "undone_at")


def _legacy_receipt(path: Path) -> dict | None:
    """A receipt file of an earlier version (one request each) as a receipt of one step."""
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(old, dict) or not re.fullmatch(r"rc-[0-9a-f]{8}", str(old.get("id"))) or \
            not isinstance(old.get("epoch"), (int, float)):
        return None
    step = {k: v for k, v in old.items() if k not in LEGACY_TOP}
    return {k: old.get(k) for k in LEGACY_TOP if k in old} | {
        "principal": None, "imported": IMPORTED, "steps": [step | {"guests": old.get("guests") or []}]}
