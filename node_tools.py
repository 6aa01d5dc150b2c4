"""A node's files over SFTP, and its power.

Files: list a directory (read) and read a file (sensitive: a node's files hold secrets), over SFTP as
the SSH user (SFTP does not pass through sudo). Reads refuse what is secret by nature: /etc/pve/priv,
/etc/shadow and /etc/gshadow, private keys, process environments, the Backup Server's password and
token files, judged on the path given and on the node's real path of it (a link to /etc/shadow is
/etc/shadow); the rest is masked like any answer. A deny list is incomplete by nature: a .env or
wp-config.php is read like any file. Downloads and uploads go between the node and the folder
PROXMOX_TRANSFER_DIR names, never outside it: each folder below it is opened without following a
link, a download never replaces a file, an upload reads a regular file only. Writing, uploading and
deleting a node's file is elevated (root on the host), and confirmed. The admission step judges a
path by what it is (policy.shell_decision): a guest's disk, root or backups are its files (exec, the
guest named), cluster configuration (/etc/pve, /etc/proxmox-backup) is changed through the API only;
a path whose real one the node resolves elsewhere is judged again there (_judged_alike). A read pages
through the file masked from its start (masking.masked_page).

Power: reboot or shut down a node (POST /nodes/{node}/status), elevated and destructive. The plan
names every guest there and what happens to it (power_effects.py: HA moves, freezes or stops it,
stop-all shuts the others down), is put to the user once, and the policy refuses it while a
protected guest there would be changed.
"""

import hashlib
import os
import posixpath
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context
from pydantic import Field

import policy
import power_effects
import runtime
from answers import ConfirmArg, DryRunArg, Host, Limit, Offset, human_bytes, iso_time, table
from errors import InvalidArgument, ProxmoxError
from inventory import check_node
from masking import masked_page
from proxmox_client import pve_client
from ssh import admitted, sftp, target_for


@dataclass
class TransferSettings:
    folder: Path | None = None  # PROXMOX_TRANSFER_DIR
    max_bytes: int = 1024 ** 3  # PROXMOX_TRANSFER_MAX_MB


_transfer = runtime.slot("node_tools.transfer", TransferSettings)
READ_BYTES = 256 * 1024  # of a file one read answers (offset pages on, in the masked text)
LOOKAHEAD = 64 * 1024  # read past the page, so that a secret it ends in is masked whole
MASKED_BYTES = 8 * 1024 ** 2  # of a file's start a read masks and pages through
LIST_ROWS = 200
# Files no read returns, on the path given or the node's real path (docs/SECURITY.md#node-files): (regex, why)
# At any root: a container's root is visible on its node (/var/lib/lxc/<vmid>/rootfs, a ZFS subvol), and its
# /etc/shadow is as secret as the node's.
ANY_ROOT = "(?:.*/)?"
REFUSED = [
    (ANY_ROOT + r"etc/pve/priv(/.*)?", "the cluster's private keys and credentials"),
    (ANY_ROOT + r"etc/g?shadow-?", "password hashes"),
    (ANY_ROOT + r"proc/[^/]+(/task/[^/]+)?/environ", "a process's environment (it holds secrets)"),
    (r".*/ssh_host_[^/]*_key", "an SSH host private key"),
    (r".*/\.ssh/id_[^/.]+|.*/id_(rsa|dsa|ecdsa|ed25519)(_sk)?", "an SSH private key"),
    (r".*\.key", "a private key"),
    (ANY_ROOT + r"etc/proxmox-backup/(shadow\.json|token\.shadow|.*\.key)",
     "the Backup Server's password or token secrets"),
    # pve-cluster API2/ClusterConfig.pm $authfile (handed to joining nodes)
    (ANY_ROOT + r"etc/corosync/authkey", "the cluster's corosync key"),
    # proxmox-backup src/tape/encryption_keys.rs
    (ANY_ROOT + r"etc/proxmox-backup/tape-encryption-keys\.json", "the tape encryption keys"),
    # pbs-api-types remote.rs: "The stored password is base64 encoded"
    (ANY_ROOT + r"etc/proxmox-backup/remote\.cfg", "the remotes' passwords (base64 only)"),
    (ANY_ROOT + r"etc/pve/sdn/(ipams|dns)\.cfg", "the SDN IPAM and DNS credentials (in the clear)"),  # pve-network
]
KINDS = {stat.S_IFDIR: "dir", stat.S_IFREG: "file", stat.S_IFLNK: "symlink", stat.S_IFCHR: "char device",
         stat.S_IFBLK: "block device", stat.S_IFIFO: "fifo", stat.S_IFSOCK: "socket"}
