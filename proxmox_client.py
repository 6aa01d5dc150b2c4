"""The one HTTP client for Proxmox VE and Proxmox Backup Server.

Every request goes through `ProxmoxClient.request`, which passes the policy's admission step
(`policy.admit`) and then sends, unwraps `{"data": ...}` and turns every failure into a `ProxmoxError`
whose message tells the model what went wrong and what to do next. Tasks of both products
are waited for here too (`wait_task`), and answered as the tools answer them (`run_task`,
`task_report`, `log_page`).
"""
from __future__ import annotations

import hashlib
import logging
import re
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable
from urllib.parse import quote, urlsplit

from mcp.server.mcpserver import Context

import catalog
import policy
from answers import compact, iso_time, progress_reporter
from errors import InvalidArgument, ProxmoxError, TaskFailed, ToolFailure

if TYPE_CHECKING:
    import requests  # imported where it is used: a server's start and first tools/list never need it

log = logging.getLogger("proxmox-mcp")


@dataclass(frozen=True)
class Product:
    name: str
    default_port: int
    token_header: str  # format with id and secret
    upid: re.Pattern  # what a task id of this product looks like
    ticket_cookie: str  # the cookie that carries a password login's ticket
    task_tool: str  # the tool that follows one of its tasks


# Task ids, as the products' own parsers accept them (docs/PROXMOX-BEHAVIOUR.md#upids): pve-common
# src/PVE/UPID.pm (decode); proxmox-rs proxmox-schema/src/upid.rs (PROXMOX_UPID_REGEX), which adds a task
# counter and allows `/` in the (systemd-escaped) fields.
_NODE = r"(?P<node>[a-zA-Z0-9](?:[a-zA-Z0-9\-]*[a-zA-Z0-9])?)"
PVE_UPID = re.compile(rf"UPID:{_NODE}:(?P<pid>[0-9A-Fa-f]{{8}}):(?P<pstart>[0-9A-Fa-f]{{8,9}}):"
                      r"(?P<starttime>[0-9A-Fa-f]{8}):(?P<type>[^:\s/]+):(?P<id>[^:\s/]*):(?P<user>[^:\s/]+):")
PBS_UPID = re.compile(rf"UPID:{_NODE}:(?P<pid>[0-9A-Fa-f]{{8}}):(?P<pstart>[0-9A-Fa-f]{{8,9}}):"
                      r"(?P<task>[0-9A-Fa-f]{8,16}):(?P<starttime>[0-9A-Fa-f]{8}):(?P<type>[^:\s]+):(?P<id>[^:\s]*):"
                      r"(?P<user>[^:\s]+):")

# Differences between the products live here (the PBS header uses a colon: docs/PROXMOX-BEHAVIOUR.md#api-tokens).
PRODUCTS = {
    "pve": Product("Proxmox VE", 8006, "PVEAPIToken={id}={secret}", PVE_UPID, "PVEAuthCookie", "get_task"),
    "pbs": Product("Proxmox Backup Server", 8007, "PBSAPIToken={id}:{secret}", PBS_UPID, "PBSAuthCookie",
                   "pbs_get_task"),
}
TICKET_RENEW_AFTER = 3600.0  # tickets live 2 h; renew after 1 h, our own margin (docs/PROXMOX-BEHAVIOUR.md#tickets)
# Why a connection could not be made, by the operating system's words in the error, and what it means.
CONNECT_CAUSES = (
    ("no route to host", "no route to host (nothing answers at that address: a wrong IP, the machine is off, or "
                         "a firewall drops it)"),
    ("network is unreachable", "network unreachable (this machine has no route to that network)"),
    ("refused", "connection refused (nothing listens on that port: is the port right, is the service running?)"),
    ("name or service not known|nodename nor servname|getaddrinfo failed|name resolution|no address associated",
     "the name does not resolve (DNS)"),
)
SLOW_CONNECT_FAILURE = 1.0  # seconds: a connect failure this slow is not tried again within the connect timeout

@dataclass
class HostConfig:
    label: str
    product: str  # "pve" or "pbs"
    url: str  # scheme://host:port, no path
    token_id: str  # user@realm!tokenid (with a password login: the user)
    token_secret: str = field(repr=False)
    user: str | None = None  # password login (a ticket) instead of a token
    password: str | None = field(default=None, repr=False)
    write_token_id: str | None = None
    write_token_secret: str | None = field(default=None, repr=False)
    verify_tls: bool = True
    ca_file: str | None = None
    fingerprint: str | None = None  # SHA-256, hex without colons, lower case
    connect_timeout: float = 5.0
    read_timeout: float = 30.0


