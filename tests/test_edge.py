"""The edge, through a real Envoy: CORS, flood protection, slow clients, deadlines that reach
the server and its providers, and a client that goes away."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
import sqlalchemy as sa

from server.db.models import CreditHold, Generation, LedgerEntry, VideoJob
from testkit.admin import IssuedKey
from testkit.eventually import eventually
from testkit.fakes.openai_stt import FakeSttProvider
from testkit.fakes.webhook_receiver import WebhookReceiver
from testkit.processes import GatewayProcess
from tests.conftest import Databases, OwnGateway, Stack, own_gateway
from tests.support.raw_http import exchange
from tests.test_transcription import audio_body

ALLOWED = "https://app.example.com"
CLIENT_RPS = 5
CLIENT_BURST = 10


def client_from(address: str, timeout: float = 30) -> httpx.AsyncClient:
    """A client on its own loopback address: to the edge, another client."""
    return httpx.AsyncClient(
        transport=httpx.AsyncHTTPTransport(local_address=address), timeout=timeout
    )


@pytest_asyncio.fixture(scope="module")
async def edge(
    databases: Databases,
    tmp_path_factory: pytest.TempPathFactory,
    fake_stt: FakeSttProvider,
    webhook_receiver: WebhookReceiver,
) -> AsyncIterator[OwnGateway]:
    """A gateway whose operator restricted origins and set tight edge limits. Each test
    speaks from its own loopback address, so the per-client buckets do not mix."""
    env = {
        "GATEWAY_CORS_ORIGINS": f"{ALLOWED}, https://admin.example.com",
        "GATEWAY_EDGE_CLIENT_RPS": str(CLIENT_RPS),
        "GATEWAY_EDGE_CLIENT_BURST": str(CLIENT_BURST),
        "GATEWAY_EDGE_HEADERS_TIMEOUT_SECONDS": "1",
        "GATEWAY_EDGE_REQUEST_TIMEOUT_SECONDS": "2",
        "GATEWAY_EDGE_UPSTREAM_TIMEOUT_SECONDS": "1",
    }
    async with own_gateway(
        databases, "sqlite", tmp_path_factory.mktemp("edge"), fake_stt, webhook_receiver, env
    ) as edge:
        yield edge


def preflight(origin: str) -> dict[str, str]:
    return {
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }


# --- CORS ----------------------------------------------------------------------------------------


async def test_any_origin_by_default(stack: Stack, funded: IssuedKey) -> None:
    origin = "https://anything.example"
    async with httpx.AsyncClient() as client:
        answer = await client.options(f"{stack.base_url}/videos", headers=preflight(origin))
        actual = await client.get(
            f"{stack.base_url}/key", headers={**funded.headers, "Origin": origin}
        )
    assert answer.status_code == 200
    assert answer.headers["access-control-allow-origin"] == origin
    assert "POST" in answer.headers["access-control-allow-methods"]
    allowed = answer.headers["access-control-allow-headers"]
    assert {"authorization", "content-type", "x-session-id"} <= set(allowed.split(", "))
    assert actual.status_code == 200
    assert actual.headers["access-control-allow-origin"] == origin
    assert "x-request-id" in actual.headers["access-control-expose-headers"]
    assert "x-generation-id" in actual.headers["access-control-expose-headers"]


async def test_restricted_origins(edge: OwnGateway) -> None:
    base = edge.gateway.base_url
    async with client_from("127.0.0.2") as client:
        allowed = await client.options(f"{base}/videos", headers=preflight(ALLOWED))
        refused = await client.options(f"{base}/videos", headers=preflight("https://evil.example"))
        actual_allowed = await client.get(
            f"{base}/key", headers={**edge.issued.headers, "Origin": ALLOWED}
        )
        submitted = await client.post(
            f"{base}/videos",
            json={"model": "fakevideo/frames", "prompt": "x", "duration": 1},
            headers={**edge.issued.headers, "Origin": "https://evil.example"},
        )
        no_origin = await client.get(f"{base}/key", headers=edge.issued.headers)
        not_preflight = await client.options(f"{base}/key")
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == ALLOWED
    # A disallowed origin: 400 in the documented shape, no allow headers, nothing done.
    for response in (refused, submitted):
        assert response.status_code == 400
        assert response.json() == {
            "error": {"code": 400, "message": "Request blocked by CORS: origin not allowed"}
        }
        assert not any(h.startswith("access-control-allow") for h in response.headers)
    assert await edge.count(VideoJob) == 0
    assert actual_allowed.status_code == 200
    assert actual_allowed.headers["access-control-allow-origin"] == ALLOWED
    assert no_origin.status_code == 200, "servers calling without an Origin are not affected"
    assert not_preflight.status_code == 404
    assert not_preflight.json()["error"]["code"] == 404


# --- flood protection ----------------------------------------------------------------------------


async def test_a_flood_is_cut_off_while_other_clients_are_served(edge: OwnGateway) -> None:
    url = f"{edge.gateway.base_url}/key"
    headers = edge.issued.headers
    polite_statuses: list[int] = []

    async def polite() -> None:
        async with client_from("127.0.0.4") as client:
            for _ in range(8):  # 4 per second: under the 5 per second of one client
                response = await client.get(url, headers=headers)
                polite_statuses.append(response.status_code)
                assert not any(h.startswith("x-ratelimit") for h in response.headers)
                await asyncio.sleep(0.25)

    async def flood() -> list[httpx.Response]:
        async with client_from("127.0.0.3") as client:
            return list(
                await asyncio.gather(*(client.get(url, headers=headers) for _ in range(60)))
            )

    started = time.time()
    flooded, _ = await asyncio.gather(flood(), polite())
    statuses = [r.status_code for r in flooded]
    assert statuses.count(200) <= CLIENT_BURST + CLIENT_RPS * 3  # the burst and a refill or two
    assert statuses.count(429) >= 60 - CLIENT_BURST - CLIENT_RPS * 3
    assert set(statuses) == {200, 429}
    limited = next(r for r in flooded if r.status_code == 429)
    assert limited.json() == {
        "error": {
            "code": 429,
            "message": "Rate limit exceeded: too many requests from this client",
            "metadata": {"error_type": "rate_limit_exceeded"},
        }
    }
    assert limited.headers["x-ratelimit-limit"] == str(CLIENT_RPS)
    assert limited.headers["x-ratelimit-remaining"] == "0"
    reset_ms = int(limited.headers["x-ratelimit-reset"])
    assert started * 1000 - 1000 <= reset_ms <= time.time() * 1000 + 2000
    assert "x-ratelimit-window-ms" not in limited.headers
    assert polite_statuses == [200] * 8, "a client under the limit never meets it"


async def test_the_global_ceiling(
    databases: Databases,
    tmp_path: Path,
    fake_stt: FakeSttProvider,
    webhook_receiver: WebhookReceiver,
) -> None:
    url = await databases.new("sqlite")
    gateway = GatewayProcess(
        data_dir=tmp_path / "gw",
        database_url=url,
        extra_env={
            "GATEWAY_EDGE_CLIENT_RPS": "100",
            "GATEWAY_EDGE_CLIENT_BURST": "100",
            "GATEWAY_EDGE_GLOBAL_RPS": "5",
            "GATEWAY_EDGE_GLOBAL_BURST": "20",
        },
    )
    await asyncio.to_thread(gateway.start)
    try:
        # Four clients, each far under its own limit, together over the ceiling.
        async def one_client(address: str) -> list[int]:
            async with client_from(address) as client:
                answers = await asyncio.gather(
                    *(client.get(f"{gateway.base_url}/key") for _ in range(10))
                )
            return [a.status_code for a in answers]

        results = await asyncio.gather(*(one_client(f"127.0.0.{i}") for i in range(10, 14)))
    finally:
        await asyncio.to_thread(gateway.stop)
    statuses = [s for result in results for s in result]
    assert statuses.count(401) <= 20 + 5  # unauthenticated, but past the edge
    assert statuses.count(429) >= 40 - 25
    assert set(statuses) == {401, 429}


# --- slow clients --------------------------------------------------------------------------------


async def test_slow_headers_and_a_stalled_body_are_408(edge: OwnGateway) -> None:
    port = edge.port
    slow_headers = await asyncio.to_thread(
        exchange, port, b"GET /api/v1/key HTTP/1.1\r\nHost: gateway\r\n", source="127.0.0.5"
    )
    # With a key: a body without one is refused before it is read (tests/hostile).
    head = (
        b"POST /api/v1/audio/transcriptions HTTP/1.1\r\nHost: gateway\r\n"
        b"Authorization: Bearer " + edge.issued.key.encode() + b"\r\n"
        b"Content-Type: application/json\r\nContent-Length: 5000\r\n\r\n"
    )
    stalled_body = await asyncio.to_thread(exchange, port, head, b'{"model":', source="127.0.0.5")
    for response, within in ((slow_headers, 1), (stalled_body, 2)):
        assert response.status == 408
        assert response.json() == {
            "error": {"code": 408, "message": "Request timed out before completing"}
        }
        assert within - 0.5 < response.seconds < within + 2
    async with client_from("127.0.0.6") as client:  # meanwhile, others are served
        assert (
            await client.get(f"{edge.gateway.base_url}/key", headers=edge.issued.headers)
        ).status_code == 200


# --- deadlines -----------------------------------------------------------------------------------


async def test_the_deadline_reaches_the_provider_call_and_nothing_is_charged(
    edge: OwnGateway,
) -> None:
    """Envoy's route timeout (1 s here) becomes the server's gRPC deadline: the server stops
    waiting for a provider that takes 2 s and answers 504 itself, before the edge's 524."""
    account = edge.issued.workspace.account_id
    async with client_from("127.0.0.7") as client:
        started = time.monotonic()
        response = await client.post(
            f"{edge.gateway.base_url}/audio/transcriptions",
            json=audio_body("fake/slow-ok"),
            headers=edge.issued.headers,
        )
        elapsed = time.monotonic() - started
    assert response.status_code == 504, response.text
    assert response.json()["error"]["code"] == 504
    assert elapsed < 1.5
    await edge.admin.no_hold_left(CreditHold.account_id == account)
    assert (
        await edge.count(
            LedgerEntry, LedgerEntry.kind == "charge", LedgerEntry.account_id == account
        )
        == 0
    )
    failed = Generation.status == "failed"
    assert await edge.count(Generation, failed, Generation.account_id == account) >= 1


