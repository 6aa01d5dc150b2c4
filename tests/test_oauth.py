"""The embedded authorization server (MCP_OAUTH=1, MCP_PUBLIC_URL) through a real server on
127.0.0.1: its metadata (RFC 9728, RFC 8414), dynamic registration (RFC 7591), the consent page that
grants nothing without the operator's secret, authorization code + PKCE S256, the SDK's client with
its OAuth support end to end, a client that authenticates only with the Basic header, refresh
rotation and the reuse of a refresh token, revocation (RFC 7009), and state that survives a restart
with only hashes in it. The consent page in a browser: tests/test_consent_view.py."""
from __future__ import annotations

import json
import sqlite3
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests
from anyio.from_thread import start_blocking_portal

import oauth_client as oc
from conftest import Session, everything_open, log_dir, requests_during, run_server
from test_http import free_port, http_server

SECRET = "test-bearer-token-0123456789abcdef"  # MCP_AUTH_TOKEN: the operator's secret on the consent page


def oauth_env(sim, tmp: Path, port: int) -> dict:
    (tmp / "protected.json").write_text("[]")
    return everything_open(sim, tmp) | {"MCP_AUTH_TOKEN": SECRET, "MCP_OAUTH": "1",
                                        "MCP_PUBLIC_URL": f"http://127.0.0.1:{port}",
                                        "PROXMOX_STATE_DB": str(tmp / "state.sqlite3")}


