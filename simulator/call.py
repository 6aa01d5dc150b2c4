"""What every handler receives (`Call`) and raises (`ApiError`), the privilege tree
that GET /access/permissions answers in both products, and the Proxmox VE node and guest
a path names (`_node`, `_guest`: used by `pve.py`, `pve_guests.py` and `api.py`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .lab import Lab, Token


@dataclass
class Download:
    """A handler's answer that is a file, not JSON: Proxmox streams these as
    application/octet-stream (pve-storage FileRestore.pm `download`, proxmox-backup
    `pxar_file_download`; docs/PROXMOX-BEHAVIOUR.md#backup-file-restore)."""
    data: bytes


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


# ---- Proxmox VE: the node and the guest a path names

def _node(call: Call, name: str) -> dict:
    """Resolve a node as pveproxy does: a down node gives 595; a wrong-case name resolves through
    DNS to a member and is refused as a proxy loop; an unknown one fails its hostname lookup
    (docs/PROXMOX-BEHAVIOUR.md#node-names-and-forwarding)."""
    lab = call.lab
    if name in lab.nodes:
        if name in lab.down_nodes:
            raise ApiError(595, "Connection refused")
        return lab.nodes[name]
    if name.lower() in {n.lower() for n in lab.nodes}:
        raise ApiError(500, "proxy loop detected")
    raise ApiError(500, f"hostname lookup '{name}' failed - failed to get address info for: {name}: "
                        f"Name or service not known")


def _guest(call: Call, node: str, vmid: str, kind: str) -> dict:
    _node(call, node)
    guest = call.lab.guests.get(int(vmid))
    if not guest or guest["node"] != node or guest["type"] != kind:
        folder = "qemu-server" if kind == "qemu" else "lxc"
        raise ApiError(500, f"Configuration file 'nodes/{node}/{folder}/{vmid}.conf' does not exist")
    return guest
