"""Which tools a client sees, at the MCP edge: the server's middleware leaves out of tools/list the tools
no configured token can use (by the privileges read from /access/permissions) and, over HTTP, those
outside the calling principal's reach (its profile and hosts: auth/), refuses calls to them and
calls with arguments a tool does not take, rewrites the SDK's argument errors as one readable line
(argument_errors.py), and tells connected clients when the set changes. Which tools a configuration
offers at all is server.offered_tools.
"""
from __future__ import annotations

import dataclasses
import inspect
import threading
import time
from collections.abc import Collection
from typing import Any, Callable

import anyio.from_thread
import anyio.lowlevel
from mcp.shared.subscriptions import ToolsListChanged
from mcp_types import CallToolResult, TextContent
from pydantic import ValidationError

import policy
import privileges
import proxmox_client
import runtime
from argument_errors import argument_error
from auth import principal
from config import Config, tool_matches
from confirmation import asks_by_round_trip
from errors import ConfigError
from products import PRODUCTS


# A call by a name the tool had before it was renamed or merged (config.RENAMED_TOOLS) still works:
# its arguments renamed, and what the old tool did by default (the tool list shows the new names only).
MERGED_ARGUMENTS = {
    "task_log": ({"limit": "log_lines"}, {"start": 0, "log_lines": 100}),
    "pbs_task_log": ({"limit": "log_lines"}, {"start": 0, "log_lines": 100}),
    "wait_task": ({}, {"wait_seconds": 60}),
    "write_pbs_protect_snapshot": ({}, {"protected": True}),
    "write_provision_lxc": ({}, {"start": True}),
    "write_provision_vm": ({}, {"start": True}),
    "write_close_terminal": ({}, {"close": True}),
}


def by_current_name(params: dict[str, Any]) -> dict[str, Any]:
    """tools/call params naming an old tool, as a call of the tool that does it now."""
    new = RENAMED_TOOLS.get(params.get("name"))
    if new is None:
        return params
    renamed, defaults = MERGED_ARGUMENTS.get(params["name"], ({}, {}))
    arguments = {renamed.get(key, key): value for key, value in (params.get("arguments") or {}).items()}
    return params | {"name": new, "arguments": defaults | arguments}


