"""The privileges each token holds, as the policy reads them: GET /access/permissions and /version,
kept per host (runtime slots), asked by path as Proxmox evaluates them, and the commands that grant a
missing one. policy.py decides with them; the tool list (visibility.py) hides what no token can use.
"""
from __future__ import annotations

import re
from typing import Any

import runtime
from errors import PolicyError

# The least built-in role that holds each privilege, for the "grant it with" hint on a 403
# (docs/PROXMOX-BEHAVIOUR.md#built-in-roles).
ROLE_FOR_PRIVILEGE = {
    "Sys.Audit": "PVEAuditor", "VM.Audit": "PVEAuditor", "Datastore.Audit": "PVEAuditor",
    "Pool.Audit": "PVEAuditor", "SDN.Audit": "PVEAuditor", "Mapping.Audit": "PVEAuditor",
    "VM.PowerMgmt": "PVEVMUser", "VM.Console": "PVEVMUser", "VM.Backup": "PVEVMUser",
    "VM.Snapshot": "PVEVMAdmin", "VM.Snapshot.Rollback": "PVEVMAdmin", "VM.Clone": "PVEVMAdmin",
    "VM.Allocate": "PVEVMAdmin", "VM.Migrate": "PVEVMAdmin", "VM.Config.Disk": "PVEVMAdmin",
    "VM.Config.CPU": "PVEVMAdmin", "VM.Config.Memory": "PVEVMAdmin", "VM.Config.Network": "PVEVMAdmin",
    "VM.Config.Options": "PVEVMAdmin", "VM.Config.HWType": "PVEVMAdmin", "VM.Config.Cloudinit": "PVEVMUser",
    "VM.Config.CDROM": "PVEVMUser", "VM.GuestAgent.Audit": "PVEAuditor", "VM.Replicate": "PVEVMAdmin",
    "VM.GuestAgent.Unrestricted": "PVEVMAdmin", "VM.GuestAgent.FileRead": "PVEVMUser",
    "VM.GuestAgent.FileWrite": "PVEVMUser", "VM.GuestAgent.FileSystemMgmt": "PVEVMUser",
    "VM.Monitor": "PVEVMAdmin",  # PVE 8
    "Datastore.AllocateSpace": "PVEDatastoreUser", "Datastore.Allocate": "PVEDatastoreAdmin",
    "Datastore.AllocateTemplate": "PVEDatastoreAdmin", "Sys.Modify": "Administrator",
    "Sys.PowerMgmt": "Administrator", "Sys.Console": "PVESysAdmin", "SDN.Use": "PVESDNUser",
    "Sys.AccessNetwork": "Administrator",
}


# (product, label, token id) -> {path: {privilege: propagate flag}}, from GET /access/permissions
_permissions = runtime.slot("privileges.permissions", dict[tuple[str, str, str], dict[str, dict[str, Any]]])
# (product, label) -> (major, minor), from GET /version when the privileges are read: the agent
# privileges depend on the major version, methods newer than a major release on the minor
_releases = runtime.slot("privileges.releases", dict[tuple[str, str], tuple[int, int]])


def set_version(host: Any, version: str) -> None:
    match = re.match(r"(\d+)\.(\d+)", str(version))
    if match:
        _releases.get()[(host.product, host.label)] = (int(match.group(1)), int(match.group(2)))


def release_of(host: Any) -> tuple[int, int] | None:
    """The host's (major, minor) version as read with its privileges; None when not read."""
    return _releases.get().get((host.product, host.label))


def version_at_least(host: Any, release: tuple[int, int]) -> bool | None:
    """Whether the host runs `release` (major, minor) or later; None when its version is not known."""
    known = release_of(host)
    return None if known is None else known >= release


def version_privileges(host: Any, privileges: list[str] | tuple[str, ...]) -> list[str]:
    """The privileges a check names, as the host's version has them: PVE 8 checks VM.Monitor for
    every guest agent call, and VM.GuestAgent.* exists from PVE 9 on
    (docs/PROXMOX-BEHAVIOUR.md#agent-privileges-by-version). An unknown version counts as current."""
    if host.product == "pve" and (release_of(host) or (9,))[0] < 9 \
            and any(p.startswith("VM.GuestAgent.") for p in privileges):
        return ["VM.Monitor"]
    return list(privileges)


def permissions_of(host: Any) -> dict[str, dict[str, Any]] | None:
    return _permissions.get().get((host.product, host.label, host.token_id))


def set_permissions(host: Any, permissions: dict[str, dict[str, Any]]) -> None:
    _permissions.get()[(host.product, host.label, host.token_id)] = permissions


def forget_permissions(host: Any) -> None:
    """Read the token's privileges again at its next request."""
    _permissions.get().pop((host.product, host.label, host.token_id), None)


