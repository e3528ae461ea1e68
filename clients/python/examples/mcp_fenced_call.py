"""An MCP client that puts the lease's fence and idempotency key in ``params._meta`` of ``tools/call``.

The MCP Python SDK's call is::

    await session.call_tool(name, arguments=None, read_timeout_seconds=None, progress_callback=None, *, meta=None)

and ``meta`` becomes the request's ``params._meta``. With the SDK installed, the whole integration
is one line::

    await session.call_tool("create_case", args, meta=fenced_meta(lease, "create_case"))

(``langchain-mcp-adapters`` tool interceptors can set the same values as per-call headers.) This
file is written against that signature without importing the SDK: ``StreamableHttpSession`` below
sends the JSON-RPC ``tools/call`` over HTTP through ``lease.fetch``, so the request also carries
``X-Execution-Fence``, ``X-Job-Id`` and the same ``Idempotency-Key`` for a ``fence: lease`` route.

    FENCEGATE_URL=http://127.0.0.1:8080 FENCEGATE_TOKEN=... FENCEGATE_JOB_TYPE=report python mcp_fenced_call.py
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import uuid
from datetime import timedelta
from typing import Any, Callable

from fencegate import AsyncFencegateClient, AsyncLease

FENCE = "io.fencegate/fence"
IDEMPOTENCY_KEY = "io.fencegate/idempotency-key"


def fenced_meta(lease: AsyncLease, step: str) -> dict[str, str]:
    """The ``_meta`` of one tool call: the lease's fence and the step's key (``fg.<job>.<step>``)."""
    return {FENCE: lease.fence, IDEMPOTENCY_KEY: f"fg.{lease.job_id}.{step}"}


class StreamableHttpSession:
    """The part of ``mcp.ClientSession`` used here, over an MCP server's HTTP endpoint."""

    def __init__(self, lease: AsyncLease, url: str) -> None:
        self._lease, self._url, self._ids = lease, url, itertools.count(1)

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None,
                        read_timeout_seconds: timedelta | None = None, progress_callback: Callable[..., Any] | None = None,
                        *, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"name": name, "arguments": arguments or {}}
        if meta:
            params["_meta"] = meta
        message = {"jsonrpc": "2.0", "id": next(self._ids), "method": "tools/call", "params": params}
        timeout = read_timeout_seconds.total_seconds() if read_timeout_seconds else None
        res = await self._lease.fetch("POST", self._url, body=message, timeout=timeout,
                                      headers={"Accept": "application/json, text/event-stream"},
                                      idempotency_key=(meta or {}).get(IDEMPOTENCY_KEY))
        answer: dict[str, Any] = res.json()
        return answer["result"]


async def main() -> None:
    base, job_type = os.environ["FENCEGATE_URL"], os.environ.get("FENCEGATE_JOB_TYPE", "report")
    async with AsyncFencegateClient(base, token=os.environ.get("FENCEGATE_TOKEN")) as client:
        await client.start(job_type, f"mcp-task-{uuid.uuid4().hex[:8]}")
        lease = await client.claim(types=[job_type], wait=5)
        assert lease is not None, "no job to claim"
        async with lease:
            session = StreamableHttpSession(lease, f"{base}/mcp")
            result = await lease.step("create_case", lambda: session.call_tool(
                "create_case", {"customer_id": "c-1048"}, meta=fenced_meta(lease, "create_case")))
            await lease.complete({"case": result["content"][0]["text"]})
        print(json.dumps({"job_id": lease.job_id, "fence": lease.fence, "result": result}))


if __name__ == "__main__":
    asyncio.run(main())
