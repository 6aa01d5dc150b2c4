"""The user's yes on every protocol revision (docs/SECURITY.md#confirmation): a client that can ask
its user is never answered by the model's confirm=true. Before the call runs, the tool is planned
as far as its first write (or its declared steps) and the user is asked about exactly that plan:
in the middle of the call up to protocol 2025-11-25, through the input-required round trip on
2026-07-28 (the SDK client's default mode). A plan that changes before it is sent is asked again;
the restore drill asks once, before its first step, for the whole drill.

Every test here runs on both revisions: `auto` is the SDK client's default (2026-07-28 against
this server), `legacy` the initialize handshake today's desktop clients speak."""
import json

import pytest

import confirmation
from conftest import User, everything_open, requests_during, stdio_session
from errors import ConfirmationNeeded

PROTECTED = [{"host": "lab", "vmid": 101, "name": "db", "reason": "the production database"}]


def writes(sent: list) -> list:
    return [r for r in sent if r[1] != "GET"]


@pytest.fixture(scope="module", params=["auto", "legacy"])
def asking(request, sim, tmp_path_factory):
    """A client that asks its user (it declares elicitation), in the SDK client's default mode and
    in the older handshake. Every gate is open: the tests are about the user's yes, not the tiers."""
    tmp = tmp_path_factory.mktemp(f"asking-{request.param}")
    (tmp / "protected.json").write_text(json.dumps(PROTECTED))
    user = User()
    with stdio_session(everything_open(sim, tmp), mode=request.param, log_name=f"confirm-{request.param}",
                       elicitation_callback=user) as session:
        session.user, session.mode, session.tmp = user, request.param, tmp
        yield session


@pytest.fixture(scope="module", params=["auto", "legacy"])
def plain(request, sim, tmp_path_factory):
    """A client that cannot ask its user: confirm=true stands in."""
    tmp = tmp_path_factory.mktemp(f"plain-{request.param}")
    (tmp / "protected.json").write_text(json.dumps(PROTECTED))
    with stdio_session(everything_open(sim, tmp), mode=request.param, log_name=f"confirm-plain-{request.param}") \
            as session:
        yield session


@pytest.fixture()
def user(asking):
    asking.user.answers, asking.user.on_question = [], None
    asked = len(asking.user.asked)
    yield asking.user
    asking.user.answers, asking.user.on_question = [], None
    asking.user.asked = asking.user.asked[:asked]


def test_the_session_speaks_the_revision_it_is_named_for(asking):
    assert (asking.client.protocol_version == "2026-07-28") == (asking.mode == "auto"), asking.client.protocol_version


def test_confirm_true_never_stands_in_for_a_client_that_can_ask(asking, user, sim):
    """The README's demo example: "stop guest 105" with confirm=true asks the user, whose no wins."""
    stop = {"vmid": 105, "action": "stop", "confirm": True}
    user.answers = ["decline"]
    message, sent = requests_during(sim, lambda: asking.error("write_power_guest", stop))
    assert "did not confirm" in message and writes(sent) == []
    assert len(user.asked) == 1 and "ci-runner (vmid 105)" in user.asked[0] and "DESTRUCTIVE" in user.asked[0]
    user.answers = ["accept"]
    done, sent = requests_during(sim, lambda: asking.ok("write_power_guest", stop))
    assert done["guest_state"] == "stopped" and ("pve", "POST", "/nodes/pve3/lxc/105/status/stop") in sent
    assert len(user.asked) == 2  # one question per call, about the request that was sent
    sim.lab.guests[105]["status"] = "running"


def test_a_refusal_is_audited_and_a_dry_run_asks_nobody(asking, user, sim):
    delete = {"vmid": 104, "confirm": True}
    user.answers = ["cancel"]
    assert "did not confirm (cancel)" in asking.error("write_delete_guest", delete)
    last = json.loads((asking.tmp / "audit.jsonl").read_text().splitlines()[-1])
    assert last["verdict"] == "refused" and last["path"] == "/nodes/pve2/qemu/104" and last["tool"] == \
        "write_delete_guest"
    plan = asking.ok("write_delete_guest", delete | {"dry_run": True})
    assert plan["needs_confirmation"] is True and len(user.asked) == 1 and 104 in sim.lab.guests


