"""Guest config differences in words: one line per changed key ("memory 4 -> 8 GiB", "net0 moved
to vmbr1 (was vmbr0)"), pending changes marked. One diff for every caller: what_changed (now
against a backup, a snapshot or a receipt), the receipts (before and after a change) and the
restore drill (the backup it restored against the guest now).

Also here: reading a config file's text (what a backup holds: GET .../vzdump/extractconfig) and
GET .../pending as the current config and the changes that wait for a restart.
"""
from __future__ import annotations

import re
from typing import Any, Callable
from urllib.parse import unquote

from masking import MASK, secret_param

# Keys that say where a config stands, not what it is: its checksum, a lock, the snapshot it
# descends from, and what a snapshot records about itself (docs/PROXMOX-BEHAVIOUR.md#snapshots-and-rollback).
BOOKKEEPING = re.compile(r"digest|lock|parent|snaptime|snapstate|vmstate|runningmachine|runningcpu"
                         r"|running-nets-host-mtu")
UNUSED = re.compile(r"unused\d+")
MEBIBYTES = ("memory", "swap", "balloon")  # options given in MiB
NIC_MODELS = ("virtio", "e1000", "e1000e", "rtl8139", "vmxnet3", "ne2k_pci", "ne2k_isa", "pcnet", "i82551",
              "i82557b", "i82559er")
LONGEST = 60  # characters of a value shown in a line
DELETED = "(delete)"  # how a pending deletion is shown (config_and_pending)


def config_and_pending(rows: list[dict]) -> tuple[dict, dict]:
    """GET .../pending as the current config and the changes waiting for a restart (a deletion
    shows as "(delete)") (docs/PROXMOX-BEHAVIOUR.md#pending-config)."""
    config = {r["key"]: r["value"] for r in rows if "value" in r}
    pending = {r["key"]: r["pending"] for r in rows if "pending" in r}
    pending |= {r["key"]: DELETED for r in rows if r.get("delete")}
    return config, pending


def read_backup_config(client: Any, node: str, volume: str) -> dict[str, str]:
    """The config inside a backup, local or on PBS, read on a node that sees it (GET
    /nodes/{node}/vzdump/extractconfig: docs/PROXMOX-BEHAVIOUR.md#configs-inside-backups)."""
    return parse_config_text(client.get(f"/nodes/{node}/vzdump/extractconfig", volume=volume) or "")


def parse_config_text(text: str) -> dict[str, str]:
    """The main section of a config file, as a backup holds it: `#` lines are the description
    (decode_text), `#qmdump#`/`#vzdump#` lines are the archive's own, `key: value` the options; the
    first `[section]` ends it (qemu-server QemuServer.pm parse_vm_config; pve-common
    ParseUtils.pm decode_text; docs/PROXMOX-BEHAVIOUR.md#configs-inside-backups)."""
    config: dict[str, str] = {}
    description: list[str] = []
    for line in (text or "").splitlines():
        if re.match(r"^\[[^\]]*\]\s*$", line):
            break
        if line.startswith(("#qmdump#", "#vzdump#")) or not line.strip():
            continue
        if line.startswith("#"):
            description.append(unquote(line[1:], encoding="utf-8", errors="replace"))
            continue
        match = re.match(r"^([a-z][a-z_\-]*\d*):\s*(.+?)\s*$", line)
        if match:
            config[match.group(1)] = match.group(2)
    if description:
        config["description"] = "\n".join(description).rstrip()
    return config


def changed_lines(old: dict, new: dict, pending: dict | None = None,
                  skip: Callable[[str], bool] | None = None) -> list[str]:
    """One line per key that differs from `old` to `new`; a key with a change waiting for a
    restart (`pending`, as config_and_pending gives it) is compared with that value and marked."""
    pending = pending or {}
    lines = []
    for key in sorted(set(old) | set(new) | set(pending), key=_natural):
        if BOOKKEEPING.fullmatch(key) or (skip and skip(key)):
            continue
        before, now = old.get(key), new.get(key)
        if key not in pending:
            if not same(before, now):
                lines.append(describe(key, before, now))
            continue
        waiting = None if pending[key] == DELETED else pending[key]
        if same(before, waiting) and not same(before, now):
            lines.append(f"{key} is back to {_short(key, before)} at the next restart (runs with {_short(key, now)})")
        elif not same(before, waiting):
            lines.append(describe(key, before, waiting) + " (pending until restart)")
    return lines


