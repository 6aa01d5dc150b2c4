"""The bypass corpus: every way found to reach a protected guest, destroy backups below the
destructive gate, read secrets at the read gate or touch the host without the elevated gate.
Each entry is refused twice: by the policy's admission step (nothing reaches `send`), and through
the generic tools of a server configured as `server.main` configures it (the in-process layer of
conftest: the same tool edge and middleware as over MCP) against the simulator, with no change
request sent. tests/test_admission.py meets the same admission over real MCP sessions.

Sessions (the operator's configuration each entry is tried in):
  open       destructive tier, exec, elevated and sensitive open; guests 100, 101, 102 protected
  write      write tier, exec and sensitive open, elevated closed
  elevated   write tier and elevated open (the destructive tier closed)
  read       the default: read tier, nothing else open
  exec_list  everything open, PROXMOX_EXEC_ALLOWED_VMIDS=105, only guest 101 protected
  unblocked  write tier and exec open, the QEMU monitor, sendkey and the agent's set-user-password
             opened by PROXMOX_UNBLOCK, PROXMOX_EXEC_ALLOWED_VMIDS=104, only guest 101 protected
  backups    everything open, guests 101 (a VM) and 103 (a container on lvmthin) protected
  remote     everything open, guests 100, 101, 102 protected, this server seen from 198.51.100.7 (outside
             the management network: let in by node pve1's rules only)
"""
import copy
import json
import re
from types import SimpleNamespace
from urllib.parse import unquote

import pytest

import calls
import policy
from conftest import in_process, requests_during
from errors import ConfirmationNeeded, PolicyError
from protection import Protected
from settings import HostPolicy, Settings

PVE = SimpleNamespace(product="pve", label="lab", token_id="root@pam!admin", write_token_id=None)
PBS = SimpleNamespace(product="pbs", label="lab", token_id="root@pam!admin", write_token_id=None)
PROTECTED = [{"host": "lab", "vmid": 100, "name": "web", "reason": "the family website"},
             {"host": "lab", "vmid": 101, "name": "db", "reason": "the production database"},
             {"host": "lab", "vmid": 102, "name": "dns", "reason": "everything breaks without DNS"},
             {"host": "lab", "vmid": 103, "name": "media", "reason": "the family photos"}]
ALL = frozenset({"exec", "elevated", "sensitive"})
UNBLOCKED = ("POST /nodes/{node}/qemu/{vmid}/monitor", "PUT /nodes/{node}/qemu/{vmid}/sendkey",
             "POST /nodes/{node}/qemu/{vmid}/agent/set-user-password")
SESSIONS = {  # name -> (access tier, extra gates, protected vmids, exec allow-list, PROXMOX_UNBLOCK)
    "open": ("destructive", ALL, (100, 101, 102), None, ()),
    "write": ("write", frozenset({"exec", "sensitive"}), (100, 101, 102), None, ()),
    "elevated": ("write", frozenset({"elevated"}), (100, 101, 102), None, ()),
    "read": ("read", frozenset(), (100, 101, 102), None, ()),
    "exec_list": ("destructive", ALL, (101,), {105}, ()),
    "unblocked": ("write", frozenset({"exec"}), (101,), {104}, UNBLOCKED),
    "backups": ("destructive", ALL, (101, 103), None, ()),
}
PBS_VOLUME = "pbs:backup/vm/101/2026-11-28T02:00:01Z"
REBOOT_VIA_EXECUTE = json.dumps([{"method": "POST", "path": "qemu/101/status/stop"}])

