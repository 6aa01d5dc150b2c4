"""Files inside backups: PVE's single-file restore of PBS-backed volumes (`file-restore/list`,
`file-restore/download`) and PBS's own catalog and pxar download, over one made-up file tree
per snapshot.

What the answers look like follows docs/PROXMOX-BEHAVIOUR.md#backup-file-restore: paths travel
base64-encoded ("/" for the top), the top lists the snapshot's archives (`root.pxar.didx` of a
container, `drive-scsi0.img.fidx` of a VM), entries are `{filepath, text, type, leaf, size,
mtime}` with the catalog's one-letter types, a VM image is opened through partition buckets
(`part/1`) by a restore VM whose boot makes the first listing inside it answer 503 (`RestoreWorld`),
and a download is the file's bytes, or a zip of a directory.
"""
from __future__ import annotations

import base64
import io
import time
import zipfile
from dataclasses import dataclass, field
from typing import Any

from .call import ApiError, Call, Download, _node

Tree = dict[str, Any]  # name -> sub-tree (a directory) or bytes (a file)
BIG_FILE = 3 * 1024 * 1024  # /var/log/journal.log: larger than a small cap, for the tests


@dataclass
class RestoreWorld:
    """What the file-restore side of a lab holds beyond its backups: how many listings inside a VM
    image answer 503 while the snapshot's restore VM boots, how many each snapshot has answered, and
    files a test adds to every snapshot's tree (under /root)."""
    boot_lists: int = 1
    listed: dict[str, int] = field(default_factory=dict)  # volid -> listings inside its image so far
    files: Tree = field(default_factory=dict)


def restore_world(lab: Any) -> RestoreWorld:
    """The lab's RestoreWorld, made on first use."""
    with lab.lock:
        found = getattr(lab, "_restore_world", None)
        if found is None:
            found = lab._restore_world = RestoreWorld()
        return found


def snapshot_tree(name: str, extra: Tree | None = None) -> Tree:
    """The file system inside one guest's backup: the same few files for every guest, its own
    host name in them, and what a test added (`extra`, under /root)."""
    return {
        "etc": {"hostname": f"{name}\n".encode(), "hosts": f"127.0.0.1 localhost\n127.0.1.1 {name}\n".encode(),
                "os-release": b'PRETTY_NAME="Debian GNU/Linux 13 (trixie)"\nID=debian\n',
                "ssh": {"sshd_config": b"PermitRootLogin prohibit-password\n"}},
        "root": {".bashrc": b"alias ll='ls -l'\n"} | (extra or {}),
        "home": {},
        "var": {"log": {"journal.log": b"x" * (BIG_FILE - 1) + b"\n"}},
    }


def _archive(kind: str) -> str:
    """The archive a PVE backup holds: a container's file archive, a VM's disk image."""
    return "root.pxar.didx" if kind == "ct" else "drive-scsi0.img.fidx"


def _decode(call: Call, name: str) -> str:
    text = str(call.arg(name) or "/")
    if text in ("/", "root"):
        return "/"
    try:
        return base64.b64decode(text, validate=True).decode()
    except ValueError:
        raise ApiError(400, f"Failed base64-decoding path '{text}'") from None


def _walk(tree: Tree, kind: str, path: str) -> tuple[Any, str]:
    """The node a path names below the archive, and the archive-relative remainder; a VM image is
    opened through its partition bucket `part/1` (proxmox-restore-daemon disk.rs, Bucket)."""
    parts = [p for p in path.split("/") if p]
    archive = _archive(kind)
    if not parts or parts[0] != archive:
        raise ApiError(400, f"'{parts[0] if parts else path}' is not supported for file-restore")
    parts = parts[1:]
    if kind == "vm":
        buckets: Tree = {"part": {"1": tree}}
        node: Any = buckets
    else:
        node = tree
    for part in parts:
        if not isinstance(node, dict) or part not in node:
            raise ApiError(400, f"error opening '{path}'")
        node = node[part]
    return node, "/".join(parts)


