"""Reads side by side, within what a Proxmox node serves at once.

pveproxy and pvedaemon run 3 workers per node (pve-manager PVE/Service/pveproxy.pm, pvedaemon.pm
`max_workers => 3`): each worker runs one API handler at a time, and a request for another node is
passed on to that node's pveproxy (pve-http-server `proxy_request`), so a node answers at most that many
requests at once and the rest wait (docs/PROXMOX-BEHAVIOUR.md#workers-per-node). Every request to a host
takes one of its node's lanes (`sent`; a path without /nodes/{node} is served by the node we talk to,
and a Backup Server is one node); `in_parallel` starts the reads of a tool call side by side, no more
at once for one node than it has lanes, so that a node's fourth read never holds a thread while it waits.

Answer times on the path are counted, not timed: inside `counting` each request starts after the
answers it followed (the caller's clock) and after the lane it takes is free, and ends one answer time
later; a fan-out ends at its latest branch. The count is what a cluster answering every request in the
same time would take, whatever the machine's load (tests/test_fanout.py, bench/flat.py).
"""
from __future__ import annotations

import contextvars
import queue
import re
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from errors import ToolFailure

PER_NODE = 3  # PROXMOX_REQUESTS_PER_NODE: pveproxy's and pvedaemon's max_workers => 3
# read threads shared by every tool call, enough for 3 reads of each of 64 nodes; beyond them a caller
# runs its reads itself
THREADS = 192
NODE_PATH = re.compile(r"/nodes/([^/]+)")


def configure(per_node: int) -> None:
    """The requests one node (or one Backup Server) may have in flight from this server."""
    global PER_NODE
    with _lock:
        PER_NODE = per_node
        _lanes.clear()


def node_of(path: str) -> str:
    """The node that serves a request: the one in its path, else the node we talk to ("")."""
    found = NODE_PATH.match(path)
    return found.group(1) if found else ""


# ---------------------------------------------------------------- the lanes of each node

# (the measurement, answer times on the path so far in this branch); None outside counting
_clock: contextvars.ContextVar[tuple[object, int] | None] = contextvars.ContextVar("fanout_clock", default=None)


class _Lanes:
    """A node's workers: at most `count` requests in flight."""

    def __init__(self, count: int):
        self.free = count
        self.ready = threading.Condition()

    def take(self) -> None:
        with self.ready:
            while not self.free:
                self.ready.wait()
            self.free -= 1

    def give(self) -> None:
        with self.ready:
            self.free += 1
            self.ready.notify()


_lock = threading.Lock()
_lanes: dict[tuple[str, str], _Lanes] = {}


def _lanes_of(host: str, node: str) -> _Lanes:
    with _lock:
        return _lanes.setdefault((host, node), _Lanes(PER_NODE))


class Count:
    """A measurement (`counting`): the answer times on the longest path, the requests sent, and when
    (in answer times) each lane of each node is free again."""

    def __init__(self) -> None:
        self.longest = 0
        self.requests = 0
        self.lanes: dict[tuple[str, str], list[int]] = {}

    def answered(self, key: tuple[str, str], after: int) -> int:
        """A request sent after `after` answer times: it takes the lane of its node free first (as the
        node's next free worker would serve it) and is answered one answer time after it starts."""
        with _lock:
            lanes = self.lanes.setdefault(key, [0] * PER_NODE)
            first = min(range(len(lanes)), key=lanes.__getitem__)
            lanes[first] = end = max(after, lanes[first]) + 1
            self.longest, self.requests = max(self.longest, end), self.requests + 1
            return end


_counting: list[Count | None] = [None]  # the measurement under way, if any


@contextmanager
def counting() -> Iterator[Count]:
    """Count the answer times on the path of what runs inside (one tool call at a time), as if every
    answer took the same time: a request starts after the answers its reads followed and once a lane
    of its node is free, and ends one answer time later; reads side by side start where their caller
    was. Counted in the order the requests are sent, so the machine's load does not change the count."""
    count = Count()
    _counting[0] = count
    try:
        yield count
    finally:
        _counting[0] = None


