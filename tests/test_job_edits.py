"""Jobs, rules and groups judged as they will be after the request (job_edits.py): the object after
an edit computed as Proxmox computes it, what its deletion and its treatment of protected guests
become, one row per case. The bypass corpus (tests/test_bypass_corpus.py) holds the refusals these
lead to; here are the rules beneath them."""
import json
from types import SimpleNamespace

import pytest

import job_edits
import policy
from conftest import everything_open, in_process, requests_during
from errors import PolicyError, ProxmoxError
from protection import Protected
from settings import HostPolicy, Settings

PVE = SimpleNamespace(product="pve", label="lab", token_id="root@pam!admin", write_token_id=None)


# ---------------------------------------------------------------- the object after the edit

@pytest.mark.parametrize("stored, given, deleted, after", [
    # pve-manager PVE/API2/Backup.pm update_job: delete, set, then the selection made consistent
    ({"all": 1, "exclude": "100", "mode": "snapshot"}, {"mode": "stop"}, ["exclude"], {"all": 1, "mode": "stop"}),
    ({"vmid": "100,101"}, {"all": 1}, [], {"all": 1}),
    ({"all": 1, "exclude": "104"}, {"vmid": "103"}, [], {"vmid": "103"}),
    ({"pool": "prod"}, {"exclude": "101"}, [], {"pool": "prod"}),
    ({"vmid": "103"}, {"exclude": "101"}, ["vmid"], {"all": 1, "exclude": "101"}),
    ({"all": 1, "exclude": "104"}, {"pool": "prod"}, [], {"pool": "prod"}),
    ({"vmid": "103", "enabled": 0}, {"enabled": 1}, [], {"vmid": "103", "enabled": 1}),
])
def test_a_backup_job_after_an_edit(stored, given, deleted, after):
    assert job_edits.merge_backup_job(stored, given, deleted) == after


@pytest.mark.parametrize("merge, stored, given, deleted, after", [
    # proxmox-backup sync.rs / prune.rs: delete, then set; the root namespace is no namespace
    (job_edits.merge_pbs_job, {"store": "b", "remove-vanished": True}, {"remote-store": "x"}, [],
     {"store": "b", "remove-vanished": True, "remote-store": "x"}),
    (job_edits.merge_pbs_job, {"store": "b", "ns": "old", "max-depth": 0}, {}, ["ns", "max-depth"], {"store": "b"}),
    (job_edits.merge_pbs_job, {"store": "b", "ns": "old"}, {"ns": ""}, [], {"store": "b"}),
    # pve-ha-manager Rules.pm update_rule: disable=0 is dropped (only delete=disable enables)
    (job_edits.merge_ha_rule, {"resources": "vm:101", "disable": 1}, {"disable": 0}, [],
     {"resources": "vm:101", "disable": 1}),
    (job_edits.merge_ha_rule, {"resources": "vm:101", "disable": 1}, {}, ["disable"], {"resources": "vm:101"}),
    # Groups.pm update: set first, then delete (a deleted option given too is gone)
    (job_edits.merge_ha_group, {"nodes": "pve1", "restricted": 1}, {"restricted": 0}, ["restricted"],
     {"nodes": "pve1"}),
])
def test_pbs_jobs_and_ha_after_an_edit(merge, stored, given, deleted, after):
    assert merge(stored, given, deleted) == after


@pytest.mark.parametrize("value, names", [("exclude,mode", ["exclude", "mode"]), ("a; b c", ["a", "b", "c"]),
                                          (["disable", "ns"], ["disable", "ns"]), (None, [])])
def test_delete_lists_of_both_products(value, names):
    assert job_edits.delete_names(value) == names


# ---------------------------------------------------------------- what it deletes, what it does to guests

def verdict(method, path, params, stored, protected=(100, 101, 102), product="pve"):
    from urllib.parse import unquote

    import catalog
    template, _, path_params = catalog.find_path(product, unquote(path))
    return job_edits.judge(product, method, template, path_params, params, stored.get, list(protected), "test")


