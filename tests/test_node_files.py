"""A node's files over SFTP (node_files, write_node_files; node_tools.py) against the suite's real sshd:
listing and reading (secret files refused on the path given and on the node's real path, the rest
masked), downloads and uploads that never leave PROXMOX_TRANSFER_DIR nor follow a link there, and
writes and deletes at the elevated gate."""
import hashlib
import json
import os
import stat

import pytest

from conftest import tool_session
from test_shell_tools import SSHD, fake_nodes, ssh_env

pytestmark = pytest.mark.skipif((not os.path.exists(SSHD) or os.geteuid() != 0) and not os.environ.get("CI"),
                                reason="needs openssh-server and root (to run sshd); .ci/run has both")
KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n"


@pytest.fixture(scope="module")
def sshd():
    with fake_nodes() as info:
        yield info


@pytest.fixture(scope="module")
def tree(sshd):
    """Files on the 'node' (the sshd's machine), under a folder of this module's own."""
    top = sshd["base"] / "files"
    (top / "etc" / "network").mkdir(parents=True)
    (top / "etc" / "network" / "interfaces").write_text("auto vmbr0\niface vmbr0 inet static\n")
    (top / "etc" / "backup.conf").write_text(f"# keys below\n{KEY}password=hunter2-secret\n")
    (top / "etc" / "blob.bin").write_bytes(b"\x00\x01\x02binary")
    (top / "shadow-link").symlink_to("/etc/shadow")
    (top / "keys").mkdir()
    (top / "keys" / "id_ed25519").write_text(KEY)
    (top / "keys" / "server.key").write_text(KEY)
    return top


@pytest.fixture(scope="module")
def files(sim, sshd, tree, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("node-files")
    env = ssh_env(sim, sshd, tmp) | {"PROXMOX_TOOLSETS": "all", "PROXMOX_ACCESS": "destructive",
                                     "PROXMOX_TRANSFER_DIR": str(tmp / "transfer")}
    with tool_session(env, log_name="node-files") as session:
        session.tmp, session.transfer = tmp, tmp / "transfer"
        yield session


def test_list_a_directory(files, tree):
    listed = files.ok("node_files", {"where": "pve1", "path": str(tree / "etc")})
    rows = {r[0]: dict(zip(listed["columns"], r, strict=True)) for r in listed["rows"]}
    assert rows["network"]["type"] == "dir" and rows["backup.conf"]["type"] == "file" and listed["untrusted"]
    assert listed["total"] == 3 and rows["backup.conf"]["mode"] == "0o644"
    assert "No such file" in files.error("node_files", {"where": "pve1", "path": str(tree / "nope")})


def test_read_a_file_masked_and_binary_not_shown(files, tree):
    read = files.ok("node_files", {"where": "pve2", "path": str(tree / "etc" / "network" / "interfaces"),
                                   "action": "read"})
    assert read["content"] == "auto vmbr0\niface vmbr0 inet static\n" and read["untrusted"]
    masked = files.ok("node_files", {"where": "pve2", "path": str(tree / "etc" / "backup.conf"), "action": "read"})
    assert "b3BlbnNzaC1rZXkt" not in masked["content"] and "hunter2-secret" not in masked["content"]
    assert "PRIVATE KEY-----***" in masked["content"]
    binary = files.ok("node_files", {"where": "pve2", "path": str(tree / "etc" / "blob.bin"), "action": "read"})
    assert binary["binary"] is True and "content" not in binary


@pytest.mark.parametrize("path, why", [
    ("/etc/shadow", "password hashes"), ("/etc/pve/priv/authkey.key", "private keys and credentials"),
    ("/proc/self/environ", "environment"), ("/proc/1/task/1/environ", "environment"),
    ("/etc/ssh/ssh_host_ed25519_key", "SSH host private key"), ("/root/.ssh/id_rsa", "SSH private key"),
    ("/etc/proxmox-backup/token.shadow", "password or token secrets"), ("/etc/../etc/./shadow", "password hashes"),
    ("/etc/corosync/authkey", "corosync key"), ("/etc/proxmox-backup/tape-encryption-keys.json", "tape"),
    ("/etc/proxmox-backup/remote.cfg", "remotes' passwords"), ("/etc/pve/sdn/ipams.cfg", "IPAM and DNS"),
    ("/etc/pve/sdn/dns.cfg", "IPAM and DNS"),
])
def test_secret_files_are_refused_before_anything_is_sent(files, path, why):
    message = files.error("node_files", {"where": "pve1", "path": path, "action": "read"})
    assert why in message and "no tool reads it" in message


def test_links_to_secret_files_and_keys_by_name_are_refused_on_their_real_path(files, tree):
    linked = files.error("node_files", {"where": "pve1", "path": str(tree / "shadow-link"), "action": "read"})
    assert "/etc/shadow on pve1 is password hashes" in linked
    assert "SSH private key" in files.error("node_files", {"where": "pve1", "path": str(tree / "keys" / "id_ed25519"),
                                                           "action": "read"})
    assert "a private key" in files.error("node_files", {"where": "pve1", "path": str(tree / "keys" / "server.key"),
                                                          "action": "read"})


def test_reading_needs_the_sensitive_gate_listing_does_not(sim, sshd, tree, tmp_path):
    env = ssh_env(sim, sshd, tmp_path) | {"PROXMOX_TOOLSETS": "all", "PROXMOX_ALLOW_SENSITIVE": "false"}
    with tool_session(env, log_name="node-files-closed") as session:
        assert session.ok("node_files", {"where": "pve1", "path": str(tree / "etc")})["total"] == 3
        message = session.error("node_files", {"where": "pve1", "path": str(tree / "etc" / "backup.conf"),
                                               "action": "read"})
        assert "'sensitive' gate" in message and "PROXMOX_ALLOW_SENSITIVE" in message


def test_download_into_the_transfer_folder_never_replaces_nor_leaves_it(files, tree):
    source = tree / "etc" / "network" / "interfaces"
    done = files.ok("write_node_files", {"where": "pve1", "action": "download", "path": str(source),
                                         "local": "pve1/interfaces"})
    saved = files.transfer / "pve1" / "interfaces"
    assert saved.read_bytes() == source.read_bytes() and stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert done["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    assert "never replaces" in files.error("write_node_files", {"where": "pve1", "action": "download",
                                                                "path": str(source), "local": "pve1/interfaces"})
    for local in ["../outside", "pve1/../../outside", "/etc/passwd", ".hidden", "a//b"]:
        message = files.error("write_node_files", {"where": "pve1", "action": "download", "path": str(source),
                                                   "local": local})
        assert "local" in message and "Nothing was sent" in message, local
    os.symlink("/tmp", files.transfer / "escape")
    assert "a link is never followed" in files.error("write_node_files", {
        "where": "pve1", "action": "download", "path": str(source), "local": "escape/interfaces"})
    assert not os.path.exists("/tmp/interfaces")
    assert "password hashes" in files.error("write_node_files", {"where": "pve1", "action": "download",
                                                                 "path": str(tree / "shadow-link"),
                                                                 "local": "shadow"})
    assert not (files.transfer / "shadow").exists()  # the refused download left nothing behind


