"""The simulator answers like Proxmox (schema checks, auth, privileges, faults), and the one
HTTP client turns every kind of failure into a message that says what to do."""

import json

import pytest
import requests

import calls
import catalog
import policy
import privileges
import proxmox_client
import simulator
from config import load_config
from errors import PolicyError, ProxmoxError, TaskFailed
from proxmox_client import parse_upid
from settings import HostPolicy, Settings

READER = "mcp@pve!reader"


def raw(sim, path, token=None, product="pve", method="GET", **params):
    token = token or f"{READER}={sim.lab.pve_tokens[READER].secret}"
    header = ("PVEAPIToken=" if product == "pve" else "PBSAPIToken=") + token
    kwargs = {"params": params} if method in ("GET", "DELETE") else {"data": params}
    return requests.request(method, sim.url(product) + "/api2/json" + path, headers={"Authorization": header},
                            verify=str(sim.cert_file), timeout=10, **kwargs)


def client(sim, product="pve", token=None, **overrides):
    env = sim.env()
    if token:
        env["PROXMOX_LAB_TOKEN"] = token
    env.update(overrides)
    config = load_config(env)
    host = next(h for h in config.hosts if h.product == product)
    return proxmox_client.ProxmoxClient(host)


# ---------------------------------------------------------------- catalog

def test_catalog_covers_both_schemas_without_descriptions():
    assert len(catalog.methods("pve")) == 675
    assert len(catalog.methods("pbs")) == 349  # 367 less the 18 HTTP/2 backup protocol calls
    text = (catalog.CATALOG_DIR / "pve.json").read_text()
    assert "Start virtual machine" not in text and "typetext" not in text


# Viewer trees (apidoc.js's apiSchema) in the official shape, with description texts of this test's own
VIEWER_TREES = {
    "pve": [{"path": "/nodes", "text": "nodes", "leaf": 0, "info": {"GET": {
        "method": "GET", "name": "index", "description": "Lists the test's nodes.", "permissions": {"user": "all"},
        "parameters": {"additionalProperties": 0}, "returns": {"type": "array", "items": {"type": "object"}}}},
        "children": [{"path": "/nodes/{node}/qemu/{vmid}/status/start", "text": "start", "leaf": 1, "info": {"POST": {
            "method": "POST", "name": "vm_start", "allowtoken": 1, "protected": 1, "proxyto": "node",
            "description": "Boots guest 4711 of the test.",
            "permissions": {"check": ["perm", "/vms/{vmid}", ["VM.PowerMgmt"]]}, "returns": {"type": "string"},
            "parameters": {"additionalProperties": 0, "properties": {
                "node": {"type": "string", "format": "pve-node", "description": "The test's node."},
                "vmid": {"type": "integer", "minimum": 100, "typetext": "<integer>", "description": "A guest."},
                "skiplock": {"type": "boolean", "optional": 1, "description": "Test words."},
                "name": {"type": "string", "optional": 1, "pattern": "(?^i:[a-z]+)"},
                "net[n]": {"type": "string", "optional": 1, "format": {
                    "model": {"type": "string", "enum": ["virtio", "e1000"], "default_key": 1, "description": "x"},
                    "bridge": {"type": "string", "optional": 1, "format_description": "y"}}}}}}}}]}],
    "pbs": [{"path": "/admin/datastore/{store}/prune", "text": "prune", "leaf": 1, "info": {"POST": {
        "method": "POST", "description": "Prunes the test's store.", "returns": {"type": "array"},
        "permissions": {"check": {"path": ["datastore", "{store}"], "privs": ["Datastore.Modify", "Datastore.Prune"],
                                  "partial": True}},
        "parameters": {"additionalProperties": False, "properties": {
            "store": {"type": "string", "pattern": "/^[A-Za-z0-9_]+$/", "description": "A store."},
            "keep-last": {"type": "integer", "minimum": 1, "optional": True}}}}}},
            {"path": "/config/test", "text": "test", "leaf": 1, "info": {"PUT": {
                "method": "PUT", "description": "Takes anything.", "parameters": {"additionalProperties": True}}}},
            {"path": "/backup/_upgrade_", "text": "_upgrade_", "leaf": 1, "info": {"GET": {"method": "GET"}}}],
}


