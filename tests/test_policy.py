"""The policy: a gate for every API method, arguments that raise it, protected guests that no
request can reach, privileges known before sending, dry run, confirmation, audit, secrets."""
import json
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

import audit
import calls
import catalog
import policy
import privileges
import server
import simulator
from conftest import in_process, requests_during, run_server, stdio_session, tool_session
from errors import ConfirmationNeeded, PolicyError
from gates import GATES, UNCERTAIN, call_gate, call_gates, method_gate
from masking import mask, mask_params
from mcp_types import ToolAnnotations
from protection import Protected, load_protected
from settings import HostPolicy, Settings

PVE = SimpleNamespace(product="pve", label="lab", token_id="mcp@pve!t", write_token_id=None)
PBS = SimpleNamespace(product="pbs", label="lab", token_id="mcp@pbs!t", write_token_id=None)
OPEN = HostPolicy("destructive", frozenset({"exec", "elevated", "sensitive"}))
PROTECTED = [{"host": "lab", "vmid": 100, "name": "web", "reason": "the family website"},
             {"host": "lab", "vmid": 102, "name": "dns", "reason": "everything breaks without DNS"}]


@pytest.fixture()
def open_policy():
    """Every gate open, guests 100 and 102 protected, no privileges known (so none is pre-checked)."""
    original = policy.settings()
    policy.configure(Settings(hosts={("pve", "lab"): OPEN, ("pbs", "lab"): OPEN},
                                     protected=Protected(entries=PROTECTED)))
    yield
    policy.configure(original)


# ---------------------------------------------------------------- the gate table

def test_every_schema_method_has_exactly_one_gate():
    counts = {}
    for product, expected in (("pve", 675), ("pbs", 349)):
        methods = catalog.methods(product)
        assert len(methods) == expected
        for entry in methods:
            gate = method_gate(entry["method"], entry["path"])
            assert gate in GATES
            counts[gate] = counts.get(gate, 0) + 1
    assert set(counts) == set(GATES), counts


def test_uncertain_classifications_are_listed_with_a_reason():
    assert len(UNCERTAIN) >= 5
    for (product, method, path), reason in UNCERTAIN.items():
        assert any(e["method"] == method and e["path"] == path for e in catalog.methods(product)), path
        assert len(reason) > 20


@pytest.mark.parametrize("product, method, path, gate", [
    ("pve", "GET", "/cluster/resources", "read"),
    ("pve", "GET", "/nodes/{node}/qemu/{vmid}/config", "read"),
    ("pve", "POST", "/nodes/{node}/qemu/{vmid}/status/start", "lifecycle"),
    ("pve", "POST", "/nodes/{node}/lxc/{vmid}/status/shutdown", "lifecycle"),
    ("pve", "POST", "/nodes/{node}/qemu/{vmid}/snapshot", "lifecycle"),
    ("pve", "POST", "/nodes/{node}/vzdump", "lifecycle"),
    ("pve", "POST", "/nodes/{node}/qemu/{vmid}/clone", "write"),
    ("pve", "POST", "/nodes/{node}/qemu/{vmid}/migrate", "write"),
    ("pve", "PUT", "/nodes/{node}/qemu/{vmid}/resize", "write"),
    ("pve", "POST", "/nodes/{node}/qemu/{vmid}/status/stop", "destructive"),
    ("pve", "POST", "/nodes/{node}/qemu/{vmid}/status/reset", "destructive"),
    ("pve", "POST", "/nodes/{node}/qemu/{vmid}/snapshot/{snapname}/rollback", "destructive"),
    ("pve", "DELETE", "/nodes/{node}/qemu/{vmid}", "destructive"),
    ("pve", "PUT", "/nodes/{node}/disks/wipedisk", "destructive"),
    ("pve", "POST", "/nodes/{node}/disks/zfs", "destructive"),
    ("pve", "POST", "/nodes/{node}/execute", "elevated"),
    ("pve", "PUT", "/access/acl", "elevated"),
    ("pve", "POST", "/access/users/{userid}/token/{tokenid}", "elevated"),
    ("pve", "POST", "/access/domains", "elevated"),
    ("pve", "PUT", "/nodes/{node}/network", "elevated"),
    ("pve", "POST", "/nodes/{node}/status", "elevated"),
    ("pve", "POST", "/storage", "elevated"),
    ("pve", "POST", "/nodes/{node}/qemu/{vmid}/agent/exec", "exec"),
    ("pve", "GET", "/nodes/{node}/qemu/{vmid}/agent/exec-status", "exec"),
    ("pve", "POST", "/nodes/{node}/qemu/{vmid}/agent/file-write", "exec"),
    ("pve", "GET", "/nodes/{node}/qemu/{vmid}/agent/file-read", "sensitive"),
    ("pve", "GET", "/nodes/{node}/qemu/{vmid}/cloudinit/dump", "sensitive"),
    ("pve", "POST", "/access/ticket", "blocked"),
    ("pve", "PUT", "/access/password", "blocked"),
    ("pve", "POST", "/nodes/{node}/vncshell", "blocked"),
    ("pve", "POST", "/nodes/{node}/termproxy", "blocked"),
    ("pve", "POST", "/nodes/{node}/spiceshell", "blocked"),
    ("pve", "POST", "/nodes/{node}/qemu/{vmid}/monitor", "blocked"),
    ("pve", "POST", "/nodes/{node}/qemu/{vmid}/vncproxy", "blocked"),
    ("pve", "POST", "/nodes/{node}/qemu/{vmid}/agent/set-user-password", "blocked"),
    ("pve", "GET", "/access/tfa", "blocked"),
    ("pbs", "GET", "/admin/datastore/{store}/snapshots", "read"),
    ("pbs", "POST", "/admin/datastore/{store}/prune", "destructive"),
    ("pbs", "POST", "/admin/datastore/{store}/prune-datastore", "destructive"),
    ("pbs", "DELETE", "/admin/datastore/{store}/snapshots", "destructive"),
    ("pbs", "POST", "/admin/datastore/{store}/gc", "lifecycle"),
    ("pbs", "POST", "/admin/datastore/{store}/verify", "lifecycle"),
    ("pbs", "PUT", "/admin/datastore/{store}/notes", "write"),
    ("pbs", "PUT", "/access/acl", "elevated"),
    ("pbs", "GET", "/admin/datastore/{store}/download", "sensitive"),
    ("pbs", "POST", "/access/ticket", "blocked"),
    ("pbs", "GET", "/backup", "blocked"),
])
def test_gate_of_method(product, method, path, gate):
    assert catalog.find_method(product, method, path)  # the row names a real method of that API
    assert method_gate(method, path) == gate