def _entry(path: str, node: Any, virtual: bool) -> dict:
    name = path.rstrip("/").rsplit("/", 1)[-1]
    encoded = base64.b64encode(path.encode()).decode()
    if isinstance(node, bytes):
        return {"filepath": encoded, "text": name, "type": "f", "leaf": 1, "size": len(node),
                "mtime": int(time.time()) - 86400}
    return {"filepath": encoded, "text": name, "type": "v" if virtual else "d", "leaf": 0}


def _list(tree: Tree, kind: str, path: str, size: int, *, catalog: bool) -> list[dict]:
    """One directory's entries. The top lists the archive; below it, children carry the path
    they were asked for plus their name; the PBS catalog drops the leading slash below the top
    (pbs-datastore catalog.rs, list_dir_contents)."""
    if path == "/":
        archive = _archive(kind)
        top = {"filepath": base64.b64encode(f"/{archive}".encode()).decode(), "text": archive,
               "type": "d" if kind == "ct" else "v", "leaf": 0, "size": size}
        return [top]
    node, rest = _walk(tree, kind, path)
    if isinstance(node, bytes):
        return [_entry(path, node, False)]
    base = path.rstrip("/")
    if catalog:
        base = base.lstrip("/")
    virtual = kind == "vm" and rest in ("", "part")  # the bucket levels above a file system
    return [_entry(f"{base}/{name}", child, virtual) for name, child in sorted(node.items())]


def _zip(node: Any, prefix: str) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        def add(sub: Any, at: str) -> None:
            if isinstance(sub, bytes):
                archive.writestr(at, sub)
                return
            archive.writestr(at + "/", b"")
            for name, child in sub.items():
                add(child, f"{at}/{name}")
        add(node, prefix)
    return buffer.getvalue()


def _download(node: Any, path: str) -> Download:
    """A file as its bytes, a directory as a zip (the default; `tar` is not modelled)."""
    if isinstance(node, bytes):
        return Download(node)
    return Download(_zip(node, path.rstrip("/").rsplit("/", 1)[-1] or "root"))


# ---- Proxmox VE: file-restore of a volume on a `pbs` storage

def _pve_snapshot(call: Call, storage: str) -> tuple[str, dict, dict]:
    """The kind, guest and PBS snapshot a file-restore volume names; refused as PVE refuses: only
    PBS storages, access to the backup volume (pve-storage FileRestore.pm, Storage.pm
    check_volume_access)."""
    lab = call.lab
    entry = lab.storages.get(storage)
    if entry is None:
        raise ApiError(500, f"storage '{storage}' does not exist")
    volume = str(call.arg("volume"))
    volid = volume if ":" in volume else f"{storage}:{volume if volume.startswith('backup/') else 'backup/' + volume}"
    if volid.split(":", 1)[0] != storage:
        raise ApiError(400, "Parameter verification failed.",
                       {"volume": f"storage ID mismatch ({volid.split(':', 1)[0]} != {storage})."})
    found = next((v for v in lab.pbs_volumes(storage) if v["volid"] == volid), None) \
        if entry["type"] == "pbs" else None
    owner = found["vmid"] if found else None
    if not call.can(f"/storage/{storage}", "Datastore.Allocate"):
        for path, privilege in ((f"/storage/{storage}", "Datastore.AllocateSpace"), (f"/vms/{owner}", "VM.Backup")):
            if owner is not None and not call.can(path, privilege):
                raise ApiError(403, f"Permission check failed ({path}, {privilege})")
    if entry["type"] != "pbs":
        raise ApiError(400, "Parameter verification failed.",
                       {"storage": "Only PBS storages supported for file-restore."})
    if found is None:
        raise ApiError(500, f"unable to find snapshot '{volid}'")
    kind = "vm" if found["subtype"] == "qemu" else "ct"
    guest = lab.guests.get(found["vmid"]) or {"name": f"guest{found['vmid']}"}
    return kind, guest, found


def _booting(call: Call, volume: dict, path: str) -> bool:
    """Whether this listing inside a VM image comes while the snapshot's restore VM boots: the
    first `boot_lists` do, and PVE gives up after 25 s with 503 (pve-storage FileRestore.pm,
    `timeout => 25`; proxmox-file-restore main.rs, list: `list not finished in time`)."""
    if path == "/":  # the archives come from the manifest, without the VM
        return False
    world = restore_world(call.lab)
    with call.lab.lock:
        count = world.listed.get(volume["volid"], 0)
        world.listed[volume["volid"]] = count + 1
    return count < world.boot_lists