def describe(key: str, before: Any, after: Any) -> str:
    """One key's change in words."""
    if secret_param(key) or MASK in str(before) or MASK in str(after):
        return f"{key} changed"  # never a secret's value, old or new
    if before is None:
        return f"{key} added: {_short(key, after)}"
    if after is None:
        return f"{key} removed (was {_short(key, before)})"
    if key in MEBIBYTES and str(before).isdigit() and str(after).isdigit():
        return f"{key} {_mebibytes(int(before), int(after))}"
    if key == "description" or "\n" in str(before) + str(after):
        return f"{key} changed"
    if "=" in str(before) + str(after):
        return f"{key} {_property_changes(key, str(before), str(after))}"
    return f"{key} {_short(key, before)} -> {_short(key, after)}"


def _property_changes(key: str, before: str, after: str) -> str:
    """What changed inside a property string: a NIC moved to another bridge, a disk's size..."""
    old, new = _parts(before), _parts(after)
    said = []
    if old.get("bridge") != new.get("bridge") and re.fullmatch(r"net\d+", key):
        said.append(f"moved to {new.get('bridge') or 'no bridge'} (was {old.get('bridge') or 'none'})")
    for part in sorted(set(old) | set(new), key=list({**old, **new}).index):
        if (part == "bridge" and said) or old.get(part) == new.get(part):
            continue
        label = "" if part == "" else f"{part} "
        if part not in old:
            said.append(f"{label}{new[part]} added" if part else f"{new[part]} added")
        elif part not in new:
            said.append(f"{label}removed (was {old[part]})")
        else:
            said.append(f"{label}{old[part]} -> {new[part]}")
    return ", ".join(said)


def _parts(value: str) -> dict[str, str]:
    """A property string's parts by name; the leading positional part (a disk's volume) is "",
    a NIC model's `virtio=<MAC>` is model and macaddr."""
    parts: dict[str, str] = {}
    for index, part in enumerate(value.split(",")):
        name, has_value, text = part.partition("=")
        if not has_value:
            parts["" if index == 0 else name] = "" if index else name
        elif name in NIC_MODELS:
            parts["model"], parts["macaddr"] = name, text
        else:
            parts[name] = text
    return parts


def _mebibytes(before: int, after: int) -> str:
    if before % 1024 == 0 and after % 1024 == 0:
        return f"{before // 1024} -> {after // 1024} GiB"
    return f"{_mib(before)} -> {_mib(after)}"


def _mib(value: int) -> str:
    return f"{value // 1024} GiB" if value and value % 1024 == 0 else f"{value} MiB"


def _short(key: str, value: Any) -> str:
    if value is None:
        return "nothing"
    if secret_param(key):
        return MASK
    if key in MEBIBYTES and str(value).isdigit():
        return _mib(int(value))
    text = str(value).replace("\n", " ")
    return text if len(text) <= LONGEST else text[:LONGEST - 1] + "…"


def same(a: Any, b: Any) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and str(a) == str(b))


def _natural(key: str) -> tuple:
    """net2 before net10."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", key))


def skip_for_backup(key: str) -> bool:
    """A backup keeps no unused disks (docs/PROXMOX-BEHAVIOUR.md#configs-inside-backups)."""
    return bool(UNUSED.fullmatch(key))


def skip_for_snapshot(key: str) -> bool:
    """A snapshot keeps no unused disks, and its `description` is the snapshot's own
    (docs/PROXMOX-BEHAVIOUR.md#snapshots-and-rollback)."""
    return bool(UNUSED.fullmatch(key)) or key == "description"
