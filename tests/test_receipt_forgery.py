"""Receipts that cannot be forged (issue 28 section 6), in the style of the bypass corpus: each
entry changes the state database the way someone who can write it would (a `before` edited, two
receipts' ids swapped, a receipt copied under another id or to another host, one brought from
another server's state, an undone mark taken away), and write_undo_change must refuse it with a
clear message and nothing sent. The legitimate neighbours beside them must still work: an
untouched receipt, a second server sharing the state, the undo's own receipt, list_changes
marking what does not verify. And a receipt is taken back only on the host it was made on: a
server whose host of that label is another URL refuses it."""
import json
import sqlite3

import pytest

import receipts
from conftest import everything_open, requests_during, tool_session

VMID = 103  # a container on pve1 (the lab's), changed here only


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    path = tmp_path_factory.mktemp("forgery")
    (path / "protected.json").write_text("[]")
    return path


@pytest.fixture(scope="module")
def ops(sim, tmp):
    with tool_session(everything_open(sim, tmp), log_name="forgery") as session:
        yield session


def db(tmp):
    return sqlite3.connect(tmp / "state" / "state.sqlite3")


def body(tmp, receipt_id):
    with db(tmp) as connection:
        return json.loads(connection.execute("SELECT body FROM receipts WHERE id = ?", (receipt_id,)).fetchone()[0])


def set_body(tmp, receipt_id, receipt):
    with db(tmp) as connection:
        connection.execute("UPDATE receipts SET body = ? WHERE id = ?",
                           (json.dumps(receipt, separators=(",", ":")), receipt_id))


def changed(ops, description):
    return ops.ok("write_configure_guest", {"vmid": VMID, "set": {"description": description}})["receipt"]


def forged_before(tmp, made, _other):
    """The old value edited: the undo would send memory=1 (an attacker's value) as `before`."""
    receipt = body(tmp, made)
    receipt["steps"][0]["before"]["memory"] = 1
    set_body(tmp, made, receipt)


def forged_row(tmp, made, _other):
    """Only the list row edited (what list_changes and a question used to show)."""
    with db(tmp) as connection:
        row = json.loads(connection.execute("SELECT row FROM receipts WHERE id = ?", (made,)).fetchone()[0])
        row["change"] = "nothing that matters"
        connection.execute("UPDATE receipts SET row = ? WHERE id = ?", (json.dumps(row), made))


def swapped_ids(tmp, made, other):
    """Two receipts' stored copies swapped: each id holds the other's body and signature."""
    with db(tmp) as connection:
        first = connection.execute("SELECT row, body, mac FROM receipts WHERE id = ?", (made,)).fetchone()
        second = connection.execute("SELECT row, body, mac FROM receipts WHERE id = ?", (other,)).fetchone()
        connection.execute("UPDATE receipts SET row = ?, body = ?, mac = ? WHERE id = ?", (*second, made))
        connection.execute("UPDATE receipts SET row = ?, body = ?, mac = ? WHERE id = ?", (*first, other))


def renamed_id(tmp, made, other):
    """Another receipt's body, signature and all, put under this id, with its id in the body matching."""
    receipt = body(tmp, other) | {"id": made}
    with db(tmp) as connection:
        mac = connection.execute("SELECT mac FROM receipts WHERE id = ?", (other,)).fetchone()[0]
        connection.execute("UPDATE receipts SET body = ?, mac = ? WHERE id = ?",
                           (json.dumps(receipt, separators=(",", ":")), mac, made))


def other_host(tmp, made, _other):
    """The receipt moved to another host label (a replay against another cluster)."""
    set_body(tmp, made, body(tmp, made) | {"host": "office", "url": "https://192.0.2.99:8006"})


def undone_mark_dropped(tmp, made, _other):
    """A receipt already taken back, its undone mark removed so that it can be replayed."""
    receipt = body(tmp, made)
    receipt.pop("undone_by", None)
    receipt["undone_by"] = None
    set_body(tmp, made, receipt)


def from_another_state(tmp, made, _other):
    """The receipt as another server's state signed it (another key): copied in whole."""
    elsewhere = receipts.open_store(tmp / "elsewhere" / "audit.jsonl")
    elsewhere.save(body(tmp, made), 1000, 30)
    with sqlite3.connect(tmp / "elsewhere" / "state" / "state.sqlite3") as theirs:
        copied = theirs.execute("SELECT row, body, mac FROM receipts WHERE id = ?", (made,)).fetchone()
    with db(tmp) as connection:
        connection.execute("UPDATE receipts SET row = ?, body = ?, mac = ? WHERE id = ?", (*copied, made))


