"""What runs inside a guest, as the housekeeping tools (lxc_admin.py) and the updates (guest_updates.py)
drive it: the package manager (apt, apk, dnf, yum, pacman) and init system (systemd, OpenRC), detected
from /etc/os-release and what is installed; the commands for each, as argument lists; their outputs
read back. Commands reach a container through `pct exec` on its node (ssh.py: the one quoting
function, the policy's admission step for each); the names they carry follow allow-list patterns
whose first character cannot start an option, checked before anything is sent.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Annotated, Callable

from pydantic import Field

from config import SshTarget
from errors import InvalidArgument, ProxmoxError
from inventory import resolve_guest
from proxmox_client import ProxmoxClient
from ssh import Result, admitted, pct_exec, run, sh_quote, shell_step, target_for

# ---------------------------------------------------------------- names, by allow-list

PACKAGE = r"^[A-Za-z0-9][A-Za-z0-9+._:@=~-]{0,127}$"  # Debian, Alpine, RPM and Arch names, version pins
SERVICE = r"^[A-Za-z0-9][A-Za-z0-9@._:-]{0,127}$"  # systemd units (templates with @) and OpenRC scripts
USER = r"^[a-z_][a-z0-9_-]{0,31}$"  # what useradd accepts by default (NAME_REGEX)
ServiceName = Annotated[str, Field(pattern=SERVICE)]
UserName = Annotated[str, Field(pattern=USER)]


def allowed(kind: str, pattern: str, names: list[str]) -> list[str]:
    """Names checked against their allow-list before anything is sent (a list's items are checked here,
    so that the tool list carries no pattern per item)."""
    bad = [name for name in names if not isinstance(name, str) or not re.fullmatch(pattern, name)]
    if bad:
        raise InvalidArgument(f"{kind} {str(bad[0])[:60]!r} is refused: names are letters, digits and + . _ : @ = ~ -, "
                              f"starting with a letter or digit (never an option). Nothing was sent.")
    return names


def script(text: str, *arguments: str) -> list[str]:
    """argv that runs a fixed shell script in the guest with `arguments` as "$1", "$2"...: the values
    never become part of the script's text."""
    return ["/bin/sh", "-c", text, "sh", *arguments]


def joined(*commands: list[str]) -> str:
    """Commands as one script line, each argument quoted by the one quoting function."""
    return " && ".join(" ".join(sh_quote(argument) for argument in argv) for argv in commands)


# ---------------------------------------------------------------- package managers

@dataclass(frozen=True)
class Manager:
    """One package manager: its commands (argument lists; names are appended after `install` and
    `remove`) and how its list of pending upgrades reads."""
    name: str
    pending: list[str]  # what would be upgraded, from the package lists the guest has now
    refresh: list[str]
    upgrade: list[str]
    install: list[str]
    remove: list[str]
    parse: Callable[[str], list[dict]]


APT_ENV = ["env", "DEBIAN_FRONTEND=noninteractive"]
APT_QUIET = ["-y", "-q", "-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold"]


def _apt(text: str) -> list[dict]:
    """apt-get -s dist-upgrade: `Inst name [old] (new suite [arch])`; a new package has no [old]."""
    rows = []
    for match in re.finditer(r"^Inst (\S+)(?: \[([^\]]+)\])? \((\S+)", text, re.MULTILINE):
        rows.append({"name": match.group(1), "from": match.group(2) or "", "to": match.group(3)})
    return rows


def _apk(text: str) -> list[dict]:
    """apk version -l '<': `name-oldversion < newversion` (versions end in -rN)."""
    rows = []
    for match in re.finditer(r"^(\S+)-(\d[^-\s]*-r\d+)\s+<\s+(\S+)", text, re.MULTILINE):
        rows.append({"name": match.group(1), "from": match.group(2), "to": match.group(3)})
    return rows


def _rpm(text: str) -> list[dict]:
    """dnf/yum check-update: `name.arch  version  repo` (exit 100 when there are some)."""
    rows = []
    for match in re.finditer(r"^([A-Za-z0-9_+.-]+)\.(\w+)\s+(\S+)\s+\S+\s*$", text, re.MULTILINE):
        if match.group(1).lower() not in ("last", "obsoleting"):
            rows.append({"name": match.group(1), "from": "", "to": match.group(3)})
    return rows


