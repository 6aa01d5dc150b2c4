"""Shells: commands on nodes and the PBS host over verified SSH, in containers (pct exec), and
in VMs through the QEMU guest agent. Off by default (the exec gate), as safe as a shell can be:

- host keys are always verified (known_hosts or a pinned SHA256 fingerprint), never added;
- every argument that reaches a remote shell passes `sh_quote`, the one quoting function;
- vmids and node names are checked by pattern before use;
- every command runs under `timeout` on the remote side and has a local deadline;
- output is stripped of terminal escapes, private keys are masked, size is capped, and the
  answer is marked untrusted (it can carry prompt injection);
- every command passes the policy's one admission step (policy.admit: gates, protected guests,
  PROXMOX_EXEC_ALLOWED_VMIDS, dry run, the user's confirmation, audit); the audit line holds the
  command (masked), stdin and file contents only as size and hash.
"""
import base64
import re
import shlex
import socket
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Callable

from mcp.server.mcpserver import Context
from pydantic import Field

import policy
import runtime
from answers import ConfirmArg, DryRunArg, Host, Vmid
from config import NODE_NAME, SshTarget
from errors import InvalidArgument, ProxmoxError
from inventory import guest_path, resolve_guest
from masking import mask
from products import PRODUCTS
from proxmox_client import poll, pve_client

if TYPE_CHECKING:  # paramiko (8 MB, 60 ms) is imported on the first SSH connection, not at start
    import paramiko

MAX_OUTPUT = 64 * 1024  # characters kept of stdout and of stderr
MAX_FILE = 1024 * 1024  # bytes for guest file reads
# file-write takes at most 61,440 characters of content, which we send base64-encoded: 46,080 bytes
# (docs/PROXMOX-BEHAVIOUR.md#guest-agent)
MAX_FILE_WRITE = 61440 * 3 // 4


_targets = runtime.slot("shell_tools.targets", dict[tuple[str, str], SshTarget])  # (product, label) -> target


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


def clean_output(text: str) -> tuple[str, bool]:
    """Terminal escapes and control characters out, private keys masked, size capped."""
    text = CONTROL.sub("", ANSI.sub("", text.replace("\r\n", "\n")))
    text = mask(text)
    if len(text) > MAX_OUTPUT:
        return text[:MAX_OUTPUT], True
    return text, False


# ---------------------------------------------------------------- connections

class _VerifyHostKey:
    """paramiko's missing-host-key policy: accept a key that is not in known_hosts only when it
    matches the pinned fingerprint."""

    def __init__(self, pinned: str | None, where: str):
        self.pinned, self.where = pinned, where

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

    pin_variable = "_SSH_FINGERPRINTS"


# (product, label, node) -> an open connection, reused while it stays up
_connections = runtime.slot("shell_tools.connections", dict[tuple[str, str, str], "paramiko.SSHClient"])
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
        verify = _VerifyHostKey(target.fingerprints.get(node), f"{node} ({address}:{port})")
        verify.pin_variable = f"{prefix}_{PRODUCTS[target.product].ssh_pin_variable}"
        client.set_missing_host_key_policy(verify)
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


def admitted(product: str, label: str, gates: tuple[str, ...], what: str, guests: list[int],
             action: Callable[[], Any], contents: bytes | None = None) -> Any:
    """Run a shell `action` once the policy's admission step lets it: gates, protected guests,
    PROXMOX_EXEC_ALLOWED_VMIDS, dry run, confirmation and audit, as for every HTTP request."""
    decision = policy.shell_decision(what, gates, guests, f"runs: {what}", contents)
    return policy.admit(_ShellHost(product, label), "SSH", what, {}, lambda _: action(), decision=decision)


# ---------------------------------------------------------------- tools

Command = Annotated[str, Field(min_length=1, max_length=16384, description="run by sh -c")]
Timeout = Annotated[int, Field(ge=1, le=3600)]
Where = Annotated[str, Field(description="node or 'pbs'")]


def _where(where: str, host: str | None) -> tuple[SshTarget, str]:
    if where == "pbs":
        return target_for("pbs", host), "pbs"
    return target_for("pve", host), where


def ssh_check(where: Where, host: Host = None) -> dict:
    """To a node or PBS: verified host key, user, version."""
    target, node = _where(where, host)
    client = connect(target, node)  # the handshake verifies the host key; it runs nothing
    fingerprint = client.get_transport().get_remote_server_key().fingerprint
    command = "id -un; " + PRODUCTS[target.product].version_command
    result = admitted(target.product, target.label, ("read",), f"node {node}: {command}", [],
                      lambda: run(target, node, command, timeout=20))
    lines = result.stdout.splitlines()
    return {"node": node, "fingerprint": fingerprint, "user": lines[0] if lines else None,
            "version": " ".join(lines[1:])[:300] or result.stderr[:300], "exit_code": result.exit_code,
            "untrusted": True}


