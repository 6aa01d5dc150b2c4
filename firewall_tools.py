"""Firewall tools: what the firewall of the cluster, a node or a guest holds and whether it filters
at all, and changes to one rule or to the options (docs/PROXMOX-BEHAVIOUR.md#firewall).

A firewall filters only where every level is on: the cluster's `enable`, then a node's own (on
unless set to 0) for the node, or a guest's option `enable` (off unless set) and `firewall=1` on the
NIC for a guest. Every change passes the policy, whose firewall guard (firewall_guard.py) refuses
what would cut this server off a node's management ports.
"""
import re
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context
from pydantic import Field

from answers import ConfirmArg, DryRunArg, Host, Node, OptionalVmid, capped, compact, table
from errors import InvalidArgument, PolicyError, ProxmoxError
from inventory import check_node, guest_path
from proxmox_client import ProxmoxClient, pve_client
from receipts import is_rule

RULE_COLUMNS = ["pos", "type", "action", "match", "source", "dest", "iface", "enable", "comment"]
RULE_KEYS = ("type", "action", "macro", "iface", "source", "dest", "proto", "enable", "log", "sport", "dport",
             "comment", "icmp-type")
Policy = Literal["ACCEPT", "DROP", "REJECT"]
SHOWN_RULES = 50  # rules a listing shows, in order; the rest are counted and api_read lists them


def _level(client: ProxmoxClient, node: str | None, vmid: int | None) -> tuple[str, str, dict | None]:
    """(API path of the firewall, the level in words, the guest's resources row or None)."""
    if vmid is not None:
        base, row = guest_path(client, vmid)
        return f"{base}/firewall", f"guest {vmid}", row
    if node is not None:
        return f"/nodes/{check_node(client, node)}/firewall", f"node {node}", None
    return "/cluster/firewall", "cluster", None


def _on(value: Any, default: int) -> bool:
    return str(value if value is not None else default).lower() not in ("0", "false", "")


def _filtering(client: ProxmoxClient, base: str, options: dict, row: dict | None) -> dict:
    """Whether the firewall filters at this level: every level above must be on too
    (docs/PROXMOX-BEHAVIOUR.md#firewall)."""
    cluster = options if base == "/cluster/firewall" else client.get("/cluster/firewall/options") or {}
    state: dict[str, Any] = {"cluster": _on(cluster.get("enable"), 0)}
    if row is not None:
        config = client.get(f"/nodes/{row['node']}/{row['type']}/{row['vmid']}/config") or {}
        state["guest"] = _on(options.get("enable"), 0)
        state["nics"] = {k: "firewall=1" in str(v) for k, v in sorted(config.items()) if re.fullmatch(r"net\d+", k)}
        state["filters"] = [nic for nic, on in state["nics"].items() if on and state["cluster"] and state["guest"]]
    elif base != "/cluster/firewall":
        state["node"] = _on(options.get("enable"), 1)
        state["filters"] = state["cluster"] and state["node"]
    else:
        nodes = [n["node"] for n in client.get("/nodes") or [] if n.get("status") == "online"]
        state["nodes"] = {n: _on((client.get(f"/nodes/{n}/firewall/options") or {}).get("enable"), 1) for n in nodes}
        state["filters"] = state["cluster"]
    return state


def _why_not(level: str, state: dict) -> str | None:
    """Why a level's rules filter nothing now, in words; None when they filter."""
    if state["filters"]:
        return None
    missing = [] if state["cluster"] else ["the cluster firewall is off (write_set_firewall_options enable=true)"]
    if state.get("node") is False:
        missing.append(f"{level}'s firewall is off")
    if state.get("guest") is False:
        missing.append(f"{level}'s option enable is off")
    if "nics" in state and not any(state["nics"].values()):
        missing.append("no NIC has firewall=1 (write_set_nic firewall=true)")
    return f"The firewall of {level} filters nothing now: {'; '.join(missing)}."


def _rule_row(rule: dict) -> dict:
    match = rule.get("macro") or " ".join(str(rule[k]) for k in ("proto", "dport") if rule.get(k)) or "any"
    if rule.get("sport"):
        match += f" sport {rule['sport']}"
    if rule.get("icmp-type"):
        match += f" {rule['icmp-type']}"
    return {k: v for k, v in rule.items() if k != "digest"} | {"match": match, "enable": int(rule.get("enable") or 0)}


def _rules_table(rules: list[dict], base: str) -> dict:
    shown = table(RULE_COLUMNS, [_rule_row(r) for r in rules], limit=SHOWN_RULES)
    if shown.pop("next_offset", None) is not None:
        shown["next"] = f"api_read path={base}/rules lists every rule with its pos"
    return shown


