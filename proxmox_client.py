"""The one HTTP client for Proxmox VE and Proxmox Backup Server.

Every request goes through `ProxmoxClient.request`, which passes the policy's admission step
(`policy.admit`) and then sends, unwraps `{"data": ...}` and turns every failure into a `ProxmoxError`
whose message tells the model what went wrong and what to do next. Tasks of both products
are waited for here too (`wait_task`); tasks.py answers them as the tools do. This module knows
HTTP and Proxmox, not MCP (tests/test_layout.py).
"""
from __future__ import annotations

import copy
import hashlib
import logging
import re
import socket
import ssl
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Protocol, TypeVar
from urllib.parse import quote, urlsplit

import calls
import catalog
import fanout
import policy
import privileges
import runtime
from errors import InvalidArgument, ProxmoxError, TaskFailed, ToolFailure
from gates import combine
from masking import mask_answer, mask_params, register_secret
from products import PRODUCTS
from settings import HostConfig

if TYPE_CHECKING:
    import requests  # imported where it is used: a server's start and first tools/list never need it

log = logging.getLogger("proxmox-guard-mcp")


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
# Reads that do not depend on each other go side by side (fanout.in_parallel, at most fanout.PER_NODE
# in flight per node); the connections kept per host cover the reads in flight at once.
POOL_SIZE = fanout.THREADS  # urllib3's default keeps 10 and opens (and then drops) a new TLS connection beyond them


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
    return PinnedAdapter(pool_maxsize=POOL_SIZE)


T = TypeVar("T")


def poll(read: Callable[[], T], done: Callable[[T], bool], seconds: float, *, pause: float = 1.0,
         growth: float = 1.0, longest: float = 2.0) -> tuple[T, bool]:
    """The one wait-until loop (tasks, guest states, HA requests, the guest agent, addresses): call
    `read` until `done` holds for what it returned or `seconds` have passed; the last value, and
    whether it was done. It reads at least once, waits `pause` between reads (times `growth` after
    each, at most `longest`) and never sleeps past the deadline."""
    deadline = time.monotonic() + seconds
    reads = calls.current().reads  # what the call read may change while it waits, the wait's own reads too
    reads.clear()
    try:
        while True:
            with reads.fresh():
                value = read()
            if done(value):
                return value, True
            if time.monotonic() + pause > deadline:
                return value, False
            time.sleep(pause)  # waiting for Proxmox to get there, not synchronising tests
            pause = min(pause * growth, longest)
    finally:  # (a task's log read while it ran lacks its last lines)
        reads.clear()


def _ca_adapter() -> Any:
    """A requests transport that verifies against a CA file (given per request as `verify`) with
    Python's checks minus one: Python 3.13 and urllib3 2.3+ set VERIFY_X509_STRICT, which refuses a CA
    without the keyUsage extension, as pve-cluster made them before 9.1.2 (every cluster set up
    earlier keeps one). Only that flag is dropped: the chain, the dates and the host name are checked
    (docs/PROXMOX-BEHAVIOUR.md#certificate-renewal)."""
    from requests.adapters import HTTPAdapter
    from urllib3.util.ssl_ import create_urllib3_context

    class ClusterCAAdapter(HTTPAdapter):
        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            context = create_urllib3_context()
            context.verify_flags &= ~ssl.VERIFY_X509_STRICT
            kwargs["ssl_context"] = context
            super().init_poolmanager(*args, **kwargs)
    return ClusterCAAdapter()


def offered_certificate(url: str, timeout: float = 3.0) -> bytes | None:
    """The certificate (DER) a server offers, unverified, or None if unreachable."""
    parts = urlsplit(url)
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((parts.hostname, parts.port or 443), timeout=timeout) as sock:
            with context.wrap_socket(sock, server_hostname=parts.hostname) as tls:
                return tls.getpeercert(binary_form=True)
    except OSError:
        return None


