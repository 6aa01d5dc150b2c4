"""What exists on a Proxmox VE cluster, as the tools look it up: guests by vmid, nodes by name,
the next free vmid, a node's bridges, where a storage is. Names are checked here before a tool
sends anything, and an unknown one is answered with the names that exist.

Guests and node names are kept a few seconds on the client (ProxmoxClient.cached); any write
drops the guests, as it may have created, moved or deleted one.
"""

from urllib.parse import urlsplit

import policy
from errors import InvalidArgument, ProxmoxError
from proxmox_client import ProxmoxClient

KEEP_SECONDS = 10.0  # how long guest and node lists are reused between calls


# ---------------------------------------------------------------- guests

def guest_resources(client: ProxmoxClient, *, fresh: bool = False) -> list[dict]:
    """All guests from one /cluster/resources call, kept for a few seconds per host."""
    def read() -> list[dict]:
        guests = client.get("/cluster/resources", type="vm") or []
        for guest in guests:
            guest["vmid"] = int(guest["vmid"])  # PVE < 8.2 sends an LXC vmid as a string
        return guests
    return client.cached("guests", read, KEEP_SECONDS, fresh=fresh, until_write=True)


def resolve_guest(client: ProxmoxClient, vmid: int) -> dict:
    """The /cluster/resources row of a guest; refreshed once on a miss; an unknown vmid
    answers with the closest existing ones."""
    for fresh in (False, True):
        for guest in guest_resources(client, fresh=fresh):
            if guest["vmid"] == vmid:
                return guest
    known = sorted(guest_resources(client), key=lambda g: abs(g["vmid"] - vmid))[:5]
    close = ", ".join(f"{g['vmid']} ({g.get('name', '?')})" for g in known)
    raise InvalidArgument(f"No guest with vmid {vmid} on host '{client.host.label}'. "
                          + (f"Closest existing: {close}. " if close else "No guests are visible. ")
                          + "Use list_guests to see them all.")


def guest_path(client: ProxmoxClient, vmid: int, *, fresh: bool = False) -> tuple[str, dict]:
    """The API path of a guest and its resources row; `fresh` re-reads before a status check."""
    if fresh:
        guest_resources(client, fresh=True)
    row = resolve_guest(client, vmid)
    return f"/nodes/{row['node']}/{row['type']}/{vmid}", row


def next_vmid(client: ProxmoxClient) -> int:
    return int(client.get("/cluster/nextid"))


# ---------------------------------------------------------------- nodes and their bridges

def node_names(client: ProxmoxClient) -> list[str]:
    return client.cached("nodes", lambda: sorted(n["node"] for n in client.get("/nodes") or []), KEEP_SECONDS)


def online_node(client: ProxmoxClient) -> str:
    """A node to act on when the caller names none: the first one that is online."""
    online = sorted(n["node"] for n in client.get("/nodes") or [] if n.get("status") == "online")
    if not online:
        raise ProxmoxError("No node is online (cluster_status shows which are down).")
    return online[0]


def check_node(client: ProxmoxClient, node: str) -> str:
    """A node name exactly as the cluster spells it; a wrong one is refused before any write."""
    names = node_names(client)
    if node not in names:
        close = [n for n in names if n.lower() == node.lower()]
        hint = f" (did you mean '{close[0]}'? names are case-sensitive)" if close else ""
        raise InvalidArgument(f"Unknown node '{node}'{hint}. Nodes: {', '.join(names)}.")
    return node


def _segment(iface: dict, ports: list[str]) -> str:
    """uplinked (a port), routed (no port but a host address: the host routes or NATs it),
    isolated (neither), or sdn-vnet (an SDN vnet; its zone decides where it leads)."""
    if iface.get("type") == "vnet":
        return "sdn-vnet"
    if ports:
        return "uplinked"
    addressed = any(iface.get(k) for k in ("cidr", "cidr6", "address", "address6", "gateway", "gateway6"))
    return "routed" if addressed else "isolated"


