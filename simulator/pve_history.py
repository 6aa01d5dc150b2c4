"""Proxmox VE: what a guest was. The configuration kept inside a backup (`GET
/nodes/{node}/vzdump/extractconfig`) and inside a snapshot (`GET .../snapshot/{snapname}/config`),
which storages can take snapshots and roll back to an older one, and the config file text both
products write. `pve_guests.py` uses the storage rules, `pve.py` registers the handlers.

Behaviour: docs/PROXMOX-BEHAVIOUR.md#snapshots-and-rollback and #configs-inside-backups.
"""
from __future__ import annotations

import re
from typing import Callable

from .call import ApiError, Call, _guest, _node
from .lab import size_bytes

# Storage types whose volumes take snapshots, with the formats that can (None: any), as each
# plugin's volume_has_feature('snapshot', current) answers (pve-storage src/PVE/Storage/*Plugin.pm).
SNAPSHOT_FORMATS: dict[str, frozenset[str] | None] = {
    "lvmthin": None, "zfspool": None, "zfs": None, "rbd": None,
    "btrfs": frozenset({"qcow2", "raw", "subvol"}),
    "dir": frozenset({"qcow2"}), "nfs": frozenset({"qcow2"}), "cifs": frozenset({"qcow2"}),
    "glusterfs": frozenset({"qcow2"}), "lvm": frozenset({"qcow2"}),
}
# Storage types that roll back only to the most recent snapshot (ZFSPoolPlugin, and LVM's
# qcow2 volume chains: volume_rollback_is_possible).
NEWEST_ONLY = ("zfspool", "zfs", "lvm")
DISK_KEY = re.compile(r"(scsi|virtio|sata|ide|efidisk|tpmstate|mp)\d+|rootfs")
# What a config file's main section holds besides the options (write_vm_config, write_pct_config).
NOT_OPTIONS = ("digest", "description", "pending", "snapshots")


def volume_format(volume: str) -> str:
    """A volume's format as its name tells: an extension, `subvol-` directories, else raw."""
    name = volume.split(":", 1)[-1]
    match = re.search(r"\.(qcow2|raw|vmdk)$", name)
    if match:
        return match.group(1)
    return "subvol" if re.search(r"(^|/)subvol-", name) else "raw"


def volumes(config: dict) -> list[str]:
    """The volumes of a guest's disks and mount points; CD-ROMs and `none` are no volume."""
    found = []
    for key, value in config.items():
        volume = str(value).split(",")[0]
        if DISK_KEY.fullmatch(key) and "media=cdrom" not in str(value) and volume not in ("none", "cdrom"):
            found.append(volume)
    return found


def _storage_type(call: Call, volume: str) -> str | None:
    if ":" not in volume or volume.startswith("/"):
        return None  # a host path: volume_has_feature answers undef
    return call.lab.storages.get(volume.split(":", 1)[0], {}).get("type")


def cannot_snapshot(call: Call, config: dict) -> str | None:
    """Why a guest cannot take a snapshot: one of its volumes is on storage without the feature
    (pve-guest-common AbstractConfig.pm __snapshot_prepare, in the task)."""
    for volume in volumes(config):
        kind = _storage_type(call, volume)
        if kind not in SNAPSHOT_FORMATS or (SNAPSHOT_FORMATS[kind] is not None
                                            and volume_format(volume) not in SNAPSHOT_FORMATS[kind]):
            return "snapshot feature is not available"
    return None


def rollback_blocked(call: Call, guest: dict, snapname: str) -> str | None:
    """A rollback to a snapshot that is not the newest, on storage that rolls back only to the newest."""
    names = [s["name"] for s in guest["snapshots"]]
    if names and names[-1] == snapname:
        return None
    for volume in volumes(guest["config"]):
        if _storage_type(call, volume) in NEWEST_ONLY:
            return f"can't rollback, '{snapname}' is not most recent snapshot on '{volume}'"
    return None


def snapshot_of(config: dict) -> dict:
    """What a snapshot keeps of a config (pve-guest-common AbstractConfig.pm __snapshot_copy_config)."""
    return {k: v for k, v in config.items()
            if k not in ("snapshots", "snapstate", "snaptime", "vmstate", "lock", "digest", "description")
            and not re.fullmatch(r"unused\d+", k)}


def config_text(kind: str, config: dict) -> str:
    """A config as the file holds it: the description as `#` lines (encode_text: control, high-bit,
    `:` and `%` escaped), then `key: value` sorted; a VM backup adds its `#qmdump#map` lines
    (qemu-server QemuServer.pm write_vm_config, VZDump/QemuServer.pm assemble; pve-container
    LXC/Config.pm write_pct_config)."""
    lines = ["#" + encode_text(line) for line in str(config.get("description") or "").split("\n")
             if config.get("description")]
    lines += [f"{key}: {config[key]}" for key in sorted(config) if key not in NOT_OPTIONS]
    if kind == "qemu":
        for key in sorted(config):
            if DISK_KEY.fullmatch(key) and "media=cdrom" not in str(config[key]):
                storage = str(config[key]).split(":", 1)[0]
                lines.append(f"#qmdump#map:{key}:drive-{key}:{storage}:{volume_format(str(config[key]))}:")
    return "\n".join(lines) + "\n"


