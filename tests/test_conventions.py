"""The same quantity has the same name and unit in every tool (docs/CONVENTIONS.md): each read
tool's answer is walked, and every key the conventions name must hold its kind of value."""
import re

import pytest

from conftest import ROOT, tool_session

HUMAN_BYTES = re.compile(r"^-?\d+(\.\d)? (B|KiB|MiB|GiB|TiB)(/s)?$")
ISO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
# key -> (kind, why); keys ending _bytes, _pct, _mb, _gb follow their suffix everywhere
KINDS = {
    "mem_used": "human bytes", "mem_total": "human bytes", "maxmem": "human bytes", "maxdisk": "human bytes",
    "used": "human bytes", "size": "human bytes", "rootfs_used": "human bytes",
    "rootfs_total": "human bytes", "gc_freed": "human bytes", "freed": "human bytes", "pending": "human bytes",
    "time": "iso time", "start": "iso time", "last_run": "iso time", "next_run": "iso time", "last_gc": "iso time",
    "newest": "iso time", "last": "iso time",
    "cpus": "count", "backup_time": "epoch",
}
READS = [("list_nodes", {}), ("node_status", {"node": "pve1"}), ("list_guests", {}), ("get_guest", {"vmid": 100}),
         ("get_guest", {"vmid": 102}), ("list_storage", {}), ("list_backups", {}),
         ("storage_content", {"storage": "local"}), ("list_tasks", {}), ("cluster_log", {}),
         ("pbs_list_datastores", {}), ("pbs_list_datastores", {"store": "backup"}),
         ("pbs_list_groups", {"store": "backup"}), ("pbs_list_snapshots", {"store": "backup"}),
         ("pbs_list_jobs", {}), ("pbs_list_tasks", {}), ("health_check", {}), ("backup_coverage", {})]


@pytest.fixture(scope="module")
def reads(sim):
    # the reader with the README's backup grant: every read tool answers (backups on `local` included)
    with tool_session(sim.env(pve_token="mcp@pve!backups"), log_name="conventions") as s:
        yield s


RAW = ("config", "pending")  # a guest's configuration as Proxmox writes it (its `cores` is the config key)


def pairs(answer):
    """Every (key, value) in an answer, tables read row by row; Proxmox's own config left as it is."""
    if isinstance(answer, dict):
        if isinstance(answer.get("columns"), list) and isinstance(answer.get("rows"), list):
            for row in answer["rows"]:
                yield from pairs(dict(zip(answer["columns"], row, strict=True)))
        for key, value in answer.items():
            if key not in ("columns", "rows", *RAW):
                yield key, value
                yield from pairs(value)
    elif isinstance(answer, list):
        for item in answer:
            yield from pairs(item)


def wrong(key: str, value) -> str | None:
    if value in ("", None) or isinstance(value, (dict, list)):
        return None
    kind = KINDS.get(key) or next((k for suffix, k in (("_bytes", "bytes"), ("_pct", "pct"), ("_mb", "count"),
                                                      ("_gb", "count")) if key.endswith(suffix)), None)
    checks = {"human bytes": lambda v: isinstance(v, str) and HUMAN_BYTES.match(v),
              "iso time": lambda v: isinstance(v, str) and ISO_TIME.match(v),
              "bytes": lambda v: isinstance(v, int) and not isinstance(v, bool),
              "count": lambda v: isinstance(v, int) and not isinstance(v, bool),
              "epoch": lambda v: isinstance(v, int) and v > 10 ** 9,
              "pct": lambda v: isinstance(v, (int, float)) and 0 <= v <= 100}
    return None if kind is None or checks[kind](value) else f"{key}={value!r} is not {kind}"


@pytest.mark.parametrize("tool, arguments", READS, ids=[f"{t}-{i}" for i, (t, _) in enumerate(READS)])
def test_each_quantity_has_its_name_and_unit(reads, tool, arguments):
    answer = reads.ok(tool, arguments)
    assert [w for key, value in pairs(answer) if (w := wrong(key, value))] == []
    assert "cores" not in dict(pairs(answer)), "a node's or guest's CPU count is `cpus` (threads, vCPUs)"
    assert not [key for key, _ in pairs(answer) if key.endswith("_human")], "bytes: `x` human, `x_bytes` exact"


def test_the_conventions_table_names_every_rule():
    text = (ROOT / "docs" / "CONVENTIONS.md").read_text()
    for word in ("_bytes`", "_pct`", "`cpus`", "`time`", "`backup_time`", "`task`", "`guest_state`", "`result`",
                 "`protected`", "`memory_mb`", "`disk_gb`", "`total`", "`truncated`"):
        assert word in text, word