def test_catalog_build_keeps_the_facts_and_drops_the_descriptions(tmp_path):
    schemas, out = tmp_path / "schemas", tmp_path / "catalog"
    schemas.mkdir()
    for product, tree in VIEWER_TREES.items():
        (schemas / f"{product}-api.json").write_text(json.dumps(tree))
    catalog.build(schemas, out)
    built = {product: json.loads((out / f"{product}.json").read_text()) for product in catalog.PRODUCTS}
    assert built["pve"] == [
        {"path": "/nodes", "method": "GET", "name": "index", "params": {}, "user": "all", "returns": "array"},
        {"path": "/nodes/{node}/qemu/{vmid}/status/start", "method": "POST", "name": "vm_start", "allowtoken": 1,
         "protected": 1, "proxyto": "node", "check": ["perm", "/vms/{vmid}", ["VM.PowerMgmt"]], "returns": "string",
         "params": {"name": {"optional": 1, "pattern": "(?i:[a-z]+)", "type": "string"},
                    "net[n]": {"optional": 1, "type": "string", "format": {
                        "bridge": {"optional": 1, "type": "string"},
                        "model": {"default_key": 1, "enum": ["virtio", "e1000"], "type": "string"}}},
                    "node": {"format": "pve-node", "type": "string"},
                    "skiplock": {"optional": 1, "type": "boolean"},
                    "vmid": {"minimum": 100, "type": "integer"}}}]
    assert built["pbs"] == [  # the HTTP/2 backup protocol under /_upgrade_ is left out
        {"path": "/admin/datastore/{store}/prune", "method": "POST", "returns": "array",
         "check": {"path": ["datastore", "{store}"], "privs": ["Datastore.Modify", "Datastore.Prune"], "partial": True},
         "params": {"keep-last": {"minimum": 1, "optional": 1, "type": "integer"},
                    "store": {"pattern": "^[A-Za-z0-9_]+$", "type": "string"}}},
        {"path": "/config/test", "method": "PUT", "params": {}, "additional": 1}]
    for product in catalog.PRODUCTS:
        text = (out / f"{product}.json").read_text()
        assert "description" not in text and "typetext" not in text and "test's" not in text
        # the committed files are in the exact form build() writes (regenerate: python catalog.py build DIR)
        committed = (catalog.CATALOG_DIR / f"{product}.json").read_text()
        assert committed == json.dumps(json.loads(committed), separators=(",", ":"), sort_keys=True) + "\n"


def test_every_catalog_path_routes_to_itself():
    for product in catalog.PRODUCTS:
        for entry in catalog.methods(product):
            concrete = entry["path"].replace("{", "").replace("}", "")
            found = catalog.find_method(product, entry["method"], concrete)
            assert found and found[0]["path"] == entry["path"], entry["path"]


# ---------------------------------------------------------------- simulator fidelity

def test_unknown_path_and_method_answer_501(sim):
    assert raw(sim, "/nodes/pve1/nothing").status_code == 501
    response = raw(sim, "/version", method="DELETE")
    assert response.status_code == 501 and "not implemented" in response.reason


def test_parameter_errors_in_proxmox_format(sim):
    response = raw(sim, "/cluster/resources", type="everything")
    assert response.status_code == 400 and response.reason == "Parameter verification failed."
    assert "type" in response.json()["errors"]
    response = raw(sim, "/nodes/pve1/qemu/100/config", verbose=1)
    assert "verbose" in response.json()["errors"]
    response = raw(sim, "/nodes/pve1/qemu/abc/config")
    assert "vmid" in response.json()["errors"]
    sim.lab.schema_rejections.clear()


def test_form_booleans_must_be_0_or_1(sim):
    entry, _ = catalog.find_method("pve", "GET", "/nodes/pve1/qemu")
    assert catalog.check_params(entry, {"node": "pve1", "full": "true"})["full"].startswith("type check")
    assert catalog.check_params(entry, {"node": "pve1", "full": "1"}) == {}
    assert catalog.check_params(entry, {"node": "pve1", "full": True}, form=False) == {}


