"""Cloud-init on existing VMs (issue 23 §2) through the MCP edge against the simulator: settings
written as qemu-server stores them (URL-encoded keys, a hashed password never shown), the drive
regenerated with what it lacked, whether a reboot is needed, clones set up in the same call, and
the refusals (closed gate, protected guest, missing privilege, bad input with nothing sent)."""
import json
from urllib.parse import unquote

import pytest

from conftest import requests_during, tool_session

PROTECTED = [{"host": "lab", "vmid": 101, "name": "db", "reason": "the production database"}]
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGVqZW1wbGVrZXlmb3J0ZXN0aW5nb25seTEyMzQ1 me@laptop"
PASSWORD = "correct-horse-battery-staple-7"


@pytest.fixture(scope="module")
def ops(sim, tmp_path_factory):
    """A server that may write, with the admin token (cloud-init needs VM.Config.Cloudinit, clones VM.Clone)."""
    tmp = tmp_path_factory.mktemp("cloudinit")
    (tmp / "protected.json").write_text(json.dumps(PROTECTED))
    env = sim.env(pve_token="root@pam!admin") | {
        "PROXMOX_ACCESS": "write", "PROXMOX_PROTECTED_VMS_FILE": str(tmp / "protected.json"),
        "PROXMOX_AUDIT_LOG": str(tmp / "audit.jsonl")}
    with tool_session(env, log_name="cloudinit") as session:
        session.audit = tmp / "audit.jsonl"
        yield session


@pytest.fixture(scope="module", autouse=True)
def cloudinit_drives(sim):
    """VMs 100 (running), 101 (running, protected) and 104 (stopped) with a cloud-init drive."""
    for vmid in (100, 101, 104):
        sim.lab.guests[vmid]["config"]["ide2"] = f"local-lvm:vm-{vmid}-cloudinit,media=cdrom"


def test_cloudinit_on_a_running_vm(ops, sim):
    # a change made elsewhere on the running VM: the drive still has the old value
    ops.ok("write_configure_guest", {"vmid": 100, "set": {"searchdomain": "old.example"}})
    answer = ops.ok("write_set_cloudinit", {"vmid": 100, "user": "debian", "ssh_keys": KEY, "password": PASSWORD,
                                            "ip": {"net0": "192.0.2.50/24,gw=192.0.2.1"},
                                            "dns": "192.0.2.1 example.org", "upgrade": False})
    assert answer["result"] == "ok" and answer["regenerated"] == "ide2"
    assert answer["changed"]["cipassword"] == "***" and answer["changed"]["ipconfig0"] == \
        "ip=192.0.2.50/24,gw=192.0.2.1"
    assert answer["changed"]["nameserver"] == "192.0.2.1" and answer["changed"]["searchdomain"] == "example.org"
    # what the drive lacked before this call, from GET .../cloudinit, now in it as well
    assert answer["also_applied"] == {"searchdomain": "old.example"}
    assert "next boot" in answer["next"] and "write_power_guest action=reboot" in answer["next"]
    config = sim.lab.guests[100]["config"]
    assert unquote(config["sshkeys"]) == KEY and "%20" in config["sshkeys"]  # URL-encoded, as qemu-server stores it
    assert config["cipassword"].startswith("$5$") and str(config["ciupgrade"]) == "0"
    assert "cloudinit" not in sim.lab.guests[100]  # regenerated: nothing pending any more
    assert PASSWORD not in json.dumps(answer) and PASSWORD not in ops.audit.read_text()


def test_a_stopped_vm_applies_at_start(ops, sim):
    answer = ops.ok("write_set_cloudinit", {"vmid": 104, "ip": {"0": "dhcp"}})
    assert answer["changed"] == {"ipconfig0": "ip=dhcp"} and "apply when it starts" in answer["next"]
    assert "also_applied" not in answer  # a stopped VM's drive is made at each start anyway


def test_regenerate_only(ops, sim):
    answer, sent = requests_during(sim, writes=True, action=lambda: ops.ok("write_set_cloudinit", {"vmid": 100}))
    assert answer["changed"] == {} and sent == [("pve", "PUT", "/nodes/pve1/qemu/100/cloudinit")]


def test_dry_run_shows_the_diff_masks_the_password_and_sends_nothing(ops, sim):
    ops.ok("write_configure_guest", {"vmid": 100, "set": {"ciuser": "someone"}})  # the drive lacks this now
    plan, sent = requests_during(sim, writes=True, action=lambda: ops.ok(
        "write_set_cloudinit", {"vmid": 100, "password": "another-secret-99", "dry_run": True}))
    assert plan["dry_run"] is True and plan["request"]["params"]["cipassword"] == "***" and sent == []
    assert plan["would_change"] == {"cipassword": "***"} and plan["drive_lacks"]["ciuser"] == "someone"
    assert "another-secret-99" not in json.dumps(plan)
    ops.ok("write_set_cloudinit", {"vmid": 100})  # regenerated: nothing lacking any more


