"""Which parameters delete data, derived from the schemas: the policy's DELETING_PARAMS match
parameters by name and type in every write method of both catalogs; this walk proves that each
of them, given a value that deletes (or left at a default that does), makes its call destructive,
and that the look-alikes do not."""
import re

import pytest

import catalog
from gates import DELETING_PARAMS, call_gates, deleting

DELETING_VALUE = {"boolean": 1, "integer": 1, "string": "unused0"}
SPECIAL = {"prune-backups": "keep-last=1", "remove_job": "full", "remove-vanished": "1"}


def deleting_params():
    """(product, method, path, parameter, spec) for every parameter a DELETING_PARAMS row names."""
    rows = []
    for product in catalog.PRODUCTS:
        for entry in catalog.methods(product):
            if entry["method"] == "GET":
                continue
            for name, spec in entry["params"].items():
                if any(re.fullmatch(pattern, name) and kind in (None, spec.get("type"))
                       for pattern, kind, _, _ in DELETING_PARAMS):
                    rows.append((product, entry["method"], entry["path"], name, spec))
    return rows


def test_the_walk_finds_the_deleting_parameters_of_both_schemas():
    rows = deleting_params()
    names = {row[3] for row in rows}
    assert len(rows) >= 145
    assert {"purge", "destroy-unreferenced-disks", "destroy-data", "remove-vanished", "delete-groups", "force",
            "force-stop", "forceStop", "keep-last", "prune-backups", "delete", "cleanup-disks", "remove_job"} <= names
    assert {("pbs", "/pull"), ("pbs", "/config/sync"), ("pbs", "/config/prune"), ("pve", "/cluster/backup/{id}"),
            ("pve", "/nodes/{node}/vzdump"), ("pbs", "/config/datastore/{name}"),
            ("pve", "/nodes/{node}/qemu/{vmid}/config")} <= {(row[0], row[2]) for row in rows}


@pytest.mark.parametrize("product, method, path, name, spec", deleting_params(),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_a_deleting_parameter_makes_its_call_destructive(product, method, path, name, spec):
    value = SPECIAL.get(name, DELETING_VALUE.get(spec.get("type"), "1"))
    if spec.get("type") == "array":
        value = [value]
    gates, reasons = call_gates(product, method, path, {name: value})
    if "blocked" in gates:
        return
    assert "destructive" in gates, (gates, reasons)
    assert any(r.startswith(f"{name}=") for r in reasons), reasons


def test_a_default_that_deletes_counts_when_the_parameter_is_left_out():
    assert "destructive" in call_gates("pve", "POST", "/cluster/bulk-action/guest/shutdown", {})[0]
    assert "destructive" not in call_gates("pve", "POST", "/cluster/bulk-action/guest/shutdown",
                                                  {"force-stop": 0})[0]


@pytest.mark.parametrize("product, method, path, params", [
    ("pve", "POST", "/nodes/{node}/qemu/{vmid}/status/shutdown", {"forceStop": 0, "keepActive": 1}),
    ("pve", "PUT", "/nodes/{node}/qemu/{vmid}/config", {"delete": "description,net1"}),  # no volume freed
    ("pve", "POST", "/nodes/{node}/vzdump", {"vmid": "103", "remove": 1}),  # the storage's own retention
    ("pve", "POST", "/nodes/{node}/vzdump", {"vmid": "103", "prune-backups": "keep-all=1"}),
    ("pve", "DELETE", "/cluster/replication/{id}", {"keep": 1}),
    ("pve", "POST", "/nodes/{node}/qemu/{vmid}/status/start", {"force-cpu": "host"}),
    ("pbs", "DELETE", "/config/datastore/{name}", {"keep-job-configs": 1}),
    ("pbs", "POST", "/admin/datastore/{store}/move-namespace", {"ns": "a", "target-ns": "b"}),  # groups move
    ("pbs", "POST", "/pull", {"store": "backup", "remote-store": "backup", "remove-vanished": 0}),
    ("pbs", "PUT", "/config/sync/{id}", {"delete": ["comment"]}),  # a config property, not data
])
def test_look_alikes_do_not_delete(product, method, path, params):
    entry = catalog.entry_for(product, method, path)
    assert deleting(entry, params) == []


@pytest.mark.parametrize("spelling", ["TRUE", "Yes", "on", " 1"])
def test_every_spelling_of_true_deletes(spelling):
    """PBS accepts 1/on/yes/true in any case (docs/PROXMOX-BEHAVIOUR.md#request-encoding)."""
    entry = catalog.entry_for("pbs", "DELETE", "/config/datastore/{name}")
    assert deleting(entry, {"destroy-data": spelling})
