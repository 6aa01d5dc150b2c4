"""Stored state under a principal's reach (docs/REVIEW-SECURITY.md F11): a principal limited to some
hosts lists, compares with and takes back only receipts and safety snapshots of those hosts; receipts
record the host they reached (receipt_hosts), and a store of the earlier layout gets it on first open."""
from conftest import requests_during
from test_http import http_server
from test_principals import TOKENS, env_of, session_as
from test_receipt_store import a_receipt, keeping_at

import receipts
import state


def hosts_of(listed: dict) -> set[str]:
    return {row[listed["columns"].index("host")] for row in listed["rows"]}


def test_every_tool_that_reads_stored_state_keeps_to_the_principals_hosts(sim, tmp_path):
    """carol (every host) changes guest 100 on lab; dave (hosts: home) is shown none of it, by page, by
    guest, as a safety snapshot, as what_changed's base or as an undo, and nothing is sent for him."""
    with http_server(env_of(sim, tmp_path)) as base:
        with session_as(base + "/mcp", TOKENS["carol"]) as carol:
            made = carol.ok("write_create_snapshot", {"host": "lab", "vmid": 100, "name": "reach_f11"})["receipt"]
            receipts.open_store(tmp_path / "audit.jsonl").add_safety("lab", 100, "mcp-safety-0a0b0c0d", "x", made,
                                                                     None)
            assert "lab" in hosts_of(carol.ok("list_changes"))
        with session_as(base + "/mcp", TOKENS["dave"]) as dave:
            for arguments in ({}, {"vmid": 100}):
                listed = dave.ok("list_changes", arguments)
                assert "lab" not in hosts_of(listed) and made not in str(listed), listed
            for tool, arguments in (("what_changed", {"vmid": 100, "host": "home", "since": made}),
                                    ("write_undo_change", {"receipt": made, "confirm": True})):
                message, sent = requests_during(sim, lambda t=tool, a=arguments: dave.error(t, a), writes=True)
                assert f"No receipt {made}" in message and sent == [], message
        with session_as(base + "/mcp", TOKENS["carol"]) as carol:
            carol.ok("write_undo_change", {"receipt": made, "confirm": True})


def test_a_store_of_the_earlier_layout_learns_each_receipts_host(tmp_path):
    keeping = keeping_at(tmp_path)
    receipts.save(keeping, a_receipt(1))
    receipts.save(keeping, a_receipt(2) | {"host": "home"})
    database = state.Database(state.path_for(tmp_path / "audit.jsonl"))
    with database.transaction() as db:  # as version 1 left it: no receipt_hosts
        db.execute("DROP TRIGGER receipt_removed_hosts")
        db.execute("DROP TABLE receipt_hosts")
        db.execute("UPDATE schemas SET version = 1 WHERE name = 'receipts'")
    store = keeping_at(tmp_path).store
    rows, total = store.page(None, 20, 0, frozenset({"lab"}))
    assert total == 1 and [r["receipt"] for r in rows] == ["rc-00000001"] and all(r["verified"] for r in rows)
    assert store.page(100, 20, 0, frozenset({"home"}))[1] == 1 and store.page(None, 20, 0, frozenset())[1] == 0
    assert store.load("rc-00000001", frozenset({"home"})) is None and store.load("rc-00000001")["host"] == "lab"
    assert database.read("SELECT version FROM schemas WHERE name = 'receipts'") == [(2,)]
