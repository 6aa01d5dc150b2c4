"""The server's state database: one SQLite file, `state/state.sqlite3` in the server's state
directory (the folder of the audit log: ~/.local/state/proxmox-mcp by default), for what the server
keeps across restarts besides the audit log, which stays the hash-chained JSON lines file (audit.py).
Receipts and safety snapshots live here (receipt_store.py); other state (named tokens, OAuth
clients) takes tables of its own in the same file.

A module owns its tables: it declares them as a `Schema` (a name, a version, the statements that
make them) and calls `Database.ensure` before its first use; the database records the version of
each schema it holds (table `schemas`), so an owner can tell a new file from an old one. Keys that
sign what is kept (`Database.key`) are files of their own beside it, never rows in it.

Its folder `state/` is the server's own: made owner-only (0700), and made so again when it is
found open to others; the file is 0600 from its first byte, and SQLite gives its WAL and
shared-memory files the file's mode. One connection per Database
and process (opened on first use, again after a fork), shared by the server's threads under a lock;
the WAL journal lets a reader go on while another process writes, and a busy timeout lets a second
server on the same file wait for the first instead of failing.
"""
from __future__ import annotations

import os
import secrets
import sqlite3
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

FOLDER_NAME = "state"  # beside the audit log
FILE_NAME = "state.sqlite3"
KEY_BYTES = 32
BUSY_SECONDS = 10.0  # how long a write waits for another server process holding the file


class StateError(OSError):
    """The state database could not be read or written (its folder, its permissions, a full disk,
    another version's file); an OSError, so that callers that keep going without it catch one type."""


@dataclass(frozen=True)
class Schema:
    """The tables of one owner: `statements` make them (CREATE ... IF NOT EXISTS), `version` says
    which layout they are."""
    name: str
    version: int
    statements: tuple[str, ...]


def path_for(audit_path: Path) -> Path:
    """The state database of a server: in the folder `state/` beside its audit log."""
    return audit_path.parent / FOLDER_NAME / FILE_NAME


def private_folder(folder: Path) -> None:
    """A folder for the server's own files: made 0700 (its parents with the usual mode), and made
    0700 again when it is the server user's and open to others."""
    if not folder.is_dir():
        folder.parent.mkdir(parents=True, exist_ok=True)
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            pass  # made meanwhile by another server process
    found = folder.stat()
    if found.st_mode & 0o077 and found.st_uid == os.getuid():
        folder.chmod(0o700)


def _private_file(path: Path) -> None:
    """Create the file empty and 0600 if it is not there (SQLite would make it with the umask's mode)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass


def _new_key_file(path: Path) -> None:
    """Write a new key whole under another name, then link it into place: a second server process
    never reads a half-written key, and the first to link wins."""
    private_folder(path.parent)
    partial = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    handle = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(handle, "wb") as out:
        out.write(secrets.token_bytes(KEY_BYTES))
    try:
        os.link(partial, path)
    except FileExistsError:
        pass
    finally:
        partial.unlink(missing_ok=True)


class Database:
    """One state database file (see the module's docstring)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = threading.RLock()
        self._connection: sqlite3.Connection | None = None
        self._pid: int | None = None
        self._ensured: set[str] = set()

    def _open(self) -> sqlite3.Connection:
        if self._connection is not None and self._pid == os.getpid():
            return self._connection
        try:
            private_folder(self.path.parent)
            _private_file(self.path)
            connection = sqlite3.connect(self.path, timeout=BUSY_SECONDS, isolation_level=None,
                                         check_same_thread=False)
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at each checkpoint, consistent always
            connection.execute("CREATE TABLE IF NOT EXISTS schemas (name TEXT PRIMARY KEY, version INTEGER NOT NULL)")
        except (OSError, sqlite3.Error) as exc:
            raise StateError(f"the state database {self.path} cannot be opened ({exc})") from None
        self._connection, self._pid, self._ensured = connection, os.getpid(), set()
        return connection

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction (taken at once, so two writers never deadlock); sqlite3 errors become
        StateError."""
        with self._lock:
            connection = self._open()
            try:
                connection.execute("BEGIN IMMEDIATE")
                try:
                    yield connection
                except BaseException:
                    connection.execute("ROLLBACK")
                    raise
                connection.execute("COMMIT")
            except sqlite3.Error as exc:
                raise StateError(f"the state database {self.path} cannot be written ({exc})") from None

    def read(self, sql: str, parameters: tuple | dict = ()) -> list[tuple]:
        """The rows of one query."""
        with self._lock:
            try:
                return self._open().execute(sql, parameters).fetchall()
            except sqlite3.Error as exc:
                raise StateError(f"the state database {self.path} cannot be read ({exc})") from None

    def ensure(self, schema: Schema) -> bool:
        """Make an owner's tables if they are not there yet; True when this call made them (a new
        file, or one an earlier version wrote without them). A file that holds a newer layout is
        refused: an older server would misread it."""
        if schema.name in self._ensured and self._pid == os.getpid():
            return False
        with self.transaction() as connection:
            row = connection.execute("SELECT version FROM schemas WHERE name = ?", (schema.name,)).fetchone()
            if row and row[0] > schema.version:
                raise StateError(f"the state database {self.path} holds {schema.name} version {row[0]}, written by "
                                 f"a newer server (this one knows version {schema.version}); run that version, or "
                                 f"point PROXMOX_AUDIT_LOG to another folder")
            if row is None or row[0] < schema.version:
                for statement in schema.statements:
                    connection.execute(statement)
                connection.execute("INSERT OR REPLACE INTO schemas (name, version) VALUES (?, ?)",
                                   (schema.name, schema.version))
        self._ensured.add(schema.name)
        return row is None

    def key(self, name: str) -> bytes:
        """A secret key of this state (`<name>.key` beside the database, 0600), made on first use:
        it signs what is kept in the database, so it is never kept in it."""
        path = self.path.parent / f"{name}.key"
        try:
            if not path.exists():
                _new_key_file(path)
            key = path.read_bytes()
        except OSError as exc:
            raise StateError(f"the key file {path} cannot be read or made ({exc.strerror or exc})") from None
        if len(key) < KEY_BYTES:
            raise StateError(f"the key file {path} holds {len(key)} bytes, not {KEY_BYTES}: restore it from a "
                             f"backup, or delete it (what it signed is then refused)")
        return key

    def close(self) -> None:
        with self._lock:
            if self._connection is not None and self._pid == os.getpid():
                self._connection.close()
            self._connection = None

