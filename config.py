"""Configuration: every environment variable the server reads, parsed into one `Config` value.

Parsing has no side effects: the secrets it finds are carried in `Config.secrets`, and
`server.main` registers them for masking. A bad value raises `ConfigError` naming the variable
(never showing a secret); the server reports it and does not start.
"""
from __future__ import annotations

import difflib
import ipaddress
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dotenv import dotenv_values

import catalog
import receipts
from gates import TIERS, method_gate
from errors import ConfigError
from foreign_env import check_read_only_flags, foreign_server, foreign_variables, honour_narrowing
from products import PRODUCTS
from auth.tokens import PROFILES, NamedToken, parse_tokens
from protection import Protected, load_protected, parse_tags
from settings import HostConfig, HostPolicy, Keeping, Settings


TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")
TOKEN = re.compile(r"^(?P<id>[^\s@!=:]+@[A-Za-z][A-Za-z0-9.\-_]*![A-Za-z][A-Za-z0-9.\-_]*)[=:](?P<secret>\S+)$")
NODE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9\-]{0,61}[A-Za-z0-9])?$")
ADDRESS = re.compile(r"(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.\-]+)(?::(\d{1,5}))?")  # host[:port], IPv6 in brackets

# Per-host variables: PROXMOX_<LABEL>_<SUFFIX> and PBS_<LABEL>_<SUFFIX>; with no label
# (PROXMOX_URL) they describe the host labelled "default".
HOST_SUFFIXES = ("URL", "TOKEN", "TOKEN_FILE", "WRITE_TOKEN", "WRITE_TOKEN_FILE", "USER", "PASSWORD", "PASSWORD_FILE",
                 "CA_FILE", "FINGERPRINT",
                 "VERIFY_TLS", "ACCESS", "ALLOW_EXEC", "ALLOW_ELEVATED", "ALLOW_SENSITIVE",
                 "SSH_NODES", "SSH_HOST", "SSH_USER", "SSH_KEY_FILE", "SSH_KEY_PASSPHRASE", "SSH_SUDO",
                 "SSH_KNOWN_HOSTS", "SSH_FINGERPRINTS", "SSH_FINGERPRINT")
GATE_FLAGS = {"ALLOW_EXEC": "exec", "ALLOW_ELEVATED": "elevated", "ALLOW_SENSITIVE": "sensitive"}
# PROXMOX_TOOLSETS values: the groups server.TOOLS puts each tool in, "default" (what an unset
# PROXMOX_TOOLSETS offers), "compact" (the generic API tools plus the workflows) and "all".
TOOLSET_GROUPS = ("guests", "storage", "network", "tasks", "pbs", "shell", "workflows", "api", "templates", "backups",
                  "monitor", "firewall", "changes", "ops")
# The groups a first conversation needs; the others are opt-in, so that the default tool list,
# paid for on every turn, stays within its budget (docs/BENCHMARKS.md).
DEFAULT_GROUPS = ("guests", "storage", "network", "tasks", "pbs", "shell", "workflows", "api")
TOOLSET_NAMES = TOOLSET_GROUPS + ("default", "compact", "all")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# Variables that apply to everything; the strings say what is accepted.
GLOBALS = {
    "PROXMOX_VERIFY_TLS": "true or false",
    "PROXMOX_CONNECT_TIMEOUT": "seconds, e.g. 5",
    "PROXMOX_READ_TIMEOUT": "seconds, e.g. 30",
    "PROXMOX_REQUESTS_PER_NODE": "requests in flight to one node at once, e.g. 3",
    "PROXMOX_ACCESS": "read, lifecycle, write or destructive",
    "PROXMOX_ALLOW_EXEC": "true or false",
    "PROXMOX_ALLOW_ELEVATED": "true or false",
    "PROXMOX_ALLOW_SENSITIVE": "true or false",
    "PROXMOX_LOG_LEVEL": "DEBUG, INFO, WARNING or ERROR",
    "PROXMOX_UNBLOCK": "comma list of blocked methods to open, like 'PUT /nodes/{node}/qemu/{vmid}/sendkey'",
    "PROXMOX_PROTECTED_VMS_FILE": "path of the protected-guest JSON list",
    "PROXMOX_PROTECTED_TAGS": "comma list of Proxmox tags that protect a guest, e.g. mcp-protected",
    "PROXMOX_DRY_RUN": "true or false",
    "PROXMOX_ELICIT": "true or false",
    "PROXMOX_AUDIT_LOG": "path of the JSONL audit log",
    "PROXMOX_RECEIPTS_KEEP": "how many receipts of changes to keep, e.g. 1000",
    "PROXMOX_RECEIPTS_DAYS": "how many days to keep receipts of changes, e.g. 30",
    "PROXMOX_SAFETY_SNAPSHOT": "off, rollback or all (also before config changes that can lose data)",
    "PROXMOX_SAFETY_KEEP": "how many safety snapshots of a guest to keep, the newest, e.g. 3",
    "PROXMOX_SAFETY_DAYS": "how many days to keep a safety snapshot, e.g. 14",
    "PROXMOX_EXEC_ALLOWED_VMIDS": "comma list of vmids exec may reach, e.g. 100,105",
    "PROXMOX_SSH_TIMEOUT": "seconds, e.g. 30",
    "PROXMOX_RESTORE_DIR": "a folder for files restored from backups, e.g. ~/restored",
    "PROXMOX_RESTORE_MAX_MB": "megabytes one restored file may have, e.g. 1024",
    "PROXMOX_TRANSFER_DIR": "a folder on this server for node file uploads and downloads, e.g. ~/node-files",
    "PROXMOX_TRANSFER_MAX_MB": "megabytes one uploaded or downloaded node file may have, e.g. 1024",
    "PROXMOX_SOURCE_ADDRESS": "the IP address the Proxmox nodes see this server connect from, e.g. 192.0.2.50",
    "PROXMOX_TOOLSETS": "comma list of " + ", ".join(TOOLSET_NAMES),
    "PROXMOX_ALLOW_TOOLS": "comma list of tool names or prefixes like write_*",
    "PROXMOX_DENY_TOOLS": "comma list of tool names or prefixes like write_*",
    "PROXMOX_PROTECTED_VMS": "comma list of label:vmid added to the protected-guest file",
    "MCP_AUTH_TOKEN": "a long random string",
    "MCP_AUTH_TOKEN_FILE": "a file holding the token",
    "MCP_AUTH_REQUIRED": "true or false",
    "MCP_AUTH_TOKENS_FILE": "path of the JSON list of named tokens (python server.py --new-token NAME)",
    "MCP_OAUTH": "true or false (1 or 0): the built-in OAuth authorization server",
    "MCP_PUBLIC_URL": "the URL clients reach this server at, e.g. https://mcp.example.com",
    "MCP_OAUTH_ISSUER": "your identity provider's issuer URL, e.g. https://auth.example.com/application/o/proxmox/",
    "MCP_OAUTH_AUDIENCE": "the audience its tokens name, by default MCP_PUBLIC_URL/mcp",
    "MCP_OAUTH_PROFILES": "comma list of group-or-scope=profile, e.g. proxmox-admins=admin,proxmox-ops=operate",
    "MCP_STATE_KEY": "comma list of secrets of 32+ characters sealing the confirmation round trip (first seals)",
    "PROXMOX_STATE_DB": "path of the SQLite state database (OAuth clients and token hashes)",
    "MCP_ALLOWED_HOSTS": "comma list of host[:port] names clients use",
    "MCP_HTTP_HOST": "an address to bind, e.g. 127.0.0.1",
    "MCP_HTTP_PORT": "a port number",
}
BOOLEAN_GLOBALS = ("PROXMOX_VERIFY_TLS", "PROXMOX_ALLOW_EXEC", "PROXMOX_ALLOW_ELEVATED",
                   "PROXMOX_ALLOW_SENSITIVE", "MCP_AUTH_REQUIRED", "PROXMOX_DRY_RUN", "PROXMOX_ELICIT", "MCP_OAUTH")