# (session, product, method, path, params, what the refusal says). Old entries first (the
# corpus of stage 1: 51 entries), then one block per class of hole of issue 14.
CORPUS = [
    # ---- stage 1: a protected guest named in every way
    ("open", "pve", "POST", "/nodes/pve1/qemu/100/status/stop", {}, "protected"),
    ("open", "pve", "POST", "/nodes/pve1/qemu/100/status/start", {}, "protected"),
    ("open", "pve", "POST", "/nodes/pve2/qemu/100/status/shutdown", {}, "protected"),  # wrong node, same guest
    ("open", "pve", "DELETE", "/nodes/pve1/qemu/100", {}, "protected"),
    ("open", "pve", "DELETE", "/nodes/pve3/lxc/102", {}, "protected"),
    ("open", "pve", "PUT", "/nodes/pve1/qemu/100/config", {"memory": "1024"}, "protected"),
    ("open", "pve", "POST", "/nodes/pve1/qemu/100/snapshot/s1/rollback", {}, "protected"),
    ("open", "pve", "POST", "/nodes/pve1/qemu/103/clone", {"newid": 100}, "protected"),  # clone over it
    ("open", "pve", "POST", "/nodes/pve1/qemu",
     {"vmid": 100, "archive": "nfs-backup:backup/vzdump-qemu-103-x.vma.zst", "force": 1}, "protected"),
    ("open", "pve", "POST", "/nodes/pve1/qemu/104/move_disk", {"disk": "scsi0", "target-vmid": 100}, "protected"),
    ("open", "pve", "POST", "/nodes/pve1/qemu/100/migrate", {"target": "pve2"}, "protected"),
    ("open", "pve", "PUT", "/nodes/pve1/qemu/100/resize", {"disk": "scsi0", "size": "+1G"}, "protected"),
    ("open", "pve", "POST", "/nodes/pve1/qemu/100/agent/exec", {"command": ["id"]}, "protected"),
    ("open", "pve", "POST", "/nodes/pve1/qemu/100/template", {}, "protected"),
    ("open", "pve", "PUT", "/nodes/pve1/qemu/100/unlink", {"idlist": "scsi1"}, "protected"),
    ("open", "pve", "DELETE", "/nodes/pve1/storage/local-lvm/content/local-lvm:vm-100-disk-0", {}, "protected"),
    ("open", "pve", "DELETE", "/nodes/pve1/storage/local-lvm/content/local-lvm%3Avm-100-disk-0", {}, "protected"),
    ("open", "pve", "DELETE", "/nodes/pve1/storage/local-lvm/content/vm-100-disk-0", {}, "protected"),
    ("open", "pve", "DELETE", "/nodes/pve3/storage/local-lvm/content/local-lvm:subvol-102-disk-0", {}, "protected"),
    ("open", "pve", "DELETE", "/nodes/pve1/storage/local-lvm/content/local-lvm:base-100-disk-0", {}, "protected"),
    ("open", "pve", "DELETE",
     "/nodes/pve1/storage/nfs-backup/content/nfs-backup:backup/vzdump-qemu-100-2026_11_28-02_00_01.vma.zst", {},
     "protected"),
    ("open", "pve", "POST", "/nodes/pve1/storage/local-lvm/content",
     {"vmid": 100, "filename": "vm-100-disk-9", "size": "1G"}, "protected"),
    ("open", "pve", "DELETE", "/nodes/pve1/storage/nfs-backup/prunebackups", {"vmid": 100}, "protected"),
    ("open", "pve", "DELETE", "/nodes/pve1/storage/nfs-backup/prunebackups", {}, "protected"),  # every guest
    ("open", "pve", "DELETE", "/cluster/ha/resources/vm:100", {}, "protected"),
    ("open", "pve", "POST", "/cluster/ha/resources", {"sid": "ct:102"}, "protected"),
    ("open", "pve", "POST", "/cluster/ha/resources/vm:100/migrate", {"node": "pve2"}, "protected"),
    ("open", "pve", "PUT", "/cluster/ha/resources/vm%3A100", {"state": "stopped"}, "protected"),
    ("open", "pve", "DELETE", "/cluster/replication/100-0", {}, "protected"),
    ("open", "pve", "POST", "/cluster/replication", {"id": "102-1", "target": "pve2", "type": "local"}, "protected"),
    ("open", "pve", "PUT", "/pools/prod", {"vms": "100", "delete": 1}, "protected"),
    ("open", "pve", "PUT", "/pools/prod", {"vms": "103,102"}, "protected"),
    ("open", "pve", "PUT", "/pools", {"poolid": "prod", "vms": "100"}, "protected"),
    ("open", "pve", "POST", "/nodes/pve1/stopall", {}, "protected"),
    ("open", "pve", "POST", "/nodes/pve1/startall", {"vms": "103,100"}, "protected"),
    ("open", "pve", "POST", "/nodes/pve1/migrateall", {"target": "pve2"}, "protected"),
    ("open", "pve", "POST", "/nodes/pve1/suspendall", {}, "protected"),
    ("open", "pve", "POST", "/cluster/bulk-action/guest/shutdown", {}, "protected"),
    ("open", "pve", "POST", "/cluster/bulk-action/guest/start", {"vms": [103, 102]}, "protected"),
    ("open", "pve", "POST", "/nodes/pve1/vzdump", {"all": 1}, "protected"),
    ("open", "pve", "POST", "/nodes/pve1/vzdump", {"all": 1, "exclude": "102"}, "protected"),
    ("open", "pve", "POST", "/nodes/pve1/vzdump", {"vmid": "103,100"}, "protected"),
    ("open", "pve", "POST", "/nodes/pve1/vzdump", {"pool": "prod"}, "protected"),
    ("open", "pve", "POST", "/cluster/backup", {"all": 1, "schedule": "daily", "storage": "pbs"}, "protected"),
    ("open", "pve", "PUT", "/nodes/pve1/qemu/100/firewall/options", {"enable": 0}, "protected"),
    ("open", "pve", "POST", "/nodes/pve1/qemu/100/firewall/rules", {"action": "ACCEPT", "type": "in"}, "protected"),
    ("open", "pbs", "POST", "/admin/datastore/backup/prune",
     {"backup-type": "vm", "backup-id": "100", "keep-last": 1}, "protected"),
    ("open", "pbs", "DELETE", "/admin/datastore/backup/snapshots",
     {"backup-type": "ct", "backup-id": "102", "backup-time": 1}, "protected"),
    ("open", "pbs", "DELETE", "/admin/datastore/backup/groups", {"backup-type": "vm", "backup-id": "100"}, "protected"),
    ("open", "pbs", "POST", "/admin/datastore/backup/prune-datastore", {"keep-last": 1}, "protected"),
    ("open", "pbs", "DELETE", "/admin/datastore/backup/namespace", {"ns": "old", "delete-groups": 1}, "protected"),
    # ---- 1. the exec allow-list inside admission (guest 105 allowed; 100 is not, and not protected)
    ("exec_list", "pve", "POST", "/nodes/pve1/qemu/100/agent/exec", {"command": ["id"]}, "PROXMOX_EXEC_ALLOWED_VMIDS"),
    ("exec_list", "pve", "POST", "/nodes/pve1/qemu/100/agent/file-write", {"file": "/etc/motd", "content": "x"},
     "PROXMOX_EXEC_ALLOWED_VMIDS"),
    ("exec_list", "pve", "GET", "/nodes/pve1/qemu/100/agent/file-read", {"file": "/etc/shadow"},
     "PROXMOX_EXEC_ALLOWED_VMIDS"),
    ("exec_list", "pve", "POST", "/nodes/pve1/qemu/100/agent", {"command": "fsfreeze-status"},
     "PROXMOX_EXEC_ALLOWED_VMIDS"),
    # ---- 2. confirmation belongs to the gate: guest file reads are asked too; a node's power reaches the
    # protected guests running there (100 on pve1, 102 on pve3: stop-all shuts them down; power_effects.py)
    ("open", "pve", "POST", "/nodes/pve1/status", {"command": "reboot"}, "protected guest 100"),
    ("open", "pve", "POST", "/nodes/pve3/status", {"command": "shutdown"}, "protected guest 102"),
    ("open", "pve", "GET", "/nodes/pve2/qemu/104/agent/file-read", {"file": "/etc/hostname"}, "confirm=true"),
    ("open", "pbs", "DELETE", "/admin/datastore/backup/snapshots",
     {"backup-type": "vm", "backup-id": "103", "backup-time": 1}, "confirm=true"),
    # ---- 3. secrets at the read gate (derived from the return schemas), lists like their items
    ("read", "pbs", "GET", "/config/access/openid/corp", {}, "PROXMOX_ALLOW_SENSITIVE"),
    ("read", "pbs", "GET", "/config/access/openid", {}, "PROXMOX_ALLOW_SENSITIVE"),
    ("read", "pbs", "GET", "/config/metrics/influxdb-http/influx", {}, "PROXMOX_ALLOW_SENSITIVE"),
    ("read", "pbs", "GET", "/config/metrics/influxdb-http", {}, "PROXMOX_ALLOW_SENSITIVE"),
    ("read", "pve", "GET", "/cluster/acme/plugins", {}, "PROXMOX_ALLOW_SENSITIVE"),
    ("read", "pve", "GET", "/cluster/acme/plugins/dns1", {}, "PROXMOX_ALLOW_SENSITIVE"),
    ("read", "pbs", "GET", "/config/acme/plugins", {}, "PROXMOX_ALLOW_SENSITIVE"),
    ("read", "pbs", "GET", "/config/remote", {}, "PROXMOX_ALLOW_SENSITIVE"),
    ("read", "pbs", "GET", "/config/s3", {}, "PROXMOX_ALLOW_SENSITIVE"),
    ("read", "pve", "GET", "/nodes/pve1/subscription", {}, "PROXMOX_ALLOW_SENSITIVE"),
    ("read", "pve", "GET", "/cluster/notifications/endpoints/webhook", {}, "PROXMOX_ALLOW_SENSITIVE"),
    # ---- 4. backups destroyed below the destructive gate ...
    ("write", "pbs", "POST", "/pull", {"store": "backup", "remote": "office", "remote-store": "backup",
                                       "remove-vanished": 1}, "PROXMOX_ACCESS=destructive"),
    ("write", "pbs", "PUT", "/config/sync/s-backup", {"remove-vanished": 1}, "PROXMOX_ACCESS=destructive"),
    ("write", "pbs", "POST", "/admin/sync/s-remove/run", {}, "PROXMOX_ACCESS=destructive"),  # stored remove-vanished
    ("write", "pbs", "POST", "/config/prune", {"id": "p-two", "store": "backup", "schedule": "daily", "keep-last": 1},
     "PROXMOX_ACCESS=destructive"),
    ("write", "pbs", "PUT", "/config/prune/p-backup", {"keep-last": 1}, "PROXMOX_ACCESS=destructive"),
    ("write", "pbs", "POST", "/admin/prune/p-backup/run", {}, "PROXMOX_ACCESS=destructive"),
    ("write", "pve", "PUT", "/cluster/backup/backup-nightly", {"prune-backups": "keep-last=1"},
     "PROXMOX_ACCESS=destructive"),
    ("write", "pve", "POST", "/nodes/pve1/vzdump", {"vmid": "103", "prune-backups": "keep-last=1"},
     "PROXMOX_ACCESS=destructive"),
    ("write", "pve", "PUT", "/storage/nfs-backup", {"prune-backups": "keep-last=1"}, "PROXMOX_ACCESS=destructive"),
    # ... and, at the destructive tier, a bulk action over the protected guests' backups
    ("open", "pbs", "POST", "/pull", {"store": "backup", "remote": "office", "remote-store": "backup",
                                      "remove-vanished": 1}, "protected"),
    ("open", "pbs", "PUT", "/config/sync/s-backup", {"remove-vanished": 1}, "protected"),
    ("open", "pbs", "POST", "/admin/sync/s-remove/run", {}, "protected"),
    ("open", "pbs", "POST", "/config/prune", {"id": "p-two", "store": "backup", "schedule": "daily", "keep-last": 1},
     "protected"),
    ("open", "pbs", "PUT", "/config/prune/p-backup", {"keep-last": 1}, "protected"),
    ("open", "pbs", "POST", "/admin/prune/p-backup/run", {}, "protected"),
    ("open", "pve", "PUT", "/cluster/backup/backup-nightly", {"prune-backups": "keep-last=1"}, "protected"),
    ("open", "pve", "POST", "/nodes/pve1/vzdump", {"vmid": "101", "prune-backups": "keep-last=1"}, "protected"),
    ("open", "pve", "PUT", "/storage/nfs-backup", {"prune-backups": "keep-last=1"}, "protected"),
    # ---- 5. names the policy did not recognise
    ("open", "pve", "DELETE", f"/nodes/pve1/storage/pbs/content/{PBS_VOLUME}", {}, "protected"),
    ("open", "pve", "PUT", f"/nodes/pve1/storage/pbs/content/{PBS_VOLUME}", {"protected": 0}, "protected"),
    ("open", "pve", "DELETE", "/nodes/pve1/storage/pbs/content/pbs:backup/ct/102/2026-11-28T02:00:01Z", {},
     "protected"),
    ("open", "pve", "POST", "/cluster/ha/rules", {"rule": "r1", "type": "resource-affinity",
                                                  "resources": "vm:103,vm:101"}, "protected"),
    ("open", "pve", "POST", "/cluster/ha/rules", {"rule": "r2", "type": "node-affinity", "nodes": "pve1",
                                                  "resources": "vm:101,vm:103"}, "protected"),
    ("open", "pve", "POST", "/nodes/pve2/qemu/0000000101/status/stop", {}, "pve-vmid"),
    ("open", "pve", "POST", "/nodes/pve2/qemu/0101/status/stop", {}, "pve-vmid"),
    ("open", "pve", "POST", "/nodes/pve2/vzdump", {"vmid": "0000000101"}, "pve-vmid"),
    ("open", "pve", "POST", "/nodes/pve2/qemu/104/status/stop", {"vmid": 101}, "conflicting values"),
    ("open", "pbs", "POST", "/admin/datastore/backup/prune", {"store": "other", "backup-type": "vm",
                                                              "backup-id": "103", "keep-last": 1}, "duplicate"),
    ("read", "pve", "GET", "/nodes/pve1/storage/pbs/file-restore/list",
     {"volume": "pbs:backup/vm/103/2026-11-28T02:00:01Z", "filepath": "/"}, "PROXMOX_ALLOW_SENSITIVE"),
    ("read", "pve", "GET", "/nodes/pve1/storage/pbs/file-restore/download",
     {"volume": "pbs:backup/vm/103/2026-11-28T02:00:01Z", "filepath": "/etc/shadow"}, "PROXMOX_ALLOW_SENSITIVE"),
    # ---- 6. changes to a protected guest that never name it
    ("open", "pve", "PUT", "/cluster/backup/backup-nightly", {"mode": "stop"}, "protected"),
    ("open", "pve", "PUT", "/cluster/backup/backup-nightly", {"exclude": "101,104"}, "protected"),
    ("open", "pve", "DELETE", "/cluster/backup/backup-nightly", {}, "protected"),
    ("open", "pve", "POST", "/nodes/pve1/execute", {"commands": REBOOT_VIA_EXECUTE}, "protected"),
    ("elevated", "pve", "POST", "/nodes/pve1/execute",
     {"commands": json.dumps([{"method": "DELETE", "path": "qemu/104"}])}, "PROXMOX_ACCESS=destructive"),
    ("elevated", "pbs", "DELETE", "/config/datastore/backup", {"destroy-data": 1}, "PROXMOX_ACCESS=destructive"),
    ("open", "pbs", "DELETE", "/config/datastore/backup", {"destroy-data": 1}, "protected"),
    ("write", "pve", "PUT", "/nodes/pve1/lxc/103/config", {"delete": "unused0"}, "PROXMOX_ACCESS=destructive"),
    ("write", "pve", "PUT", "/nodes/pve2/qemu/104/config", {"delete": "vmstate"}, "PROXMOX_ACCESS=destructive"),
    ("write", "pve", "POST", "/nodes/pve2/qemu/104/status/shutdown", {"forceStop": 1}, "PROXMOX_ACCESS=destructive"),
    ("write", "pve", "POST", "/cluster/bulk-action/guest/shutdown", {"vms": [103]}, "PROXMOX_ACCESS=destructive"),
    # ---- 7. host paths and devices, wherever they sit in a property string
    ("write", "pve", "PUT", "/nodes/pve1/lxc/103/config", {"mp0": "backup=1,volume=/etc,mp=/mnt"},
     "PROXMOX_ALLOW_ELEVATED"),
    ("write", "pve", "PUT", "/nodes/pve1/lxc/103/config", {"rootfs": "volume=/,size=8G"}, "PROXMOX_ALLOW_ELEVATED"),
    ("write", "pve", "PUT", "/nodes/pve2/qemu/104/config", {"scsi1": "/dev/sda"}, "PROXMOX_ALLOW_ELEVATED"),
    ("write", "pve", "PUT", "/nodes/pve2/qemu/104/config", {"virtio2": "file=/dev/nvme0n1,backup=0"},
     "PROXMOX_ALLOW_ELEVATED"),
    ("write", "pve", "PUT", "/nodes/pve2/qemu/104/config",
     {"scsi1": "local-lvm:0,import-from=/etc/pve/priv/authkey.key"}, "PROXMOX_ALLOW_ELEVATED"),
    ("write", "pve", "PUT", "/nodes/pve1/lxc/103/config", {"features": "keyctl=on"}, "PROXMOX_ALLOW_ELEVATED"),
    ("write", "pve", "PUT", "/nodes/pve1/lxc/103/config", {"features": "nesting=1,mknod=1"}, "PROXMOX_ALLOW_ELEVATED"),
    ("write", "pve", "PUT", "/nodes/pve2/qemu/104/config", {"usb0": "mapping=spice-dongle"}, "PROXMOX_ALLOW_ELEVATED"),
    ("write", "pve", "PUT", "/nodes/pve2/qemu/104/config", {"usb1": "host=1234:5678,usb3=1"},
     "PROXMOX_ALLOW_ELEVATED"),
    # ---- 8. reads that make a node contact any host, at the gate of query-url-metadata
    ("read", "pve", "GET", "/nodes/pve1/scan/pbs", {"server": "203.0.113.9", "username": "root@pam",
                                                    "password": "guess-me-123"}, "PROXMOX_ACCESS=write"),
    ("read", "pve", "GET", "/nodes/pve1/scan/nfs", {"server": "203.0.113.9"}, "PROXMOX_ACCESS=write"),
    ("read", "pve", "GET", "/nodes/pve1/scan/cifs", {"server": "203.0.113.9"}, "PROXMOX_ACCESS=write"),
    ("read", "pve", "GET", "/nodes/pve1/scan/iscsi", {"portal": "203.0.113.9"}, "PROXMOX_ACCESS=write"),
    ("read", "pve", "GET", "/cluster/acme/meta", {"directory": "https://203.0.113.9/directory"},
     "PROXMOX_ACCESS=write"),
    ("read", "pve", "GET", "/cluster/acme/tos", {"directory": "https://203.0.113.9/directory"},
     "PROXMOX_ACCESS=write"),
    ("read", "pbs", "GET", "/config/acme/tos", {"directory": "https://203.0.113.9/directory"},
     "PROXMOX_ACCESS=write"),
    # ---- found in review: a default that is the dangerous value, and a protected guest's backups
    # left to deletion without deleting them (docs/PROXMOX-BEHAVIOUR.md#restore, #prune-and-forget)
    ("write", "pve", "POST", "/nodes/pve1/lxc",
     {"vmid": 950, "ostemplate": "local:vztmpl/debian-13-standard_13.1-2_amd64.tar.zst"}, "PROXMOX_ALLOW_ELEVATED"),
    ("write", "pbs", "PUT", "/admin/datastore/backup/protected",
     {"backup-type": "vm", "backup-id": "101", "backup-time": 1, "protected": 0}, "protected"),
    ("write", "pbs", "POST", "/admin/datastore/backup/change-owner",
     {"backup-type": "ct", "backup-id": "102", "new-owner": "someone@pbs"}, "protected"),
    # ---- issue 20 section 4: host devices and paths in every spelling
    # (docs/PROXMOX-BEHAVIOUR.md#host-devices-and-paths)
    ("write", "pve", "PUT", "/nodes/pve2/qemu/104/config", {"cdrom": "/dev/sda"}, "PROXMOX_ALLOW_ELEVATED"),
    ("write", "pve", "PUT", "/nodes/pve2/qemu/104/config", {"cdrom": "cdrom"}, "PROXMOX_ALLOW_ELEVATED"),
    ("write", "pve", "PUT", "/nodes/pve2/qemu/104/config", {"ide2": "cdrom,media=cdrom"}, "PROXMOX_ALLOW_ELEVATED"),
    ("write", "pve", "POST", "/nodes/pve2/qemu", {"vmid": 953, "cdrom": "file=/dev/sr0"}, "PROXMOX_ALLOW_ELEVATED"),
    ("write", "pve", "POST", "/nodes/pve1/lxc", {"vmid": 951, "ostemplate": "/etc/pve/priv/authkey.key",
                                                 "unprivileged": 1}, "PROXMOX_ALLOW_ELEVATED"),
    ("write", "pve", "POST", "/nodes/pve1/qemu", {"vmid": 952, "archive": "/root/stolen.vma"},
     "PROXMOX_ALLOW_ELEVATED"),
    # ... a Ceph OSD wipes its devices; blocked methods opened by PROXMOX_UNBLOCK are confirmed, and
    # those that reach inside a guest count as exec for the allow-list; an exec-status read alone is exec
    ("elevated", "pve", "POST", "/nodes/pve1/ceph/osd", {"dev": "/dev/sdb"}, "PROXMOX_ACCESS=destructive"),
    ("unblocked", "pve", "POST", "/nodes/pve2/qemu/104/monitor", {"command": "info status"}, "confirm=true"),
    ("unblocked", "pve", "PUT", "/nodes/pve1/qemu/103/sendkey", {"key": "ctrl-alt-delete"},
     "PROXMOX_EXEC_ALLOWED_VMIDS"),
    ("unblocked", "pve", "POST", "/nodes/pve1/qemu/103/agent/set-user-password",
     {"username": "root", "password": "new-root-pw-1"}, "PROXMOX_EXEC_ALLOWED_VMIDS"),
    ("unblocked", "pve", "POST", "/nodes/pve1/qemu/103/monitor", {"command": "info status"},
     "PROXMOX_EXEC_ALLOWED_VMIDS"),
    ("open", "pve", "GET", "/nodes/pve2/qemu/104/agent/exec-status", {"pid": 1}, "confirm=true"),
    # ---- issue 20 section 2: jobs, rules and groups judged as they will be after the edit
    # (docs/PROXMOX-BEHAVIOUR.md#job-edits): a backup job that kept every protected guest out ...
    ("open", "pve", "PUT", "/cluster/backup/backup-safe", {"delete": "exclude", "mode": "stop"}, "protected"),
    ("open", "pve", "PUT", "/cluster/backup/backup-safe", {"delete": "exclude"}, "protected"),
    ("open", "pve", "PUT", "/cluster/backup/backup-safe", {"exclude": "100,102"}, "protected"),
    ("open", "pve", "PUT", "/cluster/backup/backup-safe", {"vmid": "101,103"}, "protected"),
    # ... a disabled job whose stored retention prunes, enabled
    ("write", "pve", "PUT", "/cluster/backup/backup-old", {"enabled": 1}, "PROXMOX_ACCESS=destructive"),
    # ... a PBS sync job with a stored remove-vanished, pointed elsewhere or run more often
    ("write", "pbs", "PUT", "/config/sync/s-remove", {"remote-store": "other"}, "PROXMOX_ACCESS=destructive"),
    ("write", "pbs", "PUT", "/config/sync/s-remove", {"ns": "elsewhere"}, "PROXMOX_ACCESS=destructive"),
    ("write", "pbs", "PUT", "/config/sync/s-remove", {"remote-ns": "elsewhere"}, "PROXMOX_ACCESS=destructive"),
    ("write", "pbs", "PUT", "/config/sync/s-remove", {"schedule": "hourly"}, "PROXMOX_ACCESS=destructive"),
    ("open", "pbs", "PUT", "/config/sync/s-remove", {"remote-store": "other"}, "protected"),
    # ... a PBS prune job re-enabled or widened
    ("write", "pbs", "PUT", "/config/prune/p-off", {"delete": ["disable"]}, "PROXMOX_ACCESS=destructive"),
    ("write", "pbs", "PUT", "/config/prune/p-off", {"disable": 0}, "PROXMOX_ACCESS=destructive"),
    ("write", "pbs", "PUT", "/config/prune/p-narrow", {"delete": ["max-depth"]}, "PROXMOX_ACCESS=destructive"),
    ("write", "pbs", "PUT", "/config/prune/p-narrow", {"delete": ["ns"]}, "PROXMOX_ACCESS=destructive"),
    ("write", "pbs", "PUT", "/config/prune/p-narrow", {"max-depth": 7}, "PROXMOX_ACCESS=destructive"),
    ("open", "pbs", "PUT", "/config/prune/p-off", {"delete": ["disable"]}, "protected"),
    # ... an HA rule or group that holds a protected guest moves it without naming it
    ("open", "pve", "PUT", "/cluster/ha/rules/keep-db", {"type": "node-affinity", "nodes": "pve2"}, "protected"),
    ("open", "pve", "PUT", "/cluster/ha/rules/keep-db", {"type": "node-affinity", "delete": "strict"}, "protected"),
    ("open", "pve", "PUT", "/cluster/ha/rules/keep-db", {"type": "node-affinity", "disable": 1}, "protected"),
    ("open", "pve", "DELETE", "/cluster/ha/rules/keep-db", {}, "protected"),
    ("open", "pve", "PUT", "/cluster/ha/groups/db-nodes", {"nodes": "pve3"}, "protected"),
    ("open", "pve", "PUT", "/cluster/ha/groups/db-nodes", {"delete": "restricted"}, "protected"),
    # ---- issue 25: a protected guest is backed up only in snapshot mode with remove=0, and a
    # container only when its volumes can snapshot (vzdump falls back to suspend)
    ("open", "pve", "POST", "/nodes/pve2/vzdump", {"vmid": "101", "mode": "snapshot"}, "protected"),
    ("open", "pve", "POST", "/nodes/pve2/vzdump", {"vmid": "101", "mode": "suspend", "remove": 0}, "protected"),
    ("open", "pve", "POST", "/nodes/pve3/vzdump", {"vmid": "102", "mode": "snapshot", "remove": 0}, "protected"),
    ("open", "pve", "POST", "/nodes/pve1/vzdump", {"all": 1, "mode": "snapshot", "remove": 0}, "protected"),
    ("open", "pve", "POST", "/cluster/backup", {"vmid": "101", "mode": "stop", "remove": 0, "schedule": "daily",
                                                "storage": "pbs"}, "protected"),
]
CORPUS_BEFORE = 51  # entries in stage 1's corpus (tests/test_policy.py BYPASSES)


