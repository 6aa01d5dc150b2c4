"""One file back from a backup (issue 23 §5) through the MCP edge against the simulator: browsing
inside PBS-backed backups through PVE's file-restore and the Backup Server's catalog, saving a file
or a directory into PROXMOX_RESTORE_DIR under a size cap, and the refusals (closed gates, protected
guest, missing privileges, bad input, the cap) with nothing sent or kept."""
import json
import os
import zipfile

import pytest

import config
from conftest import requests_during, tool_session
from errors import ConfigError
from simulator.file_restore import restore_world
from simulator.lab import Token

PROTECTED = [{"host": "lab", "vmid": 105, "name": "ci-runner", "reason": "builds everything"}]


def rows(answer):
    return [dict(zip(answer["columns"], row, strict=True)) for row in answer["rows"]]


def newest(sim, kind: str, vmid: int) -> str:
    return max((v for v in sim.lab.pbs_volumes("pbs") if v["vmid"] == vmid and f"/{kind}/" in v["volid"]),
               key=lambda v: v["ctime"])["volid"]


@pytest.fixture(scope="module")
def tokens(sim):
    """Reading backup contents needs more than the README's reader: PVE checks Datastore.AllocateSpace on the
    storage and VM.Backup on the guest (check_volume_access), PBS Datastore.Read."""
    owner = Token("", [("/", "PVEAuditor", True), ("/storage/pbs", "PVEDatastoreUser", True),
                       ("/vms", "PVEVMUser", True)])
    sim.lab.pve_tokens["files@pve!restore"] = Token("files-restore-secret-00000000", owner.acl, owner=owner)
    pbs_owner = Token("", [("/", "Audit", True), ("/datastore", "DatastoreReader", True)])
    sim.lab.pbs_tokens["files@pbs!restore"] = Token("files-pbs-secret-000000000000", pbs_owner.acl, owner=pbs_owner)
    return {"pve_token": "files@pve!restore", "pbs_token": "files@pbs!restore"}


