"""Proxmox VE guests: the handlers that act on one VM or container: power and HA requests,
config and pending changes, snapshots, backups, clones, migration, create and restore,
templates, deletion, the guest agent. `pve.py` puts them in `PVE_HANDLERS`.
"""
from __future__ import annotations

import re
import time
from typing import Callable

from .call import ApiError, Call, _guest, _node
from .lab import GiB, format_size, size_bytes
from .pve_cloudinit import FAST_PLUG, hide_password, record_change, stored_password
from .pve_ha_manager import ha_migrate, ha_request, power_effect, resumes
from .pve_history import (UNUSED, cannot_snapshot, cleanup_pending, rollback_blocked, set_option, snapshot_of,
                          snapshot_section)
from .pve_templates import OCI_LOG, lxc_create, oci_config


# ---- guest power: async tasks that fail later, as the real ones do (docs/PROXMOX-BEHAVIOUR.md#power-and-locks)

TASK_TYPE = {("qemu", "suspend"): "qmpause"}  # the rest: qm<action> / vz<action>


def _refused_before_task(kind: str, action: str, guest: dict, call: Call) -> str | None:
    """The checks the API handler makes before it forks a worker: a 500 with nothing started
    (qemu-server API2/Qemu.pm vm_shutdown/vm_reboot/vm_reset/vm_suspend/vm_resume, pve-container
    API2/LXC/Status.pm; docs/PROXMOX-BEHAVIOUR.md#power-and-locks)."""
    vmid, running, paused = guest["vmid"], guest["status"] == "running", guest["paused"]
    if kind == "qemu":
        if (action == "reboot" and paused) or (action == "shutdown" and paused
                                               and str(call.arg("forceStop", "0")) != "1"):
            return "VM is paused - cannot shutdown"
        if action in ("reboot", "reset", "suspend", "resume") and not running:
            return f"VM {vmid} not running"
        return None
    if action in ("start", "resume") and running and not paused:
        return f"CT {vmid} already running"
    if action in ("stop", "shutdown", "suspend") and not running:
        return f"CT {vmid} not running"
    if action == "reboot" and not running:
        return f"VM {vmid} not running"  # sic: pve-container's reboot says VM
    return None


def _in_task_error(kind: str, action: str, guest: dict, call: Call) -> str:
    label = "VM" if kind == "qemu" else "CT"
    if guest["lock"] and str(call.arg("skiplock", "0")) != "1" and not resumes(action, guest):
        return f"{label} is locked ({guest['lock']})"
    if action == "start" and guest["status"] == "running":
        return f"{label} {guest['vmid']} already running"
    return "OK"  # stopping or shutting down a stopped VM ends OK (qemu-server QemuServer.pm vm_stop)


def pve_power(kind: str, action: str) -> Callable:
    task_type = TASK_TYPE.get((kind, action), f"{'qm' if kind == 'qemu' else 'vz'}{action}")

    def handler(call: Call, node: str, vmid: str) -> str:
        guest = _guest(call, node, vmid, kind)
        refused = _refused_before_task(kind, action, guest, call)
        if refused:
            raise ApiError(500, refused)
        if guest.get("ha") and action in ("start", "stop", "shutdown"):
            return ha_request(call, node, kind, action, guest)
        return call.lab.start_task(node, task_type, vmid, user=call.token_id,
                                   exitstatus=_in_task_error(kind, action, guest, call),
                                   on_done=power_effect(call.lab, guest, action))
    return handler


def pve_snapshots(kind: str) -> Callable:
    def handler(call: Call, node: str, vmid: str) -> list:
        guest = _guest(call, node, vmid, kind)
        rows = [{k: v for k, v in snap.items() if not k.startswith("_")} for snap in guest["snapshots"]]
        parent = guest["config"].get("parent") or (rows[-1]["name"] if rows else None)
        current = {"name": "current", "description": "You are here!", "running": int(guest["status"] == "running")}
        if parent:
            current["parent"] = parent
        return rows + [current]
    return handler


def pve_snapshot_create(kind: str) -> Callable:
    def handler(call: Call, node: str, vmid: str) -> str:
        guest = _guest(call, node, vmid, kind)
        name = call.arg("snapname")
        # in the task, in this order (pve-guest-common AbstractConfig.pm __snapshot_prepare;
        # docs/PROXMOX-BEHAVIOUR.md#snapshots-and-rollback)
        error = "OK"
        if guest["template"]:
            error = "you can't take a snapshot if it's a template"
        elif guest["lock"]:
            error = f"{'VM' if kind == 'qemu' else 'CT'} is locked ({guest['lock']})"
        elif any(s["name"] == name for s in guest["snapshots"]):
            error = f"snapshot name '{name}' already used"
        else:
            error = cannot_snapshot(call, guest["config"]) or "OK"

        def apply() -> None:
            snap = {"name": name, "snaptime": int(time.time()), "description": call.arg("description", ""),
                    "_config": snapshot_of(guest["config"])}
            parent = guest["config"].get("parent") or (guest["snapshots"][-1]["name"] if guest["snapshots"] else None)
            if parent:
                snap["parent"] = parent
            if kind == "qemu" and str(call.arg("vmstate", "0")) == "1":
                snap["vmstate"] = 1
            guest["snapshots"].append(snap)
            guest["config"] |= {"parent": name, "digest": call.lab._digest(guest["vmid"])}  # the new "current" parent
        return call.lab.start_task(node, "qmsnapshot" if kind == "qemu" else "vzsnapshot", vmid,
                                   user=call.token_id, exitstatus=error, on_done=apply)
    return handler