def entry_id(entry) -> str:
    return f"{entry[0]} {entry[2]} {entry[3]}"[:70]


def settings_for(session: str) -> Settings:
    access, gates, protected, allowed, unblocked = SESSIONS[session]
    rules = HostPolicy(access, gates, frozenset(tuple(m.split(" ", 1)) for m in unblocked))
    return Settings(hosts={("pve", "lab"): rules, ("pbs", "lab"): rules},
                           protected=Protected([e for e in PROTECTED if e["vmid"] in protected]),
                           exec_allowed_vmids=allowed, source_address=SOURCES.get(session))


# What the policy reads to judge a job, rule or group edit (the stored object, the guests and
# storages, a container's volumes), as the simulated lab holds it (see `servers`).
GUESTS = {100: ("qemu", "pve1"), 101: ("qemu", "pve2"), 102: ("lxc", "pve3"), 103: ("lxc", "pve1"),
          104: ("qemu", "pve2"), 105: ("lxc", "pve3")}
STORAGES = {"local": "dir", "local-lvm": "lvmthin", "nfs-backup": "nfs", "pbs": "pbs"}
STORED = {"/cluster/backup/backup-nightly": {"id": "backup-nightly", "type": "vzdump", "all": 1, "exclude": "104",
                                             "storage": "nfs-backup", "schedule": "02:00", "enabled": 1,
                                             "mode": "snapshot"},
          # keeps every protected guest out
          "/cluster/backup/backup-safe": {"id": "backup-safe", "type": "vzdump", "all": 1, "exclude": "100,101,102",
                                          "storage": "pbs", "schedule": "03:00", "enabled": 1, "mode": "snapshot"},
          # disabled, with a retention that prunes
          "/cluster/backup/backup-old": {"id": "backup-old", "type": "vzdump", "vmid": "103", "enabled": 0,
                                         "prune-backups": "keep-last=1", "storage": "local", "schedule": "sun 04:00"},
          "/config/sync/s-remove": {"id": "s-remove", "store": "backup", "remote": "office", "schedule": "daily",
                                    "remote-store": "backup", "remove-vanished": True},
          "/config/sync/s-backup": {"id": "s-backup", "store": "backup", "remote": "office", "remote-store": "backup",
                                    "schedule": "weekly"},
          # what the PBS GUI saves: remove-vanished as JSON false
          "/config/sync/s-keep": {"id": "s-keep", "store": "backup", "remote": "office", "remote-store": "backup",
                                  "schedule": "daily", "remove-vanished": False},
          "/config/prune/p-backup": {"id": "p-backup", "store": "backup", "schedule": "hourly", "keep-last": 3,
                                     "keep-daily": 7},
          "/config/prune/p-off": {"id": "p-off", "store": "backup", "schedule": "daily", "keep-last": 1,
                                  "disable": True},
          "/config/prune/p-narrow": {"id": "p-narrow", "store": "backup", "schedule": "daily", "keep-last": 3,
                                     "ns": "old", "max-depth": 0},
          "/cluster/ha/rules/keep-db": {"rule": "keep-db", "type": "node-affinity", "resources": "vm:101",
                                        "nodes": "pve1", "strict": 1},
          "/cluster/ha/groups/db-nodes": {"group": "db-nodes", "type": "group", "nodes": "pve1", "restricted": 1},
          "/cluster/ha/resources": [{"sid": "vm:101", "type": "vm", "state": "started", "group": "db-nodes"}],
          "/cluster/resources": [{"type": kind, "vmid": vmid, "node": node} for vmid, (kind, node) in GUESTS.items()]
          + [{"type": "storage", "storage": name, "plugintype": kind} for name, kind in STORAGES.items()],
          # a mount point on a directory storage, which cannot snapshot: vzdump would suspend the container
          "/nodes/pve3/lxc/102/config": {"rootfs": "local-lvm:subvol-102-disk-0,size=8G",
                                         "mp0": "local:102/vm-102-disk-1.raw,mp=/srv,backup=1"},
          # a bind mount, which a backup leaves out
          "/nodes/pve1/lxc/103/config": {"rootfs": "local-lvm:subvol-103-disk-0,size=32G",
                                         "mp0": "/srv/media,mp=/media"}}


