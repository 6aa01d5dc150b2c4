"""The command line as a user runs it: --check, --demo, the start of --http, and what its errors name."""
import socket

import pytest

from conftest import in_process, run_server, stdio_session


def test_check_reports_version_identity_and_privileges(sim):
    result = run_server(["--check"], sim.env())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PVE host 'lab'" in result.stdout and "version: 9.2.1" in result.stdout
    assert "token mcp@pve!reader" in result.stdout and "Sys.Audit" in result.stdout
    assert "PBS host 'lab'" in result.stdout and "Datastore.Audit" in result.stdout
    assert "access tier: read" in result.stdout
    assert sim.lab.pve_tokens["mcp@pve!reader"].secret not in result.stdout + result.stderr


def test_check_flags_a_token_without_privileges_and_failures(sim):
    result = run_server(["--check"], sim.env(pve_token="mcp@pve!empty", pbs=False))
    assert "NONE" in result.stdout and "privsep" in result.stdout
    env = sim.env() | {"PROXMOX_LAB_TOKEN": "mcp@pve!reader=wrong-secret-value"}
    failed = run_server(["--check"], env)
    assert failed.returncode == 1 and "FAILED" in failed.stdout and "wrong-secret-value" not in failed.stdout


def test_demo_serves_a_simulated_lab_with_no_proxmox():
    with stdio_session({}, args=["--demo"], log_name="demo") as demo:
        hosts = demo.ok("list_hosts")
        assert {row[0] for row in hosts["rows"]} == {"demo"}
        assert demo.ok("list_guests")["total"] == 6
        assert demo.ok("cluster_status")["cluster"] == "homelab"


def test_check_warns_of_a_certificate_that_expires_within_30_days(sim, tmp_path):
    import simulator
    assert "certificate: expires" in run_server(["--check"], sim.env()).stdout  # the lab's has a year
    with simulator.Simulator(simulator.Lab.homelab()) as own:
        own.serve_certificate(*simulator.make_certificate(tmp_path, days=9))
        result = run_server(["--check"], own.env())
    assert result.returncode == 0, result.stdout + result.stderr
    warning = next(line for line in result.stdout.splitlines() if "PVE renews" in line)
    assert "warning: the certificate expires" in warning and ("(in 8 days)" in warning or "(in 9 days)" in warning)
    assert "PROXMOX_LAB_FINGERPRINT pins this certificate" in warning and "PROXMOX_LAB_CA_FILE" in warning
def test_check_runs_the_start_ups_audit_log_probe(sim, tmp_path):
    """--check says so (and exits 1) when the server would not start: here a write-enabled server
    whose audit log cannot be written."""
    (tmp_path / "file").write_text("")
    env = sim.env() | {"PROXMOX_ACCESS": "write", "PROXMOX_AUDIT_LOG": str(tmp_path / "file" / "audit.jsonl")}
    checked = run_server(["--check"], env)
    assert checked.returncode == 1
    assert [line for line in checked.stdout.splitlines() if "WOULD NOT START" in line] == [
        f"WOULD NOT START: cannot write the audit log {tmp_path / 'file' / 'audit.jsonl'} (File exists); set "
        f"PROXMOX_AUDIT_LOG to a file this user can write, or allow no writes (PROXMOX_ACCESS=read)."]
    assert run_server(["--check"], env | {"PROXMOX_AUDIT_LOG": str(tmp_path / "audit.jsonl")}).returncode == 0


def test_a_busy_port_is_one_line_naming_the_port_and_the_variable(sim):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = sim.env() | {"MCP_AUTH_TOKEN": "test-bearer-token-0123456789abcdef", "MCP_HTTP_PORT": str(port)}
        by_variable = run_server(["--http"], env, timeout=30)
        by_option = run_server(["--http", "--port", str(port)], env, timeout=30)
    assert by_variable.returncode == by_option.returncode == 2
    assert f"port {port} on 127.0.0.1 is in use" in by_variable.stderr and "MCP_HTTP_PORT" in by_variable.stderr
    assert "with --port" in by_option.stderr
    assert "serving" not in by_variable.stderr + by_option.stderr  # nothing claimed to serve first
    named = [line for line in by_variable.stderr.splitlines() if str(port) in line][0]
    assert named.startswith("proxmox-guard-mcp: port")


@pytest.mark.parametrize("label", ["lab", "default"])
def test_a_refused_token_names_the_variable_it_came_from(sim, tmp_path, label):
    token = tmp_path / "token"
    token.write_text("mcp@pve!reader=00000000-0000-0000-0000-000000000000\n")
    prefix = "PROXMOX_LAB_" if label == "lab" else "PROXMOX_"
    env = {f"{prefix}URL": sim.pve_url, f"{prefix}FINGERPRINT": sim.fingerprint, f"{prefix}TOKEN_FILE": str(token)}
    with in_process(env, log_name=f"token-file-{label}") as session:
        message = session.error("list_nodes")
    assert "the API token was refused" in message and f"Check {prefix}TOKEN_FILE;" in message


def test_check_reads_the_write_tokens_privileges_too(sim, tmp_path):
    """A wrong PROXMOX_<LABEL>_WRITE_TOKEN fails --check (exit 1, naming the variable), not the first write."""
    secret = sim.lab.pve_tokens["ops@pve!operator"].secret
    right = run_server(["--check"], sim.env() | {"PROXMOX_LAB_WRITE_TOKEN": f"ops@pve!operator={secret}"})
    line = next(line for line in right.stdout.splitlines() if "write token" in line)
    assert right.returncode == 0 and "write token ops@pve!operator: privileges on" in line and "VM.PowerMgmt" in line
    (tmp_path / "write-token").write_text("ops@pve!operator=00000000-0000-0000-0000-000000000000\n")
    wrong = run_server(["--check"], sim.env() | {"PROXMOX_LAB_WRITE_TOKEN_FILE": str(tmp_path / "write-token")})
    line = next(line for line in wrong.stdout.splitlines() if "write token" in line)
    assert wrong.returncode == 1 and "FAILED" in line and "Check PROXMOX_LAB_WRITE_TOKEN_FILE" in line
    assert secret not in right.stdout + wrong.stdout