INSTALL_DIR = Path(__file__).resolve().parent
NAME = "proxmox-guard-mcp"  # the distribution and command (pyproject.toml); `proxmox-mcp` on the index is another
# A clone (or any copy of the repository) keeps the operator's files beside server.py; an installed copy
# (pipx, uvx, the Desktop extension, the container) does not: its directory is no place to edit (settings_dir).
SOURCE_TREE = (INSTALL_DIR / "pyproject.toml").is_file()

HostValues = dict[str, tuple[str, str]]  # suffix -> (variable, value) of one host


@dataclass
class SshTarget:
    """How to reach the nodes of one host label (PVE) or its Backup Server (PBS) over SSH."""
    label: str
    product: str
    nodes: dict[str, tuple[str, int]]  # node name -> (address, port); PBS: {"pbs": ...}
    user: str = "root"
    key_file: str | None = None
    key_passphrase: str | None = field(default=None, repr=False)
    sudo: bool = False
    known_hosts: str | None = None
    fingerprints: dict[str, str] = field(default_factory=dict)  # node -> SHA256:...
    timeout: float = 30.0


@dataclass
class AuthConfig:
    """Who may use the HTTP transport beside the MCP_AUTH_TOKEN holder (docs/SECURITY.md#principals)."""
    tokens: list[NamedToken] = field(default_factory=list)  # MCP_AUTH_TOKENS_FILE
    tokens_file: str | None = None
    oauth: bool = False  # MCP_OAUTH: the embedded authorization server
    public_url: str | None = None  # MCP_PUBLIC_URL, no trailing slash
    issuer: str | None = None  # MCP_OAUTH_ISSUER: an external identity provider
    audience: str | None = None  # MCP_OAUTH_AUDIENCE, by default public_url + /mcp
    profiles: dict[str, str] = field(default_factory=dict)  # MCP_OAUTH_PROFILES: group or scope -> profile
    state_keys: list[str] = field(default_factory=list, repr=False)  # MCP_STATE_KEY, the first seals
    state_db: Path | None = None  # PROXMOX_STATE_DB

    @property
    def resource(self) -> str | None:
        """The protected resource (RFC 9728): /mcp at the public URL."""
        return f"{self.public_url}/mcp" if self.public_url else None

    def mode(self) -> str:
        """In words, for --check and the start."""
        kinds = [f"{len(self.tokens)} named token{'s' * (len(self.tokens) != 1)}"] if self.tokens else []
        if self.oauth:
            kinds.append(f"the built-in OAuth authorization server at {self.public_url}")
        if self.issuer:
            kinds.append(f"JWTs of the identity provider {self.issuer} for {self.audience}")
        return ", ".join(kinds)


@dataclass
class Config:
    """The whole configuration, read once at start by load_config."""
    hosts: list[HostConfig] = field(default_factory=list)
    settings: Settings = field(default_factory=Settings)
    default_rules: HostPolicy = field(default_factory=HostPolicy)  # when no host says otherwise
    ssh: list[SshTarget] = field(default_factory=list)
    # what every host takes unless its own variables say otherwise
    verify_tls: bool = True
    connect_timeout: float = 5.0
    read_timeout: float = 30.0
    ssh_timeout: float = 30.0
    requests_per_node: int = 3  # PROXMOX_REQUESTS_PER_NODE (fanout.PER_NODE)
    toolsets: tuple[str, ...] = ("default",)
    allow_tools: tuple[str, ...] = ()  # names or prefixes ending in *; empty: no allow list
    deny_tools: tuple[str, ...] = ()
    auth_token: str | None = field(default=None, repr=False)
    auth_required: bool = True
    auth: AuthConfig = field(default_factory=AuthConfig)  # named tokens, OAuth, the state key
    allowed_hosts: list[str] = field(default_factory=list)
    http_host: str = "127.0.0.1"
    http_port: int = 8765
    log_level: str = "INFO"
    warnings: list[str] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list, repr=False)  # for masking.register_secret, by server.main
    env_origins: EnvOrigins = field(default_factory=lambda: EnvOrigins())  # read_env_files, for --check
    restore_dir: Path | None = None  # PROXMOX_RESTORE_DIR: where write_restore_file saves; unset: not offered
    restore_max_bytes: int = 1024 ** 3  # PROXMOX_RESTORE_MAX_MB
    transfer_dir: Path | None = None  # PROXMOX_TRANSFER_DIR: node file uploads and downloads; unset: not offered
    transfer_max_bytes: int = 1024 ** 3  # PROXMOX_TRANSFER_MAX_MB


# ================================================================ the whole configuration

def load_config(env: dict[str, str] | None = None) -> Config:
    """Read and validate the whole configuration; raise ConfigError on the first bad value.
    The server then checks what only it knows: visibility.check_tool_names, and check_http_auth in HTTP mode."""
    env = without_empty(dict(os.environ if env is None else env))
    config = Config()
    foreign = {name: value for name, value in env.items() if foreign_server(name) is not None}
    config.warnings += foreign_variables(foreign)
    env = {name: value for name, value in env.items() if name not in foreign}
    honour_narrowing(foreign, env)
    read_global_settings(env, config)
    read_protected_guests(env, config)
    read_tool_choice(env, config)
    config.log_level = parse_log_level(env.get("PROXMOX_LOG_LEVEL", "INFO"))
    for (product, label), values in sorted(host_variables(env).items()):
        read_host(product, label, values, config)
    if not config.settings.protected.error:  # an entry naming no configured host protects nothing
        config.warnings += [f"PROTECTED GUEST LIST: {problem}."
                            for problem in config.settings.protected.problems({h.label for h in config.hosts})]
    read_http_settings(env, config)
    read_auth_settings(env, config)
    check_read_only_flags(foreign, config)
    config.warnings += unknown_variables(env)
    if not config.hosts:
        config.warnings.append("No Proxmox host is configured: set PROXMOX_<LABEL>_URL and _TOKEN, "
                               "or try `python server.py --demo`.")
    return config


