"""The one admission step every Proxmox request passes, HTTP or SSH.

`admit()` is called by the HTTP client (proxmox_client.request) and by the shell tools before
anything is sent, and runs the same sequence for both:

  1. classify   what the request is, resolved once (`resolve`: its catalog method, its parameters
                checked against the schema, its gates, the guests it names, the secrets it
                returns), then judged by STAGES over that one Decision: the job, rule or group it
                edits or runs as it will be after it, a firewall write of the cluster or a node
                refused if it would lock this server out (firewall_guard.py), the commands of a
                batch, what it loses, the guests a node's reboot changes. The stored objects they
                judge by are read through the client once per call (calls.Reads), not admitted again
                (own_read)
  2. judge      gates open for this host, no protected guest reached, the token's privileges,
                the exec allow-list (PROXMOX_EXEC_ALLOWED_VMIDS), no masked secret written back
  3. dry run    the exact request instead of sending it
  4. confirm    destructive, exec, elevated and unblocked calls: the user is asked when the
                client can ask (before the call runs, about the whole plan: see plan_call and
                plan_steps); confirm=true stands in only for clients that cannot
  5. audit      one line before sending (if it cannot be written, nothing is sent), one after
  6. send       and mask the secrets the answer carries; a write gets a receipt (receipts.py: the
                state before and after, a safety snapshot first where one is due)

Refusals raise PolicyError (ConfirmationNeeded when only the user's yes is missing); nothing is
sent then. Which guests a request reaches is protection.py; what a job, rule or group edit will
do is job_edits.py; masking is masking.py; the hash-chained audit file is audit.py.

The gates themselves, and which a call needs, are gates.py.
"""
from __future__ import annotations

import hashlib
import json
import posixpath
import re
import time
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import unquote

import audit as audit_log
import batch
import calls
import catalog
import firewall_guard
import job_edits
import losses
import power_effects
import protection
import receipts
import runtime
import state
from calls import Call
from errors import ConfirmationNeeded, PolicyError, ToolFailure
from gates import CONFIRMED, GATES, TIERS, call_gates, combine, deleting, inside_guest
from masking import MASK, audit_view, mask, mask_answer
from privileges import check_privileges, missing_privileges
from products import PRODUCTS
from protection import Scope, named_guests, truthy
from settings import HostPolicy, Settings


class DryRun(Exception):
    """Raised instead of sending a write when dry run (or planning) is on; carries the exact
    request as the answer shows it (`plan`) and the judged requests (`decisions`)."""

    def __init__(self, plan: dict, decisions: list[tuple[Any, "Decision"]] | None = None, summary: str = ""):
        super().__init__("dry run")
        self.plan = plan
        self.decisions = decisions or []
        self.summary = summary  # a declared plan's steps in words (plan_steps)


# Reads that follow a confirmed call in the same tool call (judged, but neither confirmed nor audited
# again): the follow-up's template regex -> the confirmed call's template regex. Only a read of the
# very exec the user said yes to (same host, same guest, its pid) is a follow-up; any other is exec.
FOLLOW_UPS = {r".*/agent/exec-status": r".*/agent/exec"}

EXECUTE = "/nodes/{node}/execute"
# Files a host serves beside its API, fetched through the same admission step as a plain read:
# (product, path) -> what it is.
DOCUMENTS = {("pve", "/pve-docs/api-viewer/apidoc.js"): "the host's API viewer (method descriptions)",
             ("pbs", "/docs/api-viewer/apidoc.js"): "the host's API viewer (method descriptions)"}
DELETES_BACKUPS = r"/admin/datastore/\{store\}/prune(-datastore)?|/admin/prune/\{id\}/run"  # by what they are


# ================================================================ per-host settings


def gate_open(rules: HostPolicy, gate: str, method: str = "POST", template: str = "") -> bool:
    tier = TIERS.index(rules.access)
    if gate == "read":
        return True
    if gate == "sensitive":
        return "sensitive" in rules.allow
    if gate in TIERS:
        return tier >= TIERS.index(gate)
    if gate == "exec":
        return "exec" in rules.allow
    if gate == "elevated":
        return "elevated" in rules.allow and (method == "GET" or tier >= TIERS.index("write"))
    return (method, template) in rules.unblocked and (method == "GET" or tier >= TIERS.index("write"))


def how_to_open(gate: str, label: str, product: str) -> str:
    return {
        "sensitive": f"PROXMOX_ALLOW_SENSITIVE=true (or {PRODUCTS[product].host_prefix(label)}_ALLOW_SENSITIVE)",
        "lifecycle": "PROXMOX_ACCESS=lifecycle or higher",
        "write": "PROXMOX_ACCESS=write or higher",
        "destructive": "PROXMOX_ACCESS=destructive",
        "exec": "PROXMOX_ALLOW_EXEC=true",
        "elevated": "PROXMOX_ALLOW_ELEVATED=true together with PROXMOX_ACCESS=write",
        "blocked": "PROXMOX_UNBLOCK naming this method (and PROXMOX_ACCESS=write for a change)",
    }[gate]


# What each principal's profile may reach beside the server's own gates, which still apply
# (docs/SECURITY.md#principals): the highest tier, and the side gates it may use.
PROFILES = {"read": ("read", frozenset()),
            "operate": ("write", frozenset({"sensitive"})),
            "admin": ("destructive", frozenset({"sensitive", "exec", "elevated", "blocked"}))}


@dataclass(frozen=True)
class Reach:
    """Who calls over HTTP (a named token, an OAuth client, an identity provider's subject) and what
    that principal may reach: its profile (PROFILES) and, when it lists them, the host labels it may
    use. The MCP edge puts it in the call (current_call().reach, beside .principal, its name);
    the single user (stdio, the one static token) has none."""
    name: str
    profile: str = "read"
    hosts: frozenset[str] | None = None

    def allows(self, gate: str) -> bool:
        tier, side = PROFILES[self.profile]
        return TIERS.index(gate) <= TIERS.index(tier) if gate in TIERS else gate in side

    def reaches(self, label: str) -> bool:
        return self.hosts is None or label in self.hosts


