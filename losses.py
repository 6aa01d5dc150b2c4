"""What a request loses, by name, for the user's question, and what the yes is pinned to.

The question names what will be lost, read from the stored objects as the request will meet them
(docs/SECURITY.md#confirmation): the volume a config edit frees (`delete=unusedN`, `vmstate`, a disk
deleted with `force`) with its size, the volume or backup a DELETE removes, the snapshot a delete
removes and what a rollback discards, the disks a guest's deletion takes with it, the PBS snapshot a
forget removes (docs/PROXMOX-BEHAVIOUR.md#parameters-that-delete-data). The ids a config edit frees
depend on the stored config, not on the request: they are pinned into the approval (Decision.basis,
policy.approval_key), so a config re-pointed while the user reads (unused0 now a 500 GiB disk) is
another question. policy.classify calls `name` for every destructive request; reads go through the
policy's own reader (a batch's overlay: batch.py).
"""
from __future__ import annotations

import re
import time
from typing import Any, Callable

from errors import PolicyError, ToolFailure
from job_edits import delete_names

GUEST = r"/nodes/\{node\}/(qemu|lxc)/\{vmid\}"
DISK = re.compile(r"(ide|sata|scsi|virtio|efidisk|tpmstate|unused)\d+|rootfs|mp\d+")
SHOWN = 8  # volumes a question names one by one; the rest are counted


def size_text(size: Any) -> str:
    """Bytes as the answers write them (31.2 GiB)."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value} B"


def _volume(value: Any) -> str | None:
    """The volume id a disk option holds (`local-lvm:vm-101-disk-0,size=32G`); None for a CD-ROM,
    `none` or a host path."""
    first = str(value or "").split(",")[0].removeprefix("file=").removeprefix("volume=")
    return first if ":" in first and "media=cdrom" not in str(value) else None


def _size(read: Callable[..., Any], node: str, volid: str, value: Any = "") -> str:
    """A volume's size: the `size=` its option names, else as the storage answers for the volume."""
    named = re.search(r"size=(\d+(?:\.\d+)?)([KMGT]?)", str(value))
    if named:
        return size_text(float(named.group(1)) * 1024 ** " KMGT".index(named.group(2) or " "))
    try:
        found = read(f"/nodes/{node}/storage/{volid.split(':', 1)[0]}/content/{volid}") or {}
    except (ToolFailure, PolicyError) as exc:
        return f"size not readable: {str(exc)[:80]}"
    return size_text(found["size"]) if str(found.get("size", "")).isdigit() else "size unknown"


def _config(read: Callable[..., Any], path: str) -> dict | None:
    try:
        found = read(path)
    except (ToolFailure, PolicyError):
        return None
    return found if isinstance(found, dict) else None