@dataclass
class EnvOrigins:
    """Where each variable came from (read_env_files), for the start-up warning and --check."""
    files: list[Path] = field(default_factory=list)  # the .env files read
    set_by: dict[str, str] = field(default_factory=dict)  # variable -> "the environment" or a file
    ignored: dict[str, Path] = field(default_factory=dict)  # variable -> the working-directory file it was ignored from
    operator_file: Path = field(default_factory=lambda: settings_dir() / ".env")  # the operator's own .env

    def warning(self) -> str | None:
        if not self.ignored:
            return None
        files = ", ".join(sorted({str(path) for path in self.ignored.values()}))
        return (f"{files} (the working directory) may only narrow access; ignored from it: "
                f"{', '.join(sorted(self.ignored))}. Set them in the environment or in {self.operator_file}.")

    def report(self) -> list[str]:
        """One line per source: the names of the variables it set (never their values)."""
        by_source: dict[str, list[str]] = {}
        for name, source in sorted(self.set_by.items()):
            if name.startswith(("PROXMOX_", "PBS_", "MCP_")):
                by_source.setdefault(source, []).append(name)
        lines = [f"set by {source}: {', '.join(names)}" for source, names in by_source.items()]
        return lines + ([f"ignored: {self.warning()}"] if self.ignored else [])


def _lower_tier(current: str | None, value: str) -> str | None:
    tiers = TIERS
    low = value.strip().lower()
    return value if low in tiers and tiers.index(low) <= tiers.index((current or "read").strip().lower()) else None


def _only_false(_current: str | None, value: str) -> str | None:
    return value if value.strip().lower() in FALSE else None


def _only_true(_current: str | None, value: str) -> str | None:
    return value if value.strip().lower() in TRUE else None


def _joined(current: str | None, value: str) -> str | None:
    return ",".join(filter(None, [(current or "").strip(" ,"), value.strip(" ,")])) or None


def _fewer_vmids(current: str | None, value: str) -> str | None:
    now, wanted = set(parse_list(current or "")), set(parse_list(value))
    return value if wanted and (not now or wanted <= now) else None


def _fewer_tools(current: str | None, value: str) -> str | None:
    now, wanted = set(parse_list(current or "")), set(parse_list(value))
    return value if wanted and (not now or wanted <= now) else None


# What a .env in the working directory may set: each variable's rule, (the value from the
# environment and the operator's .env, the file's value) -> the value to use, or None when it would
# widen access. A client's working directory can be a repository the agent edits (Claude Code):
# its .env must not raise the tier, open a gate, stop asking, empty the protected list or move the
# audit log. Per-host variables follow the same rules (HOST_NARROWING).
NARROWING: dict[str, Callable[[str | None, str], str | None]] = {
    "PROXMOX_ACCESS": _lower_tier, "PROXMOX_ALLOW_EXEC": _only_false, "PROXMOX_ALLOW_ELEVATED": _only_false,
    "PROXMOX_ALLOW_SENSITIVE": _only_false, "PROXMOX_DRY_RUN": _only_true, "PROXMOX_ELICIT": _only_true,
    "PROXMOX_PROTECTED_VMS": _joined, "PROXMOX_PROTECTED_TAGS": _joined, "PROXMOX_DENY_TOOLS": _joined,
    "PROXMOX_EXEC_ALLOWED_VMIDS": _fewer_vmids,
    "PROXMOX_ALLOW_TOOLS": _fewer_tools,
}
HOST_NARROWING = {"ACCESS": _lower_tier, "ALLOW_EXEC": _only_false, "ALLOW_ELEVATED": _only_false,
                  "ALLOW_SENSITIVE": _only_false}


def _narrowing_rule(name: str, env: dict[str, str]) -> tuple[Callable[[str | None, str], str | None], str | None]:
    """The rule for a working-directory variable, and the value it narrows (a host's falls back to the global one)."""
    if name in NARROWING:
        return NARROWING[name], env.get(name)
    match = re.fullmatch(r"(PROXMOX|PBS)_([A-Z0-9_]+?)_(ACCESS|ALLOW_EXEC|ALLOW_ELEVATED|ALLOW_SENSITIVE)", name)
    if match:
        return HOST_NARROWING[match.group(3)], env.get(name, env.get(f"PROXMOX_{match.group(3)}"))
    return (lambda _current, _value: None), None


def _narrowed(env: dict[str, str], values: dict[str, str], path: Path, origins: EnvOrigins) -> dict[str, str]:
    """The working-directory file's variables that narrow access, with the values to use; the others
    are recorded as ignored."""
    taken = {}
    for name, value in values.items():
        rule, current = _narrowing_rule(name, env)
        if current is not None and value.strip() == current.strip():
            continue  # says what is already in force
        narrowed = rule(current, value)
        if narrowed is None:
            origins.ignored[name] = path
        else:
            taken[name] = narrowed
    return taken


def without_empty(env: dict[str, str]) -> dict[str, str]:
    """Our variables set to nothing are unset: a client's form left blank (the Desktop extension's optional
    fields) or a template's `NAME=` line means the default (every default is the safe one), and never
    hides what the operator's .env says."""
    return {name: value for name, value in env.items()
            if value.strip() or not name.startswith(("PROXMOX_", "PBS_", "MCP_"))}


def settings_dir(env: dict[str, str] | None = None) -> Path:
    """Where the operator's own files live (`.env`, `protected-vms.json`): beside server.py in a clone;
    for an installed copy, whose own directory is inside a venv, the user's config directory:
    $XDG_CONFIG_HOME/proxmox-guard-mcp (~/.config/...; %APPDATA%\\proxmox-guard-mcp on Windows)."""
    if SOURCE_TREE:
        return INSTALL_DIR
    env = dict(os.environ) | (env or {})
    base = env.get("XDG_CONFIG_HOME") or (os.name == "nt" and env.get("APPDATA")) or Path.home() / ".config"
    return Path(base) / NAME


def read_env_files(environ: dict[str, str] | None = None, cwd: Path | None = None) -> tuple[dict[str, str], EnvOrigins]:
    """The variables the server sees, and where they came from. Order: the real environment, then
    the operator's `.env` (settings_dir: beside server.py in a clone; a GUI client such as Claude
    Desktop starts servers in `/`, where no .env is); an earlier source wins. Then a `.env` in the
    working directory, which may only narrow access (NARROWING): a client's working directory may be
    a repository the agent edits."""
    env = without_empty(dict(os.environ if environ is None else environ))
    install, working = settings_dir(env) / ".env", (cwd or Path.cwd()) / ".env"
    origins = EnvOrigins(set_by={name: "the environment" for name in env}, operator_file=install)
    for path in dict.fromkeys((install, working)):
        try:
            values = dotenv_values(path) if path.is_file() else None
        except OSError as exc:
            raise ConfigError(f"{path} cannot be read: {exc.strerror}.") from None
        if values is None:
            continue
        origins.files.append(path)
        values = {k: v for k, v in values.items() if v is not None and origins.set_by.get(k) != "the environment"}
        where = f"{path} ({'beside server.py' if SOURCE_TREE else 'your settings'})"
        if path == install:
            values = {k: v for k, v in values.items() if k not in env}
        else:  # it may narrow what the operator's file says, never widen it
            values = _narrowed(env, values, path, origins)
            where = f"{path} (the working directory)"
        env |= values
        origins.set_by |= {name: where for name in values}
    return env, origins


