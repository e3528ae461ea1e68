"""The sync ``FencegateClient``: the job API with blocking :mod:`http.client` calls."""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any, Callable, Mapping

from . import _ops
from ._core import JobApi, Request, Response, subject_of, worker_id_for
from ._lease_core import LeaseCore
from ._slots import Slots, slot_id
from ._transport import ConnectionPool
from .errors import FencegateError
from .lease import Lease
from .work import Handler, work_loop


class FencegateClient:
    """The worker client for fencegate's job API.

    The worker id is the token's ``sub`` unless given (then it must be ``sub`` or ``sub/…``, as
    the gateway checks). Every call has a deadline of ``request_timeout`` seconds; heartbeats
    get a third of the lease.

    Example::

        client = FencegateClient("http://127.0.0.1:8080", token=os.environ["FENCEGATE_TOKEN"])
        client.start("report", "acme:2026-08", {"account": "acme"})
        lease = client.claim(types=["report"], wait=5)
        if lease:
            with lease:
                lease.step("render", lambda: lease.fetch("POST", f"{gw}/reports/{lease.job_id}/render"))
                lease.complete({"ok": True})
    """

    def __init__(self, base_url: str, token: str | None = None, worker_id: str | None = None,
                 request_timeout: float = 10.0) -> None:
        self._api = JobApi(base_url, token)
        self._subject = subject_of(token)
        self.worker_id: str = worker_id_for(worker_id, self._subject)
        self.request_timeout = request_timeout
        self._pool = ConnectionPool()
        self._send: Callable[[Request], Response] = self._pool.send
        self._loops: set[Slots] = set()
        self._leases: list[Lease] = []
        self._lock = threading.Lock()

    def start(self, type: str, key: str, payload: Any = None, restart: bool = False) -> dict[str, Any]:
        """Starts a job by its natural key, or joins the live one (``created`` / ``joined`` say which).

        Example::

            client.start("report", "acme:2026-08", {"account": "acme"})  # {'job_id': '1', 'state': 'queued', 'created': True}
        """
        return _ops.run_sync(_ops.start(self._api, type, key, payload, restart, self.request_timeout), self._send)

    def get_job(self, job_id: str, from_seq: int | None = None) -> dict[str, Any]:
        """Reads a job, with its output chunks from ``from_seq`` on when given. Example: ``client.get_job("1")["state"]``."""
        return _ops.run_sync(_ops.get_job(self._api, job_id, from_seq, self.request_timeout), self._send)

    def claim(self, types: list[str] | None = None, wait: float = 0, worker_id: str | None = None) -> Lease | None:
        """Claims one job with its running lease, or None when none came within ``wait`` seconds (0–30).

        Example::

            lease = client.claim(types=["report"], wait=5)
        """
        leases = self._claim([self._id(worker_id)], types, wait, None)
        return leases[0] if leases else None

    def claim_batch(self, max: int, types: list[str] | None = None, wait: float = 0,
                    worker_id: str | None = None) -> list[Lease]:
        """Claims up to ``max`` jobs (1–100) in one request, each with its own fence and lease.

        Example::

            for lease in client.claim_batch(10, types=["report"]): ...
        """
        if not isinstance(max, int) or not 1 <= max <= 100:
            raise FencegateError("max must be an integer from 1 to 100", code="invalid_option")
        return self._claim([self._id(worker_id)], types, wait, max)

    def request(self, method: str, url: str, body: Any = None, headers: Mapping[str, str] | None = None,
                timeout: float | None = None) -> Response:
        """Any request, with the token for the gateway's own origin. Example: ``client.request("GET", f"{gw}/invoices/42")``."""
        return self._send(self._api.request(method, url, body, headers, timeout or self.request_timeout))

    def work(self, types: list[str] | None, handler: Handler, concurrency: int = 1, stop: threading.Event | None = None,
             shutdown_grace: float = 30.0, on_event: Callable[[dict[str, Any]], None] | None = None,
             worker_id: str | None = None, claim_wait: float = 5.0) -> list[str]:
        """Claims and runs jobs until ``stop`` is set; returns the jobs still unsettled after the grace period.

        ``handler(job, lease)`` returns the job's result; an exception fails the attempt
        (for good with ``PermanentFailure``); a lost lease commits nothing. A handler that runs
        on after its lease ended keeps its slot (draining) until it returns. ``on_event`` gets
        dicts (``claimed``, ``completed``, ``failed``, ``lost``, ``draining``…) from worker threads.

        Example::

            stop = threading.Event()
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            stuck = client.work(["report"], lambda job, lease: {"ok": True}, concurrency=4, stop=stop)
        """
        if not isinstance(concurrency, int) or concurrency < 1:
            raise FencegateError("concurrency must be a positive integer", code="invalid_option")
        base = self._id(worker_id)
        ids = {n: base if concurrency == 1 else slot_id(base, n) for n in range(1, concurrency + 1)}
        emit = on_event or (lambda event: None)

        def claim(free: list[int]) -> list[tuple[Lease, int]]:
            leases = self._claim([ids[n] for n in free], types, claim_wait, len(free) if concurrency > 1 else None)
            by_id = {ids[n]: n for n in free}
            return [(lease, by_id.get(lease.worker_id, free[i])) for i, lease in enumerate(leases)]

        slots = Slots(concurrency, emit)
        self._loops.add(slots)
        try:
            return work_loop(claim, slots, handler, stop or threading.Event(), shutdown_grace, emit)
        finally:
            self._loops.discard(slots)

    @property
    def draining_slots(self) -> int:
        """Slots of running ``work()`` loops whose handler outlived its lease. Example: ``gauge.set(client.draining_slots)``."""
        return sum(slots.draining for slots in list(self._loops))

    def close(self) -> None:
        """Stops the heartbeat threads of leases still held (they then run out), waits for them, closes idle connections."""
        with self._lock:
            leases, self._leases = self._leases, []
        for lease in leases:
            lease.close(5.0)
        self._pool.close()

    def __enter__(self) -> FencegateClient:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _id(self, worker_id: str | None) -> str:
        return self.worker_id if worker_id is None else worker_id_for(worker_id, self._subject)

    def _claim(self, ids: list[str], types: list[str] | None, wait: float, max: int | None) -> list[Lease]:
        claimed = _ops.run_sync(_ops.claim(self._api, ids, types, wait, max, self.request_timeout), self._send)
        leases = [Lease(LeaseCore(self._api, job, owner, sent_at, self.request_timeout), self._send)
                  for job, owner, sent_at in claimed]
        with self._lock:
            self._leases = [lease for lease in self._leases if lease.held] + leases
        return leases
