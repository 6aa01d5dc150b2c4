"""The HTTPS front: one loopback server per product, a self-signed certificate, and the
request handler that turns HTTP into `api.handle` calls and answers in each product's
format. `Simulator` starts and stops it all.
"""
from __future__ import annotations

import json
import re
import socket
import ssl
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from .api import handle
from .call import ApiError, Download
from .lab import Lab

API_VIEWER = {"pve": "/pve-docs/api-viewer/apidoc.js", "pbs": "/docs/api-viewer/apidoc.js"}


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed-ACK stall
    server_version = "pve-api-daemon/3.0"
    lab: Lab
    product: str
    schema_dir: Path | None = None  # where {product}-api.json, the viewer's data, is kept
    front: "Simulator"  # the running simulator, for settings that may change while it serves

    def log_message(self, *args: Any) -> None:  # keep test output clean
        pass

    def _respond(self) -> None:
        if not isinstance(self.connection, ssl.SSLSocket):
            return self._redirect_to_https()
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        form = True
        params: dict[str, Any] = {}
        if body:
            if (self.headers.get("Content-Type") or "").startswith("application/json"):
                params = json.loads(body or b"{}")
                form = False
            else:
                params = _flatten(parse_qs(body.decode(), keep_blank_values=True))
        # query keys win (docs/PROXMOX-BEHAVIOUR.md#request-encoding)
        params |= _flatten(parse_qs(parts.query, keep_blank_values=True))
        if not parts.path.startswith("/api2/json/") and parts.path != "/api2/json":
            return self._document(parts.path)
        api_path = parts.path[len("/api2/json"):] or "/"
        try:
            data = handle(self.lab, self.product, self.command, api_path, params,
                          self.headers.get("Authorization", ""), form=form,
                          cookie=self.headers.get("Cookie", ""), csrf=self.headers.get("CSRFPreventionToken", ""))
        except ApiError as exc:
            return self._send_error(exc)
        if isinstance(data, Download):  # a file: the bytes themselves, no JSON envelope
            return self._send(200, "OK", data.data, raw=True, content_type="application/octet-stream")
        body_out: dict[str, Any] = {"data": data}
        if isinstance(data, list) and re.search(r"/tasks(/[^/]+/log)?$", api_path):
            body_out["total"] = len(data)
        elif getattr(data, "total", None) is not None:  # the logs count every line, shown or not
            body_out["total"] = data.total
        self._send(200, "OK", body_out)

    def _document(self, path: str) -> None:
        """A file beside the API: the API viewer's data (when the simulator was given some; a redirect
        when a test asks, as a proxy in front might answer), else 404. Each is recorded for tests."""
        self.front.documents.append((self.product, path))
        if path != API_VIEWER[self.product]:
            return self._send(404, "Not Found", None)
        if self.front.viewer_redirect:
            self.send_response(302, "Found")
            self.send_header("Location", self.front.viewer_redirect)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        schema = self.schema_dir / f"{self.product}-api.json" if self.schema_dir else None
        if schema is not None and schema.is_file():
            return self._send(200, "OK", f"const apiSchema = {schema.read_text()};\n", raw=True)
        return self._send(404, "Not Found", None)

    def _redirect_to_https(self) -> None:
        """Plain HTTP on the TLS port: 301 for GET and HEAD, 308 for the rest, to https on the same
        Host; PVE keeps the path, PBS does not (docs/PROXMOX-BEHAVIOUR.md#plain-http-on-the-tls-port)."""
        status = 301 if self.command in ("GET", "HEAD") else 308
        location = "https://" + (self.headers.get("Host") or "") + (self.path if self.product == "pve" else "")
        self.send_response(status, "Moved Permanently" if status == 301 else "Permanent Redirect")
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def _send_error(self, exc: ApiError) -> None:
        reason = exc.message.splitlines()[0]  # only the first line reaches the reason phrase
        if self.product == "pbs":
            # PBS: plain text under a JSON content type; plain errors are 400 (docs/PROXMOX-BEHAVIOUR.md#pbs-errors)
            text = exc.message
            if exc.errors:
                text = "parameter verification errors\n\n" + "".join(
                    f"parameter '{k}': {v}\n" for k, v in exc.errors.items())
            return self._send(exc.status, reason, text, raw=True)
        body: dict[str, Any] = {"data": None}
        if exc.errors:
            body["errors"] = {k: v + "\n" for k, v in exc.errors.items()}
        if not self.lab.legacy_errors:
            body["message"] = exc.message + "\n"
        self._send(exc.status, reason, body)

    def _send(self, status: int, reason: str, body: Any, raw: bool = False,
              content_type: str = "application/json;charset=UTF-8") -> None:
        payload = (body if raw else json.dumps(body)) if body is not None else b""
        payload = payload.encode() if isinstance(payload, str) else payload
        if self.front.answer_delay:  # the host's own answer time, for bench/ (see Simulator)
            time.sleep(self.front.answer_delay)
        self.send_response(status, reason)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _respond