def test_a_plan_that_changes_before_it_is_sent_is_asked_again(asking, user, sim):
    """The user says yes to a job edit; meanwhile someone excludes another guest from the job.
    The edit is judged with the job as stored, so the yes no longer covers it: asked again (on
    2026-07-28 the retry finds another plan; before it, the call finds it when it sends)."""
    job = sim.lab.backup_jobs[0]
    stored = dict(job)
    job["exclude"] = "101,104"  # the protected guest stays out of the job
    edit = {"method": "PUT", "path": f"/cluster/backup/{job['id']}", "params": {"prune-backups": "keep-last=3"}}

    def someone_edits_the_job(question: int) -> None:
        if question == 1:
            job["exclude"] = "101,104,102"
    user.on_question, user.answers = someone_edits_the_job, ["accept", "accept"]
    try:
        done, sent = requests_during(sim, lambda: asking.ok("write_call_api", edit))
        assert len(user.asked) == 2 and user.asked[0] != user.asked[1]  # another plan, another question
        assert writes(sent) == [("pve", "PUT", f"/cluster/backup/{job['id']}")], done
    finally:
        job.clear()
        job.update(stored)


def test_the_restore_drill_asks_for_the_whole_drill_before_its_first_step(asking, user, sim):
    user.answers = ["decline"]
    message, sent = requests_during(sim, lambda: asking.error("write_drill_restore", {"vmid": 100}))
    assert "did not confirm" in message and writes(sent) == []  # nothing restored, nothing booted
    question = user.asked[0]
    assert "Restore drill of guest 100" in question and "delete the scratch guest" in question
    assert "DELETE" in question and "/status/stop" in question
    user.answers = ["accept"]
    before = set(sim.lab.guests)
    done = asking.ok("write_drill_restore", {"vmid": 100, "answer_seconds": 5})
    assert done["result"] == "ok" and set(sim.lab.guests) == before  # restored, booted, deleted
    assert len(user.asked) == 2  # asked once for the whole drill


def test_without_a_yes_the_drill_sends_nothing(plain, sim):
    """Before, a drill without confirmation restored and booted a copy, then stopped at the delete
    and left it running."""
    before = set(sim.lab.guests)
    message, sent = requests_during(sim, lambda: plain.error("write_drill_restore", {"vmid": 100}))
    assert "Confirmation needed" in message and "confirm=true" in message and "Restore drill" in message
    assert writes(sent) == [] and set(sim.lab.guests) == before


def test_the_drills_dry_run_shows_the_whole_plan(plain, sim):
    plan, sent = requests_during(sim, lambda: plain.ok("write_drill_restore", {"vmid": 100, "dry_run": True}))
    assert plan["needs_confirmation"] is True and "Restore drill of guest 100" in plan["plan"]
    start, stop, delete = (step["run"] for step in plan["steps"])
    assert start.endswith("/status/start") and stop == start.replace("start", "stop") and stop.startswith(delete)
    assert [step["needs_confirmation"] for step in plan["steps"]] == [False, True, True]
    assert writes(sent) == []


def test_a_client_that_cannot_ask_needs_confirm_true(plain, sim):
    stop = {"vmid": 105, "action": "stop"}
    message, sent = requests_during(sim, lambda: plain.error("write_power_guest", stop))
    assert "Confirmation needed" in message and "confirm=true" in message and writes(sent) == []
    assert plain.ok("write_power_guest", stop | {"confirm": True})["guest_state"] == "stopped"
    sim.lab.guests[105]["status"] = "running"


class Capabilities:
    elicitation = True


class ModernContext:
    """What a tool sees of a 2026-07-28 call from a client that declared elicitation."""
    client_capabilities = Capabilities()
    protocol_version = "2026-07-28"


