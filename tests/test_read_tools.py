"""The first read tools, through the SDK client over stdio against the simulator."""
import json
from functools import partial

import pytest

import server
from conftest import in_process, requests_during, stdio_session

READ_TOOLS = {"list_hosts", "cluster_status", "list_nodes", "list_guests", "get_guest", "list_storage",
              "list_tasks", "get_task"}




STRUCTURED = {spec.function.__name__ for spec in server.TOOLS if spec.output}  # answers as structuredContent too


def test_tool_list_names_and_annotations(session):
    tools = {t.name: t for t in session.tools()}
    assert READ_TOOLS <= set(tools)
    for tool in tools.values():
        assert tool.annotations.read_only_hint is True and not tool.annotations.destructive_hint
        assert not tool.name.startswith("write_")
        assert "title" not in tool.input_schema and tool.title  # a title for people, outside the schema
        assert tool.output_schema == ({"type": "object"} if tool.name in STRUCTURED else None)
        # the name says what the tool reads; its description what more the model needs (the list is paid
        # for on every turn)
        assert 10 < len(tool.description) < 300


def test_list_hosts_shows_both_products_without_secrets(session, sim):
    hosts = session.ok("list_hosts")
    assert hosts["columns"][:3] == ["host", "product", "url"]
    assert {(row[0], row[1]) for row in hosts["rows"]} == {("lab", "pve"), ("lab", "pbs")}
    assert {row[4] for row in hosts["rows"]} == {"pinned"}
    assert sim.lab.pve_tokens["mcp@pve!reader"].secret not in str(hosts)


def test_cluster_status(session):
    status = session.ok("cluster_status")
    assert status["cluster"] == "homelab" and status["quorate"] is True and status["standalone"] is False
    assert [n["node"] for n in status["nodes"]] == ["pve1", "pve2", "pve3"]


def test_list_nodes_with_human_sizes(session):
    nodes = session.ok("list_nodes")
    row = dict(zip(nodes["columns"], nodes["rows"][0], strict=True))
    assert row["node"] == "pve1" and row["status"] == "online" and row["mem_total"] == "64.0 GiB"


def test_list_guests_is_one_request_and_compact(session, sim):
    guests, sent = requests_during(sim, lambda: session.ok("list_guests"))
    assert sent == [("pve", "GET", "/cluster/resources")]
    assert guests["total"] == 6 and guests["columns"][:5] == ["vmid", "name", "type", "node", "status"]
    assert [row[0] for row in guests["rows"]] == [100, 101, 102, 103, 104, 105]
    result = session.call("list_guests")
    assert len(result.content) == 1 and len(result.content[0].text) < 600
    assert result.structured_content == json.loads(result.content[0].text)  # the same answer, parsed


@pytest.mark.parametrize("filters, vmids", [
    ({"type": "lxc"}, [102, 103, 105]),
    ({"status": "stopped"}, [103, 104]),
    ({"node": "pve1"}, [100, 103]),
    ({"tag": "prod"}, [100, 101]),
    ({"name": "WE"}, [100]),
    ({"limit": 2, "offset": 2}, [102, 103]),
])
def test_list_guests_filters(session, filters, vmids):
    assert [row[0] for row in session.ok("list_guests", filters)["rows"]] == vmids


def test_list_guests_tags_split_and_compare_as_proxmox_does(session, sim):
    """PVE splits a tag list on ';', ',' and spaces and compares tags without case (docs/PROXMOX-BEHAVIOUR.md#tags)."""
    before = sim.lab.guests[103].get("tags")
    sim.lab.guests[103]["tags"] = "Media, nas backup-daily"  # as a hand-edited config may hold it
    try:
        assert [row[0] for row in session.ok("list_guests", {"tag": "nas"})["rows"]] == [103]
        assert [row[0] for row in session.ok("list_guests", {"tag": "MEDIA"})["rows"]] == [103]
        assert [row[0] for row in session.ok("list_guests", {"tag": "Prod"})["rows"]] == [100, 101]
        assert session.ok("list_guests", {"tag": "back"})["rows"] == []  # whole tags, not parts of one
    finally:
        sim.lab.guests[103]["tags"] = before


