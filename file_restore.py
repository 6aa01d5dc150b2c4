"""One file back from a backup: browse inside a backup and save a file (or a directory as a zip)
into the folder PROXMOX_RESTORE_DIR names, never into the answer.

Two ways in (docs/PROXMOX-BEHAVIOUR.md#backup-file-restore): through Proxmox VE's file-restore for
a backup on a `pbs` storage (containers and VMs; for a VM, PVE boots a small restore VM to read the
disk, so the first call can take a while), or through the Backup Server's catalog (containers and
host backups; a VM backup is a disk image and has none). Backup contents are sensitive: both reads
are at the sensitive gate, and saving a file is a write to this server's disk.
"""
import base64
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import runtime
from answers import DryRunArg, Host, Limit, Offset, OptionalVmid, human_bytes, iso_time, table
from errors import InvalidArgument, ProxmoxError
from inventory import storage_node, storage_rows
from proxmox_client import ProxmoxClient, pbs_client, pve_client


@dataclass
class RestoreSettings:
    folder: Path | None = None  # PROXMOX_RESTORE_DIR
    max_bytes: int = 1024 ** 3  # PROXMOX_RESTORE_MAX_MB


_restore = runtime.slot("file_restore.restore", RestoreSettings)  # this server's (configure)
SHOWN_TEXT = 16 * 1024  # a restored file up to this size may be shown (show=true)
KINDS = {"d": "dir", "f": "file", "l": "symlink", "h": "hardlink", "v": "volume", "b": "block device",
         "c": "char device", "p": "fifo", "s": "socket"}  # catalog entry types (pbs-datastore catalog.rs)
PBS_VOLID = re.compile(r"(?P<storage>[^:]+):backup/(?P<kind>vm|ct)/(?P<vmid>\d+)/(?P<time>\S+)")


def configure(folder: Path | None, max_bytes: int) -> None:
    _restore.set(RestoreSettings(folder, max_bytes))


@dataclass
class Source:
    """Where a backup's files are read: a PVE storage volume, or a PBS snapshot."""
    client: ProxmoxClient
    label: str  # how answers name it
    node: str = ""  # PVE: a node with the storage
    storage: str = ""  # PVE
    volid: str = ""  # PVE
    snapshot: dict[str, Any] | None = None  # PBS: store, ns, backup-type, backup-id, backup-time

    def list_path(self) -> tuple[str, dict[str, Any]]:
        if self.snapshot:
            return f"/admin/datastore/{self.snapshot['store']}/catalog", self._pbs_params()
        return f"/nodes/{self.node}/storage/{self.storage}/file-restore/list", {"volume": self.volid}

    def download_path(self) -> tuple[str, dict[str, Any]]:
        if self.snapshot:
            return f"/admin/datastore/{self.snapshot['store']}/pxar-file-download", self._pbs_params()
        return f"/nodes/{self.node}/storage/{self.storage}/file-restore/download", {"volume": self.volid}

    def _pbs_params(self) -> dict[str, Any]:
        return {k: v for k, v in self.snapshot.items() if k != "store" and v}


def _encoded(path: str) -> str:
    """Paths travel base64-encoded; "/" is the top (pve-storage FileRestore.pm, proxmox-backup catalog)."""
    clean = "/" + path.strip().strip("/")
    return "/" if clean == "/" else base64.b64encode(clean.encode()).decode()


def _decoded(filepath: str) -> str:
    return "/" + base64.b64decode(filepath).decode(errors="replace").lstrip("/")


# A PBS snapshot as PBS writes it: store:[ns/<ns>/...]type/id[/time] (the time RFC 3339, as
# pbs_list_snapshots and tape restore's `snapshots` show it); without a time, the group's newest.
PBS_SNAPSHOT = re.compile(r"(?P<store>[A-Za-z0-9_][A-Za-z0-9._-]*):(?P<ns>(?:ns/[A-Za-z0-9_][A-Za-z0-9._-]*/)*)"
                          r"(?P<type>vm|ct|host)/(?P<id>[A-Za-z0-9_][A-Za-z0-9._-]*)(?:/(?P<time>\S+))?")


