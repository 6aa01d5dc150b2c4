"""What a node reboot or shutdown (POST /nodes/{node}/status) does to each guest there, as Proxmox
does it (docs/PROXMOX-BEHAVIOUR.md#node-power):

- guests not managed by HA (and HA resources in state `ignored`) are shut down by the node's
  stop-all as it goes down, each with a hard stop after its `startup: down=` timeout or 180 s;
  after a reboot the ones with `onboot=1` start again, stopped ones among them;
- HA resources follow the cluster's `ha: shutdown_policy` (datacenter.cfg, `conditional` by
  default): `migrate` (and a node in maintenance mode, whatever the policy) moves them to another
  allowed node first, and the node's shutdown waits until they are gone; `freeze` (and
  `conditional` on a reboot) stops and freezes them, to start again on this node when it is back;
  `failover` (and `conditional` on a power-off) stops them, and the HA manager recovers them on
  another node once this one is fenced.

Other requests take a node down too (`DOWN`): stopping or restarting corosync or pve-cluster on a
node whose HA LRM is active takes its quorum (or its cluster file system) away, the LRM can no longer
renew its lock and update the watchdog, and the node is reset when the watchdog runs out
(docs/PROXMOX-BEHAVIOUR.md#node-power).

Both the tool's plan (node_tools.write_node_power) and the policy's judgement (the guests the
request changes, which policy.check_protected judges as if they were named: policy.classify) read it
from here, through the policy's own reads. What decides and cannot be read refuses (PolicyError);
only the manager status (maintenance, disarm) and the HA rules (PVE 9 only) may be missing.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from errors import PolicyError, ToolFailure

NODE_POWER = "/nodes/{node}/status"
STOP_TIMEOUT = 180  # seconds before stop-all hard-stops a guest (pve-manager PVE/API2/Nodes.pm `stopall`)
Read = Callable[[str], Any]


FENCE = "fence"  # the command of a request that leaves a node's watchdog to reset it
# The requests that take a node (or its HA stack) down: (template, its path and body -> the command, or
# None). A node's power; corosync or the cluster file system stopped under an active LRM (pve-ha-manager
# src/PVE/HA/LRM.pm `get_protected_ha_agent_lock`, `active_service_count`; pve-docs ha-manager.adoc,
# "How It Works": "As long as there is no quorum the node cannot reset the watchdog").
DOWN: list[tuple[str, Callable[[dict, dict], str | None]]] = [
    (NODE_POWER, lambda _path, params: str(params.get("command", "")) or None),
    ("/nodes/{node}/services/{service}/stop", lambda path, _p: FENCE if path.get("service") in QUORUM else None),
    ("/nodes/{node}/services/{service}/restart", lambda path, _p: FENCE if path.get("service") in QUORUM else None),
]
QUORUM = ("corosync", "pve-cluster")  # without them the LRM loses its lock and stops feeding the watchdog


def judged(product: str, method: str, template: str, path_params: dict | None = None,
           params: dict | None = None) -> str | None:
    """The command (reboot, shutdown, FENCE) by which a request takes its node down, or None."""
    if product != "pve" or method != "POST":
        return None
    return next((command(path_params or {}, params or {}) for pattern, command in DOWN if pattern == template),
                None)


@dataclass
class Effect:
    """What the node's reboot or shutdown does to one guest."""
    vmid: int
    name: str
    kind: str  # qemu or lxc
    status: str  # running or stopped, now
    how: str  # in words
    changes: bool  # the guest is stopped, started or killed (not moved away while it keeps running)
    moved_to: str | None = None  # HA moves it there first

    def row(self) -> dict:
        return {"vmid": self.vmid, "name": self.name, "type": self.kind, "status": self.status,
                "what_happens": self.how, "moved_to": self.moved_to or ""}


