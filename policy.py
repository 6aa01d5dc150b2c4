"""The one gate every Proxmox request passes.

`check()` is called by the HTTP client before anything is sent. It refuses a request when
the path is not in the official API catalog, when its parameters do not fit the schema,
when its gate is closed for that host, when it names a protected guest, when the token
lacks a privilege it needs, or when it would write a masked secret back. The same module
owns secret masking and decides what the audit log records (`audit`), so that every refusal,
dry run and write is recorded in one place; the hash-chained file itself is audit.py.

Gates, from harmless to dangerous:
  read         GET that returns no secrets
  sensitive    reads that return secrets or guest files        PROXMOX_ALLOW_SENSITIVE
  lifecycle    start, shutdown, reboot, suspend, snapshot, backup  PROXMOX_ACCESS>=lifecycle
  write        create, configure, clone, migrate, move           PROXMOX_ACCESS>=write
  destructive  delete, rollback, hard stop, purge, wipe, prune   PROXMOX_ACCESS=destructive
  exec         commands and file writes inside guests           PROXMOX_ALLOW_EXEC
  elevated     reaches the host or the access system           PROXMOX_ALLOW_ELEVATED (+ write)
  blocked      tickets, passwords, TFA, consoles                only by PROXMOX_UNBLOCK
"""
from __future__ import annotations

import contextvars
import json
import posixpath
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable
from urllib.parse import unquote

import audit as audit_log
import catalog
from errors import PolicyError

TIERS = ("read", "lifecycle", "write", "destructive")
GATES = ("read", "sensitive", "lifecycle", "write", "destructive", "exec", "elevated", "blocked")
SEVERITY = {gate: rank for rank, gate in enumerate(GATES)}


class DryRun(Exception):
    """Raised instead of sending a write when dry run is on; carries the exact request."""

    def __init__(self, plan: dict):
        super().__init__("dry run")
        self.plan = plan


# ================================================================ gate of a method