def bridges(client: ProxmoxClient, node: str) -> list[dict]:
    """What a NIC can attach to on a node: Linux and OVS bridges and SDN vnets, each with its
    segment (docs/PROXMOX-BEHAVIOUR.md#networks). Other interface types are not bridges."""
    rows = []
    for iface in client.get(f"/nodes/{node}/network", type="any_bridge") or []:
        if iface.get("type") not in ("bridge", "OVSBridge", "vnet"):
            continue
        ports = (iface.get("bridge_ports") or iface.get("ovs_ports") or "").split()
        # a bridge only in /etc/network/interfaces.new (not applied yet) is listed without `active`
        # (docs/PROXMOX-BEHAVIOUR.md#networks)
        rows.append({"node": node, "bridge": iface["iface"], "uplink": " ".join(ports) or None,
                     "segment": _segment(iface, ports),
                     "pending": iface.get("type") != "vnet" and not iface.get("active"),
                     "vlan_aware": bool(iface.get("bridge_vlan_aware") or iface.get("vlanaware"))
                     or iface.get("type") == "OVSBridge",
                     "cidr": iface.get("cidr"), "gateway": iface.get("gateway"),
                     "comment": (iface.get("comments") or "").strip() or None})
    return rows


def bridges_hidden(client: ProxmoxClient) -> str | None:
    """Why this token's bridge lists may be empty: PVE lists a bridge only to callers with SDN.Audit
    or SDN.Use on /sdn/zones/localnetwork/<bridge> (docs/PROXMOX-BEHAVIOUR.md#networks); None when
    it holds one of them there or its privileges are unknown."""
    path = "/sdn/zones/localnetwork"
    if any(policy.holds(client.host, p, path) is not False for p in ("SDN.Audit", "SDN.Use")):
        return None
    return (f"The token sees no bridges: Proxmox lists a bridge only to a token with SDN.Audit or SDN.Use on "
            f"{path}/<bridge>. " + policy.grant_hint(client.host, "SDN.Audit", path))


# ---------------------------------------------------------------- storages

def storage_node(client: ProxmoxClient, storage: str, node: str | None, content: str | None = None) -> str:
    """A node where a storage is available (the given one, checked), or a clear error; with
    `content`, the storage must accept that content type."""
    rows = storage_rows(client)
    entries = [e for e in rows if e.get("storage") == storage]
    if not entries:
        names = sorted({e["storage"] for e in rows})
        raise InvalidArgument(f"Unknown storage '{storage}'. Storages: {', '.join(names)}.")
    if content and content not in (entries[0].get("content") or "").split(","):
        takes = entries[0].get("content")
        raise InvalidArgument(f"Storage '{storage}' does not take {content} (it takes {takes}); to allow it: "
                              f"`pvesm set {storage} --content {takes},{content}` on a node (a fresh install's local "
                              f"takes import from PVE 9 on: docs/PROXMOX-BEHAVIOUR.md#a-fresh-install).")
    nodes = [e["node"] for e in entries if e.get("status") == "available"]
    if node:
        if node not in [e["node"] for e in entries]:
            raise InvalidArgument(f"Storage '{storage}' is not on node '{node}'; it is on "
                                  f"{', '.join(e['node'] for e in entries)}.")
        return node
    if not nodes:
        raise ProxmoxError(f"Storage '{storage}' is not available on any node right now.")
    return nodes[0]


def storage_rows(client: ProxmoxClient) -> list[dict]:
    """One /cluster/resources row per storage and node (a storage that is not shared is a
    different disk on each node: docs/PROXMOX-BEHAVIOUR.md#per-node-storages)."""
    return client.get("/cluster/resources", type="storage") or []


def backup_storages(client: ProxmoxClient, rows: list[dict] | None = None) -> list[tuple[str, str, bool]]:
    """(storage, node, shared) to read for backups, PBS included: a shared storage once, on a node
    where it is available; a local one (each node's `local`) on every node where it is available."""
    seen: dict[tuple[str, str], tuple[str, str, bool]] = {}
    for entry in storage_rows(client) if rows is None else rows:
        if "backup" in (entry.get("content") or "").split(",") and entry.get("status") == "available":
            shared = bool(entry.get("shared"))
            key = (entry["storage"], "" if shared else entry["node"])
            seen.setdefault(key, (entry["storage"], entry["node"], shared))
    return [seen[key] for key in sorted(seen)]


def storages_on(rows: list[dict], node: str) -> dict[str, dict]:
    """The storages available on a node, by name."""
    return {r["storage"]: r for r in rows if r.get("node") == node and r.get("status") == "available"}