class _Reads:
    """Each path read once, through the policy's read. What decides (`required`) and cannot be read
    refuses (PolicyError: judged as "no guest there" it would let the request through); an optional read
    that fails is None."""

    def __init__(self, read: Read | None):
        if read is None:
            raise PolicyError("A node's guests would have to be read to judge its reboot or shutdown, and cannot be "
                              "here.")
        self.read, self.kept = read, {}

    def get(self, path: str, required: bool = False) -> Any:
        if path not in self.kept:
            try:
                self.kept[path] = self.read(path)
            except ToolFailure as exc:
                if required:
                    raise PolicyError(f"{path} could not be read ({exc}), and what the request does to the node's "
                                      f"guests depends on it, so it is refused. The read token needs VM.Audit and "
                                      f"Sys.Audit (PVEAuditor on /).") from None
                self.kept[path] = None
        return self.kept[path]


def _property(text: Any) -> dict[str, str]:
    """A property string (`shutdown_policy=migrate`, `order=2,down=60`) as a dict."""
    parts = [p.split("=", 1) for p in str(text or "").split(",") if "=" in p]
    return {k.strip(): v.strip() for k, v in parts}


SHORT_OPTIONS = {"console", "tag-style", "allowed-tags"}  # all a token without Sys.Audit on / is answered


def shutdown_policy(reads: _Reads) -> str | None:
    """datacenter.cfg `ha: shutdown_policy`, `conditional` when unset (pve-ha-manager src/PVE/HA/LRM.pm
    `shutdown_request`); None when unknown: unread, or an answer that may be the short one given
    without Sys.Audit. `ha` comes as an object (pve-cluster DataCenterConfig.pm parse_datacenter_config;
    pve-manager API2/Cluster.pm get_options); a property string is taken too."""
    options = reads.get("/cluster/options")
    if not isinstance(options, dict) or ("ha" not in options and set(options) <= SHORT_OPTIONS):
        return None
    ha = options.get("ha")
    return (ha if isinstance(ha, dict) else _property(ha)).get("shutdown_policy", "conditional")


def _manager(reads: _Reads) -> dict:
    status = reads.get("/cluster/ha/status/manager_status") or {}
    return status.get("manager_status") or {} if isinstance(status, dict) else {}


def in_maintenance(reads: _Reads, node: str) -> bool:
    """A node in HA maintenance mode (`ha-manager crm-command node-maintenance enable`): its LRM moves
    its services away whatever the shutdown policy says (LRM.pm `shutdown_request`)."""
    manager = _manager(reads)
    return (manager.get("node_status") or {}).get(node) == "maintenance" or \
        bool(((manager.get("node_request") or {}).get(node) or {}).get("maintenance"))


def ha_mode(policy: str, command: str, maintenance: bool) -> str:
    """migrate, freeze or failover: what the LRM does with its services (LRM.pm `shutdown_request`)."""
    if maintenance or policy == "migrate":
        return "migrate"
    if policy == "freeze" or (policy not in ("failover",) and command == "reboot"):
        return "freeze"  # conditional (and an unknown policy) freezes on a reboot
    return "failover"


def _ha_resources(reads: _Reads) -> dict[int, dict]:
    rows = reads.get("/cluster/ha/resources", required=True) or []
    found = {}
    for row in rows if isinstance(rows, list) else []:
        match = re.fullmatch(r"(?:vm|ct):(\d+)", str(row.get("sid", "")))
        if match:
            found[int(match.group(1))] = row
    return found


def _allowed_nodes(reads: _Reads, sid: str, resource: dict, online: list[str]) -> list[str]:
    """Where the HA manager may put a resource: every online node, unless a strict node-affinity rule
    (PVE 9, /cluster/ha/rules) or a restricted group (PVE 8, /cluster/ha/groups) names it
    (pve-ha-manager src/PVE/HA/Manager.pm `select_service_node`)."""
    allowed = set(online)
    for rule in reads.get("/cluster/ha/rules") or []:
        names = str(rule.get("resources", "")).split(",")
        if rule.get("type") == "node-affinity" and str(rule.get("strict", "0")) in ("1", "true") \
                and str(rule.get("disable", "0")) in ("0", "false") and sid in names:
            allowed &= {n.split(":")[0] for n in str(rule.get("nodes", "")).split(",")}
    group = resource.get("group")
    if group:
        for row in reads.get("/cluster/ha/groups", required=True) or []:
            if row.get("group") == group and str(row.get("restricted", "0")) in ("1", "true"):
                allowed &= {n.split(":")[0] for n in str(row.get("nodes", "")).split(",")}
    return sorted(n for n in online if n in allowed)


