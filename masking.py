"""Secrets never shown: masked in answers, errors, logs and the audit log.

Three kinds: the secrets the configuration holds (registered at start and replaced wherever they
appear); secrets by shape in any text (token headers, private keys, tickets, passwords in URLs);
and the properties an API answer carries that are secrets (catalog.py derives them from every
method's return schema at build time and adds what untyped answers hold: `secrets`). File
contents, agent stdin and header blobs are never logged: the audit sees their size and SHA-256.
"""
from __future__ import annotations

import fnmatch
import hashlib
import json
import re
from functools import lru_cache
from typing import Any

import catalog

MASK = "***"
# Parameter names whose values are secrets: these words, and the catalog's rule for answers.
SECRET_KEYS = re.compile(r"pass(word)?|cipassword|secret|token|encryption-key|keyring|hmac|private|ticket"
                         r"|csrf|key-?data|sshkey-?priv|header", re.IGNORECASE)
NOT_SECRET_PARAMS = ("sshkeys",)  # public keys
CONTENT_PARAMS = ("content", "contents", "stdin")  # file contents: size and hash only
# Blobs the audit records as size and hash, never as text, secret or not: agent stdin and HTTP
# headers (an OpenTelemetry server's `otel-headers`, a webhook's `header`: bearer tokens).
BLOB_PARAMS = re.compile(r"input-data|.*headers?", re.IGNORECASE)
LONG_VALUE = 256  # characters: a longer parameter value is logged as size and hash
_SECRET_PATTERNS = [
    re.compile(r"(PVEAPIToken=[^=\s]+=)[^\s\"',]+"),
    re.compile(r"(PBSAPIToken=[^:\s]+:)[^\s\"',]+"),
    re.compile(r"(-----BEGIN [A-Z ]*PRIVATE KEY-----)[\s\S]*?(-----END [A-Z ]*PRIVATE KEY-----)"),
    re.compile(r"((?:PVE|PBS)AuthCookie=)[^\s;\"',]+"),
    re.compile(r"((?:\"|')?(?:password|cipassword|secret|ticket|CSRFPreventionToken|token-secret|client-key)"
               r"(?:\"|')?\s*[:=]\s*(?:\"|')?)[^\"'\s,}&]+", re.IGNORECASE),
    re.compile(r"(://)[^/\s\"'<>]*(@)"),  # user and password in a URL, even with an @ in the user name
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


@lru_cache(maxsize=None)
def _answer_secret_names() -> frozenset[str]:
    return frozenset({name for product in catalog.PRODUCTS for entry in catalog.methods(product)
            for name in entry.get("secrets", ())})


def secret_param(name: str) -> bool:
    """Whether a parameter's value is a secret: by the words above, the catalog's name rule, or
    because some answer carries a property of that name as a secret (ACME plugin `data`)."""
    if name in NOT_SECRET_PARAMS:
        return False
    return bool(SECRET_KEYS.search(name) or catalog.SECRET_NAME.search(name)) or name in _answer_secret_names()


def mask_params(params: dict[str, Any]) -> dict[str, Any]:
    """Parameters as they may be shown (a dry run): secret values replaced."""
    return {k: MASK if secret_param(k) else v for k, v in params.items()}


def fingerprint(value: Any) -> dict[str, Any]:
    """Size and SHA-256 of contents, instead of the contents."""
    data = value if isinstance(value, bytes) else str(value).encode()
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def audit_view(params: dict[str, Any]) -> dict[str, Any]:
    """Parameters as the audit log records them: secrets masked, contents and long values as size
    and hash, and whatever still looks like a secret masked by shape."""
    view: dict[str, Any] = {}
    for name, value in params.items():
        if BLOB_PARAMS.fullmatch(name):
            view[name] = fingerprint(value if not isinstance(value, list) else json.dumps(value))
        elif secret_param(name):
            view[name] = MASK
        elif name in CONTENT_PARAMS or isinstance(value, bytes) or len(str(value)) > LONG_VALUE:
            view[name] = fingerprint(value)
        else:
            view[name] = value
    return json.loads(mask(json.dumps(view, default=str)))


def mask_answer(data: Any, names: tuple[str, ...] | list[str]) -> Any:
    """An API answer with the secret properties its schema names (or catalog.UNTYPED_SECRETS, where
    `*` matches any characters) replaced, at any depth."""
    if not names:
        return data
    if isinstance(data, list):
        return [mask_answer(item, names) for item in data]
    if isinstance(data, dict):
        return {k: (MASK if v not in (None, "") and _named(k, names) else mask_answer(v, names))
                for k, v in data.items()}
    return data


def _named(key: str, names: tuple[str, ...] | list[str]) -> bool:
    return key in names or any("*" in name and fnmatch.fnmatchcase(key, name) for name in names)
