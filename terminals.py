"""Interactive terminals over verified SSH: a node's login shell, or `pct enter <vmid>` on a
container's node, for the programs that want a terminal (an interactive upgrade, a TUI, a prompt).

Opening one is a confirmed request like write_exec_node (a node shell: exec + elevated) or
write_exec_guest (a container: exec, protected guests refused, PROXMOX_EXEC_ALLOWED_VMIDS). What
is typed into it is a write too (write_terminal_send): each send passes the admission step with
the terminal's gates and guests, is audited by size and SHA-256 (never the keys), and needs no new
question: the user's yes to the terminal stands for what is typed into it while it is open, for
the principal who opened it (policy.grant_standing). Nobody else can read or type into it.

At most MAX_OPEN are open per server; each keeps the last KEEP bytes of output; one idle (nothing
sent: reading is no use, docs/REVIEW-SECURITY.md F09) for IDLE_SECONDS is closed, one open for
policy.STANDING_SECONDS (as long as the yes stands) too, and all are closed when the server stops. Output is read
back as it appeared since the last read, terminal escapes and control characters stripped, masked
as one stream (masking.StreamMask: a secret cut between two reads is masked whole, what may still be
part of one waits for the rest; docs/REVIEW-SECURITY.md F08), bounded and marked untrusted.
"""

import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Callable, Literal

from mcp.server.mcpserver import Context
from pydantic import Field

import policy
import runtime
from answers import ConfirmArg, DryRunArg, Host, OptionalVmid, iso_time, table
from errors import InvalidArgument, ProxmoxError
from inventory import resolve_guest
from proxmox_client import pve_client
from masking import StreamMask
from ssh import admitted, clean_text, open_pty, target_for

if TYPE_CHECKING:
    import paramiko

MAX_OPEN = 8
IDLE_SECONDS = 15 * 60
KEEP = 1024 * 1024  # bytes of output kept per terminal
READ_MAX = 16 * 1024  # bytes one read returns at most (the rest waits for the next)
SETTLE = 0.3  # seconds without new output after which a waiting read answers
# Named keys (what an xterm sends for each)
SPECIALS = {"Enter": "\r", "Tab": "\t", "Backspace": "\x7f", "Esc": "\x1b", "Ctrl-C": "\x03", "Ctrl-D": "\x04",
            "Ctrl-Z": "\x1a", "Ctrl-L": "\x0c", "Up": "\x1b[A", "Down": "\x1b[B", "Right": "\x1b[C", "Left": "\x1b[D"}
Special = Literal["Enter", "Tab", "Backspace", "Esc", "Ctrl-C", "Ctrl-D", "Ctrl-Z", "Ctrl-L", "Up", "Down", "Right",
                  "Left"]
TerminalId = Annotated[str, Field(pattern=r"^t[0-9a-f]{6}$")]
# an escape sequence cut off at the end of what arrived so far: kept for the next read
PARTIAL_ESCAPE = re.compile(rb"\x1b(\[[0-?]*[ -/]*|\][^\x07\x1b]*|)\Z")


@dataclass
class Terminal:
    id: str
    where: str  # in words: "the login shell on pve1", "pct enter 102 on pve3"
    product: str
    label: str
    gates: tuple[str, ...]
    guests: list[int]
    principal: Any
    channel: "paramiko.Channel"
    opened: float
    used: float  # the last send (idle since then)
    buffer: bytearray = field(default_factory=bytearray)
    start: int = 0  # the stream offset of buffer[0] (what scrolled out before is gone)
    read_to: int = 0  # the stream offset up to which output was returned
    ended: str | None = None  # why no more output comes (the shell exited)
    revoke: Callable[[], None] = lambda: None  # takes back the standing yes the opening gave
    masker: StreamMask = field(default_factory=StreamMask)  # its output masked as one stream
    changed: threading.Condition = field(default_factory=threading.Condition)

    @property
    def end(self) -> int:
        return self.start + len(self.buffer)

    def row(self, now: float) -> dict:
        return {"terminal": self.id, "where": self.where, "opened": iso_time(time.time() - (now - self.opened)),
                "idle_s": int(now - self.used), "unread_bytes": self.end - max(self.read_to, self.start),
                "state": self.ended or "open"}


@dataclass
class Registry:
    """One server's terminals; `clock` is what idle time is measured with (a test moves it)."""
    open: dict[str, Terminal] = field(default_factory=dict)
    closed: dict[str, str] = field(default_factory=dict)  # id -> why, for the last few
    lock: threading.Lock = field(default_factory=threading.Lock)
    clock: Callable[[], float] = time.monotonic
    reaper: threading.Thread | None = None
    stopping: threading.Event = field(default_factory=threading.Event)


_registry = runtime.slot("terminals.registry", Registry)