def _has_snapshot(guest: dict, snapname: str) -> bool:
    return any(s["name"] == snapname for s in guest["snapshots"])


def pve_snapshot_delete(kind: str) -> Callable:
    def handler(call: Call, node: str, vmid: str, snapname: str) -> str:
        guest = _guest(call, node, vmid, kind)
        if not _has_snapshot(guest, snapname):
            raise ApiError(500, f"snapshot '{snapname}' does not exist")

        def apply() -> None:
            # what named it as parent takes its parent (pve-guest-common AbstractConfig.pm snapshot_delete)
            gone = next(s for s in guest["snapshots"] if s["name"] == snapname)
            guest["snapshots"] = [s for s in guest["snapshots"] if s["name"] != snapname]
            for holder in [*guest["snapshots"], guest["config"]]:
                if holder.get("parent") == snapname:
                    if gone.get("parent"):
                        holder["parent"] = gone["parent"]
                    else:
                        holder.pop("parent")
        return call.lab.start_task(node, "qmdelsnapshot" if kind == "qemu" else "vzdelsnapshot", vmid,
                                   user=call.token_id, on_done=apply)
    return handler


# ---- guest changes: config, disks, snapshots, backups, clones, migration, templates, deletion

def _locked(guest: dict, kind: str) -> str | None:
    return f"{'VM' if kind == 'qemu' else 'CT'} is locked ({guest['lock']})" if guest["lock"] else None


def pve_guest_config(kind: str) -> Callable:
    """GET config: pending values taken in unless current=1; a snapshot's section with `snapshot`
    (docs/PROXMOX-BEHAVIOUR.md#pending-config, #snapshots)."""
    def handler(call: Call, node: str, vmid: str) -> dict:
        guest = _guest(call, node, vmid, kind)
        if call.arg("snapshot"):
            return snapshot_section(guest, str(call.arg("snapshot"))) | {"digest": guest["config"]["digest"]}
        config = dict(guest["config"])
        if str(call.arg("current", "0")) != "1":
            for key, value in guest["pending"].items():
                if value is None:
                    config.pop(key, None)
                else:
                    config[key] = value
        return hide_password(config) if kind == "qemu" else config
    return handler


def pve_guest_pending(kind: str) -> Callable:
    """GET pending: every key with its current `value`, and `pending` or `delete` where a change
    waits for the next start (docs/PROXMOX-BEHAVIOUR.md#pending-config)."""
    def handler(call: Call, node: str, vmid: str) -> list:
        guest = _guest(call, node, vmid, kind)
        rows = []
        for key, value in guest["config"].items():
            row = {"key": key, "value": value}
            if key in guest["pending"]:
                row |= {"delete": 1} if guest["pending"][key] is None else {"pending": guest["pending"][key]}
            rows.append(row)
        rows += [{"key": key, "pending": value} for key, value in guest["pending"].items()
                 if key not in guest["config"] and value is not None]
        return hide_password(rows) if kind == "qemu" else rows
    return handler


# Options a running guest takes at once; everything else waits in `pending` for the next start
# (docs/PROXMOX-BEHAVIOUR.md#pending-config): qemu-server QemuServer.pm ($fast_plug_option,
# vmconfig_hotplug_pending with the default hotplug "network,disk,usb"), pve-container
# LXC/Config.pm ($LXC_FASTPLUG_OPTIONS, vmconfig_hotplug_pending).
HOTPLUG = {
    "qemu": re.compile(r"description|hookscript|lock|migrate_downtime|migrate_speed|name|onboot|protection"
                       r"|shares|startup|tags|vmstatestorage|cpuunits|cpulimit|agent|balloon"),
    "lxc": re.compile(r"description|onboot|startup|protection|hostname|hookscript|cores|tags|lock|cpulimit"
                      r"|cpuunits|memory|swap|net\d+|mp\d+|dev\d+"),
}
QEMU_HOTPLUG_FEATURE = (("network", re.compile(r"net\d+")), ("usb", re.compile(r"usb\d+|tablet")),
                        ("disk", re.compile(r"(scsi|virtio|sata|ide)\d+")), ("memory", re.compile(r"memory")),
                        ("cpu", re.compile(r"vcpus")))
CONFIG_CALL_KEYS = ("delete", "digest", "skiplock", "revert", "background_delay", "node", "vmid")


def _hot_pluggable(kind: str, guest: dict, key: str) -> bool:
    if HOTPLUG[kind].fullmatch(key) or (kind == "qemu" and FAST_PLUG.fullmatch(key)):
        return True
    if kind != "qemu":
        return False
    features = str(guest["config"].get("hotplug", "network,disk,usb"))
    features = "network,disk,usb" if features == "1" else features
    return any(name in features.split(",") and pattern.fullmatch(key) for name, pattern in QEMU_HOTPLUG_FEATURE)


DIGEST_MISMATCH = {"qemu": "checksum mismatch (file change by other user?)",
                   "lxc": "detected modified configuration - file changed by other user? Try again."}
QEMU_DRIVE = re.compile(r"(ide|sata|scsi|virtio)\d+|efidisk0|tpmstate0")


def protection_set(guest: dict) -> bool:
    """PVE's own `protection` option (docs/PROXMOX-BEHAVIOUR.md#the-protection-flag)."""
    return str(guest["config"].get("protection", "0")).strip().lower() in ("1", "true", "yes", "on")


