"""Container housekeeping through pct (lxc_admin.py) against the suite's real sshd and fake pct: each
container is a chroot with a real dash and stub package managers, init systems and account tools that
record every argv they get (tests/fake_containers.py). Names follow allow-lists, every argument is
quoted, a password travels on stdin only and never reaches the audit log, and sshd settings are put
back when `sshd -t` refuses them."""
import hashlib
import json
import os

import pytest

import fake_containers
from conftest import tool_session
from test_shell_tools import SSHD, fake_nodes, ssh_env

pytestmark = pytest.mark.skipif((not os.path.exists(SSHD) or os.geteuid() != 0) and not os.environ.get("CI"),
                                reason="needs openssh-server and root (sshd, chroot); .ci/run has both")

PENDING = [("openssl", "3.5.1-1", "3.5.4-1"), ("libssl3t64", "3.5.1-1", "3.5.4-1"), ("nano", "8.4-1", "8.4-1+b1")]
CONTAINERS = {  # vmid -> distribution, pending upgrades, running services
    106: ("debian", PENDING, ["cron", "nginx", "ssh"]),
    107: ("alpine", [("busybox", "1.37.0-r18", "1.37.0-r19"), ("musl", "1.2.5-r9", "1.2.5-r10")], ["crond", "sshd"]),
    108: ("rocky", [("kernel-core", "5.14.0-570.21.1.el9_6", "5.14.0-570.22.1.el9_6"),
                    ("openssl", "1:3.2.2-6.el9_5", "1:3.2.2-6.el9_5.1")], ["sshd"]),
    109: ("arch", [("linux", "6.15.2.arch1-1", "6.15.4.arch2-1"), ("systemd", "257.6-1", "257.7-1")], ["sshd"]),
}
PASSWORD = "ct-password-4715"  # conftest.SECRETS: no answer, log or audit line may hold it
HOSTILE = ["-rf", "--force-yes", "-o=APT::Get::Assume-Yes", "a'b", 'a"b', "a b", "a\nb", "$(id)", "`id`", "a;id",
           "a|id", "a&&id", "../x", "", "é", "x" * 200, "nginx\x00", "*"]


@pytest.fixture(scope="module")
def sshd():
    with fake_nodes() as info:
        yield info


@pytest.fixture(scope="module")
def roots(sim, sshd):
    made = {}
    # the protected ci-runner (105) gets a root too: what is read in it before the refusal is the stubs'
    fake_containers.build(sshd["root"] / "105", "debian", [], ["ssh"])
    for vmid, (distribution, pending, running) in CONTAINERS.items():
        made[vmid] = fake_containers.build(sshd["root"] / str(vmid), distribution, pending, running)
        sim.lab.add_guest(vmid, "lxc", "pve1", f"ct-{distribution}", status="running", tags="autoupdate")
    return made