_settings = runtime.slot("policy.settings", Settings)  # this server's (configure)
# The running tool call (calls.Call), set by the tool wrapper in server.py: the tool, dry run, the
# confirmation step, who calls, and what the call carries from request to request. None outside one.
CALL = calls.CALL


def current_call() -> Call:
    """The running tool call; outside one a fresh Call that nothing keeps."""
    return calls.current()


def settings() -> Settings:
    """This server's settings (see configure)."""
    return _settings.get()


def configure(settings: Settings) -> None:
    _settings.set(settings)


def rules_for(host: Any) -> HostPolicy:
    return settings().hosts.get((host.product, host.label), HostPolicy())


def writes_enabled(settings: Settings) -> bool:
    """Whether any host may get a request that is audited (anything beyond plain reads)."""
    return any(gate_open(rules, gate) for rules in settings.hosts.values() for gate in GATES[1:-1])


def normalise_path(path: str) -> str:
    """Decode, collapse `//` and resolve `..` so that a path cannot hide from the catalog."""
    decoded = path
    for _ in range(3):  # double-encoded slashes
        decoded = unquote(decoded)
    decoded = decoded.split("?", 1)[0]
    if any(ord(c) < 32 for c in decoded):
        raise PolicyError(f"Path {path!r} contains characters no Proxmox path has.")
    return posixpath.normpath("/" + decoded.strip("/")) if decoded.strip("/") else "/"


# ================================================================ 1. classify

@dataclass
class Decision:
    """What one request is, as the policy judged it."""
    method: str  # HTTP method, or SSH
    path: str  # the concrete path, or what a shell runs
    params: dict[str, Any] = field(default_factory=dict)
    template: str = ""  # catalog template ("" for SSH)
    gates: tuple[str, ...] = ("read",)
    reasons: list[str] = field(default_factory=list)
    guests: list[int] = field(default_factory=list)  # named or reached: protection, exec allow-list
    scope: Scope = field(default_factory=Scope)  # guests reached without being listed
    # protected guests a job, rule or group edit changes without naming them, and how (job_edits);
    # None when the request edits no such object
    changed: dict[int, str] | None = None
    entry: dict | None = None  # the catalog method (privileges)
    secrets: tuple[str, ...] = ()  # properties of the answer that are masked (nested calls' too)
    path_params: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # parameters the schema refuses
    audit_params: dict[str, Any] | None = None  # what the audit line shows instead of `params`
    basis: Any = None  # what the request was judged with beyond itself (a stored job), for the user's yes
    standing: str | None = None  # the standing yes that covers it (an open terminal's: grant_standing)
    in_guest: bool = False  # runs inside its guests (a shell's pct exec/enter/push/pull): the exec allow-list
    writer: bool = False  # a read sent with the write token (sent_by_writer)
    node_file: tuple[str, str] | None = None  # a node's file over SFTP: (action, path), judged by node_file_view

    @property
    def gate(self) -> str:
        return self.gates[-1]

    @property
    def confirm(self) -> bool:
        """Destructive, exec, elevated and unblocked calls need the user's yes."""
        return bool(set(self.gates) & set(CONFIRMED))


def document_decision(product: str, path: str) -> Decision:
    """A file the host serves beside its API (DOCUMENTS) as a read Decision; any other is refused."""
    why = DOCUMENTS.get((product, path))
    if why is None:
        raise PolicyError(f"{path} is not a file this server reads from a {product.upper()} host.")
    return Decision("GET", path, {}, "", ("read",), [why])


def shell_decision(what: str, gates: tuple[str, ...], guests: list[int], reason: str,
                   contents: bytes | None = None, *, secret: bool = False, standing: str | None = None,
                   node_file: tuple[str, str] | None = None) -> Decision:
    """A shell command (SSH) as a Decision: the gates it needs and the guests it runs in (a shell
    reaches a guest only through pct exec, enter, push or pull: `in_guest`, so the exec allow-list holds
    it at any gate, docs/REVIEW-SECURITY.md F10); file contents or stdin are audited as size and keyed
    hash only, a `secret` stdin (a password) not at all;
    `standing`: the open terminal whose yes covers it (grant_standing); `node_file`: a node's file
    (action, path), classified by the guests its path names (node_file_view)."""
    audited = {"password": MASK} if secret else {"contents": contents} if contents is not None else {}
    decision = Decision("SSH", what, {}, "", combine(set(gates)), [reason], sorted(guests), audit_params=audited,
                        standing=standing, node_file=node_file, in_guest=bool(guests))
    if node_file is not None:
        action, path = node_file
        named = node_file_view(action, path)[0]
        data = sorted(vmid for vmid, kind in named.items() if kind == "data")
        # a config read stays a config read (sensitive); what writes names every guest it touches
        decision.guests = sorted(set(decision.guests) | set(data if action in FILE_READS else named))
        if data:  # a guest's disk, root or backup: its files, as the agent reaches them (exec, + sensitive to read)
            reading = {"sensitive"} if action in FILE_READS else set()
            decision.gates = combine(set(decision.gates) | {"exec"} | reading)
            decision.in_guest = True  # its files, as a shell in it reaches them: the exec allow-list too
            decision.reasons.append(f"the files of guest {', '.join(map(str, data))} (its disk, root or backups), "
                                    f"as guest file access")
    return decision


FILE_READS = ("list", "read", "download")  # of a node's file; anything else writes or deletes it
# Node paths a file write does not reach: the cluster's and the Backup Server's configuration, which the
# API changes through the judgement it needs (protected guests' configs, the firewall's lock-out guard,
# storages, HA, jobs): docs/SECURITY.md#node-files
CLUSTER_CONFIG = re.compile(r"/etc/(?:pve|proxmox-backup)(?:/.*)?")


