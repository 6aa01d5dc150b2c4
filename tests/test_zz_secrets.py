"""Runs last: no secret of the simulator or of the HTTP tests appears in any tool output or
server log written during the test run."""
from conftest import LOG_DIR

SECRETS = ["11111111-2222-3333-4444-555555555555", "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
           "99999999-8888-7777-6666-555555555555", "pbs-reader-secret-0123456789",
           "test-bearer-token-0123456789abcdef"]


def test_no_secret_in_any_output_or_log():
    logs = sorted(LOG_DIR.glob("*.log"))
    assert any(p.name == "tool-outputs.log" for p in logs)
    for path in logs:
        text = path.read_text(errors="replace")
        for secret in SECRETS:
            assert secret not in text, f"{secret[:6]}... found in {path.name}"
