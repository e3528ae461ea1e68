"""work(), sync and asyncio: jobs run and complete, draining slots keep their capacity, shutdown names stuck jobs."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

from fencegate import AsyncFencegateClient, FencegateClient, PermanentFailure
from helpers import until


def key() -> str:
    return f"k-{uuid.uuid4().hex[:12]}"


class Events:
    """The worker's events, from whichever thread emits them."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def __call__(self, event: dict[str, Any]) -> None:
        with self._lock:
            self.items.append(event)

    def of(self, kind: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.items if e["type"] == kind]


def _background(fn: Any) -> threading.Thread:
    thread = threading.Thread(target=fn)
    thread.start()
    return thread


def test_work_runs_jobs_in_slots_completes_and_fails(gateway) -> None:  # type: ignore[no-untyped-def]
    client = FencegateClient(gateway.url, token=gateway.token("py-pool"))
    ids = [client.start("work", key(), {"n": n})["job_id"] for n in range(6)]
    bad = client.start("work", key(), {"n": "bad"})["job_id"]
    events, stop, result = Events(), threading.Event(), []

    def handler(job: dict[str, Any], lease: Any) -> Any:
        if job["payload"]["n"] == "bad":
            raise PermanentFailure("not a number")
        lease.append({"slot": lease.worker_id})
        return {"double": job["payload"]["n"] * 2}

    loop = _background(lambda: result.append(client.work(["work"], handler, concurrency=3, stop=stop, on_event=events, claim_wait=1)))
    until(lambda: len(events.of("completed")) == 6 and events.of("failed"), what="six completions and one failure")
    stop.set()
    loop.join(10)
    assert result == [[]]
    assert sorted(client.get_job(i)["result"]["double"] for i in ids) == [0, 2, 4, 6, 8, 10]
    assert events.of("failed")[0]["state"] == "failed" and client.get_job(bad)["error_code"] == "not_retryable"
    slots = {client.get_job(i, from_seq=0)["chunks"][0]["slot"] for i in ids}
    assert slots <= {"py-pool/slot-1", "py-pool/slot-2", "py-pool/slot-3"}


def test_a_handler_that_ignores_its_lost_lease_keeps_its_slot(gateway) -> None:  # type: ignore[no-untyped-def]
    client = FencegateClient(gateway.url, token=gateway.token("py-drain"))
    first = client.start("drain", key())["job_id"]
    events, stop, gate, result = Events(), threading.Event(), threading.Event(), []

    def handler(job: dict[str, Any], lease: Any) -> Any:
        if job["job_id"] == first:
            gate.wait(30)  # ignores lease.ended
        return {"ok": True}

    loop = _background(lambda: result.append(client.work(["drain"], handler, stop=stop, on_event=events, claim_wait=1)))
    until(lambda: events.of("claimed"), what="the first claim")
    client.request("POST", f"{gateway.url}/_fencegate/jobs/{first}/cancel").raise_for_problem()
    until(lambda: events.of("draining"), what="the slot draining")
    assert events.of("draining")[0]["why"] == "cancelled" and client.draining_slots == 1
    assert events.of("all_slots_draining")[0]["slots"] == 1
    second = client.start("drain", key())["job_id"]
    until(lambda: client.get_job(first)["state"] == "cancelled", what="the job cancelled")
    assert client.get_job(second)["state"] == "queued"  # the only slot is draining: nothing claims it
    gate.set()
    until(lambda: events.of("completed"), what="the second job completed once the slot drained")
    assert events.of("drained")[0]["job_id"] == first and client.draining_slots == 0
    assert events.of("completed")[0]["job_id"] == second
    stop.set()
    loop.join(10)
    assert result == [[]]


def test_shutdown_names_the_stuck_jobs_and_gives_them_back(gateway) -> None:  # type: ignore[no-untyped-def]
    client = FencegateClient(gateway.url, token=gateway.token("py-stuck"))
    stuck = client.start("shutdown", key())["job_id"]
    events, stop, gate, result = Events(), threading.Event(), threading.Event(), []
    loop = _background(lambda: result.append(client.work(["shutdown"], lambda job, lease: gate.wait(30), stop=stop,
                                                         shutdown_grace=0.3, on_event=events, claim_wait=1)))
    until(lambda: events.of("claimed"), what="the claim")
    stop.set()
    loop.join(10)
    assert result == [[stuck]]
    assert client.get_job(stuck)["state"] == "queued"  # released: another worker may take it at once
    assert events.of("released")[0]["job_id"] == stuck
    gate.set()
    other = client.claim(types=["shutdown"])
    assert other is not None and other.job_id == stuck and other.fence == "2"
    other.complete({"by": "successor"})


def test_asyncio_work_drains_and_shuts_down(gateway) -> None:  # type: ignore[no-untyped-def]
    asyncio.run(_async_work(gateway))


async def _async_work(gateway: Any) -> None:
    async with AsyncFencegateClient(gateway.url, token=gateway.token("py-async")) as client:
        done = [(await client.start("work_async", key(), {"n": n}))["job_id"] for n in range(4)]
        events, stop = Events(), asyncio.Event()

        async def handler(job: dict[str, Any], lease: Any) -> Any:
            await lease.append({"n": job["payload"]["n"]})
            return {"n": job["payload"]["n"]}

        loop = asyncio.create_task(client.work(["work_async"], handler, concurrency=2, stop=stop, on_event=events, claim_wait=1))
        await _until(lambda: len(events.of("completed")) == 4)
        stop.set()
        assert await loop == []
        assert sorted([(await client.get_job(i))["result"]["n"] for i in done]) == [0, 1, 2, 3]
        await _drain_and_stop(client, gateway)


async def _drain_and_stop(client: AsyncFencegateClient, gateway: Any) -> None:
    first = (await client.start("drain_async", key()))["job_id"]
    events, stop, gate = Events(), asyncio.Event(), asyncio.Event()

    async def handler(job: dict[str, Any], lease: Any) -> Any:
        await gate.wait()  # ignores lease.ended
        return {"ok": True}

    loop = asyncio.create_task(client.work(["drain_async"], handler, stop=stop, shutdown_grace=0.3, on_event=events, claim_wait=1))
    await _until(lambda: events.of("claimed"))
    await client.request("POST", f"{gateway.url}/_fencegate/jobs/{first}/cancel")
    await _until(lambda: events.of("draining"))
    assert client.draining_slots == 1
    second = (await client.start("drain_async", key()))["job_id"]
    gate.set()
    await _until(lambda: events.of("completed"))
    assert events.of("drained")[0]["job_id"] == first and events.of("completed")[0]["job_id"] == second
    stuck = (await client.start("drain_async", key()))["job_id"]
    gate.clear()
    await _until(lambda: len(events.of("claimed")) == 3)
    stop.set()
    assert await loop == [stuck]
    assert (await client.get_job(stuck))["state"] == "queued"
    gate.set()


async def _until(check: Any, timeout: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.02)