DIAGNOSTICS = """
echo '== disk'; df -hP -x tmpfs -x devtmpfs -x overlay 2>&1 | head -40
echo '== zfs'; if command -v zpool >/dev/null; then zpool status -x 2>&1 | head -40; else echo 'no zfs'; fi
echo '== failed units'; systemctl --failed --no-legend --plain 2>&1 | head -40
echo '== journal errors'; journalctl -p err -n 30 --no-pager -o short-iso -q 2>&1 | tail -30
echo '== memory'; free -m 2>&1; cat /proc/pressure/memory 2>/dev/null
echo '== smart'
if command -v smartctl >/dev/null; then
  for d in /dev/sd? /dev/nvme?n1; do
    [ -e "$d" ] && smartctl -H "$d" 2>&1 | grep -iE 'result|status' | sed "s|^|$d: |"
  done
else echo 'smartctl not installed'; fi
"""


def node_diagnostics(where: Where, host: Host = None) -> dict:
    """Fixed SSH checks of a node or PBS: disks, ZFS, units, journal, SMART."""
    target, node = _where(where, host)
    result = admitted(target.product, target.label, ("read",), f"node {node}: diagnostics", [],
                      lambda: run(target, node, DIAGNOSTICS, timeout=60))
    sections: dict[str, str] = {}
    current = "output"
    for line in result.stdout.splitlines():
        if line.startswith("== "):
            current = line[3:].strip()
            sections[current] = ""
        else:
            sections[current] = sections.get(current, "") + line + "\n"
    return {"node": node, "sections": {k: v.strip() for k, v in sections.items()}, "untrusted": True}


def write_exec_node(where: Where, command: Command, host: Host = None,
                    timeout: Timeout = 30, dry_run: DryRunArg = False, confirm: ConfirmArg = False,
                    ctx: Context | None = None) -> dict:
    """A shell command on a node or PBS, over SSH."""
    target, node = _where(where, host)
    result = admitted(target.product, target.label, ("exec", "elevated"), f"node {node}: {command}", [],
                      lambda: run(target, node, command, timeout=timeout))
    return result.answer(node=node)


def write_exec_lxc(vmid: Vmid, command: Command, host: Host = None, timeout: Timeout = 30,
                   stdin: Annotated[str | None, Field(max_length=MAX_FILE)] = None,
                   dry_run: DryRunArg = False, confirm: ConfirmArg = False, ctx: Context | None = None) -> dict:
    """A shell command, through pct exec."""
    client = pve_client(host)
    row = resolve_guest(client, vmid)
    if row["type"] != "lxc":
        raise InvalidArgument(f"Guest {vmid} is a VM; use write_exec_vm.")
    target = target_for("pve", client.host.label)
    line = f"pct exec {int(vmid)} -- /bin/sh -c {sh_quote(command)}"
    data = stdin.encode() if stdin is not None else None
    result = admitted("pve", client.host.label, ("exec",), f"pct exec {vmid}: {command}", [vmid],
                      lambda: run(target, row["node"], line, timeout=timeout, stdin=data), contents=data)
    return result.answer(vmid=vmid, node=row["node"])


# While a VM boots its agent is not up yet (docs/PROXMOX-BEHAVIOUR.md#guest-agent): worth waiting for.
AGENT_STARTING = ("QEMU guest agent is not running", "got timeout")


def _agent_call(call: Callable[[], Any], deadline: float) -> Any:
    """An agent call, repeated while the agent is still starting, until the deadline."""
    def attempt() -> tuple[Any, ProxmoxError | None]:
        try:
            return call(), None
        except ProxmoxError as exc:
            if not any(text in str(exc) for text in AGENT_STARTING):
                raise
            return None, exc
    (answer, starting), _ = poll(attempt, lambda outcome: outcome[1] is None, deadline - time.monotonic(), pause=2)
    if starting is not None:  # still starting at the deadline
        raise starting
    return answer


def _shell_wrapper(client: Any, base: str) -> list[str]:
    """`cmd.exe /c` on Windows (the agent reports id mswindows), else `/bin/sh -c`; an agent
    that answers with an error object instead of the OS gets the POSIX shell."""
    info = (client.get(f"{base}/agent/get-osinfo") or {}).get("result")
    windows = isinstance(info, dict) and info.get("id") == "mswindows"
    return ["cmd.exe", "/c"] if windows else ["/bin/sh", "-c"]