def permissions_read() -> int:
    """How many tokens' privileges were read (the tool list changes when this does)."""
    return len(_permissions.get())


def holds(host: Any, privilege: str, acl_path: str) -> bool | None:
    """Whether the token holds a privilege on a path; None when it cannot be told (not loaded).
    The answer lists the token's effective privileges on every ACL path, every pool member and
    the default paths (`/pool` among them), so the nearest listed path decides: on the path
    itself any flag counts, from a parent only a propagating one
    (docs/PROXMOX-BEHAVIOUR.md#permissions-paths)."""
    permissions = permissions_of(host)
    if permissions is None:
        return None
    parts = [p for p in acl_path.split("/") if p]
    for depth in range(len(parts), -1, -1):
        privileges = permissions.get("/" + "/".join(parts[:depth]))
        if privileges is None:
            continue
        # PVE: the number is the propagate flag, so 0 is still held on that exact path
        return privilege in privileges and (depth == len(parts) or privileges[privilege] in (1, True))
    return False


def holds_anywhere(host: Any, privilege: str) -> bool:
    permissions = permissions_of(host) or {}
    return any(privilege in privileges for privileges in permissions.values())


def check_privileges(host: Any, entry: dict, values: dict[str, str]) -> None:
    check = entry.get("check")
    if not check or host.product != "pve":
        return  # only privilege checks are decided here; Proxmox decides the rest
    if entry["method"] != "GET" and getattr(host, "write_token_id", None):
        return  # writes go with the write token, whose privileges were not read
    missing = missing_privileges(host, check, values)
    if missing:
        acl_path, lacking = missing
        raise PolicyError(f"The token {host.token_id} lacks {lacking} on {acl_path}, which "
                          f"{entry['method']} {entry['path']} needs; nothing was sent. "
                          + grant_hint(host, lacking, acl_path))


def missing_privileges(host: Any, check: list, values: dict[str, str]) -> tuple[str, str] | None:
    """(ACL path, privileges) a schema permission check finds missing, or None: `perm` checks,
    and `and`/`or` of them as PVE evaluates them (e.g. oci-registry-pull needs
    Datastore.AllocateTemplate on the storage and Sys.AccessNetwork on the node); other kinds
    are left to Proxmox."""
    if check[0] in ("and", "or"):
        found = [missing_privileges(host, sub, values) for sub in check[1:] if isinstance(sub, list)]
        failed = [f for f in found if f]
        if check[0] == "and":
            return failed[0] if failed else None
        return failed[0] if found and len(failed) == len(found) else None
    if check[0] != "perm":
        return None
    acl_path = re.sub(r"\{([\w-]+)\}", lambda m: values.get(m.group(1), m.group(0)), check[1])
    if "{" in acl_path:
        return None
    privileges = version_privileges(host, check[2])
    verdicts = [holds(host, p, acl_path) for p in privileges]
    if "any" in check[3:]:
        missing = all(v is False for v in verdicts)
    else:
        missing = any(v is False for v in verdicts)
    if not missing:
        return None
    return acl_path, "|".join(p for p, v in zip(privileges, verdicts, strict=True) if v is False)


# PBS: the least built-in role with each privilege (proxmox-backup pbs-api-types/src/acl.rs).
PBS_ROLE_FOR_PRIVILEGE = {
    "Sys.Audit": "Audit", "Datastore.Audit": "DatastoreAudit", "Datastore.Read": "DatastoreReader",
    "Datastore.Verify": "DatastoreReader", "Datastore.Backup": "DatastoreBackup",
    "Datastore.Prune": "DatastorePowerUser", "Datastore.Modify": "DatastoreAdmin",
}


def grant_hint(host: Any, privileges: str, acl_path: str) -> str:
    """The commands that grant a missing privilege: to the user and to the token, since a token
    holds only what both are granted (docs/PROXMOX-BEHAVIOUR.md#privilege-separation)."""
    first = version_privileges(host, privileges.split("|")[:1])[0]
    user, _, token = host.token_id.partition("!")
    if host.product == "pbs":
        role = PBS_ROLE_FOR_PRIVILEGE.get(first, f"<a role with {first}>")
        grants = [f"proxmox-backup-manager acl update {acl_path} {role} --auth-id '{who}'"
                  for who in (user, host.token_id if token else None) if who]
    else:
        role = ROLE_FOR_PRIVILEGE.get(first, f"<a role with {first}>")
        grants = [f"pveum acl modify {acl_path} --users '{user}' --roles {role}"]
        if token:
            grants.append(f"pveum acl modify {acl_path} --tokens '{host.token_id}' --roles {role}")
    if not token:
        return f"Grant it with: {grants[0]}."
    return (f"Grant it to the user and the token: {'; '.join(grants)}. A privilege-separated token holds only "
            f"what both are granted.")