def _sets(client: ProxmoxClient, base: str) -> dict:
    """IP sets (a `!` marks a nomatch entry; each cut at LIST_CAP) and aliases of the cluster or a guest."""
    ipsets = {s["name"]: capped([("!" if e.get("nomatch") else "") + e["cidr"]
                                 for e in client.get(f"{base}/ipset/{s['name']}") or []])
              for s in client.get(f"{base}/ipset") or []}
    aliases = {a["name"]: a["cidr"] for a in client.get(f"{base}/aliases") or []}
    return compact({"ipsets": ipsets, "aliases": aliases})


def firewall_rules(host: Host = None, node: Node = None, vmid: OptionalVmid = None) -> dict:
    """Rules, options, IP sets, aliases; whether it filters."""
    client = pve_client(host)
    base, level, row = _level(client, node, vmid)
    options = client.get(f"{base}/options") or {}
    rules = client.get(f"{base}/rules") or []
    answer = {"level": level, "filtering": _filtering(client, base, options, row),
              "options": {k: v for k, v in options.items() if k != "digest"},
              "rules": _rules_table(rules, base), "digest": rules[0]["digest"] if rules else None}
    if node is None:
        answer |= _sets(client, base)
    if level == "cluster":
        answer["groups"] = {g["group"]: capped([_rule_row(r)["match"] + f" {r['type']} {r['action']}"
                                                for r in client.get(f"{base}/groups/{g['group']}") or []])
                            for g in client.get(f"{base}/groups") or []}
    return compact(answer)


# ---------------------------------------------------------------- changes

def _checked_rule(rule: dict | None, needed: bool) -> dict[str, Any]:
    if rule is None:
        if needed:
            raise InvalidArgument('`rule` is needed, e.g. {"type": "in", "action": "ACCEPT", "proto": "tcp", '
                                  '"dport": "22", "source": "192.0.2.0/24"}.')
        return {}
    unknown = sorted(set(rule) - set(RULE_KEYS) - {"delete", "moveto"})
    if unknown:
        raise InvalidArgument(f"Unknown rule field(s) {', '.join(unknown)}; a rule has {', '.join(RULE_KEYS)} "
                              f"(and, to update, `delete` to drop fields or `moveto` to move it).")
    if rule.get("type", "in") != "group" and rule.get("action", "ACCEPT") not in ("ACCEPT", "DROP", "REJECT"):
        raise InvalidArgument(f"Rule action {rule['action']!r}: an in/out rule takes ACCEPT, DROP or REJECT "
                              f"(type group takes a security group's name).")
    return {k: int(v) if isinstance(v, bool) else v for k, v in rule.items()}


def _current(client: ProxmoxClient, base: str, pos: int | None, digest: str | None) -> tuple[list[dict], str | None]:
    """The rules as they are now; the position and the caller's digest checked against them."""
    try:
        rules = client.get(base) or []
    except ProxmoxError as exc:
        raise InvalidArgument(f"{base} could not be read ({exc}); firewall_rules lists what exists.") from None
    now = rules[0]["digest"] if rules else None
    if digest and digest != now:
        raise InvalidArgument("The rules changed since you read them (digest differs): read firewall_rules again "
                              "and take pos and digest from there.")
    if pos is not None and pos >= len(rules):
        raise InvalidArgument(f"No rule at pos {pos}: there are {len(rules)} (pos 0 to {len(rules) - 1}).")
    return rules, now


def _ours_at(client: ProxmoxClient, base: str, pos: int, rule: dict[str, Any]) -> str | None:
    """The list's digest, once the rule at `pos` is the one just added: create_rule checks no digest
    (pve-firewall API2/Firewall/Rules.pm), so a rule another added meanwhile would be moved or enabled
    instead (docs/PROXMOX-BEHAVIOUR.md#firewall-rules)."""
    rules, digest = _current(client, base, None, None)
    if not is_rule(rules[pos] if pos < len(rules) else {}, rule):
        raise ProxmoxError(f"Rule {pos} of {base} is not the rule just added: the list changed meanwhile. The "
                           f"rule was added disabled; find it with firewall_rules.")
    return digest


