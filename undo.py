"""Taking a change back: the requests that undo a receipt (receipts.py), computed only from a
receipt that verifies (receipt_store.py) and that was made on this very host, after checking that
what it changed is still as the change left it. write_undo_change (changes.py) declares them as
one plan, so that the dry run and the user's question show exactly these requests (method, path,
parameters), and sends them through the same policy as any write.

A receipt holds every request of one tool call, in order; its undo takes them back in reverse
order. Only the last request that touched an object is checked against what the object is now;
an earlier one is taken back from the state the later ones' undo leaves (their `before`), so the
digest the undo sends is the current one on its first request to each object and none after. The
call's safety snapshot and the rule's removals are left alone (receipts.acting_steps).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import catalog
import config_diff
from errors import InvalidArgument, ProxmoxError, ToolFailure
from job_edits import property_string
from masking import MASK, audit_view, secret_param
from receipt_store import IMPORTED
from receipts import acting_steps, is_rule, moved_to, power_state, rule_fields, stored_object, undo_state

INVERSE_POWER = {"start": "shutdown", "stop": "start", "shutdown": "start", "suspend": "resume", "resume": "suspend"}
CONTROL = {"delete", "digest", "skiplock", "revert", "background_delay", "force", "moveto", "pos"}
UNUSED = re.compile(r"unused\d+")
SHOWN_VALUE = 120  # characters of a parameter value the question shows


@dataclass
class Undo:
    """The requests that take a receipt's change back, and the plan in words."""
    steps: list[tuple[str, str, dict[str, Any]]]
    summary: str


def check_host(receipt: dict, host: Any) -> None:
    """A receipt is taken back only on the host it was made on: the label and its URL (a receipt
    another server kept for its own host of the same label is refused)."""
    made_on = receipt.get("url")
    if made_on and getattr(host, "url", made_on) != made_on:
        raise InvalidArgument(f"Receipt {receipt['id']} was made on host '{receipt['host']}' at {made_on}; this "
                              f"server's host '{receipt['host']}' is {host.url}, which may be another cluster. "
                              f"Nothing was sent; change it there with the tools.")


def undo_plan(receipt: dict, client: Any) -> Undo:
    """The inverse of a receipt's change, after checking that its objects are as the change left
    them (raises ProxmoxError when one changed since, InvalidArgument when it cannot be taken back)."""
    rid = receipt["id"]
    if receipt.get("undone_by"):
        raise InvalidArgument(f"Receipt {rid} was taken back already (receipt {', '.join(receipt['undone_by'])}); "
                              f"take that one back to redo the change.")
    why = undo_state(receipt)
    if why is not True:
        first = (acting_steps(receipt) or receipt.get("steps") or [{}])[0]
        said = f" ({first['method']} {first['path']})" if first else ""
        raise InvalidArgument(f"Receipt {rid}{said} cannot be taken back: {why}. Nothing was sent."
                              f"{'' if why == IMPORTED else _safety_hint(receipt)}")
    steps = _followed(receipt, client)
    last = {_object_key(step): index for index, step in enumerate(steps)}
    requests = []
    for index in reversed(range(len(steps))):
        step = steps[index]
        requests += PLANNERS[step["kind"]](step, client, last[_object_key(step)] == index)
    if not requests:
        raise InvalidArgument(f"Nothing to take back: receipt {rid} left everything as it was.")
    return Undo(requests, describe(receipt, requests))


def describe(receipt: dict, requests: list[tuple[str, str, dict]]) -> str:
    """The plan in words, from the requests it sends: each with its method, path and parameters."""
    said = [f"{n}) {method} {path}" + (f" {_shown(params)}" if params else "")
            for n, (method, path, params) in enumerate(requests, 1)]
    return (f"Take back receipt {receipt['id']} ({receipt.get('tool') or 'a write'} at {receipt['time']}) by "
            f"sending {len(requests)} request(s): {'; '.join(said)}.")


def _shown(params: dict) -> str:
    view = {k: (v if len(str(v)) <= SHOWN_VALUE else str(v)[:SHOWN_VALUE - 1] + "…")
            for k, v in audit_view(params).items()}
    return json.dumps(view, separators=(",", ":"), ensure_ascii=False, default=str)


def _object_key(step: dict) -> str:
    """What a step changed: the item it made, the snapshot it took, or the object it read."""
    if step.get("item"):
        return step["item"]
    if step["kind"] == "snapshot":
        return f"{step['object']}/{step['snapshot']}"
    return step["object"] + (json.dumps(step["selectors"], sort_keys=True) if step.get("selectors") else "")


