"""Slot accounting of ``work()``, shared by both fronts: which slots hold a handler whose lease ended.

A slot is taken from claim until its handler returns. One whose lease ended (lost, cancelled,
released) while the handler runs on is *draining*: it claims nothing until the handler returns,
so handlers that ignore a lost lease cannot pile up (the seeds' draining control calls).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from ._core import monotonic

Event = dict[str, Any]


class Slots:
    """The draining slots of one ``work()`` loop. Example: ``Slots(4, print).drain(job, "lost")``."""

    def __init__(self, size: int, emit: Callable[[Event], None]) -> None:
        self.size = size
        self._emit = emit
        self._draining: dict[str, float] = {}
        self._said_all = False
        self._lock = threading.Lock()

    @property
    def draining(self) -> int:
        """How many slots hold a handler whose lease has ended."""
        return len(self._draining)

    def drain(self, job: dict[str, Any], why: str) -> None:
        """The job's lease ended but its handler runs on: its slot stays taken until :meth:`drained`."""
        with self._lock:
            self._draining[_key(job)] = monotonic()
            n = len(self._draining)
            say_all = n >= self.size and not self._said_all
            self._said_all = self._said_all or say_all
        self._emit({"type": "draining", "job_id": str(job["job_id"]), "job_type": job.get("type"),
                    "fence": str(job["fence"]), "why": why, "slots_draining": n})
        if say_all:
            self._emit({"type": "all_slots_draining", "job_id": str(job["job_id"]), "slots": self.size})

    def drained(self, job: dict[str, Any]) -> None:
        """The draining job's handler returned: its slot is free for the next claim."""
        with self._lock:
            since = self._draining.pop(_key(job), None)
            if since is None:
                return
            self._said_all = False
            n = len(self._draining)
        self._emit({"type": "drained", "job_id": str(job["job_id"]), "job_type": job.get("type"), "fence": str(job["fence"]),
                    "duration_ms": round((monotonic() - since) * 1000), "slots_draining": n})


def ended_by(error: BaseException | None) -> str:
    """How a lease ended, in the words of the worker's events: ``cancelled``, ``released`` or ``lost``."""
    from .errors import JobCancelled, LeaseLost

    if isinstance(error, JobCancelled):
        return "cancelled"
    return "released" if isinstance(error, LeaseLost) and error.reason == "released" else "lost"


def slot_id(worker_id: str, n: int) -> str:
    """The id of slot ``n`` of a work loop. Example: ``slot_id("host-1", 2) == "host-1/slot-2"``."""
    return f"{worker_id}/slot-{n}"


def _key(job: dict[str, Any]) -> str:
    return f"{job['job_id']}@{job['fence']}"
