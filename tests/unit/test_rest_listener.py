"""The server's REST listener (server/rest/), in process: POST /api/v1/audio/transcriptions
and GET /api/v1/key answered as their gRPC methods answer them (the end-to-end suite sends
them through Envoy), its refusals in the documented shape, its bounds, its health, its bind
failure, its drain."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
import pytest_asyncio
from opentelemetry.trace import NoOpTracer

from server.auth import Authenticator
from server.db.models import Generation
from server.errors import GatewayError, default_message
from server.ports import ListenError
from server.rest.api import HEALTH_PATH, KEY, TRANSCRIPTIONS, RestApi
from server.rest.listener import RestListener
from server.services.keys import KeysService
from server.services.rpc import RequestObserver
from server.transcription.body import BODY_COPIES, BodyBudget
from server.transcription.upload import Uploads
from testkit.audio import fixture
from testkit.domain import Domain
from testkit.eventually import eventually

MAX_BODY = 64 * 1024
EDGE_REQUEST_SECONDS = 30.0
HEADER_LIMIT = 64 * 1024
IDLE_SECONDS = 0.5  # a connection without a whole request is closed after it


@dataclass
class Listening:
    api: RestApi
    listener: RestListener
    budget: BodyBudget
    port: int
    client: httpx.AsyncClient


def _json_body(model: str = "unit/ok") -> bytes:
    audio = base64.b64encode(fixture("hello")).decode()
    return json.dumps({"model": model, "input_audio": {"data": audio, "format": "wav"}}).encode()


async def _started_upload(
    listening: Listening, key: str, length: int, first: bytes
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A transcription whose body (`length` bytes announced) has sent only `first`."""
    reader, writer = await asyncio.open_connection("127.0.0.1", listening.port)
    writer.write(
        (
            f"POST {TRANSCRIPTIONS} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}"
            f"\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
        ).encode()
        + first
    )
    await writer.drain()
    return reader, writer


@pytest_asyncio.fixture
async def listening(domain: Domain) -> AsyncIterator[Listening]:
    budget = BodyBudget(BODY_COPIES * 4 * MAX_BODY, wait_seconds=0.1, retry_after_seconds=1)
    auth = Authenticator(domain.clock)
    uploads = Uploads(
        auth, domain.sessions, domain.transcriber(), budget, MAX_BODY, EDGE_REQUEST_SECONDS
    )
    keys = KeysService(auth, domain.sessions, domain.clock)
    api = RestApi(uploads, keys, RequestObserver(domain.metrics, NoOpTracer()))
    listener = RestListener(api, "127.0.0.1", 0, HEADER_LIMIT, IDLE_SECONDS)
    port = await listener.start()
    api.serving = True
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        yield Listening(api, listener, budget, port, client)
    await listener.stop(1)


