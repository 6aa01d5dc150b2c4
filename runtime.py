"""One server's own state, in one place.

What a server keeps for itself besides its code (the configured hosts and their clients, the
policy's settings, the privileges and versions read from each host, SSH targets and connections,
documents read from hosts, which tools are visible, how it is reached) is declared here by the
module that owns it, at import, as a slot:

    _settings = runtime.slot("policy.settings", Settings)      # the name, and what a fresh server holds

and read at use with `_settings.get()` (or replaced with `_settings.set(value)`). Every slot's value
lives in the one `Runtime` that is installed: a server process has one; the tests install a fresh one
per in-process server (tests/conftest.py), so that several can be open at once and a new store needs
no list kept by hand. tests/test_layout.py fails when a module keeps per-server state elsewhere.

What belongs to the process rather than to a server (locks, the shared read threads, the secrets
known to masking, caches of the schema) stays where it is.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")


class Runtime:
    """The values of every slot for one server; a slot's value is made by its factory on first use."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.lock = threading.Lock()


class Slot(Generic[T]):
    """One store of per-server state, declared once by the module that owns it (see `slot`)."""

    def __init__(self, name: str, factory: Callable[[], T]):
        self.name = name
        self.factory = factory

    def get(self) -> T:
        """This server's value (made fresh on first use)."""
        runtime = _installed
        try:
            return runtime.values[self.name]
        except KeyError:
            with runtime.lock:  # two threads asking at once get the same value
                return runtime.values.setdefault(self.name, self.factory())

    def set(self, value: T) -> None:
        _installed.values[self.name] = value


SLOTS: dict[str, Slot] = {}  # every slot declared, by name


def slot(name: str, factory: Callable[[], T]) -> Slot[T]:
    """Declare a store of per-server state: `name` is "<module>.<what>", `factory` makes the value
    a fresh server holds."""
    if name in SLOTS:
        raise ValueError(f"runtime slot {name!r} is declared twice")
    SLOTS[name] = Slot(name, factory)
    return SLOTS[name]


_installed = Runtime()  # this process's server


def install(runtime: Runtime) -> Runtime:
    """Make `runtime` the state every slot reads from now on; the one installed before."""
    global _installed
    before, _installed = _installed, runtime
    return before


def installed() -> Runtime:
    return _installed


# How this server is reached ("stdio" or "http"), set by server.py when it serves: security_audit
# judges exposure by it.
TRANSPORT = slot("runtime.transport", lambda: "stdio")