@pytest.fixture(scope="module")
def restorer(sim, tokens, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("file-restore")
    (tmp / "protected.json").write_text(json.dumps(PROTECTED))
    env = sim.env(**tokens) | {
        "PROXMOX_ACCESS": "write", "PROXMOX_ALLOW_SENSITIVE": "true", "PROXMOX_TOOLSETS": "backups",
        "PROXMOX_PROTECTED_VMS_FILE": str(tmp / "protected.json"), "PROXMOX_AUDIT_LOG": str(tmp / "audit.jsonl"),
        "PROXMOX_RESTORE_DIR": str(tmp / "restored"), "PROXMOX_RESTORE_MAX_MB": "1"}
    with tool_session(env, log_name="file-restore") as session:
        session.folder, session.audit = tmp / "restored", tmp / "audit.jsonl"
        yield session


# ---------------------------------------------------------------- browsing

def test_browse_a_container_backup_through_pve(restorer, sim):
    volid = newest(sim, "ct", 102)
    top = restorer.ok("backup_files", {"backup": volid})
    assert top["backup"] == volid and rows(top) == [{"path": "/root.pxar.didx", "type": "dir", "size": "3.0 GiB",
                                                    "modified": ""}]
    etc = {r["path"]: r for r in rows(restorer.ok("backup_files", {"backup": volid, "path": "/root.pxar.didx/etc"}))}
    assert etc["/root.pxar.didx/etc/hostname"]["type"] == "file" and etc["/root.pxar.didx/etc/hostname"]["size"] == \
        "4 B"
    assert etc["/root.pxar.didx/etc/ssh"]["type"] == "dir"


def test_browse_a_vm_backup_by_vmid_opens_its_partitions(restorer, sim):
    top = restorer.ok("backup_files", {"vmid": 100})
    assert top["backup"] == newest(sim, "vm", 100)
    assert rows(top)[0]["path"] == "/drive-scsi0.img.fidx" and rows(top)[0]["type"] == "volume"
    assert [r["path"] for r in rows(restorer.ok("backup_files", {"vmid": 100, "path": "/drive-scsi0.img.fidx"}))] \
        == ["/drive-scsi0.img.fidx/part"]
    inside = rows(restorer.ok("backup_files", {"vmid": 100, "path": "/drive-scsi0.img.fidx/part/1/etc"}))
    assert "/drive-scsi0.img.fidx/part/1/etc/hostname" in [r["path"] for r in inside]


def test_browse_on_the_backup_server(restorer, sim):
    answer = restorer.ok("backup_files", {"backup": "backup:ct/102", "path": "/root.pxar.didx/etc"})
    stamp = newest(sim, "ct", 102).rsplit("/", 1)[1]
    assert answer["backup"] == f"backup:ct/102/{stamp}"  # the newest, by name
    assert "/root.pxar.didx/etc/hosts" in [r["path"] for r in rows(answer)]
    assert rows(restorer.ok("backup_files", {"backup": f"backup:ct/102/{stamp}"}))[0]["path"] == "/root.pxar.didx"


def test_paging_bounds_a_big_directory(restorer, sim):
    answer = restorer.ok("backup_files", {"backup": newest(sim, "ct", 102), "path": "/root.pxar.didx", "limit": 2})
    assert len(answer["rows"]) == 2 and answer["truncated"] is True and answer["next_offset"] == 2


@pytest.mark.parametrize("backup, expected", [
    ("backup:vm/100", "no file catalog for"),
    ("backup:ct/102/2001-01-01T00:00:00Z", "No snapshot backup:ct/102/2001-01-01T00:00:00Z"),
    ("local:backup/vzdump-lxc-102-2026_01_01-02_00_01.tar.zst", "is not a backup on a PBS storage"),
])
def test_backups_that_cannot_be_browsed_are_explained(restorer, sim, backup, expected):
    message, sent = requests_during(sim, writes=True, action=lambda: restorer.error("backup_files",
                                                                                    {"backup": backup}))
    assert expected in message and sent == []


@pytest.mark.mcp  # the refusal as a client sees it, over stdio
def test_a_protected_guests_backup_is_refused_through_pve(restorer, sim):
    message, sent = requests_during(sim, action=lambda: restorer.error("backup_files",
                                                                       {"backup": newest(sim, "ct", 105)}))
    assert "Guest 105 (ci-runner) is protected" in message
    assert not [r for r in sent if "file-restore" in r[2]]


def test_the_readers_privileges_are_not_enough(sim, tmp_path):
    """The README's reader tokens see no backup contents: PVE does not let the PVE reader read the
    backup volume (check_volume_access), and the Backup Server refuses its catalog to the PBS
    reader (DatastoreAudit): the answer names both grants, and nothing reaches PVE's file-restore."""
    env = sim.env() | {"PROXMOX_ALLOW_SENSITIVE": "true", "PROXMOX_TOOLSETS": "backups",
                       "PROXMOX_AUDIT_LOG": str(tmp_path / "audit.jsonl")}
    with tool_session(env, log_name="file-restore-reader") as reader:
        message, sent = requests_during(sim, lambda: reader.error("backup_files", {"backup": newest(sim, "ct", 102)}))
        assert "lacks Datastore.AllocateSpace on /storage/pbs" in message and "pveum acl modify" in message
        assert "refuses its catalog too" in message and "proxmox-backup-manager acl update" in message
        assert not [r for r in sent if "file-restore" in r[2]]
        vm = reader.error("backup_files", {"backup": newest(sim, "vm", 100)})
        assert "A VM backup is a disk image only PVE opens" in vm and "pveum acl modify" in vm


def test_a_container_backup_pve_does_not_list_is_browsed_on_the_backup_server(sim, tokens, tmp_path):
    """The README's PVE reader cannot read backup volumes; with a Backup Server token that may read the
    datastore (DatastoreReader), a container's backup is browsed through the PBS catalog instead, by
    volid or by vmid, and nothing is asked of PVE's file-restore."""
    env = sim.env(pbs_token=tokens["pbs_token"]) | {"PROXMOX_ALLOW_SENSITIVE": "true",
                                                    "PROXMOX_TOOLSETS": "backups",
                                                    "PROXMOX_AUDIT_LOG": str(tmp_path / "audit.jsonl")}
    volid = newest(sim, "ct", 102)
    with tool_session(env, log_name="file-restore-blind") as blind:
        answer, sent = requests_during(sim, lambda: blind.ok("backup_files", {"backup": volid,
                                                                              "path": "/root.pxar.didx/etc"}))
        assert answer["backup"] == volid and "/root.pxar.didx/etc/hostname" in [r["path"] for r in rows(answer)]
        assert [r for r in sent if r[2] == "/admin/datastore/backup/catalog"]
        assert not [r for r in sent if "file-restore" in r[2]]
        by_vmid = blind.ok("backup_files", {"vmid": 102})
        assert by_vmid["backup"] == volid and rows(by_vmid)[0]["path"] == "/root.pxar.didx"


def test_a_pbs_token_without_datastore_read_is_told_the_grant(sim, tmp_path):
    """PBS reads a snapshot's catalog for Datastore.Read (or Datastore.Backup on an owned group); an
    auditing token gets 403 and the two commands that grant it."""
    owner = Token("", [("/", "Audit", True)])
    sim.lab.pbs_tokens["audit@pbs!files"] = Token("audit-pbs-secret-0000000000", owner.acl, owner=owner)
    env = sim.env(pbs_token="audit@pbs!files") | {"PROXMOX_ALLOW_SENSITIVE": "true", "PROXMOX_TOOLSETS": "backups",
                                                  "PROXMOX_AUDIT_LOG": str(tmp_path / "audit.jsonl")}
    with tool_session(env, log_name="file-restore-pbs-audit") as session:
        message = session.error("backup_files", {"backup": "backup:ct/102"})
        assert "lacks Datastore.Read|Datastore.Backup on /datastore/backup" in message
        assert "proxmox-backup-manager acl update /datastore/backup DatastoreReader" in message


def test_without_the_sensitive_gate_backup_contents_are_not_offered(sim):
    with tool_session(sim.env() | {"PROXMOX_TOOLSETS": "backups"}, log_name="file-restore-closed") as closed:
        assert not {"backup_files", "write_restore_file"} & {t.name for t in closed.tools()}


# ---------------------------------------------------------------- saving a file

def test_restore_a_small_file(restorer, sim):
    volid = newest(sim, "ct", 102)
    answer = restorer.ok("write_restore_file", {"backup": volid, "path": "/root.pxar.didx/etc/hostname"})
    saved = restorer.folder / volid.split(":", 1)[1].replace("/", "_").replace(":", "_") / "hostname"
    assert answer["result"] == "ok" and answer["saved"] == str(saved) and saved.read_bytes() == b"dns\n"
    assert saved.stat().st_mode & 0o777 == 0o600 and saved.parent.stat().st_mode & 0o777 == 0o700
    assert "content" not in answer  # a restored file goes into the answer only when asked
    again = restorer.ok("write_restore_file", {"backup": volid, "path": "/root.pxar.didx/etc/hostname", "show": True})
    assert again["saved"].endswith("hostname-1")  # never over an earlier file
    assert again["content"] == "dns\n" and again["untrusted"] is True  # small text, at the sensitive gate
    log = [json.loads(line) for line in restorer.audit.read_text().splitlines()]
    assert any(e["path"].endswith("file-restore/download") and e["verdict"] == "sent" for e in log)


def test_restore_a_directory_as_zip_from_the_backup_server(restorer, sim):
    answer = restorer.ok("write_restore_file", {"backup": "backup:ct/102", "path": "/root.pxar.didx/etc/ssh"})
    assert answer["saved"].endswith("/ssh.zip") and "zip" in answer["note"] and "content" not in answer
    with zipfile.ZipFile(answer["saved"]) as archive:
        assert "ssh/sshd_config" in archive.namelist()


def test_a_file_over_the_cap_is_refused_before_downloading(restorer, sim):
    message, sent = requests_during(sim, action=lambda: restorer.error(
        "write_restore_file", {"backup": newest(sim, "ct", 102), "path": "/root.pxar.didx/var/log/journal.log"}))
    assert "over the 1.0 MiB cap (PROXMOX_RESTORE_MAX_MB)" in message
    assert not [r for r in sent if "download" in r[2]]


def test_a_directory_over_the_cap_is_stopped_and_nothing_kept(restorer, sim):
    before = sorted(p.name for p in restorer.folder.rglob("*"))
    message = restorer.error("write_restore_file", {"backup": "backup:ct/102", "path": "/root.pxar.didx/var"})
    assert "larger than the 1 MiB cap" in message and "nothing was kept" in message
    assert sorted(p.name for p in restorer.folder.rglob("*")) == before


def test_restore_dry_run_sends_and_saves_nothing(restorer, sim):
    before = sorted(restorer.folder.rglob("*"))
    plan, sent = requests_during(sim, action=lambda: restorer.ok(
        "write_restore_file", {"backup": "backup:ct/102", "path": "/root.pxar.didx/etc/hosts", "dry_run": True}))
    assert plan["dry_run"] is True and plan["gate"] == "sensitive+write"
    assert plan["request"]["path"] == "/admin/datastore/backup/pxar-file-download"
    assert not [r for r in sent if "download" in r[2]] and sorted(restorer.folder.rglob("*")) == before


@pytest.mark.parametrize("arguments, expected", [
    ({"path": "/root.pxar.didx"}, "is a whole archive"),
    ({"path": "/root.pxar.didx/etc/nothing"}, "No '/root.pxar.didx/etc/nothing'"),
])
def test_restore_refuses_bad_paths(restorer, sim, arguments, expected):
    before = sorted(restorer.folder.rglob("*"))
    message, sent = requests_during(sim, action=lambda: restorer.error(
        "write_restore_file", {"backup": newest(sim, "ct", 102)} | arguments))
    assert expected in message
    assert not [r for r in sent if "download" in r[2]] and sorted(restorer.folder.rglob("*")) == before


def test_a_protected_guests_file_is_not_restored_through_pve(restorer, sim):
    before = sorted(restorer.folder.rglob("*"))
    message, sent = requests_during(sim, action=lambda: restorer.error(
        "write_restore_file", {"backup": newest(sim, "ct", 105), "path": "/root.pxar.didx/etc/hostname"}))
    assert "Guest 105 (ci-runner) is protected" in message
    assert not [r for r in sent if "file-restore" in r[2]] and sorted(restorer.folder.rglob("*")) == before


def test_restore_needs_the_folder_and_the_write_gate(sim, tokens, tmp_path):
    base = sim.env(**tokens) | {"PROXMOX_ALLOW_SENSITIVE": "true", "PROXMOX_TOOLSETS": "backups",
                                "PROXMOX_AUDIT_LOG": str(tmp_path / "audit.jsonl")}
    with tool_session(base | {"PROXMOX_ACCESS": "write"}, log_name="file-restore-nofolder") as session:
        assert "write_restore_file" not in {t.name for t in session.tools()}  # PROXMOX_RESTORE_DIR is not set
    with tool_session(base | {"PROXMOX_RESTORE_DIR": str(tmp_path / "r")}, log_name="file-restore-read") as session:
        offered = {t.name for t in session.tools()}
        assert "backup_files" in offered and "write_restore_file" not in offered  # the write gate is closed


@pytest.mark.parametrize("variables, expected", [
    ({"PROXMOX_RESTORE_DIR": "restored"}, "PROXMOX_RESTORE_DIR='restored' is not an absolute path"),
    ({"PROXMOX_RESTORE_MAX_MB": "lots"}, "PROXMOX_RESTORE_MAX_MB='lots' is not a number of megabytes"),
    ({"PROXMOX_RESTORE_MAX_MB": "0"}, "is not a number of megabytes (1 to 1048576)"),
])
def test_restore_settings_are_checked_at_start(variables, expected):
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        config.load_config(variables)


def test_restore_settings_are_read(tmp_path):
    loaded = config.load_config({"PROXMOX_RESTORE_DIR": str(tmp_path / "r"), "PROXMOX_RESTORE_MAX_MB": "5"})
    assert loaded.restore_dir == tmp_path / "r" and loaded.restore_max_bytes == 5 * 1024 ** 2
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="exists and is not a folder"):
        config.load_config({"PROXMOX_RESTORE_DIR": str(tmp_path / "file")})