# ---- issue 28 sections 3, 4, 5 and 7: a batch judged as it runs (node pve1 lets 198.51.100.7 in by its
# own rules: docs/PROXMOX-BEHAVIOUR.md#nested-execute), pools read (#backups-by-pool), HA edits judged by where they
# place the protected guests (#ha-placement), the yes pinned to what the question showed (#confirmation)
OUTSIDE_ADDRESS = "198.51.100.7"
SOURCES = {"remote": OUTSIDE_ADDRESS}
SESSIONS["remote"] = ("destructive", ALL, (100, 101, 102), None, ())
LET_IN = {"type": "in", "action": "ACCEPT", "proto": "tcp", "source": OUTSIDE_ADDRESS, "enable": 1}
DROP_API = {"type": "in", "action": "DROP", "proto": "tcp", "dport": "8006"}
FIREWALL = {"/cluster/firewall/options": {"enable": 1},
            "/cluster/status": [{"type": "node", "name": "pve1", "online": 1, "ip": "192.0.2.11"}],
            "/nodes/pve1/firewall/options": {}, "/nodes/pve1/network": [{"iface": "vmbr0", "cidr": "192.0.2.11/24"}],
            "/nodes/pve1/firewall/rules": [LET_IN | {"dport": "8006"}, LET_IN | {"dport": "22"}]}