def _pve_backup(host: Host, volid: str | None, vmid: int | None) -> Source:
    """A PBS-backed backup on PVE, by volid, or the guest's newest one."""
    client = pve_client(host)
    if volid:
        match = PBS_VOLID.fullmatch(volid)
        if not match:
            raise InvalidArgument(f"'{volid}' is not a backup on a PBS storage (storage:backup/vm|ct/<vmid>/<time>); "
                                  f"single files come only out of those. Restore a vzdump archive whole "
                                  f"(write_restore_backup), or take a volid from list_backups.")
        storage = match["storage"]
        return Source(client, volid, storage_node(client, storage, None), storage, volid)
    found, seen = [], set()
    for row in storage_rows(client):
        if row.get("plugintype") != "pbs" or row.get("status") != "available" or row["storage"] in seen:
            continue
        seen.add(row["storage"])
        for volume in client.get(f"/nodes/{row['node']}/storage/{row['storage']}/content", content="backup",
                                 vmid=vmid) or []:
            found.append((volume.get("ctime") or 0, row["storage"], row["node"], volume["volid"]))
    if not found:
        raise InvalidArgument(f"No PBS-backed backup of guest {vmid} is visible (the token needs "
                              f"Datastore.AllocateSpace on the storage and VM.Backup on the guest to see backups; "
                              f"list_backups shows what is there).")
    _, storage, node, newest = max(found)
    return Source(client, newest, node, storage, newest)


def _pbs_backup(pbs_host: Host, text: str) -> Source:
    """A PBS snapshot of a container or host backup (store:ct/102/<time>); the group's newest
    without a time."""
    match = PBS_SNAPSHOT.fullmatch(text)
    if match["type"] == "vm":
        raise InvalidArgument("A VM backup is a disk image, which the Backup Server has no file catalog for. Browse "
                              "it through Proxmox VE: backup=<its volid from list_backups> or vmid=<vmid> (PVE "
                              "opens the image in a small restore VM).")
    client = pbs_client(pbs_host)
    store, ns = match["store"], "/".join(match["ns"].split("/")[1::2]) or None
    group = {"backup-type": match["type"], "backup-id": match["id"], "ns": ns}
    times = {iso_time(s["backup-time"]): s["backup-time"]
             for s in client.get(f"/admin/datastore/{store}/snapshots", **group) or []}
    if not times or (match["time"] and match["time"] not in times):
        raise InvalidArgument(f"No snapshot {text} on the Backup Server; its times: "
                              f"{', '.join(sorted(times, reverse=True)[:5]) or 'none'} (pbs_list_snapshots).")
    stamp = match["time"] or max(times)
    label = f"{store}:{match['ns']}{match['type']}/{match['id']}/{stamp}"
    return Source(client, label, snapshot={"store": store} | group | {"backup-time": times[stamp]})


def _backup(host: Host, pbs_host: Host, backup: str | None, vmid: int | None) -> Source:
    """The backup a call names: a PVE volid (list_backups), a PBS snapshot, or a guest's newest."""
    if backup and PBS_SNAPSHOT.fullmatch(backup):
        return _pbs_backup(pbs_host, backup)
    if not (backup or vmid):
        raise InvalidArgument("Name the backup: backup=<volid from list_backups> or <store>:ct/<id>[/<time>] on the "
                              "Backup Server, or vmid=<vmid> for the guest's newest PBS-backed backup.")
    return _pve_backup(host, backup, vmid)


def _entries(source: Source, path: str) -> list[dict]:
    where, params = source.list_path()
    rows = source.client.get(where, **params, filepath=_encoded(path)) or []
    return [{"path": _decoded(r["filepath"]), "type": KINDS.get(r.get("type"), r.get("type")),
             "size": r.get("size"), "modified": iso_time(r.get("mtime"))} for r in rows]


