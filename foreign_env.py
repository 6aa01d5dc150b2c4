"""The variables of the other Proxmox MCP servers, met when their users switch: each answered with
one start-up line saying what to set here instead (config.load_config sets them apart first). None
is honoured except those that only narrow what the agent may do (HONOURED); a read-only flag that
this server's own variables contradict stops the server.
"""
from __future__ import annotations

from typing import Any

from errors import ConfigError
from protection import truthy

# Variables the other Proxmox MCP servers read (from their READMEs), and what to set here instead.
# Each is answered with one start-up line; none is honoured, so a name that would open writes, exec
# or turn TLS off never does so here. {value} is shown only for names that hold no secret.
FOREIGN = {
    # pve-mcp
    "PVE_HOST": ("pve-mcp", "PROXMOX_URL={value}"),
    "PVE_TOKEN_ID": ("pve-mcp", "PROXMOX_TOKEN={value}=<the PVE_TOKEN_SECRET value> (one variable: id=secret)"),
    "PVE_TOKEN_SECRET": ("pve-mcp", "PROXMOX_TOKEN=<the PVE_TOKEN_ID value>=<this secret> (one variable)"),
    "PVE_VERIFY_SSL": ("pve-mcp", "PROXMOX_FINGERPRINT=<the node's certificate SHA-256> for a self-signed "
                                  "certificate (README: certificate fingerprint)"),
    "PVE_MCP_READ_ONLY": ("pve-mcp", "nothing: read-only is the default; PROXMOX_ACCESS=lifecycle, write or "
                                     "destructive opens more"),
    "PVE_MCP_ENABLE_EXEC": ("pve-mcp", "PROXMOX_ALLOW_EXEC=true, if you mean the agent to run commands in guests"),
    "PVE_TIMEOUT": ("pve-mcp", "PROXMOX_READ_TIMEOUT={value}"),
    "PVE_MCP_TASK_WAIT": ("pve-mcp", "nothing: each write tool takes wait_seconds"),
    # Proxmox MCP Server
    "PVE_URL": ("Proxmox MCP Server", "PROXMOX_URL={value}"),
    "PVE_TOKEN": ("Proxmox MCP Server", "PROXMOX_TOKEN=<the same user@realm!tokenid=secret>"),
    "PVE_USER": ("Proxmox MCP Server", "PROXMOX_USER={value} (an API token in PROXMOX_TOKEN is safer)"),
    "PVE_PASSWORD": ("Proxmox MCP Server", "PROXMOX_PASSWORD=<the same password> (or PROXMOX_PASSWORD_FILE)"),
    "PVE_READONLY": ("Proxmox MCP Server", "nothing: read-only is the default; PROXMOX_ACCESS=lifecycle, write or "
                                           "destructive opens more"),
    "MCP_HTTP_TOKEN": ("Proxmox MCP Server", "MCP_AUTH_TOKEN=<the same token>: every HTTP request needs it"),
    "PROXMOX_MCP_CONFIG": ("Proxmox MCP Server", "one set of variables per host: PROXMOX_<LABEL>_URL, _TOKEN"),
    "PROXMOX_SERVER": ("Proxmox MCP Server", "nothing: tools take host=<label> (see list_hosts)"),
    # proxmox-ve-mcp
    "MCP_HOST": ("proxmox-ve-mcp", "MCP_HTTP_HOST={value}"),
    "MCP_PORT": ("proxmox-ve-mcp", "MCP_HTTP_PORT={value}"),
    # pvemcp
    "PROXMOX_ALLOW_WRITES": ("pvemcp", "PROXMOX_ACCESS=write (or lifecycle, or destructive): the highest tier a "
                                       "request may reach"),
    "PROXMOX_ALLOW_SSH": ("pvemcp", "PROXMOX_SSH_NODES=pve1=10.0.0.11,... with PROXMOX_SSH_FINGERPRINTS for the "
                                    "SSH tools, and PROXMOX_ALLOW_EXEC=true to run commands"),
    "PROXMOX_PROTECTED_VMIDS": ("pvemcp", "PROXMOX_PROTECTED_VMS={protected} (label:vmid; * is every host), or "
                                          "list them in protected-vms.json"),
    "PROXMOX_CREDENTIALS_FILE": ("pvemcp", "PROXMOX_TOKEN_FILE={value} (the file holds one line "
                                           "user@realm!tokenid=secret)"),
    "PROXMOX_DEFAULT_NODE": ("pvemcp", "nothing: tools find a guest's node from its vmid, or take node="),
    "PROXMOX_USERNAME": ("pvemcp", "PROXMOX_USER={value}"),
    "PROXMOX_MCP_TOKEN": ("pvemcp", "MCP_AUTH_TOKEN=<the same token>"),
    "PROXMOX_CONFIG": ("pvemcp", "one set of variables per cluster: PROXMOX_<LABEL>_URL, _TOKEN, _ACCESS; "
                                 "`python server.py --from-pvemcp {value}` prints them from your file"),
    "PROXMOX_SSH_AGENT": ("pvemcp", "nothing: without PROXMOX_SSH_KEY_FILE the SSH agent is used"),
    "PROXMOX_LOCAL_DIR": ("pvemcp", "PROXMOX_TRANSFER_DIR={value} (node files: write_node_files; guest files: "
                                    "write_guest_file)"),
    # PVEHub-MCP
    "PVEHUB_MCP_AUTH_TOKEN": ("PVEHub-MCP", "MCP_AUTH_TOKEN=<the same token>"),
    "PVEHUB_MCP_AUTH_REQUIRED": ("PVEHub-MCP", "MCP_AUTH_REQUIRED={value}"),
    "PVEHUB_ALLOWED_HOSTS": ("PVEHub-MCP", "MCP_ALLOWED_HOSTS={value}"),
    "PVEHUB_TRANSPORT": ("PVEHub-MCP", "nothing: stdio is the default, `python server.py --http` serves HTTP"),
    "PVEHUB_AUDIT_INCLUDE_RESULTS": ("PVEHub-MCP", "nothing: the audit log records each write's UPID or error"),
}