POOLS = {"/pools/prod": {"poolid": "prod", "members": [{"id": "qemu/100", "type": "qemu", "vmid": 100},
                                                       {"id": "qemu/101", "type": "qemu", "vmid": 101}]},
         "/pools/lab": {"poolid": "lab", "members": [{"id": "lxc/105", "type": "lxc", "vmid": 105}]},
         "/cluster/backup/backup-prod": {"id": "backup-prod", "type": "vzdump", "pool": "prod", "mode": "snapshot",
                                         "remove": 0, "storage": "pbs", "schedule": "05:00", "enabled": 1}}
HA_RULES = {"together": {"type": "resource-affinity", "resources": "vm:101,vm:104", "affinity": "positive"},
            "r104": {"type": "node-affinity", "resources": "vm:104", "nodes": "pve2", "strict": 1},
            "r105": {"type": "node-affinity", "resources": "ct:105", "nodes": "pve3"}}
HA = {"/cluster/ha/rules": [STORED["/cluster/ha/rules/keep-db"]] + [r | {"rule": n} for n, r in HA_RULES.items()],
      "/cluster/ha/groups": [{"group": "db-nodes", "type": "group", "nodes": "pve1", "restricted": 1}],
      "/cluster/ha/resources": STORED["/cluster/ha/resources"] + [{"sid": "vm:104", "type": "vm", "state": "started"},
                                                                {"sid": "ct:105", "type": "ct", "state": "started"}]}
HA |= {f"/cluster/ha/rules/{n}": r | {"rule": n} for n, r in HA_RULES.items()}
HA |= {f"/cluster/ha/resources/{r['sid']}": r for r in HA["/cluster/ha/resources"]}
STORED |= FIREWALL | POOLS | HA


def execute(*commands: tuple) -> dict:
    return {"commands": json.dumps([{"method": m, "path": p} | ({"args": a} if a else {}) for m, p, a in commands])}


CORPUS += [
    # a batch: each command on the state the earlier ones leave, and every way it can end (a command
    # that fails does not stop the next), where the same requests one by one are refused
    ("remote", "pve", "POST", "/nodes/pve1/execute",
     execute(("POST", "firewall/rules", DROP_API), ("PUT", "firewall/rules/0", {"enable": 1})), "would cut"),
    ("remote", "pve", "POST", "/nodes/pve1/execute",
     execute(("POST", "firewall/rules", DROP_API), ("PUT", "firewall/rules/1", {"moveto": 3}),
             ("PUT", "firewall/rules/0", {"enable": 1})), "would cut"),
    ("remote", "pve", "POST", "/nodes/pve1/execute",
     execute(("POST", "firewall/rules", DROP_API | {"dport": "3128"}), ("DELETE", "firewall/rules/1", None)),
     "would cut"),
    ("remote", "pve", "POST", "/nodes/pve1/execute",
     execute(("POST", "firewall/rules", LET_IN | {"dport": "8006", "digest": "0" * 40}),
             ("DELETE", "firewall/rules/1", None)), "would cut"),
    # pools: vzdump takes a pool's members and ignores exclude; a job moved off the pool that holds them
    ("open", "pve", "POST", "/nodes/pve2/vzdump", {"all": 1, "exclude": "101", "pool": "prod", "mode": "snapshot"},
     "protected"),
    ("open", "pve", "PUT", "/cluster/backup/backup-prod", {"pool": "lab"}, "protected"),
    ("open", "pve", "POST", "/cluster/backup", {"all": 1, "exclude": "100,101", "pool": "prod", "mode": "stop",
                                                "schedule": "daily", "storage": "pbs"}, "protected"),
    ("open", "pve", "POST", "/nodes/pve1/vzdump", {"pool": "ghost", "mode": "stop"}, "protected"),  # unreadable
    # HA: the rules of the guest 101 must run with move 101 along; a second rule for it drops both
    ("open", "pve", "PUT", "/cluster/ha/rules/r104", {"type": "node-affinity", "nodes": "pve3"}, "protected"),
    ("open", "pve", "DELETE", "/cluster/ha/rules/together", {}, "protected"),
    ("open", "pve", "PUT", "/cluster/ha/resources/vm:104", {"failback": 0}, "protected"),
    ("open", "pve", "POST", "/cluster/ha/rules", {"rule": "r104b", "type": "node-affinity", "resources": "vm:104",
                                                  "nodes": "pve1"}, "protected"),
]


CORPUS += [
    # node power by another request (docs/REVIEW-SECURITY.md F03): corosync or pve-cluster stopped under an
    # active HA LRM takes the node's quorum away and its watchdog resets it (power_effects.DOWN)
    ("open", "pve", "POST", "/nodes/pve2/services/corosync/stop", {}, "protected guest 101"),
    ("open", "pve", "POST", "/nodes/pve3/services/pve-cluster/restart", {}, "protected guest 102"),
    ("open", "pve", "POST", "/nodes/pve2/execute", execute(("POST", "services/corosync/stop", None)),
     "protected guest 101"),
    ("open", "pve", "POST", "/nodes/pve2/execute", execute(("POST", "status", {"command": "reboot"})),
     "protected guest 101"),
]


def batches_pools_and_placement_in(lab) -> None:
    """The lab holds what STORED says of the firewall, the pools and the HA rules (servers)."""
    lab.firewall["hosts"]["pve1"] = {"options": {}, "rules": copy.deepcopy(FIREWALL["/nodes/pve1/firewall/rules"])}
    lab.pools["lab"] = {"poolid": "lab", "comment": "scratch"}
    lab.guests[105]["pool"] = "lab"
    lab.ha_rules |= copy.deepcopy(HA_RULES)
    for vmid in (104, 105):
        lab.guests[vmid]["ha"] = {"state": "started"}


