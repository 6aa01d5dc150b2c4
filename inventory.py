"""What exists on a Proxmox VE cluster, as the tools look it up: guests by vmid, nodes by name,
the next free vmid, a node's bridges, where a storage is, which node has room for a new guest.
Names are checked here before a tool sends anything, and an unknown one is answered with the
names that exist. Also how a node's disks, ZFS pools and kernel are judged (node_disks,
node_updates and health_check share it).

Guests and node names are kept a few seconds on the client (ProxmoxClient.cached); any write
drops the guests, as it may have created, moved or deleted one.
"""

import contextvars
import re
import time
from contextlib import contextmanager
from typing import Any, Iterator
from urllib.parse import urlsplit

import privileges
from answers import capped, compact, human_bytes, iso_time
from errors import InvalidArgument, ProxmoxError, ToolFailure
from fanout import in_parallel
from proxmox_client import ProxmoxClient, configured, pbs_client

KEEP_SECONDS = 10.0  # how long guest and node lists are reused between calls


# ---------------------------------------------------------------- guests

# /cluster/resources as this call read it already (sharing_resources): (product, host label) and its answer
_RESOURCES: contextvars.ContextVar[tuple[Any, list[dict]] | None] = contextvars.ContextVar("resources", default=None)


def cluster_resources(client: ProxmoxClient) -> list[dict]:
    """Every resource of the cluster (GET /cluster/resources), or the answer this call read already."""
    held = _RESOURCES.get()
    if held is not None and held[0] == (client.host.product, client.host.label):
        return held[1]
    return client.get("/cluster/resources") or []


@contextmanager
def sharing_resources(client: ProxmoxClient) -> Iterator[list[dict]]:
    """One read of /cluster/resources for all that runs inside, its reads side by side included (a tool
    made of other tools' parts: the dashboard reads the inventory once)."""
    resources = client.get("/cluster/resources") or []
    token = _RESOURCES.set(((client.host.product, client.host.label), resources))
    try:
        yield resources
    finally:
        _RESOURCES.reset(token)


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


def free_vmid(client: ProxmoxClient, vmid: int | None) -> int:
    if vmid is None:
        return next_vmid(client)
    taken = {g["vmid"]: g for g in guest_resources(client, fresh=True)}
    if vmid in taken:
        raise InvalidArgument(f"vmid {vmid} is taken by '{taken[vmid].get('name')}'. "
                              f"Leave vmid out to get the next free one.")
    return vmid


def existing_snapshot(client: ProxmoxClient, base: str, vmid: int, name: str) -> None:
    names = [s["name"] for s in client.get(f"{base}/snapshot") or [] if s["name"] != "current"]
    if name not in names:
        raise InvalidArgument(f"Guest {vmid} has no snapshot '{name}'. Snapshots: {', '.join(names) or 'none'}.")


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
    if any(privileges.holds(client.host, p, path) is not False for p in ("SDN.Audit", "SDN.Use")):
        return None
    return (f"The token sees no bridges: Proxmox lists a bridge only to a token with SDN.Audit or SDN.Use on "
            f"{path}/<bridge>. " + privileges.grant_hint(client.host, "SDN.Audit", path))


def check_bridge(client: ProxmoxClient, node: str, bridge: str, vlan: int | None) -> None:
    """Fail closed: an unknown bridge, a VLAN on a bridge that is not VLAN-aware, or a bridge list
    that cannot be read refuse the change."""
    try:
        known = {b["bridge"]: b for b in bridges(client, node)}
    except ToolFailure as exc:
        raise ProxmoxError(f"Cannot read the bridges of {node} ({exc}); refusing to change a NIC blind.") from None
    if bridge not in known:
        hidden = bridges_hidden(client) if not known else None
        raise InvalidArgument(f"Node {node} has no bridge '{bridge}'. " + (
            hidden or f"Bridges: {', '.join(known) or 'none'} (list_networks)."))
    if known[bridge]["pending"]:
        raise InvalidArgument(f"Bridge {bridge} on {node} is not applied yet (it is only in the pending network "
                              f"configuration): a guest on it would not start. Apply it first (node > Network > "
                              f"Apply Configuration, or `ifreload -a` on {node}).")
    if vlan and not known[bridge]["vlan_aware"]:
        aware = ", ".join(b for b, v in known.items() if v["vlan_aware"]) or "none"
        raise InvalidArgument(f"Bridge {bridge} on {node} is not VLAN-aware; a tag there would not isolate anything. "
                              f"Use a VLAN-aware bridge: {aware}.")