def node_file_view(action: str, path: str) -> tuple[dict[int, str], bool]:
    """How a node's file is judged: the guests its path names (protection.node_path_guests) and whether
    a write would change cluster configuration. A tool compares it for the path given and the node's
    real path of it (links resolved), so a link cannot carry a write or read elsewhere."""
    return protection.node_path_guests(path), action not in FILE_READS and bool(CLUSTER_CONFIG.fullmatch(path))


def _judge_node_file(decision: Decision) -> None:
    action, path = decision.node_file
    if node_file_view(action, path)[1]:
        raise PolicyError(f"{path} is cluster configuration (guests' configs, the firewall, storages, HA, jobs): "
                          f"it is changed through the API, where protected guests and the firewall's lock-out "
                          f"guard are judged, never by a file {action}. Nothing was sent.")


def classify(host: Any, method: str, path: str, params: dict[str, Any],
             read: Callable[[str], Any] | None = None, *, nested: bool = False) -> Decision:
    """Say what a request is: resolved once (`resolve`: refused when it is not a valid call of the
    product's API), then judged on what it reaches by each of STAGES in order, over that one Decision.
    A command of a batch (`nested`) meets the firewall guard with the whole batch (_merge_nested)."""
    decision = resolve(host, method, path, params)
    for stage in STAGES:
        stage(host, decision, read, nested)
    return decision


def _method_of(host: Any, method: str, path: str) -> tuple[str, str, dict, dict[str, str]]:
    """(the normalised path, its catalog template, the method's entry, the path's parameters)."""
    clean = normalise_path(path)
    found = catalog.find_path(host.product, clean)
    if found is None:
        raise PolicyError(f"Unknown API path {clean} on {host.product.upper()}: refused. "
                          f"Use api_search to find the right path.")
    template, entries, path_params = found
    if method not in entries:
        raise PolicyError(f"{method} is not a method of {template} (it has {', '.join(sorted(entries))}).")
    return clean, template, entries[method], path_params


def resolve(host: Any, method: str, path: str, params: dict[str, Any]) -> Decision:
    """The request resolved once, from itself alone: its catalog method, template and path
    parameters, its parameters checked against the schema, its gates, the guests it names and
    whether it reaches guests in bulk. Every later stage reads and adds to this Decision."""
    method = method.upper()
    clean, template, entry, path_params = _method_of(host, method, path)
    gates, reasons = call_gates(host.product, method, template, params)
    judged_by_job = job_edits.operation(host.product, method, template)  # its selection is judged there
    named = {k: v for k, v in params.items() if not (judged_by_job and k in judged_by_job[0].selection)}
    decision = Decision(method, clean, params, template, gates, reasons,
                        sorted(named_guests(host.product, template, path_params, named, entry)), entry=entry,
                        secrets=tuple(entry.get("secrets", ())), path_params=path_params)
    decision.errors = catalog.check_params(entry, params, path_params=path_params, product=host.product)
    deletes = bool(deleting(entry, params)) or bool(re.fullmatch(DELETES_BACKUPS, template))
    decision.scope = protection.bulk_scope(template, params, deletes)
    return decision


Read = Callable[[str], Any] | None  # how a stage reads the stored objects it judges by (shared by the call)


def _stage_as_after(host: Any, decision: Decision, read: Read, _nested: bool) -> None:
    """A job, rule or group created, edited, deleted or run, judged as the object will be after it."""
    if not job_edits.operation(host.product, decision.method, decision.template):
        return
    # read the stored object only for a valid call whose own gates are open and that names no protected guest
    require_gates(host, decision.gates, f"{decision.method} {decision.path}", decision.reasons, decision.method,
                  decision.template)
    _refuse_invalid(decision)
    check_protected(host, decision)
    _judge_as_after(host, decision, read)


def _stage_firewall(host: Any, decision: Decision, read: Read, nested: bool) -> None:
    """A firewall write of the cluster or a node that would lock this server out is refused, and the
    protected guests a firewall object reaches are the request's (firewall_guard;
    docs/PROXMOX-BEHAVIOUR.md#firewall-lockout). Not while planning: the guard only refuses, and the
    call meets it."""
    if not firewall_guard.guards(host.product, decision.method, decision.template) or current_call().planning:
        return
    if not nested:
        judge(host, decision)  # read the firewall only for a call the rest of the policy allows
        firewall_guard.check(host, decision, read, settings().source_address, settings().backup_servers)
    protected = protected_vmids(host)
    decision.guests = sorted(set(decision.guests) | firewall_guard.protected_reached(decision, read, protected))


def _stage_batch(host: Any, decision: Decision, read: Read, _nested: bool) -> None:
    """POST /nodes/{node}/execute: each command classified on what the earlier ones leave."""
    if decision.template == EXECUTE and not decision.errors:
        _merge_nested(host, decision, decision.path_params["node"], decision.params.get("commands"), read)


def _stage_losses(host: Any, decision: Decision, read: Read, _nested: bool) -> None:
    """What a request whose gates are open loses, by name; the yes pinned to what it frees (losses)."""
    if decision.template != EXECUTE and not decision.errors and all(
            gate_open(rules_for(host), g, decision.method, decision.template) for g in decision.gates):
        losses.name(host.product, decision, read)


def _stage_node_power(host: Any, decision: Decision, read: Read, _nested: bool) -> None:
    """A node's reboot or shutdown, judged by the guests it changes; while planning too: no question
    is asked about a reboot that will be refused."""
    down = power_effects.judged(host.product, decision.method, decision.template, decision.path_params,
                                decision.params)
    if down and not decision.errors:
        _judge_node_power(host, decision, read, down)


# What classify does after `resolve`, in order: each stage reads the stored objects it needs through
# `read` (sent once per call: calls.Reads) and adds what it finds to the one Decision.
STAGES = (_stage_as_after, _stage_firewall, _stage_batch, _stage_losses, _stage_node_power)


