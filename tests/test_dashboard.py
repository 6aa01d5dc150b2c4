"""The dashboard tool: what each part shows (nodes, storage, the busiest or the chosen guest,
backup coverage by job, health findings), that it stays bounded as the cluster grows, and the MCP
Apps wiring (the tool's _meta.ui.resourceUri, the ui:// resource, structuredContent only for
clients that render views). How the view draws it: tests/test_dashboard_view.py."""
import json
import re
import time
from contextlib import contextmanager

import pytest

import dashboard
import simulator
from conftest import in_process, requests_during, stdio_session, tool_session
from simulator.pve_monitor import monitor

GiB = 1024 ** 3
MONITOR = {"PROXMOX_TOOLSETS": "default,monitor"}  # the dashboard is in the opt-in monitor group
APPS = "io.modelcontextprotocol/ui"
APP_MIME = "text/html;profile=mcp-app"


def build_lab(**sizes) -> simulator.Lab:
    """The homelab with what each part must show: a full storage, a stale backup, an excluded
    guest, a node under load, guests of different sizes busy to different degrees."""
    lab = simulator.Lab.homelab(**sizes)
    lab.task_seconds = 0
    now = int(time.time())
    lab.storages["pbs"]["used"] = 3800 * GiB  # 95 %: a health finding (a shared storage)
    lab.nodes["pve2"]["cpu"] = 0.97
    store = lab.datastores["backup"]["groups"]
    store[("", "ct", "102")] = [lab.pbs_snapshot(now - 5 * 86400)]  # guest 102: stale
    lab.volumes["local"] = [v for v in lab.volumes["local"] if v.get("vmid") != 102]
    return lab


@pytest.fixture(scope="module")
def sim():
    lab = build_lab()
    # the busiest guest is the one using the most host cores: 100 uses 4 x 0.5 = 2 cores, 105 uses
    # 1 x 0.9, although its share of its own cores is higher (docs/PROXMOX-BEHAVIOUR.md#guest-cpu-figures)
    for vmid, (cpu, cores) in {100: (0.5, 4), 101: (0.2, 2), 102: (0.05, 1), 105: (0.9, 1)}.items():
        lab.guests[vmid]["cpu"], lab.guests[vmid]["config"]["cores"] = cpu, cores
    with simulator.Simulator(lab) as running:
        yield running
        assert running.lab.schema_rejections == []


@pytest.fixture(scope="module")
def session(sim):
    # the README's reader token with its optional backup grant (BackupReader): without it PVE lists no
    # backup on `local` to the token, and the coverage matrix says "unknown" (tests/test_default_world.py)
    with tool_session(sim.env(pve_token="mcp@pve!backups") | MONITOR, log_name="dashboard") as running:
        yield running


def as_dicts(part: dict) -> list[dict]:
    return [dict(zip(part["columns"], row, strict=True)) for row in part["rows"]]


def test_every_part_is_there(session, sim):
    answer, sent = requests_during(sim, lambda: session.ok("dashboard"))
    assert [n["node"] for n in as_dicts(answer["nodes"])] == ["pve1", "pve2", "pve3"]
    pve2 = as_dicts(answer["nodes"])[1]
    assert pve2["cpu_pct"] == 97.0 and pve2["cores"] == 8 and pve2["status"] == "online"
    storages = as_dicts(answer["storage"])
    assert storages[0] == {"storage": "pbs", "node": "(shared)", "type": "pbs", "status": "available",
                           "used_pct": 95.0, "used": "3.7 TiB", "total": "3.9 TiB"}  # fullest first, shared once
    assert {(s["storage"], s["node"]) for s in storages} >= {("local", "pve1"), ("local", "pve3"),
                                                            ("local-lvm", "pve2")}
    health = as_dicts(answer["health"])
    assert {"severity": "critical", "area": "storage", "finding": "pbs (shared) is 95.0% full"} in health
    assert answer["health"]["summary"]["critical"] >= 1
    # one read of the inventory for nodes, storage and guests; the workflows read what they need
    assert sent.count(("pve", "GET", "/cluster/resources")) >= 1


def test_the_busiest_guests_are_those_using_most_host_cores(session):
    guests = session.ok("dashboard")["guests"]
    assert guests["picked"] == "busiest by CPU now" and guests["running"] == 4 and guests["total"] == 6
    rows = as_dicts(guests)
    assert [g["vmid"] for g in rows] == [100, 105, 101, 102]
    assert rows[0] | {"mem": ""} == {"vmid": 100, "name": "web", "type": "qemu", "node": "pve1", "status": "running",
                                     "cpu_pct": 50.0, "cores": 4, "mem_pct": rows[0]["mem_pct"], "mem": ""}


