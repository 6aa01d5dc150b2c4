"""The whole API through the generic tools: every non-blocked method of both schemas is called
once with valid parameters and passes; every blocked method, and every method whose gate is
closed, is refused with nothing sent."""
import copy
import base64
import json
import re

import pytest

import catalog
import simulator
from conftest import everything_open, stdio_session
from gates import call_gate, method_gate
from simulator.pve_monitor import add_pool

# Values for path parameters that exist in the simulated lab.
PATH_VALUES = {
    "pve": {"node": "pve1", "vmid": "100", "storage": "local", "volume": "local:iso/debian-13.1.0-amd64-netinst.iso",
            "snapname": "walk", "poolid": "prod", "userid": "mcp@pve", "iface": "vmbr0", "upid": None,
            "service": "pveproxy", "name": "walk1", "id": "walk1", "realm": "pve", "tokenid": "walk", "groupid": "g1",
            "roleid": "Walker", "cputype": "custom-walk", "sid": "vm:101", "zone": "zone1", "vnet": "vnet1",
            "subnet": "zone1-10.0.0.0-24", "controller": "c1", "ipam": "pve", "dns": "d1", "fabric": "f1",
            "pos": "0", "cidr": "10.0.0.0/24", "group": "g1", "rule": "r1", "type": "lvmthin", "osdid": "0",
            "monid": "m1", "mgrid": "m1", "mdsid": "m1", "pgid": "1.0", "filename": "x.conf", "plugin": "walk1",
            "nodeid": "pve1"},
    "pbs": {"node": "localhost", "store": "backup", "upid": None, "userid": "mcp@pbs", "name": "walk1", "id": "walk1",
            "realm": "pbs", "token-name": "walk", "iface": "eth0", "service": "proxmox-backup", "drive": "d1",
            "changer": "c1", "uuid": "1b7a5b0e-6c4f-4b8a-9b1a-2f3c4d5e6f70", "fingerprint": "aa:" * 31 + "aa",
            "s3-endpoint-id": "s3", "label-text": "walk", "media-set": "1b7a5b0e-6c4f-4b8a-9b1a-2f3c4d5e6f70",
            "snapshot": "vm/100/2026-01-01T00:00:00Z"},
}
CANDIDATES = ["walk1", "1", "pve1", "100", "a1b2", "vm", "local", "192.0.2.5", "192.0.2.0/24", "daily",
              "mcp@pve", "mcp@pbs", "mcp@pbs!walk", "local:iso/debian.iso", "1G", "vmbr0", "BC:24:11:00:00:01",
              "2026-01-01", "walk@example.com", "+1G", "x", "aa:" * 31 + "aa", "https://example.com/x.iso",
              "vm/100", "1b7a5b0e-6c4f-4b8a-9b1a-2f3c4d5e6f70", "sha256", "0", "ssh-ed25519 AAAA walk", "*/5",
              "pve", "pbs", "AAAA", "w.example.com", "10", "abcdefghij", "dir", "/dev/sda", "sda", "100-0", "acl",
              "/", "walkpass1", "docker.io/library/debian:13", "192.0.2.5:8089", "8086:1234", "0000:01:00.0",
              "pve1c-0123456789", '[{"method": "GET", "path": "status"}]']
# Tried first for these parameters: the OCI reference pattern backtracks for minutes on other
# candidates (a UUID), see catalog._matches.
NAMED_CANDIDATES = {"reference": ["docker.io/library/debian:13", "docker.io/library/debian"]}


def value_for(name: str, spec: dict, entry: dict):
    kind = spec.get("type", "string")
    if "enum" in spec:
        return spec["enum"][0]
    if kind == "boolean":
        return 1
    if kind in ("integer", "number"):
        low = spec.get("minimum", 1)
        return int(max(low, 100 if "vmid" in name else 1))
    if kind == "array":
        return [value_for(name, spec.get("items") or {"type": "string"}, entry)]
    fmt = spec.get("format")
    if isinstance(fmt, dict):
        default = next((k for k, s in fmt.items() if s.get("default_key")), None)
        required = [k for k, s in fmt.items() if not s.get("optional") and k != default]
        parts = [str(value_for(default, fmt[default], entry))] if default else []
        parts += [f"{k}={value_for(k, fmt[k], entry)}" for k in required]
        if parts:
            return ",".join(parts)
    for candidate in NAMED_CANDIDATES.get(name, []) + CANDIDATES:
        if catalog.check_params({"params": {name: spec}}, {name: candidate}) == {}:
            return candidate
    return "walk1"


