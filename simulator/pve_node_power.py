"""Proxmox VE node power: POST /nodes/{node}/status reboots or powers off a node, and what that does
to its guests (docs/PROXMOX-BEHAVIOUR.md#node-power); the cluster options (datacenter.cfg, its
`ha: shutdown_policy`) and the HA manager's status (nodes in maintenance mode) it depends on.

The node goes down a moment after the call (pve-manager PVE/API2/Nodes.pm `node_cmd`: `sleep 2;
reboot`), after its guests were dealt with: stop-all shuts down the guests HA does not manage
(services/pve-guests.service, Nodes.pm `stopall`), the HA manager moves, freezes or stops its
resources by the shutdown policy (pve-ha-manager src/PVE/HA/LRM.pm `shutdown_request`). A rebooted
node is back `lab.reboot_seconds` later: `onboot` guests start (Nodes.pm `startall`), frozen HA
resources start on it again, migrated ones come back; a node that was shut down stays off until
`power_on`; its failed-over HA resources are recovered on another node once it is fenced.
"""
from __future__ import annotations

import re
from typing import Callable

from .call import Call, _node
from .lab import Lab
from .pve_ha_manager import fence_node, power_effect


def _policy(lab: Lab) -> str:
    parts = dict(p.split("=", 1) for p in lab.datacenter.get("ha", "").split(",") if "=" in p)
    return parts.get("shutdown_policy", "conditional")


def _mode(lab: Lab, node: str, command: str) -> str:
    """LRM.pm `shutdown_request`: maintenance mode or `migrate` moves, `freeze` (and `conditional` on a
    reboot) freezes, `failover` (and `conditional` on a power-off) stops for recovery."""
    policy = _policy(lab)
    if node in lab.ha_maintenance or policy == "migrate":
        return "migrate"
    if policy == "freeze" or (policy != "failover" and command == "reboot"):
        return "freeze"
    return "failover"


def _allowed(lab: Lab, guest: dict, node: str) -> list[str]:
    """Online nodes the resource may run on (strict node-affinity rules, restricted groups)."""
    sid = f"{'vm' if guest['type'] == 'qemu' else 'ct'}:{guest['vmid']}"
    allowed = [n for n in lab.nodes if n != node and n not in lab.down_nodes and n not in lab.ha_maintenance]
    for rule in lab.ha_rules.values():
        if rule.get("type") == "node-affinity" and str(rule.get("strict", 0)) in ("1", "true") \
                and sid in str(rule.get("resources", "")).split(","):
            names = {n.split(":")[0] for n in str(rule.get("nodes", "")).split(",")}
            allowed = [n for n in allowed if n in names]
    return allowed


def _going_down(lab: Lab, node: str, command: str) -> None:
    """What happens before the node is down: each guest on it dealt with, then the node offline. While HA
    is disarmed with `ignore` its resources count as unmanaged (HA/Config.pm `$service_check_ha_state`),
    so stop-all shuts them down; with `freeze` nobody does, and they die with the node."""
    mode = _mode(lab, node, command)
    for guest in [g for g in lab.guests.values() if g["node"] == node]:
        ha = guest.get("ha")
        if ha and ha.get("state") != "ignored" and lab.ha_disarm != "ignore":
            if lab.ha_disarm == "freeze":
                guest["status"] = "stopped"  # killed as the node goes down
            else:
                _ha_goes(lab, guest, node, mode)
        elif guest["status"] == "running":
            power_effect(lab, guest, "shutdown")()  # stop-all: shutdown, a hard stop after the timeout
    lab.down_nodes.add(node)
    if command == "reboot":
        lab.schedule(lab.reboot_seconds, lambda: power_on(lab, node))
    elif mode == "failover":
        fence_node(lab, node)


def _ha_goes(lab: Lab, guest: dict, node: str, mode: str) -> None:
    ha = guest["ha"]
    if guest["status"] != "running":
        return
    if mode == "migrate":
        targets = _allowed(lab, guest, node)
        if targets:  # the LRM waits until its services moved away (the node's shutdown hangs meanwhile)
            guest["node"], ha["maintenance_node"] = targets[0], node
            return
        if _policy(lab) == "migrate":
            return  # stuck: the shutdown waits for it (modelled as: it keeps running)
        # manual maintenance under another policy: the LRM queues request_stop for what is still
        # there (LRM.pm shutdown_request: `$maintenance` only with policy migrate), so it is stopped
    power_effect(lab, guest, "stop")()
    ha["state"] = "freeze" if mode == "freeze" else ha["state"]
    ha["stopped_by_shutdown"] = True


