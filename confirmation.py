"""The user's yes, at the MCP edge (docs/SECURITY.md#confirmation): before a tool that can need it
runs, for a client that can ask its user, the requests it would send are planned (policy.plan_call) and
the user is asked about that plan once, with its digest; a request that needs the yes and was not in the
plan is asked in the middle of the call (before 2026-07-28) or refused so that the next call asks. A
client that cannot ask gives the yes with confirm=true. server.as_tool wires this into every tool.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import inspect
import json
import re
import typing
from typing import Annotated, Any, Callable

import anyio.from_thread
from mcp.server.elicitation import ElicitationResult
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.resolve import Elicit, Resolve
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, Field

import calls
import inventory
import policy
import proxmox_client
from auth import principal
from errors import ConfirmationNeeded, PolicyError, ToolFailure
from masking import MASK, mask, mask_params

SHOWN = 300  # characters: a longer value or text is shown as its size and hash
PUBLIC_KEY = re.compile(r"((?:sk-)?(?:ssh|ecdsa)-[\w@.-]+) ([A-Za-z0-9+/]+={0,2})(?: (.*))?")


class Confirmation(BaseModel):
    confirm: bool = Field(description="Yes, do it")


def can_elicit(ctx: Any) -> bool:
    """Whether the user can be asked: the client declared elicitation, and the connection can
    carry the question (on 2026-07-28 inside the call's input-required round trip; before it as a
    request to the client in the middle of the call). See docs/SECURITY.md#confirmation."""
    try:
        capabilities = ctx.client_capabilities
        return bool(policy.settings().elicit and capabilities and capabilities.elicitation) and \
            (asks_by_round_trip(ctx) or ctx.session.can_send_request)
    except (AttributeError, ValueError):
        return False


def asks_by_round_trip(ctx: Any) -> bool:
    """Whether the call speaks 2026-07-28 or later (questions and notifications travel otherwise)."""
    return getattr(ctx, "protocol_version", None) in MODERN_PROTOCOL_VERSIONS


def plan_resolver(function: Callable) -> Callable:
    """Before a tool that can need confirmation runs, for a client that can ask its user: the
    requests it would send (policy.plan_call), recomputed on every round of the call."""
    def plan(ctx: Any, **arguments: Any) -> policy.Plan:
        if arguments.get("dry_run") or policy.settings().dry_run or not can_elicit(ctx):
            return policy.Plan()
        return policy.plan_call(function, arguments | {"ctx": None}, function.__name__, principal.call_fields())
    return _resolver(plan, function, f"plan_{function.__name__}")


def approval_resolver(function: Callable, plan: Callable) -> Callable:
    """The question about the whole plan; on 2026-07-28 the SDK carries it in the input-required
    round trip and, on the retry, takes the answer only if the question (the plan, with its
    digest) is unchanged; before that revision it asks in the middle of the call."""
    def approval(found: Annotated[policy.Plan, Resolve(plan)]) -> Any:
        return Elicit(describe_plan(found.decisions, found.summary), Confirmation) if found.decisions else None
    approval.__annotations__ = {"found": Annotated[policy.Plan, Resolve(plan)]}
    approval.__qualname__ = approval.__name__ = f"approve_{function.__name__}"
    return approval


def _resolver(body: Callable, function: Callable, name: str) -> Callable:
    """`body` with the tool's own arguments by name (how the SDK hands resolvers a call's arguments)."""
    names = [n for n in inspect.signature(function).parameters if n != "ctx"]
    body.__signature__ = inspect.Signature(
        [inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context)]
        + [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY) for n in names])
    body.__annotations__ = {"ctx": Context}
    body.__qualname__ = body.__name__ = name
    return body


def with_confirmation(tool: Callable, function: Callable) -> Callable:
    """A tool that can need the user's yes gets two parameters the SDK fills before it runs and
    that are not in its input schema: the plan and the user's answer to it."""
    plan = plan_resolver(function)
    signature = inspect.signature(tool)
    answer = Annotated[ElicitationResult[Confirmation], Resolve(approval_resolver(function, plan))]
    extra = [inspect.Parameter("confirmation_plan", inspect.Parameter.KEYWORD_ONLY,
                               annotation=Annotated[policy.Plan, Resolve(plan)]),
             inspect.Parameter("user_answer", inspect.Parameter.KEYWORD_ONLY, annotation=answer)]
    tool.__signature__ = signature.replace(parameters=[*signature.parameters.values(), *extra])
    tool.__annotations__ = typing.get_type_hints(function, include_extras=True) | {
        "confirmation_plan": Annotated[policy.Plan, Resolve(plan)], "user_answer": answer}
    return tool


def approved(plan: policy.Plan | None, answer: Any) -> set[str]:
    """The approval keys of a plan the user said yes to; a refusal of it raises (and is audited)."""
    if plan is None or not plan.decisions:
        return set()
    data = getattr(answer, "data", None)
    if getattr(answer, "action", None) == "accept" and isinstance(data, Confirmation) and data.confirm:
        return {policy.approval_key(host, decision) for host, decision in plan.decisions}
    why = f"The user did not confirm ({getattr(answer, 'action', 'no answer')}); nothing was done."
    for host, decision in plan.decisions:
        policy.audit(host, decision.method, decision.path, policy.audited_params(decision), "refused", error=why)
    raise PolicyError(why)


