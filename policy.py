"""The one admission step every Proxmox request passes, HTTP or SSH.

`admit()` is called by the HTTP client (proxmox_client.request) and by the shell tools before
anything is sent, and runs the same sequence for both:

  1. classify   what the request is: its catalog method, its parameters checked against the
                schema, its gates (the method's, raised by dangerous arguments, nested calls
                and the jobs it runs), the guests it names or reaches, the secrets it returns
  2. judge      gates open for this host, no protected guest reached, the token's privileges,
                the exec allow-list (PROXMOX_EXEC_ALLOWED_VMIDS), no masked secret written back
  3. dry run    the exact request instead of sending it
  4. confirm    destructive, exec and elevated calls: the user is asked when the client can
                ask; confirm=true stands in only for clients that cannot
  5. audit      one line before sending (if it cannot be written, nothing is sent), one after
  6. send       and mask the secrets the answer carries

Refusals raise PolicyError (ConfirmationNeeded when only the user's yes is missing); nothing is
sent then. Which guests a request reaches is protection.py; masking is masking.py; the
hash-chained audit file is audit.py.

Gates, from harmless to dangerous (a call can need several, e.g. elevated + destructive):
  read         GET that returns no secrets
  sensitive    reads that return secrets or guest files        PROXMOX_ALLOW_SENSITIVE
  lifecycle    start, shutdown, reboot, suspend, snapshot, backup  PROXMOX_ACCESS>=lifecycle
  write        create, configure, clone, migrate, move           PROXMOX_ACCESS>=write
  destructive  delete, rollback, hard stop, purge, wipe, prune   PROXMOX_ACCESS=destructive
  exec         commands and file access inside guests           PROXMOX_ALLOW_EXEC
  elevated     reaches the host or the access system           PROXMOX_ALLOW_ELEVATED (+ write)
  blocked      tickets, passwords, TFA, consoles                only by PROXMOX_UNBLOCK
"""
from __future__ import annotations

import contextvars
import posixpath
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable
from urllib.parse import unquote

import audit as audit_log
import catalog
import protection
from errors import ConfirmationNeeded, PolicyError, ToolFailure
from masking import MASK, audit_view, mask, mask_answer, mask_params, register_secret  # noqa: F401 (re-exported)
from protection import Protected, Scope, load_protected, named_guests, truthy  # noqa: F401 (re-exported)

TIERS = ("read", "lifecycle", "write", "destructive")
GATES = ("read", "sensitive", "lifecycle", "write", "destructive", "exec", "elevated", "blocked")
SEVERITY = {gate: rank for rank, gate in enumerate(GATES)}
CONFIRMED = ("destructive", "exec", "elevated")  # the user says yes to these


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
    # exec: commands and file writes inside guests
    ("*", r".*/agent/(exec|exec-status|file-write)", "exec", "runs commands or writes files in a guest"),
    ("POST", r".*/qemu/\{vmid\}/agent", "exec", "runs any guest agent command"),
    # each nested call is classified too (docs/PROXMOX-BEHAVIOUR.md#nested-execute)
    ("POST", r"/nodes/\{node\}/execute", "elevated", "runs API calls in bulk as the node"),
    # sensitive reads (and the GETs whose answers carry secrets: method_gate)
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
    ("GET", r"/nodes/\{node\}/storage/\{storage\}/file-restore/(list|download)", "sensitive",
     "backup contents (docs/PROXMOX-BEHAVIOUR.md#backup-file-restore)"),
    ("GET", r"/nodes/\{node\}/(journal|syslog)", "read", "logs"),
    # reads that make the node connect to a host the caller names (docs/PROXMOX-BEHAVIOUR.md#reads-that-connect-out)
    ("GET", r"/nodes/\{node\}/(query-url-metadata|query-oci-repo-tags|scan/(nfs|cifs|pbs|iscsi))"
            r"|/cluster/acme/(meta|tos)|/config/acme/tos", "write",
     "makes the node connect to a host the caller names"),
    ("GET", r".*", "read", "reads"),
    # elevated: the host, its network, the access system and the cluster itself
    ("*", r"/access/(users|groups|roles|acl|domains).*|/config/access/.*", "elevated",
     "users, tokens, ACLs and realms"),
    ("POST", r"/nodes/\{node\}/status", "elevated", "reboots or shuts down the node and every guest on it"),
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
    ("*", r"/admin/datastore/\{store\}/(prune|prune-datastore)|/admin/prune/\{id\}/run", "destructive",
     "removes backups"),
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
    ("POST", r"/admin/(sync|verify)/\{id\}/run|/admin/datastore/\{store\}/(verify|gc)"
             r"|/nodes/\{node\}/replication/\{id\}/schedule_now", "lifecycle", "runs a job now"),
    # everything else that changes something
    ("*", r".*", "write", "changes configuration or creates things"),
]
# Gates a method needs besides its own: (methods, template regex, gate, why).
ALSO_GATES: list[tuple[str, str, str, str]] = [
    ("GET", r".*/agent/file-read", "exec", "reads through the guest agent, as exec does"),
]
# Reads that follow a confirmed call (judged, but neither confirmed nor audited again): (template regex, why).
FOLLOW_UPS = {r".*/agent/exec-status": "reads the output of an exec the user confirmed"}