def own_read(host: Any, path: str, params: dict[str, Any]) -> Decision | None:
    """Steps 1 and 2 for a read the admission step makes for its own judgement (the firewall guard,
    protection, job judgement, losses, the receipts' state before and after): a plain read, which no
    gate beyond `read` guards, goes to the transport as judged here (the principal's reach, the
    token's privileges, the secrets to mask) instead of through the whole admission step again, which
    classified each such read anew (issue 30). None when the read needs more: it is admitted as a
    tool's read is."""
    try:
        clean, template, entry, path_params = _method_of(host, "GET", path)
    except PolicyError:
        return None  # refused as admission refuses it
    gates, reasons = call_gates(host.product, "GET", template, params)
    if gates != ("read",) or catalog.check_params(entry, params, path_params=path_params, product=host.product):
        return None  # admitted as a tool's read: a gate beyond read, or parameters the schema refuses
    decision = Decision("GET", clean, params, template, gates, reasons, entry=entry,
                        secrets=tuple(entry.get("secrets", ())), path_params=path_params)
    try:
        _check_reach(host, gates, f"GET {clean}")
        check_privileges(host, entry, path_params | {k: str(v) for k, v in params.items()
                                                      if isinstance(v, (str, int))})
    except PolicyError as exc:
        audit(host, "GET", clean, params, "refused", error=str(exc))
        raise
    return decision


def _judge_node_power(host: Any, decision: Decision, read: Callable[[str], Any] | None, command: str) -> None:
    """A request that takes a node down (a reboot or shutdown; corosync stopped under an active HA LRM:
    power_effects.DOWN, docs/PROXMOX-BEHAVIOUR.md#node-power) changes the guests there that HA does not
    move away: they are `changed`, which check_protected judges as it judges named guests (the list,
    the tags, the protection flag); an unreadable protected list refuses it outright."""
    if settings().protected.error:
        decision.changed = {}
        return
    # read the node's guests only for a call whose own gates are open
    require_gates(host, decision.gates, f"{decision.method} {decision.path}", decision.reasons, decision.method,
                  decision.template)
    changed = power_effects.changes(read, decision.path_params["node"], command, protected_vmids(host))
    decision.changed = (decision.changed or {}) | changed


def _judge_as_after(host: Any, decision: Decision, read: Callable[[str], Any] | None) -> None:
    """A job, rule or group created, edited, deleted or run (and a one-shot vzdump) is judged as the
    object will be after the request (job_edits): the deletion it adds, the protected guests it changes."""
    protected = protected_vmids(host)
    verdict = job_edits.judge(host.product, decision.method, decision.template, decision.path_params,
                              decision.params, read, protected, f"{decision.method} {decision.path}")
    decision.gates = combine(set(decision.gates) | verdict.gates)
    decision.reasons += verdict.reasons
    decision.scope.bulk = decision.scope.bulk or verdict.whole_scope
    decision.changed = verdict.changed
    decision.basis = verdict.before  # the user's yes is for the object as it was read


def _merge_nested(host: Any, decision: Decision, node: str, commands: Any, read: Callable[[str], Any] | None) -> None:
    """POST /nodes/{node}/execute runs each command as an API call on that node, in order, each on the
    state the earlier ones left, and the next after one that failed
    (docs/PROXMOX-BEHAVIOUR.md#nested-execute): each is classified on what the earlier ones leave
    (batch.Overlay), the batch needs all their gates, and its firewall writes are judged together for
    every way the batch can end (batch.check_firewall)."""
    commands = catalog.command_batch(commands) if isinstance(commands, str) else None
    if commands is None:  # the schema check refuses it first; this is the policy's own guard
        raise PolicyError("execute: `commands` must be a JSON array of {\"method\", \"path\", \"args\"}; "
                          "nothing was sent.")
    overlay, firewall_writes = batch.Overlay(read, host.product), []
    for command in commands:
        inner = classify(host, command["method"], f"/nodes/{node}/{command['path'].lstrip('/')}",
                         command.get("args") or {}, overlay.read, nested=True)
        _refuse_invalid(inner)
        decision.gates = combine(set(decision.gates) | set(inner.gates))
        decision.reasons += [f"{inner.method} {inner.path}: {r}" for r in inner.reasons]
        decision.guests = sorted(set(decision.guests) | set(inner.guests))
        decision.secrets += tuple(s for s in inner.secrets if s not in decision.secrets)  # each answer is returned
        decision.scope.bulk = decision.scope.bulk or inner.scope.bulk
        if inner.changed is not None:
            decision.changed = (decision.changed or {}) | inner.changed
        decision.basis = [*(decision.basis or []), inner.basis] if inner.basis is not None else decision.basis
        if firewall_guard.guards(host.product, inner.method, inner.template):
            firewall_writes.append(inner)
        overlay.fold(inner)
    if firewall_writes and not current_call().planning:
        judge(host, decision)  # read the firewall only for a batch the rest of the policy allows
        batch.check_firewall(host, f"{decision.method} {decision.path}", firewall_writes, read,
                             settings().source_address, settings().backup_servers)


# ================================================================ 2. judge

def judge(host: Any, decision: Decision) -> None:
    """Refuse a classified request the operator did not allow."""
    require_gates(host, decision.gates, f"{decision.method} {decision.path}", decision.reasons, decision.method,
                  decision.template)
    _refuse_invalid(decision)
    if decision.node_file is not None:
        _judge_node_file(decision)
    if decision.gates != ("read",):
        check_protected(host, decision)
    _check_exec_allowed(decision)
    decision.writer = sent_by_writer(host, decision)
    if decision.entry is not None and not decision.writer:
        check_privileges(host, decision.entry, decision.path_params | {
            k: str(v) for k, v in decision.params.items() if isinstance(v, (str, int))})
    if decision.method not in ("GET", "SSH"):
        for name, value in decision.params.items():
            if MASK in str(value):  # ours, or Proxmox's own ********** (cipassword)
                raise PolicyError(f"Parameter '{name}' holds a masked value ({MASK}); sending it would "
                                  f"overwrite the real secret. Leave it out to keep the current value.")
    decision.reasons += receipts.announce(settings().receipts, decision, host.label)  # in a dry run and the question


