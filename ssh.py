"""SSH to the nodes and the Backup Server, as every shell tool reaches them (shell_tools.py,
terminals.py, lxc_admin.py, node_tools.py, guest_updates.py):

- host keys are always verified (known_hosts or a pinned SHA256 fingerprint), never added;
- every argument that reaches a remote shell passes `sh_quote`, the one quoting function;
- every command runs under `timeout` on the remote side and has a local deadline;
- output is stripped of terminal escapes, private keys are masked, size is capped;
- every command passes the policy's one admission step (`admitted`: policy.shell_decision, then
  policy.admit: gates, protected guests, PROXMOX_EXEC_ALLOWED_VMIDS, dry run, the user's
  confirmation, audit); the audit line holds the command (masked), stdin and file contents only as
  size and hash.
"""
import re
import shlex
import socket
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import policy
import runtime
from config import NODE_NAME, SshTarget
from errors import InvalidArgument, ProxmoxError
from masking import mask
from products import PRODUCTS

if TYPE_CHECKING:  # paramiko (8 MB, 60 ms) is imported on the first SSH connection, not at start
    import paramiko

MAX_OUTPUT = 64 * 1024  # characters kept of stdout and of stderr


_targets = runtime.slot("ssh.targets", dict[tuple[str, str], SshTarget])  # (product, label) -> target


def configure(targets: list[SshTarget]) -> None:
    _targets.set({(t.product, t.label): t for t in targets})


# ---------------------------------------------------------------- quoting and output

def sh_quote(argument: str) -> str:
    """The one quoting function for anything that reaches a remote shell: POSIX single quotes,
    safe in dash and bash. NUL cannot be passed in an argument at all, so it is refused."""
    if "\x00" in argument:
        raise InvalidArgument("A command or argument contains a NUL byte, which no shell argument can carry.")
    return shlex.quote(argument)


ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def clean_text(text: str) -> str:
    """Terminal escapes and control characters out (a stream read in pieces is masked by masking.StreamMask)."""
    return CONTROL.sub("", ANSI.sub("", text.replace("\r\n", "\n")))


def clean_output(text: str) -> tuple[str, bool]:
    """Terminal escapes and control characters out, private keys masked, size capped."""
    text = mask(clean_text(text))
    if len(text) > MAX_OUTPUT:
        return text[:MAX_OUTPUT], True
    return text, False


# ---------------------------------------------------------------- connections

class _VerifyHostKey:
    """paramiko's missing-host-key policy: accept a key that is not in known_hosts only when it
    matches the pinned fingerprint; a refusal names the variable that pins it (`pin_variable`)."""

    def __init__(self, pinned: str | None, where: str, pin_variable: str):
        self.pinned, self.where, self.pin_variable = pinned, where, pin_variable

    def missing_host_key(self, _client: "paramiko.SSHClient", _hostname: str, key: "paramiko.PKey") -> None:
        import paramiko
        offered = key.fingerprint
        if self.pinned and self.pinned == offered:
            return
        if self.pinned:
            what = "does not match the pinned fingerprint"
        else:
            what = "is unknown (not in known_hosts, none pinned)"
        raise paramiko.SSHException(
            f"Host key of {self.where} {what}: it offers {offered}. If that is really the node's key (compare with "
            f"`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` on it), pin it with {self.pin_variable}={offered} "
            f"or add it to the known_hosts file.")


# (product, label, node) -> an open connection, reused while it stays up
_connections = runtime.slot("ssh.connections", dict[tuple[str, str, str], "paramiko.SSHClient"])
_connections_lock = threading.Lock()


def target_for(product: str, label: str | None) -> SshTarget:
    targets = {k[1]: t for k, t in _targets.get().items() if k[0] == product}
    if label is None and len(targets) == 1:
        return next(iter(targets.values()))
    if label is None or label.lower() not in targets:
        facts = PRODUCTS[product]
        prefix = f"{facts.env_prefix}_<LABEL>_{facts.ssh_variable}"
        raise ProxmoxError(f"No SSH access is configured for {product.upper()} host {label or '(any)'}; "
                           f"set {prefix}. Configured: {', '.join(sorted(targets)) or 'none'}.")
    return targets[label.lower()]