def _protection_refusal(kind: str, guest: dict, deleted: list[str], changed: dict) -> str | None:
    """What a config update refuses while the protection flag is set: removing a disk (qemu-server
    API2/Qemu.pm update_vm_api: unusedN, a drive, vmstate; pve-container LXC/Config.pm
    update_pct_config: unusedN, mpN deleted, mpN or rootfs changed). `PVE::AbstractConfig::check_protection`
    appends ' - protection mode enabled'. The flag is taken off in a request of its own first."""
    if not protection_set(guest):
        return None
    config, vmid = guest["config"], guest["vmid"]
    for key in deleted:
        if kind == "qemu" and UNUSED.fullmatch(key):
            return f"can't remove unused disk '{str(config.get(key, '')).split(',')[0]}' - protection mode enabled"
        if kind == "qemu" and key == "vmstate":
            return f"can't remove vmstate '{config.get(key, '')}' - protection mode enabled"
        if kind == "qemu" and QEMU_DRIVE.fullmatch(key):
            return f"can't remove drive '{key}' - protection mode enabled"
        if kind == "lxc" and (UNUSED.fullmatch(key) or re.fullmatch(r"mp\d+", key)):
            return f"can't remove CT {vmid} drive '{key}' - protection mode enabled"
    changed_drive = next((key for key in changed if kind == "lxc" and re.fullmatch(r"mp\d+|rootfs", key)), None)
    return f"can't update CT {vmid} drive '{changed_drive}' - protection mode enabled" if changed_drive else None


def pve_config_update(kind: str) -> Callable:
    def handler(call: Call, node: str, vmid: str) -> None:
        guest = _guest(call, node, vmid, kind)
        config = guest["config"]
        if call.arg("digest") and call.arg("digest") != config["digest"]:
            raise ApiError(500, DIGEST_MISMATCH[kind])
        if _locked(guest, kind) and str(call.arg("skiplock", "0")) != "1":
            raise ApiError(500, _locked(guest, kind))
        changes: dict[str, object] = {key: None for key in re.split(r"[,;\s]+", str(call.arg("delete", ""))) if key}
        changes |= {key: value[0] if isinstance(value, list) and len(value) == 1 else value
                    for key, value in call.params.items() if key not in CONFIG_CALL_KEYS}
        refused = _protection_refusal(kind, guest, [k for k, v in changes.items() if v is None],
                                      {k: v for k, v in changes.items() if v is not None})
        if refused:
            raise ApiError(500, refused)
        if "cipassword" in changes and changes["cipassword"] is not None:
            changes["cipassword"] = stored_password(changes["cipassword"])
        running = guest["status"] == "running"
        for key, value in changes.items():
            if running and not _hot_pluggable(kind, guest, key):
                guest["pending"][key] = value
                continue
            if running and kind == "qemu":  # the drive keeps the old value (docs/PROXMOX-BEHAVIOUR.md#cloud-init)
                record_change(guest, key, config.get(key), value)
            guest["pending"].pop(key, None)
            set_option(guest, key, value)
        cleanup_pending(guest)
        if "name" in config or "hostname" in config:
            guest["name"] = config.get("name") or config.get("hostname")
        if config.get("tags"):
            config["tags"] = normal_tags(config["tags"])
        guest["tags"] = config.get("tags", "")
        config["digest"] = call.lab._digest(int(vmid))
    return handler


def pve_resize(kind: str) -> Callable:
    def handler(call: Call, node: str, vmid: str) -> str:
        guest = _guest(call, node, vmid, kind)
        disk, size = call.arg("disk"), str(call.arg("size"))
        value = guest["config"].get(disk)
        if value is None:
            raise ApiError(500, f"disk '{disk}' does not exist")
        current = size_bytes(value)
        wanted = current + int(size[1:-1]) * GiB if size.startswith("+") else int(size.rstrip("G")) * GiB
        if wanted < current:
            raise ApiError(500, "shrinking disks is not supported")

        def apply() -> None:
            guest["config"][disk] = re.sub(r"size=[\d.]+[KMGT]?", f"size={format_size(wanted)}", guest["config"][disk])
            guest["maxdisk"] = wanted
        return call.lab.start_task(node, "resize", vmid, user=call.token_id, exitstatus=_locked(guest, kind) or "OK",
                                   on_done=apply)
    return handler


def pve_rollback(kind: str) -> Callable:
    """A rollback stops the guest; it runs again afterwards only when the snapshot holds RAM (VMs) or
    `start=1` was given (docs/PROXMOX-BEHAVIOUR.md#snapshots-and-rollback)."""
    def handler(call: Call, node: str, vmid: str, snapname: str) -> str:
        guest = _guest(call, node, vmid, kind)
        if not _has_snapshot(guest, snapname):
            raise ApiError(500, f"snapshot '{snapname}' does not exist")
        start = str(call.arg("start", "0")) == "1"
        if start and kind == "qemu" and not call.can(f"/vms/{vmid}", "VM.PowerMgmt"):
            raise ApiError(403, f"Permission check failed (/vms/{vmid}, VM.PowerMgmt)")
        error = _locked(guest, kind) or rollback_blocked(call, guest, snapname) or "OK"
        return call.lab.start_task(node, "qmrollback" if kind == "qemu" else "vzrollback", vmid, user=call.token_id,
                                   exitstatus=error, lock=(guest, "rollback"),
                                   on_done=_rolled_back(call, guest, snapname, start))
    return handler


