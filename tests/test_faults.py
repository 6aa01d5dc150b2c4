"""The fault suite (issue 8): each fault is answered with a clear error, and the server keeps
serving the next call. One table of faults, used here and timed by bench/run.py (tests never
assert timings). SSH faults (a connection dropped mid-command, sshd gone) are in
test_shell_tools.py, next to the sshd they need."""
import socket
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest

from conftest import stdio_session

READ_TIMEOUT = 1  # seconds: the bench checks each answer arrives within this plus one second


@dataclass
class Fault:
    name: str
    start: Callable[[Any], None]  # switches the fault on in the simulator's lab
    tool: str
    arguments: dict
    expect: tuple[str, ...]  # words the error must contain
    stop: Callable[[Any], None] = lambda _lab: None
    env: str = "reader"  # which server answers: reader, operator (lifecycle tier)
    extra: dict = field(default_factory=dict)


def _slow(lab: Any) -> None:
    lab.slow_paths[r"^/cluster/resources$"] = READ_TIMEOUT + 1.5


def _failing_task(lab: Any) -> None:
    lab.fault_upid = lab.start_task("pve1", "qmstart", "100", exitstatus="start failed: QEMU exited with code 1",
                                    duration=0.2)


def _lock(lab: Any) -> None:
    lab.guests[100]["lock"] = "backup"


FAULTS = [
    Fault("node down (595)", lambda lab: lab.down_nodes.add("pve3"), "get_guest", {"vmid": 102},
          ("unreachable", "'pve3'", "cluster_status"), lambda lab: lab.down_nodes.clear()),
    Fault("answer slower than the timeout", _slow, "list_guests", {},
          ("did not answer", f"within {READ_TIMEOUT} s", "PROXMOX_READ_TIMEOUT"), lambda lab: lab.slow_paths.clear()),
    Fault("random 500", lambda lab: lab.fail.append((r"^/cluster/resources$", 500, "got timeout")),
          "list_guests", {}, ("failed (500)", "got timeout"), lambda lab: lab.fail.clear()),
    Fault("failing task", _failing_task, "get_task", {"upid": "{fault_upid}", "wait_seconds": 10},
          ("TASK ERROR", "QEMU exited with code 1")),
    Fault("locked guest", _lock, "write_power_guest", {"vmid": 100, "action": "shutdown"},
          ("locked (backup)",), lambda lab: lab.guests[100].update(lock=None), env="operator"),
]


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def fault_envs(sim: Any) -> dict[str, dict]:
    """The servers the faults need: the reader and an operator on the simulator, a host that is
    down, and a host whose certificate no longer matches its pin."""
    base = {"PROXMOX_READ_TIMEOUT": str(READ_TIMEOUT)}
    admin = sim.env(pve_token="root@pam!admin", pbs_token="root@pam!admin")  # writes need more than the reader
    down = {"PROXMOX_LAB_URL": f"https://127.0.0.1:{closed_port()}", "PROXMOX_LAB_TOKEN": "a@pve!t=" + "s" * 36}
    return {"reader": sim.env() | base, "operator": admin | base | {"PROXMOX_ACCESS": "lifecycle"},
            "host down": down | base,
            "certificate changed": sim.env(pbs=False) | base | {"PROXMOX_LAB_FINGERPRINT": ":".join(["ab"] * 32)}}


def arguments_for(fault: Fault, lab: Any) -> dict:
    return {k: (v.format(fault_upid=getattr(lab, "fault_upid", "")) if isinstance(v, str) else v)
            for k, v in fault.arguments.items()}


@pytest.fixture(scope="module")
def servers(sim):
    envs = fault_envs(sim)
    with stdio_session(envs["reader"], log_name="faults-reader") as reader, \
            stdio_session(envs["operator"], log_name="faults-operator") as operator:
        yield {"reader": reader, "operator": operator}


@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_fault_is_a_clear_error_and_the_server_keeps_serving(fault, servers, sim):
    session = servers[fault.env]
    fault.start(sim.lab)
    try:
        message = session.error(fault.tool, arguments_for(fault, sim.lab))
    finally:
        fault.stop(sim.lab)
    for words in fault.expect:
        assert words in message, f"{fault.name}: {words!r} not in {message!r}"
    assert session.ok("list_guests")["rows"]  # the next call is served


def test_host_down_is_clear_and_the_list_still_answers(sim):
    with stdio_session(fault_envs(sim)["host down"], log_name="faults-down") as session:
        message = session.error("list_guests")
        assert "unreachable" in message and "connection refused" in message
        assert "s" * 36 not in message
        assert {"list_guests", "server_info"} <= {t.name for t in session.tools()}
        assert session.ok("list_hosts")["rows"]


def test_a_changed_certificate_under_a_pin_is_refused_and_shown(sim):
    with stdio_session(fault_envs(sim)["certificate changed"], log_name="faults-pin") as session:
        message = session.error("list_guests")
        assert "does not match the pinned fingerprint" in message and sim.fingerprint in message
        assert session.ok("list_hosts")["rows"]  # still serving