def _holders(client: ProxmoxClient, nodes: list[str], volid: str | None) -> list[str]:
    """The nodes that can use a volume: all for shared storage, else those whose own disk holds it
    (docs/PROXMOX-BEHAVIOUR.md#per-node-storages)."""
    storage = (volid or "").split(":", 1)[0]
    rows = [r for r in storage_rows(client) if r.get("storage") == storage]
    if not volid or not rows or any(r.get("shared") for r in rows):
        return nodes
    on = {r["node"] for r in rows if r.get("status") == "available"}
    return [n for n in nodes if n in on and any(v.get("volid") == volid for v in client.get(
        f"/nodes/{n}/storage/{storage}/content") or [])]


def pick_node(client: ProxmoxClient, memory_mb: int, volid: str | None = None) -> tuple[str, str | None]:
    """An online node that holds `volid` (when it is on a node's own storage) with the most free
    memory, and a note when free memory cannot be told: without Sys.Audit the nodes come without
    figures (docs/PROXMOX-BEHAVIOUR.md#cluster-resources), which says nothing about room."""
    online = {r["node"]: r for r in client.get("/cluster/resources", type="node") or [] if r.get("status") == "online"}
    nodes = _holders(client, sorted(online), volid)
    if not nodes:
        raise InvalidArgument(f"No online node holds {volid}; take one from storage_content, or download it to the "
                              f"node you want (write_download_url node=...).")
    if any(online[n].get("maxmem") is None for n in nodes):
        return nodes[0], (f"free memory not checked: the token lacks Sys.Audit on /nodes, so nodes come without "
                          f"figures; {nodes[0]} holds what it needs")
    free = {n: online[n]["maxmem"] - online[n].get("mem", 0) for n in nodes}
    best = max(nodes, key=free.get)
    if free[best] < memory_mb * 1024 * 1024:
        raise ProxmoxError(f"No online node that can use it has {memory_mb} MiB of free memory "
                           f"({', '.join(nodes)} checked); give a smaller memory_mb or free memory.")
    return best, None


# ---------------------------------------------------------------- storages

def storage_node(client: ProxmoxClient, storage: str, node: str | None, content: str | None = None,
                 rows: list[dict] | None = None) -> str:
    """A node where a storage is available (the given one, checked), or a clear error; with
    `content`, the storage must accept that content type. `rows`: storage_rows, when the caller has them."""
    rows = storage_rows(client) if rows is None else rows
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