def test_upload_write_and_delete_are_elevated_and_confirmed(files, tree):
    (files.transfer / "up").mkdir(parents=True, exist_ok=True)
    (files.transfer / "up" / "motd").write_text("uploaded text\n")
    target = tree / "uploaded-motd"
    assert "confirm=true" in files.error("write_node_files", {"where": "pve1", "action": "upload", "path": str(target),
                                                              "local": "up/motd"})
    assert not target.exists()
    done = files.ok("write_node_files", {"where": "pve1", "action": "upload", "path": str(target), "local": "up/motd",
                                         "confirm": True})
    assert target.read_text() == "uploaded text\n" and done["sha256"] == hashlib.sha256(b"uploaded text\n").hexdigest()
    os.symlink("/etc/hostname", files.transfer / "up" / "hostname")
    assert "a link is never followed" in files.error("write_node_files", {
        "where": "pve1", "action": "upload", "path": str(tree / "h"), "local": "up/hostname", "confirm": True})
    files.ok("write_node_files", {"where": "pve1", "action": "write", "path": str(target),
                                  "content": "written-4243-text\n", "confirm": True})
    assert target.read_text() == "written-4243-text\n"
    assert "is a symlink" in files.error("write_node_files", {"where": "pve1", "action": "write",
                                                              "path": str(tree / "shadow-link"), "content": "x",
                                                              "confirm": True})
    assert "is a dir" in files.error("write_node_files", {"where": "pve1", "action": "delete",
                                                          "path": str(tree / "keys"), "confirm": True})
    files.ok("write_node_files", {"where": "pve1", "action": "delete", "path": str(target), "confirm": True})
    assert not target.exists()
    audit = (files.tmp / "audit.jsonl").read_text()
    assert "written-4243-text" not in audit and "uploaded text" not in audit
    upload = next(json.loads(x) for x in audit.splitlines() if "upload" in x and '"sent"' in x)
    assert upload["params"]["file"]["sha256"] == done["sha256"]