def _keep_output(terminal: Terminal) -> None:
    """The terminal's reader thread: output into the buffer (the last KEEP bytes) until the channel ends."""
    channel = terminal.channel
    while True:
        try:
            data = channel.recv(32768)
        except OSError:
            data = b""
        with terminal.changed:
            if not data:
                status = channel.recv_exit_status() if channel.exit_status_ready() else None
                terminal.ended = terminal.ended or (f"ended (exit {status})" if status is not None else "ended")
                terminal.changed.notify_all()
                return
            terminal.buffer.extend(data)
            if len(terminal.buffer) > KEEP:
                cut = len(terminal.buffer) - KEEP
                del terminal.buffer[:cut]
                terminal.start += cut
            terminal.changed.notify_all()


def _close(registry: Registry, terminal: Terminal, why: str) -> None:
    registry.open.pop(terminal.id, None)
    registry.closed[terminal.id] = why
    while len(registry.closed) > 20:
        registry.closed.pop(next(iter(registry.closed)))
    terminal.revoke()
    with terminal.changed:
        terminal.ended = terminal.ended or why
        terminal.changed.notify_all()
    terminal.channel.close()  # sshd hangs the shell up


def _expire(registry: Registry) -> None:
    """Close the terminals idle for IDLE_SECONDS, and those whose yes no longer stands."""
    now = registry.clock()
    with registry.lock:
        for terminal in list(registry.open.values()):
            if now - terminal.used >= IDLE_SECONDS:
                _close(registry, terminal, f"closed after {IDLE_SECONDS // 60} minutes idle")
            elif now - terminal.opened >= policy.STANDING_SECONDS:
                _close(registry, terminal, f"closed {policy.STANDING_SECONDS // 60} minutes after it was opened")


def _reap(registry: Registry) -> None:
    """Each server's reaper: its idle terminals closed about every half minute."""
    while not registry.stopping.wait(30):
        _expire(registry)


def close_all(why: str = "closed: the server stopped") -> None:
    """Every terminal of this server closed (server.serve calls it when the server stops)."""
    registry = _registry.get()
    registry.stopping.set()
    with registry.lock:
        for terminal in list(registry.open.values()):
            _close(registry, terminal, why)


def _mine(terminal_id: str, use: bool = False) -> tuple[Registry, Terminal]:
    """An open terminal of this caller (another principal's is not there for it), idle ones closed
    first; `use`: a send, which is what keeps it from idling (a read is not)."""
    registry = _registry.get()
    _expire(registry)
    terminal = registry.open.get(terminal_id)
    if terminal is None or terminal.principal != policy.current_call().principal:
        why = registry.closed.get(terminal_id) if terminal is None else None
        raise InvalidArgument(f"Terminal {terminal_id} is not open" + (f" ({why})" if why else "") +
                              "; terminal_read without terminal lists the open ones, write_open_terminal opens one.")
    if use:
        terminal.used = registry.clock()
    return registry, terminal


# ---------------------------------------------------------------- tools

def _target(where: str | None, vmid: int | None, host: Host) -> tuple[Any, str, str | None, tuple[str, ...], list[int],
                                                                     str]:
    """(SSH target, node, command, gates, guests, in words) of the terminal a call asks for."""
    if (where is None) == (vmid is None):
        raise InvalidArgument("Give where (a node, or 'pbs', for its login shell) or vmid (a container, for pct "
                              "enter), not both. Nothing was sent.")
    if vmid is not None:
        client = pve_client(host)
        row = resolve_guest(client, vmid)
        if row["type"] != "lxc" or row.get("status") != "running":
            raise InvalidArgument(f"Guest {vmid} is a {'VM' if row['type'] == 'qemu' else 'stopped container'}; pct "
                                  f"enter reaches running containers only. Nothing was sent.")
        target = target_for("pve", client.host.label)
        return target, row["node"], f"pct enter {int(vmid)}", ("exec",), [vmid], \
            f"pct enter {vmid} on {row['node']}"
    product = "pbs" if where == "pbs" else "pve"
    target = target_for(product, host)
    return target, where, None, ("exec", "elevated"), [], f"the login shell on {where}"


def write_open_terminal(where: Annotated[str | None, Field(description="node or 'pbs': its shell")] = None,
                        vmid: OptionalVmid = None, host: Host = None, dry_run: DryRunArg = False,
                        confirm: ConfirmArg = False, ctx: Context | None = None) -> dict:
    """A node's shell, or pct enter on a container (vmid); closed after 15 min idle."""
    target, node, command, gates, guests, words = _target(where, vmid, host)
    registry = _registry.get()
    _expire(registry)
    if len(registry.open) >= MAX_OPEN:
        raise InvalidArgument(f"{MAX_OPEN} terminals are open ({', '.join(registry.open)}), the most there can be; "
                              f"close one with write_terminal_send close=true. Nothing was sent.")
    channel = admitted(target.product, target.label, gates, f"open a terminal: {words}", guests,
                       lambda: open_pty(target, node, command))
    now = registry.clock()
    terminal = Terminal(f"t{secrets.token_hex(3)}", words, target.product, target.label, gates, guests,
                        policy.current_call().principal, channel, now, now)
    terminal.revoke = policy.grant_standing(f"terminal:{terminal.id}", lambda: registry.clock())
    with registry.lock:
        registry.open[terminal.id] = terminal
    threading.Thread(target=_keep_output, args=(terminal,), name=f"terminal-{terminal.id}", daemon=True).start()
    if registry.reaper is None:
        registry.reaper = threading.Thread(target=_reap, args=(registry,), daemon=True, name="terminal-reaper")
        registry.reaper.start()
    return {"terminal": terminal.id, "where": words, "next": "write_terminal_send types, terminal_read reads"}