def archive_node(client: ProxmoxClient, archive: str, node: str | None) -> str:
    """The node to restore on: any for a shared storage; for a local one (each node's `local`)
    the node whose disk holds the archive (docs/PROXMOX-BEHAVIOUR.md#per-node-storages)."""
    storage = archive.split(":", 1)[0]
    rows = [r for r in storage_rows(client) if r["storage"] == storage and r.get("status") == "available"]
    if not rows or rows[0].get("shared"):
        return check_node(client, node) if node else online_node(client)
    # a token that cannot list a backup cannot tell where it is (docs/PROXMOX-BEHAVIOUR.md#who-sees-which-volume)
    owner = re.search(r"vzdump-(?:qemu|lxc)-(\d+)-", archive)
    if owner and hidden_backups(client, storage, [int(owner.group(1))]):
        if node:
            return check_node(client, node)
        raise InvalidArgument(f"The token cannot see backups on '{storage}', each node's own disk, so which node holds "
                              f"{archive} is unknown: give node=<the node it was taken on>.")
    candidates = [check_node(client, node)] if node else [r["node"] for r in rows]
    for name in candidates:
        volumes = client.get(f"/nodes/{name}/storage/{storage}/content", content="backup") or []
        if any(v["volid"] == archive for v in volumes):
            return name
    holders = [r["node"] for r in rows if r["node"] not in candidates and any(
        v["volid"] == archive for v in client.get(f"/nodes/{r['node']}/storage/{storage}/content",
                                                  content="backup") or [])]
    if holders:
        raise InvalidArgument(f"{archive} is on the '{storage}' storage of {', '.join(holders)}, which is that "
                              f"node's own disk: restore it there (node={holders[0]}).")
    raise InvalidArgument(f"No node's '{storage}' storage holds {archive}; take a volid from list_backups.")


VOLUME_KEY = re.compile(r"(scsi|virtio|sata|ide|efidisk|tpmstate|mp)\d+|rootfs")


def volume_storages(config: dict, disks_only: bool = False) -> list[str]:
    """The storages a guest's volumes are on (CD-ROM images too, unless disks_only)."""
    found = []
    for key, value in config.items():
        volume = str(value).split(",")[0]
        if VOLUME_KEY.fullmatch(key) and ":" in volume and not (disks_only and "media=cdrom" in str(value)):
            found.append(volume.split(":", 1)[0])
    return sorted(set(found))


def disk_size(value: str) -> tuple[float, str] | None:
    """A disk's size in GiB and as its config writes it: `32G`, or `2252M` for an imported image
    (pve-common format_size, docs/PROXMOX-BEHAVIOUR.md#downloads-and-imports)."""
    match = re.search(r"size=(\d+(?:\.\d+)?)([KMGT]?)", value or "")
    if not match:
        return None
    scale = {"": 1 / 1024 ** 3, "K": 1 / 1024 ** 2, "M": 1 / 1024, "G": 1, "T": 1024}[match.group(2)]
    return float(match.group(1)) * scale, match.group(1) + match.group(2)


# ---------------------------------------------------------------- node hardware and packages, judged
# (node_disks and node_updates show these; health_check reports them: docs/PROXMOX-BEHAVIOUR.md#node-monitoring)

HEALTHY = ("PASSED", "OK")  # smartctl's ATA and SCSI words; UNKNOWN: no SMART (pve-storage Diskmanage.pm)
# not a verdict on the disk: smartctl could not or would not judge it (docs/PROXMOX-BEHAVIOUR.md#disks-and-smart)
UNJUDGED = ("UNKNOWN", "SMART DISABLED")
SMART_OFF = "SMART Disabled"
WEAROUT_LEFT_WARN = 20  # percent of rated life left


def wearout_left(disk: dict) -> float | None:
    """An SSD's `wearout`: the percent of life left (100 new), a number or a string; `N/A` for
    disks without one (pve-storage src/PVE/Diskmanage.pm, get_wear_leveling_info)."""
    try:
        return float(disk.get("wearout"))
    except (TypeError, ValueError):
        return None


def disk_problem(disk: dict) -> str | None:
    """Why a disk needs attention: SMART health other than PASSED/OK (UNKNOWN and `SMART Disabled` judge
    nothing), or under 20 % life left."""
    health = str(disk.get("health") or "UNKNOWN")
    if health.upper() not in HEALTHY + UNJUDGED:
        return f"SMART health {health}"
    left = wearout_left(disk)
    if left is not None and left < WEAROUT_LEFT_WARN:
        return f"{left:g}% of its rated life left"
    return None


