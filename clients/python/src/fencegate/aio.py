"""``AsyncFencegateClient``: the job API for asyncio, on the same core as the sync client."""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType
from typing import Any, Awaitable, Callable, Mapping

from . import _ops
from ._core import JobApi, Response, subject_of, worker_id_for
from ._lease_core import LeaseCore, error_record
from ._slots import Slots, ended_by, slot_id
from ._aio_transport import AsyncConnectionPool
from .aio_lease import AsyncLease, run_async
from .errors import FencegateError, GatewayUnreachable, PermanentFailure
from .work import lease_event

AsyncHandler = Callable[[dict[str, Any], AsyncLease], Awaitable[Any]]
Emit = Callable[[dict[str, Any]], None]


class AsyncFencegateClient:
    """The worker client for asyncio: the methods of :class:`fencegate.FencegateClient` as coroutines.

    Example::

        async with AsyncFencegateClient("http://127.0.0.1:8080", token=token) as client:
            await client.start("report", "acme:2026-08")
            stop = asyncio.Event()
            stuck = await client.work(["report"], handler, concurrency=4, stop=stop)
    """

    def __init__(self, base_url: str, token: str | None = None, worker_id: str | None = None,
                 request_timeout: float = 10.0) -> None:
        self._api = JobApi(base_url, token)
        self._subject = subject_of(token)
        self.worker_id: str = worker_id_for(worker_id, self._subject)
        self.request_timeout = request_timeout
        self._pool = AsyncConnectionPool()
        self._send = self._pool.send
        self._loops: set[Slots] = set()
        self._leases: list[AsyncLease] = []
        self._orphans: set[asyncio.Task[None]] = set()

    async def start(self, type: str, key: str, payload: Any = None, restart: bool = False) -> dict[str, Any]:
        """Starts a job by its natural key, or joins it. Example: ``await client.start("report", "acme:2026-08")``."""
        return await run_async(_ops.start(self._api, type, key, payload, restart, self.request_timeout), self._send)

    async def get_job(self, job_id: str, from_seq: int | None = None) -> dict[str, Any]:
        """Reads a job. Example: ``(await client.get_job("1"))["state"]``."""
        return await run_async(_ops.get_job(self._api, job_id, from_seq, self.request_timeout), self._send)

    async def claim(self, types: list[str] | None = None, wait: float = 0, worker_id: str | None = None) -> AsyncLease | None:
        """Claims one job with its running lease, or None. Example: ``lease = await client.claim(["report"], wait=5)``."""
        leases = await self._claim([self._id(worker_id)], types, wait, None)
        return leases[0] if leases else None

    async def claim_batch(self, max: int, types: list[str] | None = None, wait: float = 0,
                          worker_id: str | None = None) -> list[AsyncLease]:
        """Claims up to ``max`` jobs (1–100) in one request. Example: ``await client.claim_batch(10, ["report"])``."""
        if not isinstance(max, int) or not 1 <= max <= 100:
            raise FencegateError("max must be an integer from 1 to 100", code="invalid_option")
        return await self._claim([self._id(worker_id)], types, wait, max)

    async def request(self, method: str, url: str, body: Any = None, headers: Mapping[str, str] | None = None,
                      timeout: float | None = None) -> Response:
        """Any request, with the token for the gateway's own origin. Example: ``await client.request("GET", url)``."""
        req = self._api.request(method, url, body, headers, timeout or self.request_timeout)
        return await self._send(req)

    async def work(self, types: list[str] | None, handler: AsyncHandler, concurrency: int = 1,
                   stop: asyncio.Event | None = None, shutdown_grace: float = 30.0, on_event: Emit | None = None,
                   worker_id: str | None = None, claim_wait: float = 5.0) -> list[str]:
        """Claims and runs jobs until ``stop`` is set; the jobs still unsettled after the grace period.

        Example::

            async def handler(job, lease):
                await lease.step("render", lambda: lease.fetch("POST", f"{gw}/reports/{lease.job_id}/render"))
                return {"ok": True}
            stuck = await client.work(["report"], handler, concurrency=4, stop=stop)
        """
        if not isinstance(concurrency, int) or concurrency < 1:
            raise FencegateError("concurrency must be a positive integer", code="invalid_option")
        base = self._id(worker_id)
        ids = {n: base if concurrency == 1 else slot_id(base, n) for n in range(1, concurrency + 1)}
        emit = on_event or (lambda event: None)
        slots = Slots(concurrency, emit)
        self._loops.add(slots)
        loop = _WorkLoop(self, ids, types, claim_wait, handler, slots, emit)
        try:
            return await loop.run(stop or asyncio.Event(), shutdown_grace)
        finally:
            self._loops.discard(slots)

    @property
    def draining_slots(self) -> int:
        """Slots of running ``work()`` loops whose handler outlived its lease."""
        return sum(slots.draining for slots in list(self._loops))

    async def aclose(self) -> None:
        """Stops the renewals of leases still held and the handlers ``work()`` gave up on; closes idle connections."""
        leases, self._leases = self._leases, []
        for lease in leases:
            await lease.aclose()
        for task in list(self._orphans):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._pool.aclose()

    async def __aenter__(self) -> AsyncFencegateClient:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    def _id(self, worker_id: str | None) -> str:
        return self.worker_id if worker_id is None else worker_id_for(worker_id, self._subject)

    async def _claim(self, ids: list[str], types: list[str] | None, wait: float, max: int | None) -> list[AsyncLease]:
        claimed = await run_async(_ops.claim(self._api, ids, types, wait, max, self.request_timeout), self._send)
        leases = [AsyncLease(LeaseCore(self._api, job, owner, sent_at, self.request_timeout), self._send)
                  for job, owner, sent_at in claimed]
        self._leases = [lease for lease in self._leases if lease.held] + leases
        return leases


