"""What differs between Proxmox VE and Proxmox Backup Server, as data: names, ports, the token
header and its separator, task ids, the variables that configure a host, where the ACLs start. Code
looks a difference up here (`PRODUCTS[host.product].env_prefix`) instead of branching on the
product's name. Standard library only: the client, the policy and the configuration all read it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Product:
    name: str
    default_port: int
    token_header: str  # format with id and secret
    upid: re.Pattern  # what a task id of this product looks like
    escaped_ids: bool  # whether a task id's worker id is systemd-escaped (proxmox_client.unescape_id)
    ticket_cookie: str  # the cookie that carries a password login's ticket
    task_tool: str  # the tool that follows one of its tasks
    first_log_line: int  # the `start` of a task log's first line (docs/PROXMOX-BEHAVIOUR.md#pbs-tasks)
    all_log_lines: int  # the `limit` that asks for every line of a task log (docs/PROXMOX-BEHAVIOUR.md#pve-tasks)
    env_prefix: str  # of its hosts' variables: <prefix>_<LABEL>_URL
    ssh_variable: str  # the suffix naming its SSH access: one address per node, or the one host
    ssh_pin_variable: str  # the suffix pinning SSH host keys
    acl_root: str  # the ACL path its privileges are granted on, at the widest
    version_command: str  # what shows its version on a shell

    def host_prefix(self, label: str) -> str:
        """The start of a host's variables: PROXMOX_HOME, PBS_BACKUP."""
        return f"{self.env_prefix}_{label.upper()}"


# Task ids, as the products' own parsers accept them (docs/PROXMOX-BEHAVIOUR.md#upids): pve-common
# src/PVE/UPID.pm (decode); proxmox-rs proxmox-schema/src/upid.rs (PROXMOX_UPID_REGEX), which adds a task
# counter and allows `/` in the (systemd-escaped) fields.
_NODE = r"(?P<node>[a-zA-Z0-9](?:[a-zA-Z0-9\-]*[a-zA-Z0-9])?)"
PVE_UPID = re.compile(rf"UPID:{_NODE}:(?P<pid>[0-9A-Fa-f]{{8}}):(?P<pstart>[0-9A-Fa-f]{{8,9}}):"
                      r"(?P<starttime>[0-9A-Fa-f]{8}):(?P<type>[^:\s/]+):(?P<id>[^:\s/]*):(?P<user>[^:\s/]+):")
PBS_UPID = re.compile(rf"UPID:{_NODE}:(?P<pid>[0-9A-Fa-f]{{8}}):(?P<pstart>[0-9A-Fa-f]{{8,9}}):"
                      r"(?P<task>[0-9A-Fa-f]{8,16}):(?P<starttime>[0-9A-Fa-f]{8}):(?P<type>[^:\s]+):(?P<id>[^:\s]*):"
                      r"(?P<user>[^:\s]+):")

# The PBS header uses a colon (docs/PROXMOX-BEHAVIOUR.md#api-tokens); PBS counts a task log's lines
# from 1, PVE skips `start` lines (docs/PROXMOX-BEHAVIOUR.md#pbs-tasks); PVE before 7.3 answers a log's
# limit=0 with no line, so "all" is a limit no log reaches there (docs/PROXMOX-BEHAVIOUR.md#pve-tasks).
PRODUCTS = {
    "pve": Product("Proxmox VE", 8006, "PVEAPIToken={id}={secret}", PVE_UPID, False, "PVEAuthCookie", "get_task",
                   0, 1_000_000, "PROXMOX", "SSH_NODES", "SSH_FINGERPRINTS", "/", "pveversion"),
    "pbs": Product("Proxmox Backup Server", 8007, "PBSAPIToken={id}:{secret}", PBS_UPID, True, "PBSAuthCookie",
                   "get_task", 1, 0, "PBS", "SSH_HOST", "SSH_FINGERPRINT", "/datastore",
                   "proxmox-backup-manager versions"),
}
