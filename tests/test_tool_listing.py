"""What a client shows beside what the model reads: a title for every tool, the server's and the
dashboard's icons, structured output for the read tools clients render or chain (the text content
unchanged), and the tool list within its budget (docs/BENCHMARKS.md)."""
import json

import pytest

import server
import tool_meta
from conftest import ROOT, run_server, stdio_session

STRUCTURED = {"list_guests": {}, "get_guest": {"vmid": 100}, "list_nodes": {}, "list_storage": {},
              "list_backups": {}, "health_check": {}, "backup_coverage": {}, "list_changes": {}}
PIN = "SHA256:" + "A" * 43


def test_every_tool_has_a_title_of_its_own():
    titles = {spec.function.__name__: tool_meta.title_for(spec.function.__name__) for spec in server.TOOLS}
    assert all(titles.values()) and len(set(titles.values())) == len(titles)
    assert titles["list_guests"] == "Guests" and titles["write_pbs_prune_group"] == "Prune PBS group"
    assert all(len(title) <= 32 and "_" not in title for title in titles.values())


def test_the_tools_clients_render_are_exactly_the_structured_ones():
    assert {spec.function.__name__ for spec in server.TOOLS if spec.output} == set(STRUCTURED)


@pytest.mark.mcp
@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_structured_output_is_the_text_answer_parsed(sim, mode):
    """Each of them answers its compact JSON as text (unchanged) and the same JSON as structuredContent,
    which the SDK client checks against the tool's outputSchema (on both protocol revisions)."""
    env = sim.env(pve_token="mcp@pve!backups") | {"PROXMOX_TOOLSETS": "default,changes"}
    with stdio_session(env, mode=mode, log_name=f"structured-{mode}") as client:
        listed = {tool.name: tool for tool in client.tools()}
        for name, arguments in STRUCTURED.items():
            assert listed[name].output_schema == {"type": "object"}, name
            result = client.call(name, arguments)
            assert not result.is_error and len(result.content) == 1, name
            assert result.structured_content == json.loads(result.content[0].text), name
        assert all(listed[name].output_schema is None for name in listed if name not in STRUCTURED)
        assert all(tool.title for tool in listed.values())


@pytest.mark.mcp
def test_the_server_and_the_dashboard_carry_icons(sim):
    with stdio_session(sim.env() | {"PROXMOX_TOOLSETS": "default,monitor"}, mode="legacy",
                       log_name="icons") as client:
        info = client.client.server_info
        dashboard = next(tool for tool in client.tools() if tool.name == "dashboard")
    assert info.title == "Proxmox VE and Backup Server" and info.version == server.VERSION
    for icons, svg in ((info.icons, tool_meta.SERVER_ICON), (dashboard.icons, ROOT / "views" / "dashboard.svg")):
        assert len(icons) == 1 and icons[0].mime_type == "image/svg+xml" and icons[0].sizes == ["any"]
        assert icons[0].src == tool_meta.data_uri(svg) and icons[0].src.startswith("data:image/svg+xml,%3Csvg")
        assert "#" not in icons[0].src and " " not in icons[0].src  # a URI: no fragment, no spaces


def test_the_icons_ship_in_the_wheel():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert set(project["tool"]["setuptools"]["package-data"]["views"]) >= {"*.html", "*.svg"}
    for svg in (ROOT / "views").glob("*.svg"):
        assert svg.read_text().startswith("<svg xmlns=") and "<script" not in svg.read_text()


# ---------------------------------------------------------------- the budget (docs/BENCHMARKS.md)

HOSTS = {"PROXMOX_LAB_URL": "https://192.0.2.1", "PROXMOX_LAB_TOKEN": "a@pve!t=" + "s" * 36,
         "PBS_LAB_URL": "https://192.0.2.2", "PBS_LAB_TOKEN": "a@pbs!t:" + "s" * 36}
EVERYTHING = HOSTS | {"PROXMOX_LAB_SSH_NODES": "pve1=192.0.2.1", "PROXMOX_LAB_SSH_FINGERPRINTS": f"pve1={PIN}",
                      "PBS_LAB_SSH_HOST": "192.0.2.2", "PBS_LAB_SSH_FINGERPRINT": PIN, "PROXMOX_TOOLSETS": "all",
                      "PROXMOX_ACCESS": "destructive", "PROXMOX_ALLOW_EXEC": "true", "PROXMOX_ALLOW_ELEVATED": "true",
                      "PROXMOX_ALLOW_SENSITIVE": "true"}


@pytest.mark.parametrize("configuration, env, budget", [
    ("default", HOSTS, 9_500),
    ("default, two PVE hosts", HOSTS | {"PROXMOX_B_URL": "https://192.0.2.3", "PROXMOX_B_TOKEN": "a@pve!t=" + "s" * 36},
     10_000),
    ("everything open", EVERYTHING, 32_000),
])
def test_the_tool_list_stays_within_its_budget(tmp_path, configuration, env, budget):
    """The list is paid for on every turn (GUIDE: default <= 10,000 B, everything open <= 32,000 B; the
    default keeps 500 B in hand). Measured as `python server.py --list-tools` counts it."""
    listed = run_server(["--list-tools", "--json"], env | {"PROXMOX_RESTORE_DIR": str(tmp_path / "restored")})
    total = json.loads(listed.stdout)["total_bytes"]
    assert total <= budget, f"{configuration}: the tool list is {total} B, over its {budget} B"


@pytest.mark.mcp
def test_a_call_by_an_old_name_reaches_the_tool_that_does_it_now(sim):
    """Merged tools keep their old names callable (a client's cached list, a user's script): the call
    becomes the new tool's, with the old tool's defaults; tools/list shows the new names only."""
    upid = sim.lab.start_task("pve1", "vzdump", "100", finished=True)
    with stdio_session(sim.env(pve_token="mcp@pve!backups"), mode="legacy", log_name="old-names") as client:
        listed = {tool.name for tool in client.tools()}
        page = client.call("task_log", {"upid": upid, "limit": 2})
        guest = client.call("list_snapshots", {"vmid": 100})
        store = client.call("pbs_datastore_status", {"store": "backup"})
    assert not {"task_log", "list_snapshots", "pbs_datastore_status"} & listed
    assert not page.is_error and json.loads(page.content[0].text)["next_start"] == 2
    assert not guest.is_error and json.loads(guest.content[0].text)["vmid"] == 100
    assert not store.is_error and json.loads(store.content[0].text)["store"] == "backup"