def power_on(lab: Lab, node: str) -> None:
    """The node is back: `onboot` guests start, frozen HA resources start again here, migrated ones
    come back to it (Manager.pm: the maintenance fallback node)."""
    lab.down_nodes.discard(node)
    for guest in lab.guests.values():
        ha = guest.get("ha")
        if ha and ha.get("maintenance_node") == node and node not in lab.ha_maintenance:
            # still in manual maintenance, nothing moves back (Manager.pm select_service_node)
            guest["node"] = node
            ha.pop("maintenance_node")
        elif guest["node"] == node and ha and ha.pop("stopped_by_shutdown", False):
            if ha["state"] == "freeze":
                ha["state"] = "started"
            power_effect(lab, guest, "start")()
        elif guest["node"] == node and not ha and str(guest["config"].get("onboot", 0)) == "1" \
                and guest["status"] != "running":
            power_effect(lab, guest, "start")()


def pve_node_command(call: Call, node: str) -> None:
    """POST /nodes/{node}/status: null now, the node goes down a moment later (Nodes.pm `node_cmd`)."""
    _node(call, node)
    command = call.arg("command")
    call.lab.node_commands.append((node, command))
    call.lab.schedule(call.lab.node_command_seconds, lambda: _going_down(call.lab, node, command))


# datacenter.cfg keys parse_datacenter_config answers as a hash, and the key a bare value sets
# (pve-cluster src/PVE/DataCenterConfig.pm: `$res->{ha} = parse_property_string($ha_format, ...)`)
PARSED_OPTIONS = {"crs": "ha", "migration": "type", "replication": None, "next-id": None, "ha": None,
                  "notify": None, "u2f": None, "webauthn": None, "tag-style": None, "user-tag-access": None}
SHORT_OPTIONS = ("console", "tag-style")  # what a caller without Sys.Audit on / gets (Cluster.pm get_options)


def _parsed(key: str, value: object) -> object:
    if key not in PARSED_OPTIONS or not isinstance(value, str):
        return value
    pairs = (part.split("=", 1) if "=" in part else [PARSED_OPTIONS[key], part] for part in value.split(",") if part)
    return {k: v for k, v in pairs if k}


def pve_cluster_options(call: Call) -> dict:
    """GET /cluster/options (pve-manager PVE/API2/Cluster.pm `get_options`, permissions `user: all`):
    datacenter.cfg as parsed, its property strings as objects; without Sys.Audit on / only console and
    tag-style; `allowed-tags` for everyone (docs/PROXMOX-BEHAVIOUR.md#node-power)."""
    options = {k: _parsed(k, v) for k, v in call.lab.datacenter.items()
               if call.can("/", "Sys.Audit") or k in SHORT_OPTIONS}
    tags = {t for g in call.lab.guests.values() for t in re.split(r"[;,\s]+", str(g["config"].get("tags", ""))) if t}
    return options | {"allowed-tags": sorted(tags)}


def pve_ha_manager_status(call: Call) -> dict:
    """GET /cluster/ha/status/manager_status: {manager_status, quorum, lrm_status} (pve-ha-manager
    src/PVE/API2/HA/Status.pm `manager_status`); a node in maintenance mode is `maintenance` there."""
    lab = call.lab
    online = [n for n in lab.nodes if n not in lab.down_nodes]
    status = {n: "maintenance" if n in lab.ha_maintenance else "online" if n in online else "unknown"
              for n in lab.nodes}
    disarm = {"disarm": {"mode": lab.ha_disarm, "state": "disarmed"}} if lab.ha_disarm else {}
    return {"manager_status": {"master_node": online[0] if online else None, "node_status": status,
                               "node_request": {n: {"maintenance": 1} for n in lab.ha_maintenance}} | disarm,
            "quorum": {"node": online[0] if online else None, "quorate": int(len(online) * 2 > len(lab.nodes))},
            "lrm_status": {n: {"mode": "maintenance" if n in lab.ha_maintenance else "active"} for n in online}}


NODE_POWER_HANDLERS: dict[tuple[str, str], Callable] = {
    ("POST", "/nodes/{node}/status"): pve_node_command,
    ("GET", "/cluster/options"): pve_cluster_options,
    ("GET", "/cluster/ha/status/manager_status"): pve_ha_manager_status,
}
