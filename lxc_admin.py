"""Container housekeeping through pct on the container's node: packages, services and users,
for apt, apk, dnf/yum and pacman and for systemd and OpenRC (guest_os.py detects which). Names
follow allow-list patterns whose first character cannot start an option; every argument passes the
one quoting function; a password travels on stdin only and is never audited; sshd settings are
checked with `sshd -t` before the reload, and the previous file is put back when it refuses them.
Fixed reads (what is pending, running, a service's state) run at the read gate, like
node_diagnostics; every change is exec, confirmed. Outputs are cleaned, masked and untrusted.
"""
import re
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context
from pydantic import Field

from answers import ConfirmArg, DryRunArg, Host, Vmid, table
from errors import InvalidArgument
from guest_os import (PACKAGE, Container, ServiceName, System, UserName, allowed, container, inspect, need_init,
                      need_manager, notable, pending, running_services, run_in, script, sections, upgrade_label,
                      upgrade_script, upgraded)
from masking import register_secret
from proxmox_client import pve_client
from ssh import Result

TAIL = 40  # lines of a command's output an answer shows (the end, where errors are)


def _tail(text: str) -> str:
    return "\n".join(text.splitlines()[-TAIL:])


def _outcome(result: Result) -> dict:
    answer = {"exit_code": result.exit_code, "output": _tail(result.stdout), "errors": _tail(result.stderr),
              "untrusted": True}
    return {k: v for k, v in answer.items() if v not in ("", None)} | {"exit_code": result.exit_code}


# ---------------------------------------------------------------- packages

def _list(ct: Container, system: System) -> dict:
    rows = pending(ct, system)
    return {"upgradable": table(["name", "from", "to"], rows), "notable": notable(rows),
            "note": "from the package lists the container has now; upgrade refreshes them first"}


def _upgrade(ct: Container, system: System) -> dict:
    manager = need_manager(ct.vmid, system)
    result = run_in(ct, script(upgrade_script(manager)), ("exec",), upgrade_label(manager), timeout=3600)
    parts = sections(result.stdout)
    before, after = manager.parse(parts.get("before", "")), manager.parse(parts.get("after", ""))
    done = upgraded(before, after) if result.exit_code == 0 else []
    return {"upgraded": len(done), "packages": table(["name", "from", "to"], done), "notable": notable(done),
            "still_pending": len(after)} | _outcome(Result(result.exit_code, parts.get("upgrade", result.stdout),
                                                             result.stderr))


def _change_packages(ct: Container, system: System, action: str, names: list[str]) -> dict:
    if not names:
        raise InvalidArgument(f"action={action} needs names, e.g. names=[\"nginx\"]. Nothing was sent.")
    manager = need_manager(ct.vmid, system)
    argv = (manager.install if action == "install" else manager.remove) + names
    return {"names": names} | _outcome(run_in(ct, argv, ("exec",), timeout=1800))


def write_lxc_packages(vmid: Vmid, action: Literal["list", "upgrade", "install", "remove"],
                       names: list[str] | None = None, host: Host = None,
                       dry_run: DryRunArg = False, confirm: ConfirmArg = False, ctx: Context | None = None) -> dict:
    """A container's packages (apt, apk, dnf, yum, pacman)."""
    names = allowed("package", PACKAGE, (names or [])[:51])
    if len(names) > 50:
        raise InvalidArgument("names takes at most 50 packages per call. Nothing was sent.")
    ct = container(pve_client(host), vmid)
    system = inspect(ct)
    answer = {"vmid": vmid} | system.row()
    if action == "list":
        return answer | _list(ct, system) | {"untrusted": True}
    if action == "upgrade":
        return answer | _upgrade(ct, system)
    return answer | _change_packages(ct, system, action, names)


# ---------------------------------------------------------------- services

def _systemd_state(text: str) -> dict:
    """`systemctl show --property=...`: KEY=value lines."""
    values = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {"loaded": values.get("LoadState"), "active": values.get("ActiveState"), "sub": values.get("SubState"),
            "enabled": values.get("UnitFileState")}


def _state(ct: Container, system: System, name: str) -> dict:
    init = need_init(ct.vmid, system)
    result = run_in(ct, init.status(name), ("read",), timeout=30)
    if init.name == "systemd":
        return {"state": _systemd_state(result.stdout)}
    return {"state": {"status": _tail(result.stdout).strip() or _tail(result.stderr).strip(),
                      "running": result.exit_code == 0}}