def auth_method(host: HostConfig) -> str:
    """How a host is logged in to, in words for server_info, list_hosts and --check."""
    if not host.password:
        return "API token"
    if not host.token_secret:
        return f"password login as {host.user}"
    return f"API token; password login as {host.user} where tokens are refused"


# ---------------------------------------------------------------- TLS

def _pinned_adapter(fingerprint: str) -> Any:
    """A requests transport that accepts exactly the certificate with the pinned SHA-256
    fingerprint (urllib3 checks it)."""
    from requests.adapters import HTTPAdapter

    class PinnedAdapter(HTTPAdapter):
        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            kwargs["assert_fingerprint"] = fingerprint
            super().init_poolmanager(*args, **kwargs)
    return PinnedAdapter()


def server_fingerprint(url: str, timeout: float = 3.0) -> str | None:
    """The SHA-256 fingerprint of the certificate a server offers, or None if unreachable."""
    parts = urlsplit(url)
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((parts.hostname, parts.port or 443), timeout=timeout) as sock:
            with context.wrap_socket(sock, server_hostname=parts.hostname) as tls:
                der = tls.getpeercert(binary_form=True)
    except OSError:
        return None
    digest = hashlib.sha256(der).hexdigest().upper()
    return ":".join(digest[i:i + 2] for i in range(0, len(digest), 2))


# ---------------------------------------------------------------- UPIDs

def unescape_id(text: str) -> str:
    """A PBS worker id as written: `-` was `/`, `\\xNN` any other byte (proxmox-rs
    proxmox-schema/src/upid.rs, unescape_id)."""
    def byte(match: re.Match) -> bytes:
        return b"/" if match.group(0) == b"-" else bytes([int(match.group(1).decode(), 16)])
    return re.sub(rb"\\x([0-9A-Fa-f]{2})|-", byte, text.encode()).decode(errors="replace")


def never_connected(exc: Exception) -> bool:
    """True when the connection was never made (refused, no route, DNS, connect timeout), as opposed
    to one dropped during the request, which an idempotent GET may retry."""
    import requests
    from urllib3.exceptions import MaxRetryError, NewConnectionError
    reason = exc.args[0].reason if exc.args and isinstance(exc.args[0], MaxRetryError) else exc
    return isinstance(exc, requests.exceptions.ConnectTimeout) or isinstance(reason, NewConnectionError)


def parse_upid(upid: str, product: str = "pve") -> dict:
    """Split a task id. PVE: UPID:node:pid:pstart:starttime:type:id:user: ; PBS has a task
    counter before starttime and systemd-escapes the worker id."""
    match = PRODUCTS[product].upid.fullmatch(upid)
    if not match:
        raise ProxmoxError(f"'{upid}' is not a {PRODUCTS[product].name} task id (UPID).")
    worker = unescape_id(match["id"]) if product == "pbs" else match["id"]
    return {"node": match["node"], "pid": int(match["pid"], 16), "pstart": int(match["pstart"], 16),
            "starttime": int(match["starttime"], 16), "type": match["type"], "id": worker, "user": match["user"]}


PERCENT = re.compile(r"(\d{1,3}(?:\.\d+)?)\s*%")


def task_outcome(state: str | None) -> str | None:
    """What a task state text means: "ok", "warnings" (a success), "unknown" or "failed"; None when
    there is none (running, never ran). Both products write `OK`, `WARNINGS: <n>`, the error text,
    or `unknown` / `unexpected status` (docs/PROXMOX-BEHAVIOUR.md#pbs-jobs, #pve-tasks)."""
    if not state:
        return None
    if state == "OK":
        return "ok"
    if re.fullmatch(r"WARNINGS: \d+", state):
        return "warnings"
    return "unknown" if state in ("unknown", "unexpected status") else "failed"


# ---------------------------------------------------------------- the client

def encode_params(params: dict[str, Any] | None) -> dict[str, Any]:
    """Form encoding as Proxmox wants it: booleans 0/1, lists as repeated keys,
    {"net": {0: "..."}} as net0, None dropped."""
    out: dict[str, Any] = {}
    for key, value in (params or {}).items():
        if value is None:
            continue
        if isinstance(value, dict):
            for index, item in value.items():
                out.update(encode_params({f"{key}{index}": item}))
        elif isinstance(value, bool):
            out[key] = int(value)
        elif isinstance(value, (list, tuple)):
            out[key] = [int(v) if isinstance(v, bool) else v for v in value]
        else:
            out[key] = value
    return out