# Classifications a reviewer should look at again, with the reason for the choice.
UNCERTAIN: dict[tuple[str, str, str], str] = {
    ("pve", "GET", "/nodes/{node}/query-url-metadata"): "a GET, but the node fetches any URL given: treated as a write",
    ("pve", "GET", "/nodes/{node}/scan/pbs"):
        "a GET, but the node logs in to any server given (scan nfs, cifs, iscsi alike): treated as a write",
    ("pve", "GET", "/cluster/acme/directories"): "a static list of known ACME directories; contacts nobody: read",
    ("pve", "GET", "/nodes/{node}/report"): "not secret by design, but it dumps configuration files: sensitive",
    ("pve", "POST", "/nodes/{node}/vzdump"):
        "a backup prunes per the storage's own retention (remove=1 by default); that retention is the operator's "
        "choice: lifecycle. With its own prune-backups it is destructive",
    ("pve", "POST", "/nodes/{node}/migrateall"):
        "moves every guest of a node: write, refused when it would move a protected guest",
    ("pve", "POST", "/nodes/{node}/status"):
        "reboots every guest of the node, protected ones too: elevated and confirmed, not refused",
    ("pve", "POST", "/nodes/{node}/qemu/{vmid}/template"): "irreversible in practice, but destroys nothing: write",
    ("pve", "PUT", "/cluster/options"): "datacenter-wide settings; none reach the host shell: write",
    ("pve", "GET", "/cluster/config/join"): "join information holds no password but helps an attacker: sensitive",
    ("pbs", "POST", "/admin/datastore/{store}/gc"): "GC frees only chunks no snapshot references: lifecycle",
    ("pbs", "GET", "/config/remote/{name}"): "PBS does not return the password, but the remote's auth id: sensitive",
    ("pve", "POST", "/nodes/{node}/qemu/{vmid}/agent/fsfreeze-freeze"):
        "a frozen filesystem blocks the guest until thawed: lifecycle",
}


def any_value(_value: str) -> bool:
    """An argument rule that holds whatever the value is."""
    return True


def absolute_path(value: str) -> bool:
    return value.strip().startswith("/")


def enabled(value: str) -> bool:
    return value.strip().lower() in ("1", "yes", "on", "true")


# Arguments that raise a call's gate: (path regex, parameter regex, test on the value, gate, why).
ARGUMENT_RULES: list[tuple[str, str, Callable[[str], bool], str, str]] = [
    (r".*", r"hookscript", any_value, "elevated", "a hookscript runs on the host"),
    (r".*/qemu(/\{vmid\}/config)?", r"args", any_value, "elevated", "raw QEMU arguments reach the host"),
    (r".*", r"hostpci\d+|parallel\d+|dev\d+", any_value, "elevated", "host device passthrough"),
    (r".*", r"serial\d+", lambda v: v.startswith("/dev/"), "elevated", "host serial device"),
    (r".*/lxc", r"unprivileged", lambda v: not truthy(v), "elevated",
     "privileged container: root inside is root on the host"),
    (r".*/vzdump|/cluster/backup.*", r"script|dumpdir|tmpdir", any_value, "elevated",
     "runs a script or writes to a host path"),
    (r"/nodes/\{node\}/lxc|/nodes/\{node\}/qemu", r"restore|archive", any_value, "write", "restores a backup"),
]
# Parts of property strings (`scsi1: "/dev/sda"`, `mp0: "backup=1,volume=/etc,mp=/mnt"`) that
# raise a call's gate, whatever part of the string they are: (parameter regex, part regex, test,
# gate, why). `file` and `volume` are the disk or mount volume of every disk and mount point.
PART_RULES: list[tuple[str, str, Callable[[str], bool], str, str]] = [
    (r".*", r"file|volume", absolute_path, "elevated", "a host path or device as a disk or mount point"),
    (r".*", r"import-from", absolute_path, "elevated", "imports a file from the host's file system"),
    (r"usb\d+", r"host", lambda v: v.strip().lower() != "spice", "elevated", "passes a host USB device through"),
    (r"usb\d+", r"mapping", any_value, "elevated", "passes a mapped host USB device through"),
    (r"features", r"keyctl|mknod|fuse|force_rw_sys", enabled, "elevated",
     "the container may use host keyrings, device nodes, FUSE or a writable /sys"),
    (r"features", r"mount", any_value, "elevated", "the container may mount file systems"),
    (r"virtiofs\d+", r"dirid", any_value, "elevated", "shares a host directory with the guest"),
]