def _rolled_back(call: Call, guest: dict, snapname: str, start: bool) -> Callable[[], None]:
    """The guest is stopped, its config becomes the snapshot's (keeping its description and unused
    disks), `parent` names the snapshot, pending changes are gone; it runs again only from a RAM
    snapshot or with start=1 (pve-guest-common AbstractConfig.pm snapshot_rollback,
    __snapshot_apply_config; docs/PROXMOX-BEHAVIOUR.md#snapshots-and-rollback)."""
    def apply() -> None:
        snap = next(s for s in guest["snapshots"] if s["name"] == snapname)
        kept = {k: v for k, v in guest["config"].items() if UNUSED.fullmatch(k) or k == "description"}
        config = kept | snapshot_of(snap.get("_config") or guest["config"])
        config |= {"parent": snapname, "digest": call.lab._digest(guest["vmid"])}
        guest["config"], guest["pending"] = config, {}
        running = start or bool(snap.get("vmstate"))
        guest["status"], guest["paused"] = ("running" if running else "stopped"), False
        guest["uptime"] = 1 if running else 0
    return apply


# The create parameters the simulated guest keeps in its config.
CREATE_KEEPS = re.compile(r"(net|ipconfig|scsi|ide|sata|virtio|mp)\d+|ciuser|sshkeys|nameserver|tags|ostype|rootfs"
                          r"|unprivileged|description|features|onboot|searchdomain|ciupgrade|cicustom|citype|cpu"
                          r"|machine|bios|scsihw|boot|efidisk0|tpmstate0")
DISK_KEY = re.compile(r"(scsi|virtio|sata|ide|efidisk|tpmstate|mp)\d+|rootfs")
MAC = re.compile(r"(?i)\b([0-9a-f]{2}:){5}[0-9a-f]{2}\b")


def _volume_storages(guest: dict) -> list[str]:
    """The storages of a guest's volumes, CD-ROM images included (`none` and `cdrom` are no volume)."""
    found = []
    for key, value in guest["config"].items():
        volume = str(value).split(",")[0]
        if DISK_KEY.fullmatch(key) and ":" in volume:
            found.append(volume.split(":")[0])
    return found


def _shared(call: Call, storage: str) -> bool:
    return bool(call.lab.storages.get(storage, {}).get("shared"))


def _new_macs(call: Call, config: dict) -> dict:
    """Every NIC with a fresh random MAC address, as clones and `unique` restores get."""
    def fresh(_match: re.Match) -> str:
        return "BC:24:11:" + ":".join(f"{call.lab.random.randrange(256):02X}" for _ in range(3))
    return {k: MAC.sub(fresh, str(v)) if re.fullmatch(r"net\d+", k) else v for k, v in config.items()}


def _allocate_disks(call: Call, vmid: int, params: dict) -> dict:
    """`<storage>:<GiB>` becomes a new volume of that size; `<storage>:0,import-from=<volid>` one the
    size of the source image (docs/PROXMOX-BEHAVIOUR.md#downloads-and-imports)."""
    disks = {}
    for index, key in enumerate(k for k in sorted(params) if DISK_KEY.fullmatch(k)):
        value = str(params[key][0] if isinstance(params[key], list) else params[key])
        parts = value.split(",")
        match = re.fullmatch(r"([\w.-]+):(\d+(?:\.\d+)?)", parts[0])
        if not match:
            continue
        options = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
        size = int(float(match.group(2)) * GiB)
        source = options.pop("import-from", None)
        if source:  # the source image's own size, written as format_size does (2252M)
            found = [v for v in call.lab.volumes.get(source.split(":")[0], []) if v["volid"] == source]
            size = found[0]["size"] if found else 2 * GiB
        disks[key] = ",".join([f"{match.group(1)}:vm-{vmid}-disk-{index}", *(f"{k}={v}" for k, v in options.items()),
                               f"size={format_size(size)}"])
    return disks


def _archive_here(call: Call, archive: str, node: str) -> bool:
    storage = archive.split(":")[0]
    if call.lab.storages.get(storage, {}).get("type") == "pbs":
        return True
    return any(v["volid"] == archive and v.get("_node", node) == node for v in call.lab.volumes.get(storage, []))


def _restored_source(call: Call, archive: str) -> dict | None:
    match = re.search(r"vzdump-(?:qemu|lxc)-(\d+)-|/(?:vm|ct)/(\d+)/", archive)
    return call.lab.guests.get(int(match.group(1) or match.group(2))) if match else None


def _check_ct_storages(call: Call, node: str) -> None:
    """A container's volumes go to storages with `rootdir` content: those `rootfs`/`mpN` name, or
    `storage` (default `local`) when only sizes or nothing is given; else a 400 before any task
    (pve-container API2/LXC.pm create_vm; docs/PROXMOX-BEHAVIOUR.md#a-fresh-install)."""
    named = [str(v).split(",")[0].split(":")[0] for k, v in call.params.items()
             if re.fullmatch(r"rootfs|mp\d+", k) and ":" in str(v).split(",")[0]]
    for sid in named or [call.arg("storage", "local")]:
        entry = call.lab.storages.get(sid)
        if entry is None or node not in call.lab.storage_nodes(entry):
            raise ApiError(500, f"storage '{sid}' is not available on node '{node}'")
        if "rootdir" not in entry["content"].split(","):
            raise ApiError(400, "Parameter verification failed.",
                           {"storage": f"storage '{sid}' does not support container directories"})


