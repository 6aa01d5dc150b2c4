"""The import rule of the layout, read from the source with `ast`:

- a tool module never imports a helper from another tool module; shared helpers live in
  answers.py, errors.py, inventory.py, pbs_state.py and the client. It may import another tool module to
  call its *tools* (workflows compose pve_tools' writes; resources call list tools);
- the shared modules import no tool module (nor server.py).
"""
import ast

import pytest

import server
from conftest import ROOT

TOOL_MODULES = ("pve_tools", "pbs_tools", "shell_tools", "workflows", "api_tools", "templates", "file_restore",
                "monitor_tools", "dashboard", "firewall_tools", "backup_jobs", "changes")
SHARED_MODULES = ("answers", "errors", "audit", "inventory", "pbs_state", "proxmox_client", "policy", "catalog",
                  "gates", "firewall_guard", "protection", "masking", "config", "http_transport", "job_edits",
                  "receipts", "config_diff")
TOOLS_OF = {module: {spec.function.__name__ for spec in server.TOOLS if spec.function.__module__ == module}
            for module in TOOL_MODULES}


def parse(module: str) -> ast.Module:
    return ast.parse((ROOT / f"{module}.py").read_text(), filename=f"{module}.py")


def imported_modules(tree: ast.Module) -> list[tuple[int, str, str]]:
    """(line, module, how) of every import anywhere in the file, functions included."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, "import") for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.lineno, node.module, "from"))
    return found


def test_every_tool_module_is_checked():
    assert all(TOOLS_OF[module] for module in TOOL_MODULES)
    assert {spec.function.__module__ for spec in server.TOOLS} <= set(TOOL_MODULES) | {"server"}


@pytest.mark.parametrize("module", TOOL_MODULES)
def test_a_tool_module_takes_no_helper_from_another(module):
    tree = parse(module)
    others = set(TOOL_MODULES) - {module}
    froms = [(line, name) for line, name, how in imported_modules(tree) if how == "from" and name in others]
    assert froms == [], f"{module} imports names from a tool module: {froms}; move the helper to a shared module"
    imported = {name for _, name, how in imported_modules(tree) if how == "import" and name in others}
    used = [(node.lineno, node.value.id, node.attr) for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in imported]
    helpers = [(line, f"{name}.{attr}") for line, name, attr in used if attr not in TOOLS_OF[name]]
    assert helpers == [], f"{module} uses what is not a tool of another tool module: {helpers}"


@pytest.mark.parametrize("module", SHARED_MODULES)
def test_a_shared_module_imports_no_tool_module(module):
    imports = [(line, name) for line, name, _ in imported_modules(parse(module))
               if name in TOOL_MODULES or name == "server"]
    assert imports == [], f"{module} imports {imports}"