def freed(config: dict, params: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """(option, volume id, option value) for each volume a config edit frees: the unusedN and vmstate
    it deletes, and with `force` the disks it deletes (qemu-server API2/Qemu.pm `$update_vm_api`:
    try_deallocate_drive; QemuServer.pm vmconfig_delete_or_detach_drive; pve-container
    LXC/Config.pm vmconfig_apply_pending)."""
    force = str(params.get("force", "0")).lower() in ("1", "true")
    found = []
    for option in delete_names(params.get("delete")):
        frees = re.fullmatch(r"unused\d+|vmstate", option) or (force and DISK.fullmatch(option))
        volume = _volume(config.get(option)) if option != "vmstate" else (config.get(option) or None)
        if frees and volume:
            found.append((option, str(volume), config.get(option)))
    return found


def _listed(items: list[str]) -> str:
    shown = items[:SHOWN]
    return ", ".join(shown) + (f" and {len(items) - SHOWN} more" if len(items) > SHOWN else "")


def _config_edit(decision: Any, read: Callable[..., Any]) -> tuple[list[str], Any]:
    node = decision.path_params.get("node", "")
    path = decision.path.rsplit("/config", 1)[0] + "/config"
    config = _config(read, path)
    if config is None:
        return ["what it frees could not be read (the guest's config); asked as it is"], {"frees": "unread"}
    volumes = freed(config, decision.params)
    named = [f"{option}: {volid} ({_size(read, node, volid, value)})" for option, volid, value in volumes]
    reasons = [f"frees {_listed(named)}: the data on {'it' if len(named) == 1 else 'them'} is lost"] if named else []
    return reasons, {"frees": [[option, volid] for option, volid, _ in volumes]}


def _guest_delete(decision: Any, read: Callable[..., Any]) -> tuple[list[str], Any]:
    config = _config(read, f"{decision.path}/config")
    if config is None:
        return [], None
    node = decision.path_params.get("node", "")
    disks = [f"{volid} ({_size(read, node, volid, value)})" for key, value in sorted(config.items())
             if DISK.fullmatch(key) and (volid := _volume(value))]
    return ([f"deletes the guest with its disks {_listed(disks)}"] if disks else []), None


def _snapshot(decision: Any, read: Callable[..., Any]) -> tuple[list[str], Any]:
    name = decision.path_params.get("snapname", "")
    base = decision.path.split("/snapshot/", 1)[0]
    try:
        listed = read(f"{base}/snapshot") or []
    except (ToolFailure, PolicyError):
        listed = []
    snap = next((s for s in listed if isinstance(s, dict) and s.get("name") == name), {})
    taken = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(snap["snaptime"]))) if snap.get("snaptime") else None
    what = f"snapshot {name!r}" + (f" (taken {taken})" if taken else "") + (
        f", {snap['description'].strip()[:80]!r}" if snap.get("description") else "")
    if decision.template.endswith("/rollback"):
        return [f"goes back to {what}: what changed on the guest since then is lost"], None
    return [f"deletes {what}"], None


def _volume_delete(decision: Any, read: Callable[..., Any]) -> tuple[list[str], Any]:
    volid = decision.path_params.get("volume", "")
    volid = volid if ":" in volid else f"{decision.path_params.get('storage')}:{volid}"
    try:
        found = read(decision.path) or {}
    except (ToolFailure, PolicyError) as exc:
        return [f"deletes {volid} (its size could not be read: {str(exc)[:80]})"], None
    notes = f", notes {str(found['notes']).strip()[:80]!r}" if found.get("notes") else ""
    size = size_text(found["size"]) if str(found.get("size", "")).isdigit() else "size unknown"
    return [f"deletes {volid} ({size}{notes})"], None


def _pbs_forget(decision: Any, _read: Callable[..., Any]) -> tuple[list[str], Any]:
    params = decision.params
    when = str(params.get("backup-time", ""))
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(when))) if when.isdigit() else when
    group = f"{params.get('backup-type')}/{params.get('backup-id')}"
    return [f"forgets backup snapshot {group}/{stamp}" if when else f"forgets every backup of group {group}"], None


# (method, template regex, product, what it loses): the table of what each kind of request loses.
NAMERS: list[tuple[str, str, str, Callable[[Any, Callable[..., Any]], tuple[list[str], Any]]]] = [
    ("PUT|POST", rf"{GUEST}/config", "pve", _config_edit),
    ("DELETE", GUEST, "pve", _guest_delete),
    ("DELETE|POST", rf"{GUEST}/snapshot/\{{snapname\}}(/rollback)?", "pve", _snapshot),
    ("DELETE", r"/nodes/\{node\}/storage/\{storage\}/content/\{volume\}", "pve", _volume_delete),
    ("DELETE", r"/admin/datastore/\{store\}/(snapshots|groups)", "pbs", _pbs_forget),
]


def name(product: str, decision: Any, read: Callable[..., Any] | None) -> None:
    """Add what a destructive request loses to its reasons (the question and the dry run show them),
    and pin the ids a config edit frees into decision.basis."""
    if "destructive" not in decision.gates or read is None:
        return
    for methods, pattern, for_product, namer in NAMERS:
        if product == for_product and re.fullmatch(methods, decision.method) and re.fullmatch(pattern,
                                                                                             decision.template):
            reasons, pinned = namer(decision, read)
            decision.reasons += reasons
            if pinned is not None:
                decision.basis = pinned if decision.basis is None else [decision.basis, pinned]
            return