def connect(target: SshTarget, node: str) -> "paramiko.SSHClient":
    """A verified connection to one node, reused while it stays up."""
    import paramiko
    if not NODE_NAME.match(node) or node not in target.nodes:
        raise InvalidArgument(f"No SSH address for node '{node}' of host '{target.label}'. "
                              f"Known: {', '.join(sorted(target.nodes)) or 'none'}.")
    key = (target.product, target.label, node)
    connections = _connections.get()
    with _connections_lock:
        client = connections.get(key)
        if client is not None and client.get_transport() is not None and client.get_transport().is_active():
            return client
        address, port = target.nodes[node]
        client = paramiko.SSHClient()
        if target.known_hosts:
            client.load_host_keys(target.known_hosts)
        prefix = PRODUCTS[target.product].host_prefix(target.label)
        client.set_missing_host_key_policy(_VerifyHostKey(target.fingerprints.get(node), f"{node} ({address}:{port})",
                                                          f"{prefix}_{PRODUCTS[target.product].ssh_pin_variable}"))
        try:
            client.connect(address, port=port, username=target.user, key_filename=target.key_file,
                           passphrase=target.key_passphrase, timeout=10, banner_timeout=10, auth_timeout=10,
                           allow_agent=target.key_file is None, look_for_keys=False)
        except paramiko.BadHostKeyException as exc:
            raise ProxmoxError(f"Host key of {node} ({address}:{port}) CHANGED: known_hosts has "
                               f"{exc.expected_key.fingerprint}, the server offers {exc.key.fingerprint}. Refused. "
                               f"If the node was reinstalled, update known_hosts; "
                               f"otherwise treat it as an attack.") from None
        except paramiko.AuthenticationException:
            raise ProxmoxError(f"SSH login as {target.user} on {node} failed: the key was refused. Check "
                               f"{prefix}_SSH_KEY_FILE and the node's "
                               f"authorized_keys.") from None
        except (paramiko.SSHException, socket.error, OSError) as exc:
            raise ProxmoxError(f"SSH to {node} ({address}:{port}) failed: {exc}") from None
        connections[key] = client
        return client


@dataclass
class Result:
    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    truncated: bool = False

    def answer(self, **extra: Any) -> dict:
        result: dict[str, Any] = {"exit_code": self.exit_code, "stdout": self.stdout, "stderr": self.stderr,
                                  "untrusted": True} | extra
        if self.truncated:
            result["truncated"] = True
        if self.timed_out:
            result["timed_out"] = True
            result["note"] = "The command hit its timeout; it was signalled but may still be running on the host."
        return result


def _forget(target: SshTarget, node: str) -> None:
    with _connections_lock:
        _connections.get().pop((target.product, target.label, node), None)


def _open_channel(target: SshTarget, node: str) -> "paramiko.Channel":
    """A session channel on the node's connection; a dropped connection is reopened once."""
    import paramiko
    for attempt in (1, 2):
        client = connect(target, node)
        try:
            return client.get_transport().open_session(timeout=10)
        except (paramiko.SSHException, EOFError, OSError, AttributeError):
            _forget(target, node)
            if attempt == 2:
                raise ProxmoxError(f"The SSH connection to {node} dropped and could not be reopened.") from None
    raise AssertionError("the second attempt returns or raises")


def _drain(receive: Callable[[int], bytes], buffer: bytearray) -> None:
    """Read what a channel stream has now (the channel times out after a second), keeping at most
    four times MAX_OUTPUT bytes."""
    try:
        while True:
            chunk = receive(32768)
            if not chunk:
                break
            if len(buffer) < MAX_OUTPUT * 4:
                buffer.extend(chunk)
    except socket.timeout:
        pass


def _collect(channel: "paramiko.Channel", deadline: float, out: bytearray, err: bytearray) -> bool:
    """Read stdout and stderr until the command exits, the channel closes or the deadline
    passes; True when the deadline passed."""
    while True:
        _drain(channel.recv, out)
        _drain(channel.recv_stderr, err)
        if channel.exit_status_ready() and not channel.recv_ready() and not channel.recv_stderr_ready():
            return False
        if channel.closed and not channel.exit_status_ready():
            return False
        if time.monotonic() > deadline:
            return True


