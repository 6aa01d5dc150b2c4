"""An external identity provider (MCP_OAUTH_ISSUER): this server as a resource server only, against a
test issuer on 127.0.0.1 whose keys the test makes with cryptography and whose JWTs it signs with
PyJWT (RS256 and ES256). Accepted: a token signed by a key of the issuer's JWKS, for this audience,
within exp and nbf; its scopes or groups give the profile. Refused (401): another audience, expired,
not yet valid, another issuer, an unknown key, a forged or unsigned token. The keys are read again
for a new key id, at most once a minute."""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
import pytest
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

import oauth_client as oc
from conftest import everything_open, requests_during, run_server
from test_http import free_port, http_server
from test_principals import audit_lines, names, session_as


class LoopbackIssuer:
    """An OpenID provider's discovery document and JWKS on loopback; it counts the JWKS reads."""

    def __init__(self):
        self.keys: dict[str, object] = {}  # kid -> private key
        self.published: list[str] = []  # the kids the JWKS lists
        self.jwks_reads = 0
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path == "/.well-known/openid-configuration":
                    body = {"issuer": issuer.url, "jwks_uri": issuer.url + "/jwks",
                            "authorization_endpoint": issuer.url + "/authorize",
                            "token_endpoint": issuer.url + "/token"}
                elif self.path == "/jwks":
                    issuer.jwks_reads += 1
                    body = {"keys": [issuer.jwk(kid) for kid in issuer.published]}
                else:
                    self.send_error(404)
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_args):
                pass
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add_key(self, kid: str, kind: str = "RS256", publish: bool = True) -> None:
        self.keys[kid] = rsa.generate_private_key(65537, 2048) if kind == "RS256" else \
            ec.generate_private_key(ec.SECP256R1())
        if publish:
            self.published.append(kid)

    def jwk(self, kid: str) -> dict:
        key = self.keys[kid]
        if isinstance(key, rsa.RSAPrivateKey):
            return jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key(), as_dict=True) | {
                "kid": kid, "use": "sig", "alg": "RS256"}
        return jwt.algorithms.ECAlgorithm.to_jwk(key.public_key(), as_dict=True) | {"kid": kid, "use": "sig",
                                                                                      "alg": "ES256"}

    def token(self, kid: str = "rsa-1", audience: str = "", **claims) -> str:
        key = self.keys[kid]
        now = int(time.time())
        body = {"iss": self.url, "sub": "alice", "aud": audience, "iat": now, "exp": now + 300} | claims
        return jwt.encode(body, key, algorithm="RS256" if isinstance(key, rsa.RSAPrivateKey) else "ES256",
                          headers={"kid": kid})

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def issuer():
    running = LoopbackIssuer()
    running.add_key("rsa-1")
    running.add_key("ec-1", "ES256")
    yield running
    running.close()


@pytest.fixture(scope="module")
def served(sim, issuer, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("idp")
    (tmp / "protected.json").write_text("[]")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = everything_open(sim, tmp) | {"MCP_OAUTH_ISSUER": issuer.url, "MCP_PUBLIC_URL": base,
                                       "MCP_OAUTH_PROFILES": "proxmox-admins=admin,proxmox-ops=operate"}
    with http_server(env, port=port) as url:
        yield url, url + "/mcp", tmp


def test_the_resource_names_the_identity_provider(served, issuer):
    base, _, _ = served
    resource = requests.get(base + "/.well-known/oauth-protected-resource/mcp", timeout=10).json()
    assert resource["authorization_servers"] == [issuer.url] and resource["resource"] == base + "/mcp"
    for path in ("/.well-known/oauth-authorization-server", "/authorize", "/token", "/register"):
        assert requests.get(base + path, timeout=10).status_code == 401, path  # no authorization server here
    refused = requests.post(base + "/mcp", json=oc.INIT, headers=oc.HEADERS, timeout=10)
    assert refused.status_code == 401 and "resource_metadata=" in refused.headers["www-authenticate"]


def test_a_group_gives_its_profile_and_the_principal_is_the_subject(served, issuer, sim):
    base, audience, tmp = served
    with session_as(audience, issuer.token(audience=audience, groups=["staff", "proxmox-ops"])) as alice:
        listed = names(alice)
        assert "write_create_snapshot" in listed and "write_delete_guest" not in listed
        assert alice.ok("list_guests", {"status": "running"})["total"] == 4
        alice.ok("write_create_snapshot", {"vmid": 100, "name": "by-idp", "dry_run": True})
    assert audit_lines(tmp)[-1]["principal"] == "idp:alice"


def test_es256_and_a_scope(served, issuer):
    _, audience, _ = served
    token = issuer.token("ec-1", audience=audience, sub="bob", scope="openid proxmox:admin")
    with session_as(audience, token) as bob:
        assert "write_delete_guest" in names(bob)


def test_no_scope_or_group_it_knows_is_read(served, issuer):
    _, audience, _ = served
    with session_as(audience, issuer.token(audience=audience, groups=["staff"], scope="openid")) as carol:
        assert not [n for n in names(carol) if n.startswith("write_")]


@pytest.mark.parametrize("why, claims", [
    ("another audience", {"aud": "https://other.example/mcp"}),
    ("expired", {"exp": -600, "iat": -900}),  # times: seconds from when the test runs (not from the collection)
    ("not yet valid", {"nbf": 600}),
    ("another issuer", {"iss": "https://evil.example"}),
    ("no subject", {"sub": None}),
])
def test_refused_tokens(served, issuer, sim, why, claims):
    _, audience, _ = served
    now = int(time.time())
    claims = {"aud": audience} | {k: now + v if k in ("exp", "iat", "nbf") else v for k, v in claims.items()}
    token = issuer.token(**{k: v for k, v in claims.items() if k != "aud"}, audience=claims["aud"])
    if claims.get("sub", "") is None:
        token = jwt.encode({k: v for k, v in jwt.decode(token, options={"verify_signature": False}).items()
                            if k != "sub"}, issuer.keys["rsa-1"], algorithm="RS256", headers={"kid": "rsa-1"})
    status, sent = requests_during(sim, lambda: oc.mcp_status(audience.removesuffix("/mcp"), token))
    assert status == 401 and sent == [], why


def test_forged_and_unsigned_tokens_are_refused(served, issuer):
    base, audience, _ = served
    good = issuer.token(audience=audience, groups=["proxmox-admins"])
    head, body, signature = good.split(".")
    forged_body = jwt.utils.base64url_encode(json.dumps(jwt.decode(good, options={"verify_signature": False}) | {
        "sub": "mallory"}).encode()).decode()
    unsigned = jwt.encode(jwt.decode(good, options={"verify_signature": False}), None, algorithm="none")
    public_pem = issuer.keys["rsa-1"].public_key().public_bytes(serialization.Encoding.PEM,
                                                                serialization.PublicFormat.SubjectPublicKeyInfo)
    confused = hs256(jwt.decode(good, options={"verify_signature": False}), public_pem)
    for token in (f"{head}.{forged_body}.{signature}", unsigned, confused, good[:-4] + "AAAA"):
        assert oc.mcp_status(base, token) == 401
    assert oc.mcp_status(base, good) == 200


def hs256(claims: dict, secret: bytes) -> str:
    """A token MACed with the issuer's public key as an HMAC secret (the RS256/HS256 confusion)."""
    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).decode().rstrip("=")
    signing = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "rsa-1"}).encode()) + "." + \
        b64(json.dumps(claims).encode())
    return signing + "." + b64(hmac.new(secret, signing.encode(), hashlib.sha256).digest())