def normal_tags(tags: object) -> str:
    """Tags as PVE stores them: split at `;`, `,` or white space, lower case, sorted, each once
    (pve-guest-common src/PVE/GuestHelpers.pm get_unique_tags, default tag-style)."""
    return ";".join(sorted({t.lower() for t in re.split(r"[;,\s]+", str(tags)) if t}))


def _configure_created(call: Call, guest: dict, restored: bool, volumes: dict) -> None:
    """A created guest's config: the parameters it keeps and its new volumes; a restore also keeps the
    backed-up MAC addresses unless unique=1 (docs/PROXMOX-BEHAVIOUR.md#restore)."""
    if not restored:  # a new guest has the disks it was given, not the lab's defaults
        for key in [k for k in guest["config"] if DISK_KEY.fullmatch(k) or k == "boot"]:
            guest["config"].pop(key)
    for key, value in call.params.items():
        if CREATE_KEEPS.fullmatch(key):
            guest["config"][key] = value
    guest["config"] |= volumes
    if guest["config"].get("tags"):
        guest["config"]["tags"] = guest["tags"] = normal_tags(guest["config"]["tags"])
    sizes = [size_bytes(str(v)) for k, v in volumes.items() if not k.startswith(("efidisk", "tpmstate"))]
    guest["maxdisk"] = next((size for size in sizes if size), guest["maxdisk"])


def pve_create(kind: str) -> Callable:
    """Create a guest, or restore one from a backup archive (qemu: archive=, lxc: restore=1)."""
    def handler(call: Call, node: str) -> str:
        _node(call, node)
        vmid = int(call.arg("vmid"))
        label = "VM" if kind == "qemu" else "CT"
        if kind == "qemu":
            archive = call.arg("archive")
        else:
            archive = call.arg("ostemplate") if str(call.arg("restore", "0")) == "1" else None
        exists = vmid in call.lab.guests
        if exists and not (archive and str(call.arg("force", "0")) == "1"):
            raise ApiError(500, f"unable to create {label} {vmid}: config file already exists")
        if exists and protection_set(call.lab.guests[vmid]):  # restore over it (qemu-server create_vm, pve-container)
            raise ApiError(500, f"unable to restore {label} {vmid} -{' -' * (kind == 'qemu')} protection mode enabled")
        oci = lxc_create(call, archive) if kind == "lxc" else None  # refuses what create_vm refuses
        missing = archive and not _archive_here(call, archive, node)
        if missing and kind == "qemu":  # a backup on another node's `local` is not here
            raise ApiError(500, f"can't find file '{archive}'")  # docs/PROXMOX-BEHAVIOUR.md#restore
        if kind == "lxc":
            _check_ct_storages(call, node)
        name = call.arg("name") or call.arg("hostname") or f"{'vm' if kind == 'qemu' else 'ct'}{vmid}"
        disks = _allocate_disks(call, vmid, call.params)
        if kind == "lxc" and archive and "rootfs" not in disks:  # restored onto `storage` (default local)
            size = (_restored_source(call, archive) or {}).get("maxdisk", 8 * GiB) // GiB
            disks["rootfs"] = f"{call.arg('storage', 'local')}:vm-{vmid}-disk-0,size={size}G"
        source = _restored_source(call, archive) if archive else None
        nics = {k: v for k, v in (source or {}).get("config", {}).items() if re.fullmatch(r"net\d+", k)}
        if str(call.arg("unique", "0")) == "1":
            nics = _new_macs(call, nics)

        def apply() -> None:
            memory_mib = int(str(call.arg("memory", 2048)).split(",")[0].split("=")[-1])
            guest = call.lab.add_guest(vmid, kind, node, name, memory_mib=memory_mib, cores=int(call.arg("cores", 1)))
            _configure_created(call, guest, bool(archive), disks | nics)
            if oci:  # an application image brings its entry point (docs/PROXMOX-BEHAVIOUR.md#templates-and-oci-images)
                guest["config"] |= oci_config(guest["config"])
            if str(call.arg("start", "0")) == "1":
                guest["status"] = "running"
        prefix = "qm" if kind == "qemu" else "vz"
        lines = [f"restore {archive}"] + [f"progress {p}%" for p in (25, 50, 75, 100)] if archive else None
        lines = OCI_LOG if oci else lines
        return call.lab.start_task(node, f"{prefix}{'restore' if archive else 'create'}", str(vmid),
                                   user=call.token_id, lines=lines, on_done=apply,
                                   exitstatus=f"can't find file '{archive}'" if missing else "OK")
    return handler


def _clone_refusal(call: Call, kind: str, source: dict, target: str | None, full: bool) -> str | None:
    """What clone_vm dies with before its worker starts (docs/PROXMOX-BEHAVIOUR.md#clone)."""
    label = "VM" if kind == "qemu" else "CT"
    storage, snapname = call.arg("storage"), call.arg("snapname")
    if storage and target and not _shared(call, storage):
        return f"can't clone to non-shared storage '{storage}'"
    if storage and not full:
        return "parameter 'storage' not allowed for linked clones"
    if snapname and not _has_snapshot(source, snapname):
        return f"snapshot '{snapname}' does not exist"
    if kind == "lxc" and full and source["status"] == "running" and not snapname:
        return "Full clone of a running container is only possible from a snapshot"
    # qemu judges the source's volumes; a container the volumes as they will be (on `storage` if given)
    storages = _volume_storages(source) if kind == "qemu" or not storage else [storage]
    if target and not all(_shared(call, s) for s in storages):
        return f"can't clone {label} to node '{target}' ({label} uses local storage)"
    return None