def test_on_2026_07_28_a_request_the_user_did_not_see_is_not_sent():
    """A request that needs the yes and was not in the plan the user approved (it came up while the
    call ran) cannot be asked about in the middle of a 2026-07-28 call: refused, and confirm=true
    does not stand in."""
    from types import SimpleNamespace

    import policy
    host = SimpleNamespace(product="pbs", label="lab")
    decision = policy.Decision("DELETE", "/admin/datastore/backup/snapshots", gates=("read", "destructive"),
                               reasons=["deletes a backup snapshot"])
    with pytest.raises(ConfirmationNeeded, match="Call the tool again"):
        confirmation.confirmer(True, ModernContext())(host, [decision])


def test_a_cluster_rule_added_lower_down_is_asked_once_and_completes(asking, user, sim):
    """Issue 28 section 8: a cluster firewall rule (elevated, so confirmed) added at pos 1 takes three
    requests (add on top disabled, move, enable); all three are declared before the first, so the one
    question covers them and the call completes on both revisions, leaving no disabled rule on top."""
    rules = sim.lab.firewall["cluster"]["rules"]
    before = list(rules)
    rules[:] = [{"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "443", "enable": 1}]
    user.answers = ["accept"]
    try:
        added, sent = requests_during(sim, lambda: asking.ok("write_edit_firewall_rule", {
            "action": "add", "pos": 1, "rule": {"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "80"}}))
        assert added["pos"] == 1 and [(r["dport"], r["enable"]) for r in rules] == [("443", 1), ("80", 1)]
        assert [r[1:] for r in writes(sent)] == [("POST", "/cluster/firewall/rules"),
                                                  ("PUT", "/cluster/firewall/rules/0"),
                                                  ("PUT", "/cluster/firewall/rules/1")]
        assert len(user.asked) == 1 and "moved to pos 1, then enabled" in user.asked[0]
        assert "1) ELEVATED: POST" in user.asked[0] and "3) ELEVATED: PUT /cluster/firewall/rules/1" in user.asked[0]
    finally:
        rules[:] = before


def test_the_question_names_the_volume_a_config_edit_frees_and_the_yes_is_pinned_to_it(asking, user, sim):
    """Issue 28 section 7: `delete=unused0` frees the volume unused0 holds. The question names it and its
    size; someone re-points unused0 at a 500 GiB disk while the user reads: the yes was for the 8 GiB
    one, so the user is asked again, about the 500 GiB disk, and the no wins. Nothing is sent."""
    guest = sim.lab.guests[104]
    small, big = "local-lvm:vm-104-disk-7", "local-lvm:vm-104-disk-8"
    guest["config"]["unused0"], guest["detached"] = small, {small: 8 * 2**30, big: 500 * 2**30}
    edit = {"method": "PUT", "path": "/nodes/pve2/qemu/104/config", "params": {"delete": "unused0"}}

    def someone_repoints_it(question: int) -> None:
        if question == 1:
            guest["config"]["unused0"] = big
    user.on_question, user.answers = someone_repoints_it, ["accept", "decline"]
    try:
        message, sent = requests_during(sim, lambda: asking.error("write_call_api", edit))
        assert len(user.asked) == 2 and "did not confirm" in message and writes(sent) == []
        assert f"frees unused0: {small} (8.0 GiB)" in user.asked[0]
        assert f"frees unused0: {big} (500.0 GiB)" in user.asked[1] and guest["config"]["unused0"] == big
    finally:
        guest["config"].pop("unused0", None)
        guest.pop("detached", None)


def test_every_question_names_what_will_be_lost(asking, user, sim):
    """The snapshot a delete removes and the time it was taken, the disks a guest's deletion takes."""
    user.answers, name = ["decline", "decline"], f"before-upgrade-{asking.mode}"
    asking.ok("write_create_snapshot", {"vmid": 104, "name": name})
    assert "did not confirm" in asking.error("write_delete_snapshot", {"vmid": 104, "name": name})
    assert f"deletes snapshot '{name}' (taken 20" in user.asked[0]
    assert "did not confirm" in asking.error("write_delete_guest", {"vmid": 104})
    disk = sim.lab.guests[104]["config"]["scsi0"].split(",")[0]
    assert f"deletes the guest with its disks {disk} (" in user.asked[1]