def test_a_filter_that_matches_nothing_says_why(session):
    nothing = session.ok("list_guests", {"tag": "gpu"})
    assert nothing["rows"] == [] and nothing["note"] == "No guest has tag 'gpu'; tags in use: ci, infra, prod, web."
    quiet = session.ok("list_guests", {"node": "pve2", "type": "qemu", "name": "nas"})
    assert quiet["note"] == "No guest has name=nas; names in use: ci-runner, db, dns, media, web, win11."
    nobody = session.ok("list_guests", {"status": "unknown"})
    assert nobody["note"] == "No guest has status=unknown; statuses in use: running, stopped."
    both = session.ok("list_guests", {"node": "pve1", "status": "running", "type": "lxc"})
    assert both["rows"] == [] and "each alone matches" in both["note"]
    assert "node=pve1" in both["note"] and "status=running" in both["note"] and "type=lxc" in both["note"]
    unknown = session.error("list_guests", {"node": "pve9"})
    assert "Unknown node 'pve9'" in unknown and "pve1, pve2, pve3" in unknown
    wrong_case = session.error("list_guests", {"status": "Running"})  # the schema enumerates the states
    assert "must be one of 'running', 'stopped', 'unknown' or 'locked'" in wrong_case
    schema = next(t for t in session.tools() if t.name == "list_guests").input_schema
    assert schema["properties"]["status"]["enum"] == ["running", "stopped", "unknown", "locked"]  # locked: any lock
    assert session.ok("list_guests", {"status": "locked"})["note"].startswith("No guest has status=locked")


def test_list_guests_pages_with_a_marker(session):
    page = session.ok("list_guests", {"limit": 4})
    assert page["truncated"] is True and page["next_offset"] == 4
    rest = session.ok("list_guests", {"limit": 4, "offset": 4})
    assert "truncated" not in rest and len(rest["rows"]) == 2


def test_get_guest_by_vmid_alone(session, sim):
    guest, sent = requests_during(sim, lambda: session.ok("get_guest", {"vmid": 102}))
    assert len(sent) <= 3
    assert guest["type"] == "lxc" and guest["node"] == "pve3" and guest["name"] == "dns"
    assert guest["config"]["hostname"] == "dns"
    assert guest["maxmem"] == "512.0 MiB" and guest["maxmem_bytes"] == 512 * 1024 ** 2
    vm = session.ok("get_guest", {"vmid": 100})
    assert vm["type"] == "qemu" and vm["config"]["scsi0"].startswith("local-lvm:vm-100-disk-0")


def test_unknown_vmid_names_the_closest(session, sim):
    message, sent = requests_during(sim, lambda: session.error("get_guest", {"vmid": 150}))
    assert "No guest with vmid 150" in message and "105 (ci-runner)" in message and "list_guests" in message
    assert all(path == "/cluster/resources" for _, _, path in sent)


def test_bad_input_is_refused_with_nothing_sent(session, sim):
    for tool, args in [("get_guest", {"vmid": 5}), ("get_guest", {"vmid": "abc"}), ("get_guest", {}),
                       ("list_guests", {"type": "vm"}), ("list_guests", {"limit": 0}),
                       ("get_task", {"upid": "not-a-upid"}), ("list_guests", {"host": "nowhere"})]:
        message, sent = requests_during(sim, partial(session.error, tool, args))
        assert sent == [], (tool, args)
        assert message
    assert "No Proxmox VE host labelled 'nowhere'" in session.error("list_guests", {"host": "nowhere"})


def test_list_storage_merges_shared_storage(session):
    storage = session.ok("list_storage")
    rows = [dict(zip(storage["columns"], row, strict=True)) for row in storage["rows"]]
    shared = [r for r in rows if r["node"] == "(shared)"]
    assert {r["storage"] for r in shared} == {"pbs"}  # a fresh install: local and local-lvm on each node
    assert len([r for r in rows if r["storage"] == "local"]) == 3 and len(rows) == 7
    assert all(r["used"].endswith("iB") and 0 <= r["used_pct"] <= 100 for r in rows)
    only = session.ok("list_storage", {"node": "pve2"})
    assert {row[1] for row in only["rows"]} <= {"pve2", "(shared)"}


def test_list_tasks_and_failures(session):
    tasks = session.ok("list_tasks")
    rows = [dict(zip(tasks["columns"], row, strict=True)) for row in tasks["rows"]]
    assert {r["type"] for r in rows} >= {"vzdump", "qmstart"}
    failed = session.ok("list_tasks", {"errors": True})
    assert [row[tasks["columns"].index("status")] for row in failed["rows"]] == ["job errors"]
    on_node = session.ok("list_tasks", {"node": "pve2"})
    assert {row[1] for row in on_node["rows"]} == {"pve2"}


@pytest.mark.mcp  # progress notifications
def test_get_task_waits_with_progress(session, sim):
    upid = sim.lab.start_task("pve1", "qmclone", "100", duration=1.5)
    progress = []
    task = session.ok("get_task", {"upid": upid, "wait_seconds": 30}, progress=progress)
    assert task["result"] == "ok" and task["log"][-1] == "TASK OK"
    assert progress and all(total == 100 for _, total, _ in progress)
    assert [p for p, _, _ in progress] == sorted(p for p, _, _ in progress)


