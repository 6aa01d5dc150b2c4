"""Shells: commands on nodes and the PBS host over verified SSH, in containers (pct exec), and
in VMs through the QEMU guest agent. Off by default (the exec gate), as safe as a shell can be
(ssh.py: verified host keys, the one quoting function, remote timeouts, cleaned and capped output,
the policy's admission step for every command); vmids and node names are checked by pattern before
use, and every answer is marked untrusted (it can carry prompt injection).
"""
import base64
import time
from typing import Annotated, Any, Callable

from mcp.server.mcpserver import Context
from pydantic import Field

from answers import ConfirmArg, DryRunArg, Host, Vmid
from config import SshTarget
from errors import InvalidArgument, ProxmoxError
from inventory import guest_path
from products import PRODUCTS
from proxmox_client import ProxmoxClient, poll, pve_client
from ssh import Result, admitted, clean_output, connect, run, sh_quote, target_for

MAX_FILE = 1024 * 1024  # bytes for guest file reads
# file-write takes at most 61,440 characters of content, which we send base64-encoded: 46,080 bytes
# (docs/PROXMOX-BEHAVIOUR.md#guest-agent)
MAX_FILE_WRITE = 61440 * 3 // 4


# ---------------------------------------------------------------- tools

Command = Annotated[str, Field(min_length=1, max_length=16384, description="run by sh -c")]
Timeout = Annotated[int, Field(ge=1, le=3600)]
Where = Annotated[str, Field(description="node or 'pbs'")]


def _where(where: str, host: str | None) -> tuple[SshTarget, str]:
    if where == "pbs":
        return target_for("pbs", host), "pbs"
    return target_for("pve", host), where


def ssh_check(where: Where, host: Host = None) -> dict:
    """Verified host key, user, version."""
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
    """Fixed checks over SSH: disks, ZFS, units, journal, SMART."""
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
    """A shell command, over SSH."""
    target, node = _where(where, host)
    result = admitted(target.product, target.label, ("exec", "elevated"), f"node {node}: {command}", [],
                      lambda: run(target, node, command, timeout=timeout))
    return result.answer(node=node)


def write_exec_guest(vmid: Vmid, command: Command, host: Host = None, timeout: Timeout = 30,
                     stdin: Annotated[str | None, Field(max_length=MAX_FILE)] = None,
                     dry_run: DryRunArg = False, confirm: ConfirmArg = False, ctx: Context | None = None) -> dict:
    """A shell command: a VM's by its agent, a container's by pct exec (SSH)."""
    client = pve_client(host)
    base, row = guest_path(client, vmid)
    if row["type"] == "lxc":
        return _exec_lxc(client, row, vmid, command, timeout, stdin)
    if stdin is not None:
        raise InvalidArgument(f"stdin goes to containers only; nothing was sent. For VM {vmid}, write the data to "
                              f"a file first (write_guest_file) and read it in the command.")
    return _exec_vm(client, base, vmid, command, timeout)


def _exec_lxc(client: ProxmoxClient, row: dict, vmid: int, command: str, timeout: int, stdin: str | None) -> dict:
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


def _exec_vm(client: ProxmoxClient, base: str, vmid: int, command: str, timeout: int) -> dict:
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


def write_guest_file(vmid: Vmid, path: GuestPath,
                     content: Annotated[str | None, Field(max_length=MAX_FILE_WRITE)] = None,
                     host: Host = None, dry_run: DryRunArg = False, confirm: ConfirmArg = False,
                     ctx: Context | None = None) -> dict:
    """Read a guest file (up to 1 MiB; sensitive), or replace it with content."""
    client = pve_client(host)
    base, row = guest_path(client, vmid)
    if content is None:
        return _read_guest_file(client, base, row, vmid, path)
    return _write_guest_file(client, base, row, vmid, path, content)


def _read_guest_file(client: ProxmoxClient, base: str, row: dict, vmid: int, path: str) -> dict:
    if row["type"] == "qemu":  # sensitive + exec, confirmed (gates.ALSO_GATES)
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


def _write_guest_file(client: ProxmoxClient, base: str, row: dict, vmid: int, path: str, content: str) -> dict:
    if row["type"] == "qemu":
        if len(content.encode()) > MAX_FILE_WRITE:
            raise InvalidArgument(f"The guest agent writes at most {MAX_FILE_WRITE} bytes per file; this content "
                                  f"is {len(content.encode())} bytes (UTF-8). Nothing was sent; fetch the file "
                                  f"inside the guest instead (write_exec_guest).")
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