NodePath = Annotated[str, Field(pattern=r"^/[^\x00]*$", max_length=4096)]
LocalName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9._/-]{0,254}$",
                                 description="e.g. pve1/interfaces")]
Where = Annotated[str, Field(description="node or 'pbs'")]


def configure(folder: Path | None, max_bytes: int) -> None:
    _transfer.set(TransferSettings(folder, max_bytes))


def _where(where: str, host: Host) -> tuple[Any, str]:
    return (target_for("pbs", host), "pbs") if where == "pbs" else (target_for("pve", host), where)


def _clean(path: str) -> str:
    clean = posixpath.normpath(path)
    return "/" + clean.lstrip("/")


def _refused(path: str) -> str | None:
    return next((why for pattern, why in REFUSED if re.fullmatch(pattern, path)), None)


def _readable(client: Any, node: str, path: str, action: str = "read") -> str:
    """The node's real path of a file a read may return; a secret one is refused (given or real), and
    one the policy would judge otherwise than the path given (_judged_alike)."""
    for real in (path, _clean(client.normalize(path))):
        why = _refused(real)
        if why:
            raise InvalidArgument(f"{real} on {node} is {why}: no tool reads it. Nothing was returned.")
    _judged_alike(node, action, path, real)
    return real


def _real_parent(client: Any, path: str) -> str:
    """The node's real path of a file to write or delete: its folder's links resolved (the file itself
    is never a link: _writable)."""
    folder, name = posixpath.split(path)
    try:
        return posixpath.join(_clean(client.normalize(folder)), name)
    except OSError:
        return path  # no such folder: the write fails there


def _judged_alike(node: str, action: str, given: str, real: str) -> None:
    """The admission judged the path given (the guests it names, cluster configuration); a link that
    leads where it would judge otherwise is refused (docs/SECURITY.md#node-files)."""
    if policy.node_file_view(action, real) != policy.node_file_view(action, given):
        raise InvalidArgument(f"{given} on {node} leads to {real}, which is judged otherwise (a guest's files or "
                              f"cluster configuration): name that path. Nothing was done.")


def _kind(mode: int | None) -> str:
    return KINDS.get(stat.S_IFMT(mode or 0), "?")


def _list(client: Any, node: str, path: str, limit: int, offset: int) -> dict:
    _judged_alike(node, "list", path, _clean(client.normalize(path)))
    rows = [{"name": a.filename, "type": _kind(a.st_mode), "size": human_bytes(a.st_size),
             "mode": oct(stat.S_IMODE(a.st_mode or 0)), "modified": iso_time(a.st_mtime)}
            for a in sorted(client.listdir_attr(path), key=lambda a: a.filename)]
    return {"path": path} | table(["name", "type", "size", "mode", "modified"], rows, limit=limit, offset=offset)


def _read(client: Any, node: str, path: str, offset: int) -> dict:
    """A page of a file's text, masked from the file's start before it is cut (masking.masked_page): the
    caller's offset (in the masked text) never cuts a secret out of its mask. Only MASKED_BYTES from the
    start are read so; the rest of a larger file is downloaded."""
    real = _readable(client, node, path)
    attributes = client.stat(real)
    if not stat.S_ISREG(attributes.st_mode or 0):
        raise InvalidArgument(f"{real} on {node} is a {_kind(attributes.st_mode)}, not a file.")
    if offset >= MASKED_BYTES:
        raise InvalidArgument(f"offset={offset}: a read shows the first {MASKED_BYTES // 1024 ** 2} MiB of a file, "
                              f"masked from its start; download the file (write_node_files action=download) for "
                              f"the rest.")
    wanted = min(offset + READ_BYTES + LOOKAHEAD, MASKED_BYTES)
    with client.open(real, "rb") as handle:
        data = handle.read(wanted + 1)
    if b"\x00" in data:
        return {"path": real, "size": human_bytes(attributes.st_size), "binary": True,
                "note": "a binary file: download it (write_node_files action=download)"}
    complete = len(data) <= wanted
    page, following = masked_page(data[:wanted].decode("utf-8", "replace"), offset, READ_BYTES, complete)
    answer = {"path": real, "size": human_bytes(attributes.st_size), "content": page, "untrusted": True}
    if following is not None:
        answer |= {"truncated": True, "next_offset": following}
    elif not complete:
        answer |= {"truncated": True, "note": f"past the first {MASKED_BYTES // 1024 ** 2} MiB (or a private key "
                                               f"that does not end): download the file for the rest"}
    return answer


