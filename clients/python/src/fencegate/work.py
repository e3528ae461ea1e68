"""The sync ``work()`` loop: claims into free slots, runs each job in its own thread, drains and shuts down."""

from __future__ import annotations

import threading
from typing import Any, Callable

from ._core import monotonic
from ._lease_core import error_record
from ._slots import Slots, ended_by
from .errors import FencegateError, GatewayUnreachable, PermanentFailure
from .lease import Lease

Emit = Callable[[dict[str, Any]], None]
Handler = Callable[[dict[str, Any], Lease], Any]
Claim = Callable[[list[int]], list[tuple[Lease, int]]]


def lease_event(kind: str, lease: Lease, **extra: Any) -> dict[str, Any]:
    """An event about one job: identifiers and codes only. Example: ``lease_event("claimed", lease)``."""
    return {"type": kind, "job_id": lease.job_id, "fence": lease.fence, **extra}


def report_ended(lease: Lease, emit: Emit) -> None:
    """The event for a lease that ended before completion: ``lost``, ``cancelled`` or ``released``."""
    why = ended_by(lease.error)
    emit(lease_event(why, lease, reason=getattr(lease.error, "reason", None) or why))


def commit(lease: Lease, ok: bool, value: Any, emit: Emit) -> None:
    """The handler's outcome under the lease: its result completes the job, its exception fails the attempt."""
    try:
        if ok:
            lease.complete(value)
            emit(lease_event("completed", lease))
        else:
            state = lease.fail(error_record(value), retryable=not isinstance(value, PermanentFailure))
            emit(lease_event("failed", lease, state=state))
    except FencegateError as err:
        if lease.error is None or isinstance(err, GatewayUnreachable):
            emit(lease_event("error", lease, code=err.code))


class _Runner:
    """One job's thread: the handler, then its commit; a lease that ends meanwhile drains the slot."""

    def __init__(self, lease: Lease, handler: Handler, slots: Slots, emit: Emit, free: Callable[[], None]) -> None:
        self.lease, self.handler, self.slots, self.emit, self.free = lease, handler, slots, emit, free
        self.done = threading.Event()
        self.abandoned = False
        self._lock = threading.Lock()
        self._running = True
        self._draining = False
        self.thread = threading.Thread(target=self._run, name=f"fencegate-job-{lease.job_id}", daemon=True)

    def _ended(self, lease: Lease) -> None:
        with self._lock:
            still = self._running
            self._draining = still and not self.abandoned
            quiet = self.abandoned
        if not quiet:
            report_ended(lease, self.emit)
        if still and not quiet:
            self.slots.drain(lease.job, ended_by(lease.error))

    def _run(self) -> None:
        self.lease.on_end(self._ended)
        try:
            ok, value = True, self.handler(self.lease.job, self.lease)
        except Exception as err:  # the handler's failure is the job's, not the worker's
            ok, value = False, err
        with self._lock:
            self._running = False
            draining = self._draining
        if draining:
            self.slots.drained(self.lease.job)
        if not self.lease.ended.is_set() and not self.abandoned:
            commit(self.lease, ok, value, self.emit)
        self.lease.close(0)
        self.done.set()
        self.free()


def work_loop(claim: Claim, slots: Slots, handler: Handler, stop: threading.Event, grace: float, emit: Emit) -> list[str]:
    """Claims and runs jobs until ``stop`` is set; returns the jobs whose handlers outlived ``grace``."""
    cond = threading.Condition()
    idle = list(range(1, slots.size + 1))
    runners: list[_Runner] = []

    def give_back(*free: int) -> None:
        with cond:
            idle.extend(free)
            idle.sort()
            cond.notify_all()

    failures = 0
    while not stop.is_set():
        with cond:
            if not idle:
                cond.wait(0.05)
                continue
            asked, idle[:] = idle[:100], idle[100:]
        try:
            claimed = claim(asked)
            failures = 0
        except FencegateError as err:
            give_back(*asked)
            emit({"type": "error", "code": err.code})
            stop.wait(min(0.1 * 2 ** failures, 5.0))
            failures += 1
            continue
        give_back(*[n for n in asked if n not in {s for _, s in claimed}])
        for lease, slot in claimed:
            runner = _admit(lease, slot, handler, slots, stop, emit, give_back)
            if runner is not None:
                runners = [r for r in runners if not r.done.is_set()] + [runner]
    return _shut_down(runners, grace)


def _admit(lease: Lease, slot: int, handler: Handler, slots: Slots, stop: threading.Event, emit: Emit,
           give_back: Callable[..., None]) -> _Runner | None:
    if stop.is_set():
        lease.release()
        lease.close(0)
        emit(lease_event("released", lease, reason="shutdown"))
        give_back(slot)
        return None
    emit(lease_event("claimed", lease))
    if lease.state == "lost":
        emit(lease_event("lost", lease, reason=getattr(lease.error, "reason", "deadline")))
        give_back(slot)
        return None
    runner = _Runner(lease, handler, slots, emit, lambda: give_back(slot))
    runner.thread.start()
    return runner


def _shut_down(runners: list[_Runner], grace: float) -> list[str]:
    """Gives running handlers ``grace`` seconds, then releases the leases of those still running."""
    deadline = monotonic() + grace
    for runner in runners:
        runner.done.wait(max(0.0, deadline - monotonic()))
    unsettled = []
    for runner in runners:
        if not runner.done.is_set():
            unsettled.append(runner.lease.job_id)
            runner.lease.release()
            with runner._lock:
                runner.abandoned = True
            runner.lease.close(0)
    return unsettled