# First match wins. (methods, path template regex, gate, why). Paths are catalog templates.
RULES: list[tuple[str, str, str, str]] = [
    # blocked: logins, passwords, second factors, consoles and raw protocol channels
    ("*", r"/access/ticket|/access/vncticket|/access/password|/access/openid/.*", "blocked",
     "login and password endpoints"),
    ("*", r"/access/tfa.*|/access/users/\{userid\}/tfa|/access/users/\{userid\}/unlock-tfa", "blocked",
     "second-factor material"),
    ("*", r".*/(vncshell|spiceshell|termproxy|vncproxy|spiceproxy|vncwebsocket|mtunnel|mtunnelwebsocket)", "blocked",
     "interactive consoles and tunnels"),
    ("*", r".*/qemu/\{vmid\}/(monitor|sendkey|dbus-vmstate)", "blocked",
     "QEMU monitor and keystrokes reach the guest console"),
    ("*", r".*/agent/set-user-password", "blocked", "sets a guest password"),
    ("GET", r"/backup|/reader", "blocked", "HTTP/2 backup protocol upgrade, not a REST call"),
    # exec: commands and file writes inside guests, and the node's own command runner
    ("*", r".*/agent/(exec|exec-status|file-write)", "exec", "runs commands or writes files in a guest"),
    ("POST", r".*/qemu/\{vmid\}/agent", "exec", "runs any guest agent command"),
    ("POST", r"/nodes/\{node\}/execute", "elevated", "runs API calls in bulk as the node"),
    # sensitive reads
    ("GET", r".*/agent/file-read", "sensitive", "reads any file in the guest"),
    ("GET", r".*/cloudinit/dump", "sensitive", "cloud-init user data can hold passwords and keys"),
    ("GET", r"/nodes/\{node\}/report", "sensitive", "full system report with configuration files"),
    ("GET", r"/cluster/config/join|/cluster/config/totem|/cluster/config/qdevice", "sensitive",
     "cluster join information"),
    ("GET", r"/cluster/notifications/endpoints/.*|/config/notifications/endpoints/.*", "sensitive",
     "notification targets can hold tokens"),
    ("GET", r"/config/remote/.*|/config/s3/.*|/config/encryption-keys.*|/config/tape-encryption-keys.*", "sensitive",
     "remote credentials and key material"),
    ("GET", r"/admin/datastore/\{store\}/(download|download-decoded|pxar-file-download|catalog|file-restore/.*)",
     "sensitive", "backup contents"),
    ("GET", r"/nodes/\{node\}/(journal|syslog)", "read", "logs"),
    ("GET", r"/nodes/\{node\}/query-url-metadata|/nodes/\{node\}/query-oci-repo-tags", "write",
     "makes the node fetch an arbitrary URL"),
    ("GET", r".*", "read", "reads"),
    # elevated: the host, its network, the access system and the cluster itself
    ("*", r"/access/(users|groups|roles|acl|domains).*|/config/access/.*", "elevated",
     "users, tokens, ACLs and realms"),
    ("POST", r"/nodes/\{node\}/status", "elevated", "reboots or shuts down the node"),
    ("*", r"/nodes/\{node\}/(network|dns|hosts|time|apt|services|subscription|certificates|config)(/.*)?", "elevated",
     "node system configuration"),
    ("*", r"/nodes/\{node\}/ceph.*|/cluster/ceph.*", "elevated", "Ceph cluster management"),
    ("*", r"/cluster/config.*|/cluster/acme.*|/config/acme.*|/cluster/metrics.*|/config/metrics.*", "elevated",
     "cluster membership, certificates and data sent out"),
    ("*", r"/cluster/notifications.*|/config/notifications.*", "elevated", "notification targets send data out"),
    ("*", r"/cluster/mapping.*", "elevated", "host device mappings"),
    ("*", r"/cluster/firewall.*|/nodes/\{node\}/firewall.*", "elevated",
     "host-level firewall can lock out the cluster"),
    ("PUT", r"/cluster/sdn", "elevated", "applies SDN to every node"),
    ("*", r"/storage(/.*)?|/config/datastore(/.*)?|/config/s3.*", "elevated",
     "storage definitions can mount host paths"),
    ("*", r"/nodes/\{node\}/disks/(initgpt|wipedisk)|/nodes/\{node\}/disks/(lvm|lvmthin|directory|zfs)(/.*)?",
     "destructive", "formats or wipes disks"),
    # destructive
    ("POST", r".*/snapshot/\{snapname\}/rollback", "destructive", "rollback discards the current state"),
    ("POST", r".*/status/(stop|reset)", "destructive", "hard power-off loses unsaved guest state"),
    ("POST", r"/nodes/\{node\}/stopall", "destructive", "stops every guest of the node"),
    ("PUT", r".*/qemu/\{vmid\}/unlink", "destructive", "deletes disks"),
    ("*", r"/admin/datastore/\{store\}/(prune|prune-datastore)", "destructive", "removes backups"),
    ("*", r"/tape/.*/(format-media|erase-media|clean)|/tape/media/destroy", "destructive", "erases tapes"),
    ("DELETE", r".*", "destructive", "deletes"),
    # lifecycle
    ("POST", r".*/status/(start|shutdown|reboot|suspend|resume)", "lifecycle", "power state"),
    ("POST", r"/nodes/\{node\}/(startall|suspendall|wakeonlan)", "lifecycle", "power state"),
    ("POST", r".*/\{vmid\}/snapshot", "lifecycle", "creates a snapshot"),
    ("POST", r".*/agent/(ping|fsfreeze-.*|fstrim|shutdown|suspend-.*)", "lifecycle",
     "guest agent power and filesystem actions"),
    ("POST", r"/nodes/\{node\}/vzdump", "lifecycle", "creates a backup"),
    ("POST", r"/cluster/bulk-action/guest/(start|shutdown|suspend)", "lifecycle", "power state of several guests"),
    ("POST", r"/admin/(sync|verify|prune)/\{id\}/run|/admin/datastore/\{store\}/(verify|gc)"
             r"|/nodes/\{node\}/replication/\{id\}/schedule_now", "lifecycle", "runs a job now"),
    # everything else that changes something
    ("*", r".*", "write", "changes configuration or creates things"),
]