def _volume_freeing(value: str) -> bool:
    """`delete=unused0` or `delete=vmstate` frees the volume at once."""
    return any(re.fullmatch(r"unused\d+|vmstate", item) for item in re.split(r"[,;\s]+", value))


# Parameters that delete data, found by name and type in every write method of both schemas (a
# test walks them all): (parameter regex, its type or None for any, test on the value, why). A
# boolean that defaults to true deletes when left out (bulk shutdown's force-stop).
# docs/PROXMOX-BEHAVIOUR.md#parameters-that-delete-data
DELETING_PARAMS: list[tuple[str, str | None, Callable[[str], bool], str]] = [
    (r"purge|destroy-.+|cleanup(-disks)?|remove[-_](pools|storages|ecprofile)|delete-groups", "boolean",
     truthy, "also deletes data"),
    (r"force|force-?stop|forceStop", "boolean", truthy, "forces past a safety check or stops hard"),
    (r"delete", "boolean", truthy, "deletes the source"),  # move_disk, move_volume
    (r"delete", "string", _volume_freeing, "frees the volume (unusedN, vmstate)"),  # config edits
    (r"keep-(last|hourly|daily|weekly|monthly|yearly)", None, any_value,
     "removes the backups its keep rules do not keep"),
    (r"prune-backups", None, lambda v: not re.fullmatch(r"\s*keep-all=(1|yes|on|true)\s*", v), "prunes backups"),
    (r"remove-vanished", None, lambda v: v not in ("", "0", "false", "no", "off"),
     "removes what the source no longer has"),
    (r"remove_job", None, lambda v: v == "full", "also removes the replicated volumes"),
]
# Jobs whose effect is in their stored configuration: a run (or an edit) is judged with it.
# (method, template) -> the job's configuration path; `{id}` is filled from the request.
JOB_CONFIG = {("POST", "/admin/sync/{id}/run"): "/config/sync/{id}",
              ("PUT", "/cluster/backup/{id}"): "/cluster/backup/{id}",
              ("DELETE", "/cluster/backup/{id}"): "/cluster/backup/{id}"}
EXECUTE = "/nodes/{node}/execute"
DELETES_BACKUPS = r"/admin/datastore/\{store\}/prune(-datastore)?|/admin/prune/\{id\}/run"  # by what they are


def _rule_for(method: str, template: str) -> tuple[str, str]:
    for methods, pattern, gate, why in RULES:
        if (methods == "*" or method in methods.split("|")) and re.fullmatch(pattern, template):
            return gate, why
    raise AssertionError("the last rule matches everything")


def _secret_read(product: str | None, template: str) -> list[str]:
    """The secrets a GET returns: its own (derived from the schema at build time: catalog.py), or
    those its item endpoint is gated for (a list carries what its items carry)."""
    products = [product] if product else list(catalog.PRODUCTS)
    for name in products:
        entry = catalog.entry_for(name, "GET", template) or {}
        if entry.get("secrets"):
            return entry["secrets"]
        for item in catalog.item_templates(name, template):
            if _rule_for("GET", item)[0] == "sensitive" or (catalog.entry_for(name, "GET", item) or {}).get("secrets"):
                return [f"what {item} returns"]
    return []


def method_gate(method: str, template: str, product: str | None = None) -> str:
    """The gate of a catalog method, before its arguments are looked at."""
    gate = _rule_for(method, template)[0]
    if method == "GET" and gate == "read" and _secret_read(product, template):
        return "sensitive"
    return gate


def combine(gates: set[str]) -> tuple[str, ...]:
    """The gates a call needs, least severe first: one tier (the highest), plus sensitive, exec
    and elevated; blocked alone."""
    if "blocked" in gates:
        return ("blocked",)
    tiers = [g for g in gates if g in TIERS]
    top = max(tiers, key=TIERS.index) if tiers else "read"
    rest = {g for g in gates if g not in TIERS}
    kept = rest | ({top} if top != "read" or not rest else set())
    return tuple(sorted(kept, key=SEVERITY.get))


def _argument_gates(template: str, params: dict[str, Any], entry: dict) -> list[tuple[str, str]]:
    """(gate, reason) for every dangerous argument, property-string parts included."""
    raised = []
    for path_pattern, name_pattern, test, gate, why in ARGUMENT_RULES:
        if re.fullmatch(path_pattern, template):
            raised += [(gate, f"{name}: {why}") for name, values in _each(params)
                       if re.fullmatch(name_pattern, name) and any(test(v) for v in values)]
    for name, values in _each(params):
        fmt = (catalog.spec_for(entry.get("params", {}), name) or {}).get("format")
        if isinstance(fmt, dict):
            raised += [(gate, f"{name}: {why}") for value in values
                       for gate, why in _part_gates(name, fmt, value)]
    return raised