def pve_file_restore_list(call: Call, node: str, storage: str) -> list:
    _node(call, node)
    kind, guest, volume = _pve_snapshot(call, storage)
    path = _decode(call, "filepath")
    if kind == "vm" and _booting(call, volume, path):
        raise ApiError(503, "list not finished in time")
    tree = snapshot_tree(guest["name"], restore_world(call.lab).files)
    return _list(tree, kind, path, volume["size"], catalog=kind == "ct")


def pve_file_restore_download(call: Call, node: str, storage: str) -> Download:
    _node(call, node)
    kind, guest, _ = _pve_snapshot(call, storage)
    path = _decode(call, "filepath")
    found, _ = _walk(snapshot_tree(guest["name"], restore_world(call.lab).files), kind, path)
    return _download(found, path)


# ---- Proxmox Backup Server: the catalog of a file archive and its single-file download

def _pbs_snapshot(call: Call, store: str) -> tuple[str, dict]:
    """A snapshot the caller may read: Datastore.Read, or Datastore.Backup and owning the group
    (proxmox-backup src/api2/admin/datastore.rs check_privs_and_load_store, hierarchy.rs
    check_ns_privs_full); a VM snapshot has no catalog (docs/PROXMOX-BEHAVIOUR.md#backup-file-restore)."""
    lab = call.lab
    ds = lab.datastores.get(store)
    if ds is None:
        raise ApiError(400, f"unable to get datastore '{store}' - datastore '{store}' does not exist")
    ns = str(call.arg("ns") or "")
    acl = f"/datastore/{store}" + (f"/{ns}" if ns else "")
    if not (call.can(acl, "Datastore.Read") or call.can(acl, "Datastore.Backup")):
        raise ApiError(403, f"permission check failed - missing Datastore.Read|Datastore.Backup on {acl}")
    kind, item, when = call.arg("backup-type"), str(call.arg("backup-id")), int(call.arg("backup-time"))
    snaps = ds["groups"].get((ns, kind, item), [])
    snap = next((s for s in snaps if s["backup-time"] == when), None)
    if snap is None:
        raise ApiError(400, f"backup dir '{kind}/{item}/{when}' does not exist")
    if not call.can(acl, "Datastore.Read") and snap["owner"] != call.token_id:
        raise ApiError(403, f"backup owner check failed ({call.token_id} != {snap['owner']})")
    if kind == "vm":  # a VM backup is a disk image: no file archive, so no catalog
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))
        index = f"/datastore/{store}/vm/{item}/{stamp}/catalog.pcat1.didx"
        raise ApiError(400, f"unable to read dynamic index '\"{index}\"' - No such file or directory (os error 2)")
    guest = lab.guests.get(int(item)) if item.isdigit() else None
    return kind, {"name": (guest or {}).get("name", item), "size": snap["size"]}


def pbs_catalog(call: Call, store: str) -> list:
    kind, snap = _pbs_snapshot(call, store)
    tree = snapshot_tree(snap["name"], restore_world(call.lab).files)
    return _list(tree, kind, _decode(call, "filepath"), snap["size"], catalog=True)


def pbs_pxar_download(call: Call, store: str) -> Download:
    kind, snap = _pbs_snapshot(call, store)
    path = _decode(call, "filepath")
    found, _ = _walk(snapshot_tree(snap["name"], restore_world(call.lab).files), kind, path)
    return _download(found, path)


PVE_FILE_HANDLERS = {
    ("GET", "/nodes/{node}/storage/{storage}/file-restore/list"): pve_file_restore_list,
    ("GET", "/nodes/{node}/storage/{storage}/file-restore/download"): pve_file_restore_download,
}
PBS_FILE_HANDLERS = {
    ("GET", "/admin/datastore/{store}/catalog"): pbs_catalog,
    ("GET", "/admin/datastore/{store}/pxar-file-download"): pbs_pxar_download,
}
