"""The audit log that can fail, and the protected list that can be wrong.

Audit: a line is written before a request is sent (if it cannot be, nothing is sent); a line
after it that fails becomes a note in the answer; a write-enabled server that cannot write its
log does not start; --verify-audit finds altered, removed, cut-off and recomputed lines (the
head file). Protected list: both file forms, labels normalised, entries that name no configured
host and broken files reported by --check (non-zero), at start and by server_info."""
import json
from types import SimpleNamespace

import pytest

import audit
import calls
import policy
import privileges
import protection
import server
from conftest import run_server, stdio_session
from errors import PolicyError
from protection import load_protected
from settings import HostConfig, HostPolicy, Settings

PVE = SimpleNamespace(product="pve", label="lab", token_id="root@pam!admin", write_token_id=None)
OPEN = HostPolicy("destructive", frozenset({"exec", "elevated", "sensitive"}))


@pytest.fixture()
def audited(tmp_path):
    original = policy.settings()
    policy.configure(Settings(hosts={("pve", "lab"): OPEN}, audit_path=tmp_path / "audit.jsonl"))
    token = policy.CALL.set(calls.Call(tool="test", confirm=lambda *_: None))
    yield tmp_path / "audit.jsonl"
    policy.CALL.reset(token)
    policy.configure(original)


def start_guest(path="/nodes/pve1/qemu/103/status/start"):
    return ("POST", path, {})


# ---------------------------------------------------------------- before and after sending

def test_a_line_that_cannot_be_written_before_sending_refuses_the_request(audited):
    audited.mkdir()  # a directory where the log should be: no line can be appended
    sent = []
    with pytest.raises(PolicyError, match="NOT sent.*PROXMOX_AUDIT_LOG"):
        policy.admit(PVE, *start_guest(), sent.append)
    assert sent == []
    audited.rmdir()  # the secrets scan reads every *.jsonl the tests leave


def test_a_line_that_fails_after_sending_becomes_a_note_in_the_answer(audited):
    def send_then_lose_the_log(_decision):
        audited.unlink()
        audited.mkdir()  # the log vanished while the request ran
        return "UPID:pve1:0001:0001:0001:qmstart:103:root@pam:"

    def tool() -> dict:
        """A tool for the test."""
        return {"upid": policy.admit(PVE, *start_guest(), send_then_lose_the_log)}

    answer = json.loads(server.as_tool(tool)())
    assert answer["upid"].startswith("UPID:")
    assert "audit line could not be written" in answer["audit"] and "was sent" in answer["audit"]
    audited.rmdir()


def test_sending_and_sent_lines_bracket_every_request(audited):
    policy.admit(PVE, *start_guest(), lambda _decision: "UPID:x")
    lines = [json.loads(line) for line in audited.read_text().splitlines()]
    assert [line["verdict"] for line in lines] == ["sending", "sent"]
    assert lines[1]["result"] == "UPID:x" and "ms" in lines[1]
    assert audit.verify(audited) == (2, None, "2 lines, chain intact, head matches")


def test_a_dry_run_is_one_line_and_its_preview_reads_only_what_exists(audited):
    """The dry-run plan shows the current state with GETs the catalog has; it never makes up a GET
    that the policy then refuses (and logs as refused)."""
    import proxmox_client
    host = HostConfig("lab", "pve", "https://127.0.0.1:9", "dry@pam!run", "secret")
    client = proxmox_client.ProxmoxClient(host)
    client._send = lambda *_args, **_kwargs: {}  # the privileges read first, and the preview's reads
    policy.CALL.get().dry_run = True
    try:
        with pytest.raises(policy.DryRun):
            client.request("POST", "/nodes/pve1/vzdump", {"vmid": "103", "storage": "local"})
    finally:
        privileges.forget_permissions(host)
    lines = [json.loads(line) for line in audited.read_text().splitlines()]
    assert [(line["method"], line["verdict"]) for line in lines] == [("POST", "dry_run")]