def node_files(where: Where, path: NodePath, action: Literal["list", "read"] = "list", host: Host = None,
               limit: Limit = LIST_ROWS, offset: Offset = 0) -> dict:
    """A node's directory or file (sensitive; secrets refused)."""
    target, node = _where(where, host)
    clean = _clean(path)
    if action == "read" and _refused(clean):
        raise InvalidArgument(f"{clean} on {node} is {_refused(clean)}: no tool reads it. Nothing was sent.")
    gates = ("read",) if action == "list" else ("sensitive",)
    answer = admitted(target.product, target.label, gates, f"sftp {node}: {action} {clean}", [],
                      lambda: _sftp(target, node, lambda c: _list(c, node, clean, limit, offset) if action == "list"
                                    else _read(c, node, clean, offset)), node_file=(action, clean))
    return {"node": node} | answer | {"untrusted": True}


def _sftp(target: Any, node: str, work: Any) -> Any:
    client = sftp(target, node)
    try:
        return work(client)
    except OSError as exc:  # paramiko raises IOError with the SFTP status (no such file, permission denied)
        raise ProxmoxError(f"SFTP on {node}: {exc.strerror or exc}.") from None
    finally:
        client.close()


# ---------------------------------------------------------------- this server's folder

def _local_parts(name: str) -> list[str]:
    parts = name.split("/")
    if any(part in ("", ".", "..") for part in parts) or len(parts) > 8:
        raise InvalidArgument(f"local={name!r}: a name below PROXMOX_TRANSFER_DIR, its parts without '.' or '..', "
                              f"at most 8 deep (e.g. pve1/interfaces). Nothing was sent.")
    return parts


def _folder() -> tuple[Path, int]:
    settings = _transfer.get()
    if settings.folder is None:
        raise ProxmoxError("PROXMOX_TRANSFER_DIR is not set: node files move only to and from the folder it names.")
    return settings.folder, settings.max_bytes


def _open_parent(parts: list[str], create: bool) -> int:
    """The folder holding `parts`' file, opened folder by folder from PROXMOX_TRANSFER_DIR without
    following a link (O_NOFOLLOW at each step); `create` makes the missing ones (0700)."""
    folder, _ = _folder()
    if create:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            if create:
                try:
                    os.mkdir(part, 0o700, dir_fd=fd)
                except FileExistsError:
                    pass
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = inner
    except OSError as exc:
        os.close(fd)
        raise InvalidArgument(f"{'/'.join(parts[:-1])} below PROXMOX_TRANSFER_DIR cannot be opened as a folder "
                              f"({exc.strerror}; a link is never followed). Nothing was sent.") from None
    return fd


