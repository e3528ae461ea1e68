"""The Python worker of `npm run bench -- leases` (systems py-sdk and py-sdk-async).

One process per row, kept across the phases like the TS SDK's client: ``fencegate``'s
``work()`` from clients/python, with a no-op handler, over the same gateway as the TS SDK.

    python3 bench/python-worker.py <base_url> <sync|async> <slots> <job_type> <worker_id> <claim_wait>

A line protocol on stdin/stdout (bench/lease-sdk.ts drives it):
  stdout ``ready``               the client is built (printed once)
  stdin  ``run <total>``         work until ``total`` jobs had an outcome, then stop claiming
  stdout ``completed``           one job completed under its lease
  stdout ``refused <type> <why>`` one job ended otherwise (failed, lost, error…)
  stdout ``problem <code>``      a claim failed (no job done with it)
  stdout ``idle <json>``         ``work()`` returned (its unsettled job ids): the next ``run`` may come
Stdin at its end: the process closes the client and exits.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from typing import Any, Callable

from fencegate import AsyncFencegateClient, FencegateClient

OUTCOMES = ("completed", "failed", "lost", "cancelled", "released", "error")


class Phase:
    """Counts one run's outcomes and says when ``total`` jobs had one; thread-safe (sync handlers run in threads)."""

    def __init__(self, total: int, stop: Callable[[], None]) -> None:
        self.total, self.stop, self.outcomes = total, stop, 0
        self.lock = threading.Lock()

    def on_event(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind not in OUTCOMES:
            return
        why = event.get("code") or event.get("reason") or "-"
        # A claim's error has no job: it is reported, but no job is done with it.
        is_job = "job_id" in event
        line = "completed" if kind == "completed" else f"refused {kind} {why}" if is_job else f"problem {why}"
        with self.lock:
            say(line)
            if is_job:
                self.outcomes += 1
                if self.outcomes == self.total:
                    self.stop()


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def handler(job: dict[str, Any], lease: Any) -> dict[str, bool]:
    return {"ok": True}


async def async_handler(job: dict[str, Any], lease: Any) -> dict[str, bool]:
    return {"ok": True}


def run_sync(url: str, slots: int, job_type: str, worker_id: str, claim_wait: float) -> None:
    with FencegateClient(url, worker_id=worker_id) as client:
        say("ready")
        for line in sys.stdin:
            stop = threading.Event()
            phase = Phase(int(line.split()[1]), stop.set)
            unsettled = client.work([job_type], handler, concurrency=slots, stop=stop, on_event=phase.on_event,
                                    claim_wait=claim_wait)
            say("idle " + json.dumps(unsettled))


async def run_async(url: str, slots: int, job_type: str, worker_id: str, claim_wait: float) -> None:
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    try:
        async with AsyncFencegateClient(url, worker_id=worker_id) as client:
            say("ready")
            while line := (await stdin.readline()).decode():
                stop = asyncio.Event()
                phase = Phase(int(line.split()[1]), stop.set)
                unsettled = await client.work([job_type], async_handler, concurrency=slots, stop=stop,
                                              on_event=phase.on_event, claim_wait=claim_wait)
                say("idle " + json.dumps(unsettled))
    finally:
        transport.close()


def main(argv: list[str]) -> None:
    url, mode, slots, job_type, worker_id, claim_wait = argv
    if mode == "sync":
        run_sync(url, int(slots), job_type, worker_id, float(claim_wait))
    elif mode == "async":
        asyncio.run(run_async(url, int(slots), job_type, worker_id, float(claim_wait)))
    else:
        raise SystemExit(f"mode must be sync or async, not {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