def test_the_corpus_grew_by_every_example_of_issue_14():
    assert len(CORPUS) >= CORPUS_BEFORE + 76, len(CORPUS)  # 127 at the end of stage 2
    assert len({(e[0], e[2], e[3], json.dumps(e[4], sort_keys=True)) for e in CORPUS}) == len(CORPUS)


@pytest.mark.parametrize("entry", CORPUS, ids=entry_id)
def test_refused_by_the_admission_step_with_nothing_sent(entry):
    session, product, method, path, params, expected = entry
    host = PBS if product == "pbs" else PVE
    sent = []
    original = policy.settings()
    policy.configure(settings_for(session))
    confirm = None if expected == "confirm=true" else (lambda *_: None)  # confirm=true elsewhere
    token = policy.CALL.set(calls.Call(tool="corpus", confirm=confirm))
    try:
        with pytest.raises(PolicyError) as refused:
            policy.admit(host, method, path, dict(params), sent.append, read=STORED.get)
    finally:
        policy.CALL.reset(token)
        policy.configure(original)
    message = str(refused.value)
    assert sent == []
    if expected == "confirm=true":
        assert isinstance(refused.value, ConfirmationNeeded), message
    else:
        assert expected in message, message


# ---------------------------------------------------------------- through the server's tools

def session_env(sim, tmp, session: str) -> dict:
    access, gates, protected, allowed, unblocked = SESSIONS[session]
    (tmp / "protected.json").write_text(json.dumps([e for e in PROTECTED if e["vmid"] in protected]))
    # the policy must refuse, not Proxmox's privileges: a token that holds everything
    env = sim.env(pve_token="root@pam!admin", pbs_token="root@pam!admin") | {
        "PROXMOX_ACCESS": access, "PROXMOX_PROTECTED_VMS_FILE": str(tmp / "protected.json"),
        "PROXMOX_AUDIT_LOG": str(tmp / "audit.jsonl")}
    env |= {f"PROXMOX_ALLOW_{gate.upper()}": "true" for gate in gates}
    if allowed:
        env["PROXMOX_EXEC_ALLOWED_VMIDS"] = ",".join(map(str, sorted(allowed)))
    if unblocked:
        env["PROXMOX_UNBLOCK"] = ",".join(unblocked)
    if session in SOURCES:
        env["PROXMOX_SOURCE_ADDRESS"] = SOURCES[session]
    return env


@pytest.fixture(scope="module")
def servers(sim, tmp_path_factory):
    """One server per session (in process), against the module's simulator, whose lab holds the
    stored jobs."""
    lab = sim.lab
    for path, stored in STORED.items():  # the same objects in the simulated lab
        kind, _, name = path.rpartition("/")
        if kind == "/cluster/backup" and name != "backup-nightly":
            lab.backup_jobs.append(dict(stored))
        elif kind in ("/config/sync", "/config/prune") and not any(j["id"] == name for j in lab.pbs_jobs[kind[8:]]):
            lab.pbs_jobs[kind[8:]].append(dict(stored))
    lab.ha_rules["keep-db"] = {k: v for k, v in STORED["/cluster/ha/rules/keep-db"].items() if k != "rule"}
    lab.ha_groups["db-nodes"] = {"nodes": "pve1", "restricted": 1}
    lab.guests[101]["ha"] = {"state": "started", "group": "db-nodes"}
    lab.guests[102]["config"]["mp0"] = STORED["/nodes/pve3/lxc/102/config"]["mp0"]
    batches_pools_and_placement_in(lab)
    from contextlib import ExitStack
    with ExitStack() as stack:
        yield {name: stack.enter_context(in_process(session_env(sim, tmp_path_factory.mktemp(name), name),
                                                    log_name=f"corpus-{name}"))
               for name in SESSIONS}


@pytest.mark.parametrize("entry", CORPUS, ids=entry_id)
def test_refused_through_the_generic_tools_with_nothing_sent(servers, sim, entry):
    session, product, method, path, params, expected = entry
    arguments = {"path": path, "params": params, "host": "lab", "product": product}
    if expected != "confirm=true":
        arguments["confirm"] = True  # a client that cannot ask its user, and says yes
    tool = "api_read" if method == "GET" else "write_call_api"
    if tool == "write_call_api":
        arguments["method"] = method
    message, sent = requests_during(sim, lambda: servers[session].error(tool, arguments))
    assert expected in message, message
    refused = (method, unquote(path))  # the reads the policy makes to decide (a job's stored config) may pass
    assert [r for r in sent if r[1] != "GET" or r[1:] == refused] == []


# The legitimate neighbours of the review's entries: they pass the same admission step.
ALLOWED = [
    ("write", "pve", "POST", "/nodes/pve1/lxc",
     {"vmid": 950, "ostemplate": "local:vztmpl/debian-13-standard_13.1-2_amd64.tar.zst", "unprivileged": 1}),
    ("write", "pbs", "PUT", "/admin/datastore/backup/protected",
     {"backup-type": "vm", "backup-id": "101", "backup-time": 1, "protected": 1}),  # protecting more is fine
    ("write", "pbs", "POST", "/admin/datastore/backup/change-owner",
     {"backup-type": "vm", "backup-id": "103", "new-owner": "someone@pbs"}),  # not a protected guest
    # issue 20: a stored remove-vanished of JSON false removes nothing; an edit that leaves what a job
    # deletes, and what it does to protected guests, as it was passes below the destructive tier
    ("write", "pbs", "POST", "/admin/sync/s-keep/run", {}),
    ("write", "pbs", "PUT", "/config/sync/s-remove", {"comment": "nightly copy", "rate-in": "10MiB"}),
    ("write", "pbs", "PUT", "/config/prune/p-backup", {"comment": "hourly"}),
    ("open", "pve", "PUT", "/cluster/backup/backup-nightly", {"comment": "checked"}),
    ("open", "pve", "PUT", "/cluster/ha/rules/keep-db", {"type": "node-affinity", "comment": "the database"}),
    # issue 25: a backup in snapshot mode that never prunes leaves a protected guest as it is
    ("open", "pve", "POST", "/nodes/pve2/vzdump", {"vmid": "101", "mode": "snapshot", "remove": 0, "storage": "pbs"}),
    ("open", "pve", "POST", "/cluster/backup", {"all": 1, "exclude": "102", "mode": "snapshot", "remove": 0,
                                                "schedule": "daily", "storage": "pbs"}),
    ("backups", "pve", "POST", "/nodes/pve1/vzdump", {"vmid": "103", "mode": "snapshot", "remove": 0}),
]


ALLOWED += [  # issue 28: a batch that keeps this server in however it ends; what places or backs up no
    # protected guest
    ("remote", "pve", "POST", "/nodes/pve1/execute",
     execute(("POST", "firewall/rules", DROP_API), ("PUT", "firewall/rules/0", {"moveto": 3}),
             ("PUT", "firewall/rules/2", {"enable": 1}))),
    ("open", "pve", "POST", "/nodes/pve3/vzdump", {"pool": "lab", "mode": "stop"}),
    ("open", "pve", "PUT", "/cluster/backup/backup-prod", {"comment": "production"}),
    ("open", "pve", "PUT", "/cluster/ha/rules/r105", {"type": "node-affinity", "nodes": "pve1"}),
    ("open", "pve", "PUT", "/cluster/ha/resources/ct:105", {"failback": 0}),
    # F03: a node whose LRM is idle (no HA resource there) keeps its guests without quorum; other services
    ("open", "pve", "POST", "/nodes/pve1/services/corosync/restart", {}),
    ("open", "pve", "POST", "/nodes/pve2/services/pveproxy/restart", {}),
]


@pytest.mark.parametrize("entry", ALLOWED, ids=entry_id)
def test_their_legitimate_neighbours_pass(entry):
    session, product, method, path, params = entry
    sent = []
    original = policy.settings()
    policy.configure(settings_for(session))
    token = policy.CALL.set(calls.Call(tool="corpus", confirm=lambda *_: None))
    try:
        policy.admit(PBS if product == "pbs" else PVE, method, path, dict(params), sent.append, read=STORED.get)
    finally:
        policy.CALL.reset(token)
        policy.configure(original)
    assert len(sent) == 1