class ProxmoxClient:
    def __init__(self, host: HostConfig):
        import requests
        self.host = host
        self.product = PRODUCTS[host.product]
        self.base = host.url.rstrip("/") + "/api2/json"
        self.session = requests.Session()
        self.session.headers["User-Agent"] = "proxmox-mcp"
        self._permissions_lock = threading.Lock()
        self._ticket: tuple[str, str, float] | None = None  # (ticket, CSRF token, when it was issued)
        self._login_lock = threading.Lock()
        self._permissions_retry = 0.0
        self._kept: dict[str, tuple[float, Any, bool]] = {}  # reads kept a few seconds (see `cached`)
        self._kept_lock = threading.Lock()
        self._slow_failure: tuple[float, ProxmoxError] | None = None  # (when, error) of the last slow connect failure
        # Passed on every request: a session-level value loses to REQUESTS_CA_BUNDLE in the environment.
        self.verify: bool | str = host.verify_tls
        if host.fingerprint:
            self.session.mount(host.url, _pinned_adapter(host.fingerprint))
            self.verify = False  # the pin replaces CA verification; urllib3 still checks the fingerprint
        elif host.ca_file:
            self.verify = host.ca_file

    def _auth_headers(self, method: str, renew: bool = False, ticket: bool = False) -> dict[str, str]:
        """Token header; or, for a password login (or with `ticket`, for an endpoint that refuses
        tokens), the ticket cookie and the CSRF token on writes, logging in first when there is no
        ticket, it is an hour old, or `renew` is asked."""
        host = self.host
        if host.password and (ticket or not host.token_secret):
            ticket, csrf, _ = self._login(renew)
            headers = {"Cookie": f"{self.product.ticket_cookie}={ticket}"}
            return headers | ({"CSRFPreventionToken": csrf} if method != "GET" else {})
        if method != "GET" and host.write_token_id:
            return {"Authorization": self.product.token_header.format(id=host.write_token_id,
                                                                      secret=host.write_token_secret)}
        return {"Authorization": self.product.token_header.format(id=host.token_id, secret=host.token_secret)}

    def _login(self, renew: bool) -> tuple[str, str, float]:
        """POST /access/ticket with the user and password; the ticket is kept and reused."""
        import requests
        with self._login_lock:
            current = self._ticket
            if current and not renew and time.monotonic() - current[2] < TICKET_RENEW_AFTER:
                return current
            host = self.host
            prefix = ("PROXMOX" if host.product == "pve" else "PBS") + f"_{host.label.upper()}"
            try:
                response = self.session.post(self.base + "/access/ticket", data={
                    "username": host.user, "password": host.password},
                    timeout=(host.connect_timeout, host.read_timeout), verify=self.verify, allow_redirects=False)
            except requests.exceptions.SSLError:
                raise self._tls_error() from None
            except requests.exceptions.RequestException as exc:
                raise self._connection_error(exc) from None
            self._refuse_redirect(response)
            if response.status_code == 401:
                raise ProxmoxError(f"Login as {host.user} on host '{host.label}' failed: wrong user or password. "
                                   f"Check {prefix}_USER (user@realm) and {prefix}_PASSWORD.", status=401)
            if response.status_code >= 400:
                raise self._http_error("POST", "/access/ticket", response)
            data = response.json().get("data") or {}
            if data.get("NeedTFA") or "!tfa!" in str(data.get("ticket", "")) or not data.get("CSRFPreventionToken"):
                raise ProxmoxError(
                    f"Login as {host.user} on host '{host.label}' needs a second factor (TFA), which this server "
                    f"cannot give. Create an API token for it instead (pveum user token add {host.user} mcp, or "
                    f"Datacenter > Permissions > API Tokens) and set {prefix}_TOKEN.", status=401)
            policy.register_secret(data["ticket"])
            policy.register_secret(data["CSRFPreventionToken"])
            self._ticket = (data["ticket"], data["CSRFPreventionToken"], time.monotonic())
            return self._ticket

    def request(self, method: str, path: str, params: dict[str, Any] | None = None, *,
                timeout: float | None = None) -> Any:
        """Send one request through the policy's admission step (policy.admit: gates, protected
        guests, privileges, dry run, confirmation, audit) and return the unwrapped `data`, with
        the secrets its schema names masked."""
        method = method.upper()
        params = encode_params(params)
        self.ensure_permissions()
        return policy.admit(self.host, method, path, params, lambda decision: self._deliver(decision, timeout),
                            read=self.get, plan=self._dry_run_plan, client=self)

    def plan(self, steps: list[tuple[str, str, dict[str, Any] | None]], summary: str) -> None:
        """Declare the requests a multi-step tool will send, before its first (policy.plan_steps):
        judged now, shown together by a dry run, confirmed together once."""
        self.ensure_permissions()
        policy.plan_steps(self.host, [(m.upper(), path, encode_params(params)) for m, path, params in steps],
                          summary, read=self.get)

    def _deliver(self, decision: policy.Decision, timeout: float | None) -> Any:
        """Send what the policy admitted; a write drops the reads kept meanwhile."""
        data = self._send(decision.method, decision.path, decision.params, timeout)
        if decision.method != "GET":
            with self._kept_lock:  # a write may have changed what exists
                self._kept = {key: kept for key, kept in self._kept.items() if not kept[2]}
        return data

    def _dry_run_plan(self, decision: policy.Decision) -> dict:
        protection = ("names no protected guest" if not decision.guests
                      else f"names guest(s) {', '.join(map(str, decision.guests))}, none protected")
        plan = {"dry_run": True, "host": self.host.label,
                "request": {"method": decision.method, "path": decision.path,
                            "params": policy.mask_params(decision.params)},
                "gate": "+".join(decision.gates), "why": decision.reasons, "protection": protection,
                "needs_confirmation": decision.confirm}
        current = self._current_state(decision)
        if current is not None:
            plan["current"] = current
        return plan

    def _current_state(self, decision: policy.Decision) -> Any:
        """What a write would change, where one GET can show it (the guest, or the same path); only
        GETs the API has are tried (one it lacks would be refused, and logged as refused)."""
        match = re.match(r"(/nodes/[^/]+/(?:qemu|lxc)/\d+)", decision.path)
        candidates = [match.group(1) + "/status/current"] if match else []
        candidates.append(decision.path)
        for path in (p for p in candidates if catalog.find_method(self.host.product, "GET", p)):
            try:
                return self.get(path)
            except ToolFailure:
                continue
        return None

    def ensure_permissions(self) -> None:
        """Read the token's own privileges once per host (at start, or at first use)."""
        if policy.permissions_of(self.host) is not None or time.monotonic() < self._permissions_retry:
            return
        with self._permissions_lock:
            if policy.permissions_of(self.host) is not None:
                return
            try:
                self._permissions_retry = time.monotonic() + 60  # a failed read is retried later
                permissions = self._send("GET", "/access/permissions", {}, timeout=5)
                if self.host.product == "pve":
                    self._read_version()
                policy.set_permissions(self.host, permissions or {})
            except ProxmoxError as exc:
                log.info("could not read the privileges of %s: %s", self.host.label, exc)

    def _read_version(self) -> None:
        """The PVE version, which agent privileges depend on (policy.version_privileges); without it
        the current version's privileges are assumed."""
        try:
            policy.set_version(self.host, (self._send("GET", "/version", {}, timeout=5) or {}).get("version"))
        except ProxmoxError as exc:
            log.info("could not read the version of %s: %s", self.host.label, exc)

    def _send(self, method: str, path: str, params: dict[str, Any], timeout: float | None = None) -> Any:
        import requests
        url = self.base + quote(path, safe="/:@!=,")
        send_as = {"params": params} if method in ("GET", "DELETE") else {"data": params}
        attempts = 3 if method == "GET" else 1
        read_timeout = timeout or self.host.read_timeout
        renewed = login_again = use_ticket = False
        failed = self._slow_failure  # a host that just took the whole connect timeout to fail is not tried again
        if failed and time.monotonic() - failed[0] < self.host.connect_timeout:
            raise failed[1]
        for attempt in range(attempts + 2):
            headers = self._auth_headers(method, renew=login_again, ticket=use_ticket)
            login_again = False
            started = time.monotonic()
            try:
                response = self.session.request(
                    method, url, headers=headers,
                    timeout=(min(self.host.connect_timeout, read_timeout), read_timeout), verify=self.verify,
                    allow_redirects=False, **send_as)
                if response.status_code == 401 and self.host.password and not renewed \
                        and (use_ticket or not self.host.token_secret):
                    renewed = login_again = True  # the ticket expired or the server restarted: retry once
                    continue
                if response.status_code == 403 and self.host.password and self.host.token_secret \
                        and not use_ticket and "need proper ticket" in response.text:
                    use_ticket = True  # an endpoint Proxmox refuses to tokens: the password login instead
                    continue
                break
            except requests.exceptions.SSLError:
                raise self._tls_error() from None
            except requests.exceptions.ConnectionError as exc:
                if attempt + 1 < attempts and not never_connected(exc):
                    time.sleep(0.2 * (attempt + 1))  # retry an idempotent GET after a dropped connection
                    continue
                error = self._connection_error(exc)
                if never_connected(exc) and time.monotonic() - started >= SLOW_CONNECT_FAILURE:
                    self._slow_failure = (time.monotonic(), error)
                raise error from None
            except requests.exceptions.Timeout:
                raise ProxmoxError(
                    f"Host '{self.host.label}' did not answer {method} {path} within "
                    f"{read_timeout:g} s. The node may be overloaded; retry later or raise "
                    f"PROXMOX_READ_TIMEOUT.") from None
        self._refuse_redirect(response)
        if response.status_code >= 400:
            raise self._http_error(method, path, response)
        try:
            return response.json().get("data")
        except ValueError:
            raise ProxmoxError(f"Host '{self.host.label}' sent a non-JSON answer to {method} {path}; "
                               f"is {self.host.url} really {self.product.name}?") from None

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params)

    def cached(self, key: str, read: Callable[[], Any], ttl: float, *, fresh: bool = False,
               until_write: bool = False) -> Any:
        """What `read` returns, kept `ttl` seconds under `key` (the inventory lookups); `fresh`
        reads again; `until_write` drops it as soon as a write is sent through this client."""
        with self._kept_lock:
            kept = self._kept.get(key)
            if kept and not fresh and time.monotonic() - kept[0] < ttl:
                return kept[1]
        value = read()
        with self._kept_lock:
            self._kept[key] = (time.monotonic(), value, until_write)
        return value

    # ------------------------------------------------------------ errors

    def _connection_error(self, exc: Exception) -> ProxmoxError:
        """Why the host could not be reached, in the operating system's terms, and what to check."""
        import requests
        text = str(exc).lower()
        reason = next((meaning for words, meaning in CONNECT_CAUSES if re.search(words, text)), "cannot connect")
        if isinstance(exc, requests.exceptions.ConnectTimeout) or "timed out" in text:
            reason = (f"no answer within {self.host.connect_timeout:g} s (PROXMOX_CONNECT_TIMEOUT): the machine is "
                      f"off, the address is wrong, or a firewall drops the packets")
        elif self.host.url.startswith("http://") and not never_connected(exc):
            reason = ("the connection was closed at once, as a port that speaks TLS does to plain HTTP: the URL "
                      "should start with https://")
        return ProxmoxError(
            f"Host '{self.host.label}' ({self.host.url}) is unreachable: {reason}. Check that the URL and "
            f"port are right (PVE 8006, PBS 8007) and that the service is running.")

    def _refuse_redirect(self, response: requests.Response) -> None:
        """Proxmox answers plain HTTP on its TLS port with a redirect to https (301, or 308 for other
        methods: docs/PROXMOX-BEHAVIOUR.md#plain-http-on-the-tls-port). It is never followed: the
        token would go on in the clear, or be dropped on the way."""
        if response.status_code not in (301, 302, 303, 307, 308):
            return
        location = response.headers.get("Location", "")
        prefix = ("PROXMOX" if self.host.product == "pve" else "PBS") + (
            f"_{self.host.label.upper()}" if self.host.label != "default" else "")
        if self.host.url.startswith("http://") and location.startswith("https://"):
            raise ProxmoxError(
                f"Host '{self.host.label}': port {urlsplit(self.host.url).port} speaks TLS, so {self.host.url} answers "
                f"with a redirect to https. Set {prefix}_URL={'https://' + self.host.url[len('http://'):]} (and pin "
                f"its certificate with {prefix}_FINGERPRINT).")
        raise ProxmoxError(f"Host '{self.host.label}' ({self.host.url}) answered with a redirect to "
                           f"{location[:200]!r}; set the URL of the Proxmox API itself.")

    def _tls_error(self) -> ProxmoxError:
        label = self.host.label.upper()
        prefix = "PROXMOX" if self.host.product == "pve" else "PBS"
        offered = server_fingerprint(self.host.url)
        seen = f" The server offers SHA-256 {offered}." if offered else ""
        if self.host.fingerprint:
            return ProxmoxError(
                f"TLS certificate of host '{self.host.label}' does not match the pinned fingerprint "
                f"({prefix}_{label}_FINGERPRINT).{seen} If the certificate was renewed on purpose, "
                f"pin the new fingerprint; otherwise someone may be intercepting the connection.")
        return ProxmoxError(
            f"TLS certificate of host '{self.host.label}' could not be verified (self-signed?).{seen} "
            f"Pin it with {prefix}_{label}_FINGERPRINT=<that value>, or give the cluster CA in "
            f"{prefix}_{label}_CA_FILE.")

    def _http_error(self, method: str, path: str, response: requests.Response) -> ProxmoxError:
        status = response.status_code
        message, errors = _error_text(response)
        where = f"{method} {path} on host '{self.host.label}'"
        if status == 401 and self.host.password:
            text = (f"Authentication failed for {where} even after a fresh login as {self.host.user}: "
                    f"{message or 'the ticket was refused'}.")
        elif status == 401:
            var = ("PROXMOX" if self.host.product == "pve" else "PBS") + f"_{self.host.label.upper()}_TOKEN"
            text = (f"Authentication failed for {where}: the API token was refused (wrong, expired or "
                    f"deleted). Check {var}; the expected form is user@realm!tokenid=secret.")
        elif status == 403:
            text = _permission_message(where, message, self.host)
        elif status == 400 and errors:
            details = "; ".join(f"{name}: {msg.strip()}" for name, msg in sorted(errors.items()))
            text = f"Invalid parameters for {where}: {details}."
        elif status in (595, 596, 599):
            node = re.search(r"/nodes/([^/]+)", path)
            name = f" '{node.group(1)}'" if node else ""
            text = (f"Node{name} is unreachable from the API host ({status}: {message or 'no answer'}). "
                    f"The node may be down or the name may be wrong; check cluster_status and use node "
                    f"names exactly as listed.")
        elif status == 501:
            text = f"{where} is not implemented by this {self.product.name} ({message}). Check the path."
        else:
            text = f"{where} failed ({status}): {message or response.reason}"
            hint = _hint_for(message, path) if self.host.product == "pve" else None
            if hint:
                text += f". {hint}"
        return ProxmoxError(text, status=status, errors=errors)

    # ------------------------------------------------------------ tasks

    def task_node(self, upid: str) -> str:
        return parse_upid(upid, self.host.product)["node"]

    def task_status(self, upid: str) -> dict:
        return self.get(f"/nodes/{self.task_node(upid)}/tasks/{upid}/status")

    def task_log(self, upid: str, start: int = 0, limit: int = 50) -> list[dict]:
        """Log lines after the first `start` ones; `limit=0` means all. PBS counts `start` from 1
        (PVE: lines to skip), so it is sent one higher there (docs/PROXMOX-BEHAVIOUR.md#pbs-tasks)."""
        first = start + 1 if self.host.product == "pbs" else start
        return self.get(f"/nodes/{self.task_node(upid)}/tasks/{upid}/log", start=first, limit=limit) or []

    def wait_task(self, upid: str, timeout: float = 30.0,
                  on_progress: Callable[[float | None, str], None] | None = None) -> dict:
        """Poll a task until it stops or the deadline passes.

        Returns the final status with `result` "ok" or "warnings", or {"status": "still_running"}
        at the deadline. A failed task raises TaskFailed carrying the last log lines.
        """
        deadline = time.monotonic() + timeout
        delay = 0.2
        while True:
            status = self.task_status(upid)
            if status.get("status") != "running":
                return self._finished(upid, status)
            if on_progress:
                lines = self.task_log(upid, start=0, limit=0)
                text = next((line["t"] for line in reversed(lines) if PERCENT.search(line.get("t", ""))), "")
                match = PERCENT.search(text)
                on_progress(float(match.group(1)) if match else None, text or "running")
            if time.monotonic() + delay > deadline:
                return {"status": "still_running", "upid": upid,
                        "next": f"call {self.product.task_tool} with this upid and wait_seconds to keep waiting"}
            time.sleep(delay)  # polling a remote task, not synchronising tests
            delay = min(delay * 1.5, 2.0)

    def _finished(self, upid: str, status: dict) -> dict:
        exit_status = status.get("exitstatus", "")
        result = {"status": "stopped", "upid": upid, "exitstatus": exit_status}
        if exit_status == "OK":
            return result | {"result": "ok"}
        if exit_status.startswith("WARNINGS"):
            lines = [line["t"] for line in self.task_log(upid, limit=0) if "WARN" in line.get("t", "")]
            return result | {"result": "warnings", "warnings": lines[-10:]}
        tail = [line["t"] for line in self.task_log(upid, limit=0)][-8:]
        raise TaskFailed(f"Task {upid} failed: {exit_status}. Last log lines: " + " | ".join(tail))