# Classifications a reviewer should look at again, with the reason for the choice.
UNCERTAIN: dict[tuple[str, str, str], str] = {
    ("pve", "GET", "/nodes/{node}/query-url-metadata"): "a GET, but the node fetches any URL given: treated as a write",
    ("pve", "GET", "/nodes/{node}/report"): "not secret by design, but it dumps configuration files: sensitive",
    ("pve", "POST", "/nodes/{node}/vzdump"):
        "a backup changes no guest, but it loads storage and can run hook scripts: lifecycle, hooks elevated",
    ("pve", "POST", "/nodes/{node}/migrateall"):
        "moves every guest of a node: write, refused when it would move a protected guest",
    ("pve", "POST", "/nodes/{node}/qemu/{vmid}/template"): "irreversible in practice, but destroys nothing: write",
    ("pve", "PUT", "/cluster/options"): "datacenter-wide settings; none reach the host shell: write",
    ("pve", "GET", "/cluster/config/join"): "join information holds no password but helps an attacker: sensitive",
    ("pbs", "POST", "/admin/datastore/{store}/gc"): "GC frees only chunks no snapshot references: lifecycle",
    ("pbs", "GET", "/config/remote/{name}"): "PBS does not return the password, but the remote's auth id: sensitive",
    ("pve", "POST", "/nodes/{node}/qemu/{vmid}/agent/fsfreeze-freeze"):
        "a frozen filesystem blocks the guest until thawed: lifecycle",
}

def truthy(value: str) -> bool:
    return value in ("1", "True", "true", "yes", "on")


def any_value(_value: str) -> bool:
    """An argument rule that holds whatever the value is."""
    return True


# Arguments that raise a call's gate: (path regex, parameter regex, test on the value, gate, why).
ARGUMENT_RULES: list[tuple[str, str, Callable[[str], bool], str, str]] = [
    (r".*", r"hookscript", any_value, "elevated", "a hookscript runs on the host"),
    (r".*/qemu(/\{vmid\}/config)?", r"args", any_value, "elevated", "raw QEMU arguments reach the host"),
    (r".*", r"hostpci\d+|parallel\d+|dev\d+", any_value, "elevated", "host device passthrough"),
    (r".*", r"usb\d+", lambda v: "spice" not in v, "elevated", "host USB passthrough"),
    (r".*", r"serial\d+", lambda v: v.startswith("/dev/"), "elevated", "host serial device"),
    (r".*/lxc(/\{vmid\}/config)?", r"mp\d+|rootfs", lambda v: v.split(",")[0].split("=")[-1].startswith("/"),
     "elevated", "bind-mounts a host path"),
    (r".*/lxc(/\{vmid\}/config)?", r"features", lambda v: "mount=" in v or "keyctl=1" in v, "elevated",
     "container may mount or use host keyrings"),
    (r".*/lxc", r"unprivileged", lambda v: not truthy(v), "elevated",
     "privileged container: root inside is root on the host"),
    (r".*/vzdump|/cluster/backup.*", r"script|dumpdir|tmpdir", any_value, "elevated",
     "runs a script or writes to a host path"),
    (r".*", r"purge|destroy-unreferenced-disks", truthy, "destructive", "also deletes jobs and disks"),
    (r".*", r"force", truthy, "destructive", "forces past a safety check"),
    (r".*/(move_disk|move_volume)", r"delete", truthy, "destructive", "deletes the source disk"),
    (r"/nodes/\{node\}/lxc|/nodes/\{node\}/qemu", r"restore|archive", any_value, "write", "restores a backup"),
]


def _rule_for(method: str, template: str) -> tuple[str, str]:
    for methods, pattern, gate, why in RULES:
        if (methods == "*" or method in methods.split("|")) and re.fullmatch(pattern, template):
            return gate, why
    raise AssertionError("the last rule matches everything")


def method_gate(method: str, template: str) -> str:
    """The gate of a catalog method, before its arguments are looked at."""
    return _rule_for(method, template)[0]


def call_gate(method: str, template: str, params: dict[str, Any]) -> tuple[str, list[str]]:
    """The gate of one call: the method's, raised by dangerous arguments. Returns (gate, reasons)."""
    gate, why = _rule_for(method, template)
    reasons = [why]
    if method == "GET":
        return gate, reasons
    if template.endswith("/prune") and truthy(str(params.get("dry-run", "0"))):
        return "read", ["prune with dry-run only lists what would be removed"]
    for path_pattern, name_pattern, test, raised, reason in ARGUMENT_RULES:
        if not re.fullmatch(path_pattern, template):
            continue
        for name, value in params.items():
            values = value if isinstance(value, list) else [value]
            if re.fullmatch(name_pattern, name) and any(test(str(v)) for v in values):
                if SEVERITY[raised] > SEVERITY[gate] and gate != "blocked":
                    gate = raised
                reasons.append(f"{name}: {reason}")
    return gate, reasons


