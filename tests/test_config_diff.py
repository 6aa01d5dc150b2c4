"""config_diff: one line per changed key, in words, the same for what_changed, the receipts and the
restore drill; and a config file's text as a backup holds it (docs/PROXMOX-BEHAVIOUR.md#configs-inside-backups)."""
import pytest

import config_diff

NIC = "virtio=BC:24:11:00:64:01,bridge=vmbr0"

# (key, before, after, the line)
LINES = [
    ("memory", 4096, 8192, "memory 4 -> 8 GiB"),
    ("memory", 512, 2048, "memory 512 MiB -> 2 GiB"),
    ("swap", "512", "1024", "swap 512 MiB -> 1 GiB"),
    ("cores", 2, 4, "cores 2 -> 4"),
    ("net0", NIC, NIC.replace("vmbr0", "vmbr1"), "net0 moved to vmbr1 (was vmbr0)"),
    ("net0", NIC, NIC + ",tag=20", "net0 tag 20 added"),
    ("net0", NIC + ",tag=10", NIC + ",tag=20", "net0 tag 10 -> 20"),
    ("net0", NIC, NIC.replace("virtio=BC:24:11:00:64:01", "e1000=BC:24:11:00:64:01"), "net0 model virtio -> e1000"),
    ("net0", "name=eth0,bridge=vmbr0,ip=dhcp", "name=eth0,bridge=vmbr0,ip=10.0.0.5/24", "net0 ip dhcp -> 10.0.0.5/24"),
    ("scsi0", "local-lvm:vm-100-disk-0,size=32G", "local-lvm:vm-100-disk-0,size=40G", "scsi0 size 32G -> 40G"),
    ("net1", None, NIC, f"net1 added: {NIC}"),
    ("net1", NIC, None, f"net1 removed (was {NIC})"),
    ("tags", "prod;web", "prod", "tags prod;web -> prod"),
    ("description", "line one\nline two", "other", "description changed"),
    ("cipassword", "**********", "**********", "cipassword changed"),  # never a secret's value
    ("cipassword", None, "s3cret", "cipassword changed"),
]


@pytest.mark.parametrize("key, before, after, line", LINES, ids=[f"{r[0]}-{r[3][:30]}" for r in LINES])
def test_one_line_per_changed_key(key, before, after, line):
    assert config_diff.describe(key, before, after) == line


def test_unchanged_and_bookkeeping_keys_are_left_out():
    old = {"memory": 2048, "digest": "a", "lock": "backup", "parent": "s1", "snaptime": 1, "cores": "2"}
    assert config_diff.changed_lines(old, {"memory": "2048", "digest": "b", "parent": "s2", "cores": 2}) == []


def test_pending_changes_are_marked():
    old = {"memory": 4096, "cores": 2, "tags": "prod"}
    now = {"memory": 4096, "cores": 2, "tags": "prod"}
    pending = {"memory": 8192, "tags": config_diff.DELETED}
    assert config_diff.changed_lines(old, now, pending) == [
        "memory 4 -> 8 GiB (pending until restart)", "tags removed (was prod) (pending until restart)"]
    # a pending change that takes the guest back to the old value
    assert config_diff.changed_lines({"cores": 2}, {"cores": 4}, {"cores": 2}) == [
        "cores is back to 2 at the next restart (runs with 4)"]


def test_keys_sorted_naturally_and_skips_per_source():
    old = {"net10": "a", "net2": "a", "unused0": "local-lvm:vm-100-disk-1", "description": "x"}
    new = {"net10": "b", "net2": "b", "description": "y"}
    lines = config_diff.changed_lines(old, new, skip=config_diff.skip_for_snapshot)
    assert lines == ["net2 a -> b", "net10 a -> b"]
    assert config_diff.changed_lines(old, new, skip=config_diff.skip_for_backup)[0] == "description changed"


def test_a_backup_config_file_is_read_as_proxmox_writes_it():
    """Description as #-lines with %XX escapes, options, #qmdump# lines, and nothing after the
    first section (qemu-server parse_vm_config, pve-common decode_text)."""
    text = ("#web server%3A front\n#second line 100%25\nagent: 1\nmemory: 4096\n"
            "net0: virtio=BC:24:11:00:64:01,bridge=vmbr0\n"
            "#qmdump#map:scsi0:drive-scsi0:local-lvm:raw:\n\n[before_upgrade]\nmemory: 2048\n")
    assert config_diff.parse_config_text(text) == {
        "agent": "1", "memory": "4096", "net0": "virtio=BC:24:11:00:64:01,bridge=vmbr0",
        "description": "web server: front\nsecond line 100%"}


def test_the_simulators_config_text_reads_back_whole():
    from simulator.pve_history import config_text
    config = {"memory": 2048, "description": "ünïcode: 100%\nline 2", "scsi0": "local-lvm:vm-1-disk-0,size=8G",
              "digest": "x"}
    assert config_diff.parse_config_text(config_text("qemu", config)) == {
        "memory": "2048", "scsi0": "local-lvm:vm-1-disk-0,size=8G", "description": "ünïcode: 100%\nline 2"}