# ---------------------------------------------------------------- tasks, as the tools answer them

def run_task(client: ProxmoxClient, method: str, path: str, params: dict[str, Any], wait_seconds: int,
             ctx: Context | None, action: str) -> dict:
    """Send a write and, when it starts a task, wait for it with progress notifications.
    A failed task raises TaskFailed (a tool error with the last log lines)."""
    data = client.request(method, path, params)
    if not (isinstance(data, str) and data.startswith("UPID:")):
        return {"action": action, "result": "ok"}
    if not wait_seconds:
        return {"action": action, "status": "started", "upid": data,
                "next": f"{client.product.task_tool} with this upid and wait_seconds to follow it"}
    outcome = client.wait_task(data, timeout=wait_seconds, on_progress=progress_reporter(ctx))
    return {"action": action} | outcome


def task_report(client: ProxmoxClient, upid: str, wait_seconds: int, log_lines: int, ctx: Context | None,
                again: str) -> dict:
    """A task's status, result and last log lines (both products); with wait_seconds, waits with
    progress and answers still_running at the deadline, naming the tool (`again`) to continue."""
    parse_upid(upid, client.host.product)
    if wait_seconds:
        outcome = client.wait_task(upid, timeout=wait_seconds, on_progress=progress_reporter(ctx))
        if outcome["status"] == "still_running":
            return outcome | {"next": f"call {again} with this upid and wait_seconds to keep waiting"}
    status = client.task_status(upid)
    user = status.get("user")  # without the token, which comes as `tokenid` (docs/PROXMOX-BEHAVIOUR.md#pve-tasks)
    if user and status.get("tokenid"):
        user = f"{user}!{status['tokenid']}"
    result = compact({"upid": upid, "node": status.get("node"), "type": status.get("type"),
                      "id": status.get("id"), "user": user, "status": status.get("status"),
                      "exitstatus": status.get("exitstatus"), "start": iso_time(status.get("starttime"))})
    if log_lines:
        result["log"] = [line["t"] for line in client.task_log(upid, limit=0)[-log_lines:]]
    if status.get("status") == "stopped":
        result["result"] = task_outcome(status.get("exitstatus")) or "unknown"
    return result


