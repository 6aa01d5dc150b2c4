"""Proxmox VE HA configuration: rules (PVE 9), groups (PVE 8) and resources, as the API reads and
edits them (pve-ha-manager src/PVE/API2/HA/Rules.pm, Groups.pm, Resources.pm;
docs/PROXMOX-BEHAVIOUR.md#ha-rules-and-groups). A resource is a guest whose `ha` is set; its
`group` (PVE 8) says which group's nodes it may run on."""
from __future__ import annotations

import re
from typing import Callable

from .call import ApiError, Call
from .pve_ha_manager import place_later

RULE_FIELDS = ("type", "resources", "nodes", "strict", "affinity", "disable", "comment")
RESOURCE_FIELDS = ("group", "failback", "comment", "max_restart", "max_relocate")
GROUP_FIELDS = ("nodes", "restricted", "nofailback", "comment")


def _names(value: object) -> list[str]:
    """`delete`: a list of option names (pve-configid-list: split like PVE's split_list)."""
    values = value if isinstance(value, list) else [value]
    return [name for item in values for name in re.split(r"[,;\s]+", str(item)) if name]


def _digest(call: Call) -> str:
    return f"{len(call.lab.ha_rules):02x}{len(call.lab.ha_groups):02x}" + "0" * 36


def ha_resources(call: Call) -> list:
    """GET /cluster/ha/resources: every resource's config with its `sid` (Resources.pm `index`,
    `$api_copy_config`); `group` only while HA groups exist (PVE 8)."""
    wanted = call.arg("type")
    rows = []
    for vmid, guest in sorted(call.lab.guests.items()):
        if not guest.get("ha"):
            continue
        kind = "vm" if guest["type"] == "qemu" else "ct"
        if wanted in (None, kind):
            row = {"sid": f"{kind}:{vmid}", "type": kind, "state": guest["ha"].get("state", "started"),
                   "digest": _digest(call)}
            row |= {k: guest["ha"][k] for k in RESOURCE_FIELDS if guest["ha"].get(k) is not None}
            rows.append(row)
    return rows


def ha_rules(call: Call) -> list:
    return [_rule(call, rule) for rule in sorted(call.lab.ha_rules)]


def _rule(call: Call, rule: str) -> dict:
    """One rule as `read_rule` answers it (Rules.pm `$get_api_ha_rule`): its config with `rule`,
    `digest` and `order`."""
    if rule not in call.lab.ha_rules:
        raise ApiError(500, f"no such ha rule '{rule}'")
    return dict(call.lab.ha_rules[rule]) | {"rule": rule, "digest": _digest(call),
                                            "order": sorted(call.lab.ha_rules).index(rule) + 1}


def ha_rule(call: Call, rule: str) -> dict:
    return _rule(call, rule)


def ha_rule_update(call: Call, rule: str) -> None:
    """PUT /cluster/ha/rules/{rule} (Rules.pm `update_rule`): a false `disable` is dropped, the
    `delete`d options are removed (SectionConfig `delete_from_config`), then the given ones set."""
    stored = call.lab.ha_rules.get(rule)
    if stored is None:
        raise ApiError(500, f"HA rule '{rule}' does not exist")
    given = {k: v for k, v in call.params.items() if k in RULE_FIELDS and k != "type"}
    if str(given.get("disable", "1")) in ("0", "false"):
        given.pop("disable")
    for name in _names(call.params.get("delete", "")):
        stored.pop(name, None)
    stored.update(given)
    place_later(call.lab)


def ha_rule_delete(call: Call, rule: str) -> None:
    if call.lab.ha_rules.pop(rule, None) is None:
        raise ApiError(500, f"HA rule '{rule}' does not exist")
    place_later(call.lab)


def ha_rule_create(call: Call) -> None:
    """POST /cluster/ha/rules (Rules.pm `create_rule`): a rule id that exists is refused."""
    rule = call.arg("rule")
    if rule in call.lab.ha_rules:
        raise ApiError(500, f"HA rule '{rule}' already defined")
    call.lab.ha_rules[rule] = {k: call.arg(k) for k in RULE_FIELDS if call.arg(k) is not None}
    place_later(call.lab)


def _groups_migrated(call: Call, action: str) -> None:
    """pve-ha-manager 5.0.2+ (PVE 9): every groups endpoint dies once groups.cfg holds no group,
    which is so on every fresh PVE 9 cluster and once the CRM has migrated them to rules (API2/HA/Groups.pm,
    HA/Config.pm `have_groups_been_migrated`, commit 849ef84; docs/PROXMOX-BEHAVIOUR.md#ha-rules-and-groups)."""
    if call.lab.pve_major >= 9 and not call.lab.ha_groups:
        raise ApiError(500, f"cannot {action} group{'s' if action == 'index' else ''}: "
                            "ha groups have been migrated to rules")


def ha_groups(call: Call) -> list:
    _groups_migrated(call, "index")
    return [dict(group) | {"group": name, "type": "group"} for name, group in sorted(call.lab.ha_groups.items())]


def ha_group(call: Call, group: str) -> dict:
    _groups_migrated(call, "read")
    if group not in call.lab.ha_groups:
        raise ApiError(500, f"no such ha group '{group}'")
    return dict(call.lab.ha_groups[group]) | {"group": group, "type": "group", "digest": _digest(call)}