def test_property_strings_and_indexed_parameters_are_checked():
    entry, _ = catalog.find_method("pve", "POST", "/nodes/pve1/qemu")
    base = {"node": "pve1", "vmid": "200"}
    assert catalog.check_params(entry, base | {"net0": "virtio,bridge=vmbr0,firewall=1"}) == {}
    assert "net0" in catalog.check_params(entry, base | {"net0": "virtio,bridge=vmbr0,colour=red"})
    assert "net0" in catalog.check_params(entry, base | {"net0": "virtio,firewall=maybe"})


def test_tokens_and_privileges(sim):
    assert raw(sim, "/version", token=f"{READER}=wrong").status_code == 401
    assert raw(sim, "/version", token="PVEAPIToken").status_code == 401
    empty = f"mcp@pve!empty={sim.lab.pve_tokens['mcp@pve!empty'].secret}"
    response = raw(sim, "/cluster/status", token=empty)
    assert response.status_code == 403 and response.reason == "Permission check failed (/, Sys.Audit)"
    # a privilege-separated token without ACLs sees empty lists, not 403
    rows = raw(sim, "/cluster/resources", token=empty, type="vm").json()["data"]
    assert rows == []


def test_pbs_uses_a_colon_and_plain_text_errors(sim):
    secret = sim.lab.pbs_tokens["mcp@pbs!reader"].secret
    assert raw(sim, "/version", token=f"mcp@pbs!reader:{secret}", product="pbs").status_code == 200
    assert raw(sim, "/version", token=f"mcp@pbs!reader={secret}", product="pbs").status_code == 401
    response = raw(sim, "/admin/datastore/x/groups", token=f"mcp@pbs!reader:{secret}", product="pbs")
    assert response.status_code == 400 and "parameter 'store'" in response.text  # minLength 3
    response = raw(sim, "/admin/datastore/missing/groups", token=f"mcp@pbs!reader:{secret}", product="pbs")
    assert response.status_code == 400 and response.text.startswith("unable to get datastore")
    sim.lab.schema_rejections.clear()


def test_nodes_down_or_misspelled(sim):
    sim.lab.down_nodes.add("pve2")
    try:
        assert raw(sim, "/nodes/pve2/status").status_code == 595
        rows = raw(sim, "/cluster/resources", type="node").json()["data"]
        assert {r["node"]: r["status"] for r in rows}["pve2"] == "offline"
    finally:
        sim.lab.down_nodes.clear()
    # wrong case: DNS finds the member, pveproxy refuses the loop (docs/PROXMOX-BEHAVIOUR.md#node-names-and-forwarding)
    misspelled = raw(sim, "/nodes/PVE1/status")
    assert misspelled.status_code == 500 and "proxy loop detected" in misspelled.reason
    assert raw(sim, "/nodes/nowhere/status").status_code == 500


def test_tasks_run_log_and_finish(sim):
    upid = sim.lab.start_task("pve1", "qmclone", "100", duration=60)
    status = raw(sim, f"/nodes/pve1/tasks/{upid}/status").json()["data"]
    assert status["status"] == "running" and "exitstatus" not in status and "endtime" not in status
    finished = sim.lab.start_task("pve1", "vzdump", "101", exitstatus="WARNINGS: 1", finished=True)
    status = raw(sim, f"/nodes/pve1/tasks/{finished}/status").json()["data"]
    assert status["status"] == "stopped" and status["exitstatus"] == "WARNINGS: 1"
    log = raw(sim, f"/nodes/pve1/tasks/{finished}/log", limit=0).json()
    assert log["data"][0]["n"] == 1 and log["data"][-1]["t"] == "TASK WARNINGS: 1" and "total" in log
    active = raw(sim, "/nodes/pve1/tasks", source="active").json()["data"]
    assert [t["upid"] for t in active] == [upid]
    archive = raw(sim, "/nodes/pve1/tasks").json()["data"]  # finished tasks only by default
    assert upid not in {t["upid"] for t in archive} and finished in {t["upid"] for t in archive}


# ---------------------------------------------------------------- UPIDs