def _refuse_invalid(decision: Decision) -> None:
    if decision.errors:
        details = "; ".join(f"{name}: {message}" for name, message in sorted(decision.errors.items()))
        raise PolicyError(f"Invalid parameters for {decision.method} {decision.template}: {details}. Nothing was "
                          f"sent; api_describe shows the accepted parameters.")


def check(host: Any, method: str, path: str, params: dict[str, Any],
          read: Callable[[str], Any] | None = None) -> Decision:
    """Classify and judge one request (steps 1 and 2); raises PolicyError with the reason and
    what would allow it (and is audited)."""
    try:
        decision = classify(host, method, path, params, read)
        judge(host, decision)
    except PolicyError as exc:
        audit(host, method, path, params, "refused", error=str(exc))
        raise
    return decision


def require_gates(host: Any, gates: tuple[str, ...], what: str, reasons: list[str], method: str = "POST",
                  template: str = "") -> None:
    """Refuse when a gate the call needs is closed for this host, naming the variables that open them;
    or beyond the calling principal's reach (its hosts, its profile)."""
    _check_reach(host, gates, what)
    closed = [gate for gate in gates if not gate_open(rules_for(host), gate, method, template)]
    if closed:
        names = " and ".join(f"'{gate}'" for gate in closed)
        raise PolicyError(f"{what} on host '{host.label}' needs the {names} gate{'s' * (len(closed) > 1)} "
                          f"({'; '.join(reasons)}), which {'are' if len(closed) > 1 else 'is'} closed. The operator "
                          f"can open {'them' if len(closed) > 1 else 'it'} with "
                          f"{'; '.join(how_to_open(gate, host.label, host.product) for gate in closed)}.")


def _check_reach(host: Any, gates: tuple[str, ...], what: str) -> None:
    """A principal's reach (Reach): only its hosts, only the gates its profile allows."""
    reach = current_call().reach
    if reach is None:
        return
    if not reach.reaches(host.label):
        raise PolicyError(f"{what}: host '{host.label}' is not one of the hosts '{reach.name}' may use "
                          f"({', '.join(sorted(reach.hosts or ())) or 'none'}). Nothing was sent.")
    beyond = [gate for gate in gates if not reach.allows(gate)]
    if beyond:
        raise PolicyError(f"{what} needs the {' and '.join(repr(g) for g in beyond)} gate, beyond the profile "
                          f"'{reach.profile}' of '{reach.name}'. Nothing was sent; the operator can give "
                          f"'{reach.name}' a higher profile (docs/SECURITY.md#principals).")


# On PBS a protected guest's backups are guarded against what deletes them (the destructive gate)
# and against what leaves them to deletion: taking a snapshot's protection off (prune then removes
# it) and giving the group to another owner, who may then prune or forget it. (path regex, test on
# the call's params; docs/PROXMOX-BEHAVIOUR.md#prune-and-forget)
PBS_EXPOSING = [(r"/admin/datastore/\{store\}/protected", lambda params: not truthy(params.get("protected", "0"))),
                (r"/admin/datastore/\{store\}/change-owner", lambda _params: True)]


def guarded_on_pbs(decision: Decision) -> bool:
    """Whether a PBS call can cost a guest its backups (see PBS_EXPOSING)."""
    if decision.node_file is not None and decision.node_file[0] not in FILE_READS:
        return True  # a file written or deleted in a datastore can be a backup's
    return "destructive" in decision.gates or decision.method != "GET" and any(
        re.fullmatch(pattern, decision.template) and exposes(decision.params) for pattern, exposes in PBS_EXPOSING)


def check_protected(host: Any, decision: Decision) -> None:
    """Refuse a request that names a protected guest or reaches guests it does not list on a host
    with protected ones; refuse every guest-changing request while the list is unreadable."""
    if host.product == "pbs" and not guarded_on_pbs(decision):
        return  # on PBS only what can cost a guest its backups is guarded
    protected, scope = settings().protected, decision.scope
    if protected.error and (decision.guests or scope.bulk or decision.changed is not None):
        raise PolicyError(f"The protected-guest list could not be read ({protected.error}), so every "
                          f"request that changes a guest is refused. Fix the file and restart.")
    destroys = "destructive" in decision.gates
    for vmid, why in _protected(host, decision.guests, destroys).items():
        raise PolicyError(f"Guest {vmid}{_name(host, vmid)} is protected on host '{host.label}': {why}. This request "
                          f"is refused.")
    # what it changes without naming it meets the same three tests (the list, the tags, the flag)
    for vmid, why in _protected(host, sorted(decision.changed or {}), destroys).items():
        how = decision.changed[vmid]
        raise PolicyError(f"{decision.method} {decision.path} changes protected guest {vmid}{_name(host, vmid)} "
                          f"without naming it: {how}. Host '{host.label}' protects it: {why}. This request is refused"
                          f"{BACKUP_HINT if 'back' in how else ''}.")
    if scope.bulk and protected_vmids(host):
        raise PolicyError(f"{decision.method} {decision.path} {scope.bulk}, and host '{host.label}' has protected "
                          f"guests. List the guests explicitly, leaving out the protected ones.")


