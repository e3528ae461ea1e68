"""Keep-alive connections, sync and asyncio, through the real gateway: calls share a connection; a
connection the server closed is not reused; an answer lost on a kept-alive connection is asked for
again only when sending the request twice is harmless (a claim never is: it could take a second job)."""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from conftest import start_gateway, stop_gateway
from fencegate import AsyncFencegateClient, FencegateClient, GatewayUnreachable
from helpers import Interposer


def _states(client: FencegateClient, ids: list[str]) -> list[str]:
    return [client.get_job(i)["state"] for i in ids]


def test_sync_calls_share_one_connection(gateway) -> None:  # type: ignore[no-untyped-def]
    proxy = Interposer(urlsplit(gateway.url).port or 80)
    try:
        with FencegateClient(proxy.url, token=gateway.token("py-ka")) as client:
            job_id = client.start("keepalive", f"share:{uuid.uuid4().hex[:8]}")["job_id"]
            for _ in range(5):
                client.get_job(job_id)
            lease = client.claim(types=["keepalive"])
            assert lease is not None
            lease.complete({"ok": True})
            assert proxy.accepted == 1
            # The server closes the idle connection: a claim (never resent) still goes out, on a new one.
            again = client.start("keepalive", f"share:{uuid.uuid4().hex[:8]}")["job_id"]
            proxy.close_connections()
            lease = client.claim(types=["keepalive"])
            assert lease is not None and lease.job_id == again and proxy.accepted == 2
            lease.complete({"ok": True})
    finally:
        proxy.close()


def test_sync_a_lost_answer_is_asked_again_only_when_harmless(gateway) -> None:  # type: ignore[no-untyped-def]
    proxy = Interposer(urlsplit(gateway.url).port or 80)
    try:
        with FencegateClient(proxy.url, token=gateway.token("py-ka")) as client:
            tag = uuid.uuid4().hex[:8]
            first = client.start("keepalive", f"lost:{tag}:1")["job_id"]
            # A GET is resent on a new connection.
            proxy.lose_next_answer()
            assert client.get_job(first)["job_id"] == first
            assert (proxy.lost, proxy.accepted) == (1, 2)
            # A start without restart is resent too: the gateway made the job, the resend joins it.
            proxy.lose_next_answer()
            second = client.start("keepalive", f"lost:{tag}:2")
            assert second.get("joined") is True and "created" not in second and proxy.lost == 2
            # A claim is not: the gateway took the first job for this worker, and no second claim took the other.
            proxy.lose_next_answer()
            with pytest.raises(GatewayUnreachable):
                client.claim(types=["keepalive"])
            assert proxy.lost == 3
            assert _states(client, [first, second["job_id"]]) == ["running", "queued"]
            # Under the lease, the calls the protocol makes repeatable are resent: this completion lands once.
            lease = client.claim(types=["keepalive"], worker_id=client.worker_id)
            assert lease is not None and lease.job_id == second["job_id"]
            proxy.lose_next_answer()
            lease.complete({"ok": True})
            assert proxy.lost == 4 and client.get_job(second["job_id"])["state"] == "succeeded"
    finally:
        proxy.close()


def test_asyncio_calls_share_a_connection_and_a_claim_is_never_resent(gateway) -> None:  # type: ignore[no-untyped-def]
    proxy = Interposer(urlsplit(gateway.url).port or 80)

    async def scenario() -> None:
        async with AsyncFencegateClient(proxy.url, token=gateway.token("py-ka-async")) as client:
            tag = uuid.uuid4().hex[:8]
            first = (await client.start("keepalive_async", f"a:{tag}:1"))["job_id"]
            for _ in range(5):
                await client.get_job(first)
            assert proxy.accepted == 1
            proxy.lose_next_answer()
            assert (await client.get_job(first))["job_id"] == first
            assert (proxy.lost, proxy.accepted) == (1, 2)
            second = (await client.start("keepalive_async", f"a:{tag}:2"))["job_id"]
            proxy.lose_next_answer()
            with pytest.raises(GatewayUnreachable):
                await client.claim(types=["keepalive_async"])
            assert [(await client.get_job(i))["state"] for i in (first, second)] == ["running", "queued"]
            lease = await client.claim(types=["keepalive_async"])
            assert lease is not None and lease.job_id == second
            proxy.lose_next_answer()
            await lease.complete({"ok": True})
            assert proxy.lost == 3 and (await client.get_job(second))["state"] == "succeeded"
            third = (await client.start("keepalive_async", f"a:{tag}:3"))["job_id"]
            proxy.close_connections()  # as a server closes its idle connections: the claim goes out on a new one
            lease = await client.claim(types=["keepalive_async"])
            assert lease is not None and lease.job_id == third
            await lease.complete({"ok": True})

    try:
        asyncio.run(scenario())
    finally:
        proxy.close()


def test_a_gateway_restarted_between_calls(gateway) -> None:  # type: ignore[no-untyped-def]
    """The kept-alive connections of both fronts die with the gateway; the next calls (a claim among them) go out on new ones."""
    with tempfile.TemporaryDirectory(prefix="fencegate-py-restart-") as tmp:
        proc, listening = start_gateway(Path(tmp), gateway.upstream.url)
        port = urlsplit(listening["data_url"]).port or 80
        url = listening["data_url"]
        sync_client = FencegateClient(url, token=gateway.token("py-restart"))
        try:
            job_id = sync_client.start("restarted", f"r:{uuid.uuid4().hex[:8]}")["job_id"]

            async def before() -> AsyncFencegateClient:
                client = AsyncFencegateClient(url, token=gateway.token("py-restart"))
                await client.get_job(job_id)
                return client

            loop = asyncio.new_event_loop()
            try:
                async_client = loop.run_until_complete(before())
                stop_gateway(proc)
                proc, _ = start_gateway(Path(tmp), gateway.upstream.url, port)
                lease = sync_client.claim(types=["restarted"])
                assert lease is not None and lease.job_id == job_id
                lease.complete({"after": "restart"})
                assert loop.run_until_complete(async_client.get_job(job_id))["state"] == "succeeded"
                loop.run_until_complete(async_client.aclose())
            finally:
                loop.close()
        finally:
            sync_client.close()
            stop_gateway(proc)