class _WorkLoop:
    """One ``work()`` run: claims into free slots, one task per job, then the shutdown grace period."""

    def __init__(self, client: AsyncFencegateClient, ids: dict[int, str], types: list[str] | None, claim_wait: float,
                 handler: AsyncHandler, slots: Slots, emit: Emit) -> None:
        self.client, self.ids, self.types, self.claim_wait = client, ids, types, claim_wait
        self.handler, self.slots, self.emit = handler, slots, emit
        self.idle = list(ids)
        self.freed = asyncio.Event()
        self.running: dict[asyncio.Task[None], AsyncLease] = {}
        self.abandoned: set[str] = set()

    async def run(self, stop: asyncio.Event, grace: float) -> list[str]:
        failures = 0
        while not stop.is_set():
            if not self.idle:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.freed.wait(), 0.05)
                self.freed.clear()
                continue
            asked, self.idle = self.idle[:100], self.idle[100:]
            try:
                claimed = await self._claim(asked)
                failures = 0
            except FencegateError as err:
                self._give_back(*asked)
                self.emit({"type": "error", "code": err.code})
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), min(0.1 * 2 ** failures, 5.0))
                failures += 1
                continue
            self._give_back(*[n for n in asked if n not in {s for _, s in claimed}])
            for lease, slot in claimed:
                await self._admit(lease, slot, stop)
        return await self._shut_down(grace)

    async def _claim(self, free: list[int]) -> list[tuple[AsyncLease, int]]:
        max = len(free) if len(self.ids) > 1 else None
        leases = await self.client._claim([self.ids[n] for n in free], self.types, self.claim_wait, max)
        by_id = {self.ids[n]: n for n in free}
        return [(lease, by_id.get(lease.worker_id, free[i])) for i, lease in enumerate(leases)]

    def _give_back(self, *free: int) -> None:
        self.idle = sorted(self.idle + list(free))
        self.freed.set()

    async def _admit(self, lease: AsyncLease, slot: int, stop: asyncio.Event) -> None:
        if stop.is_set():
            await lease.release()
            self.emit(lease_event("released", lease, reason="shutdown"))
            return self._give_back(slot)
        self.emit(lease_event("claimed", lease))
        if lease.state == "lost":
            self.emit(lease_event("lost", lease, reason=getattr(lease.error, "reason", "deadline")))
            return self._give_back(slot)
        task = asyncio.get_running_loop().create_task(self._run(lease, slot), name=f"fencegate-job-{lease.job_id}")
        self.running[task] = lease

    async def _run(self, lease: AsyncLease, slot: int) -> None:
        flags = {"running": True, "draining": False}

        def ended(ended_lease: AsyncLease) -> None:
            if lease.job_id in self.abandoned:
                return
            why = ended_by(ended_lease.error)
            self.emit(lease_event(why, lease, reason=getattr(ended_lease.error, "reason", None) or why))
            if flags["running"]:
                flags["draining"] = True
                self.slots.drain(lease.job, why)

        lease.on_end(ended)
        try:
            ok, value = True, await self.handler(lease.job, lease)
        except Exception as err:  # the handler's failure is the job's, not the worker's
            ok, value = False, err
        finally:
            flags["running"] = False
        if flags["draining"]:
            self.slots.drained(lease.job)
        if not lease.ended.is_set() and lease.job_id not in self.abandoned:
            await _commit(lease, ok, value, self.emit)
        await lease.aclose()
        self._give_back(slot)

    async def _shut_down(self, grace: float) -> list[str]:
        tasks = list(self.running)
        if tasks:
            await asyncio.wait(tasks, timeout=max(0.0, grace))
        unsettled = []
        for task in tasks:
            if not task.done():
                lease = self.running[task]
                unsettled.append(lease.job_id)
                self.abandoned.add(lease.job_id)
                await lease.release()
                self.client._orphans.add(task)
                task.add_done_callback(self.client._orphans.discard)
        return unsettled


async def _commit(lease: AsyncLease, ok: bool, value: Any, emit: Emit) -> None:
    try:
        if ok:
            await lease.complete(value)
            emit(lease_event("completed", lease))
        else:
            state = await lease.fail(error_record(value), retryable=not isinstance(value, PermanentFailure))
            emit(lease_event("failed", lease, state=state))
    except FencegateError as err:
        if lease.error is None or isinstance(err, GatewayUnreachable):
            emit(lease_event("error", lease, code=err.code))