def _download(target: Any, node: str, path: str, local: str) -> dict:
    """Node file -> a new local file (0600), all or nothing, within PROXMOX_TRANSFER_MAX_MB."""
    parts = _local_parts(local)
    _, cap = _folder()
    parent = _open_parent(parts, create=True)
    try:
        fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=parent)
    except OSError as exc:
        os.close(parent)
        raise InvalidArgument(f"local={local!r} cannot be created ({exc.strerror}); a download never replaces a "
                              f"file. Nothing was sent.") from None
    digest, written = hashlib.sha256(), 0
    try:
        with os.fdopen(fd, "wb") as out:
            def copy(client: Any) -> str:
                nonlocal written
                real = _readable(client, node, path, "download")
                with client.open(real, "rb") as source:
                    while block := source.read(1 << 16):
                        written += len(block)
                        if written > cap:
                            raise InvalidArgument(f"{real} is larger than the {cap // 1024 ** 2} MiB cap "
                                                  f"(PROXMOX_TRANSFER_MAX_MB); nothing was kept.")
                        digest.update(block)
                        out.write(block)
                return real
            real = _sftp(target, node, copy)
    except BaseException:
        os.unlink(parts[-1], dir_fd=parent)
        raise
    finally:
        os.close(parent)
    return {"path": real, "saved": str(_folder()[0] / local), "size": human_bytes(written),
            "sha256": digest.hexdigest()}


def _local_file(local: str) -> tuple[int, int, str]:
    """A regular local file to upload: (fd, size, sha256), opened without following a link."""
    parts = _local_parts(local)
    _, cap = _folder()
    parent = _open_parent(parts, create=False)
    try:
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW, dir_fd=parent)
    except OSError as exc:
        raise InvalidArgument(f"local={local!r} cannot be opened ({exc.strerror}; a link is never followed). "
                              f"Nothing was sent.") from None
    finally:
        os.close(parent)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size > cap:
        os.close(fd)
        raise InvalidArgument(f"local={local!r} is not a regular file of at most {cap // 1024 ** 2} MiB "
                              f"(PROXMOX_TRANSFER_MAX_MB). Nothing was sent.")
    digest = hashlib.sha256()
    while block := os.read(fd, 1 << 16):
        digest.update(block)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd, info.st_size, digest.hexdigest()


def _writable(client: Any, node: str, path: str, action: str) -> int | None:
    """A node path a write may replace: not a link, not a folder, in a folder judged as the path given;
    the mode of the file there (None: new)."""
    _judged_alike(node, action, path, _real_parent(client, path))
    try:
        attributes = client.lstat(path)
    except OSError:
        return None  # a new file
    if not stat.S_ISREG(attributes.st_mode or 0):
        raise InvalidArgument(f"{path} on {node} is a {_kind(attributes.st_mode)}; only a regular file is written "
                              f"or deleted here (a link is never followed).")
    return stat.S_IMODE(attributes.st_mode)


def _put(client: Any, node: str, path: str, blocks: Any, action: str = "write") -> int:
    """Written beside it as `<path>.tmp.<random>`, then renamed over it, as Proxmox writes every /etc/pve
    file (pve-common File.pm file_set_contents): pmxcfs replicates each write at once, and pve-firewall,
    the HA stack or pvestatd never read it half-written (docs/PROXMOX-BEHAVIOUR.md#node-files)."""
    mode = _writable(client, node, path, action)
    temporary, sent = f"{path}.tmp.{os.urandom(4).hex()}", 0
    try:
        with client.open(temporary, "wbx") as out:
            for block in blocks:
                out.write(block)
                sent += len(block)
        client.chmod(temporary, 0o644 if mode is None else mode)
        client.posix_rename(temporary, path)
    except BaseException:
        try:
            client.remove(temporary)
        except OSError:
            pass  # never made, or renamed already
        raise
    return sent


PMXCFS_MAX = 1024 * 1024  # a file in /etc/pve (pve-cluster src/pmxcfs/memdb.h MEMDB_MAX_FILE_SIZE)


def _fits(path: str, size: int) -> None:
    if (path == "/etc/pve" or path.startswith("/etc/pve/")) and size > PMXCFS_MAX:
        raise InvalidArgument(f"{path} is in /etc/pve (pmxcfs), which holds files of at most 1 MiB; this is "
                              f"{human_bytes(size)}. Nothing was sent.")


def _file_blocks(fd: int, expected: str) -> Any:
    """The local file's blocks; it must still be what was hashed for the audit line."""
    digest = hashlib.sha256()
    while block := os.read(fd, 1 << 16):
        digest.update(block)
        yield block
    if digest.hexdigest() != expected:
        raise ProxmoxError("The local file changed while it was sent; the node has what was read. Send it again.")