# Foreign names that only narrow what the agent may do, and are honoured while they are warned about.
HONOURED = ("PROXMOX_PROTECTED_VMIDS", "PVE_MCP_READ_ONLY", "PVE_READONLY")


# Whole families of foreign names, by prefix: (prefix, server, what to set instead).
FOREIGN_PREFIXES = (
    ("PVEHUB_", "PVEHub-MCP", "PROXMOX_<LABEL>_URL and _TOKEN (PBS_<LABEL>_... for a Backup Server); "
                              "PROXMOX_ACCESS and PROXMOX_ALLOW_* for the policy"),
    ("PROXMOX_GUEST_SSH_", "pvemcp", "nothing: commands reach guests through write_exec_guest"),
    ("PVE_", "another Proxmox MCP server", "PROXMOX_<LABEL>_URL and _TOKEN (this server reads PROXMOX_*, PBS_* "
                                           "and MCP_* names)"),
)


def foreign_server(name: str) -> str | None:
    """The other Proxmox MCP server a variable name belongs to, if it is one of theirs."""
    if name in FOREIGN:
        return FOREIGN[name][0]
    return next((server for prefix, server, _ in FOREIGN_PREFIXES if name.startswith(prefix)), None)


def foreign_variables(env: dict[str, str]) -> list[str]:
    """One line per variable of another Proxmox MCP server: what to set here instead."""
    lines = []
    for name in sorted(env):
        advice = FOREIGN[name][1] if name in FOREIGN else next(a for p, _, a in FOREIGN_PREFIXES if name.startswith(p))
        value = env[name].strip()
        protected = ",".join(f"*:{v.strip()}" for v in value.split(",") if v.strip())
        honoured = "honoured meanwhile, as it only narrows" if name in HONOURED else "not read here"
        lines.append(f"{name} is {foreign_server(name)}'s setting ({honoured}). Set instead: "
                     f"{advice.format(value=value, protected=protected)}.")
    if lines:
        lines.append("README, 'Coming from another Proxmox MCP server', maps every such variable.")
    return lines


def honour_narrowing(foreign: dict[str, str], env: dict[str, str]) -> None:
    """The foreign names that only narrow what the agent may do keep doing so: PROXMOX_PROTECTED_VMIDS
    joins PROXMOX_PROTECTED_VMS in `env` (every host)."""
    vmids = [v.strip() for v in foreign.get("PROXMOX_PROTECTED_VMIDS", "").split(",") if v.strip()]
    if not all(v.isdigit() and int(v) >= 100 for v in vmids):
        raise ConfigError(f"PROXMOX_PROTECTED_VMIDS={foreign['PROXMOX_PROTECTED_VMIDS']!r} is not a comma list of "
                          f"vmids; set PROXMOX_PROTECTED_VMS=*:100,*:101 instead.")
    if vmids:
        env["PROXMOX_PROTECTED_VMS"] = ",".join([env.get("PROXMOX_PROTECTED_VMS", "")] + [f"*:{v}" for v in vmids])


def check_read_only_flags(foreign: dict[str, str], config: Any) -> None:
    """A foreign read-only flag contradicted by this server's own variables stops the server."""
    for name in ("PVE_MCP_READ_ONLY", "PVE_READONLY"):
        if not truthy(foreign.get(name, "")):
            continue
        rules = [config.default_rules, *config.settings.hosts.values()]
        if any(r.access != "read" or r.allow & {"exec", "elevated"} for r in rules):
            raise ConfigError(f"{name}={foreign[name]} asks for read-only, but PROXMOX_ACCESS or a PROXMOX_ALLOW_* "
                              f"variable opens more; remove one of them (read-only is the default here).")