RESOURCES = [{"type": "qemu", "vmid": 100, "node": "pve1"}, {"type": "qemu", "vmid": 101, "node": "pve2"},
             {"type": "lxc", "vmid": 102, "node": "pve3"}, {"type": "storage", "storage": "local-lvm",
                                                             "plugintype": "lvmthin"},
             {"type": "storage", "storage": "local", "plugintype": "dir"}]


@pytest.mark.parametrize("stored, params, gates", [
    ({"enabled": 0, "vmid": "103", "prune-backups": "keep-last=1"}, {"enabled": 1}, {"destructive"}),
    ({"enabled": 1, "vmid": "103", "prune-backups": "keep-last=1"}, {"comment": "x"}, set()),  # deletes as before
    ({"enabled": 1, "vmid": "103", "prune-backups": "keep-last=1"}, {"vmid": "104"}, {"destructive"}),
    ({"enabled": 1, "vmid": "103", "prune-backups": "keep-last=1"}, {"remove": 0}, set()),  # stops pruning
    ({"enabled": 1, "vmid": "103"}, {"prune-backups": "keep-all=1"}, set()),
    # GET answers prune-backups as an object, PUT takes a property string (Backup.pm: "proper objects
    # when they are returned from the API"): the same retention either way
    ({"enabled": 0, "vmid": "103", "prune-backups": {"keep-all": 1}}, {"enabled": 1}, set()),
    ({"enabled": 1, "vmid": "103", "prune-backups": {"keep-last": 2, "keep-daily": 7}},
     {"prune-backups": "keep-daily=7,keep-last=2"}, set()),
    ({"enabled": 1, "vmid": "103", "prune-backups": {"keep-last": 2}}, {"prune-backups": "keep-last=1"},
     {"destructive"}),
])
def test_a_backup_edit_deletes_when_what_the_job_prunes_changes(stored, params, gates):
    found = verdict("PUT", "/cluster/backup/j", params, {"/cluster/backup/j": stored}, protected=())
    assert found.gates == gates


@pytest.mark.parametrize("stored, params, gates", [
    ({"store": "b", "schedule": "daily", "remove-vanished": True}, {"remote-ns": "x"}, {"destructive"}),
    ({"store": "b", "schedule": "daily", "remove-vanished": False}, {"remote-ns": "x"}, set()),  # the GUI's false
    ({"store": "b", "remove-vanished": True}, {"remote-ns": "x"}, set()),  # no schedule: it never runs by itself
    ({"store": "b", "remove-vanished": True}, {"schedule": "daily"}, {"destructive"}),
    ({"store": "b", "schedule": "daily", "remove-vanished": True}, {"remove-vanished": 1, "rate-in": "1MiB"}, set()),
])
def test_a_sync_edit_deletes_when_what_it_removes_changes(stored, params, gates):
    found = verdict("PUT", "/config/sync/s", params, {"/config/sync/s": stored}, product="pbs")
    assert found.gates == gates and found.whole_scope == (job_edits.PBS_SCOPE if gates else None)


def test_a_run_deletes_what_the_stored_job_deletes_schedule_or_not():
    stored = {"/config/sync/s": {"store": "b", "remove-vanished": "true"}}
    assert verdict("POST", "/admin/sync/s/run", {}, stored, product="pbs").gates == {"destructive"}
    stored = {"/config/sync/s": {"store": "b", "remove-vanished": False, "schedule": "daily"}}
    assert verdict("POST", "/admin/sync/s/run", {}, stored, product="pbs").gates == set()


@pytest.mark.parametrize("params, changed", [
    ({"vmid": "101", "mode": "snapshot", "remove": 0}, set()),  # a VM: nothing changes on it
    ({"vmid": "101", "mode": "snapshot"}, {101}),  # prunes its older backups
    ({"vmid": "101", "remove": 0}, {101}),  # the node's vzdump.conf chooses the mode
    ({"vmid": "102", "mode": "snapshot", "remove": 0}, set()),  # a container on lvmthin
    ({"all": 1, "exclude": "100,101,102", "mode": "stop"}, set()),  # none of them
    ({"pool": "prod", "mode": "snapshot", "remove": 0}, set()),  # a pool may hold any of them: all judged
    ({"pool": "prod", "mode": "stop"}, {100, 101, 102}),
])
def test_a_backup_changes_a_protected_guest_unless_snapshot_without_prune(params, changed):
    stored = {"/cluster/resources": RESOURCES, "/nodes/pve3/lxc/102/config": {"rootfs": "local-lvm:vm-102-disk-0"}}
    found = verdict("POST", "/nodes/pve1/vzdump", params, stored)
    assert set(found.changed) == changed


