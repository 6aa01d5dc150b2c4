"""Updating guests safely (write_update_guests, guest_updates.py): containers through the suite's real
sshd and fake pct (chroots with stub package managers: tests/fake_containers.py), VMs through the
simulator's guest agent. The whole plan is read and declared before the first write (one question on
both protocol revisions; a dry run shows it all and sends nothing); each guest is snapshotted first,
upgraded, checked; a failed check rolls back when asked, else the update stops there."""
import json
import os

import pytest

import fake_containers
from conftest import User, requests_during, stdio_session, tool_session
from test_shell_tools import SSHD, fake_nodes, ssh_env

pytestmark = pytest.mark.skipif((not os.path.exists(SSHD) or os.geteuid() != 0) and not os.environ.get("CI"),
                                reason="needs openssh-server and root (sshd, chroot); .ci/run has both")

CONTAINERS = {  # vmid -> distribution, pending upgrades, running services
    106: ("debian", [("openssl", "3.5.1-1", "3.5.4-1"), ("nano", "8.4-1", "8.4-1+b1")], ["cron", "nginx"]),
    107: ("alpine", [("musl", "1.2.5-r9", "1.2.5-r10")], ["crond", "sshd"]),
    110: ("debian", [("curl", "8.14.1-1", "8.14.1-2")], ["cron"]),  # its root disk is on `local`: no snapshot
}


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
        guest = sim.lab.add_guest(vmid, "lxc", "pve1", f"ct-{distribution}-{vmid}", status="running",
                                  tags="autoupdate" if vmid != 110 else "")
        if vmid == 110:
            guest["config"]["rootfs"] = "local:110/vm-110-disk-0.raw,size=8G"
    return made


