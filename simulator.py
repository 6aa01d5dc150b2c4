"""A simulated Proxmox VE cluster and Backup Server, for tests and `--demo`.

Every request is matched against the catalog generated from the official API schemas:
an unknown path or method answers 501, an unknown, missing or ill-typed parameter 400,
both in Proxmox's own format. Tokens carry ACLs and are checked like the real servers
(401, 403 with the privilege and path, empty lists for privilege-separated tokens without
ACLs). The state behind the tools (nodes, guests, storage, tasks, PBS datastores) is kept
in `Lab`; tasks have real UPIDs, run for a while, log progress and end OK, with warnings
or with an error. Faults (a node down, slow answers, 500s) are switched on from tests.

    with Simulator(Lab.homelab()) as sim:
        print(sim.pve_url, sim.fingerprint, sim.tokens)

Behaviour follows ../shared/PROXMOX-FACTS.md; comments name the fact where it matters.
"""
from __future__ import annotations

import hashlib
import json
import random
import re
import secrets
import ssl
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs, unquote, urlsplit

import catalog

GiB = 1024 ** 3

# Built-in roles, reduced to the privileges the simulator checks.
ROLES = {
    "Administrator": {"*"},
    "PVEAuditor": {"Sys.Audit", "VM.Audit", "Datastore.Audit", "Pool.Audit", "SDN.Audit", "Mapping.Audit",
                   "VM.GuestAgent.Audit"},
    "PVEVMUser": {"VM.Audit", "VM.PowerMgmt", "VM.Console", "VM.Backup", "VM.Config.CDROM",
                  "VM.Config.Cloudinit", "Datastore.AllocateSpace", "Datastore.Audit"},
    "PVEVMAdmin": {"VM.Audit", "VM.PowerMgmt", "VM.Console", "VM.Backup", "VM.Snapshot", "VM.Snapshot.Rollback",
                   "VM.Clone", "VM.Allocate", "VM.Migrate", "VM.Config.Disk", "VM.Config.CPU",
                   "VM.Config.Memory", "VM.Config.Network", "VM.Config.Options", "VM.Config.HWType",
                   "VM.Config.Cloudinit", "VM.Config.CDROM", "VM.GuestAgent.Audit",
                   "VM.GuestAgent.Unrestricted", "VM.GuestAgent.FileRead", "VM.GuestAgent.FileWrite"},
    "PVEDatastoreUser": {"Datastore.AllocateSpace", "Datastore.Audit"},
    "PVEDatastoreAdmin": {"Datastore.Allocate", "Datastore.AllocateSpace", "Datastore.AllocateTemplate",
                          "Datastore.Audit"},
    "DatastoreReader": {"Datastore.Audit", "Datastore.Read"},
    "DatastoreAdmin": {"Datastore.Audit", "Datastore.Modify", "Datastore.Read", "Datastore.Verify",
                       "Datastore.Backup", "Datastore.Prune"},
    "Audit": {"Sys.Audit", "Datastore.Audit"},
    "Admin": {"*"},
}


def all_privileges(product: str) -> set[str]:
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
    return found


@dataclass
class Token:
    secret: str
    acl: list[tuple[str, str, bool]] = field(default_factory=list)  # (path, role, propagate)
    privsep: bool = True

    def privileges(self, path: str) -> set[str]:
        """Privileges on a path: the most specific ACL level wins (exact path, then parents
        with propagate)."""
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts), -1, -1):
            level = "/" + "/".join(parts[:depth])
            roles = [role for acl_path, role, propagate in self.acl
                     if ("/" + acl_path.strip("/")) == level and (propagate or depth == len(parts))]
            if roles:
                return set().union(*(ROLES[r] for r in roles))
        return set()

    def has(self, path: str, privilege: str) -> bool:
        held = self.privileges(path)
        return "*" in held or privilege in held


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

    def log(self, now: float) -> list[str]:
        if not self.running(now):
            end = "TASK OK" if self.exitstatus == "OK" else (
                f"TASK {self.exitstatus}" if self.exitstatus.startswith("WARNINGS") else f"TASK ERROR: {self.exitstatus}")
            return self.lines + [end]
        shown = int(len(self.lines) * (now - self.started) / max(self.duration, 1e-6))
        return self.lines[:max(1, shown)]