@pytest.mark.parametrize("method, path, params, gate", [
    ("POST", "/nodes/{node}/qemu", {"vmid": 200, "hookscript": "local:snippets/x.sh"}, "elevated"),
    ("POST", "/nodes/{node}/qemu/{vmid}/config", {"args": "-device foo"}, "elevated"),
    ("PUT", "/nodes/{node}/qemu/{vmid}/config", {"hostpci0": "0000:01:00.0"}, "elevated"),
    ("PUT", "/nodes/{node}/qemu/{vmid}/config", {"usb0": "host=1234:5678"}, "elevated"),
    ("PUT", "/nodes/{node}/qemu/{vmid}/config", {"usb0": "spice"}, "write"),
    ("PUT", "/nodes/{node}/qemu/{vmid}/config", {"serial0": "/dev/ttyS0"}, "elevated"),
    ("PUT", "/nodes/{node}/qemu/{vmid}/config", {"serial0": "socket"}, "write"),
    ("PUT", "/nodes/{node}/lxc/{vmid}/config", {"mp0": "/srv/data,mp=/data"}, "elevated"),
    ("PUT", "/nodes/{node}/lxc/{vmid}/config", {"mp0": "local-lvm:8,mp=/data"}, "write"),
    ("PUT", "/nodes/{node}/lxc/{vmid}/config", {"dev0": "/dev/dri/card0"}, "elevated"),
    ("PUT", "/nodes/{node}/lxc/{vmid}/config", {"features": "nesting=1,mount=nfs"}, "elevated"),
    ("POST", "/nodes/{node}/lxc", {"vmid": 200, "unprivileged": 0}, "elevated"),
    ("POST", "/nodes/{node}/lxc", {"vmid": 200, "unprivileged": 1}, "write"),
    ("POST", "/nodes/{node}/vzdump", {"vmid": "101", "script": "/root/hook.sh"}, "elevated"),
    ("POST", "/nodes/{node}/vzdump", {"vmid": "101", "dumpdir": "/etc"}, "elevated"),
    ("POST", "/cluster/backup", {"tmpdir": "/tmp/x"}, "elevated"),
    ("DELETE", "/nodes/{node}/qemu/{vmid}", {"purge": 1}, "destructive"),
    ("POST", "/nodes/{node}/qemu/{vmid}/move_disk", {"disk": "scsi0", "delete": 1}, "destructive"),
    ("POST", "/nodes/{node}/qemu/{vmid}/move_disk", {"disk": "scsi0"}, "write"),
    ("POST", "/nodes/{node}/lxc/{vmid}/migrate", {"target": "pve2", "force": 1}, "destructive"),
    ("POST", "/admin/datastore/{store}/prune", {"dry-run": 1}, "read"),
    # `cdrom` names its format (pve-qm-ide) and is parsed like ide[n]; `cdrom` as a volume is the node's drive
    ("PUT", "/nodes/{node}/qemu/{vmid}/config", {"cdrom": "/dev/sda"}, "elevated"),
    ("PUT", "/nodes/{node}/qemu/{vmid}/config", {"cdrom": "cdrom"}, "elevated"),
    ("PUT", "/nodes/{node}/qemu/{vmid}/config", {"sata1": "cdrom,media=cdrom"}, "elevated"),
    ("PUT", "/nodes/{node}/qemu/{vmid}/config", {"cdrom": "local:iso/debian.iso"}, "write"),
    ("PUT", "/nodes/{node}/qemu/{vmid}/config", {"cdrom": "none"}, "write"),
    ("POST", "/nodes/{node}/lxc", {"vmid": 200, "ostemplate": "/var/lib/vz/template/cache/x.tar.zst",
                                   "unprivileged": 1}, "elevated"),
    ("POST", "/nodes/{node}/lxc", {"vmid": 200, "ostemplate": "local:vztmpl/x.tar.zst", "unprivileged": 1}, "write"),
    ("POST", "/nodes/{node}/qemu", {"vmid": 200, "archive": "/mnt/x.vma"}, "elevated"),
])
def test_arguments_raise_the_gate(method, path, params, gate):
    assert call_gate(method, path, params)[0] == gate