def read_global_settings(env: dict[str, str], config: Config) -> None:
    """Timeouts, TLS, the access tier and gates every host starts from, dry run, asking, audit."""
    for name in BOOLEAN_GLOBALS:
        if name in env:
            parse_bool(name, env[name])
    config.verify_tls = flag(env, "PROXMOX_VERIFY_TLS", "true")
    config.connect_timeout = parse_seconds("PROXMOX_CONNECT_TIMEOUT", env.get("PROXMOX_CONNECT_TIMEOUT", "5"))
    config.ssh_timeout = parse_seconds("PROXMOX_SSH_TIMEOUT", env.get("PROXMOX_SSH_TIMEOUT", "30"))
    config.settings.exec_allowed_vmids = parse_exec_vmids(env.get("PROXMOX_EXEC_ALLOWED_VMIDS", ""))
    config.settings.source_address = parse_address("PROXMOX_SOURCE_ADDRESS", env.get("PROXMOX_SOURCE_ADDRESS", ""))
    config.read_timeout = parse_seconds("PROXMOX_READ_TIMEOUT", env.get("PROXMOX_READ_TIMEOUT", "30"))
    # pveproxy and pvedaemon serve 3 requests at once per node (docs/PROXMOX-BEHAVIOUR.md#workers-per-node)
    config.requests_per_node = parse_count("PROXMOX_REQUESTS_PER_NODE", env.get("PROXMOX_REQUESTS_PER_NODE", "3"),
                                           1, 64)
    if not config.verify_tls:
        config.warnings.append("PROXMOX_VERIFY_TLS=false: TLS certificates are not checked, so a man in the "
                               "middle can read the API token. Pin the certificate with _FINGERPRINT instead.")
    access = parse_access("PROXMOX_ACCESS", env.get("PROXMOX_ACCESS", "read"))
    allow = frozenset(gate for suffix, gate in GATE_FLAGS.items() if flag(env, f"PROXMOX_{suffix}", "false"))
    config.default_rules = HostPolicy(access, allow, parse_unblock(env.get("PROXMOX_UNBLOCK", "")))
    config.settings.dry_run = flag(env, "PROXMOX_DRY_RUN", "false")
    config.settings.elicit = flag(env, "PROXMOX_ELICIT", "true")
    config.settings.audit_path = Path(env["PROXMOX_AUDIT_LOG"]).expanduser() if env.get("PROXMOX_AUDIT_LOG") \
        else default_audit_path(env)
    read_restore_settings(env, config)
    config.settings.receipts = read_receipt_settings(env, config.settings.audit_path)


def read_restore_settings(env: dict[str, str], config: Config) -> None:
    """PROXMOX_RESTORE_DIR and PROXMOX_RESTORE_MAX_MB: where files restored from backups go, and
    how large one may be; PROXMOX_TRANSFER_DIR and PROXMOX_TRANSFER_MAX_MB the same for node files
    (write_node_files). A folder must be an absolute path (after ~); it is created on first use."""
    config.restore_dir = parse_folder(env, "PROXMOX_RESTORE_DIR", "restored")
    config.restore_max_bytes = parse_megabytes(env, "PROXMOX_RESTORE_MAX_MB")
    config.transfer_dir = parse_folder(env, "PROXMOX_TRANSFER_DIR", "node-files")
    config.transfer_max_bytes = parse_megabytes(env, "PROXMOX_TRANSFER_MAX_MB")


def parse_folder(env: dict[str, str], name: str, example: str) -> Path | None:
    folder = env.get(name, "").strip()
    if not folder:
        return None
    path = Path(folder).expanduser()
    if not path.is_absolute():
        raise ConfigError(f"{name}={folder!r} is not an absolute path; give e.g. {Path.home() / example}.")
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{name}={folder!r} exists and is not a folder.")
    return path


def parse_megabytes(env: dict[str, str], name: str) -> int:
    megabytes = env.get(name, "1024").strip()
    if not megabytes.isdigit() or not 1 <= int(megabytes) <= 1024 * 1024:
        raise ConfigError(f"{name}={megabytes!r} is not a number of megabytes (1 to 1048576).")
    return int(megabytes) * 1024 ** 2


def read_receipt_settings(env: dict[str, str], audit_path: Path) -> Keeping:
    """Receipts of changes live in the state database beside the audit log (`state/state.sqlite3`, with
    the receipts an earlier version kept in `audit.receipts/` imported), bounded in count and age;
    the safety snapshot is taken before rollbacks by default, and a guest keeps the newest few."""
    safety = env.get("PROXMOX_SAFETY_SNAPSHOT", "rollback").strip().lower()
    if safety not in receipts.SAFETY_CHOICES:
        raise ConfigError(f"PROXMOX_SAFETY_SNAPSHOT={safety!r} is not one of {', '.join(receipts.SAFETY_CHOICES)}.")
    return Keeping(receipts.open_store(audit_path),
                            parse_count("PROXMOX_RECEIPTS_KEEP", env.get("PROXMOX_RECEIPTS_KEEP", "1000"), 10, 100000),
                            parse_count("PROXMOX_RECEIPTS_DAYS", env.get("PROXMOX_RECEIPTS_DAYS", "30"), 1, 3650),
                            safety,
                            parse_count("PROXMOX_SAFETY_KEEP", env.get("PROXMOX_SAFETY_KEEP", "3"), 1, 100),
                            parse_count("PROXMOX_SAFETY_DAYS", env.get("PROXMOX_SAFETY_DAYS", "14"), 1, 3650))


def parse_count(name: str, value: str, lowest: int, highest: int) -> int:
    if not value.strip().isdigit() or not lowest <= int(value) <= highest:
        raise ConfigError(f"{name}={value!r} is not a whole number from {lowest} to {highest}.")
    return int(value)


PROTECTED_FILE: Path | None = None  # None: protected-vms.json in settings_dir() (the tests point it elsewhere)
SKIP_WORKTREE = "git update-index --skip-worktree protected-vms.json"  # README: git pull keeps your edits


def protected_file(env: dict[str, str]) -> tuple[Path, bool]:
    """The protected-guest list in force and whether it must exist: a file PROXMOX_PROTECTED_VMS_FILE
    names (empty: unset), or the one in settings_dir(), which a clone ships (gone: broken, fail closed);
    an installed copy's is the user's to create."""
    named = env.get("PROXMOX_PROTECTED_VMS_FILE", "").strip()
    if named:
        return Path(named).expanduser(), True
    return PROTECTED_FILE or settings_dir(env) / "protected-vms.json", SOURCE_TREE


