"""The job API's operations as sans-I/O generators, driven by either front.

An operation yields a :class:`Request` (the driver sends it and sends back the :class:`Response`,
or throws ``GatewayUnreachable`` into it) or a float (the driver sleeps that many seconds), and
returns its value. ``run_sync`` drives one in the calling thread; the asyncio front drives the
same generator with its asyncio transport and ``asyncio.sleep``.

Example::

    job = run_sync(start(api, "report", "acme:2026-08", None, False, 10.0), send)
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, ContextManager, Generator, TypeVar, Union

from ._core import HOLDER_RETRIES, JobApi, Request, Response, claim_body, claimed_jobs, job_path, ok_body
from ._lease_core import LeaseCore
from .errors import GatewayUnreachable, error_from_problem

T = TypeVar("T")
Op = Generator[Union[Request, float], Any, T]


def run_sync(op: Op[T], send: Callable[[Request], Response], lock: ContextManager[Any] | None = None) -> T:
    """Drives an operation with blocking I/O; the generator advances under ``lock``, I/O runs without it.

    Example::

        job = run_sync(get_job(api, "1", None, 10.0), send)
    """
    value: Any = None
    error: BaseException | None = None
    guard = lock if lock is not None else contextlib.nullcontext()
    while True:
        try:
            with guard:
                item = op.throw(error) if error is not None else op.send(value)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        value, error = None, None
        if isinstance(item, Request):
            try:
                value = send(item)
            except GatewayUnreachable as err:
                error = err
        else:
            time.sleep(item)


def start(api: JobApi, type: str, key: str, payload: Any, restart: bool, timeout: float) -> Op[dict[str, Any]]:
    """Starts a job by its natural key or joins it: the job API's answer."""
    body = {"type": type, "key": key, "payload": payload, "restart": restart}
    # Without restart a second start joins the job the first one started (its natural key).
    return ok_body((yield api.job_call("POST", "", body, timeout, replayable=not restart)))


def get_job(api: JobApi, job_id: str, from_seq: int | None, timeout: float) -> Op[dict[str, Any]]:
    """Reads a job (with its chunks from ``from_seq`` on)."""
    path = job_path(job_id) + ("" if from_seq is None else f"?from={int(from_seq)}")
    return ok_body((yield api.job_call("GET", path, None, timeout)))


def claim(api: JobApi, worker_ids: list[str], types: list[str] | None, wait: float, max: int | None,
          timeout: float) -> Op[list[tuple[dict[str, Any], str, float]]]:
    """One claim request: each job with the owner the server recorded and when the claim was sent."""
    sent_at = time.monotonic()
    res = yield api.job_call("POST", "/claim", claim_body(worker_ids, types, wait, max), wait + timeout)
    jobs = claimed_jobs(res, max is not None)
    out = []
    for i, job in enumerate(jobs):
        owner = job.get("worker_id")
        out.append((job, owner if isinstance(owner, str) else worker_ids[min(i, len(worker_ids) - 1)], sent_at))
    return out


def holder_call(core: LeaseCore, action: str, body: dict[str, Any], allow_cancelled: bool = False) -> Op[dict[str, Any]]:
    """A call under the lease: refused once it is gone, retried on no answer and on 5xx, 409/404 become its loss."""
    last: BaseException | None = None
    for attempt in range(HOLDER_RETRIES + 1):
        core.holder_check(allow_cancelled, last)
        try:
            res = yield core.request(action, body)
        except GatewayUnreachable as err:
            if attempt >= HOLDER_RETRIES:
                raise
            last = err
            yield 0.05 * 2 ** attempt
            continue
        if res.status == 200:
            return res.problem() or {}
        core.refused(res)
        if res.status >= 500 and attempt < HOLDER_RETRIES:
            last = error_from_problem(res.status, res.problem(), res.headers)
            yield 0.05 * 2 ** attempt
            continue
        raise error_from_problem(res.status, res.problem(), res.headers)
    raise AssertionError("unreachable")  # pragma: no cover


def append(core: LeaseCore, chunk: Any) -> Op[int]:
    """Appends one chunk at the next sequence number; a retry resends the same chunk and number."""
    seq = core.next_seq
    yield from holder_call(core, "append", {"seq": seq, "chunk": chunk})
    core.next_seq = seq + 1
    return seq


def heartbeat(core: LeaseCore) -> Op[str]:
    """One renewal with a deadline of a third of the lease: ``renewed``, ``cancel``, ``lost`` or ``unknown``."""
    if core.done():
        return "done"
    sent_at = time.monotonic()
    try:
        res = yield core.request("heartbeat", {}, core.interval)
    except GatewayUnreachable:
        return core.heard(sent_at, None)
    return core.heard(sent_at, res)


def release(core: LeaseCore) -> Op[None]:
    """Gives the job back; if the release does not arrive, the job waits out its lease."""
    try:
        yield core.request("release", {})
    except GatewayUnreachable:
        pass


def cancelled(core: LeaseCore) -> Op[None]:
    """After a cancel request: the fail that ends the job as ``cancelled``."""
    try:
        yield core.request("fail", {"error": {"code": "job_cancelled"}, "retryable": True})
    except GatewayUnreachable:
        pass
