"""The TOOLS table and the README's "How to add a tool": one test per step, so that a new tool
needs only its function, its table entry, its tests and the generated docs."""
import inspect

import pytest

import api_tools
import backup_jobs
import firewall_tools
import file_restore
import guest_updates
import health
import lxc_admin
import node_tools
import terminals
import dashboard
import monitor_tools
import pbs_tools
import provisioning
import pve_tools
import server
import shell_tools
import templates
import tool_docs
import workflows
from config import TOOLSET_GROUPS
from conftest import ROOT, run_server
from gates import CONFIRMED, GATES

TOOL_MODULES = (pve_tools, pbs_tools, shell_tools, workflows, api_tools, templates, file_restore, monitor_tools,
                dashboard, firewall_tools, backup_jobs, terminals, lxc_admin, node_tools, guest_updates, provisioning,
                health)
SPECS = {spec.function.__name__: spec for spec in server.TOOLS}
TABLE = tool_docs.ToolTable(server.TOOLS, server.INSTRUCTIONS, server.make_tool, server.slim_schema)
# Tools that take confirm but not ctx, so their confirmation could never be asked of the user by
# elicitation (only confirm=true would work). It is empty, and a test keeps it so.
CONFIRM_WITHOUT_CTX: set[str] = set()

def parameters(name: str) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(SPECS[name].function).parameters)


# ---------------------------------------------------------------- step 1: the function

@pytest.mark.parametrize("name", SPECS)
def test_a_tool_is_a_typed_function_with_a_short_docstring(name):
    doc = inspect.getdoc(SPECS[name].function) or ""
    assert doc and len(doc.splitlines()) <= 4, f"{name}: the docstring is its description, 1 to 4 lines"
    untyped = [p for p, v in parameters(name).items() if p != "ctx" and v.annotation is inspect.Parameter.empty]
    assert not untyped, f"{name}: parameters without a type: {untyped}"


@pytest.mark.parametrize("name", [name for name in SPECS if name.startswith("write_")])
def test_a_write_tool_takes_dry_run(name):
    assert "dry_run" in parameters(name)


@pytest.mark.parametrize("name", SPECS)
def test_a_tool_that_may_need_confirmation_takes_confirm_and_ctx(name):
    spec, taken = SPECS[name], parameters(name)
    if set((spec.gate, *spec.also)) & set(CONFIRMED) or spec.may_destroy:
        assert "confirm" in taken, f"{name} can need the user's yes, so it takes confirm"
    if "confirm" in taken:
        assert "ctx" in taken, f"{name} takes confirm, so it takes ctx: the user is asked when the client can"


def test_no_tool_takes_confirm_without_ctx():
    assert CONFIRM_WITHOUT_CTX == set()
    assert [name for name in SPECS if "confirm" in parameters(name) and "ctx" not in parameters(name)] == []


def test_every_write_function_of_the_tool_modules_is_in_the_table():
    defined = {name for module in TOOL_MODULES for name, f in vars(module).items()
               if name.startswith("write_") and inspect.isfunction(f) and f.__module__ == module.__name__}
    assert defined - set(SPECS) == set()


# ---------------------------------------------------------------- step 2: the table entry

def test_tool_names_are_unique():
    assert len(SPECS) == len(server.TOOLS)


@pytest.mark.parametrize("name", SPECS)
def test_a_table_entry_is_complete_and_consistent(name):
    spec = SPECS[name]
    assert spec.toolset in ("always", *TOOLSET_GROUPS)
    assert spec.product in ("", "pve", "pbs")
    assert spec.gate in GATES and spec.gate != "blocked" and set(spec.also) <= set(GATES)
    changes = spec.gate not in ("read", "sensitive")
    assert name.startswith("write_") == changes, f"{name}: the write_ prefix marks exactly the tools that change"
    assert not (spec.may_destroy and spec.gate in ("destructive", "exec")), f"{name}: may_destroy is for lower gates"
    assert all("." in privilege for privilege in spec.needs), f"{name}: needs names Proxmox privileges"


def test_toolsets_are_derived_from_the_table():
    assert set(SPECS) == set(server.TOOLSETS["all"]) | set(server.ALWAYS_ON)
    assert set(server.ALWAYS_ON) == {"list_hosts", "server_info"}
    assert set(server.TOOLSETS["compact"]) == set(server.TOOLSETS["api"]) | set(server.TOOLSETS["workflows"])
    for group in TOOLSET_GROUPS:
        assert server.TOOLSETS[group], f"toolset {group} has no tool"


# ---------------------------------------------------------------- step 3: its tests

def test_every_tool_is_named_in_a_test():
    texts = [path.read_text() for path in (ROOT / "tests").glob("test_*.py") if path.name != "test_tool_table.py"]
    untested = [name for name in SPECS if not any(f'"{name}"' in t or f"'{name}'" in t for t in texts)]
    assert not untested, f"no test calls {untested}"


# ---------------------------------------------------------------- step 4: the generated docs

def test_the_tool_catalog_is_current():
    generated = run_server(["--list-tools", "--markdown"], {})
    assert generated.returncode == 0
    assert (ROOT / "docs" / "TOOLS.md").read_text() == generated.stdout, \
        "docs/TOOLS.md is stale: run python server.py --write-docs"


def test_the_readme_tool_summary_is_current():
    readme = (ROOT / "README.md").read_text()
    start, end = (readme.index(marker) for marker in tool_docs.README_SUMMARY)
    summary = tool_docs.tool_summary_markdown(server.TOOLS)
    assert readme[start + len(tool_docs.README_SUMMARY[0]):end].strip("\n") == summary, \
        "the README's tool summary is stale: run python server.py --write-docs"


def test_every_tool_is_in_the_catalog_and_the_summary():
    catalog, summary = (ROOT / "docs" / "TOOLS.md").read_text(), tool_docs.tool_summary_markdown(server.TOOLS)
    assert [name for name in SPECS if f"## `{name}`" not in catalog or f"`{name}`" not in summary] == []


def test_write_docs_writes_both(tmp_path):
    (tmp_path / "docs").mkdir()
    start, end = tool_docs.README_SUMMARY
    (tmp_path / "README.md").write_text(f"# x\n\n{start}\nold\n{end}\nafter\n")
    assert tool_docs.write_docs(TABLE, tmp_path) == 0
    assert (tmp_path / "docs" / "TOOLS.md").read_text() == tool_docs.tool_catalog_markdown(TABLE) + "\n"
    readme = (tmp_path / "README.md").read_text()
    assert "old" not in readme and readme.endswith(f"{tool_docs.tool_summary_markdown(server.TOOLS)}\n{end}\nafter\n")
