"""Proxmox VE guest power as it lands, and the HA manager: what a start or stop does to a guest,
and how the HA manager carries out requests for HA resources: started or stopped, relocated to
another node after a failed start, `error` (sticky until the resource is disabled), and `fence`
then `recovery` on another node when its node is lost (docs/PROXMOX-BEHAVIOUR.md#ha-managed-guests).
"""
from __future__ import annotations

import re
from typing import Callable

from .call import ApiError, Call
from .lab import Lab
from .pve_cloudinit import regenerated
from .pve_history import set_option

MAX_RELOCATE = 1  # pve-ha-manager's default for a resource (src/PVE/HA/Resources.pm, max_relocate)


def _apply_pending(lab: Lab, guest: dict) -> None:
    """A start applies what waited in `pending` (docs/PROXMOX-BEHAVIOUR.md#pending-config)."""
    for key, value in guest["pending"].items():
        set_option(guest, key, value)
    if guest["pending"]:
        guest["pending"] = {}
        guest["config"]["digest"] = lab._digest(guest["vmid"])


def resumes(action: str, guest: dict) -> bool:
    """A hibernated VM (lock `suspended`, no task) is resumed by a start (qemu-server QemuServer.pm, vm_start)."""
    return action == "start" and guest["lock"] == "suspended"


def power_effect(lab: Lab, guest: dict, action: str) -> Callable[[], None]:
    resuming = resumes(action, guest)

    def apply() -> None:
        if resuming:
            guest["lock"] = None
        if action in ("start", "reboot", "reset", "resume"):
            guest["status"], guest["paused"] = "running", False
            if action in ("start", "reboot"):
                _apply_pending(lab, guest)
                regenerated(guest)  # a start makes the cloud-init drive anew (docs/PROXMOX-BEHAVIOUR.md#cloud-init)
        elif action in ("stop", "shutdown"):
            guest["status"], guest["paused"] = "stopped", False
        elif action == "suspend":
            guest["paused"] = True
        guest["uptime"] = 1 if guest["status"] == "running" else 0
    return apply


# ---- the HA manager

def _crm_start(lab: Lab, guest: dict) -> None:
    """The CRM starts a resource on its node; a start that fails there is retried on another node
    (relocate; `migrate` for VMs), and once it failed on more nodes than max_relocate allows the
    resource enters `error` (pve-ha-manager src/PVE/HA/Manager.pm next_state_started)."""
    ha = guest["ha"]
    if guest["node"] in lab.down_nodes or ha["state"] in ("fence", "recovery", "error"):
        return  # the node is lost: fencing and recovery decide (fence_node)
    if guest["node"] not in ha.get("fails_on", ()):
        ha["state"] = "started"
        power_effect(lab, guest, "start")()
        return
    failed = ha.setdefault("failed_nodes", [])
    failed.append(guest["node"])
    other = next((n for n in lab.nodes if n not in failed and n not in lab.down_nodes), None)
    if len(failed) > MAX_RELOCATE or other is None:
        ha["state"] = "error"
        return
    ha["state"] = "migrate" if guest["type"] == "qemu" else "relocate"

    def moved() -> None:
        guest["node"] = other
        _crm_start(lab, guest)
    lab.schedule(lab.ha_seconds, moved)


def ha_request(call: Call, node: str, kind: str, action: str, guest: dict) -> str:
    """An HA resource's start/stop/shutdown only queues a request: the hastart/hastop task ends OK at
    once; the HA manager acts later and a stop stays in force; a resource in `error` ignores requests
    until it is disabled (docs/PROXMOX-BEHAVIOUR.md#ha-managed-guests)."""
    label = "VM" if kind == "qemu" else "CT"
    starting = action == "start"
    ha = guest["ha"]

    def queued() -> None:
        if ha["state"] == "error":  # Manager.pm next_state_error: only `disabled` gets it out
            return
        if starting and guest["status"] == "running":
            ha["state"] = "started"
            return
        ha["state"] = "request_start" if starting else "request_stop"
        call.lab.schedule(call.lab.ha_seconds, crm)

    def crm() -> None:
        if starting:
            _crm_start(call.lab, guest)
        elif ha["state"] == "request_stop":
            ha["state"] = "stopped"
            power_effect(call.lab, guest, "stop")()
    line = f"Requesting HA {'start' if starting else 'stop'} for {label} {guest['vmid']}"
    return call.lab.start_task(node, "hastart" if starting else "hastop", str(guest["vmid"]), user=call.token_id,
                               lines=[line], on_done=queued)


