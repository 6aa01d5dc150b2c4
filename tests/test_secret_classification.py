"""Secrets in answers, derived from Proxmox's own schemas: the catalog builder walks the return
schema of every GET (list items and nested objects included) and records the secret-like
properties it carries (catalog.secret_properties, one name rule); such methods are `sensitive`,
their lists too, and the secrets are masked in every answer. These tests read the committed
catalog/*.json, so they hold in a fresh clone."""
import json

import pytest

import calls
import catalog
import masking
import policy
from gates import call_gates, method_gate
from settings import HostPolicy, Settings

# The whole classification over both catalogs: (product, GET path) -> the secrets its answer carries.
EXPECTED = {
    ("pve", "/cluster/acme/plugins"): ["data"],
    ("pve", "/cluster/acme/plugins/{id}"): ["data"],
    ("pve", "/cluster/notifications/endpoints/webhook"): ["secret"],
    ("pve", "/cluster/notifications/endpoints/webhook/{name}"): ["secret"],
    ("pve", "/nodes/{node}/subscription"): ["key"],
    ("pbs", "/config/access/openid"): ["client-key"],
    ("pbs", "/config/access/openid/{realm}"): ["client-key"],
    ("pbs", "/config/acme/plugins"): ["data"],
    ("pbs", "/config/acme/plugins/{id}"): ["data"],
    ("pbs", "/config/metrics/influxdb-http"): ["token"],
    ("pbs", "/config/metrics/influxdb-http/{name}"): ["token"],
    ("pbs", "/config/notifications/endpoints/webhook"): ["secret"],
    ("pbs", "/config/notifications/endpoints/webhook/{name}"): ["secret"],
    ("pbs", "/config/s3"): ["access-key"],
    ("pbs", "/config/s3/{id}"): ["access-key"],
    ("pbs", "/nodes/{node}/subscription"): ["key"],
}


# Write answers whose return schema names a secret (the same name rule).
EXPECTED_WRITES = {
    ("pve", "POST", "/access/ticket"): ["CSRFPreventionToken"],
    ("pve", "POST", "/access/openid/login"): ["CSRFPreventionToken"],
    ("pve", "POST", "/storage"): ["encryption-key"],
    ("pve", "PUT", "/storage/{storage}"): ["encryption-key"],
    ("pve", "POST", "/nodes/{node}/spiceshell"): ["password"],
    ("pve", "POST", "/nodes/{node}/vncshell"): ["password"],
    ("pve", "POST", "/nodes/{node}/lxc/{vmid}/spiceproxy"): ["password"],
    ("pve", "POST", "/nodes/{node}/lxc/{vmid}/vncproxy"): ["password"],
    ("pve", "POST", "/nodes/{node}/qemu/{vmid}/spiceproxy"): ["password"],
    ("pve", "POST", "/nodes/{node}/qemu/{vmid}/vncproxy"): ["password"],
    ("pve", "POST", "/cluster/config/nodes/{node}"): ["corosync_authkey"],
    ("pbs", "PUT", "/config/access/openid/{realm}"): ["client-key"],
    ("pbs", "PUT", "/access/users/{userid}/token/{token-name}"): ["secret"],
    ("pbs", "POST", "/access/ticket"): ["CSRFPreventionToken"],
    ("pbs", "POST", "/access/openid/login"): ["CSRFPreventionToken"],
}
# Answers the schema leaves untyped, or names innocently (catalog.UNTYPED_SECRETS, cited there).
EXPECTED_UNTYPED = {
    ("pve", "GET", "/cluster/sdn/ipams"): ["token"],
    ("pve", "GET", "/cluster/sdn/ipams/{ipam}"): ["token"],
    ("pve", "GET", "/cluster/sdn/dns"): ["key"],
    ("pve", "GET", "/cluster/sdn/dns/{dns}"): ["key"],
    ("pve", "GET", "/cluster/metrics/server/{id}"): ["*-headers"],
    ("pve", "GET", "/access/domains/{realm}"): ["client-key"],
    ("pve", "POST", "/access/users/{userid}/token/{tokenid}"): ["value"],
    ("pve", "PUT", "/access/users/{userid}/token/{tokenid}"): ["value"],
    ("pbs", "POST", "/access/users/{userid}/token/{token-name}"): ["value"],
}