# a pool's members, as GET /pools/{poolid} answers them (pve-manager PVE/API2/Pool.pm read_pool)
POOLS = {"/pools/prod": {"poolid": "prod", "members": [{"id": "qemu/101", "type": "qemu", "vmid": 101,
                                                        "node": "pve2"}]},
         "/pools/ci": {"poolid": "ci", "members": [{"id": "lxc/105", "type": "lxc", "vmid": 105, "node": "pve3"}]}}


@pytest.mark.parametrize("params, changed", [
    ({"pool": "prod", "mode": "stop"}, {101}),  # the pool's members only
    ({"pool": "ci", "mode": "stop"}, set()),  # none of them is protected
    # vzdump takes the pool's members and ignores exclude (and all) when a pool is given
    # (PVE/VZDump.pm get_included_guests): 101 is backed up, with the storage's retention
    ({"all": 1, "exclude": "101", "pool": "prod", "mode": "snapshot"}, {101}),
    ({"all": 1, "exclude": "100,101,102", "pool": "prod", "mode": "stop"}, {101}),
    ({"pool": "ghost", "mode": "stop"}, {100, 101, 102}),  # members unreadable: it may hold any of them
])
def test_a_backup_by_pool_reaches_the_pools_members(params, changed):
    stored = {"/cluster/resources": RESOURCES} | POOLS
    assert set(verdict("POST", "/nodes/pve1/vzdump", params, stored).changed) == changed
    job = verdict("POST", "/cluster/backup", params | {"schedule": "daily", "id": "j"}, stored)
    assert set(job.changed) == changed  # a job created so, as vzdump resolves it when it runs


def test_a_nested_pool_is_read_through_the_pools_index():
    """Nested pools (PVE 8.1+) cannot be read as /pools/{poolid} (Pool.pm read_pool: "deprecated, no
    support for nested pools, use 'GET /pools/?poolid={poolid}'"), and vzdump takes any pool id."""
    nested = [{"poolid": "team/web", "members": [{"id": "qemu/101", "type": "qemu", "vmid": 101, "node": "pve2"}]}]

    def read(path, **params):
        if path == "/pools" and params == {"poolid": "team/web"}:
            return nested
        if path == "/cluster/resources":
            return RESOURCES
        raise ProxmoxError(f"Method 'GET {path}' not implemented", status=501)
    found = job_edits.judge("pve", "POST", "/nodes/{node}/vzdump", {"node": "pve1"},
                            {"pool": "team/web", "mode": "stop"}, read, [100, 101, 102], "test")
    assert set(found.changed) == {101}


@pytest.mark.parametrize("stored_job, params, changed", [
    # moved from the pool that holds 101 to one that does not: 101 is no longer backed up
    ({"pool": "prod", "mode": "snapshot", "remove": 0}, {"pool": "ci"}, {101: "no longer acts on it"}),
    ({"pool": "ci", "mode": "stop"}, {"pool": "prod"}, {101: "mode stop"}),  # taken in, in stop mode
    ({"pool": "ci", "mode": "stop"}, {"comment": "x"}, {}),
    # a pool whose members cannot be read, judged both ways: it may let 101 go
    ({"pool": "prod", "mode": "snapshot", "remove": 0}, {"pool": "ghost"}, {101: "not holding it"}),
    ({"pool": "ghost", "mode": "snapshot", "remove": 0}, {"comment": "x"}, {}),  # the same pool either way
])
def test_a_job_edit_is_judged_by_the_members_of_its_pools(stored_job, params, changed):
    stored = {"/cluster/resources": RESOURCES, "/cluster/backup/j": stored_job | {"enabled": 1}} | POOLS
    found = verdict("PUT", "/cluster/backup/j", params, stored).changed
    assert set(found) == set(changed) and all(why in found[vmid] for vmid, why in changed.items()), found