def _flatten(parsed: dict[str, list[str]]) -> dict[str, Any]:
    return {k: v[0] if len(v) == 1 else v for k, v in parsed.items()}


# ---------------------------------------------------------------- TLS and serving

def make_certificate(directory: Path, common_name: str = "localhost", *, days: int = 365,
                     ca: tuple[Any, Any] | None = None,
                     names: tuple[str, ...] = ("localhost", "127.0.0.1")) -> tuple[Path, Path, str]:
    """A certificate for `names` valid `days` more days, self-signed or signed by `ca` (its
    certificate and key, see make_cluster_ca); returns (cert, key, SHA-256 fingerprint)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    issuer, signer = (ca[0].subject, ca[1]) if ca else (name, key)
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
               .not_valid_after(now + datetime.timedelta(days=days))
               .add_extension(x509.SubjectAlternativeName([
                   x509.IPAddress(ipaddress.ip_address(n)) if n[0].isdigit() else x509.DNSName(n) for n in names]),
                   critical=False))
    if ca:  # as pve-cluster's node certificates (Setup.pm, gen_pve_ssl_cert)
        builder = (builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=False)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()),
                                  critical=False)
                   .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False))
    cert = builder.sign(signer, hashes.SHA256())
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    digest = cert.fingerprint(hashes.SHA256()).hex().upper()
    return cert_path, key_path, ":".join(digest[i:i + 2] for i in range(0, len(digest), 2))


def make_cluster_ca(path: Path, *, key_usage: bool = True) -> tuple[Any, Any]:
    """A cluster CA as pve-cluster makes it (Setup.pm, gen_pveca_cert: 10 years; the keyUsage
    extension only from 9.1.2 on, so older clusters have none), written to `path` like
    /etc/pve/pve-root-ca.pem; returns its certificate and key for make_certificate."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Proxmox Virtual Environment")])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
               .not_valid_after(now + datetime.timedelta(days=3650))
               .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False))
    if key_usage:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=False, content_commitment=False, key_encipherment=False, data_encipherment=False,
            key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False),
            critical=True)
    cert = builder.sign(key, hashes.SHA256())
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert, key


class _Server(ThreadingHTTPServer):
    """TLS and plain HTTP on one port, told apart by the first byte (a TLS handshake starts with 0x16):
    plain HTTP is answered with a redirect to https, as both products do
    (docs/PROXMOX-BEHAVIOUR.md#plain-http-on-the-tls-port)."""
    daemon_threads = True
    # socketserver's default backlog of 5 drops the SYNs of a client
    # opening many connections at once (reads side by side), which then wait out the connect timeout
    request_queue_size = 512
    tls: ssl.SSLContext

    def finish_request(self, request: Any, client_address: Any) -> None:
        try:
            request.settimeout(10)
            first = request.recv(1, socket.MSG_PEEK)
            request.settimeout(None)
            if first == b"\x16":
                request = self.tls.wrap_socket(request, server_side=True)
        except (OSError, ssl.SSLError):
            return  # a client that hung up or failed the handshake
        super().finish_request(request, client_address)
        request.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up (a timeout test) is not an error of the simulator


