"""Receipts and undo end to end: servers over stdio, the SDK's client, the simulator. Each refusal of
write_undo_change reaches the client as a tool error with nothing sent: the object changed since (digest),
a change that cannot be taken back, a gate the inverse needs closed, a protected guest, and the
user's no (asked once for the whole undo, on 2026-07-28 and on the older handshake alike).
Servers that share an audit log share its receipts: a receipt made by one is judged by another's
policy."""
import json

import pytest
import requests

from conftest import User, everything_open, requests_during, stdio_session


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    path = tmp_path_factory.mktemp("undo-over-mcp")
    (path / "protected.json").write_text("[]")
    (path / "protects-104.json").write_text(json.dumps([{"host": "lab", "vmid": 104, "reason": "protected now"}]))
    return path


@pytest.fixture(scope="module", params=["auto", "legacy"])
def asking(request, sim, tmp):
    """A client that asks its user, in the SDK's default mode (2026-07-28) and in the older
    handshake. Every gate is open: an operator's server (the tests are about undo, not the tiers)."""
    user = User()
    with stdio_session(everything_open(sim, tmp), mode=request.param, log_name=f"undo-{request.param}",
                       elicitation_callback=user) as session:
        session.user, session.mode = user, request.param
        yield session


@pytest.fixture()
def user(asking):
    asking.user.answers, asked = [], len(asking.user.asked)
    yield asking.user
    asking.user.answers, asking.user.asked = [], asking.user.asked[:asked]


def writes(sent):
    return [r for r in sent if r[1] != "GET"]


def test_the_session_speaks_the_revision_it_is_named_for(asking):
    assert (asking.client.protocol_version == "2026-07-28") == (asking.mode == "auto")


def test_undo_asks_once_for_the_whole_undo_and_a_no_sends_nothing(asking, user, sim):
    made = asking.ok("write_create_snapshot", {"vmid": 104, "name": f"undo_{asking.mode}"})
    assert user.asked == []  # a snapshot needs no yes; taking it back (deleting it) does
    for confirm in (False, True):  # the model's confirm=true never stands in for a user who can be asked
        user.answers = ["decline"]
        message, sent = requests_during(sim, lambda c=confirm: asking.error("write_undo_change", {
            "receipt": made["receipt"], "confirm": c}))
        assert "did not confirm" in message and writes(sent) == []
    assert [s["name"] for s in sim.lab.guests[104]["snapshots"]] == [f"undo_{asking.mode}"]
    question = user.asked[-1]
    assert f"Take back receipt {made['receipt']}" in question and "DESTRUCTIVE" in question and "(vmid 104)" in question
    user.answers = ["accept"]
    asked = len(user.asked)
    done, sent = requests_during(sim, lambda: asking.ok("write_undo_change", {"receipt": made["receipt"]}))
    assert done["result"] == "ok" and sim.lab.guests[104]["snapshots"] == [] and len(user.asked) == asked + 1
    assert writes(sent) == [("pve", "DELETE", f"/nodes/pve2/qemu/104/snapshot/undo_{asking.mode}")]


def test_undo_is_refused_when_the_object_changed_since(asking, sim):
    done = asking.ok("write_configure_guest", {"vmid": 103, "set": {"description": asking.mode}})
    assert done["receipt"].startswith("rc-")
    # someone else's edit through the API, after ours: another digest, another value
    secret = sim.lab.pve_tokens["root@pam!admin"].secret
    requests.put(f"{sim.pve_url}/api2/json/nodes/pve1/lxc/103/config", data={"swap": 1024}, timeout=10,
                 headers={"Authorization": f"PVEAPIToken=root@pam!admin={secret}"}, verify=str(sim.cert_file))
    message, sent = requests_during(sim, lambda: asking.error("write_undo_change", {"receipt": done["receipt"]}))
    assert "changed since receipt" in message and "swap" in message and writes(sent) == []
    sim.lab.guests[103]["config"]["swap"] = 512  # as the change left it (the digest differs, the values not)
    assert asking.ok("write_undo_change", {"receipt": done["receipt"]})["result"] == "ok"
    assert "description" not in sim.lab.guests[103]["config"]


