"""The blocking transport: one :mod:`http.client` connection per request, closed after it.

A connection per request keeps no socket between calls (nothing to leak, nothing stale after a
partition); both fronts use it, the asyncio one from ``asyncio.to_thread``.
"""

from __future__ import annotations

import http.client
import socket
from urllib.parse import urlsplit

from ._core import Request, Response, unreachable


def send(req: Request) -> Response:
    """Sends one request and reads the whole answer; no answer in time raises ``GatewayUnreachable``.

    Example::

        res = send(Request("GET", "http://127.0.0.1:8080/_fencegate/jobs/1", {}, None, 5.0))
    """
    parts = urlsplit(req.url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname or "127.0.0.1", parts.port, timeout=req.timeout)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        conn.request(req.method, target, body=req.body, headers=req.headers)
        answer = conn.getresponse()
        body = answer.read()
        headers: dict[str, str] = {}
        for name, value in answer.getheaders():
            key = name.lower()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        return Response(answer.status, headers, body)
    except (OSError, http.client.HTTPException, socket.timeout) as err:
        raise unreachable(f"{req.method} {parts.path}", err) from None
    finally:
        conn.close()
