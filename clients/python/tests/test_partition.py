"""The seeds' partition test, sync and asyncio: W1 is cut off from its gateway, its lease expires, W2
takes the job over, W1's network comes back: it cannot renew, cannot complete, and its side effect is refused."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any
from urllib.parse import urlsplit

import pytest

from fencegate import AsyncFencegateClient, FencegateClient, LeaseExpired, LeaseLost, NotOwner, StaleFence
from helpers import Relay, until


def _expired(client: FencegateClient, job_id: str) -> bool:
    return client.get_job(job_id)["remaining_lease_ms"] == 0


def _assert_w1_refused(w1: FencegateClient, relay: Relay, job_id: str, worker_id: str) -> None:
    """Through the restored network, the gateway itself refuses W1's renewal, completion and side effect."""
    base = f"{relay.url}/_fencegate/jobs/{job_id}"
    with pytest.raises(LeaseLost) as renew:
        w1.request("POST", f"{base}/heartbeat", {"worker_id": worker_id, "fence": "1"}).raise_for_problem()
    assert renew.value.reason == "superseded"
    with pytest.raises(NotOwner):
        w1.request("POST", f"{base}/complete", {"worker_id": worker_id, "fence": "1", "result": {"by": "w1"}}).raise_for_problem()
    headers = {"X-Execution-Fence": "1", "X-Job-Id": job_id, "Idempotency-Key": f"fg.{job_id}.again"}
    with pytest.raises(StaleFence) as side_effect:
        w1.request("POST", f"{relay.url}/reports/{job_id}/render", {}, headers).raise_for_problem()
    assert side_effect.value.code == "lease_expired" and side_effect.value.status == 409


def _assert_upstream(gateway: Any, job_id: str) -> None:
    """Each step reached the real upstream once: fetch-data under fence 1, render only under fence 2."""
    seen = [(r["path"].rsplit("/", 1)[1], r["fence"]) for r in gateway.upstream.paths(job_id)]
    assert seen == [("fetch-data", "1"), ("render", "2")]


def test_partition_sync(gateway) -> None:  # type: ignore[no-untyped-def]
    relay = Relay(urlsplit(gateway.url).port or 80)
    w1 = FencegateClient(relay.url, token=gateway.token("py-w1"))
    w2 = FencegateClient(gateway.url, token=gateway.token("py-w2"))
    try:
        job_id = w2.start("report", f"acme:{uuid.uuid4().hex[:8]}", {"account": "acme"})["job_id"]
        l1 = w1.claim(types=["report"])
        assert l1 is not None and l1.fence == "1"
        run = lambda lease, base, step: lease.step(step, lambda: lease.fetch("POST", f"{base}/reports/{job_id}/{step}", body={}))  # noqa: E731
        assert run(l1, relay.url, "fetch-data").status == 200
        l1.append({"step": "fetch-data", "by": "w1"})

        relay.cut()
        delayed: list[Any] = []
        sender = threading.Thread(target=lambda: delayed.append(_outcome(lambda: run(l1, relay.url, "render"))))
        sender.start()
        until(lambda: relay.held() > 0, what="W1's command held in the network")
        until(lambda: _expired(w2, job_id), what="the lease expired on the database clock")
        assert l1.state == "lost"  # its local deadline is never later than the database's

        l2 = w2.claim(types=["report"], wait=5)
        assert l2 is not None and (l2.job_id, l2.fence) == (job_id, "2")
        assert run(l2, gateway.url, "fetch-data").headers.get("idempotent-replayed") == "true"
        assert run(l2, gateway.url, "render").status == 200
        l2.append({"step": "render", "by": "w2"})

        relay.restore()
        sender.join(15)
        assert isinstance(delayed[0], LeaseExpired)  # the late command reached the gateway and was refused
        with pytest.raises(LeaseLost):
            l1.complete({"by": "w1"})
        _assert_w1_refused(w1, relay, job_id, l1.worker_id)
        l2.complete({"by": "w2"})
        job = w2.get_job(job_id, from_seq=0)
        assert job["result"] == {"by": "w2"} and [c["by"] for c in job["chunks"]] == ["w1", "w2"]
        _assert_upstream(gateway, job_id)
    finally:
        w1.close()
        w2.close()
        relay.close()


def test_partition_asyncio(gateway) -> None:  # type: ignore[no-untyped-def]
    relay = Relay(urlsplit(gateway.url).port or 80)
    try:
        job_id = asyncio.run(_partition_async(gateway, relay))
        _assert_upstream(gateway, job_id)
    finally:
        relay.close()


async def _partition_async(gateway: Any, relay: Relay) -> str:
    async with AsyncFencegateClient(relay.url, token=gateway.token("py-w1")) as w1, \
            AsyncFencegateClient(gateway.url, token=gateway.token("py-w2")) as w2:
        job_id = (await w2.start("report_async", f"acme:{uuid.uuid4().hex[:8]}"))["job_id"]

        async def run(lease: Any, base: str, step: str) -> Any:
            return await lease.step(step, lambda: lease.fetch("POST", f"{base}/reports/{job_id}/{step}", body={}))

        l1 = await w1.claim(types=["report_async"])
        assert l1 is not None and l1.fence == "1"
        assert (await run(l1, relay.url, "fetch-data")).status == 200
        await l1.append({"step": "fetch-data", "by": "w1"})

        relay.cut()
        delayed = asyncio.create_task(run(l1, relay.url, "render"))
        await _until(lambda: relay.held() > 0)
        await _until_async(lambda: _remaining(w2, job_id))
        assert l1.state == "lost"
        l2 = await w2.claim(types=["report_async"], wait=5)
        assert l2 is not None and l2.fence == "2"
        assert (await run(l2, gateway.url, "fetch-data")).headers.get("idempotent-replayed") == "true"
        await run(l2, gateway.url, "render")
        relay.restore()
        with pytest.raises(LeaseExpired):
            await delayed
        with pytest.raises(LeaseLost):
            await l1.complete({"by": "w1"})
        raw = FencegateClient(relay.url, token=gateway.token("py-w1"))
        await asyncio.to_thread(_assert_w1_refused, raw, relay, job_id, l1.worker_id)
        await l2.complete({"by": "w2"})
        assert (await w2.get_job(job_id))["result"] == {"by": "w2"}
        return job_id


async def _remaining(client: AsyncFencegateClient, job_id: str) -> bool:
    return (await client.get_job(job_id))["remaining_lease_ms"] == 0


async def _until(check: Any, timeout: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.02)


async def _until_async(check: Any, timeout: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.02)


def _outcome(fn: Any) -> Any:
    try:
        return fn()
    except Exception as err:  # the test inspects what the late command got
        return err
