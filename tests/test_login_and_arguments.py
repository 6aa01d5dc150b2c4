"""Issue 9: the password (ticket) login fallback, strict arguments and why tools are hidden,
through the MCP client against the simulator."""
import time

import pytest

import proxmox_client
from conftest import in_process, requests_during, run_server, stdio_session, tool_session
from settings import HostConfig

PASSWORD_ENV = {"PROXMOX_ACCESS": "lifecycle"}


def login_env(sim, user: str = "ops@pve", password: str = "sim-ops-password-4711") -> dict:
    return {"PROXMOX_LAB_URL": sim.pve_url, "PROXMOX_LAB_USER": user, "PROXMOX_LAB_PASSWORD": password,
            "PROXMOX_LAB_FINGERPRINT": sim.fingerprint,
            "PBS_LAB_URL": sim.pbs_url, "PBS_LAB_USER": "ops@pbs", "PBS_LAB_PASSWORD": "sim-pbs-password-4713",
            "PBS_LAB_FINGERPRINT": sim.fingerprint} | PASSWORD_ENV


@pytest.fixture(scope="module")
def ops(sim, tmp_path_factory):
    env = login_env(sim) | {"PROXMOX_AUDIT_LOG": str(tmp_path_factory.mktemp("login") / "audit.jsonl")}
    with stdio_session(env, log_name="test_login") as running:
        yield running


def logins(sim, product: str = "pve") -> int:
    return sum(1 for r in sim.lab.requests if r[:3] == (product, "POST", "/access/ticket"))


def test_password_login_reads_both_products_with_one_ticket_each(ops, sim):
    guests = ops.ok("list_guests")
    assert {row[0] for row in guests["rows"]} >= {100, 101}
    stores = ops.ok("pbs_list_datastores")
    assert stores["rows"]
    # one login per product, then the ticket is reused
    before = logins(sim), logins(sim, "pbs")
    ops.ok("list_nodes")
    ops.ok("pbs_list_datastores")
    assert (logins(sim), logins(sim, "pbs")) == before and before[0] >= 1 and before[1] >= 1
    assert "ops@pve" in sim.lab.request_tokens and "ops@pbs" in sim.lab.request_tokens


def test_server_info_and_list_hosts_name_the_login_method(ops):
    info = ops.ok("server_info")
    assert {(h["product"], h["auth"]) for h in info["hosts"]} == {("pve", "password login as ops@pve"),
                                                                  ("pbs", "password login as ops@pbs")}
    assert all(h["token"] == "ops@pve" or h["token"] == "ops@pbs" for h in info["hosts"])
    hosts = ops.ok("list_hosts")
    assert all("password login as" in row[hosts["columns"].index("token")] for row in hosts["rows"])


def test_writes_carry_the_csrf_token(ops, sim):
    _, sent = requests_during(sim, lambda: ops.ok("write_create_snapshot", {"vmid": 100, "name": "viaticket"}),
                              writes=True)
    assert any(r[1] == "POST" and r[2].endswith("/100/snapshot") for r in sent)
    assert "viaticket" in str(ops.ok("get_guest", {"vmid": 100})["snapshots"])


def test_an_expired_ticket_is_renewed_once_and_the_call_succeeds(ops, sim):
    ops.ok("list_nodes")
    before = logins(sim)
    sim.lab.expire_tickets()  # two hours pass
    assert ops.ok("cluster_status")["nodes"]
    assert logins(sim) == before + 1
    ops.ok("list_nodes")
    assert logins(sim) == before + 1  # the new ticket is kept


def test_a_ticket_is_renewed_before_it_runs_out(sim):
    """In process: after an hour the client logs in again before sending, without a 401."""
    host = HostConfig(label="lab", product="pve", url=sim.pve_url, token_id="ops@pve",
                                     token_secret="", user="ops@pve", password="sim-ops-password-4711",
                                     fingerprint=sim.fingerprint.replace(":", "").lower())
    client = proxmox_client.ProxmoxClient(host)
    client._send("GET", "/version", {})
    first = client._ticket
    client._ticket = (first[0], first[1], time.monotonic() - proxmox_client.TICKET_RENEW_AFTER - 1)
    before = len(sim.lab.requests)
    client._send("GET", "/version", {})
    assert [r[1:] for r in sim.lab.requests[before:]] == [("POST", "/access/ticket"), ("GET", "/version")]
    assert client._ticket[0] != first[0]