class ToolVisibility:
    """Server middleware: leaves out of tools/list the tools that no configured token can use
    (by the privileges read from /access/permissions), refuses calls to them with the reason,
    and tells connected clients when that set changes (notifications/tools/list_changed)."""

    def __init__(self) -> None:
        self.specs: list[Any] = []  # the offered tools' server.ToolSpec
        self.config: Config | None = None
        self.accepted: dict[str, set[str]] = {}  # tool -> the argument names it takes
        self.arguments: dict[str, Any] = {}  # tool -> its argument model (the SDK's FuncMetadata), for errors
        self.notified: dict[Any, tuple] = {}  # session -> the hidden set it last saw (before 2026-07-28)
        self.bus: Any = None  # the server's subscriptions/listen bus (2026-07-28 clients listen there)
        self.published: tuple | None = None  # the hidden set the bus was last told about
        self.token: Any = None
        self.lock = threading.Lock()
        self._hidden: tuple[int, dict[str, str]] = (-1, {})  # (privileges read so far, hidden tools)
        self.listed = threading.Event()  # a tools/list was answered (see load_permissions_in_background)

    def offer(self, config: Config, specs: list[Any]) -> None:
        """The tools this configuration offers (server.offered_tools), and the argument names each takes."""
        self.config = config
        self.specs = specs
        self.accepted = {spec.function.__name__: set(inspect.signature(spec.function).parameters) - {"ctx"}
                         for spec in self.specs}
        self._hidden = (-1, {})

    def hidden(self) -> dict[str, str]:
        """Tools no configured token can use; recomputed only when privileges were read."""
        seen, hidden = self._hidden
        if seen == privileges.permissions_read():
            return hidden
        seen, hidden = privileges.permissions_read(), {}
        for spec in self.specs:
            if not spec.needs:
                continue
            hosts = [h for h in proxmox_client.configured(spec.product).values()] if spec.product else []
            if not hosts or any(privileges.permissions_of(h) is None for h in hosts):
                continue  # unknown yet: offer the tool
            if spec.gate not in ("read", "sensitive") and any(getattr(h, "write_token_id", None) for h in hosts):
                continue  # writes go with the write token, whose privileges are not read (privileges.check_privileges)
            needed = {h.label: privileges.version_privileges(h, spec.needs) for h in hosts}
            if not any(privileges.holds_anywhere(h, p) for h in hosts for p in needed[h.label]):
                needs = privileges.version_privileges(hosts[0], spec.needs)
                hidden[spec.function.__name__] = (f"no configured token holds {' or '.join(needs)}. "
                                                  + privileges.grant_hint(hosts[0], spec.needs[0],
                                                                      PRODUCTS[spec.product].acl_root))
        self._hidden = (seen, hidden)
        return hidden

    def beyond(self, reach: policy.Reach | None) -> dict[str, str]:
        """Tools outside a principal's reach (its profile, its hosts), left out of its list and refused."""
        if reach is None:
            return {}
        beyond = {}
        for spec in self.specs:
            gates = [g for g in (spec.gate, *spec.also) if not reach.allows(g)]
            hosts = [label for label in proxmox_client.configured(spec.product)] if spec.product else None
            if gates:
                beyond[spec.function.__name__] = (f"it needs the {' and '.join(gates)} gate, beyond the profile "
                                                  f"'{reach.profile}' of '{reach.name}'")
            elif hosts and not any(reach.reaches(label) for label in hosts):
                beyond[spec.function.__name__] = f"'{reach.name}' may use none of its hosts ({', '.join(hosts)})"
        return beyond

    def unknown_arguments(self, name: str, arguments: Any) -> str | None:
        """Strict arguments: a name the tool does not take is refused (nothing is sent), naming
        the ones it takes, instead of being silently ignored."""
        accepted = self.accepted.get(name)
        if accepted is None or not isinstance(arguments, dict):
            return None
        unknown = sorted(set(arguments) - accepted)
        if not unknown:
            return None
        shown = ", ".join(repr(u[:40]) for u in unknown[:5])
        if len(unknown) > 5:
            shown += f" and {len(unknown) - 5} more"
        return f"{name} does not take {shown}; nothing was sent. It takes: {', '.join(sorted(accepted))}."

    async def __call__(self, ctx: Any, call_next: Callable) -> Any:
        if self.token is None:
            self.token = anyio.lowlevel.current_token()
        reach = principal.current()  # over HTTP: who calls
        hidden = self.hidden() | self.beyond(reach)
        if ctx.method == "tools/call" and isinstance(ctx.params, dict) and ctx.params.get("name") in RENAMED_TOOLS:
            ctx = dataclasses.replace(ctx, params=by_current_name(ctx.params))  # SDK: rewrite by replace
        if ctx.method == "tools/call":
            name = (ctx.params or {}).get("name")
            refusal = f"{name} is not available: {hidden[name]}" if name in hidden else \
                self.unknown_arguments(name, (ctx.params or {}).get("arguments"))
            if refusal:
                return CallToolResult(content=[TextContent(type="text", text=refusal)], is_error=True)
        result = await call_next(ctx)
        if ctx.method == "tools/call":
            self.readable_argument_error((ctx.params or {}).get("name"), (ctx.params or {}).get("arguments"), result)
        if ctx.method == "resources/list" and reach is not None and reach.hosts is not None:
            keep_reachable(result, reach)
        if ctx.method == "tools/list":
            keep_items(result, "tools", lambda tool: field_of(tool, "name") not in hidden)
            seen = tuple(sorted(self.hidden()))  # what changes while serving (a principal's reach does not)
            if asks_by_round_trip(ctx):  # no session to notify: 2026-07-28 clients listen on the bus
                self.published = self.published or seen
            else:
                self.notified[ctx.session] = seen
            self.listed.set()
        return result

    def readable_argument_error(self, name: str, arguments: Any, result: Any) -> None:
        """Rewrite an error result of the SDK's argument validation as one line naming the argument,
        the rule and an example (argument_error); any other result is left as it is."""
        block = (field_of(result, "content") or [{}])[0]
        text = field_of(block, "text") or ""
        metadata = self.arguments.get(name)
        if not field_of(result, "is_error") or metadata is None \
                or not text.startswith(f"Error executing tool {name}: ") or "validation error" not in text:
            return
        try:
            metadata.validate_arguments(arguments or {})
            return
        except ValidationError as exc:
            set_field(block, "text", argument_error(name, exc, metadata.arg_model.model_json_schema()))

    def refresh(self) -> None:
        """After privileges were read: tell each session whose list is now stale."""
        current = tuple(sorted(self.hidden()))
        if self.published is not None and self.published != current and self.token is not None:
            anyio.from_thread.run(self.bus.publish, ToolsListChanged(), token=self.token)
            self.published = current
        for session, seen in list(self.notified.items()):
            if seen != current and self.token is not None:
                try:
                    anyio.from_thread.run(session.send_tool_list_changed, token=self.token)
                    self.notified[session] = current
                except Exception:  # the session is gone
                    self.notified.pop(session, None)