def _online_nodes(reads: _Reads, node: str) -> list[str]:
    rows = reads.get("/cluster/resources", required=True) or []
    return sorted(r["node"] for r in rows if r.get("type") == "node" and r.get("status") == "online"
                  and r.get("node") != node and not in_maintenance(reads, r["node"]))


def _plain(guest: dict, config: dict, command: str) -> tuple[str, bool]:
    """A guest HA does not manage: stop-all shuts it down; `onboot` starts it after a reboot
    (pve-manager PVE/API2/Nodes.pm `stopall`, `startall`; services/pve-guests.service)."""
    onboot = str(config.get("onboot", "0")) == "1"
    down = _property(config.get("startup")).get("down", STOP_TIMEOUT)
    later = ("started again at boot (onboot=1)" if onboot else "stays stopped after the reboot (onboot is off)") \
        if command == "reboot" else "stays off until the node is powered on" + (", then starts (onboot=1)" * onboot)
    if guest.get("status") != "stopped":  # running (or its state unknown: judged as running)
        return f"shut down by the node's stop-all (hard stop after {down} s); {later}", True
    if onboot and command == "reboot":
        return "stopped now; started at boot (onboot=1)", True
    return "", False


def _with_ha(reads: _Reads, guest: dict, resource: dict, node: str, command: str) -> tuple[str, bool, str | None]:
    """An HA resource, by the LRM's mode (LRM.pm `shutdown_request`; pve-docs ha-manager.adoc, Shutdown Policy)."""
    if guest.get("status") == "stopped" and resource.get("state", "started") in ("stopped", "disabled"):
        return "", False, None
    disarm = _manager(reads).get("disarm") or {}
    if disarm:  # with `freeze` HA keeps them and stop-all skips them (HA/Config.pm `$service_check_ha_state`)
        return (f"HA is disarmed ({disarm.get('mode', '?')}): stop-all skips HA resources, so it is killed when the "
                f"node goes down"), True, None
    policy, manual = shutdown_policy(reads), in_maintenance(reads, node)
    if policy is None and not manual:
        return ("HA's shutdown policy could not be read (GET /cluster/options answers it with Sys.Audit on /): "
                "it is stopped and frozen, stopped for recovery elsewhere, or moved by HA"), True, None
    mode = ha_mode(policy or "migrate", command, manual)
    if mode == "migrate":
        return _moved_by_ha(reads, guest, resource, node, waits=policy in ("migrate", None), manual=manual)
    if mode == "freeze":
        after = "started again on this node after the reboot" if command == "reboot" else \
            "stays stopped until the node returns, then starts here"
        return f"stopped and frozen by HA; {after}", True, None
    return ("stopped by HA; recovered (started) on another node once this one is fenced, about 2 minutes after it "
            "went down"), True, None


def _moved_by_ha(reads: _Reads, guest: dict, resource: dict, node: str, *, waits: bool,
                 manual: bool) -> tuple[str, bool, str | None]:
    """Maintenance: HA moves it to a node it picks by CRS score (Manager.pm `select_service_node`), so the
    first allowed one is only likely; it comes back when the node returns, unless the node is in manual
    maintenance, which outlives the reboot. What HA cannot move waits out the shutdown under policy
    migrate; under another policy with manual maintenance the LRM stops it and the shutdown goes on
    (LRM.pm `shutdown_request`: `$maintenance` only for migrate, else `request_stop` for every service)."""
    sid = f"{'vm' if guest['type'] == 'qemu' else 'ct'}:{guest['vmid']}"
    targets = _allowed_nodes(reads, sid, resource, _online_nodes(reads, node))
    if not targets and waits:
        return ("HA cannot move it (no other allowed node is online), so the node's shutdown waits until it "
                "can"), True, None
    if not targets:
        return ("HA cannot move it (no other allowed node is online), so HA stops it and the shutdown goes on "
                "(manual maintenance under a policy other than migrate)"), True, None
    how = "live-migrated" if guest["type"] == "qemu" else "relocated (stopped, moved, started)"
    back = ("it stays there until `ha-manager crm-command node-maintenance disable` (the node is in manual "
            "maintenance)" if manual else "moved back when it returns")
    return (f"{how} by HA to another node (likely {targets[0]}) before the node goes down; {back}"), False, targets[0]


