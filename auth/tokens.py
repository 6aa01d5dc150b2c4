"""Named bearer tokens: one per person or program, in the JSON list MCP_AUTH_TOKENS_FILE names:

    [{"name": "alice", "sha256": "<hex of the token>", "profile": "operate", "hosts": ["home"]}]

Each works within its profile (policy.PROFILES: read, operate, admin) and, when `hosts` is given, on
those host labels only; a token that is not listed gets 401. Only the SHA-256 of a token is kept,
and a presented token is compared with every entry in constant time. `python server.py --new-token
alice --profile operate` makes a token, shows it once and prints the line to add.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from dataclasses import dataclass

import policy

PROFILES = tuple(policy.PROFILES)  # read, operate, admin
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # no ':' so that it never reads as oauth:... or idp:...
HEX = re.compile(r"[0-9a-f]{64}")
RESERVED = ("operator",)  # the MCP_AUTH_TOKEN holder, when other principals exist


@dataclass(frozen=True)
class NamedToken:
    name: str
    sha256: str
    profile: str
    hosts: frozenset[str] | None = None  # None: every host


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def find(tokens: list[NamedToken], presented: str) -> NamedToken | None:
    """The entry whose hash is the presented token's; every entry is compared, in constant time."""
    wanted, found = digest(presented).encode(), None
    for entry in tokens:
        if hmac.compare_digest(entry.sha256.encode(), wanted):
            found = entry
    return found


def parse_tokens(text: str) -> list[NamedToken]:
    """The entries of a tokens file; ValueError names the first bad one."""
    try:
        entries = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"is not JSON ({exc})") from None
    if not isinstance(entries, list):
        raise ValueError('is not a JSON list of {"name", "sha256", "profile", "hosts"} objects')
    tokens = [parse_entry(number, entry) for number, entry in enumerate(entries, 1)]
    for field_name in ("name", "sha256"):
        values = [getattr(t, field_name) for t in tokens]
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:
            raise ValueError(f"gives the {field_name} {twice[0][:12]!r} twice; each token needs its own")
    return tokens


def parse_entry(number: int, entry: object) -> NamedToken:
    if not isinstance(entry, dict) or not {"name", "sha256", "profile"} <= set(entry) \
            or set(entry) - {"name", "sha256", "profile", "hosts"}:
        raise ValueError(f'entry {number} is not {{"name", "sha256", "profile"}} with an optional "hosts"')
    name, sha256, profile, hosts = entry["name"], entry["sha256"], entry["profile"], entry.get("hosts")
    if not isinstance(name, str) or not NAME.fullmatch(name) or name in RESERVED:
        raise ValueError(f"entry {number}: name {str(name)[:40]!r} must be letters, digits, '.', '_' or '-' "
                         f"(up to 64), and not {', '.join(RESERVED)}")
    if not isinstance(sha256, str) or not HEX.fullmatch(sha256.lower()):
        raise ValueError(f"entry {number} ({name}): sha256 must be the 64 hex digits of the token's SHA-256 "
                         f"(`python server.py --new-token {name}` prints the line)")
    if profile not in PROFILES:
        raise ValueError(f"entry {number} ({name}): profile {str(profile)[:20]!r} is not one of {', '.join(PROFILES)}")
    if hosts is not None and (not isinstance(hosts, list) or not all(isinstance(h, str) and h for h in hosts)):
        raise ValueError(f"entry {number} ({name}): hosts must be a list of host labels, e.g. [\"home\"]")
    return NamedToken(name, sha256.lower(), profile, frozenset(hosts) if hosts is not None else None)


def new_token(name: str, profile: str, hosts: list[str] | None) -> tuple[str, str]:
    """A new token and the line to add for it (its hash, never the token)."""
    if not NAME.fullmatch(name) or name in RESERVED:
        raise ValueError(f"the name {name[:40]!r} must be letters, digits, '.', '_' or '-' (up to 64), "
                         f"and not {', '.join(RESERVED)}")
    if profile not in PROFILES:
        raise ValueError(f"the profile {profile!r} is not one of {', '.join(PROFILES)}")
    token = "pmcp_" + secrets.token_urlsafe(32)
    line: dict = {"name": name, "sha256": digest(token), "profile": profile}
    if hosts:
        line["hosts"] = hosts
    return token, json.dumps(line)


def new_token_text(name: str, profile: str, hosts: list[str] | None, tokens_file: str | None) -> str:
    """What `--new-token` prints: the token, once, and the line for the tokens file."""
    token, line = new_token(name, profile, hosts)
    where = tokens_file or "the file MCP_AUTH_TOKENS_FILE names (a JSON list)"
    return (f"token for {name} (shown this once, never stored; give it to {name}, who sends it as "
            f"'Authorization: Bearer <token>'):\n{token}\n\nadd this entry to {where}, then restart the server:\n"
            f"{line}\n")