# ---------------------------------------------------------------- node files (docs/REVIEW-SECURITY.md F05, F06)
# A node's file is judged by what its path is (policy.shell_decision, protection.NODE_PATHS): a guest's
# disk, root or backups are its files (exec, + sensitive to read; the guest named: protection, the exec
# allow-list); cluster configuration is written through the API only.
NODE_FILES = [  # (session, product, action, path, what the refusal says)
    ("open", "pve", "write", "/etc/pve/lxc/100.conf", "cluster configuration"),
    ("open", "pve", "write", "/etc/pve/local/qemu-server/101.conf", "cluster configuration"),
    ("open", "pve", "write", "/etc/pve/firewall/cluster.fw", "cluster configuration"),
    ("open", "pve", "upload", "/etc/pve/nodes/pve1/host.fw", "cluster configuration"),
    ("open", "pve", "delete", "/etc/pve/jobs.cfg", "cluster configuration"),
    ("open", "pve", "write", "/etc/pve/storage.cfg", "cluster configuration"),
    ("open", "pbs", "write", "/etc/proxmox-backup/sync.cfg", "cluster configuration"),
    ("open", "pve", "delete", "/var/lib/vz/images/100/vm-100-disk-0.qcow2", "protected"),
    ("open", "pve", "write", "/dev/zvol/rpool/data/vm-101-disk-0", "protected"),
    ("open", "pve", "upload", "/rpool/data/subvol-102-disk-0/etc/passwd", "protected"),
    ("open", "pve", "delete", "/var/lib/vz/dump/vzdump-qemu-100-2026_01_01-00_00_00.vma.zst", "protected"),
    ("open", "pve", "write", "/var/lib/lxc/102/rootfs/etc/crontab", "protected"),
    ("open", "pbs", "delete", "/mnt/datastore/backup/vm/101/2026-01-01T00:00:00Z/index.json.blob", "protected"),
    ("open", "pbs", "write", "/mnt/datastore/backup/ns/old/ct/102/owner", "protected"),
    ("open", "pve", "read", "/var/lib/lxc/102/rootfs/etc/app.env", "protected"),  # a guest's files
    ("exec_list", "pve", "read", "/var/lib/lxc/103/rootfs/etc/app.env", "PROXMOX_EXEC_ALLOWED_VMIDS"),
    ("exec_list", "pve", "list", "/rpool/data/subvol-103-disk-0/root", "PROXMOX_EXEC_ALLOWED_VMIDS"),
    ("exec_list", "pve", "download", "/var/lib/vz/images/104/vm-104-disk-0.qcow2", "PROXMOX_EXEC_ALLOWED_VMIDS"),
    ("exec_list", "pbs", "download", "/mnt/datastore/backup/vm/104/2026-01-01T00:00:00Z/drive-scsi0.img.fidx",
     "PROXMOX_EXEC_ALLOWED_VMIDS"),
    ("read", "pve", "list", "/var/lib/lxc/103/rootfs/root", "'exec'"),
]
NODE_FILES_ALLOWED = [  # their neighbours: what is no guest's and no cluster configuration
    ("open", "pve", "write", "/etc/motd"),
    ("open", "pve", "write", "/root/images-2026/notes.txt"),
    ("open", "pve", "read", "/etc/pve/qemu-server/100.conf"),  # a config read stays a config read
    ("open", "pve", "list", "/var/lib/vz/images"),
    ("exec_list", "pve", "read", "/var/lib/lxc/105/rootfs/etc/hostname"),  # allowed, not protected there
    ("read", "pve", "list", "/var/lib/lxc"),
]
NODE_GATES = {"list": ("read",), "read": ("sensitive",), "download": ("sensitive", "write"),
              "write": ("elevated",), "upload": ("elevated",), "delete": ("elevated", "destructive")}


def admit_node_file(session: str, product: str, action: str, path: str) -> list:
    decision = policy.shell_decision(f"sftp pve1: {action} {path}", NODE_GATES[action], [], "node file",
                                     node_file=(action, path))
    sent, original = [], policy.settings()
    policy.configure(settings_for(session))
    token = policy.CALL.set(calls.Call(tool="corpus", confirm=lambda *_: None))
    try:
        policy.admit(PBS if product == "pbs" else PVE, "SSH", decision.path, {}, sent.append, decision=decision)
    finally:
        policy.CALL.reset(token)
        policy.configure(original)
    return sent


@pytest.mark.parametrize("entry", NODE_FILES, ids=lambda e: f"{e[0]} {e[2]} {e[3]}"[:70])
def test_a_node_file_is_judged_by_what_its_path_is(entry):
    session, product, action, path, expected = entry
    with pytest.raises(PolicyError, match=re.escape(expected)):
        admit_node_file(session, product, action, path)


@pytest.mark.parametrize("entry", NODE_FILES_ALLOWED, ids=lambda e: f"{e[0]} {e[2]} {e[3]}"[:70])
def test_the_neighbours_of_node_files_pass(entry):
    assert len(admit_node_file(*entry)) == 1


# ---------------------------------------------------------------- issue 34: guests Proxmox itself marks (pack)
# A guest is protected by a tag of PROXMOX_PROTECTED_TAGS (read from /cluster/resources at admission,
# once per call) and, for what destroys, by PVE's own `protection` flag (read from its config): in the
# one admission step, wherever a request names the guest, and for what reaches it without naming it.
# Sessions: tagged (everything open, no list entry, guest 104 tagged `MCP-Protected` as typed in the
# GUI), flagged (everything open, no list entry, guest 103 with protection=1).
import protection  # noqa: E402
from errors import ProxmoxError  # noqa: E402

MARK_TAG = "mcp-protected"
MARKED_ROWS = [{"type": kind, "vmid": vmid, "node": node, "tags": "MCP-Protected;lab" if vmid == 104 else "prod"}
               for vmid, (kind, node) in GUESTS.items()]
MARKED_CONFIGS = {"/nodes/pve1/lxc/103/config": {"protection": 1, "rootfs": "local-lvm:vm-103-disk-0,size=32G"}}
MARKED = [  # (session, method, path, params, what the refusal says)
    ("tagged", "POST", "/nodes/pve2/qemu/104/status/start", {}, "carries the tag 'mcp-protected'"),
    ("tagged", "PUT", "/nodes/pve2/qemu/104/config", {"memory": "1024"}, "carries the tag"),
    ("tagged", "POST", "/nodes/pve1/qemu/104/snapshot", {"snapname": "s1"}, "carries the tag"),  # wrong node
    ("tagged", "DELETE", "/nodes/pve2/storage/local-lvm/content/local-lvm:vm-104-disk-0", {}, "carries the tag"),
    ("tagged", "POST", "/nodes/pve1/qemu/100/move_disk", {"disk": "scsi0", "target-vmid": 104}, "carries the tag"),
    ("tagged", "POST", "/cluster/ha/resources", {"sid": "vm:104"}, "carries the tag"),
    ("tagged", "POST", "/nodes/pve2/startall", {}, "has protected guests"),  # reaches it without naming it
    ("tagged", "POST", "/cluster/backup", {"all": 1, "storage": "local", "schedule": "daily",
                                           "prune-backups": "keep-last=1"}, "changes protected guest 104"),
    ("flagged", "DELETE", "/nodes/pve1/lxc/103", {}, "protection flag is set"),
    ("flagged", "DELETE", "/nodes/pve2/lxc/103", {"purge": 1}, "protection flag is set"),  # wrong node
    ("flagged", "POST", "/nodes/pve1/lxc/103/status/stop", {}, "protection flag is set"),
    ("flagged", "POST", "/nodes/pve1/lxc/103/snapshot/s1/rollback", {}, "protection flag is set"),
    ("flagged", "DELETE", "/nodes/pve1/lxc/103/snapshot/s1", {}, "protection flag is set"),
    ("flagged", "DELETE", "/nodes/pve1/storage/local-lvm/content/local-lvm:vm-103-disk-0", {},
     "protection flag is set"),
]
MARKED_POWER = [  # F01: what a node's power (or its lost quorum) changes meets the same marks
    ("tagged", "POST", "/nodes/pve2/status", {"command": "reboot"}, "changes protected guest 104"),
    ("tagged", "POST", "/nodes/pve2/services/corosync/stop", {}, "changes protected guest 104"),
    ("flagged", "POST", "/nodes/pve1/status", {"command": "shutdown"}, "protection flag is set"),
]
MARKED_ALLOWED = [  # their legitimate neighbours
    ("tagged", "POST", "/nodes/pve3/lxc/105/status/start", {}),  # untagged
    ("tagged", "POST", "/nodes/pve2/qemu", {"vmid": 950, "name": "new"}),  # a new guest carries no tag yet
    ("flagged", "POST", "/nodes/pve1/lxc/103/status/start", {}),  # the flag guards what destroys only
    ("flagged", "POST", "/nodes/pve1/lxc/103/snapshot", {"snapname": "s2"}),
    ("flagged", "PUT", "/nodes/pve1/lxc/103/config", {"description": "photos"}),
    ("flagged", "POST", "/nodes/pve3/lxc/105/status/stop", {}),  # destructive, but not flagged
    ("tagged", "POST", "/nodes/pve3/status", {"command": "reboot"}),  # its guests carry no mark
    ("flagged", "POST", "/nodes/pve1/services/corosync/stop", {}),  # no HA there: the watchdog is not armed
]