def test_a_write_replaces_the_file_by_rename_never_in_place(files, tree):
    """Proxmox writes every /etc/pve file as `<name>.tmp.<pid>` and renames it (pve-common File.pm
    file_set_contents): pmxcfs replicates each write at once, and pve-firewall or the HA stack can read a
    file truncated in place. So the file is a new one (a new inode), whole or not at all, with its mode."""
    target = tree / "pve-firewall" / "cluster.fw"
    target.parent.mkdir(exist_ok=True)
    target.write_text("[OPTIONS]\nenable: 1\n")
    target.chmod(0o640)
    before = target.stat()
    files.ok("write_node_files", {"where": "pve1", "action": "write", "path": str(target),
                                  "content": "[OPTIONS]\nenable: 1\npolicy_in: DROP\n", "confirm": True})
    after = target.stat()
    assert target.read_text().endswith("policy_in: DROP\n") and after.st_ino != before.st_ino
    assert stat.S_IMODE(after.st_mode) == 0o640
    assert sorted(p.name for p in target.parent.iterdir() if "cluster.fw" in p.name) == ["cluster.fw"]


def test_more_than_pmxcfs_holds_is_refused_before_sending(files):
    """pmxcfs caps a file at 1 MiB (pve-cluster src/pmxcfs/memdb.h MEMDB_MAX_FILE_SIZE): a larger upload
    into /etc/pve would fail midway, so it is refused before anything is sent."""
    (files.transfer / "up").mkdir(parents=True, exist_ok=True)
    (files.transfer / "up" / "big.cfg").write_bytes(b"#" * (1024 * 1024 + 1))
    message = files.error("write_node_files", {"where": "pve1", "action": "upload", "path": "/etc/pve/big.cfg",
                                               "local": "up/big.cfg", "confirm": True})
    assert "1 MiB" in message and "Nothing was sent" in message


def test_the_tiers_and_the_transfer_folder_setting(sim, sshd, tree, tmp_path):
    env = ssh_env(sim, sshd, tmp_path) | {"PROXMOX_TOOLSETS": "all"}  # write tier: no delete; no transfer folder
    with tool_session(env, log_name="node-files-write") as session:
        assert "'destructive' gate" in session.error("write_node_files", {
            "where": "pve1", "action": "delete", "path": str(tree / "etc" / "blob.bin"), "confirm": True})
        assert (tree / "etc" / "blob.bin").exists()
        assert "PROXMOX_TRANSFER_DIR is not set" in session.error("write_node_files", {
            "where": "pve1", "action": "download", "path": str(tree / "etc" / "blob.bin"), "local": "blob"})
        never = tmp_path / "never-written"  # the sshd is this machine: a dry run must leave no file there
        plan = session.ok("write_node_files", {"where": "pbs", "action": "write", "path": str(never), "content": "x",
                                               "dry_run": True})
        assert plan["dry_run"] is True and plan["gate"] == "elevated" and not never.exists()


@pytest.mark.mcp
def test_both_tools_over_mcp(files, tree):
    """Both tools through the SDK's client over stdio (the other tests here run in process)."""
    assert files.ok("node_files", {"where": "pbs", "path": str(tree / "etc")})["total"] == 3
    target = tree / "over-mcp"
    files.ok("write_node_files", {"where": "pve3", "action": "write", "path": str(target), "content": "mcp\n",
                                  "confirm": True})
    assert target.read_text() == "mcp\n"


def test_a_link_cannot_carry_a_file_write_or_read_into_a_guest(files, tree):
    """The admission judges the path given (docs/REVIEW-SECURITY.md F05, F06): a folder link that leads
    into a container's root on the node (protected 101's here) is refused at its real path, nothing written."""
    root = tree / "var" / "lib" / "lxc" / "101" / "rootfs" / "etc"
    root.mkdir(parents=True)
    (root / "hostname").write_text("db\n")
    (tree / "innocent").symlink_to(root)
    message = files.error("write_node_files", {"where": "pve1", "action": "write", "content": "x\n",
                                               "path": str(tree / "innocent" / "motd"), "confirm": True})
    assert "judged otherwise" in message and not (root / "motd").exists()
    assert "judged otherwise" in files.error("node_files", {"where": "pve1", "action": "read",
                                                            "path": str(tree / "innocent" / "hostname")})
    assert "protected" in files.error("node_files", {"where": "pve1", "action": "read", "path": str(root / "hostname")})
