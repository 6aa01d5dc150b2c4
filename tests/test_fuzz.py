"""Fuzz every tool: arguments generated from its input schema plus hostile values (wrong types,
huge strings, negative and huge ids, unicode, path tricks), with a fixed seed. No call may crash
(an unexplained "Error executing tool X"), every failure carries a message, and arguments the
tool rejects by its schema send nothing to the simulator. Writes run under PROXMOX_DRY_RUN, so
nothing is changed and no task is waited for.

The calls go through the in-process layer (the server's own request path: middleware, the SDK's
argument model, the tool edge, JSON both ways); the first MCP_CALLS of them also go through the
MCP client over stdio, which must answer each exactly as the in-process layer did."""
import json
import random

import pytest

from conftest import in_process, stdio_session

CALLS = 7_000  # about 80 per tool offered here (89 tools in all, each in its turn)
MCP_CALLS = 700  # the first of them, over stdio too (about 6 ms each there, the transport's cost)
HOSTILE = [None, True, -1, 0, 99, 10 ** 12, -10 ** 12, 3.5, "", " ", "x" * 20000, "../../etc/passwd",
           "/nodes/pve1/../../access", "%2e%2e%2f", "vm:100", "100-0", "local-lvm:vm-100-disk-0", "'; rm -rf / #",
           "$(reboot)", "`id`", "ünïcödé 日本語 🙂", "\u202e", "\x00", "\n", [], {}, [1, 2], {"a": 1}, "PVE1", "pve1",
           "UPID:pve1:00000001:00000001:00000001:qmstart:100:root@pam:", "true", "1", "2048"]
GOOD = {"integer": [100, 101, 102, 103, 104, 105, 1, 5, 30],
        "string": ["pve1", "pve2", "local", "backup", "vmbr0", "web", "scsi0", "+1G", "net0", "snap1", "lab", "vm",
                   "100", "local:iso/debian-13.1.0-amd64-netinst.iso"],
        "boolean": [True, False], "number": [1.0]}


def value(rng: random.Random, prop: dict):
    if rng.random() < 0.3:
        return rng.choice(HOSTILE)
    if "enum" in prop:
        return rng.choice(prop["enum"])
    kind = prop.get("type") or (prop.get("anyOf") or [{}])[0].get("type", "string")
    if kind == "array":
        return [value(rng, prop.get("items", {"type": "string"})) for _ in range(rng.randint(0, 2))]
    if kind == "object":
        return {rng.choice(["memory", "cores", "colour", "net0"]): rng.choice(GOOD["string"] + GOOD["integer"])}
    return rng.choice(GOOD.get(kind, GOOD["string"]))


def arguments(rng: random.Random, schema: dict) -> dict:
    args = {}
    for name, prop in schema.get("properties", {}).items():
        if name in schema.get("required", []) or rng.random() < 0.4:
            args[name] = value(rng, prop)
    if rng.random() < 0.1:
        args["unknown_argument"] = "x"
    for waiting in ("wait_seconds", "timeout", "answer_seconds"):  # never wait long in a fuzz
        if isinstance(args.get(waiting), int) and not isinstance(args[waiting], bool):
            args[waiting] = min(max(args[waiting], 0), 1)
    return args


@pytest.fixture(scope="module")
def fuzz_env(sim, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    (tmp / "protected.json").write_text(json.dumps([{"host": "lab", "vmid": 101, "reason": "fuzz"}]))
    # every tool offered and every request reaching the argument checks: more than the reader holds
    return sim.env(pve_token="root@pam!admin", pbs_token="root@pam!admin") | {
        "PROXMOX_ACCESS": "destructive", "PROXMOX_ALLOW_SENSITIVE": "true", "PROXMOX_DRY_RUN": "true",
        "PROXMOX_PROTECTED_VMS_FILE": str(tmp / "protected.json"), "PROXMOX_AUDIT_LOG": str(tmp / "audit.jsonl")}


@pytest.fixture(scope="module")
def fuzzed(fuzz_env):
    with in_process(fuzz_env, log_name="fuzz") as session:
        yield session


def test_fuzz_every_tool(fuzzed, sim):
    rng = random.Random(20261129)
    tools = fuzzed.tools()
    assert len(tools) > 40
    crashes, silent, leaked = [], [], []
    for index in range(CALLS):
        tool = tools[index % len(tools)]
        args = arguments(rng, tool.input_schema)
        before = len(sim.lab.requests)
        result = fuzzed.call(tool.name, args)
        text = result.content[0].text if result.content else ""
        sent = [r for r in sim.lab.requests[before:] if r[2] not in ("/access/permissions", "/version")]
        if result.is_error:
            if text.strip() in (f"Error executing tool {tool.name}", ""):
                crashes.append((tool.name, args))
            elif ("validation error" in text or text.startswith(f"{tool.name}: argument '")) and sent:
                leaked.append((tool.name, args, sent))
        elif not text:
            silent.append((tool.name, args))
        # the prune preview is a POST with dry-run=1 (the read gate); anything else would be a write
        if any(method != "GET" and not path.endswith("/prune") for _, method, path in sent):
            leaked.append((tool.name, args, "a write was sent under dry run"))
    assert crashes == [], crashes[:5]
    assert silent == [], silent[:5]
    assert leaked == [], leaked[:5]
    assert sim.lab.schema_rejections == []


def test_fuzz_over_mcp_answers_as_in_process(fuzzed, fuzz_env):
    rng = random.Random(20261129)
    with stdio_session(fuzz_env, log_name="fuzz") as over_mcp:
        tools = over_mcp.tools()
        assert [(t.name, t.input_schema) for t in tools] == [(t.name, t.input_schema) for t in fuzzed.tools()]
        for index in range(MCP_CALLS):
            tool = tools[index % len(tools)]
            args = arguments(rng, tool.input_schema)
            wire, local = over_mcp.call(tool.name, args), fuzzed.call(tool.name, args)
            assert wire.is_error == local.is_error and len(wire.content) == len(local.content) == 1, (tool.name, args)
            if wire.is_error:  # an answer may hold the time; an error says the same over both
                assert wire.content[0].text == local.content[0].text, (tool.name, args)
            else:
                assert json.loads(wire.content[0].text).keys() == json.loads(local.content[0].text).keys()