def test_each_shown_guest_with_its_last_hour(session, sim):
    """metrics' summary of each shown guest, read side by side: CPU and memory with their sparkline,
    the network's two directions."""
    guests, sent = requests_during(sim, lambda: session.ok("dashboard")["guests"])
    lines = guests["last_hour"]
    assert [line["vmid"] for line in lines] == [g["vmid"] for g in as_dicts(guests)]
    for line in lines:
        assert set(line) == {"vmid", "cpu", "mem", "net"}, line
        assert re.fullmatch(r"\d+\.\d% now, max \d+\.\d%, (rising|falling|steady) [▁▂▃▄▅▆▇█ ]+", line["cpu"]), line
        assert re.fullmatch(r"in \S+ \S+/s, out \S+ \S+/s now; max in \S+ \S+/s, out \S+ \S+/s", line["net"]), line
    history = [path for _, method, path in sent if path.endswith("/rrddata")]
    assert sorted(history) == sorted(f"/nodes/{g['node']}/{g['type']}/{g['vmid']}/rrddata"
                                     for g in as_dicts(guests))  # each once: the summary and the points from one read


def test_a_chosen_guest_instead_of_the_busiest(session, sim):
    guests = session.ok("dashboard", {"vmid": 103})["guests"]
    assert guests["picked"] == "vmid 103" and [g["vmid"] for g in as_dicts(guests)] == [103]
    assert guests["last_hour"] == [{"vmid": 103, "note": "No CPU, memory or I/O values: the guest was not running "
                                                         "in this timeframe."}]  # 103 is stopped
    error, sent = requests_during(sim, lambda: session.error("dashboard", {"vmid": 990}))
    assert "No guest with vmid 990" in error and "Closest existing" in error
    assert {path for _, _, path in sent} <= {"/cluster/resources"}  # only the guest list was read


def test_backup_coverage_as_a_matrix_of_guests_and_jobs(session):
    backups = session.ok("dashboard")["backups"]
    assert backups["columns"] == ["vmid", "name", "state", "age_h", "where", "verify", "backup-nightly"]
    rows = as_dicts(backups)
    # the guests that need attention first: missing, then stale, then the rest by vmid
    assert [(r["vmid"], r["state"]) for r in rows] == [(103, "missing"), (104, "missing"), (102, "stale"),
                                                        (100, "ok"), (101, "ok"), (105, "ok")]
    assert {r["vmid"]: r["backup-nightly"] for r in rows} == {103: "covers", 104: "excludes", 102: "covers",
                                                               100: "covers", 101: "covers", 105: "covers"}
    assert backups["summary"] == {"missing": 2, "stale": 1, "ok": 3} and backups["total"] == 6
    assert rows[2]["where"] == "pbs:backup" and rows[2]["age_h"] > 100


def test_what_could_not_be_read_is_said_not_shown_as_healthy(session, sim):
    """A node that is down and a Backup Server datastore that fails: the node is shown as it is and
    the sections that could not be read are named."""
    sim.lab.down_nodes.add("pve3")
    sim.lab.fail.append((r"^/admin/datastore/backup/snapshots", 500, "datastore 'backup' is not mounted"))
    try:
        answer = session.ok("dashboard")
    finally:
        sim.lab.down_nodes.discard("pve3")
        sim.lab.fail.pop()
    assert {n["node"]: n["status"] for n in as_dicts(answer["nodes"])}["pve3"] != "online"
    assert "pbs:backup" in answer["backups"]["unavailable"]
    assert answer["health"]["summary"]["critical"] >= 1


def test_the_same_findings_as_health_check(session):
    health = session.ok("health_check")
    shown = session.ok("dashboard")["health"]
    assert shown["rows"] == [[f["severity"], f["area"], f["finding"]] for f in health["findings"]]
    assert shown["summary"] == health["summary"]


def test_opening_it_wakes_no_sleeping_disk(session, sim):
    """PVE reads SMART with smartctl on every disk unless skipsmart (pve-storage Diskmanage.pm), which
    spins up a disk asleep: the dashboard, opened often, reads none; health_check, asked for disk
    health, does (docs/PROXMOX-BEHAVIOUR.md#disks-and-smart)."""
    world = monitor(sim.lab)
    before = dict(world.smart_reads)
    answer, sent = requests_during(sim, lambda: session.ok("dashboard"))
    assert world.smart_reads == before
    assert not any(path.endswith(("/disks/list", "/disks/smart")) for _, _, path in sent)
    assert "health_check" in answer["health"]["disks"] and "SMART" in answer["health"]["disks"]
    session.ok("health_check")
    assert sum(world.smart_reads.values()) > sum(before.values())


def test_not_offered_by_default_and_no_view_without_it(sim):
    with in_process(sim.env(), log_name="dashboard-default") as default:
        assert "dashboard" not in {t.name for t in default.tools()}
        assert "Unknown tool: dashboard" in default.error("dashboard")
        resources = default.portal.call(default.server.list_resources)
        assert not [r.uri for r in resources if str(r.uri).startswith("ui://")]