def test_a_changed_network_is_said_to_go_to_the_drive(ops, sim):
    """qemu-server's list of what the drive lacks never names a changed ipconfig<n> (cloudinit_pending
    reports only $cloudinitoptions), but the drive is made from the config's current ones
    (docs/PROXMOX-BEHAVIOUR.md#cloud-init)."""
    ops.ok("write_set_cloudinit", {"vmid": 100, "ip": {"net0": "192.0.2.50/24,gw=192.0.2.1"}})
    ops.ok("write_configure_guest", {"vmid": 100, "set": {"ipconfig0": "ip=192.0.2.77/24,gw=192.0.2.1"}})
    assert "ipconfig0" in sim.lab.guests[100]["cloudinit"]  # the drive still has the old address
    plan, sent = requests_during(sim, writes=True, action=lambda: ops.ok(
        "write_set_cloudinit", {"vmid": 100, "dry_run": True}))
    assert "ipconfig0" not in plan["drive_lacks"] and sent == []
    assert "ipconfig0" in plan["network"] and "always" in plan["network"]
    answer = ops.ok("write_set_cloudinit", {"vmid": 100})
    assert "ipconfig0" in answer["network"] and "cloudinit" not in sim.lab.guests[100]


@pytest.mark.parametrize("arguments, expected", [
    ({"vmid": 102, "user": "x"}, "is a container; cloud-init is for VMs"),
    ({"vmid": 103, "user": "x"}, "is a container"),
    ({"vmid": 100, "ip": {"net0": "192.0.2.50"}}, "needs its prefix length, e.g. 192.0.2.50/24"),
    ({"vmid": 100, "ip": {"net3": "dhcp"}}, "the VM has no NIC net3; its NICs: net0"),
    ({"vmid": 100, "ip": {"net0": "ip=192.0.2.5/24,gateway=192.0.2.1"}}, "'gateway' is not ip, gw, ip6 or gw6"),
    ({"vmid": 100, "ssh_keys": "-----BEGIN OPENSSH PRIVATE KEY-----\nabc"}, "holds a private key"),
    ({"vmid": 100, "ssh_keys": "not a key"}, "is not an OpenSSH public key line"),
    ({"vmid": 100, "password": "short"}, "at least 8 characters"),
    ({"vmid": 100, "dns": "192.0.2.1 not_a_domain!"}, "neither an address nor a domain name"),
])
def test_bad_input_is_refused_with_nothing_sent(ops, sim, arguments, expected):
    message, sent = requests_during(sim, writes=True, action=lambda: ops.error("write_set_cloudinit", arguments))
    assert expected in message and sent == []


def test_a_vm_without_a_cloudinit_drive(ops, sim):
    drive = sim.lab.guests[104]["config"].pop("ide2")
    try:
        message, sent = requests_during(sim, writes=True, action=lambda: ops.error("write_set_cloudinit",
                                                                                   {"vmid": 104, "user": "x"}))
        assert "has no cloud-init drive" in message and "ide2" in message and sent == []
    finally:
        sim.lab.guests[104]["config"]["ide2"] = drive


@pytest.mark.mcp  # the refusal as a client sees it, over stdio
def test_refused_by_the_policy(ops, sim):
    message, sent = requests_during(sim, writes=True, action=lambda: ops.error("write_set_cloudinit",
                                                                               {"vmid": 101, "user": "x"}))
    assert "Guest 101 (db) is protected" in message and sent == []
    # the admin token: only the closed gate may hide the tool here, not a missing privilege
    with tool_session(sim.env(pve_token="root@pam!admin"), log_name="cloudinit-read") as closed:
        assert "write_set_cloudinit" not in {t.name for t in closed.tools()}
    # the README's reader token has neither VM.Config.Cloudinit nor VM.Config.Network
    with tool_session(sim.env() | {"PROXMOX_ACCESS": "write"}, log_name="cloudinit-reader") as weak:
        message = weak.error("write_set_cloudinit", {"vmid": 100, "user": "x"})
        assert "VM.Config.Cloudinit" in message and "pveum acl modify" in message


def test_cicustom_snippets_are_elevated(ops, sim):
    """A host file fed to the guest: the elevated gate, through any tool (docs/PROXMOX-BEHAVIOUR.md#cloud-init)."""
    message, sent = requests_during(sim, writes=True, action=lambda: ops.error(
        "write_configure_guest", {"vmid": 100, "set": {"cicustom": "user=local:snippets/user.yaml"}}))
    assert "elevated" in message and "PROXMOX_ALLOW_ELEVATED" in message and sent == []


def test_clone_with_cloudinit_in_one_call(ops, sim):
    answer = ops.ok("write_clone_guest", {"vmid": 104, "newid": 160, "name": "web2",
                                          "cloudinit": {"user": "ops", "ip": {"net0": "192.0.2.60/24,gw=192.0.2.1"}}})
    assert answer["result"] == "ok" and answer["cloudinit"]["regenerated"] == "ide2"
    config = sim.lab.guests[160]["config"]
    assert config["ciuser"] == "ops" and config["ipconfig0"] == "ip=192.0.2.60/24,gw=192.0.2.1"


@pytest.mark.parametrize("cloudinit, expected", [
    ({"hostname": "x"}, "cloudinit takes user, ssh_keys, password, ip, dns, upgrade; not hostname"),
    ({"ip": {"net0": "300.1.1.1/24"}}, "ip for net0"),
])
def test_clone_cloudinit_is_checked_before_cloning(ops, sim, cloudinit, expected):
    message, sent = requests_during(sim, writes=True, action=lambda: ops.error(
        "write_clone_guest", {"vmid": 104, "newid": 161, "cloudinit": cloudinit}))
    assert expected in message and sent == [] and 161 not in sim.lab.guests