def test_a_ceph_osd_wipes_its_devices():
    """pve-manager API2/Ceph/OSD.pm createosd wipes the device first: destructive on top of elevated."""
    gates = call_gates("pve", "POST", "/nodes/{node}/ceph/osd", {"dev": "/dev/sdb"})[0]
    assert gates == ("destructive", "elevated")


def test_closed_gates_name_the_variable_that_opens_them():
    original = policy.settings()
    policy.configure(Settings(hosts={("pve", "lab"): HostPolicy("lifecycle")}))
    try:
        with pytest.raises(PolicyError, match="PROXMOX_ACCESS=destructive"):
            policy.check(PVE, "POST", "/nodes/pve1/qemu/100/status/stop", {})
        with pytest.raises(PolicyError, match="PROXMOX_ALLOW_EXEC"):
            policy.check(PVE, "POST", "/nodes/pve1/qemu/100/agent/exec", {"command": ["id"]})
        with pytest.raises(PolicyError, match="PROXMOX_ALLOW_ELEVATED"):
            policy.check(PVE, "PUT", "/nodes/pve1/qemu/100/config", {"hookscript": "local:snippets/a.sh"})
        with pytest.raises(PolicyError, match="PROXMOX_UNBLOCK"):
            policy.check(PVE, "POST", "/nodes/pve1/termproxy", {})
        with pytest.raises(PolicyError, match="PROXMOX_ALLOW_SENSITIVE"):
            policy.check(PVE, "GET", "/nodes/pve1/qemu/100/agent/file-read", {"file": "/etc/shadow"})
        assert policy.check(PVE, "POST", "/nodes/pve1/qemu/100/status/start", {}).gate == "lifecycle"
    finally:
        policy.configure(original)


@pytest.mark.parametrize("path", [
    "/nodes/pve1/qemu/100/../../../access/users", "/nodes/pve1//qemu/100/nope", "/nodes/pve1%2F..%2F..%2Faccess",
    "/NODES/pve1/status", "/nodes/pve1/qemu/100/config\x00", "/api2/json/version", "/nodes/pve1/qemu/100/status/Start",
    "/nodes/pve1/qemu/100%252Fstatus%252Fstart",
])
def test_unknown_or_disguised_paths_are_refused(path, open_policy):
    with pytest.raises(PolicyError):
        policy.check(PVE, "POST", path, {})


def test_bad_parameters_are_refused_before_sending(open_policy):
    with pytest.raises(PolicyError, match="vmid"):
        policy.check(PVE, "GET", "/nodes/pve1/qemu/abc/config", {})
    with pytest.raises(PolicyError, match="not defined in schema"):
        policy.check(PVE, "POST", "/nodes/pve1/qemu/101/status/start", {"now": 1})