def _followed(receipt: dict, client: Any) -> list[dict]:
    """The steps as their planners read them (with the receipt's id and product), on the node
    where each guest runs now (a guest migrated since is taken back there)."""
    steps = [step | {"id": receipt["id"], "product": receipt["product"]} for step in acting_steps(receipt)]
    guests = {m.group(3): m.group(1) for step in steps
              for m in [re.match(r"/nodes/([^/]+)/(qemu|lxc)/(\d+)(/|$)", step.get("object") or "")] if m}
    if not guests:
        return steps
    try:
        rows = client.get("/cluster/resources", type="vm") or []
    except ToolFailure:
        return steps  # where they were: reading there says what is wrong
    moved = {vmid: node for vmid, node in ((str(r.get("vmid")), r.get("node")) for r in rows)
             if vmid in guests and node and node != guests[vmid]}
    return [_moved(step, moved) for step in steps]


def _moved(step: dict, moved: dict[str, str]) -> dict:
    match = re.match(r"/nodes/([^/]+)/(qemu|lxc)/(\d+)(/|$)", step.get("object") or "")
    if not match or match.group(3) not in moved:
        return step
    old, new = f"/nodes/{match.group(1)}/", f"/nodes/{moved[match.group(3)]}/"
    return step | {k: v.replace(old, new, 1) for k, v in step.items()
                   if k in ("object", "item", "path") and isinstance(v, str)}


def _safety_hint(receipt: dict) -> str:
    names = [s["safety_snapshot"] for s in receipt.get("steps") or []
             if s.get("safety_snapshot") and not str(s["safety_snapshot"]).startswith("none")]
    if names:
        return f" Its safety snapshot {names[-1]} holds the guest as it was: write_rollback_snapshot returns to it."
    return ""


def _unchanged_since(step: dict, after: Any, now: Any) -> None:
    """Refuse when the object is not as the change left it: another digest and other values (a
    restart that applied pending values changes the digest, not the values)."""
    if isinstance(after, dict) and isinstance(now, dict):
        if after.get("digest") and after.get("digest") == now.get("digest"):
            return
        differ = sorted(k for k in set(after) | set(now)
                        if not config_diff.BOOKKEEPING.fullmatch(k) and not config_diff.same(after.get(k), now.get(k)))
    else:
        differ = [] if after == now else ["its value"]
    if differ:
        raise ProxmoxError(f"{step.get('item') or step['object']} changed since receipt {step['id']}: "
                           f"another digest, and {', '.join(differ[:8])} differ from what the change left, so taking "
                           f"it back would overwrite that. Nothing was sent; read it again and change it with the "
                           f"tools.")


def _current(step: dict, client: Any, path: str | None = None) -> Any:
    return stored_object(client.get(path or step["object"], **(step.get("selectors") or {})))


def _accepted(step: dict, method: str, template: str) -> dict:
    return (catalog.entry_for(step["product"], method, template) or {}).get("params", {})


def _undo_settings(step: dict, client: Any, live: bool) -> list:
    now = _current(step, client) if live else step["after"]
    if live:
        _unchanged_since(step, step["after"], now)
    template = step["template"]
    method = "PUT" if catalog.entry_for(step["product"], "PUT", template) else step["method"]
    accepted = _accepted(step, method, template)
    params = restore_params(step["before"], step["after"], accepted)
    for name, spec in accepted.items():  # what the method requires besides the path (an HA rule's type)
        if not spec.get("optional") and f"{{{name}}}" not in template and name not in params and name in now:
            params[name] = now[name]
    if live and "digest" in accepted and now.get("digest"):
        params["digest"] = now["digest"]  # Proxmox refuses it if the object changes before it arrives
    return [(method, step["object"], params)]