def _protected(host: Any, guests: list[int], destroys: bool) -> dict[int, str]:
    """The protected ones among `guests`, each with why, in their order: listed (the entry's name and
    reason), or as Proxmox marks them (a protected tag; its protection flag for what destroys:
    protection.marked_guests)."""
    listed = settings().protected
    found = {}
    for vmid in guests:
        entry = listed.find(host.label, vmid, host.product)
        if entry:
            found[vmid] = entry.get("reason", "no reason given")
    if found:  # refused by the list alone: nothing more is read
        return found
    return protection.marked_guests(host, list(guests), destroys, listed, current_call())


def _name(host: Any, vmid: int) -> str:
    entry = settings().protected.find(host.label, vmid, host.product) or {}
    return f" ({entry['name']})" if entry.get("name") else ""


def protected_vmids(host: Any) -> list[int]:
    """The guests a host protects without a request naming them: its list's entries and, on PVE, the
    guests that carry a protected tag (read once per call)."""
    listed = settings().protected
    return sorted({e["vmid"] for e in listed.for_host(host.label, host.product)}
                  | set(protection.tagged_guests(host, listed, current_call())))


BACKUP_HINT = ("; a protected guest may be backed up with mode=snapshot and remove=0 (a VM, or a container whose "
               "volumes can snapshot), which changes nothing on it")


def _check_exec_allowed(decision: Decision) -> None:
    """PROXMOX_EXEC_ALLOWED_VMIDS: exec, guest file access, the unblocked methods that act inside a
    guest (gates.INSIDE_GUEST) and every shell command run in a guest, whatever its gate (a read's
    pct exec runs programs there too: Decision.in_guest), reach only the listed guests."""
    allowed = settings().exec_allowed_vmids
    if allowed is None or ("exec" not in decision.gates and not inside_guest(decision.template)
                           and not decision.in_guest):
        return
    for vmid in decision.guests:
        if vmid not in allowed:
            raise PolicyError(f"Guest {vmid} is not in PROXMOX_EXEC_ALLOWED_VMIDS "
                              f"({', '.join(map(str, sorted(allowed)))}): {decision.method} {decision.path} "
                              f"is refused.")


# ================================================================ 3 to 6: dry run, confirmation, audit, send

def admit(host: Any, method: str, path: str, params: dict[str, Any], send: Callable[[Decision], Any], *,
          read: Callable[[str], Any] | None = None, plan: Callable[[Decision], dict] | None = None,
          decision: Decision | None = None, client: Any = None) -> Any:
    """The one admission step: classify and judge (or take a shell's `decision`), then dry run,
    confirmation, audit, and `send(decision)`. Reads are neither confirmed nor audited. A write
    gets a receipt, read through `client` (the HTTP client: receipts.start)."""
    try:
        decision = decision or classify(host, method, path, params, read)
        judge(host, decision)
    except PolicyError as exc:
        audit(host, method, path, params, "refused", error=str(exc))
        raise
    if decision.gates == ("read",) or follows_confirmed(host, decision):
        return mask_answer(send(decision), decision.secrets)
    audited = audited_params(decision)
    # planning and a dry run hold back what changes something or needs the user's yes; a sensitive read
    # changes nothing (and the preview of a dry run reads the current state that way), but a GET a tool
    # raised above it (a download it saves to disk: write_restore_file) does
    holds_back = decision.method != "GET" or decision.confirm or set(decision.gates) - {"read", "sensitive"}
    if current_call().planning and holds_back:  # the plan the user is asked about: nothing is sent
        raise DryRun({}, [(host, decision), *_follow_ups(host, decision, read)])
    if (current_call().dry_run or settings().dry_run) and holds_back:
        audit(host, decision.method, decision.path, audited, "dry_run")
        raise DryRun(plan(decision) if plan else default_plan(host, decision), [(host, decision)])
    _confirm(host, [decision])
    result = _send_audited(host, decision, audited, send, client)
    if decision.confirm and calls.in_call():  # what a follow-up in this call may read
        confirmed = (host.product, host.label, decision.path, (result or {}).get("pid") if isinstance(result, dict)
                     else None)
        current_call().confirmed.append(confirmed)
    return result


def _follow_ups(host: Any, decision: Decision, read: Callable[[str], Any] | None) -> list[tuple[Any, Decision]]:
    """What the admission sends after this request's yes, declared with it: the older safety
    snapshots the rule removes (receipts.follow_ups), where the gate that removes them is open."""
    if not gate_open(rules_for(host), "destructive"):
        return []
    planned = []
    for method, path, params in receipts.follow_ups(settings().receipts, host.label, decision):
        try:
            planned.append((host, check(host, method, path, params, read)))
        except PolicyError:
            continue  # refused when it comes: the answer names what was kept
    return planned


def sent_by_writer(host: Any, decision: Decision) -> bool:
    """A read that goes with the write token: the output of an exec this call confirmed (FOLLOW_UPS),
    and a write tool's guest agent read the reader lacks the privilege for. The README's reader
    (PVEAuditor) holds VM.GuestAgent.Audit only, where exec-status needs VM.GuestAgent.Unrestricted
    and file-read VM.GuestAgent.FileRead (PVE 9), and every agent call VM.Monitor on PVE 8
    (docs/PROXMOX-BEHAVIOUR.md#agent-privileges-by-version)."""
    if decision.method != "GET" or not getattr(host, "write_token_id", None) or host.product != "pve":
        return False
    if follows_confirmed(host, decision):
        return True
    check = (decision.entry or {}).get("check")
    return ("/agent/" in decision.template and str(current_call().tool or "").startswith("write_")
            and bool(check) and missing_privileges(host, check, decision.path_params) is not None)


def follows_confirmed(host: Any, decision: Decision) -> bool:
    """A read that follows a call the user confirmed in this same tool call (FOLLOW_UPS): the output
    of that exec, on the same host and guest, by its pid."""
    if decision.method != "GET":
        return False
    for pattern, confirmed_pattern in FOLLOW_UPS.items():
        if not re.fullmatch(pattern, decision.template):
            continue
        guest = decision.path.rsplit("/agent/", 1)[0]
        return any(product == host.product and label == host.label and re.fullmatch(confirmed_pattern, path)
                   and path.rsplit("/agent/", 1)[0] == guest and str(pid) == str(decision.params.get("pid"))
                   for product, label, path, pid in current_call().confirmed)
    return False


