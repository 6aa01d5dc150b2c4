"""One file back from a backup: browse inside a backup and save a file (or a directory as a zip)
into the folder PROXMOX_RESTORE_DIR names. A restored file goes into the answer only when the
caller asks (`show=true`: a small UTF-8 text file, masked like every answer, marked untrusted);
otherwise the answer names the saved file, its size and SHA-256.

Two ways in (docs/PROXMOX-BEHAVIOUR.md#backup-file-restore): through Proxmox VE's file-restore for
a backup on a `pbs` storage (containers and VMs; for a VM, PVE boots a small restore VM to read the
disk, and listings inside the image answer 503 until it is up: they are tried again once, then the
answer says to call again), or through the Backup Server's catalog (containers and host backups; a VM
backup is a disk image and has none): asked for, or when PVE does not list a container's backup to
this token. Backup contents are sensitive: both reads are at the sensitive gate, and saving a file
is a write to this server's disk. The saved file is opened relative to the restore folder without
following links (`NewFile`): a link planted there cannot send it elsewhere.
"""
import base64
import calendar
import hashlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import runtime
from answers import DryRunArg, Host, Limit, Offset, OptionalVmid, human_bytes, iso_time, table
from errors import InvalidArgument, ProxmoxError
from inventory import backup_grant, hidden_backups, pbs_backed_storages, storage_node, storage_rows
from masking import mask
from proxmox_client import ProxmoxClient, configured, pbs_client, pve_client


@dataclass
class RestoreSettings:
    folder: Path | None = None  # PROXMOX_RESTORE_DIR
    max_bytes: int = 1024 ** 3  # PROXMOX_RESTORE_MAX_MB


_restore = runtime.slot("file_restore.restore", RestoreSettings)  # this server's (configure)
SHOWN_TEXT = 16 * 1024  # a restored file up to this size may be shown (show=true)
KINDS = {"d": "dir", "f": "file", "l": "symlink", "h": "hardlink", "v": "volume", "b": "block device",
         "c": "char device", "p": "fifo", "s": "socket"}  # catalog entry types (pbs-datastore catalog.rs)
PBS_VOLID = re.compile(r"(?P<storage>[^:]+):backup/(?P<kind>vm|ct)/(?P<vmid>\d+)/(?P<time>\S+)")
# Listings inside a VM image in one call: PVE gives up on each after 25 s while the restore VM boots
# (503 `list not finished in time`; the GUI lists again: docs/PROXMOX-BEHAVIOUR.md#backup-file-restore)
RESTORE_VM_TRIES = 2


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
    blind: str = ""  # why a PVE backup is read on the Backup Server: PVE does not list it to this token

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


def _pve_backup(host: Host, pbs_host: Host, volid: str | None, vmid: int | None) -> Source:
    """A PBS-backed backup on PVE, by volid, or the guest's newest one; read through the Backup Server's
    catalog when PVE does not list it to this token."""
    client = pve_client(host)
    if not volid:
        return _newest(client, pbs_host, vmid)
    match = PBS_VOLID.fullmatch(volid)
    if not match:
        raise InvalidArgument(f"'{volid}' is not a backup on a PBS storage (storage:backup/vm|ct/<vmid>/<time>); "
                              f"single files come only out of those. Restore a vzdump archive whole "
                              f"(write_restore_backup), or take a volid from list_backups.")
    storage = match["storage"]
    if hidden_backups(client, storage, [int(match["vmid"])]):
        return _blind(client, pbs_host, match)
    return Source(client, volid, storage_node(client, storage, None), storage, volid)


def _newest(client: ProxmoxClient, pbs_host: Host, vmid: int) -> Source:
    """The guest's newest backup on a PBS storage: listed by PVE, or, on a storage where PVE lists
    this token none of the guest's, on the Backup Server the storage writes to."""
    found, seen = [], set()
    pbs, on_pbs = None, None
    for row in storage_rows(client):
        storage = row["storage"]
        if row.get("plugintype") != "pbs" or row.get("status") != "available" or storage in seen:
            continue
        seen.add(storage)
        if not hidden_backups(client, storage, [vmid]):
            found += [(v.get("ctime") or 0, v["volid"], row["node"]) for v in client.get(
                f"/nodes/{row['node']}/storage/{storage}/content", content="backup", vmid=vmid) or []]
            continue
        if on_pbs is None:  # read once, for the first storage that hides the guest's backups
            pbs = _backup_server(pbs_host)
            on_pbs = pbs_backed_storages(client, pbs) if pbs else {}
        if storage in on_pbs:
            store, ns = on_pbs[storage]
            found += [(s["backup-time"], f"{storage}:backup/{s['backup-type']}/{vmid}/"
                       f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(s['backup-time']))}", None)
                      for s in pbs.get(f"/admin/datastore/{store}/snapshots", ns=ns or None,
                                       **{"backup-id": str(vmid)}) or [] if s.get("backup-type") in ("vm", "ct")]
    if not found:
        raise InvalidArgument(f"No PBS-backed backup of guest {vmid} is visible (the token needs "
                              f"Datastore.AllocateSpace on the storage and VM.Backup on the guest to see backups; "
                              f"list_backups shows what is there).")
    _, newest, node = max(found)
    if node is None:  # read on the Backup Server
        return _blind(client, pbs_host, PBS_VOLID.fullmatch(newest))
    return Source(client, newest, node, newest.split(":", 1)[0], newest)