def test_a_write_enabled_server_that_cannot_write_its_log_does_not_start(sim, tmp_path):
    (tmp_path / "file").write_text("")
    env = sim.env() | {"PROXMOX_ACCESS": "write", "PROXMOX_AUDIT_LOG": str(tmp_path / "file" / "audit.jsonl"),
                       "PROXMOX_PROTECTED_VMS_FILE": str(tmp_path / "none.json")}
    (tmp_path / "none.json").write_text("[]")
    result = run_server([], env)  # on stdio, its input empty
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if "audit log" in line]
    assert len(lines) == 1 and "PROXMOX_AUDIT_LOG" in lines[0]
    # a read-only server writes no audit line, so it starts (and ends with its client)
    reader = run_server([], env | {"PROXMOX_ACCESS": "read"})
    assert reader.returncode == 0 and "PROXMOX_AUDIT_LOG" not in reader.stderr


# ---------------------------------------------------------------- --verify-audit and the head

def write_lines(path, count=5):
    for i in range(count):
        audit.append(path, {"n": i, "verdict": "sent"})


def test_verify_finds_lines_cut_off_at_the_end(tmp_path):
    path = tmp_path / "audit.jsonl"
    write_lines(path)
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:3]) + "\n")
    count, bad, message = audit.verify(path)
    assert (count, bad) == (3, 4) and "cut off" in message


def test_verify_finds_a_recomputed_chain(tmp_path):
    path = tmp_path / "audit.jsonl"
    write_lines(path)
    forged, previous = [], audit.GENESIS
    for line in path.read_text().splitlines():
        record = json.loads(line)
        record.pop("hash")
        record["verdict"] = "refused"  # history rewritten, every hash recomputed
        record["prev"] = previous
        body = json.dumps(record, separators=(",", ":"))
        previous = audit._line_hash(previous, body.encode())
        forged.append(body[:-1] + f',"hash":"{previous}"}}')
    path.write_text("\n".join(forged) + "\n")
    count, bad, message = audit.verify(path)
    assert bad is not None and "rewritten" in message


def test_verify_needs_the_head(tmp_path):
    path = tmp_path / "audit.jsonl"
    write_lines(path, 2)
    audit.head_path(path).unlink()
    assert "head file" in audit.verify(path)[2] and audit.verify(path)[1] is not None


def test_a_head_recreated_for_a_log_that_had_lines_fails_verification(tmp_path):
    """Removing the head and the last lines, then letting the server write again, must not verify:
    a head started for a log that already had lines cannot rule out lines cut off before it."""
    path = tmp_path / "audit.jsonl"
    write_lines(path, 4)
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:2]) + "\n")  # the last two lines cut off ...
    audit.head_path(path).unlink()  # ... and the head that would tell
    audit.append(path, {"n": 9})  # the next write starts a new head from the log's current end
    count, bad, message = audit.verify(path)
    assert (count, bad) == (3, 3) and "started at line 2" in message and "cut off" in message
    verified = run_server(["--verify-audit"], {"PROXMOX_AUDIT_LOG": str(path)})
    assert verified.returncode == 1 and "started at line 2" in verified.stdout


def test_a_line_with_duplicated_keys_does_not_verify(tmp_path):
    """The hash covers the line's bytes as written: a key added twice (one parser reads the first,
    another the last) is an altered line."""
    path = tmp_path / "audit.jsonl"
    write_lines(path, 3)
    lines = path.read_text().splitlines()
    lines[1] = '{"verdict":"refused",' + lines[1][1:]  # the original "verdict":"sent" follows
    path.write_text("\n".join(lines) + "\n")
    assert audit.verify(path)[:2] == (2, 2)


def test_a_reformatted_line_does_not_verify(tmp_path):
    path = tmp_path / "audit.jsonl"
    write_lines(path, 2)
    lines = path.read_text().splitlines()
    lines[0] = lines[0].replace(",", ", ")  # the same record as a parser reads it, other bytes
    path.write_text("\n".join(lines) + "\n")
    assert audit.verify(path)[1] == 1


def test_the_log_and_its_head_are_readable_by_their_owner_only(tmp_path):
    path = tmp_path / "audit.jsonl"
    audit.open_log(path)
    write_lines(path, 2)
    assert path.stat().st_mode & 0o777 == 0o600
    assert audit.head_path(path).stat().st_mode & 0o777 == 0o600


def test_verify_audit_command_exit_codes(tmp_path):
    path = tmp_path / "audit.jsonl"
    write_lines(path)
    ok = run_server(["--verify-audit"], {"PROXMOX_AUDIT_LOG": str(path)})
    assert ok.returncode == 0 and "head matches" in ok.stdout
    path.write_text("\n".join(path.read_text().splitlines()[:-1]) + "\n")
    cut = run_server(["--verify-audit"], {"PROXMOX_AUDIT_LOG": str(path)})
    assert cut.returncode == 1 and "cut off" in cut.stdout