# (name, how the state is changed, what the refusal says)
FORGERIES = [
    ("a forged before", forged_before, "does not verify"),
    ("a forged list row", forged_row, "does not verify"),
    ("two receipts' ids swapped", swapped_ids, "does not verify"),
    ("a receipt under another id", renamed_id, "does not verify"),
    ("a receipt moved to another host", other_host, "does not verify"),
    ("an undone receipt replayed", undone_mark_dropped, "does not verify"),
    ("a receipt from another server's state", from_another_state, "does not verify"),
]


@pytest.mark.parametrize("name, forge, refusal", FORGERIES, ids=[f[0] for f in FORGERIES])
def test_a_forged_receipt_is_refused_with_nothing_sent(ops, sim, tmp, name, forge, refusal):
    other, made = changed(ops, f"{name} 2"), changed(ops, f"{name} 1")  # `made` is the newest: undoable as it is
    if forge is undone_mark_dropped:
        ops.ok("write_undo_change", {"receipt": made})
        other = changed(ops, f"{name} 1")  # as the change left it again, so that only the mark stands in the way
    with db(tmp) as connection:
        saved = {rid: connection.execute("SELECT row, body, mac FROM receipts WHERE id = ?", (rid,)).fetchone()
                 for rid in (made, other)}
    forge(tmp, made, other)
    try:
        message, sent = requests_during(sim, lambda: ops.error("write_undo_change", {"receipt": made, "confirm": True}),
                                        writes=True)
        assert refusal in message and "Nothing was sent" in message and sent == []
        assert "memory" not in message  # a forged value is never shown as if it were the receipt's
        row = next(r for r in ops.ok("list_changes", {"vmid": VMID, "limit": 50})["rows"] if r[0] == made)
        assert row[-1] == "no: it does not verify (changed outside this server)"
    finally:
        with db(tmp) as connection:
            for rid, stored in saved.items():
                connection.execute("UPDATE receipts SET row = ?, body = ?, mac = ? WHERE id = ?", (*stored, rid))
    assert sim.lab.guests[VMID]["config"]["memory"] != 1


# ---------------------------------------------------------------- the legitimate neighbours

def test_an_untouched_receipt_is_taken_back_and_its_undo_too(ops, sim, tmp):
    was = sim.lab.guests[VMID]["config"].get("description")
    made = changed(ops, "kept as it was")
    undone = ops.ok("write_undo_change", {"receipt": made})
    assert undone["result"] == "ok" and sim.lab.guests[VMID]["config"].get("description") == was
    assert body(tmp, made)["undone_by"] == [undone["receipt"]]  # marked, and signed again by the server
    assert "taken back already" in ops.error("write_undo_change", {"receipt": made})
    assert ops.ok("write_undo_change", {"receipt": undone["receipt"]})["result"] == "ok"  # the redo verifies
    assert sim.lab.guests[VMID]["config"]["description"] == "kept as it was"


def test_a_second_server_sharing_the_state_takes_a_receipt_back(ops, sim, tmp):
    """Two servers with their audit logs in one folder share the state database and its key."""
    was = sim.lab.guests[VMID]["config"].get("description")
    made = changed(ops, "shared state")
    with tool_session(everything_open(sim, tmp, PROXMOX_AUDIT_LOG=str(tmp / "second.jsonl")),
                      log_name="forgery-second") as second:
        assert second.ok("write_undo_change", {"receipt": made})["result"] == "ok"
    assert sim.lab.guests[VMID]["config"].get("description") == was


def test_a_receipt_is_taken_back_only_on_the_host_it_was_made_on(ops, sim, tmp):
    """A server whose host of the same label is another URL (another cluster, perhaps) refuses it."""
    made = changed(ops, "this cluster")
    moved = everything_open(sim, tmp) | {"PROXMOX_LAB_URL": sim.url("pve").replace("127.0.0.1", "localhost")}
    with tool_session(moved, log_name="forgery-moved") as elsewhere:
        message, sent = requests_during(sim, lambda: elsewhere.error("write_undo_change", {"receipt": made}),
                                        writes=True)
    assert "was made on host 'lab' at https://127.0.0.1" in message and "localhost" in message and sent == []
    assert ops.ok("write_undo_change", {"receipt": made})["result"] == "ok"  # where it was made: taken back
