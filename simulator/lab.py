"""The simulated world: nodes, guests, storage, tasks, PBS datastores, tokens and faults.

`Lab` holds the state behind both products; `Token` carries an ACL and answers privilege
questions; `Task` is a running or finished task with a real UPID and a log. Nothing here
knows about HTTP: the handlers in `pve.py`, `pve_guests.py` and `pbs.py` read and change a `Lab`.
"""
from __future__ import annotations

import functools
import hashlib
import random
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import catalog

GiB = 1024 ** 3
# Left out of the config a backup keeps (qemu-server VZDump/QemuServer.pm assemble, pve-container
# VZDump/LXC.pm assemble; docs/PROXMOX-BEHAVIOUR.md#configs-inside-backups).
NOT_IN_BACKUP = re.compile(r"unused\d+|lock|parent|snapstate|digest|pending")


def backup_config(config: dict) -> dict:
    """The config a backup keeps: the main section without unused disks, lock and parent."""
    return {k: v for k, v in config.items() if not NOT_IN_BACKUP.fullmatch(k)}

# Built-in roles, reduced to the privileges the simulator checks (PVE 9 names; PVE 8 in `roles_for`).
# PVE's groups: pve-access-control src/PVE/AccessControl.pm ($privgroups); PBS's: pbs-api-types src/acl.rs.
ROLES = {
    "Administrator": {"*"},
    "NoAccess": set(),
    "PVEAuditor": {"Sys.Audit", "VM.Audit", "Datastore.Audit", "Pool.Audit", "SDN.Audit", "Mapping.Audit",
                   "VM.GuestAgent.Audit"},
    "PVEVMUser": {"VM.Audit", "VM.PowerMgmt", "VM.Console", "VM.Backup", "VM.Config.CDROM",
                  "VM.Config.Cloudinit", "VM.GuestAgent.Audit", "VM.GuestAgent.FileRead", "VM.GuestAgent.FileWrite",
                  "VM.GuestAgent.FileSystemMgmt"},
    "PVEVMAdmin": {"VM.Audit", "VM.PowerMgmt", "VM.Console", "VM.Backup", "VM.Snapshot", "VM.Snapshot.Rollback",
                   "VM.Clone", "VM.Allocate", "VM.Migrate", "VM.Config.Disk", "VM.Config.CPU",
                   "VM.Config.Memory", "VM.Config.Network", "VM.Config.Options", "VM.Config.HWType",
                   "VM.Config.Cloudinit", "VM.Config.CDROM", "VM.GuestAgent.Audit", "VM.Replicate",
                   "VM.GuestAgent.Unrestricted", "VM.GuestAgent.FileRead", "VM.GuestAgent.FileWrite",
                   "VM.GuestAgent.FileSystemMgmt"},
    "PVEDatastoreUser": {"Datastore.AllocateSpace", "Datastore.Audit"},
    "PVEDatastoreAdmin": {"Datastore.Allocate", "Datastore.AllocateSpace", "Datastore.AllocateTemplate",
                          "Datastore.Audit"},
    "DatastoreAudit": {"Datastore.Audit"},
    "DatastoreReader": {"Datastore.Audit", "Datastore.Read", "Datastore.Verify"},
    "DatastoreBackup": {"Datastore.Backup"},
    "DatastorePowerUser": {"Datastore.Prune", "Datastore.Backup"},
    "DatastoreAdmin": {"Datastore.Audit", "Datastore.Modify", "Datastore.Read", "Datastore.Verify",
                       "Datastore.Backup", "Datastore.Prune"},
    "Audit": {"Sys.Audit", "Datastore.Audit"},
    # the custom role the README's recipe adds so that the read token sees backups (a backup is listed only
    # to a caller who could make one: docs/PROXMOX-BEHAVIOUR.md#who-sees-which-volume)
    "BackupReader": {"Datastore.AllocateSpace", "VM.Backup"},
    "Admin": {"*"},
}


@functools.lru_cache(maxsize=None)
def all_privileges(product: str) -> frozenset[str]:
    """Every privilege the API's permission checks name: what Administrator holds."""
    found: set[str] = set()

    def walk(check: Any) -> None:
        if isinstance(check, dict):
            found.update(check.get("privs", []))
        elif isinstance(check, list):
            for item in check:
                if isinstance(item, list) and item and all(isinstance(x, str) for x in item) and \
                        all(re.fullmatch(r"[A-Z][A-Za-z]+(\.[A-Za-z]+)+", x) for x in item):
                    found.update(item)
                else:
                    walk(item)
    for entry in catalog.methods(product):
        walk(entry.get("check"))
    if product == "pve":  # named only in handler code, not in the schema's checks
        found |= {"VM.Backup", "VM.Replicate", "Permissions.Modify"}
    else:  # likewise (pbs-api-types src/acl.rs PRIV_DATASTORE_*)
        found |= {"Datastore.Read", "Datastore.Verify", "Datastore.Prune"}
    return frozenset(found)


