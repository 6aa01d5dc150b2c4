"""The embedded authorization server's state, in SQLite (the standard library's sqlite3), so that
clients and grants survive a restart: registered clients, pending consents, authorization codes and
tokens. A credential is never written, only its SHA-256: client secrets, codes, access and refresh
tokens, the consent form's one-time value.

The tables are prefixed `oauth_` and created when missing, so the file (PROXMOX_STATE_DB, by default
`state.sqlite3` beside the audit log) can be shared with the server's other state. Every change is
one short transaction; several processes may use the file (WAL, a busy timeout).
"""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import sqlite3
import time
from contextlib import closing
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS oauth_clients (
    client_id TEXT PRIMARY KEY, metadata TEXT NOT NULL, secret_sha256 TEXT, created INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS oauth_consents (
    id TEXT PRIMARY KEY, client_id TEXT NOT NULL, params TEXT NOT NULL, nonce_sha256 TEXT,
    attempts INTEGER NOT NULL DEFAULT 0, expires INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS oauth_codes (
    code_sha256 TEXT PRIMARY KEY, client_id TEXT NOT NULL, grant_id TEXT NOT NULL, params TEXT NOT NULL,
    expires INTEGER NOT NULL, used INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS oauth_tokens (
    token_sha256 TEXT PRIMARY KEY, kind TEXT NOT NULL, client_id TEXT NOT NULL, grant_id TEXT NOT NULL,
    profile TEXT NOT NULL, resource TEXT, expires INTEGER NOT NULL,
    used INTEGER NOT NULL DEFAULT 0, revoked INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS oauth_tokens_grant ON oauth_tokens (grant_id);
"""
CONSENT_SECONDS = 600  # a consent page is answered within ten minutes
CODE_SECONDS = 300  # an authorization code is exchanged within five (RFC 6749 4.1.2: short-lived)
ACCESS_SECONDS = 3600  # an access token lasts an hour
REFRESH_SECONDS = 30 * 86400  # a refresh token thirty days (each use makes a new one)
UNUSED_CLIENT_SECONDS = 3600  # a registered client that got no grant within an hour is dropped
# What anyone may store without a credential is bounded, and refused beyond (429), never evicted: evicting
# would let a stranger push out a client or a consent the operator is answering (docs/REVIEW-SECURITY.md F14)
PENDING_CLIENTS = 50  # registered clients without a grant
CONSENTS_PER_CLIENT, CONSENTS = 10, 100  # consent pages waiting for the operator, per client and in all
PENDING = "client_id NOT IN (SELECT client_id FROM oauth_codes UNION SELECT client_id FROM oauth_tokens)"


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


class Full(Exception):
    """A bound of unauthenticated state is reached: nothing stored; try again in `retry_after` seconds."""

    def __init__(self, what: str, retry_after: int):
        super().__init__(f"too many {what} at once: try again in {retry_after} s")
        self.retry_after = retry_after


def new_secret(prefix: str = "") -> str:
    return prefix + secrets.token_urlsafe(32)


class Store:
    """The tables of one state database file."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))  # owner-only from its first byte
        with closing(self._connect()) as db, db:
            db.executescript(SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=10)
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA journal_mode=WAL")
        return db

    def run(self, sql: str, *args: Any) -> int:
        """One statement in its own transaction: the number of rows it changed."""
        with closing(self._connect()) as db, db:
            return db.execute(sql, args).rowcount

    def one(self, sql: str, *args: Any) -> sqlite3.Row | None:
        with closing(self._connect()) as db:
            return db.execute(sql, args).fetchone()

    # ---------------------------------------------------------------- clients

    def add_client(self, client_id: str, metadata: dict, secret: str | None) -> None:
        """Store a client, unless PENDING_CLIENTS wait for a grant already (Full). A client without a grant
        is dropped after UNUSED_CLIENT_SECONDS, unless its consent page is still open."""
        now = int(time.time())
        self.run(f"DELETE FROM oauth_clients WHERE created < ? AND {PENDING} AND client_id NOT IN "
                 "(SELECT client_id FROM oauth_consents WHERE expires >= ?)", now - UNUSED_CLIENT_SECONDS, now)
        # one statement, so that concurrent registrations cannot pass the bound together
        if not self.run(f"INSERT INTO oauth_clients SELECT ?, ?, ?, ? WHERE (SELECT COUNT(*) FROM oauth_clients "
                        f"WHERE {PENDING}) < ?", client_id, json.dumps(metadata),
                        digest(secret) if secret else None, now, PENDING_CLIENTS):
            oldest = self.one(f"SELECT MIN(created) AS t FROM oauth_clients WHERE {PENDING}")["t"] or now
            raise Full("clients waiting for a grant", max(1, oldest + UNUSED_CLIENT_SECONDS - now))

    def granted(self, client_id: str) -> bool:
        """Whether the operator has approved this client (a code or a token of it is kept)."""
        return self.one(f"SELECT 1 FROM oauth_clients WHERE client_id = ? AND NOT {PENDING}", client_id) is not None

    def client(self, client_id: str) -> tuple[dict, str | None] | None:
        """A client's metadata and the hash of its secret."""
        row = self.one("SELECT metadata, secret_sha256 FROM oauth_clients WHERE client_id = ?", client_id)
        return (json.loads(row["metadata"]), row["secret_sha256"]) if row else None

    # ---------------------------------------------------------------- consents waiting for the operator

    def add_consent(self, client_id: str, params: dict) -> str:
        """A consent request's id, unless CONSENTS_PER_CLIENT of this client's, or CONSENTS in all, are open (Full)."""
        consent = new_secret()
        now = int(time.time())
        self.run("DELETE FROM oauth_consents WHERE expires < ?", now)
        if self.run("INSERT INTO oauth_consents (id, client_id, params, expires) SELECT ?, ?, ?, ? WHERE "
                    "(SELECT COUNT(*) FROM oauth_consents WHERE client_id = ?) < ? AND "
                    "(SELECT COUNT(*) FROM oauth_consents) < ?", consent, client_id, json.dumps(params),
                    now + CONSENT_SECONDS, client_id, CONSENTS_PER_CLIENT, CONSENTS):
            return consent
        mine = self.one("SELECT COUNT(*) AS n, MIN(expires) AS t FROM oauth_consents WHERE client_id = ?", client_id)
        oldest = mine if mine["n"] >= CONSENTS_PER_CLIENT else self.one("SELECT MIN(expires) AS t FROM oauth_consents")
        raise Full("authorization requests waiting for the operator", max(1, (oldest["t"] or now) - now))

    def consent(self, consent: str) -> sqlite3.Row | None:
        return self.one("SELECT * FROM oauth_consents WHERE id = ? AND expires >= ?", consent, int(time.time()))

    def new_nonce(self, consent: str) -> str:
        """The consent form's one-time value: a new one replaces the last (only the newest page's form works)."""
        nonce = new_secret()
        self.run("UPDATE oauth_consents SET nonce_sha256 = ? WHERE id = ?", digest(nonce), consent)
        return nonce

    def take_nonce(self, consent: str, nonce: str) -> bool:
        """Whether `nonce` is the consent's current one-time value; it is used up either way when it is."""
        return self.run("UPDATE oauth_consents SET nonce_sha256 = NULL WHERE id = ? AND nonce_sha256 = ?",
                        consent, digest(nonce)) == 1

    def failed_attempt(self, consent: str) -> int:
        self.run("UPDATE oauth_consents SET attempts = attempts + 1 WHERE id = ?", consent)
        row = self.one("SELECT attempts FROM oauth_consents WHERE id = ?", consent)
        return row["attempts"] if row else 0

    def drop_consent(self, consent: str) -> None:
        self.run("DELETE FROM oauth_consents WHERE id = ?", consent)

    # ---------------------------------------------------------------- codes

    def add_code(self, client_id: str, params: dict) -> str:
        code = new_secret("pmcp_code_")
        self.run("INSERT INTO oauth_codes VALUES (?, ?, ?, ?, ?, 0)", digest(code), client_id, new_secret(),
                 json.dumps(params), int(time.time()) + CODE_SECONDS)
        return code

    def take_code(self, client_id: str, code: str) -> tuple[str, dict, int] | None:
        """A code's grant, parameters and expiry, used up now. A code used before revokes every token issued from
        it (RFC 6749 4.1.2) and is refused; so is an expired one, or one of another client."""
        row = self.one("SELECT * FROM oauth_codes WHERE code_sha256 = ? AND client_id = ?", digest(code), client_id)
        if row is None:
            return None
        if self.run("UPDATE oauth_codes SET used = 1 WHERE code_sha256 = ? AND used = 0", row["code_sha256"]) != 1:
            self.revoke_grant(row["grant_id"])
            return None
        return (row["grant_id"], json.loads(row["params"]), row["expires"]) if row["expires"] >= time.time() else None

    # ---------------------------------------------------------------- tokens

    def add_tokens(self, client_id: str, grant_id: str, profile: str, resource: str | None) -> tuple[str, str]:
        """A new access token and refresh token of a grant."""
        now = int(time.time())
        self.run("DELETE FROM oauth_tokens WHERE expires < ?", now - REFRESH_SECONDS)
        self.run("DELETE FROM oauth_codes WHERE expires < ?", now - REFRESH_SECONDS)
        access, refresh = new_secret("pmcp_at_"), new_secret("pmcp_rt_")
        for kind, token, lasts in (("access", access, ACCESS_SECONDS), ("refresh", refresh, REFRESH_SECONDS)):
            self.run("INSERT INTO oauth_tokens VALUES (?, ?, ?, ?, ?, ?, ?, 0, 0)", digest(token), kind, client_id,
                     grant_id, profile, resource, now + lasts)
        return access, refresh

    def token(self, kind: str, token_sha256: str) -> sqlite3.Row | None:
        """A token by its hash, whatever its state (live() says whether it still works)."""
        return self.one("SELECT * FROM oauth_tokens WHERE token_sha256 = ? AND kind = ?", token_sha256, kind)

    def use_refresh(self, token_sha256: str) -> bool:
        """Use a refresh token up (rotation); False when it was used before: then its whole grant is revoked."""
        if self.run("UPDATE oauth_tokens SET used = 1 WHERE token_sha256 = ? AND kind = 'refresh' AND used = 0 "
                    "AND revoked = 0", token_sha256) == 1:
            return True
        row = self.one("SELECT grant_id FROM oauth_tokens WHERE token_sha256 = ?", token_sha256)
        if row is not None:
            self.revoke_grant(row["grant_id"])
        return False

    def revoke_grant(self, grant_id: str) -> None:
        self.run("UPDATE oauth_tokens SET revoked = 1 WHERE grant_id = ?", grant_id)

    def grant_of(self, token_sha256: str) -> str | None:
        row = self.one("SELECT grant_id FROM oauth_tokens WHERE token_sha256 = ?", token_sha256)
        return row["grant_id"] if row else None


def live(row: sqlite3.Row | None) -> bool:
    """Whether a token row still works: not revoked, not expired, not used up (a rotated refresh token)."""
    return row is not None and not row["revoked"] and not row["used"] and row["expires"] >= time.time()
