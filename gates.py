"""Which gates a call needs: the gate of every API method (a table of rules, first match wins),
and the gates its arguments raise: dangerous values, parts of property strings (host paths and
devices wherever they sit), parameters that delete data (found by name and type in both
schemas), and the secrets a GET returns (derived from the schemas at build time: catalog.py).
policy.py decides with these whether a call is allowed for a host.

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

import re
from functools import lru_cache
from typing import Any, Callable

import catalog
from protection import truthy

TIERS = ("read", "lifecycle", "write", "destructive")
GATES = ("read", "sensitive", "lifecycle", "write", "destructive", "exec", "elevated", "blocked")
GATE_RANK = {gate: rank for rank, gate in enumerate(GATES)}
# the user says yes to these; a blocked method opened by PROXMOX_UNBLOCK too
CONFIRMED = ("destructive", "exec", "elevated", "blocked")


# ================================================================ gate of a method

# First match wins. (methods, path template regex, gate, why). Paths are catalog templates.
METHOD_GATES: list[tuple[str, str, str, str]] = [
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
    ("POST", r"/nodes/\{node\}/status", "elevated",  # docs/PROXMOX-BEHAVIOUR.md#node-power
     "reboots or shuts down the node and every guest on it"),
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
    ("POST", r"/nodes/\{node\}/ceph/osd", "destructive",  # docs/PROXMOX-BEHAVIOUR.md#host-devices-and-paths
     "wipes the devices it is given before creating the OSD"),
    ("POST", r"/nodes/\{node\}/status", "destructive",  # docs/PROXMOX-BEHAVIOUR.md#node-power
     "stops the node's guests that HA does not move away"),
]
# Blocked methods that act inside a guest (its monitor, keyboard, console, a password): opened by
# PROXMOX_UNBLOCK, they count as exec for PROXMOX_EXEC_ALLOWED_VMIDS.
INSIDE_GUEST = (r".*/qemu/\{vmid\}/(monitor|sendkey)|.*/agent/set-user-password"
                r"|.*/(qemu|lxc)/\{vmid\}/(vncproxy|termproxy|spiceproxy|vncwebsocket)")
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
        "reboots every guest of the node: elevated and confirmed, refused while it changes a protected guest",
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
    # snippets are files on the host's storage that only root can place; the API checks no access to
    # them (docs/PROXMOX-BEHAVIOUR.md#cloud-init)
    (r".*/qemu(/\{vmid\}/config)?", r"cicustom", any_value, "elevated",
     "cicustom feeds snippet files from the host's storage into the guest"),
    # a path instead of a volume id: any file of the host (root only; docs/PROXMOX-BEHAVIOUR.md#host-devices-and-paths)
    (r"/nodes/\{node\}/lxc|/nodes/\{node\}/qemu", r"ostemplate|archive", absolute_path, "elevated",
     "a host file as the template or backup to restore"),
]
# Arguments whose absence raises a call's gate, because Proxmox then takes the dangerous value:
# (method, path regex, parameter, unless (the call's params -> bool), gate, why).
MISSING_RULES: list[tuple[str, str, str, Callable[[dict], bool], str, str]] = [
    # a container created without `unprivileged` is privileged before pve-container 6.0 (PVE 8); a
    # restore keeps the backup's own setting (docs/PROXMOX-BEHAVIOUR.md#restore)
    ("POST", r"/nodes/\{node\}/lxc", "unprivileged", lambda p: truthy(p.get("restore", "0")), "elevated",
     "unprivileged left out: a privileged container on PVE 8, root inside is root on the host"),
]
# Parts of property strings (`scsi1: "/dev/sda"`, `mp0: "backup=1,volume=/etc,mp=/mnt"`) that
# raise a call's gate, whatever part of the string they are: (parameter regex, part regex, test,
# gate, why). `file` and `volume` are the disk or mount volume of every disk and mount point
# (docs/PROXMOX-BEHAVIOUR.md#property-strings).
PART_RULES: list[tuple[str, str, Callable[[str], bool], str, str]] = [
    (r".*", r"file|volume", absolute_path, "elevated", "a host path or device as a disk or mount point"),
    (r"cdrom|ide\d+|sata\d+|scsi\d+", r"file", lambda v: v.strip() == "cdrom", "elevated",
     "the node's physical CD/DVD drive"),
    (r".*", r"import-from", absolute_path, "elevated", "imports a file from the host's file system"),
    (r"usb\d+", r"host", lambda v: v.strip().lower() != "spice", "elevated", "passes a host USB device through"),
    (r"usb\d+", r"mapping", any_value, "elevated", "passes a mapped host USB device through"),
    (r"features", r"keyctl|mknod|fuse|force_rw_sys", truthy, "elevated",
     "the container may use host keyrings, device nodes, FUSE or a writable /sys"),
    (r"features", r"mount", any_value, "elevated", "the container may mount file systems"),
    (r"virtiofs\d+", r"dirid", any_value, "elevated", "shares a host directory with the guest"),
]


# Parameters whose schema names their property-string format instead of spelling it out, and the
# parameter of the same method that spells it out: `cdrom` is `ide2` (qemu-server `$confdesc`,
# format 'pve-qm-ide'; docs/PROXMOX-BEHAVIOUR.md#host-devices-and-paths).
NAMED_FORMATS = {"pve-qm-ide": "ide[n]"}


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
    (r"remove-vanished", None, truthy,
     "removes what the source no longer has"),
    (r"remove_job", None, lambda v: v == "full", "also removes the replicated volumes"),
]


@lru_cache(maxsize=None)  # one answer per catalog method; asked for every request
def _rule_for(method: str, template: str) -> tuple[str, str]:
    for methods, pattern, gate, why in METHOD_GATES:
        if (methods == "*" or method in methods.split("|")) and re.fullmatch(pattern, template):
            return gate, why
    raise AssertionError("the last rule matches everything")


@lru_cache(maxsize=None)
def _secret_read(product: str | None, template: str) -> tuple[str, ...]:
    """The secrets a GET returns: its own (derived from the schema at build time: catalog.py), or
    those its item endpoint is gated for (a list carries what its items carry)."""
    products = [product] if product else list(catalog.PRODUCTS)
    for name in products:
        entry = catalog.entry_for(name, "GET", template) or {}
        if entry.get("secrets"):
            return tuple(entry["secrets"])
        for item in catalog.item_templates(name, template):
            if _rule_for("GET", item)[0] == "sensitive" or (catalog.entry_for(name, "GET", item) or {}).get("secrets"):
                return (f"what {item} returns",)
    return ()


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
    return tuple(sorted(kept, key=GATE_RANK.get))


def _argument_gates(template: str, params: dict[str, Any], entry: dict) -> list[tuple[str, str]]:
    """(gate, reason) for every dangerous argument, property-string parts included."""
    raised = []
    for path_pattern, name_pattern, test, gate, why in ARGUMENT_RULES:
        if re.fullmatch(path_pattern, template):
            raised += [(gate, f"{name}: {why}") for name, values in _each(params)
                       if re.fullmatch(name_pattern, name) and any(test(v) for v in values)]
    for name, values in _each(params):
        fmt = (catalog.spec_for(entry.get("params", {}), name) or {}).get("format")
        if isinstance(fmt, str) and fmt in NAMED_FORMATS:
            fmt = (entry.get("params", {}).get(NAMED_FORMATS[fmt]) or {}).get("format")
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
    raised += [(gate, why) for methods, pattern, name, unless, gate, why in MISSING_RULES
               if method == methods and re.fullmatch(pattern, template) and name not in params and not unless(params)]
    gates.update(g for g, _ in raised)
    reasons += [r for _, r in raised]
    return combine(gates), reasons


def inside_guest(template: str) -> bool:
    """Whether a blocked method acts inside a guest (INSIDE_GUEST): exec, for the allow-list."""
    return bool(re.fullmatch(INSIDE_GUEST, template))


def call_gate(method: str, template: str, params: dict[str, Any], product: str = "pve") -> tuple[str, list[str]]:
    """The most severe gate of one call, and why."""
    gates, reasons = call_gates(product, method, template, params)
    return gates[-1], reasons
