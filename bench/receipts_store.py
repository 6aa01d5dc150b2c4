"""Receipts as the store grows (issue 31): the time one write takes to keep its receipt, and one
list_changes call (a page of 20), with the store empty (or holding one page) and holding 10,000
receipts, side by side with the file layout of earlier versions (one JSON file a receipt, listed,
stat'ed and sorted at every write). Prints the figures and their ratios; nothing here asserts.
Run from the project root:

    python bench/receipts_store.py [--receipts N] [--rounds N] [--file-rounds N]

The receipt written is a config change of a guest (before and after of 40 keys, one step), as
write_configure_guest keeps one. The state database is measured through receipts.save and the
list_changes tool function in process (policy settings of a server installed); the file layout through
the receipts.py of commit 18fa2fb (the last one with files), loaded beside it. Medians of N rounds (the
file layout's of fewer: one list of 10,000 files takes seconds).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import answers  # noqa: E402
import changes  # noqa: E402
import policy  # noqa: E402
import receipts  # noqa: E402
import runtime  # noqa: E402
from settings import Keeping, Settings  # noqa: E402

FILE_LAYOUT = "18fa2fb"  # the last commit that kept receipts as files
CONFIG = {f"option{n}": f"value-{n}-" + "x" * 20 for n in range(38)} | {"memory": 4096, "digest": "d" * 40}


def a_receipt(number: int, epoch: float) -> dict:
    """A receipt of one config change, as receipts.py keeps it."""
    step = {"method": "PUT", "path": "/nodes/pve1/qemu/100/config", "template": "/nodes/{node}/qemu/{vmid}/config",
            "params": {"memory": 8192, "digest": "d" * 40}, "guests": [100 + number % 50], "kind": "settings",
            "object": "/nodes/pve1/qemu/100/config", "selectors": {}, "before": CONFIG,
            "after": CONFIG | {"memory": 8192}, "changes": ["memory 4 -> 8 GiB"], "undo": True, "audit": "a" * 64}
    return {"id": f"rc-{number:08x}", "time": "2026-12-01T00:00:00Z", "epoch": epoch, "host": "lab", "product": "pve",
            "url": "https://pve1:8006", "tool": "write_configure_guest", "by": "mcp-ops@pve!write", "principal": None,
            "guests": step["guests"], "steps": [step]}


def an_old_receipt(number: int, epoch: float) -> dict:
    """The same change as the file layout kept it (one request, its fields at the top)."""
    new = a_receipt(number, epoch)
    return {k: v for k, v in new.items() if k != "steps"} | new["steps"][0]


def median_seconds(action: Callable[[], object], rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        action()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


# ---------------------------------------------------------------- the state database

def database_figures(folder: Path, count: int, rounds: int, keep: int = 100000) -> dict[str, float]:
    keeping = Keeping(receipts.open_store(folder / "audit.jsonl"), keep=keep, days=3650)
    now = time.time()
    numbers = iter(range(count, 10 ** 8))
    for number in range(count):
        receipts.save(keeping, a_receipt(number, now - count + number))
    outside = runtime.install(runtime.Runtime())
    try:  # the list first: the writes measured below add their receipts
        policy.configure(Settings(receipts=keeping))
        listing = median_seconds(lambda: changes.list_changes(), rounds)
    finally:
        runtime.install(outside)
    write = median_seconds(lambda: receipts.save(keeping, a_receipt(next(numbers), time.time())), rounds)
    keeping.store.database.close()
    return {"write": write, "list": listing}


# ---------------------------------------------------------------- the file layout

def file_layout_module(workdir: Path):
    """receipts.py as the file layout had it, importable beside today's modules."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{FILE_LAYOUT}:receipts.py"], check=True,
                            capture_output=True, text=True).stdout
    path = workdir / "receipts_files.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("receipts_files", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["receipts_files"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def file_figures(old, folder: Path, count: int, rounds: int) -> dict[str, float]:
    keeping = old.Keeping(folder / "audit.receipts", keep=100000, days=3650)
    keeping.directory.mkdir(parents=True)
    now = time.time()
    for number in range(count):  # written directly: save() would list the folder each time
        receipt = an_old_receipt(number, now - count + number)
        target = keeping.directory / f"{receipt['id']}.json"
        target.write_text(json.dumps(receipt, separators=(",", ":")))
        os.utime(target, (receipt["epoch"], receipt["epoch"]))
    numbers = iter(range(count, 10 ** 8))

    def list_changes() -> dict:  # the list_changes of that commit
        rows = [{"receipt": r["id"], "time": r["time"], "host": r["host"], "tool": r.get("tool"), "by": r.get("by"),
                 "guests": ",".join(map(str, r.get("guests") or [])), "change": "; ".join(r.get("changes") or []),
                 "undo": "yes"} for r in old.recent(keeping)]
        return answers.table(changes.COLUMNS, rows, limit=20, offset=0)
    listing = median_seconds(list_changes, rounds)
    write = median_seconds(lambda: old.save(keeping, an_old_receipt(next(numbers), time.time())), rounds)
    return {"write": write, "list": listing}


# ---------------------------------------------------------------- the table

def measure(count: int, rounds: int, file_rounds: int) -> dict:
    with tempfile.TemporaryDirectory() as workdir:
        work = Path(workdir)
        old = file_layout_module(work)
        figures = {}
        for size in (0, 20, count):
            figures[("state database", size)] = database_figures(work / f"database-{size}", size, rounds)
            figures[("files", size)] = file_figures(old, work / f"files-{size}", size, file_rounds)
        figures["full"] = database_figures(work / "database-full", count, rounds, keep=count)
        return figures


def print_table(figures: dict, count: int) -> None:
    """Per write: an empty store against one of `count` receipts. Per list_changes: the same against
    a store of one page (20: the same answer, so what differs is the store's size), and the empty
    store's (no rows to read) beside them."""
    print(f"| layout | per write, empty | at {count:,} | ratio | per list_changes, empty | one page (20) | "
          f"at {count:,} | ratio to one page |")
    print("|---|---|---|---|---|---|---|---|")
    for layout in ("state database", "files"):
        empty, page, full = (figures[(layout, size)] for size in (0, 20, count))
        writes = f"{_us(empty['write'])} | {_us(full['write'])} | {full['write'] / empty['write']:.2f}x"
        lists = f"{_us(empty['list'])} | {_us(page['list'])} | {_us(full['list'])} | {full['list'] / page['list']:.2f}x"
        print(f"| {layout} | {writes} | {lists} |")
    full, empty = figures["full"]["write"], figures[("state database", 0)]["write"]
    print(f"\nstate database at its count (PROXMOX_RECEIPTS_KEEP={count:,}, the oldest dropped a hundredth at a time): "
          f"{_us(full)} per write, {full / empty:.2f}x the empty store's")


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f} µs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--receipts", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--file-rounds", type=int, default=5)
    options = parser.parse_args()
    print_table(measure(options.receipts, options.rounds, options.file_rounds), options.receipts)


if __name__ == "__main__":
    main()
