"""The rules of the layout, read from the source with `ast`:

- a tool module never imports a helper from another tool module; shared helpers live in
  answers.py, errors.py, inventory.py, pbs_state.py and the client. It may import another tool module to
  call its *tools* (workflows compose pve_tools' writes; resources call list tools);
- the shared modules import no tool module (nor server.py);
- the HTTP client and the policy know no MCP (neither the SDK nor answers.py);
- per-server state (settings, hosts, what was read from them) is declared in runtime.py, never kept
  in a module-level name;
- a name is imported from the module that defines it; a tool module reads no other tool's rows;
  waiting for Proxmox is one loop (proxmox_client.poll); an import inside a function defers something.
"""
import ast
import functools
import importlib.util
import subprocess
import sys

import pytest

import server
from conftest import ROOT, server_env

TOOL_MODULES = ("pve_tools", "pbs_tools", "shell_tools", "workflows", "api_tools", "templates", "file_restore",
                "monitor_tools", "dashboard", "firewall_tools", "backup_jobs", "changes", "terminals", "lxc_admin",
                "node_tools", "guest_updates", "provisioning", "health")
SHARED_MODULES = ("answers", "errors", "audit", "inventory", "pbs_state", "proxmox_client", "policy", "catalog",
                  "gates", "firewall_guard", "protection", "masking", "config", "http_transport", "job_edits",
                  "receipts", "config_diff", "runtime", "tasks", "rrd", "ssh", "guest_os",
                  "power_effects", "state", "receipt_store", "undo", "batch", "losses", "findings", "settings",
                  "foreign_env", "calls", "fanout", "privileges")
# Modules that speak to Proxmox and know nothing of MCP: neither the SDK nor the answer kit that wraps it.
NO_MCP = ("proxmox_client", "policy", "gates", "masking", "protection", "catalog", "audit", "firewall_guard",
          "job_edits", "errors", "runtime", "receipts", "config_diff", "ssh", "power_effects", "state",
          "receipt_store", "undo", "batch", "losses", "settings", "foreign_env", "calls", "fanout", "privileges")
TOOLS_OF = {module: {spec.function.__name__ for spec in server.TOOLS if spec.function.__module__ == module}
            for module in TOOL_MODULES}


def parse(module: str) -> ast.Module:
    return parse_file(ROOT / f"{module}.py")


@functools.cache  # once per file for the whole module: the rules only read the trees
def parse_file(path) -> ast.Module:
    return ast.parse(path.read_text(), filename=path.name)


@functools.cache
def all_nodes(path) -> list[ast.AST]:
    return list(ast.walk(parse_file(path)))


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


@pytest.mark.parametrize("module", TOOL_MODULES)
def test_a_tool_module_does_not_read_another_tools_rows(module):
    """A tool that needs what another tool lists calls the shared function beneath both (inventory.py,
    pbs_state.py, ...): cells picked by position out of another tool's table
    (`list_backups(...)["rows"][0][0]`) break when that table gains a column. Passing an answer on
    whole (a resource) is fine."""
    tree = parse(module)
    others = set(TOOL_MODULES) - {module}

    def tool_call(node: ast.AST) -> bool:
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and isinstance(node.func.value, ast.Name) and node.func.value.id in others
    answers = {target.id for node in ast.walk(tree) if isinstance(node, ast.Assign) and tool_call(node.value)
               for target in node.targets if isinstance(target, ast.Name)}
    picked = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Subscript)
              and isinstance(node.slice, ast.Constant) and node.slice.value == "rows"
              and (tool_call(node.value) or isinstance(node.value, ast.Name) and node.value.id in answers)]
    assert picked == [], f"{module} reads another tool's rows at lines {picked}"


@pytest.mark.parametrize("module", NO_MCP)
def test_the_client_and_the_policy_know_no_mcp(module):
    """The HTTP client and the admission step are Proxmox's side: progress to a client, answer shapes
    and the SDK's types live in answers.py, tasks.py and the tool modules."""
    imports = [(line, name) for line, name, _ in imported_modules(parse(module))
               if name.split(".")[0] in ("mcp", "mcp_types", "answers", "anyio")]
    assert imports == [], f"{module} imports {imports}"


