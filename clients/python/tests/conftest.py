"""A real gateway for the suite: `node dist/src/cli/main.js serve` on free ports, an embedded PGlite
store in a temporary directory, `auth.mode: jwt` (HS256), and a recording upstream behind its routes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from helpers import AUDIENCE, ISSUER, SECRET, Upstream, token

ROOT = Path(__file__).resolve().parents[3]
CLI = ROOT / "dist" / "src" / "cli" / "main.js"
# name -> lease; each test uses its own types, so the tests of one session never claim each other's jobs.
JOB_TYPES = {"basic": "20s", "batch": "20s", "ctx": "20s", "beat": "2s", "cancel": "2s", "report": "2s",
             "report_async": "2s", "work": "5s", "work_async": "5s", "drain": "2s", "drain_async": "2s",
             "shutdown": "20s", "shutdown_async": "20s", "examples": "20s", "keys": "20s",
             "keepalive": "20s", "keepalive_async": "20s", "restarted": "20s"}


@dataclass
class Gateway:
    url: str
    admin_url: str
    upstream: Upstream

    def token(self, sub: str, scope: str | None = None) -> str:
        return token(sub) if scope is None else token(sub, scope)


def _config(upstream: str) -> dict:
    fenced = {"upstream": upstream, "entity": "job:{header.X-Job-Id}", "fence": "lease", "idempotency": "required"}
    return {
        "server": {"port": 0, "admin_port": 0, "drain_delay": 0},
        "log": {"level": "info"},
        "auth": {"mode": "jwt", "issuer": ISSUER, "audience": AUDIENCE, "hs256_secret": SECRET},
        "job_types": [{"name": n, "lease": lease, "max_attempts": 10, "backoff": "1s"} for n, lease in JOB_TYPES.items()],
        "routes": [{"name": "report-step", "method": "POST", "path": "/reports/:job/:step", **fenced},
                   {"name": "mcp", "method": "POST", "path": "/mcp", **fenced}],
    }


def _wait_listening(log: Path, proc: subprocess.Popen, deadline: float) -> dict:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the gateway exited with {proc.returncode}: {log.read_text()[-2000:]}")
        for line in log.read_text().splitlines():
            if '"listening"' in line:
                return json.loads(line)
        time.sleep(0.05)
    raise RuntimeError(f"the gateway did not start: {log.read_text()[-2000:]}")


def _wait_health(admin_url: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{admin_url}/health", timeout=2) as res:
                if res.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError("the gateway's /health never answered 200")


def start_gateway(tmp: Path, upstream: str, port: int = 0) -> tuple[subprocess.Popen, dict]:
    """`fencegate serve` on ``port`` (0: a free one) with its PGlite data in ``tmp``; the process and its `listening` log line."""
    node = shutil.which("node")
    if node is None or not CLI.exists():
        pytest.fail(f"needs node and the built gateway ({CLI}): run `npm run build` first")
    config = tmp / "fencegate.yaml"
    cfg = _config(upstream)
    cfg["server"]["port"] = port
    config.write_text(json.dumps(cfg))  # JSON is YAML
    log = tmp / f"gateway-{time.monotonic_ns()}.log"
    with open(log, "w") as out:
        # Without DATABASE_URL: the CLI prefers it to --data-dir, and CI's shared database holds
        # other suites' jobs of these types (the second CI pass claimed one of them).
        env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
        proc = subprocess.Popen([node, str(CLI), "serve", "--config", str(config), "--data-dir", str(tmp / "data")],
                                stdout=out, stderr=subprocess.STDOUT, cwd=tmp, env=env)
    try:
        deadline = time.monotonic() + 60
        listening = _wait_listening(log, proc, deadline)
        _wait_health(listening["admin_url"], deadline)
    except BaseException:
        stop_gateway(proc)
        raise
    return proc, listening


def stop_gateway(proc: subprocess.Popen) -> None:
    """SIGTERM (the gateway drains and closes its connections), SIGKILL after 15 s."""
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def gateway() -> Iterator[Gateway]:
    upstream = Upstream()
    with tempfile.TemporaryDirectory(prefix="fencegate-py-") as tmp:
        proc, listening = start_gateway(Path(tmp), upstream.url)
        try:
            yield Gateway(listening["data_url"], listening["admin_url"], upstream)
        finally:
            stop_gateway(proc)
            upstream.close()
