"""The one gate every Proxmox request passes: `check()` is called by the HTTP client
before anything is sent. It also owns secret masking for results, errors and logs.
"""
from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import catalog

TIERS = ("read", "lifecycle", "write", "destructive")


class PolicyError(Exception):
    """A request refused before sending; the message says why and what would allow it."""


@dataclass
class Settings:
    access: dict[str, str] = field(default_factory=dict)  # host label -> tier
    default_access: str = "read"


SETTINGS = Settings()


def configure(settings: Settings) -> None:
    global SETTINGS
    SETTINGS = settings


def normalise_path(path: str) -> str:
    """Decode, collapse `//` and resolve `..` so that a path cannot hide from the catalog."""
    decoded = path
    for _ in range(3):  # double-encoded slashes
        decoded = unquote(decoded)
    decoded = decoded.split("?", 1)[0]
    if "\x00" in decoded or "\\" in decoded:
        raise PolicyError(f"Path {path!r} contains characters no Proxmox path has.")
    return posixpath.normpath("/" + decoded.strip("/")) if decoded.strip("/") else "/"


def gate_of(method: str) -> str:
    return "read" if method == "GET" else "write"


def access_for(label: str) -> str:
    return SETTINGS.access.get(label, SETTINGS.default_access)


def check(host: Any, method: str, path: str, params: dict[str, Any]) -> str:
    """Refuse a request the operator did not allow; return the normalised path to send."""
    clean = normalise_path(path)
    found = catalog.find_path(host.product, clean)
    if found is None:
        raise PolicyError(f"Unknown API path {clean} for {host.product.upper()}: refused. "
                          f"Use api_search to find the right path.")
    if method not in found[1]:
        allowed = ", ".join(sorted(found[1]))
        raise PolicyError(f"{method} is not a method of {found[0]} (it has {allowed}).")
    gate = gate_of(method)
    tier = access_for(host.label)
    if gate != "read" and TIERS.index(tier) < TIERS.index("write"):
        raise PolicyError(f"{method} {clean} on host '{host.label}' needs write access, but access is "
                          f"'{tier}'. The operator can raise it with PROXMOX_ACCESS.")
    return clean


# ---------------------------------------------------------------- secrets

MASK = "***"
_SECRET_PATTERNS = [
    re.compile(r"(PVEAPIToken=[^=\s]+=)[^\s\"',]+"),
    re.compile(r"(PBSAPIToken=[^:\s]+:)[^\s\"',]+"),
    re.compile(r"(-----BEGIN [A-Z ]*PRIVATE KEY-----)[\s\S]*?(-----END [A-Z ]*PRIVATE KEY-----)"),
    re.compile(r"((?:PVE|PBS)AuthCookie=)[^\s;\"',]+"),
    re.compile(r"((?:\"|')?(?:password|cipassword|secret|ticket|CSRFPreventionToken|token-secret)"
               r"(?:\"|')?\s*[:=]\s*(?:\"|')?)[^\"'\s,}&]+", re.IGNORECASE),
    re.compile(r"(://[^:/\s@\"',]+:)[^@\s/\"',]+(@)"),
]
_known_secrets: set[str] = set()


def register_secret(secret: str | None) -> None:
    """Remember a configured secret so that it is masked wherever it would appear."""
    if secret and len(secret) >= 6:
        _known_secrets.add(secret)


def mask(text: str) -> str:
    """Mask token secrets, passwords, keys, tickets and secrets in URLs."""
    for secret in _known_secrets:
        text = text.replace(secret, MASK)
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + MASK + (m.group(2) if m.lastindex == 2 else ""), text)
    return text