def test_upids_of_both_products():
    pve = parse_upid("UPID:pve1:000A1B2C:1234ABCDE:6745B3C1:qmstart:100:root@pam!mcp:")
    assert pve["node"] == "pve1" and pve["type"] == "qmstart" and pve["id"] == "100" and pve["user"] == "root@pam!mcp"
    assert parse_upid("UPID:pve1:000A1B2C:0000ABCD:6745B3C1:vzdump::root@pam:")["id"] == ""
    pbs = parse_upid("UPID:pbs:000003E8:0000A1B2:00000012:6745B3C1:verificationjob:backup\\x3av\\x2dabc:root@pam:",
                     "pbs")
    assert pbs["type"] == "verificationjob" and pbs["id"].startswith("backup:")
    with pytest.raises(ProxmoxError):
        parse_upid("UPID:pbs:000003E8:0000A1B2:00000012:6745B3C1:verify:store:root@pam:", "pve")
    with pytest.raises(ProxmoxError):
        parse_upid("UPID:pve1:000A1B2C:0000ABCD:6745B3C1:qmstart:100:root@pam:", "pbs")
    with pytest.raises(ProxmoxError):
        parse_upid("not-a-upid")


# ---------------------------------------------------------------- the client

def test_form_encoding():
    encoded = proxmox_client.encode_params({"full": True, "net": {0: "virtio", 1: "e1000"}, "skip": None,
                                            "command": ["/bin/sh", "-c", "id"], "onboot": False})
    assert encoded == {"full": 1, "net0": "virtio", "net1": "e1000", "command": ["/bin/sh", "-c", "id"],
                       "onboot": 0}


def test_client_reads_data_and_translates_errors(sim):
    pve = client(sim)
    assert pve.get("/version")["release"] == "9.2"
    with pytest.raises(ProxmoxError) as caught:
        client(sim, token=f"{READER}=00000000-0000-0000-0000-000000000000").get("/version")
    assert "PROXMOX_LAB_TOKEN" in str(caught.value) and "00000000-0000" not in str(caught.value)
    before = len(sim.lab.requests)
    with pytest.raises(PolicyError) as caught:  # the policy checks the schema before sending
        pve.get("/cluster/resources", type="bogus")
    assert "type" in str(caught.value) and "enumeration" in str(caught.value)
    assert len(sim.lab.requests) == before
    sim.lab.fail.append((r"^/cluster/resources$", 400, "value out of range"))  # one the server rejects
    try:
        with pytest.raises(ProxmoxError) as caught:
            pve.get("/cluster/resources")
        assert "Invalid parameters" in str(caught.value) and "value: value out of range" in str(caught.value)
    finally:
        sim.lab.fail.clear()


def test_403_names_privilege_path_and_the_grant(sim):
    empty = client(sim, token=f"mcp@pve!empty={sim.lab.pve_tokens['mcp@pve!empty'].secret}")
    before = len(sim.lab.requests)
    with pytest.raises(PolicyError) as caught:  # refused before sending: its privileges are known
        empty.get("/cluster/status")
    # the privileges, and the version whose privileges they are (agent calls: VM.Monitor before PVE 9)
    assert sim.lab.requests[before:] == [("pve", "GET", "/access/permissions"), ("pve", "GET", "/version")]
    text = str(caught.value)
    assert "Sys.Audit" in text and "on /" in text
    assert "pveum acl modify / --tokens 'mcp@pve!empty' --roles PVEAuditor" in text
    assert "privilege-separated" in text


def test_errors_read_from_the_reason_phrase_of_old_servers(sim):
    sim.lab.legacy_errors = True
    try:
        with pytest.raises(ProxmoxError) as caught:
            client(sim).get("/nodes/nowhere/status")
        assert "hostname lookup 'nowhere' failed" in str(caught.value)
    finally:
        sim.lab.legacy_errors = False


def test_500_messages_get_a_next_step(sim):
    sim.lab.fail.append((r"/qemu/100/status/current$", 500, "VM is locked (backup)"))
    try:
        with pytest.raises(ProxmoxError) as caught:
            client(sim).get("/nodes/pve1/qemu/100/status/current")
        assert "locked (backup)" in str(caught.value) and "wait for it" in str(caught.value)
    finally:
        sim.lab.fail.clear()