class Simulator:
    """Serves a Lab as PVE and PBS over HTTPS on ephemeral loopback ports."""

    def __init__(self, lab: Lab | None = None, host: str = "127.0.0.1", schema_dir: str | Path | None = None,
                 answer_delay: float = 0.0):
        """`schema_dir` holds pve-api.json/pbs-api.json, served as each product's API viewer
        data (apidoc.js); without it the viewer answers 404, as on a host that has none.
        `answer_delay`: seconds every answer waits before it is sent (this simulator alone answers
        in well under a millisecond; bench/ compares at 0, 10 and 20 ms); may be changed while
        serving. A slow-server fault for tests is `Lab.delay` / `Lab.slow_paths` instead."""
        self.lab = lab or Lab.homelab()
        self.host = host
        self.answer_delay = answer_delay
        self.schema_dir = Path(schema_dir) if schema_dir is not None else None
        self._dir = tempfile.TemporaryDirectory(prefix="pve-sim-")
        self.state_dir = self._dir.name
        self.cert_file, key_file, self.fingerprint = make_certificate(Path(self._dir.name))
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._context.load_cert_chain(self.cert_file, key_file)
        self._servers: dict[str, ThreadingHTTPServer] = {}
        self.documents: list[tuple[str, str]] = []  # (product, path) of each request beside the API
        self.viewer_redirect: str | None = None  # the API viewer answers a redirect there

    def start(self) -> "Simulator":
        for product in ("pve", "pbs"):
            attributes = {"lab": self.lab, "product": product, "schema_dir": self.schema_dir, "front": self}
            handler = type(f"{product}Handler", (_RequestHandler,), attributes)
            server = _Server((self.host, 0), handler)
            server.tls = self._context
            # shutdown() waits for the loop's next poll: 50 ms instead of the default 500 at every stop
            threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True,
                             name=f"sim-{product}").start()
            self._servers[product] = server
        return self

    def serve_certificate(self, cert_file: Path, key_file: Path, fingerprint: str) -> None:
        """Offer another certificate from the next connection on, as a node does after pveupdate
        renewed its own (docs/PROXMOX-BEHAVIOUR.md#certificate-renewal)."""
        self._context.load_cert_chain(cert_file, key_file)
        self.cert_file, self.fingerprint = cert_file, fingerprint

    def url(self, product: str) -> str:
        return f"https://{self.host}:{self._servers[product].server_address[1]}"

    @property
    def pve_url(self) -> str:
        return self.url("pve")

    @property
    def pbs_url(self) -> str:
        return self.url("pbs")

    def env(self, label: str = "lab", pve_token: str = "mcp@pve!reader", pbs_token: str = "mcp@pbs!reader",
            pbs: bool = True) -> dict[str, str]:
        """Environment variables that point the server at this simulator (fingerprint pinned)."""
        secret = self.lab.pve_tokens[pve_token].secret
        key = label.upper()
        env = {f"PROXMOX_{key}_URL": self.pve_url, f"PROXMOX_{key}_TOKEN": f"{pve_token}={secret}",
               f"PROXMOX_{key}_FINGERPRINT": self.fingerprint}
        if pbs:
            env |= {f"PBS_{key}_URL": self.pbs_url,
                    f"PBS_{key}_TOKEN": f"{pbs_token}:{self.lab.pbs_tokens[pbs_token].secret}",
                    f"PBS_{key}_FINGERPRINT": self.fingerprint}
        return env

    def stop(self) -> None:
        for server in self._servers.values():
            server.shutdown()
            server.server_close()
        self._servers.clear()
        self._dir.cleanup()

    def __enter__(self) -> "Simulator":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
