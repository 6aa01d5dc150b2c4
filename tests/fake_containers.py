"""Containers for the shell tests' fake pct: a directory per container that `pct exec` chroots into
(tests/test_shell_tools.py FAKE_PCT), holding a real dash and the few coreutils the tools' scripts use,
and stub package managers, init systems and account tools (shell scripts) that record every call
they get in /var/log/calls: one line per call, the program and each argument separated by \\x1f, so
that a test reads back the exact argv the server sent. State the stubs keep (what is pending, which
services run) is in /var/lib/stub, where a test can change it."""
import os
import shutil
import stat
import subprocess
from pathlib import Path

BINARIES = ("dash", "cat", "cp", "mv", "rm", "mkdir", "chmod", "chown", "touch", "grep", "env", "mawk")
RECORD = 'r() { { printf %s "${0##*/}"; for a in "$@"; do printf "\\037%s" "$a"; done; echo; } >> /var/log/calls; }\n'

APT = RECORD + r"""r "$@"
case " $* " in
  *" -s "*) while read -r n old new; do echo "Inst $n [$old] ($new stable [amd64])"; done < /var/lib/stub/pending ;;
  *" update "*) echo "Reading package lists..." ;;
  *" dist-upgrade "*)
    if [ -e /var/lib/stub/fail-upgrade ]; then
      echo "E: Sub-process /usr/bin/dpkg returned an error code (1)" >&2; exit 100
    fi
    while read -r n old new; do echo "Setting up $n ($new) ..."; done < /var/lib/stub/pending
    : > /var/lib/stub/pending
    if [ -e /var/lib/stub/break-service ]; then
      b=$(cat /var/lib/stub/break-service)
      grep -vx "$b" /var/lib/stub/running > /var/lib/stub/r; mv /var/lib/stub/r /var/lib/stub/running
    fi ;;
  *" install "*|*" remove "*)
    for a in "$@"; do
      [ "$a" = missing-pkg ] && { echo "E: Unable to locate package $a" >&2; exit 100; }
    done
    echo "done" ;;
esac
"""
APK = RECORD + r"""r "$@"
case "$1" in
  version) echo "Installed:                                Available:"
           while read -r n old new; do echo "$n-$old < $new"; done < /var/lib/stub/pending ;;
  upgrade) while read -r n old new; do echo "Upgrading $n ($old -> $new)"; done < /var/lib/stub/pending
           : > /var/lib/stub/pending ;;
esac
"""
DNF = RECORD + r"""r "$@"
case " $* " in
  *" check-update "*) [ -s /var/lib/stub/pending ] || exit 0
    while read -r n old new; do echo "$n.x86_64    $new    baseos"; done < /var/lib/stub/pending; exit 100 ;;
  *" upgrade "*) : > /var/lib/stub/pending ;;
esac
"""
PACMAN = RECORD + r"""r "$@"
case "$1" in
  -Qu) [ -s /var/lib/stub/pending ] || exit 1
       while read -r n old new; do echo "$n $old -> $new"; done < /var/lib/stub/pending ;;
  -Syu) : > /var/lib/stub/pending ;;
esac
"""
SYSTEMCTL = RECORD + r"""r "$@"
s=/var/lib/stub
case "$1" in
  list-units) while read -r n; do echo "$n.service loaded active running $n"; done < $s/running ;;
  show) for n in "$@"; do :; done; if grep -qx "$n" $s/running; then a=active; b=running; else a=inactive; b=dead; fi
        if grep -qx "$n" $s/enabled; then e=enabled; else e=disabled; fi
        printf 'LoadState=loaded\nActiveState=%s\nSubState=%s\nUnitFileState=%s\n' $a $b $e ;;
  start|restart) grep -qx "$3" $s/running || echo "$3" >> $s/running ;;
  stop) grep -vx "$3" $s/running > $s/r; mv $s/r $s/running ;;
  enable) echo "$3" >> $s/enabled ;;
  disable) grep -vx "$3" $s/enabled > $s/r; mv $s/r $s/enabled ;;
  reload) ;;
esac
"""
RC_STATUS = RECORD + r"""r "$@"
while read -r n; do echo " $n    [  started  ]"; done < /var/lib/stub/running
"""
RC_SERVICE = RECORD + r"""r "$@"
s=/var/lib/stub
case "$2" in
  status) if grep -qx "$1" $s/running; then echo " * status: started"; else echo " * status: stopped"; exit 3; fi ;;
  start|restart) grep -qx "$1" $s/running || echo "$1" >> $s/running ;;
  stop) grep -vx "$1" $s/running > $s/r; mv $s/r $s/running ;;
esac
"""
USERADD = RECORD + r"""r "$@"
for a in "$@"; do n=$a; done
echo "$n:x:1000:1000::/home/$n:/bin/sh" >> /etc/passwd; mkdir -p "/home/$n"
"""
CHPASSWD = RECORD + r"""r "$@"
cat >> /var/log/chpasswd.stdin
"""
SSHD = RECORD + r"""r "$@"
if [ -e /etc/ssh/refuse ]; then
  echo "/etc/ssh/sshd_config line 2: Bad configuration option: $(cat /etc/ssh/refuse)" >&2; exit 255
fi
exit 0
"""
CURL = RECORD + r"""r "$@"
[ -e /var/lib/stub/curl-fails ] && { echo "curl: (7) Failed to connect to localhost port 8080" >&2; exit 7; }
echo ok
"""
# distribution -> (os-release, init, stubs by path)
SYSTEMD = {"usr/bin/systemctl": SYSTEMCTL}
OPENRC = {"sbin/rc-service": RC_SERVICE, "sbin/rc-status": RC_STATUS, "sbin/rc-update": RECORD + 'r "$@"\n'}
ACCOUNTS = {"usr/sbin/useradd": USERADD, "usr/sbin/chpasswd": CHPASSWD, "usr/sbin/sshd": SSHD, "usr/bin/curl": CURL}
DISTRIBUTIONS = {
    "debian": ('PRETTY_NAME="Debian GNU/Linux 13 (trixie)"\nID=debian\n', SYSTEMD, {"usr/bin/apt-get": APT}),
    "alpine": ('NAME="Alpine Linux"\nID=alpine\nPRETTY_NAME="Alpine Linux v3.22"', OPENRC, {"sbin/apk": APK}),
    "rocky": ('PRETTY_NAME="Rocky Linux 9.6 (Blue Onyx)"\nID="rocky"\nID_LIKE="rhel centos fedora"\n', SYSTEMD,
              {"usr/bin/dnf": DNF}),
    "arch": ('PRETTY_NAME="Arch Linux"\nID=arch\n', SYSTEMD, {"usr/bin/pacman": PACMAN}),
}
SSHD_CONFIG = "Include /etc/ssh/sshd_config.d/*.conf\nPermitRootLogin yes\n#PasswordAuthentication yes\n" \
              "Match User backup\n    PermitRootLogin no\n"