def test_get_task_still_running_then_continued(session, sim):
    upid = sim.lab.start_task("pve2", "qmmigrate", "101", duration=1.6)  # outlasts the first call's 1 s wait
    first = session.ok("get_task", {"upid": upid, "wait_seconds": 1})
    assert first["status"] == "still_running" and first["upid"] == upid and "wait_seconds" in first["next"]
    done = session.ok("get_task", {"upid": upid, "wait_seconds": 60})
    assert done["result"] == "ok"


def test_failed_task_is_a_tool_error_with_the_log(session, sim):
    upid = sim.lab.start_task("pve1", "qmstart", "100", exitstatus="VM is locked (backup)", duration=0.2)
    message = session.error("get_task", {"upid": upid, "wait_seconds": 30})
    assert "VM is locked (backup)" in message and "TASK ERROR" in message


def test_warnings_are_success(session, sim):
    upid = sim.lab.start_task("pve1", "vzdump", "100", exitstatus="WARNINGS: 2", finished=True)
    task = session.ok("get_task", {"upid": upid})
    assert task["result"] == "warnings" and task["exitstatus"] == "WARNINGS: 2"


def test_node_down_is_a_clear_error_and_the_server_keeps_serving(session, sim):
    sim.lab.down_nodes.add("pve3")
    try:
        message = session.error("get_guest", {"vmid": 102})
        assert "unreachable" in message and "'pve3'" in message
        status = session.ok("cluster_status")
        assert status["offline"] == ["pve3"]
    finally:
        sim.lab.down_nodes.clear()
    assert session.ok("get_guest", {"vmid": 102})["status"] == "running"


def test_networks_of_the_nodes_that_answer_when_one_is_down(session, sim):
    sim.lab.down_nodes.add("pve3")
    try:
        networks = session.ok("list_networks")
        assert {row[0] for row in networks["rows"]} == {"pve1", "pve2"}
        assert "pve3" in networks["not_read"][0] and "unreachable" in networks["not_read"][0]
    finally:
        sim.lab.down_nodes.clear()


def test_empty_inventory_hints_at_permissions(sim):
    env = sim.env(pve_token="mcp@pve!empty", pbs=False)
    with in_process(env, log_name="empty-token") as empty:
        guests = empty.ok("list_guests")
        assert guests["rows"] == [] and "privilege-separated" in guests["note"]
        message = empty.error("cluster_status")
        assert "Sys.Audit" in message and "pveum acl modify" in message


def test_modern_protocol_era(sim):
    with stdio_session(sim.env(), mode="auto", log_name="modern") as modern:
        assert READ_TOOLS <= {t.name for t in modern.tools()}
        assert modern.ok("list_guests", {"type": "qemu"})["total"] == 3


def test_tools_list_answers_with_every_host_down():
    env = {"PROXMOX_LAB_URL": "https://127.0.0.1:9", "PROXMOX_LAB_TOKEN": "a@pve!t=" + "s" * 36,
           "PBS_LAB_URL": "https://127.0.0.1:9", "PBS_LAB_TOKEN": "a@pbs!t:" + "s" * 36}
    with stdio_session(env, log_name="hosts-down") as down:
        assert READ_TOOLS <= {t.name for t in down.tools()}
        message = down.error("list_guests")
        assert "unreachable" in message and "connection refused" in message
        assert "s" * 36 not in message


def test_protected_guests_are_visible(sim, tmp_path):
    """list_guests and get_guest mark a guest on the protected list (with its reason), server_info
    lists the list; a model sees before it tries that no change to the guest will be admitted."""
    listed = tmp_path / "protected.json"
    listed.write_text('[{"host": "lab", "vmid": 101, "name": "db", "reason": "the production database"}]')
    env = sim.env() | {"PROXMOX_PROTECTED_VMS_FILE": str(listed), "PROXMOX_PROTECTED_VMS": "*:105"}
    with in_process(env, log_name="protected-visible") as session:
        guests = session.ok("list_guests")
        info = session.ok("server_info")
        db, web = session.ok("get_guest", {"vmid": 101}), session.ok("get_guest", {"vmid": 100})
    marks = {row[0]: row[guests["columns"].index("protected")] for row in guests["rows"]}
    assert marks == {100: "", 101: "the production database", 102: "", 103: "", 104: "",
                     105: "listed in PROXMOX_PROTECTED_VMS"}
    assert db["protected"] == "the production database" and "protected" not in web
    assert info["protected_guests"] == [
        {"host": "lab", "vmid": 101, "name": "db", "reason": "the production database"},
        {"host": "*", "vmid": 105, "reason": "listed in PROXMOX_PROTECTED_VMS"}]
    with in_process(sim.env(), log_name="protected-none") as session:  # nothing protected: no column at all
        assert "protected" not in session.ok("list_guests")["columns"]