def write_lxc_services(vmid: Vmid, action: Literal["list", "status", "start", "stop", "restart", "enable", "disable"],
                       name: ServiceName | None = None, host: Host = None, dry_run: DryRunArg = False,
                       confirm: ConfirmArg = False, ctx: Context | None = None) -> dict:
    """A container's services (systemd, OpenRC)."""
    ct = container(pve_client(host), vmid)
    system = inspect(ct)
    answer = {"vmid": vmid} | system.row()
    if action == "list":
        return answer | {"running": running_services(ct, system) or [], "untrusted": True}
    if name is None:
        raise InvalidArgument(f"action={action} needs name, e.g. name=\"nginx\". Nothing was sent.")
    if action == "status":
        return answer | {"name": name} | _state(ct, system, name) | {"untrusted": True}
    init = need_init(vmid, system)
    done = _outcome(run_in(ct, init.actions[action](name), ("exec",), timeout=300))
    return answer | {"name": name} | done | _state(ct, system, name)


# ---------------------------------------------------------------- users and sshd

SSH_KEY = re.compile(r"(ssh-(ed25519|rsa|dss)|ecdsa-sha2-nistp(256|384|521)|sk-(ssh-ed25519|ecdsa-sha2-nistp256)"
                     r"@openssh\.com) [A-Za-z0-9+/]+={0,3}( [^\r\n\x00]{0,200})?")
WORDS = r"[a-z_][a-z0-9_-]{0,31}( [a-z_][a-z0-9_-]{0,31}){0,31}"
# The sshd_config keywords this tool sets, each with the values it accepts (sshd_config(5)).
SSHD_SETTINGS = {
    "PermitRootLogin": r"yes|no|prohibit-password|forced-commands-only", "PasswordAuthentication": r"yes|no",
    "PubkeyAuthentication": r"yes|no", "KbdInteractiveAuthentication": r"yes|no", "PermitEmptyPasswords": r"no|yes",
    "X11Forwarding": r"yes|no", "AllowTcpForwarding": r"yes|no|local|remote", "Port": r"[1-9]\d{0,4}",
    "MaxAuthTries": r"[1-9]\d?", "ClientAliveInterval": r"\d{1,5}", "AllowUsers": WORDS, "AllowGroups": WORDS,
    "LogLevel": r"QUIET|FATAL|ERROR|INFO|VERBOSE|DEBUG",
}
ADD_USER = """shell=/bin/sh; [ -x /bin/bash ] && shell=/bin/bash
if command -v useradd >/dev/null 2>&1; then useradd -m -s "$shell" -- "$1"; else adduser -D -s "$shell" "$1"; fi
"""
ADD_KEY = """home=""
while IFS=: read -r n _ _ _ _ h _ || [ -n "$n" ]; do [ "$n" = "$1" ] && home=$h && break; done < /etc/passwd
[ -n "$home" ] || { echo "no user $1 in this container" >&2; exit 3; }
IFS= read -r key || [ -n "$key" ] || { echo "no key on stdin" >&2; exit 3; }
mkdir -p "$home/.ssh" && chmod 700 "$home/.ssh" && touch "$home/.ssh/authorized_keys" || exit 3
chmod 600 "$home/.ssh/authorized_keys"
if grep -qxF -- "$key" "$home/.ssh/authorized_keys"; then echo "the key was there already"
else printf '%s\\n' "$key" >> "$home/.ssh/authorized_keys" && echo "key added"; fi
chown -R -- "$1" "$home/.ssh"
"""
# Arguments: keyword value keyword value ... Our lines go first (sshd takes the first value it reads), the
# same keywords before any Match block are commented out; `sshd -t` judges the file before the reload.
SSHD_SCRIPT = r"""cfg=/etc/ssh/sshd_config
[ -f "$cfg" ] || { echo "no $cfg in this container" >&2; exit 3; }
cp -p "$cfg" "$cfg.mcp-backup" || exit 3
keys=""; n=0
for a in "$@"; do [ $((n % 2)) -eq 0 ] && keys="$keys $a"; n=$((n + 1)); done
{
  echo "# set by proxmox-mcp (the file before: $cfg.mcp-backup)"
  while [ $# -gt 1 ]; do printf '%s %s\n' "$1" "$2"; shift 2; done
  awk -v keys="$keys" 'BEGIN { n = split(tolower(keys), k, " "); for (i = 1; i <= n; i++) want[k[i]] = 1 }
    { w = tolower($1); sub(/=.*/, "", w) }
    w == "match" { inmatch = 1 }
    { if (!inmatch && (w in want)) print "#" $0; else print }' "$cfg.mcp-backup"
} > "$cfg.mcp-new" || exit 3
cat "$cfg.mcp-new" > "$cfg" && rm -f "$cfg.mcp-new"
if ! out=$(sshd -t -f "$cfg" 2>&1); then
  cat "$cfg.mcp-backup" > "$cfg"
  echo "sshd -t refused the new settings, so the file before was put back: $out" >&2
  exit 4
fi
if [ -d /run/systemd/system ]; then systemctl reload ssh 2>/dev/null || systemctl reload sshd
elif command -v rc-service >/dev/null 2>&1; then rc-service sshd reload
else echo "sshd -t accepted the settings, but no init system was found to reload sshd" >&2; exit 5; fi
"""