def read_protected_guests(env: dict[str, str], config: Config) -> None:
    """The protected-guest file plus PROXMOX_PROTECTED_VMS and PROXMOX_PROTECTED_TAGS. A list that is
    configured but missing or unreadable fails closed (policy.check_protected refuses every request
    that changes a guest); an empty one protects nothing, and the start says so, loudly."""
    path, required = protected_file(env)
    protected = load_protected(path) if required or path.exists() else Protected(source=f"{path} (not created)")
    protected.entries += parse_protected_vms(env.get("PROXMOX_PROTECTED_VMS", ""))
    try:
        protected.tags = parse_tags(env.get("PROXMOX_PROTECTED_TAGS", ""))
    except ValueError as exc:
        raise ConfigError(f"PROXMOX_PROTECTED_TAGS: {exc}.") from None
    config.settings.protected = protected
    if protected.error:
        restore = f" (`git checkout -- {path.name}` brings the repository's back)" if SOURCE_TREE and \
            path.parent == INSTALL_DIR and not path.exists() else ""
        config.warnings.append(f"PROTECTED GUEST LIST UNREADABLE ({protected.error}{restore}): every request "
                               f"that changes a guest will be refused until it is fixed.")
    elif not protected.entries and not protected.tags:
        keep = f" (then `{SKIP_WORKTREE}` keeps your list through git pull)" if SOURCE_TREE and \
            path == INSTALL_DIR / "protected-vms.json" else ""
        config.warnings.append(f"NO GUEST IS PROTECTED: {path} lists none{'' if path.exists() else ' (create it)'} "
                               f"and PROXMOX_PROTECTED_TAGS is not set. Add the guests no agent may ever change (your "
                               f"router, your NAS) before allowing writes{keep}, or tag them and set "
                               f"PROXMOX_PROTECTED_TAGS.")


def read_tool_choice(env: dict[str, str], config: Config) -> None:
    """PROXMOX_TOOLSETS, PROXMOX_ALLOW_TOOLS and PROXMOX_DENY_TOOLS (whose names visibility.check_tool_names checks)."""
    config.toolsets = parse_toolsets(env.get("PROXMOX_TOOLSETS", "default"))
    config.allow_tools = parse_list(env.get("PROXMOX_ALLOW_TOOLS", ""))
    config.deny_tools = parse_list(env.get("PROXMOX_DENY_TOOLS", ""))


def read_http_settings(env: dict[str, str], config: Config) -> None:
    """The HTTP transport: bearer token, bind address and port, host names clients use."""
    token, source = env.get("MCP_AUTH_TOKEN"), "MCP_AUTH_TOKEN"
    if "MCP_AUTH_TOKEN_FILE" in env:
        token, source = read_secret_file("MCP_AUTH_TOKEN_FILE", env["MCP_AUTH_TOKEN_FILE"]), "MCP_AUTH_TOKEN_FILE"
    if token is not None:
        check_auth_token(source, token)
    config.auth_token = token
    if token:
        config.secrets.append(token)
    config.auth_required = flag(env, "MCP_AUTH_REQUIRED", "true")
    config.allowed_hosts = [h.strip() for h in env.get("MCP_ALLOWED_HOSTS", "").split(",") if h.strip()]
    config.http_host = env.get("MCP_HTTP_HOST", "127.0.0.1")
    port = env.get("MCP_HTTP_PORT", "8765")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"MCP_HTTP_PORT={port!r} is not a port number (1-65535).")
    config.http_port = int(port)


def read_auth_settings(env: dict[str, str], config: Config) -> None:
    """Named tokens, the built-in OAuth server or an identity provider, the state key and database."""
    auth = config.auth
    if env.get("MCP_AUTH_TOKENS_FILE"):
        auth.tokens_file = env["MCP_AUTH_TOKENS_FILE"]
        try:
            auth.tokens = parse_tokens(read_secret_file("MCP_AUTH_TOKENS_FILE", auth.tokens_file))
        except ValueError as exc:
            raise ConfigError(f"MCP_AUTH_TOKENS_FILE={auth.tokens_file!r} {exc}.") from None
        labels = {h.label for h in config.hosts}
        config.warnings += [f"MCP_AUTH_TOKENS_FILE: {t.name}'s hosts name no configured host: "
                            f"{', '.join(sorted(t.hosts - labels))}"
                            for t in auth.tokens if t.hosts and t.hosts - labels]
    auth.oauth = flag(env, "MCP_OAUTH", "false")
    auth.public_url = parse_public_url("MCP_PUBLIC_URL", env["MCP_PUBLIC_URL"]) if env.get("MCP_PUBLIC_URL") else None
    if auth.public_url:  # the name clients use is one the server answers to
        config.allowed_hosts.append(auth.public_url.split("://", 1)[1])
    auth.issuer = parse_public_url("MCP_OAUTH_ISSUER", env["MCP_OAUTH_ISSUER"], keep_path=True) \
        if env.get("MCP_OAUTH_ISSUER") else None
    auth.audience = env.get("MCP_OAUTH_AUDIENCE", "").strip() or auth.resource
    auth.profiles = parse_profiles(env.get("MCP_OAUTH_PROFILES", ""))
    auth.state_keys = [k.strip() for k in env.get("MCP_STATE_KEY", "").split(",") if k.strip()]
    if any(len(k) < 32 for k in auth.state_keys):
        raise ConfigError("MCP_STATE_KEY: each key (comma-separated) needs 32 characters or more; make one with "
                          "`openssl rand -hex 32`.")
    config.secrets += auth.state_keys
    auth.state_db = Path(env["PROXMOX_STATE_DB"]).expanduser() if env.get("PROXMOX_STATE_DB") else \
        config.settings.audit_path.with_name("state.sqlite3") if config.settings.audit_path else None


def parse_public_url(name: str, value: str, keep_path: bool = False) -> str:
    """An https URL (http only on loopback: tests, a tunnel's local end), without query or fragment;
    no path unless `keep_path` (an issuer may have one)."""
    match = re.fullmatch(r"(https?)://(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.\-]+)(:\d{1,5})?(/[^?#\s]*)?", value.strip())
    if not match or match[1] == "http" and not is_loopback(match[2]) or (match[4] or "/") != "/" and not keep_path:
        raise ConfigError(f"{name}={value!r} is not an https:// URL{'' if keep_path else ' without a path'} (http:// "
                          f"only on loopback), e.g. https://mcp.example.com.")
    return value.strip() if keep_path else value.strip().rstrip("/")


def parse_profiles(value: str) -> dict[str, str]:
    """MCP_OAUTH_PROFILES: `group-or-scope=profile,...`."""
    profiles = {}
    for item in parse_list(value):
        name, _, profile = item.partition("=")
        if not name.strip() or profile.strip() not in PROFILES:
            raise ConfigError(f"MCP_OAUTH_PROFILES: {item!r} is not NAME=PROFILE with a profile of "
                              f"{', '.join(PROFILES)}, e.g. proxmox-admins=admin.")
        profiles[name.strip()] = profile.strip()
    return profiles
WRITE_AUTH_TOKEN = "echo \"MCP_AUTH_TOKEN=$(openssl rand -hex 32)\" >> .env"  # README, Container: the shell runs it