def _each(params: dict[str, Any]) -> list[tuple[str, list[str]]]:
    return [(name, [str(v) for v in (value if isinstance(value, list) else [value])]) for name, value in params.items()]


def _part_gates(name: str, fmt: dict, value: str) -> list[tuple[str, str]]:
    try:
        parts = list(catalog.parse_property_string(fmt, value).items())
    except ValueError:  # the schema check refuses it; meanwhile every part is judged as a volume
        parts = [("file", part.partition("=")[2] or part) for part in value.split(",")]
    return [(gate, why) for param, part, test, gate, why in PART_RULES if re.fullmatch(param, name)
            for key, sub in parts if re.fullmatch(part, key) and test(sub)]


def deleting(entry: dict, params: dict[str, Any]) -> list[str]:
    """Why a call deletes data, by its parameters (DELETING_PARAMS): given, or a boolean left at a
    default that deletes."""
    reasons = []
    for name, values in _each(params):
        reasons += _deleting(name, catalog.spec_for(entry.get("params", {}), name) or {}, values)
    for name, spec in entry.get("params", {}).items():
        if name not in params and spec.get("type") == "boolean" and truthy(spec.get("default")):
            reasons += [f"{r} (its default)" for r in _deleting(name, spec, [str(spec["default"])])]
    return reasons


def _deleting(name: str, spec: dict, values: list[str]) -> list[str]:
    """The reasons a parameter deletes data; one the schema does not know is judged by name alone."""
    return [f"{name}={value}: {why}" for pattern, kind, test, why in DELETING_PARAMS
            if re.fullmatch(pattern, name) and kind in (None, spec.get("type", kind))
            for value in values[:1] if any(test(v) for v in values)]


def call_gates(product: str, method: str, template: str, params: dict[str, Any]) -> tuple[tuple[str, ...], list[str]]:
    """The gates one call needs and why: the method's, the gates its method also needs, and those
    its arguments raise (dangerous values, parameters that delete data)."""
    gate, why = _rule_for(method, template)
    gates, reasons = {method_gate(method, template, product)}, [why]
    secrets = _secret_read(product, template) if method == "GET" else []
    if secrets:
        reasons.append(f"returns secrets ({', '.join(secrets)})")
    for methods, pattern, also, also_why in ALSO_GATES:
        if (methods == "*" or method in methods.split("|")) and re.fullmatch(pattern, template):
            gates.add(also)
            reasons.append(also_why)
    if method == "GET" or gate == "blocked":
        return combine(gates), reasons
    if template.endswith("/prune") and truthy(params.get("dry-run", "0")):
        return ("read",), ["prune with dry-run only lists what would be removed"]
    entry = catalog.entry_for(product, method, template) or {}
    raised = _argument_gates(template, params, entry) + [("destructive", r) for r in deleting(entry, params)]
    gates.update(g for g, _ in raised)
    reasons += [r for _, r in raised]
    return combine(gates), reasons


def call_gate(method: str, template: str, params: dict[str, Any], product: str = "pve") -> tuple[str, list[str]]:
    """The most severe gate of one call, and why."""
    gates, reasons = call_gates(product, method, template, params)
    return gates[-1], reasons


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


@dataclass
class Settings:
    hosts: dict[tuple[str, str], HostPolicy] = field(default_factory=dict)  # (product, label)
    protected: Protected = field(default_factory=Protected)
    dry_run: bool = False
    elicit: bool = True
    audit_path: Path | None = None
    exec_allowed_vmids: set[int] | None = None  # PROXMOX_EXEC_ALLOWED_VMIDS; None: any guest


SETTINGS = Settings()
# Per call, set by the tool wrapper in server.py: tool name, dry run, the confirmation step, and
# notes for the answer (an audit line that failed after sending). None outside a tool call.
CALL: contextvars.ContextVar[dict | None] = contextvars.ContextVar("call", default=None)


def current_call() -> dict:
    """The running tool call's settings, empty outside a tool call."""
    return CALL.get() or {}


def configure(settings: Settings) -> None:
    global SETTINGS
    SETTINGS = settings


def rules_for(host: Any) -> HostPolicy:
    return SETTINGS.hosts.get((host.product, host.label), HostPolicy())


def writes_enabled(settings: Settings) -> bool:
    """Whether any host may get a request that is audited (anything beyond plain reads)."""
    return any(gate_open(rules, gate) for rules in settings.hosts.values() for gate in GATES[1:-1])