def log_page(client: ProxmoxClient, upid: str, start: int, limit: int) -> dict:
    """Log lines of a task from `start`, with `next_start` when there are more."""
    parse_upid(upid, client.host.product)
    lines = client.task_log(upid, start=start, limit=limit + 1)
    result: dict[str, Any] = {"upid": upid, "lines": [line["t"] for line in lines[:limit]]}
    if len(lines) > limit:
        result["next_start"] = start + limit
    return result


def _error_text(response: requests.Response) -> tuple[str, dict]:
    """Proxmox puts the message in the reason phrase (always), in body.message (PVE >= 5.2.0 of
    its HTTP server), in body.errors (400) or as a plain-text body (PBS)."""
    reason = response.reason or ""
    errors: dict = {}
    body_message = ""
    try:
        body = response.json()
    except ValueError:
        body_message = response.text.strip()[:500]
    else:
        if isinstance(body, dict):
            errors = body.get("errors") or {}
            body_message = str(body.get("message") or "").strip()
        elif isinstance(body, str):
            body_message = body.strip()[:500]
    message = body_message if len(body_message) > len(reason) else reason
    return message.strip(), errors if isinstance(errors, dict) else {}


def _permission_message(where: str, message: str, host: HostConfig) -> str:
    match = re.search(r"Permission check failed \(([^,]+), ([^)]+)\)", message) or \
        re.search(r"missing permissions '([^']+)' on '([^']+)'", message)
    if not match:
        if "API token" in message:
            return f"{where} refused: {message} This endpoint needs a user login, not a token."
        return f"Permission denied for {where}: {message}"
    if message.startswith("missing"):  # PBS: privileges first, then path
        privileges, acl_path = match.group(1), match.group(2)
    else:
        acl_path, privileges = match.group(1), match.group(2)
    if privileges.startswith("user != root"):
        return f"{where} is allowed to root@pam only ({message}); a token cannot do it."
    return f"Permission denied for {where}: the token lacks {privileges} on {acl_path}. " + \
        policy.grant_hint(host, privileges, acl_path)


