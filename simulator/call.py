"""What every handler receives (`Call`) and raises (`ApiError`), and the privilege tree
that GET /access/permissions answers in both products."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .lab import Lab, Token


class ApiError(Exception):
    def __init__(self, status: int, message: str, errors: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.errors = status, message, errors


@dataclass
class Call:
    product: str
    method: str
    path: str
    params: dict[str, Any]
    token_id: str
    token: Token
    lab: Lab

    def held(self, acl_path: str) -> dict[str, bool]:
        """The caller's privileges on a path, each with its propagate flag."""
        pool = self.lab.pool_path(acl_path) if self.product == "pve" else None
        return self.token.privileges(acl_path, self.lab.roles(self.product), pool)

    def can(self, acl_path: str, privilege: str) -> bool:
        return privilege in self.held(acl_path)

    def arg(self, name: str, default: Any = None) -> Any:
        value = self.params.get(name, default)
        return value[0] if isinstance(value, list) and len(value) == 1 else value


# Paths listed even without an ACL on them (docs/PROXMOX-BEHAVIOUR.md#permissions-paths): pve-access-control
# src/PVE/RPCEnvironment.pm (get_effective_permissions), proxmox-backup src/api2/access/mod.rs (list_permissions).
DEFAULT_PATHS = {"pve": ("/", "/access", "/access/groups", "/nodes", "/pool", "/sdn", "/storage", "/vms"),
                 "pbs": ("/", "/access", "/datastore", "/remote", "/system")}


def _acl_paths(call: Call) -> set[str]:
    """Every path some ACL names (any user's or token's), and for PVE every pool member."""
    lab = call.lab
    tokens = lab.pve_tokens if call.product == "pve" else lab.pbs_tokens
    paths = {path for token in tokens.values() for path in token.acl_paths()}
    paths |= {path for _, token, _ in lab.logins[call.product].values() for path in token.acl_paths()}
    if call.product == "pve":
        paths |= {entry["path"] for entry in lab.acl}
        paths |= {f"/vms/{vmid}" for vmid, guest in lab.guests.items() if guest.get("pool")}
    return paths


def _permissions(call: Call, render: Callable[[bool], Any]) -> dict:
    """GET /access/permissions: the default paths, every ACL path and (PVE) every pool member,
    each with the caller's privileges and their propagate flag; paths without any are left out."""
    answer = {}
    for path in sorted(set(DEFAULT_PATHS[call.product]) | _acl_paths(call)):
        held = call.held(path)
        if held:
            answer[path] = {privilege: render(flag) for privilege, flag in sorted(held.items())}
    return answer