@pytest.mark.parametrize("module", SHARED_MODULES)
def test_a_shared_module_imports_no_tool_module(module):
    imports = [(line, name) for line, name, _ in imported_modules(parse(module))
               if name in TOOL_MODULES or name == "server"]
    assert imports == [], f"{module} imports {imports}"


# ---------------------------------------------------------------- per-server state lives in runtime.py

# Module-level state that belongs to the process, not to one server: each with the reason.
PROCESS_WIDE = {
    ("masking", "_known_secrets"): "a secret once known is masked for the life of the process, whichever server met it",
    ("fanout", "_threads"): "the read threads every server of the process shares (in_parallel)",
    ("fanout", "_lanes"): "each node's lanes: its requests in flight from this process, whichever server sent them",
    ("fanout", "_counting"): "the measurement under way (tests and bench/ count answer times on the path)",
    ("fanout", "PER_NODE"): "PROXMOX_REQUESTS_PER_NODE: what a node serves at once, for every server of the process",
    ("demo", "DEMO"): "the simulated lab --demo serves, held for the life of the process",
    ("runtime", "_installed"): "the registry itself: which server's state is installed",
    ("runtime", "SLOTS"): "the registry itself: the slots the modules declared at import",
}
MUTATORS = {"append", "extend", "insert", "add", "update", "clear", "pop", "popitem", "setdefault", "remove",
            "discard"}


def top_level_modules() -> list[str]:
    return sorted(path.stem for path in ROOT.glob("*.py"))