def test_bounded_as_the_cluster_grows():
    """20 nodes and 1,000 guests: each part shows its first rows and counts the rest."""
    lab = build_lab(nodes=20, guests=1000)
    with simulator.Simulator(lab) as big, in_process(big.env() | MONITOR, log_name="dashboard-big") as tools:
        result = tools.call("dashboard")
        assert not result.is_error, result.content[0].text
        text = result.content[0].text
        answer = json.loads(text)
        assert big.lab.schema_rejections == []
    assert len(text.encode()) <= 6000, len(text.encode())
    assert answer["nodes"]["total"] == 20 and answer["nodes"]["more"] == 4 and len(answer["nodes"]["rows"]) == 16
    assert answer["storage"]["more"] == answer["storage"]["total"] - dashboard.SHOWN["storages"]
    assert answer["backups"]["total"] == 1000 and len(answer["backups"]["rows"]) == 20
    assert answer["backups"]["more"] == 980
    assert len(answer["guests"]["rows"]) == dashboard.SHOWN["guests"]


def test_the_view_is_one_file_that_loads_nothing_and_writes_no_markup():
    """dashboard.html reaches nothing (the frame has no network) and puts Proxmox's strings in as
    text only; tests/test_dashboard_view.py shows the same in a browser."""
    html = dashboard.VIEW_HTML.read_text()
    loads = ("fetch(", "XMLHttpRequest", "WebSocket", "EventSource", "sendBeacon", "import(", "importScripts",
             "<link", " src=", " href=", "url(", "@import", "<iframe", "<object", "<embed", "<img")
    assert [vector for vector in loads if vector in html] == []
    assert re.findall(r"https?://[^\s\"'<>)]*", html) == ["http://www.w3.org/2000/svg"]  # a name, not fetched
    markup = ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function")
    assert [sink for sink in markup if sink in html] == []


# ---------------------------------------------------------------- MCP Apps, over MCP

@contextmanager
def apps_client(env: dict, *, declares_apps: bool, mode: str = "legacy"):
    """The SDK's client over stdio, declaring the MCP Apps extension (as a host that renders views
    does) or not; the initialize handshake of today's clients unless `mode` says otherwise."""
    from mcp.client.extension import advertise
    extensions = [advertise(APPS, {"mimeTypes": [APP_MIME]})] if declares_apps else []
    with stdio_session(env, log_name="dashboard-apps", extensions=extensions, mode=mode) as client:
        yield client


@pytest.fixture(scope="module")
def host_with_apps(sim):
    with apps_client(sim.env() | MONITOR, declares_apps=True) as client:
        yield client


def test_the_tool_names_its_view_and_the_server_serves_it(host_with_apps):
    tool = next(t for t in host_with_apps.tools() if t.name == "dashboard")
    assert tool.meta == {"ui": {"resourceUri": "ui://proxmox/dashboard.html"}}
    read = host_with_apps.portal.call(host_with_apps.client.read_resource, "ui://proxmox/dashboard.html")
    content = read.contents[0]
    assert content.mime_type == APP_MIME and content.text == dashboard.VIEW_HTML.read_text()
    assert content.meta == {"ui": {"prefersBorder": True}}  # no CSP domains: the view needs no network


def test_a_client_that_renders_views_gets_the_answer_and_the_view_data(host_with_apps):
    result = host_with_apps.call("dashboard")
    assert not result.is_error
    answer = json.loads(result.content[0].text)
    data = result.structured_content
    assert {k: v for k, v in data.items() if k in answer} == answer and set(data) - set(answer) == {"charts"}
    assert [c["vmid"] for c in data["charts"]] == [g["vmid"] for g in as_dicts(answer["guests"])]
    for chart in data["charts"]:
        assert chart["timeframe"] == "hour" and chart["step_s"] == 60 and set(chart["last"]) >= {"cpu", "mem"}
        assert set(chart["series"]) == {"cpu", "mem", "netin", "netout"}
        assert {len(values) for values in chart["series"].values()} == {60}  # the hour, oldest first
        assert all(0 <= v <= 100 for v in chart["series"]["cpu"] + chart["series"]["mem"])  # shares in %
    assert "charts" not in answer  # the points never reach the model


def test_a_client_without_apps_gets_the_same_answer_as_text_only(sim, host_with_apps):
    with apps_client(sim.env() | MONITOR, declares_apps=False) as plain:
        result = plain.call("dashboard")
        assert result.structured_content is None
        answer = json.loads(result.content[0].text)
    with_apps = json.loads(host_with_apps.call("dashboard").content[0].text)
    assert answer.keys() == with_apps.keys() and answer["nodes"] == with_apps["nodes"]


def test_the_server_declares_the_extension_where_the_protocol_carries_it(sim):
    """Server capabilities carry `extensions` from the 2026-07-28 protocol on (mcp_types: the
    2025-11-25 wire models have no such field); the views work on both, as the tests above show."""
    with apps_client(sim.env() | MONITOR, declares_apps=True, mode="auto") as modern:
        assert APPS in (modern.client.server_capabilities.extensions or {})
        result = modern.call("dashboard")
        assert result.structured_content is not None and not result.is_error


def test_the_demo_offers_it_with_the_monitor_toolset():
    """`PROXMOX_TOOLSETS=default,monitor python server.py --demo`: the README's way to see it."""
    with stdio_session(MONITOR, args=["--demo"], log_name="dashboard-demo") as demo:
        answer = demo.ok("dashboard")
        assert answer["host"] == "demo" and answer["nodes"]["total"] == 3 and answer["guests"]["rows"]