# A result comes in one of two shapes (mcp.server.context.HandlerResult): the SDK's model, or its
# JSON dict (camelCase keys), which a result beyond the model's fields keeps (the 2026-07-28
# round trip's `requestState`). Read and changed here only, whichever it is.
DICT_KEYS = {"is_error": "isError"}


def field_of(value: Any, name: str) -> Any:
    return value.get(DICT_KEYS.get(name, name)) if isinstance(value, dict) else getattr(value, name, None)


def set_field(value: Any, name: str, new: Any) -> None:
    if isinstance(value, dict):
        value[DICT_KEYS.get(name, name)] = new
    else:
        setattr(value, name, new)


def keep_items(result: Any, name: str, keep: Callable[[Any], bool]) -> None:
    """Drop from the list `name` of a result (tools, resources) the items `keep` refuses."""
    set_field(result, name, [item for item in field_of(result, name) or [] if keep(item)])


def keep_reachable(result: Any, reach: policy.Reach) -> None:
    """resources/list for a principal limited to some hosts: the resources of those hosts only
    (`proxmox://<label>/...`, `pbs://<label>/...`; reading another's is refused anyway)."""
    def host_of(resource: Any) -> str | None:
        scheme, _, rest = str(field_of(resource, "uri") or "").partition("://")
        return rest.split("/", 1)[0] if scheme in ("proxmox", "pbs") else None
    keep_items(result, "resources", lambda resource: host_of(resource) is None or reach.reaches(host_of(resource)))


_visibility = runtime.slot("visibility.tools", ToolVisibility)  # this server's tool list middleware


def current() -> ToolVisibility:
    """This server's middleware."""
    return _visibility.get()


def load_permissions_in_background(after: float = 1.0, settle: float = 0.1) -> None:
    """Read every token's privileges without delaying anything; then refresh the list. The reads
    start `settle` seconds after the first tools/list was answered (its answer is written by
    then), or after `after` seconds: a client that asks for the list at once has it before they
    could finish anyway, and running beside it (importing requests, TLS handshakes) they made
    start to tools/list 4-7 % slower (docs/BENCHMARKS.md)."""
    visible = current()

    def load(product: str, label: str) -> None:
        if visible.listed.wait(timeout=after):
            time.sleep(settle)
        proxmox_client.client_for(product, label).ensure_permissions()  # the client imports requests
        visible.refresh()
    for product in ("pve", "pbs"):
        for label in proxmox_client.configured(product):
            threading.Thread(target=load, args=(product, label), daemon=True,
                             name=f"permissions-{product}-{label}").start()


