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
