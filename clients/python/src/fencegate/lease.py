"""The sync ``Lease``: one claimed job, renewed by its own heartbeat thread."""

from __future__ import annotations

import json
import threading
from types import TracebackType
from typing import Any, Callable, Mapping, TypeVar

from . import _ops
from ._core import Request, Response, gateway_refusal, monotonic
from ._lease_core import LeaseCore, error_record
from .errors import FencegateError, LeaseExpired, PermanentFailure

T = TypeVar("T")
Send = Callable[[Request], Response]


class Lease:
    """One claimed job's lease, as its worker holds it.

    A thread renews it every third of the lease, each renewal with a deadline of a third; the
    local deadline moves only on a confirmed renewal, and nothing is sent under the lease once
    it is lost. ``state`` is ``"owner"``, ``"unknown"`` (a renewal unconfirmed, the deadline not
    passed) or ``"lost"``. As a context manager, an exception inside fails the job and leaving
    without settling releases it.

    Example::

        with client.claim(types=["report"]) as lease:
            res = lease.step("fetch", lambda: lease.fetch("POST", f"{gw}/reports/{lease.job_id}/fetch"))
            lease.append({"fetched": res.status})
            lease.complete({"ok": True})
    """

    def __init__(self, core: LeaseCore, send: Send) -> None:
        self._core = core
        self._send = send
        self._cond = threading.Condition(threading.RLock())
        self._appending = threading.Lock()
        self._stop = threading.Event()
        self._ended_fired = False
        self._on_end: list[Callable[[Lease], None]] = []
        #: Set when the lease ends for any reason but completion (lost, cancelled, released).
        self.ended = threading.Event()
        self._thread = threading.Thread(target=self._beat_loop, name=f"fencegate-heartbeat-{core.job_id}", daemon=True)
        if core.done():
            self._fire_end()
        else:
            self._thread.start()

    job = property(lambda self: self._core.job, doc="The job as claimed (the claim's answer).")
    job_id = property(lambda self: self._core.job_id, doc="The job's id.")
    fence = property(lambda self: self._core.fence, doc="This lease's fence (a decimal string).")
    worker_id = property(lambda self: self._core.worker_id, doc="The owner the gateway recorded.")
    attempt = property(lambda self: self._core.attempt, doc="The attempt this lease runs.")
    cursor = property(lambda self: self._core.cursor, doc="Output chunks the job had at the claim.")
    renewals = property(lambda self: self._core.renewals, doc="Confirmed renewals so far.")
    error = property(lambda self: self._core.ended, doc="What ended the lease (LeaseLost, JobCancelled), or None.")

    @property
    def held(self) -> bool:
        """True until the lease ends or its job is settled under it."""
        return not self._core.done()

    @property
    def state(self) -> str:
        """``owner``, ``unknown`` or ``lost``; reading it also notices a passed deadline."""
        with self._cond:
            self._core.check_deadline()
            state = self._core.state
        self._after()
        return state

    def wait_changed(self, timeout: float | None = None) -> str:
        """Waits for the next change of ``state`` (or ``timeout``); returns the state."""
        with self._cond:
            before = self._core.state
            self._cond.wait_for(lambda: self._core.state != before, timeout)
        return self.state

    def on_end(self, callback: Callable[[Lease], None]) -> None:
        """Calls ``callback(lease)`` once the lease ends other than by completion (at once if it has)."""
        with self._cond:
            if not self._ended_fired:
                self._on_end.append(callback)
                return
        callback(self)

    def fetch(self, method: str, url: str, body: Any = None, headers: Mapping[str, str] | None = None,
              idempotency_key: str | None = None, timeout: float | None = None) -> Response:
        """Sends a side effect with ``X-Execution-Fence``, ``X-Job-Id`` and an ``Idempotency-Key``.

        Sent only as owner: it waits out an unknown ownership and raises ``LeaseLost`` after loss.
        A refusal by the gateway itself raises its typed error (``LeaseExpired`` also ends the
        lease); the upstream's answers, whatever their status, are returned.

        Example::

            res = lease.fetch("POST", f"{gw}/payments/42/capture", body={"amount": 1299})
        """
        with self._cond:
            key = self._core.choose_key(headers, idempotency_key)
            if_unknown = "wait" if self._core.step_name is None else self._if_unknown
            self._ready(if_unknown)
            req = self._core.fetch_request(method, url, body, headers, key, timeout)
        res = self._send(req)
        refusal = gateway_refusal(res)
        if refusal is None:
            return res
        if isinstance(refusal, LeaseExpired):
            with self._cond:
                self._core.lose("expired")
            self._after()
        raise refusal

    def step(self, name: str, fn: Callable[[], T], if_unknown: str = "wait") -> T:
        """Runs one irreversible step, as owner only; its fetches share the key ``fg.<job>.<name>``.

        Example::

            lease.step("charge", lambda: lease.fetch("POST", url, body=charge))
        """
        with self._cond:
            self._core.begin_step(name)
            self._if_unknown = if_unknown
        try:
            with self._cond:
                self._ready(if_unknown)
            return fn()
        finally:
            with self._cond:
                self._core.end_step()

    def append(self, record: Any) -> int:
        """Appends one output chunk; numbers follow call order, a retry resends the same chunk and number."""
        snapshot = json.loads(json.dumps(record))
        with self._appending:
            return self._call(_ops.append(self._core, snapshot))

    def complete(self, result: Any = None) -> None:
        """Completes the job with ``result``; refused locally after loss, retried on no answer."""
        with self._appending:
            self._call(_ops.holder_call(self._core, "complete", {"result": result}))
        self._finish()

    def fail(self, error: Any = None, retryable: bool = True) -> str:
        """Ends this attempt with ``error`` (an exception is recorded by name and code); returns the job's state."""
        record = error_record(error) if isinstance(error, BaseException) else error
        answer = self._call(_ops.holder_call(self._core, "fail", {"error": record, "retryable": retryable}, True))
        self._finish()
        return str(answer.get("state"))

    def release(self) -> None:
        """Gives the job back now: another worker may claim it at once; this lease is then lost (``released``)."""
        with self._cond:
            if self._core.done():
                return
            self._core.lose("released")
            self._stop.set()
        _ops.run_sync(_ops.release(self._core), self._send)
        self._after()

    def close(self, timeout: float | None = None) -> None:
        """Stops renewing (the lease then runs out unless settled) and waits for the heartbeat thread."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            if exc is None:
                self.release()
            elif not self._core.done():
                self.fail(exc, retryable=not isinstance(exc, PermanentFailure))
        except FencegateError:
            if exc is None:
                raise
        finally:
            self.close(0)

    # internals
    _if_unknown = "wait"

    def _ready(self, if_unknown: str) -> None:
        while not self._core.gate(if_unknown):
            self._cond.wait(self._core.wait_time())
        self._after()

    def _call(self, op: _ops.Op[T]) -> T:
        try:
            return _ops.run_sync(op, self._send, self._cond)
        finally:
            self._after()

    def _finish(self) -> None:
        with self._cond:
            self._core.finished = True
            self._stop.set()
            self._cond.notify_all()

    def _after(self) -> None:
        """Wakes waiters, and fires the end once the core says the lease ended."""
        with self._cond:
            self._cond.notify_all()
            fire = self._core.ended is not None and not self._ended_fired
        if fire:
            self._fire_end()

    def _fire_end(self) -> None:
        with self._cond:
            if self._ended_fired:
                return
            self._ended_fired = True
            self._stop.set()
            callbacks, self._on_end = self._on_end, []
            self._cond.notify_all()
        self.ended.set()
        for callback in callbacks:
            callback(self)

    def _beat_loop(self) -> None:
        next_at = monotonic() + self._core.interval
        while not self._stop.is_set():
            with self._cond:
                wake = min(next_at, self._core.deadline)
            if self._stop.wait(max(0.0, wake - monotonic())):
                break
            if monotonic() >= next_at:
                next_at = monotonic() + self._core.interval
                outcome = _ops.run_sync(_ops.heartbeat(self._core), self._send, self._cond)
                if outcome == "cancel":
                    _ops.run_sync(_ops.cancelled(self._core), self._send)
            else:
                with self._cond:
                    self._core.check_deadline()
            self._after()