def all_methods():
    return [(product, entry) for product in catalog.PRODUCTS for entry in catalog.methods(product)]


def test_the_classification_over_both_whole_catalogs():
    found = {(product, entry["method"], entry["path"]): entry["secrets"] for product, entry in all_methods()
             if entry.get("secrets")}
    expected = {(product, "GET", path): names for (product, path), names in EXPECTED.items()}
    assert found == expected | EXPECTED_WRITES | EXPECTED_UNTYPED


@pytest.mark.parametrize("product, method, path", sorted(EXPECTED_UNTYPED))
def test_untyped_secrets_are_gated_like_typed_ones_and_masked(product, method, path):
    names = EXPECTED_UNTYPED[(product, method, path)]
    if method == "GET":  # the least-privilege token reads them at the read tier otherwise
        assert method_gate("GET", path, product) != "read"
    value = {"id": "x", "otel-headers": "eyJBdXRob3JpemF0aW9uIjoiQmVhcmVyIHNlY3JldCJ9", "token": "nb-token",
             "key": "pdns-key", "client-key": "oidc-key", "value": "token-secret", "type": "t"}
    masked = masking.mask_answer([value], names)[0]
    shown = {k: v for k, v in masked.items() if v != masking.MASK}
    by_shape = {k for k in value if masking._SECRET_KEY.search(k)}  # masked in every answer ("client-key": x)
    assert set(value) - set(shown) == {"otel-headers" if n == "*-headers" else n for n in names} | by_shape


@pytest.mark.parametrize("product, path", sorted(EXPECTED))
def test_a_get_that_returns_secrets_is_sensitive(product, path):
    assert method_gate("GET", path, product) == "sensitive"
    gates, reasons = call_gates(product, "GET", path, {})
    assert gates == ("sensitive",) and any("returns secrets" in r for r in reasons)


def test_a_list_is_gated_like_its_items_over_both_catalogs():
    checked = 0
    for product, entry in all_methods():
        if entry["method"] != "GET":
            continue
        items = catalog.item_templates(product, entry["path"])
        if any(method_gate("GET", item, product) == "sensitive" for item in items):
            assert method_gate("GET", entry["path"], product) == "sensitive", (product, entry["path"])
            checked += 1
    assert checked >= 15  # /config/remote, /config/s3, the ACME plugins, the notification endpoints, ...
    assert method_gate("GET", "/config/remote", "pbs") == "sensitive"  # auth-id, as /config/remote/{name}


def test_reads_without_secrets_stay_at_the_read_gate():
    for product, path in (("pve", "/cluster/resources"), ("pve", "/nodes/{node}/qemu/{vmid}/config"),
                          ("pve", "/nodes/{node}/qemu/{vmid}/pending"), ("pve", "/access/users"),
                          ("pbs", "/admin/sync"), ("pbs", "/config/sync"), ("pve", "/nodes/{node}/apt/repositories"),
                          ("pve", "/cluster/sdn/fabrics/all"), ("pve", "/cluster/acme/directories")):
        assert method_gate("GET", path, product) == "read", (product, path)


# ---------------------------------------------------------------- the name rule, on schemas of our own

def prop(kind="string", **facts):
    return {"type": kind, **facts}


@pytest.mark.parametrize("schema, expected", [
    ({"type": "object", "properties": {"password": prop(), "name": prop()}}, ["password"]),
    ({"type": "array", "items": {"type": "object", "properties": {"client-key": prop(), "access-key": prop(),
                                                                    "secret-key": prop()}}},
     ["access-key", "client-key", "secret-key"]),
    ({"type": "object", "properties": {"outer": {"type": "object", "properties": {"token": prop()}}}}, ["token"]),
    ({"type": "object", "properties": {"plugin": prop(), "data": prop()}}, ["data"]),  # ACME DNS credentials
    ({"type": "object", "properties": {"data": prop(), "digest": prop()}}, []),  # /etc/hosts, not a plugin
    ({"type": "object", "properties": {"secret": {"type": "array", "items": prop()}}}, ["secret"]),
    ({"type": "object", "properties": {"key": prop(), "status": prop()}}, ["key"]),  # a subscription key
    ({"type": "array", "items": {"type": "object", "properties": {"key": prop(), "value": prop()}}}, []),
    ({"type": "object", "properties": {"active-encryption-key": prop(pattern="[a-z]+")}}, []),  # a key id
    ({"type": "object", "properties": {"associated-key": {"type": "array", "items": prop(pattern="[a-z]+")}}}, []),
    ({"type": "object", "properties": {"tfa": prop(enum=["yubico"]), "privsep": prop("integer")}}, []),
    ({"type": "object", "properties": {"public_key": prop(), "lock-token": prop(), "cipassword": prop()}}, []),
])
def test_the_name_rule(schema, expected):
    assert catalog.secret_properties(schema) == expected