@pytest.fixture(scope="module")
def state(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("oauth")


@pytest.fixture(scope="module")
def base(sim, state):
    port = free_port()
    with http_server(oauth_env(sim, state, port), port=port) as url:
        yield url


@contextmanager
def oauth_session(url: str, operator, mode: str = "auto", **client_kw):
    """The SDK's client with its OAuth support (mcp.client.auth): it finds the metadata, registers,
    sends the user to /authorize (`operator` answers the consent page) and exchanges the code."""
    from mcp import Client
    from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider, TokenStorage
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client
    from mcp.shared.auth import OAuthClientMetadata
    import anyio.to_thread

    class Memory(TokenStorage):
        tokens = client = None

        async def get_tokens(self):
            return self.tokens

        async def set_tokens(self, tokens):
            self.tokens = tokens

        async def get_client_info(self):
            return self.client

        async def set_client_info(self, client_info):
            self.client = client_info
    answer = {}

    async def redirect(authorization_url: str) -> None:
        answer.update(await anyio.to_thread.run_sync(operator, authorization_url))

    async def callback() -> AuthorizationCodeResult:
        return AuthorizationCodeResult(code=answer["code"], state=answer.get("state"), iss=answer.get("iss"))
    storage = Memory()
    provider = OAuthClientProvider(url, OAuthClientMetadata(client_name="SDK client", redirect_uris=[oc.REDIRECT]),
                                   storage, redirect_handler=redirect, callback_handler=callback)
    with start_blocking_portal() as portal:
        transport = streamable_http_client(url, http_client=create_mcp_http_client(auth=provider))
        with portal.wrap_async_context_manager(Client(transport, mode=mode, **client_kw)) as client:
            session = Session(portal, client)
            session.storage = storage
            yield session


def operator_grants(base: str, profile: str):
    def answer(url: str) -> dict:
        assert url.startswith(base + "/authorize?")
        return oc.redirected(oc.consent(base, url, SECRET, profile))
    return answer


# ---------------------------------------------------------------- metadata and the 401

def test_the_resource_and_the_server_describe_themselves(base):
    resource = requests.get(base + "/.well-known/oauth-protected-resource/mcp", timeout=10).json()
    assert resource["resource"] == base + "/mcp" and resource["authorization_servers"] == [base]
    assert resource["scopes_supported"] == ["proxmox:read", "proxmox:operate", "proxmox:admin"]
    assert requests.get(base + "/.well-known/oauth-protected-resource", timeout=10).json() == resource
    server = requests.get(base + "/.well-known/oauth-authorization-server", timeout=10).json()
    assert server["issuer"] == base and server["code_challenge_methods_supported"] == ["S256"]
    assert {"none", "client_secret_basic"} <= set(server["token_endpoint_auth_methods_supported"])
    assert {"none", "client_secret_basic"} <= set(server["revocation_endpoint_auth_methods_supported"])
    assert server["registration_endpoint"] == base + "/register" and server["revocation_endpoint"] == base + "/revoke"
    assert server["grant_types_supported"] == ["authorization_code", "refresh_token"]
    assert server["response_types_supported"] == ["code"]


def test_mcp_answers_401_naming_the_resource_metadata(base):
    bare = requests.post(base + "/mcp", json=oc.INIT, headers=oc.HEADERS, timeout=10)
    assert bare.status_code == 401
    metadata = f"{base}/.well-known/oauth-protected-resource/mcp"
    assert bare.headers["www-authenticate"] == f'Bearer resource_metadata="{metadata}"'
    wrong = requests.post(base + "/mcp", json=oc.INIT, headers=oc.HEADERS | {"Authorization": "Bearer nope-nope-nope"},
                          timeout=10)
    assert wrong.status_code == 401 and 'error="invalid_token"' in wrong.headers["www-authenticate"]


def test_the_static_bearer_still_works_with_oauth_on(base):
    assert oc.mcp_status(base, SECRET) == 200


def test_authorize_refuses_what_oauth_2_1_leaves_out(base):
    client = oc.register(base)
    _, challenge = oc.pkce()
    no_pkce = oc.authorize_url(base, client["client_id"], challenge).replace(f"code_challenge={challenge}&", "")
    refusals = {
        oc.authorize_url(base, client["client_id"], challenge, code_challenge_method="plain"): "invalid_request",
        no_pkce: "invalid_request",  # PKCE S256 only
        oc.authorize_url(base, client["client_id"], challenge, response_type="token"): "unsupported_response_type",
        oc.authorize_url(base, client["client_id"], challenge, resource="https://elsewhere.example/mcp"):
            "invalid_target"}
    for url, error in refusals.items():  # a client nobody approved yet is never redirected to (F15): a page
        page = requests.get(url, allow_redirects=False, timeout=10)
        assert page.status_code == 400 and "location" not in page.headers and error in page.text, page.text
    oc.code_for(base, client["client_id"], SECRET)  # approved once: its errors go back to it (RFC 6749 4.1.2.1)
    for url, error in refusals.items():
        assert oc.redirected(requests.get(url, allow_redirects=False, timeout=10))["error"] == error
    foreign = oc.authorize_url(base, client["client_id"], challenge).replace("127.0.0.1%3A9", "evil.example")
    unknown = oc.authorize_url(base, "no-such-client", challenge)
    for url in (foreign, unknown):  # never redirected there, and a page, not JSON, for the browser
        page = requests.get(url, allow_redirects=False, timeout=10)
        assert page.status_code == 400 and "text/html" in page.headers["content-type"], page.text


@pytest.mark.parametrize("uri, allowed", [
    ("https://claude.ai/api/mcp/auth_callback", True), ("http://localhost:7777/oauth/callback", True),
    ("http://127.0.0.1:33418/", True), ("http://[::1]:8080/cb", True),
    ("http://mcp.example.com/cb", False), ("cursor://anysphere.cursor-mcp/oauth/callback", False),
    ("javascript:alert(1)", False), ("https://claude.ai/cb#x", False), ("http://localhost.evil.example/cb", False)])
def test_redirect_uris_are_https_or_loopback(base, uri, allowed):
    answer = requests.post(base + "/register", json={"redirect_uris": [uri], "token_endpoint_auth_method": "none"},
                           timeout=10)
    assert answer.status_code == (201 if allowed else 400), answer.text
    if not allowed:
        assert answer.json()["error"] in ("invalid_redirect_uri", "invalid_client_metadata")


# ---------------------------------------------------------------- the SDK's client end to end

@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_the_sdk_client_authorizes_and_calls_tools(base, sim, state, mode):
    with oauth_session(base + "/mcp", operator_grants(base, "operate"), mode=mode) as session:
        names = {t.name for t in session.tools()}
        assert "list_guests" in names and "write_create_snapshot" in names
        assert "write_delete_guest" not in names and "write_exec_guest" not in names  # beyond operate
        assert session.ok("list_guests", {"status": "running"})["total"] == 4
        message, sent = requests_during(sim, lambda: session.error("write_power_guest", {
            "vmid": 100, "action": "stop", "confirm": True}), writes=True)
        assert "beyond the profile 'operate'" in message and sent == []
        assert session.storage.tokens.scope == "proxmox:operate"
    lines = [json.loads(line) for line in (state / "audit.jsonl").read_text().splitlines()]
    grant = [line for line in lines if line.get("event") == "oauth_grant"][-1]
    assert grant["principal"].startswith("oauth:SDK client (") and grant["profile"] == "operate"
    refused = [line for line in lines if line.get("tool") == "write_power_guest"][-1]
    assert refused["verdict"] == "refused" and refused["principal"].startswith("oauth:SDK client (")


def test_no_scope_means_read(base):
    client = oc.register(base, scope=None)
    verifier, challenge = oc.pkce()
    page = requests.get(oc.authorize_url(base, client["client_id"], challenge, scope=None), timeout=10)
    assert oc.Form(page.text).profiles == ["read"]
    refused = requests.post(base + "/authorize/consent", data=oc.Form(page.text).fields | {
        "secret": SECRET, "profile": "admin", "action": "grant"}, allow_redirects=False, timeout=10)
    assert refused.status_code == 400 and "Choose one of the profiles offered" in refused.text
    answer = oc.redirected(oc.consent(base, oc.authorize_url(base, client["client_id"], challenge, scope=None),
                                      SECRET, "read"))
    tokens = oc.exchange(base, client["client_id"], answer["code"], verifier).json()
    assert tokens["scope"] == "proxmox:read" and tokens["token_type"] == "Bearer" and tokens["expires_in"] == 3600


# ---------------------------------------------------------------- codes

def test_a_wrong_verifier_gets_nothing_and_spends_the_code(base):
    client = oc.register(base)
    code, verifier = oc.code_for(base, client["client_id"], SECRET)
    wrong = oc.exchange(base, client["client_id"], code, oc.pkce()[0])
    assert wrong.status_code == 400 and wrong.json()["error"] == "invalid_grant"
    assert oc.exchange(base, client["client_id"], code, verifier).json()["error"] == "invalid_grant"


def test_a_code_works_once_for_its_client_and_redirect_uri(base):
    client, other = oc.register(base), oc.register(base)
    code, verifier = oc.code_for(base, client["client_id"], SECRET)
    assert oc.exchange(base, other["client_id"], code, verifier).json()["error"] == "invalid_grant"
    moved = oc.token(base, {"grant_type": "authorization_code", "code": code, "redirect_uri": "http://127.0.0.1:9/x",
                            "client_id": client["client_id"], "code_verifier": verifier})
    assert moved.status_code == 400
    code, verifier = oc.code_for(base, client["client_id"], SECRET)
    first = oc.exchange(base, client["client_id"], code, verifier).json()
    assert oc.mcp_status(base, first["access_token"]) == 200
    again = oc.exchange(base, client["client_id"], code, verifier)
    assert again.json()["error"] == "invalid_grant"
    assert oc.mcp_status(base, first["access_token"]) == 401  # a code used twice takes back what it gave
    assert oc.refresh(base, client["client_id"], first["refresh_token"]).json()["error"] == "invalid_grant"


# ---------------------------------------------------------------- refresh and revocation

def tokens_of(base: str, client: dict, profile: str = "read") -> dict:
    code, verifier = oc.code_for(base, client["client_id"], SECRET, profile)
    answer = oc.exchange(base, client["client_id"], code, verifier)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_refresh_rotates_and_a_reused_refresh_token_revokes_its_family(base, state):
    client = oc.register(base)
    first = tokens_of(base, client)
    second = oc.refresh(base, client["client_id"], first["refresh_token"]).json()
    assert second["refresh_token"] != first["refresh_token"] and second["access_token"] != first["access_token"]
    assert oc.mcp_status(base, second["access_token"]) == 200
    reused = oc.refresh(base, client["client_id"], first["refresh_token"])
    assert reused.status_code == 400 and reused.json()["error"] == "invalid_grant"
    assert oc.mcp_status(base, second["access_token"]) == 401  # the whole family
    assert oc.refresh(base, client["client_id"], second["refresh_token"]).json()["error"] == "invalid_grant"
    assert oc.mcp_status(base, first["access_token"]) == 401
    events = [json.loads(line).get("event") for line in (state / "audit.jsonl").read_text().splitlines()]
    assert "oauth_refresh_reused" in events


def test_a_refresh_may_narrow_but_never_widen(base):
    client = oc.register(base)
    first = tokens_of(base, client, "operate")
    wider = oc.token(base, {"grant_type": "refresh_token", "refresh_token": first["refresh_token"],
                            "client_id": client["client_id"], "scope": "proxmox:admin"})
    assert wider.json()["error"] == "invalid_scope"


def test_revocation_works_at_once_for_a_public_client(base):
    client = oc.register(base)
    first = tokens_of(base, client)
    assert oc.mcp_status(base, first["access_token"]) == 200
    revoked = requests.post(base + "/revoke", data={"token": first["access_token"], "client_id": client["client_id"]},
                            timeout=10)
    assert revoked.status_code == 200
    assert oc.mcp_status(base, first["access_token"]) == 401
    assert oc.refresh(base, client["client_id"], first["refresh_token"]).json()["error"] == "invalid_grant"
    again = tokens_of(base, client)  # a refresh token revokes its grant too
    assert requests.post(base + "/revoke", data={"token": again["refresh_token"], "client_id": client["client_id"],
                                                 "token_type_hint": "refresh_token"}, timeout=10).status_code == 200
    assert oc.mcp_status(base, again["access_token"]) == 401


def test_another_client_cannot_revoke_a_token(base):
    client, other = oc.register(base), oc.register(base)
    first = tokens_of(base, client)
    requests.post(base + "/revoke", data={"token": first["access_token"], "client_id": other["client_id"]}, timeout=10)
    assert oc.mcp_status(base, first["access_token"]) == 200


def test_an_expired_access_token_is_refused(base, state):
    client = oc.register(base)
    first = tokens_of(base, client)
    with sqlite3.connect(state / "state.sqlite3") as db:  # an hour later, as far as the token is concerned
        db.execute("UPDATE oauth_tokens SET expires = 0 WHERE kind = 'access' AND client_id = ?",
                   (client["client_id"],))
    assert oc.mcp_status(base, first["access_token"]) == 401
    renewed = oc.refresh(base, client["client_id"], first["refresh_token"]).json()
    assert oc.mcp_status(base, renewed["access_token"]) == 200


# ---------------------------------------------------------------- a client that speaks only Basic (RFC 6749 2.3.1)

def test_a_basic_only_confidential_client(base):
    client = oc.register(base, token_endpoint_auth_method="client_secret_basic", client_name="Basic only")
    assert client["client_secret"]
    pair = (client["client_id"], client["client_secret"])
    code, verifier = oc.code_for(base, client["client_id"], SECRET, "operate")
    form = {"grant_type": "authorization_code", "code": code, "redirect_uri": oc.REDIRECT, "code_verifier": verifier}
    wrong = oc.token(base, form, basic=(client["client_id"], "not-the-secret"))
    assert wrong.status_code == 401 and wrong.json()["error"] == "invalid_client"
    tokens = oc.token(base, form, basic=pair)  # the code survived: a client that failed to authenticate spent nothing
    assert tokens.status_code == 200, tokens.text
    tokens = tokens.json()
    assert tokens["scope"] == "proxmox:operate" and oc.mcp_status(base, tokens["access_token"]) == 200
    renewed = oc.token(base, {"grant_type": "refresh_token", "refresh_token": tokens["refresh_token"]}, basic=pair)
    assert renewed.status_code == 200, renewed.text
    no_secret = oc.token(base, {"grant_type": "refresh_token", "refresh_token": renewed.json()["refresh_token"],
                                "client_id": client["client_id"]})
    assert no_secret.status_code == 401  # a confidential client must authenticate
    revoked = requests.post(base + "/revoke", data={"token": renewed.json()["access_token"]}, timeout=10,
                            auth=pair)
    assert revoked.status_code == 200 and oc.mcp_status(base, renewed.json()["access_token"]) == 401


# ---------------------------------------------------------------- the consent page's answers

def test_nothing_is_granted_without_the_operators_secret(base):
    client = oc.register(base)
    _, challenge = oc.pkce()
    url = oc.authorize_url(base, client["client_id"], challenge)
    wrong = oc.consent(base, url, "not-the-operator-secret-at-all")
    assert wrong.status_code == 403 and "That is not the operator" in wrong.text and "location" not in wrong.headers
    empty = oc.consent(base, url, "")
    assert empty.status_code == 403
    denied = oc.redirected(oc.consent(base, url, "", action="deny"))
    assert denied["error"] == "access_denied" and denied["state"] == "st4te" and denied["iss"] == base


def test_five_wrong_secrets_refuse_the_request(base):
    client = oc.register(base)
    _, challenge = oc.pkce()
    page = requests.get(oc.authorize_url(base, client["client_id"], challenge), timeout=10)
    for _ in range(4):
        page = requests.post(base + "/authorize/consent", data=oc.Form(page.text).fields | {
            "secret": "wrong-wrong-wrong", "action": "grant"}, allow_redirects=False, timeout=10)
        assert page.status_code == 403
    last = requests.post(base + "/authorize/consent", data=oc.Form(page.text).fields | {
        "secret": SECRET, "action": "grant"} | {"secret": "wrong"}, allow_redirects=False, timeout=10)
    assert oc.redirected(last)["error"] == "access_denied"


def test_the_forms_one_time_value_is_bound_to_its_request(base):
    client = oc.register(base)
    _, challenge = oc.pkce()
    first = oc.Form(requests.get(oc.authorize_url(base, client["client_id"], challenge), timeout=10).text).fields
    other = oc.Form(requests.get(oc.authorize_url(base, client["client_id"], challenge), timeout=10).text).fields
    swapped = requests.post(base + "/authorize/consent", data=first | {"nonce": other["nonce"], "secret": SECRET,
                                                                        "action": "grant"}, timeout=10,
                            allow_redirects=False)
    assert swapped.status_code == 400 and "location" not in swapped.headers
    none = requests.post(base + "/authorize/consent", data={"request": other["request"], "secret": SECRET,
                                                           "action": "grant"}, allow_redirects=False, timeout=10)
    assert none.status_code == 400
    granted = requests.post(base + "/authorize/consent", data=other | {"secret": SECRET, "action": "grant"},
                            allow_redirects=False, timeout=10)
    assert "code" in oc.redirected(granted)
    replayed = requests.post(base + "/authorize/consent", data=other | {"secret": SECRET, "action": "grant"},
                             allow_redirects=False, timeout=10)
    assert replayed.status_code == 400 and "location" not in replayed.headers
    foreign = requests.post(base + "/authorize/consent", data=first | {"secret": SECRET, "action": "grant"},
                            headers={"Origin": "https://evil.example"}, allow_redirects=False, timeout=10)
    assert foreign.status_code == 403


def test_the_page_escapes_what_the_client_registered(base):
    client = oc.register(base, client_name='<script>alert(1)</script><img src=x onerror=alert(2)>"')
    _, challenge = oc.pkce()
    page = requests.get(oc.authorize_url(base, client["client_id"], challenge, state='"><b>'), timeout=10)
    assert "<script>alert" not in page.text and "<img" not in page.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text
    assert page.headers["x-frame-options"] == "DENY" and "frame-ancestors 'none'" in \
        page.headers["content-security-policy"] and page.headers["cache-control"] == "no-store"


# ---------------------------------------------------------------- what anyone may store is bounded

def test_what_anyone_may_store_is_bounded_and_refused_beyond(sim, tmp_path):
    """Registration and consent pages need no credential: a small body, short fields, a bound on clients
    without a grant and on open consent pages (per client and in all); beyond it 429 with Retry-After,
    and nothing already stored is pushed out (docs/REVIEW-SECURITY.md F14)."""
    from auth.store import CONSENTS_PER_CLIENT, PENDING_CLIENTS
    port = free_port()
    with http_server(oauth_env(sim, tmp_path, port), port=port) as url:
        big = requests.post(url + "/register", json={"redirect_uris": [oc.REDIRECT], "client_name": "x" * 20000},
                            timeout=10)
        assert big.status_code == 413
        long_name = requests.post(url + "/register", json={"redirect_uris": [oc.REDIRECT], "client_name": "x" * 201,
                                                           "token_endpoint_auth_method": "none"}, timeout=10)
        assert long_name.status_code == 400 and "client_name" in long_name.json()["error_description"]
        client = oc.register(url)["client_id"]
        _, challenge = oc.pkce()
        pages = [requests.get(oc.authorize_url(url, client, challenge), timeout=10)
                 for _ in range(CONSENTS_PER_CLIENT + 1)]
        assert [p.status_code for p in pages] == [200] * CONSENTS_PER_CLIENT + [429]
        assert 0 < int(pages[-1].headers["retry-after"]) <= 600 and "text/html" in pages[-1].headers["content-type"]
        for _ in range(PENDING_CLIENTS - 1):
            oc.register(url)
        refused = requests.post(url + "/register", json={"redirect_uris": [oc.REDIRECT]}, timeout=10)
        assert refused.status_code == 429 and 0 < int(refused.headers["retry-after"]) <= 3600
        granted = requests.post(url + "/authorize/consent", data=oc.Form(pages[0].text).fields | {
            "secret": SECRET, "action": "grant"}, allow_redirects=False, timeout=10)
        assert "code" in oc.redirected(granted)  # the first page still works: nothing was evicted
        oc.register(url)  # a client with a grant waits no more: its place is free


# ---------------------------------------------------------------- state: hashes only, and it survives a restart

def test_state_survives_a_restart_and_holds_no_token(sim, tmp_path):
    port = free_port()
    env = oauth_env(sim, tmp_path, port)
    with http_server(env, port=port) as url:
        client = oc.register(url, token_endpoint_auth_method="client_secret_post")
        code, verifier = oc.code_for(url, client["client_id"], SECRET)
        first = oc.token(url, {"grant_type": "authorization_code", "code": code, "redirect_uri": oc.REDIRECT,
                               "client_id": client["client_id"], "client_secret": client["client_secret"],
                               "code_verifier": verifier}).json()
    with http_server(env, port=port) as url:
        assert oc.mcp_status(url, first["access_token"]) == 200
        renewed = oc.token(url, {"grant_type": "refresh_token", "refresh_token": first["refresh_token"],
                                 "client_id": client["client_id"], "client_secret": client["client_secret"]})
        assert renewed.status_code == 200, renewed.text
    written = b"".join(path.read_bytes() for path in tmp_path.rglob("*") if path.is_file())
    written += (log_dir() / "http.log").read_bytes()
    for secret in (first["access_token"], first["refresh_token"], client["client_secret"],
                   renewed.json()["access_token"], renewed.json()["refresh_token"]):
        assert secret.encode() not in written
    assert oct((tmp_path / "state.sqlite3").stat().st_mode & 0o777) == "0o600"


@pytest.mark.parametrize("env, expected", [
    ({"MCP_OAUTH": "1", "MCP_PUBLIC_URL": "https://mcp.example.com"}, "MCP_OAUTH=1 needs MCP_AUTH_TOKEN"),
    ({"MCP_OAUTH": "1", "MCP_AUTH_TOKEN": SECRET}, "needs MCP_PUBLIC_URL"),
    ({"MCP_OAUTH": "1", "MCP_AUTH_TOKEN": SECRET, "MCP_PUBLIC_URL": "http://mcp.example.com"}, "https://"),
    ({"MCP_OAUTH": "yes please", "MCP_AUTH_TOKEN": SECRET}, "MCP_OAUTH"),
])
def test_what_oauth_needs_to_start(env, expected):
    result = run_server(["--http"], env)
    assert result.returncode == 2 and expected in result.stderr, result.stderr


def test_the_other_servers_oauth_variables_mean_the_same_here():
    """Proxmox MCP Server's MCP_OAUTH=1 and MCP_PUBLIC_URL (its ngrok example) are read, not warned
    about; the public URL's host is a name the server answers to."""
    from config import load_config
    loaded = load_config({"MCP_OAUTH": "1", "MCP_PUBLIC_URL": "https://abc.ngrok-free.app/",
                          "MCP_ALLOWED_HOSTS": "abc.ngrok-free.app"})
    assert loaded.auth.oauth and loaded.auth.public_url == "https://abc.ngrok-free.app"
    assert loaded.auth.resource == "https://abc.ngrok-free.app/mcp" and "abc.ngrok-free.app" in loaded.allowed_hosts
    assert not [w for w in loaded.warnings if "MCP_OAUTH" in w or "MCP_PUBLIC_URL" in w]
