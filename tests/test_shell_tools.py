"""Shell tools against a REAL OpenSSH server on loopback (generated host and user keys, fake
pct, pveversion, proxmox-backup-manager and sudo on its PATH) and the guest agent path
against the simulator. The injection corpus runs through real bash and dash."""
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from conftest import in_process, log_dir, run_server, stdio_session

SSHD = "/usr/sbin/sshd"
pytestmark = pytest.mark.skipif((not os.path.exists(SSHD) or os.geteuid() != 0) and not os.environ.get("CI"),
                                 reason="needs openssh-server and root (to run sshd and add a dash user); "
                                        ".ci/run has both")

FAKE_PCT = r"""#!/bin/sh
# pct as docs/PROXMOX-BEHAVIOUR.md#lxc-exec-over-ssh describes it:
# exec passes exit codes through, a stopped CT fails with 255; a container with a root of its own
# (tests/fake_containers.py) runs the command chrooted there with a clean PATH, as lxc-attach does
root="$FAKE_ROOT"
case "$1" in
  exec) vmid="$2"; shift 2; [ "$1" = "--" ] && shift
        if [ "$vmid" = "103" ]; then echo "container '103' not running!" >&2; exit 255; fi
        if [ -x "$root/$vmid/bin/sh" ]; then PATH=/usr/sbin:/usr/bin:/sbin:/bin exec chroot "$root/$vmid" "$@"; fi
        exec "$@" ;;
  enter) PS1='ct# ' exec /bin/sh -i ;;
  pull) mkdir -p "$(dirname "$4")"; cat "$root/$2$3" > "$4" ;;
  push) mkdir -p "$(dirname "$root/$2$4")"; cat "$3" > "$root/$2$4" ;;
  *) echo "fake pct: unknown command $1" >&2; exit 2 ;;
esac
"""
FAKE_SUDO = """#!/bin/sh
[ "$1" = "-n" ] || { echo "sudo: a password is required" >&2; exit 1; }
shift; echo "via-sudo" >&2; exec "$@"
"""
SCRIPTS = {"pct": FAKE_PCT, "sudo": FAKE_SUDO,
           "pveversion": "#!/bin/sh\necho 'pve-manager/9.2.1/0d3f1c6ba8d1e2a7 (running kernel: 6.14.11-2-pve)'\n",
           "proxmox-backup-manager": "#!/bin/sh\necho 'proxmox-backup-server 4.2.1-1 running version: 4.2.1'\n",
           "qm": "#!/bin/sh\necho '{\"exitcode\":0,\"exited\":1,\"out-data\":\"ok\"}'\n"}
# A user whose login shell is dash, for the injection corpus: a name of this run's own, so that two test
# runs on one machine never share (or remove) each other's, and removed when the module ends.
DASH_USER = f"mcpdash{secrets.token_hex(4)}"
PROTECTED = [{"host": "lab", "vmid": 101, "name": "db", "reason": "the production database"},
             {"host": "lab", "vmid": 105, "name": "ci-runner", "reason": "runs the release pipeline"}]


def fingerprint(public_key: Path) -> str:
    out = subprocess.run(["ssh-keygen", "-lf", str(public_key), "-E", "sha256"], capture_output=True, text=True)
    return out.stdout.split()[1]


@pytest.fixture(scope="module")
def sshd():
    with fake_nodes() as info:
        yield info


@contextmanager
def fake_nodes() -> Iterator[dict]:
    """A real sshd for the module that opens it (the fixture `sshd`; other modules define theirs with this)."""
    # not under pytest's tmp (mode 0700): the unprivileged dash user must read keys and run scripts
    base = Path(tempfile.mkdtemp(prefix="mcp-sshd-"))
    base.chmod(0o755)
    for name in ("host", "user", "other"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(base / name)], check=True)
    (base / "authorized_keys").write_text((base / "user.pub").read_text())
    bin_dir = base / "bin"
    bin_dir.mkdir()
    for name, text in SCRIPTS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    fake_root = base / "guests"
    (fake_root / "102" / "etc").mkdir(parents=True)
    (fake_root / "102" / "etc" / "hostname").write_text("dns\n")
    # no home, no password, but not locked (sshd refuses "!")
    subprocess.run(["useradd", "-M", "-s", "/usr/bin/dash", "-p", "*", DASH_USER], check=True)
    try:
        yield from serve_sshd(base, bin_dir, fake_root)
    finally:
        shutil.rmtree(base, ignore_errors=True)
        subprocess.run(["userdel", DASH_USER], check=False)  # leave no system user behind