def test_the_builder_records_the_secrets_of_a_viewer_tree(tmp_path):
    tree = [{"path": "/config", "text": "config", "children": [
        {"path": "/config/things", "text": "things", "leaf": 1, "info": {
            "GET": {"method": "GET", "parameters": {"properties": {}},
                    "returns": {"type": "array", "items": {"type": "object", "properties": {
                        "id": {"type": "string"}, "client-key": {"type": "string"}}}}},
            "POST": {"method": "POST", "parameters": {"properties": {"client-key": {"type": "string"}}},
                     "returns": {"type": "null"}}}}]}]
    import json
    for product in catalog.PRODUCTS:
        (tmp_path / f"{product}-api.json").write_text(json.dumps(tree))
    catalog.build(tmp_path, tmp_path / "out")
    built = json.loads((tmp_path / "out" / "pbs.json").read_text())
    assert {e["method"]: e.get("secrets") for e in built} == {"GET": ["client-key"], "POST": None}


# ---------------------------------------------------------------- masked in every answer

def test_secrets_are_masked_in_answers_lists_and_nested_objects():
    answer = [{"plugin": "dns1", "api": "cf", "data": "CF_Token=abc123"}, {"plugin": "dns2", "data": ""}]
    assert masking.mask_answer(answer, ["data"]) == [{"plugin": "dns1", "api": "cf", "data": "***"},
                                                     {"plugin": "dns2", "data": ""}]
    assert masking.mask_answer({"outer": {"token": "t0k3n"}}, ["token"]) == {"outer": {"token": "***"}}
    assert masking.mask_answer({"token": "t0k3n"}, []) == {"token": "t0k3n"}


def test_blobs_are_audited_as_size_and_hash():
    """Agent stdin (`input-data`) and header blobs (`otel-headers`, webhook `header`) are recorded as
    size and SHA-256, never verbatim; in a dry run the headers are masked."""
    params = {"input-data": "root:new-password\n", "otel-headers": "eyJBdXRob3JpemF0aW9uIjoiQmVhcmVyIHMifQ==",
              "header": ["name=Authorization,value=QmVhcmVyIHM="], "command": ["chpasswd"]}
    audited = masking.audit_view(params)
    for name in ("input-data", "otel-headers", "header"):
        assert set(audited[name]) == {"bytes", "sha256"}, name
    assert audited["command"] == ["chpasswd"] and "new-password" not in str(audited)
    shown = masking.mask_params(params)
    assert shown["otel-headers"] == shown["header"] == masking.MASK


def test_secret_parameters_are_masked_in_dry_runs_and_audit_lines():
    params = {"data": "CF_Token=abc123", "client-key": "k", "access-key": "a", "secret-key": "s", "key": "pve-subkey",
              "password": "p", "api": "cf", "sshkeys": "ssh-ed25519 AAAA"}
    shown = masking.mask_params(params)
    assert {k for k, v in shown.items() if v == masking.MASK} == {"data", "client-key", "access-key", "secret-key",
                                                                 "key", "password"}
    assert masking.audit_view(params)["data"] == masking.MASK


