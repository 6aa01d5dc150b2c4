"""What `--check` reports of one host: its version and certificate, the privileges its token holds
(and the write token's), the guests it has (for the protected list) and the gates open for it."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import policy
import privileges
import proxmox_client
from errors import ToolFailure
from gates import GATES
from masking import mask
from settings import HostConfig


def check_host(config: Any, host: HostConfig, guests: dict[str, dict[int, dict]]) -> bool:
    """--check of one host: version, certificate, the token's privileges and the write token's; a PVE
    host's guests into `guests` (for the protected list). True when something failed."""
    client = proxmox_client.client_for(host.product, host.label)
    rules = config.settings.hosts[(host.product, host.label)]
    print(f"{host.product.upper()} host '{host.label}' at {host.url} ({proxmox_client.auth_method(host)}"
          f"{' ' + host.token_id if host.token_secret else ''})")
    failed = False
    try:
        print(f"  version: {(client.get('/version') or {}).get('version')}")
        certificate = proxmox_client.certificate_line(host)
        if certificate:
            print(f"  {certificate}")
        print(f"  {privileges_line(privileges.permissions_of(host) or {})}")
        if host.product == "pve":
            guests[host.label] = {int(row["vmid"]): row for row in client.get("/cluster/resources", type="vm") or []}
    except ToolFailure as exc:
        failed = True
        print(f"  FAILED: {mask(str(exc))}")
    if host.write_token_id:
        failed = check_write_token(host) or failed
    print(f"  access tier: {rules.access}; gates open: "
          f"{', '.join(g for g in GATES if policy.gate_open(rules, g, 'POST'))}")
    return failed


def privileges_line(permissions: dict) -> str:
    held = sorted({p for privs in permissions.values() for p in privs})
    warning = "" if held else "; warning: the token holds no privileges: lists will be empty, writes refused " \
                              "(a privsep token without ACLs?)"
    return f"privileges on {len(permissions)} paths: {', '.join(held) or 'NONE'}{warning}"


def check_write_token(host: HostConfig) -> bool:
    """The write token (_WRITE_TOKEN or _WRITE_TOKEN_FILE) reads its own privileges, as the reader's are
    read: a wrong one fails here, not at the first write. True when it failed."""
    writer = replace(host, token_id=host.write_token_id, token_secret=host.write_token_secret, write_token_id=None,
                     write_token_secret=None, token_variable=host.write_token_variable, user=None, password=None)
    try:
        permissions = proxmox_client.ProxmoxClient(writer).get("/access/permissions") or {}
    except ToolFailure as exc:
        print(f"  write token {host.write_token_id}: FAILED: {mask(str(exc))}")
        return True
    print(f"  write token {host.write_token_id}: {privileges_line(permissions)}")
    return False