class MarkingLab:
    """What the policy reads to find marked guests, as the simulated lab answers it (or fails)."""

    def __init__(self, fail: bool = False):
        self.reads: list[str] = []
        self.fail = fail

    def get(self, path: str, **_params) -> object:
        self.reads.append(path)
        if self.fail:
            raise ProxmoxError("Host 'lab' is unreachable (connection refused).")
        return [dict(row) for row in MARKED_ROWS] if path == "/cluster/resources" else MARKED_CONFIGS.get(path, {})

    read = get  # the reads the policy makes for its own judgement (ProxmoxClient.read)


def admit_marked(session: str, method: str, path: str, params: dict, lab: MarkingLab) -> list:
    sent = []
    original = policy.settings()
    tags = (MARK_TAG,) if session == "tagged" else ()
    policy.configure(Settings(hosts={("pve", "lab"): HostPolicy("destructive", ALL)},
                                     protected=Protected(tags=tags)))
    protection.read_guests_with(lambda _label: lab)
    token = policy.CALL.set(calls.Call(tool="corpus", confirm=lambda *_: None))
    try:
        policy.admit(PVE, method, path, dict(params), sent.append, read=STORED.get)
    finally:
        policy.CALL.reset(token)
        protection.read_guests_with(None)
        policy.configure(original)
    return sent


@pytest.mark.parametrize("entry", MARKED + MARKED_POWER, ids=lambda e: f"{e[0]} {e[1]} {e[2]}"[:70])
def test_a_guest_proxmox_marks_is_refused_at_admission_with_nothing_sent(entry):
    session, method, path, params, expected = entry
    lab = MarkingLab()
    with pytest.raises(PolicyError, match=expected):
        admit_marked(session, method, path, params, lab)
    assert lab.reads.count("/cluster/resources") <= 1  # once per call, however many guests it names


@pytest.mark.parametrize("entry", MARKED_ALLOWED, ids=lambda e: f"{e[0]} {e[1]} {e[2]}"[:70])
def test_the_neighbours_of_marked_guests_pass(entry):
    session, method, path, params = entry
    assert len(admit_marked(session, method, path, params, MarkingLab())) == 1


def test_what_decides_and_cannot_be_read_refuses(sim):
    with pytest.raises(PolicyError, match="tags .PROXMOX_PROTECTED_TAGS. could not be read.*refused"):
        admit_marked("tagged", "POST", "/nodes/pve3/lxc/105/status/start", {}, MarkingLab(fail=True))
    with pytest.raises(PolicyError, match="read their protection flag.*refused"):
        admit_marked("flagged", "POST", "/nodes/pve3/lxc/105/status/stop", {}, MarkingLab(fail=True))
    assert len(admit_marked("flagged", "POST", "/nodes/pve3/lxc/105/status/start", {}, MarkingLab(fail=True))) == 1


def failing_on(*paths: str, hide: int | None = None):
    """STORED as the policy reads it, with `paths` failing and guest `hide` not shown to the read token."""
    def read(path: str):
        if path in paths:
            raise ProxmoxError(f"{path}: 596 connection timed out")
        if path == "/cluster/resources":
            return [row for row in STORED[path] if row.get("vmid") != hide]
        return STORED.get(path)
    return read


@pytest.mark.parametrize("read, expected", [  # F02: the node's guests, their HA state, a guest's config
    (failing_on("/cluster/resources"), "/cluster/resources could not be read"),
    (failing_on("/cluster/ha/resources"), "/cluster/ha/resources could not be read"),
    (failing_on("/nodes/pve1/qemu/100/config"), "/nodes/pve1/qemu/100/config could not be read"),
    (failing_on(hide=101), "Protected guest 101 is not among the guests"),
], ids=["resources", "ha", "config", "unseen"])
def test_node_power_refuses_what_it_cannot_read(read, expected):
    sent, original = [], policy.settings()
    policy.configure(settings_for("exec_list"))  # only 101 (on pve2) protected
    token = policy.CALL.set(calls.Call(tool="corpus", confirm=lambda *_: None))
    try:
        with pytest.raises(PolicyError, match=expected):
            policy.admit(PVE, "POST", "/nodes/pve1/status", {"command": "reboot"}, sent.append, read=read)
        # the neighbour: the manager status (maintenance, disarm) may be missing
        policy.admit(PVE, "POST", "/nodes/pve1/status", {"command": "reboot"}, sent.append,
                     read=failing_on("/cluster/ha/status/manager_status"))
    finally:
        policy.CALL.reset(token)
        policy.configure(original)
    assert len(sent) == 1


@pytest.fixture()
def marked_lab(sim):
    """The simulated lab with guest 104 tagged and guest 103's protection flag set, for one test."""
    g104, g103 = sim.lab.guests[104], sim.lab.guests[103]
    before = g104["tags"]
    g104["tags"] = g104["config"]["tags"] = "MCP-Protected;lab"
    g103["config"]["protection"] = 1
    yield
    g104["tags"], g103["config"]["protection"] = before, 0
    g104["config"].pop("tags", None)


def test_marked_guests_are_refused_through_the_generic_tools_with_nothing_sent(sim, tmp_path, marked_lab):
    env = session_env(sim, tmp_path, "open") | {"PROXMOX_PROTECTED_TAGS": MARK_TAG}
    (tmp_path / "protected.json").write_text("[]")
    with in_process(env, log_name="corpus-marked") as server:
        for session, method, path, params, expected in MARKED:
            arguments = {"method": method, "path": path, "params": params, "confirm": True}
            message, sent = requests_during(sim, lambda a=arguments: server.error("write_call_api", a))
            assert expected in message, message
            assert [r for r in sent if r[1] != "GET"] == [], (session, path)
# ---- issue 28 section 7: a yes is for the object the question showed. The user said yes while the
# config read `before`; when the request is sent it reads `after` (unused0 re-pointed at a 500 GiB disk,
# vmstate at another volume): the yes does not stand for it, and the same object keeps it.
SMALL, BIG = "local-lvm:vm-104-disk-7", "local-lvm:vm-104-disk-8"
SIZES = {f"/nodes/pve2/storage/local-lvm/content/{v}": {"size": size} for v, size in ((SMALL, 8 << 30),
                                                                                    (BIG, 500 << 30))}
CONFIG = "/nodes/pve2/qemu/104/config"
PINNED = [  # (the config the user said yes for, the config when it is sent, the request's parameters)
    ({"unused0": SMALL}, {"unused0": BIG}, {"delete": "unused0"}),
    ({"vmstate": SMALL}, {"vmstate": BIG}, {"delete": "vmstate"}),
    ({"unused0": SMALL, "unused1": BIG}, {"unused0": BIG, "unused1": SMALL}, {"delete": "unused0"}),
]


@pytest.mark.parametrize("before, after, params", PINNED)
def test_a_yes_does_not_stand_for_another_object(before, after, params):
    original = policy.settings()
    policy.configure(settings_for("open"))
    try:
        shown = policy.classify(PVE, "PUT", CONFIG, dict(params), read=(SIZES | {CONFIG: before}).get)
        assert any(SMALL in reason for reason in shown.reasons), shown.reasons  # the question names it
        for config, sent_count in ((after, 0), (before, 1)):
            sent = []
            token = policy.CALL.set(calls.Call(tool="corpus", confirm=None,
                                     approved={policy.approval_key(PVE, shown)}))
            try:
                if sent_count:
                    policy.admit(PVE, "PUT", CONFIG, dict(params), sent.append, read=(SIZES | {CONFIG: config}).get)
                else:
                    with pytest.raises(ConfirmationNeeded):
                        policy.admit(PVE, "PUT", CONFIG, dict(params), sent.append,
                                     read=(SIZES | {CONFIG: config}).get)
            finally:
                policy.CALL.reset(token)
            assert len(sent) == sent_count
    finally:
        policy.configure(original)