class Lab:
    """The simulated world: one PVE cluster and one PBS, plus tokens and faults."""

    def __init__(self, *, cluster_name: str = "homelab", seed: int = 7):
        self.cluster_name = cluster_name
        self.random = random.Random(seed)
        self.lock = threading.RLock()
        self.nodes: dict[str, dict] = {}
        self.guests: dict[int, dict] = {}
        self.storages: dict[str, dict] = {}
        self.pools: dict[str, dict] = {}
        self.tasks: dict[str, Task] = {}
        self.datastores: dict[str, dict] = {}
        self.networks: dict[str, list[dict]] = {}  # node -> interfaces
        self.volumes: dict[str, list[dict]] = {}  # storage -> volumes other than guest disks
        self.pbs_jobs: dict[str, list[dict]] = {}  # "sync" | "verify" | "prune" -> jobs
        self.backup_jobs: list[dict] = []  # /cluster/backup
        self.acl: list[dict] = []  # /access/acl as the access system holds it
        self.users: list[dict] = []  # /access/users?full=1, tokens included
        self.firewall: dict[str, int] = {"cluster": 1}  # "cluster", node names, vmids as str -> enable
        self.cert_days: dict[str, int] = {}  # node -> days until its certificate expires
        self.replication: dict[str, list[dict]] = {}  # node -> replication job states
        self.pve_tokens: dict[str, Token] = {}
        self.pbs_tokens: dict[str, Token] = {}
        # password logins: product -> userid -> (password, the user's rights, needs a second factor)
        self.logins: dict[str, dict[str, tuple[str, Token, bool]]] = {"pve": {}, "pbs": {}}
        self.tickets: dict[str, tuple[str, str, str, float]] = {}  # ticket -> (product, userid, csrf, issued)
        self.ticket_lifetime = 7200.0  # real tickets expire after 2 h
        self.task_seconds = 0.6  # how long a simulated task runs
        # faults, switched on by tests
        self.down_nodes: set[str] = set()
        self.delay = 0.0
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
    def homelab(cls, nodes: int = 3, guests: int = 6, seed: int = 7) -> "Lab":
        """A small cluster: `nodes` nodes, `guests` guests (QEMU and LXC mixed), local and
        shared storage, a pool, finished tasks, a PBS with one datastore, and three tokens."""
        lab = cls(seed=seed)
        names = ["pve1", "pve2", "pve3"] if nodes == 3 else [f"pve{i + 1}" for i in range(nodes)]
        for index, name in enumerate(names):
            lab.add_node(name, maxcpu=8 if index else 16, maxmem=(32 if index else 64) * GiB)
        for name in names:
            lab.add_storage("local", "dir", "iso,vztmpl,backup,import", node=name, total=100 * GiB, used=31 * GiB)
            lab.add_storage("local-lvm", "lvmthin", "images,rootdir", node=name, total=400 * GiB, used=120 * GiB)
        lab.add_storage("nfs-backup", "nfs", "backup,iso", total=2000 * GiB, used=900 * GiB, shared=True)
        lab.add_storage("pbs", "pbs", "backup", total=4000 * GiB, used=1200 * GiB, shared=True)
        lab.pools["prod"] = {"poolid": "prod", "comment": "production"}
        presets = [("web", "qemu", "running", "prod;web", 4096), ("db", "qemu", "running", "prod", 8192),
                   ("dns", "lxc", "running", "infra", 512), ("media", "lxc", "stopped", "", 2048),
                   ("win11", "qemu", "stopped", "", 8192), ("ci-runner", "lxc", "running", "ci", 4096)]
        for i in range(guests):
            name, kind, status, tags, memory = presets[i % len(presets)]
            if i >= len(presets):
                name = f"{name}-{i}"
                status = lab.random.choice(["running", "running", "stopped"])
            lab.add_guest(100 + i, kind, names[i % len(names)], name, status=status, tags=tags,
                          pool="prod" if "prod" in tags else None, memory_mib=memory)
        lab.start_task(names[0], "vzdump", "100", exitstatus="OK", finished=True)
        lab.start_task(names[1], "qmstart", "101", exitstatus="OK", finished=True)
        lab.start_task(names[0], "vzdump", "104", exitstatus="job errors", finished=True)
        lab.add_datastore("backup", total=4000 * GiB, used=1200 * GiB)
        for index, name in enumerate(names):
            lab.networks[name] = [
                {"iface": "eno1", "type": "eth", "active": 1, "autostart": 1},
                {"iface": "vmbr0", "type": "bridge", "active": 1, "autostart": 1, "bridge_ports": "eno1",
                 "bridge_vlan_aware": 1, "cidr": f"192.0.2.{11 + index}/24", "gateway": "192.0.2.1"},
                {"iface": "vmbr1", "type": "bridge", "active": 1, "autostart": 1, "bridge_ports": "",
                 "comments": "isolated lab segment\n"},
            ]
        now = int(time.time())
        lab.add_volume("local", "local:iso/debian-13.1.0-amd64-netinst.iso", "iso", 754 * 1024 ** 2)
        lab.add_volume("local", "local:vztmpl/debian-13-standard_13.1-2_amd64.tar.zst", "vztmpl", 126 * 1024 ** 2)
        for vmid, guest in lab.guests.items():
            if guest["status"] == "running":
                kind = "qemu" if guest["type"] == "qemu" else "lxc"
                stamp = time.strftime("%Y_%m_%d-02_00_01", time.gmtime(now - 86400))
                lab.add_volume("nfs-backup", f"nfs-backup:backup/vzdump-{kind}-{vmid}-{stamp}.vma.zst"
                               if kind == "qemu" else f"nfs-backup:backup/vzdump-lxc-{vmid}-{stamp}.tar.zst",
                               "backup", 2 * GiB, vmid=vmid, ctime=now - 86400)
        lab.backup_jobs = [{"id": "backup-nightly", "type": "vzdump", "schedule": "02:00", "enabled": 1, "all": 1,
                            "exclude": "104", "storage": "nfs-backup", "mode": "snapshot"}]
        lab.users = [{"userid": "root@pam", "enable": 1, "expire": 0,
                      "tokens": [{"tokenid": "admin", "privsep": 0, "expire": 0}]},
                     {"userid": "mcp@pve", "enable": 1, "expire": 0,
                      "tokens": [{"tokenid": "reader", "privsep": 1, "expire": int(time.time()) + 180 * 86400},
                                 {"tokenid": "empty", "privsep": 1, "expire": int(time.time()) + 180 * 86400}]}]
        lab.acl = [{"path": "/", "type": "token", "ugid": "mcp@pve!reader", "roleid": "PVEAuditor", "propagate": 1},
                   {"path": "/", "type": "user", "ugid": "root@pam", "roleid": "Administrator", "propagate": 1}]
        lab.cert_days = {name: 300 for name in names}
        lab.pve_tokens["mcp@pve!reader"] = Token("11111111-2222-3333-4444-555555555555",
                                                 [("/", "PVEAuditor", True)])
        lab.pve_tokens["root@pam!admin"] = Token("aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
                                                 [("/", "Administrator", True)], privsep=False)
        lab.pve_tokens["mcp@pve!empty"] = Token("99999999-8888-7777-6666-555555555555", [])
        lab.pbs_tokens["root@pam!admin"] = Token("pbs-admin-secret-9876543210", [("/", "Admin", True)],
                                                 privsep=False)
        lab.pbs_tokens["mcp@pbs!reader"] = Token("pbs-reader-secret-0123456789",
                                                 [("/", "Audit", True), ("/datastore", "DatastoreReader", True)])
        lab.logins["pve"]["ops@pve"] = ("sim-ops-password-4711", Token("", [("/", "PVEVMAdmin", True),
                                                                           ("/", "PVEAuditor", True)]), False)
        lab.logins["pve"]["tfa@pve"] = ("sim-tfa-password-4712", Token("", [("/", "PVEAuditor", True)]), True)
        lab.logins["pbs"]["ops@pbs"] = ("sim-pbs-password-4713", Token("", [("/", "Audit", True),
                                                                           ("/datastore", "DatastoreReader", True)]),
                                        False)
        return lab

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
                       "rootfs": f"local-lvm:subvol-{vmid}-disk-0,size={disk_gib}G",
                       "net0": f"name=eth0,bridge=vmbr0,hwaddr=BC:24:11:{vmid % 256:02X}:00:01,ip=dhcp",
                       "unprivileged": 1}
        if tags:
            config["tags"] = tags
        guest = {"vmid": vmid, "type": kind, "node": node, "name": name, "status": status, "template": 0,
                 "snapshots": [],
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
                    size = re.search(r"size=(\d+)G", value)
                    found.append({"volid": volid, "content": "images" if guest["type"] == "qemu" else "rootdir",
                                  "vmid": vmid, "format": "raw",
                                  "size": int(size.group(1)) * GiB if size else 0, "ctime": 0})
        return found

    def add_datastore(self, name: str, *, total: int, used: int) -> None:
        """A datastore with three daily snapshots of every running guest, in the root namespace."""
        now = int(time.time())
        groups: dict[tuple[str, str, str], list[dict]] = {}
        for vmid, guest in self.guests.items():
            if guest["status"] != "running":
                continue  # stopped guests have no backup: a finding for backup_coverage later
            kind = "vm" if guest["type"] == "qemu" else "ct"
            groups[("", kind, str(vmid))] = [self.pbs_snapshot(now - days * 86400 - 3600) for days in range(3)]
        self.datastores[name] = {"store": name, "total": total, "used": used, "groups": groups,
                                 "namespaces": {"": "", "offsite": "copies from the office"},
                                 "gc": {"last-run-state": "ok", "last-run-endtime": now - 86400, "removed-bytes": 2 * GiB,
                                        "pending-bytes": 0, "disk-chunks": 51234}}
        self.pbs_jobs.setdefault("verify", []).append(
            {"id": f"v-{name}", "store": name, "schedule": "daily", "last-run-state": "ok",
             "last-run-endtime": now - 7200, "next-run": now + 79200})
        self.pbs_jobs.setdefault("prune", []).append(
            {"id": f"p-{name}", "store": name, "schedule": "hourly", "keep-last": 3, "keep-daily": 7,
             "last-run-state": "ok", "last-run-endtime": now - 1800, "next-run": now + 1800})
        self.pbs_jobs.setdefault("sync", []).append(
            {"id": f"s-{name}", "store": name, "remote": "office", "remote-store": "backup", "schedule": "weekly",
             "last-run-state": "sync failed - remote unreachable", "last-run-endtime": now - 3 * 86400,
             "next-run": now + 4 * 86400})

    @staticmethod
    def pbs_snapshot(backup_time: int, *, size: int = 3 * GiB, protected: bool = False, state: str = "ok",
                     encrypted: bool = False, comment: str = "") -> dict:
        return {"backup-time": backup_time, "size": size, "protected": protected, "comment": comment,
                "verification": {"state": state, "upid": ""} if state else None,
                "crypt-mode": "encrypt" if encrypted else "none", "owner": "root@pam"}

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
                worker = item.replace(":", "\\x3a").replace("/", "\\x2f")
                upid = f"UPID:{node}:{self._pid:08X}:0000A1B2:{len(self.tasks):08X}:{starttime:08X}:{kind}:{worker}:{user}:"
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

    def tick(self) -> None:
        """Apply the effects of tasks that have finished."""
        now = time.time()
        with self.lock:
            for task in self.tasks.values():
                if not task.done and not task.running(now):
                    task.done = True
                    succeeded = task.exitstatus == "OK" or task.exitstatus.startswith("WARNINGS")
                    if task.on_end:
                        task.on_end()
                    if task.on_done and succeeded:
                        task.on_done()


# ================================================================ request handling

class ApiError(Exception):
    def __init__(self, status: int, message: str, errors: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.errors = status, message, errors


@dataclass
class Call:
    product: str
    method: str
    path: str
    params: dict[str, Any]
    token_id: str
    token: Token
    lab: Lab

    def can(self, acl_path: str, privilege: str) -> bool:
        return self.token.has(acl_path, privilege)

    def arg(self, name: str, default: Any = None) -> Any:
        value = self.params.get(name, default)
        return value[0] if isinstance(value, list) and len(value) == 1 else value


def _check_permission(call: Call, entry: dict, path_params: dict[str, str]) -> None:
    check = entry.get("check")
    if not check:
        return
    if call.product == "pbs":
        acl_path = "/" + "/".join(path_params.get(p.strip("{}"), p) if p.startswith("{") else p
                                  for p in check["path"])
        privileges = check["privs"]
        held = [call.can(acl_path, p) for p in privileges]
        if not (any(held) if check.get("partial") else all(held)):
            raise ApiError(403, "permission check failed")
        return
    failure = _evaluate(call, check, path_params | {k: str(v) for k, v in call.params.items()
                                                    if isinstance(v, (str, int))})
    if failure:
        raise ApiError(403, f"Permission check failed ({failure[0]}, {failure[1]})")


def _evaluate(call: Call, check: list, values: dict[str, str]) -> tuple[str, str] | None:
    """Evaluate a PVE permission check; return (path, privileges) of the first failure."""
    kind = check[0]
    if kind == "perm":
        path = re.sub(r"\{([\w-]+)\}", lambda m: values.get(m.group(1), m.group(0)), check[1])
        privileges = check[2]
        any_of = "any" in check[3:]
        held = [call.can(path, p) for p in privileges]
        if (any(held) if any_of else all(held)):
            return None
        return path, "|".join(privileges) if any_of else next(p for p, h in zip(privileges, held) if not h)
    if kind == "or":
        failures = [_evaluate(call, sub, values) for sub in check[1:]]
        return None if any(f is None for f in failures) else failures[0]
    if kind == "and":
        return next((f for f in (_evaluate(call, sub, values) for sub in check[1:]) if f), None)
    # userid-group, perm-modify and friends: the real checks depend on the target; need Sys.Audit at /
    return None if call.can("/access", "Sys.Audit") or call.can("/", "Sys.Audit") else ("/access", "Sys.Audit")


def _node(call: Call, name: str) -> dict:
    """Resolve a node as pveproxy does: wrong case or a down node gives 595 (PROXMOX-FACTS)."""
    lab = call.lab
    if name in lab.nodes:
        if name in lab.down_nodes:
            raise ApiError(595, "Connection refused")
        return lab.nodes[name]
    if name.lower() in {n.lower() for n in lab.nodes}:
        raise ApiError(595, "Connection refused")
    raise ApiError(500, f"hostname lookup '{name}' failed - failed to get address info for: {name}: "
                        f"Name or service not known")


def _guest(call: Call, node: str, vmid: str, kind: str) -> dict:
    _node(call, node)
    guest = call.lab.guests.get(int(vmid))
    if not guest or guest["node"] != node or guest["type"] != kind:
        folder = "qemu-server" if kind == "qemu" else "lxc"
        raise ApiError(500, f"Configuration file 'nodes/{node}/{folder}/{vmid}.conf' does not exist")
    return guest


# ---------------------------------------------------------------- PVE handlers

def pve_version(call: Call, **_: str) -> dict:
    return {"version": "9.2.1", "release": "9.2", "repoid": "0d3f1c6ba8d1e2a7"}


def pve_cluster_status(call: Call, **_: str) -> list:
    lab = call.lab
    rows: list[dict] = []
    if len(lab.nodes) > 1:  # a standalone node has no cluster entry (PROXMOX-FACTS)
        online = len(lab.nodes) - len(lab.down_nodes)
        rows.append({"type": "cluster", "id": "cluster", "name": lab.cluster_name, "nodes": len(lab.nodes),
                     "quorate": int(online * 2 > len(lab.nodes)), "version": 7})
    for index, name in enumerate(lab.nodes):
        rows.append({"type": "node", "id": f"node/{name}", "name": name, "nodeid": index + 1,
                     "online": int(name not in lab.down_nodes), "local": int(index == 0),
                     "ip": f"192.0.2.{11 + index}", "level": ""})
    return rows


def _guest_row(guest: dict) -> dict:
    kind = guest["type"]
    cfg = guest["config"]
    maxmem = int(cfg.get("memory", 512)) * 1024 * 1024
    running = guest["status"] == "running"
    row = {"id": f"{kind}/{guest['vmid']}", "type": kind, "vmid": guest["vmid"], "node": guest["node"],
           "name": guest["name"], "status": guest["status"], "template": guest["template"],
           "maxcpu": int(cfg.get("cores", 1)), "cpu": guest["cpu"] if running else 0,
           "maxmem": maxmem, "mem": int(maxmem * 0.45) if running else 0, "maxdisk": guest["maxdisk"],
           "disk": int(guest["maxdisk"] * 0.3) if kind == "lxc" and running else 0,
           "uptime": guest["uptime"] if running else 0, "netin": 0, "netout": 0, "diskread": 0, "diskwrite": 0}
    if kind == "qemu":
        row["memhost"] = row["mem"]  # PVE 9
    for key in ("tags", "lock", "pool"):  # only when set (PROXMOX-FACTS)
        if guest.get(key):
            row[key] = guest[key]
    return row


def pve_cluster_resources(call: Call, **_: str) -> list:
    lab = call.lab
    wanted = call.arg("type")
    rows: list[dict] = []
    if wanted in (None, "node"):
        for name, node in lab.nodes.items():
            row = {"id": f"node/{name}", "type": "node", "node": name,
                   "status": "offline" if name in lab.down_nodes else "online"}
            # without Sys.Audit the node comes back bare (PROXMOX-FACTS); a down node has no stats
            if call.can(f"/nodes/{name}", "Sys.Audit") and name not in lab.down_nodes:
                row |= {k: node[k] for k in ("cpu", "maxcpu", "mem", "maxmem", "disk", "maxdisk", "uptime",
                                             "level")} | {"cgroup-mode": 2}
            rows.append(row)
    if wanted in (None, "vm"):
        for vmid, guest in sorted(lab.guests.items()):
            if call.can(f"/vms/{vmid}", "VM.Audit"):
                row = _guest_row(guest)
                if guest["node"] in lab.down_nodes:
                    row["status"] = "unknown"
                rows.append(row)
    if wanted in (None, "storage"):
        for storage in lab.storages.values():
            if not call.can(f"/storage/{storage['storage']}", "Datastore.Audit"):
                continue
            for name in lab.storage_nodes(storage):
                rows.append({"id": f"storage/{name}/{storage['storage']}", "type": "storage", "node": name,
                             "storage": storage["storage"], "plugintype": storage["type"],
                             "status": "unknown" if name in lab.down_nodes else "available",
                             "content": storage["content"], "shared": storage["shared"],
                             "disk": storage["used"], "maxdisk": storage["total"]})
    if wanted is None:
        for pool in lab.pools:
            if call.can(f"/pool/{pool}", "Pool.Audit"):
                rows.append({"id": f"/pool/{pool}", "type": "pool", "pool": pool})
    if wanted in (None, "sdn"):
        for name in lab.nodes:
            if call.can("/sdn/zones/localnetwork", "SDN.Audit"):
                rows.append({"id": f"sdn/{name}/localnetwork", "type": "sdn", "sdn": "localnetwork",
                             "node": name, "status": "ok"})
    return rows


def pve_nodes(call: Call, **_: str) -> list:
    rows = []
    for name, node in call.lab.nodes.items():
        row = {"node": name, "status": "offline" if name in call.lab.down_nodes else "online",
               "type": "node", "id": f"node/{name}",
               "ssl_fingerprint": "AA:BB:CC:DD:EE:FF:00:11:22:33:44:55:66:77:88:99:AA:BB:CC:DD:EE:FF:00:11:22:33:44:55:66:77:88:99"}
        if call.can(f"/nodes/{name}", "Sys.Audit") and name not in call.lab.down_nodes:
            row |= {k: node[k] for k in ("cpu", "maxcpu", "mem", "maxmem", "disk", "maxdisk", "uptime", "level")}
        rows.append(row)
    return rows


def pve_node_status(call: Call, node: str) -> dict:
    info = _node(call, node)
    return {"uptime": info["uptime"], "loadavg": info["loadavg"], "cpu": info["cpu"], "wait": 0.001,
            "kversion": info["kversion"], "pveversion": "pve-manager/9.2.1/0d3f1c6ba8d1e2a7",
            "cpuinfo": {"cpus": info["maxcpu"], "model": "AMD Ryzen 7 5800U", "sockets": 1, "cores": info["maxcpu"] // 2},
            "memory": {"total": info["maxmem"], "used": info["mem"], "free": info["maxmem"] - info["mem"]},
            "rootfs": {"total": info["maxdisk"], "used": info["disk"], "avail": info["maxdisk"] - info["disk"]},
            "swap": {"total": 8 * GiB, "used": 0, "free": 8 * GiB},
            "boot-info": {"mode": "efi", "secureboot": 0}, "current-kernel": {"release": "6.14.11-2-pve"}}


def pve_guest_list(kind: str) -> Callable:
    def handler(call: Call, node: str) -> list:
        _node(call, node)
        rows = []
        for vmid, guest in sorted(call.lab.guests.items()):
            if guest["node"] == node and guest["type"] == kind and call.can(f"/vms/{vmid}", "VM.Audit"):
                row = _guest_row(guest)
                row.pop("id"), row.pop("node")
                if kind == "lxc":
                    row["vmid"] = str(vmid) if call.lab.legacy_errors else vmid  # PVE < 8.2 sent a string
                rows.append(row)
        return rows
    return handler


def pve_guest_status(kind: str) -> Callable:
    def handler(call: Call, node: str, vmid: str) -> dict:
        guest = _guest(call, node, vmid, kind)
        row = _guest_row(guest)
        row.pop("id"), row.pop("node")
        row |= {"qmpstatus": guest["status"]} if kind == "qemu" else {}
        if kind == "qemu" and guest["config"].get("agent"):
            row["agent"] = 1
        return row
    return handler


def pve_guest_config(kind: str) -> Callable:
    def handler(call: Call, node: str, vmid: str) -> dict:
        guest = _guest(call, node, vmid, kind)
        return dict(guest["config"])
    return handler


def pve_storage_list(call: Call, **_: str) -> list:
    rows = []
    for storage in call.lab.storages.values():
        if call.can(f"/storage/{storage['storage']}", "Datastore.Audit"):
            row = {"storage": storage["storage"], "type": storage["type"], "content": storage["content"],
                   "shared": storage["shared"], "digest": "0" * 40}
            if not storage["shared"]:
                row["nodes"] = ",".join(storage["nodes"])
            rows.append(row)
    return rows


def pve_node_storage(call: Call, node: str) -> list:
    _node(call, node)
    rows = []
    for storage in call.lab.storages.values():
        if node in call.lab.storage_nodes(storage) and call.can(f"/storage/{storage['storage']}", "Datastore.Audit"):
            content = call.arg("content")
            if content and content not in storage["content"].split(","):
                continue
            rows.append({"storage": storage["storage"], "type": storage["type"], "content": storage["content"],
                         "shared": storage["shared"], "active": 1, "enabled": 1, "total": storage["total"],
                         "used": storage["used"], "avail": storage["total"] - storage["used"],
                         "used_fraction": round(storage["used"] / storage["total"], 4)})
    return rows


def _task_row(task: Task, now: float) -> dict:
    parts = task.upid.split(":")
    row = {"upid": task.upid, "node": task.node, "pid": int(parts[2], 16), "pstart": int(parts[3], 16),
           "starttime": int(task.started), "type": task.type, "id": task.id, "user": task.user}
    if not task.running(now):
        row |= {"endtime": int(task.started + task.duration), "status": task.exitstatus}
    return row


def _visible_task(call: Call, task: Task) -> bool:
    """A token sees only its own tasks unless it has Sys.Audit on the node (PROXMOX-FACTS)."""
    return task.user == call.token_id or call.can(f"/nodes/{task.node}", "Sys.Audit")


def pve_tasks(call: Call, node: str) -> list:
    _node(call, node)
    now = time.time()
    source = call.arg("source", "archive")
    vmid = call.arg("vmid")
    errors_only = str(call.arg("errors", "0")) == "1"
    rows = []
    for task in sorted(call.lab.tasks.values(), key=lambda t: -t.started):
        running = task.running(now)
        if task.node != node or not _visible_task(call, task):
            continue
        if (source == "archive" and running) or (source == "active" and not running):
            continue
        if vmid is not None and task.id != str(vmid):
            continue
        if call.arg("typefilter") and task.type != call.arg("typefilter"):
            continue
        if errors_only and (running or task.exitstatus == "OK"):
            continue
        rows.append(_task_row(task, now))
    start, limit = int(call.arg("start", 0)), int(call.arg("limit", 50))
    return rows[start:start + limit] if limit else rows[start:]


def pve_cluster_tasks(call: Call) -> list:
    """Recent tasks of every node, running ones included."""
    now = time.time()
    tasks = sorted(call.lab.tasks.values(), key=lambda t: -t.started)
    return [_task_row(t, now) for t in tasks if _visible_task(call, t)][:50]


def _task(call: Call, node: str, upid: str) -> Task:
    _node(call, node)
    task = call.lab.tasks.get(upid)
    if task is None or task.node != node:
        raise ApiError(500, "no such task")
    if not _visible_task(call, task):
        raise ApiError(403, f"Permission check failed (/nodes/{node}, Sys.Audit)")
    return task


def pve_task_status(call: Call, node: str, upid: str) -> dict:
    task = _task(call, node, upid)
    row = _task_row(task, time.time())
    row.pop("endtime", None)  # the status endpoint has no endtime (PROXMOX-FACTS)
    if task.running(time.time()):
        row["status"] = "running"
    else:
        row |= {"status": "stopped", "exitstatus": task.exitstatus}
    return row


def pve_task_log(call: Call, node: str, upid: str) -> list:
    task = _task(call, node, upid)
    lines = task.log(time.time()) or ["no content"]
    start = int(call.arg("start", 0))
    limit = int(call.arg("limit", 50))
    rows = [{"n": i + 1, "t": text} for i, text in enumerate(lines)]
    return rows[start:start + limit] if limit else rows[start:]


# ---- guest power: async tasks that fail later, as the real ones do (PROXMOX-FACTS)

POWER_RESULT = {"start": "running", "stop": "stopped", "shutdown": "stopped", "reboot": "running",
                "reset": "running", "suspend": "paused", "resume": "running"}


def pve_power(kind: str, action: str) -> Callable:
    prefix = "qm" if kind == "qemu" else "vz"
    label = "VM" if kind == "qemu" else "CT"

    def handler(call: Call, node: str, vmid: str) -> str:
        guest = _guest(call, node, vmid, kind)
        error = "OK"
        if guest["lock"] and str(call.arg("skiplock", "0")) != "1":
            error = f"{label} is locked ({guest['lock']})"
        elif action == "start" and guest["status"] == "running":
            error = f"{label} {vmid} already running"
        elif action in ("shutdown", "reboot", "reset", "suspend") and guest["status"] != "running":
            error = f"{label} {vmid} not running"
        elif action == "resume" and guest["status"] != "paused":
            error = f"{label} {vmid} not paused"

        def apply() -> None:
            guest["status"] = POWER_RESULT[action]
            guest["uptime"] = 1 if guest["status"] == "running" else 0
        return call.lab.start_task(node, f"{prefix}{action}", vmid, user=call.token_id, exitstatus=error,
                                   on_done=apply)
    return handler


def pve_snapshots(kind: str) -> Callable:
    def handler(call: Call, node: str, vmid: str) -> list:
        guest = _guest(call, node, vmid, kind)
        rows = [dict(snap) for snap in guest["snapshots"]]
        parent = rows[-1]["name"] if rows else None
        current = {"name": "current", "description": "You are here!", "running": int(guest["status"] == "running")}
        if parent:
            current["parent"] = parent
        return rows + [current]
    return handler


def pve_snapshot_create(kind: str) -> Callable:
    def handler(call: Call, node: str, vmid: str) -> str:
        guest = _guest(call, node, vmid, kind)
        name = call.arg("snapname")
        error = "OK"
        if any(s["name"] == name for s in guest["snapshots"]):
            error = f"snapshot name '{name}' already used"
        elif guest["lock"]:
            error = f"{'VM' if kind == 'qemu' else 'CT'} is locked ({guest['lock']})"

        def apply() -> None:
            snap = {"name": name, "snaptime": int(time.time()), "description": call.arg("description", "")}
            if guest["snapshots"]:
                snap["parent"] = guest["snapshots"][-1]["name"]
            if kind == "qemu" and str(call.arg("vmstate", "0")) == "1":
                snap["vmstate"] = 1
            guest["snapshots"].append(snap)
        return call.lab.start_task(node, "qmsnapshot" if kind == "qemu" else "vzsnapshot", vmid,
                                   user=call.token_id, exitstatus=error, on_done=apply)
    return handler


def pve_snapshot_delete(kind: str) -> Callable:
    def handler(call: Call, node: str, vmid: str, snapname: str) -> str:
        guest = _guest(call, node, vmid, kind)
        if not any(s["name"] == snapname for s in guest["snapshots"]):
            raise ApiError(500, f"snapshot '{snapname}' does not exist")

        def apply() -> None:
            guest["snapshots"] = [s for s in guest["snapshots"] if s["name"] != snapname]
        return call.lab.start_task(node, "qmdelsnapshot" if kind == "qemu" else "vzdelsnapshot", vmid,
                                   user=call.token_id, on_done=apply)
    return handler


def pve_storage_content(call: Call, node: str, storage: str) -> list:
    _node(call, node)
    entry = call.lab.storages.get(storage)
    if entry is None or node not in call.lab.storage_nodes(entry):
        raise ApiError(500, f"storage '{storage}' does not exist")
    rows = [v for v in call.lab.volumes.get(storage, []) if v.get("_node", node) == node]
    rows += call.lab.guest_disks(storage, node)
    content, vmid = call.arg("content"), call.arg("vmid")
    return [{k: val for k, val in v.items() if k != "_node"} for v in rows
            if (content is None or v["content"] == content) and (vmid is None or v.get("vmid") == int(vmid))]


def pve_network(call: Call, node: str) -> list:
    _node(call, node)
    wanted = call.arg("type")
    rows = call.lab.networks.get(node, [])
    if wanted in ("any_bridge", "any_local_bridge"):
        return [dict(r) for r in rows if r["type"] in ("bridge", "OVSBridge")]
    return [dict(r) for r in rows if wanted is None or r["type"] == wanted]



# ---- guest changes: config, disks, snapshots, backups, clones, migration, templates, deletion

def _locked(guest: dict, kind: str) -> str | None:
    return f"{'VM' if kind == 'qemu' else 'CT'} is locked ({guest['lock']})" if guest["lock"] else None


def pve_config_update(kind: str) -> Callable:
    def handler(call: Call, node: str, vmid: str) -> None:
        guest = _guest(call, node, vmid, kind)
        config = guest["config"]
        if call.arg("digest") and call.arg("digest") != config["digest"]:
            raise ApiError(500, "detected modified configuration - file changed by other user? Try again.")
        if _locked(guest, kind) and str(call.arg("skiplock", "0")) != "1":
            raise ApiError(500, _locked(guest, kind))
        for key in re.split(r"[,;\s]+", str(call.arg("delete", ""))):
            config.pop(key, None)
        for key, value in call.params.items():
            if key not in ("delete", "digest", "skiplock", "revert", "background_delay", "node", "vmid"):
                config[key] = value[0] if isinstance(value, list) and len(value) == 1 else value
        if "name" in config or "hostname" in config:
            guest["name"] = config.get("name") or config.get("hostname")
        guest["tags"] = config.get("tags", "")
        config["digest"] = call.lab._digest(int(vmid))
    return handler


def pve_resize(kind: str) -> Callable:
    def handler(call: Call, node: str, vmid: str) -> str:
        guest = _guest(call, node, vmid, kind)
        disk, size = call.arg("disk"), str(call.arg("size"))
        value = guest["config"].get(disk)
        if value is None:
            raise ApiError(500, f"disk '{disk}' does not exist")
        current = int(re.search(r"size=(\d+)G", value).group(1))
        wanted = current + int(size[1:-1]) if size.startswith("+") else int(size.rstrip("G"))
        if wanted < current:
            raise ApiError(500, "shrinking disks is not supported")

        def apply() -> None:
            guest["config"][disk] = re.sub(r"size=\d+G", f"size={wanted}G", guest["config"][disk])
            guest["maxdisk"] = wanted * GiB
        return call.lab.start_task(node, "resize", vmid, user=call.token_id, exitstatus=_locked(guest, kind) or "OK",
                                   on_done=apply)
    return handler


def pve_rollback(kind: str) -> Callable:
    def handler(call: Call, node: str, vmid: str, snapname: str) -> str:
        guest = _guest(call, node, vmid, kind)
        if not any(s["name"] == snapname for s in guest["snapshots"]):
            raise ApiError(500, f"snapshot '{snapname}' does not exist")
        return call.lab.start_task(node, "qmrollback" if kind == "qemu" else "vzrollback", vmid, user=call.token_id,
                                   exitstatus=_locked(guest, kind) or "OK", lock=(guest, "rollback"))
    return handler


def pve_vzdump(call: Call, node: str) -> str:
    _node(call, node)
    vmid = int(str(call.arg("vmid", "0")).split(",")[0] or 0)
    guest = call.lab.guests.get(vmid)
    if guest is None or guest["node"] != node:
        return call.lab.start_task(node, "vzdump", "", user=call.token_id, exitstatus="job errors",
                                   lines=[f"ERROR: guest {vmid} is not on node {node}"])
    storage = call.arg("storage", "local")
    kind = "qemu" if guest["type"] == "qemu" else "lxc"
    stamp = time.strftime("%Y_%m_%d-%H_%M_%S", time.gmtime())
    ext = "vma.zst" if kind == "qemu" else "tar.zst"
    volid = f"{storage}:backup/vzdump-{kind}-{vmid}-{stamp}.{ext}"
    lines = [f"INFO: starting new backup job: vzdump {vmid} --storage {storage} --mode {call.arg('mode', 'snapshot')}",
             f"INFO: Starting Backup of VM {vmid} ({kind})"] + \
        [f"INFO: {p}% ({p * 20 // 100} GiB of 20 GiB) in {p // 10}s" for p in (10, 35, 60, 85, 100)] + \
        [f"INFO: Finished Backup of VM {vmid}"]

    def apply() -> None:
        call.lab.add_volume(storage, volid, "backup", 2 * GiB, vmid=vmid, node=guest["node"])
        if call.arg("notes-template"):
            call.lab.volumes[storage][-1]["notes"] = call.arg("notes-template")
    return call.lab.start_task(node, "vzdump", str(vmid), user=call.token_id, lines=lines,
                               exitstatus=_locked(guest, kind) or "OK", on_done=apply, lock=(guest, "backup"))


def pve_create(kind: str) -> Callable:
    """Create a guest, or restore one from a backup archive (qemu: archive=, lxc: restore=1)."""
    def handler(call: Call, node: str) -> str:
        _node(call, node)
        vmid = int(call.arg("vmid"))
        archive = call.arg("archive") if kind == "qemu" else (call.arg("ostemplate") if str(call.arg("restore", "0")) == "1" else None)
        exists = vmid in call.lab.guests
        if exists and not (archive and str(call.arg("force", "0")) == "1"):
            raise ApiError(500, f"unable to create {'VM' if kind == 'qemu' else 'CT'} {vmid}: config file already exists")
        name = call.arg("name") or call.arg("hostname") or f"{'vm' if kind == 'qemu' else 'ct'}{vmid}"

        def apply() -> None:
            guest = call.lab.add_guest(vmid, kind, node, name, memory_mib=int(str(call.arg("memory", 2048)).split(",")[0].split("=")[-1]),
                                       cores=int(call.arg("cores", 1)))
            for key, value in call.params.items():
                if re.fullmatch(r"(net|ipconfig|scsi|ide|sata|virtio|mp)\d+|ciuser|sshkeys|nameserver|tags|ostype|rootfs|unprivileged|description", key):
                    guest["config"][key] = value
            if str(call.arg("start", "0")) == "1":
                guest["status"] = "running"
        prefix = "qm" if kind == "qemu" else "vz"
        lines = [f"restore {archive}"] + [f"progress {p}%" for p in (25, 50, 75, 100)] if archive else None
        return call.lab.start_task(node, f"{prefix}{'restore' if archive else 'create'}", str(vmid),
                                   user=call.token_id, lines=lines, on_done=apply)
    return handler


def pve_clone(kind: str) -> Callable:
    def handler(call: Call, node: str, vmid: str) -> str:
        source = _guest(call, node, vmid, kind)
        newid = int(call.arg("newid"))
        if newid in call.lab.guests:
            raise ApiError(500, f"unable to create {'VM' if kind == 'qemu' else 'CT'} {newid}: config file already exists")
        target = call.arg("target", node)
        _node(call, target)
        name = call.arg("name") or call.arg("hostname") or f"copy-of-{source['name']}"

        def apply() -> None:
            clone = call.lab.add_guest(newid, kind, target, name)
            clone["config"] = {k: v for k, v in source["config"].items() if k != "digest"} | {
                "digest": call.lab._digest(newid), ("name" if kind == "qemu" else "hostname"): name}
        lines = [f"create full clone of drive scsi0 (local-lvm:vm-{vmid}-disk-0)"] + \
            [f"transferred {p * 32 // 100}.0 GiB of 32.0 GiB ({p}.00%)" for p in (20, 40, 60, 80, 100)]
        return call.lab.start_task(node, "qmclone" if kind == "qemu" else "vzclone", vmid, user=call.token_id,
                                   lines=lines, exitstatus=_locked(source, kind) or "OK", on_done=apply,
                                   lock=(source, "clone"))
    return handler


def pve_migrate(kind: str) -> Callable:
    def handler(call: Call, node: str, vmid: str) -> str:
        guest = _guest(call, node, vmid, kind)
        target = call.arg("target")
        _node(call, target)
        error = _locked(guest, kind) or "OK"
        if target == node:
            error = "target is local node."
        elif guest["status"] == "running" and kind == "qemu" and str(call.arg("online", "0")) != "1":
            error = "can't migrate running VM without --online"
        elif guest["status"] == "running" and kind == "lxc" and str(call.arg("restart", "0")) != "1":
            error = "lxc live migration is currently not implemented"

        def apply() -> None:
            guest["node"] = target
        lines = [f"starting migration of {kind.upper()} {vmid} to node '{target}'"] + \
            [f"migration active, transferred {p * 4 // 100} GiB of 4 GiB VM-state ({p}%)" for p in (25, 50, 75, 100)]
        return call.lab.start_task(node, "qmigrate" if kind == "qemu" else "vzmigrate", vmid, user=call.token_id,
                                   lines=lines, exitstatus=error, on_done=apply, lock=(guest, "migrate"))
    return handler


def pve_template(kind: str) -> Callable:
    def handler(call: Call, node: str, vmid: str) -> str | None:
        guest = _guest(call, node, vmid, kind)
        if guest["status"] == "running":
            raise ApiError(500, f"you can't convert a {'VM' if kind == 'qemu' else 'CT'} to template if it is running")

        def apply() -> None:
            guest["template"] = 1
            guest["config"]["template"] = 1
        if kind == "lxc":  # synchronous for containers (the schema returns null)
            apply()
            return None
        return call.lab.start_task(node, "qmtemplate", vmid, user=call.token_id, on_done=apply)
    return handler


def pve_destroy(kind: str) -> Callable:
    def handler(call: Call, node: str, vmid: str) -> str:
        guest = _guest(call, node, vmid, kind)
        label = "VM" if kind == "qemu" else "CT"
        error = _locked(guest, kind) or ("OK" if guest["status"] == "stopped" else f"{label} {vmid} is running - destroy failed")

        def apply() -> None:
            call.lab.guests.pop(int(vmid), None)
        return call.lab.start_task(node, "qmdestroy" if kind == "qemu" else "vzdestroy", vmid, user=call.token_id,
                                   exitstatus=error, on_done=apply)
    return handler


def pve_download_url(call: Call, node: str, storage: str) -> str:
    _node(call, node)
    entry = call.lab.storages.get(storage)
    content = call.arg("content")
    if entry is None or content not in entry["content"].split(","):
        raise ApiError(500, f"storage '{storage}' does not support content-type '{content}'")
    folder = {"iso": "iso", "vztmpl": "vztmpl", "import": "import"}[content]
    volid = f"{storage}:{folder}/{call.arg('filename')}"
    lines = [f"downloading {call.arg('url')} to /var/lib/vz/template/{folder}/{call.arg('filename')}"] + \
        [f"{p}% [{'=' * (p // 10)}] 600.0M" for p in (10, 40, 70, 100)] + ["download of file finished"]
    if call.arg("checksum"):
        lines.append("calculating checksum... OK, checksum verified")

    def apply() -> None:
        call.lab.add_volume(storage, volid, content, 600 * 1024 ** 2, node=node)
    return call.lab.start_task(node, "download", storage, user=call.token_id, lines=lines, on_done=apply)


def pve_delete_volume(call: Call, node: str, storage: str, volume: str) -> str:
    _node(call, node)
    volid = volume if ":" in volume else f"{storage}:{volume}"
    volumes = call.lab.volumes.get(storage, [])
    disk = next((v for v in call.lab.guest_disks(storage, node) if v["volid"] == volid), None)
    if disk is not None:
        raise ApiError(500, f"volume '{volid}' is in use by guest {disk['vmid']}")
    if not any(v["volid"] == volid for v in volumes):
        raise ApiError(500, f"volume '{volid}' does not exist")

    def apply() -> None:
        call.lab.volumes[storage] = [v for v in volumes if v["volid"] != volid]
    return call.lab.start_task(node, "imgdel", "", user=call.token_id, on_done=apply)


def pve_agent(command: str) -> Callable:
    def handler(call: Call, node: str, vmid: str) -> dict:
        guest = _guest(call, node, vmid, "qemu")
        if not guest["config"].get("agent"):
            raise ApiError(500, "No QEMU guest agent configured")
        if guest["status"] != "running":
            raise ApiError(500, f"VM {vmid} is not running")
        address = f"192.0.2.{100 + int(vmid) % 100}"
        answers = {
            "get-osinfo": {"result": {"id": "debian", "name": "Debian GNU/Linux", "pretty-name": "Debian GNU/Linux 13 (trixie)",
                                      "kernel-release": "6.12.48+deb13-amd64", "machine": "x86_64"}},
            "get-host-name": {"result": {"host-name": guest["name"]}},
            "network-get-interfaces": {"result": [
                {"name": "lo", "ip-addresses": [{"ip-address": "127.0.0.1", "ip-address-type": "ipv4", "prefix": 8}]},
                {"name": "eth0", "hardware-address": "bc:24:11:00:00:01",
                 "ip-addresses": [{"ip-address": address, "ip-address-type": "ipv4", "prefix": 24},
                                  {"ip-address": "fe80::be24:11ff:fe00:1", "ip-address-type": "ipv6", "prefix": 64}]}]},
        }
        return answers[command]
    return handler


def _agent_ready(call: Call, node: str, vmid: str) -> dict:
    guest = _guest(call, node, vmid, "qemu")
    if not guest["config"].get("agent"):
        raise ApiError(500, "No QEMU guest agent configured")
    if guest["status"] != "running":
        raise ApiError(500, f"VM {vmid} is not running")
    if guest.get("agent_boot_pings", 0) > 0:  # right after boot (PROXMOX-FACTS): a transient timeout
        guest["agent_boot_pings"] -= 1
        raise ApiError(500, f"VM {vmid} qmp command 'guest-ping' failed - got timeout")
    return guest


def pve_agent_ping(call: Call, node: str, vmid: str) -> None:
    _agent_ready(call, node, vmid)


def pve_agent_exec(call: Call, node: str, vmid: str) -> dict:
    """Runs nothing: answers like the agent would for `sh -c "<script>"`, echoing the script,
    with `exit N` in it as the exit code and `sleep N` making it take that long."""
    guest = _agent_ready(call, node, vmid)
    command = call.params.get("command")
    argv = command if isinstance(command, list) else [command]
    script = argv[-1] if argv[:2] == ["/bin/sh", "-c"] else " ".join(argv)
    guest.setdefault("agent_pids", {})
    pid = 4000 + len(guest["agent_pids"])
    code = re.search(r"exit (\d+)", script)
    pause = re.search(r"sleep (\d+)", script)
    guest["agent_pids"][pid] = {"done_at": time.time() + (int(pause.group(1)) if pause else 0),
                                "exitcode": int(code.group(1)) if code else 0, "out": f"ran: {script}\n"}
    return {"pid": pid}


def pve_agent_exec_status(call: Call, node: str, vmid: str) -> dict:
    guest = _agent_ready(call, node, vmid)
    process = guest.get("agent_pids", {}).get(int(call.arg("pid")))
    if process is None:
        raise ApiError(500, "Agent error: Invalid parameter 'pid'")
    if time.time() < process["done_at"]:
        return {"exited": 0}  # only this while running (PROXMOX-FACTS)
    return {"exited": 1, "exitcode": process["exitcode"], "out-data": process["out"]}


def pve_agent_file_read(call: Call, node: str, vmid: str) -> dict:
    guest = _agent_ready(call, node, vmid)
    files = guest.setdefault("files", {"/etc/hostname": guest["name"] + "\n"})
    path = call.arg("file")
    if path not in files:
        raise ApiError(500, f"Agent error: Failed to open file '{path}': No such file or directory")
    return {"content": files[path], "bytes-read": len(files[path])}


def pve_agent_file_write(call: Call, node: str, vmid: str) -> None:
    guest = _agent_ready(call, node, vmid)
    content = call.arg("content")
    if str(call.arg("encode", "1")) == "0":
        import base64
        content = base64.b64decode(content).decode()
    guest.setdefault("files", {})[call.arg("file")] = content


def pve_lxc_interfaces(call: Call, node: str, vmid: str) -> list:
    guest = _guest(call, node, vmid, "lxc")
    if guest["status"] != "running":
        raise ApiError(500, f"CT {vmid} not running")
    return [{"name": "lo", "inet": "127.0.0.1/8", "hwaddr": "00:00:00:00:00:00"},
            {"name": "eth0", "inet": f"192.0.2.{100 + int(vmid) % 100}/24", "inet6": "fe80::1/64",
             "hwaddr": "bc:24:11:00:00:01"}]


def pve_cluster_log(call: Call) -> list:
    now = int(time.time())
    rows = [{"n": i + 1, "time": now - 600 * i, "node": node, "pid": 1000 + i, "user": "root@pam", "tag": "pvedaemon",
             "pri": 6, "uid": f"{i:08X}", "msg": f"<root@pam> end task {task.upid} {task.exitstatus}"}
            for i, (node, task) in enumerate((t.node, t) for t in call.lab.tasks.values())]
    limit = int(call.arg("max", 50))
    return rows[:limit]


def pve_rrddata(call: Call, node: str) -> list:
    info = _node(call, node)
    now = int(time.time())
    return [{"time": now - 60 * i, "cpu": info["cpu"], "maxcpu": info["maxcpu"], "memused": info["mem"],
             "memtotal": info["maxmem"], "loadavg": float(info["loadavg"][0]), "netin": 1200.5, "netout": 800.25,
             "iowait": 0.01} for i in range(5)]


def pve_certificates(call: Call, node: str) -> list:
    _node(call, node)
    notafter = int(time.time()) + call.lab.cert_days.get(node, 300) * 86400
    return [{"filename": "pve-ssl.pem", "subject": f"/CN={node}.lab", "notafter": notafter,
             "notbefore": notafter - 730 * 86400, "fingerprint": "AB:" * 31 + "AB"}]


def pve_replication(call: Call, node: str) -> list:
    _node(call, node)
    return [dict(job) for job in call.lab.replication.get(node, [])]


def pve_backup_jobs(call: Call) -> list:
    return [dict(job) for job in call.lab.backup_jobs]


def pve_users(call: Call) -> list:
    full = str(call.arg("full", "0")) == "1"
    return [{k: v for k, v in u.items() if full or k != "tokens"} for u in call.lab.users]


def pve_acl(call: Call) -> list:
    return [dict(entry) for entry in call.lab.acl]


def pve_firewall_options(scope: str) -> Callable:
    def handler(call: Call, node: str | None = None, vmid: str | None = None) -> dict:
        key = "cluster" if scope == "cluster" else (vmid if vmid else node)
        return {"enable": call.lab.firewall.get(key, 0), "policy_in": "DROP" if scope == "cluster" else "ACCEPT"}
    return handler


def pve_nextid(call: Call, **_: str) -> str:
    vmid = 100
    while vmid in call.lab.guests:
        vmid += 1
    return str(vmid)  # a string (PROXMOX-FACTS)


def pve_permissions(call: Call, **_: str) -> dict:
    return _permissions(call, lambda privs: {p: 1 for p in privs})


def _permissions(call: Call, render: Callable[[set], dict]) -> dict:
    held: dict[str, set] = {}
    for path, role, propagate in call.token.acl:
        privileges = set(ROLES[role])
        if "*" in privileges:
            privileges = all_privileges(call.product)
        held.setdefault(path, set()).update(privileges)  # several roles on one path add up
    return {path: render(sorted(privileges)) for path, privileges in held.items()}


def pve_pools(call: Call, **_: str) -> list:
    return [{"poolid": p["poolid"], "comment": p.get("comment", "")} for name, p in call.lab.pools.items()
            if call.can(f"/pool/{name}", "Pool.Audit")]


PVE_HANDLERS: dict[tuple[str, str], Callable] = {
    ("GET", "/version"): pve_version,
    ("GET", "/cluster/status"): pve_cluster_status,
    ("GET", "/cluster/resources"): pve_cluster_resources,
    ("GET", "/cluster/nextid"): pve_nextid,
    ("GET", "/cluster/tasks"): pve_cluster_tasks,
    ("GET", "/nodes"): pve_nodes,
    ("GET", "/nodes/{node}/status"): pve_node_status,
    ("GET", "/nodes/{node}/qemu"): pve_guest_list("qemu"),
    ("GET", "/nodes/{node}/lxc"): pve_guest_list("lxc"),
    ("GET", "/nodes/{node}/qemu/{vmid}/status/current"): pve_guest_status("qemu"),
    ("GET", "/nodes/{node}/lxc/{vmid}/status/current"): pve_guest_status("lxc"),
    ("GET", "/nodes/{node}/qemu/{vmid}/config"): pve_guest_config("qemu"),
    ("GET", "/nodes/{node}/lxc/{vmid}/config"): pve_guest_config("lxc"),
    ("GET", "/storage"): pve_storage_list,
    ("GET", "/nodes/{node}/storage"): pve_node_storage,
    ("GET", "/nodes/{node}/tasks"): pve_tasks,
    ("GET", "/nodes/{node}/tasks/{upid}/status"): pve_task_status,
    ("GET", "/nodes/{node}/tasks/{upid}/log"): pve_task_log,
    ("GET", "/access/permissions"): pve_permissions,
    ("GET", "/pools"): pve_pools,
    ("GET", "/nodes/{node}/storage/{storage}/content"): pve_storage_content,
    ("GET", "/nodes/{node}/network"): pve_network,
    ("POST", "/nodes/{node}/vzdump"): pve_vzdump,
    ("POST", "/nodes/{node}/storage/{storage}/download-url"): pve_download_url,
    ("DELETE", "/nodes/{node}/storage/{storage}/content/{volume}"): pve_delete_volume,
    ("GET", "/nodes/{node}/lxc/{vmid}/interfaces"): pve_lxc_interfaces,
    ("GET", "/cluster/log"): pve_cluster_log,
    ("GET", "/nodes/{node}/certificates/info"): pve_certificates,
    ("GET", "/cluster/backup"): pve_backup_jobs,
    ("GET", "/nodes/{node}/replication"): pve_replication,
    ("GET", "/access/users"): pve_users,
    ("GET", "/access/acl"): pve_acl,
    ("GET", "/cluster/firewall/options"): pve_firewall_options("cluster"),
    ("GET", "/nodes/{node}/firewall/options"): pve_firewall_options("node"),
    ("GET", "/nodes/{node}/qemu/{vmid}/firewall/options"): pve_firewall_options("guest"),
    ("GET", "/nodes/{node}/lxc/{vmid}/firewall/options"): pve_firewall_options("guest"),
    ("GET", "/nodes/{node}/rrddata"): pve_rrddata,
}
PVE_HANDLERS |= {("POST", "/nodes/{node}/qemu/{vmid}/agent/exec"): pve_agent_exec,
                 ("POST", "/nodes/{node}/qemu/{vmid}/agent/ping"): pve_agent_ping,
                 ("GET", "/nodes/{node}/qemu/{vmid}/agent/exec-status"): pve_agent_exec_status,
                 ("GET", "/nodes/{node}/qemu/{vmid}/agent/file-read"): pve_agent_file_read,
                 ("POST", "/nodes/{node}/qemu/{vmid}/agent/file-write"): pve_agent_file_write}
for _command in ("get-osinfo", "get-host-name", "network-get-interfaces"):
    PVE_HANDLERS[("GET", f"/nodes/{{node}}/qemu/{{vmid}}/agent/{_command}")] = pve_agent(_command)
for _kind in ("qemu", "lxc"):
    for _action in POWER_RESULT:
        if _kind == "lxc" and _action == "reset":
            continue  # containers have no reset
        PVE_HANDLERS[("POST", f"/nodes/{{node}}/{_kind}/{{vmid}}/status/{_action}")] = pve_power(_kind, _action)
    PVE_HANDLERS[("GET", f"/nodes/{{node}}/{_kind}/{{vmid}}/snapshot")] = pve_snapshots(_kind)
    PVE_HANDLERS[("POST", f"/nodes/{{node}}/{_kind}/{{vmid}}/snapshot")] = pve_snapshot_create(_kind)
    PVE_HANDLERS[("DELETE", f"/nodes/{{node}}/{_kind}/{{vmid}}/snapshot/{{snapname}}")] = pve_snapshot_delete(_kind)
    PVE_HANDLERS[("POST", f"/nodes/{{node}}/{_kind}/{{vmid}}/snapshot/{{snapname}}/rollback")] = pve_rollback(_kind)
    PVE_HANDLERS[("PUT", f"/nodes/{{node}}/{_kind}/{{vmid}}/config")] = pve_config_update(_kind)
    PVE_HANDLERS[("PUT", f"/nodes/{{node}}/{_kind}/{{vmid}}/resize")] = pve_resize(_kind)
    PVE_HANDLERS[("POST", f"/nodes/{{node}}/{_kind}")] = pve_create(_kind)
    PVE_HANDLERS[("POST", f"/nodes/{{node}}/{_kind}/{{vmid}}/clone")] = pve_clone(_kind)
    PVE_HANDLERS[("POST", f"/nodes/{{node}}/{_kind}/{{vmid}}/migrate")] = pve_migrate(_kind)
    PVE_HANDLERS[("POST", f"/nodes/{{node}}/{_kind}/{{vmid}}/template")] = pve_template(_kind)
    PVE_HANDLERS[("DELETE", f"/nodes/{{node}}/{_kind}/{{vmid}}")] = pve_destroy(_kind)


# ---------------------------------------------------------------- PBS handlers

def pbs_version(call: Call, **_: str) -> dict:
    return {"version": "4.2", "release": "1", "repoid": "5a1e0c5f"}


def pbs_permissions(call: Call, **_: str) -> dict:
    return _permissions(call, lambda privs: {p: True for p in privs})


def _datastore(call: Call, store: str) -> dict:
    found = call.lab.datastores.get(store)
    if found is None:
        raise ApiError(400, f"unable to get datastore '{store}' - datastore '{store}' does not exist")
    return found


def pbs_datastores(call: Call, **_: str) -> list:
    # only stores the caller may Audit or Backup (PROXMOX-FACTS)
    return [{"store": name, "comment": ""} for name in call.lab.datastores
            if call.can(f"/datastore/{name}", "Datastore.Audit") or call.can(f"/datastore/{name}", "Datastore.Backup")]


def pbs_datastore_usage(call: Call) -> list:
    now = int(time.time())
    rows = []
    for name, ds in call.lab.datastores.items():
        if not call.can(f"/datastore/{name}", "Datastore.Audit"):
            continue
        growth = 5 * GiB  # per day, so that an estimate exists
        rows.append({"store": name, "total": ds["total"], "used": ds["used"], "avail": ds["total"] - ds["used"],
                     "estimated-full-date": now + (ds["total"] - ds["used"]) // growth * 86400,
                     "history-start": now - 30 * 86400, "history-delta": 86400,
                     "gc-status": {k: v for k, v in ds["gc"].items() if k != "last-run-state"}})
    return rows


def pbs_datastore_status(call: Call, store: str) -> dict:
    ds = _datastore(call, store)
    result = {"total": ds["total"], "used": ds["used"], "avail": ds["total"] - ds["used"]}
    if str(call.arg("verbose", "0")) == "1":
        counts: dict[str, dict] = {}
        for (_, kind, _), snaps in ds["groups"].items():
            entry = counts.setdefault(kind, {"groups": 0, "snapshots": 0})
            entry["groups"] += 1
            entry["snapshots"] += len(snaps)
        result |= {"counts": counts, "gc-status": ds["gc"]}
    return result


def _ns(call: Call) -> str:
    return call.arg("ns", "") or ""


def pbs_namespaces(call: Call, store: str) -> list:
    ds = _datastore(call, store)
    return [{"ns": ns, "comment": comment} if ns else {"ns": ""} for ns, comment in ds["namespaces"].items()]


def pbs_groups(call: Call, store: str) -> list:
    ds = _datastore(call, store)
    rows = []
    for (ns, kind, item), snaps in sorted(ds["groups"].items()):
        if ns != _ns(call) or not snaps:
            continue
        rows.append({"backup-type": kind, "backup-id": item, "last-backup": max(x["backup-time"] for x in snaps),
                     "backup-count": len(snaps), "owner": "root@pam", "files": ["index.json.blob", "drive-scsi0.img.fidx"]})
    return rows


def pbs_snapshots(call: Call, store: str) -> list:
    ds = _datastore(call, store)
    rows = []
    for (ns, kind, item), snaps in sorted(ds["groups"].items()):
        if ns != _ns(call) or call.arg("backup-type") not in (None, kind) or call.arg("backup-id") not in (None, item):
            continue
        for snap in snaps:
            row = {"backup-type": kind, "backup-id": item, "backup-time": snap["backup-time"], "size": snap["size"],
                   "protected": snap["protected"], "owner": snap["owner"], "comment": snap["comment"] or None,
                   "files": [{"filename": "index.json.blob", "crypt-mode": snap["crypt-mode"], "size": 512}]}
            if snap["verification"]:
                row["verification"] = snap["verification"]
            rows.append({k: v for k, v in row.items() if v is not None})
    return rows


def _group(call: Call, ds: dict) -> list[dict]:
    key = (_ns(call), call.arg("backup-type"), call.arg("backup-id"))
    if key not in ds["groups"]:
        raise ApiError(400, f"group '{key[1]}/{key[2]}' does not exist")
    return ds["groups"][key]


def _snapshot(call: Call, ds: dict) -> dict:
    for snap in _group(call, ds):
        if snap["backup-time"] == int(call.arg("backup-time")):
            return snap
    raise ApiError(400, "snapshot does not exist")


PRUNE_PERIODS = (("keep-last", None), ("keep-hourly", "%Y/%m/%d/%H"), ("keep-daily", "%Y/%m/%d"),
                 ("keep-weekly", "%G/%V"), ("keep-monthly", "%Y/%m"), ("keep-yearly", "%Y"))


def prune_marks(snapshots: list[dict], options: dict[str, int]) -> dict[int, str]:
    """PBS's prune selection (proxmox-backup, prune.rs): newest first; each keep option keeps
    the newest snapshot of its next N periods, skipping periods an earlier option already
    covered and snapshots already marked; protected snapshots are always kept; with no keep
    option everything is kept. Returns backup-time -> keep | remove | protected."""
    ordered = sorted(snapshots, key=lambda x: -x["backup-time"])
    if not any(options.get(name) for name, _ in PRUNE_PERIODS):
        return {x["backup-time"]: "protected" if x["protected"] else "keep" for x in ordered}
    mark: dict[int, str] = {}
    for name, period in PRUNE_PERIODS:
        keep = options.get(name)
        if not keep:
            continue
        def period_of(snap: dict) -> str:
            return str(snap["backup-time"]) if period is None else time.strftime(period, time.gmtime(snap["backup-time"]))
        already = {period_of(x) for x in ordered if mark.get(x["backup-time"]) == "keep"}
        included: set[str] = set()
        for snap in ordered:
            if snap["backup-time"] in mark:
                continue
            if snap["protected"]:
                mark[snap["backup-time"]] = "protected"
                continue
            selected = period_of(snap)
            if selected in already:
                continue
            if selected not in included:
                if len(included) >= keep:
                    break
                included.add(selected)
                mark[snap["backup-time"]] = "keep"
            else:
                mark[snap["backup-time"]] = "remove"
    return {x["backup-time"]: "protected" if x["protected"] else mark.get(x["backup-time"], "remove") for x in ordered}


def pbs_prune(call: Call, store: str) -> list | str:
    ds = _datastore(call, store)
    snaps = _group(call, ds)
    options = {name: int(call.arg(name)) for name, _ in PRUNE_PERIODS if call.arg(name) is not None}
    marks = prune_marks(snaps, options)
    rows = [{"backup-type": call.arg("backup-type"), "backup-id": call.arg("backup-id"), "backup-time": t,
             "keep": verdict != "remove", "protected": verdict == "protected"} for t, verdict in marks.items()]
    if str(call.arg("dry-run", "0")) != "1":
        ds["groups"][(_ns(call), call.arg("backup-type"), call.arg("backup-id"))] = [
            x for x in snaps if marks[x["backup-time"]] != "remove"]
    return rows


def pbs_forget(call: Call, store: str) -> None:
    ds = _datastore(call, store)
    snap = _snapshot(call, ds)
    if snap["protected"]:
        raise ApiError(400, "cannot remove protected snapshot")
    _group(call, ds).remove(snap)


def pbs_set_protected(call: Call, store: str) -> None:
    _snapshot(call, _datastore(call, store))["protected"] = str(call.arg("protected")) in ("1", "true")


def pbs_set_notes(call: Call, store: str) -> None:
    _snapshot(call, _datastore(call, store))["comment"] = str(call.arg("notes")).split("\n")[0]


def pbs_gc_status(call: Call, store: str) -> dict:
    return dict(_datastore(call, store)["gc"], store=store)


def pbs_gc_start(call: Call, store: str) -> str:
    ds = _datastore(call, store)
    lines = ["starting garbage collection on store " + store, "Start GC phase1 (mark used chunks)"] + \
        [f"marked {p}% ({p * 120 // 100} of 120 index files)" for p in (25, 50, 75, 100)] + \
        ["Start GC phase2 (sweep unused chunks)", "Removed garbage: 1.2 GiB", "Pending removals: 0 B"]

    def apply() -> None:
        ds["gc"] |= {"last-run-state": "ok", "last-run-endtime": int(time.time())}
    return call.lab.start_task("pbs", "garbage_collection", store, user=call.token_id, lines=lines, on_done=apply,
                               product="pbs")


def pbs_verify(call: Call, store: str) -> str:
    ds = _datastore(call, store)
    if call.arg("backup-time"):
        targets = [_snapshot(call, ds)]
    elif call.arg("backup-id"):
        targets = list(_group(call, ds))
    else:
        targets = [x for snaps in ds["groups"].values() for x in snaps]
    lines = [f"verify datastore {store}"] + [f"percentage done: {p}% ({p * len(targets) // 100}/{len(targets)} snapshots)"
                                             for p in (25, 50, 75, 100)]

    def apply() -> None:
        for snap in targets:
            snap["verification"] = {"state": "ok", "upid": ""}
    item = store if not call.arg("backup-id") else f"{store}:{call.arg('backup-type')}/{call.arg('backup-id')}"
    return call.lab.start_task("pbs", "verify", item, user=call.token_id, lines=lines, on_done=apply, product="pbs")


def pbs_jobs(kind: str) -> Callable:
    def handler(call: Call, **_: str) -> list:
        store = call.arg("store")
        return [dict(job) for job in call.lab.pbs_jobs.get(kind, []) if store in (None, job["store"])]
    return handler


def pbs_gc_jobs(call: Call, **_: str) -> list:
    return [{"store": name, "schedule": "daily", **ds["gc"]} for name, ds in call.lab.datastores.items()]


def pbs_run_job(kind: str) -> Callable:
    def handler(call: Call, id: str) -> str:
        job = next((j for j in call.lab.pbs_jobs.get(kind, []) if j["id"] == id), None)
        if job is None:
            raise ApiError(400, f"job '{id}' does not exist")
        task_type = {"sync": "syncjob", "verify": "verificationjob", "prune": "prunejob"}[kind]
        return call.lab.start_task("pbs", task_type, f"{job['store']}:{id}", user=call.token_id, product="pbs")
    return handler


def _pbs_task(call: Call, upid: str) -> Task:
    task = call.lab.tasks.get(upid)
    if task is None:
        raise ApiError(400, "no such task")
    return task


def pbs_tasks(call: Call, node: str) -> list:
    now = time.time()
    rows = []
    for task in sorted(call.lab.tasks.values(), key=lambda t: -t.started):
        if not task.upid.startswith("UPID:pbs:") and task.node != "pbs":
            continue
        running = task.running(now)
        if str(call.arg("running", "0")) == "1" and not running:
            continue
        if str(call.arg("errors", "0")) == "1" and (running or task.exitstatus == "OK"):
            continue
        row = {"upid": task.upid, "node": task.node, "pid": 1000, "pstart": 41394, "starttime": int(task.started),
               "worker_type": task.type, "worker_id": task.id, "user": task.user}
        if not running:
            row |= {"endtime": int(task.started + task.duration), "status": task.exitstatus}
        rows.append(row)  # running tasks are listed too (PROXMOX-FACTS)
    start, limit = int(call.arg("start", 0)), int(call.arg("limit", 50))
    return rows[start:start + limit] if limit else rows[start:]


def pbs_task_status(call: Call, node: str, upid: str) -> dict:
    task = _pbs_task(call, upid)
    row = {"upid": upid, "node": task.node, "pid": 1000, "pstart": 41394, "starttime": int(task.started),
           "type": task.type, "id": task.id, "user": task.user}
    if task.running(time.time()):
        return row | {"status": "running"}
    return row | {"status": "stopped", "exitstatus": task.exitstatus}


def pbs_task_log(call: Call, node: str, upid: str) -> list:
    lines = _pbs_task(call, upid).log(time.time()) or ["no content"]
    rows = [{"n": i + 1, "t": text} for i, text in enumerate(lines)]
    start, limit = int(call.arg("start", 0)), int(call.arg("limit", 50))
    return rows[start:start + limit] if limit else rows[start:]


PBS_HANDLERS: dict[tuple[str, str], Callable] = {
    ("GET", "/version"): pbs_version,
    ("GET", "/access/permissions"): pbs_permissions,
    ("GET", "/admin/datastore"): pbs_datastores,
    ("GET", "/status/datastore-usage"): pbs_datastore_usage,
    ("GET", "/admin/datastore/{store}/status"): pbs_datastore_status,
    ("GET", "/admin/datastore/{store}/namespace"): pbs_namespaces,
    ("GET", "/admin/datastore/{store}/groups"): pbs_groups,
    ("GET", "/admin/datastore/{store}/snapshots"): pbs_snapshots,
    ("DELETE", "/admin/datastore/{store}/snapshots"): pbs_forget,
    ("POST", "/admin/datastore/{store}/prune"): pbs_prune,
    ("PUT", "/admin/datastore/{store}/protected"): pbs_set_protected,
    ("PUT", "/admin/datastore/{store}/notes"): pbs_set_notes,
    ("GET", "/admin/datastore/{store}/gc"): pbs_gc_status,
    ("POST", "/admin/datastore/{store}/gc"): pbs_gc_start,
    ("POST", "/admin/datastore/{store}/verify"): pbs_verify,
    ("GET", "/admin/sync"): pbs_jobs("sync"),
    ("GET", "/admin/verify"): pbs_jobs("verify"),
    ("GET", "/admin/prune"): pbs_jobs("prune"),
    ("GET", "/admin/gc"): pbs_gc_jobs,
    ("POST", "/admin/sync/{id}/run"): pbs_run_job("sync"),
    ("POST", "/admin/verify/{id}/run"): pbs_run_job("verify"),
    ("POST", "/admin/prune/{id}/run"): pbs_run_job("prune"),
    ("GET", "/nodes/{node}/tasks"): pbs_tasks,
    ("GET", "/nodes/{node}/tasks/{upid}/status"): pbs_task_status,
    ("GET", "/nodes/{node}/tasks/{upid}/log"): pbs_task_log,
}
HANDLERS = {"pve": PVE_HANDLERS, "pbs": PBS_HANDLERS}
TOKEN_HEADER = {"pve": re.compile(r"^PVEAPIToken=(?P<id>[^=\s]+)=(?P<secret>\S+)$"),
                "pbs": re.compile(r"^PBSAPIToken=(?P<id>[^:\s]+):(?P<secret>\S+)$")}


def generic(call: Call, entry: dict) -> Any:
    """A method that the simulator keeps no state for: an empty answer of the right type."""
    if call.method == "GET":
        return {"array": [], "object": {}}.get(entry.get("returns", ""))
    return None


COOKIE = {"pve": "PVEAuthCookie", "pbs": "PBSAuthCookie"}


def login(lab: Lab, product: str, params: dict[str, Any]) -> dict:
    """POST /access/ticket: a ticket and a CSRF token for a user and password (PROXMOX-FACTS:
    valid two hours); an account with a second factor gets a half ticket and NeedTFA."""
    errors = catalog.check_params(catalog.find_method(product, "POST", "/access/ticket")[0], params)
    if errors:
        lab.schema_rejections.append((product, "POST", "/access/ticket", errors))
        raise ApiError(400, "Parameter verification failed.", errors)
    user, password = str(params.get("username", "")), str(params.get("password", ""))
    known = lab.logins[product].get(user)
    if known is None or known[0] != password:
        if lab.auth_fail_delay:
            time.sleep(lab.auth_fail_delay)
        raise ApiError(401, "authentication failure")
    prefix = product.upper()
    if known[2]:
        return {"username": user, "ticket": f"{prefix}:!tfa!{{\"totp\":true}}:{secrets.token_hex(8)}",
                "NeedTFA": 1}
    ticket = f"{prefix}:{user}:{int(time.time()):X}::{secrets.token_urlsafe(24)}"
    csrf = f"{int(time.time()):X}:{secrets.token_urlsafe(16)}"
    with lab.lock:
        lab.tickets[ticket] = (product, user, csrf, time.time())
    return {"username": user, "ticket": ticket, "CSRFPreventionToken": csrf}


def ticket_identity(lab: Lab, product: str, cookie: str) -> tuple[str, Token, str] | None:
    """The user, rights and CSRF token of a valid, unexpired ticket cookie."""
    jar = dict(part.strip().split("=", 1) for part in cookie.split(";") if "=" in part)
    found = lab.tickets.get(jar.get(COOKIE[product], ""))
    if found is None or found[0] != product or time.time() - found[3] > lab.ticket_lifetime:
        return None
    return found[1], lab.logins[product][found[1]][1], found[2]


def handle(lab: Lab, product: str, method: str, raw_path: str, params: dict[str, Any], auth: str,
           *, form: bool = True, cookie: str = "", csrf: str = "") -> Any:
    """One API call: auth, route, schema check, permission check, then the handler."""
    lab.tick()
    if lab.delay:
        time.sleep(lab.delay)  # a slow server, switched on by a test
    path = unquote(raw_path)
    for pattern, seconds in lab.slow_paths.items():
        if re.search(pattern, path):
            time.sleep(seconds)
    match = TOKEN_HEADER[product].match(auth or "")
    logging_in = method == "POST" and path == "/access/ticket" and not match
    identity = None if match or logging_in else ticket_identity(lab, product, cookie)
    caller = match.group("id") if match else (identity[0] if identity else "")
    with lab.lock:
        lab.requests.append((product, method, path))
        lab.request_tokens.append(caller)
    if logging_in:
        return login(lab, product, params)
    if identity:  # a valid ticket: the user's own rights; writes need the ticket's CSRF token
        token = identity[1]
        if method != "GET" and csrf != identity[2]:
            raise ApiError(401, "Permission denied - invalid csrf token")
    else:
        tokens = lab.pve_tokens if product == "pve" else lab.pbs_tokens
        token = tokens.get(match.group("id")) if match else None
        if token is None or token.secret != match.group("secret"):
            if lab.auth_fail_delay:
                time.sleep(lab.auth_fail_delay)
            raise ApiError(401, "Authentication failed!" if product == "pve" else
                           "authentication failed - invalid token")
    if method == "HEAD":
        raise ApiError(501, f"Method 'HEAD {path}' not implemented")
    found = catalog.find_method(product, method, path)
    if found is None:
        raise ApiError(501, f"Method '{method} {path}' not implemented")
    entry, path_params = found
    if match and entry.get("allowtoken") == 0:  # PROXMOX-FACTS: a few endpoints refuse tokens outright
        raise ApiError(403, f"URI '{path}' not available with API token, need proper ticket.")
    for pattern, status, message in lab.fail:
        if re.search(pattern, path):
            if status == 400:  # a parameter the server itself rejects, in PVE's format
                raise ApiError(400, "Parameter verification failed.", {"value": message})
            raise ApiError(status, message)
    errors = catalog.check_params(entry, params, form=form, path_params=path_params)
    if errors:
        lab.schema_rejections.append((product, method, path, errors))
        raise ApiError(400, "Parameter verification failed.", errors)
    call = Call(product, method, path, params, caller, token, lab)
    if "node" in path_params and product == "pve":
        _node(call, path_params["node"])
    _check_permission(call, entry, path_params)
    handler = HANDLERS[product].get((method, entry["path"]))
    with lab.lock:
        if handler is None:
            return generic(call, entry)
        return handler(call, **{k.replace("-", "_"): v for k, v in path_params.items()})


API_VIEWER = {"pve": "/pve-docs/api-viewer/apidoc.js", "pbs": "/docs/api-viewer/apidoc.js"}
SCHEMA_DIR = Path(__file__).resolve().parent.parent / "shared" / "schemas"


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed-ACK stall
    server_version = "pve-api-daemon/3.0"
    lab: Lab
    product: str

    def log_message(self, *args: Any) -> None:  # keep test output clean
        pass

    def _respond(self) -> None:
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        form = True
        params: dict[str, Any] = {}
        if body:
            if (self.headers.get("Content-Type") or "").startswith("application/json"):
                params = json.loads(body or b"{}")
                form = False
            else:
                params = _flatten(parse_qs(body.decode(), keep_blank_values=True))
        params |= _flatten(parse_qs(parts.query, keep_blank_values=True))  # query keys win (PROXMOX-FACTS)
        if parts.path == API_VIEWER[self.product]:
            schema = SCHEMA_DIR / f"{self.product}-api.json"
            if schema.is_file():  # the official viewer data, when ../shared is beside the project
                return self._send(200, "OK", f"const apiSchema = {schema.read_text()};\n", raw=True)
            return self._send(404, "Not Found", None)
        if not parts.path.startswith("/api2/json/") and parts.path != "/api2/json":
            return self._send(404, "Not Found", None)
        api_path = parts.path[len("/api2/json"):] or "/"
        try:
            data = handle(self.lab, self.product, self.command, api_path, params,
                          self.headers.get("Authorization", ""), form=form,
                          cookie=self.headers.get("Cookie", ""), csrf=self.headers.get("CSRFPreventionToken", ""))
        except ApiError as exc:
            return self._send_error(exc)
        body_out: dict[str, Any] = {"data": data}
        if isinstance(data, list) and re.search(r"/tasks(/[^/]+/log)?$", api_path):
            body_out["total"] = len(data)
        self._send(200, "OK", body_out)

    def _send_error(self, exc: ApiError) -> None:
        reason = exc.message.splitlines()[0]  # only the first line reaches the reason phrase
        if self.product == "pbs":
            # PBS: plain text under a JSON content type; plain errors are 400 (PROXMOX-FACTS)
            text = exc.message
            if exc.errors:
                text = "parameter verification errors\n\n" + "".join(
                    f"parameter '{k}': {v}\n" for k, v in exc.errors.items())
            return self._send(exc.status, reason, text, raw=True)
        body: dict[str, Any] = {"data": None}
        if exc.errors:
            body["errors"] = {k: v + "\n" for k, v in exc.errors.items()}
        if not self.lab.legacy_errors:
            body["message"] = exc.message + "\n"
        self._send(exc.status, reason, body)

    def _send(self, status: int, reason: str, body: Any, raw: bool = False) -> None:
        payload = (body if raw else json.dumps(body)).encode() if body is not None else b""
        self.send_response(status, reason)
        self.send_header("Content-Type", "application/json;charset=UTF-8")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _respond


def _flatten(parsed: dict[str, list[str]]) -> dict[str, Any]:
    return {k: v[0] if len(v) == 1 else v for k, v in parsed.items()}


# ---------------------------------------------------------------- TLS and serving

def make_certificate(directory: Path, common_name: str = "localhost") -> tuple[Path, Path, str]:
    """A self-signed certificate for localhost/127.0.0.1; returns (cert, key, SHA-256 fingerprint)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    digest = cert.fingerprint(hashes.SHA256()).hex().upper()
    return cert_path, key_path, ":".join(digest[i:i + 2] for i in range(0, len(digest), 2))


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up (a timeout test) is not an error of the simulator


class Simulator:
    """Serves a Lab as PVE and PBS over HTTPS on ephemeral loopback ports."""

    def __init__(self, lab: Lab | None = None, host: str = "127.0.0.1"):
        self.lab = lab or Lab.homelab()
        self.host = host
        self._dir = tempfile.TemporaryDirectory(prefix="pve-sim-")
        self.state_dir = self._dir.name
        self.cert_file, key_file, self.fingerprint = make_certificate(Path(self._dir.name))
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._context.load_cert_chain(self.cert_file, key_file)
        self._servers: dict[str, ThreadingHTTPServer] = {}

    def start(self) -> "Simulator":
        for product in ("pve", "pbs"):
            handler = type(f"{product}Handler", (_RequestHandler,), {"lab": self.lab, "product": product})
            server = _Server((self.host, 0), handler)
            server.socket = self._context.wrap_socket(server.socket, server_side=True)
            threading.Thread(target=server.serve_forever, daemon=True, name=f"sim-{product}").start()
            self._servers[product] = server
        return self

    def url(self, product: str) -> str:
        return f"https://{self.host}:{self._servers[product].server_address[1]}"

    @property
    def pve_url(self) -> str:
        return self.url("pve")

    @property
    def pbs_url(self) -> str:
        return self.url("pbs")

    def env(self, label: str = "lab", pve_token: str = "mcp@pve!reader", pbs_token: str = "mcp@pbs!reader",
            pbs: bool = True) -> dict[str, str]:
        """Environment variables that point the server at this simulator (fingerprint pinned)."""
        secret = self.lab.pve_tokens[pve_token].secret
        key = label.upper()
        env = {f"PROXMOX_{key}_URL": self.pve_url, f"PROXMOX_{key}_TOKEN": f"{pve_token}={secret}",
               f"PROXMOX_{key}_FINGERPRINT": self.fingerprint}
        if pbs:
            env |= {f"PBS_{key}_URL": self.pbs_url,
                    f"PBS_{key}_TOKEN": f"{pbs_token}:{self.lab.pbs_tokens[pbs_token].secret}",
                    f"PBS_{key}_FINGERPRINT": self.fingerprint}
        return env

    def stop(self) -> None:
        for server in self._servers.values():
            server.shutdown()
            server.server_close()
        self._servers.clear()
        self._dir.cleanup()

    def __enter__(self) -> "Simulator":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


if __name__ == "__main__":
    import sys
    with Simulator() as sim:
        print(json.dumps(sim.env(), indent=2), file=sys.stderr)
        print("simulator running; Ctrl-C to stop", file=sys.stderr)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