@pytest.mark.parametrize("config, why", [
    ({"rootfs": "local:102/vm-102-disk-0.raw"}, "on dir storage"),
    ({"rootfs": "local-lvm:vm-102-disk-0", "mp0": "local:102/vm-102-disk-1.raw,mp=/srv,backup=1"}, "on dir storage"),
    ({"rootfs": "nowhere:vm-102-disk-0"}, "on unknown storage"),
    ({"rootfs": "local-lvm:vm-102-disk-0", "mp0": "local:102/vm-102-disk-1.raw,mp=/srv"}, None),  # backup=0
    ({"rootfs": "local-lvm:vm-102-disk-0", "mp1": "/srv/data,mp=/data,backup=1"}, None),  # a bind mount: never
])
def test_a_container_is_suspended_when_a_backed_up_volume_cannot_snapshot(config, why):
    stored = {"/cluster/resources": RESOURCES, "/nodes/pve3/lxc/102/config": config}
    found = verdict("POST", "/nodes/pve3/vzdump", {"vmid": "102", "mode": "snapshot", "remove": 0}, stored)
    assert (why in found.changed[102]) if why else found.changed == {}
    if why:
        assert "suspend" in found.changed[102]


@pytest.mark.parametrize("method, params, changed", [
    ("PUT", {"type": "node-affinity", "comment": "why"}, set()),
    ("PUT", {"type": "node-affinity", "nodes": "pve3"}, {101}),
    ("PUT", {"type": "node-affinity", "resources": "vm:103"}, {101}),  # lets it go
    ("PUT", {"type": "node-affinity", "resources": "vm:101,vm:100"}, {100, 101}),  # with another (affinity: together)
    ("DELETE", {}, {101}),
])
def test_an_ha_rule_holding_a_protected_guest(method, params, changed):
    stored = {"/cluster/ha/rules/r1": {"type": "node-affinity", "resources": "vm:101", "nodes": "pve1"}}
    assert set(verdict(method, "/cluster/ha/rules/r1", params, stored).changed) == changed


def test_an_ha_group_is_judged_by_the_resources_that_name_it():
    stored = {"/cluster/ha/groups/g": {"nodes": "pve1"},
              "/cluster/ha/resources": [{"sid": "ct:102", "group": "g"}, {"sid": "vm:103", "group": "h"}]}
    assert set(verdict("PUT", "/cluster/ha/groups/g", {"nodes": "pve2"}, stored).changed) == {102}
    stored["/cluster/ha/resources"] = [{"sid": "vm:103", "group": "g"}]
    assert verdict("PUT", "/cluster/ha/groups/g", {"nodes": "pve2"}, stored).changed == {}
    # a resource may name a group that does not exist yet: creating it places the guest
    stored["/cluster/ha/resources"] = [{"sid": "vm:100", "group": "new"}]
    assert set(verdict("POST", "/cluster/ha/groups", {"group": "new", "nodes": "pve2"}, stored).changed) == {100}


# PVE 9's HA rules as GET /cluster/ha/rules lists them: 101 must run with 104, 104 is kept on pve2,
# 105 is kept apart from 103 (pve-ha-manager Rules/NodeAffinity.pm, Rules/ResourceAffinity.pm)
HA = {"/cluster/ha/rules": [
    {"rule": "together", "type": "resource-affinity", "resources": "vm:101,vm:104", "affinity": "positive"},
    {"rule": "r104", "type": "node-affinity", "resources": "vm:104", "nodes": "pve2", "strict": 1},
    {"rule": "apart", "type": "resource-affinity", "resources": "ct:103,ct:105", "affinity": "negative"}],
    "/cluster/ha/groups": [{"group": "g", "nodes": "pve1:2,pve2", "restricted": 0}],
    "/cluster/ha/resources": [{"sid": s} for s in ("vm:101", "vm:104", "ct:103", "ct:105")]
    + [{"sid": "ct:102", "group": "g"}]}
