"""Where MCP users look: the official registry's server.json, the Claude Desktop extension (.mcpb) and
the Claude Code plugin. Each validates against its published schema (copies in tests/schemas/, with
their sources), names the one distribution and version, names only variables the server reads, and
starts what it says it starts."""
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import jsonschema
import pytest

import config
import server
from conftest import ROOT, run_server, server_env

SCHEMAS = ROOT / "tests" / "schemas"
tomllib = pytest.importorskip("tomllib")
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SECRET = re.compile(r"_(TOKEN|PASSWORD|KEY_PASSPHRASE)$")  # a variable that holds a secret, not a file naming one


def validate(document: dict, schema_file: str) -> None:
    schema = json.loads((SCHEMAS / schema_file).read_text())
    validator = jsonschema.validators.validator_for(schema)
    validator(schema, format_checker=jsonschema.FormatChecker()).validate(document)


def known(variable: str) -> bool:
    """A variable the server reads (config.GLOBALS, or an unlabelled host's)."""
    return variable in config.GLOBALS or any(variable == f"{prefix}_{suffix}" for prefix in ("PROXMOX", "PBS")
                                             for suffix in config.HOST_SUFFIXES)


def started_demo(command: list[str], env: dict, cwd: Path) -> str:
    """A server started as a client starts it, stdin closed at once: what it says on stderr."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=cwd, env=env,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stderr


# ---------------------------------------------------------------- server.json (the MCP registry)

def test_server_json_validates_and_names_the_package_on_the_index():
    entry = json.loads((ROOT / "server.json").read_text())
    validate(entry, "server.schema.json")
    assert entry["$schema"] == "https://static.modelcontextprotocol.io/schemas/2025-12-11/server.schema.json"
    assert entry["version"] == server.VERSION and entry["name"].endswith("/" + config.NAME)
    package, = entry["packages"]
    assert (package["registryType"], package["identifier"], package["version"]) == ("pypi", config.NAME,
                                                                                     server.VERSION)
    assert package["runtimeHint"] == "uvx" and package["transport"] == {"type": "stdio"}
    # the index's README is ours: the registry finds the entry's name in it (ownership of the package)
    assert f"mcp-name: {entry['name']}" in (ROOT / "README.md").read_text()


def test_server_json_names_what_a_user_sets_and_marks_the_secrets():
    variables = {v["name"]: v for v in json.loads((ROOT / "server.json").read_text())["packages"][0]
                 ["environmentVariables"]}
    assert {"PROXMOX_URL", "PROXMOX_TOKEN_FILE", "PROXMOX_TOKEN", "PROXMOX_FINGERPRINT", "PROXMOX_ACCESS",
            "PROXMOX_PROTECTED_VMS_FILE", "PROXMOX_PROTECTED_TAGS"} <= set(variables)
    for name, variable in variables.items():
        assert known(name), f"server.json names {name}, which the server does not read"
        assert variable.get("isSecret", False) == bool(SECRET.search(name)), name
        assert variable["description"] and (variable.get("format") == "filepath") == name.endswith("_FILE"), name
    assert variables["PROXMOX_ACCESS"]["choices"] == ["read", "lifecycle", "write", "destructive"]
    assert variables["PROXMOX_ACCESS"]["default"] == "read" and variables["PROXMOX_URL"]["isRequired"]


# ---------------------------------------------------------------- the Claude Desktop extension (.mcpb)

MANIFEST = json.loads((ROOT / "packaging" / "mcpb" / "manifest.json").read_text())


def test_the_extension_manifest_validates_and_asks_for_what_a_first_start_needs():
    validate(MANIFEST, "mcpb-manifest-v0.3.schema.json")
    assert (MANIFEST["name"], MANIFEST["version"], MANIFEST["license"]) == (config.NAME, server.VERSION, "MIT")
    assert {"url", "token_file", "fingerprint", "access"} <= set(MANIFEST["user_config"])
    assert MANIFEST["user_config"]["token_file"]["type"] == "file" and MANIFEST["user_config"]["url"]["required"]
    launch = MANIFEST["server"]["mcp_config"]
    assert MANIFEST["server"]["type"] == "python" and launch["args"] == ["${__dirname}/" + MANIFEST["server"]
                                                                        ["entry_point"]]
    asked = {name for value in launch["env"].values() for name in re.findall(r"\$\{user_config\.(\w+)\}", value)}
    assert asked == set(MANIFEST["user_config"]), "every answer is passed on, and only those"
    assert all(known(name) for name in launch["env"] if name != "PYTHONPATH")
    assert not any(SECRET.search(name) for name in launch["env"]), "secrets go in files the user picks"
    assert (ROOT / "packaging" / "mcpb" / MANIFEST["icon"]).read_bytes().startswith(b"\x89PNG")


def test_the_bundle_holds_the_server_and_its_bundled_entry_starts(tmp_path):
    sys.path.insert(0, str(ROOT / "packaging"))
    try:
        import build_mcpb
    finally:
        sys.path.remove(str(ROOT / "packaging"))
    bundle = build_mcpb.build(tmp_path / "dist", deps=False)
    assert bundle.name == f"{config.NAME}-{server.VERSION}.mcpb"
    with zipfile.ZipFile(bundle) as archive:
        names = set(archive.namelist())
        archive.extractall(tmp_path / "installed")
    assert {"manifest.json", "icon.png", "server/server.py", "server/catalog/pve.json", "server/views/dashboard.html",
            "server/views/icon.svg", "server/simulator/__init__.py", "server/requirements.txt"} <= names
    assert not [n for n in names if n.startswith(("server/tests", "server/.")) or n.endswith("pyproject.toml")]
    assert json.loads((tmp_path / "installed" / "manifest.json").read_text()) == MANIFEST
    # started as Claude Desktop starts it: the bundled entry, the answers as variables (the optional ones left
    # empty), here with this interpreter's packages for server/lib
    answers = {"url": "https://pve1.example:8006", "token_file": str(tmp_path / "token"), "fingerprint": "",
               "access": "read", "protected_list": ""}
    (tmp_path / "token").write_text("mcp@pve!mcp=11111111-2222-3333-4444-555555555555\n")
    launch = MANIFEST["server"]["mcp_config"]
    env = server_env({}) | {"XDG_CONFIG_HOME": str(tmp_path / "config")} | {
        name: re.sub(r"\$\{user_config\.(\w+)\}", lambda m: answers[m.group(1)], value)
        for name, value in launch["env"].items() if name != "PYTHONPATH"}
    entry = [sys.executable, str(tmp_path / "installed" / MANIFEST["server"]["entry_point"])]
    listed = subprocess.run(entry + ["--list-tools"], capture_output=True, text=True, timeout=120, env=env,
                            cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert listed.returncode == 0, listed.stderr[-2000:]
    # an installed copy: its settings are the user's config folder, never the extension's own
    assert str(tmp_path / "config" / "proxmox-guard-mcp" / "protected-vms.json") in listed.stderr
    assert "demo (a simulated cluster" in started_demo(entry + ["--demo"], server_env({}), tmp_path)


# ---------------------------------------------------------------- the Claude Code plugin

PLUGIN = json.loads((ROOT / ".claude-plugin" / "plugin.json").read_text())


def test_the_plugin_and_its_marketplace_name_the_package_and_its_version():
    assert (PLUGIN["name"], PLUGIN["version"], PLUGIN["license"]) == (config.NAME, server.VERSION, "MIT")
    market = json.loads((ROOT / ".claude-plugin" / "marketplace.json").read_text())
    listed, = market["plugins"]
    assert market["name"] and market["owner"]["name"]
    assert (listed["name"], listed["source"], listed["version"]) == (config.NAME, "./", server.VERSION)
    assert listed["description"] == PLUGIN["description"]
    assert not (ROOT / ".mcp.json").exists()  # in the plugin itself, not a project's server for this repository


def test_the_plugins_server_entry_starts_the_server_and_its_demo(tmp_path):
    """`/plugin install` starts `uvx --from ${CLAUDE_PLUGIN_ROOT} proxmox-guard-mcp`: the project of the
    plugin's folder (this repository), its console script. Run as uvx runs it (the script's entry point,
    from that folder), with --demo; with uvx itself where it is installed."""
    entry, = PLUGIN["mcpServers"].values()
    assert entry["command"] == "uvx" and entry["args"] == ["--from", "${CLAUDE_PLUGIN_ROOT}", config.NAME]
    module, function = PROJECT["project"]["scripts"][config.NAME].split(":")
    as_uvx_runs_it = [sys.executable, "-c", f"import sys; sys.argv[0] = {config.NAME!r}; "
                      f"from {module} import {function}; {function}()", "--demo"]
    said = started_demo(as_uvx_runs_it, server_env({}) | {"PYTHONPATH": str(ROOT)}, tmp_path)
    assert f"{config.NAME} demo (a simulated cluster" in said
    if shutil.which("uvx"):
        args = [a.replace("${CLAUDE_PLUGIN_ROOT}", str(ROOT)) for a in entry["args"]]
        assert "demo (a simulated cluster" in started_demo(["uvx", *args, "--demo"], dict(os.environ), tmp_path)


def test_one_version_and_one_name_in_every_distribution_file():
    for path in ("server.json", "packaging/mcpb/manifest.json", ".claude-plugin/plugin.json",
                 ".claude-plugin/marketplace.json"):
        text = (ROOT / path).read_text()
        assert server.VERSION in text and config.NAME in text, path
        assert "proxmox-mcp\"" not in text and "/proxmox-mcp" not in text, path
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f'org.opencontainers.image.title="{config.NAME}"' in dockerfile
    assert run_server(["--version"], {}).stdout.strip() == f"{config.NAME} {server.VERSION}"
