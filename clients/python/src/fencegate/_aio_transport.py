"""The asyncio transport: HTTP/1.1 over asyncio streams, keep-alive connections pooled per client.

It replaces ``asyncio.to_thread`` around the blocking transport, whose default executor (a few
threads on a small machine) capped the requests in flight: long-polling claims and heartbeats
queued behind each other. The reuse rules are the blocking pool's (see ``_transport``): an idle
connection past the server's keep-alive timeout or closed by the server is not reused, and a
request is sent again on a new connection only if its send failed or it is ``replayable``.
A request's ``timeout`` bounds the whole exchange (connect, send, answer).
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Dict, List, Optional, Tuple
from urllib.parse import urlsplit

from ._core import Request, Response, keep_alive_seconds, monotonic, unreachable
from ._transport import readable

Origin = Tuple[str, str, int]
Conn = Tuple[asyncio.StreamReader, asyncio.StreamWriter]
IDLE_LIMIT = 4.0
MAX_IDLE = 16
_NO_BODY = (204, 304)


class _Sent(Exception):
    """The request's bytes left whole; what failed came after (the answer)."""


class AsyncConnectionPool:
    """Idle keep-alive connections per origin, for one client on one event loop. Example: ``await pool.send(req)``."""

    def __init__(self, max_idle: int = MAX_IDLE) -> None:
        self.max_idle = max_idle
        self.opened = 0
        self._idle: Dict[Origin, List[Tuple[Conn, float]]] = {}
        self._tls: Optional[ssl.SSLContext] = None
        self._closed = False

    async def send(self, req: Request) -> Response:
        """Sends one request and reads the whole answer; no answer in time raises ``GatewayUnreachable``."""
        parts = urlsplit(req.url)
        origin: Origin = (parts.scheme, parts.hostname or "127.0.0.1", parts.port or (443 if parts.scheme == "https" else 80))
        data = request_bytes(req, origin, (parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
        deadline = monotonic() + req.timeout
        while True:
            conn, reused = self._take(origin)
            try:
                return await asyncio.wait_for(self._exchange(origin, conn, data, req.method), max(0.0, deadline - monotonic()))
            except (OSError, EOFError, ValueError, asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, _Sent) as err:
                _close(conn)
                if isinstance(err, asyncio.TimeoutError):
                    raise unreachable(f"{req.method} {parts.path}", err) from None  # sent or not, the deadline is spent
                sent = isinstance(err, _Sent)
                cause = err.__cause__ if sent and err.__cause__ is not None else err
                if reused and (not sent or (req.replayable and _no_answer(cause))):
                    continue
                raise unreachable(f"{req.method} {parts.path}", cause) from None
            except BaseException:
                _close(conn)  # cancelled mid-exchange: the connection is in an unknown state
                raise

    async def aclose(self) -> None:
        """Closes the idle connections and waits for them to close."""
        self._closed = True
        conns = [conn for entries in self._idle.values() for conn, _ in entries]
        self._idle.clear()
        for conn in conns:
            _close(conn)
        for _, writer in conns:
            try:
                await writer.wait_closed()
            except (OSError, ssl.SSLError):
                pass

    def _take(self, origin: Origin) -> Tuple[Optional[Conn], bool]:
        idle = self._idle.get(origin) or []
        while idle:
            conn, until = idle.pop()
            if until > monotonic() and not _dropped(conn):
                return conn, True
            _close(conn)
        return None, False

    async def _exchange(self, origin: Origin, conn: Optional[Conn], data: bytes, method: str) -> Response:
        if conn is None:
            conn = await self._connect(origin)
        reader, writer = conn
        try:
            # A failure here propagates as is: the request never arrived whole.
            writer.write(data)
            await writer.drain()
            try:
                status, headers, body, keep = await read_response(reader, method)
            except (OSError, EOFError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as err:
                raise _Sent() from err
        except BaseException:
            _close(conn)
            raise
        if keep and not self._closed and len(self._idle.setdefault(origin, [])) < self.max_idle:
            self._idle[origin].append((conn, monotonic() + keep_alive_seconds(headers.get("keep-alive"), IDLE_LIMIT)))
        else:
            _close(conn)
        return Response(status, headers, body)

    async def _connect(self, origin: Origin) -> Conn:
        scheme, host, port = origin
        if scheme == "https":
            self._tls = self._tls or ssl.create_default_context()
            conn = await asyncio.open_connection(host, port, ssl=self._tls, server_hostname=host)
        else:
            conn = await asyncio.open_connection(host, port)
        self.opened += 1
        return conn


def request_bytes(req: Request, origin: Origin, target: str) -> bytes:
    """The request's head and body as sent: ``Host``, ``Content-Length`` and ``Accept-Encoding: identity`` added."""
    scheme, host, port = origin
    shown = f"[{host}]" if ":" in host else host
    default_port = 443 if scheme == "https" else 80
    given = {k.lower() for k in req.headers}
    lines = [f"{req.method} {target} HTTP/1.1"]
    if "host" not in given:
        lines.append(f"Host: {shown}" if port == default_port else f"Host: {shown}:{port}")
    if "accept-encoding" not in given:
        lines.append("Accept-Encoding: identity")
    if (req.body is not None or req.method.upper() in ("POST", "PUT", "PATCH")) and "content-length" not in given:
        lines.append(f"Content-Length: {len(req.body or b'')}")
    for name, value in req.headers.items():
        if any(c in f"{name}{value}" for c in "\r\n\0") or ":" in name or not name:
            raise ValueError(f"invalid header {name!r}")
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (req.body or b"")


async def read_response(reader: asyncio.StreamReader, method: str) -> Tuple[int, Dict[str, str], bytes, bool]:
    """One answer: status, headers (lower-case names, repeated ones joined), body, and whether the connection stays open."""
    while True:
        version, status = _status_line(await reader.readuntil(b"\r\n"))
        headers: Dict[str, str] = {}
        while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
            name, sep, value = line.decode("latin-1").partition(":")
            if not sep:
                raise ValueError("a header line without a colon")
            key, value = name.strip().lower(), value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        if not 100 <= status < 200:
            break  # 1xx (100 Continue, 103 Early Hints) come before the answer
    tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    keep = version == "HTTP/1.1" and "close" not in tokens or version == "HTTP/1.0" and "keep-alive" in tokens
    if method.upper() == "HEAD" or status in _NO_BODY:
        return status, headers, b"", keep
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return status, headers, await _chunked(reader), keep
    if "content-length" in headers:
        length = int(headers["content-length"].split(",")[0])
        return status, headers, await reader.readexactly(length), keep
    return status, headers, await reader.read(), False  # read until the server closes


def _status_line(line: bytes) -> Tuple[str, int]:
    version, _, rest = line.decode("latin-1").strip().partition(" ")
    if not version.startswith("HTTP/1.") or not rest[:3].isdigit():
        raise ValueError(f"not an HTTP/1.x status line: {line[:40]!r}")
    return version, int(rest[:3])


async def _chunked(reader: asyncio.StreamReader) -> bytes:
    out = bytearray()
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":
                pass  # trailers
            return bytes(out)
        out += await reader.readexactly(size)
        await reader.readexactly(2)


def _no_answer(err: BaseException) -> bool:
    """The server closed or reset the connection before any byte of an answer (not a timeout)."""
    if isinstance(err, asyncio.IncompleteReadError):
        return not err.partial
    return isinstance(err, (ConnectionResetError, BrokenPipeError))


def _dropped(conn: Conn) -> bool:
    """The server closed an idle connection: seen by the loop already, or readable on its socket before the loop ran."""
    sock = conn[1].get_extra_info("socket")
    return conn[0].at_eof() or conn[1].is_closing() or sock is None or readable(sock.fileno())


def _close(conn: Optional[Conn]) -> None:
    if conn is not None:
        conn[1].close()