def _pacman(text: str) -> list[dict]:
    """pacman -Qu: `name old -> new`."""
    return [{"name": m.group(1), "from": m.group(2), "to": m.group(3)}
            for m in re.finditer(r"^(\S+) (\S+) -> (\S+)", text, re.MULTILINE)]


def _rpm_manager(name: str) -> Manager:
    return Manager(name, [name, "-q", "check-update"], [name, "-q", "makecache"], [name, "-y", "-q", "upgrade"],
                   [name, "-y", "install", "--"], [name, "-y", "remove", "--"], _rpm)


MANAGERS = {
    "apt": Manager("apt", ["apt-get", "-s", "-q", "dist-upgrade"], ["apt-get", "update", "-q"],
                   [*APT_ENV, "apt-get", *APT_QUIET, "dist-upgrade"],
                   [*APT_ENV, "apt-get", *APT_QUIET, "install", "--"],
                   [*APT_ENV, "apt-get", *APT_QUIET, "remove", "--"], _apt),
    "apk": Manager("apk", ["apk", "version", "-l", "<"], ["apk", "update", "-q"], ["apk", "upgrade"], ["apk", "add"],
                   ["apk", "del"], _apk),
    "dnf": _rpm_manager("dnf"),
    "yum": _rpm_manager("yum"),
    "pacman": Manager("pacman", ["pacman", "-Qu"], ["pacman", "-Sy", "--noconfirm"], ["pacman", "-Syu", "--noconfirm"],
                      ["pacman", "-S", "--noconfirm", "--needed", "--"], ["pacman", "-R", "--noconfirm", "--"],
                      _pacman),
}
# /etc/os-release ID (or ID_LIKE) -> the manager that distribution uses (the binary found decides dnf or yum)
BY_DISTRIBUTION = {"debian": "apt", "ubuntu": "apt", "devuan": "apt", "alpine": "apk", "fedora": "dnf", "rhel": "dnf",
                   "centos": "dnf", "rocky": "dnf", "almalinux": "dnf", "ol": "dnf", "arch": "pacman",
                   "archlinux": "pacman", "manjaro": "pacman",
                   # the guest agent's get-osinfo gives the ID only (no ID_LIKE: qga commands-posix.c), so the
                   # common derivatives are named here
                   "linuxmint": "apt", "kali": "apt", "raspbian": "apt", "pop": "apt", "elementary": "apt",
                   "zorin": "apt", "neon": "apt", "parrot": "apt", "pureos": "apt", "amzn": "dnf",
                   "endeavouros": "pacman", "garuda": "pacman", "artix": "pacman", "cachyos": "pacman"}
# Upgrades worth naming: kernels (a VM needs a reboot for them), the C library, OpenSSL, OpenSSH, systemd
NOTABLE = re.compile(r"(linux-image|linux-lts|linux|kernel|kernel-core|pve-kernel|proxmox-kernel)([-.].*)?|libc6|glibc"
                     r"|musl|openssl|libssl\S*|openssh(-server)?|systemd")


def notable(rows: list[dict]) -> list[str]:
    return [f"{r['name']} {r['from']} -> {r['to']}".replace("  ", " ") for r in rows if NOTABLE.fullmatch(r["name"])]


# ---------------------------------------------------------------- init systems

@dataclass(frozen=True)
class Init:
    """One init system: the running services, a service's state, and the commands for each action."""
    name: str
    running: list[str]
    parse_running: Callable[[str], list[str]]
    status: Callable[[str], list[str]]
    actions: dict[str, Callable[[str], list[str]]]


def _systemd_running(text: str) -> list[str]:
    return sorted({line.split()[0].removesuffix(".service") for line in text.splitlines() if line.strip()})


def _openrc_running(text: str) -> list[str]:
    return sorted({m.group(1) for m in re.finditer(r"^\s*(\S+)\s+\[\s*started", text, re.MULTILINE)})