def _delete(client: Any, node: str, path: str) -> None:
    _writable(client, node, path, "delete")
    client.remove(path)


def write_node_files(where: Where, action: Literal["download", "upload", "write", "delete"], path: NodePath,
                     local: LocalName | None = None,
                     content: Annotated[str | None, Field(max_length=1024 * 1024)] = None, host: Host = None,
                     dry_run: DryRunArg = False, confirm: ConfirmArg = False, ctx: Context | None = None) -> dict:
    """Download, upload (PROXMOX_TRANSFER_DIR), write or delete a node's file."""
    target, node = _where(where, host)
    clean = _clean(path)
    if action in ("download", "upload") and not local:
        raise InvalidArgument(f"action={action} needs local, e.g. local=\"{node}/{posixpath.basename(clean)}\". "
                              f"Nothing was sent.")
    if action == "write" and content is None:
        raise InvalidArgument("action=write needs content. Nothing was sent.")
    what = f"sftp {node}: {action} {clean}"
    if action == "download":
        if _refused(clean):
            raise InvalidArgument(f"{clean} on {node} is {_refused(clean)}: no tool reads it. Nothing was sent.")
        return {"node": node} | admitted(target.product, target.label, ("sensitive", "write"), f"{what} to {local}",
                                         [], lambda: _download(target, node, clean, local), node_file=(action, clean))
    if action == "delete":
        admitted(target.product, target.label, ("elevated", "destructive"), what, [],
                 lambda: _sftp(target, node, lambda c: _delete(c, node, clean)), node_file=(action, clean))
        return {"node": node, "path": clean, "result": "deleted"}
    if action == "write":
        data = content.encode()
        _fits(clean, len(data))
        sent = admitted(target.product, target.label, ("elevated",), what, [],
                        lambda: _sftp(target, node, lambda c: _put(c, node, clean, [data])), contents=data,
                        node_file=(action, clean))
        return {"node": node, "path": clean, "bytes": sent, "result": "written"}
    fd, size, sha = _local_file(local)
    try:
        _fits(clean, size)
        sent = admitted(target.product, target.label, ("elevated",), f"{what} from {local}", [],
                        lambda: _sftp(target, node, lambda c: _put(c, node, clean, _file_blocks(fd, sha), "upload")),
                        audit={"file": {"bytes": size, "sha256": sha}}, node_file=(action, clean))
    finally:
        os.close(fd)
    return {"node": node, "path": clean, "bytes": sent, "sha256": sha, "result": "uploaded"}


# ---------------------------------------------------------------- power

# pve-manager services/pve-guests.service: `ExecStop=-/usr/bin/vzdump -stop` runs before stop-all
ABORTS = "A backup running on the node is aborted (pve-guests stops vzdump before its guests)."


def write_node_power(node: str, action: Literal["reboot", "shutdown"],
                     host: Host = None, dry_run: DryRunArg = False, confirm: ConfirmArg = False,
                     ctx: Context | None = None) -> dict:
    """Reboot or shut down a node; the plan says what happens to each guest."""
    client = pve_client(host)
    check_node(client, node)
    effects = power_effects.effects(client.get, node, action)
    rows = table(["vmid", "name", "type", "status", "what_happens", "moved_to"], [e.row() for e in effects])
    words = "; ".join(f"{e.name or 'guest'} ({e.vmid}): {e.how}" for e in effects) or "no guest runs there"
    path = f"/nodes/{node}/status"
    try:
        client.plan([("POST", path, {"command": action})], f"{action.capitalize()} node {node}: {words}. {ABORTS}")
    except policy.DryRun as dry:  # the answer of a dry run shows the guests too
        dry.plan["guests"] = rows
        raise
    client.request("POST", path, {"command": action})
    stuck = [e.vmid for e in effects if e.how.startswith("HA cannot move it")]
    return {"node": node, "action": action, "result": "requested", "guests": rows,
            "note": f"{ABORTS} The node goes down a few seconds after the call; cluster_status shows when it is "
                    f"{'back' if action == 'reboot' else 'off'}." + (
                        f" Its shutdown waits while HA cannot move guest(s) {', '.join(map(str, stuck))}."
                        if stuck else "")}