# ---------------------------------------------------------------- the tool lists' names, checked at start

# write_ tools before 0.2.0, when some named the object first: every write_ tool is now write_<verb>_<object>
# (write_pbs_<verb>_<object> on a Backup Server). Settings naming the old names keep working, with a line.
RENAMED_TOOLS = {
    "write_guest_power": "write_power_guest", "write_snapshot_create": "write_create_snapshot",
    "write_snapshot_rollback": "write_rollback_snapshot", "write_snapshot_delete": "write_delete_snapshot",
    "write_guest_config": "write_configure_guest", "write_template": "write_make_template",
    "write_pbs_gc": "write_pbs_run_gc", "write_pbs_verify": "write_pbs_verify_backups",
    "write_pbs_prune": "write_pbs_prune_group",
    "write_vm_exec": "write_exec_guest", "write_lxc_exec": "write_exec_guest",
    "write_node_exec": "write_exec_node", "write_guest_file_read": "write_guest_file",
    "write_guest_file_write": "write_guest_file", "write_restore_drill": "write_drill_restore",
    "write_api_call": "write_call_api",
    # merged in 0.2.0 (the tool list is paid for on every turn)
    "task_log": "get_task", "pbs_get_task": "get_task", "pbs_task_log": "get_task", "wait_task": "get_task",
    "write_close_terminal": "write_terminal_send", "list_snapshots": "get_guest",
    "write_get_guest_file": "write_guest_file", "write_put_guest_file": "write_guest_file",
    "write_exec_vm": "write_exec_guest", "write_exec_lxc": "write_exec_guest",
    "write_provision_lxc": "write_create_lxc", "write_provision_vm": "write_create_vm",
    "pbs_datastore_status": "pbs_list_datastores", "pbs_list_namespaces": "pbs_list_groups",
    "write_pbs_protect_snapshot": "write_pbs_edit_snapshot", "write_pbs_set_notes": "write_pbs_edit_snapshot",
}


def check_tool_names(config: Config, tool_names: Collection[str]) -> None:
    """PROXMOX_ALLOW_TOOLS / PROXMOX_DENY_TOOLS: every entry must name a tool (or a prefix of some); an
    entry that named tools by their old names (RENAMED_TOOLS) names them by their new ones."""
    for variable, field_name in (("PROXMOX_ALLOW_TOOLS", "allow_tools"), ("PROXMOX_DENY_TOOLS", "deny_tools")):
        entries, renamed = _renamed(getattr(config, field_name), tool_names)
        unknown = [e for e in entries if not any(tool_matches(e, name) for name in tool_names)]
        if unknown:
            raise ConfigError(f"{variable}: {', '.join(unknown)} names no tool. Tools: {', '.join(tool_names)}.")
        if renamed:
            config.warnings.append(f"{variable}: {'; '.join(renamed)} (write_ tools are named verb first since "
                                   f"0.2.0, some merged); set the new names to silence this line.")
        setattr(config, field_name, entries)


def _renamed(entries: tuple[str, ...], tool_names: Collection[str]) -> tuple[tuple[str, ...], list[str]]:
    """Each entry that names a tool now, and the new names of the old tools an entry matched."""
    out: list[str] = []
    said = []
    for entry in entries:
        new = sorted(RENAMED_TOOLS[old] for old in RENAMED_TOOLS
                     if tool_matches(entry, old) and not tool_matches(entry, RENAMED_TOOLS[old]))
        if not new or any(tool_matches(entry, name) for name in tool_names):
            out.append(entry)
        out += [name for name in new if name not in out]
        if new:
            said.append(f"{entry} now means {', '.join(new)}" + (" too" if entry in out else ""))
    return tuple(out), said
