"""The blocking transport: keep-alive :mod:`http.client` connections, a small pool per client.

A new connection per request cost a TCP handshake and a gateway-side connection setup on every
claim, heartbeat and completion. The pool keeps idle connections per origin (thread-safe: a
connection serves one request at a time) and never reuses one the server has closed or is
about to close:

- an idle connection past the server's ``Keep-Alive: timeout`` less a second (``IDLE_LIMIT``
  without one) is closed, not reused;
- before reuse, a connection the server closed (its socket readable: EOF or stray bytes) is
  dropped;
- if a reused connection still fails, the request is sent again on a new connection only when
  that cannot repeat an effect: the send itself failed (a request the server never got whole
  is not processed), or the request is ``replayable`` (safe methods, and the job API's calls
  whose resend the protocol makes harmless). A claim or a side effect whose bytes may have
  reached the gateway is never resent here: it raises ``GatewayUnreachable``.
"""

from __future__ import annotations

import http.client
import select
import socket
import threading
import time
import weakref
from typing import Dict, List, Tuple
from urllib.parse import urlsplit

from ._core import Request, Response, keep_alive_seconds, unreachable

Origin = Tuple[str, str, int]
IDLE_LIMIT = 4.0
MAX_IDLE = 16


class _Sent(Exception):
    """The request's bytes left whole; what failed came after (the answer)."""


class ConnectionPool:
    """Idle keep-alive connections per origin for one client. Example: ``ConnectionPool().send(req)``."""

    def __init__(self, max_idle: int = MAX_IDLE) -> None:
        self.max_idle = max_idle
        self._idle: Dict[Origin, List[Tuple[http.client.HTTPConnection, float]]] = {}
        self._lock = threading.Lock()
        self.opened = 0
        # Idle sockets are a cache, not something the caller opened: a client dropped without
        # close() still closes them (no ResourceWarning), at collection or at exit.
        self._finalizer = weakref.finalize(self, _close_all, self._idle, self._lock)

    def send(self, req: Request) -> Response:
        """Sends one request and reads the whole answer; no answer in time raises ``GatewayUnreachable``."""
        parts = urlsplit(req.url)
        origin: Origin = (parts.scheme, parts.hostname or "127.0.0.1", parts.port or (443 if parts.scheme == "https" else 80))
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        while True:
            conn, reused = self._take(origin, req.timeout)
            try:
                return self._exchange(origin, conn, req, target)
            except (OSError, http.client.HTTPException, _Sent) as err:
                conn.close()
                sent = isinstance(err, _Sent)
                cause = err.__cause__ if sent and err.__cause__ is not None else err
                if reused and (not sent or (req.replayable and _no_answer(cause))):
                    continue  # a stale connection: nothing to repeat, or nothing harmful
                raise unreachable(f"{req.method} {parts.path}", cause) from None

    def close(self) -> None:
        """Closes the idle connections (one in use is closed when its request ends)."""
        self._finalizer()

    def _take(self, origin: Origin, timeout: float) -> Tuple[http.client.HTTPConnection, bool]:
        now = time.monotonic()
        while True:
            with self._lock:
                idle = self._idle.get(origin)
                conn, until = idle.pop() if idle else (None, 0.0)
            if conn is None:
                break
            if until > now and not _dropped(conn):
                conn.timeout = timeout
                conn.sock.settimeout(timeout)  # type: ignore[union-attr]
                return conn, True
            conn.close()
        cls = http.client.HTTPSConnection if origin[0] == "https" else http.client.HTTPConnection
        with self._lock:
            self.opened += 1
        return cls(origin[1], origin[2], timeout=timeout), False

    def _exchange(self, origin: Origin, conn: http.client.HTTPConnection, req: Request, target: str) -> Response:
        # A failure in here (connecting, or sending) propagates as is: the request never arrived whole.
        conn.request(req.method, target, body=req.body, headers=req.headers)
        try:
            answer = conn.getresponse()
            body = answer.read()
        except (OSError, http.client.HTTPException) as err:
            raise _Sent() from err
        headers: dict[str, str] = {}
        for name, value in answer.getheaders():
            key = name.lower()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        if answer.will_close:
            conn.close()
        else:
            self._put(origin, conn, time.monotonic() + keep_alive_seconds(headers.get("keep-alive"), IDLE_LIMIT))
        return Response(answer.status, headers, body)

    def _put(self, origin: Origin, conn: http.client.HTTPConnection, until: float) -> None:
        with self._lock:
            if not self._finalizer.alive:
                conn.close()
                return
            idle = self._idle.setdefault(origin, [])
            if len(idle) < self.max_idle:
                idle.append((conn, until))
                return
        conn.close()


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """True when an idle connection's socket is readable: the server closed it (or sent what no request asked for)."""
    return conn.sock is None or readable(conn.sock.fileno())


def readable(fd: int) -> bool:
    """True when a socket has something to read now (an idle connection: the server's close). Example: ``readable(sock.fileno())``."""
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    except AttributeError:  # no poll() (Windows)
        return bool(select.select([fd], [], [], 0)[0])


def _no_answer(err: BaseException) -> bool:
    """The server closed or reset the connection before any byte of an answer (not a timeout)."""
    return isinstance(err, (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)) and not isinstance(err, socket.timeout)


def _close_all(idle: Dict[Origin, List[Tuple[http.client.HTTPConnection, float]]], lock: threading.Lock) -> None:
    with lock:
        conns = [conn for entries in idle.values() for conn, _ in entries]
        idle.clear()
    for conn in conns:
        conn.close()


_default = ConnectionPool()


def send(req: Request) -> Response:
    """Sends one request on the module's shared pool. Example: ``send(Request("GET", url, {}, None, 5.0))``."""
    return _default.send(req)