def write_exec_vm(vmid: Vmid, command: Command, host: Host = None, timeout: Timeout = 30,
                  dry_run: DryRunArg = False, confirm: ConfirmArg = False, ctx: Context | None = None) -> dict:
    """A shell command, through the guest agent."""
    client = pve_client(host)
    base, row = guest_path(client, vmid)
    if row["type"] != "qemu":
        raise InvalidArgument(f"Guest {vmid} is a container; use write_exec_lxc.")
    deadline = time.monotonic() + timeout
    wrapper = _agent_call(lambda: _shell_wrapper(client, base), deadline)
    started = _agent_call(lambda: client.request("POST", f"{base}/agent/exec", {"command": [*wrapper, command]}),
                          deadline)
    pid = started["pid"]
    status, exited = poll(lambda: client.get(f"{base}/agent/exec-status", pid=pid) or {},
                          lambda status: bool(status.get("exited")), deadline - time.monotonic(), pause=0.2, growth=1.5)
    if not exited:
        return Result(None, "", "", timed_out=True).answer(vmid=vmid, pid=pid)
    stdout, cut_out = clean_output(status.get("out-data", ""))
    stderr, cut_err = clean_output(status.get("err-data", ""))
    truncated = cut_out or cut_err or bool(status.get("out-truncated") or status.get("err-truncated"))
    return Result(status.get("exitcode", status.get("signal")), stdout, stderr, truncated=truncated).answer(vmid=vmid)


GuestPath = Annotated[str, Field(pattern=r"^/[^\x00]*$", max_length=4096)]


def write_get_guest_file(vmid: Vmid, path: GuestPath, host: Host = None, dry_run: DryRunArg = False,
                          confirm: ConfirmArg = False, ctx: Context | None = None) -> dict:
    """Reads a guest file, up to 1 MiB."""
    client = pve_client(host)
    base, row = guest_path(client, vmid)
    if row["type"] == "qemu":  # sensitive + exec, confirmed (policy.ALSO_GATES)
        data = client.get(f"{base}/agent/file-read", file=path) or {}
        content, truncated = clean_output(data.get("content", ""))
        return {"vmid": vmid, "path": path, "content": content, "truncated": truncated or bool(data.get("truncated")),
                "untrusted": True}
    target = target_for("pve", client.host.label)
    line = (f"t=$(mktemp) && pct pull {int(vmid)} {sh_quote(path)} \"$t\" && head -c {MAX_FILE} \"$t\"; "
            f"s=$?; rm -f \"$t\"; exit $s")
    result = admitted("pve", client.host.label, ("sensitive", "exec"), f"pct pull {vmid} {path}", [vmid],
                      lambda: run(target, row["node"], line, timeout=60))
    if result.exit_code != 0:
        raise ProxmoxError(f"Reading {path} in container {vmid} failed: {result.stderr.strip()[:300]}")
    return {"vmid": vmid, "path": path, "content": result.stdout, "truncated": result.truncated, "untrusted": True}


def write_put_guest_file(vmid: Vmid, path: GuestPath,
                           content: Annotated[str, Field(max_length=MAX_FILE_WRITE)],
                           host: Host = None, dry_run: DryRunArg = False, confirm: ConfirmArg = False,
                           ctx: Context | None = None) -> dict:
    """Writes (replaces) a guest file."""
    client = pve_client(host)
    base, row = guest_path(client, vmid)
    if row["type"] == "qemu":
        if len(content.encode()) > MAX_FILE_WRITE:
            raise InvalidArgument(f"The guest agent writes at most {MAX_FILE_WRITE} bytes per file; this content "
                                  f"is {len(content.encode())} bytes (UTF-8). Nothing was sent; fetch the file "
                                  f"inside the guest instead (write_exec_vm).")
        encoded = base64.b64encode(content.encode()).decode()
        client.request("POST", f"{base}/agent/file-write", {"file": path, "content": encoded, "encode": False})
        return {"vmid": vmid, "path": path, "bytes": len(content.encode()), "result": "ok"}
    target = target_for("pve", client.host.label)
    line = f"t=$(mktemp) && cat > \"$t\" && pct push {int(vmid)} \"$t\" {sh_quote(path)}; s=$?; rm -f \"$t\"; exit $s"
    result = admitted("pve", client.host.label, ("exec",), f"pct push {vmid} {path}", [vmid],
                      lambda: run(target, row["node"], line, timeout=60, stdin=content.encode()),
                      contents=content.encode())
    if result.exit_code != 0:
        raise ProxmoxError(f"Writing {path} in container {vmid} failed: {result.stderr.strip()[:300]}")
    return {"vmid": vmid, "path": path, "bytes": len(content.encode()), "result": "ok"}