def normalise_path(path: str) -> str:
    """Decode, collapse `//` and resolve `..` so that a path cannot hide from the catalog."""
    decoded = path
    for _ in range(3):  # double-encoded slashes
        decoded = unquote(decoded)
    decoded = decoded.split("?", 1)[0]
    if any(ord(c) < 32 for c in decoded):
        raise PolicyError(f"Path {path!r} contains characters no Proxmox path has.")
    return posixpath.normpath("/" + decoded.strip("/")) if decoded.strip("/") else "/"


# ================================================================ 1. classify

@dataclass
class Decision:
    """What one request is, as the policy judged it."""
    method: str  # HTTP method, or SSH
    path: str  # the concrete path, or what a shell runs
    params: dict[str, Any] = field(default_factory=dict)
    template: str = ""  # catalog template ("" for SSH)
    gates: tuple[str, ...] = ("read",)
    reasons: list[str] = field(default_factory=list)
    guests: list[int] = field(default_factory=list)  # named or reached: protection, exec allow-list
    scope: Scope = field(default_factory=Scope)  # guests reached without being listed
    entry: dict | None = None  # the catalog method (privileges, secrets)
    path_params: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # parameters the schema refuses
    audit_params: dict[str, Any] | None = None  # what the audit line shows instead of `params`

    @property
    def gate(self) -> str:
        return self.gates[-1]

    @property
    def follow_up(self) -> bool:
        return self.method == "GET" and any(re.fullmatch(p, self.template) for p in FOLLOW_UPS)

    @property
    def confirm(self) -> bool:
        """Destructive, exec and elevated calls need the user's yes."""
        return bool(set(self.gates) & set(CONFIRMED)) and not self.follow_up


def shell_decision(what: str, gates: tuple[str, ...], guests: list[int], reason: str,
                   contents: bytes | None = None) -> Decision:
    """A shell command (SSH) as a Decision: the gates it needs and the guests it reaches; file
    contents or stdin are audited as size and hash only."""
    audited = {"contents": contents} if contents is not None else {}
    return Decision("SSH", what, {}, "", combine(set(gates)), [reason], sorted(guests), audit_params=audited)


def classify(host: Any, method: str, path: str, params: dict[str, Any],
             read: Callable[[str], Any] | None = None) -> Decision:
    """Say what a request is; refuse one that is not a valid call of the product's API."""
    method = method.upper()
    clean = normalise_path(path)
    found = catalog.find_path(host.product, clean)
    if found is None:
        raise PolicyError(f"Unknown API path {clean} on {host.product.upper()}: refused. "
                          f"Use api_search to find the right path.")
    template, entries, path_params = found
    if method not in entries:
        raise PolicyError(f"{method} is not a method of {template} (it has {', '.join(sorted(entries))}).")
    entry = entries[method]
    gates, reasons = call_gates(host.product, method, template, params)
    decision = Decision(method, clean, params, template, gates, reasons,
                        sorted(named_guests(host.product, template, path_params, params, entry)), entry=entry,
                        path_params=path_params)
    decision.errors = catalog.check_params(entry, params, path_params=path_params, product=host.product)
    deletes = bool(deleting(entry, params)) or bool(re.fullmatch(DELETES_BACKUPS, template))
    decision.scope = protection.bulk_scope(template, params, deletes)
    if re.fullmatch(protection.BACKUP_SELECTION, template):
        decision.guests = sorted(set(decision.guests) | protection.selection_scope(params, decision.scope))
    if (method, template) in JOB_CONFIG:  # read the job only for a valid call whose own gates are open
        require_gates(host, decision.gates, f"{method} {clean}", reasons, method, template)
        _refuse_invalid(decision)
        _judge_with_job(host, decision, path_params, read)
    if template == EXECUTE and not decision.errors:
        _merge_nested(host, decision, path_params["node"], params.get("commands"))
    return decision


def _judge_with_job(host: Any, decision: Decision, path_params: dict[str, str],
                    read: Callable[[str], Any] | None) -> None:
    """A job edit or run judged with the job as stored: a backup job's guests before and after the
    edit; a sync job run that removes vanished backups deletes them."""
    config_path = re.sub(r"\{([\w-]+)\}", lambda m: path_params[m.group(1)],
                         JOB_CONFIG[(decision.method, decision.template)])
    try:
        stored = read(config_path) if read else None
    except ToolFailure as exc:
        raise PolicyError(f"{decision.method} {decision.path} depends on the job {config_path}, which could not "
                          f"be read ({exc}); nothing was sent.") from None
    stored = stored if isinstance(stored, dict) else {}
    if decision.template == "/cluster/backup/{id}":
        listed = protection.selection_scope(stored, decision.scope)
        if not (stored.get("vmid") or stored.get("pool") or truthy(stored.get("all", "0"))):
            decision.scope.bulk = "edits a backup job whose guests could not be read"
        decision.guests = sorted(set(decision.guests) | listed)
        return
    reasons = deleting(catalog.entry_for(host.product, "PUT", config_path.rsplit("/", 1)[0] + "/{id}") or {}, stored)
    if reasons:
        decision.gates = combine(set(decision.gates) | {"destructive"})
        decision.reasons += [f"the job's {r}" for r in reasons]
        decision.scope.bulk = "removes backups of every group the sync covers"


