"""--check and --demo, as a user runs them."""
from conftest import run_server, stdio_session


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