def test_a_second_factor_account_gets_a_clear_error(sim):
    with stdio_session(login_env(sim, "tfa@pve", "sim-tfa-password-4712"), log_name="test_login_tfa") as session:
        message = session.error("list_guests")
    assert "second factor" in message and "API token" in message and "PROXMOX_LAB_TOKEN" in message


def test_a_wrong_password_names_the_variables(sim):
    with stdio_session(login_env(sim, "ops@pve", "not-the-password"), log_name="test_login_wrong") as session:
        message = session.error("list_guests")
    assert "wrong user or password" in message and "PROXMOX_LAB_PASSWORD" in message
    assert "not-the-password" not in message


def test_check_says_which_method_each_host_uses(sim):
    out = run_server(["--check"], login_env(sim)).stdout
    assert "password login as ops@pve" in out and "password login as ops@pbs" in out
    assert "sim-ops-password" not in out


def test_password_configuration_errors(tmp_path):
    base = {"PROXMOX_LAB_URL": "https://192.0.2.1:8006"}
    assert "go together" in run_server(["--list-tools"], base | {"PROXMOX_LAB_USER": "ops@pve"}).stderr
    assert "user@realm" in run_server(["--list-tools"], base | {"PROXMOX_LAB_USER": "ops",
                                                                 "PROXMOX_LAB_PASSWORD": "x"}).stderr
    secret_file = tmp_path / "password"
    secret_file.write_text("from-a-file\n")
    done = run_server(["--list-tools"], base | {"PROXMOX_LAB_USER": "ops@pve",
                                                 "PROXMOX_LAB_PASSWORD_FILE": str(secret_file)})
    assert done.returncode == 0 and "token is safer" in done.stderr and "from-a-file" not in done.stderr


# ---------------------------------------------------------------- strict arguments

def test_unknown_arguments_are_refused_with_the_accepted_ones(session, sim):
    message, sent = requests_during(sim, lambda: session.error("list_guests", {"nodes": "pve1"}))
    assert sent == []
    assert "'nodes'" in message and "node" in message and "limit" in message and "nothing was sent" in message
    message = session.error("get_guest", {"vmid": 100, "verbose": True})
    assert "'verbose'" in message and "vmid" in message


def test_booleans_and_numbers_are_accepted_as_proxmox_accepts_them(session):
    for value in (True, 1, "1", "true", "on", "yes"):
        assert "rows" in session.ok("list_tasks", {"errors": value, "limit": "5"}), value
    assert len(session.ok("list_guests", {"limit": "2"})["rows"]) == 2


def test_indexed_options_as_a_nested_object(admin_dry, sim):
    plan, sent = requests_during(sim, lambda: admin_dry.ok("write_configure_guest", {
        "vmid": 100, "set": {"net": {"1": "virtio,bridge=vmbr0"}, "memory": "4096"}, "dry_run": True}), writes=True)
    assert sent == []
    text = str(plan)
    assert "net1" in text and "virtio,bridge=vmbr0" in text
    plan, sent = requests_during(sim, lambda: admin_dry.ok("write_call_api", {
        "method": "PUT", "path": "/nodes/pve1/qemu/100/config", "params": {"net": {"2": "virtio,bridge=vmbr0"}},
        "dry_run": True}), writes=True)
    assert sent == [] and "net2" in str(plan)


@pytest.fixture(scope="module")
def admin_dry(sim):
    # the write tools offered: the reader's privileges would hide them
    env = sim.env(pve_token="root@pam!admin", pbs_token="root@pam!admin") | {"PROXMOX_ACCESS": "write"}
    with tool_session(env, log_name="test_login_admin") as running:
        yield running


# ---------------------------------------------------------------- why tools are hidden