# Guests the walk adds for methods Proxmox refuses before any task when the guest is in the wrong
# state (docs/PROXMOX-BEHAVIOUR.md#power-and-locks, #migrate): template path -> (vmid, kind, node, state).
WALK_GUESTS = {"/nodes/{node}/lxc/{vmid}/status/reboot": (110, "lxc", "pve1", "running"),
               "/nodes/{node}/lxc/{vmid}/status/resume": (111, "lxc", "pve1", "paused"),
               "/nodes/{node}/lxc/{vmid}/status/shutdown": (112, "lxc", "pve1", "running"),
               "/nodes/{node}/lxc/{vmid}/status/stop": (113, "lxc", "pve1", "running"),
               "/nodes/{node}/lxc/{vmid}/status/suspend": (114, "lxc", "pve1", "running"),
               "/nodes/{node}/qemu/{vmid}/migrate": (115, "qemu", "pve1", "stopped"),  # not the guest others use
               "/nodes/{node}/lxc/{vmid}/migrate": (116, "lxc", "pve3", "stopped"),  # a running CT needs restart
               # started apart from 103, which the walk makes a template and clones later: a running
               # container is neither (the start's task ends while the walk goes on: load decided it)
               "/nodes/{node}/lxc/{vmid}/status/start": (117, "lxc", "pve1", "stopped")}
# Methods that need another guest than the default.
PATH_OVERRIDES = {"/nodes/{node}/lxc/{vmid}/interfaces": {"node": "pve3", "vmid": "102"},
                  "/nodes/{node}/qemu/{vmid}/template": {"node": "pve2", "vmid": "104"},  # a stopped VM
                  "/admin/prune/{id}/run": {"id": "p-backup"}, "/admin/sync/{id}/run": {"id": "s-backup"},
                  "/admin/verify/{id}/run": {"id": "v-backup"}}
PATH_OVERRIDES |= {path: {"node": node, "vmid": str(vmid)} for path, (vmid, _, node, _) in WALK_GUESTS.items()}
PATH_OVERRIDES |= {"/nodes/{node}/storage/{storage}/file-restore/list": {"storage": "pbs"},
                   "/nodes/{node}/storage/{storage}/file-restore/download": {"storage": "pbs"}}
PBS_SNAPSHOT = {}  # backup-type, backup-id and backup-time of a snapshot in the lab, set by the fixture
# Parameters of methods that only succeed on what exists (docs/PROXMOX-BEHAVIOUR.md#backup-file-restore,
# #templates-and-oci-images): (method, path template) -> parameters, set by the fixture from the lab.
WALK_PARAMS: dict[tuple[str, str], dict] = {}


def path_value(product: str, name: str, entry: dict, upid: str) -> str:
    known = dict(PATH_VALUES[product], upid=upid)
    if "/lxc/" in entry["path"]:
        known["vmid"] = "103"
    known.update(PATH_OVERRIDES.get(entry["path"], {}))
    spec = entry["params"].get(name, {"type": "string"})
    if known.get(name) is not None and (name not in entry["params"] or
                                        catalog.check_params({"params": {name: spec}}, {name: known[name]}) == {}):
        return known[name]
    return str(value_for(name, spec, entry))


