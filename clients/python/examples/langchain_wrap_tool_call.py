"""A LangChain-style ``wrap_tool_call`` middleware: every tool call of an agent runs as a fenced, keyed
step of the job's lease.

LangChain's hook (``langchain.agents.middleware``; ``AgentMiddleware.wrap_tool_call`` or the
``@wrap_tool_call`` decorator) is::

    wrap_tool_call(request: ToolCallRequest, handler: Callable[[ToolCallRequest], ToolMessage | Command]) -> ToolMessage | Command

where ``request.tool_call`` is the model's call (``{"name", "args", "id"}``). This file is written
against that signature without importing LangChain: with it installed, decorate
``fenced_tool_calls(lease)`` with ``@wrap_tool_call`` (or return it from an ``AgentMiddleware``).

Run against a gateway whose route ``POST /reports/:job/:step`` is ``fence: lease``::

    FENCEGATE_URL=http://127.0.0.1:8080 FENCEGATE_TOKEN=... FENCEGATE_JOB_TYPE=report python langchain_wrap_tool_call.py
"""

from __future__ import annotations

import contextvars
import json
import os
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from fencegate import FencegateClient, Lease

#: The lease of the job the agent runs; tools send their side effects through it.
current_lease: contextvars.ContextVar[Lease] = contextvars.ContextVar("current_lease")


def fenced_tool_calls(lease: Lease) -> Callable[[Any, Callable[[Any], Any]], Any]:
    """The middleware: runs ``handler(request)`` as the step ``tool.<name>.<call id>`` of ``lease``.

    The step starts only while the lease is held (it waits out an unknown ownership and raises
    ``LeaseLost`` after loss), and every ``lease.fetch`` inside it carries the fence and a key
    derived from the tool call's id, so a successor replaying the transcript gets the stored answer.
    """

    def wrap_tool_call(request: Any, handler: Callable[[Any], Any]) -> Any:
        call = request.tool_call
        step = re.sub(r"[^A-Za-z0-9_.:-]", "_", f"tool.{call['name']}.{call['id']}")[:128]
        token = current_lease.set(lease)
        try:
            return lease.step(step, lambda: handler(request))
        finally:
            current_lease.reset(token)

    return wrap_tool_call


# --- what LangChain provides, reduced to the fields used here -----------------------------------
@dataclass
class ToolCallRequest:
    tool_call: dict[str, Any]
    tool: Any = None
    state: dict[str, Any] = field(default_factory=dict)
    runtime: Any = None


def create_ticket(summary: str) -> dict[str, Any]:
    """A tool with a side effect: sent through the gateway's fenced route, under the current lease."""
    lease = current_lease.get()
    base = os.environ["FENCEGATE_URL"]
    res = lease.fetch("POST", f"{base}/reports/{lease.job_id}/ticket", body={"summary": summary})
    return {"status": res.status, "upstream": res.json()}


def main() -> None:
    client = FencegateClient(os.environ["FENCEGATE_URL"], token=os.environ.get("FENCEGATE_TOKEN"))
    job_type = os.environ.get("FENCEGATE_JOB_TYPE", "report")
    client.start(job_type, f"agent-run-{uuid.uuid4().hex[:8]}", {"ask": "open a case for c-1048"})
    lease = client.claim(types=[job_type], wait=5)
    assert lease is not None, "no job to claim"
    with lease:
        middleware = fenced_tool_calls(lease)
        request = ToolCallRequest({"name": "create_ticket", "args": {"summary": "check invoice"}, "id": "call_1"})

        def run_tool(req: ToolCallRequest) -> dict[str, Any]:  # LangChain's handler: executes the tool
            return {"type": "tool", "tool_call_id": req.tool_call["id"], "content": create_ticket(**req.tool_call["args"])}

        message = middleware(request, run_tool)
        lease.complete({"tool_message": message})
    print(json.dumps({"job_id": lease.job_id, "fence": lease.fence, "message": message}))


if __name__ == "__main__":
    main()