def test_node_unreachable_is_explained(sim):
    sim.lab.down_nodes.add("pve3")
    try:
        with pytest.raises(ProxmoxError) as caught:
            client(sim).get("/nodes/pve3/status")
        assert "595" in str(caught.value) and "'pve3'" in str(caught.value) and "cluster_status" in str(caught.value)
    finally:
        sim.lab.down_nodes.clear()


def test_tls_pin_mismatch_and_unverified_certificates(sim):
    wrong = ":".join(["00"] * 32)
    with pytest.raises(ProxmoxError) as caught:
        client(sim, PROXMOX_LAB_FINGERPRINT=wrong).get("/version")
    assert "does not match the pinned fingerprint" in str(caught.value) and sim.fingerprint in str(caught.value)
    env = sim.env()
    del env["PROXMOX_LAB_FINGERPRINT"]
    host = next(h for h in load_config(env).hosts if h.product == "pve")
    with pytest.raises(ProxmoxError) as caught:
        proxmox_client.ProxmoxClient(host).get("/version")
    assert "PROXMOX_LAB_FINGERPRINT" in str(caught.value) and sim.fingerprint in str(caught.value)
    ca_env = env | {"PROXMOX_LAB_CA_FILE": str(sim.cert_file)}
    host = next(h for h in load_config(ca_env).hosts if h.product == "pve")
    assert proxmox_client.ProxmoxClient(host).get("/version")["release"] == "9.2"


def test_connection_refused_and_timeouts(sim):
    import socket
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    down = client(sim, PROXMOX_LAB_URL=f"https://127.0.0.1:{port}")
    with pytest.raises(ProxmoxError) as caught:
        down.get("/version")
    assert "unreachable" in str(caught.value) and "connection refused" in str(caught.value)
    slow = client(sim, PROXMOX_READ_TIMEOUT="0.3")
    sim.lab.delay = 1.0
    try:
        with pytest.raises(ProxmoxError) as caught:
            slow.get("/version")
        assert "did not answer" in str(caught.value) and "PROXMOX_READ_TIMEOUT" in str(caught.value)
    finally:
        sim.lab.delay = 0


def test_policy_refuses_unknown_paths_before_sending(sim):
    pve = client(sim)
    before = len(sim.lab.requests)
    for path in ("/nodes/pve1/../../access/secret", "/nodes//pve1/nope", "/nodes/pve1%2Fqemu%2F100/zzz"):
        with pytest.raises(PolicyError):
            pve.get(path)
    with pytest.raises(PolicyError) as caught:
        pve.request("POST", "/nodes/pve1/qemu/100/status/start")
    assert "PROXMOX_ACCESS" in str(caught.value)
    assert len(sim.lab.requests) == before


def test_403_from_the_server_when_privileges_were_not_read(sim):
    reader = client(sim)
    reader._permissions_retry = float("inf")  # as if /access/permissions had failed
    privileges.forget_permissions(reader.host)
    original = policy.settings()
    policy.configure(Settings(hosts={("pve", "lab"): HostPolicy("destructive")}))
    token = policy.CALL.set(calls.Call(confirm=lambda *_: None))
    try:
        with pytest.raises(ProxmoxError, match=r"lacks VM.PowerMgmt on /vms/100"):
            reader.request("POST", "/nodes/pve1/qemu/100/status/stop")
    finally:
        policy.CALL.reset(token)
        policy.configure(original)


def test_wait_task_outcomes(sim):
    pve = client(sim, token=f"root@pam!admin={sim.lab.pve_tokens['root@pam!admin'].secret}")
    ok = sim.lab.start_task("pve1", "qmclone", "100", duration=0.4)
    seen = []
    assert pve.wait_task(ok, timeout=20, on_progress=lambda pct, _text: seen.append(pct))["result"] == "ok"
    warned = sim.lab.start_task("pve1", "vzdump", "100", exitstatus="WARNINGS: 1", duration=0.1)
    outcome = pve.wait_task(warned, timeout=20)
    assert outcome["result"] == "warnings" and outcome["warnings"]
    failed = sim.lab.start_task("pve1", "qmstart", "101", exitstatus="VM is locked (backup)", duration=0.1)
    with pytest.raises(TaskFailed) as caught:
        pve.wait_task(failed, timeout=20)
    assert "VM is locked (backup)" in str(caught.value) and "TASK ERROR" in str(caught.value)
    slow = sim.lab.start_task("pve1", "qmmigrate", "102", duration=60)
    assert pve.wait_task(slow, timeout=0.5)["status"] == "still_running"