# ================================================================ per-host settings

@dataclass
class HostPolicy:
    access: str = "read"
    allow: frozenset[str] = frozenset()  # of "sensitive", "exec", "elevated"
    unblocked: frozenset[tuple[str, str]] = frozenset()  # (METHOD, template)


def gate_open(rules: HostPolicy, gate: str, method: str = "POST", template: str = "") -> bool:
    tier = TIERS.index(rules.access)
    if gate == "read":
        return True
    if gate == "sensitive":
        return "sensitive" in rules.allow
    if gate in TIERS:
        return tier >= TIERS.index(gate)
    if gate == "exec":
        return "exec" in rules.allow
    if gate == "elevated":
        return "elevated" in rules.allow and (method == "GET" or tier >= TIERS.index("write"))
    return (method, template) in rules.unblocked and (method == "GET" or tier >= TIERS.index("write"))


def how_to_open(gate: str, label: str, product: str) -> str:
    prefix = "PROXMOX" if product == "pve" else "PBS"
    return {
        "sensitive": f"PROXMOX_ALLOW_SENSITIVE=true (or {prefix}_{label.upper()}_ALLOW_SENSITIVE)",
        "lifecycle": "PROXMOX_ACCESS=lifecycle or higher",
        "write": "PROXMOX_ACCESS=write or higher",
        "destructive": "PROXMOX_ACCESS=destructive",
        "exec": "PROXMOX_ALLOW_EXEC=true",
        "elevated": "PROXMOX_ALLOW_ELEVATED=true together with PROXMOX_ACCESS=write",
        "blocked": "PROXMOX_UNBLOCK naming this method (and PROXMOX_ACCESS=write for a change)",
    }[gate]


# ================================================================ protected guests

@dataclass
class Protected:
    entries: list[dict] = field(default_factory=list)
    error: str | None = None  # set when the file could not be read: fail closed

    def find(self, host_label: str, vmid: int, product: str) -> dict | None:
        for entry in self.entries:
            # a PBS backup group carries no PVE host label: any entry with that vmid protects it
            same_host = product == "pbs" or entry.get("host") in (None, "*", host_label)
            if same_host and int(entry["vmid"]) == vmid:
                return entry
        return None

    def any_for(self, host_label: str, product: str) -> bool:
        return any(product == "pbs" or e.get("host") in (None, "*", host_label) for e in self.entries)


def load_protected(path: Path) -> Protected:
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, list) or not all(isinstance(e, dict) and "vmid" in e for e in data):
            raise ValueError("expected a list of {\"host\", \"vmid\", \"name\", \"reason\"} objects")
        for entry in data:
            int(entry["vmid"])
        return Protected(entries=data)
    except (OSError, ValueError, TypeError) as exc:
        return Protected(error=f"{path}: {exc}")


VOLUME_VMID = re.compile(r"(?:^|[:/,=])(?:vm|base|subvol|basevol)-(\d{3,9})-")
BACKUP_VMID = re.compile(r"vzdump-(?:qemu|lxc|openvz)-(\d{3,9})-")
HA_SID = re.compile(r"(?:^|/|,|=)(?:vm|ct):(\d{3,9})(?:$|/|,)")
REPLICATION_ID = re.compile(r"^(\d{3,9})-\d{1,9}$")
VMID_LIST_PARAMS = ("vmid", "newid", "target-vmid", "vms", "vmids")
# Parameters that only name what a request reads: restoring a protected guest's backup to a NEW
# vmid leaves the guest alone (a restore over it is still caught by `vmid`).
SOURCE_PARAMS = {r"/nodes/\{node\}/(qemu|lxc)": ("archive", "ostemplate")}
# Bulk actions: the parameter that lists the guests; absent means "all of them".
BULK = {
    r"/nodes/\{node\}/(startall|stopall|suspendall|migrateall)": "vms",
    r"/cluster/bulk-action/guest/.*": "vms",
    r"/nodes/\{node\}/storage/\{storage\}/prunebackups": "vmid",
    r"/admin/datastore/\{store\}/prune-datastore": None,
    r"/admin/datastore/\{store\}/namespace": None,
}