def test_a_new_key_is_read_once_and_unknown_keys_are_refused(served, issuer):
    base, audience, _ = served
    assert oc.mcp_status(base, issuer.token(audience=audience)) == 200
    before = issuer.jwks_reads
    issuer.add_key("rsa-2")  # the provider rotates: its JWKS lists a new key
    assert oc.mcp_status(base, issuer.token("rsa-2", audience=audience)) == 200
    assert issuer.jwks_reads == before + 1  # read again for the new key id
    issuer.add_key("rsa-unlisted", publish=False)
    for _ in range(3):  # a key the provider never published: refused, and the JWKS is not read again and again
        assert oc.mcp_status(base, issuer.token("rsa-unlisted", audience=audience)) == 401
    assert issuer.jwks_reads == before + 1
    assert oc.mcp_status(base, issuer.token("rsa-1", audience=audience)) == 200


def test_check_reports_the_identity_provider(sim, issuer, tmp_path):
    env = sim.env() | {"MCP_OAUTH_ISSUER": issuer.url, "MCP_PUBLIC_URL": "https://mcp.example.com",
                       "PROXMOX_AUDIT_LOG": str(tmp_path / "audit.jsonl")}
    checked = run_server(["--check"], env)
    assert f"identity provider {issuer.url}: reachable, " in checked.stdout, checked.stdout
    assert "audience https://mcp.example.com/mcp" in checked.stdout and checked.returncode == 0
    gone = run_server(["--check"], env | {"MCP_OAUTH_ISSUER": f"http://127.0.0.1:{free_port()}"})
    assert "UNREACHABLE" in gone.stdout and gone.returncode == 1


def test_an_audience_of_its_own(sim, issuer, tmp_path):
    (tmp_path / "protected.json").write_text("[]")
    port = free_port()
    env = everything_open(sim, tmp_path) | {"MCP_OAUTH_ISSUER": issuer.url, "MCP_PUBLIC_URL": f"http://127.0.0.1:{port}",
                                            "MCP_OAUTH_AUDIENCE": "proxmox-mcp"}
    with http_server(env, port=port) as base:
        assert oc.mcp_status(base, issuer.token(audience="proxmox-mcp")) == 200
        assert oc.mcp_status(base, issuer.token(audience=base + "/mcp")) == 401


def test_rfc_8414_metadata_when_there_is_no_openid_configuration():
    """An issuer with a path (Authentik's /application/o/<slug>/): OpenID discovery first, then RFC 8414
    with the path inserted after /.well-known/oauth-authorization-server; its `issuer` must be this one."""
    from auth import idp
    issuer = "https://auth.example.com/application/o/proxmox/"
    assert idp.metadata_urls(issuer) == [
        "https://auth.example.com/application/o/proxmox/.well-known/openid-configuration",
        "https://auth.example.com/.well-known/oauth-authorization-server/application/o/proxmox"]
    served = {idp.metadata_urls(issuer)[1]: {"issuer": issuer, "jwks_uri": "https://auth.example.com/jwks"}}

    def fetch(url):
        if url not in served:
            raise OSError("404 Not Found")
        return served[url]
    assert idp.Issuer(issuer, "aud", {}, fetch=fetch).discover() == "https://auth.example.com/jwks"
    served[idp.metadata_urls(issuer)[1]]["issuer"] = "https://evil.example/"
    with pytest.raises(LookupError, match="names issuer 'https://evil.example/'"):
        idp.Issuer(issuer, "aud", {}, fetch=fetch).discover()