# ---------------------------------------------------------------- backups the token cannot see

BACKUP_ROLE = "BackupReader"  # the custom role the README's recipe adds (a role may not start with PVE)


def hidden_backups(client: ProxmoxClient, storage: str, vmids: list[int]) -> list[int]:
    """The guests whose backups on a storage this token's listing leaves out: PVE lists a backup
    only to a caller with Datastore.AllocateSpace on the storage and VM.Backup on the guest, or
    Datastore.Allocate (docs/PROXMOX-BEHAVIOUR.md#who-sees-which-volume). Told from the privileges
    read once; none while they are unknown."""
    host, where = client.host, f"/storage/{storage}"
    if policy.holds(host, "Datastore.Allocate", where) is not False:
        return []
    if policy.holds(host, "Datastore.AllocateSpace", where) is False:
        return sorted(vmids)
    return sorted(v for v in vmids if policy.holds(host, "VM.Backup", f"/vms/{v}") is False)


def backup_grant(client: ProxmoxClient) -> str:
    """The commands that let this token see backups: a role with the two privileges PVE asks for,
    granted to the user and the token (a token holds only what both are granted)."""
    user, _, token = client.host.token_id.partition("!")
    grants = [f"pveum role add {BACKUP_ROLE} --privs Datastore.AllocateSpace,VM.Backup",
              f"pveum acl modify / --users '{user}' --roles {BACKUP_ROLE}"]
    if token:
        grants.append(f"pveum acl modify / --tokens '{client.host.token_id}' --roles {BACKUP_ROLE}")
    return "; ".join(grants)


def hidden_note(client: ProxmoxClient, hidden: dict[str, list[int]], guests: int) -> dict:
    """What cannot be seen, said once: where, whose, why, and the grant that shows it."""
    where = [f"{name} ({'every guest' if len(vmids) >= guests else 'guests ' + ', '.join(map(str, vmids))})"
             for name, vmids in sorted(hidden.items())]
    return {"not_visible": where,
            "why": f"Proxmox lists a backup only to a token holding Datastore.AllocateSpace on its storage and "
                   f"VM.Backup on its guest; {client.host.token_id} lacks them there, so backups there are not shown "
                   f"(which says nothing about whether they exist).",
            "grant": backup_grant(client)}


def pbs_backed_storages(client: ProxmoxClient, pbs: ProxmoxClient) -> dict[str, tuple[str, str]]:
    """The PVE storages of type pbs that write to this Backup Server (same host name), each with
    its datastore and namespace (root without one) (docs/PROXMOX-BEHAVIOUR.md#pbs-backed-volumes)."""
    server = (urlsplit(pbs.host.url).hostname or "").lower()
    return {s["storage"]: (s["datastore"], s.get("namespace") or "") for s in client.get("/storage", type="pbs") or []
            if str(s.get("server", "")).strip("[]").lower() == server and s.get("datastore")}


# ---------------------------------------------------------------- HA resources that failed

# HA states in which a request has failed or the guest's node is lost, with the way out
# (docs/PROXMOX-BEHAVIOUR.md#ha-managed-guests)
HA_FAILED = {
    "error": "the HA manager could not start it and holds it in state error, where it ignores every request "
             "until the resource is disabled. Find why (list_tasks vmid={vmid} errors=true on its nodes), fix it, "
             "disable it (`ha-manager set {sid} --state disabled` on a node, or write_api_call PUT "
             "/cluster/ha/resources/{sid} state=disabled, which needs Sys.Console), then start it again.",
    "fence": "its node {node} was lost and is being fenced; the HA manager then recovers the guest on another "
             "node. Check cluster_status; get_guest shows where it runs once recovered.",
    "recovery": "its node was lost and fenced, and the HA manager is recovering it on another node; it stays in "
                "recovery while no node can take it. Check cluster_status and the resource's HA rules.",
}


def ha_failure(row: dict) -> str:
    """What an HA state of HA_FAILED means for a guest (its /cluster/resources row), and the way out."""
    vmid, node = row["vmid"], row.get("node")
    sid = f"{'vm' if row.get('type') == 'qemu' else 'ct'}:{vmid}"
    return f"HA resource {sid} is in state '{row['hastate']}' on {node}: " + \
        HA_FAILED[row["hastate"]].format(vmid=vmid, sid=sid, node=node)
