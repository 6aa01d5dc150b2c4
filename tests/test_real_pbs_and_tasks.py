"""Real Proxmox behaviour around PBS, tasks and access (issue 15), each modelled in the simulator
after the source cited in docs/PROXMOX-BEHAVIOUR.md and checked here through the tool functions,
called in this process against a simulator of the test's own."""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator

import pytest

import config as config_module
import pbs_tools
import policy
import proxmox_client
import simulator
import workflows
from errors import ToolFailure

LABEL = "real"  # a label of its own: privileges read here never mix with other tests' hosts


@contextmanager
def tools_on(sim: simulator.Simulator, tmp_path: Any, pve_token: str = "mcp@pve!reader",
             pbs_token: str = "mcp@pbs!reader", **env: str) -> Iterator[None]:
    """The tool functions of this process pointed at `sim` (host label `real`)."""
    settings = config_module.load_config(sim.env(LABEL, pve_token=pve_token, pbs_token=pbs_token) | {
        "PROXMOX_AUDIT_LOG": str(tmp_path / "audit.jsonl")} | env)
    before = [h for product in ("pve", "pbs") for h in proxmox_client.configured(product).values()]
    original = policy.SETTINGS
    proxmox_client.configure_hosts(settings.hosts)
    policy.configure(settings.settings)
    try:
        yield
    finally:
        proxmox_client.configure_hosts(before)
        policy.configure(original)
        for kept in (policy.PERMISSIONS, getattr(policy, "VERSIONS", {})):
            for key in [k for k in kept if k[1] == LABEL]:
                kept.pop(key)


def rows(answer: dict) -> list[dict]:
    return [dict(zip(answer["columns"], row, strict=True)) for row in answer["rows"]]


@pytest.fixture()
def lab() -> simulator.Lab:
    return simulator.Lab.homelab()


@pytest.fixture()
def sim(lab: simulator.Lab) -> Iterator[simulator.Simulator]:
    with simulator.Simulator(lab) as running:
        yield running
        assert running.lab.schema_rejections == [], running.lab.schema_rejections


def findings(report: dict, area: str) -> list[str]:
    return [f["finding"] for f in report["findings"] if f["area"] == area]


# ---------------------------------------------------------------- 1, 2: PBS job states and garbage collection

def test_healthy_verify_job_is_not_reported_failed(sim, tmp_path):
    with tools_on(sim, tmp_path):
        report = workflows.health_check()
    assert not [f for f in findings(report, "pbs") if "verify job" in f], report["findings"]


def test_failed_and_warning_verify_jobs(sim, lab, tmp_path):
    job = lab.pbs_jobs["verify"][0]
    with tools_on(sim, tmp_path):
        job["last-run-state"] = "WARNINGS: 2"
        assert not [f for f in findings(workflows.health_check(), "pbs") if "verify job" in f]
        job["last-run-state"] = "verification failed - please check the log for details"
        failed = [f for f in findings(workflows.health_check(), "pbs") if "verify job" in f]
    assert failed and "verification failed" in failed[0]


def test_gc_times_come_from_the_gc_job(sim, lab, tmp_path):
    ran = lab.datastores["backup"]["gc_job"]["last-run-endtime"]
    with tools_on(sim, tmp_path):
        before = len(lab.requests)
        stores = rows(pbs_tools.pbs_list_datastores())
        asked = [path for _, _, path in lab.requests[before:] if path not in ("/access/permissions", "/version")]
        status = pbs_tools.pbs_datastore_status("backup")
        report = workflows.health_check()
    assert stores[0]["last_gc"] == pbs_tools.iso_time(ran) and stores[0]["gc_result"] == "OK"
    assert asked == ["/status/datastore-usage", "/admin/gc"]  # one extra read for every store
    assert status["gc"]["last_run"] == pbs_tools.iso_time(ran) and status["gc"]["state"] == "OK"
    assert status["gc"]["next_run"]
    assert not [f for f in findings(report, "pbs") if "garbage collection" in f], report["findings"]


def test_old_or_failed_gc_is_reported(sim, lab, tmp_path):
    gc = lab.datastores["backup"]["gc_job"]
    gc["last-run-endtime"] = int(time.time()) - 20 * 86400
    with tools_on(sim, tmp_path):
        assert [f for f in findings(workflows.health_check(), "pbs") if "garbage collection" in f]
        gc |= {"last-run-endtime": int(time.time()) - 3600, "last-run-state": "TASK ERROR: out of space"}
        failed = [f for f in findings(workflows.health_check(), "pbs") if "garbage collection" in f]
    assert failed and "out of space" in failed[0]


def test_unmounted_datastore_is_unavailable(sim, lab, tmp_path):
    lab.add_datastore("usb", total=1000 * simulator.GiB, used=10 * simulator.GiB)
    lab.datastores["usb"]["error"] = "datastore 'usb' is not mounted"
    with tools_on(sim, tmp_path, pbs_token="root@pam!admin"):
        stores = {r["store"]: r for r in rows(pbs_tools.pbs_list_datastores())}
        report = workflows.health_check()
        with pytest.raises(ToolFailure, match="not mounted"):
            pbs_tools.pbs_datastore_status("usb")
    assert stores["usb"]["unavailable"] == "datastore 'usb' is not mounted" and stores["usb"]["used"] == ""
    assert stores["backup"]["unavailable"] == ""
    assert any("usb" in u["section"] and "not mounted" in u["reason"] for u in report["unavailable"])
    assert not [f for f in findings(report, "pbs") if "usb" in f]