def _numbers(value: Any) -> list[int]:
    values = value if isinstance(value, list) else [value]
    return [int(n) for v in values for n in re.findall(r"\d{3,9}", str(v))]


def named_guests(product: str, template: str, path_params: dict[str, str], params: dict[str, Any]) -> set[int]:
    """Every vmid a request names, wherever it hides: path, id parameters, lists, volume ids,
    backup file names, HA sids, replication ids and PBS backup groups."""
    found: set[int] = set()
    for pattern, names in SOURCE_PARAMS.items():
        if re.fullmatch(pattern, template):
            params = {k: v for k, v in params.items() if k not in names}
    everything = {**path_params, **params}
    for name in VMID_LIST_PARAMS:
        if name in everything:
            found.update(_numbers(everything[name]))
    texts = [str(v) for value in everything.values() for v in (value if isinstance(value, list) else [value])]
    for text in texts:
        found.update(int(n) for n in VOLUME_VMID.findall(text))
        found.update(int(n) for n in BACKUP_VMID.findall(text))
        found.update(int(n) for n in HA_SID.findall(text))
    if "replication" in template:
        for key in ("id",):
            match = REPLICATION_ID.match(str(everything.get(key, "")))
            if match:
                found.add(int(match.group(1)))
    backup_id = str(everything.get("backup-id", ""))
    if product == "pbs" and everything.get("backup-type") in ("vm", "ct") and backup_id.isdigit():
        found.add(int(backup_id))
    if "sid" in everything or "sids" in everything:
        found.update(_numbers(everything.get("sid", "")) + _numbers(everything.get("sids", "")))
    return found


def _all_guests_request(template: str, params: dict[str, Any]) -> str | None:
    """Why a request touches guests without naming them (bulk, vzdump all=1, pools), or None."""
    for pattern, list_param in BULK.items():
        if re.fullmatch(pattern, template):
            if template.endswith("/namespace") and str(params.get("delete-groups", "0")) not in ("1", "true"):
                return None
            if list_param is None or list_param not in params:
                return "acts on every guest without an explicit list"
    if re.fullmatch(r"/nodes/\{node\}/vzdump|/cluster/backup(/\{id\})?", template):
        if str(params.get("all", "0")) in ("1", "true", "True"):
            return "all=1"
        if "pool" in params:
            return "selects guests by pool, which cannot be checked before sending"
    return None


# ================================================================ the settings and the check

@dataclass
class Settings:
    hosts: dict[tuple[str, str], HostPolicy] = field(default_factory=dict)  # (product, label)
    protected: Protected = field(default_factory=Protected)
    dry_run: bool = False
    elicit: bool = True
    audit_path: Path | None = None


SETTINGS = Settings()
# Per call, set by the tool wrapper in server.py: tool name, dry run, confirmation.
# None outside a tool call (a shared dict default would be one object for every context).
CALL: contextvars.ContextVar[dict | None] = contextvars.ContextVar("call", default=None)


def current_call() -> dict:
    """The running tool call's settings, empty outside a tool call."""
    return CALL.get() or {}


def configure(settings: Settings) -> None:
    global SETTINGS
    SETTINGS = settings


def rules_for(host: Any) -> HostPolicy:
    return SETTINGS.hosts.get((host.product, host.label), HostPolicy())


def normalise_path(path: str) -> str:
    """Decode, collapse `//` and resolve `..` so that a path cannot hide from the catalog."""
    decoded = path
    for _ in range(3):  # double-encoded slashes
        decoded = unquote(decoded)
    decoded = decoded.split("?", 1)[0]
    if any(ord(c) < 32 for c in decoded):
        raise PolicyError(f"Path {path!r} contains characters no Proxmox path has.")
    return posixpath.normpath("/" + decoded.strip("/")) if decoded.strip("/") else "/"


@dataclass
class Decision:
    path: str
    template: str
    gate: str
    reasons: list[str]
    guests: list[int]
    confirm: bool  # destructive and exec calls need the user's yes


