"""The asyncio ``AsyncLease``: the same ``LeaseCore`` and operations, driven from the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
from types import TracebackType
from typing import Any, Awaitable, Callable, Mapping, TypeVar, Union

from . import _ops
from ._core import Request, Response, gateway_refusal, monotonic
from ._lease_core import LeaseCore, error_record
from .errors import FencegateError, GatewayUnreachable, LeaseExpired, PermanentFailure

T = TypeVar("T")
#: Sends one request without blocking the loop: ``AsyncConnectionPool.send``.
Send = Callable[[Request], Awaitable[Response]]


async def run_async(op: _ops.Op[T], send: Send) -> T:
    """Drives an operation from the event loop: each request with ``send`` (asyncio streams), each pause in ``asyncio.sleep``.

    Example::

        job = await run_async(_ops.get_job(api, "1", None, 10.0), pool.send)
    """
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            item = op.throw(error) if error is not None else op.send(value)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        value, error = None, None
        if isinstance(item, Request):
            try:
                value = await send(item)
            except GatewayUnreachable as err:
                error = err
        else:
            await asyncio.sleep(item)


class AsyncLease:
    """One claimed job's lease in asyncio: renewed by its own task, every third of the lease.

    Same rules as :class:`fencegate.Lease`; ``async with`` fails the job on an exception and
    releases it when left unsettled.

    Example::

        async with await client.claim(types=["report"]) as lease:
            res = await lease.fetch("POST", f"{gw}/reports/{lease.job_id}/render")
            await lease.complete({"status": res.status})
    """

    def __init__(self, core: LeaseCore, send: Send) -> None:
        self._core = core
        self._send = send
        self._changed = asyncio.Event()
        self._appending = asyncio.Lock()
        self._on_end: list[Callable[[AsyncLease], None]] = []
        self._ended_fired = False
        #: Set when the lease ends for any reason but completion (lost, cancelled, released).
        self.ended = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        if core.done():
            self._fire_end()
        else:
            self._task = asyncio.get_running_loop().create_task(self._beat_loop(), name=f"fencegate-heartbeat-{core.job_id}")

    job = property(lambda self: self._core.job, doc="The job as claimed (the claim's answer).")
    job_id = property(lambda self: self._core.job_id, doc="The job's id.")
    fence = property(lambda self: self._core.fence, doc="This lease's fence (a decimal string).")
    worker_id = property(lambda self: self._core.worker_id, doc="The owner the gateway recorded.")
    attempt = property(lambda self: self._core.attempt, doc="The attempt this lease runs.")
    cursor = property(lambda self: self._core.cursor, doc="Output chunks the job had at the claim.")
    renewals = property(lambda self: self._core.renewals, doc="Confirmed renewals so far.")
    error = property(lambda self: self._core.ended, doc="What ended the lease (LeaseLost, JobCancelled), or None.")
    held = property(lambda self: not self._core.done(), doc="True until the lease ends or its job is settled.")

    @property
    def state(self) -> str:
        """``owner``, ``unknown`` or ``lost``; reading it also notices a passed deadline."""
        self._core.check_deadline()
        self._after()
        return self._core.state

    async def wait_changed(self, timeout: float | None = None) -> str:
        """Waits for the next change of ``state`` (or ``timeout``); returns the state."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)
        return self.state

    def on_end(self, callback: Callable[[AsyncLease], None]) -> None:
        """Calls ``callback(lease)`` once the lease ends other than by completion (at once if it has)."""
        if self._ended_fired:
            callback(self)
        else:
            self._on_end.append(callback)

    async def fetch(self, method: str, url: str, body: Any = None, headers: Mapping[str, str] | None = None,
                    idempotency_key: str | None = None, timeout: float | None = None) -> Response:
        """A side effect with the fence, the job id and a key; as :meth:`fencegate.Lease.fetch`.

        Example::

            res = await lease.fetch("POST", f"{gw}/payments/42/capture", body={"amount": 1299})
        """
        key = self._core.choose_key(headers, idempotency_key)
        await self._ready(self._if_unknown if self._core.step_name is not None else "wait")
        req = self._core.fetch_request(method, url, body, headers, key, timeout)
        res = await self._send(req)
        refusal = gateway_refusal(res)
        if refusal is None:
            return res
        if isinstance(refusal, LeaseExpired):
            self._core.lose("expired")
            self._after()
        raise refusal

    async def step(self, name: str, fn: Callable[[], Union[Awaitable[T], T]], if_unknown: str = "wait") -> T:
        """Runs one irreversible step as owner; its fetches share the key ``fg.<job>.<name>``.

        Example::

            await lease.step("charge", lambda: lease.fetch("POST", url, body=charge))
        """
        self._core.begin_step(name)
        self._if_unknown = if_unknown
        try:
            await self._ready(if_unknown)
            result = fn()
            return await result if inspect.isawaitable(result) else result  # type: ignore[no-any-return]
        finally:
            self._core.end_step()

    async def append(self, record: Any) -> int:
        """Appends one output chunk in call order. Example: ``await lease.append({"rows": 120})``."""
        snapshot = json.loads(json.dumps(record))
        async with self._appending:
            return await self._call(_ops.append(self._core, snapshot))

    async def complete(self, result: Any = None) -> None:
        """Completes the job with ``result`` under this lease. Example: ``await lease.complete({"ok": True})``."""
        async with self._appending:
            await self._call(_ops.holder_call(self._core, "complete", {"result": result}))
        await self._finish()

    async def fail(self, error: Any = None, retryable: bool = True) -> str:
        """Ends this attempt with ``error``; returns the job's new state. Example: ``await lease.fail(err)``."""
        record = error_record(error) if isinstance(error, BaseException) else error
        answer = await self._call(_ops.holder_call(self._core, "fail", {"error": record, "retryable": retryable}, True))
        await self._finish()
        return str(answer.get("state"))

    async def release(self) -> None:
        """Gives the job back now; this lease is then lost (``released``). Example: ``await lease.release()``."""
        if self._core.done():
            return
        self._core.lose("released")
        await self._stop_beats()
        await run_async(_ops.release(self._core), self._send)
        self._after()

    async def aclose(self) -> None:
        """Stops renewing (the lease then runs out unless settled). Example: ``await lease.aclose()``."""
        await self._stop_beats()

    async def __aenter__(self) -> AsyncLease:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            if exc is None:
                await self.release()
            elif not self._core.done():
                await self.fail(exc, retryable=not isinstance(exc, PermanentFailure))
        except FencegateError:
            if exc is None:
                raise
        finally:
            await self.aclose()

    _if_unknown = "wait"

    async def _ready(self, if_unknown: str) -> None:
        while not self._core.gate(if_unknown):
            await self.wait_changed(self._core.wait_time())
        self._after()

    async def _call(self, op: _ops.Op[T]) -> T:
        try:
            return await run_async(op, self._send)
        finally:
            self._after()

    async def _finish(self) -> None:
        self._core.finished = True
        await self._stop_beats()
        self._notify()

    async def _stop_beats(self) -> None:
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _after(self) -> None:
        self._notify()
        if self._core.ended is not None and not self._ended_fired:
            self._fire_end()

    def _fire_end(self) -> None:
        self._ended_fired = True
        callbacks, self._on_end = self._on_end, []
        self.ended.set()
        for callback in callbacks:
            callback(self)

    async def _beat_loop(self) -> None:
        next_at = monotonic() + self._core.interval
        while not self._core.done():
            await asyncio.sleep(max(0.0, min(next_at, self._core.deadline) - monotonic()))
            if monotonic() >= next_at:
                next_at = monotonic() + self._core.interval
                if await run_async(_ops.heartbeat(self._core), self._send) == "cancel":
                    await run_async(_ops.cancelled(self._core), self._send)
            else:
                self._core.check_deadline()
            self._after()