def _merge_nested(host: Any, decision: Decision, node: str, commands: Any) -> None:
    """POST /nodes/{node}/execute runs each command as an API call on that node
    (docs/PROXMOX-BEHAVIOUR.md#nested-execute): each is classified, and the batch needs all their gates."""
    batch = catalog.command_batch(commands) if isinstance(commands, str) else None
    if batch is None:  # the schema check refuses it first; this is the policy's own guard
        raise PolicyError("execute: `commands` must be a JSON array of {\"method\", \"path\", \"args\"}; "
                          "nothing was sent.")
    for command in batch:
        inner = classify(host, command["method"], f"/nodes/{node}/{command['path'].lstrip('/')}",
                         command.get("args") or {})
        _refuse_invalid(inner)
        decision.gates = combine(set(decision.gates) | set(inner.gates))
        decision.reasons += [f"{inner.method} {inner.path}: {r}" for r in inner.reasons]
        decision.guests = sorted(set(decision.guests) | set(inner.guests))
        decision.scope.bulk = decision.scope.bulk or inner.scope.bulk
        decision.scope.all_except += inner.scope.all_except


# ================================================================ 2. judge

def judge(host: Any, decision: Decision) -> None:
    """Refuse a classified request the operator did not allow."""
    require_gates(host, decision.gates, f"{decision.method} {decision.path}", decision.reasons, decision.method,
                  decision.template)
    _refuse_invalid(decision)
    if decision.gates != ("read",):
        check_protected(host, decision)
    _check_exec_allowed(decision)
    if decision.entry is not None:
        _check_privileges(host, decision.entry, decision.path_params | {
            k: str(v) for k, v in decision.params.items() if isinstance(v, (str, int))})
    if decision.method not in ("GET", "SSH"):
        for name, value in decision.params.items():
            if any(marker in str(value) for marker in (MASK, "**********")):
                raise PolicyError(f"Parameter '{name}' holds a masked value ({MASK}); sending it would "
                                  f"overwrite the real secret. Leave it out to keep the current value.")


def _refuse_invalid(decision: Decision) -> None:
    if decision.errors:
        details = "; ".join(f"{name}: {message}" for name, message in sorted(decision.errors.items()))
        raise PolicyError(f"Invalid parameters for {decision.method} {decision.template}: {details}. Nothing was "
                          f"sent; api_describe shows the accepted parameters.")


def check(host: Any, method: str, path: str, params: dict[str, Any],
          read: Callable[[str], Any] | None = None) -> Decision:
    """Classify and judge one request (steps 1 and 2); raises PolicyError with the reason and
    what would allow it."""
    decision = classify(host, method, path, params, read)
    judge(host, decision)
    return decision


def require_gates(host: Any, gates: tuple[str, ...], what: str, reasons: list[str], method: str = "POST",
                  template: str = "") -> None:
    """Refuse when a gate the call needs is closed for this host, naming the variables that open them."""
    closed = [gate for gate in gates if not gate_open(rules_for(host), gate, method, template)]
    if closed:
        names = " and ".join(f"'{gate}'" for gate in closed)
        raise PolicyError(f"{what} on host '{host.label}' needs the {names} gate{'s' * (len(closed) > 1)} "
                          f"({'; '.join(reasons)}), which {'are' if len(closed) > 1 else 'is'} closed. The operator "
                          f"can open {'them' if len(closed) > 1 else 'it'} with "
                          f"{'; '.join(how_to_open(gate, host.label, host.product) for gate in closed)}.")