def ha_migrate(call: Call, node: str, kind: str, guest: dict, target: str) -> str:
    """An HA resource's migration is a request to the HA manager (docs/PROXMOX-BEHAVIOUR.md#ha-managed-guests)."""
    ha = guest["ha"]
    before = ha["state"]

    def queued() -> None:
        ha["state"] = "migrate"
        call.lab.schedule(call.lab.ha_seconds, crm)

    def crm() -> None:
        guest["node"], ha["state"] = target, before
    line = f"Requesting HA migration for {'VM' if kind == 'qemu' else 'CT'} {guest['vmid']} to node {target}"
    return call.lab.start_task(node, "hamigrate", str(guest["vmid"]), user=call.token_id, lines=[line],
                               on_done=queued)


def fence_node(lab: Lab, node: str) -> None:
    """A node is lost: its HA resources go to `fence`; once it is fenced the CRM recovers each on
    another online node (`recovery`, then `started` there); with no node to take it, it stays in
    `recovery` (Manager.pm next_state_recovery)."""
    lab.down_nodes.add(node)
    for guest in [g for g in lab.guests.values() if g["node"] == node and g.get("ha")]:
        guest["ha"]["state"] = "fence"

        def recover(guest: dict = guest) -> None:
            guest["ha"]["state"] = "recovery"
            other = next((n for n in lab.nodes if n not in lab.down_nodes), None)
            if other is not None:
                lab.schedule(lab.ha_seconds, lambda: _recovered(lab, guest, other))
        lab.schedule(lab.ha_seconds, recover)


def _recovered(lab: Lab, guest: dict, node: str) -> None:
    guest["node"], guest["status"] = node, "stopped"
    guest["ha"]["state"] = "request_start"
    _crm_start(lab, guest)


def pve_ha_resource_update(call: Call, sid: str) -> None:
    """PUT /cluster/ha/resources/{sid}: the given options set, then the `delete`d ones removed
    (Config.pm `update_single_resource_config_inplace`); `state=disabled` takes a resource out of
    `error` to `stopped`; `started` asks the CRM to start it (not while in `error`)."""
    vmid = int(sid.split(":")[-1])
    guest = call.lab.guests.get(vmid)
    if guest is None or not guest.get("ha"):  # pve-ha-manager src/PVE/HA/Config.pm update_resources_config
        raise ApiError(500, f"update resources config failed: no such resource '{sid}'")
    ha, wanted = guest["ha"], call.arg("state")
    ha.update({k: call.arg(k) for k in ("group", "failback", "comment", "max_restart", "max_relocate")
               if call.arg(k) is not None})
    for name in (n for n in re.split(r"[,;\s]+", str(call.arg("delete") or "")) if n):
        ha.pop(name, None)
    place_later(call.lab)
    if wanted == "disabled":
        ha["state"] = "stopped"
        ha.pop("failed_nodes", None)
        power_effect(call.lab, guest, "stop")()
    elif wanted == "started" and ha["state"] != "error":
        ha["state"] = "request_start"
        call.lab.schedule(call.lab.ha_seconds, lambda: _crm_start(call.lab, guest))


# ---- where the HA manager places a started resource (pve-ha-manager src/PVE/HA/Manager.pm
# select_service_node; Rules/NodeAffinity.pm, Rules/ResourceAffinity.pm, Rules.pm, Groups.pm)

def place_later(lab: Lab) -> None:
    """After an HA rule, group or resource changes, the CRM's next round moves each started resource
    that may no longer stay where it runs (docs/PROXMOX-BEHAVIOUR.md#ha-placement)."""
    lab.schedule(lab.ha_seconds, lambda: place(lab))


def _node_list(text: object) -> dict[str, int]:
    """`nodes` of a rule or group: node -> priority (0 when not given; Tools.pm parse_node_priority)."""
    nodes = {}
    for item in (i for i in re.split(r"[,;\s]+", str(text or "")) if i):
        name, _, priority = item.partition(":")
        nodes[name] = int(priority or 0)
    return nodes