def _pve8(privileges: set[str] | frozenset[str]) -> set[str]:
    """PVE 8 has no VM.GuestAgent.* privileges; its agent calls check VM.Monitor, which the
    admin group (PVEVMAdmin, PVEAdmin) holds (docs/PROXMOX-BEHAVIOUR.md#agent-privileges-by-version)."""
    kept = {p for p in privileges if not p.startswith("VM.GuestAgent.")}
    return kept | {"VM.Monitor"} if "VM.GuestAgent.Unrestricted" in privileges else kept


@functools.lru_cache(maxsize=None)
def roles_for(product: str, pve_major: int = 9) -> dict[str, frozenset[str]]:
    """The roles with Administrator's "*" spelled out, as one product and version has them."""
    roles = {}
    for name, privileges in ROLES.items():
        held = all_privileges(product) if "*" in privileges else frozenset(privileges)
        roles[name] = frozenset(_pve8(held)) if product == "pve" and pve_major < 9 else held
    return roles


Privileges = dict[str, bool]  # privilege -> whether it propagates to paths below


@dataclass
class Token:
    """The rights of an API token (or a user: the `owner` of a token). A token holds, on each
    path, what its own ACL grants intersected with what its owner holds; with `privsep` off
    (PVE only), exactly what its owner holds. `owner` None stands for root@pam, who holds
    everything (docs/PROXMOX-BEHAVIOUR.md#privilege-separation)."""
    secret: str
    acl: list[tuple[str, str, bool]] = field(default_factory=list)  # (path, role, propagate)
    privsep: bool = True
    owner: "Token | None" = None

    def own_privileges(self, path: str, roles: dict[str, frozenset[str]], pool: str | None = None) -> Privileges:
        """What this entry's own ACL grants on a path: the most specific level with an entry
        wins (the exact path, else the nearest parent with propagate); roles of the guest's pool
        add privileges that never propagate (pve-access-control RPCEnvironment.pm, $compile_acl_path)."""
        parts = [p for p in path.split("/") if p]
        held: Privileges = {}
        for depth in range(len(parts), -1, -1):
            level = "/" + "/".join(parts[:depth])
            entries = [(role, propagate) for acl_path, role, propagate in self.acl
                       if ("/" + acl_path.strip("/")) == level and (propagate or depth == len(parts))]
            if entries:
                for role, propagate in entries:
                    for privilege in roles[role]:
                        held[privilege] = held.get(privilege, False) or bool(propagate)
                break
        if pool:
            for privilege in self.own_privileges(pool, roles):
                held.setdefault(privilege, False)
        return held

    def privileges(self, path: str, roles: dict[str, frozenset[str]], pool: str | None = None) -> Privileges:
        if self.owner is None:
            return self.own_privileges(path, roles, pool)
        of_owner = self.owner.privileges(path, roles, pool)
        if not self.privsep:
            return of_owner
        own = self.own_privileges(path, roles, pool)
        return {p: flag and of_owner[p] for p, flag in own.items() if p in of_owner}

    def has(self, path: str, privilege: str, roles: dict[str, frozenset[str]], pool: str | None = None) -> bool:
        return privilege in self.privileges(path, roles, pool)

    def acl_paths(self) -> set[str]:
        own = {"/" + path.strip("/") if path.strip("/") else "/" for path, _, _ in self.acl}
        return own | (self.owner.acl_paths() if self.owner else set())


def escape_id(text: str) -> str:
    """A PBS worker id as its UPID carries it, systemd-escaped: `/` becomes `-`, any other byte
    outside [A-Za-z0-9_.] (and a leading `.`) `\\xNN` (proxmox-rs proxmox-schema/src/upid.rs, escape_id;
    docs/PROXMOX-BEHAVIOUR.md#upids)."""
    out = []
    for index, byte in enumerate(text.encode()):
        char = chr(byte)
        if char == "/":
            out.append("-")
        elif (index == 0 and char == ".") or not (char.isascii() and (char.isalnum() or char in "_.")):
            out.append(f"\\x{byte:02x}")
        else:
            out.append(char)
    return "".join(out)


UNITS = {"": 1, "K": 1024, "M": 1024 ** 2, "G": GiB, "T": 1024 ** 4}


def size_bytes(value: str) -> int:
    """The bytes a disk's `size=` says (`32G`, `2252M`, ...); 0 when it says none."""
    match = re.search(r"size=(\d+(?:\.\d+)?)([KMGT]?)", value)
    return int(float(match.group(1)) * UNITS[match.group(2)]) if match else 0


def format_size(size: int) -> str:
    """A size as Proxmox writes it into a config: the largest unit that divides it exactly
    (pve-common src/PVE/JSONSchema.pm format_size): 32G, 2252M."""
    for unit in ("T", "G", "M", "K"):
        if size % UNITS[unit] == 0:
            return f"{size // UNITS[unit]}{unit}"
    return str(size)