def check_auth_token(source: str, token: str) -> None:
    """The bearer token: 32 characters or more, nothing a shell was meant to expand (a `.env` is read as
    it is written: `MCP_AUTH_TOKEN=$(openssl rand -hex 32)` is that text, not a random token), no
    whitespace. The message never shows the value."""
    if "$(" in token or "`" in token or "${" in token:
        why = "holds a shell command ($(...)) instead of its output: a .env file is read, never run"
    elif any(character.isspace() for character in token):
        why = "contains spaces or other whitespace"
    elif len(token) < 32:
        why = f"is {len(token)} characters long; a bearer token needs 32 or more"
    else:
        return
    raise ConfigError(f"{source} {why}. Write a real one with `{WRITE_AUTH_TOKEN}` (remove the old line first).")


def unknown_variables(env: dict[str, str]) -> list[str]:
    """A warning for each PROXMOX_, PBS_ or MCP_ variable that is not ours, with the closest known
    name when there is one (a typo)."""
    known_suffix = tuple("_" + s for s in HOST_SUFFIXES)
    unlabelled = ("PROXMOX_URL", "PBS_URL", "PROXMOX_TOKEN", "PBS_TOKEN")
    unknown = [name for name in env if name.startswith(("PROXMOX_", "PBS_", "MCP_")) and name not in GLOBALS
               and not name.endswith(known_suffix) and name not in unlabelled]
    if not unknown:
        return []
    labels = {(product, label) for product, label in host_variables(env)} | {("pve", "default"), ("pbs", "default")}
    known = list(GLOBALS) + [f"{PRODUCTS[product].env_prefix}_"
                             + (f"{label.upper()}_" if label != "default" else "") + suffix
                             for product, label in labels for suffix in HOST_SUFFIXES]
    warnings = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
        hint = f"did you mean {close[0]}?" if close else "a typo? .env.example lists every name."
        warnings.append(f"Unknown variable {name} ignored ({hint})")
    return warnings


# ================================================================ one host

def host_variables(env: dict[str, str]) -> dict[tuple[str, str], HostValues]:
    """Group per-host variables: {(product, label): {suffix: (variable, value)}}."""
    grouped: dict[tuple[str, str], HostValues] = {}
    suffixes = sorted(HOST_SUFFIXES, key=len, reverse=True)
    for name, value in env.items():
        for product, facts in PRODUCTS.items():
            prefix = facts.env_prefix + "_"
            if not name.startswith(prefix) or name in GLOBALS:
                continue
            rest = name[len(prefix):]
            for suffix in suffixes:
                if rest == suffix or rest.endswith("_" + suffix):
                    label = rest[:-len(suffix)].rstrip("_").lower() or "default"
                    grouped.setdefault((product, label), {})[suffix] = (name, value)
                    break
    return grouped


def read_host(product: str, label: str, values: HostValues, config: Config) -> None:
    """One host's variables: its URL, credentials, TLS, gates and SSH access."""
    prefix = PRODUCTS[product].env_prefix
    where = f"{prefix}_{label.upper()}_" if label != "default" else f"{prefix}_"
    if not re.fullmatch(r"[a-z0-9][a-z0-9_]*", label):
        raise ConfigError(f"Host label {label!r} in {where}URL: use letters, digits and underscores.")
    if "URL" not in values:
        raise ConfigError(f"{', '.join(v[0] for v in values.values())} set but {where}URL is missing.")
    url = parse_url(*values["URL"], product)
    token_id, secret, user, password = parse_credentials(where, label, values, config.warnings)
    host = HostConfig(label=label, product=product, url=url, token_id=token_id, token_secret=secret,
                      user=user, password=password, connect_timeout=config.connect_timeout,
                      read_timeout=config.read_timeout, token_variable=token_source(values, "TOKEN"),
                      **parse_tls(label, values, config.verify_tls, config.warnings))
    if "WRITE_TOKEN_FILE" in values or "WRITE_TOKEN" in values:
        host.write_token_id, host.write_token_secret = parse_write_token(values)
        host.write_token_variable = token_source(values, "WRITE_TOKEN")
    config.secrets += [s for s in (secret, password, host.write_token_secret) if s]
    if url.startswith("http://"):
        config.warnings.append(f"{where}URL uses plain http: the API token travels unencrypted.")
    config.settings.hosts[(product, label)] = parse_host_rules(values, config.default_rules)
    config.hosts.append(host)
    if product == "pbs":  # the firewall guard keeps 8007 open on a node that is one of them
        config.settings.backup_servers += (url,)
    ssh = parse_ssh(product, label, values, config.ssh_timeout)
    if ssh:
        config.ssh.append(ssh)
        config.secrets += [ssh.key_passphrase] if ssh.key_passphrase else []


def parse_credentials(where: str, label: str, values: HostValues,
                      warnings: list[str]) -> tuple[str, str, str | None, str | None]:
    """(token id, token secret, user, password) of one host: an API token, a password login, or both."""
    user, password = parse_login(where, values)
    if "TOKEN_FILE" in values:
        token_var, token_text = values["TOKEN_FILE"][0], read_secret_file(*values["TOKEN_FILE"])
    else:
        token_var, token_text = values.get("TOKEN", ("", ""))
    if not token_text and not user:
        raise ConfigError(f"{where}URL is set but neither {where}TOKEN nor {where}TOKEN_FILE is "
                          f"(or {where}USER and {where}PASSWORD, if you cannot create a token).")
    if not token_text:
        warnings.append(f"Host '{label}' logs in as {user} with a password: an API token is safer "
                        f"(it can be limited and revoked on its own; see README).")
        return user, "", user, password
    token_id, secret = parse_token(token_var, token_text)
    if user:
        warnings.append(f"{where}TOKEN and {where}USER are both set for host '{label}': the token is "
                        f"used, the password only where Proxmox refuses tokens.")
    return token_id, secret, user, password


def token_source(values: HostValues, suffix: str) -> str:
    """The variable a token was read from, as the user wrote it: the file's when both are set (it wins)."""
    return (values.get(f"{suffix}_FILE") or values.get(suffix) or ("",))[0]


def parse_login(where: str, values: HostValues) -> tuple[str | None, str | None]:
    """The optional user and password of a host (the ticket login, for those who cannot use a token)."""
    has_password = "PASSWORD" in values or "PASSWORD_FILE" in values
    if "USER" not in values and not has_password:
        return None, None
    if "USER" not in values or not has_password:
        raise ConfigError(f"{where}USER and {where}PASSWORD (or {where}PASSWORD_FILE) go together.")
    name, user = values["USER"]
    if not re.fullmatch(r"[^\s@:/]+@[A-Za-z][A-Za-z0-9.\-_]*", user):
        raise ConfigError(f"{name}={user!r} is not user@realm (e.g. root@pam, ops@pve).")
    password = read_secret_file(*values["PASSWORD_FILE"]) if "PASSWORD_FILE" in values else values["PASSWORD"][1]
    if not password:
        raise ConfigError(f"{where}PASSWORD is empty.")
    return user, password


def parse_write_token(values: HostValues) -> tuple[str, str]:
    """_WRITE_TOKEN or _WRITE_TOKEN_FILE: a second token used for the requests that change things."""
    name, text = values.get("WRITE_TOKEN", ("", ""))
    if "WRITE_TOKEN_FILE" in values:
        name, text = values["WRITE_TOKEN_FILE"][0], read_secret_file(*values["WRITE_TOKEN_FILE"])
    return parse_token(name, text)


