"""One lease's state, as both fronts hold it: deadline, ownership, keys and sequence numbers.

No I/O and no locking here: the sync ``Lease`` calls it under its lock, the asyncio one from
its event loop. The rules are the TS SDK's (src/client/lease.ts): the local deadline is the
``lease_remaining_ms`` the database measured, counted from when the claim or renewal was
*sent*, so it is never later than the real one; it moves only on a confirmed renewal.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from ._core import JobApi, Request, Response, job_path, monotonic, positive_ms
from .errors import FencegateError, JobCancelled, LeaseLost, OwnershipUnknown

_STEP = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
Ownership = str  # "owner" | "unknown" | "lost"


class LeaseCore:
    """The state machine of one claimed job's lease. Example: ``LeaseCore(api, job, "w1", sent_at, 10.0)``."""

    def __init__(self, api: JobApi, job: dict[str, Any], worker_id: str, sent_at: float, request_timeout: float) -> None:
        self.api = api
        self.job = job
        self.job_id = str(job.get("job_id"))
        self.fence = str(job.get("fence"))
        self.worker_id = worker_id
        self.attempt = int(job.get("attempt") or 0)
        self.cursor = int(job.get("cursor_length") or 0)
        self.next_seq = self.cursor
        self.request_timeout = request_timeout
        lease_ms = positive_ms(job.get("lease_ms"))
        remaining_ms = positive_ms(job.get("lease_remaining_ms"))
        self.interval = max(0.001, lease_ms / 3000)
        self.deadline = sent_at + remaining_ms / 1000
        self.state: Ownership = "owner"
        self.ended: FencegateError | None = None
        self.finished = False
        self.renewals = 0
        self.step_name: str | None = None
        self._step_fetches = 0
        self._loose_fetches = 0
        if lease_ms <= 0 or remaining_ms <= 0:
            self.lose("deadline")

    # ownership
    def done(self) -> bool:
        """True once nothing more may be sent under the lease (ended or finished)."""
        return self.ended is not None or self.finished

    def check_deadline(self) -> None:
        """Notices a confirmed deadline that has passed: the lease is then lost (``deadline``)."""
        if not self.done() and monotonic() >= self.deadline:
            self.lose("deadline")

    def lose(self, reason: str) -> FencegateError:
        """Marks the lease lost for good; returns the error that ended it."""
        if self.ended is None:
            self.ended = LeaseLost(job_id=self.job_id, fence=self.fence, reason=reason)
        self.state = "lost"
        return self.ended

    def cancel(self) -> JobCancelled:
        """The gateway said the job is cancelled: the lease ends (the front then sends the fail)."""
        err = JobCancelled(f"job {self.job_id} was cancelled")
        if self.ended is None:
            self.ended = err
        self.state = "lost"
        return err

    def gate(self, if_unknown: str) -> bool:
        """True when a side effect may start now, False to wait for a change; raises once it never may."""
        self.check_deadline()
        if self.ended is not None:
            raise self.ended
        if self.finished:
            raise FencegateError(f"job {self.job_id} is already finished under this lease", code="lease_finished")
        if self.state == "owner":
            return True
        if if_unknown == "raise":
            raise OwnershipUnknown(f"job {self.job_id}: the last renewal was not confirmed; ownership is unknown")
        return False

    def wait_time(self) -> float:
        """How long a waiter may sleep before the deadline must be checked again."""
        return max(0.0, self.deadline - monotonic()) + 0.001

    # heartbeats
    def heard(self, sent_at: float, res: Response | None) -> str:
        """Reads a renewal's answer (None: no answer in time): ``renewed``, ``cancel``, ``lost`` or ``unknown``."""
        self.check_deadline()
        if self.done():
            return "done"
        body = res.problem() if res is not None else None
        remaining = (body or {}).get("lease_remaining_ms")
        if res is not None and res.status == 200 and isinstance(remaining, int):
            self.deadline = max(self.deadline, sent_at + remaining / 1000)
            self.renewals += 1
            self.state = "owner"
            if (body or {}).get("cancel_requested") is True:
                self.cancel()
                return "cancel"
            return "renewed"
        if res is not None and res.status == 409 and (body or {}).get("code") == "lease_lost":
            self.lose(str((body or {}).get("reason") or "expired"))
            return "lost"
        if res is not None and res.status == 404:
            self.lose("not_found")
            return "lost"
        self.state = "unknown"
        return "unknown"

    # calls under the lease
    def request(self, action: str, body: dict[str, Any], timeout: float | None = None) -> Request:
        """A job API call under this lease, naming its worker and fence.

        Replayable: under one fence a renewal renews again, a completion with the same result is
        a no-op success, an append resends the same sequence number, and a release or fail
        answered by a lost lease is what the caller already reads as one (the ops retry them too).
        """
        sent = {"worker_id": self.worker_id, "fence": self.fence, **body}
        return self.api.job_call("POST", job_path(self.job_id, action), sent, timeout or self.request_timeout, True)

    def holder_check(self, allow_cancelled: bool, last_failure: BaseException | None) -> None:
        """Raises when no call may be made now; after a lost answer, the unknown outcome rather than a loss."""
        self.check_deadline()
        if self.ended is not None and not (allow_cancelled and isinstance(self.ended, JobCancelled)):
            raise last_failure or self.ended
        if self.finished:
            raise FencegateError(f"job {self.job_id} is already finished under this lease", code="lease_finished")

    def refused(self, res: Response) -> None:
        """A 409 ``lease_lost``/``not_owner`` or a 404 ends the lease; raises the typed error."""
        body = res.problem() or {}
        if res.status == 409 and body.get("code") in ("lease_lost", "not_owner"):
            err = self.lose(str(body.get("reason") or "superseded"))
            raise err
        if res.status == 404:
            raise self.lose("not_found")

    # side effects
    def begin_step(self, name: str) -> None:
        """Starts a step: its fetches share the key ``fg.<job>.<step>`` (then ``.1``, ``.2``)."""
        if not _STEP.match(name):
            raise FencegateError("a step name is 1-128 letters, digits, _ . : -", code="invalid_step_name")
        if self.step_name is not None:
            raise FencegateError(f"step {name} started while step {self.step_name} runs", code="step_overlap")
        self.step_name, self._step_fetches = name, 0

    def end_step(self) -> None:
        """Ends the running step."""
        self.step_name = None

    def next_key(self) -> str:
        """The idempotency key of the next fetch: stable per step and call order, so a successor replays it."""
        if self.step_name is not None:
            n = self._step_fetches
            self._step_fetches += 1
            return f"fg.{self.job_id}.{self.step_name}" + (f".{n}" if n else "")
        n = self._loose_fetches
        self._loose_fetches += 1
        return f"fg.{self.job_id}.fetch.{n}"

    def choose_key(self, headers: Mapping[str, str] | None, explicit: str | None) -> str:
        """The key a fetch sends: the one given (argument or header) is kept, else :meth:`next_key`."""
        given = explicit or next((v for k, v in (headers or {}).items() if k.lower() == "idempotency-key"), None)
        return given or self.next_key()

    def fetch_request(self, method: str, url: str, body: Any, headers: Mapping[str, str] | None, key: str,
                      timeout: float | None) -> Request:
        """A side effect under the lease: ``X-Execution-Fence``, ``X-Job-Id`` and ``Idempotency-Key``."""
        sent = {k: v for k, v in (headers or {}).items() if k.lower() not in ("x-execution-fence", "x-job-id", "idempotency-key")}
        sent.update({"X-Execution-Fence": self.fence, "X-Job-Id": self.job_id, "Idempotency-Key": key})
        return self.api.request(method, url, body, sent, timeout or self.request_timeout)


def error_record(error: BaseException) -> dict[str, str]:
    """What a failed attempt records: the error's name and code; the message only for this package's errors."""
    if isinstance(error, FencegateError):
        return {"name": type(error).__name__, "code": error.code, "message": str(error)}
    code = getattr(error, "code", None)
    return {"name": type(error).__name__, **({"code": code} if isinstance(code, str) else {})}