def test_exec_status_follows_only_the_exec_confirmed_in_the_same_call(open_policy):
    """An exec-status read skips confirmation only as the follow-up of the exec the user confirmed
    in this tool call (same host, guest and pid); any other read of a guest's exec output is exec."""
    asked = []
    token = policy.CALL.set(calls.Call(tool="test",
                             confirm=lambda _host, decisions, *_: asked.extend(d.path for d in decisions)))
    try:
        assert policy.admit(PVE, "POST", "/nodes/pve2/qemu/104/agent/exec", {"command": ["id"]},
                            lambda _: {"pid": 7}) == {"pid": 7}
        status = "/nodes/pve2/qemu/104/agent/exec-status"
        policy.admit(PVE, "GET", status, {"pid": 7}, lambda _: {"exited": 1})
        assert asked == ["/nodes/pve2/qemu/104/agent/exec"]
        policy.admit(PVE, "GET", status, {"pid": 8}, lambda _: {"exited": 1})  # another process
        policy.admit(PVE, "GET", "/nodes/pve2/qemu/103/agent/exec-status", {"pid": 7}, lambda _: {})  # another guest
        assert asked[1:] == [status, "/nodes/pve2/qemu/103/agent/exec-status"]
    finally:
        policy.CALL.reset(token)
    token = policy.CALL.set(calls.Call(tool="other", confirm=None))  # the next call starts with nothing confirmed
    try:
        with pytest.raises(ConfirmationNeeded):
            policy.admit(PVE, "GET", status, {"pid": 7}, lambda _: {"exited": 1})
    finally:
        policy.CALL.reset(token)


def test_masked_values_are_never_written_back(open_policy):
    for value in ("***", "**********", "pre***post"):
        with pytest.raises(PolicyError, match="overwrite the real secret"):
            policy.check(PVE, "PUT", "/nodes/pve1/qemu/101/config", {"cipassword": value})


# ---------------------------------------------------------------- protected guests

# The bypass corpus (stage 1's 51 entries and every example of issue 14) is tests/test_bypass_corpus.py.


def test_unprotected_guests_and_reads_pass(open_policy):
    assert policy.check(PVE, "POST", "/nodes/pve2/qemu/101/status/stop", {}).guests == [101]
    # a protected guest's backup may be restored to a NEW vmid (a restore drill); over it, never
    restore = {"vmid": 150, "archive": "nfs-backup:backup/vzdump-qemu-100-2026_11_28-02_00_01.vma.zst"}
    assert policy.check(PVE, "POST", "/nodes/pve1/qemu", restore).guests == [150]
    assert policy.check(PVE, "POST", "/nodes/pve3/lxc", {"vmid": 151, "restore": 1,
                                                         "ostemplate": "nfs-backup:backup/vzdump-lxc-102-x.tar.zst"})
    with pytest.raises(PolicyError, match="protected"):
        policy.check(PVE, "POST", "/nodes/pve1/qemu", restore | {"vmid": 100, "force": 1})
    assert policy.check(PVE, "GET", "/nodes/pve1/qemu/100/config", {}).gate == "read"
    assert policy.check(PVE, "POST", "/nodes/pve1/vzdump", {"all": 1, "exclude": "100,102"}).gate == "lifecycle"
    assert policy.check(PVE, "POST", "/nodes/pve1/startall", {"vms": "101,103"}).guests == [101, 103]
    assert policy.check(PBS, "PUT", "/admin/datastore/backup/notes",
                        {"backup-type": "vm", "backup-id": "100", "backup-time": 1, "notes": "x"}).gate == "write"


def test_a_broken_protected_list_fails_closed(tmp_path):
    broken = tmp_path / "protected.json"
    broken.write_text("[{oops")
    loaded = load_protected(broken)
    assert loaded.error and not loaded.entries
    assert load_protected(tmp_path / "missing.json").error
    original = policy.settings()
    policy.configure(Settings(hosts={("pve", "lab"): OPEN}, protected=loaded))
    try:
        with pytest.raises(PolicyError, match="could not be read"):
            policy.check(PVE, "POST", "/nodes/pve1/qemu/105/status/start", {})
        assert policy.check(PVE, "GET", "/nodes/pve1/qemu/105/config", {}).gate == "read"
    finally:
        policy.configure(original)


# ---------------------------------------------------------------- privileges known before sending

def test_privileges_decide_before_sending():
    host = SimpleNamespace(product="pve", label="p", token_id="a@pve!t", write_token_id=None)
    privileges.set_permissions(host, {"/vms": {"VM.Audit": 1, "VM.PowerMgmt": 1}, "/nodes/pve1": {"Sys.Audit": 0}})
    assert privileges.holds(host, "VM.PowerMgmt", "/vms/100") is True
    assert privileges.holds(host, "Sys.Audit", "/nodes/pve1") is True  # 0 is the propagate flag, still held
    assert privileges.holds(host, "Sys.Audit", "/nodes/pve1/disks") is False  # not propagated
    assert privileges.holds(host, "VM.Snapshot", "/vms/100") is False
    # PVE lists /pool among its default paths and every pool member with the pool's privileges
    # (flag 0: never propagated), so a listed /pool decides nothing by itself
    privileges.set_permissions(host, {"/pool": {"Pool.Audit": 1}, "/pool/prod": {"VM.Snapshot": 1},
                                  "/vms/100": {"VM.Snapshot": 0, "VM.Audit": 1}, "/vms": {"VM.Audit": 1}})
    assert privileges.holds(host, "VM.Snapshot", "/vms/100") is True
    assert privileges.holds(host, "VM.Snapshot", "/vms/100/x") is False  # pool privileges do not propagate
    assert privileges.holds(host, "VM.Snapshot", "/vms/102") is False
    assert privileges.holds(host, "VM.Audit", "/vms/102") is True