def test_power_actions_are_tasks_that_change_state(sim):
    admin = client(sim, token=f"root@pam!admin={sim.lab.pve_tokens['root@pam!admin'].secret}")
    admin_request = admin.request
    import policy as policy_module
    original = policy_module.settings()
    policy_module.configure(Settings(hosts={("pve", "lab"): HostPolicy("destructive")}))
    confirmed = policy_module.CALL.set(calls.Call(confirm=lambda *_: None))
    try:
        upid = admin_request("POST", "/nodes/pve1/lxc/103/status/start")
        assert admin.wait_task(upid, timeout=20)["result"] == "ok"
        assert sim.lab.guests[103]["status"] == "running"
        again = admin_request("POST", "/nodes/pve1/qemu/100/status/start")  # 200 + UPID, fails later
        with pytest.raises(TaskFailed, match="VM 100 already running"):
            admin.wait_task(again, timeout=20)
        with pytest.raises(ProxmoxError, match="CT 103 already running"):  # a container refuses before any task
            admin_request("POST", "/nodes/pve1/lxc/103/status/start")
        sim.lab.guests[100]["lock"] = "backup"
        locked = admin_request("POST", "/nodes/pve1/qemu/100/status/shutdown")
        with pytest.raises(TaskFailed, match=r"VM is locked \(backup\)"):
            admin.wait_task(locked, timeout=20)
        sim.lab.guests[100]["lock"] = None
        snap = admin_request("POST", "/nodes/pve1/qemu/100/snapshot", {"snapname": "before-upgrade"})
        admin.wait_task(snap, timeout=20)
        names = [s["name"] for s in admin.get("/nodes/pve1/qemu/100/snapshot")]
        assert names == ["before-upgrade", "current"]
        gone = admin_request("DELETE", "/nodes/pve1/qemu/100/snapshot/before-upgrade")
        admin.wait_task(gone, timeout=20)
        assert [s["name"] for s in admin.get("/nodes/pve1/qemu/100/snapshot")] == ["current"]
        with pytest.raises(PolicyError, match="VM.PowerMgmt"):  # known before sending
            client(sim).request("POST", "/nodes/pve1/qemu/100/status/stop")
    finally:
        policy_module.CALL.reset(confirmed)
        policy_module.configure(original)
        sim.lab.guests[103]["status"] = "stopped"


def test_storage_content_and_networks(sim):
    pve = client(sim)
    isos = pve.get("/nodes/pve1/storage/local/content", content="iso")
    assert [v["volid"] for v in isos] == ["local:iso/debian-13.1.0-amd64-netinst.iso"]
    # the reader token (PVEAuditor) sees no disks and no backups: a disk needs VM.Config.Disk on its guest, a
    # backup Datastore.AllocateSpace on the storage and VM.Backup on its guest (pve-storage check_volume_access)
    assert pve.get("/nodes/pve1/storage/local-lvm/content") == []
    assert pve.get("/nodes/pve1/storage/local/content", content="backup") == []
    admin = client(sim, token=f"root@pam!admin={sim.lab.pve_tokens['root@pam!admin'].secret}")
    disks = admin.get("/nodes/pve1/storage/local-lvm/content")
    assert {v["volid"] for v in disks} == {"local-lvm:vm-100-disk-0", "local-lvm:vm-103-disk-0"}
    backups = admin.get("/nodes/pve1/storage/local/content", content="backup", vmid=100)
    assert len(backups) == 1 and backups[0]["format"] == "vma.zst"
    assert admin.get("/nodes/pve2/storage/local/content", content="backup", vmid=100) == []  # pve1's own disk
    bridges = {n["iface"]: n for n in pve.get("/nodes/pve1/network", type="bridge")}
    assert bridges["vmbr0"]["bridge_ports"] == "eno1" and bridges["vmbr0"]["bridge_vlan_aware"] == 1
    assert bridges["vmbr1"]["bridge_ports"] == "" and "bridge_vlan_aware" not in bridges["vmbr1"]