def _blind(client: ProxmoxClient, pbs_host: Host, match: re.Match) -> Source:
    """A backup PVE does not list to this token (docs/PROXMOX-BEHAVIOUR.md#who-sees-which-volume): a
    container's is read through the catalog of the Backup Server its storage writes to."""
    storage, kind, vmid = match["storage"], match["kind"], int(match["vmid"])
    why = (f"PVE does not let {client.host.token_id} read backup {match.group(0)}: it lacks Datastore.AllocateSpace "
           f"on /storage/{storage} or VM.Backup on /vms/{vmid} ({backup_grant(client)})")
    if kind == "vm":
        raise ProxmoxError(f"{why}. A VM backup is a disk image only PVE opens (the Backup Server has no file "
                           f"catalog of it), so grant that to browse it.", status=403)
    pbs = _backup_server(pbs_host)
    where = pbs_backed_storages(client, pbs).get(storage) if pbs else None
    if where is None:
        several = " (several are: name it with pbs_host)" if pbs is None and configured("pbs") else ""
        raise ProxmoxError(f"{why}, and no configured Backup Server{several} holds storage {storage}'s datastore, "
                           f"whose catalog would show it.", status=403)
    stamp = calendar.timegm(time.strptime(match["time"], "%Y-%m-%dT%H:%M:%SZ"))
    snapshot = {"store": where[0], "ns": where[1] or None, "backup-type": "ct", "backup-id": str(vmid),
                "backup-time": stamp}
    return Source(pbs, match.group(0), snapshot=snapshot, blind=why)


def _backup_server(pbs_host: Host) -> ProxmoxClient | None:
    """The Backup Server to read a backup PVE hides on: the one named, or the only one configured."""
    return pbs_client(pbs_host) if pbs_host or len(configured("pbs")) == 1 else None


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
    return _pve_backup(host, pbs_host, backup, vmid)


def _entries(source: Source, path: str) -> list[dict]:
    rows = _listing(source, path)
    return [{"path": _decoded(r["filepath"]), "type": KINDS.get(r.get("type"), r.get("type")),
             "size": r.get("size"), "modified": iso_time(r.get("mtime"))} for r in rows]


def _listing(source: Source, path: str) -> list[dict]:
    """One directory's rows; a listing inside a VM image is tried again while its restore VM boots."""
    where, params = source.list_path()
    for _ in range(RESTORE_VM_TRIES):
        try:
            return source.client.get(where, **params, filepath=_encoded(path)) or []
        except ProxmoxError as exc:
            if source.blind and exc.status == 403:
                raise ProxmoxError(f"{source.blind}; the Backup Server refuses its catalog too: {exc}",
                                   status=403) from None
            if exc.status != 503 or "not finished in time" not in str(exc):
                raise
    raise ProxmoxError(f"The restore VM that opens {source.label} is still starting: Proxmox gave up listing "
                       f"{path} after 25 s, {RESTORE_VM_TRIES} times. Call again in about 30 s (it stays up "
                       f"10 minutes after its last use).", status=503)


def backup_files(backup: str | None = None, vmid: OptionalVmid = None, path: str = "/",
                 host: Host = None, pbs_host: Host = None, limit: Limit = 200, offset: Offset = 0) -> dict:
    """A volid on a PBS storage, vmid's newest, or PBS store:ct/102[/time]."""
    source = _backup(host, pbs_host, backup, vmid)
    rows = _entries(source, path)
    for row in rows:
        row["size"] = human_bytes(row["size"])
    result = {"backup": source.label, "path": "/" + path.strip().strip("/")}
    return result | table(["path", "type", "size", "modified"], rows, limit=limit, offset=offset)