@dataclass
class Task:
    upid: str
    node: str
    type: str
    id: str
    user: str
    started: float  # time.time()
    duration: float
    lines: list[str]  # log lines spread over the run, the last one ends the task
    exitstatus: str = "OK"
    on_done: Callable[[], None] | None = None  # on success
    on_end: Callable[[], None] | None = None  # always (releases locks)
    done: bool = False

    def running(self, now: float) -> bool:
        return now < self.started + self.duration

    def last_line(self) -> str:
        if self.exitstatus == "OK":
            return "TASK OK"
        if self.exitstatus.startswith("WARNINGS"):
            return f"TASK {self.exitstatus}"
        return f"TASK ERROR: {self.exitstatus}"

    def log(self, now: float) -> list[str]:
        if not self.running(now):
            return self.lines + [self.last_line()]
        shown = int(len(self.lines) * (now - self.started) / max(self.duration, 1e-6))
        return self.lines[:max(1, shown)]


class Lab:
    """The simulated world: one PVE cluster and one PBS, plus tokens and faults."""

    def __init__(self, *, cluster_name: str = "homelab", seed: int = 7, pve_major: int = 9):
        self.cluster_name = cluster_name
        self.pve_major = pve_major  # 8 or 9: the /version answer and the agent privileges follow it
        # the Backup Server's release; older ones lack what pbs.SINCE names (docs/PROXMOX-BEHAVIOUR.md#pbs-releases)
        self.pbs_release: tuple[int, int, int] = (4, 1, 11)
        self.pbs_timezone = "UTC"  # the Backup Server's local time, in which prune counts its periods
        self.random = random.Random(seed)
        self.lock = threading.RLock()
        self.nodes: dict[str, dict] = {}
        self.guests: dict[int, dict] = {}
        self.storages: dict[str, dict] = {}
        self.pools: dict[str, dict] = {}
        self.tasks: dict[str, Task] = {}
        self.datastores: dict[str, dict] = {}
        self.networks: dict[str, list[dict]] = {}  # node -> interfaces
        self.vnets: dict[str, dict] = {}  # SDN vnets on every node: name -> {zone, vlanaware, alias}
        self.offline_storages: set[tuple[str, str]] = set()  # (node, storage) that report no usage
        self.volumes: dict[str, list[dict]] = {}  # storage -> volumes other than guest disks
        self.pbs_jobs: dict[str, list[dict]] = {}  # "sync" | "verify" | "prune" -> jobs
        self.backup_jobs: list[dict] = []  # /cluster/backup
        self.ha_rules: dict[str, dict] = {}  # /cluster/ha/rules (PVE 9): rule id -> its config
        self.ha_groups: dict[str, dict] = {}  # /cluster/ha/groups (PVE 8): group -> its config
        self.sdn_ipams: list[dict] = []  # /cluster/sdn/ipams, their API tokens included
        self.sdn_dns: list[dict] = []  # /cluster/sdn/dns, their API keys included
        self.metric_servers: dict[str, dict] = {}  # /cluster/metrics/server/{id}, as status.cfg holds them
        self.created_tokens: list[str] = []  # the secrets of API tokens created through the API
        self.acme_plugins: list[dict] = []  # /cluster/acme/plugins, DNS API credentials in `data`
        self.acl: list[dict] = []  # /access/acl as the access system holds it
        self.users: list[dict] = []  # /access/users?full=1, tokens included
        # the firewall of the cluster, of each node and of each guest (simulator/pve_firewall.py)
        self.firewall: dict[str, Any] = {"cluster": {"options": {}, "rules": [], "groups": {}, "group_comments": {},
                                                     "ipsets": {}, "aliases": {}}, "hosts": {}, "guests": {}}
        self.cert_days: dict[str, int] = {}  # node -> days until its certificate expires
        self.replication: dict[str, list[dict]] = {}  # node -> replication job states
        # roles an admin made (pveum role add NAME --privs ...): product -> name -> privileges
        self.custom_roles: dict[str, dict[str, frozenset[str]]] = {"pve": {}, "pbs": {}}
        self.pve_tokens: dict[str, Token] = {}
        self.pbs_tokens: dict[str, Token] = {}
        # password logins: product -> userid -> (password, the user's rights, needs a second factor)
        self.logins: dict[str, dict[str, tuple[str, Token, bool]]] = {"pve": {}, "pbs": {}}
        self.tickets: dict[str, tuple[str, str, str, float]] = {}  # ticket -> (product, userid, csrf, issued)
        self.ticket_lifetime = 7200.0  # real tickets expire after 2 h
        self.task_seconds = 0.6  # how long a simulated task runs
        self.ha_seconds = 0.4  # how long the HA manager takes to act on a queued request
        # node power (simulator/pve_node_power.py): datacenter.cfg (its `ha` shutdown_policy), the nodes in HA
        # maintenance mode, how long after the call a node goes down and how long a reboot takes
        self.datacenter: dict[str, str] = {"keyboard": "en-us"}
        self.ha_maintenance: set[str] = set()
        self.ha_disarm: str | None = None  # `ha-manager crm-command disarm-ha freeze|ignore`: its mode
        self.node_command_seconds = 0.05
        self.reboot_seconds = 0.5
        self.node_commands: list[tuple[str, str]] = []  # (node, command) of each reboot or shutdown asked
        self.later: list[tuple[float, Callable[[], None]]] = []  # (when, effect): the HA manager's work
        # faults, switched on by tests
        self.down_nodes: set[str] = set()
        self.delay = 0.0
        # each node's API workers (simulator/api.py `_worker`): at most this many requests at once per node
        self.workers_per_node = 3
        self.workers: dict[tuple[str, str], threading.Semaphore] = {}
        self.in_flight: dict[tuple[str, str], int] = {}
        self.most_at_once: dict[tuple[str, str], int] = {}  # (product, node or "") -> the most seen at once
        self.slow_paths: dict[str, float] = {}  # path regex -> seconds, for one slow endpoint
        self.fail: list[tuple[str, int, str]] = []  # (path regex, status, message)
        self.legacy_errors = False  # before libpve-http-server-perl 5.2.0: message only in the reason
        self.auth_fail_delay = 0.0  # real servers delay every 401 by about 3 s
        # what was asked, for tests that count requests
        self.requests: list[tuple[str, str, str]] = []
        self.request_tokens: list[str] = []  # the token id of each request, in the same order
        self.schema_rejections: list[tuple[str, str, str, dict]] = []
        self._pid = 0x1000

    # ------------------------------------------------------------ building state

    @classmethod
    def homelab(cls, nodes: int = 3, guests: int = 6, seed: int = 7, pve_major: int = 9) -> "Lab":
        """A small cluster: `nodes` nodes, `guests` guests (QEMU and LXC mixed), local and
        shared storage, a pool, finished tasks, a PBS with one datastore, and three tokens."""
        lab = cls(seed=seed, pve_major=pve_major)
        names = ["pve1", "pve2", "pve3"] if nodes == 3 else [f"pve{i + 1}" for i in range(nodes)]
        lab._add_homelab_nodes(names)
        lab._add_homelab_guests(names, guests)
        lab.start_task(names[0], "vzdump", "100", exitstatus="OK", finished=True)
        lab.start_task(names[1], "qmstart", "101", exitstatus="OK", finished=True)
        lab.start_task(names[0], "vzdump", "104", exitstatus="job errors", finished=True)
        for name in names:  # pveupdate's daily package list refresh (docs/PROXMOX-BEHAVIOUR.md#pending-updates)
            lab.start_task(name, "aptupdate", "", finished=True)
        lab.add_datastore("backup", total=4000 * GiB, used=1200 * GiB)
        lab._add_homelab_networks(names)
        lab._add_homelab_volumes()
        lab._add_homelab_users()
        lab.cert_days = {name: 300 for name in names}
        lab.firewall["cluster"]["options"]["enable"] = 1  # on, with no rules: the management IP set lets the LAN in
        lab._add_homelab_tokens()
        return lab

    def _add_homelab_nodes(self, names: list[str]) -> None:
        """The nodes, each with a fresh install's `local` and `local-lvm`, and the shared PBS storage.
        The installer writes `local` (dir) for iso, vztmpl, backup (and import since its PVE 9 version)
        and `local-lvm` (lvmthin) for images and rootdir (docs/PROXMOX-BEHAVIOUR.md#a-fresh-install)."""
        for index, name in enumerate(names):
            self.add_node(name, maxcpu=8 if index else 16, maxmem=(32 if index else 64) * GiB)
        local = "iso,vztmpl,backup,import" if self.pve_major >= 9 else "iso,vztmpl,backup"
        for name in names:
            self.add_storage("local", "dir", local, node=name, total=100 * GiB, used=31 * GiB)
            self.add_storage("local-lvm", "lvmthin", "images,rootdir", node=name, total=400 * GiB, used=120 * GiB)
        self.add_storage("pbs", "pbs", "backup", total=4000 * GiB, used=1200 * GiB, shared=True)
        # where the PBS storage writes: the simulated Backup Server's root namespace of "backup"
        self.storages["pbs"]["config"] = {"server": "127.0.0.1", "datastore": "backup", "username": "pve@pbs",
                                          "fingerprint": "AB:" * 31 + "AB"}

    def _add_homelab_guests(self, names: list[str], count: int) -> None:
        """The `prod` pool and `count` guests from the presets, spread over the nodes."""
        self.pools["prod"] = {"poolid": "prod", "comment": "production"}
        presets = [("web", "qemu", "running", "prod;web", 4096), ("db", "qemu", "running", "prod", 8192),
                   ("dns", "lxc", "running", "infra", 512), ("media", "lxc", "stopped", "", 2048),
                   ("win11", "qemu", "stopped", "", 8192), ("ci-runner", "lxc", "running", "ci", 4096)]
        for i in range(count):
            name, kind, status, tags, memory = presets[i % len(presets)]
            if i >= len(presets):
                name = f"{name}-{i}"
                status = self.random.choice(["running", "running", "stopped"])
            guest = self.add_guest(100 + i, kind, names[i % len(names)], name, status=status, tags=tags,
                                   pool="prod" if "prod" in tags else None, memory_mib=memory)
            if name.startswith("win"):
                guest["config"]["ostype"] = "win11"

    def _add_homelab_networks(self, names: list[str]) -> None:
        """Each node's uplink, VLAN-aware bridge and isolated bridge."""
        for index, name in enumerate(names):
            self.networks[name] = [
                {"iface": "eno1", "type": "eth", "active": 1, "autostart": 1},
                {"iface": "vmbr0", "type": "bridge", "active": 1, "autostart": 1, "bridge_ports": "eno1",
                 "bridge_vlan_aware": 1, "cidr": f"192.0.2.{11 + index}/24", "gateway": "192.0.2.1"},
                {"iface": "vmbr1", "type": "bridge", "active": 1, "autostart": 1, "bridge_ports": "",
                 "comments": "isolated lab segment\n"},
            ]

    def _add_homelab_volumes(self) -> None:
        """An ISO, a container template, last night's backup of every running guest on its node's
        own `local` (file names in the node's local time), and the nightly job to the PBS storage."""
        now = int(time.time())
        self.add_volume("local", "local:iso/debian-13.1.0-amd64-netinst.iso", "iso", 754 * 1024 ** 2)
        self.add_volume("local", "local:vztmpl/debian-13-standard_13.1-2_amd64.tar.zst", "vztmpl", 126 * 1024 ** 2)
        for vmid, guest in self.guests.items():
            if guest["status"] == "running":
                kind = "qemu" if guest["type"] == "qemu" else "lxc"
                stamp = time.strftime("%Y_%m_%d-%H_%M_%S", time.localtime(now - 86400))
                ext = "vma.zst" if kind == "qemu" else "tar.zst"
                self.add_volume("local", f"local:backup/vzdump-{kind}-{vmid}-{stamp}.{ext}", "backup", 2 * GiB,
                                vmid=vmid, ctime=now - 86400, node=guest["node"])
                self.volumes["local"][-1]["_config"] = backup_config(guest["config"])
        self.backup_jobs = [{"id": "backup-nightly", "type": "vzdump", "schedule": "02:00", "enabled": 1, "all": 1,
                             "exclude": "104", "storage": "pbs", "mode": "snapshot"}]

    def _add_homelab_users(self) -> None:
        """The users and ACL entries that /access/users and /access/acl list."""
        self.users = [{"userid": "root@pam", "enable": 1, "expire": 0,
                       "tokens": [{"tokenid": "admin", "privsep": 0, "expire": 0}]},
                      {"userid": "mcp@pve", "enable": 1, "expire": 0,
                       "tokens": [{"tokenid": "reader", "privsep": 1, "expire": int(time.time()) + 180 * 86400},
                                  {"tokenid": "empty", "privsep": 1, "expire": int(time.time()) + 180 * 86400}]}]
        self.acl = [{"path": "/", "type": "token", "ugid": "mcp@pve!reader", "roleid": "PVEAuditor", "propagate": 1},
                    {"path": "/", "type": "user", "ugid": "mcp@pve", "roleid": "PVEAuditor", "propagate": 1},
                    {"path": "/", "type": "user", "ugid": "root@pam", "roleid": "Administrator", "propagate": 1}]

    def _add_homelab_tokens(self) -> None:
        """The API tokens and password logins the simulated servers accept."""
        # tokens hold what both they and their user are granted (docs/PROXMOX-BEHAVIOUR.md#privilege-separation)
        mcp_pve = Token("", [("/", "PVEAuditor", True)])
        self.pve_tokens["mcp@pve!reader"] = Token("11111111-2222-3333-4444-555555555555",
                                                  [("/", "PVEAuditor", True)], owner=mcp_pve)
        self.pve_tokens["root@pam!admin"] = Token("aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
                                                  [("/", "Administrator", True)], privsep=False)
        self.pve_tokens["mcp@pve!empty"] = Token("99999999-8888-7777-6666-555555555555", [], owner=mcp_pve)
        # the README's reader with the optional grant that shows backups, given to the user and the token
        lister = [("/", "PVEAuditor", True), ("/", "BackupReader", True)]
        self.pve_tokens["mcp@pve!backups"] = Token("77777777-6666-5555-4444-333333333333", lister,
                                                   owner=Token("", lister))
        # a write token as examples/operator.env pairs with the reader: guests and storage space, no Sys.*
        operator = [("/", "PVEVMAdmin", True), ("/", "PVEDatastoreUser", True)]
        self.pve_tokens["ops@pve!operator"] = Token("55555555-4444-3333-2222-111111111111", operator,
                                                    owner=Token("", operator))
        self.pbs_tokens["root@pam!admin"] = Token("pbs-admin-secret-9876543210", [("/", "Admin", True)])
        # the README's PBS recipe: Audit on /, DatastoreAudit on /datastore (lists, never reads contents)
        mcp_pbs = Token("", [("/", "Audit", True), ("/datastore", "DatastoreAudit", True)])
        self.pbs_tokens["mcp@pbs!reader"] = Token("pbs-reader-secret-0123456789",
                                                  [("/", "Audit", True), ("/datastore", "DatastoreAudit", True)],
                                                  owner=mcp_pbs)
        self.logins["pve"]["ops@pve"] = ("sim-ops-password-4711", Token("", [("/", "PVEVMAdmin", True),
                                                                            ("/", "PVEAuditor", True)]), False)
        # root@pam by password: the only caller of a method without `permissions` (execute, wipedisk, ...)
        self.logins["pve"]["root@pam"] = ("sim-root-password-4710", Token("", [("/", "Administrator", True)]), False)
        self.logins["pve"]["tfa@pve"] = ("sim-tfa-password-4712", Token("", [("/", "PVEAuditor", True)]), True)
        self.logins["pbs"]["ops@pbs"] = ("sim-pbs-password-4713", Token(
            "", [("/", "Audit", True), ("/datastore", "DatastoreReader", True)]), False)

    def expire_tickets(self) -> None:
        """Make every ticket issued so far older than its lifetime (two hours pass)."""
        with self.lock:
            self.tickets = {t: (p, u, c, issued - self.ticket_lifetime - 1) for t, (p, u, c, issued)
                            in self.tickets.items()}

    @classmethod
    def scale(cls, nodes: int = 20, guests: int = 5000, seed: int = 7) -> "Lab":
        return cls.homelab(nodes=nodes, guests=guests, seed=seed)

    def add_node(self, name: str, *, maxcpu: int = 8, maxmem: int = 32 * GiB) -> None:
        self.nodes[name] = {"node": name, "status": "online", "maxcpu": maxcpu, "maxmem": maxmem,
                            "cpu": round(self.random.uniform(0.02, 0.4), 4),
                            "mem": int(maxmem * self.random.uniform(0.2, 0.7)),
                            "maxdisk": 100 * GiB, "disk": int(100 * GiB * self.random.uniform(0.1, 0.5)),
                            "uptime": self.random.randint(3600, 90 * 86400), "level": "",
                            "kversion": "Linux 6.14.11-2-pve #1 SMP PREEMPT_DYNAMIC PMX 6.14.11-2",
                            "loadavg": [f"{self.random.uniform(0, 2):.2f}" for _ in range(3)]}

    def add_storage(self, storage: str, kind: str, content: str, *, node: str | None = None,
                    total: int, used: int, shared: bool = False) -> None:
        entry = self.storages.setdefault(storage, {"storage": storage, "type": kind, "content": content,
                                                   "shared": int(shared), "nodes": [], "total": total,
                                                   "used": used})
        if node:
            entry["nodes"].append(node)

    def pbs_volumes(self, storage: str) -> list[dict]:
        """The backups a PVE storage of type pbs shows: the snapshots of its datastore's namespace
        (root without `namespace`), named `<storage>:backup/<type>/<id>/<time>` (pve-storage
        src/PVE/Storage/PBSPlugin.pm, list_volumes; docs/PROXMOX-BEHAVIOUR.md#pbs-backed-volumes)."""
        config = self.storages[storage].get("config", {})
        ds = self.datastores.get(config.get("datastore", ""))
        if ds is None:
            return []
        volumes = []
        for (ns, kind, item), snaps in sorted(ds["groups"].items()):
            if ns != config.get("namespace", "") or kind not in ("vm", "ct") or not item.isdigit():
                continue
            for snap in snaps:
                stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(snap["backup-time"]))
                volume = {"volid": f"{storage}:backup/{kind}/{item}/{stamp}", "content": "backup",
                          "format": f"pbs-{kind}", "size": snap["size"], "vmid": int(item),
                          "ctime": snap["backup-time"], "subtype": "qemu" if kind == "vm" else "lxc"}
                if snap["verification"]:
                    volume["verification"] = snap["verification"]
                if snap["protected"]:
                    volume["protected"] = 1
                if snap["comment"]:
                    volume["notes"] = snap["comment"]
                volumes.append(volume | {"_config": snap.get("config") or {}})
        return volumes

    def roles(self, product: str) -> dict[str, frozenset[str]]:
        built_in = roles_for(product, self.pve_major if product == "pve" else 9)
        return built_in | self.custom_roles[product] if self.custom_roles[product] else built_in

    def pool_path(self, path: str) -> str | None:
        """`/pool/<name>` when `path` is a guest in that pool: its roles reach the guest (PVE)."""
        match = re.fullmatch(r"/vms/(\d+)", path)
        guest = self.guests.get(int(match.group(1))) if match else None
        return f"/pool/{guest['pool']}" if guest and guest.get("pool") else None

    def storage_nodes(self, storage: dict) -> list[str]:
        return list(self.nodes) if storage["shared"] else storage["nodes"]

    def add_guest(self, vmid: int, kind: str, node: str, name: str, *, status: str = "stopped",
                  tags: str = "", pool: str | None = None, memory_mib: int = 2048, cores: int = 2,
                  disk_gib: int = 32) -> dict:
        config: dict[str, Any] = {"memory": memory_mib, "cores": cores, "digest": self._digest(vmid)}
        if kind == "qemu":
            config |= {"name": name, "ostype": "l26", "scsihw": "virtio-scsi-single", "agent": "1",
                       "scsi0": f"local-lvm:vm-{vmid}-disk-0,size={disk_gib}G",
                       "net0": f"virtio=BC:24:11:{vmid // 256 % 256:02X}:{vmid % 256:02X}:01,bridge=vmbr0",
                       "boot": "order=scsi0;net0", "sockets": 1}
        else:
            config |= {"hostname": name, "ostype": "debian", "arch": "amd64", "swap": 512,
                       # lvmthin holds raw volumes only, named vm-<id>-disk-N for containers too
                       # (docs/PROXMOX-BEHAVIOUR.md#a-fresh-install)
                       "rootfs": f"local-lvm:vm-{vmid}-disk-0,size={disk_gib}G",
                       "net0": f"name=eth0,bridge=vmbr0,hwaddr=BC:24:11:{vmid % 256:02X}:00:01,ip=dhcp",
                       "unprivileged": 1}
        if tags:
            config["tags"] = tags
        # status is running or stopped only; a paused VM is running with `paused` set, an HA resource
        # has `ha` {"state": ...}, and `pending` holds changes waiting for a restart
        # (docs/PROXMOX-BEHAVIOUR.md#guest-status, #ha-managed-guests, #pending-config)
        guest = {"vmid": vmid, "type": kind, "node": node, "name": name, "status": status, "template": 0,
                 "snapshots": [], "paused": False, "ha": None, "pending": {},
                 "tags": tags, "pool": pool, "lock": None, "config": config, "maxdisk": disk_gib * GiB,
                 "uptime": self.random.randint(600, 40 * 86400) if status == "running" else 0,
                 "cpu": round(self.random.uniform(0.0, 0.3), 4) if status == "running" else 0}
        self.guests[vmid] = guest
        return guest

    def add_volume(self, storage: str, volid: str, content: str, size: int, *, vmid: int | None = None,
                   ctime: int | None = None, node: str | None = None) -> None:
        """A volume; with `node` on a storage that is not shared, it exists on that node only
        (each node's `local` is its own disk)."""
        fmt = {"iso": "iso", "vztmpl": "tzst"}.get(content) or re.sub(r"^[^.]*\.", "", volid.rsplit("/", 1)[-1])
        volume = {"volid": volid, "content": content, "size": size, "format": fmt,
                  "ctime": ctime or int(time.time())}
        if vmid is not None:
            volume["vmid"] = vmid
        if node and not self.storages.get(storage, {}).get("shared"):
            volume["_node"] = node
        self.volumes.setdefault(storage, []).append(volume)

    def guest_disks(self, storage: str, node: str) -> list[dict]:
        """Volumes that guests' configs reference on a storage (disk-like keys only)."""
        found = []
        for vmid, guest in self.guests.items():
            if guest["node"] != node and not self.storages.get(storage, {}).get("shared"):
                continue
            for key, value in guest["config"].items():
                if not isinstance(value, str) or not value.startswith(storage + ":"):
                    continue
                if re.fullmatch(r"(scsi|virtio|sata|ide|efidisk|tpmstate|unused)\d+|rootfs|mp\d+", key):
                    volid = value.split(",")[0]
                    found.append({"volid": volid, "content": "images" if guest["type"] == "qemu" else "rootdir",
                                  "vmid": vmid, "format": "raw", "size": size_bytes(value), "ctime": 0})
        return found

    def add_datastore(self, name: str, *, total: int, used: int) -> None:
        """A datastore with three daily snapshots of every running guest, in the root namespace."""
        now = int(time.time())
        groups: dict[tuple[str, str, str], list[dict]] = {}
        for vmid, guest in self.guests.items():
            if guest["status"] != "running":
                continue  # stopped guests have no backup: a finding for backup_coverage later
            kind = "vm" if guest["type"] == "qemu" else "ct"
            groups[("", kind, str(vmid))] = [self.pbs_snapshot(now - days * 86400 - 3600, config=guest["config"])
                                             for days in range(3)]
        # gc-status holds counters only; the last run's time and state are the GC job's
        # (docs/PROXMOX-BEHAVIOUR.md#garbage-collection); `error` makes the store unavailable
        gc_upid = f"UPID:pbs:000003E8:0000A1B2:{len(self.datastores):08X}:{now - 86400 - 300:08X}:" \
                  f"garbage_collection:{name}:root@pam:"
        self.datastores[name] = {"store": name, "total": total, "used": used, "groups": groups,
                                 "namespaces": {"": "", "offsite": "copies from the office"},
                                 "gc": {"upid": gc_upid, "index-file-count": 120, "index-data-bytes": 90 * GiB,
                                        "disk-bytes": used, "disk-chunks": 51234, "removed-bytes": 2 * GiB,
                                        "removed-chunks": 812, "pending-bytes": 0, "pending-chunks": 0,
                                        "removed-bad": 0, "still-bad": 0},
                                 "gc_job": {"schedule": "daily", "last-run-state": "OK",
                                            "last-run-endtime": now - 86400, "duration": 300,
                                            "next-run": now + 3600},
                                 "error": None}
        # job states are the task state text: OK, WARNINGS: n, the error, unknown (docs/PROXMOX-BEHAVIOUR.md#pbs-jobs)
        self.pbs_jobs.setdefault("verify", []).append(
            {"id": f"v-{name}", "store": name, "schedule": "daily", "last-run-state": "OK",
             "last-run-endtime": now - 7200, "next-run": now + 79200})
        self.pbs_jobs.setdefault("prune", []).append(
            {"id": f"p-{name}", "store": name, "schedule": "hourly", "keep-last": 3, "keep-daily": 7,
             "last-run-state": "OK", "last-run-endtime": now - 1800, "next-run": now + 1800})
        self.pbs_jobs.setdefault("sync", []).append(
            {"id": f"s-{name}", "store": name, "remote": "office", "remote-store": "backup", "schedule": "weekly",
             "last-run-state": "sync failed - remote unreachable", "last-run-endtime": now - 3 * 86400,
             "next-run": now + 4 * 86400})
        self.pbs_jobs["sync"].append(
            {"id": f"push-{name}", "store": name, "remote": "offsite", "remote-store": "copies", "schedule": "daily",
             "sync-direction": "push", "last-run-state": "OK", "last-run-endtime": now - 5000,
             "next-run": now + 80000})

    @staticmethod
    def pbs_snapshot(backup_time: int, *, size: int = 3 * GiB, protected: bool = False, state: str = "ok",
                     encrypted: bool = False, comment: str = "", config: dict | None = None) -> dict:
        """A PBS snapshot; `comment` is its notes (listings show their first line), `config` the guest
        config it holds (qemu-server.conf or pct.conf: docs/PROXMOX-BEHAVIOUR.md#configs-inside-backups)."""
        return {"backup-time": backup_time, "size": size, "protected": protected, "comment": comment,
                "verification": {"state": state, "upid": ""} if state else None,
                "crypt-mode": "encrypt" if encrypted else "none", "owner": "root@pam",
                "config": backup_config(config or {})}

    @staticmethod
    def _digest(vmid: int) -> str:
        return hashlib.sha1(f"{vmid}-{time.time_ns()}".encode()).hexdigest()

    # ------------------------------------------------------------ tasks

    def start_task(self, node: str, kind: str, item: str, *, user: str = "root@pam", exitstatus: str = "OK",
                   duration: float | None = None, lines: list[str] | None = None, finished: bool = False,
                   on_done: Callable[[], None] | None = None, product: str = "pve",
                   lock: tuple[dict, str] | None = None) -> str:
        """Start a task; `lock` (guest, reason) locks the guest while it runs."""
        with self.lock:
            self._pid += 1
            started = time.time() - (3600 if finished else 0)
            starttime = int(started)
            if product == "pbs":
                worker = escape_id(item)
                upid = (f"UPID:{node}:{self._pid:08X}:0000A1B2:{len(self.tasks):08X}:{starttime:08X}:"
                        f"{kind}:{worker}:{user}:")
            else:  # PVE's UPID decoder allows no ':' in the worker id
                upid = f"UPID:{node}:{self._pid:08X}:0000A1B2:{starttime:08X}:{kind}:{item.replace(':', '_')}:{user}:"
            if lines is None:
                lines = [f"starting {kind} {item}"] + [f"progress {p}%" for p in (20, 40, 60, 80, 100)]
                if exitstatus.startswith("WARNINGS"):
                    lines.append("WARN: something needed attention")
            on_end = None
            if lock and exitstatus == "OK":
                guest, reason = lock
                guest["lock"] = reason

                def on_end() -> None:
                    guest["lock"] = None
            self.tasks[upid] = Task(upid, node, kind, item, user, started,
                                    self.task_seconds if duration is None else duration, lines, exitstatus,
                                    on_done, on_end)
            return upid

    def schedule(self, seconds: float, effect: Callable[[], None]) -> None:
        """An effect that happens later without a task of its own (the HA manager acting)."""
        with self.lock:
            self.later.append((time.time() + seconds, effect))

    def tick(self) -> None:
        """Apply the effects of tasks that have finished, then those scheduled for now."""
        now = time.time()
        with self.lock:
            due = [effect for when, effect in self.later if when <= now]
            self.later = [(when, effect) for when, effect in self.later if when > now]
            for task in self.tasks.values():
                if not task.done and not task.running(now):
                    task.done = True
                    succeeded = task.exitstatus == "OK" or task.exitstatus.startswith("WARNINGS")
                    if task.on_end:
                        task.on_end()
                    if task.on_done and succeeded:
                        task.on_done()
            for effect in due:
                effect()