def sent(host: str, path: str, send: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`send(*args, **kwargs)` in one of the lanes of the node that serves `path` on `host`."""
    key = (host, node_of(path))
    lanes = _lanes_of(*key)
    lanes.take()
    count, clock = _counting[0], _clock.get()
    if count is not None:
        _clock.set((count, count.answered(key, clock[1] if clock and clock[0] is count else 0)))
    try:
        return send(*args, **kwargs)
    finally:
        lanes.give()


# ---------------------------------------------------------------- side by side

def in_parallel(calls: list[Callable[[], Any]], limit: int = THREADS, nodes: list[str] | None = None) -> list[Any]:
    """Run independent reads side by side, at most `limit` at once and, where `nodes` names the node each
    reads from, at most PER_NODE of them for one node; each in a copy of the caller's context (the
    policy's call state). The results come in the order of `calls`; a call that failed with a ToolFailure
    leaves that exception in its place (anything else raises). Reads inside such a read go side by side
    too; when no thread is free the caller runs a read itself, so threads never all wait for each other."""
    if len(calls) < 2 or limit < 2:
        return [_outcome(call) for call in calls]
    keys = nodes or [None] * len(calls)
    results: list[Any] = [None] * len(calls)
    waiting = list(range(len(calls)))
    busy: dict[Any, int] = {}
    done: queue.SimpleQueue = queue.SimpleQueue()
    running, ended = 0, _clock.get()
    after = ended  # where every read starts: the caller's clock (the lanes count the waits for a node)

    def startable() -> int | None:
        for position, index in enumerate(waiting):
            if keys[index] is None or busy.get(keys[index], 0) < PER_NODE:
                return waiting.pop(position)
        return None

    while waiting or running:
        while running < limit and (index := startable()) is not None:
            busy[keys[index]] = busy.get(keys[index], 0) + 1
            running += 1
            _start(index, calls[index], done, after)
        index, result, clock = done.get()
        if isinstance(result, _Raised):
            raise result.error
        running -= 1
        busy[keys[index]] -= 1
        results[index] = result
        ended = _later(ended, clock)
    if ended is not None:
        _clock.set(ended)
    return results


def _later(one: tuple[object, int] | None, other: tuple[object, int] | None) -> tuple[object, int] | None:
    """The later of two clocks of the measurement under way (a clock of an earlier one counts for nothing)."""
    one, other = (c if c and c[0] is _counting[0] else None for c in (one, other))
    if one is None or other is None:
        return one or other
    return one if one[1] >= other[1] else other


def _start(index: int, call: Callable[[], Any], done: queue.SimpleQueue, after: tuple[object, int] | None) -> None:
    """Run one read on a free thread (or here, when none is), in a copy of this context whose clock
    starts after `after`; its result and end go to `done`."""
    context = contextvars.copy_context()
    if after is not None:
        context.run(_clock.set, after)

    def job() -> None:
        try:
            result = context.run(_outcome, call)
        except BaseException as error:  # noqa: BLE001 - raised again in the caller
            result = _Raised(error)
        done.put((index, result, context.get(_clock)))
    if not _threads.offer(job):
        job()


class _Raised:
    def __init__(self, error: BaseException):
        self.error = error


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except ToolFailure as exc:
        return exc


class _Threads:
    """Read threads kept for the next time (starting 40 threads per call cost more than the reads on a
    busy machine): a job goes to an idle thread, else to a new one while there are fewer than THREADS."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.idle = 0
        self.count = 0

    def offer(self, job: Callable[[], None]) -> bool:
        with self.lock:
            if self.idle:
                self.idle -= 1
            elif self.count < THREADS:
                self.count += 1
                threading.Thread(target=self._serve, name=f"read-{self.count}", daemon=True).start()
            else:
                return False
        self.jobs.put(job)
        return True

    def _serve(self) -> None:
        while True:
            job = self.jobs.get()
            try:
                job()
            finally:
                with self.lock:
                    self.idle += 1


_threads = _Threads()