def pool_problem(pool: dict) -> str | None:
    """Why a ZFS pool needs attention: a state other than ONLINE, or errors `zpool status` reports
    (anything but "No known data errors"), or a device with read, write or checksum errors, or a
    cache, log or spare device that cannot serve (docs/PROXMOX-BEHAVIOUR.md#zfs-pools)."""
    state = str(pool.get("state") or pool.get("health") or "")
    errors = str(pool.get("errors") or "No known data errors")
    if state and state != "ONLINE":
        return f"state {state}" + (f": {pool.get('status')}" if pool.get("status") else "")
    if not errors.startswith("No known data errors"):
        return f"errors: {errors}"
    bad = [d["name"] for d in vdevs(pool) if d.get("read") or d.get("write") or d.get("cksum")]
    if bad:
        return f"device errors on {', '.join(bad[:4])}"
    unserving = [f"{SECTION_NAMES[section]} {d['name']} {d.get('state')}" for section, d in pool_devices(pool)
                 if section != "data" and device_problem(section, d)]
    return "; ".join(unserving[:4]) or None


# `zpool status` lists these beside the pool's own vdevs, each a line with only its name and its
# devices below it (OpenZFS cmd/zpool/zpool_main.c: print_class_vdevs, print_l2cache, print_spares;
# pve-storage src/PVE/API2/Disks/ZFS.pm keeps them as the pool's siblings): docs/PROXMOX-BEHAVIOUR.md#zfs-pools
SECTION_NAMES = {"logs": "log device", "cache": "cache device", "spares": "spare", "special": "special device",
                 "dedup": "dedup device"}
SPARE_READY = ("AVAIL", "INUSE")  # a hot spare waiting, or one that took a failed disk's place


def pool_devices(pool: dict) -> list[tuple[str, dict]]:
    """(section, device) of each leaf device of a pool's `zpool status` tree: `data` for the pool's
    own vdevs, else the section (logs, cache, spares, special, dedup) it is listed under."""
    found = []
    for top in pool.get("children") or []:
        section = top["name"] if top.get("name") in SECTION_NAMES and "state" not in top else "data"
        found += [(section, d) for d in [top, *vdevs(top)] if not d.get("children")]
    return found


def device_problem(section: str, device: dict) -> bool:
    """A device that is not serving: any state but ONLINE (a spare: AVAIL or INUSE), or I/O errors."""
    healthy = SPARE_READY if section == "spares" else ("ONLINE",)
    return device.get("state") not in healthy or bool(device.get("read") or device.get("write") or device.get("cksum"))


def vdevs(node: dict) -> list[dict]:
    found = []
    for child in node.get("children") or []:
        found.append(child)
        found += vdevs(child)
    return found


# proxmox-kernel-6.8.12-4-pve-signed, pve-kernel-5.15.158-2-pve, proxmox-kernel-6.14.8-2-bpo12-pve-signed; not the
# meta packages (proxmox-kernel-6.8) or proxmox-kernel-helper
KERNEL_PACKAGE = re.compile(r"^(?:pve|proxmox)-kernel-(\d+\.\d+\.\d+-\d+(?:-[a-z0-9]+)*-pve)(?:-signed)?$")


def kernels(versions: list[dict]) -> dict:
    """The running kernel (proxmox-ve's RunningKernel) against the newest installed one: APT.pm's
    `versions` lists installed kernel packages newest first."""
    running = next((p.get("RunningKernel") for p in versions if p.get("RunningKernel")), None)
    installed = [m.group(1) for p in versions if p.get("CurrentState") == "Installed"
                 and (m := KERNEL_PACKAGE.match(str(p.get("Package", ""))))]
    newest = installed[0] if installed else None
    return compact({"kernel_running": running, "kernel_newest": newest,
                    "reboot_for_kernel": bool(running and newest and running != newest) or None})