def check_protected(host: Any, decision: Decision) -> None:
    """Refuse a request that names a protected guest or reaches guests it does not list on a host
    with protected ones; refuse every guest-changing request while the list is unreadable."""
    if host.product == "pbs" and "destructive" not in decision.gates:
        return  # on PBS only what deletes backups is guarded
    protected, scope = SETTINGS.protected, decision.scope
    if protected.error and (decision.guests or scope.bulk or scope.all_except):
        raise PolicyError(f"The protected-guest list could not be read ({protected.error}), so every "
                          f"request that changes a guest is refused. Fix the file and restart.")
    for vmid in decision.guests:
        entry = protected.find(host.label, vmid, host.product)
        if entry:
            name = f" ({entry['name']})" if entry.get("name") else ""
            raise PolicyError(f"Guest {vmid}{name} is protected on host '{host.label}': "
                              f"{entry.get('reason', 'no reason given')}. This request is refused.")
    for excluded in scope.all_except:
        left = [e for e in protected.for_host(host.label, host.product) if e["vmid"] not in excluded]
        if left:
            raise PolicyError(f"{decision.method} {decision.path} selects all guests (all=1), which includes "
                              f"protected guest {left[0]['vmid']} on host '{host.label}'. Add it to exclude.")
    if scope.bulk and protected.for_host(host.label, host.product):
        raise PolicyError(f"{decision.method} {decision.path} {scope.bulk}, and host '{host.label}' has protected "
                          f"guests. List the guests explicitly, leaving out the protected ones.")


def _check_exec_allowed(decision: Decision) -> None:
    """PROXMOX_EXEC_ALLOWED_VMIDS: exec and guest file access reach only the listed guests."""
    allowed = SETTINGS.exec_allowed_vmids
    if allowed is None or "exec" not in decision.gates:
        return
    for vmid in decision.guests:
        if vmid not in allowed:
            raise PolicyError(f"Guest {vmid} is not in PROXMOX_EXEC_ALLOWED_VMIDS "
                              f"({', '.join(map(str, sorted(allowed)))}): {decision.method} {decision.path} "
                              f"is refused.")


# ================================================================ 3 to 6: dry run, confirmation, audit, send

def admit(host: Any, method: str, path: str, params: dict[str, Any], send: Callable[[Decision], Any], *,
          read: Callable[[str], Any] | None = None, plan: Callable[[Decision], dict] | None = None,
          decision: Decision | None = None) -> Any:
    """The one admission step: classify and judge (or take a shell's `decision`), then dry run,
    confirmation, audit, and `send(decision)`. Reads are neither confirmed nor audited."""
    try:
        decision = decision or classify(host, method, path, params, read)
        judge(host, decision)
    except PolicyError as exc:
        audit(host, method, path, params, "refused", error=str(exc))
        raise
    if decision.gates == ("read",) or decision.follow_up:
        return mask_answer(send(decision), (decision.entry or {}).get("secrets", ()))
    audited = decision.audit_params if decision.audit_params is not None else decision.params
    if current_call().get("dry_run") or SETTINGS.dry_run:
        audit(host, decision.method, decision.path, audited, "dry_run")
        raise DryRun(plan(decision) if plan else default_plan(host, decision))
    try:
        if decision.confirm:
            confirm = current_call().get("confirm")
            if confirm is None:
                raise ConfirmationNeeded(f"{decision.method} {decision.path} is {decision.gate} and needs the "
                                         f"user's confirmation, which this caller cannot give.")
            confirm(host, decision)
    except PolicyError as exc:
        audit(host, decision.method, decision.path, audited, "refused", error=str(exc))
        raise
    return _send_audited(host, decision, audited, send)


def _send_audited(host: Any, decision: Decision, audited: dict[str, Any], send: Callable[[Decision], Any]) -> Any:
    """An audit line before sending (if it cannot be written, nothing is sent), one after (if
    that fails, the answer says so)."""
    try:
        audit(host, decision.method, decision.path, audited, "sending", strict=True)
    except OSError as exc:
        raise PolicyError(f"The audit log {SETTINGS.audit_path} cannot be written ({exc.strerror or exc}); "
                          f"{decision.method} {decision.path} was NOT sent. Fix the file's directory or "
                          f"permissions, or point PROXMOX_AUDIT_LOG elsewhere.") from None
    started = time.monotonic()
    try:
        result = send(decision)
    except ToolFailure as exc:
        _audit_after(host, decision, audited, "failed", error=str(exc), started=started)
        raise
    _audit_after(host, decision, audited, "sent", result=result if isinstance(result, str) else "ok", started=started)
    return mask_answer(result, (decision.entry or {}).get("secrets", ()))


def _audit_after(host: Any, decision: Decision, audited: dict[str, Any], verdict: str, **details: Any) -> None:
    try:
        audit(host, decision.method, decision.path, audited, verdict, strict=True, **details)
    except OSError as exc:
        notes = current_call().setdefault("notes", []) if CALL.get() is not None else []
        notes.append(f"The request was sent ({verdict}), but its audit line could not be written to "
                     f"{SETTINGS.audit_path} ({exc.strerror or exc}).")


def default_plan(host: Any, decision: Decision) -> dict:
    """What a dry run answers when the caller has no richer plan (the shell tools)."""
    return {"dry_run": True, "host": host.label, "run": decision.path, "gate": "+".join(decision.gates),
            "why": decision.reasons, "guests": decision.guests, "needs_confirmation": decision.confirm}


