"""Named bearer tokens (MCP_AUTH_TOKENS_FILE) and the principal everywhere, through real HTTP servers
on 127.0.0.1 and the SDK's client: each token within its profile and hosts (tools beyond them are not
listed, and refused when called, with nothing sent), an unlisted token gets 401, no OAuth metadata is
advertised, every audit line names the principal, `--new-token` makes one, and one principal's yes
never stands for another's on either protocol revision. Replicas sharing MCP_STATE_KEY accept each
other's retries of the 2026-07-28 round trip."""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests
from anyio.from_thread import start_blocking_portal

import oauth_client as oc
import calls
import policy
from auth import tokens
from conftest import Session, everything_open, requests_during, run_server
from test_http import http_server
from settings import HostPolicy

OPERATOR = "test-bearer-token-0123456789abcdef"
TOKENS = {"alice": "alice-token-0123456789abcdef-aaaa", "bob": "bob-token-0123456789abcdef-bbbbbb",
          "carol": "carol-token-0123456789abcdef-cccc", "dave": "dave-token-0123456789abcdef-dddddd"}
ENTRIES = [{"name": "alice", "profile": "read"}, {"name": "bob", "profile": "operate"},
           {"name": "carol", "profile": "admin"}, {"name": "dave", "profile": "admin", "hosts": ["home"]}]


def tokens_file(tmp: Path) -> Path:
    path = tmp / "tokens.json"
    path.write_text(json.dumps([e | {"sha256": tokens.digest(TOKENS[e["name"]])} for e in ENTRIES]))
    return path


def env_of(sim, tmp: Path, **extra: str) -> dict:
    (tmp / "protected.json").write_text("[]")
    return everything_open(sim, tmp) | sim.env("home", pve_token="root@pam!admin", pbs=False) | {
        "MCP_AUTH_TOKEN": OPERATOR, "MCP_AUTH_TOKENS_FILE": str(tokens_file(tmp))} | extra


