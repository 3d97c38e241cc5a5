"""Hostile request bodies through the real stack (issue 29, "Anonymous big bodies"): bodies
without a usable key are refused before they are buffered or parsed, concurrent large bodies
cost at most the server's body budget (then 503 + Retry-After, never 502), the memory a
burst took is given back, and another tenant's transcription goes on meanwhile.

Oracles: the RSS of the server process (the `gateway up` process) and of its Envoy (its
child), statuses in the documented error shape, and the other tenant's answer and latency."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from server.db.models import CreditHold
from testkit.fakes.openai_stt import FakeSttProvider
from testkit.fakes.webhook_receiver import WebhookReceiver
from tests.conftest import Databases, OwnGateway, own_gateway
from tests.support.early_reply import Answer, post
from tests.support.rss import RssSampler, descendants, rss_bytes, settle_rss
from tests.test_transcription import audio_body

MIB = 1024 * 1024
TRANSCRIPTIONS = "/api/v1/audio/transcriptions"
# A key of the right shape that no workspace holds: refused by the server, not the edge.
UNKNOWN_KEY = "Bearer sk-gw-v1-" + "0" * 64
BUDGET = 64 * MIB  # the server's body budget here (default 512 MiB)
# What a burst may cost the server process and Envoy at most, and keep once it is over. The
# bodies of the anonymous burst total 1.5 GB; before the fix the server grew by 2 GiB.
SERVER_PEAK_GROWTH = 96 * MIB
ENVOY_PEAK_GROWTH = 128 * MIB
KEPT_GROWTH = 48 * MIB


@pytest_asyncio.fixture(scope="module")
async def gateway(
    databases: Databases,
    tmp_path_factory: pytest.TempPathFactory,
    fake_stt: FakeSttProvider,
    webhook_receiver: WebhookReceiver,
) -> AsyncIterator[OwnGateway]:
    env = {
        "GATEWAY_BODY_BUDGET_BYTES": str(BUDGET),
        "GATEWAY_BODY_BUDGET_WAIT_SECONDS": "0.5",
    }
    folder = tmp_path_factory.mktemp("bodies")
    async with own_gateway(databases, "sqlite", folder, fake_stt, webhook_receiver, env) as own:
        yield own


def _pids(own: OwnGateway) -> tuple[int, int]:
    """The server process (`gateway up` serves in its own process) and its Envoy."""
    assert own.gateway.process is not None
    server = own.gateway.process.pid
    envoys = [
        pid
        for pid in descendants(server)
        if Path(f"/proc/{pid}/comm").read_text().strip().startswith("envoy")
    ]
    assert len(envoys) == 1, envoys
    return server, envoys[0]


def _json_body(audio_bytes: int) -> bytes:
    """A transcription request whose base64 audio is `audio_bytes` long (random bytes)."""
    data = base64.b64encode(os.urandom(audio_bytes)).decode("ascii")
    return json.dumps({"model": "fake/ok", "input_audio": {"data": data, "format": "wav"}}).encode()


def _documented(answer: Answer, status: int) -> bool:
    body = answer.json()
    return answer.status == status and body["error"]["code"] == status


async def _other_tenant(own: OwnGateway) -> tuple[int, float]:
    """A small transcription of another tenant (the fixture's funded key): status, seconds."""
    async with httpx.AsyncClient(timeout=30) as client:
        started = time.monotonic()
        answer = await client.post(
            f"{own.gateway.base_url}/audio/transcriptions",
            json=audio_body("fake/ok"),
            headers=own.issued.headers,
        )
        return answer.status_code, time.monotonic() - started


async def test_anonymous_big_bodies_are_refused_before_they_are_buffered(
    gateway: OwnGateway,
) -> None:
    """The issue's burst at its real sizes: 32 concurrent 46 MiB JSON bodies (base64 of a
    36 MB "WAV"), half with no Authorization (the edge refuses them), half with a key of
    the right shape that does not exist (the server refuses them from the headers, before
    it reads the body). All 401; neither process grows by the bodies; another tenant's
    transcription during the burst answers 200 promptly."""
    body = _json_body(36_000_000)
    assert len(body) > 45 * MIB
    server, envoy = _pids(gateway)
    assert (await _other_tenant(gateway))[0] == 200  # warm: the baseline includes its path
    server_before, envoy_before = settle_rss(server), settle_rss(envoy)

    async def anonymous(index: int) -> Answer:
        headers = {"content-type": "application/json"}
        if index % 2:
            headers["authorization"] = UNKNOWN_KEY
        return await post(gateway.port, TRANSCRIPTIONS, body, headers, answer_within=60)

    async def tenant_during_burst() -> tuple[int, float]:
        await asyncio.sleep(0.2)  # the burst is under way
        return await _other_tenant(gateway)

    with RssSampler(server) as server_rss, RssSampler(envoy) as envoy_rss:
        *answers, (tenant_status, tenant_seconds) = await asyncio.gather(
            *(anonymous(i) for i in range(32)), tenant_during_burst()
        )
    assert [a.status for a in answers] == [401] * 32, [a.status for a in answers]
    assert all(_documented(a, 401) for a in answers)
    messages = {a.json()["error"]["message"] for a in answers}
    assert messages == {
        "Missing Authorization header: send 'Authorization: Bearer <API key>'",
        "Invalid API key",
    }
    assert tenant_status == 200 and tenant_seconds < 5, (tenant_status, tenant_seconds)
    assert server_rss.peak - server_before < SERVER_PEAK_GROWTH, server_rss.peak - server_before
    assert envoy_rss.peak - envoy_before < ENVOY_PEAK_GROWTH, envoy_rss.peak - envoy_before
    assert settle_rss(server) - server_before < KEPT_GROWTH


async def test_anonymous_bodies_on_the_typed_json_routes_are_refused_before_envoy_buffers(
    gateway: OwnGateway,
) -> None:
    """The typed JSON routes (the transcoder buffers their bodies whole) refuse a body
    without a well-formed key, or over the route's limit, at the edge, before it is read."""
    body = b'{"model": "fake/x", "prompt": "' + b"x" * (40 * MIB) + b'"}'
    _, envoy = _pids(gateway)
    before = settle_rss(envoy)
    routes = [
        ("/api/v1/videos", {}, 401),  # a media route: no key
        ("/api/v1/keys", {"authorization": "Bearer sk-x"}, 413),  # over 1 MiB: first refusal
    ]
    with RssSampler(envoy) as envoy_rss:
        answers = await asyncio.gather(
            *(
                post(
                    gateway.port,
                    path,
                    body,
                    {"content-type": "application/json", **headers},
                    answer_within=60,
                )
                for path, headers, _ in routes * 4
            )
        )
    assert [a.status for a in answers] == [status for _, _, status in routes * 4]
    assert all(_documented(a, a.status) for a in answers)
    assert all(a.sent < len(body) for a in answers), "refused before the body was read"
    assert envoy_rss.peak - before < ENVOY_PEAK_GROWTH, envoy_rss.peak - before


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_authenticated_bodies_beyond_the_budget_get_503_with_retry_after(
    gateway: OwnGateway, chunked: bool
) -> None:
    """16 concurrent 6 MiB bodies of a real key, against a 64 MiB budget (each holds 4x its
    bytes while it is parsed): some are read (and refused as audio that is not a WAV),
    the others wait, then get 503 + Retry-After; none gets a 5xx of another kind, nothing
    stays held, and the server keeps none of the memory."""
    body = _json_body(4_500_000)
    server, _ = _pids(gateway)
    before = settle_rss(server)
    headers = {"content-type": "application/json", **gateway.issued.headers}
    with RssSampler(server) as server_rss:
        answers = await asyncio.gather(
            *(post(gateway.port, TRANSCRIPTIONS, body, headers, chunked=chunked) for _ in range(16))
        )
    statuses = sorted(a.status for a in answers)
    assert set(statuses) <= {400, 503} and 400 in statuses and 503 in statuses, statuses
    for answer in answers:
        assert _documented(answer, answer.status)
        if answer.status == 503:
            assert answer.headers["retry-after"] == "1"
    assert await gateway.count(CreditHold) == 0
    # The budget bounds what is held at once (plus gRPC's and the interpreter's own).
    assert server_rss.peak - before < BUDGET + 64 * MIB, server_rss.peak - before
    assert settle_rss(server) - before < KEPT_GROWTH
    assert rss_bytes(server) > 0


async def test_a_route_without_media_refuses_a_body_larger_than_its_json_needs(
    gateway: OwnGateway,
) -> None:
    """Keys, vault, guardrails, workspaces and BYOK carry JSON of a few KiB: a body over
    GATEWAY_EDGE_MAX_CONTROL_BODY_BYTES (1 MiB) is a 413 at the edge, declared (before it is
    read) or chunked (once that much arrived), even with a good key; the media routes still
    take large bodies."""
    body = b'{"name": "' + b"x" * (2 * MIB) + b'"}'
    headers = {"content-type": "application/json", **gateway.issued.headers}
    refused = list(
        await asyncio.gather(
            post(gateway.port, "/api/v1/keys", body, headers),
            post(gateway.port, "/api/v1/vault/secrets/big", body, headers, method="PUT"),
            post(gateway.port, "/api/v1/guardrails", body, headers),
        )
    )
    chunked = await post(gateway.port, "/api/v1/keys", body, headers, chunked=True)
    refused.append(chunked)
    assert [a.status for a in refused] == [413] * 4
    assert all(_documented(a, 413) for a in refused)
    media = await post(gateway.port, TRANSCRIPTIONS, _json_body(1_600_000), headers)
    assert media.status == 400  # read and parsed: random bytes are no WAV