@pytest.fixture(scope="module")
def care(sim, sshd, roots, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lxc-admin")
    env = ssh_env(sim, sshd, tmp) | {"PROXMOX_TOOLSETS": "all"}
    with tool_session(env, log_name="lxc-admin") as session:
        session.tmp = tmp
        yield session


@pytest.fixture()
def fresh(roots):
    """Every container as CONTAINERS says, its stubs' call logs empty."""
    for vmid, (_, pending, running) in CONTAINERS.items():
        fake_containers.set_state(roots[vmid], pending, running)
    return roots


def audit(session) -> str:
    return (session.tmp / "audit.jsonl").read_text()


# ---------------------------------------------------------------- packages

@pytest.mark.parametrize("vmid, manager, init, notable", [
    (106, "apt", "systemd", ["openssl 3.5.1-1 -> 3.5.4-1", "libssl3t64 3.5.1-1 -> 3.5.4-1"]),
    (107, "apk", "openrc", ["musl 1.2.5-r9 -> 1.2.5-r10"]),
    (108, "dnf", "systemd", ["kernel-core -> 5.14.0-570.22.1.el9_6", "openssl -> 1:3.2.2-6.el9_5.1"]),
    (109, "pacman", "systemd", ["linux 6.15.2.arch1-1 -> 6.15.4.arch2-1", "systemd 257.6-1 -> 257.7-1"]),
])
def test_the_package_manager_and_init_are_detected_and_pending_upgrades_listed(care, fresh, vmid, manager, init,
                                                                               notable):
    listed = care.ok("write_lxc_packages", {"vmid": vmid, "action": "list"})  # a read: nothing to confirm
    assert listed["package_manager"] == manager and listed["init"] == init and listed["untrusted"]
    assert listed["upgradable"]["total"] == len(CONTAINERS[vmid][1]) and listed["notable"] == notable
    assert all(call[0] != "apt-get" or "-s" in call for call in fake_containers.calls(fresh[vmid]))


def test_upgrade_refreshes_then_upgrades_and_says_what_changed(care, fresh):
    needs = care.error("write_lxc_packages", {"vmid": 106, "action": "upgrade"})
    assert "confirm=true" in needs and fake_containers.calls(fresh[106]) == []  # it read, it ran nothing
    done = care.ok("write_lxc_packages", {"vmid": 106, "action": "upgrade", "confirm": True})
    assert done["upgraded"] == 3 and done["still_pending"] == 0 and done["exit_code"] == 0
    assert "openssl 3.5.1-1 -> 3.5.4-1" in done["notable"] and "Setting up nano" in done["output"]
    programs = [call[:2] + call[-1:] for call in fake_containers.calls(fresh[106])]
    assert ["apt-get", "update", "-q"] in programs and ["apt-get", "-y", "dist-upgrade"] in programs
    upgrade = next(c for c in fake_containers.calls(fresh[106]) if c[-1] == "dist-upgrade" and "-y" in c)
    assert "Dpkg::Options::=--force-confold" in upgrade  # the container's changed config files are kept


def test_install_and_remove_pass_names_literally(care, fresh):
    names = ["nginx", "libc6:amd64", "g++", "python3.13=3.13.5-2", "apt-transport~https"]
    care.ok("write_lxc_packages", {"vmid": 106, "action": "install", "names": names, "confirm": True})
    assert fake_containers.calls(fresh[106])[-1][-6:] == ["--", *names]
    care.ok("write_lxc_packages", {"vmid": 107, "action": "remove", "names": ["busybox-extras"], "confirm": True})
    assert fake_containers.calls(fresh[107])[-1] == ["apk", "del", "busybox-extras"]
    care.ok("write_lxc_packages", {"vmid": 109, "action": "install", "names": ["htop"], "confirm": True})
    assert fake_containers.calls(fresh[109])[-1] == ["pacman", "-S", "--noconfirm", "--needed", "--", "htop"]
    failed = care.ok("write_lxc_packages", {"vmid": 106, "action": "install", "names": ["missing-pkg"],
                                            "confirm": True})
    assert failed["exit_code"] == 100 and "Unable to locate package" in failed["errors"]
    assert "install needs names" in care.error("write_lxc_packages", {"vmid": 106, "action": "install",
                                                                      "confirm": True})


@pytest.mark.parametrize("name", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_package_names_are_refused_and_nothing_is_sent(care, fresh, sim, name):
    before = len(sim.lab.requests)
    message = care.error("write_lxc_packages", {"vmid": 106, "action": "install", "names": ["curl", name],
                                                "confirm": True})
    assert "is refused" in message and "never an option" in message and "Nothing was sent" in message
    assert fake_containers.calls(fresh[106]) == [] and len(sim.lab.requests) == before


# ---------------------------------------------------------------- services

def test_services_on_systemd_and_openrc(care, fresh):
    assert care.ok("write_lxc_services", {"vmid": 106, "action": "list"})["running"] == ["cron", "nginx", "ssh"]
    assert care.ok("write_lxc_services", {"vmid": 107, "action": "list"})["running"] == ["crond", "sshd"]
    state = care.ok("write_lxc_services", {"vmid": 106, "action": "status", "name": "nginx"})["state"]
    assert state == {"loaded": "loaded", "active": "active", "sub": "running", "enabled": "disabled"}
    stopped = care.ok("write_lxc_services", {"vmid": 106, "action": "stop", "name": "nginx", "confirm": True})
    assert stopped["state"]["active"] == "inactive" and ["systemctl", "stop", "--", "nginx"] in \
        fake_containers.calls(fresh[106])
    care.ok("write_lxc_services", {"vmid": 106, "action": "enable", "name": "getty@tty1", "confirm": True})
    assert ["systemctl", "enable", "--", "getty@tty1"] in fake_containers.calls(fresh[106])
    started = care.ok("write_lxc_services", {"vmid": 107, "action": "start", "name": "nginx", "confirm": True})
    assert started["state"]["running"] is True and ["rc-service", "nginx", "start"] in fake_containers.calls(fresh[107])
    care.ok("write_lxc_services", {"vmid": 107, "action": "enable", "name": "nginx", "confirm": True})
    assert ["rc-update", "add", "nginx", "default"] in fake_containers.calls(fresh[107])


@pytest.mark.parametrize("name", ["-H", "--root=/", "a b", "$(reboot)", "x;reboot", "a\nb", ""])
def test_hostile_service_names_are_refused(care, fresh, name):
    message = care.error("write_lxc_services", {"vmid": 106, "action": "restart", "name": name, "confirm": True})
    assert "argument 'name'" in message and "Nothing was sent" in message
    assert fake_containers.calls(fresh[106]) == []


# ---------------------------------------------------------------- users and sshd

def test_add_a_user_set_a_password_by_stdin_and_add_a_key(care, fresh):
    care.ok("write_lxc_users", {"vmid": 106, "action": "add", "user": "alice", "confirm": True})
    assert fake_containers.calls(fresh[106])[-1] == ["useradd", "-m", "-s", "/bin/sh", "--", "alice"]
    done = care.ok("write_lxc_users", {"vmid": 106, "action": "password", "user": "alice", "password": PASSWORD,
                                       "confirm": True})
    assert done["changed"] is True and PASSWORD not in json.dumps(done)
    assert fake_containers.calls(fresh[106])[-1] == ["chpasswd"]  # nothing on its command line
    assert (fresh[106] / "var" / "log" / "chpasswd.stdin").read_text().endswith(f"alice:{PASSWORD}\n")
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHk0c9xCbYbF3Xw7QH0T1d2M6rIh9kXW0p9Vv8Q3m5Rz alice@laptop"
    added = care.ok("write_lxc_users", {"vmid": 106, "action": "ssh_key", "user": "alice", "key": key,
                                        "confirm": True})
    assert "key added" in added["output"]
    assert (fresh[106] / "home" / "alice" / ".ssh" / "authorized_keys").read_text() == key + "\n"
    again = care.ok("write_lxc_users", {"vmid": 106, "action": "ssh_key", "user": "alice", "key": key,
                                        "confirm": True})
    assert "there already" in again["output"]
    text = audit(care)
    assert PASSWORD not in text and hashlib.sha256(f"alice:{PASSWORD}\n".encode()).hexdigest() not in text
    line = next(json.loads(x) for x in text.splitlines() if "chpasswd" in x and '"sent"' in x)
    assert line["params"] == {"password": "***"}


def test_bad_users_passwords_and_keys_are_refused(care, fresh):
    for user in ["-o", "root;id", "Alice", "a b", "$(id)", "x" * 40]:
        assert "argument 'user'" in care.error("write_lxc_users", {"vmid": 106, "action": "add", "user": user,
                                                                   "confirm": True})
    newline = care.error("write_lxc_users", {"vmid": 106, "action": "password", "user": "alice",
                                             "password": "x\nroot:owned", "confirm": True})
    assert "line break" in newline and "owned" not in newline
    assert "not one OpenSSH public key" in care.error("write_lxc_users", {
        "vmid": 106, "action": "ssh_key", "user": "alice", "key": "ssh-ed25519 AAAA\nssh-rsa BBBB", "confirm": True})
    assert "needs password" in care.error("write_lxc_users", {"vmid": 106, "action": "password", "user": "alice",
                                                               "confirm": True})
    assert fake_containers.calls(fresh[106]) == []


def test_sshd_settings_are_checked_with_sshd_t_and_put_back_when_refused(care, fresh):
    config = fresh[106] / "etc" / "ssh" / "sshd_config"
    config.write_text(fake_containers.SSHD_CONFIG)
    done = care.ok("write_lxc_users", {"vmid": 106, "action": "sshd", "confirm": True,
                                       "settings": {"PermitRootLogin": "prohibit-password",
                                                    "PasswordAuthentication": "no"}})
    assert done["applied"] is True and "restored" not in done
    lines = config.read_text().splitlines()
    assert lines[1:3] == ["PermitRootLogin prohibit-password", "PasswordAuthentication no"]
    assert "#PermitRootLogin yes" in lines and "    PermitRootLogin no" in lines  # a Match block is left alone
    calls = fake_containers.calls(fresh[106])
    assert ["sshd", "-t", "-f", "/etc/ssh/sshd_config"] in calls and ["systemctl", "reload", "ssh"] in calls
    before = config.read_text()
    (fresh[106] / "etc" / "ssh" / "refuse").write_text("Port")
    refused = care.ok("write_lxc_users", {"vmid": 106, "action": "sshd", "settings": {"Port": "2222"},
                                          "confirm": True})
    assert refused["applied"] is False and refused["restored"] is True and "Bad configuration option" in \
        refused["errors"]
    assert config.read_text() == before  # put back, and no reload after the refusal:
    assert fake_containers.calls(fresh[106])[-1] == ["sshd", "-t", "-f", "/etc/ssh/sshd_config"]
    for settings in [{"PermitRootLogin": "yes\nMatch all"}, {"Banner": "/etc/shadow"}, {"Port": "22; reboot"}]:
        assert "not one this tool sets" in care.error("write_lxc_users", {"vmid": 106, "action": "sshd",
                                                                          "settings": settings, "confirm": True})


# ---------------------------------------------------------------- the policy

def test_protected_stopped_not_allowed_and_vms_are_refused(care, fresh, sim, sshd, tmp_path):
    assert "release pipeline" in care.error("write_lxc_packages", {"vmid": 105, "action": "upgrade",
                                                                   "confirm": True})
    assert "is stopped" in care.error("write_lxc_services", {"vmid": 103, "action": "list"})
    assert "is a VM" in care.error("write_lxc_users", {"vmid": 100, "action": "add", "user": "bob", "confirm": True})
    env = ssh_env(sim, sshd, tmp_path) | {"PROXMOX_TOOLSETS": "all", "PROXMOX_EXEC_ALLOWED_VMIDS": "107"}
    with tool_session(env, log_name="lxc-admin-allowed") as limited:
        assert "PROXMOX_EXEC_ALLOWED_VMIDS" in limited.error("write_lxc_services", {
            "vmid": 106, "action": "restart", "name": "nginx", "confirm": True})
        assert limited.ok("write_lxc_services", {"vmid": 107, "action": "restart", "name": "sshd",
                                                 "confirm": True})["exit_code"] == 0
    assert not [c for c in fake_containers.calls(fresh[106]) if c[0] == "systemctl" and c[1] == "restart"]


def test_a_dry_run_sends_nothing_and_the_exec_gate_hides_the_tools(care, fresh, sim, sshd, tmp_path):
    plan = care.ok("write_lxc_packages", {"vmid": 106, "action": "remove", "names": ["nano"], "dry_run": True})
    assert plan["dry_run"] is True and "apt-get" in plan["run"] and "nano" in plan["run"]
    assert not [c for c in fake_containers.calls(fresh[106]) if "remove" in c]
    env = ssh_env(sim, sshd, tmp_path) | {"PROXMOX_TOOLSETS": "all", "PROXMOX_ALLOW_EXEC": "false"}
    with tool_session(env, log_name="lxc-admin-closed") as closed:
        offered = {t.name for t in closed.tools()}
    assert not {"write_lxc_packages", "write_lxc_services", "write_lxc_users"} & offered


@pytest.mark.mcp
def test_each_tool_over_mcp(care, fresh):
    """The three tools through the SDK's client over stdio (the other tests here run in process)."""
    assert care.ok("write_lxc_packages", {"vmid": 106, "action": "list"})["package_manager"] == "apt"
    assert care.ok("write_lxc_services", {"vmid": 107, "action": "list"})["running"] == ["crond", "sshd"]
    added = care.ok("write_lxc_users", {"vmid": 106, "action": "add", "user": "carol", "confirm": True})
    assert added["exit_code"] == 0 and fake_containers.calls(fresh[106])[-1][-1] == "carol"