def check(host: Any, method: str, path: str, params: dict[str, Any]) -> Decision:
    """Refuse a request the operator did not allow; otherwise say what it is.

    Raises PolicyError with the reason and what would allow it; nothing is sent then.
    """
    method = method.upper()
    clean = normalise_path(path)
    found = catalog.find_path(host.product, clean)
    if found is None:
        raise PolicyError(f"Unknown API path {clean} on {host.product.upper()}: refused. "
                          f"Use api_search to find the right path.")
    template, entries, path_params = found
    if method not in entries:
        raise PolicyError(f"{method} is not a method of {template} (it has {', '.join(sorted(entries))}).")
    gate, reasons = call_gate(method, template, params)
    require_gate(host, gate, f"{method} {clean}", reasons, method, template)
    errors = catalog.check_params(entries[method], params, path_params=path_params)
    if errors:
        details = "; ".join(f"{name}: {message}" for name, message in sorted(errors.items()))
        raise PolicyError(f"Invalid parameters for {method} {template}: {details}. Nothing was sent; "
                          f"api_describe shows the accepted parameters.")
    guests = sorted(named_guests(host.product, template, path_params, params))
    if gate != "read":
        check_protected(host, method, template, params, guests, gate)
    _check_privileges(host, entries[method], path_params | {k: str(v) for k, v in params.items()
                                                            if isinstance(v, (str, int))})
    if method != "GET":
        for name, value in params.items():
            if any(marker in str(value) for marker in (MASK, "**********")):
                raise PolicyError(f"Parameter '{name}' holds a masked value ({MASK}); sending it would "
                                  f"overwrite the real secret. Leave it out to keep the current value.")
    # a GET (exec-status) belongs to an exec that was confirmed already
    return Decision(clean, template, gate, reasons, guests, confirm=gate in ("destructive", "exec") and method != "GET")


def require_gate(host: Any, gate: str, what: str, reasons: list[str], method: str = "POST",
                 template: str = "") -> None:
    """Refuse when the gate is closed for this host, naming the variable that opens it."""
    if not gate_open(rules_for(host), gate, method, template):
        raise PolicyError(f"{what} on host '{host.label}' is in the '{gate}' gate ({'; '.join(reasons)}), "
                          f"which is closed. The operator can open it with "
                          f"{how_to_open(gate, host.label, host.product)}.")


def check_protected(host: Any, method: str, template: str, params: dict, guests: list[int], gate: str) -> None:
    """Refuse a request that names a protected guest or acts on all guests of a host with
    protected ones; refuse every guest-changing request while the list is unreadable."""
    if host.product == "pbs" and gate not in ("destructive",):
        return  # on PBS only forget, prune and deletion of backups are guarded
    protected = SETTINGS.protected
    bulk = _all_guests_request(template, params)
    if protected.error and (guests or bulk):
        raise PolicyError(f"The protected-guest list could not be read ({protected.error}), so every "
                          f"request that changes a guest is refused. Fix the file and restart.")
    for vmid in guests:
        entry = protected.find(host.label, vmid, host.product)
        if entry:
            name = f" ({entry['name']})" if entry.get("name") else ""
            raise PolicyError(f"Guest {vmid}{name} is protected on host '{host.label}': "
                              f"{entry.get('reason', 'no reason given')}. This request is refused.")
    if bulk == "all=1":
        excluded = set(_numbers(params.get("exclude", "")))
        left = [e for e in protected.entries
                if e.get("host") in (None, "*", host.label) and int(e["vmid"]) not in excluded]
        if left:
            raise PolicyError(f"{method} {template} with all=1 would include protected guest "
                              f"{left[0]['vmid']} on host '{host.label}'. Add it to exclude.")
    elif bulk and protected.any_for(host.label, host.product):
        raise PolicyError(f"{method} {template} {bulk}, and host '{host.label}' has protected guests. "
                          f"List the guests explicitly, leaving out the protected ones.")


# ================================================================ privileges the token holds

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
}



# (product, label, token id) -> {path: {privilege: propagate flag}}, from GET /access/permissions
PERMISSIONS: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {}


# (product, label) -> major version, from GET /version when the privileges are read
VERSIONS: dict[tuple[str, str], int] = {}


def set_version(host: Any, version: str) -> None:
    match = re.match(r"(\d+)\.", str(version))
    if match:
        VERSIONS[(host.product, host.label)] = int(match.group(1))


