"""The examples run as written, against the suite's gateway: their side effects arrive fenced and keyed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent / "examples"


def _run(name: str, gateway) -> dict:  # type: ignore[no-untyped-def]
    env = {**os.environ, "FENCEGATE_URL": gateway.url, "FENCEGATE_TOKEN": gateway.token("py-examples"),
           "FENCEGATE_JOB_TYPE": "examples", "PYTHONPATH": str(HERE.parent / "src"), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-X", "dev", "-W", "error", str(EXAMPLES / name)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.py")))
def test_every_example_runs(name: str, gateway) -> None:  # type: ignore[no-untyped-def]
    out = _run(name, gateway)
    seen = gateway.upstream.paths(out["job_id"])
    assert len(seen) == 1 and seen[0]["fence"] == out["fence"]
    if name.startswith("mcp"):
        meta = seen[0]["body"]["params"]["_meta"]
        assert meta == {"io.fencegate/fence": out["fence"], "io.fencegate/idempotency-key": f"fg.{out['job_id']}.create_case"}
        assert seen[0]["key"] == meta["io.fencegate/idempotency-key"]
    else:
        assert seen[0]["key"] == f"fg.{out['job_id']}.tool.create_ticket.call_1"
        assert out["message"]["content"]["status"] == 200