def backup_files(backup: str | None = None, vmid: OptionalVmid = None, path: str = "/",
                 host: Host = None, pbs_host: Host = None, limit: Limit = 200, offset: Offset = 0) -> dict:
    """A volid on a PBS storage, vmid's newest, or PBS store:ct/102[/time]."""
    source = _backup(host, pbs_host, backup, vmid)
    rows = _entries(source, path)
    for row in rows:
        row["size"] = human_bytes(row["size"])
    result = {"backup": source.label, "path": "/" + path.strip().strip("/")}
    return result | table(["path", "type", "size", "modified"], rows, limit=limit, offset=offset)


def _destination(folder: Path, source: Source, path: str, directory: bool, create: bool) -> Path:
    """A new file under the restore folder: <backup>/<name>, a directory as <name>.zip; never an
    existing name. `create` makes the folders (not for a dry run)."""
    label = re.sub(r"[^A-Za-z0-9_.-]+", "_", source.label.split(":", 1)[-1]).strip("_")
    parent = folder / label
    if create:  # backup contents: readable by this server's user only
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        parent.mkdir(exist_ok=True, mode=0o700)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", path.rstrip("/").rsplit("/", 1)[-1]) or "backup"
    suffix = ".zip" if directory else ""
    candidate, number = parent / f"{name}{suffix}", 1
    while candidate.exists() or candidate.with_name(candidate.name + ".part").exists():
        candidate, number = parent / f"{name}-{number}{suffix}", number + 1
    return candidate


def _sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as data:
        for block in iter(lambda: data.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _shown(destination: Path, size: int) -> dict:
    """A small text file's contents, marked as data from the backup, not instructions."""
    if size > SHOWN_TEXT:
        return {"not_shown": f"larger than {SHOWN_TEXT // 1024} KiB; read it from the saved file"}
    try:
        return {"content": destination.read_bytes().decode("utf-8"), "untrusted": True}
    except UnicodeDecodeError:
        return {"not_shown": "not UTF-8 text"}


def _saved_entry(source: Source, clean: str) -> dict:
    """The entry a restore saves, from its directory's listing: a file or directory within the cap."""
    parent = clean.rsplit("/", 1)[0] or "/"
    entry = next((e for e in _entries(source, parent) if e["path"] == clean), None)
    if entry is None:
        raise InvalidArgument(f"No '{clean}' in {source.label}; backup_files path={parent} lists what is there.")
    if entry["type"] not in ("file", "dir", "hardlink"):
        raise InvalidArgument(f"'{clean}' is a {entry['type']}; only files and directories can be saved.")
    cap = _restore.get().max_bytes
    if (entry.get("size") or 0) > cap:
        raise InvalidArgument(f"'{clean}' has {human_bytes(entry['size'])}, over the {human_bytes(cap)} "
                              f"cap (PROXMOX_RESTORE_MAX_MB). Nothing was sent.")
    return entry


def write_restore_file(backup: str, path: str, host: Host = None, pbs_host: Host = None,
                       dry_run: DryRunArg = False) -> dict:
    """A file (a dir as .zip) named as backup_files does, to PROXMOX_RESTORE_DIR."""
    settings = _restore.get()
    folder = settings.folder
    if folder is None:
        raise ProxmoxError("PROXMOX_RESTORE_DIR is not set: restored files go only to the folder it names.")
    clean = "/" + path.strip().strip("/")
    if clean.count("/") < 2:
        raise InvalidArgument(f"'{clean}' is a whole archive; name a file or directory inside it "
                              f"(backup_files lists them).")
    source = _backup(host, pbs_host, backup, None)
    # a dry run answers the download itself: the listing first would be a sensitive read, held back too
    entry = {"type": "file"} if dry_run else _saved_entry(source, clean)
    destination = _destination(folder, source, clean, entry["type"] == "dir", create=not dry_run)
    where, params = source.download_path()
    size = source.client.download(where, params | {"filepath": _encoded(clean)}, destination, settings.max_bytes,
                                  also=("write", f"saves it to {folder} on this server"))
    answer = {"result": "ok", "backup": source.label, "path": clean, "saved": str(destination),
              "size": human_bytes(size), "sha256": _sha256(destination)}
    if entry["type"] == "dir":
        answer["note"] = "The directory was saved as a zip archive."
    else:  # the read itself needed the sensitive gate (docs/SECURITY.md)
        answer |= _shown(destination, size)
    return answer