def audited_params(decision: Decision) -> dict[str, Any]:
    """What an audit line shows of a request's parameters (contents as size and hash)."""
    return decision.audit_params if decision.audit_params is not None else decision.params


# ================================================================ 4. confirmation: plan, ask, apply

def approval_key(host: Any, decision: Decision) -> str:
    """What the user's yes is pinned to: the host, the method, the path and every parameter, and
    what the decision was judged with (a stored job), so that a changed request is asked again; and who
    asks (the principal), so that one principal's yes never stands for another's. A `digest` parameter is
    left out: it only makes Proxmox refuse a request whose object changed, so a step declared before the
    state it names exists (client.plan) is the step then sent with it."""
    params = {k: v for k, v in decision.params.items() if k != "digest"}
    return hashlib.sha256(json.dumps([host.product, host.label, decision.method, decision.path, params,
                                      _payload(decision), decision.basis, current_call().principal],
                                     sort_keys=True, default=str).encode()).hexdigest()


def _payload(decision: Decision) -> dict[str, Any]:
    """What a shell decision sends beside its command (file contents, stdin: audit_params), by hash: a
    yes to writing one text is no yes to writing another (docs/REVIEW-SECURITY.md F07)."""
    return {k: hashlib.sha256(v).hexdigest() if isinstance(v, bytes) else v
            for k, v in (decision.audit_params or {}).items()}


def plan_digest(plan: list[tuple[Any, Decision]]) -> str:
    """A short name for a whole plan, shown in the question: another plan is another question."""
    return hashlib.sha256("".join(approval_key(h, d) for h, d in plan).encode()).hexdigest()[:10]


# Standing yeses: what the user said yes to once and that stands while its object lives, for the
# principal who said it (an open terminal: what is typed into it; docs/SECURITY.md#terminals), and
# never longer than STANDING_SECONDS from the yes (docs/REVIEW-SECURITY.md F09: a standing yes kept alive
# by use would stand for hours). standing key -> (the principal whose yes it is (None: the single-user
# form), until when by its clock, the clock).
STANDING_SECONDS = 60 * 60
_standing = runtime.slot("policy.standing", dict[str, tuple[Any, float, Callable[[], float]]])


def grant_standing(key: str, clock: Callable[[], float] = time.monotonic) -> Callable[[], None]:
    """The user's yes to the call now running stands for the decisions carrying `key` for
    STANDING_SECONDS by `clock`, or until the function this returns takes it back."""
    granted = _standing.get()
    granted[key] = (current_call().principal, clock() + STANDING_SECONDS, clock)
    return lambda: granted.pop(key, None)


def _stands(decision: Decision) -> bool:
    """Whether a standing yes of this call's principal covers the decision, and has not run out."""
    grant = _standing.get().get(decision.standing) if decision.standing is not None else None
    if grant is None:
        return False
    principal, until, clock = grant
    return principal == current_call().principal and clock() < until


def _confirm(host: Any, decisions: list[Decision], summary: str = "") -> None:
    """Step 4: the requests that need the user's yes and were not in the plan the user approved
    (nor covered by a standing yes) are put to the call's confirmation step
    (confirmation.confirmer); a refusal is audited."""
    approved = current_call().approved
    pending = [d for d in decisions if d.confirm and approval_key(host, d) not in approved and not _stands(d)]
    if not pending:
        return
    try:
        confirm = current_call().confirm
        if confirm is None:
            raise ConfirmationNeeded(f"{pending[0].method} {pending[0].path} is {pending[0].gate} and needs the "
                                     f"user's confirmation, which this caller cannot give.")
        confirm(host, pending, summary)
    except PolicyError as exc:
        # not the question: it shows what would be sent (a file's text), which the audit line keeps as a hash
        why = "the user's yes is missing" if isinstance(exc, ConfirmationNeeded) else str(exc)
        for decision in pending:
            audit(host, decision.method, decision.path, audited_params(decision), "refused", error=why)
        raise
    current_call().approved.update(approval_key(host, d) for d in pending)


def plan_steps(host: Any, steps: list[tuple[str, str, dict[str, Any]]], summary: str,
               read: Callable[[str], Any] | None = None, prepared: list[Decision] = ()) -> list[Decision]:
    """A tool that sends several requests declares, before the first, those it can name already
    (the restore drill: the start, stop and delete of its scratch guest; an update: the shell
    commands it runs, as `prepared` shell decisions) and the whole plan in words: they are judged
    now, each on what the steps before it leave (batch.py), a dry run shows them, and those that need
    the user's yes are asked together, once, before anything is sent."""
    overlay, decisions = batch.Overlay(read, host.product), []
    for method, path, params in steps:  # each judged on what the steps before it leave (batch.py)
        decisions.append(check(host, method, path, params, overlay.read))
        overlay.fold(decisions[-1])
    for decision in prepared:
        try:
            judge(host, decision)
        except PolicyError as exc:
            audit(host, decision.method, decision.path, audited_params(decision), "refused", error=str(exc))
            raise
        decisions.append(decision)
    writes = [d for d in decisions if d.gates != ("read",)]
    writes += [after for d in list(writes) for _, after in _follow_ups(host, d, read)]
    if current_call().planning:
        raise DryRun({}, [(host, d) for d in writes], summary)
    if current_call().dry_run or settings().dry_run:
        for decision in writes:
            audit(host, decision.method, decision.path, audited_params(decision), "dry_run")
        raise DryRun({"dry_run": True, "host": host.label, "plan": summary,
                      "steps": [default_plan(host, d) for d in writes],
                      "needs_confirmation": any(d.confirm for d in writes)}, [(host, d) for d in writes], summary)
    _confirm(host, writes, summary)
    return decisions