HA |= {f"/cluster/ha/rules/{r['rule']}": r for r in HA["/cluster/ha/rules"]}
HA |= {"/cluster/ha/groups/g": HA["/cluster/ha/groups"][0]}
HA |= {f"/cluster/ha/resources/{r['sid']}": r for r in HA["/cluster/ha/resources"]}


@pytest.mark.parametrize("method, path, params, changed", [
    # the rule of the guest 101 must run with: the HA manager moves 101 along
    # (Rules.pm create_implicit_positive_resource_affinity_node_affinity_rules; Manager.pm select_service_node)
    ("PUT", "/cluster/ha/rules/r104", {"type": "node-affinity", "nodes": "pve3"}, {101}),
    ("PUT", "/cluster/ha/rules/r104", {"type": "node-affinity", "delete": "strict"}, {101}),
    ("PUT", "/cluster/ha/rules/r104", {"type": "node-affinity", "disable": 1}, {101}),
    ("DELETE", "/cluster/ha/rules/r104", {}, {101}),
    ("PUT", "/cluster/ha/rules/together", {"type": "resource-affinity", "affinity": "negative"}, {101}),
    ("POST", "/cluster/ha/rules", {"rule": "r2", "type": "node-affinity", "resources": "vm:104", "nodes": "pve1"},
     {101}),  # a second node affinity rule for 104: both are dropped (check_single_resource_reference)
    # 104's group becomes a second node affinity rule for it: both are dropped, 102's group's rule too
    ("PUT", "/cluster/ha/resources/vm:104", {"group": "g"}, {101, 102}),
    ("PUT", "/cluster/ha/resources/vm:104", {"failback": 0}, {101}),
    # a group's priorities, strictness and failback move the guests whose resources name it
    ("PUT", "/cluster/ha/groups/g", {"nodes": "pve1,pve2:2"}, {102}),
    ("PUT", "/cluster/ha/groups/g", {"restricted": 1}, {102}),
    ("PUT", "/cluster/ha/groups/g", {"nofailback": 1}, {102}),
    # what places no protected guest, or places them as before
    ("PUT", "/cluster/ha/rules/r104", {"type": "node-affinity", "comment": "why"}, set()),
    ("PUT", "/cluster/ha/rules/r104", {"type": "node-affinity", "nodes": "pve2:0"}, set()),  # priority 0 is none
    ("PUT", "/cluster/ha/rules/apart", {"type": "resource-affinity", "affinity": "positive"}, set()),
    ("PUT", "/cluster/ha/resources/ct:105", {"failback": 0, "max_relocate": 2}, set()),
    ("PUT", "/cluster/ha/groups/g", {"comment": "first floor"}, set()),
])
def test_an_ha_edit_is_judged_by_where_it_places_the_protected_guests(method, path, params, changed):
    assert set(verdict(method, path, params, HA).changed) == changed


def test_an_object_that_cannot_be_read_refuses_the_request():
    with pytest.raises(PolicyError, match="could not be read"):
        verdict("PUT", "/cluster/ha/rules/gone", {"type": "node-affinity", "comment": "x"}, {})


# ---------------------------------------------------------------- in the admission step

def test_an_unreadable_protected_list_refuses_every_job_edit(tmp_path):
    original = policy.settings()
    rules = HostPolicy("destructive", frozenset({"exec", "elevated", "sensitive"}))
    policy.configure(Settings(hosts={("pve", "lab"): rules}, protected=Protected(error="broken")))
    try:
        with pytest.raises(PolicyError, match="protected-guest list could not be read"):
            policy.check(PVE, "PUT", "/cluster/ha/rules/r1", {"type": "node-affinity", "comment": "x"},
                         read={"/cluster/ha/rules/r1": {"type": "node-affinity", "resources": "vm:103"}}.get)
    finally:
        policy.configure(original)