def _place(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        return
    source = source.resolve()  # the file itself, where a library path is a link
    try:
        os.link(source, target)  # the same filesystem: no copy
    except OSError:
        shutil.copy2(source, target)


def _libraries(binary: Path) -> list[Path]:
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        parts = line.split()
        path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0] if parts and parts[0].startswith("/") else ""
        if path.startswith("/"):
            found.append(Path(path))
    return found


def build(root: Path, distribution: str, pending: list[tuple[str, str, str]], running: list[str]) -> Path:
    """A container root for `distribution` (DISTRIBUTIONS), with what its package manager has pending
    (name, installed, candidate) and the services running."""
    release, init, manager = DISTRIBUTIONS[distribution]
    for name in BINARIES:
        binary = Path(shutil.which(name)).resolve()
        _place(binary, root / "usr" / "bin" / ("awk" if name == "mawk" else name))
        for library in _libraries(binary):
            _place(library, root / str(library).lstrip("/"))
    (root / "bin").mkdir(exist_ok=True)
    if not (root / "bin" / "sh").exists():
        os.link(root / "usr" / "bin" / "dash", root / "bin" / "sh")
    for folder in ("etc/ssh", "var/log", "var/lib/stub", "home", "root", "tmp", "sbin", "usr/sbin", "run"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    null = root / "dev" / "null"
    if not null.exists():
        null.parent.mkdir(exist_ok=True)
        try:
            os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except OSError:  # no CAP_MKNOD: a plain file serves the scripts' redirections
            null.write_text("")
            null.chmod(0o666)
    if init is SYSTEMD:
        (root / "run" / "systemd" / "system").mkdir(parents=True, exist_ok=True)
    for path, text in (init | manager | ACCOUNTS).items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("#!/bin/sh\n" + text)
        (root / path).chmod(0o755)
    (root / "etc" / "os-release").write_text(release)
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc" / "group").write_text("root:x:0:\n")
    (root / "etc" / "ssh" / "sshd_config").write_text(SSHD_CONFIG)
    set_state(root, pending, running)
    return root


def set_state(root: Path, pending: list[tuple[str, str, str]], running: list[str], enabled: list[str] = ()) -> None:
    stub = root / "var" / "lib" / "stub"
    for name in ("fail-upgrade", "break-service", "curl-fails"):
        (stub / name).unlink(missing_ok=True)
    (root / "etc" / "ssh" / "refuse").unlink(missing_ok=True)
    (stub / "pending").write_text("".join(f"{n} {old} {new}\n" for n, old, new in pending))
    (stub / "running").write_text("".join(f"{n}\n" for n in running))
    (stub / "enabled").write_text("".join(f"{n}\n" for n in enabled))
    (root / "var" / "log" / "calls").write_text("")


def calls(root: Path) -> list[list[str]]:
    """Every call the stubs recorded: [program, arguments...]."""
    text = (root / "var" / "log" / "calls").read_text()
    return [line.split("\x1f") for line in text.split("\n") if line]