# Locks no task holds (docs/PROXMOX-BEHAVIOUR.md#guest-status): what to do about each.
PERSISTENT_LOCKS = {
    "suspended": "The VM is hibernated (its memory saved to disk; no task holds this lock): start it to resume "
                 "(write_guest_power action=start).",
    "mounted": "The container's volumes are mounted on the host (pct mount; no task holds this lock): run "
               "`pct unmount {vmid}` on its node.",
}


def lock_advice(lock: str, vmid: int | str = "<vmid>", kind: str = "qemu") -> str:
    """What to do about a guest lock: persistent ones have their own way out; the others belong to
    a task (backup, clone, migrate, snapshot-delete, ...) and are stale once it has ended."""
    if lock in PERSISTENT_LOCKS:
        return PERSISTENT_LOCKS[lock].format(vmid=vmid)
    unlock = f"{'pct' if kind == 'lxc' else 'qm'} unlock {vmid}"
    return (f"A '{lock}' task holds this lock: wait for it (list_tasks vmid={vmid}); if none is running, "
            f"the lock is stale and `{unlock}` on the node removes it.")


def _locked_hint(match: re.Match, message: str) -> str:
    guest = re.search(r"(?:qemu|lxc)/(\d+)", message) or re.search(r"(?:VM|CT) (\d+)", message)
    kind = "lxc" if match.group(1) == "CT" else "qemu"
    return lock_advice(match.group(2), guest.group(1) if guest else "<vmid>", kind)


