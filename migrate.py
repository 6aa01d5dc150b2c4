"""`--from-pvemcp instances.json`: pvemcp's configuration file as the `.env` that says the same here.

pvemcp (README, "Plusieurs clusters") reads a JSON file named by PROXMOX_CONFIG: one object per
cluster, with the lower-case names of its PROXMOX_* variables (url, token, credentials_file,
fingerprint, allow_writes, protected_vmids, local_dir, ssh: {key_file, nodes, fingerprints, ...}),
and `${VARIABLE}` values read from the environment. The clusters may come as `{"instances": {...}}`,
`{"instances": [...]}` (each with a `name`), a bare object of name -> settings, or a bare list.

Each cluster becomes a host label; `${VARIABLE}` stays as it is (python-dotenv expands it from the
environment when the server reads the file, so no secret is copied). What would open a gate (writes,
exec, elevated, sensitive) is written commented out, to be opened on purpose; TLS is never turned off
(pin the fingerprint instead); what has no equivalent is a comment saying so.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from errors import ConfigError

TRUE = ("1", "true", "yes", "on")
# pvemcp's key -> our variable's suffix: carried over as written
PLAIN = {"url": "URL", "token": "TOKEN", "credentials_file": "TOKEN_FILE", "fingerprint": "FINGERPRINT",
         "ca_file": "CA_FILE", "username": "USER", "user": "USER", "password": "PASSWORD"}
# what opens a gate: written commented out (suffix, the value that opens it)
OPENING = {"allow_writes": ("ACCESS", "write"), "allow_exec": ("ALLOW_EXEC", "true"),
           "allow_elevated": ("ALLOW_ELEVATED", "true"), "allow_sensitive": ("ALLOW_SENSITIVE", "true")}
SSH = {"nodes": "SSH_NODES", "fingerprints": "SSH_FINGERPRINTS", "key_file": "SSH_KEY_FILE", "user": "SSH_USER",
       "sudo": "SSH_SUDO", "known_hosts": "SSH_KNOWN_HOSTS", "key_passphrase": "SSH_KEY_PASSPHRASE"}
NOTHING = {"local_dir": "files move with write_guest_file",
           "default_node": "tools find a guest's node from its vmid, or take node",
           "allow_ssh": "SSH is on where PROXMOX_<LABEL>_SSH_NODES is set (below, from `ssh`)",
           "ssh_agent": "without PROXMOX_<LABEL>_SSH_KEY_FILE the SSH agent is used",
           "name": "the label is the host's name"}


def instances(data: Any) -> list[tuple[str, dict]]:
    """(name, settings) of each cluster in any of the file's forms; ValueError when it has none."""
    if isinstance(data, dict) and "instances" in data:
        data = data["instances"]
    if isinstance(data, dict):
        found = [(str(name), value) for name, value in data.items()]
    elif isinstance(data, list):
        found = [(str(item.get("name", f"cluster{i + 1}")) if isinstance(item, dict) else "", item)
                 for i, item in enumerate(data)]
    else:
        found = []
    if not found or not all(isinstance(settings, dict) and name for name, settings in found):
        raise ValueError('expected {"instances": {"<name>": {"url": ..., "token": ...}}} or a list of such objects')
    return found


def label_for(name: str) -> str:
    """A host label (letters, digits, _) for a cluster name: `Home Lab` is HOME_LAB in variable names."""
    return re.sub(r"[^a-z0-9_]+", "_", name.strip().lower()).strip("_") or "default"


def text(value: Any) -> str:
    """A value as a .env line holds it: lists joined with commas, booleans as true/false."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(text(v) for v in value)
    if isinstance(value, dict):  # ssh nodes and fingerprints: {"pve1": "10.0.0.11"}
        return ",".join(f"{k}={text(v)}" for k, v in value.items())
    return str(value)


def cluster_lines(name: str, settings: dict, protected: list[str]) -> list[str]:
    label = label_for(name)
    prefix = f"PROXMOX_{label.upper()}_"
    lines = [f"# pvemcp cluster '{name}': host label {label} (tools take host=\"{label}\")"]
    for key, value in settings.items():
        if key in PLAIN:
            lines.append(f"{prefix}{PLAIN[key]}={text(value)}")
        elif key in OPENING:
            suffix, opened = OPENING[key]
            if str(value).strip().lower() in TRUE:
                lines.append(f"# {prefix}{suffix}={opened}   <- pvemcp {key}: true; remove the # to open it here too")
        elif key in ("verify_ssl", "verify_tls") and str(value).strip().lower() not in TRUE:
            lines.append(f"# {key}: false is not carried over: pin the certificate with {prefix}FINGERPRINT")
        elif key == "protected_vmids":
            protected += [f"{label}:{vmid}" for vmid in text(value).replace(" ", "").split(",") if vmid]
        elif key == "ssh" and isinstance(value, dict):
            lines += [f"{prefix}{SSH[k]}={text(v)}" for k, v in value.items() if k in SSH]
            lines += [f"# ssh.{k}: not known here" for k in value if k not in SSH]
        elif key in NOTHING:
            lines.append(f"# {key}: nothing to set ({NOTHING[key]})")
        else:
            lines.append(f"# {key}: not known here (.env.example lists every variable)")
    return lines


def pvemcp_env(path: Path) -> list[str]:
    """The .env lines for pvemcp's file at `path`; ConfigError naming the file when it cannot be read."""
    try:
        found = instances(json.loads(path.read_text()))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is not pvemcp's instances file: {exc}") from None
    protected: list[str] = []
    lines = [f"# translated from pvemcp's {path} by `python server.py --from-pvemcp`; read it before use.",
             "# ${VARIABLES} are read from the environment when the server reads this file, as pvemcp did."]
    for name, settings in found:
        lines += cluster_lines(name, settings, protected)
    if protected:
        lines.append(f"PROXMOX_PROTECTED_VMS={','.join(protected)}")
    return lines
