"""Cloud-init on QEMU guests: which config changes the generated drive does not hold yet
(`GET .../cloudinit`), regenerating it (`PUT .../cloudinit`), and the password as Proxmox stores
and shows it.

Behaviour and sources: docs/PROXMOX-BEHAVIOUR.md#cloud-init.
"""
from __future__ import annotations

import hashlib
import re
from typing import Any

from .call import ApiError, Call, _guest

# The options GET .../cloudinit reports (qemu-server src/PVE/API2/Qemu.pm, $cloudinitoptions).
REPORTED = ("cicustom", "cipassword", "citype", "ciuser", "ciupgrade", "nameserver", "searchdomain", "sshkeys")
# Cloud-init options take effect in the config at once, even on a running VM, and the value the
# drive was made with is recorded (src/PVE/QemuServer.pm: $confdesc_cloudinit in
# $fast_plug_option, vmconfig_hotplug_pending's $cloudinit_record_changed).
FAST_PLUG = re.compile(r"cicustom|cipassword|citype|ciuser|ciupgrade|nameserver|searchdomain|sshkeys|ipconfig\d+")
RECORDED = re.compile(FAST_PLUG.pattern + r"|name")  # cloudinit_pending_properties (net<n> too, not fast-plugged)
HIDDEN = "**********"  # how GET config, pending and cloudinit show cipassword


def record_change(guest: dict, key: str, old: Any, new: Any) -> None:
    """Remember what the drive holds for a key changed on a running VM: the old value the first
    time, or that the key was added; a change back to the drive's value forgets it
    (QemuServer.pm, $cloudinit_record_changed)."""
    if not RECORDED.fullmatch(key):
        return
    ci = guest.setdefault("cloudinit", {})
    added = set(ci.pop("added", set()))
    recorded = ci.get(key)
    if new is not None and recorded is not None and str(new) == str(recorded):
        ci.pop(key, None)
        added.discard(key)
    elif new is not None and old is None and recorded is None:
        added.add(key)
    elif new is None and key in added:
        added.discard(key)
    elif old is not None and recorded is None and key not in added:
        ci[key] = old
    if added:
        ci["added"] = added


def regenerated(guest: dict) -> None:
    """The drive was made from the current config (a start, or PUT .../cloudinit)."""
    guest.pop("cloudinit", None)


def has_drive(guest: dict) -> bool:
    return any(re.fullmatch(r"(ide|sata|scsi|virtio)\d+", k) and "cloudinit" in str(v)
               for k, v in guest["config"].items())


def stored_password(value: Any) -> str:
    """qemu-server stores a plain cipassword hashed (PVE::Tools::encrypt_pw) and keeps a value that
    is a crypt hash already (src/PVE/API2/Qemu.pm, $update_vm_api)."""
    text = str(value)
    if re.match(r"^\$(?:[156]|2[ay])(\$.+){2}", text):
        return text
    return "$5$simsalt$" + hashlib.sha256(text.encode()).hexdigest()[:43]


def hide_password(rows: Any) -> Any:
    """cipassword as GET config and GET pending show it (Qemu.pm, vm_config and vm_pending)."""
    if isinstance(rows, dict):
        return {k: (HIDDEN if k == "cipassword" else v) for k, v in rows.items()}
    for row in rows:
        if row.get("key") == "cipassword":
            row.update({k: HIDDEN + (" " if k == "pending" else "") for k in ("value", "pending") if k in row})
    return rows


def pve_cloudinit_pending(call: Call, node: str, vmid: str) -> list:
    """GET .../cloudinit: the added keys with their new value; each reported option that is set,
    with the drive's `value` and the config's `pending` value when they differ; recorded keys no
    longer set as deleted (Qemu.pm, cloudinit_pending)."""
    guest = _guest(call, node, vmid, "qemu")
    config, ci = guest["config"], dict(guest.get("cloudinit", {}))
    added = sorted(ci.pop("added", set()))
    show = lambda key, value: HIDDEN if key == "cipassword" else value  # noqa: E731
    rows: list[dict] = [{"key": key, "pending": show(key, config.get(key))} for key in added]
    for key in REPORTED:
        if not config.get(key) or key in added:
            continue
        if key in ci:
            rows.append({"key": key, "value": show(key, ci[key]), "pending": show(key, config[key])})
        else:
            rows.append({"key": key, "value": show(key, config[key])})
    rows += [{"key": key, "delete": 1} for key in ci if not config.get(key)]
    return [{k: str(v) if k in ("value", "pending") else v for k, v in row.items()} for row in rows]


def pve_cloudinit_update(call: Call, node: str, vmid: str) -> None:
    """PUT .../cloudinit: regenerate the drive from the config; refused while the VM is locked;
    nothing happens without a cloud-init drive (Qemu.pm cloudinit_update, QemuServer.pm
    vmconfig_update_cloudinit_drive)."""
    guest = _guest(call, node, vmid, "qemu")
    if guest["lock"]:
        raise ApiError(500, f"VM is locked ({guest['lock']})")
    if has_drive(guest):
        regenerated(guest)


PVE_CLOUDINIT_HANDLERS = {
    ("GET", "/nodes/{node}/qemu/{vmid}/cloudinit"): pve_cloudinit_pending,
    ("PUT", "/nodes/{node}/qemu/{vmid}/cloudinit"): pve_cloudinit_update,
}
