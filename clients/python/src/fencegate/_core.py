"""The sans-I/O core both fronts share: requests are built and answers read here, never sent.

``FencegateClient`` sends a :class:`Request` on its pool of :mod:`http.client` connections in the
calling thread; ``AsyncFencegateClient`` sends the same request on its pool of asyncio streams. Everything that decides
(identity, claim bodies, what a heartbeat or a call under the lease answered) lives here once.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping
from urllib.parse import quote, urlsplit

from .errors import FencegateError, GatewayUnreachable, WorkerMismatch, error_from_problem

MAX_WORKER_ID = 255
HOLDER_RETRIES = 4
_JSON = "application/json"


def monotonic() -> float:
    """The clock lease deadlines use (seconds); never the wall clock. Example: ``deadline = monotonic() + 2``."""
    return time.monotonic()


@dataclass(frozen=True)
class Request:
    """One HTTP request, ready to send. Example: ``Request("GET", url, {}, None, 10.0)``.

    ``replayable``: sending it twice does no harm, so a transport may send it again on a new
    connection when a kept-alive one was closed under it (safe methods, and the job API's calls
    the protocol makes repeatable); anything else whose bytes may have arrived is never resent.
    """

    method: str
    url: str
    headers: dict[str, str]
    body: bytes | None
    timeout: float
    replayable: bool = False


@dataclass(frozen=True)
class Response:
    """An answer: ``status``, ``headers`` (lower-case names), ``body`` bytes and :meth:`json`.

    Example::

        res = lease.fetch("POST", f"{gw}/reports/{lease.job_id}/render", body={"step": 1})
        print(res.status, res.headers.get("idempotent-replayed"), res.json())
    """

    status: int
    headers: Mapping[str, str]
    body: bytes = field(repr=False)

    def json(self) -> Any:
        """The body parsed as JSON. Example: ``res.json()["fence"]``."""
        return json.loads(self.body.decode("utf-8"))

    def problem(self) -> dict[str, Any] | None:
        """The JSON object of a body, else None. Example: ``(res.problem() or {}).get("code")``."""
        try:
            value = self.json() if self.body else None
        except (ValueError, UnicodeDecodeError):
            return None
        return value if isinstance(value, dict) else None

    def raise_for_problem(self) -> Response:
        """Raises the typed error of a gateway refusal (a ``urn:fencegate:problem:`` answer), else returns self.

        Example::

            client.request("POST", url, headers=h).raise_for_problem()  # StaleFence, LeaseExpired, …
        """
        error = gateway_refusal(self)
        if error is not None:
            raise error
        return self


def gateway_refusal(res: Response) -> FencegateError | None:
    """The typed error when fencegate itself refused (not the upstream). Example: ``gateway_refusal(res)``."""
    if res.status < 400:
        return None
    problem = res.problem()
    if problem is None or not str(problem.get("type", "")).startswith("urn:fencegate:problem:"):
        return None
    return error_from_problem(res.status, problem, res.headers)


def subject_of(token: str | None) -> str | None:
    """The ``sub`` of a JWT, read without verifying it (the gateway verifies). Example: ``subject_of(tok)``."""
    parts = (token or "").split(".")
    if len(parts) != 3:
        return None
    try:
        raw = base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4))
        claims = json.loads(raw.decode("utf-8"))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        return None
    sub = claims.get("sub") if isinstance(claims, dict) else None
    return sub if isinstance(sub, str) and sub else None


def worker_id_for(explicit: str | None, subject: str | None) -> str:
    """The worker id: ``explicit`` if the gateway would take it, else the token's ``sub``, else random.

    Example::

        worker_id_for("host-1/blue", "host-1")  # 'host-1/blue'
    """
    if explicit is None:
        return subject or f"worker-{uuid.uuid4()}"
    if not explicit or len(explicit) > MAX_WORKER_ID:
        raise FencegateError("worker_id must be 1-255 characters", code="invalid_option")
    if subject is None or explicit == subject or explicit.startswith(subject + "/"):
        return explicit
    raise WorkerMismatch(f"worker_id {explicit!r} is not the token's sub {subject!r} or {subject + '/…'!r}: "
                         "the gateway would refuse it (403 worker_mismatch)")


class JobApi:
    """Builds the job API's requests and reads its answers. Example: ``JobApi(url, token).job_call("GET", "/1", None, 10)``."""

    def __init__(self, base_url: str, token: str | None) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise FencegateError("base_url must be an http(s) URL", code="invalid_option")
        self.base_url = base_url.rstrip("/")
        self.token = token
        self._origin = _origin(self.base_url)

    def authorize(self, url: str, headers: dict[str, str]) -> None:
        """Adds the bearer token for the gateway's own origin only, never for other hosts."""
        if self.token and "authorization" not in {k.lower() for k in headers} and _origin(url) == self._origin:
            headers["Authorization"] = f"Bearer {self.token}"

    def request(self, method: str, url: str, body: Any, headers: Mapping[str, str] | None, timeout: float,
                replayable: bool | None = None) -> Request:
        """Any request to the gateway: a dict or list body is sent as JSON, bytes and str as they are.

        ``replayable`` defaults to the safe methods (GET, HEAD, OPTIONS) only.
        """
        sent = dict(headers or {})
        data: bytes | None
        if body is None or isinstance(body, bytes):
            data = body
        elif isinstance(body, str):
            data = body.encode("utf-8")
        else:
            data = json.dumps(body, separators=(",", ":")).encode("utf-8")
            if "content-type" not in {k.lower() for k in sent}:
                sent["Content-Type"] = _JSON
        self.authorize(url, sent)
        safe = method.upper() in ("GET", "HEAD", "OPTIONS")
        return Request(method, url, sent, data, timeout, safe if replayable is None else replayable)

    def job_call(self, method: str, path: str, body: Any, timeout: float, replayable: bool | None = None) -> Request:
        """A request to ``/_fencegate/jobs{path}``; a claim is not ``replayable`` (a resend could take a second job)."""
        return self.request(method, f"{self.base_url}/_fencegate/jobs{path}", body, {"Accept": _JSON}, timeout, replayable)