def test_server_info_says_why_each_tool_is_hidden(sim):
    env = sim.env() | {"PROXMOX_TOOLSETS": "guests,workflows", "PROXMOX_DENY_TOOLS": "security_audit"}
    with in_process(env, log_name="test_login_hidden") as session:
        grouped = session.ok("server_info")["hidden_tools"]
        listed = {t.name for t in session.tools()}
    assert len(grouped) == len(set(grouped)) and all(grouped.values())  # each reason said once, with its tools
    hidden = {name: why for why, names in grouped.items() for name in names}
    assert len(hidden) == sum(len(names) for names in grouped.values())
    assert "lifecycle gate is closed" in hidden["write_power_guest"] and "PROXMOX_ACCESS" in hidden["write_power_guest"]
    assert "PROXMOX_TOOLSETS" in hidden["pbs_list_snapshots"]
    assert hidden["security_audit"] == "listed in PROXMOX_DENY_TOOLS"
    assert "SSH" in hidden["ssh_check"] or "PROXMOX_TOOLSETS" in hidden["ssh_check"]
    assert not set(hidden) & listed


def test_an_endpoint_that_refuses_tokens_uses_the_password_login(sim, tmp_path):
    """With a token and a user configured, the token does everything except the few endpoints
    Proxmox refuses to tokens; those get one retry with the ticket."""
    admin = sim.lab.pve_tokens["root@pam!admin"].secret
    env = {"PROXMOX_LAB_URL": sim.pve_url, "PROXMOX_LAB_TOKEN": f"root@pam!admin={admin}",
           "PROXMOX_LAB_USER": "ops@pve", "PROXMOX_LAB_PASSWORD": "sim-ops-password-4711",
           "PROXMOX_LAB_FINGERPRINT": sim.fingerprint, "PROXMOX_ACCESS": "write", "PROXMOX_ALLOW_ELEVATED": "true",
           "PROXMOX_UNBLOCK": "PUT /access/password", "PROXMOX_AUDIT_LOG": str(tmp_path / "audit.jsonl")}
    with stdio_session(env, log_name="test_login_both") as session:
        info = session.ok("server_info")
        assert info["hosts"][0]["auth"] == "API token; password login as ops@pve where tokens are refused"
        session.ok("list_nodes")
        before = len(sim.lab.requests)
        session.ok("write_call_api", {"method": "PUT", "path": "/access/password", "confirm": True,
                                      "params": {"userid": "ops@pve", "password": "changed-password-4714"}})
        # strict=False: a background read may append to both lists between the two slices
        sent = list(zip(sim.lab.requests[before:], sim.lab.request_tokens[before:], strict=False))
    puts = [token for (product, method, path), token in sent if path == "/access/password"]
    assert puts == ["root@pam!admin", "ops@pve"]  # refused to the token, then done with the ticket
    assert ("pve", "POST", "/access/ticket") in [r for r, _ in sent]
    assert "changed-password-4714" not in (tmp_path / "audit.jsonl").read_text()


def test_the_simulator_wants_the_csrf_token_on_writes(sim):
    """What the client must get right, as real servers do it: the ticket alone reads, a write also
    needs the CSRF token that came with it."""
    import requests
    login = requests.post(sim.pve_url + "/api2/json/access/ticket", verify=str(sim.cert_file),
                          data={"username": "ops@pve", "password": "sim-ops-password-4711"}).json()["data"]
    cookie = {"Cookie": f"PVEAuthCookie={login['ticket']}"}
    url = sim.pve_url + "/api2/json/nodes/pve1/qemu/100/snapshot"
    assert requests.get(url, headers=cookie, verify=str(sim.cert_file)).status_code == 200
    refused = requests.post(url, headers=cookie, data={"snapname": "nocsrf"}, verify=str(sim.cert_file))
    assert refused.status_code == 401 and "csrf" in refused.reason.lower()
    done = requests.post(url, headers=cookie | {"CSRFPreventionToken": login["CSRFPreventionToken"]},
                         data={"snapname": "withcsrf"}, verify=str(sim.cert_file))
    assert done.status_code == 200 and done.json()["data"].startswith("UPID:")