def pve_clone(kind: str) -> Callable:
    def handler(call: Call, node: str, vmid: str) -> str:
        source = _guest(call, node, vmid, kind)
        newid = int(call.arg("newid"))
        label = "VM" if kind == "qemu" else "CT"
        target = call.arg("target")
        target = None if target in (node, "localhost") else target
        if target:
            _node(call, target)
        full = str(call.arg("full")) == "1" if call.arg("full") is not None else not source["template"]
        refused = _clone_refusal(call, kind, source, target, full)
        if refused:
            raise ApiError(500, refused)
        if newid in call.lab.guests:
            raise ApiError(500, f"unable to create {label} {newid}: config file already exists")
        name = call.arg("name") or call.arg("hostname") or f"copy-of-{source['name']}"

        def apply() -> None:
            clone = call.lab.add_guest(newid, kind, target or node, name)
            config = {k: v for k, v in source["config"].items() if k not in ("digest", "template")}
            clone["config"] = _new_macs(call, config) | {  # a clone always gets new MACs
                "digest": call.lab._digest(newid), ("name" if kind == "qemu" else "hostname"): name}
            clone["config"] |= _own_volumes(config, newid, call.arg("storage"))
        how = "full" if full else "linked"
        lines = [f"create {how} clone of drive scsi0 (local-lvm:vm-{vmid}-disk-0)"] + \
            [f"transferred {p * 32 // 100}.0 GiB of 32.0 GiB ({p}.00%)" for p in (20, 40, 60, 80, 100)]
        return call.lab.start_task(node, "qmclone" if kind == "qemu" else "vzclone", vmid, user=call.token_id,
                                   lines=lines, exitstatus=_locked(source, kind) or "OK", on_done=apply,
                                   lock=(source, "clone"))
    return handler


def _storage_map(value: str | None) -> dict[str, str]:
    """targetstorage: one storage for all, `src:dst` pairs, or `1` for each to itself."""
    if not value or value == "1":
        return {}
    pairs = [p.split(":", 1) for p in value.split(",")]
    return {src: dst for src, dst in pairs} if all(len(p) == 2 for p in pairs) else {"*": value}


def _migrate_refusal(call: Call, kind: str, guest: dict, target: str, node: str) -> ApiError | None:
    """What migrate_vm refuses before any task (docs/PROXMOX-BEHAVIOUR.md#migrate)."""
    running = guest["status"] == "running"
    if target == node:
        return ApiError(400, "Parameter verification failed.", {"target": "target is local node."})
    if kind == "lxc":
        if running and str(call.arg("online", "0")) != "1" and str(call.arg("restart", "0")) != "1":
            return ApiError(500, "can't migrate running container without --online or --restart")
        return None
    if _locked(guest, kind):
        return ApiError(500, _locked(guest, kind))
    if running and str(call.arg("online", "0")) != "1":
        return ApiError(500, "can't migrate running VM without --online")
    jobs = [job for jobs in call.lab.replication.values() for job in jobs if int(job.get("guest", 0)) == guest["vmid"]]
    if running and jobs and target not in {job.get("target") for job in jobs}:  # qemu-server API2/Qemu.pm migrate_vm
        return ApiError(500, f"Cannot live-migrate replicated VM to node '{target}' - not a replication target. "
                             f"Use 'force' to override.")
    mapping = _storage_map(call.arg("targetstorage"))
    for storage in _volume_storages(guest):
        wanted = mapping.get(storage, mapping.get("*", storage))
        entry = call.lab.storages.get(wanted)
        if entry is None or target not in call.lab.storage_nodes(entry):
            return ApiError(500, f"storage '{wanted}' is not available on node '{target}'")
    return None


# Storage types whose snapshots a migration can carry (qemu-server QemuMigrate.pm, pve-container LXC/Migrate.pm
# scan_local_volumes: zfspool, btrfs; qcow2 files on a directory storage for VMs).
SNAPSHOTS_MIGRATE = ("zfspool", "btrfs")


def _local_volume_errors(call: Call, kind: str, guest: dict) -> list[str]:
    """Why local volumes block a migration: a CD-ROM image on local storage, a snapshot on storage
    that cannot carry it, a live VM with local snapshots (docs/PROXMOX-BEHAVIOUR.md#migrate)."""
    errors = []
    for key, value in guest["config"].items():
        volid = str(value).split(",")[0]
        if not DISK_KEY.fullmatch(key) or ":" not in volid or _shared(call, volid.split(":")[0]):
            continue
        entry = call.lab.storages.get(volid.split(":")[0], {})
        if "media=cdrom" in str(value):
            if not re.search(r"vm-\d+-cloudinit", volid):
                errors.append(f"can't migrate local disk '{volid}': local cdrom image")
        elif guest["snapshots"] and kind == "qemu" and guest["status"] == "running":
            errors.append(f"can't migrate local disk '{volid}': online storage migration not possible if "
                          f"non-replicated snapshot exists")
        elif guest["snapshots"] and entry.get("type") not in SNAPSHOTS_MIGRATE and not volid.endswith(".qcow2"):
            errors.append(f"can't migrate local disk '{volid}': non-migratable snapshot exists")
    return errors