def pending_updates(versions: list[dict], everything: list[dict] | None) -> tuple[list[dict], dict[str, int]]:
    """The packages with an update pending and their count by origin: the whole update list when it
    could be read (it needs Sys.Modify), else the packages `versions` lists (Proxmox's own and the
    kernels) whose candidate is not what is installed (docs/PROXMOX-BEHAVIOUR.md#pending-updates)."""
    pending = [p for p in versions if p.get("OldVersion") and p.get("Version") != p.get("OldVersion")]
    # versions lists proxmox-kernel-helper twice (among the kernels and in its fixed list): once each
    packages = everything if everything is not None else list({p.get("Package"): p for p in pending}.values())
    by_origin: dict[str, int] = {}
    for package in packages:
        origin = package.get("Origin") or "unknown"
        by_origin[origin] = by_origin.get(origin, 0) + 1
    return packages, by_origin


# ---------------------------------------------------------------- backup jobs

def vmid_set(text: Any) -> set[int]:
    """The vmids of a `pve-vmid-list` ("100,101")."""
    return {int(v) for v in str(text or "").split(",") if v.strip().isdigit()}


def job_selects(job: dict, guest: dict) -> tuple[bool, bool]:
    """(selects, excludes) as vzdump picks guests: by pool, else by vmid, else all minus
    `exclude` (which applies with all only); `node` limits any of them to that node's guests
    (docs/PROXMOX-BEHAVIOUR.md#backup-jobs-and-vzdump-prune)."""
    vmid = int(guest["vmid"])
    if job.get("node") and job["node"] != guest.get("node"):
        return False, False
    if job.get("pool"):
        return guest.get("pool") == job["pool"], False
    if job.get("vmid"):
        return vmid in vmid_set(job["vmid"]), False
    if str(job.get("all", 0)) == "1":
        excluded = vmid in vmid_set(job.get("exclude"))
        return not excluded, excluded
    return False, False


# ---------------------------------------------------------------- backups the token cannot see

BACKUP_ROLE = "BackupReader"  # the custom role the README's recipe adds (a role may not start with PVE)


