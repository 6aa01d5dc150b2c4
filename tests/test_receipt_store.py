"""The state database and the receipts kept in it (state.py, receipt_store.py): owner-only files, one
file that several owners' tables share, a newer layout refused, the receipts an earlier version kept
as files imported once on first start (listed and compared, never undone), the principal of each
call kept and shown, pages read through the indexes."""
import json
import os
import sqlite3
import stat
import time
from types import SimpleNamespace

import pytest

import calls
import changes
import policy
import receipts
import runtime
import state
from conftest import everything_open, requests_during, tool_session
from settings import Keeping, Settings

OLD_RECEIPT = {  # a receipt file as 0.2.0 before this change kept it: one request, every field at the top
    "id": "rc-0a1b2c3d", "time": "2026-11-30T10:00:00Z", "epoch": None, "host": "lab", "product": "pve",
    "tool": "write_configure_guest", "by": "root@pam!admin", "method": "PUT", "path": "/nodes/pve1/qemu/100/config",
    "template": "/nodes/{node}/qemu/{vmid}/config", "params": {"cores": 3}, "guests": [100], "kind": "settings",
    "object": "/nodes/pve1/qemu/100/config", "selectors": {}, "before": {"cores": 2, "memory": 4096, "digest": "a"},
    "after": {"cores": 3, "memory": 4096, "digest": "b"}, "changes": ["cores 2 -> 3"], "undo": True, "audit": "0" * 64}


def mode(path):
    return stat.S_IMODE(path.stat().st_mode)


def keeping_at(folder, **fields):
    return Keeping(receipts.open_store(folder / "audit.jsonl"), **fields)


def a_receipt(number, guests=(100,), principal=None, epoch=None):
    return {"id": f"rc-{number:08x}", "time": "2026-12-01T00:00:00Z", "epoch": epoch or 1_800_000_000 + number,
            "host": "lab", "product": "pve", "url": "https://pve1:8006", "tool": "write_configure_guest",
            "by": "root@pam!admin", "principal": principal, "guests": list(guests),
            "steps": [{"method": "PUT", "path": "/nodes/pve1/qemu/100/config", "kind": "settings", "undo": True,
                       "changes": [f"cores {number} -> {number + 1}"], "guests": list(guests)}]}


def test_the_state_folder_file_and_key_are_the_owners_only(tmp_path):
    """The audit log's folder is made as audit.py makes it (the usual mode); the state beside it is the
    server's own: its folder 0700 (made so again when found open), the database and the key 0600."""
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o755)
    keeping = keeping_at(logs)
    receipts.save(keeping, a_receipt(1))
    folder = logs / "state"
    assert mode(folder) == 0o700 and mode(folder / "state.sqlite3") == 0o600 and mode(folder / "receipts.key") == 0o600
    assert all(mode(path) == 0o600 for path in folder.glob("state.sqlite3-*"))  # the WAL files take the file's mode
    assert len((folder / "receipts.key").read_bytes()) == 32
    folder.chmod(0o755)
    receipts.save(keeping_at(logs), a_receipt(2))  # another server's start on the same state
    assert mode(folder) == 0o700


def test_several_owners_share_one_file_and_a_newer_layout_is_refused(tmp_path):
    database = state.Database(state.path_for(tmp_path / "audit.jsonl"))
    other = state.Schema("tokens", 1, ("CREATE TABLE IF NOT EXISTS tokens (name TEXT PRIMARY KEY)",))
    assert database.ensure(other) is True and database.ensure(other) is False
    receipts.save(keeping_at(tmp_path), a_receipt(2))
    names = {row[0] for row in database.read("SELECT name FROM schemas")}
    assert names == {"tokens", "receipts"}
    with database.transaction() as db:
        db.execute("UPDATE schemas SET version = 99 WHERE name = 'receipts'")
    with pytest.raises(state.StateError, match="holds receipts version 99, written by a newer server"):
        keeping_at(tmp_path).store.page(None, 20, 0)


def test_pages_are_read_newest_first_by_guest_and_counted(tmp_path):
    keeping = keeping_at(tmp_path, keep=100)
    for number in range(1, 31):
        receipts.save(keeping, a_receipt(number, guests=(100,) if number % 3 else (100, 101)))
    rows, total = keeping.store.page(None, 5, 0)
    assert total == 30 and [r["receipt"] for r in rows] == [f"rc-{n:08x}" for n in (30, 29, 28, 27, 26)]
    rows, total = keeping.store.page(101, 3, 2)
    assert total == 10 and [r["receipt"] for r in rows] == [f"rc-{n:08x}" for n in (24, 21, 18)]
    assert all(r["verified"] for r in rows) and rows[0]["change"] == "cores 24 -> 25"
    receipts.save(keeping_at(tmp_path, keep=10), a_receipt(31))  # pruned from the oldest end: the count is kept
    assert keeping.store.page(None, 1, 0)[1] == 10 and len(keeping.store.ids()) == 10
    assert keeping.store.page(101, 100, 0)[1] == 3  # their guests went with them