async def test_a_client_that_goes_away_is_not_charged(stack: Stack, funded: IssuedKey) -> None:
    """The client closes its connection while the provider works: Envoy resets the call, the
    server cancels it, releases the hold and charges nothing."""
    account = funded.workspace.account_id
    body = audio_body("fake/slow-ok")
    calls_before = len(stack.fake_stt.calls_for("slow-2"))

    async def abandon() -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            await client.post(
                f"{stack.base_url}/audio/transcriptions", json=body, headers=funded.headers
            )

    task = asyncio.create_task(abandon())
    await eventually(
        lambda: len(stack.fake_stt.calls_for("slow-2")) > calls_before,
        within=10,
        message="the call reached the provider",
    )
    task.cancel()  # closes the connection mid-request
    with pytest.raises(asyncio.CancelledError):
        await task
    # The cancelled call's last write is its failed generation record, after its hold is
    # released: once it is there, no late provider answer can charge the call.
    await eventually(
        lambda: stack.admin.count(Generation, Generation.account_id == account),
        within=10,
        message="the cancelled call recorded its failure",
    )
    await stack.admin.no_hold_left(CreditHold.account_id == account)
    assert (
        await stack.admin.count(
            LedgerEntry, LedgerEntry.account_id == account, LedgerEntry.kind == "charge"
        )
        == 0
    )
    async with stack.admin.sessions() as session:
        record = (
            await session.exec(sa.select(Generation).where(Generation.account_id == account))
        ).scalar_one()
    assert record.status == "failed" and record.cost_micros == 0


