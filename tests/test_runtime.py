"""runtime.py: one server's state in one place. The in-process tests install a fresh Runtime per server
(conftest.in_process); tests/test_layout.py checks that no module keeps per-server state elsewhere."""
import pytest

import policy
import privileges
import proxmox_client
import runtime
import server  # noqa: F401  (imports every module, so that every slot is declared)
from conftest import ROOT
from settings import Settings


def test_a_fresh_runtime_holds_what_a_fresh_server_holds_and_the_one_before_comes_back():
    before = policy.settings()
    outside = runtime.install(runtime.Runtime())
    try:
        assert policy.settings() is not before and not policy.settings().dry_run
        assert proxmox_client.configured("pve") == {} and privileges.permissions_read() == 0
        policy.configure(Settings(dry_run=True))
        assert policy.settings().dry_run
    finally:
        assert runtime.install(outside) is not outside
    assert policy.settings() is before


def test_each_slot_is_declared_once_by_the_module_its_name_starts_with():
    for name in runtime.SLOTS:
        module = name.split(".", 1)[0]
        assert f'slot("{name}"' in (ROOT / f"{module}.py").read_text(), f"{name} is not declared in {module}.py"
    with pytest.raises(ValueError, match="declared twice"):
        runtime.slot("policy.settings", Settings)