class NewFile:
    """A new file `<label>/<name>` under the restore folder, never over an existing name and never
    through a link: the label folder is opened relative to the restore folder without following a
    link (O_DIRECTORY | O_NOFOLLOW), the file is made in it as `<name>.part` (O_CREAT | O_EXCL |
    O_NOFOLLOW, 0600) and linked to a free name once complete (linkat refuses a name that exists).
    Its SHA-256, and its first SHOWN_TEXT bytes, are kept as it is written. proxmox_client.Sink."""

    def __init__(self, folder: Path, label: str, name: str):
        self.folder, self.label, self.wanted, self.name = folder, label, name, name
        self.digest, self.head = hashlib.sha256(), bytearray()
        self.dir_fd: int | None = None
        self.file: Any = None

    @property
    def path(self) -> Path:
        return self.folder / self.label / self.name

    def open(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)  # backup contents: this server's user only
        top = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            try:
                os.mkdir(self.label, 0o700, dir_fd=top)
            except FileExistsError:
                pass
            self.dir_fd = os.open(self.label, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=top)
        except OSError as exc:
            raise ProxmoxError(f"{self.folder / self.label} is not a folder of its own ({exc.strerror}: a link or a "
                               f"file is there); nothing was saved. Remove it from PROXMOX_RESTORE_DIR.") from None
        finally:
            os.close(top)
        try:
            self.name = self._free()
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            self.file = os.fdopen(os.open(self.name + ".part", flags, 0o600, dir_fd=self.dir_fd), "wb")
        except BaseException:
            os.close(self.dir_fd)
            raise

    def _free(self) -> str:
        """The first of name, name-1, name-2 ... for which neither it nor its .part exists (links count)."""
        stem, dot, suffix = self.wanted.partition(".zip") if self.wanted.endswith(".zip") else (self.wanted, "", "")
        for number in range(10_000):
            name = f"{stem}-{number}{dot}{suffix}" if number else self.wanted
            if not any(self._exists(n) for n in (name, name + ".part")):
                return name
        raise ProxmoxError(f"{self.folder / self.label} holds 10,000 files named {self.wanted}; clear it out.")

    def _exists(self, name: str) -> bool:
        try:
            os.stat(name, dir_fd=self.dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return True

    def write(self, data: bytes) -> None:
        self.file.write(data)
        self.digest.update(data)
        if len(self.head) <= SHOWN_TEXT:
            self.head += data[:SHOWN_TEXT + 1 - len(self.head)]

    def keep(self) -> None:
        self.file.close()
        part = self.name + ".part"
        while True:
            try:
                os.link(part, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd, follow_symlinks=False)
                break
            except FileExistsError:  # made meanwhile: the next free name
                self.name = self._free()
        os.unlink(part, dir_fd=self.dir_fd)
        os.close(self.dir_fd)

    def drop(self) -> None:
        if self.file is not None:
            self.file.close()
            try:
                os.unlink(self.name + ".part", dir_fd=self.dir_fd)
            except FileNotFoundError:
                pass
        if self.dir_fd is not None:
            os.close(self.dir_fd)


def _new_file(folder: Path, source: Source, path: str, directory: bool) -> NewFile:
    """Where a restore saves: <folder>/<backup>/<name>, a directory as <name>.zip."""
    label = re.sub(r"[^A-Za-z0-9_.-]+", "_", source.label.split(":", 1)[-1]).strip("_")
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", path.rstrip("/").rsplit("/", 1)[-1]) or "backup"
    return NewFile(folder, label, name + (".zip" if directory else ""))


def _shown(saved: NewFile, size: int) -> dict:
    """A small text file's contents, masked like every answer and marked as data from the backup,
    not instructions."""
    if size > SHOWN_TEXT:
        return {"not_shown": f"larger than {SHOWN_TEXT // 1024} KiB; read it from the saved file"}
    try:
        return {"content": mask(bytes(saved.head).decode("utf-8")), "untrusted": True}
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


def write_restore_file(backup: str, path: str, host: Host = None, pbs_host: Host = None, show: bool = False,
                       dry_run: DryRunArg = False) -> dict:
    """A file (a dir as .zip) from backup_files to PROXMOX_RESTORE_DIR; show: its text too."""
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
    saved = _new_file(folder, source, clean, entry["type"] == "dir")
    where, params = source.download_path()
    size = source.client.download(where, params | {"filepath": _encoded(clean)}, saved, settings.max_bytes,
                                  also=("write", f"saves it to {folder} on this server"))
    answer = {"result": "ok", "backup": source.label, "path": clean, "saved": str(saved.path),
              "size": human_bytes(size), "sha256": saved.digest.hexdigest()}
    if entry["type"] == "dir":
        answer["note"] = "The directory was saved as a zip archive."
    elif show:  # the read itself needed the sensitive gate (docs/SECURITY.md#files-from-backups)
        answer |= _shown(saved, size)
    return answer