def agent_result(answer: dict | None) -> tuple[Any, str | None]:
    """An agent command's result, or its error: an agent error without a description comes back
    as a success, `{"result": {"error": {...}}}` (docs/PROXMOX-BEHAVIOUR.md#guest-agent)."""
    result = (answer or {}).get("result")
    if isinstance(result, dict) and isinstance(result.get("error"), dict):
        error = result["error"]
        return None, str(error.get("desc") or error.get("class") or error)[:200]
    return result, None


# 500 messages with a known next step: a text with the match's groups, or a function of the match and message.
HINTS = (
    (r"(VM|CT) is locked \(([\w-]+)\)", _locked_hint),
    (r"guest agent is not running|No QEMU guest agent configured",
     "The QEMU guest agent is not available in this VM; install and start qemu-guest-agent and set agent=1."),
    (r"got timeout", "The guest agent did not answer in time; a VM that just booted can need a minute."),
    (r"(VM|CT) \d+ is not running|not running", "Start the guest first (write_guest_power action=start)."),
    (r"does not exist", "Check the id with list_guests or list_storage."),
)


def _hint_for(message: str, where: str = "") -> str | None:
    for pattern, hint in HINTS:
        match = re.search(pattern, message, re.IGNORECASE)
        if match:
            return hint(match, f"{where} {message}") if callable(hint) else hint.format(*match.groups())
    return None