def test_undo_is_refused_for_what_cannot_be_taken_back(asking, sim):
    grown = asking.ok("write_resize_disk", {"vmid": 104, "disk": "scsi0", "size": "+1G"})
    row = next(r for r in asking.ok("list_changes", {"vmid": 104})["rows"] if r[0] == grown["receipt"])
    assert row[-1] == "no: disks only grow: Proxmox cannot shrink a disk back"
    message, sent = requests_during(sim, lambda: asking.error("write_undo_change", {"receipt": grown["receipt"]}))
    assert "cannot be taken back" in message and "disks only grow" in message and writes(sent) == []


def test_what_changed_over_mcp(asking):
    done = asking.ok("write_configure_guest", {"vmid": 104, "set": {"cores": 4}})
    assert asking.ok("what_changed", {"vmid": 104, "since": done["receipt"]})["changes"] == ["cores 2 -> 4"]
    asking.ok("write_undo_change", {"receipt": done["receipt"]})


@pytest.fixture(scope="module")
def made(sim, tmp):
    """A snapshot of guest 104 taken by an operator's server; its receipt, for the servers below."""
    with stdio_session(everything_open(sim, tmp), log_name="undo-maker") as maker:
        yield maker.ok("write_create_snapshot", {"vmid": 104, "name": "shared"})["receipt"]
        maker.ok("write_delete_snapshot", {"vmid": 104, "name": "shared", "confirm": True})


def test_undo_is_refused_when_the_inverse_needs_a_closed_gate(sim, tmp, made):
    """The operator of this server opened the write tier only: deleting the snapshot is destructive."""
    with stdio_session(everything_open(sim, tmp, PROXMOX_ACCESS="write"), log_name="undo-writer") as writer:
        message, sent = requests_during(sim, lambda: writer.error("write_undo_change",
                                                                  {"receipt": made, "confirm": True}))
    assert "needs the 'destructive' gate" in message and "PROXMOX_ACCESS=destructive" in message
    assert writes(sent) == [] and "shared" in [s["name"] for s in sim.lab.guests[104]["snapshots"]]


def test_undo_never_reaches_a_protected_guest(sim, tmp, made):
    env = everything_open(sim, tmp, PROXMOX_PROTECTED_VMS_FILE=str(tmp / "protects-104.json"))
    with stdio_session(env, log_name="undo-guarded") as guarded:
        message, sent = requests_during(sim, lambda: guarded.error("write_undo_change",
                                                                   {"receipt": made, "confirm": True}))
    assert "Guest 104" in message and "protected" in message and writes(sent) == []
    assert "shared" in [s["name"] for s in sim.lab.guests[104]["snapshots"]]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_the_safety_snapshots_the_rule_removes_are_in_the_one_question(sim, tmp, mode):
    """PROXMOX_SAFETY_KEEP=1: the second rollback's question names the older safety snapshot it
    deletes (declared with the rollback), the user is asked once, and it is deleted: on 2026-07-28,
    where nothing can be asked in the middle of a call, as on the older handshake."""
    user = User()
    env = everything_open(sim, tmp, PROXMOX_SAFETY_KEEP="1")
    guest = sim.lab.guests[104]
    with stdio_session(env, mode=mode, log_name=f"undo-safety-{mode}", elicitation_callback=user) as session:
        session.ok("write_create_snapshot", {"vmid": 104, "name": f"kept_{mode}"})
        user.answers = ["accept"]
        first = session.ok("write_rollback_snapshot", {"vmid": 104, "name": f"kept_{mode}"})
        older = first["safety_snapshot"]["name"]
        user.answers, asked = ["accept"], len(user.asked)
        second, sent = requests_during(sim, lambda: session.ok("write_rollback_snapshot",
                                                               {"vmid": 104, "name": f"kept_{mode}"}))
        assert len(user.asked) == asked + 1 and f"older safety snapshots of this guest are deleted: {older}" in \
            user.asked[-1] and f"DELETE /nodes/pve2/qemu/104/snapshot/{older}" in user.asked[-1]
        assert second["safety_snapshots_removed"] == [older] and "safety_snapshots_note" not in second
        assert ("pve", "DELETE", f"/nodes/pve2/qemu/104/snapshot/{older}") in writes(sent)
        names = [s["name"] for s in guest["snapshots"]]
        assert older not in names and second["safety_snapshot"]["name"] in names
        for name in (second["safety_snapshot"]["name"], f"kept_{mode}"):
            user.answers = ["accept"]
            session.ok("write_delete_snapshot", {"vmid": 104, "name": name})
    assert guest["status"] == "stopped"  # as the lab has it: a rollback without RAM leaves it stopped
