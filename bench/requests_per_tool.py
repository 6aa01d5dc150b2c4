"""API requests per tool call: every tool of the every-tool test (tests/test_every_tool_over_mcp.py,
its CALLS in its order, against the same homelab and the same everything-open server), run in
process, each call's requests counted as the simulator receives them. Not a test: nothing here
asserts (tests/test_request_counts.py holds the issue-30 targets). Run from the project root:

    python bench/requests_per_tool.py [--json]

Prints a Markdown table (tool, requests besides task polls, GETs, writes, requests repeated
within the call, task polls, requests the admission step classified) and two more rows: a node
firewall rule added at a position, and a guest stop (its task polls counted apart). The token's
privileges and the version, read once per host in the background, are left out.
"""
from __future__ import annotations

import json
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import config  # noqa: E402
import conftest  # noqa: E402
import policy  # noqa: E402
import simulator  # noqa: E402
from test_every_tool_over_mcp import CALLS  # noqa: E402

BACKGROUND = ("/access/permissions", "/version")
# The two calls issue 30 names: a rule added at a position of a node's firewall, a guest stopped.
NAMED = [("node firewall rule added at pos 0", "write_edit_firewall_rule",
          {"node": "pve1", "action": "add", "pos": 0,
           "rule": {"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "8443"}, "confirm": True}),
         ("guest stop", "write_power_guest", {"vmid": 100, "action": "stop", "confirm": True})]


def is_poll(path: str) -> bool:
    """A task's status or log read (how a tool waits for the task it started)."""
    return "/tasks/" in path and path.rsplit("/", 1)[-1] in ("status", "log")


ADMITTED = [0]  # requests the admission step classified (each read the policy makes through the client counts)


def counting(classify: Callable[..., Any]) -> Callable[..., Any]:
    def counted_classify(*args: Any, **kwargs: Any) -> Any:
        ADMITTED[0] += 1
        return classify(*args, **kwargs)
    return counted_classify


def counted(lab: simulator.Lab, action: Callable[[], Any]) -> tuple[dict, Any]:
    before, admitted = len(lab.requests), ADMITTED[0]
    answer = action()
    sent = [r for r in lab.requests[before:] if r[2] not in BACKGROUND]
    polls = [r for r in sent if is_poll(r[2])]
    row = {"requests": len(sent) - len(polls), "gets": sum(1 for r in sent if r[1] == "GET" and not is_poll(r[2])),
           "writes": sum(1 for r in sent if r[1] != "GET"), "polls": len(polls),
           "repeated": sum(n - 1 for n in Counter(r for r in sent if not is_poll(r[2])).values() if n > 1),
           "admitted": ADMITTED[0] - admitted}
    return row, answer


def prepare(lab: simulator.Lab, tmp: Path) -> None:
    """What the every-tool test's `admin` fixture sets up in the lab."""
    (tmp / "protected.json").write_text(json.dumps([{"host": "lab", "vmid": 105, "reason": "not used here"}]))
    lab.guests[100]["config"]["ide2"] = "local-lvm:vm-100-cloudinit,media=cdrom"
    lab.mcp_upids = {"pve": lab.start_task("pve1", "vzdump", "100", finished=True),
                     "pbs": lab.start_task("localhost", "verify", "backup", finished=True, product="pbs")}
    lab.mcp_receipts = tmp / "state" / "state.sqlite3"


def measure() -> list[dict]:
    rows = []
    policy.classify = counting(policy.classify)
    with tempfile.TemporaryDirectory() as workdir:
        tmp = Path(workdir)
        conftest.STATE_DIR = tmp / "state"
        conftest.STATE_DIR.mkdir()
        conftest.LOGS = tmp / "logs"
        conftest.LOGS.mkdir()
        (conftest.STATE_DIR / "no-protected-guests.json").write_text("[]")
        config.PROTECTED_FILE = conftest.STATE_DIR / "no-protected-guests.json"
        lab = simulator.Lab.homelab()
        lab.task_seconds = 0
        with simulator.Simulator(lab) as sim:
            prepare(lab, tmp)
            env = conftest.everything_open(sim, tmp) | {"XDG_STATE_HOME": str(conftest.STATE_DIR)}
            with conftest.in_process(env, log_name="bench-requests") as session:
                for label, tool, arguments in [(tool, tool, arguments) for tool, arguments in CALLS] + NAMED:
                    given = arguments(lab) if callable(arguments) else arguments  # NAMED last: the stop
                    row, _ = counted(lab, lambda t=tool, a=given: session.ok(t, a))  # leaves guest 100 stopped
                    rows.append({"tool": label} | row)
    return rows


def table(rows: list[dict]) -> str:
    columns = ("requests", "gets", "writes", "repeated", "polls", "admitted")
    lines = ["| tool | requests | GETs | writes | repeated | task polls | admitted |", "|---|" + "---:|" * 6]
    lines += [f"| {r['tool']} | " + " | ".join(str(r[c]) for c in columns) + " |" for r in rows]
    lines.append(f"| **all {len(rows)} calls** | " + " | ".join(str(sum(r[c] for r in rows)) for c in columns) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    measured = measure()
    print(json.dumps(measured, indent=1) if "--json" in sys.argv else table(measured))