def _add(client: ProxmoxClient, base: str, rule: dict[str, Any], pos: int | None, count: int) -> int:
    """A new rule lands on top, disabled unless `enable` is given (docs/PROXMOX-BEHAVIOUR.md#firewall-rules):
    lower down it is added disabled, moved, then enabled, so that it never filters out of place. The
    three requests are declared before the first (client.plan): judged together, each on what the one
    before it leaves, shown together by a dry run and asked about once."""
    enable = int(rule.pop("enable", 1))
    if not pos:
        client.request("POST", base, rule | {"enable": enable})
        return 0
    placed = min(pos, count)
    steps = [("POST", base, rule | {"enable": 0}), ("PUT", f"{base}/0", {"moveto": pos + 1})]
    steps += [("PUT", f"{base}/{placed}", {"enable": 1})] if enable else []
    client.plan(steps, f"Add the rule at pos {placed}: Proxmox puts a new rule on top, so it is added disabled, "
                       f"moved to pos {placed}{', then enabled' if enable else ' and left disabled'}.")
    client.request("POST", base, rule | {"enable": 0})
    client.request("PUT", f"{base}/0", {"moveto": pos + 1, "digest": _ours_at(client, base, 0, rule)})
    if enable:
        try:
            client.request("PUT", f"{base}/{placed}", {"enable": 1, "digest": _ours_at(client, base, placed, rule)})
        except PolicyError as exc:
            raise PolicyError(f"{exc} The rule was added at pos {placed} but left disabled: delete it "
                              f"(write_edit_firewall_rule action=delete pos={placed}) or leave it off.") from None
    return placed


def write_edit_firewall_rule(action: Literal["add", "update", "delete", "move"], host: Host = None, node: Node = None,
                        vmid: OptionalVmid = None, pos: Annotated[int | None, Field(ge=0)] = None,
                        rule: dict | None = None, digest: str | None = None,
                        dry_run: DryRunArg = False, confirm: ConfirmArg = False, ctx: Context | None = None) -> dict:
    """Add (at pos, default top), update, move (rule.moveto) or delete a rule; digest from firewall_rules."""
    client = pve_client(host)
    firewall, level, row = _level(client, node, vmid)
    base = f"{firewall}/rules"
    fields = _checked_rule(rule, action in ("add", "update"))
    moveto = fields.pop("moveto", None)
    if action != "add" and pos is None:
        raise InvalidArgument(f"`pos` is needed to {action} a rule; firewall_rules lists them with their pos.")
    if action == "move" and not str(moveto).isdigit():
        raise InvalidArgument('A move needs rule={"moveto": N}: the position the rule should take.')
    rules, now = _current(client, base, pos if action != "add" else None, digest)
    if action == "add":
        pos = _add(client, base, fields, pos, len(rules))
    elif action == "delete":
        client.request("DELETE", f"{base}/{pos}", {"digest": now})
        return {"level": level, "deleted": _rule_row(rules[pos]), "rules_left": len(rules) - 1, "result": "ok"}
    elif action == "move":  # the API's moveto puts it before the rule there now (Rules.pm update_rule)
        moveto = int(moveto)
        client.request("PUT", f"{base}/{pos}", {"moveto": moveto if moveto < pos else moveto + 1, "digest": now})
        pos = min(moveto, len(rules) - 1)
    else:
        client.request("PUT", f"{base}/{pos}", fields | {"digest": now})
    after = client.get(base) or []
    note = _why_not(level, _filtering(client, firewall, client.get(f"{firewall}/options") or {}, row))
    return compact({"level": level, "pos": pos, "rule": _rule_row(after[pos]) if pos < len(after) else None,
                    "rules": len(after), "result": "ok", "note": note})


def write_set_firewall_options(host: Host = None, node: Node = None, vmid: OptionalVmid = None,
                           enable: bool | None = None, policy_in: Policy | None = None,
                           policy_out: Policy | None = None, dry_run: DryRunArg = False,
                           confirm: ConfirmArg = False, ctx: Context | None = None) -> dict:
    """Enable, disable, set policies."""
    client = pve_client(host)
    base, level, row = _level(client, node, vmid)
    if node is not None and vmid is None and (policy_in or policy_out):
        raise InvalidArgument("A node has no policy of its own: the cluster's policy_in and policy_out apply to "
                              "every node. Leave node out to set them.")
    changes = compact({"enable": None if enable is None else int(enable), "policy_in": policy_in,
                       "policy_out": policy_out})
    if not changes:
        raise InvalidArgument("Nothing to change: give enable, policy_in or policy_out.")
    before = client.get(f"{base}/options") or {}
    client.request("PUT", f"{base}/options", changes | {"digest": before.get("digest")})
    after = client.get(f"{base}/options") or {}
    state = _filtering(client, base, after, row)
    return compact({"level": level, "changed": changes, "options": {k: v for k, v in after.items() if k != "digest"},
                    "filtering": state, "result": "ok", "note": _why_not(level, state)})