def _on(value: object) -> bool:
    return str(value).lower() in ("1", "true", "yes", "on")


def _compiled(lab: Lab) -> tuple[dict[int, dict], dict[int, set[int]], dict[int, set[int]]]:
    """(vmid -> node affinity {nodes, strict}, vmid -> together, vmid -> apart): the enabled rules, HA
    groups in use as node affinity rules (Groups.pm migrate_groups_to_rules), rules sharing a resource
    dropped (NodeAffinity.pm check_single_resource_reference), positive partners taking the rule of
    the one in it (Rules.pm create_implicit_positive_resource_affinity_node_affinity_rules)."""
    rules = [r for r in lab.ha_rules.values() if not _on(r.get("disable", 0))]
    for name, group in lab.ha_groups.items():
        users = [v for v, g in lab.guests.items() if (g.get("ha") or {}).get("group") == name]
        if users:
            rules.append({"type": "node-affinity", "resources": ",".join(f"vm:{v}" for v in users),
                          "nodes": group.get("nodes"), "strict": group.get("restricted", 0)})

    def members(rule: dict) -> set[int]:
        return {int(m) for m in re.findall(r":(\d+)", str(rule.get("resources", "")))}
    placing = [r for r in rules if r.get("type") == "node-affinity"]
    shared = {v for r in placing for v in members(r) if sum(v in members(o) for o in placing) > 1}
    affinity = {v: {"nodes": _node_list(r.get("nodes")), "strict": _on(r.get("strict", 0))}
                for r in placing if not members(r) & shared for v in members(r)}
    together: dict[int, set[int]] = {}
    apart: dict[int, set[int]] = {}
    for rule in (r for r in rules if r.get("type") == "resource-affinity"):
        side = together if rule.get("affinity") == "positive" else apart
        for vmid in members(rule):
            side.setdefault(vmid, set()).update(members(rule) - {vmid})
    for vmid, partners in together.items():
        inherited = next((affinity[p] for p in sorted(partners | {vmid}) if p in affinity), None)
        if inherited is not None:
            affinity[vmid] = inherited
    return affinity, together, apart


def _allowed(lab: Lab, vmid: int, affinity: dict[int, dict]) -> tuple[set[str], set[str]]:
    """(allowed, preferred) online nodes by node affinity (NodeAffinity.pm plugin_compile,
    get_node_affinity: a non-strict rule lets every other node in at priority -1)."""
    online = [n for n in lab.nodes if n not in lab.down_nodes]
    rule = affinity.get(vmid)
    if rule is None:
        return set(online), set(online)
    nodes = dict(rule["nodes"]) | ({} if rule["strict"] else {n: -1 for n in online if n not in rule["nodes"]})
    allowed = {n: p for n, p in nodes.items() if n in online}
    top = max(allowed.values(), default=None)
    return set(allowed), {n for n, p in allowed.items() if p == top}


def place(lab: Lab) -> None:
    """Each started resource on a node it may no longer stay on, or (with failback) off its preferred
    nodes, goes to the first preferred node its resource affinity allows (select_service_node with no
    preference: stay where allowed, else the preferred nodes less the separated, narrowed to the
    together node)."""
    affinity, together, apart = _compiled(lab)
    for vmid, guest in sorted(lab.guests.items()):
        ha = guest.get("ha") or {}
        if ha.get("state") != "started" or guest["node"] in lab.down_nodes:
            continue
        allowed, preferred = _allowed(lab, vmid, affinity)
        with_nodes = {lab.guests[p]["node"] for p in together.get(vmid, ()) if p in lab.guests}
        away = {lab.guests[p]["node"] for p in apart.get(vmid, ()) if p in lab.guests}
        stays = guest["node"] in allowed and (guest["node"] in with_nodes or guest["node"] not in away)
        if stays and not _on(ha.get("failback", 1)):
            continue
        candidates = preferred - away
        if with_nodes & candidates:
            candidates = {sorted(with_nodes & candidates)[0]}
        if candidates and guest["node"] not in candidates:
            guest["node"] = sorted(candidates)[0]