def restore_params(before: dict, after: dict, accepted: dict) -> dict[str, Any]:
    """The parameters that set every changed option back: its old value, or its deletion; never an
    unusedN entry (Proxmox drops it when its volume is attached again: docs/PROXMOX-BEHAVIOUR.md#pending-config)."""
    keys = [k for k in sorted(set(before) | set(after)) if not config_diff.same(before.get(k), after.get(k))
            and not config_diff.BOOKKEEPING.fullmatch(k) and k not in CONTROL and catalog.spec_for(accepted, k)]
    secret = [k for k in keys if secret_param(k) or MASK in str(before.get(k, ""))]
    if secret:
        raise InvalidArgument(f"{', '.join(secret)} changed, and receipts never keep a secret's old value: set it "
                              f"again yourself. Nothing was sent.")
    params = {k: sendable(accepted, k, before[k]) for k in keys if k in before}
    gone = [k for k in keys if k not in before and not UNUSED.fullmatch(k)]
    if gone and "delete" in accepted:
        params["delete"] = gone if accepted["delete"].get("type") == "array" else ",".join(gone)
    for key in gone if "delete" not in accepted else ():
        params[key] = 0 if (catalog.spec_for(accepted, key) or {}).get("type") == "boolean" else ""
    if not params:
        raise InvalidArgument("Nothing to take back: the change left every option as it was.")
    return params


def sendable(accepted: dict, key: str, value: Any) -> Any:
    """A value as the write takes it: an object GET answered for a property string (a backup job's
    `prune-backups`: docs/PROXMOX-BEHAVIOUR.md#backup-jobs-after-an-edit) written as one."""
    if isinstance(value, dict) and (catalog.spec_for(accepted, key) or {}).get("type") == "string":
        return property_string(value)
    return value


def _undo_value(step: dict, client: Any, live: bool) -> list:
    if live:
        _unchanged_since(step, step["after"], _current(step, client))
    name = step["object"].rsplit("/", 1)[1]  # notes or protected
    before = step["before"]
    if MASK in str(before):
        raise InvalidArgument(f"The old {name} held something secret-looking, which receipts never keep. "
                              f"Nothing was sent.")
    value = int(bool(before)) if name == "protected" else (before or "")
    return [("PUT", step["object"], dict(step.get("selectors") or {}) | {name: value})]


def _undo_rules(step: dict, client: Any, live: bool) -> list:
    """A firewall rule list set back one edit: a new rule deleted (it is on top), a deleted one made
    again as write_edit_firewall_rule adds one (disabled on top, moved, then enabled, so that it
    never filters out of place), a move moved back, a changed rule set back
    (docs/PROXMOX-BEHAVIOUR.md#firewall-rules)."""
    collection, pos, before = step["object"], step.get("pos"), step["before"]
    digest = {}
    if live:
        now = stored_object(client.get(collection) or [])
        if [rule_fields(r) for r in now] != [rule_fields(r) for r in step["after"]]:
            raise ProxmoxError(f"The rules of {collection} changed since receipt {step['id']}, so taking it back "
                               f"would move or change other rules. Nothing was sent; read them with firewall_rules "
                               f"and change them with write_edit_firewall_rule.")
        digest = {"digest": now[0]["digest"]} if now and now[0].get("digest") else {}
    if step["method"] == "POST":
        return [("DELETE", f"{collection}/0", digest)]
    if step["method"] == "DELETE":
        return _rule_made_again(step, collection, rule_fields(before[pos]), pos)
    if "moveto" in step["params"]:
        where = moved_to(pos, int(step["params"]["moveto"]), len(before))
        return [("PUT", f"{collection}/{where}", {"moveto": pos if pos < where else pos + 1} | digest)]
    accepted = _accepted(step, "PUT", step["template"])
    return [("PUT", f"{collection}/{pos}", restore_params(rule_fields(before[pos]), rule_fields(step["after"][pos]),
                                                          accepted) | digest)]


def _rule_made_again(step: dict, collection: str, rule: dict, pos: int) -> list:
    accepted = _accepted(step, "POST", step["template"].rsplit("/", 1)[0])
    fields = {k: v for k, v in rule.items() if catalog.spec_for(accepted, k) and k not in CONTROL | {"enable"}}
    if any(MASK in str(v) for v in fields.values()):
        raise InvalidArgument("The rule held something secret-looking, which receipts never keep. Nothing was sent.")
    steps = [("POST", collection, fields | {"enable": 0})]  # a new rule lands on top: disabled until in place
    if pos:
        steps.append(("PUT", f"{collection}/0", {"moveto": pos + 1}))  # before the rule now at pos+1
    if str(rule.get("enable", 0)) not in ("0", ""):
        steps.append(("PUT", f"{collection}/{pos}", {"enable": 1}))
    return steps  # the move and the enable get the digest of the list read back (made_rule_check)