def confirmer(confirmed: bool, ctx: Any) -> Callable:
    """The policy's confirmation step for requests that need the user's yes and were not in the
    plan the user approved before the call ran. A client that can ask is never answered by
    confirm=true: before 2026-07-28 the user is asked now, in the middle of the call; on
    2026-07-28 the question can only come before the call runs, so the request is refused and
    the next call asks. confirm=true stands in only for clients that cannot ask (or
    PROXMOX_ELICIT=false)."""
    def confirm(host: Any, decisions: list[policy.Decision], summary: str = "") -> None:
        question = describe_plan([(host, d) for d in decisions], summary)
        if ctx is not None and can_elicit(ctx):
            if asks_by_round_trip(ctx):
                raise ConfirmationNeeded(f"Not sent: the user confirmed another plan than this one, which came up "
                                         f"while the call ran ({question}). Call the tool again: the user is "
                                         f"asked about the plan as it is now.")
            ask_user(ctx, question)
        elif not confirmed:
            raise ConfirmationNeeded(f"Confirmation needed: {question} Ask the user; if they agree, call again "
                                     f"with confirm=true.")
    return confirm


def ask_user(ctx: Any, message: str) -> None:
    """Ask the user in the middle of a call (before 2026-07-28); anything but a yes refuses."""
    try:
        answer = anyio.from_thread.run(ctx.elicit, message, Confirmation)
    except Exception as exc:  # a client that fails to answer means no
        raise PolicyError(f"Asking the user failed ({exc}); nothing was done.") from None
    finally:  # what the call read before the question may have changed while the user read it
        calls.current().reads.clear()
    if not (answer.action == "accept" and answer.data is not None and answer.data.confirm):
        raise PolicyError(f"The user did not confirm ({answer.action}); nothing was done.")


def describe_plan(plan: list[tuple[Any, policy.Decision]], summary: str = "") -> str:
    """The question: the plan in words when the tool declared one, each request that needs the
    yes by its exact target (name and vmid) and consequence, and the plan's digest (another plan
    is another question)."""
    lines = [describe_request(host, decision) for host, decision in plan]
    text = lines[0] if len(lines) == 1 else " ".join(f"{n}) {line}" for n, line in enumerate(lines, 1))
    return f"{summary + ' ' if summary else ''}{text} (plan {policy.plan_digest(plan)})"


def describe_request(host: Any, decision: policy.Decision) -> str:
    """One request in words: the exact target by name and vmid, and the consequence."""
    names = {}
    if decision.guests and host.product == "pve":
        try:
            names = {g["vmid"]: g.get("name") for g in inventory.guest_resources(
                proxmox_client.client_for("pve", host.label))}
        except ToolFailure:
            pass
    targets = ", ".join(f"{names.get(v) or 'guest'} (vmid {v})" for v in decision.guests)
    on = f" on {targets}" if targets else ""
    gates = " + ".join(g.upper() for g in decision.gates if g not in ("read", "sensitive", "lifecycle", "write"))
    return (f"{gates or decision.gate.upper()}: {decision.method} {decision.path}{on}, host '{host.label}'."
            f"{sends(decision)} Consequence: {'; '.join(decision.reasons)}.")


def sends(decision: policy.Decision) -> str:
    """What the request sends, for the question (docs/REVIEW-SECURITY.md F07: the user is asked about
    exactly what will be sent): its parameters, secrets masked; a shell's file contents or stdin; a
    long value as its size and hash."""
    shown = [f"{name}={_value(value)}" for name, value in mask_params(
        {k: v for k, v in decision.params.items() if k != "digest"}).items()]
    shown += [f"{name}: {_value(value)}" for name, value in (decision.audit_params or {}).items()]
    return f" Sends {'; '.join(shown)}." if shown else ""


def _value(value: Any) -> str:
    """One value as the question shows it: a public key by its fingerprint, a short text as it is
    (masked), anything longer as its size and SHA-256."""
    if value == MASK:
        return value
    data = value if isinstance(value, bytes) else (value if isinstance(value, str) else json.dumps(value)).encode()
    text = data.decode("utf-8", "replace")
    keys = [_public_key(line) for line in text.splitlines() if line.strip()]
    if keys and all(keys):
        return ", ".join(keys)
    if len(text) > SHOWN or "\ufffd" in text:
        return f"{len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()[:16]}"
    return json.dumps(mask(text)) if isinstance(value, (str, bytes)) else mask(text)  # quoted, escaped: no look-alikes


def _public_key(line: str) -> str | None:
    """An OpenSSH public key line as ssh-keygen -l names it (type, SHA256 fingerprint, comment); None
    for any other line."""
    found = PUBLIC_KEY.fullmatch(line.strip())
    if found is None:
        return None
    try:
        blob = base64.b64decode(found.group(2), validate=True)
    except (binascii.Error, ValueError):
        return None
    fingerprint = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    comment = f" {json.dumps(mask(found.group(3)))}" if found.group(3) else ""
    return f"{found.group(1)} key SHA256:{fingerprint}{comment}"