def version_privileges(host: Any, privileges: list[str] | tuple[str, ...]) -> list[str]:
    """The privileges a check names, as the host's version has them: PVE 8 checks VM.Monitor for
    every guest agent call, and VM.GuestAgent.* exists from PVE 9 on
    (docs/PROXMOX-BEHAVIOUR.md#agent-privileges-by-version). An unknown version counts as current."""
    if host.product == "pve" and VERSIONS.get((host.product, host.label), 9) < 9 \
            and any(p.startswith("VM.GuestAgent.") for p in privileges):
        return ["VM.Monitor"]
    return list(privileges)


def permissions_of(host: Any) -> dict[str, dict[str, Any]] | None:
    return PERMISSIONS.get((host.product, host.label, host.token_id))


def set_permissions(host: Any, permissions: dict[str, dict[str, Any]]) -> None:
    PERMISSIONS[(host.product, host.label, host.token_id)] = permissions


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


def _check_privileges(host: Any, entry: dict, values: dict[str, str]) -> None:
    check = entry.get("check")
    if not check or host.product != "pve" or check[0] != "perm":
        return  # only plain privilege checks are decided here; Proxmox decides the rest
    if entry["method"] != "GET" and getattr(host, "write_token_id", None):
        return  # writes go with the write token, whose privileges were not read
    acl_path = re.sub(r"\{([\w-]+)\}", lambda m: values.get(m.group(1), m.group(0)), check[1])
    if "{" in acl_path:
        return
    privileges = version_privileges(host, check[2])
    verdicts = [holds(host, p, acl_path) for p in privileges]
    if "any" in check[3:]:
        missing = all(v is False for v in verdicts)
    else:
        missing = any(v is False for v in verdicts)
    if missing:
        lacking = "|".join(p for p, v in zip(privileges, verdicts, strict=True) if v is False)
        raise PolicyError(f"The token {host.token_id} lacks {lacking} on {acl_path}, which "
                          f"{entry['method']} {entry['path']} needs; nothing was sent. "
                          + grant_hint(host, lacking, acl_path))


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


# ================================================================ secrets

MASK = "***"
SECRET_KEYS = re.compile(r"pass(word)?|cipassword|secret|token|encryption-key|keyring|hmac|private|ticket"
                         r"|csrf|key-?data|sshkey-?priv", re.IGNORECASE)
_SECRET_PATTERNS = [
    re.compile(r"(PVEAPIToken=[^=\s]+=)[^\s\"',]+"),
    re.compile(r"(PBSAPIToken=[^:\s]+:)[^\s\"',]+"),
    re.compile(r"(-----BEGIN [A-Z ]*PRIVATE KEY-----)[\s\S]*?(-----END [A-Z ]*PRIVATE KEY-----)"),
    re.compile(r"((?:PVE|PBS)AuthCookie=)[^\s;\"',]+"),
    re.compile(r"((?:\"|')?(?:password|cipassword|secret|ticket|CSRFPreventionToken|token-secret)"
               r"(?:\"|')?\s*[:=]\s*(?:\"|')?)[^\"'\s,}&]+", re.IGNORECASE),
    re.compile(r"(://[^:/\s@\"',]+:)[^@\s/\"',]+(@)"),
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


def mask_params(params: dict[str, Any]) -> dict[str, Any]:
    """Parameters as they may be shown or logged: secret-named values replaced."""
    return {k: MASK if SECRET_KEYS.search(k) and k not in ("sshkeys",) else v for k, v in params.items()}


# ================================================================ audit

def audit(host: Any, method: str, path: str, params: dict[str, Any], verdict: str, *,
          result: str | None = None, error: str | None = None, started: float | None = None) -> None:
    """Record a write, exec, refusal or dry run in the audit log (masked; see audit.py)."""
    if SETTINGS.audit_path is None:
        return
    record = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": host.label,
              "product": host.product, "tool": current_call().get("tool"), "method": method, "path": path,
              "params": json.loads(mask(json.dumps(mask_params(params), default=str))), "verdict": verdict}
    if result is not None:
        record["result"] = mask(str(result))
    if error is not None:
        record["error"] = mask(error)[:500]
    if started is not None:
        record["ms"] = int((time.monotonic() - started) * 1000)
    audit_log.append(SETTINGS.audit_path, record)
