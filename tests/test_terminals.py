"""Interactive terminals (terminals.py) against the suite's real sshd: a node's login shell (bash) and
`pct enter` (the fake pct's dash). Opening asks for the user's yes; what is typed is audited by size and
hash only and asks nothing more; output comes back cleaned and bounded; eight at most, closed after 15
minutes without a send, 60 minutes after opening and when the server stops; nobody but the principal
who opened one reaches it."""
import json
import os
import time

import pytest

import calls
import policy
import terminals
from conftest import User, in_process, stdio_session
from test_shell_tools import SSHD, command_line, descendants, fake_nodes, ssh_env

pytestmark = pytest.mark.skipif((not os.path.exists(SSHD) or os.geteuid() != 0) and not os.environ.get("CI"),
                                reason="needs openssh-server and root (to run sshd); .ci/run has both")


@pytest.fixture(scope="module")
def sshd():
    with fake_nodes() as info:
        yield info


@pytest.fixture(scope="module")
def tty(sim, sshd, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("terminals")
    with in_process(ssh_env(sim, sshd, tmp) | {"PROXMOX_TOOLSETS": "all"}, log_name="terminals") as session:
        session.tmp = tmp
        yield session
        with session.installed():
            terminals.close_all()


def opened(session, **where) -> str:
    return session.ok("write_open_terminal", where | {"confirm": True})["terminal"]


def until(session, terminal: str, text: str, reads: int = 10) -> str:
    """What the terminal shows until `text` appears (each read waits for output to pause)."""
    seen = ""
    for _ in range(reads):
        seen += session.ok("terminal_read", {"terminal": terminal, "wait": 5})["output"]
        if text in seen:
            return seen
    raise AssertionError(f"{text!r} never appeared: {seen[-500:]!r}")


def registry(session) -> terminals.Registry:
    with session.installed():
        return terminals._registry.get()


def test_a_node_shell_types_reads_and_strips_escapes(tty):
    term = opened(tty, where="pve1")
    tty.ok("write_terminal_send", {"terminal": term, "keys": "echo hello-$((6*7)); printf '\\033[31mred\\033[0m\\n'",
                                   "press": ["Enter"]})
    seen = until(tty, term, "red")
    assert "hello-42" in seen and "\x1b" not in seen and "\r" not in seen
    tty.ok("write_terminal_send", {"terminal": term, "keys": "sleep 600", "press": ["Enter"]})
    tty.ok("write_terminal_send", {"terminal": term, "press": ["Ctrl-C"]})
    tty.ok("write_terminal_send", {"terminal": term, "keys": "echo abc", "press": ["Left", "Left"]})
    tty.ok("write_terminal_send", {"terminal": term, "keys": "X", "press": ["Enter"]})
    assert "aXbc" in until(tty, term, "aXbc")  # the arrows moved the cursor; Ctrl-C ended the sleep
    tty.ok("write_terminal_send", {"terminal": term, "keys": "ech", "press": ["Tab"]})
    tty.ok("write_terminal_send", {"terminal": term, "keys": " completed", "press": ["Enter"]})
    assert "completed" in until(tty, term, "\ncompleted")
    assert tty.ok("write_terminal_send", {"terminal": term, "close": True})["result"] == "closed"
    assert "is not open (closed by write_terminal_send close=true)" in tty.error("terminal_read", {"terminal": term})


def test_pct_enter_reaches_the_container_and_its_refusals(tty):
    term = opened(tty, vmid=102)
    listed = tty.ok("terminal_read", {})
    row = dict(zip(listed["columns"], next(r for r in listed["rows"] if r[0] == term), strict=True))
    assert row["where"] == "pct enter 102 on pve3" and row["state"] == "open"
    tty.ok("write_terminal_send", {"terminal": term, "keys": "echo in-$((1+1))-ct", "press": ["Enter"]})
    assert "in-2-ct" in until(tty, term, "in-2-ct")
    tty.ok("write_terminal_send", {"terminal": term, "close": True})
    assert "release pipeline" in tty.error("write_open_terminal", {"vmid": 105, "confirm": True})  # protected
    assert "is a VM" in tty.error("write_open_terminal", {"vmid": 100, "confirm": True})
    assert "not both" in tty.error("write_open_terminal", {"where": "pve1", "vmid": 102, "confirm": True})
    assert "confirm=true" in tty.error("write_open_terminal", {"where": "pve1"})
    plan = tty.ok("write_open_terminal", {"where": "pve1", "dry_run": True})
    assert plan["gate"] == "exec+elevated" and plan["needs_confirmation"] is True
    assert term not in registry(tty).open and len(registry(tty).open) == 0


def test_keys_are_audited_by_size_and_keyed_hash_never_verbatim(tty):
    term = opened(tty, where="pve2")
    secret_keys = "echo typed-4242-marker"
    tty.ok("write_terminal_send", {"terminal": term, "keys": secret_keys, "press": ["Enter"]})
    until(tty, term, "\ntyped-4242-marker")
    tty.ok("write_terminal_send", {"terminal": term, "close": True})
    lines = [json.loads(x) for x in (tty.tmp / "audit.jsonl").read_text().splitlines()]
    sends = [x for x in lines if x["path"] == f"terminal {term} (the login shell on pve2): keys"]
    assert sends and all(set(x["params"]["contents"]) == {"bytes", "hmac_sha256"} for x in sends)
    assert "typed-4242-marker" not in (tty.tmp / "audit.jsonl").read_text()
    assert any(x["path"] == "open a terminal: the login shell on pve2" and x["verdict"] == "sent" for x in lines)


def test_eight_at_most_and_closed_after_fifteen_idle_minutes(tty):
    opened_ids = [opened(tty, where="pve3") for _ in range(terminals.MAX_OPEN)]
    assert "8 terminals are open" in tty.error("write_open_terminal", {"where": "pve3", "confirm": True})
    kept = registry(tty)
    clock = kept.clock
    try:
        kept.clock = lambda: clock() + terminals.IDLE_SECONDS + 1  # a quarter of an hour passes, nobody types
        assert tty.ok("terminal_read", {})["total"] == 0
        assert "closed after 15 minutes idle" in tty.error("write_terminal_send", {"terminal": opened_ids[0],
                                                                                  "keys": "x"})
    finally:
        kept.clock = clock
    assert opened(tty, where="pve3")  # room again


def test_reading_is_no_use_and_typing_keeps_a_terminal_for_sixty_minutes_at_most(tty):
    """docs/REVIEW-SECURITY.md F09: only a send keeps a terminal from idling, and none keeps it (nor the
    yes that stands for what is typed) beyond policy.STANDING_SECONDS."""
    read, typed = opened(tty, where="pve1"), opened(tty, where="pve2")
    kept = registry(tty)
    clock, offset = kept.clock, [0.0]
    kept.clock = lambda: clock() + offset[0]
    try:
        for _ in range(4):  # 56 minutes: a send every 14
            offset[0] += 14 * 60
            tty.ok("write_terminal_send", {"terminal": typed, "keys": "true", "press": ["Enter"]})
        assert "closed after 15 minutes idle" in tty.error("terminal_read", {"terminal": read, "wait": 0})
        offset[0] += 5 * 60
        assert "closed 60 minutes after it was opened" in tty.error("write_terminal_send", {"terminal": typed,
                                                                                           "keys": "true"})
    finally:
        kept.clock = clock


def test_output_is_kept_to_one_mib_and_read_in_bounded_pieces(tty):
    term = opened(tty, where="pve1")
    tty.ok("write_terminal_send", {"terminal": term, "press": ["Enter"],  # the echo of the line shows EN""D
                                   "keys": "head -c 1500000 /dev/zero | tr '\\0' x; echo; echo EN\"\"D"})
    kept = registry(tty).open[term]
    with kept.changed:  # the output arrives while nobody reads: only the last MiB is kept
        assert kept.changed.wait_for(lambda: b"\nEND" in kept.buffer[-200:], timeout=60)
    first = tty.ok("terminal_read", {"terminal": term, "wait": 0})
    assert first["dropped_bytes"] > 0 and "scrolled out unread" in first["note"] and first["more"] is True
    assert len(first["output"]) <= terminals.READ_MAX and set(first["output"]) <= {"x"}
    assert len(kept.buffer) <= terminals.KEEP
    tty.ok("write_terminal_send", {"terminal": term, "close": True})


def test_another_principal_neither_reads_nor_types(tty):
    term = opened(tty, where="pve1")
    with tty.installed():
        token = policy.CALL.set(calls.Call(tool="terminal_read", principal="mallory"))
        try:
            with pytest.raises(Exception, match="is not open"):
                terminals.terminal_read(terminal=term, wait=0)
            assert terminals.terminal_read()["total"] == 0  # nor sees it listed
            with pytest.raises(Exception, match="is not open"):
                terminals.write_terminal_send(terminal=term, keys="id")
        finally:
            policy.CALL.reset(token)
    tty.ok("write_terminal_send", {"terminal": term, "close": True})


def test_the_node_shell_needs_the_elevated_gate(sim, sshd, tmp_path):
    env = ssh_env(sim, sshd, tmp_path) | {"PROXMOX_TOOLSETS": "all", "PROXMOX_ALLOW_ELEVATED": "false"}
    with in_process(env, log_name="terminals-no-elevated") as session:
        assert "'elevated' gate" in session.error("write_open_terminal", {"where": "pve1", "confirm": True})
        term = session.ok("write_open_terminal", {"vmid": 102, "confirm": True})["terminal"]  # a container's: exec
        session.ok("write_terminal_send", {"terminal": term, "close": True})


@pytest.mark.mcp
@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_opening_is_asked_typing_is_not_and_the_shell_ends_with_the_server(sim, sshd, tmp_path, mode):
    user = User()
    user.answers = ["accept"]
    marker = f"sleep {6000 + (mode == 'auto')}"
    with stdio_session(ssh_env(sim, sshd, tmp_path) | {"PROXMOX_TOOLSETS": "all"}, mode=mode,
                       log_name=f"terminals-{mode}", elicitation_callback=user) as session:
        term = session.ok("write_open_terminal", {"where": "pve1"})["terminal"]
        assert len(user.asked) == 1 and "EXEC + ELEVATED" in user.asked[0] and "login shell on pve1" in user.asked[0]
        session.ok("write_terminal_send", {"terminal": term, "keys": marker, "press": ["Enter"]})
        session.ok("write_terminal_send", {"terminal": term, "keys": "x"})
        assert len(user.asked) == 1  # the yes to the terminal stands for what is typed into it
        deadline = time.monotonic() + 20
        while not any(marker in command_line(pid) for pid in descendants(sshd["process"].pid)):
            assert time.monotonic() < deadline, "the command never started"
            session.ok("terminal_read", {"terminal": term, "wait": 1})
    deadline = time.monotonic() + 20  # the server stopped: its shells were hung up
    while any(marker in command_line(pid) for pid in descendants(sshd["process"].pid)):
        assert time.monotonic() < deadline, "the terminal's shell outlived the server"
        time.sleep(0.1)