def _migrate_error(call: Call, kind: str, guest: dict) -> tuple[str, list[str]]:
    """What the migration task itself ends with, and the log lines that say why."""
    label = "VM" if kind == "qemu" else "CT"
    if kind == "lxc" and guest["status"] == "running" and str(call.arg("restart", "0")) != "1":
        return "lxc live migration is currently not implemented", []
    errors = _local_volume_errors(call, kind, guest)
    local = [str(v).split(",")[0] for k, v in guest["config"].items() if DISK_KEY.fullmatch(k)
             and "media=cdrom" not in str(v) and ":" in str(v) and not _shared(call, str(v).split(":")[0])]
    if kind == "qemu" and guest["status"] == "running" and local and str(call.arg("with-local-disks", "0")) != "1":
        # qemu-server QemuMigrate.pm scan_local_volumes, pve-guest-common AbstractMigrate.pm
        errors += [f"can't migrate local disk '{v}': can't live migrate attached local disks without "
                   f"with-local-disks option" for v in local]
    if errors:
        return "migration aborted", [*errors, f"ERROR: migration aborted (duration 00:00:01): can't migrate "
                                              f"{label} - check log"]
    return _locked(guest, kind) or "OK", []


def _moved(call: Call, guest: dict, target: str) -> Callable[[], None]:
    mapping = _storage_map(call.arg("targetstorage") or call.arg("target-storage"))

    def apply() -> None:
        guest["node"] = target
        for key, value in guest["config"].items():
            storage = str(value).split(":")[0]
            if DISK_KEY.fullmatch(key) and ":" in str(value) and (storage in mapping or "*" in mapping):
                guest["config"][key] = mapping.get(storage, mapping.get("*")) + str(value)[len(storage):]
    return apply


def pve_migrate(kind: str) -> Callable:
    def handler(call: Call, node: str, vmid: str) -> str:
        guest = _guest(call, node, vmid, kind)
        target = call.arg("target")
        _node(call, target)
        refused = _migrate_refusal(call, kind, guest, target, node)
        if refused:
            raise refused
        if guest.get("ha"):
            return ha_migrate(call, node, kind, guest, target)
        error, why = _migrate_error(call, kind, guest)
        lines = [f"starting migration of {kind.upper()} {vmid} to node '{target}'"] + why + \
            ([f"migration active, transferred {p * 4 // 100} GiB of 4 GiB VM-state ({p}%)" for p in (25, 50, 75, 100)]
             if error == "OK" else [])
        return call.lab.start_task(node, "qmigrate" if kind == "qemu" else "vzmigrate", vmid, user=call.token_id,
                                   lines=lines, exitstatus=error, on_done=_moved(call, guest, target),
                                   lock=(guest, "migrate"))
    return handler


def _own_volumes(config: dict, vmid: int, storage: str | None) -> dict:
    """A clone's disks: volumes of its own, `vm-<newid>-disk-<n>`, on `storage` or the source's
    (an lvmthin linked clone's name does not show its base) (docs/PROXMOX-BEHAVIOUR.md#a-fresh-install)."""
    volumes = {}
    for key, value in config.items():
        volid, _, options = str(value).partition(",")
        match = re.fullmatch(r"([\w.-]+):(?:base|vm)-\d+-disk-(\d+)", volid)
        if DISK_KEY.fullmatch(key) and match:
            volumes[key] = f"{storage or match.group(1)}:vm-{vmid}-disk-{match.group(2)}" + (f",{options}" if options
                                                                                             else "")
    return volumes


def pve_template(kind: str) -> Callable:
    """A template's volumes are renamed base-<vmid>-disk-<n> (pve-storage LvmThinPlugin.pm create_base)."""
    def handler(call: Call, node: str, vmid: str) -> str | None:
        guest = _guest(call, node, vmid, kind)
        if guest["status"] == "running":
            raise ApiError(500, f"you can't convert a {'VM' if kind == 'qemu' else 'CT'} to template if it is running")

        def apply() -> None:
            guest["template"] = 1
            guest["config"]["template"] = 1
            for key, value in guest["config"].items():
                if DISK_KEY.fullmatch(key) and "media=cdrom" not in str(value):
                    guest["config"][key] = re.sub(rf"^([\w.-]+):vm-{vmid}-", rf"\1:base-{vmid}-", str(value))
        if kind == "lxc":  # synchronous for containers (the schema returns null)
            apply()
            return None
        return call.lab.start_task(node, "qmtemplate", vmid, user=call.token_id, on_done=apply)
    return handler


def pve_destroy(kind: str) -> Callable:
    def handler(call: Call, node: str, vmid: str) -> str:
        guest = _guest(call, node, vmid, kind)
        label = "VM" if kind == "qemu" else "CT"
        if protection_set(guest):  # the early checks, before any task (qemu-server destroy_vm, pve-container)
            raise ApiError(500, f"can't remove {label} {vmid} - protection mode enabled")
        running = f"{label} {vmid} is running - destroy failed"
        error = _locked(guest, kind) or ("OK" if guest["status"] == "stopped" else running)

        def apply() -> None:
            call.lab.guests.pop(int(vmid), None)
        return call.lab.start_task(node, "qmdestroy" if kind == "qemu" else "vzdestroy", vmid, user=call.token_id,
                                   exitstatus=error, on_done=apply)
    return handler


# ---- inside the guest: the QEMU guest agent, a container's interfaces

LINUX_OSINFO = {"id": "debian", "name": "Debian GNU/Linux", "pretty-name": "Debian GNU/Linux 13 (trixie)",
                "kernel-release": "6.12.48+deb13-amd64", "machine": "x86_64"}