def encode_text(text: str) -> str:
    """pve-common ParseUtils.pm encode_text: control and high-bit characters, `:` and `%` as %XX (UTF-8)."""
    return "".join(c if 0x20 <= ord(c) <= 0x7e and c not in "%:" else "".join(f"%{b:02X}" for b in c.encode())
                   for c in text)


def _backup_volume(call: Call, node: str, volume: str) -> tuple[dict, str]:
    """The backup a volume id names, as the node sees it, and its guest type; 500 as pve-storage
    answers when the node cannot find it (Storage.pm abs_filesystem_path)."""
    storage = volume.split(":", 1)[0]
    entry = call.lab.storages.get(storage)
    if entry is None or node not in call.lab.storage_nodes(entry):
        raise ApiError(500, f"storage '{storage}' does not exist")
    if entry["type"] == "pbs":
        for found in call.lab.pbs_volumes(storage):
            if found["volid"] == volume:
                return found, found["subtype"]
        raise ApiError(500, "proxmox-backup-client failed: Error: unable to find snapshot")
    for found in call.lab.volumes.get(storage, []):
        if found["volid"] == volume and found.get("_node", node) == node and found["content"] == "backup":
            return found, "qemu" if "vzdump-qemu-" in volume else "lxc"
    raise ApiError(500, f"can't find file '{volume}'")


def pve_extractconfig(call: Call, node: str) -> str:
    """The config inside a backup, as text (pve-manager API2/VZDump.pm extractconfig; pve-storage
    Storage.pm extract_vzdump_config, PBSPlugin.pm extract_vzdump_config). Its permission is checked
    in the handler: the volume's access (check_volume_access) and VM.Backup on the owner."""
    _node(call, node)
    volume = str(call.arg("volume"))
    storage = volume.split(":", 1)[0]
    found, kind = _backup_volume(call, node, volume)
    owner = found.get("vmid")
    if not call.can(f"/storage/{storage}", "Datastore.Allocate"):
        for path, privilege in ((f"/storage/{storage}", "Datastore.AllocateSpace"), (f"/vms/{owner}", "VM.Backup")):
            if not call.can(path, privilege):
                raise ApiError(403, f"Permission check failed ({path}, {privilege})")
    if not call.can(f"/vms/{owner}", "VM.Backup"):
        raise ApiError(403, f"Permission check failed (/vms/{owner}, VM.Backup)")
    return config_text(kind, found.get("_config") or {})


def pve_snapshot_config(kind: str) -> Callable:
    """A snapshot's config section: the options it keeps, with snaptime, its description, parent
    and vmstate (qemu-server API2/Qemu.pm get_snapshot_config; pve-container the same)."""
    def handler(call: Call, node: str, vmid: str, snapname: str) -> dict:
        guest = _guest(call, node, vmid, kind)
        return snapshot_section(guest, snapname)
    return handler


def snapshot_section(guest: dict, snapname: str) -> dict:
    for snap in guest["snapshots"]:
        if snap["name"] == snapname:
            meta = {k: snap[k] for k in ("snaptime", "description", "parent") if snap.get(k) not in (None, "")}
            if snap.get("vmstate"):
                meta["vmstate"] = f"local-lvm:vm-{guest['vmid']}-state-{snapname}"
            return dict(snap.get("_config") or {}) | meta
    raise ApiError(500, f"snapshot '{snapname}' does not exist")


# ---- options set and pending values, as both products write them (docs/PROXMOX-BEHAVIOUR.md#pending-config)

UNUSED = re.compile(r"unused\d+")


def _disk_volume(key: str, value: object) -> str | None:
    """The volume a disk or mount point option holds; CD-ROMs and `none` hold none."""
    found = volumes({key: value}) if value is not None else []
    return found[0] if found else None


def set_option(guest: dict, key: str, value: object) -> None:
    """One option set (or deleted: None) in the current config. A disk that is detached or replaced
    becomes an `unusedN` entry; a volume attached again loses its `unusedN` entry (qemu-server
    QemuServer.pm vmconfig_register_unused_drive, write_vm_config; pve-container LXC/Config.pm
    write_pct_config)."""
    config = guest["config"]
    old = _disk_volume(key, config.get(key))
    size_of = size_bytes(str(config.get(key, "")))
    if value is None:
        config.pop(key, None)
    else:
        config[key] = value
    if old and old != _disk_volume(key, value) and old not in config.values():
        index = next(n for n in range(256) if f"unused{n}" not in config)
        config[f"unused{index}"] = old
        guest.setdefault("detached", {})[old] = size_of  # an unusedN entry names no size; the volume has one
    attached = set(volumes(config))
    for unused in [k for k, v in config.items() if UNUSED.fullmatch(k) and v in attached]:
        del config[unused]


def cleanup_pending(guest: dict) -> None:
    """Pending values equal to the current ones, and pending deletions of options that are not set,
    are dropped (pve-guest-common AbstractConfig.pm cleanup_pending)."""
    config = guest["config"]
    guest["pending"] = {k: v for k, v in guest["pending"].items()
                        if (v is None and k in config) or (v is not None and str(config.get(k)) != str(v))}