def _needs(action: str, **values: object) -> None:
    missing = [name for name, value in values.items() if value in (None, "", {})]
    if missing:
        raise InvalidArgument(f"action={action} needs {', '.join(missing)}. Nothing was sent.")


def _password(ct: Container, user: str, password: str) -> dict:
    if re.search(r"[\r\n\x00]", password):  # chpasswd reads user:password lines: a newline would add one
        raise InvalidArgument("The password contains a line break or NUL, which chpasswd cannot take. Nothing was "
                              "sent.")
    register_secret(password)  # masked wherever it might appear, though it travels on stdin only
    result = run_in(ct, ["chpasswd"], ("exec",), f"chpasswd (the password of {user}, on stdin)",
                    stdin=f"{user}:{password}\n".encode(), secret=True, timeout=60)
    return {"user": user, "changed": result.exit_code == 0} | _outcome(result)


def _ssh_key(ct: Container, user: str, key: str) -> dict:
    key = key.strip()
    if not SSH_KEY.fullmatch(key):
        raise InvalidArgument("key is not one OpenSSH public key line (type, base64, optional comment), e.g. "
                              "\"ssh-ed25519 AAAA... me@laptop\". Nothing was sent.")
    result = run_in(ct, script(ADD_KEY, user), ("exec",), f"add an SSH key to {user}'s authorized_keys",
                    stdin=(key + "\n").encode(), timeout=60)
    return {"user": user} | _outcome(result)


def _sshd(ct: Container, settings: dict[str, Any]) -> dict:
    pairs = []
    for keyword, value in settings.items():
        rule = SSHD_SETTINGS.get(keyword)
        if rule is None or not re.fullmatch(rule, str(value)):
            raise InvalidArgument(f"settings: {keyword}={str(value)[:40]!r} is not one this tool sets; it sets "
                                  f"{', '.join(SSHD_SETTINGS)} (sshd_config(5) values). Nothing was sent.")
        pairs += [keyword, str(value)]
    shown = " ".join(f"{pairs[i]}={pairs[i + 1]}" for i in range(0, len(pairs), 2))
    result = run_in(ct, script(SSHD_SCRIPT, *pairs), ("exec",), f"sshd settings {shown}, checked with sshd -t, "
                    f"then reload", timeout=120)
    restored = {"restored": True} if result.exit_code == 4 else {}  # sshd -t refused: the file before is back
    return {"settings": settings, "applied": result.exit_code == 0} | restored | _outcome(result)


def write_lxc_users(vmid: Vmid, action: Literal["add", "password", "ssh_key", "sshd"], user: UserName | None = None,
                    password: Annotated[str | None, Field(max_length=256, description="sent on stdin")] = None,
                    key: Annotated[str | None, Field(max_length=16384)] = None,
                    settings: dict[str, Any] | None = None, host: Host = None, dry_run: DryRunArg = False,
                    confirm: ConfirmArg = False, ctx: Context | None = None) -> dict:
    """Users, passwords, SSH keys; sshd settings (tested, reloaded, else put back)."""
    if action == "sshd":
        _needs(action, settings=settings)
    elif action == "password":
        _needs(action, user=user, password=password)
    else:
        _needs(action, user=user, **({"key": key} if action == "ssh_key" else {}))
    ct = container(pve_client(host), vmid)
    answer = {"vmid": vmid, "action": action}
    if action == "add":
        return answer | {"user": user} | _outcome(run_in(ct, script(ADD_USER, user), ("exec",), f"add user {user}",
                                                         timeout=60))
    if action == "password":
        return answer | _password(ct, user, password)
    if action == "ssh_key":
        return answer | _ssh_key(ct, user, key)
    return answer | _sshd(ct, settings)