def module_names(tree: ast.Module) -> set[str]:
    """Names the module binds at its top level (assignments)."""
    names = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def local_names(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    arguments = function.args
    names = {a.arg for a in arguments.args + arguments.kwonlyargs + arguments.posonlyargs}
    names |= {a.arg for a in (arguments.vararg, arguments.kwarg) if a}
    return names | {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def changed_root(target: ast.expr) -> tuple[str, str | None] | None:
    """What an item or attribute assignment, or a mutating call, changes: the name at the root of
    `a[...].b[...]` and the attribute right after it (`module.NAME` of another module)."""
    chain = []
    while isinstance(target, (ast.Subscript, ast.Attribute)):
        chain.append(target)
        target = target.value
    if not isinstance(target, ast.Name) or not chain:
        return None
    first = chain[-1]
    return target.id, first.attr if isinstance(first, ast.Attribute) else None


def state_changes(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, name) where a function rebinds (`global`) or changes in place (a mutating method, an item
    or attribute assigned or deleted) a name the module binds at its top level, or one of another
    project module (`module.NAME`): state kept in a module."""
    names, modules, found = module_names(tree), set(top_level_modules()), []
    for function in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        declared = {(node.lineno, name) for node in ast.walk(function) if isinstance(node, ast.Global)
                    for name in node.names}
        changed = []
        for node in ast.walk(function):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
                changed.append((node.lineno, (node.func.value.id, None) if isinstance(node.func.value, ast.Name)
                                else changed_root(node.func.value) or (None, None)))
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                changed += [(node.lineno, changed_root(t) or (None, None)) for t in targets]
        own = local_names(function) - {name for _, name in declared}
        found += sorted(declared)
        for line, (name, attr) in changed:
            if name in names and name not in own:
                found.append((line, name))
            elif name in modules and name not in own and attr is not None:
                found.append((line, f"{name}.{attr}"))
    return found


@pytest.mark.parametrize("module", top_level_modules())
def test_per_server_state_is_declared_in_the_runtime_registry(module):
    """What a server keeps for itself (settings, hosts, clients, what it read from them) is a slot of
    runtime.py, so that a test installs one fresh Runtime per server; module-level state elsewhere is
    either the process's (PROCESS_WIDE, with the reason) or a mistake."""
    kept = sorted({(line, name) for line, name in state_changes(parse(module))
                   if (module, name) not in PROCESS_WIDE and tuple(name.split(".")) not in PROCESS_WIDE})
    assert kept == [], (f"{module} keeps state in module-level names {kept}: declare it with runtime.slot "
                        f"(runtime.py), or, if it belongs to the process, list it in PROCESS_WIDE with the reason")


def test_every_process_wide_exception_still_exists():
    for module, name in PROCESS_WIDE:
        assert name in module_names(parse(module)), f"{module}.{name} is gone: drop it from PROCESS_WIDE"


# ---------------------------------------------------------------- a name is imported from its own module

def borrowed_names(module: str) -> set[str]:
    """The names a project module imports from another project module (`from gates import GATES`)."""
    project = set(top_level_modules())
    return {alias.asname or alias.name for node in parse(module).body if isinstance(node, ast.ImportFrom)
            and node.module in project for alias in node.names}


def test_no_name_is_taken_through_a_module_that_only_imported_it():
    """`policy.mask` would work while policy imports mask from masking; the name is taken from masking,
    so that a module's names are its own and an import can move without breaking a stranger."""
    borrowed = {module: borrowed_names(module) for module in top_level_modules()}
    found = []
    for path in [*ROOT.glob("*.py"), *(ROOT / "tests").glob("*.py"), *(ROOT / "bench").glob("*.py")]:
        nodes = all_nodes(path)
        aliases = {alias.asname or alias.name: alias.name for node in nodes if isinstance(node, ast.Import)
                   for alias in node.names if alias.name in borrowed}
        found += [f"{path.name}:{node.lineno} {aliases[node.value.id]}.{node.attr}" for node in nodes
                  if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                  and node.value.id in aliases and node.attr in borrowed[aliases[node.value.id]]]
        found += [f"{path.name}:{node.lineno} from {node.module} import {alias.name}" for node in nodes
                  if isinstance(node, ast.ImportFrom) and node.module in borrowed for alias in node.names
                  if alias.name in borrowed[node.module]]
    assert found == [], f"names taken through a module that imported them (import them from their own): {found}"


# Where a module may sleep besides proxmox_client.poll, the one wait-until loop: each with the reason.
SLEEPS = {
    ("proxmox_client", "_send"): "a short pause before retrying a GET whose connection dropped",
    ("visibility", "load"): "the privileges are read a moment after the first tools/list, not beside it",
    ("http_transport", "stop"): "on SIGTERM, the requests being answered finish (ours, not Proxmox's)",
}


def own_nodes(function: ast.AST) -> list[ast.AST]:
    """The nodes of a function's body, without those of the functions defined inside it."""
    found, stack = [], list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        found.append(node)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))
    return found


def test_waiting_for_proxmox_is_one_loop():
    """Waiting until a task ends, a guest is in a state, the agent answers: proxmox_client.poll, with
    its deadline, for every one of them."""
    found = []
    for module in top_level_modules():
        for function in (n for n in ast.walk(parse(module)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            sleeps = [n.lineno for n in own_nodes(function) if isinstance(n, ast.Call)
                      and isinstance(n.func, ast.Attribute) and n.func.attr == "sleep"]
            if sleeps and (module, function.name) not in SLEEPS | {("proxmox_client", "poll"): ""}:
                found.append(f"{module}.{function.name}:{sleeps[0]}")
    assert found == [], f"waiting loops of their own (use proxmox_client.poll): {found}"


# ---------------------------------------------------------------- an import inside a function defers something

def imported_module(module: str, name: str) -> str:
    """What `from module import name` loads: the submodule `module.name` if there is one, else `module`."""
    try:
        return f"{module}.{name}" if importlib.util.find_spec(f"{module}.{name}") else module
    except (ImportError, AttributeError, ValueError):
        return module


def project_modules() -> dict[str, tuple[ast.Module, str]]:
    """Every module of the server by its dotted name, with its package: the top level and the
    packages (auth, simulator)."""
    found = {}
    for path in [*ROOT.glob("*.py"), *ROOT.glob("auth/*.py"), *ROOT.glob("simulator/*.py")]:
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if path.name == "__init__.py" else parts)
        found[name] = ast.parse(path.read_text(), filename=str(path)), ".".join(parts[:-1])
    return found


def imported_from(node: ast.ImportFrom, package: str) -> str:
    """The module of `from X import ...` (`from .lab import Lab` in simulator/api.py: simulator.lab)."""
    parent = package.rsplit(".", node.level - 1)[0] if node.level else ""
    return ".".join(part for part in (parent, node.module) if part)


def import_graph() -> dict[str, set[str]]:
    """Which project modules each one imports, anywhere in the file (inside functions too)."""
    modules = project_modules()
    graph = {}
    for name, (tree, package) in modules.items():
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = imported_from(node, package)
                found |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names}
        graph[name] = found & set(modules) - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """A shortest path back to each module that its imports lead back to (one per set of modules)."""
    found, seen = [], set()
    for start in sorted(graph):
        came_from, queue = {}, [start]
        while queue and start not in came_from:
            name = queue.pop(0)
            for nxt in sorted(graph[name] - set(came_from)):
                came_from[nxt] = name
                queue.append(nxt)
        if start in came_from:
            path = [start]
            while len(path) == 1 or path[-1] != start:
                path.append(came_from[path[-1]])
            if frozenset(path) not in seen:
                seen.add(frozenset(path))
                found.append(path[::-1])
    return found


