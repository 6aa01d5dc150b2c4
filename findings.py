"""A report of findings, as health_check, backup_coverage and security_audit answer: each finding
with its evidence and a next step, worst first; the sections that could not be read (never counted
as healthy); findings alike folded past the first few, so that an answer stays small however large
the cluster (docs/BENCHMARKS.md#workflows-as-the-cluster-grows).
"""
from typing import Any, Callable

from answers import LIST_CAP, more
from errors import ToolFailure
from fanout import in_parallel

WORST_FIRST = {"critical": 0, "warning": 1, "info": 2}  # a finding's severity: its place in the answer


class Report:
    """Findings with evidence and a next step; sections that could not be read."""

    def __init__(self, thresholds: dict[str, Any]):
        self.findings: list[dict] = []
        self.unavailable: list[dict] = []
        self.checked: list[str] = []
        self.thresholds = thresholds

    def add(self, severity: str, area: str, finding: str, evidence: Any, next_step: str, *,
            kind: str | None = None, subject: Any = None) -> None:
        """One finding. Findings of one `kind` (default: alike in area) fold together past the first
        few; `subject` is what a folded one is listed by (default: its text)."""
        self.findings.append({"severity": severity, "area": area, "finding": finding, "evidence": evidence,
                              "next": next_step, "_kind": kind or f"like these ({area})",
                              "_subject": subject if subject is not None else finding[:60]})

    def section(self, name: str, read: Callable[[], Any]) -> Any:
        """Run one section; a failure is recorded as unavailable, never as healthy."""
        try:
            result = read()
        except ToolFailure as exc:
            result = exc
        return self.record(name, result)

    def sections(self, reads: list[tuple[str, Callable[[], Any]]], nodes: list[str] | None = None) -> list[Any]:
        """Sections that do not depend on each other, read side by side (where `nodes` names the node each
        reads from, within what that node serves at once: fanout.PER_NODE) and recorded in the order given,
        as `section` records one (docs/BENCHMARKS.md#workflows-as-the-cluster-grows)."""
        results = in_parallel([read for _, read in reads], nodes=nodes)
        return [self.record(name, result) for (name, _), result in zip(reads, results, strict=True)]

    def merge(self, other: "Report") -> None:
        """What a part read beside this report (another host's sections), after this report's own."""
        self.findings += other.findings
        self.unavailable += other.unavailable
        self.checked += other.checked

    def record(self, name: str, result: Any) -> Any:
        if isinstance(result, ToolFailure):
            self.unavailable.append({"section": name, "reason": str(result)[:300]})
            return None
        self.checked.append(name)
        return result

    def drop_checked(self, name: str) -> None:
        """A section that found nothing to read (no PBS host configured) was not checked."""
        if name in self.checked:
            self.checked.remove(name)

    def answer(self, **extra: Any) -> dict:
        """Counts first, then the findings worst first; findings of one kind beyond the first few are
        summarised in one that counts them, lists the first ones and names the call that lists them all,
        so that the answer stays small however large the cluster and no finding is dropped
        (docs/BENCHMARKS.md#workflows-as-the-cluster-grows)."""
        findings = sorted(self.findings, key=lambda f: WORST_FIRST[f["severity"]])
        counts = {s: sum(f["severity"] == s for f in findings) for s in WORST_FIRST}
        return {"summary": counts | {"unavailable": len(self.unavailable)}, "findings": folded(findings),
                "unavailable": self.unavailable[:LIST_CAP] + more(self.unavailable, {"section": "..."}),
                "checked": self.checked[:LIST_CAP] + more(self.checked, ""), "thresholds": self.thresholds} | extra


FOLD_AFTER = 3  # findings of one kind shown one by one before the rest are summarised


# The call that lists every finding of an area one by one, named in a summary of them.
LISTS_ALL = {"locks": "list_guests status=locked", "ha": "api_read path=/cluster/ha/status/current",
             "tasks": "list_tasks errors=true limit=500", "disks": "node_disks node=<each node named>",
             "zfs": "node_disks node=<each node named>", "storage": "list_storage", "updates": "node_updates",
             "certificates": "api_read path=/nodes/<node>/certificates/info",
             "replication": "api_read path=/nodes/<node>/replication",
             "backups": "backup_coverage (offset pages through every guest)",
             "pbs": "pbs_list_jobs and pbs_list_datastores", "guests": "guest_config vmid=<each vmid named>"}


def _summary(severity: str, area: str, kind: str, group: list[dict]) -> dict:
    """Findings of one kind past the first few, in one: how many, the first LIST_CAP by subject, and
    the call that lists them all."""
    steps = {f["next"] for f in group}
    call = LISTS_ALL.get(area, "the first ones are named; look at each")
    return {"severity": severity, "area": area, "finding": f"{len(group)} more {kind}",
            "evidence": {"count": len(group), "first": [f["_subject"] for f in group[:LIST_CAP]], "all": call},
            "next": steps.pop() if len(steps) == 1 else f"each has its own next step; {call} lists them",
            "_kind": kind}


def folded(findings: list[dict]) -> list[dict]:
    """Findings of one severity, area and kind keep their first FOLD_AFTER; the rest become one
    summary after them. Nothing is dropped: the summary counts them all and names the call that lists them."""
    shown: list[dict] = []
    rest: dict[tuple[str, str, str], list[dict]] = {}
    for finding in findings:
        key = (finding["severity"], finding["area"], finding["_kind"])
        if sum(1 for f in shown if (f["severity"], f["area"], f["_kind"]) == key) < FOLD_AFTER:
            shown.append(finding)
        else:
            rest.setdefault(key, []).append(finding)
    for key, group in rest.items():
        position = max(i for i, f in enumerate(shown) if (f["severity"], f["area"], f["_kind"]) == key)
        shown.insert(position + 1, _summary(*key, group))
    return [{k: v for k, v in f.items() if not k.startswith("_")} for f in shown]