def test_a_token_created_through_the_tools_is_masked_in_the_answer_and_the_audit(sim, tmp_path):
    """POST /access/users/{userid}/token/{tokenid} answers the new secret as `value` (both products);
    the model never sees it, nor does the audit log."""
    from conftest import everything_open, in_process
    (tmp_path / "protected.json").write_text("[]")
    with in_process(everything_open(sim, tmp_path), log_name="token-create") as session:
        for product, path in (("pve", "/access/users/mcp@pve/token/fresh"),
                              ("pbs", "/access/users/mcp@pbs/token/fresh")):
            answer = session.ok("write_call_api", {"method": "POST", "path": path, "product": product,
                                                   "confirm": True})["data"]
            assert answer["value"] == masking.MASK, answer
            secret = sim.lab.created_tokens[-1]
            assert secret not in (tmp_path / "audit.jsonl").read_text()


def test_untyped_secrets_through_the_tools(sim, tmp_path):
    """The read tier's least-privilege token reads SDN IPAM and DNS lists: now sensitive; opened, masked."""
    from conftest import in_process
    sim.lab.sdn_ipams = [{"ipam": "netbox", "type": "netbox", "url": "https://nb.example/api", "token": "nb-4711"}]
    sim.lab.sdn_dns = [{"dns": "pdns", "type": "powerdns", "url": "https://dns.example", "key": "pdns-4711"}]
    with in_process(sim.env(), log_name="untyped-read") as reader:
        assert "PROXMOX_ALLOW_SENSITIVE" in reader.error("api_read", {"path": "/cluster/sdn/ipams"})
    with in_process(sim.env() | {"PROXMOX_ALLOW_SENSITIVE": "true"}, log_name="untyped-open") as session:
        ipams = session.ok("api_read", {"path": "/cluster/sdn/ipams"})["data"]
        dns = session.ok("api_read", {"path": "/cluster/sdn/dns"})["data"]
    assert ipams[0]["token"] == dns[0]["key"] == masking.MASK and ipams[0]["url"] == "https://nb.example/api"


def test_secrets_of_calls_nested_in_execute_are_masked():
    """POST /nodes/{node}/execute answers each nested call's data (docs/PROXMOX-BEHAVIOUR.md#nested-execute):
    a nested GET's secrets are masked as they are in the GET's own answer."""
    import json
    from types import SimpleNamespace
    host = SimpleNamespace(product="pve", label="lab", token_id="mcp@pve!t", write_token_id=None)
    rules = HostPolicy("destructive", frozenset({"exec", "elevated", "sensitive"}))
    original = policy.settings()
    policy.configure(Settings(hosts={("pve", "lab"): rules}))
    token = policy.CALL.set(calls.Call(tool="test", confirm=lambda *_: None))
    commands = json.dumps([{"method": "GET", "path": "subscription"}])
    try:
        answer = policy.admit(host, "POST", "/nodes/pve1/execute", {"commands": commands},
                              lambda _: [{"status": 200, "data": {"key": "pve2c-0123456789", "status": "active"}}])
    finally:
        policy.CALL.reset(token)
        policy.configure(original)
    assert answer == [{"status": 200, "data": {"key": masking.MASK, "status": "active"}}]


def test_a_dry_run_preview_masks_the_secrets_of_the_request_and_of_the_current_state(sim, tmp_path):
    """A dry run shows the exact request and the object's current state: the headers it would send
    and the headers stored now are masked in both (the GET's untyped `otel-headers`)."""
    from conftest import everything_open, in_process
    stored = "eyJBdXRob3JpemF0aW9uIjoiQmVhcmVyIG9sZC00NzExIn0="
    sim.lab.metric_servers["otel"] = {"type": "opentelemetry", "server": "otel.example", "port": 4318,
                                      "otel-headers": stored}
    (tmp_path / "protected.json").write_text("[]")
    new = "eyJBdXRob3JpemF0aW9uIjoiQmVhcmVyIG5ldy00NzEyIn0="
    with in_process(everything_open(sim, tmp_path), log_name="dry-secrets") as session:
        plan = session.ok("write_call_api", {"method": "PUT", "path": "/cluster/metrics/server/otel", "dry_run": True,
                                             "params": {"server": "otel.example", "port": 4318, "otel-headers": new}})
    assert plan["request"]["params"]["otel-headers"] == masking.MASK
    assert plan["current"]["otel-headers"] == masking.MASK and plan["current"]["server"] == "otel.example"
    assert stored not in json.dumps(plan) and new not in (tmp_path / "audit.jsonl").read_text()