# ---------------------------------------------------------------- issue 21: certificates renew

def test_a_renewed_certificate_breaks_the_pin_and_the_error_says_how_to_repin(tmp_path):
    with simulator.Simulator(simulator.Lab.homelab()) as own:
        pinned = own.env()  # the fingerprint of today's certificate
        renewed = simulator.make_certificate(tmp_path)  # pveupdate, 14 days before it expires
        own.serve_certificate(*renewed)
        with pytest.raises(ProxmoxError) as caught:
            client(own, **pinned).get("/version")
    text = str(caught.value)
    assert "renewed" in text and "14 days" in text and "pvenode cert info" in text
    assert renewed[2] in text and "PROXMOX_LAB_FINGERPRINT=" in text and "pve-root-ca.pem" in text


def test_a_download_with_a_renewed_certificate_says_how_to_repin_too(tmp_path):
    """A file download (write_restore_file) meets the same TLS refusal as any request, with the same
    words; it raised a TypeError before (the refusal's message was built without its cause)."""
    with simulator.Simulator(simulator.Lab.homelab()) as own:
        pinned = own.env()
        own.serve_certificate(*simulator.make_certificate(tmp_path))
        decision = policy.Decision("GET", "/nodes/pve1/storage/pbs/file-restore/download", {"volume": "x"})
        with pytest.raises(ProxmoxError, match="renewed"):
            client(own, **pinned)._stream(decision, tmp_path / "file", 1 << 20)
    assert not (tmp_path / "file").exists()


def test_the_cluster_ca_file_works_with_strict_x509_checking(tmp_path, monkeypatch):
    """Python 3.13 (and urllib3 2.3+ on it) check X.509 strictly, which refuses a cluster CA made before
    pve-cluster 9.1.2 (no keyUsage). Here urllib3 is made to behave as on 3.13."""
    import types

    import urllib3.util.ssl_
    monkeypatch.setattr(urllib3.util.ssl_, "sys", types.SimpleNamespace(version_info=(3, 13, 0)))
    old_ca = simulator.make_cluster_ca(tmp_path / "pve-root-ca.pem", key_usage=False)
    (tmp_path / "node").mkdir()
    with simulator.Simulator(simulator.Lab.homelab()) as own:
        own.serve_certificate(*simulator.make_certificate(tmp_path / "node", ca=old_ca))
        strict = requests.Session()  # what a client with Python's default checks does
        with pytest.raises(requests.exceptions.SSLError, match="key usage"):
            strict.get(own.pve_url + "/api2/json/version", verify=str(tmp_path / "pve-root-ca.pem"), timeout=5)
        env = own.env()
        del env["PROXMOX_LAB_FINGERPRINT"]

        def trusting(ca_file):  # a client that trusts the CA in `ca_file`, no pin
            config = load_config(env | {"PROXMOX_LAB_CA_FILE": str(tmp_path / ca_file)})
            return proxmox_client.ProxmoxClient(next(h for h in config.hosts if h.product == "pve"))
        assert trusting("pve-root-ca.pem").get("/version")["release"] == "9.2"
        # the chain and the host name are still checked: another CA, or a name the certificate lacks, fails
        simulator.make_cluster_ca(tmp_path / "other-ca.pem")
        with pytest.raises(ProxmoxError, match="does not verify against the CA"):
            trusting("other-ca.pem").get("/version")
        (tmp_path / "elsewhere").mkdir()
        own.serve_certificate(*simulator.make_certificate(tmp_path / "elsewhere", ca=old_ca, names=("pve9.example",)))
        with pytest.raises(ProxmoxError, match="Hostname mismatch|IP address mismatch"):
            trusting("pve-root-ca.pem").get("/version")


def test_poll_reads_until_done_or_the_deadline_and_says_which():
    answers = iter(["running", "running", "stopped"])
    done = lambda state: state == "stopped"  # noqa: E731
    assert proxmox_client.poll(lambda: next(answers), done, 60, pause=0) == ("stopped", True)
    reads = []
    assert proxmox_client.poll(lambda: reads.append(1) or "running", done, 0) \
        == ("running", False) and reads == [1]  # read once even with no time left, never slept past the deadline