def run(target: SshTarget, node: str, command: str, *, timeout: float | None = None,
        stdin: bytes | None = None) -> Result:
    """Run a shell command line on a node: remote `timeout` signals it, a local deadline closes
    the channel. A dropped connection is reopened once."""
    limit = timeout or target.timeout
    wrapped = f"timeout --signal=TERM --kill-after=5 {int(limit)} /bin/sh -c {sh_quote(command)}"
    if target.sudo:
        wrapped = "sudo -n " + wrapped
    channel = _open_channel(target, node)
    channel.settimeout(1.0)
    channel.exec_command(wrapped)
    if stdin is not None:
        channel.sendall(stdin)
    channel.shutdown_write()
    out, err = bytearray(), bytearray()
    timed_out = _collect(channel, time.monotonic() + limit + 7, out, err)
    exit_code = channel.recv_exit_status() if channel.exit_status_ready() else None
    if not timed_out and exit_code in (None, -1):  # paramiko's -1: the channel closed without an exit status
        _forget(target, node)
        raise ProxmoxError(f"The SSH connection to {node} dropped while the command ran; it may or may not "
                           f"have finished. Check its effect before running it again.")
    channel.close()
    if exit_code == 124:  # coreutils timeout: the command was signalled
        timed_out = True
    stdout, cut_out = clean_output(out.decode("utf-8", "replace"))
    stderr, cut_err = clean_output(err.decode("utf-8", "replace"))
    return Result(exit_code, stdout, stderr, timed_out, cut_out or cut_err or len(out) >= MAX_OUTPUT * 4)


# ---------------------------------------------------------------- the policy for shells

@dataclass
class _ShellHost:
    """What the policy needs to know about the host a shell runs on."""
    product: str
    label: str
    token_id: str = ""


def shell_step(what: str, gates: tuple[str, ...], guests: list[int], contents: bytes | None = None, *,
               secret: bool = False, standing: str | None = None, audit: dict | None = None,
               node_file: tuple[str, str] | None = None) -> policy.Decision:
    """A shell command as the policy judges it (a multi-step tool declares these before its first
    write: ProxmoxClient.plan); `secret` stdin (a password) is not audited at all; `audit` is what the
    audit line shows instead (a file sent: its size and SHA-256)."""
    decision = policy.shell_decision(what, gates, guests, f"runs: {what}", contents, secret=secret,
                                     standing=standing, node_file=node_file)
    if audit is not None:
        decision.audit_params = audit
    return decision


def admitted(product: str, label: str, gates: tuple[str, ...], what: str, guests: list[int],
             action: Callable[[], Any], contents: bytes | None = None, *, secret: bool = False,
             standing: str | None = None, audit: dict | None = None, node_file: tuple[str, str] | None = None) -> Any:
    """Run a shell `action` once the policy's admission step lets it: gates, protected guests,
    PROXMOX_EXEC_ALLOWED_VMIDS, dry run, confirmation and audit, as for every HTTP request; `node_file`:
    the (action, path) of a node's file (policy.shell_decision)."""
    decision = shell_step(what, gates, guests, contents, secret=secret, standing=standing, audit=audit,
                          node_file=node_file)
    return policy.admit(_ShellHost(product, label), "SSH", what, {}, lambda _: action(), decision=decision)


def pct_exec(vmid: int, argv: list[str]) -> str:
    """The node's command line that runs `argv` in a container, each argument quoted (pct exec hands
    them to the container's execve: no shell there unless argv starts one)."""
    return f"pct exec {int(vmid)} -- " + " ".join(sh_quote(argument) for argument in argv)


def open_pty(target: SshTarget, node: str, command: str | None, width: int = 160,
             height: int = 48) -> "paramiko.Channel":
    """An interactive channel with a terminal: the login shell (`command` None; `sudo -n -i` for a
    sudo target), or `command` (`pct enter <vmid>`). Nothing here times it out: terminals.py does."""
    channel = _open_channel(target, node)
    channel.get_pty(term="xterm", width=width, height=height)
    if command is None and not target.sudo:
        channel.invoke_shell()
    else:
        channel.exec_command(("sudo -n " if target.sudo else "") + (command or "-i"))
    return channel


def sftp(target: SshTarget, node: str) -> "paramiko.SFTPClient":
    """An SFTP session on the node's connection (as the SSH user: SFTP does not pass through sudo);
    a dropped connection is reopened once."""
    import paramiko
    for attempt in (1, 2):
        try:
            return connect(target, node).open_sftp()
        except (paramiko.SSHException, EOFError, OSError, AttributeError) as exc:
            _forget(target, node)
            if attempt == 2:
                raise ProxmoxError(f"SFTP to {node} failed ({exc}); is the SFTP subsystem enabled in its "
                                   f"sshd_config?") from None
    raise AssertionError("the second attempt returns or raises")