def server_fingerprint(url: str, timeout: float = 3.0) -> str | None:
    """The SHA-256 fingerprint of the certificate a server offers, or None if unreachable."""
    der = offered_certificate(url, timeout)
    if der is None:
        return None
    digest = hashlib.sha256(der).hexdigest().upper()
    return ":".join(digest[i:i + 2] for i in range(0, len(digest), 2))


def certificate_expiry(url: str, timeout: float = 3.0) -> float | None:
    """When the certificate a server offers expires (epoch), or None if unreachable."""
    der = offered_certificate(url, timeout)
    if der is None:
        return None
    from cryptography import x509  # installed with paramiko, a runtime dependency
    return x509.load_der_x509_certificate(der).not_valid_after_utc.timestamp()


CERT_WARN_DAYS = 30  # --check warns this close to the end: ACME certificates are renewed then, PVE's own at 14


def certificate_line(host: HostConfig) -> str | None:
    """What --check says about the certificate a host offers: when it expires, and within 30 days a
    warning that it will be (or should have been) renewed, which changes a pinned fingerprint
    (docs/PROXMOX-BEHAVIOUR.md#certificate-renewal). None when it cannot be read (plain HTTP, down)."""
    expires = certificate_expiry(host.url) if host.url.startswith("https://") else None
    if expires is None:
        return None
    days = int((expires - time.time()) // 86400)
    when = f"expires {time.strftime('%Y-%m-%d', time.gmtime(expires))} (in {days} days)"
    if days >= CERT_WARN_DAYS:
        return f"certificate: {when}"
    renewal, command, ca_file = RENEWAL[host.product]
    var = PRODUCTS[host.product].host_prefix(host.label)
    pinned = (f" {var}_FINGERPRINT pins this certificate: after the renewal pin the new one (see {command})"
              + (f", or trust the cluster CA with {var}_CA_FILE ({ca_file})" if ca_file else "") + "."
              ) if host.fingerprint else ""
    return f"warning: the certificate {when}. {renewal}; if that did not happen, renew it by hand.{pinned}"


# Why a pinned certificate changes, by product (docs/PROXMOX-BEHAVIOUR.md#certificate-renewal): the command that
# shows a node's fingerprints, and whether a cluster CA can be trusted instead of the leaf.
RENEWAL = {
    "pve": ("PVE renews a node's own certificate by itself 14 days before it expires (pveupdate; ACME ones 30 "
            "days before)", "`pvenode cert info` on the node", "/etc/pve/pve-root-ca.pem"),
    "pbs": ("PBS renews an ACME certificate 30 days before it expires (its own self-signed one lasts 1000 years)",
            "`proxmox-backup-manager cert info` on the server", None),
}


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
    worker = unescape_id(match["id"]) if PRODUCTS[product].escaped_ids else match["id"]
    return {"node": match["node"], "pid": int(match["pid"], 16), "pstart": int(match["pstart"], 16),
            "starttime": int(match["starttime"], 16), "type": match["type"], "id": worker, "user": match["user"]}


def parse_release(answer: dict) -> tuple[int, ...] | None:
    """GET /version as numbers: PVE's `version` is the full one (9.2.1; 7.x wrote 7.4-3), PBS's is
    major.minor with the patch number in `release` (proxmox-backup src/api2/version.rs)."""
    numbers = [int(n) for n in re.findall(r"\d+", str(answer.get("version") or "").split("-")[0])]
    if len(numbers) == 2 and str(answer.get("release", "")).isdigit():
        numbers.append(int(answer["release"]))
    return tuple(numbers) or None


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
        from requests.adapters import HTTPAdapter
        self.host = host
        self.product = PRODUCTS[host.product]
        self.base = host.url.rstrip("/") + "/api2/json"
        # One session per host, shared by the reads that run side by side (in_parallel): each request
        # passes its own headers, timeouts and TLS setting, Proxmox sets no cookies on API answers, and
        # urllib3's connection pool is thread-safe (docs/BENCHMARKS.md#reading-nodes-side-by-side).
        self.session = requests.Session()
        self.session.headers["User-Agent"] = "proxmox-guard-mcp"
        for scheme in ("https://", "http://"):
            self.session.mount(scheme, HTTPAdapter(pool_maxsize=POOL_SIZE))
        self._envelope = threading.local()  # the last answer's `total` in this thread (get_counted)
        self._permissions_lock = threading.Lock()
        self._ticket: tuple[str, str, float] | None = None  # (ticket, CSRF token, when it was issued)
        self._login_lock = threading.Lock()
        self._permissions_retry = 0.0
        self._kept: dict[str, tuple[float, Any, bool]] = {}  # reads kept a few seconds (see `cached`)
        self._kept_lock = threading.Lock()
        self._slow_failure: tuple[float, ProxmoxError] | None = None  # (when, error) of the last slow connect failure
        self._release: tuple[int, ...] | None = None  # the product's version as numbers, read once (release())
        self._release_read = False
        self._release_lock = threading.Lock()
        # Passed on every request: a session-level value loses to REQUESTS_CA_BUNDLE in the environment.
        self.verify: bool | str = host.verify_tls
        if host.fingerprint:
            self.session.mount(host.url, _pinned_adapter(host.fingerprint))
            self.verify = False  # the pin replaces CA verification; urllib3 still checks the fingerprint
        elif host.ca_file:
            self.session.mount(host.url, _ca_adapter())
            self.verify = host.ca_file

    def _auth_headers(self, method: str, renew: bool = False, ticket: bool = False,
                      writer: bool = False) -> dict[str, str]:
        """Token header (the write token for writes and for a read the policy sends with it: `writer`);
        or, for a password login (or with `ticket`, for an endpoint that refuses tokens), the ticket
        cookie and the CSRF token on writes, logging in first when there is no ticket, it is an hour
        old, or `renew` is asked."""
        host = self.host
        if host.password and (ticket or not host.token_secret):
            ticket, csrf, _ = self._login(renew)
            headers = {"Cookie": f"{self.product.ticket_cookie}={ticket}"}
            return headers | ({"CSRFPreventionToken": csrf} if method != "GET" else {})
        if (method != "GET" or writer) and host.write_token_id:
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
            prefix = self.product.host_prefix(host.label)
            try:
                response = self.session.post(self.base + "/access/ticket", data={
                    "username": host.user, "password": host.password},
                    timeout=(host.connect_timeout, host.read_timeout), verify=self.verify, allow_redirects=False)
            except requests.exceptions.SSLError as exc:
                raise self._tls_error(exc) from None
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
            register_secret(data["ticket"])
            register_secret(data["CSRFPreventionToken"])
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
                            read=self.read, plan=self._dry_run_plan, client=self)

    def plan(self, steps: list[tuple[str, str, dict[str, Any] | None]], summary: str,
             shell: list[policy.Decision] = ()) -> None:
        """Declare the requests a multi-step tool will send, before its first (policy.plan_steps),
        with the shell commands it runs on this host's nodes (`shell`, already classified): judged
        now, shown together by a dry run, confirmed together once."""
        self.ensure_permissions()
        policy.plan_steps(self.host, [(m.upper(), path, encode_params(params)) for m, path, params in steps],
                          summary, read=self.read, prepared=list(shell))

    def read(self, path: str, **params: Any) -> Any:
        """A read the policy makes for its own judgement (policy.own_read: the firewall guard,
        protection, job judgement, the receipts): straight to the transport, shared with the call's
        other reads (calls.Reads), not admitted again; one that needs a gate beyond read is admitted
        as a tool's read is."""
        params = encode_params(params)
        self.ensure_permissions()
        decision = policy.own_read(self.host, path, params)
        if decision is None:
            return self.request("GET", path, params)
        return mask_answer(self._fetch(decision.path, decision.params), decision.secrets)

    def _deliver(self, decision: policy.Decision, timeout: float | None) -> Any:
        """Send what the policy admitted (a read once per call: _fetch); a write drops the reads kept
        meanwhile (the call's are dropped by the policy: policy._send_audited)."""
        how = {"writer": decision.writer, "ticket": self._root_only(decision)}
        if decision.method == "GET":
            return self._fetch(decision.path, decision.params, timeout, **how)
        data = self._send(decision.method, decision.path, decision.params, timeout, **how)
        with self._kept_lock:  # a write may have changed what exists
            self._kept = {key: kept for key, kept in self._kept.items() if not kept[2]}
        return data

    def _root_only(self, decision: policy.Decision) -> bool:
        """A PVE method without `permissions` (execute, disks/wipedisk, cluster/config, ...) is for
        root@pam only, never a token: sent with root@pam's password login where one is set beside the
        token (pve-access-control RPCEnvironment.pm check_api2_permissions; PROXMOX-BEHAVIOUR.md#nested-execute)."""
        entry = decision.entry or {}
        return (self.host.product == "pve" and self.host.user == "root@pam" and bool(self.host.password)
                and bool(entry) and not entry.get("check") and entry.get("user") not in ("all", "world"))

    def _fetch(self, path: str, params: dict[str, Any], timeout: float | None = None, **how: bool) -> Any:
        """A GET sent once per tool call: the answer a read of the same path and parameters got in
        this call, until a write or a wait (calls.Reads); a copy, since callers change what they get.
        `how`: the token or login it goes with (a read sent with the write token is kept apart)."""
        reads = calls.current().reads
        key = reads.key(self.host.product, self.host.label, path, params) + tuple(k for k, v in how.items() if v)
        kept = reads.get(key)
        if kept is None:
            self._envelope.total = None
            data = self._send("GET", path, params, timeout, **how)
            kept = (data, self._envelope.total)
            reads.keep(key, *kept)
        self._envelope.total = kept[1]
        return copy.deepcopy(kept[0])

    def _dry_run_plan(self, decision: policy.Decision) -> dict:
        protection = ("names no protected guest" if not decision.guests
                      else f"names guest(s) {', '.join(map(str, decision.guests))}, none protected")
        plan = {"dry_run": True, "host": self.host.label,
                "request": {"method": decision.method, "path": decision.path,
                            "params": mask_params(decision.params)},
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
                return self.read(path)
            except ToolFailure:
                continue
        return None

    def ensure_permissions(self) -> None:
        """Read the token's own privileges once per host (at start, or at first use)."""
        if privileges.permissions_of(self.host) is not None or time.monotonic() < self._permissions_retry:
            return
        with self._permissions_lock:
            if privileges.permissions_of(self.host) is not None:
                return
            try:
                self._permissions_retry = time.monotonic() + 60  # a failed read is retried later
                permissions = self._send("GET", "/access/permissions", {}, timeout=5)
                if self.host.product == "pve":
                    self.release()
                privileges.set_permissions(self.host, permissions or {})
            except ProxmoxError as exc:
                log.info("could not read the privileges of %s: %s", self.host.label, exc)

    def release(self) -> tuple[int, ...] | None:
        """The product's version as numbers, read once: PVE 9.2.1 is (9, 2, 1), PBS 3.2.7 (`version` 3.2,
        `release` 7) is (3, 2, 7). PVE's agent privileges depend on it (privileges.version_privileges), and
        what older Backup Servers offer (pbs_tools.SINCE). None when it cannot be read: callers then
        assume the current release."""
        with self._release_lock:
            if not self._release_read:
                self._release_read = True
                try:
                    answer = self._send("GET", "/version", {}, timeout=5) or {}
                except ProxmoxError as exc:
                    log.info("could not read the version of %s: %s", self.host.label, exc)
                    return None
                self._release = parse_release(answer)
                privileges.set_version(self.host, answer.get("version"))
        return self._release

    def _send(self, method: str, path: str, params: dict[str, Any], timeout: float | None = None, *,
              writer: bool = False, ticket: bool = False) -> Any:
        import requests
        url = self.base + quote(path, safe="/:@!=,")
        send_as = {"params": params} if method in ("GET", "DELETE") else {"data": params}
        attempts = 3 if method == "GET" else 1
        read_timeout = timeout or self.host.read_timeout
        renewed = login_again = False
        use_ticket = ticket
        failed = self._slow_failure  # a host that just took the whole connect timeout to fail is not tried again
        if failed and time.monotonic() - failed[0] < self.host.connect_timeout:
            raise failed[1]
        for attempt in range(attempts + 2):
            headers = self._auth_headers(method, renew=login_again, ticket=use_ticket, writer=writer)
            login_again = False
            started = time.monotonic()
            try:
                response = fanout.sent(f"{self.host.product}:{self.host.label}", path, self.session.request,
                    method, url, headers=headers,
                    timeout=(min(self.host.connect_timeout, read_timeout), read_timeout), verify=self.verify,
                    allow_redirects=False, **send_as)
                if response.status_code == 401 and self.host.password and not renewed \
                        and (use_ticket or not self.host.token_secret):
                    renewed = login_again = True  # the ticket expired or the server restarted: retry once
                    continue
                if response.status_code == 403 and self.host.password and self.host.token_secret \
                        and not use_ticket and ("need proper ticket" in response.text or (
                            "user != root@pam" in response.text and self.host.user == "root@pam")):
                    # an endpoint Proxmox refuses to tokens, or one for root@pam only (no `permissions`:
                    # execute, wipedisk; a token's user is its token id): the password login instead
                    use_ticket = True
                    continue
                break
            except requests.exceptions.SSLError as exc:
                raise self._tls_error(exc) from None
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
        return self._data(method, path, response)

    def _data(self, method: str, path: str, response: requests.Response) -> Any:
        """The `data` of a JSON answer; of a file download (file-restore, pxar) only its size: its
        bytes never go into an answer (write_restore_file saves them)."""
        if response.headers.get("Content-Type", "").startswith("application/octet-stream"):
            return {"download": f"a file of {len(response.content)} bytes, not shown",
                    "next": "write_restore_file saves files from backups"}
        try:
            body = response.json()
            self._envelope.total = body.get("total")
            return body.get("data")
        except ValueError:
            raise ProxmoxError(f"Host '{self.host.label}' sent a non-JSON answer to {method} {path}; "
                               f"is {self.host.url} really {self.product.name}?") from None

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params)

    def download(self, path: str, params: dict[str, Any], destination: Sink, max_bytes: int,
                 also: tuple[str, str] | None = None) -> int:
        """A file Proxmox streams instead of JSON (file-restore, pxar downloads), admitted like any
        request, written to `destination` (a new file it opens) and never beyond `max_bytes`;
        the byte count. `also` (gate, why) raises the call's gates: saving to disk is the tool's
        own act."""
        params = encode_params(params)
        self.ensure_permissions()
        decision = policy.classify(self.host, "GET", path, params, self.read)
        if also:
            decision.gates = combine(set(decision.gates) | {also[0]})
            decision.reasons.append(also[1])
        return policy.admit(self.host, "GET", path, params, lambda d: self._stream(d, destination, max_bytes),
                            read=self.read, plan=self._dry_run_plan, decision=decision)

    def _stream(self, decision: policy.Decision, destination: Sink, max_bytes: int) -> int:
        import requests
        url = self.base + quote(decision.path, safe="/:@!=,")
        try:
            response = self.session.get(url, params=decision.params, headers=self._auth_headers("GET"),
                                        timeout=(self.host.connect_timeout, self.host.read_timeout),
                                        verify=self.verify, allow_redirects=False, stream=True)
        except requests.exceptions.SSLError as exc:
            raise self._tls_error(exc) from None
        except requests.exceptions.RequestException as exc:
            raise self._connection_error(exc) from None
        with response:
            self._refuse_redirect(response)
            if response.status_code >= 400:
                raise self._http_error("GET", decision.path, response)
            return _save(response, destination, max_bytes, f"{decision.path} on host '{self.host.label}'")

    def get_counted(self, path: str, **params: Any) -> tuple[Any, int | None]:
        """A GET and the `total` its answer's envelope carries (logs count every line, shown or not)."""
        self._envelope.total = None
        return self.get(path, **params), self._envelope.total

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
        prefix = self.product.env_prefix if self.host.label == "default" else self.product.host_prefix(self.host.label)
        if self.host.url.startswith("http://") and location.startswith("https://"):
            raise ProxmoxError(
                f"Host '{self.host.label}': port {urlsplit(self.host.url).port} speaks TLS, so {self.host.url} answers "
                f"with a redirect to https. Set {prefix}_URL={'https://' + self.host.url[len('http://'):]} (and pin "
                f"its certificate with {prefix}_FINGERPRINT).")
        raise ProxmoxError(f"Host '{self.host.label}' ({self.host.url}) answered with a redirect to "
                           f"{location[:200]!r}; set the URL of the Proxmox API itself.")

    def _tls_error(self, exc: Exception) -> ProxmoxError:
        """Why the certificate was refused and what to do: a pin that no longer matches is most
        likely a renewed certificate (docs/PROXMOX-BEHAVIOUR.md#certificate-renewal)."""
        var = self.product.host_prefix(self.host.label)
        offered = server_fingerprint(self.host.url)
        seen = f" The server offers SHA-256 {offered}." if offered else ""
        renewal, command, ca_file = RENEWAL[self.host.product]
        if self.host.fingerprint:
            instead = (f" To stop re-pinning, trust the cluster CA instead: {var}_CA_FILE=<a copy of {ca_file}> "
                       f"(it stays the same when node certificates renew).") if ca_file else ""
            return ProxmoxError(
                f"TLS certificate of host '{self.host.label}' does not match the pinned fingerprint "
                f"({var}_FINGERPRINT).{seen} Most likely the certificate was renewed: {renewal}. Compare "
                f"the offered fingerprint with {command}; if they match, set {var}_FINGERPRINT=<that value>."
                f"{instead} If they do not match, someone may be intercepting the connection: do not pin it.")
        reason = re.search(r"certificate verify failed: ([^(]+)", str(exc))
        why = f" ({reason.group(1).strip()})" if reason else ""
        if self.host.ca_file:
            return ProxmoxError(
                f"TLS certificate of host '{self.host.label}' does not verify against the CA in "
                f"{self.host.ca_file} ({var}_CA_FILE){why}.{seen} Check that the file is the CA that signed "
                f"this node's certificate and that {self.host.url} uses a name the certificate carries.")
        return ProxmoxError(
            f"TLS certificate of host '{self.host.label}' could not be verified (self-signed?){why}.{seen} "
            f"Pin it with {var}_FINGERPRINT=<that value>, or give the cluster CA in {var}_CA_FILE.")

    def _http_error(self, method: str, path: str, response: requests.Response) -> ProxmoxError:
        status = response.status_code
        message, errors = _error_text(response)
        where = f"{method} {path} on host '{self.host.label}'"
        if status == 401 and self.host.password:
            text = (f"Authentication failed for {where} even after a fresh login as {self.host.user}: "
                    f"{message or 'the ticket was refused'}.")
        elif status == 401:
            var = self.host.write_token_variable if method != "GET" and self.host.write_token_id \
                else self.host.token_variable
            text = (f"Authentication failed for {where}: the API token was refused (wrong, expired or "
                    f"deleted). Check {var or 'its token variable'}; the expected form is user@realm!tokenid=secret.")
        elif status == 403:  # a write went with the write token: the grant is for that one
            writer = method != "GET" and self.host.write_token_id
            text = _permission_message(where, message, replace(self.host, token_id=writer) if writer else self.host)
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
        (PVE: lines to skip), so it is sent one higher there (docs/PROXMOX-BEHAVIOUR.md#pbs-tasks).
        PVE before 7.3 answers limit=0 with nothing, so "all" is asked as a limit no log reaches
        (docs/PROXMOX-BEHAVIOUR.md#pve-tasks)."""
        first, limit = start + self.product.first_log_line, limit or self.product.all_log_lines
        return self.get(f"/nodes/{self.task_node(upid)}/tasks/{upid}/log", start=first, limit=limit) or []

    def wait_task(self, upid: str, timeout: float = 30.0,
                  on_progress: Callable[[float | None, str], None] | None = None) -> dict:
        """Poll a task until it stops or the deadline passes.

        Returns the final status with `result` "ok" or "warnings", or {"status": "still_running"}
        at the deadline. A failed task raises TaskFailed carrying the last log lines.
        """
        def read() -> dict:
            status = self.task_status(upid)
            if status.get("status") == "running" and on_progress:
                lines = self.task_log(upid, start=0, limit=0)
                text = next((line["t"] for line in reversed(lines) if PERCENT.search(line.get("t", ""))), "")
                match = PERCENT.search(text)
                on_progress(float(match.group(1)) if match else None, text or "running")
            return status
        status, ended = poll(read, lambda status: status.get("status") != "running", timeout, pause=0.2, growth=1.5)
        if ended:
            return self._finished(upid, status)
        return {"status": "still_running", "upid": upid,
                "next": f"call {self.product.task_tool} with this upid and wait_seconds to keep waiting"}

    def _finished(self, upid: str, status: dict) -> dict:
        exit_status = status.get("exitstatus", "")
        result = {"status": "stopped", "upid": upid, "exitstatus": exit_status}
        if exit_status == "OK":
            return result | {"result": "ok"}
        if exit_status.startswith("WARNINGS"):
            lines = [line["t"] for line in self.task_log(upid, limit=0) if "WARN" in line.get("t", "")]
            return result | {"result": "warnings", "warnings": lines[-10:]}
        tail = [line["t"] for line in self.task_log(upid, limit=0)][-8:]
        raise TaskFailed(f"Task {upid} failed: {exit_status}. Last log lines: " + " | ".join(tail), upid=upid,
                         exit_status=exit_status)


# ---------------------------------------------------------------- downloads

class Sink(Protocol):
    """Where a streamed answer goes (file_restore.NewFile): opened when the answer starts, written part
    by part, kept when all of it came, dropped (nothing left behind) otherwise."""
    def open(self) -> None: ...
    def write(self, data: bytes) -> None: ...
    def keep(self) -> None: ...
    def drop(self) -> None: ...


def _save(response: requests.Response, destination: Sink, max_bytes: int, what: str) -> int:
    """The body of a streamed answer into `destination`, all or nothing: a body over `max_bytes` or a
    broken transfer leaves nothing behind."""
    import requests
    written = 0
    destination.open()
    try:
        for chunk in response.iter_content(chunk_size=1 << 16):
            written += len(chunk)
            if written > max_bytes:
                raise ProxmoxError(f"{what} is larger than the {max_bytes // 1024 ** 2} MiB cap "
                                   f"(PROXMOX_RESTORE_MAX_MB); nothing was kept.")
            destination.write(chunk)
        destination.keep()
    except requests.exceptions.RequestException as exc:
        destination.drop()
        raise ProxmoxError(f"The download of {what} broke off after {written} bytes ({exc}); nothing was "
                           f"kept.") from None
    except BaseException:
        destination.drop()
        raise
    return written


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
    # PBS names privileges first: `missing permissions 'A|B' on '/x'` (cached_user_info.rs) or, for
    # namespaced reads, `permission check failed - missing A|B on /x` (hierarchy.rs check_ns_privs_full)
    if "user != root@pam" in message:  # a method without `permissions` (RPCEnvironment.pm check_api2_permissions)
        prefix = PRODUCTS[host.product].host_prefix(host.label)
        return (f"{where} is allowed to root@pam only ({message}): Proxmox refuses it to every API token, "
                f"root@pam's included. Set {prefix}_USER=root@pam and {prefix}_PASSWORD beside the token to have "
                f"it sent with that login.")
    match = re.search(r"Permission check failed \(([^,]+), ([^)]+)\)", message) or \
        re.search(r"missing permissions '([^']+)' on '([^']+)'", message) or \
        re.search(r"missing ([\w.|]+) on (/\S*)", message)
    if not match:
        if "API token" in message:
            return f"{where} refused: {message} This endpoint needs a user login, not a token."
        return f"Permission denied for {where}: {message}"
    if "missing" in message:  # PBS: privileges first, then path
        lacking, acl_path = match.group(1), match.group(2)
    else:
        acl_path, lacking = match.group(1), match.group(2)
    return f"Permission denied for {where}: the token lacks {lacking} on {acl_path}. " + \
        privileges.grant_hint(host, lacking, acl_path)


# Locks no task holds (docs/PROXMOX-BEHAVIOUR.md#guest-status): what to do about each.
PERSISTENT_LOCKS = {
    "suspended": "The VM is hibernated (its memory saved to disk; no task holds this lock): start it to resume "
                 "(write_power_guest action=start).",
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
    (r"(VM|CT) \d+ is not running|not running", "Start the guest first (write_power_guest action=start)."),
    (r"does not exist", "Check the id with list_guests or list_storage."),
)


def _hint_for(message: str, where: str = "") -> str | None:
    for pattern, hint in HINTS:
        match = re.search(pattern, message, re.IGNORECASE)
        if match:
            return hint(match, f"{where} {message}") if callable(hint) else hint.format(*match.groups())
    return None


# ---------------------------------------------------------------- configured hosts

_hosts = runtime.slot("proxmox_client.hosts", lambda: {"pve": {}, "pbs": {}})  # product -> label -> HostConfig
_clients = runtime.slot("proxmox_client.clients", dict[tuple[str, str], "ProxmoxClient"])  # made at first use
_clients_lock = threading.Lock()


def configure_hosts(hosts: list[HostConfig]) -> None:
    """Set the hosts tools may use (called once at start). Nothing connects here."""
    configured_hosts = _hosts.get()
    configured_hosts["pve"].clear()
    configured_hosts["pbs"].clear()
    _clients.get().clear()
    for host in hosts:
        configured_hosts[host.product][host.label] = host


def configured(product: str) -> dict[str, HostConfig]:
    return _hosts.get()[product]


def client_for(product: str, label: str | None) -> ProxmoxClient:
    """The client of a configured host by label; the label may be left out when there is one."""
    hosts = configured(product)
    name = PRODUCTS[product].name
    if label is None:
        reach = policy.current_call().reach  # a principal limited to some hosts: the one of them it reaches
        reachable = [k for k in hosts if reach is None or reach.reaches(k)] or list(hosts)
        if len(reachable) == 1:
            label = reachable[0]
        elif not hosts:
            prefix = PRODUCTS[product].env_prefix
            raise ProxmoxError(f"No {name} host is configured. Set {prefix}_<LABEL>_URL and {prefix}_<LABEL>_TOKEN.")
        else:
            raise InvalidArgument(f"Several {name} hosts are configured ({', '.join(sorted(reachable))}): pass host.")
    key = label.lower()
    if key not in hosts:
        known = ", ".join(sorted(hosts)) or "none"
        raise InvalidArgument(f"No {name} host labelled '{label}'. Configured: {known} (see list_hosts).")
    clients = _clients.get()
    with _clients_lock:
        if (product, key) not in clients:
            clients[(product, key)] = ProxmoxClient(hosts[key])
        return clients[(product, key)]


def pve_client(label: str | None = None) -> ProxmoxClient:
    return client_for("pve", label)


def pbs_client(label: str | None = None) -> ProxmoxClient:
    return client_for("pbs", label)