# ================================================================ privileges the token holds

# A built-in role that holds each privilege, for the "grant it with" hint on a 403.
ROLE_FOR_PRIVILEGE = {
    "Sys.Audit": "PVEAuditor", "VM.Audit": "PVEAuditor", "Datastore.Audit": "PVEAuditor",
    "Pool.Audit": "PVEAuditor", "SDN.Audit": "PVEAuditor", "Mapping.Audit": "PVEAuditor",
    "VM.PowerMgmt": "PVEVMUser", "VM.Console": "PVEVMUser", "VM.Backup": "PVEVMUser",
    "VM.Snapshot": "PVEVMAdmin", "VM.Snapshot.Rollback": "PVEVMAdmin", "VM.Clone": "PVEVMAdmin",
    "VM.Allocate": "PVEVMAdmin", "VM.Migrate": "PVEVMAdmin", "VM.Config.Disk": "PVEVMAdmin",
    "VM.Config.CPU": "PVEVMAdmin", "VM.Config.Memory": "PVEVMAdmin", "VM.Config.Network": "PVEVMAdmin",
    "VM.Config.Options": "PVEVMAdmin", "VM.Config.HWType": "PVEVMAdmin", "VM.Config.Cloudinit": "PVEVMAdmin",
    "VM.Config.CDROM": "PVEVMAdmin", "VM.GuestAgent.Audit": "PVEVMAdmin",
    "Datastore.AllocateSpace": "PVEDatastoreUser", "Datastore.Allocate": "PVEDatastoreAdmin",
    "Datastore.AllocateTemplate": "PVEDatastoreAdmin", "Sys.Modify": "PVESysAdmin",
    "Sys.PowerMgmt": "PVESysAdmin", "Sys.Console": "PVESysAdmin", "SDN.Use": "PVESDNUser",
}



# (product, label, token id) -> {path: {privilege: propagate flag}}, from GET /access/permissions
PERMISSIONS: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {}


def permissions_of(host: Any) -> dict[str, dict[str, Any]] | None:
    return PERMISSIONS.get((host.product, host.label, host.token_id))


def set_permissions(host: Any, permissions: dict[str, dict[str, Any]]) -> None:
    PERMISSIONS[(host.product, host.label, host.token_id)] = permissions


def holds(host: Any, privilege: str, acl_path: str) -> bool | None:
    """Whether the token holds a privilege on a path; None when it cannot be told (not loaded,
    or pool ACLs that may grant it)."""
    permissions = permissions_of(host)
    if permissions is None:
        return None
    parts = [p for p in acl_path.split("/") if p]
    for depth in range(len(parts), -1, -1):
        level = "/" + "/".join(parts[:depth])
        privileges = permissions.get(level)
        if privileges and privilege in privileges:
            flag = privileges[privilege]
            # PVE: the number is the propagate flag, so 0 is still held on that exact path
            if depth == len(parts) or flag in (1, True):
                return True
    if any(path.startswith(("/pool", "/pools")) for path in permissions):
        return None
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
    privileges = check[2]
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


def grant_hint(host: Any, privileges: str, acl_path: str) -> str:
    """The command that grants a missing privilege, and the privsep reminder."""
    first = privileges.split("|")[0]
    if host.product == "pbs":
        grant = f"proxmox-backup-manager acl update {acl_path} <role with {first}> --auth-id '{host.token_id}'"
    else:
        role = ROLE_FOR_PRIVILEGE.get(first, f"<a role with {first}>")
        grant = f"pveum acl modify {acl_path} --tokens '{host.token_id}' --roles {role}"
    return (f"Grant it with: {grant}. A privilege-separated token needs the ACL on the token itself, "
            f"not only on its user.")




# ================================================================ audit

def audit(host: Any, method: str, path: str, params: dict[str, Any], verdict: str, *, strict: bool = False,
          result: str | None = None, error: str | None = None, started: float | None = None) -> None:
    """Record a write, exec, refusal or dry run in the audit log: masked, contents as size and
    hash (see audit.py for the file). With `strict` a failure to write raises OSError."""
    if SETTINGS.audit_path is None:
        return
    record = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": host.label,
              "product": host.product, "tool": current_call().get("tool"), "method": method, "path": mask(path),
              "params": audit_view(params), "verdict": verdict}
    if result is not None:
        record["result"] = mask(str(result))
    if error is not None:
        record["error"] = mask(error)[:500]
    if started is not None:
        record["ms"] = int((time.monotonic() - started) * 1000)
    try:
        audit_log.append(SETTINGS.audit_path, record)
    except OSError:
        if strict:
            raise