@pytest.fixture(scope="module")
def updates(sim, sshd, roots, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("updates")
    env = ssh_env(sim, sshd, tmp) | {"PROXMOX_TOOLSETS": "all", "PROXMOX_ACCESS": "destructive"}
    with tool_session(env, log_name="updates") as session:
        session.tmp = tmp
        yield session


@pytest.fixture()
def fresh(roots, sim):
    for vmid, (_, pending, running) in CONTAINERS.items():
        fake_containers.set_state(roots[vmid], pending, running)
    for vmid in (100, *CONTAINERS):
        sim.lab.guests[vmid]["snapshots"] = []
        sim.lab.guests[vmid]["config"].pop("parent", None)
        sim.lab.guests[vmid]["status"] = "running"
    return roots


def writes(sent: list) -> list:
    return [r for r in sent if r[1] != "GET"]


READS = (["apt-get", "-s"], ["systemctl", "list-units"], ["systemctl", "show"], ["apk", "version"], ["rc-status"])


def ran(root) -> list[list[str]]:
    """What ran in a container beyond reading (the stubs' calls that change something)."""
    return [c for c in fake_containers.calls(root) if not any(c[:len(r)] == r for r in READS)]


def test_a_dry_run_shows_the_whole_plan_and_changes_nothing(updates, fresh, sim):
    plan, sent = requests_during(sim, lambda: updates.ok("write_update_guests", {
        "tag": "autoupdate", "checks": ["curl -fsS localhost:8080"], "rollback_on_failure": True, "dry_run": True}))
    assert writes(sent) == [] and all(ran(fresh[v]) == [] for v in CONTAINERS)
    guests = {g["vmid"]: g for g in plan["guests"]}
    assert set(guests) == {106, 107}
    assert guests[106] | {"services": sorted(guests[106]["services"])} == {
        "vmid": 106, "name": "ct-debian-106", "type": "lxc", "os": "Debian GNU/Linux 13 (trixie)",
        "package_manager": "apt", "pending": 2, "notable": ["openssl 3.5.1-1 -> 3.5.4-1"],
        "services": ["cron", "nginx"], "first": guests[106]["first"]}
    assert guests[106]["first"].startswith("snapshot pre-update-") and guests[107]["package_manager"] == "apk"
    steps = " ".join(str(step) for step in plan["steps"])
    assert "/nodes/pve1/lxc/106/snapshot" in steps and "dist-upgrade" in steps and "check: curl" in steps
    assert "/rollback" in steps and "Update 2 guest(s) one after the other" in plan["plan"]


def test_each_guest_is_snapshotted_upgraded_and_checked_in_order(updates, fresh, sim):
    done, sent = requests_during(sim, lambda: updates.ok("write_update_guests", {
        "vmids": [107, 106], "checks": ["curl -fsS localhost:8080"], "confirm": True}))
    assert done["updated"] == 2 and done["failed"] == 0 and done["untrusted"]
    first, second = done["guests"]
    assert (first["vmid"], second["vmid"]) == (107, 106)  # the order given
    assert second["upgraded"] == 2 and second["notable"] == ["openssl 3.5.1-1 -> 3.5.4-1"]
    assert second["checks"] == [{"check": "the services that ran before still run", "ok": True},
                                {"check": "curl -fsS localhost:8080", "ok": True, "exit_code": 0, "output": "ok"}]
    snapshot = second["snapshot"]
    assert snapshot["kept"] and snapshot["name"].startswith("pre-update-") and "write_delete_snapshot vmid=106" in \
        snapshot["remove"] and done["receipt"].startswith("rc-")  # one receipt for the call (receipts.py)
    assert [s["name"] for s in sim.lab.guests[106]["snapshots"]] == [snapshot["name"]]
    assert "remove after" in sim.lab.guests[106]["snapshots"][0]["description"]
    order = [r for r in writes(sent) if r[2].endswith("/snapshot")]
    assert order == [("pve", "POST", "/nodes/pve1/lxc/107/snapshot"), ("pve", "POST", "/nodes/pve1/lxc/106/snapshot")]
    assert ["apk", "upgrade"] in ran(fresh[107]) and ["curl", "-fsS", "localhost:8080"] in ran(fresh[106])


def test_a_failed_check_rolls_back_when_asked_and_touches_no_further_guest(updates, fresh, sim):
    (fresh[106] / "var" / "lib" / "stub" / "break-service").write_text("nginx")
    message, sent = requests_during(sim, lambda: updates.error("write_update_guests", {
        "vmids": [106, 107], "rollback_on_failure": True, "confirm": True}))
    assert "The update failed on guest 106 and was rolled back; the guests after it were not touched" in message
    report = json.loads(message.split("Report: ", 1)[1].split(" Sent before the failure")[0])
    failed, untouched = report["guests"]
    assert failed["checks"][0] == {"check": "the services that ran before still run", "ok": False,
                                   "stopped": ["nginx"]}
    assert failed["rolled_back"].startswith("to pre-update-") and failed["rolled_back"].endswith("started again")
    assert untouched["result"] == "not reached: an earlier guest failed" and ran(fresh[107]) == []
    assert ("pve", "POST", f"/nodes/pve1/lxc/106/snapshot/{failed['snapshot']['name']}/rollback") in sent


def test_without_rollback_it_stops_and_with_continue_it_goes_on(updates, fresh, sim, roots):
    (fresh[106] / "var" / "lib" / "stub" / "curl-fails").write_text("")
    update = {"vmids": [106, 107], "checks": ["curl -fsS localhost:8080"], "confirm": True}
    message, sent = requests_during(sim, lambda: updates.error("write_update_guests", update))
    assert "failed on guest 106;" in message and "not touched" in message and ran(fresh[107]) == []
    assert not [r for r in sent if "/rollback" in r[2]]  # not asked: the snapshot is kept, the guest as it is
    fake_containers.set_state(roots[107], CONTAINERS[107][1], CONTAINERS[107][2])
    sim.lab.guests[106]["snapshots"] = []
    message = updates.error("write_update_guests", update | {"continue_on_failure": True})
    assert "the guests after it were updated" in message and ["apk", "upgrade"] in ran(fresh[107])


def test_a_guest_that_cannot_snapshot_is_refused_or_backed_up_as_chosen(updates, fresh, sim):
    message, sent = requests_during(sim, lambda: updates.error("write_update_guests", {"vmids": [110],
                                                                                       "confirm": True}))
    assert "cannot take a snapshot (rootfs is on local (dir)" in message and "without_snapshot" in message
    assert writes(sent) == [] and ran(fresh[110]) == []
    assert "give backup_storage" in updates.error("write_update_guests", {"vmids": [110],
                                                                          "without_snapshot": "backup"})
    done, sent = requests_during(sim, lambda: updates.ok("write_update_guests", {
        "vmids": [110], "without_snapshot": "backup", "backup_storage": "local", "confirm": True}))
    assert done["guests"][0]["backup"]["storage"] == "local" and done["guests"][0]["upgraded"] == 1
    assert ("pve", "POST", "/nodes/pve1/vzdump") in sent


def test_vms_through_the_guest_agent_and_a_failed_check_rolled_back(updates, fresh, sim):
    done, sent = requests_during(sim, lambda: updates.ok("write_update_guests", {"vmids": [100], "confirm": True}))
    vm = done["guests"][0]
    assert vm["os"] == "Debian GNU/Linux 13 (trixie)" and vm["package_manager"] == "apt" and vm["result"] == "updated"
    execs = [r for r in writes(sent) if r[2].endswith("/agent/exec")]
    assert execs == [("pve", "POST", "/nodes/pve1/qemu/100/agent/exec")]
    sim.lab.guests[100]["snapshots"] = []
    message, sent = requests_during(sim, lambda: updates.error("write_update_guests", {
        "vmids": [100], "checks": ["test -f /run/app.pid || exit 3"], "rollback_on_failure": True, "confirm": True}))
    assert "rolled back" in message and any(r[2].endswith("/rollback") for r in writes(sent))
    assert "skipped: stopped" in updates.ok("write_update_guests", {"vmids": [104], "confirm": True})["guests"][0][
        "result"]  # a stopped VM (and Windows) is left alone


def test_protected_guests_hostile_checks_and_bad_input(updates, fresh, sim):
    message, sent = requests_during(sim, lambda: updates.error("write_update_guests", {"vmids": [106, 105],
                                                                                       "confirm": True}))
    assert "release pipeline" in message and writes(sent) == [] and ran(fresh[106]) == []
    check = "test \"$(printf %s 'a  b')\" = 'a  b' && echo 'quoted;$(id)`id`'"  # reaches the guest's sh -c intact
    done = updates.ok("write_update_guests", {"vmids": [107], "checks": [check], "confirm": True})
    assert done["guests"][0]["checks"][-1] == {"check": check, "ok": True, "exit_code": 0,
                                               "output": "quoted;$(id)`id`"}
    assert "Choose the guests" in updates.error("write_update_guests", {"confirm": True})
    assert "No guest 4242" in updates.error("write_update_guests", {"vmids": [4242]})
    assert "at most 10 commands" in updates.error("write_update_guests", {"vmids": [106], "checks": ["true"] * 11})
    assert "confirm=true" in updates.error("write_update_guests", {"vmids": [106]})


@pytest.mark.mcp
@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_one_question_for_the_whole_plan_and_progress_per_guest(sim, sshd, roots, tmp_path, mode):
    for vmid, (_, pending, running) in CONTAINERS.items():
        fake_containers.set_state(roots[vmid], pending, running)
        sim.lab.guests[vmid]["snapshots"] = []
    user = User()
    user.answers = ["accept"]
    env = ssh_env(sim, sshd, tmp_path) | {"PROXMOX_TOOLSETS": "all", "PROXMOX_ACCESS": "destructive"}
    progress = []
    with stdio_session(env, mode=mode, log_name=f"updates-{mode}", elicitation_callback=user) as session:
        done = session.ok("write_update_guests", {"tag": "autoupdate", "checks": ["curl -fsS localhost:8080"],
                                                  "rollback_on_failure": True}, progress=progress)
    assert done["updated"] == 2 and len(user.asked) == 1
    question = user.asked[0]
    assert "Update 2 guest(s)" in question and "ct-debian-106 (vmid 106)" in question and "check: curl" in question
    assert [m for _, _, m in progress if m and m.startswith("guest ")] == [
        "guest 106 (1/2): snapshot, upgrade, checks", "guest 107 (2/2): snapshot, upgrade, checks"]