INITS = {
    "systemd": Init("systemd", ["systemctl", "list-units", "--type=service", "--state=running", "--no-legend",
                                "--plain", "--no-pager"], _systemd_running,
                    lambda name: ["systemctl", "show", "--no-pager",
                                  "--property=LoadState,ActiveState,SubState,UnitFileState", "--", name],
                    {action: (lambda name, action=action: ["systemctl", action, "--", name])
                     for action in ("start", "stop", "restart", "enable", "disable")}),
    "openrc": Init("openrc", ["rc-status", "--servicelist"], _openrc_running,
                   lambda name: ["rc-service", name, "status"],
                   {"start": lambda name: ["rc-service", name, "start"],
                    "stop": lambda name: ["rc-service", name, "stop"],
                    "restart": lambda name: ["rc-service", name, "restart"],
                    "enable": lambda name: ["rc-update", "add", name, "default"],
                    "disable": lambda name: ["rc-update", "del", name, "default"]}),
}

# ---------------------------------------------------------------- what a guest runs

INSPECT = r"""
if [ -r /etc/os-release ]; then
  while IFS= read -r line || [ -n "$line" ]; do printf 'os:%s\n' "$line"; done < /etc/os-release
fi
for m in apt-get apk dnf yum pacman; do command -v "$m" >/dev/null 2>&1 && printf 'pm:%s\n' "$m"; done
if [ -d /run/systemd/system ]; then echo init:systemd
elif command -v rc-service >/dev/null 2>&1; then echo init:openrc; fi
"""


@dataclass
class System:
    """What /etc/os-release and the installed tools say about a guest."""
    name: str  # PRETTY_NAME
    manager: Manager | None
    init: Init | None
    found: list[str] = field(default_factory=list)  # package managers installed

    def row(self) -> dict:
        return {"os": self.name, "package_manager": self.manager.name if self.manager else "none found",
                "init": self.init.name if self.init else "unknown"}


def read_system(text: str) -> System:
    """The INSPECT output as a System: the manager of the distribution (ID, then ID_LIKE) if it is
    installed, else the first one found."""
    release = {}
    for line in text.splitlines():
        key, _, value = line.removeprefix("os:").partition("=")
        if line.startswith("os:") and value:
            release[key] = value.strip().strip("\"'")
    found = [line[3:].replace("apt-get", "apt") for line in text.splitlines() if line.startswith("pm:")]
    init = next((INITS[line[5:]] for line in text.splitlines() if line.startswith("init:") and line[5:] in INITS), None)
    chosen = None
    for distribution in [release.get("ID", ""), *release.get("ID_LIKE", "").split()]:
        wanted = BY_DISTRIBUTION.get(distribution.lower())
        if wanted == "dnf" and "dnf" not in found and "yum" in found:
            wanted = "yum"
        if wanted in found:
            chosen = wanted
            break
    chosen = chosen or (found[0] if found else None)
    return System(release.get("PRETTY_NAME") or release.get("ID") or "unknown", MANAGERS.get(chosen or ""), init,
                  found)


def sections(text: str) -> dict[str, str]:
    """Output marked with `@@name` lines, by name."""
    parts: dict[str, str] = {}
    current = ""
    for line in text.splitlines(keepends=True):
        if line.startswith("@@"):
            current = line[2:].strip()
            parts[current] = ""
        else:
            parts[current] = parts.get(current, "") + line
    return parts


def upgrade_script(manager: Manager, before: str = "", after: str = "") -> str:
    """Refresh the package lists, then what is pending, the upgrade, and what is pending after: each in
    a section (`before` and `after` run first and last), the upgrade's exit status as the script's."""
    return (f"{before}{joined(manager.refresh)} || exit $?\necho @@before\n{joined(manager.pending)}\n"
            f"echo @@upgrade\n{joined(manager.upgrade)}; s=$?\necho @@after\n{joined(manager.pending)}\n{after}"
            f"exit $s\n")


def upgrade_label(manager: Manager) -> str:
    """How an upgrade is shown (audit, dry run, the user's question): the commands it runs."""
    return f"upgrade: {shlex.join(manager.refresh)}; {shlex.join(manager.upgrade)}"