# ---------------------------------------------------------------- the restore VM, links, shown files

def test_a_vm_backup_whose_restore_vm_is_still_starting_says_to_call_again(restorer, sim):
    """PVE gives up a listing inside a VM image after 25 s with 503 while the restore VM boots
    (FileRestore.pm; proxmox-file-restore `list not finished in time`): listed again once, then a clear
    error that says to call again, which then works."""
    world = restore_world(sim.lab)
    volid = newest(sim, "vm", 100)
    before, world.boot_lists, world.listed[volid] = world.boot_lists, 3, 0
    try:
        message = restorer.error("backup_files", {"backup": volid, "path": "/drive-scsi0.img.fidx"})
        assert "is still starting" in message and "Call again in about 30 s" in message
        assert world.listed[volid] == 2  # tried twice in the call
        assert rows(restorer.ok("backup_files", {"backup": volid, "path": "/drive-scsi0.img.fidx"}))
    finally:
        world.boot_lists = before


def test_a_link_in_the_restore_folder_is_never_followed(restorer, sim, tmp_path):
    """A link planted in PROXMOX_RESTORE_DIR, where the backup's folder or the file would go, cannot
    send the file elsewhere: the folder is refused, the file's name is skipped."""
    volid = newest(sim, "ct", 102)
    label = volid.split(":", 1)[1].replace("/", "_").replace(":", "_")
    outside = tmp_path / "outside"
    outside.mkdir()
    restorer.folder.mkdir(parents=True, exist_ok=True)
    planted = restorer.folder / label
    kept = restorer.folder / (label + ".kept")
    if planted.exists():
        planted.rename(kept)
    planted.symlink_to(outside)
    try:
        message = restorer.error("write_restore_file", {"backup": volid, "path": "/root.pxar.didx/etc/hosts"})
        assert "is not a folder of its own" in message and "nothing was saved" in message
        assert list(outside.iterdir()) == []
    finally:
        planted.unlink()
        if kept.exists():
            kept.rename(planted)
    planted.mkdir(exist_ok=True)
    (planted / "os-release").symlink_to(outside / "os-release")
    answer = restorer.ok("write_restore_file", {"backup": volid, "path": "/root.pxar.didx/etc/os-release"})
    assert answer["saved"] == str(planted / "os-release-1") and not (outside / "os-release").exists()
    assert os.path.islink(planted / "os-release")


def test_a_shown_file_is_masked(restorer, sim):
    world = restore_world(sim.lab)
    world.files["app.env"] = b"DB_PASSWORD=hunter2-secret\ncurl -u backup:s3cret! https://nas\nname=web\n"
    try:
        answer = restorer.ok("write_restore_file", {"backup": "backup:ct/102", "path": "/root.pxar.didx/root/app.env",
                                                    "show": True})
        assert answer["content"] == "DB_PASSWORD=***\ncurl -u backup:*** https://nas\nname=web\n"
    finally:
        del world.files["app.env"]