def test_no_import_cycle():
    """No module imports, even inside a function, one that imports it back (through any others): a
    value a module needs from one that needs it is handed to it (the Backup Servers' URLs to the
    firewall guard, the tool table to tool_docs)."""
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert "firewall_guard" in import_graph()["batch"] and "simulator.lab" in import_graph()["simulator.api"]


def test_an_import_inside_a_function_defers_something(tmp_path):
    """A module imported inside a function is one a server's start does not load (requests, paramiko,
    the simulator, the HTTP-only parts); one the start loads anyway is imported at the top of the file."""
    start = ("import sys, anyio, server; config, _ = server.configuration(server.parse_args([])); "
             "server.apply_configuration(config); anyio.run(server.build_server(config).list_tools); "
             "print(' '.join(sys.modules))")
    loaded = set(subprocess.run([sys.executable, "-c", start], cwd=tmp_path, capture_output=True, text=True, check=True,
                                env=server_env({"PYTHONPATH": str(ROOT)})).stdout.split())
    found = []
    for module in top_level_modules():
        for function in (n for n in ast.walk(parse(module)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for node in own_nodes(function):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [imported_module(node.module, a.name) for a in node.names] \
                    if isinstance(node, ast.ImportFrom) and node.module else []
                found += [f"{module}.{function.name}:{node.lineno} {name}" for name in names
                          if name in loaded]
    assert found == [], f"imports inside functions of modules every start loads (move them to the top): {found}"


MODULE_LINES = 1000  # a module longer than this is split by what it is about (tests/test_layout.py)


def test_no_module_is_longer_than_the_limit():
    """A module that outgrows this is split by what it is about (provisioning.py out of pve_tools.py
    and workflows.py, health.py with findings.py out of workflows.py)."""
    paths = [*ROOT.glob("*.py"), *ROOT.glob("auth/*.py"), *ROOT.glob("simulator/*.py")]
    lines = {str(path.relative_to(ROOT)): len(path.read_text().splitlines()) for path in paths}
    assert {name: n for name, n in lines.items() if n > MODULE_LINES} == {}


def test_settings_are_values_config_reads_without_the_client_or_the_policy():
    """settings.py holds the values the configuration is read into; config.py reads them without the
    client or the policy (each of which imports settings.py); settings.py imports only protection.py (and
    receipt_store.py for a type)."""
    graph = import_graph()
    assert not {"proxmox_client", "policy"} & graph["config"]
    assert graph["settings"] <= {"protection", "receipt_store"}


def test_server_py_is_the_mcp_edge_only():
    """server.py holds the tool table, registration, transports and the command line; what grows
    beside them (visibility, confirmation, argument errors, docs, the demo) has a module of its own."""
    assert len((ROOT / "server.py").read_text().splitlines()) < 900