def test_the_refusal_says_what_changes_for_which_guest_and_what_would_pass():
    original = policy.settings()
    rules = HostPolicy("destructive", frozenset({"exec", "elevated", "sensitive"}))
    protected = Protected([{"host": "lab", "vmid": 101, "name": "db", "reason": "production"}])
    policy.configure(Settings(hosts={("pve", "lab"): rules}, protected=protected))
    stored = {"/cluster/backup/j": {"all": 1, "exclude": "101", "mode": "snapshot", "enabled": 1}}
    try:
        with pytest.raises(PolicyError) as refused:
            policy.check(PVE, "PUT", "/cluster/backup/j", {"delete": "exclude", "mode": "stop"}, read=stored.get)
    finally:
        policy.configure(original)
    message = str(refused.value)
    assert "changes protected guest 101 (db) without naming it" in message and "mode stop" in message
    assert "mode=snapshot and remove=0" in message


# ---------------------------------------------------------------- through the tools, against the simulator

def test_an_ha_rule_edit_is_judged_and_the_simulator_stores_what_was_judged(sim, tmp_path):
    """The simulator keeps HA rules as pve-ha-manager does: the object the policy judged is the
    one stored after the request."""
    sim.lab.ha_rules["web-first"] = {"type": "node-affinity", "resources": "vm:103", "nodes": "pve1", "strict": 1}
    sim.lab.ha_rules["db-here"] = {"type": "node-affinity", "resources": "vm:101", "nodes": "pve2"}
    (tmp_path / "protected.json").write_text(json.dumps([{"host": "lab", "vmid": 101, "reason": "prod"}]))
    with in_process(everything_open(sim, tmp_path), log_name="job-edits") as session:
        edit = {"type": "node-affinity", "nodes": "pve2:2,pve3", "delete": "strict"}
        stored = sim.lab.ha_rules["web-first"]
        judged = job_edits.merge_ha_rule(dict(stored), {k: v for k, v in edit.items() if k != "delete"}, ["strict"])
        session.ok("write_call_api", {"method": "PUT", "path": "/cluster/ha/rules/web-first", "params": edit})
        assert sim.lab.ha_rules["web-first"] == judged == {"type": "node-affinity", "resources": "vm:103",
                                                            "nodes": "pve2:2,pve3"}
        move = {"method": "PUT", "path": "/cluster/ha/rules/db-here", "params": {"type": "node-affinity",
                                                                                "nodes": "pve3"}}
        message, sent = requests_during(sim, lambda: session.error("write_call_api", move), writes=True)
        assert "changes protected guest 101" in message and sent == []
        assert sim.lab.ha_rules["db-here"]["nodes"] == "pve2"


def test_pools_are_read_and_vzdump_takes_their_members(sim, tmp_path):
    """Issue 28 section 4: a job moved off the pool that holds protected 101 is refused; a one-shot
    vzdump of that pool with `exclude: 101` is refused (vzdump ignores exclude with a pool, so 101 would
    be backed up and pruned by the storage's retention); a backup of a pool holding no protected guest
    passes, and the simulator backs up exactly that pool's members, its exclude ignored."""
    sim.lab.pools["lab"] = {"poolid": "lab", "comment": "scratch"}
    sim.lab.guests[105]["pool"] = "lab"
    sim.lab.backup_jobs.append({"id": "prod-nightly", "type": "vzdump", "schedule": "01:00", "enabled": 1,
                                "pool": "prod", "storage": "pbs", "mode": "snapshot", "remove": 0})
    (tmp_path / "protected.json").write_text(json.dumps([{"host": "lab", "vmid": 101, "reason": "prod"}]))
    try:
        with in_process(everything_open(sim, tmp_path), log_name="job-edits-pools") as session:
            moved = {"method": "PUT", "path": "/cluster/backup/prod-nightly", "params": {"pool": "lab"}}
            message, sent = requests_during(sim, lambda: session.error("write_call_api", moved), writes=True)
            assert "changes protected guest 101" in message and "no longer acts on it" in message and sent == []
            dump = {"method": "POST", "path": "/nodes/pve2/vzdump",
                    "params": {"all": 1, "exclude": "101", "pool": "prod", "storage": "local", "mode": "snapshot"}}
            message, sent = requests_during(sim, lambda: session.error("write_call_api", dump), writes=True)
            assert "changes protected guest 101" in message and "prunes its older backups" in message and sent == []
            before = {v["volid"] for v in sim.lab.volumes["local"]}
            session.ok("write_call_api", {"method": "POST", "path": "/nodes/pve3/vzdump", "params": {
                "pool": "lab", "exclude": "105", "storage": "local", "mode": "stop"}})
            sim.lab.tick()
            made = {v["volid"] for v in sim.lab.volumes["local"]} - before
            assert [volid.split("-")[2] for volid in made] == ["105"], made  # the pool's member, exclude ignored
    finally:
        sim.lab.backup_jobs.pop()
        sim.lab.guests[105]["pool"] = None
        del sim.lab.pools["lab"]


