"""fencegate: workers for fencegate's job API, sync and asyncio, standard library only.

Example::

    from fencegate import FencegateClient

    client = FencegateClient("http://127.0.0.1:8080", token=token)
    client.start("report", "acme:2026-08", {"account": "acme"})
    with client.claim(types=["report"], wait=5) as lease:
        lease.step("render", lambda: lease.fetch("POST", f"{gw}/reports/{lease.job_id}/render"))
        lease.complete({"ok": True})
"""

from ._core import Response
from .aio import AsyncFencegateClient
from .aio_lease import AsyncLease
from .client import FencegateClient
from .errors import (
    FencegateError, GatewayUnreachable, InsufficientScope, JobCancelled, JobFinished, JobNotFound, LeaseExpired,
    LeaseLost, NotOwner, OwnershipUnknown, PermanentFailure, SequenceConflict, StaleFence, StoreUnavailable,
    Unauthenticated, UnknownJobType, WorkerMismatch, error_from_problem,
)
from .lease import Lease

__version__ = "0.1.0"
__all__ = [
    "AsyncFencegateClient", "AsyncLease", "FencegateClient", "Lease", "Response",
    "FencegateError", "GatewayUnreachable", "InsufficientScope", "JobCancelled", "JobFinished", "JobNotFound",
    "LeaseExpired", "LeaseLost", "NotOwner", "OwnershipUnknown", "PermanentFailure", "SequenceConflict",
    "StaleFence", "StoreUnavailable", "Unauthenticated", "UnknownJobType", "WorkerMismatch", "error_from_problem",
]