def made_rule_check(client: Any, made: dict | None, method: str, path: str) -> dict:
    """The digest a request after a firewall rule made again (`made`: its list and the fields it was
    POSTed with) is sent with, read once the rule is in the list: the rule at the position the request
    names must be that rule. create_rule checks no digest and puts every new rule on top (pve-firewall
    API2/Firewall/Rules.pm), so a rule another added meanwhile would be moved or enabled instead."""
    collection, _, pos = path.rpartition("/")
    if made is None or method != "PUT" or collection != made["collection"] or not pos.isdigit():
        return {}
    rules = client.get(collection) or []
    if not is_rule(rules[int(pos)] if int(pos) < len(rules) else {}, made["fields"]):
        raise ProxmoxError(f"Rule {pos} of {collection} is not the rule just made again: the list changed meanwhile. "
                           f"The rule was made again disabled; find it with firewall_rules and move or enable it "
                           f"with write_edit_firewall_rule.")
    return {"digest": rules[0]["digest"]} if rules and rules[0].get("digest") else {}


def made_rule(method: str, path: str, params: dict) -> dict | None:
    """A firewall rule POSTed by an undo (made_rule_check reads it back before each next request)."""
    return {"collection": path, "fields": params} if method == "POST" and path.endswith("/firewall/rules") else None


def _undo_created(step: dict, client: Any, live: bool) -> list:
    item = step["item"]
    now = step["after"]
    if live:
        try:
            now = _current(step, client, item)
        except ToolFailure:
            raise ProxmoxError(f"{item} no longer exists: nothing to take back.") from None
        _unchanged_since(step, step["after"], now)
    template = step["template"] + "/" + _item_template_tail(step)
    accepted = _accepted(step, "DELETE", template)
    return [("DELETE", item, {"digest": now["digest"]} if live and "digest" in accepted and now.get("digest") else {})]


def _item_template_tail(step: dict) -> str:
    items = catalog.item_templates(step["product"], step["template"])
    return items[0].rsplit("/", 1)[1] if items else "{id}"


def _undo_deleted(step: dict, client: Any, live: bool) -> list:
    """The item made again from what it was."""
    collection, item = step["object"].rsplit("/", 1)
    id_name = re.search(r"\{([\w-]+)\}$", step["template"]).group(1)
    if live:
        try:
            client.get(step["object"])
        except ToolFailure:
            pass
        else:
            raise ProxmoxError(f"{step['object']} exists again since receipt {step['id']}; nothing was sent.")
    accepted = _accepted(step, "POST", step["template"].rsplit("/", 1)[0])
    before = step["before"] if isinstance(step["before"], dict) else {}
    params = {k: sendable(accepted, k, v) for k, v in before.items() if catalog.spec_for(accepted, k)
              and k not in CONTROL and not config_diff.BOOKKEEPING.fullmatch(k)}
    if any(MASK in str(v) for v in params.values()):
        raise InvalidArgument("It held something secret-looking, which receipts never keep. Nothing was sent.")
    return [("POST", collection, params | {id_name: item})]


def _snapshots(client: Any, base: str) -> list[str]:
    return [s["name"] for s in client.get(f"{base}/snapshot") or [] if s.get("name") != "current"]


def _undo_snapshot(step: dict, client: Any, _live: bool) -> list:
    name = step["snapshot"]
    if name not in _snapshots(client, step["object"].rsplit("/", 1)[0]):
        raise ProxmoxError(f"Snapshot {name} no longer exists (or was never made): nothing to take back.")
    return [("DELETE", f"{step['object']}/{name}", {})]


def _undo_power(step: dict, client: Any, live: bool) -> list:
    base = step["object"].rsplit("/status", 1)[0]
    if live:
        state = power_state(client.get(step["object"]) or {})
        if state != step["after"]:
            raise ProxmoxError(f"Guest {base.rsplit('/', 1)[1]} is {state} now, not {step['after']} as the change "
                               f"left it: nothing was sent.")
    action = step["path"].rsplit("/", 1)[1]
    return [("POST", f"{base}/status/{INVERSE_POWER[action]}", {})]


def _undo_rollback(step: dict, client: Any, _live: bool) -> list:
    name = step["safety_snapshot"]
    base = step["object"].rsplit("/status", 1)[0]
    if name not in _snapshots(client, base):
        raise ProxmoxError(f"The safety snapshot {name} no longer exists, so the state before the rollback is gone.")
    return [("POST", f"{base}/snapshot/{name}/rollback", {"start": 1} if step["before"] == "running" else {})]


PLANNERS = {"settings": _undo_settings, "value": _undo_value, "rules": _undo_rules, "created": _undo_created,
            "deleted": _undo_deleted, "snapshot": _undo_snapshot, "power": _undo_power, "rollback": _undo_rollback}