def _fenced(guest: dict, resource: dict | None, lrm_active: bool) -> tuple[str, bool]:
    """A guest on a node left without quorum: nothing happens while its LRM is idle (no watchdog is
    armed); under an active LRM the watchdog resets the node, which kills every guest there."""
    if not lrm_active or guest.get("status") == "stopped" and not _ha_active(resource):
        return "", False
    after = "recovered (started) by HA on another node once the node is fenced" if _ha_active(resource) else \
        "killed with it, and started at boot only with onboot=1"
    return f"the node loses quorum and its watchdog resets it about 60 s later (HA is active there): {after}", True


def _ha_active(resource: dict | None) -> bool:
    """An HA resource its LRM runs (LRM.pm `active_service_count`: not stopped, frozen or ignored)."""
    return resource is not None and resource.get("state", "started") in ("started", "enabled")


def effects(read: Read | None, node: str, command: str, only: set[int] | None = None,
            watched: tuple[int, ...] | list[int] = ()) -> list[Effect]:
    """What the node's `command` (reboot, shutdown, FENCE) does to each of its guests (those in `only`,
    when given) that it changes or moves, in vmid order; templates are left out. A `watched` guest (a
    protected one) that the read token cannot see refuses it (PolicyError)."""
    reads = _Reads(read)
    every = [r for r in reads.get("/cluster/resources", required=True) or [] if r.get("type") in ("qemu", "lxc")]
    here = [r for r in every if r.get("node") == node and not r.get("template")]
    resources = _ha_resources(reads) if here else {}
    lrm_active = command == FENCE and any(_ha_active(resources.get(int(r["vmid"]))) for r in here) \
        and not _manager(reads).get("disarm")  # a disarmed HA releases the watchdog
    found = []
    for row in sorted(here, key=lambda r: int(r["vmid"])):
        guest = row | {"vmid": int(row["vmid"])}
        if only is not None and guest["vmid"] not in only:
            continue
        resource = resources.get(guest["vmid"])
        moved = None
        ignored = (_manager(reads).get("disarm") or {}).get("mode") == "ignore"  # unmanaged while so disarmed
        if command == FENCE:
            how, changes = _fenced(guest, resource, lrm_active)
        elif resource is not None and resource.get("state") != "ignored" and not ignored:  # `vm_is_ha_managed`
            how, changes, moved = _with_ha(reads, guest, resource, node, command)
        else:
            config = reads.get(f"/nodes/{node}/{guest['type']}/{guest['vmid']}/config", required=True) or {}
            how, changes = _plain(guest, config, command)
        if how:
            found.append(Effect(guest["vmid"], str(guest.get("name") or ""), guest["type"],
                                str(guest.get("status") or "?"), how, changes, moved))
    unseen = sorted(set(watched) - {int(r["vmid"]) for r in every if str(r.get("vmid", "")).isdigit()})
    if unseen:  # a guest the read token cannot see may be on this node: not judged as absent
        raise PolicyError(f"Protected guest {unseen[0]} is not among the guests /cluster/resources shows, so what the "
                          f"request does to it cannot be told and it is refused. The read token needs VM.Audit on it "
                          f"(PVEAuditor on /); a list entry for a guest that is gone is removed from the list.")
    return found


def words(command: str) -> str:
    return "the loss of quorum" if command == FENCE else f"the node's {command}"


def changes(read: Read | None, node: str, command: str, watched: list[int] = ()) -> dict[int, str]:
    """Every guest the request's `command` changes, and how (policy.check_protected judges them as it
    judges the guests a request names); one HA moves away while it keeps running is not changed. A
    `watched` guest (a protected one) that the read token cannot see refuses it (PolicyError)."""
    found = effects(read, node, command, watched=watched)
    return {e.vmid: f"{words(command)}: {e.how}" for e in found if e.changes}


def protected_changes(read: Read | None, node: str, command: str, protected: list[int]) -> dict[int, str]:
    """The protected guests the node's `command` changes, and how."""
    return {vmid: how for vmid, how in changes(read, node, command, protected).items() if vmid in protected}