def write_terminal_send(terminal: TerminalId, keys: Annotated[str, Field(max_length=4096)] = "",
                        press: list[Special] | None = None, close: bool = False,
                        dry_run: DryRunArg = False, confirm: ConfirmArg = False, ctx: Context | None = None) -> dict:
    """Type into a terminal: keys (text), then press (named keys); close: hang it up after."""
    if len(press or []) > 32:
        raise InvalidArgument("press takes at most 32 keys per call. Nothing was sent.")
    data = (keys + "".join(SPECIALS[name] for name in press or [])).encode()
    if not data:
        if close:
            return _hang_up(terminal)
        raise InvalidArgument("Give keys (text), press (named keys, e.g. [\"Enter\"]) or close=true. Nothing was "
                              "sent.")
    _, term = _mine(terminal, use=True)
    if term.ended:
        raise ProxmoxError(f"Terminal {terminal} has {term.ended}; close it with write_terminal_send close=true.")
    admitted(term.product, term.label, term.gates, f"terminal {term.id} ({term.where}): keys", term.guests,
             lambda: term.channel.sendall(data), contents=data, standing=f"terminal:{term.id}")
    if close:
        return _hang_up(terminal) | {"sent_bytes": len(data)}
    return {"terminal": term.id, "sent_bytes": len(data)}


def _take(term: Terminal) -> tuple[bytes, int]:
    """What appeared since the last read (at most READ_MAX bytes, never half a character or escape
    sequence), and how many bytes scrolled out unread before it."""
    begin = max(term.read_to, term.start)
    dropped = begin - term.read_to
    chunk = bytes(term.buffer[begin - term.start:begin - term.start + READ_MAX])
    if not term.ended:  # what may still be completed by the next bytes waits for them
        partial = PARTIAL_ESCAPE.search(chunk[-64:])
        if partial:
            chunk = chunk[:len(chunk) - (len(chunk[-64:]) - partial.start())]
        cut = len(chunk)
        while cut and chunk[cut - 1] & 0xC0 == 0x80:
            cut -= 1
        if cut and chunk[cut - 1] >= 0xC0:  # a lead byte whose sequence is incomplete
            chunk = chunk[:cut - 1]
    term.read_to = begin + len(chunk)
    return chunk, dropped


def _wait_for_output(term: Terminal, seconds: float) -> None:
    """Until output arrives and then pauses (SETTLE), the terminal ends, or `seconds` pass."""
    deadline = time.monotonic() + seconds
    with term.changed:
        while term.end <= max(term.read_to, term.start) and not term.ended and time.monotonic() < deadline:
            term.changed.wait(deadline - time.monotonic())
        while not term.ended and time.monotonic() < deadline:
            seen = term.end
            term.changed.wait(min(SETTLE, deadline - time.monotonic()))
            if term.end == seen:
                return


def terminal_read(terminal: TerminalId | None = None,
                  wait: Annotated[int, Field(ge=0, le=60, description="s for output")] = 2) -> dict:
    """Output since the last read (<=16 KiB); no terminal: the open ones."""
    if terminal is None:
        registry = _registry.get()
        _expire(registry)
        now = registry.clock()
        mine = [t.row(now) for t in registry.open.values() if t.principal == policy.current_call().principal]
        return table(["terminal", "where", "opened", "idle_s", "unread_bytes", "state"], mine) | {
            "most": MAX_OPEN, "idle_close_s": IDLE_SECONDS}
    _, term = _mine(terminal)
    _wait_for_output(term, wait)
    with term.changed:
        chunk, dropped = _take(term)
        more = term.end > term.read_to
        text = term.masker.feed(clean_text(chunk.decode("utf-8", "replace")), final=bool(term.ended) and not more)
    answer = {"terminal": term.id, "output": text, "state": term.ended or "open", "untrusted": True}
    if more:
        answer["more"] = True
    if dropped:
        answer["dropped_bytes"] = dropped
        answer["note"] = f"{dropped} bytes scrolled out unread before this (the last {KEEP // 1024} KiB are kept)"
    return answer


def _hang_up(terminal: str) -> dict:
    """Close a terminal (its shell is hung up), judged as any request on it."""
    registry, term = _mine(terminal)
    admitted(term.product, term.label, term.gates, f"terminal {term.id} ({term.where}): close", term.guests,
             lambda: None, standing=f"terminal:{term.id}")
    with registry.lock:
        _close(registry, term, "closed by write_terminal_send close=true")
    return {"terminal": term.id, "result": "closed"}