def test_a_nested_pool_without_a_protected_guest_is_backed_up(sim, tmp_path):
    """A nested pool (PVE 8.1+) is read through GET /pools?poolid=; /pools/team/web names no method,
    so judged through it the backup would be refused as "members could not be read"."""
    sim.lab.pools["team/web"] = {"poolid": "team/web"}
    sim.lab.guests[105]["pool"] = "team/web"
    (tmp_path / "protected.json").write_text(json.dumps([{"host": "lab", "vmid": 101, "reason": "prod"}]))
    try:
        with in_process(everything_open(sim, tmp_path), log_name="job-edits-nested") as session:
            session.ok("write_call_api", {"method": "POST", "path": "/nodes/pve3/vzdump", "params": {
                "pool": "team/web", "storage": "local", "mode": "stop"}})
    finally:
        sim.lab.guests[105]["pool"] = None
        del sim.lab.pools["team/web"]


def test_an_ha_edit_that_moves_a_protected_guest_is_refused_and_the_simulator_would_move_it(sim, tmp_path):
    """Issue 28 section 5: 101 must run with 104 (positive affinity), 104 is kept on pve2. Moving 104's
    rule to pve3 never names 101, yet the HA manager moves 101 along: refused, nothing sent. The same
    edit made by someone else, straight to the simulator, does move 101. A rule that places no
    protected guest is edited as before."""
    from simulator import handle
    lab = sim.lab
    saved = dict(lab.ha_rules)
    lab.ha_rules = {"together": {"type": "resource-affinity", "resources": "vm:101,vm:104", "affinity": "positive"},
                     "r104": {"type": "node-affinity", "resources": "vm:104", "nodes": "pve2", "strict": 1},
                     "r105": {"type": "node-affinity", "resources": "ct:105", "nodes": "pve3"}}
    for vmid in (101, 104, 105):
        lab.guests[vmid]["ha"] = {"state": "started"}
    (tmp_path / "protected.json").write_text(json.dumps([{"host": "lab", "vmid": 101, "reason": "prod"}]))
    edit = {"method": "PUT", "path": "/cluster/ha/rules/r104", "params": {"type": "node-affinity", "nodes": "pve3"}}
    try:
        with in_process(everything_open(sim, tmp_path), log_name="job-edits-ha") as session:
            message, sent = requests_during(sim, lambda: session.error("write_call_api", edit), writes=True)
            assert "changes protected guest 101" in message and "where the HA manager may run it" in message
            assert sent == [] and lab.guests[101]["node"] == "pve2"
            session.ok("write_call_api", {"method": "PUT", "path": "/cluster/ha/rules/r105",
                                          "params": {"type": "node-affinity", "nodes": "pve3:2,pve1"}})
        handle(lab, "pve", "PUT", edit["path"], edit["params"], "PVEAPIToken=root@pam!admin="
               "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee")
        lab.later = [(0, effect) for _, effect in lab.later]  # the CRM's next round
        lab.tick()
        assert (lab.guests[104]["node"], lab.guests[101]["node"]) == ("pve3", "pve3")
    finally:
        lab.ha_rules = saved
        for vmid, node in ((101, "pve2"), (104, "pve2"), (105, "pve3")):
            lab.guests[vmid]["ha"], lab.guests[vmid]["node"] = None, node