def call_for(product: str, entry: dict, upid: str):
    path = re.sub(r"\{([\w-]+)\}", lambda m: path_value(product, m.group(1), entry, upid), entry["path"])
    params = {}
    for name, spec in entry["params"].items():
        if spec.get("optional") or "[n]" in name or f"{{{name}}}" in entry["path"]:
            continue
        params[name] = value_for(name, spec, entry)
    # stateful handlers: a free vmid to create, a disk that exists to grow
    lxc = "/lxc" in entry["path"]
    fresh = {"vmid": 902 if lxc else 900, "newid": 903 if lxc else 901, "target": "pve2", "protected": 0,
             "pid": 4000, "file": "/etc/hostname"}
    if product == "pbs":
        fresh |= PBS_SNAPSHOT
    params.update({k: v for k, v in fresh.items() if k in params})
    params.update(WALK_PARAMS.get((entry["method"], entry["path"]), {}))
    if entry["path"].endswith("/download-url"):  # the name must fit the content type (#downloads-and-imports)
        params["filename"] = "walk1.iso"
    if entry["method"] == "POST" and entry["path"] == "/nodes/{node}/lxc":  # a fresh install's `local` takes no CT
        params["storage"] = "local-lvm"
    if entry["path"].endswith("/resize"):
        params.update(disk="rootfs" if "/lxc/" in entry["path"] else "scsi0", size="+1G")
    if "/firewall/" in entry["path"] and params.get("type") == "in":  # an in rule's action (verify_rule)
        params["action"] = "ACCEPT"
    if product == "pve" and entry["path"] == "/cluster/backup" and entry["method"] == "POST":  # create_job
        params.update(id="walk2", schedule="daily", vmid="103", storage="local")
    if product == "pve" and entry["path"] == "/cluster/backup/{id}" and entry["method"] == "PUT":  # not empty
        params["mode"] = "snapshot"
    if product == "pve" and (entry["method"], entry["path"]) == ("POST", "/cluster/ha/resources"):
        params["sid"] = "vm:104"  # a guest that is not an HA resource yet
    return path, params


def seed_firewall(lab, entry: dict) -> None:
    """The firewall objects the walk names, before each firewall call (the walk deletes them too):
    security group g1, IP set and alias walk1, a harmless rule at pos 0 of every level and the group;
    none of the object a call creates, an empty one where Proxmox deletes only empty ones
    (docs/PROXMOX-BEHAVIOUR.md#firewall-rules)."""
    method, template = entry["method"], entry["path"]
    harmless = {"type": "in", "action": "DROP", "proto": "udp", "dport": "9", "enable": 1}
    emptied = method == "DELETE" and template.endswith(("/groups/{group}", "/ipset/{name}"))
    ipsets = {"walk1": {"entries": [] if emptied else [{"cidr": "10.0.0.0/24"}]}}
    aliases = {"walk1": {"name": "walk1", "cidr": "192.0.2.0/24"}}
    lab.firewall = {"cluster": {"options": {"enable": 1}, "rules": [dict(harmless)],
                                "groups": {"g1": [] if emptied else [dict(harmless)]}, "group_comments": {},
                                "ipsets": copy.deepcopy(ipsets), "aliases": copy.deepcopy(aliases)},
                    "hosts": {"pve1": {"options": {}, "rules": [dict(harmless)]}},
                    "guests": {vmid: {"options": {}, "rules": [dict(harmless)], "ipsets": copy.deepcopy(ipsets),
                                      "aliases": copy.deepcopy(aliases)} for vmid in (100, 103)}}
    if method == "POST":  # the collection a call creates in holds no object of that name yet
        for level in [lab.firewall["cluster"], *lab.firewall["guests"].values()]:
            if template.endswith("/firewall/groups"):
                level.get("groups", {}).pop("g1", None)
            if template.endswith("/firewall/ipset"):
                level["ipsets"].pop("walk1")
            if template.endswith("/firewall/aliases"):
                level["aliases"].pop("walk1")


def seed_backup_job(lab) -> None:
    """Backup job walk1 before each backup job call (the walk deletes it too); walk2 is what it creates."""
    lab.backup_jobs[:] = [j for j in lab.backup_jobs if j["id"] not in ("walk1", "walk2")]
    lab.backup_jobs.append({"id": "walk1", "type": "vzdump", "vmid": "103", "storage": "local", "schedule": "daily"})