@pytest.fixture(scope="module")
def state(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("principals")


@pytest.fixture(scope="module")
def base(sim, state):
    with http_server(env_of(sim, state)) as url:
        yield url


@contextmanager
def session_as(url: str, token: str, mode: str = "auto", **client_kw):
    """The SDK's client with a bearer token; `session.http` is its HTTP client (headers may change)."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    with start_blocking_portal() as portal:
        with portal.wrap_async_context_manager(Client(streamable_http_client(url, http_client=http), mode=mode,
                                                      **client_kw)) as client:
            session = Session(portal, client)
            session.http = http
            yield session


def audit_lines(state: Path) -> list[dict]:
    return [json.loads(line) for line in (state / "audit.jsonl").read_text().splitlines()]


def names(session: Session) -> set[str]:
    return {t.name for t in session.tools()}


# ---------------------------------------------------------------- who gets in

def test_a_listed_token_gets_in_and_an_unlisted_one_gets_401(base):
    for token in (*TOKENS.values(), OPERATOR):
        assert oc.mcp_status(base, token) == 200
    assert oc.mcp_status(base, "not-a-listed-token-0123456789") == 401
    assert oc.mcp_status(base, tokens.digest(TOKENS["alice"])) == 401  # the hash is not the token


def test_bearer_only_servers_advertise_no_oauth_metadata(base):
    for path in ("/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource",
                 "/.well-known/oauth-authorization-server", "/authorize", "/register"):
        assert requests.get(base + path, timeout=10).status_code == 401, path
    refused = requests.post(base + "/mcp", json=oc.INIT, headers=oc.HEADERS, timeout=10)
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"


# ---------------------------------------------------------------- each within its profile and hosts

@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_a_read_principal_sees_no_write_tool_and_is_refused_one(base, sim, state, mode):
    with session_as(base + "/mcp", TOKENS["alice"], mode=mode) as alice:
        listed = names(alice)
        assert "list_guests" in listed and not [n for n in listed if n.startswith("write_")]
        assert "backup_files" not in listed  # sensitive reads are beyond read too
        message, sent = requests_during(sim, lambda: alice.error("write_create_snapshot", {
            "host": "lab", "vmid": 100, "name": "by-alice"}), writes=True)
        assert "not available" in message and "beyond the profile 'read' of 'alice'" in message and sent == []
        assert alice.ok("list_guests", {"host": "lab", "status": "running"})["total"] == 4


def test_an_operate_principal_writes_but_nothing_destructive(base, sim, state):
    with session_as(base + "/mcp", TOKENS["bob"]) as bob:
        listed = names(bob)
        assert {"write_create_snapshot", "write_configure_guest"} <= listed
        assert not listed & {"write_delete_guest", "write_rollback_snapshot", "write_exec_guest"}
        assert bob.ok("write_create_snapshot", {"host": "lab", "vmid": 100, "name": "by-bob"})["task"]
        message, sent = requests_during(sim, lambda: bob.error("write_power_guest", {
            "host": "lab", "vmid": 105, "action": "stop", "confirm": True}), writes=True)
        assert "'destructive' gate, beyond the profile 'operate' of 'bob'" in message and sent == []
    written = [line for line in audit_lines(state) if line.get("tool") == "write_create_snapshot"]
    assert written and {line["principal"] for line in written} == {"bob"}


def test_the_servers_gates_cap_every_profile(sim, tmp_path):
    with http_server(env_of(sim, tmp_path, PROXMOX_ACCESS="lifecycle")) as url:
        with session_as(url + "/mcp", TOKENS["carol"]) as carol:
            listed = names(carol)
            assert "write_create_snapshot" in listed and "write_configure_guest" not in listed
            assert "write_delete_guest" not in listed


def test_a_principal_reaches_only_its_hosts(base, sim):
    with session_as(base + "/mcp", TOKENS["dave"]) as dave:
        listed = names(dave)
        assert "list_guests" in listed and not [n for n in listed if n.startswith("pbs_")]  # PBS is on lab only
        assert [row[0] for row in dave.ok("list_hosts")["rows"]] == ["home"]
        assert dave.ok("list_guests")["total"] == 6  # host may be left out: dave reaches one
        message, sent = requests_during(sim, lambda: dave.error("list_guests", {"host": "lab"}))
        assert "host 'lab' is not one of the hosts 'dave' may use (home)" in message and sent == []
        listed = dave.portal.call(dave.client.list_resources).resources
        assert {str(r.uri) for r in listed if not str(r.uri).startswith("ui:")} == {"proxmox://home/guests",
                                                                                 "proxmox://home/health"}
        from mcp.shared.exceptions import MCPError
        with pytest.raises(MCPError, match="host 'lab' is not one of the hosts 'dave' may use"):
            dave.portal.call(lambda: dave.client.read_resource("proxmox://lab/guests"))
        info = dave.ok("server_info")
        assert info["principal"] == {"name": "dave", "profile": "admin", "hosts": ["home"]}
        assert [h["host"] for h in info["hosts"]] == ["home"]
    with session_as(base + "/mcp", TOKENS["carol"]) as carol:
        assert {row[0] for row in carol.ok("list_hosts")["rows"]} == {"home", "lab"}
    with session_as(base + "/mcp", TOKENS["alice"]) as alice:
        hidden = alice.ok("server_info")["hidden_tools"]
        assert "write_create_snapshot" in hidden["it needs the lifecycle gate, beyond the profile 'read' of 'alice'"]


def test_health_shows_a_principal_its_own_hosts(base):
    seen = requests.get(base + "/health", headers={"Authorization": f"Bearer {TOKENS['dave']}"}, timeout=10).json()
    assert set(seen["hosts"]) == {"pve:home"}
    assert set(requests.get(base + "/health", headers={"Authorization": f"Bearer {OPERATOR}"},
                            timeout=10).json()["hosts"]) == {"pve:home", "pve:lab", "pbs:lab"}
    assert "hosts" not in requests.get(base + "/health", timeout=10).json()


def test_every_audit_line_names_the_principal(base, state):
    with session_as(base + "/mcp", OPERATOR) as operator:
        operator.ok("write_create_snapshot", {"host": "lab", "vmid": 100, "name": "by-operator", "dry_run": True})
    lines = audit_lines(state)
    assert lines and all("principal" in line for line in lines if "tool" in line)
    assert lines[-1]["principal"] == "operator" and lines[-1]["verdict"] == "dry_run"


def test_the_single_user_is_named_nobody(sim, tmp_path):
    (tmp_path / "protected.json").write_text("[]")
    with http_server(everything_open(sim, tmp_path) | {"MCP_AUTH_TOKEN": OPERATOR}) as url:
        with session_as(url + "/mcp", OPERATOR) as operator:
            operator.ok("write_create_snapshot", {"vmid": 100, "name": "alone", "dry_run": True})
    assert audit_lines(tmp_path)[-1]["principal"] is None


# ---------------------------------------------------------------- one principal's yes never stands for another's

def stop_105(sim) -> dict:
    sim.lab.guests[105]["status"] = "running"
    return {"host": "lab", "vmid": 105, "action": "stop", "confirm": True}


def test_an_approval_is_pinned_to_its_principal():
    host, decision = HostPolicy(), policy.Decision("POST", "/nodes/pve3/lxc/105/status/stop")
    host.product, host.label = "pve", "lab"
    keys = set()
    for who in ({}, {"principal": "alice"}, {"principal": "bob"}):
        token = policy.CALL.set(calls.Call(**who))
        keys.add(policy.approval_key(host, decision))
        policy.CALL.reset(token)
    assert len(keys) == 3


@pytest.mark.parametrize("retried_by", ["dave", "carol"])
def test_on_2026_07_28_another_principal_cannot_retry_with_the_yes(base, sim, retried_by):
    """The input-required round trip: carol's client is asked; the retry carrying her sealed state and
    her user's yes goes out with dave's credential, and is refused (the SDK binds the state to the
    principal); nothing is sent. The same retry with carol's own credential stops the guest."""
    from mcp.shared.exceptions import MCPError
    from mcp_types import ElicitResult
    holder = {}

    async def user(_context, _params):
        holder["session"].http.headers["Authorization"] = f"Bearer {TOKENS[retried_by]}"
        return ElicitResult(action="accept", content={"confirm": True})
    with session_as(base + "/mcp", TOKENS["carol"], elicitation_callback=user) as carol:
        holder["session"] = carol
        assert carol.client.protocol_version == "2026-07-28"
        arguments = stop_105(sim)
        if retried_by == "dave":
            with pytest.raises(MCPError, match="Invalid or expired requestState"):
                requests_during(sim, lambda: carol.call("write_power_guest", arguments), writes=True)
            assert sim.lab.guests[105]["status"] == "running"
        else:
            _, sent = requests_during(sim, lambda: carol.ok("write_power_guest", arguments), writes=True)
            assert [r for r in sent if "/status/stop" in r[2]] and sim.lab.guests[105]["status"] == "stopped"


def test_before_2026_07_28_another_principal_cannot_answer_the_question(base, sim):
    """The question travels inside carol's session: dave's answer to it, posted into that session with
    his credential, is refused as if the session did not exist, and carol's no stands."""
    from mcp_types import ElicitResult
    posted = []
    session_id = {}

    async def capture(response):
        session_id["id"] = response.headers.get("mcp-session-id") or session_id.get("id")

    async def user(context, _params):
        answer = {"jsonrpc": "2.0", "id": context.request_id, "result": {"action": "accept",
                                                                         "content": {"confirm": True}}}
        posted.append(requests.post(base + "/mcp", json=answer, timeout=10, headers=oc.HEADERS | {
            "Authorization": f"Bearer {TOKENS['dave']}", "mcp-session-id": session_id["id"],
            "mcp-protocol-version": "2025-06-18"}).status_code)
        return ElicitResult(action="decline")
    with session_as(base + "/mcp", TOKENS["carol"], mode="legacy", elicitation_callback=user) as carol:
        carol.http.event_hooks["response"].append(capture)
        arguments = stop_105(sim)
        message, sent = requests_during(sim, lambda: carol.error("write_power_guest", arguments), writes=True)
    assert posted == [404] and "did not confirm (decline)" in message and sent == []
    assert sim.lab.guests[105]["status"] == "running"


# ---------------------------------------------------------------- replicas: MCP_STATE_KEY

STATE_KEY = "state-key-0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize("shared_key", [True, False])
def test_a_retry_reaching_another_replica(sim, tmp_path, shared_key):
    """Two replicas behind one name: the 2026-07-28 question comes from the first, the retry with the
    user's yes reaches the second. With the same MCP_STATE_KEY it unseals there and the guest stops;
    without (each process its own key) it is refused and nothing is sent."""
    from mcp.shared.exceptions import MCPError
    from mcp_types import ElicitResult
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    extra = {"MCP_STATE_KEY": STATE_KEY} if shared_key else {}
    with http_server(env_of(sim, tmp_path / "a", **extra)) as first, \
            http_server(env_of(sim, tmp_path / "b", **extra)) as second:
        moved = {}

        async def to_second(request):
            if moved:
                request.url = request.url.copy_with(port=int(second.rsplit(":", 1)[1]))
                request.headers["host"] = second.split("://", 1)[1]

        async def user(_context, _params):
            moved["yes"] = True
            return ElicitResult(action="accept", content={"confirm": True})
        with session_as(first + "/mcp", TOKENS["carol"], elicitation_callback=user) as carol:
            carol.http.event_hooks["request"].append(to_second)
            arguments = stop_105(sim)
            if shared_key:
                carol.ok("write_power_guest", arguments)
                assert sim.lab.guests[105]["status"] == "stopped"
            else:
                with pytest.raises(MCPError, match="Invalid or expired requestState"):
                    carol.call("write_power_guest", arguments)
                assert sim.lab.guests[105]["status"] == "running"
    assert moved
    if shared_key:  # each replica writes its own audit log: the stop is in the second one's
        assert [line for line in audit_lines(tmp_path / "b") if "/status/stop" in line.get("path", "")]


# ---------------------------------------------------------------- the tokens file and --new-token

def test_new_token_prints_the_token_once_and_the_line_to_add(sim, tmp_path):
    made = run_server(["--new-token", "erin", "--profile", "operate", "--hosts", "home"],
                      {"MCP_AUTH_TOKENS_FILE": str(tmp_path / "tokens.json")})
    assert made.returncode == 0, made.stderr
    lines = made.stdout.splitlines()
    token = lines[1]
    entry = json.loads(next(line for line in lines if line.startswith("{")))
    assert entry == {"name": "erin", "sha256": tokens.digest(token), "profile": "operate", "hosts": ["home"]}
    assert str(tmp_path / "tokens.json") in made.stdout and token.startswith("pmcp_") and len(token) > 40
    (tmp_path / "tokens.json").write_text(json.dumps([entry]))
    (tmp_path / "protected.json").write_text("[]")
    with http_server(everything_open(sim, tmp_path) | sim.env("home", pbs=False) | {
            "MCP_AUTH_TOKENS_FILE": str(tmp_path / "tokens.json")}) as url:
        with session_as(url + "/mcp", token) as erin:
            assert [row[0] for row in erin.ok("list_hosts")["rows"]] == ["home"]
    refused = run_server(["--new-token", "bad name"], {})
    assert refused.returncode == 2 and "letters, digits" in refused.stderr


@pytest.mark.parametrize("content, expected", [
    ("{", "is not JSON"),
    ('{"name": "x"}', "is not a JSON list"),
    ('[{"name": "a", "sha256": "00", "profile": "read"}]', "sha256 must be the 64 hex digits"),
    (json.dumps([{"name": "a", "sha256": "0" * 64, "profile": "root"}]), "profile 'root' is not one of"),
    (json.dumps([{"name": "a", "sha256": "0" * 64, "profile": "read"}, {"name": "a", "sha256": "1" * 64,
                                                                          "profile": "read"}]), "gives the name"),
    (json.dumps([{"name": "operator", "sha256": "0" * 64, "profile": "read"}]), "and not operator"),
    (json.dumps([{"name": "a", "sha256": "0" * 64, "profile": "read", "hosts": "home"}]), "list of host labels"),
])
def test_a_bad_tokens_file_stops_the_server_naming_it(tmp_path, content, expected):
    (tmp_path / "tokens.json").write_text(content)
    result = run_server(["--http"], {"MCP_AUTH_TOKENS_FILE": str(tmp_path / "tokens.json")})
    assert result.returncode == 2 and "MCP_AUTH_TOKENS_FILE" in result.stderr and expected in result.stderr, \
        result.stderr


def test_named_tokens_alone_open_http_mode(sim, tmp_path):
    (tmp_path / "protected.json").write_text("[]")
    with http_server(everything_open(sim, tmp_path) | {"MCP_AUTH_TOKENS_FILE": str(tokens_file(tmp_path))}) as url:
        assert oc.mcp_status(url, TOKENS["alice"]) == 200 and oc.mcp_status(url, OPERATOR) == 401


def test_every_entry_is_compared_in_constant_time(monkeypatch):
    compared = []
    real = tokens.hmac.compare_digest
    monkeypatch.setattr(tokens.hmac, "compare_digest", lambda a, b: compared.append(a) or real(a, b))
    entries = [tokens.NamedToken(n, tokens.digest(t), "read") for n, t in TOKENS.items()]
    assert tokens.find(entries, TOKENS["alice"]).name == "alice"
    assert len(compared) == len(entries)  # no early exit that would tell which entry matched


def test_check_reports_the_auth_mode_and_the_principals(sim, tmp_path):
    checked = run_server(["--check"], env_of(sim, tmp_path, MCP_STATE_KEY=STATE_KEY))
    assert "HTTP access: the static bearer MCP_AUTH_TOKEN (the operator), 4 named tokens" in checked.stdout
    assert "principal alice: profile read, every host" in checked.stdout
    assert "principal dave: profile admin, home" in checked.stdout
    assert "sealed with MCP_STATE_KEY (1 key)" in checked.stdout and STATE_KEY not in checked.stdout
    alone = run_server(["--check"], sim.env() | {"MCP_AUTH_TOKEN": OPERATOR})
    assert "HTTP access: the static bearer MCP_AUTH_TOKEN (single user)" in alone.stdout


def test_a_short_state_key_stops_the_server():
    result = run_server(["--http"], {"MCP_AUTH_TOKEN": OPERATOR, "MCP_STATE_KEY": "short"})
    assert result.returncode == 2 and "MCP_STATE_KEY" in result.stderr and "32 characters" in result.stderr