# ---------------------------------------------------------------- configured hosts

_hosts: dict[str, dict[str, HostConfig]] = {"pve": {}, "pbs": {}}
_clients: dict[tuple[str, str], ProxmoxClient] = {}
_clients_lock = threading.Lock()


def configure_hosts(hosts: list[HostConfig]) -> None:
    """Set the hosts tools may use (called once at start). Nothing connects here."""
    _hosts["pve"].clear()
    _hosts["pbs"].clear()
    _clients.clear()
    for host in hosts:
        _hosts[host.product][host.label] = host


def configured(product: str) -> dict[str, HostConfig]:
    return _hosts[product]


def client_for(product: str, label: str | None) -> ProxmoxClient:
    """The client of a configured host by label; the label may be left out when there is one."""
    hosts = _hosts[product]
    name = PRODUCTS[product].name
    if label is None:
        if len(hosts) == 1:
            label = next(iter(hosts))
        elif not hosts:
            prefix = "PROXMOX" if product == "pve" else "PBS"
            raise ProxmoxError(f"No {name} host is configured. Set {prefix}_<LABEL>_URL and {prefix}_<LABEL>_TOKEN.")
        else:
            raise InvalidArgument(f"Several {name} hosts are configured ({', '.join(sorted(hosts))}): pass host.")
    key = label.lower()
    if key not in hosts:
        known = ", ".join(sorted(hosts)) or "none"
        raise InvalidArgument(f"No {name} host labelled '{label}'. Configured: {known} (see list_hosts).")
    with _clients_lock:
        if (product, key) not in _clients:
            _clients[(product, key)] = ProxmoxClient(hosts[key])
        return _clients[(product, key)]


def pve_client(label: str | None = None) -> ProxmoxClient:
    return client_for("pve", label)


def pbs_client(label: str | None = None) -> ProxmoxClient:
    return client_for("pbs", label)
