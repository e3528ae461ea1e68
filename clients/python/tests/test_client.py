"""The sync client's methods against the real gateway, one behaviour per test."""

from __future__ import annotations

import threading
import uuid

import pytest

from fencegate import (
    FencegateClient, FencegateError, InsufficientScope, JobCancelled, JobNotFound, LeaseLost, PermanentFailure,
    StaleFence, UnknownJobType, WorkerMismatch, error_from_problem,
)
from helpers import until


def key() -> str:
    return f"k-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def client(gateway):  # type: ignore[no-untyped-def]
    with FencegateClient(gateway.url, token=gateway.token("py-worker")) as c:
        yield c


def test_natural_key_starts_join_one_job_also_when_concurrent(client: FencegateClient) -> None:
    k = key()
    first = client.start("keys", k, {"n": 1})
    assert first["created"] is True and first["state"] == "queued"
    again = client.start("keys", k, {"n": 2})
    assert again == {"job_id": first["job_id"], "state": "queued", "joined": True}
    k2, ids = key(), []
    threads = [threading.Thread(target=lambda: ids.append(client.start("keys", k2)["job_id"])) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ids) == 8 and len(set(ids)) == 1
    assert client.get_job(first["job_id"])["state"] == "queued"


def test_claim_fetch_step_append_complete(client: FencegateClient, gateway) -> None:  # type: ignore[no-untyped-def]
    k = key()
    job_id = client.start("basic", k, {"account": "acme"})["job_id"]
    lease = client.claim(types=["basic"])
    assert lease is not None
    assert (lease.job_id, lease.fence, lease.state, lease.worker_id) == (job_id, "1", "owner", "py-worker")
    assert lease.job["payload"] == {"account": "acme"} and lease.attempt == 1 and lease.cursor == 0
    loose = lease.fetch("POST", f"{gateway.url}/reports/{job_id}/fetch-data", body={"step": 1})
    assert loose.status == 200 and loose.json()["fence"] == "1"
    stepped = lease.step("render", lambda: lease.fetch("POST", f"{gateway.url}/reports/{job_id}/render", body={}))
    assert stepped.headers["content-type"].startswith("application/json") and isinstance(stepped.body, bytes)
    assert [r["key"] for r in gateway.upstream.paths(job_id)] == [f"fg.{job_id}.fetch.0", f"fg.{job_id}.render"]
    assert {r["fence"] for r in gateway.upstream.paths(job_id)} == {"1"}
    assert [lease.append({"step": "fetch"}), lease.append({"step": "render"})] == [0, 1]
    assert client.get_job(job_id, from_seq=0)["chunks"] == [{"step": "fetch"}, {"step": "render"}]
    lease.complete({"score": 0.93})
    assert client.get_job(job_id)["state"] == "succeeded"
    assert client.start("basic", k)["result"] == {"score": 0.93}
    with pytest.raises(FencegateError) as err:
        lease.fetch("POST", f"{gateway.url}/reports/{job_id}/late")
    assert err.value.code == "lease_finished"


def test_claim_none_batch_fail_and_release(client: FencegateClient) -> None:
    assert client.claim(types=["batch"], wait=0) is None
    ids = [client.start("batch", key())["job_id"] for _ in range(3)]
    leases = client.claim_batch(5, types=["batch"], wait=1)
    assert sorted(lease.job_id for lease in leases) == sorted(ids)
    assert {lease.fence for lease in leases} == {"1"}
    first, second, third = leases
    assert first.fail({"message": "bad input"}, retryable=False) == "failed"
    assert second.fail(RuntimeError("flaky"), retryable=True) == "queued"
    third.release()
    assert third.state == "lost" and isinstance(third.error, LeaseLost) and third.error.reason == "released"
    with pytest.raises(LeaseLost):
        third.complete({"late": True})
    again = client.claim(types=["batch"])
    assert again is not None and again.job_id == third.job_id and again.fence == "2"
    again.release()
    failed = client.get_job(first.job_id)
    assert failed["state"] == "failed" and failed["error"] == {"message": "bad input"}
    assert client.get_job(second.job_id)["error"] == {"name": "RuntimeError"}


def test_heartbeats_renew_every_third_of_the_lease(client: FencegateClient) -> None:
    client.start("beat", key())
    lease = client.claim(types=["beat"])
    assert lease is not None
    until(lambda: lease.renewals >= 4, what="four renewals of a 2 s lease")  # past the 2 s lease
    assert lease.state == "owner"
    lease.complete(None)
    assert client.get_job(lease.job_id)["state"] == "succeeded"


def test_context_manager_fails_on_exception_and_releases_when_unsettled(client: FencegateClient) -> None:
    for _ in range(3):
        client.start("ctx", key())
    with pytest.raises(ValueError):
        with client.claim(types=["ctx"]) as retried:  # type: ignore[union-attr]
            raise ValueError("boom")
    assert client.get_job(retried.job_id)["state"] == "queued"
    with pytest.raises(PermanentFailure):
        with client.claim(types=["ctx"]) as failed:  # type: ignore[union-attr]
            raise PermanentFailure("no account")
    assert client.get_job(failed.job_id)["error_code"] == "not_retryable"
    with client.claim(types=["ctx"]) as left:  # type: ignore[union-attr]
        assert left.state == "owner"
    assert left.error is not None and left.error.reason == "released"
    assert client.get_job(left.job_id)["state"] == "queued"


def test_cancel_reaches_the_owner_through_its_heartbeat(client: FencegateClient, gateway) -> None:  # type: ignore[no-untyped-def]
    job_id = client.start("cancel", key())["job_id"]
    lease = client.claim(types=["cancel"])
    assert lease is not None
    client.request("POST", f"{gateway.url}/_fencegate/jobs/{job_id}/cancel").raise_for_problem()
    assert lease.ended.wait(5)
    assert isinstance(lease.error, JobCancelled) and lease.state == "lost"
    until(lambda: client.get_job(job_id)["state"] == "cancelled", what="the job cancelled")
    with pytest.raises(JobCancelled):
        lease.fetch("POST", f"{gateway.url}/reports/{job_id}/late")


def test_errors_carry_the_problem(gateway) -> None:  # type: ignore[no-untyped-def]
    reader = FencegateClient(gateway.url, token=gateway.token("browser", "jobs:read"))
    with pytest.raises(InsufficientScope) as scope:
        reader.start("basic", key())
    assert (scope.value.status, scope.value.code) == (403, "insufficient_scope")
    assert scope.value.detail and scope.value.request_id
    worker = FencegateClient(gateway.url, token=gateway.token("py-worker"))
    with pytest.raises(JobNotFound) as missing:
        worker.get_job("999999999")
    assert missing.value.status == 404
    with pytest.raises(UnknownJobType):
        worker.start("no-such-type", key())
    with pytest.raises(WorkerMismatch):
        FencegateClient(gateway.url, token=gateway.token("py-worker"), worker_id="someone-else")
    assert FencegateClient(gateway.url, token=gateway.token("py-worker"), worker_id="py-worker/blue").worker_id == "py-worker/blue"
    busy = error_from_problem(503, {"code": "store_unavailable", "detail": "down"}, {"retry-after": "1"})
    assert busy.retry_after == 1.0 and busy.code == "store_unavailable"
    assert isinstance(error_from_problem(409, {"code": "lease_expired"}, {}), StaleFence)