def parse_tls(label: str, values: HostValues, verify_default: bool, warnings: list[str]) -> dict:
    """verify_tls, fingerprint and ca_file of one host (HostConfig fields)."""
    tls: dict = {"verify_tls": verify_default}
    if "VERIFY_TLS" in values:
        tls["verify_tls"] = parse_bool(*values["VERIFY_TLS"])
        if not tls["verify_tls"]:
            warnings.append(f"{values['VERIFY_TLS'][0]}=false: TLS is not checked for host '{label}'.")
    if "FINGERPRINT" in values:
        tls["fingerprint"] = parse_fingerprint(*values["FINGERPRINT"])
    if "CA_FILE" in values:
        tls["ca_file"] = readable_file(*values["CA_FILE"])
    return tls


def parse_host_rules(values: HostValues, defaults: HostPolicy) -> HostPolicy:
    """A host's access tier and gate flags: its own _ACCESS and _ALLOW_* over the global ones."""
    allow = set(defaults.allow)
    for suffix, gate in GATE_FLAGS.items():
        if suffix in values:
            (allow.add if parse_bool(*values[suffix]) else allow.discard)(gate)
    access = parse_access(*values["ACCESS"]) if "ACCESS" in values else defaults.access
    return HostPolicy(access, frozenset(allow), defaults.unblocked)


def parse_ssh(product: str, label: str, values: HostValues, timeout: float) -> SshTarget | None:
    """SSH access of one host: PVE nodes by name (`pve1=10.0.0.11,pve2=10.0.0.12:2222`) or the PBS
    host; a host key must be verifiable (known_hosts or pinned fingerprints)."""
    key = PRODUCTS[product].ssh_variable
    if key not in values:
        stray = [v[0] for k, v in values.items() if k.startswith("SSH_")]
        if stray:
            raise ConfigError(f"{', '.join(stray)} set without {PRODUCTS[product].host_prefix(label)}_{key}.")
        return None
    name, text = values[key]
    nodes = parse_ssh_nodes(product, name, text)
    fingerprints = parse_ssh_fingerprints(product, values, nodes)
    known_hosts = values.get("SSH_KNOWN_HOSTS", (None, None))[1]
    known_hosts = readable_file(*values["SSH_KNOWN_HOSTS"]) if known_hosts else None
    key_file = values.get("SSH_KEY_FILE", (None, None))[1]
    key_file = readable_file(*values["SSH_KEY_FILE"]) if key_file else None
    if not known_hosts and set(fingerprints) != set(nodes):
        missing = sorted(set(nodes) - set(fingerprints))
        raise ConfigError(f"{name}: host keys must be verifiable; give _SSH_KNOWN_HOSTS or pin "
                          f"{', '.join(missing)} in _SSH_FINGERPRINTS (never trusted on first use).")
    passphrase = values.get("SSH_KEY_PASSPHRASE", (None, None))[1]
    sudo = parse_bool(*values["SSH_SUDO"]) if "SSH_SUDO" in values else False
    return SshTarget(label, product, nodes, values.get("SSH_USER", (None, "root"))[1], key_file, passphrase, sudo,
                     known_hosts, fingerprints, timeout)


def parse_ssh_nodes(product: str, name: str, text: str) -> dict[str, tuple[str, int]]:
    """_SSH_NODES (PVE: node=address[:port],...) or _SSH_HOST (PBS: address[:port], node "pbs")."""
    nodes: dict[str, tuple[str, int]] = {}
    entries = [e.strip() for e in text.split(",") if e.strip()] if product == "pve" else [f"pbs={text.strip()}"]
    for entry in entries:
        node, _, address = entry.partition("=")
        match = ADDRESS.fullmatch(address)
        if not NODE_NAME.match(node) or not match:
            raise ConfigError(f"{name}: '{entry}' is not node=address[:port]" if product == "pve" else
                              f"{name}: '{text}' is not address[:port]")
        nodes[node] = (match.group(1).strip("[]"), int(match.group(2) or 22))
    return nodes


def parse_ssh_fingerprints(product: str, values: HostValues, nodes: dict) -> dict[str, str]:
    """_SSH_FINGERPRINTS (PVE: node=SHA256:...,...) or _SSH_FINGERPRINT (PBS): pinned host keys."""
    fingerprints: dict[str, str] = {}
    for fkey in ("SSH_FINGERPRINTS", "SSH_FINGERPRINT"):
        if fkey not in values:
            continue
        fname, ftext = values[fkey]
        pairs = [p.strip() for p in ftext.split(",") if p.strip()] if product == "pve" else [f"pbs={ftext.strip()}"]
        for pair in pairs:
            node, _, fingerprint = pair.partition("=")
            if not re.fullmatch(r"SHA256:[A-Za-z0-9+/]{43}", fingerprint) or node not in nodes:
                raise ConfigError(f"{fname}: '{pair}' is not node=SHA256:<43 base64 characters> for a known node.")
            fingerprints[node] = fingerprint
    return fingerprints


# ================================================================ single values

def flag(env: dict[str, str], name: str, default: str) -> bool:
    return parse_bool(name, env.get(name, default))


