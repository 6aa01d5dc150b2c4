"""Runs last: no secret of the simulator or of the HTTP tests appears in any tool output,
server log or audit log written during the test run."""
from conftest import LOG_DIR

SECRETS = ["11111111-2222-3333-4444-555555555555", "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
           "99999999-8888-7777-6666-555555555555", "pbs-reader-secret-0123456789", "pbs-admin-secret-9876543210",
           "test-bearer-token-0123456789abcdef", "s3cret!", "hunter2",
           "sim-ops-password-4711", "sim-tfa-password-4712", "sim-pbs-password-4713", "not-the-password",
           # passwords and tickets of the login tests
           "from-a-file", "changed-password-4714", "PVE:ops@pve:", "PBS:ops@pbs:",
           # ACME DNS credentials, a scanned server's password, guest file contents (admission tests)
           "cf-secret-4711", "cf-4712", "guess-me-123", "root-password-in-a-file", "hunter2-secret"]


def test_no_secret_in_any_output_or_log(tmp_path_factory):
    logs = sorted(LOG_DIR.glob("*.log"))
    audits = sorted(tmp_path_factory.getbasetemp().rglob("*.jsonl"))
    assert any(p.name == "tool-outputs.log" for p in logs) and audits
    for path in logs + audits:
        text = path.read_text(errors="replace")
        for secret in SECRETS:
            assert secret not in text, f"{secret[:6]}... found in {path}"
