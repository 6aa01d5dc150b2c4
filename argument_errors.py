"""Arguments that fail the SDK's validation, answered in one line the model can act on: each argument,
the rule it breaks in words, and a valid example (from its pattern, choices, bounds, description or
name). visibility.py puts it in place of the library's multi-line dump.
"""
from __future__ import annotations

import json
from typing import Any

from masking import mask

# What each argument pattern of the tools means, in words, with an example (a test walks every
# tool and fails when a pattern is missing here).
PATTERNS = {
    r"^[A-Za-z][A-Za-z0-9_\-]{1,39}$": ("2 to 40 letters, digits, _ or -, starting with a letter", "before_upgrade"),
    r"^[A-Za-z0-9][A-Za-z0-9.\-]{0,62}$": ("a DNS name: letters, digits, . and -, at most 63", "web01"),
    r"^[A-Za-z0-9_][A-Za-z0-9._\-]*$": ("letters, digits, ., _ and -", "100"),
    r"^[A-Za-z0-9][A-Za-z0-9._\-]*$": ("a file name: letters, digits, ., _ and -", "debian-12.iso"),
    r"^https?://\S+$": ("an http or https URL", "https://example.org/debian-12.iso"),
    r"^\+?\d+G$": ("a size in G, or +G to grow by", "+10G"),
    r"^net\d+$": ("net and a number", "net0"),
    r"^rc-[0-9a-f]{8}$": ("a receipt id: rc- and 8 hex digits (list_changes)", "rc-1a2b3c4d"),
    r"^/[^\x00]*$": ("an absolute path", "/etc/hostname"),
    r"^[A-Za-z0-9][A-Za-z0-9@._:-]{0,127}$": ("a service name: letters, digits, @ . _ : -, never starting with -",
                                             "nginx"),
    r"^[a-z_][a-z0-9_-]{0,31}$": ("a user name: lower-case letters, digits, _ and -, starting with a letter or _",
                                  "alice"),
    r"^t[0-9a-f]{6}$": ("a terminal id: t and 6 hex digits (terminal_read lists them)", "t1a2b3c"),
    r"^[A-Za-z0-9_][A-Za-z0-9._/-]{0,254}$": ("a name below PROXMOX_TRANSFER_DIR: letters, digits, . _ - and /",
                                             "pve1/interfaces"),
}
# Examples for arguments whose schema gives no rule (pattern, choices, bounds, default) to derive one from.
NAMED_EXAMPLES = {
    "host": "home", "pbs_host": "home", "node": "pve1", "target": "pve2", "where": "pve1", "storage": "local-lvm",
    "target_storage": "local-zfs",
    "disk": "scsi0", "bridge": "vmbr0", "command": "uptime", "method": "GET", "store": "backup",
    "ns": "prod", "backup_id": "100", "backup_time": 1735693200, "job_id": "verify-backup", "query": "snapshot",
    "upid": "UPID:pve1:...",
    "name": "web", "status": "running", "tag": "prod", "snapshot": "before_upgrade", "digest": "9f3c...",
    "description": "before the upgrade", "notes": "before the upgrade", "content": "text", "stdin": "text",
    "ciuser": "debian", "ssh_keys": "ssh-ed25519 AAAA... me@laptop", "gateway": "192.0.2.1", "ip": {"net0": "dhcp"},
    "checksum": "9e107d9d372bb6826bd81d3542a419d6", "delete": ["net1"], "params": {"full": 1},
    "thresholds": {"storage_warn_pct": 85}, "set": {"memory": 4096}, "path": "/root.pxar.didx/etc/hostname",
    "search": "debian", "template": "debian-13-standard_13.1-2_amd64.tar.zst", "features": "keyctl=1",
    "reference": "docker.io/library/nginx:latest", "user": "debian", "password": "a long passphrase",
    "dns": "192.0.2.1 example.org", "cloudinit": {"user": "debian", "ip": {"net0": "dhcp"}},
    "backup": "pbs:backup/ct/102/2026-01-01T02:00:00Z",
    "since": "2h", "until": "1h", "grep": "error", "service": "pvedaemon", "cursor": "syslog|812||||",
    "smart": "/dev/sda",
    "rule": {"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "22", "source": "192.0.2.0/24"},
    "group": "webservers", "vmids": [100, 101], "all_except": [104], "schedule": "02:00", "pool": "prod",
    "keep": "keep-daily=7,keep-weekly=4",
    "keys": "ls -l", "press": ["Enter"], "names": ["nginx"], "key": "ssh-ed25519 AAAA... me@laptop",
    "settings": {"PermitRootLogin": "prohibit-password"}, "checks": ["curl -fsS localhost:8080"],
    "backup_storage": "local", "terminal": "t1a2b3c",
}
# Where one tool's argument takes other values than the name's example: a fresh install's storage for backups,
# ISOs and templates is `local`, never `local-lvm` (guest disks only) (docs/PROXMOX-BEHAVIOUR.md#per-node-storages).
TOOL_EXAMPLES = {("write_backup_guest", "storage"): "local", ("list_backups", "storage"): "local",
                 ("write_download_url", "storage"): "local"}
VOLID_EXAMPLE = "local:iso/debian-12.iso"  # for every argument described as a volid
RULES_IN_WORDS = {  # pydantic error type -> the rule, in words (ctx holds the bound)
    "missing": "is required", "string_too_short": "needs at least {min_length} characters",
    "string_too_long": "takes at most {max_length} characters", "greater_than_equal": "must be at least {ge}",
    "less_than_equal": "must be at most {le}", "greater_than": "must be more than {gt}",
    "less_than": "must be less than {lt}", "int_parsing": "must be a whole number",
    "int_type": "must be a whole number",
    "int_from_float": "must be a whole number", "bool_parsing": "must be true or false",
    "bool_type": "must be true or false", "literal_error": "must be one of {expected}", "string_type": "must be text",
    "dict_type": "must be an object", "list_type": "must be a list", "float_parsing": "must be a number",
}


def argument_error(tool: str, error: Any, schema: dict) -> str:
    """A pydantic ValidationError as one readable line: each argument, the rule it breaks and an
    example (instead of the library's multi-line dump)."""
    problems = []
    errors = sorted(error.errors(include_url=False), key=lambda e: e["type"] == "missing")  # given values first
    for item in errors[:5]:
        name = str(item["loc"][0]) if item["loc"] else "arguments"
        prop = schema.get("properties", {}).get(name, {})
        pattern = next((v["pattern"] for v in prop.get("anyOf") or [prop] if "pattern" in v), None)
        rule = RULES_IN_WORDS[item["type"]].format(**item.get("ctx", {})) if item["type"] in RULES_IN_WORDS \
            else item["msg"][:1].lower() + item["msg"][1:]
        if item["type"] == "string_pattern_mismatch":
            rule = f"must be {PATTERNS.get(pattern, (f'text matching {pattern}',))[0]}"
        example = TOOL_EXAMPLES.get((tool, name)) or example_for(name, prop, pattern)
        given = "" if item["type"] == "missing" else f" (got {json.dumps(item.get('input'), default=str)[:40]})"
        problems.append(f"argument '{name}' {rule}{given}" + (f", e.g. {json.dumps(example)}" if example is not None
                                                              else ""))
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return mask(f"{tool}: {'; '.join(problems)}{more}. Nothing was sent.")


def example_for(name: str, prop: dict, pattern: str | None) -> Any:
    """A valid value for an argument: from its pattern, its choices, its bounds, its description or
    its name; None when nothing says."""
    if pattern:
        return PATTERNS.get(pattern, (None, None))[1]
    variants = [v for v in prop.get("anyOf") or [prop] if v.get("type") != "null"]
    for variant in variants:
        if "enum" in variant:
            return variant["enum"][0]
        if variant.get("type") == "integer":
            return NAMED_EXAMPLES.get(name, variant.get("minimum", variant.get("maximum", 1)))
        if variant.get("type") == "boolean":
            return True
    if prop.get("default") not in (None, "", False):
        return prop["default"]
    described = prop.get("description", "")
    if "e.g. " in described:
        return described.split("e.g. ", 1)[1].split(",")[0].split(" ")[0].rstrip(".")
    if described == "volid" or name == "volid":
        return VOLID_EXAMPLE
    return NAMED_EXAMPLES.get(name)
