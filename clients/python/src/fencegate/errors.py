"""Errors of the fencegate client: one class per problem code the worker branches on.

Every error carries the problem's ``code`` and, when the gateway answered, its ``status``,
``detail``, ``request_id`` and ``retry_after`` (seconds, from ``Retry-After``). None carries a
body, a result or a token.

Example::

    try:
        lease.complete({"ok": True})
    except LeaseLost as err:
        log.warning("lost job %s (%s)", err.job_id, err.reason)
"""

from __future__ import annotations

from typing import Any, Mapping

__all__ = [
    "FencegateError", "LeaseLost", "NotOwner", "StaleFence", "LeaseExpired", "InsufficientScope",
    "Unauthenticated", "WorkerMismatch", "JobNotFound", "JobFinished", "SequenceConflict",
    "UnknownJobType", "StoreUnavailable", "OwnershipUnknown", "JobCancelled", "GatewayUnreachable",
    "PermanentFailure", "error_from_problem",
]


class FencegateError(Exception):
    """The base of every error of this package; ``code`` is stable, the message is for people.

    Example::

        except FencegateError as err:
            if err.retry_after: time.sleep(err.retry_after)
    """

    default_code = "fencegate_error"

    def __init__(
        self,
        message: str = "",
        *,
        code: str | None = None,
        status: int | None = None,
        detail: str | None = None,
        request_id: str | None = None,
        retry_after: float | None = None,
        problem: Mapping[str, Any] | None = None,
    ) -> None:
        self.code: str = code or self.default_code
        self.status = status
        self.detail = detail
        self.request_id = request_id
        self.retry_after = retry_after
        self.problem: dict[str, Any] = dict(problem or {})
        super().__init__(message or detail or self.code)


class LeaseLost(FencegateError):
    """The lease is gone: the gateway refused it, its confirmed deadline passed, or it was released.

    ``reason`` is the gateway's (``expired``, ``superseded``, ``released``, ``cancelled``,
    ``finished``, ``max_runtime``, ``not_found``) or the client's own ``deadline``.

    Example::

        except LeaseLost as err:
            assert err.reason in ("expired", "superseded", "deadline")
    """

    default_code = "lease_lost"

    def __init__(self, message: str = "", *, job_id: str | None = None, fence: str | None = None,
                 reason: str | None = None, **kw: Any) -> None:
        self.job_id = job_id
        self.fence = fence
        self.reason = reason or str((kw.get("problem") or {}).get("reason") or "superseded")
        if not message and job_id is not None:
            message = f"job {job_id}: fence {fence} no longer holds the lease ({self.reason})"
        super().__init__(message, **kw)


class NotOwner(LeaseLost):
    """A completion by a worker and fence that no longer hold the job (``409 not_owner``).

    Example::

        except NotOwner: pass  # the successor's result stands
    """

    default_code = "not_owner"


class StaleFence(FencegateError):
    """The gateway refused a side effect for its fence (``409 stale_fence``).

    Example::

        except StaleFence: pass  # a newer owner's command was accepted already
    """

    default_code = "stale_fence"


class LeaseExpired(StaleFence):
    """A ``fence: lease`` route refused the fence: not the live lease of its job (``409 lease_expired``).

    Example::

        except StaleFence as err: assert err.code in ("stale_fence", "lease_expired")
    """

    default_code = "lease_expired"


class InsufficientScope(FencegateError):
    """The token lacks a scope the call needs (``403 insufficient_scope``).

    Example::

        except InsufficientScope: print("ask for jobs:work")
    """

    default_code = "insufficient_scope"


class Unauthenticated(FencegateError):
    """No valid bearer token (``401 unauthenticated``). Example: ``except Unauthenticated: refresh()``."""

    default_code = "unauthenticated"


class WorkerMismatch(FencegateError):
    """A worker id that is not the token's ``sub`` or ``sub/…``. Example: ``FencegateClient(url, token, worker_id="other")``."""

    default_code = "worker_mismatch"


class JobNotFound(FencegateError):
    """No such job in the caller's tenant (``404``). Example: ``except JobNotFound: return None``."""

    default_code = "job_not_found"


class JobFinished(FencegateError):
    """The job failed or was cancelled; start it with ``restart=True``. Example: ``client.start(t, k, restart=True)``."""

    default_code = "job_finished"


class SequenceConflict(FencegateError):
    """An append that does not continue the output. Example: ``err.problem["cursor_length"]``."""

    default_code = "sequence_conflict"


class UnknownJobType(FencegateError):
    """No such job type is configured. Example: ``except UnknownJobType: raise SystemExit(2)``."""

    default_code = "unknown_job_type"


class StoreUnavailable(FencegateError):
    """The gateway's store is down; nothing changed. Example: ``time.sleep(err.retry_after or 1)``."""

    default_code = "store_unavailable"


class OwnershipUnknown(FencegateError):
    """A renewal was not confirmed and the deadline has not passed: no new step starts now.

    Example::

        lease.step("charge", charge, if_unknown="raise")  # raises OwnershipUnknown instead of waiting
    """

    default_code = "ownership_unknown"


class JobCancelled(FencegateError):
    """Someone cancelled the job; a heartbeat told the owner, which ended the attempt.

    Example::

        except JobCancelled: return
    """

    default_code = "job_cancelled"


class GatewayUnreachable(FencegateError):
    """The gateway did not answer within the call's deadline; the call's outcome is unknown.

    Example::

        except GatewayUnreachable: schedule_retry()
    """

    default_code = "gateway_unreachable"


class PermanentFailure(FencegateError):
    """Raised by a handler to fail the job for good (``retryable=False``).

    Example::

        if not job["payload"].get("account"): raise PermanentFailure("no account")
    """

    default_code = "permanent_failure"


_BY_CODE: dict[str, type[FencegateError]] = {
    cls.default_code: cls
    for cls in (LeaseLost, NotOwner, StaleFence, LeaseExpired, InsufficientScope, Unauthenticated,
                WorkerMismatch, JobNotFound, JobFinished, SequenceConflict, UnknownJobType, StoreUnavailable)
}


def error_from_problem(status: int, problem: Mapping[str, Any] | None, headers: Mapping[str, str]) -> FencegateError:
    """The error for a problem answer: the class of its ``code`` (``FencegateError`` for others).

    Example::

        err = error_from_problem(409, {"code": "stale_fence", "detail": "..."}, {})
        assert isinstance(err, StaleFence)
    """
    body = dict(problem or {})
    code = body.get("code") if isinstance(body.get("code"), str) else f"http_{status}"
    detail = body.get("detail") if isinstance(body.get("detail"), str) else None
    request_id = body.get("request_id") if isinstance(body.get("request_id"), str) else headers.get("x-request-id")
    cls = _BY_CODE.get(str(code), FencegateError)
    message = f"{status} {code}" + (f": {detail}" if detail else "")
    return cls(message, code=str(code), status=status, detail=detail, request_id=request_id,
               retry_after=_retry_after(headers.get("retry-after")), problem=body)


def _retry_after(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