def parse_bool(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in TRUE:
        return True
    if lowered in FALSE:
        return False
    raise ConfigError(f"{name}={value!r} is not a boolean; use true or false.")


def parse_seconds(name: str, value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1
    if not 0 < seconds <= 3600:
        raise ConfigError(f"{name}={value!r} is not a number of seconds between 0 and 3600.")
    return seconds


def parse_url(name: str, value: str, product: str) -> str:
    value = value.strip().rstrip("/")
    value = value.removesuffix("/api2/json")
    if "@" in value.split("://", 1)[-1].split("/", 1)[0]:  # never echo a user or password given in the URL
        raise ConfigError(f"{name} holds a user name or password (user:password@host); put the URL without them "
                          f"and the credentials in the _TOKEN (or _USER and _PASSWORD) variables.")
    match = re.fullmatch(r"(https?)://" + ADDRESS.pattern, value)
    if not match:
        raise ConfigError(f"{name}={value!r} is not a URL like https://pve.example:8006 "
                          f"(scheme, host and optional port; no path).")
    port = match.group(3) or str(PRODUCTS[product].default_port)
    if match.group(1) == "http" and int(port) in (8006, 8007):  # docs/PROXMOX-BEHAVIOUR.md#plain-http-on-the-tls-port
        raise ConfigError(f"{name}={value!r}: port {port} speaks TLS (Proxmox redirects plain HTTP to https); "
                          f"use https://{match.group(2)}:{port}.")
    return f"{match.group(1)}://{match.group(2)}:{port}"


def parse_token(name: str, value: str) -> tuple[str, str]:
    match = TOKEN.match(value.strip())
    if not match:
        raise ConfigError(f"{name} is not an API token of the form user@realm!tokenid=secret "
                          f"(the value is not shown).")
    return match.group("id"), match.group("secret")


def parse_fingerprint(name: str, value: str) -> str:
    digits = value.strip().replace(":", "").lower()
    if not re.fullmatch(r"[0-9a-f]{64}", digits):
        raise ConfigError(f"{name} is not a SHA-256 fingerprint (64 hex digits, colons allowed).")
    return digits


def parse_access(name: str, value: str) -> str:
    tier = value.strip().lower()
    if tier not in TIERS:
        raise ConfigError(f"{name}={value!r} is not one of {', '.join(TIERS)}.")
    return tier


def parse_log_level(value: str) -> str:
    if value.upper() not in LOG_LEVELS:
        raise ConfigError(f"PROXMOX_LOG_LEVEL={value!r} is not DEBUG, INFO, WARNING or ERROR.")
    return value.upper()


def parse_exec_vmids(value: str) -> set[int] | None:
    """PROXMOX_EXEC_ALLOWED_VMIDS: the vmids exec may reach; None (unset) means any."""
    if not value.strip():
        return None
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not all(v.isdigit() and 100 <= int(v) <= 999999999 for v in items):
        raise ConfigError("PROXMOX_EXEC_ALLOWED_VMIDS must be a comma list of vmids (100-999999999).")
    return {int(v) for v in items}


def parse_address(name: str, value: str) -> str | None:
    """An IP address (the firewall guard judges for it: docs/PROXMOX-BEHAVIOUR.md#firewall-lockout); None when unset."""
    if not value.strip():
        return None
    try:
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        raise ConfigError(f"{name}={value!r} is not an IP address (e.g. 192.0.2.50 or 2001:db8::5).") from None


def parse_protected_vms(value: str) -> list[dict]:
    """PROXMOX_PROTECTED_VMS: label:vmid entries (label * for every host) added to the protected list."""
    entries = []
    for item in (i.strip() for i in value.split(",") if i.strip()):
        label, _, vmid = item.partition(":")
        if not (re.fullmatch(r"[a-z0-9_]+|\*", label.lower()) and vmid.isdigit() and int(vmid) >= 100):
            raise ConfigError(f"PROXMOX_PROTECTED_VMS entry {item!r} is not label:vmid (e.g. home:100).")
        entries.append({"host": label.lower(), "vmid": int(vmid), "reason": "listed in PROXMOX_PROTECTED_VMS"})
    return entries


def parse_toolsets(value: str) -> tuple[str, ...]:
    toolsets = tuple(t.strip().lower() for t in value.split(",") if t.strip())
    unknown = [t for t in toolsets if t not in TOOLSET_NAMES]
    if unknown or not toolsets:
        raise ConfigError(f"PROXMOX_TOOLSETS={value!r}: unknown {', '.join(unknown) or 'empty'}; "
                          f"use {', '.join(TOOLSET_NAMES)}.")
    return toolsets


def tool_matches(pattern: str, name: str) -> bool:
    return name.startswith(pattern[:-1]) if pattern.endswith("*") else name == pattern


def parse_list(value: str) -> tuple[str, ...]:
    return tuple(e.strip() for e in value.split(",") if e.strip())


def parse_unblock(value: str) -> frozenset[tuple[str, str]]:
    """PROXMOX_UNBLOCK: 'METHOD /path/{template}' entries, each a blocked method of either API."""
    opened = set()
    for item in filter(None, (part.strip() for part in value.split(","))):
        method, _, path = item.partition(" ")
        method, path = method.upper(), path.strip()
        products = [p for p in catalog.PRODUCTS if any(e["method"] == method and e["path"] == path
                                                       for e in catalog.methods(p))]
        if not products:
            raise ConfigError(f"PROXMOX_UNBLOCK entry {item!r} is not a method of the PVE or PBS API; "
                              f"write it as 'METHOD /path/{{param}}' as api_search shows it.")
        if method_gate(method, path) != "blocked":
            raise ConfigError(f"PROXMOX_UNBLOCK entry {item!r} is not blocked; its gate is set by PROXMOX_ACCESS "
                              f"and the PROXMOX_ALLOW_* flags.")
        opened.add((method, path))
    return frozenset(opened)


def readable_file(name: str, path: str) -> str:
    """A file the configuration names (CA, known_hosts, SSH key): it must exist; ~ is expanded."""
    if not Path(path).expanduser().is_file():
        raise ConfigError(f"{name}={path!r} is not a readable file.")
    return str(Path(path).expanduser())


def read_secret_file(name: str, path: str) -> str:
    try:
        return Path(path).expanduser().read_text().strip()
    except OSError as exc:
        raise ConfigError(f"{name}={path!r} cannot be read: {exc.strerror}.") from None


def default_audit_path(env: dict[str, str] | None = None) -> Path:
    """The user's state directory ($XDG_STATE_HOME, else ~/.local/state; %LOCALAPPDATA% on Windows):
    never the working directory, which a GUI client sets to `/` (Claude Desktop) or anywhere."""
    env = dict(os.environ) | (env or {})
    state = env.get("XDG_STATE_HOME") or (os.name == "nt" and env.get("LOCALAPPDATA")) \
        or Path.home() / ".local" / "state"
    return Path(state) / "proxmox-mcp" / "audit.jsonl"


# ================================================================ checks the server makes with what only it knows

def is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def check_http_auth(config: Config, bind_host: str) -> None:
    check_oauth(config)
    if config.auth_token or config.auth.tokens or config.auth.issuer:
        return
    if not is_loopback(bind_host):
        raise ConfigError(f"HTTP on {bind_host} needs MCP_AUTH_TOKEN (or MCP_AUTH_TOKEN_FILE); "
                          f"a non-loopback bind never starts without one.")
    if config.auth_required:
        raise ConfigError("HTTP mode needs MCP_AUTH_TOKEN (or MCP_AUTH_TOKEN_FILE). On a loopback bind, "
                          "MCP_AUTH_REQUIRED=false opts out explicitly.")
    config.warnings.append("HTTP without a bearer token (MCP_AUTH_REQUIRED=false): any local process can "
                           "use this server.")


def check_oauth(config: Config) -> None:
    """HTTP mode with OAuth: what it needs (the seed's MCP_OAUTH=1 and MCP_PUBLIC_URL, and more)."""
    auth = config.auth
    if auth.oauth and auth.issuer:
        raise ConfigError("MCP_OAUTH=1 and MCP_OAUTH_ISSUER both set: either this server grants access itself, or "
                          "your identity provider does. Unset one.")
    if (auth.oauth or auth.issuer) and not auth.public_url:
        raise ConfigError(f"{'MCP_OAUTH=1' if auth.oauth else 'MCP_OAUTH_ISSUER'} needs MCP_PUBLIC_URL, the https:// "
                          f"URL clients reach this server at (the protected resource is MCP_PUBLIC_URL/mcp).")
    if auth.oauth and not config.auth_token:
        raise ConfigError("MCP_OAUTH=1 needs MCP_AUTH_TOKEN (or MCP_AUTH_TOKEN_FILE): the operator's secret, typed "
                          "into the consent page before any client is granted access.")
    if auth.oauth and auth.state_db is None:
        raise ConfigError("MCP_OAUTH=1 needs a place for its state: set PROXMOX_STATE_DB (or PROXMOX_AUDIT_LOG).")