def upgraded(before: list[dict], after: list[dict]) -> list[dict]:
    still = {r["name"] for r in after}
    return [r for r in before if r["name"] not in still]


# ---------------------------------------------------------------- a container, through pct

@dataclass
class Container:
    """A container and the node it runs on, reached over SSH with pct."""
    client: ProxmoxClient
    vmid: int
    node: str
    name: str
    status: str
    target: SshTarget

    @property
    def label(self) -> str:
        return self.client.host.label


def container(client: ProxmoxClient, vmid: int) -> Container:
    """A container by vmid (its node found as usual); a VM or a stopped container is refused with
    what to do instead."""
    row = resolve_guest(client, vmid)
    if row["type"] != "lxc":
        raise InvalidArgument(f"Guest {vmid} is a VM; these tools reach containers through pct. In a VM, use "
                              f"write_exec_guest (guest agent).")
    if row.get("status") != "running":
        raise InvalidArgument(f"Container {vmid} is {row.get('status')}; pct reaches running containers only. "
                              f"Start it first (write_power_guest action=start).")
    return Container(client, vmid, row["node"], str(row.get("name") or ""), row["status"],
                     target_for("pve", client.host.label))


def what(ct: Container, argv: list[str], label: str | None = None) -> str:
    """What the audit line, a dry run and the user's question show for a command in the container: the
    command itself, or for a fixed script its `label` (with the values it takes)."""
    return f"pct exec {ct.vmid}: {label or shlex.join(argv)}"


def step(ct: Container, argv: list[str], gates: tuple[str, ...], label: str | None = None,
         contents: bytes | None = None, secret: bool = False):
    """The policy's view of one command in the container (for a plan declared before the first write)."""
    return shell_step(what(ct, argv, label), gates, [ct.vmid], contents, secret=secret)


def run_in(ct: Container, argv: list[str], gates: tuple[str, ...], label: str | None = None, *,
           stdin: bytes | None = None, secret: bool = False, timeout: float | None = None) -> Result:
    """Run argv in the container once the policy admits it (the read gate for the fixed reads, exec
    for changes); a container that stopped meanwhile is a clear error."""
    line = pct_exec(ct.vmid, argv)
    result = admitted("pve", ct.label, gates, what(ct, argv, label), [ct.vmid],
                      lambda: run(ct.target, ct.node, line, timeout=timeout, stdin=stdin), contents=stdin,
                      secret=secret)
    if result.exit_code == 255 and "not running" in result.stderr:
        raise ProxmoxError(f"Container {ct.vmid} is not running (pct: {result.stderr.strip()[:200]}); start it "
                           f"first.")
    return result


def inspect(ct: Container) -> System:
    """The container's distribution, package manager and init system (one fixed read)."""
    result = run_in(ct, script(INSPECT), ("read",), "read /etc/os-release, the package manager and init", timeout=30)
    return read_system(result.stdout)


def pending(ct: Container, system: System) -> list[dict]:
    """What its package manager would upgrade, from the package lists the container has now (a read)."""
    manager = need_manager(ct.vmid, system)
    result = run_in(ct, manager.pending, ("read",), timeout=120)
    return manager.parse(result.stdout)


def running_services(ct: Container, system: System) -> list[str] | None:
    """The services running now, or None when the init system is unknown (a read)."""
    if system.init is None:
        return None
    result = run_in(ct, system.init.running, ("read",), timeout=30)
    return system.init.parse_running(result.stdout)


def need_manager(vmid: int, system: System) -> Manager:
    if system.manager is None:
        raise ProxmoxError(f"Guest {vmid} ({system.name}) has none of apt, apk, dnf, yum or pacman; its packages "
                           f"cannot be managed here.")
    return system.manager


def need_init(vmid: int, system: System) -> Init:
    if system.init is None:
        raise ProxmoxError(f"Guest {vmid} ({system.name}) runs neither systemd nor OpenRC (no /run/systemd/system, "
                           f"no rc-service); its services cannot be managed here.")
    return system.init