async def test_a_transcription_is_answered_with_its_generation_id_and_charged(
    domain: Domain, listening: Listening
) -> None:
    issued = await domain.funded_key("rest")
    response = await listening.client.post(
        TRANSCRIPTIONS,
        content=_json_body(),
        headers={**issued.headers, "content-type": "application/json"},
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    generation_id = response.headers["x-generation-id"]
    assert response.json()["text"]
    rows = await domain.rows(Generation, Generation.id == generation_id)
    assert len(rows) == 1
    assert await domain.charges(issued.workspace.account_id) != []
    assert listening.budget.free == listening.budget.capacity


async def test_a_refusal_is_the_documented_error_with_its_headers(
    domain: Domain, listening: Listening
) -> None:
    missing = await listening.client.post(TRANSCRIPTIONS, content=_json_body())
    assert missing.status_code == 401
    assert missing.json() == {
        "error": {
            "code": 401,
            "message": "Missing Authorization header: send 'Authorization: Bearer <API key>'",
        }
    }
    issued = await domain.funded_key("rest")
    unknown = await listening.client.post(
        TRANSCRIPTIONS,
        content=_json_body("nobody/nothing"),
        headers={**issued.headers, "content-type": "application/json"},
    )
    assert unknown.status_code in (400, 404)
    assert unknown.json()["error"]["code"] == unknown.status_code
    assert unknown.headers["content-type"].startswith("application/json")


async def test_a_body_over_the_limit_is_refused_without_a_declared_length(
    domain: Domain, listening: Listening
) -> None:
    issued = await domain.funded_key("rest")

    async def chunked() -> AsyncIterator[bytes]:
        for _ in range(4):
            yield b"x" * (MAX_BODY // 2)

    response = await listening.client.post(
        TRANSCRIPTIONS,
        content=chunked(),
        headers={**issued.headers, "content-type": "application/json"},
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == 413
    assert listening.budget.free == listening.budget.capacity


async def test_headers_as_long_as_the_edge_lets_through_reach_the_gateway(
    listening: Listening,
) -> None:
    """aiohttp's own limit is 8 KiB a header; Envoy forwards up to its header limit."""
    response = await listening.client.post(
        TRANSCRIPTIONS,
        content=_json_body(),
        headers={"authorization": "Bearer " + "k" * 30_000, "x-session-id": "s" * 20_000},
    )
    assert response.status_code == 401
    assert response.json()["error"]["message"] == "Invalid API key"


async def test_a_compressed_body_is_not_inflated(domain: Domain, listening: Listening) -> None:
    """A body is counted as the bytes that came: gzip that would unpack past the limit is
    not unpacked (it is no JSON, as sent), and holds nothing after."""
    issued = await domain.funded_key("rest")
    bomb = gzip.compress(b" " * (MAX_BODY * 64))
    assert len(bomb) < MAX_BODY
    response = await listening.client.post(
        TRANSCRIPTIONS,
        content=bomb,
        headers={
            **issued.headers,
            "content-type": "application/json",
            "content-encoding": "gzip",
        },
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == 400
    assert listening.budget.free == listening.budget.capacity


async def test_other_paths_are_a_documented_404_and_health_follows_serving(
    listening: Listening,
) -> None:
    for method, path in (("GET", TRANSCRIPTIONS), ("POST", "/api/v1/key"), ("GET", "/")):
        response = await listening.client.request(method, path)
        assert response.status_code == 404
        assert response.json() == {"error": {"code": 404, "message": "Not Found"}}
    assert (await listening.client.get(HEALTH_PATH)).status_code == 200
    listening.api.serving = False
    assert (await listening.client.get(HEALTH_PATH)).status_code == 503


async def test_a_caller_that_goes_away_mid_body_cancels_the_request_and_frees_its_budget(
    domain: Domain, listening: Listening
) -> None:
    issued = await domain.funded_key("rest")
    reader, writer = await _started_upload(listening, issued.key, MAX_BODY, b"{" * 100)
    await eventually(lambda: listening.budget.free < listening.budget.capacity)
    writer.close()
    await eventually(lambda: listening.budget.free == listening.budget.capacity)
    del reader


async def test_a_body_still_arriving_past_the_edges_request_timeout_is_408(
    domain: Domain,
) -> None:
    """Envoy answers 408 to a body that has not arrived within the edge's request timeout;
    the server waits a second more (Envoy's answer comes first), then gives up too — for a
    caller that reached it without Envoy — with the same words, and frees its memory."""
    budget = BodyBudget(BODY_COPIES * 4 * MAX_BODY, wait_seconds=0.1, retry_after_seconds=1)
    auth = Authenticator(domain.clock)
    uploads = Uploads(auth, domain.sessions, domain.transcriber(), budget, MAX_BODY, 0.1)
    issued = await domain.funded_key("rest")

    class Stalled:
        content_type = "application/json"

        async def chunks(self) -> AsyncIterator[bytes]:
            yield b"{"
            await asyncio.Event().wait()  # the rest never comes
            yield b"}"

    headers = [(name.lower(), value) for name, value in issued.headers.items()]
    started = time.monotonic()
    with pytest.raises(GatewayError) as refused:
        await asyncio.wait_for(uploads.transcribe(headers, Stalled(), None, None, None), 5)
    assert 1.0 < time.monotonic() - started < 3
    assert (refused.value.status, refused.value.message) == (408, default_message(408))
    assert budget.free == budget.capacity


async def test_a_taken_port_is_an_error_naming_the_address_and_the_flag(
    listening: Listening,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ListenError) as refused:
            await RestListener(listening.api, "127.0.0.1", port, HEADER_LIMIT, IDLE_SECONDS).start()
    assert f"127.0.0.1:{port}" in str(refused.value)
    assert "--rest-port / GATEWAY_REST_PORT" in str(refused.value)
    assert "address already in use" in str(refused.value)


async def test_stop_lets_a_request_in_flight_finish_and_accepts_no_more(
    domain: Domain, listening: Listening
) -> None:
    issued = await domain.funded_key("rest")
    body = _json_body()
    reader, writer = await _started_upload(listening, issued.key, len(body), body[:10])
    port = listening.port
    await eventually(lambda: listening.budget.free < listening.budget.capacity)
    stopping = asyncio.create_task(listening.listener.stop(5))
    await asyncio.sleep(0.05)
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)
    writer.write(body[10:])
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    await stopping
    writer.close()


async def test_get_key_is_answered_as_the_transcoder_prints_the_grpc_answer(
    domain: Domain, listening: Listening
) -> None:
    """The same KeysService answers both ways; the REST body is its message printed as the
    facade's transcoder prints it (proto field names, every field, nulls as null)."""
    issued = await domain.funded_key("rest", limit="5")
    response = await listening.client.get(KEY, headers=issued.headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    data = response.json()["data"]
    assert data["limit"] == 5
    assert data["limit_remaining"] == 5
    assert data["expires_at"] is None
    assert data["is_management_key"] is False
    assert data["rate_limit"] == {
        "requests": -1,
        "interval": "10s",
        "note": "deprecated: ignore this field",
    }
    assert data["free_model_daily_requests"].keys() == {"used", "limit", "remaining"}
    refused = await listening.client.get(KEY, headers={"authorization": "Bearer sk-gw-v1-no"})
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == 401


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    """Whether the server closes the connection within `seconds` (what it sends first, an
    answer or nothing, is read and dropped)."""
    try:
        async with asyncio.timeout(seconds):
            while await reader.read(65536):
                pass
    except TimeoutError:
        return False
    return True


@pytest.mark.parametrize("sent", [b"", b"POST /api/v1/audio/transcriptions HTTP/1.1\r\nHo"])
async def test_a_connection_without_a_whole_request_is_closed_once_idle(
    listening: Listening, sent: bytes
) -> None:
    """A caller that reaches the listener without Envoy and sends nothing, or headers that
    never end, holds its connection only for the listener's idle time."""
    reader, writer = await asyncio.open_connection("127.0.0.1", listening.port)
    try:
        writer.write(sent)
        await writer.drain()
        assert await _closed_within(reader, IDLE_SECONDS * 6)
    finally:
        writer.close()


async def test_a_kept_alive_connection_serves_within_its_idle_time_then_closes(
    listening: Listening,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", listening.port)
    health = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    try:
        for _ in range(2):
            writer.write(health)
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
            assert head.startswith(b"HTTP/1.1 200")
            await asyncio.sleep(IDLE_SECONDS / 2)  # idle, but not long enough
        assert await _closed_within(reader, IDLE_SECONDS * 6)
    finally:
        writer.close()