@dataclass
class Plan:
    """What a call would send that needs the user's yes, found before it runs (plan_call)."""
    decisions: list[tuple[Any, Decision]] = field(default_factory=list)
    summary: str = ""


def plan_call(function: Callable[..., Any], arguments: dict[str, Any], tool: str, caller: dict | None = None) -> Plan:
    """Run a tool as far as its first write (or its declared plan_steps) without sending it: the
    requests it would send that need the user's yes. Nothing is sent but reads (a sensitive one is
    audited as sent), no refusal or dry run audited; a call that fails before its first write needs no
    question (it fails again when it runs). A tool that sends a request needing the yes after another
    write must declare its steps first (client.plan): on 2026-07-28 a yes cannot be asked mid-call."""
    token = CALL.set(Call(tool=tool, planning=True, **(caller or {})))  # caller: the principal and its reach
    try:
        function(**arguments)
    except DryRun as planned:
        confirmed = [(host, decision) for host, decision in planned.decisions
                     if decision.confirm and not _stands(decision)]
        return Plan(confirmed, planned.summary if confirmed else "")
    except ToolFailure:
        return Plan()
    finally:
        CALL.reset(token)
    return Plan()


def _send_audited(host: Any, decision: Decision, audited: dict[str, Any], send: Callable[[Decision], Any],
                  client: Any = None) -> Any:
    """The receipt started (the state before, a safety snapshot where due), an audit line before
    sending (if it cannot be written, nothing is sent), one after (if that fails, the answer says
    so), the receipt kept."""
    try:
        receipt = receipts.start(settings().receipts, host, decision, client, current_call())
    except ToolFailure as exc:
        audit(host, decision.method, decision.path, audited, "refused", error=str(exc))
        raise
    try:
        line = audit(host, decision.method, decision.path, audited, "sending", strict=True,
                     receipt=receipt.id if receipt else None)
    except OSError as exc:
        raise PolicyError(f"The audit log {settings().audit_path} cannot be written ({exc.strerror or exc}); "
                          f"{decision.method} {decision.path} was NOT sent. Fix the file's directory or "
                          f"permissions, or point PROXMOX_AUDIT_LOG elsewhere.") from None
    started = time.monotonic()
    try:
        result = send(decision)
    except ToolFailure as exc:
        _audit_after(host, decision, audited, "failed", error=str(exc), started=started)
        raise
    finally:  # what the call read before may have changed (calls.Reads): the receipt's state after is read anew
        current_call().reads.clear()
    _audit_after(host, decision, audited, "sent", result=result if isinstance(result, str) else "ok", started=started)
    _keep_receipt(receipt, result, line)
    return mask_answer(result, decision.secrets)


def _keep_receipt(receipt: receipts.Pending | None, result: Any, line: str | None) -> None:
    """The call's receipt, with this write as its latest step, named in the call's answer; one that
    cannot be written is a note."""
    if receipt is None:
        return
    try:
        receipt.finish(result, line)
    except OSError as exc:
        current_call().notes.append(f"The request was sent, but its receipt could not be written "
                                    f"({exc.strerror or exc}).")
        return
    if receipt.id not in current_call().receipts:
        current_call().receipts.append(receipt.id)


def _audit_after(host: Any, decision: Decision, audited: dict[str, Any], verdict: str, **details: Any) -> None:
    try:
        audit(host, decision.method, decision.path, audited, verdict, strict=True, **details)
    except OSError as exc:
        current_call().notes.append(f"The request was sent ({verdict}), but its audit line could not be written to "
                     f"{settings().audit_path} ({exc.strerror or exc}).")


def default_plan(host: Any, decision: Decision) -> dict:
    """What a dry run answers when the caller has no richer plan (the shell tools)."""
    return {"dry_run": True, "host": host.label, "run": decision.path, "gate": "+".join(decision.gates),
            "why": decision.reasons, "guests": decision.guests, "needs_confirmation": decision.confirm}


# ================================================================ audit

def audit(host: Any, method: str, path: str, params: dict[str, Any], verdict: str, *, strict: bool = False,
          result: str | None = None, error: str | None = None, started: float | None = None,
          receipt: str | None = None) -> str | None:
    """Record a write, exec, refusal or dry run in the audit log: masked, contents as size and
    keyed hash (audit_key; see audit.py for the file); the line's hash is its id. With `strict` a
    failure to write raises OSError."""
    if settings().audit_path is None or current_call().planning and verdict in ("refused", "dry_run"):
        return None
    record = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": host.label,
              "product": host.product, "tool": current_call().tool, "method": method, "path": mask(path),
              "params": audit_view(params, audit_key()), "verdict": verdict,
              "principal": current_call().principal}
    if result is not None:
        record["result"] = mask(str(result))
    if error is not None:
        record["error"] = mask(error)[:500]
    if started is not None:
        record["ms"] = int((time.monotonic() - started) * 1000)
    if receipt is not None:
        record["receipt"] = receipt
    try:
        audit_log.append(settings().audit_path, record)
    except OSError:
        if strict:
            raise
        return None
    return record["hash"]


# audit log path -> the key its hashes of contents are made with (b"": none could be made)
_audit_keys = runtime.slot("policy.audit_keys", dict[str, bytes])


def audit_key() -> bytes:
    """The audit log's key for contents (state.Database.key("audit"), beside the state database): the
    log records what was typed or written as size and HMAC, never a plain hash, since the hash of a short
    text (a password typed at a prompt) can be tested against guesses (docs/REVIEW-SECURITY.md F16).
    Where no key can be made, b"": the size only."""
    path = str(settings().audit_path)
    keys = _audit_keys.get()
    if path not in keys:
        try:
            keys[path] = state.Database(state.path_for(Path(path))).key("audit")
        except OSError:
            keys[path] = b""
    return keys[path]