# --- bounds the server checks --------------------------------------------------------------------


async def test_counts_and_base64_audio_are_bounded(stack: Stack, funded: IssuedKey) -> None:
    image = {"type": "image_url", "image_url": {"url": "https://images.example.com/a.png"}}
    video = {"model": "fakevideo/frames", "prompt": "a tree", "duration": 1}
    async with httpx.AsyncClient(timeout=120) as client:
        frames = await client.post(
            f"{stack.base_url}/videos",
            json={**video, "frame_images": [{**image, "frame_type": "first_frame"}] * 3},
            headers=funded.headers,
        )
        references = await client.post(
            f"{stack.base_url}/videos",
            json={**video, "input_references": [image] * 9},
            headers=funded.headers,
        )
        audio = await client.post(
            f"{stack.base_url}/audio/transcriptions",
            json=audio_body("fake/ok", b"\x00" * 25_000_001),
            headers=funded.headers,
        )
    for response, param in ((frames, "frame_images"), (references, "input_references")):
        assert response.status_code == 400, response.text
        assert response.json()["error"]["metadata"] == {"param": param}
    assert audio.status_code == 413
    assert audio.json()["error"] == {
        "code": 413,
        "message": "The audio is larger than 25 MB",
        "metadata": {"param": "input_audio.data"},
    }
    assert (
        await stack.admin.count(VideoJob, VideoJob.account_id == funded.workspace.account_id) == 0
    )