def job_path(job_id: str, action: str = "") -> str:
    """``/<id>`` or ``/<id>/<action>``. Example: ``job_path("7", "heartbeat")``."""
    return f"/{quote(str(job_id), safe='')}" + (f"/{action}" if action else "")


def ok_body(res: Response) -> dict[str, Any]:
    """The JSON object of a 2xx answer; any other answer raises its typed error."""
    if 200 <= res.status < 300:
        return res.problem() or {}
    raise error_from_problem(res.status, res.problem(), res.headers)


def claim_body(worker_ids: list[str], types: list[str] | None, wait: float, max: int | None) -> dict[str, Any]:
    """The claim's body: one worker id, or (a batch of ``max``) one per job: the slots of ``work()``."""
    if not 0 <= wait <= 30:
        raise FencegateError("wait must be 0 to 30 seconds", code="invalid_option")
    body: dict[str, Any] = {"wait": wait}
    if len(worker_ids) > 1:
        body["worker_ids"] = worker_ids
    else:
        body["worker_id"] = worker_ids[0]
    if max is not None:
        body["max"] = max
    if types is not None:
        body["types"] = list(types)
    return body


def claimed_jobs(res: Response, batch: bool) -> list[dict[str, Any]]:
    """The jobs of a claim's answer (``[]`` for 204)."""
    body = ok_body(res)
    if res.status == 204 or not body:
        return []
    jobs = body.get("jobs") if batch else [body]
    return [j for j in jobs or [] if isinstance(j, dict)]


def positive_ms(value: Any) -> int:
    """A positive integer from an answer, else 0 (a lease of 0 starts lost rather than guessed)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def keep_alive_seconds(header: str | None, fallback: float) -> float:
    """How long an idle connection may be reused: the server's ``Keep-Alive: timeout`` less a second, else ``fallback``.

    Example::

        keep_alive_seconds("timeout=5", 4.0)  # 4.0
    """
    for part in (header or "").split(","):
        name, _, value = part.strip().partition("=")
        if name.strip().lower() == "timeout" and value.strip().isdigit():
            return max(0.0, int(value.strip()) - 1.0)
    return fallback


def unreachable(what: str, err: BaseException) -> GatewayUnreachable:
    """The error for a request that got no answer. Example: ``raise unreachable("POST /claim", err)``."""
    return GatewayUnreachable(f"{what}: the gateway did not answer ({type(err).__name__})")


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port or (443 if parts.scheme == "https" else 80)