# what qemu-guest-agent reports on Windows (docs/PROXMOX-BEHAVIOUR.md#guest-agent; not from Proxmox's source)
WINDOWS_OSINFO = {"id": "mswindows", "name": "Microsoft Windows", "pretty-name": "Windows 11 Pro",
                  "version": "Microsoft Windows 11", "kernel-release": "22631", "machine": "x86-64"}


def _windows(guest: dict) -> bool:
    return str(guest["config"].get("ostype", "")).startswith("win")


def pve_agent(command: str) -> Callable:
    def handler(call: Call, node: str, vmid: str) -> dict:
        guest = _agent_ready(call, node, vmid)
        # an agent error without `desc` comes back as a success (docs/PROXMOX-BEHAVIOUR.md#guest-agent)
        if command in guest.get("agent_errors", {}):
            return {"result": {"error": guest["agent_errors"][command]}}
        address = f"192.0.2.{100 + int(vmid) % 100}"
        answers = {
            "get-osinfo": {"result": WINDOWS_OSINFO if _windows(guest) else LINUX_OSINFO},
            "get-host-name": {"result": {"host-name": guest["name"]}},
            "network-get-interfaces": {"result": [
                {"name": "lo", "ip-addresses": [{"ip-address": "127.0.0.1", "ip-address-type": "ipv4", "prefix": 8}]},
                {"name": "eth0", "hardware-address": "bc:24:11:00:00:01",
                 "ip-addresses": [{"ip-address": address, "ip-address-type": "ipv4", "prefix": 24},
                                  {"ip-address": "fe80::be24:11ff:fe00:1", "ip-address-type": "ipv6", "prefix": 64}]}]},
        }
        return answers[command]
    return handler


def _agent_ready(call: Call, node: str, vmid: str) -> dict:
    guest = _guest(call, node, vmid, "qemu")
    if not guest["config"].get("agent"):
        raise ApiError(500, "No QEMU guest agent configured")
    if guest["status"] != "running":
        raise ApiError(500, f"VM {vmid} is not running")
    # right after boot the agent's ping fails for a while (docs/PROXMOX-BEHAVIOUR.md#guest-agent)
    if guest.get("agent_boot_pings", 0) > 0:
        guest["agent_boot_pings"] -= 1
        raise ApiError(500, "QEMU guest agent is not running")
    return guest


def pve_agent_ping(call: Call, node: str, vmid: str) -> None:
    _agent_ready(call, node, vmid)


def pve_agent_exec(call: Call, node: str, vmid: str) -> dict:
    """Runs nothing: answers like the agent would for `sh -c "<script>"`, echoing the script,
    with `exit N` in it as the exit code and `sleep N` making it take that long."""
    guest = _agent_ready(call, node, vmid)
    command = call.params.get("command")
    argv = command if isinstance(command, list) else [command]
    if _windows(guest) and argv[0] == "/bin/sh":  # no /bin/sh on Windows (not verified in Proxmox's source)
        raise ApiError(500, "Agent error: Failed to execute child process \"/bin/sh\" (No such file or directory)")
    wrapped = argv[:2] in (["/bin/sh", "-c"], ["cmd.exe", "/c"])
    script = argv[-1] if wrapped else " ".join(argv)
    guest.setdefault("agent_pids", {})
    pid = 4000 + len(guest["agent_pids"])
    code = re.search(r"exit (\d+)", script)
    pause = re.search(r"sleep (\d+)", script)
    guest["agent_pids"][pid] = {"done_at": time.time() + (int(pause.group(1)) if pause else 0),
                                "exitcode": int(code.group(1)) if code else 0, "out": f"ran: {script}\n"}
    return {"pid": pid}


def pve_agent_exec_status(call: Call, node: str, vmid: str) -> dict:
    guest = _agent_ready(call, node, vmid)
    process = guest.get("agent_pids", {}).get(int(call.arg("pid")))
    if process is None:
        raise ApiError(500, "Agent error: Invalid parameter 'pid'")
    if time.time() < process["done_at"]:
        return {"exited": 0}  # only this while running (docs/PROXMOX-BEHAVIOUR.md#guest-agent)
    return {"exited": 1, "exitcode": process["exitcode"], "out-data": process["out"]}


def pve_agent_file_read(call: Call, node: str, vmid: str) -> dict:
    guest = _agent_ready(call, node, vmid)
    files = guest.setdefault("files", {"/etc/hostname": guest["name"] + "\n"})
    path = call.arg("file")
    if path not in files:
        raise ApiError(500, f"Agent error: Failed to open file '{path}': No such file or directory")
    return {"content": files[path], "bytes-read": len(files[path])}


def pve_agent_file_write(call: Call, node: str, vmid: str) -> None:
    guest = _agent_ready(call, node, vmid)
    content = call.arg("content")
    if str(call.arg("encode", "1")) == "0":
        import base64
        content = base64.b64decode(content).decode()
    guest.setdefault("files", {})[call.arg("file")] = content


def pve_lxc_interfaces(call: Call, node: str, vmid: str) -> list:
    guest = _guest(call, node, vmid, "lxc")
    if guest["status"] != "running":
        raise ApiError(500, f"CT {vmid} not running")
    return [{"name": "lo", "inet": "127.0.0.1/8", "hwaddr": "00:00:00:00:00:00"},
            {"name": "eth0", "inet": f"192.0.2.{100 + int(vmid) % 100}/24", "inet6": "fe80::1/64",
             "hwaddr": "bc:24:11:00:00:01"}]
