"""The values the configuration is read into (config.py reads them from the environment), kept
apart from the modules that use them so that config.py needs neither the client nor the policy:
a host's address and credentials (HostConfig, for proxmox_client), a host's gates (HostPolicy) and
this server's settings (Settings, for policy), where receipts are kept (Keeping, for receipts).
It imports only protection.py (the protected guest list a Settings holds).

To add a setting: its field here (or in config.Config for what the MCP edge alone reads), its
variable read in config.py, and both .env.example and docs/CONFIGURATION.md (README: How to add a
setting; tests/test_config.py checks the last two).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from protection import Protected

if TYPE_CHECKING:  # the type only: receipt_store opens the database, which a value needs not
    from receipt_store import Store


@dataclass
class HostConfig:
    """One configured host: where it is and how it is logged in to (PROXMOX_<LABEL>_*, PBS_<LABEL>_*)."""
    label: str
    product: str  # "pve" or "pbs"
    url: str  # scheme://host:port, no path
    token_id: str  # user@realm!tokenid (with a password login: the user)
    token_secret: str = field(repr=False)
    user: str | None = None  # password login (a ticket) instead of a token
    password: str | None = field(default=None, repr=False)
    write_token_id: str | None = None
    write_token_secret: str | None = field(default=None, repr=False)
    token_variable: str = ""  # where each token came from (..._TOKEN or ..._TOKEN_FILE), for errors that name it
    write_token_variable: str = ""
    verify_tls: bool = True
    ca_file: str | None = None
    fingerprint: str | None = None  # SHA-256, hex without colons, lower case
    connect_timeout: float = 5.0
    read_timeout: float = 30.0


@dataclass
class HostPolicy:
    """The gates open on one host: its access tier, the side gates allowed, the methods unblocked."""
    access: str = "read"
    allow: frozenset[str] = frozenset()  # of "sensitive", "exec", "elevated"
    unblocked: frozenset[tuple[str, str]] = frozenset()  # (METHOD, template)


@dataclass
class Keeping:
    """Where receipts live and for how long, and when a safety snapshot is taken (config.py)."""
    store: Store | None = None  # in the state database beside the audit log; None: no receipts (no audit log)
    keep: int = 1000  # PROXMOX_RECEIPTS_KEEP
    days: int = 30  # PROXMOX_RECEIPTS_DAYS
    safety: str = "rollback"  # PROXMOX_SAFETY_SNAPSHOT: off, rollback, or all (rollback and risky config)
    safety_keep: int = 3  # PROXMOX_SAFETY_KEEP: a guest's safety snapshots kept, the newest
    safety_days: int = 14  # PROXMOX_SAFETY_DAYS: and none older


@dataclass
class Settings:
    """This server's settings as the policy reads them (policy.settings())."""
    hosts: dict[tuple[str, str], HostPolicy] = field(default_factory=dict)  # (product, label)
    protected: Protected = field(default_factory=Protected)
    dry_run: bool = False
    elicit: bool = True
    audit_path: Path | None = None
    receipts: Keeping = field(default_factory=Keeping)  # beside the audit log
    exec_allowed_vmids: set[int] | None = None  # PROXMOX_EXEC_ALLOWED_VMIDS; None: any guest
    source_address: str | None = None  # PROXMOX_SOURCE_ADDRESS: as the nodes see this server (firewall_guard)
    backup_servers: tuple[str, ...] = ()  # the configured Backup Servers' URLs: their port 8007 (firewall_guard)