def call_api(session, product: str, entry: dict, path: str, params: dict):
    """One method through the generic tools: api_read for GET, write_call_api otherwise."""
    arguments = {"path": path, "params": params, "host": "lab", "product": product}
    if entry["method"] == "GET":  # a guest file read, or an exec's output read alone, needs the user's yes like exec
        asks = "file-read" in path or "exec-status" in path
        return session.call("api_read", arguments | {"confirm": True} if asks else arguments)
    return session.call("write_call_api", arguments | {"method": entry["method"], "confirm": True})


@pytest.fixture(scope="module")
def walker(sim, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("walk")
    (tmp / "protected.json").write_text("[]")
    # tasks that run a while, as the walk was written for: the clone's lock keeps guest 100 from
    # being migrated away from under the methods that follow
    sim.lab.task_seconds = 0.6
    # the walk's node reboot is judged and sent; its effect (simulator/pve_node_power.py) would take pve1 away
    # from the methods walked after it, so the node goes down only after the walk
    sim.lab.node_command_seconds = 3600
    for vmid, kind, node, state in WALK_GUESTS.values():
        status = "stopped" if state == "stopped" else "running"
        guest = sim.lab.add_guest(vmid, kind, node, f"walk{vmid}", status=status)
        guest["paused"] = state == "paused"
    sim.lab.guests[101]["ha"] = {"state": "started"}  # the HA resource the walk edits (vm:101)
    sim.lab.pools["walk1"] = {"poolid": "walk1"}  # the pool the walk reads and edits
    for vmid in (100, 103):  # snapshots the walk reads and deletes
        sim.lab.guests[vmid]["snapshots"].append({"name": "walk", "snaptime": 1})
    # jobs and an ACME plugin the walk reads (the policy reads a job before editing or running it)
    sim.lab.backup_jobs.append({"id": "walk1", "type": "vzdump", "vmid": "103", "storage": "local",
                                "schedule": "daily"})
    for kind in ("sync", "prune"):
        sim.lab.pbs_jobs[kind].append({"id": "walk1", "store": "backup", "schedule": "daily"})
    sim.lab.acme_plugins.append({"plugin": "walk1", "type": "dns", "api": "cf", "data": "CF_Token=walk"})
    add_pool(sim.lab, "pve1", "walk1")  # a ZFS pool whose status the walk reads
    sim.lab.ha_rules["r1"] = {"type": "node-affinity", "resources": "vm:103", "nodes": "pve1"}
    sim.lab.ha_groups["g1"] = {"nodes": "pve1"}
    sim.lab.metric_servers["walk1"] = {"type": "influxdb", "server": "192.0.2.50", "port": 8089}
    sim.lab.sdn_ipams.append({"ipam": "pve", "type": "pve"})
    sim.lab.sdn_dns.append({"dns": "d1", "type": "powerdns", "url": "https://dns.example", "key": "walk"})
    sim.lab.add_datastore("walk1", total=100 * simulator.GiB, used=1 * simulator.GiB)  # /config/datastore/{name}
    snap = sim.lab.datastores["backup"]["groups"][("", "vm", "100")][0]
    PBS_SNAPSHOT.update({"backup-type": "vm", "backup-id": "100", "backup-time": snap["backup-time"]})
    hostname = base64.b64encode(b"/root.pxar.didx/etc/hostname").decode()
    container = {"backup-type": "ct", "backup-id": "102",  # a file archive: a VM backup has no catalog
                 "backup-time": sim.lab.datastores["backup"]["groups"][("", "ct", "102")][0]["backup-time"]}
    volume = next(v["volid"] for v in sim.lab.pbs_volumes("pbs") if v["vmid"] == 102)
    WALK_PARAMS.update({
        ("GET", "/nodes/{node}/storage/{storage}/file-restore/list"): {"volume": volume, "filepath": "/"},
        ("GET", "/nodes/{node}/storage/{storage}/file-restore/download"): {"volume": volume, "filepath": hostname},
        ("GET", "/admin/datastore/{store}/catalog"): container | {"filepath": "/"},
        ("GET", "/admin/datastore/{store}/pxar-file-download"): container | {"filepath": hostname},
        ("POST", "/nodes/{node}/aplinfo"): {"storage": "local",
                                            "template": "debian-12-standard_12.12-1_amd64.tar.zst"},
        ("GET", "/nodes/{node}/vzdump/extractconfig"): {  # a backup the node sees (#configs-inside-backups)
            "volume": next(v["volid"] for v in sim.lab.pbs_volumes("pbs") if v["vmid"] == 100)}})
    # no safety snapshot before rollbacks: its task would wait out the clone's lock on guest 100
    # and root@pam's login beside the tokens: the methods without `permissions` are for root@pam only
    env = everything_open(sim, tmp, PROXMOX_SAFETY_SNAPSHOT="off", PROXMOX_LAB_USER="root@pam",
                          PROXMOX_LAB_PASSWORD=sim.lab.logins["pve"]["root@pam"][0])
    with stdio_session(env, log_name="walk") as session:
        yield session


def test_every_open_method_passes_and_every_blocked_one_is_refused(walker, sim):
    upids = {"pve": sim.lab.start_task("pve1", "walk", "", finished=True),
             "pbs": sim.lab.start_task("localhost", "walk", "x", finished=True, product="pbs")}
    failures, refused_blocked, passed = [], 0, 0
    for product in catalog.PRODUCTS:
        # deleting the walk's guests, snapshots and HA rules comes last, so that every other method still finds them
        for entry in sorted(catalog.methods(product), key=lambda e: e["method"] == "DELETE" and bool(re.fullmatch(
                r"/nodes/\{node\}/(qemu|lxc)/\{vmid\}(/snapshot/\{snapname\})?|/cluster/ha/(rules|groups|resources)/\{\w+\}",
                e["path"]))):
            path, params = call_for(product, entry, upids[product])
            gate = method_gate(entry["method"], entry["path"])
            if product == "pve" and "/firewall/" in entry["path"]:
                seed_firewall(sim.lab, entry)
            if product == "pve" and entry["path"].startswith("/cluster/backup"):
                seed_backup_job(sim.lab)
            before = len(sim.lab.requests)
            result = call_api(walker, product, entry, path, params)
            text = result.content[0].text if result.content else ""
            sent = [r for r in sim.lab.requests[before:] if r[2] != "/access/permissions"]
            if gate == "blocked":
                if not result.is_error or "blocked" not in text or any(r[2] == path for r in sent):
                    failures.append((product, entry["method"], entry["path"], "blocked but not refused", text[:200]))
                refused_blocked += 1
            elif result.is_error:
                failures.append((product, entry["method"], entry["path"], path, json.dumps(params)[:200], text[:300]))
            else:
                passed += 1
    assert failures == [], f"{len(failures)} failed:\n" + "\n".join(map(str, failures[:40]))
    assert refused_blocked == 51 and passed == 675 + 349 - 51
    assert sim.lab.schema_rejections == []


def test_closed_gates_refuse_with_nothing_sent(sim, tmp_path):
    """At the lifecycle tier with no extra gate, every call above it is refused before sending."""
    (tmp_path / "protected.json").write_text("[]")
    env = sim.env(pve_token="root@pam!admin", pbs_token="root@pam!admin") | {
        "PROXMOX_ACCESS": "lifecycle", "PROXMOX_PROTECTED_VMS_FILE": str(tmp_path / "protected.json"),
        "PROXMOX_AUDIT_LOG": str(tmp_path / "audit.jsonl")}
    refused = 0
    with stdio_session(env, log_name="walk-closed") as session:
        for product in catalog.PRODUCTS:
            for entry in catalog.methods(product):
                path, params = call_for(product, entry, "UPID:pve1:00000001:00000001:00000001:x::root@pam:")
                gate, _ = call_gate(entry["method"], entry["path"], params, product)
                if gate in ("read", "lifecycle"):
                    continue
                before = len(sim.lab.requests)
                result = call_api(session, product, entry, path, params)
                sent = [r for r in sim.lab.requests[before:] if r[2] not in ("/access/permissions", "/version")]
                assert result.is_error and "gate" in result.content[0].text, (entry["method"], entry["path"])
                assert sent == [], (entry["method"], entry["path"])
                refused += 1
    assert refused > 500