# ---------------------------------------------------------------- audit

def test_audit_lines_chain_and_tampering_is_found(tmp_path):
    original = policy.settings()
    policy.configure(Settings(audit_path=tmp_path / "audit.jsonl"))
    try:
        threads = [threading.Thread(target=lambda i=i: [
            policy.audit(PVE, "POST", f"/nodes/pve1/qemu/{100 + i}/status/start", {"password": "hunter2"}, "sent")
            for _ in range(50)]) for i in range(20)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        policy.configure(original)
    path = tmp_path / "audit.jsonl"
    lines = path.read_text().splitlines()
    assert len(lines) == 1000
    assert "hunter2" not in path.read_text()
    assert audit.verify(path) == (1000, None, "1000 lines, chain intact, head matches")
    record = json.loads(lines[50])
    record["path"] = "/nodes/pve1/qemu/999/status/start"
    lines[50] = json.dumps(record, separators=(",", ":"))  # line 51 altered
    path.write_text("\n".join(lines) + "\n")
    assert audit.verify(path)[1] == 51
    del lines[50]
    path.write_text("\n".join(lines) + "\n")
    count, bad, message = audit.verify(path)
    assert bad == 51 and "removed" in message


def test_mask():
    text = mask('PVEAPIToken=a@b!c=1234-5678 {"password": "pw1", "cipassword":"pw2"} https://u:pw3@h/ '
                       '-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n-----END OPENSSH PRIVATE KEY----- '
                       'PVEAuthCookie=PVE:x:y CSRFPreventionToken: tok')
    for secret in ("1234-5678", "pw1", "pw2", "pw3", "abc", "PVE:x:y", "tok"):
        assert secret not in text
    assert mask_params({"password": "x", "cipassword": "y", "sshkeys": "ssh-ed25519 AAA", "memory": 4}) == \
        {"password": "***", "cipassword": "***", "sshkeys": "ssh-ed25519 AAA", "memory": 4}


# ---------------------------------------------------------------- through the MCP client

def write_env(sim, tmp: Path, **extra) -> dict:
    protected = tmp / "protected.json"
    protected.write_text(json.dumps(PROTECTED))
    # the policy must decide, not Proxmox's privileges: a token that holds everything
    return sim.env(pve_token="root@pam!admin", pbs_token="root@pam!admin") | {
        "PROXMOX_ACCESS": "destructive", "PROXMOX_ALLOW_EXEC": "true", "PROXMOX_ALLOW_ELEVATED": "true",
        "PROXMOX_ALLOW_SENSITIVE": "true", "PROXMOX_PROTECTED_VMS_FILE": str(protected),
        "PROXMOX_AUDIT_LOG": str(tmp / "audit.jsonl")} | extra


@pytest.fixture(scope="module")
def admin(sim, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("admin")
    with tool_session(write_env(sim, tmp), log_name="policy-admin") as session:
        session.tmp = tmp
        yield session




def test_read_tier_hides_write_tools_and_annotations_hold(session):
    tools = {t.name: t for t in session.tools()}
    assert "write_call_api" not in tools and {"api_search", "api_describe", "api_read"} <= set(tools)
    message = session.error("api_read", {"path": "/nodes/pve1/qemu/100/agent/file-read",
                                         "params": {"file": "/etc/shadow"}})
    assert "sensitive" in message and "PROXMOX_ALLOW_SENSITIVE" in message


def test_annotations_match_gates_over_the_whole_list(admin):
    tools = admin.tools()
    assert "write_call_api" in {t.name for t in tools}
    for tool in tools:
        hints = tool.annotations or ToolAnnotations()  # none: the MCP defaults (changes things, may destroy)
        changes = not hints.read_only_hint
        assert changes == tool.name.startswith("write_"), tool.name
        assert not changes or "dry_run" in tool.input_schema["properties"], f"{tool.name} has no dry_run"
        if changes:
            assert hints.destructive_hint is not False or not hints.idempotent_hint


def test_write_runs_is_audited_and_verified(admin, sim):
    result, sent = requests_during(sim, lambda: admin.ok("write_call_api", {
        "method": "POST", "path": "/nodes/pve2/qemu/101/snapshot", "params": {"snapname": "pre-upgrade"}}))
    assert result["data"].startswith("UPID:pve2:") and "get_task" in result["next"]
    assert ("pve", "POST", "/nodes/pve2/qemu/101/snapshot") in sent
    audit = [json.loads(line) for line in (admin.tmp / "audit.jsonl").read_text().splitlines()]
    assert audit[-1]["verdict"] == "sent" and audit[-1]["result"].startswith("UPID:")
    assert audit[-1]["tool"] == "write_call_api"
    from conftest import run_server as run
    verified = run(["--verify-audit"], {"PROXMOX_AUDIT_LOG": str(admin.tmp / "audit.jsonl")})
    assert verified.returncode == 0 and "chain intact" in verified.stdout


def test_dry_run_shows_the_exact_request_and_sends_nothing(admin, sim):
    plan, sent = requests_during(sim, lambda: admin.ok("write_call_api", {
        "method": "PUT", "path": "/nodes/pve2/qemu/101/config", "params": {"memory": "4096", "cipassword": "s3cret!"},
        "dry_run": True}))
    assert plan["dry_run"] is True and plan["gate"] == "write"
    assert plan["request"] == {"method": "PUT", "path": "/nodes/pve2/qemu/101/config",
                               "params": {"memory": "4096", "cipassword": "***"}}
    assert plan["current"]["status"] == "running" and "101" in plan["protection"]
    assert all(method == "GET" for _, method, _ in sent)
    audit = (admin.tmp / "audit.jsonl").read_text().splitlines()
    assert json.loads(audit[-1])["verdict"] == "dry_run" and "s3cret!" not in "".join(audit)


def test_refusals_are_audited(admin):
    admin.error("write_call_api", {"method": "DELETE", "path": "/nodes/pve1/qemu/100", "confirm": True})
    last = json.loads((admin.tmp / "audit.jsonl").read_text().splitlines()[-1])
    assert last["verdict"] == "refused" and "protected" in last["error"]


def test_destructive_needs_confirmation_without_elicitation(admin, sim):
    message, sent = requests_during(sim, lambda: admin.error("write_call_api", {
        "method": "POST", "path": "/nodes/pve2/qemu/104/status/stop"}))
    assert "confirm=true" in message and "win11 (vmid 104)" in message
    assert [s for s in sent if s[1] != "GET"] == []
    done = admin.ok("write_call_api", {"method": "POST", "path": "/nodes/pve2/qemu/104/status/stop", "confirm": True})
    assert done["data"].startswith("UPID:")


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_elicitation_asks_the_user(sim, tmp_path, mode):
    from mcp_types import ElicitResult
    answers, asked = ["decline", "accept"], []

    async def answer(context, params):
        asked.append(params.message)
        action = answers.pop(0)
        return ElicitResult(action=action, content={"confirm": True} if action == "accept" else None)

    with stdio_session(write_env(sim, tmp_path), mode=mode, log_name="elicit", elicitation_callback=answer) as session:
        call = {"method": "POST", "path": "/nodes/pve3/lxc/105/status/stop"}
        assert "did not confirm" in session.error("write_call_api", call)
        assert session.ok("write_call_api", call)["data"].startswith("UPID:")
        assert len(asked) == 2 and "ci-runner (vmid 105)" in asked[0] and "DESTRUCTIVE" in asked[0]
        assert session.ok("write_call_api", call | {"dry_run": True})["needs_confirmation"] is True
        assert len(asked) == 2  # a dry run asks nobody
    sim.lab.tick()  # the stop is done; then 105 runs again, as it was, for the other revision's run
    sim.lab.guests[105]["status"] = "running"


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_elicit_off_requires_confirm(sim, tmp_path, mode):
    async def answer(context, params):
        raise AssertionError("must not be asked")

    env = write_env(sim, tmp_path, PROXMOX_ELICIT="false")
    with stdio_session(env, mode=mode, log_name="no-elicit", elicitation_callback=answer) as session:
        stop = {"method": "POST", "path": "/nodes/pve3/lxc/105/status/stop"}
        assert "confirm=true" in session.error("write_call_api", stop)


def test_global_dry_run(sim, tmp_path):
    with in_process(write_env(sim, tmp_path, PROXMOX_DRY_RUN="true"), log_name="dry") as session:
        before = len([r for r in sim.lab.requests if r[1] != "GET"])
        plan = session.ok("write_call_api", {"method": "POST", "path": "/nodes/pve2/qemu/101/status/reboot"})
        assert plan["dry_run"] is True
        assert len([r for r in sim.lab.requests if r[1] != "GET"]) == before


def test_unblock_opens_one_blocked_method(tmp_path):
    ok = run_server(["--list-tools"], {"PROXMOX_UNBLOCK": "PUT /nodes/{node}/qemu/{vmid}/sendkey"})
    assert ok.returncode == 0
    for bad, expected in (("POST /nodes/{node}/qemu/{vmid}/clone", "not blocked"), ("GET /nope", "not a method")):
        result = run_server(["--list-tools"], {"PROXMOX_UNBLOCK": bad})
        assert result.returncode == 2 and expected in result.stderr


def test_api_search_and_describe(admin):
    found = admin.ok("api_search", {"query": "snapshot rollback", "host": "lab"})
    paths = {row[1]: row[2] for row in found["rows"]}
    assert paths["/nodes/{node}/qemu/{vmid}/snapshot/{snapname}/rollback"] == "destructive"
    described = admin.ok("api_describe", {"path": "/nodes/pve1/qemu/100/status/start", "method": "POST"})
    assert described["path"] == "/nodes/{node}/qemu/{vmid}/status/start" and described["gate"] == "lifecycle"
    assert described["parameters"]["vmid"]["required"] is True
    assert described["parameters"]["skiplock"]["type"] == "boolean"
    assert described["permission"] == ["perm", "/vms/{vmid}", ["VM.PowerMgmt"]]
    pbs = admin.ok("api_search", {"query": "prune", "product": "pbs"})
    assert any(row[1] == "/admin/datastore/{store}/prune" for row in pbs["rows"])


def test_api_describe_uses_the_hosts_own_descriptions(admin, tmp_path):
    start = {"path": "/nodes/{node}/qemu/{vmid}/status/start", "method": "POST"}
    assert "description" not in admin.ok("api_describe", start)  # this module's host has no API viewer (404)
    # a host whose viewer (apidoc.js) holds one method, described in words of this test's own
    viewer = [{"path": "/nodes", "text": "nodes", "leaf": 0, "children": [
        {"path": "/nodes/{node}/qemu/{vmid}/status/start", "text": "start", "leaf": 1,
         "info": {"POST": {"method": "POST", "name": "vm_start", "description": "Boots guest 4711 of the test."}}}]}]
    (tmp_path / "pve-api.json").write_text(json.dumps(viewer))
    admitted = []
    admit = policy.admit

    def recording(host, method, path, params, send, **kw):
        admitted.append((method, path))
        return admit(host, method, path, params, send, **kw)

    with simulator.Simulator(simulator.Lab.homelab(), schema_dir=tmp_path) as own:
        with in_process(own.env(), log_name="policy-viewer") as session:
            policy.admit = recording  # the viewer file is fetched through the admission step too
            try:
                assert session.ok("api_describe", start)["description"] == "Boots guest 4711 of the test."
            finally:
                policy.admit = admit
    assert ("GET", "/pve-docs/api-viewer/apidoc.js") in admitted
    with pytest.raises(PolicyError, match="not a file"):
        policy.document_decision("pve", "/pve-docs/../../etc/passwd")


def test_the_api_viewer_file_is_read_only_where_the_policy_admitted_it(tmp_path):
    """A redirect from the viewer's path (a proxy in front of the node) is not followed: the file read is
    the one the admission step judged, nothing else; the tools answer from the schema alone."""
    start = {"path": "/nodes/{node}/qemu/{vmid}/status/start", "method": "POST"}
    (tmp_path / "pve-api.json").write_text("[]")
    with simulator.Simulator(simulator.Lab.homelab(), schema_dir=tmp_path) as own:
        own.viewer_redirect = "/elsewhere/apidoc.js"
        with in_process(own.env(), log_name="policy-viewer-redirect") as session:
            described = session.ok("api_describe", start)
            assert described["gate"] == "lifecycle" and "description" not in described
            assert session.ok("api_search", {"query": "vm start"})["rows"]
        assert ("pve", "/pve-docs/api-viewer/apidoc.js") in own.documents
        assert not [path for _, path in own.documents if path.startswith("/elsewhere")]


def test_api_read_reads_any_path(admin):
    version = admin.ok("api_read", {"path": "/version"})
    assert version["data"]["release"] == "9.2"
    datastores = admin.ok("api_read", {"path": "/admin/datastore", "host": "lab", "product": "pbs"})
    assert datastores["data"][0]["store"] == "backup"
    assert "Unknown API path" in admin.error("api_read", {"path": "/nodes/pve1/secret"})


# ---------------------------------------------------------------- rights, hosts, tokens, reports

@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_tools_no_token_can_use_are_hidden_and_clients_told(sim, mode):
    """Told as each revision tells: a notification on the session before 2026-07-28, an event on
    the subscriptions/listen stream the client opened on 2026-07-28."""
    import threading as _threading
    changed = _threading.Event()

    async def on_message(message):
        if getattr(getattr(message, "root", message), "method", "") == "notifications/tools/list_changed":
            changed.set()

    async def listen(client, ready):
        async with client.listen(tools_list_changed=True) as subscription:
            ready.set()
            async for _event in subscription:
                changed.set()
                return

    sim.lab.slow_paths[r"^/access/permissions$"] = 1.5  # the list is answered before privileges are known
    try:
        env = sim.env(pve_token="mcp@pve!empty", pbs=False)
        with stdio_session(env, mode=mode, log_name="hidden", message_handler=on_message) as session:
            if mode == "auto":
                ready = _threading.Event()
                session.portal.start_task_soon(listen, session.client, ready)
                assert ready.wait(timeout=30)
            assert {"cluster_status", "get_guest"} <= {t.name for t in session.tools()}
            assert changed.wait(timeout=30), "no notifications/tools/list_changed"
            names = {t.name for t in session.tools()}
            assert "cluster_status" not in names and "get_guest" not in names and "list_guests" in names
            message = session.error("cluster_status")
            assert "Sys.Audit" in message and "pveum acl modify / --tokens 'mcp@pve!empty'" in message
            info = session.ok("server_info")
            info["hidden_tools"] = {name: why for why, names in info["hidden_tools"].items() for name in names}
            by_privilege = {name for name, why in info["hidden_tools"].items() if "no configured token holds" in why}
            # every read tool of the default list that needs a privilege (from the tool table): the token holds none
            needing = {spec.function.__name__ for spec in server.TOOLS if spec.needs and spec.gate == "read"
                       and spec.product == "pve" and spec.function.__name__ in server.TOOLSETS["default"]}
            assert by_privilege == needing and {"cluster_status", "get_guest", "list_backups"} <= needing
            assert "gate is closed" in info["hidden_tools"]["write_make_template"]  # and the other reasons too
            assert "no Proxmox Backup Server host" in info["hidden_tools"]["pbs_list_groups"]
    finally:
        sim.lab.slow_paths.clear()


def test_per_host_access_and_the_write_token(sim, tmp_path):
    reader = f"mcp@pve!reader={sim.lab.pve_tokens['mcp@pve!reader'].secret}"
    admin = f"root@pam!admin={sim.lab.pve_tokens['root@pam!admin'].secret}"
    env = write_env(sim, tmp_path) | {"PROXMOX_ACCESS": "read", "PROXMOX_LAB_ACCESS": "lifecycle",
                                       "PROXMOX_LAB_TOKEN": reader, "PROXMOX_LAB_WRITE_TOKEN": admin,
                                       "PROXMOX_OTHER_URL": sim.pve_url, "PROXMOX_OTHER_FINGERPRINT": sim.fingerprint,
                                       "PROXMOX_OTHER_TOKEN": admin}
    with in_process(env, log_name="per-host") as session:
        assert "write_call_api" in {t.name for t in session.tools()}  # open on one host
        call = {"method": "POST", "path": "/nodes/pve2/qemu/101/snapshot", "params": {"snapname": "split"}}
        message = session.error("write_call_api", call | {"host": "other", "product": "pve"})
        assert "'lifecycle' gate" in message and "PROXMOX_ACCESS" in message
        before = len(sim.lab.requests)
        session.ok("write_call_api", call | {"host": "lab", "product": "pve"})
        # strict=False: a background read may append to both lists between the two slices
        tokens = dict(zip(sim.lab.requests[before:], sim.lab.request_tokens[before:], strict=False))
        assert tokens[("pve", "POST", "/nodes/pve2/qemu/101/snapshot")] == "root@pam!admin"
        # every GET of host 'lab' used the read token (the other host reads its privileges in the background)
        background = ("/access/permissions", "/version")
        lab_reads = [t for (_, m, p), t in tokens.items() if m == "GET" and p not in background]
        assert all(t == "mcp@pve!reader" for t in lab_reads)
        info = session.ok("server_info")
        lab = next(h for h in info["hosts"] if h["host"] == "lab" and h["product"] == "pve")
        assert lab["write_token"] == "root@pam!admin" and "lifecycle" in lab["gates_open"]
        assert "write" not in lab["gates_open"] and lab["version"] == "9.2.1" and "Sys.Audit" in lab["privileges"]
        assert len(info["protected_guests"]) == 2 and info["audit_log"].endswith("audit.jsonl")


def test_startup_warns_about_an_empty_protected_list(tmp_path):
    (tmp_path / "empty.json").write_text("[]")
    result = run_server(["--list-tools"], {"PROXMOX_PROTECTED_VMS_FILE": str(tmp_path / "empty.json")})
    assert "NO GUEST IS PROTECTED" in result.stderr
    result = run_server(["--list-tools"], {"PROXMOX_PROTECTED_VMS_FILE": str(tmp_path / "missing.json")})
    assert "PROTECTED GUEST LIST UNREADABLE" in result.stderr
