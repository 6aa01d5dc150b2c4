"""The test run itself: it writes only inside pytest's temporary directory, and its end scans
every answer and log for secrets whatever tests ran (conftest.state_dir), so no test module has
to run last and any single file passes alone."""
from conftest import ROOT, SECRETS, log_dir, secrets_in


def test_the_logs_live_in_pytests_temporary_directory(tmp_path_factory):
    assert log_dir().is_relative_to(tmp_path_factory.getbasetemp())
    assert not log_dir().is_relative_to(ROOT)


def test_the_end_of_run_scan_finds_a_secret(tmp_path):
    # (not .log or .jsonl: the end of this run scans those, and must not find this one)
    clean, leaky = tmp_path / "clean.txt", tmp_path / "leaky.txt"
    clean.write_text("nothing to see\n")
    leaky.write_text(f'{{"params": "{SECRETS[0]}"}}\n')
    assert secrets_in([clean]) == []
    assert secrets_in([clean, leaky]) == [f"{SECRETS[0][:6]}... in {leaky}"]