def hidden_backups(client: ProxmoxClient, storage: str, vmids: list[int]) -> list[int]:
    """The guests whose backups on a storage this token's listing leaves out: PVE lists a backup
    only to a caller with Datastore.AllocateSpace on the storage and VM.Backup on the guest, or
    Datastore.Allocate (docs/PROXMOX-BEHAVIOUR.md#who-sees-which-volume). Told from the privileges
    read once; none while they are unknown."""
    host, where = client.host, f"/storage/{storage}"
    if privileges.holds(host, "Datastore.Allocate", where) is not False:
        return []
    if privileges.holds(host, "Datastore.AllocateSpace", where) is False:
        return sorted(vmids)
    return sorted(v for v in vmids if privileges.holds(host, "VM.Backup", f"/vms/{v}") is False)


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
    where = [f"{name} ({'every guest' if len(vmids) >= guests else 'guests ' + ', '.join(map(str, capped(vmids)))})"
             for name, vmids in sorted(hidden.items())]
    return {"not_visible": capped(where),
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

def backup_volumes(client: ProxmoxClient, vmid: int | None = None, storage: str | None = None, *,
                   near: str | None = None, rows: list[dict] | None = None) -> tuple[list[dict], dict]:
    """The backups on every storage that holds them, PBS-backed ones too, newest first (list_backups'
    rows, the restore drill's newest backup), each storage read side by side; with `near` (a guest's node)
    only the shared storages and that node's own; `rows`: the storage rows read already. And what the
    listing could not show: `not_read` storages, and the backups `not_visible` to this token (why, and the
    grant that shows them)."""
    found, unread, hidden = [], [], {}
    everything = storage_rows(client) if rows is None else rows
    vmids = [vmid] if vmid else sorted(g["vmid"] for g in guest_resources(client))
    chosen = [(name, node, shared) for name, node, shared in backup_storages(client, everything)
              if (not storage or name == storage) and (near is None or shared or node == near)]
    unseen_on = {name: hidden_backups(client, name, vmids) for name, _, _ in chosen}
    pbs, on_pbs = None, {}
    if any(unseen_on.values()):  # a PBS-backed storage PVE hides is read on the Backup Server itself
        pbs = _only_pbs()
        on_pbs = pbs_backed_storages(client, pbs) if pbs else {}
    reads, nodes = [], []
    for name, node, shared in chosen:
        unseen = unseen_on[name]
        if unseen and name in on_pbs:
            reads.append(lambda n=name: _pbs_backups(pbs, n, *on_pbs[n], vmid))
            nodes.append(None)
        elif len(unseen) < len(vmids):
            reads.append(lambda n=name, at=node, own=not shared: [  # each node's `local` is its own disk
                _backup_row(v, n, at if own else None) | {"read_on": at}
                for v in client.get(f"/nodes/{at}/storage/{n}/content", content="backup", vmid=vmid) or []])
            nodes.append(node)
        if unseen and name not in on_pbs:
            hidden[name] = unseen
    for listed in in_parallel(reads, nodes=nodes):
        if isinstance(listed, ToolFailure):
            raise listed
        found += listed
    for entry in everything:
        if "backup" in (entry.get("content") or "").split(",") and entry.get("status") != "available" \
                and (not storage or entry["storage"] == storage):
            unread.append(f"{entry['storage']} on {entry['node']} ({entry.get('status')})")
    found.sort(key=lambda r: -r["ctime"])
    notes = {"not_read": unread} if unread else {}
    return found, notes | (hidden_note(client, hidden, len(vmids)) if hidden else {})


def _backup_row(volume: dict, storage: str, node: str | None) -> dict:
    return {"volid": volume["volid"], "vmid": volume.get("vmid"), "storage": storage, "node": node,
            "size": human_bytes(volume.get("size")), "time": iso_time(volume.get("ctime")),
            "ctime": volume.get("ctime") or 0, "notes": volume.get("notes"),
            "protected": 1 if volume.get("protected") else None,
            "verify": (volume.get("verification") or {}).get("state")}


def _pbs_backups(pbs: ProxmoxClient, storage: str, store: str, ns: str, vmid: int | None) -> list[dict]:
    """A PBS-backed storage's backups read on the Backup Server itself, named as PVE names them
    (`<storage>:backup/vm/<vmid>/<UTC time>`, docs/PROXMOX-BEHAVIOUR.md#pbs-backed-volumes)."""
    found = []
    for snap in pbs.get(f"/admin/datastore/{store}/snapshots", ns=ns or None,
                        **({"backup-id": str(vmid)} if vmid else {})) or []:
        if snap.get("backup-type") in ("vm", "ct") and str(snap.get("backup-id", "")).isdigit():
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(snap["backup-time"]))
            found.append(_backup_row({"volid": f"{storage}:backup/{snap['backup-type']}/{snap['backup-id']}/{stamp}",
                                      "vmid": int(snap["backup-id"]), "size": snap.get("size"),
                                      "ctime": snap["backup-time"], "notes": snap.get("comment"),
                                      "protected": snap.get("protected"), "verification": snap.get("verification")},
                                     storage, None))
    return found


def pbs_of(label: str | None) -> ProxmoxClient | None:
    """The Backup Server a report reads: the one named, else the one configured if exactly one is."""
    if label is None and len(configured("pbs")) != 1:
        return None
    return pbs_client(label)


def _only_pbs() -> ProxmoxClient | None:
    """The Backup Server to read PBS-backed storages on: the one configured, if exactly one is."""
    return pbs_client() if len(configured("pbs")) == 1 else None


# ---------------------------------------------------------------- HA resources that failed

# HA states in which a request has failed or the guest's node is lost, with the way out
# (docs/PROXMOX-BEHAVIOUR.md#ha-managed-guests)
HA_FAILED = {
    "error": "the HA manager could not start it and holds it in state error, where it ignores every request "
             "until the resource is disabled. Find why (list_tasks vmid={vmid} errors=true on its nodes), fix it, "
             "disable it (`ha-manager set {sid} --state disabled` on a node, or write_call_api PUT "
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