def test_the_principal_is_kept_and_list_changes_shows_it(tmp_path):
    """The auth stream names who called (policy.current_call()["principal"]); the single-user form does not."""
    keeping = keeping_at(tmp_path)
    host = SimpleNamespace(product="pve", label="lab", url="https://pve1:8006", token_id="mcp@pve!reader",
                           write_token_id="mcp-ops@pve!write")
    assert receipts.record_for(host, calls.Call(tool="write_configure_guest")).receipt["principal"] is None
    named = receipts.record_for(host, calls.Call(tool="write_configure_guest", principal="alice")).receipt
    receipts.save(keeping, named | {"steps": a_receipt(1)["steps"]})
    outside = runtime.install(runtime.Runtime())
    try:
        policy.configure(Settings(receipts=keeping))
        listed = changes.list_changes()
        assert listed["columns"][-1] == "principal" and listed["rows"][0][-1] == "alice"
        assert listed["rows"][0][4] == "mcp-ops@pve!write"  # by: the token that wrote
        receipts.save(keeping, a_receipt(5) | {"epoch": 1_900_000_000})
        assert "principal" in changes.list_changes()["columns"]  # a page with one named call shows the column
        assert "principal" not in changes.list_changes(limit=1)["columns"]  # a page of unnamed calls does not
    finally:
        runtime.install(outside)


# ---------------------------------------------------------------- receipts of an earlier version

@pytest.fixture()
def upgraded(sim, tmp_path):
    """The folder of a server upgraded from the file layout: audit.receipts/ with one receipt file."""
    (tmp_path / "protected.json").write_text("[]")
    folder = tmp_path / "audit.receipts"
    folder.mkdir()
    old = OLD_RECEIPT | {"epoch": time.time() - 3600}
    (folder / f"{old['id']}.json").write_text(json.dumps(old))
    (folder / "rc-zzzz.json").write_text("not a receipt")  # skipped
    os.chmod(folder, 0o755)
    with tool_session(everything_open(sim, tmp_path), log_name="store-upgraded") as session:
        yield session, tmp_path


def test_receipts_kept_as_files_are_imported_listed_and_compared(upgraded, sim):
    session, tmp = upgraded
    row = next(r for r in session.ok("list_changes", {"vmid": 100})["rows"] if r[0] == OLD_RECEIPT["id"])
    assert row[6] == "cores 2 -> 3" and row[-1].startswith("no: kept by an earlier version as a plain file")
    compared = session.ok("what_changed", {"vmid": 100, "since": OLD_RECEIPT["id"]})
    assert compared["since"] == f"before receipt {OLD_RECEIPT['id']}"
    assert (tmp / "audit.receipts" / f"{OLD_RECEIPT['id']}.json").exists()  # left where they were
    with sqlite3.connect(tmp / "state" / "state.sqlite3") as db:
        assert db.execute("SELECT folder, count FROM receipt_imports").fetchall() == [(str(tmp / "audit.receipts"), 1)]


def test_an_imported_receipt_is_never_undone(upgraded, sim):
    """A file anyone who could write the folder may have edited: its `before` is not sent."""
    session, _ = upgraded
    message, sent = requests_during(sim, lambda: session.error("write_undo_change", {"receipt": OLD_RECEIPT["id"]}),
                                    writes=True)
    assert "cannot be taken back: kept by an earlier version as a plain file" in message and sent == []


def test_files_are_imported_once(tmp_path):
    folder = tmp_path / "audit.receipts"
    folder.mkdir()
    (folder / "rc-0a1b2c3d.json").write_text(json.dumps(OLD_RECEIPT | {"epoch": 1_800_000_000.0}))
    keeping = keeping_at(tmp_path, keep=100, days=3650)
    assert keeping.store.ids() == ["rc-0a1b2c3d"]
    (folder / "rc-0a1b2c3e.json").write_text(json.dumps(OLD_RECEIPT | {"id": "rc-0a1b2c3e", "epoch": 1_800_000_001.0}))
    assert keeping_at(tmp_path).store.ids() == ["rc-0a1b2c3d"]  # a new server on the same state: no second import
