"""Test helpers: HS256 tokens, a recording upstream, a TCP relay a test can partition, and polling."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import selectors
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

ISSUER = "https://issuer.test"
AUDIENCE = "fencegate"
SECRET = "a-test-secret-of-at-least-32-bytes!!"
WORKER_SCOPES = "jobs:start jobs:work jobs:read jobs:cancel"


def token(sub: str, scope: str = WORKER_SCOPES, tenant: str = "acme") -> str:
    """An HS256 JWT as the gateway's `auth.mode: jwt` verifies it (test/helpers/tokens.ts's claims)."""
    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")

    now = int(time.time())
    claims = {"sub": sub, "tenant_id": tenant, "scope": scope, "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + 600}
    signing = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode()) + "." + b64(json.dumps(claims).encode())
    signature = hmac.new(SECRET.encode(), signing.encode("ascii"), hashlib.sha256).digest()
    return signing + "." + b64(signature)


def until(check: Callable[[], Any], timeout: float = 15.0, what: str = "the condition") -> Any:
    """Polls ``check`` until it returns a truthy value; fails after ``timeout`` instead of hanging."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"never saw {what} within {timeout} s")
        time.sleep(0.02)


class Upstream:
    """A real HTTP upstream that records every request: path, fence, job id and idempotency key."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"null")
                seen = {"path": self.path, "fence": self.headers.get("x-execution-fence"), "body": body,
                        "job": self.headers.get("x-job-id"), "key": self.headers.get("idempotency-key")}
                with upstream._lock:
                    upstream.requests.append(seen)
                answer: Any = {"path": self.path, "fence": seen["fence"], "n": len(upstream.requests)}
                if isinstance(body, dict) and body.get("jsonrpc") == "2.0":  # an MCP server's tools/call
                    answer = {"jsonrpc": "2.0", "id": body.get("id"),
                              "result": {"content": [{"type": "text", "text": "done"}], "isError": False,
                                         "_meta": {"seen": (body.get("params") or {}).get("_meta")}}}
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def paths(self, job_id: str) -> list[dict[str, Any]]:
        """The requests made for one job."""
        with self._lock:
            return [r for r in self.requests if r["job"] == job_id]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join()


class Relay:
    """A TCP relay to a port: while cut it neither forwards nor closes anything; restore delivers what it held."""

    def __init__(self, target_port: int) -> None:
        self._target = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._peer: dict[socket.socket, socket.socket] = {}
        self._held: dict[socket.socket, list[bytes]] = {}
        self._closed: set[socket.socket] = set()
        self._all: list[socket.socket] = []
        self._cut = False
        self._stop = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def cut(self) -> None:
        with self._lock:
            self._cut = True

    def restore(self) -> None:
        with self._lock:
            self._cut = False

    def held(self) -> int:
        """Bytes held while cut."""
        with self._lock:
            return sum(len(chunk) for chunks in self._held.values() for chunk in chunks)

    def close(self) -> None:
        self._stop = True
        self._thread.join()
        for sock in self._all:
            sock.close()
        self._sel.close()
        self._listener.close()

    def _loop(self) -> None:
        while not self._stop:
            for key, _ in self._sel.select(0.02):
                if key.data is None:
                    self._accept()
                else:
                    self._read(key.fileobj)  # type: ignore[arg-type]
            with self._lock:
                if not self._cut:
                    self._flush()

    def _accept(self) -> None:
        client, _ = self._listener.accept()
        target = socket.create_connection(("127.0.0.1", self._target))
        self._all += [client, target]
        for a, b in ((client, target), (target, client)):
            a.setblocking(True)
            self._peer[a] = b
            self._held[b] = []
            self._sel.register(a, selectors.EVENT_READ, "pipe")

    def _read(self, sock: socket.socket) -> None:
        try:
            data = sock.recv(65536)
        except OSError:
            data = b""
        with self._lock:
            if data:
                self._held[self._peer[sock]].append(data)
            else:
                self._sel.unregister(sock)
                self._closed.add(sock)

    def _flush(self) -> None:
        for dest, chunks in self._held.items():
            while chunks:
                try:
                    dest.sendall(chunks.pop(0))
                except OSError:
                    chunks.clear()
        for sock in list(self._closed):
            # A side that closed: once what it sent is delivered, the other side is told.
            peer = self._peer.pop(sock, None)
            self._closed.discard(sock)
            if peer is not None and peer in self._peer:
                with_suppressed(lambda: peer.shutdown(socket.SHUT_WR))
            if peer is not None and peer not in self._peer:
                self._held.pop(peer, None)
                self._held.pop(sock, None)
                peer.close()
                sock.close()


def with_suppressed(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except OSError:
        pass


class Interposer:
    """A TCP proxy to a port that counts the connections made through it. Armed with :meth:`lose_next_answer`,
    it forwards the next request and then closes the client's connection instead of delivering the answer:
    the server processed the request, and the client cannot know it (a server that closed at the wrong time)."""

    def __init__(self, target_port: int) -> None:
        self._target = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.accepted = 0
        self.lost = 0
        self._armed = False
        self._stop = False
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._clients: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def lose_next_answer(self) -> None:
        with self._lock:
            self._armed = True

    def close_connections(self) -> None:
        """Sends the client the end of every connection made so far, as a server closing its idle keep-alive
        connections does. What the client still sends goes through (the server may act on it); no answer comes back."""
        with self._lock:
            clients = list(self._clients)
        for sock in clients:
            with_suppressed(lambda: sock.shutdown(socket.SHUT_WR))

    def close(self) -> None:
        self._stop = True
        self._accepting.join()
        with self._lock:
            socks, threads = list(self._socks), list(self._threads)
        for sock in socks:
            with_suppressed(lambda: sock.shutdown(socket.SHUT_RDWR))
        for thread in threads:
            thread.join()
        for sock in socks:
            sock.close()
        self._listener.close()

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            client.settimeout(None)
            server = socket.create_connection(("127.0.0.1", self._target))
            with self._lock:
                self.accepted += 1
                self._socks += [client, server]
                self._clients.append(client)
                pumps = [threading.Thread(target=self._pump, args=(client, server, False), daemon=True),
                         threading.Thread(target=self._pump, args=(server, client, True), daemon=True)]
                self._threads += pumps
            for pump in pumps:
                pump.start()

    def _pump(self, src: socket.socket, dest: socket.socket, answers: bool) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if data and answers:
                with self._lock:
                    lose, self._armed = self._armed, False
                    self.lost += lose
                if lose:  # the client gets an orderly close where its answer should be
                    with_suppressed(lambda: dest.shutdown(socket.SHUT_RDWR))
                    with_suppressed(lambda: src.shutdown(socket.SHUT_RDWR))
                    return
            if not data:
                with_suppressed(lambda: dest.shutdown(socket.SHUT_WR))
                return
            try:
                dest.sendall(data)
            except OSError:
                return