def serve_sshd(base: Path, bin_dir: Path, fake_root: Path):
    """An sshd on a free loopback port with the keys and scripts under `base`, until the module ends."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (base / "sshd_config").write_text(f"""Port {port}
ListenAddress 127.0.0.1
HostKey {base / 'host'}
PidFile {base / 'sshd.pid'}
AuthorizedKeysFile {base / 'authorized_keys'}
StrictModes no
UsePAM no
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
AllowUsers root {DASH_USER}
SetEnv PATH={bin_dir}:/usr/local/bin:/usr/bin:/bin FAKE_ROOT={fake_root} HOME={base}
Subsystem sftp internal-sftp
LogLevel ERROR
""")
    Path("/run/sshd").mkdir(exist_ok=True)
    log_file = log_dir() / "sshd.log"
    with open(log_file, "a") as log:
        def start() -> subprocess.Popen:
            process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(base / "sshd_config")], stdout=log, stderr=log)
            deadline = time.monotonic() + 20
            while True:  # readiness: the port accepts connections
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    return process
                except OSError:
                    assert process.poll() is None and time.monotonic() < deadline, log_file.read_text()[-500:]
                    time.sleep(0.05)
        info = {"port": port, "base": base, "fingerprint": fingerprint(base / "host.pub"), "root": fake_root,
                "process": start(), "start": start}
        try:
            yield info
        finally:
            info["process"].terminate()
            info["process"].wait(timeout=10)


def ssh_env(sim, sshd, tmp, user="root", **extra):
    port, pin = sshd["port"], sshd["fingerprint"]
    (tmp / "protected.json").write_text(json.dumps(PROTECTED))
    nodes = ",".join(f"pve{i}=127.0.0.1:{port}" for i in (1, 2, 3))
    # the README's split: the reader for reads, the operator token for writes (and a write tool's
    # agent reads the reader lacks: policy.sent_by_writer)
    operator = sim.lab.pve_tokens["ops@pve!operator"].secret
    return sim.env(pbs_token="root@pam!admin") | {
        "PROXMOX_LAB_WRITE_TOKEN": f"ops@pve!operator={operator}",
        "PROXMOX_ACCESS": "write", "PROXMOX_ALLOW_EXEC": "true", "PROXMOX_ALLOW_ELEVATED": "true",
        "PROXMOX_ALLOW_SENSITIVE": "true",  # guest file reads: sensitive + exec
        "PROXMOX_LAB_SSH_NODES": nodes, "PROXMOX_LAB_SSH_USER": user,
        "PROXMOX_LAB_SSH_KEY_FILE": str(sshd["base"] / "user"),
        "PROXMOX_LAB_SSH_FINGERPRINTS": ",".join(f"pve{i}={pin}" for i in (1, 2, 3)),
        "PBS_LAB_SSH_HOST": f"127.0.0.1:{port}", "PBS_LAB_SSH_KEY_FILE": str(sshd["base"] / "user"),
        "PBS_LAB_SSH_FINGERPRINT": pin, "PBS_LAB_SSH_USER": user,
        "PROXMOX_PROTECTED_VMS_FILE": str(tmp / "protected.json"), "PROXMOX_AUDIT_LOG": str(tmp / "audit.jsonl"),
    } | extra


@pytest.fixture(scope="module")
def shell(sim, sshd, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("shell")
    with stdio_session(ssh_env(sim, sshd, tmp), log_name="shell") as session:
        session.tmp = tmp
        yield session


# ---------------------------------------------------------------- connecting

def test_ssh_check_verifies_the_pinned_key(shell, sshd):
    node = shell.ok("ssh_check", {"where": "pve2"})
    assert node["fingerprint"] == sshd["fingerprint"] and node["user"] == "root"
    assert node["version"].startswith("pve-manager/9.2.1")
    pbs = shell.ok("ssh_check", {"where": "pbs"})
    assert "proxmox-backup-server 4.2.1" in pbs["version"]


def test_a_wrong_pin_is_refused_and_the_offered_key_shown(sim, sshd, tmp_path):
    other = fingerprint(sshd["base"] / "other.pub")
    env = ssh_env(sim, sshd, tmp_path, PROXMOX_LAB_SSH_FINGERPRINTS=",".join(f"pve{i}={other}" for i in (1, 2, 3)))
    with stdio_session(env, log_name="shell-wrong-pin") as session:
        message = session.error("ssh_check", {"where": "pve1"})
        assert "does not match the pinned fingerprint" in message and sshd["fingerprint"] in message
        assert "PROXMOX_LAB_SSH_FINGERPRINTS" in message


def test_a_changed_known_hosts_key_is_refused(sim, sshd, tmp_path):
    known = tmp_path / "known_hosts"
    key_type, key_data = (sshd["base"] / "other.pub").read_text().split()[:2]
    known.write_text(f"[127.0.0.1]:{sshd['port']} {key_type} {key_data}\n")
    env = ssh_env(sim, sshd, tmp_path, PROXMOX_LAB_SSH_KNOWN_HOSTS=str(known))
    env.pop("PROXMOX_LAB_SSH_FINGERPRINTS")
    with stdio_session(env, log_name="shell-changed") as session:
        message = session.error("ssh_check", {"where": "pve1"})
        assert "CHANGED" in message and sshd["fingerprint"] in message


def test_unverifiable_host_keys_stop_the_server(sim, sshd, tmp_path):
    env = ssh_env(sim, sshd, tmp_path)
    env.pop("PROXMOX_LAB_SSH_FINGERPRINTS")
    result = run_server(["--list-tools"], env)
    assert result.returncode == 2 and "never trusted on first use" in result.stderr


def test_exec_tools_need_the_gate_and_ssh(sim, sshd, tmp_path):
    def offered(env):
        with in_process(env, log_name="shell-offered") as session:
            return {t.name for t in session.tools()}
    base = ssh_env(sim, sshd, tmp_path)
    closed = offered(base | {"PROXMOX_ALLOW_EXEC": "false"})
    assert not {"write_exec_guest", "write_exec_node", "write_guest_file"} & closed
    assert {"ssh_check", "node_diagnostics"} <= closed
    no_ssh = offered({k: v for k, v in base.items() if "SSH" not in k})
    assert "write_exec_guest" in no_ssh and "ssh_check" not in no_ssh  # a VM's agent needs no SSH
    assert "write_exec_node" not in offered(base | {"PROXMOX_ALLOW_ELEVATED": "false"})


# ---------------------------------------------------------------- running

def test_node_exec_results_exit_codes_and_sudo(shell, sim, tmp_path, sshd):
    ok = shell.ok("write_exec_node", {"where": "pve1", "command": "echo hello; echo oops >&2; exit 3", "confirm": True})
    assert ok["stdout"] == "hello\n" and ok["stderr"] == "oops\n" and ok["exit_code"] == 3 and ok["untrusted"]
    env = ssh_env(sim, sshd, tmp_path, PROXMOX_LAB_SSH_SUDO="true")
    with stdio_session(env, log_name="shell-sudo") as session:
        result = session.ok("write_exec_node", {"where": "pve1", "command": "id -un", "confirm": True})
        assert result["stdout"] == "root\n" and "via-sudo" in result["stderr"]


def test_node_exec_needs_confirmation(shell):
    message = shell.error("write_exec_node", {"where": "pve1", "command": "reboot"})
    assert "confirm=true" in message


def test_timeout_signals_the_command(shell):
    result = shell.ok("write_exec_node", {"where": "pve1", "command": "echo start; sleep 30; echo never",
                                          "timeout": 1, "confirm": True})
    assert result["timed_out"] is True and result["stdout"] == "start\n" and "may still be running" in result["note"]


def test_huge_output_is_capped_and_escapes_stripped(shell):
    result = shell.ok("write_exec_node", {"where": "pve1", "confirm": True, "command":
                                          "printf '\\033[31mred\\033[0m\\n'; head -c 300000 /dev/zero | tr '\\0' x"})
    assert result["stdout"].startswith("red\n") and "\x1b" not in result["stdout"]
    assert result["truncated"] is True and len(result["stdout"]) == 64 * 1024


def test_private_keys_are_masked(shell, sshd):
    result = shell.ok("write_exec_node", {"where": "pve1", "command": f"cat {sshd['base'] / 'user'}", "confirm": True})
    assert "PRIVATE KEY-----***" in result["stdout"] and "b3BlbnNzaC1rZXkt" not in result["stdout"]


def test_lxc_exec_with_stdin_and_a_stopped_container(shell):
    result = shell.ok("write_exec_guest", {"vmid": 102, "command": "tr a-z A-Z", "stdin": "quiet\n", "confirm": True})
    assert result["stdout"] == "QUIET\n" and result["exit_code"] == 0 and result["node"] == "pve3"
    stopped = shell.ok("write_exec_guest", {"vmid": 103, "command": "true", "confirm": True})
    assert stopped["exit_code"] == 255 and "not running" in stopped["stderr"]
    assert "stdin goes to containers only" in shell.error("write_exec_guest", {"vmid": 100, "command": "cat",
                                                                              "stdin": "x", "confirm": True})


def test_protected_and_not_allowed_guests_are_refused(shell, sim, sshd, tmp_path):
    assert "release pipeline" in shell.error("write_exec_guest", {"vmid": 105, "command": "true", "confirm": True})
    message = shell.error("write_exec_guest", {"vmid": 101, "command": "id", "confirm": True})
    assert "protected" in message and "production database" in message
    env = ssh_env(sim, sshd, tmp_path, PROXMOX_EXEC_ALLOWED_VMIDS="102")
    with stdio_session(env, log_name="shell-allowed") as session:
        assert "PROXMOX_EXEC_ALLOWED_VMIDS" in session.error("write_exec_guest", {"vmid": 103, "command": "true",
                                                                                "confirm": True})
        assert "PROXMOX_EXEC_ALLOWED_VMIDS" in session.error("write_exec_guest", {"vmid": 100, "command": "id",
                                                                               "confirm": True})
        assert session.ok("write_exec_guest", {"vmid": 102, "command": "echo ok", "confirm": True})["stdout"] == "ok\n"


def test_guest_files_in_containers_and_vms(shell, sshd, sim):
    read = shell.ok("write_guest_file", {"vmid": 102, "path": "/etc/hostname", "confirm": True})
    assert read["content"] == "dns\n" and read["untrusted"]
    shell.ok("write_guest_file", {"vmid": 102, "path": "/etc/motd", "content": "secret-motd-text\n",
                                      "confirm": True})
    assert (sshd["root"] / "102" / "etc" / "motd").read_text() == "secret-motd-text\n"
    shell.ok("write_guest_file", {"vmid": 100, "path": "/etc/motd", "content": "vm motd\n", "confirm": True})
    assert sim.lab.guests[100]["files"]["/etc/motd"] == "vm motd\n"
    missing = shell.error("write_guest_file", {"vmid": 102, "path": "/nope", "confirm": True})
    assert "Reading /nope in container 102 failed" in missing


def test_vm_exec_through_the_guest_agent(shell, sim):
    result = shell.ok("write_exec_guest", {"vmid": 100, "command": "uname -a; exit 4", "confirm": True})
    assert result["exit_code"] == 4 and result["stdout"] == "ran: uname -a; exit 4\n" and result["untrusted"]
    sim.lab.guests[100]["agent_boot_pings"] = 1  # just booted: the first call times out, then it answers
    assert shell.ok("write_exec_guest", {"vmid": 100, "command": "true", "confirm": True})["exit_code"] == 0
    slow = shell.ok("write_exec_guest", {"vmid": 100, "command": "sleep 20", "timeout": 1, "confirm": True})
    assert slow["timed_out"] is True
    assert "not running" in shell.error("write_exec_guest", {"vmid": 104, "command": "true", "confirm": True})


def test_node_diagnostics_runs_fixed_commands(shell):
    report = shell.ok("node_diagnostics", {"where": "pve1"})
    assert {"disk", "zfs", "failed units", "journal errors", "memory", "smart"} <= set(report["sections"])
    assert "Filesystem" in report["sections"]["disk"] and report["untrusted"]


def test_audit_records_commands_but_never_stdin_or_content(shell):
    audit = (shell.tmp / "audit.jsonl").read_text()
    assert "tr a-z A-Z" in audit and "quiet" not in audit and "secret-motd-text" not in audit


# ---------------------------------------------------------------- the injection corpus

PAYLOADS = [
    "'", '"', "''", '""', "'\"'\"'", "\\", "\\'", "$HOME", "${HOME}", "$(id)", "`id`", "$((1+1))", "; id", "&& id",
    "|| id", "| id", "& id", "> /tmp/x", "< /etc/passwd", "2>&1", "a\nb", "a\r\nb", "\nid\n", "\t\ttab", "*", "?",
    "[a-z]", "~", "~root", "!!", "!$", "#comment", "-n", "--help", "-e \\x41", "--", "-", "a b  c", " lead", "trail ",
    "ünïcödé", "日本語", "🙂 emoji", "\u202eRTL", "\x1b[31mred", "\x07bell", "$'\\x41'", "{a,b}", "a=b id",
    "x" * 5000, "'$(id)'\"`id`\";id", "%s%n%x", "\\$(id)", "\"$(printf '\\x27')\"", ")(", "}{", "IFS=x",
]


def hexdump(text: str) -> str:
    return text.encode().hex()


@pytest.mark.parametrize("user", ["root", DASH_USER], ids=["bash", "dash"])
def test_injection_corpus_comes_out_literal(sim, sshd, tmp_path, user):
    assert len(PAYLOADS) >= 50
    import ssh
    env = ssh_env(sim, sshd, tmp_path, user=user)
    with stdio_session(env, log_name=f"shell-inject-{user}") as session:
        entry = subprocess.run(["getent", "passwd", user], capture_output=True, text=True).stdout
        shell_of = entry.split(":")[-1].strip()
        assert shell_of.endswith("bash" if user == "root" else "dash")
        for payload in PAYLOADS:
            command = f"printf %s {ssh.sh_quote(payload)} | od -v -An -tx1 | tr -d ' \\n'"
            for tool, target in (("write_exec_node", {"where": "pve1"}), ("write_exec_guest", {"vmid": 102})):
                result = session.ok(tool, target | {"command": command, "confirm": True})
                assert result["stdout"] == hexdump(payload), (tool, payload)
        message = session.error("write_exec_node", {"where": "pve1", "command": "echo a\x00b", "confirm": True})
        assert "NUL" in message


# ---------------------------------------------------------------- faults

def descendants(pid: int) -> list[int]:
    """The processes below `pid` (this module's sshd: its sessions and the commands they run), read
    from /proc, so that a test ends only what its own sshd started, never another run's by name."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def end_sessions(sshd) -> None:
    """Drop every connection to this module's sshd (its listener stays unless terminated too)."""
    for pid in descendants(sshd["process"].pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_connection_dropped_mid_command_is_a_clear_error(shell, sshd):
    import threading
    marker = "sleep 600"  # far beyond the call's timeout: only a dropped connection ends it sooner

    def cut_when_running() -> None:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:  # wait for the remote command to exist, then kill its session
            if any(marker in command_line(pid) for pid in descendants(sshd["process"].pid)):
                end_sessions(sshd)
                return
            time.sleep(0.05)
    cutter = threading.Thread(target=cut_when_running)
    cutter.start()
    message = shell.error("write_exec_node", {"where": "pve1", "command": marker, "timeout": 60, "confirm": True})
    cutter.join()
    assert "dropped while the command ran" in message
    assert shell.ok("write_exec_node", {"where": "pve1", "command": "echo back", "confirm": True})["stdout"] == "back\n"


def command_line(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_sshd_gone_is_a_clear_error_and_the_server_keeps_serving(shell, sshd):
    sessions = descendants(sshd["process"].pid)
    sshd["process"].terminate()
    sshd["process"].wait(timeout=10)
    for pid in sessions:  # the open session goes too
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        message = shell.error("ssh_check", {"where": "pve2"})
        assert "SSH to pve2" in message or "dropped" in message
        assert shell.ok("list_guests")["total"] >= 6  # the API side still serves
    finally:
        sshd["process"] = sshd["start"]()
    assert shell.ok("ssh_check", {"where": "pve2"})["user"] == "root"