def ha_group_update(call: Call, group: str) -> None:
    """PUT /cluster/ha/groups/{group} (Groups.pm `update`): the given options are set first, then
    the `delete`d ones removed."""
    _groups_migrated(call, "update")
    stored = call.lab.ha_groups.get(group)
    if stored is None:
        raise ApiError(500, f"no such ha group '{group}'")
    stored.update({k: v for k, v in call.params.items() if k in GROUP_FIELDS})
    for name in _names(call.params.get("delete", "")):
        stored.pop(name, None)
    place_later(call.lab)


def ha_group_create(call: Call) -> None:
    _groups_migrated(call, "create")
    group = call.arg("group")
    if group in call.lab.ha_groups:
        raise ApiError(500, f"ha group '{group}' already defined")
    call.lab.ha_groups[group] = {k: call.arg(k) for k in GROUP_FIELDS if call.arg(k) is not None}
    place_later(call.lab)


def ha_group_delete(call: Call, group: str) -> None:
    """DELETE /cluster/ha/groups/{group}: refused while a resource names it (Groups.pm `delete`)."""
    _groups_migrated(call, "delete")
    if group not in call.lab.ha_groups:
        raise ApiError(500, f"no such ha group '{group}'")
    if any((g.get("ha") or {}).get("group") == group for g in call.lab.guests.values()):
        raise ApiError(500, f"ha group '{group}' is used by HA resources")
    del call.lab.ha_groups[group]


def _sid_vmid(sid: object) -> int:
    """The guest of an HA resource id (`vm:100`, `ct:100`, or a bare vmid: Config.pm `parse_sid`)."""
    match = re.fullmatch(r"(?:(?:vm|ct):)?(\d+)", str(sid))
    if match is None:
        raise ApiError(400, "Parameter verification failed.", {"sid": f"unable to parse service id '{sid}'"})
    return int(match.group(1))


def _resource(call: Call, sid: str) -> tuple[int, dict]:
    vmid = _sid_vmid(sid)
    guest = call.lab.guests.get(vmid)
    if guest is None or not guest.get("ha"):
        raise ApiError(500, f"no such resource '{sid}'")
    return vmid, guest


def ha_resource(call: Call, sid: str) -> dict:
    """GET /cluster/ha/resources/{sid} (Resources.pm `read`): its config with sid, type and digest."""
    _, guest = _resource(call, sid)
    kind = "vm" if guest["type"] == "qemu" else "ct"
    return {k: v for k, v in guest["ha"].items() if k in RESOURCE_FIELDS or k == "state"} | {
        "sid": f"{kind}:{guest['vmid']}", "type": kind, "digest": _digest(call)}


def ha_resource_create(call: Call) -> None:
    """POST /cluster/ha/resources (Resources.pm `create`): the guest becomes an HA resource, started
    unless a state is given."""
    vmid = _sid_vmid(call.arg("sid"))
    guest = call.lab.guests.get(vmid)
    if guest is None:
        raise ApiError(500, f"unable to find VM/CT {vmid}")
    if guest.get("ha"):
        raise ApiError(500, f"resource ID '{call.arg('sid')}' already defined")
    guest["ha"] = {"state": call.arg("state", "started")} | {k: call.arg(k) for k in RESOURCE_FIELDS
                                                             if call.arg(k) is not None}
    place_later(call.lab)


def ha_resource_delete(call: Call, sid: str) -> None:
    _, guest = _resource(call, sid)
    guest["ha"] = None
    place_later(call.lab)


def _since_pve9(handler: Callable, method: str) -> Callable:
    """PVE 8 (pve-ha-manager 4.x) has no HA rules: pveproxy answers 501 (pve-manager PVE/HTTPServer.pm
    `rest_handler`: "Method '<method> <path>' not implemented")."""
    def answer(call: Call, **path_params: str) -> object:
        if call.lab.pve_major < 9:
            raise ApiError(501, f"Method '{method} {call.path}' not implemented")
        return handler(call, **path_params)
    return answer


HA_HANDLERS: dict[tuple[str, str], Callable] = {
    ("GET", "/cluster/ha/resources"): ha_resources,
    ("GET", "/cluster/ha/rules"): ha_rules,
    ("GET", "/cluster/ha/rules/{rule}"): ha_rule,
    ("PUT", "/cluster/ha/rules/{rule}"): ha_rule_update,
    ("DELETE", "/cluster/ha/rules/{rule}"): ha_rule_delete,
    ("GET", "/cluster/ha/groups"): ha_groups,
    ("GET", "/cluster/ha/groups/{group}"): ha_group,
    ("PUT", "/cluster/ha/groups/{group}"): ha_group_update,
    ("POST", "/cluster/ha/rules"): ha_rule_create,
    ("POST", "/cluster/ha/groups"): ha_group_create,
    ("DELETE", "/cluster/ha/groups/{group}"): ha_group_delete,
    ("GET", "/cluster/ha/resources/{sid}"): ha_resource,
    ("POST", "/cluster/ha/resources"): ha_resource_create,
    ("DELETE", "/cluster/ha/resources/{sid}"): ha_resource_delete,
}
HA_HANDLERS |= {key: _since_pve9(handler, key[0]) for key, handler in HA_HANDLERS.items() if "/ha/rules" in key[1]}
