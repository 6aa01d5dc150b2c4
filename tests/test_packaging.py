"""What makes the project adoptable, checked: the licence, the installable command
(pyproject.toml lists every module; CI builds the wheel and starts it), one version everywhere,
and the user's own files kept out of git."""
import re

import pytest

import config
import server
from conftest import ROOT, run_server
from gates import method_gate
from pve_tools import POWER_ACTIONS

tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the project itself runs on 3.10 too
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_wheel_holds_every_module_the_simulator_and_the_catalog():
    modules = {path.stem for path in ROOT.glob("*.py")}
    assert set(PROJECT["tool"]["setuptools"]["py-modules"]) == modules
    assert {"simulator", "catalog"} <= set(PROJECT["tool"]["setuptools"]["packages"])
    assert PROJECT["tool"]["setuptools"]["package-data"]["catalog"] == ["*.json"]
    assert {"views"} <= set(PROJECT["tool"]["setuptools"]["packages"])  # the dashboard's view, for installs too
    assert PROJECT["tool"]["setuptools"]["package-data"]["views"] == ["*.html", "*.svg"]  # and its icons
    assert (ROOT / "views" / "dashboard.html").is_file()
    assert not (ROOT / "catalog" / "__init__.py").exists()  # `import catalog` must still find catalog.py


def test_the_command_is_the_server():
    assert PROJECT["project"]["name"] == config.NAME == "proxmox-guard-mcp"
    assert PROJECT["project"]["scripts"] == {config.NAME: "server:cli"}
    assert PROJECT["tool"]["setuptools"]["dynamic"] == {"version": {"attr": "server.VERSION"},
                                                         "dependencies": {"file": ["requirements.txt"]}}


def test_one_version_in_the_changelog_the_command_line_and_server_info(session):
    newest = re.search(r"^## (\d+\.\d+\.\d+)", (ROOT / "CHANGELOG.md").read_text(), re.MULTILINE).group(1)
    assert newest == server.VERSION
    shown = run_server(["--version"], {})
    assert shown.returncode == 0 and shown.stdout.strip() == f"{config.NAME} {server.VERSION}"
    assert session.ok("server_info")["version"] == server.VERSION


def test_mit_licence_said_in_the_readme():
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    assert PROJECT["project"]["license"] == "MIT"
    assert "MIT" in (ROOT / "README.md").read_text().split("## Licence", 1)[1]


def test_the_users_own_files_stay_out_of_git_and_the_image():
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert {".env", "secrets/", "data/"} <= set(ignored)
    docker_ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert {".env", "secrets", "data", "protected-vms.json"} <= set(docker_ignored)  # mounted, never built in


def test_the_readmes_tiers_name_each_power_action_where_the_gates_put_it():
    text = " ".join((ROOT / "README.md").read_text().split())
    tiers = dict(re.findall(r"`(lifecycle|destructive)`\s*\(([^)]*)\)", text.split("`PROXMOX_ACCESS` is the "
                                                                                    "highest tier", 1)[1][:400]))
    for action in POWER_ACTIONS:
        gate = method_gate("POST", f"/nodes/{{node}}/qemu/{{vmid}}/status/{action}", "pve")
        assert re.search(rf"\b{action}\b", tiers[gate]), f"README: {action} belongs under `{gate}`"
        other = {"lifecycle": "destructive", "destructive": "lifecycle"}[gate]
        assert not re.search(rf"\b{action}\b", tiers[other]), f"README names {action} under `{other}`"


def test_help_and_the_commands_table_name_the_same_options():
    shown = run_server(["--help"], {})
    options = set(re.findall(r"(--[a-z-]+)", shown.stdout)) - {"--help"}
    table = (ROOT / "docs" / "CONFIGURATION.md").read_text().split("## Commands", 1)[1]
    commands = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `python server.py")]
    assert options == {option for command in commands for option in re.findall(r"(--[a-z-]+)", command)}