# ---------------------------------------------------------------- the protected list

@pytest.mark.parametrize("text", [
    '[{"host": "DEMO ", "vmid": 101, "name": "db", "reason": "prod"}]',
    '{"protected_vms": [{"host": "Demo", "vmid": "101", "name": "db", "reason": "prod"}]}',
])
def test_both_forms_of_the_list_with_labels_normalised(tmp_path, text):
    (tmp_path / "p.json").write_text(text)
    loaded = load_protected(tmp_path / "p.json")
    assert loaded.error is None and loaded.entries[0]["host"] == "demo" and loaded.entries[0]["vmid"] == 101
    assert loaded.find("demo", 101, "pve")["name"] == "db"
    assert loaded.problems({"demo"}) == []


@pytest.mark.parametrize("text", ['{"protected": []}', '[{"host": "demo"}]', '[{"vmid": 42}]', '[1, 2]',
                                  '{"protected_vms": {"vmid": 101}}'])
def test_a_broken_list_fails_closed(tmp_path, text):
    (tmp_path / "p.json").write_text(text)
    loaded = load_protected(tmp_path / "p.json")
    assert loaded.error and not loaded.entries
    assert "could not be read" in loaded.problems({"demo"})[0]


def test_an_entry_naming_no_configured_host_is_reported():
    protected = protection.Protected([protection._entry({"host": "prod", "vmid": 101}),
                                      protection._entry({"host": "*", "vmid": 102})])
    assert protected.unknown_hosts({"lab"}) == [{"host": "prod", "vmid": 101}]
    assert "names host 'prod'" in protected.problems({"lab"})[0] and len(protected.problems({"lab"})) == 1


def test_check_start_and_server_info_report_the_protected_list(sim, tmp_path):
    good, stray, broken = tmp_path / "good.json", tmp_path / "stray.json", tmp_path / "broken.json"
    good.write_text('{"protected_vms": [{"host": "LAB", "vmid": 101, "name": "db", "reason": "prod"}]}')
    stray.write_text('[{"host": "lab", "vmid": 101}, {"host": "prod", "vmid": 100, "reason": "typo"}]')
    broken.write_text('[{"host": "lab", "vmid": 101')
    base = sim.env() | {"PROXMOX_AUDIT_LOG": str(tmp_path / "audit.jsonl")}
    assert run_server(["--check"], base | {"PROXMOX_PROTECTED_VMS_FILE": str(good)}).returncode == 0
    for path, expected in ((stray, "names host 'prod'"), (broken, "could not be read")):
        checked = run_server(["--check"], base | {"PROXMOX_PROTECTED_VMS_FILE": str(path)})
        assert checked.returncode == 1 and expected in checked.stdout, checked.stdout
    started = run_server(["--list-tools"], base | {"PROXMOX_PROTECTED_VMS_FILE": str(stray)})
    assert "PROTECTED GUEST LIST" in started.stderr and "names host 'prod'" in started.stderr
    with stdio_session(base | {"PROXMOX_PROTECTED_VMS_FILE": str(stray)}, log_name="audit-info") as session:
        info = session.ok("server_info")
        assert len(info["protected_guests"]) == 2 and "names host 'prod'" in info["protected_list_problems"][0]


def test_a_log_written_before_the_hash_covered_the_bytes_still_verifies(tmp_path):
    """Lines of earlier versions hash the parsed record (keys sorted); they verify, a key given twice does not."""
    path, previous, lines = tmp_path / "audit.jsonl", audit.GENESIS, []
    for n in range(3):
        record = {"n": n, "verdict": "sent", "prev": previous}
        record["hash"] = previous = audit._legacy_hash(previous, record)
        lines.append(json.dumps(record, separators=(",", ":")))
    path.write_text("\n".join(lines) + "\n")
    audit.head_path(path).write_text(json.dumps({"hash": previous, "count": 3}))
    assert audit.verify(path) == (3, None, "3 lines, chain intact, head matches")
    path.write_text("\n".join([lines[0], '{"verdict":"refused",' + lines[1][1:], lines[2]]) + "\n")
    assert audit.verify(path)[1] == 2
