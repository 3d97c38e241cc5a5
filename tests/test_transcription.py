"""POST /api/v1/audio/transcriptions through Envoy: both request forms, both official SDKs,
the local provider on real speech, fallback routing against scripted fake providers,
metering and bad input."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from typing import Any

import grpc
import httpx
import pytest
import sqlalchemy as sa
from google.api import httpbody_pb2
from openai import AsyncOpenAI
from openrouter import OpenRouter

from server.contract import audio_pb2, audio_pb2_grpc
from server.db.models import CreditHold, Generation
from testkit.admin import IssuedKey
from testkit.audio import ENCODINGS, b64, encode, fixture, vbr_mp3_without_xing
from tests.conftest import Stack

HELLO_SECONDS = 1.075125


async def transcribe_json(
    stack: Stack, issued: IssuedKey, body: dict[str, Any], headers: dict[str, str] | None = None
) -> httpx.Response:
    async with httpx.AsyncClient(timeout=60) as client:
        return await client.post(
            f"{stack.base_url}/audio/transcriptions",
            json=body,
            headers={**issued.headers, **(headers or {})},
        )


def audio_body(
    model: str, data: bytes | None = None, fmt: str = "wav", **extra: Any
) -> dict[str, Any]:
    return {"model": model, "input_audio": {"data": b64(data or fixture()), "format": fmt}, **extra}


async def key_usage(stack: Stack, issued: IssuedKey) -> dict[str, Any]:
    async with httpx.AsyncClient() as client:
        return (await client.get(f"{stack.base_url}/key", headers=issued.headers)).json()["data"]


# --- real speech on the local provider ----------------------------------------------------


async def test_openai_sdk_multipart_on_local_speech(stack: Stack, funded: IssuedKey) -> None:
    client = AsyncOpenAI(api_key=funded.key, base_url=stack.base_url)
    result = await client.audio.transcriptions.create(
        file=("door.wav", fixture("door"), "audio/wav"), model="local/pocketsphinx-en"
    )
    assert result.text == "open the door"
    verbose = await client.audio.transcriptions.create(
        file=("hello.wav", fixture("hello"), "audio/wav"),
        model="local/pocketsphinx-en",
        response_format="verbose_json",
        timestamp_granularities=["word", "segment"],
    )
    assert verbose.text == "hello world"
    assert verbose.duration == pytest.approx(HELLO_SECONDS)
    assert [w.word for w in verbose.words or []] == ["hello", "world"]
    assert verbose.segments and verbose.segments[0].text == "hello world"
    await client.close()


async def test_openrouter_sdk_json_on_local_speech(stack: Stack, funded: IssuedKey) -> None:
    def call() -> Any:
        with OpenRouter(api_key=funded.key, server_url=stack.base_url) as sdk:
            return sdk.stt.create_transcription(
                input_audio={"data": b64(fixture("hello")), "format": "wav"},
                model="local/pocketsphinx-en",
                response_format="verbose_json",
            )

    result = await asyncio.to_thread(call)
    assert result.text == "hello world"
    assert result.usage.seconds == pytest.approx(HELLO_SECONDS)
    assert result.usage.cost == pytest.approx(0.000108)  # 1.075125 s x 0.0001, half-even
    assert result.task == "transcribe" and result.language == "en"
    assert result.words is None  # only with the word granularity


@pytest.mark.parametrize("fmt", sorted(ENCODINGS))
async def test_every_supported_container_decodes(stack: Stack, funded: IssuedKey, fmt: str) -> None:
    response = await transcribe_json(
        stack, funded, audio_body("local/pocketsphinx-en", encode(fmt), fmt)
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["text"] == "hello world"
    assert body["usage"]["seconds"] == pytest.approx(HELLO_SECONDS, abs=0.01)


async def test_duration_is_measured_not_taken_from_headers(stack: Stack, funded: IssuedKey) -> None:
    vbr = await transcribe_json(stack, funded, audio_body("fake/ok", vbr_mp3_without_xing(), "mp3"))
    assert vbr.status_code == 200, vbr.text
    assert vbr.json()["usage"]["seconds"] == pytest.approx(4.1, abs=0.02)
    streamed = await transcribe_json(stack, funded, audio_body("fake/ok", encode("webm"), "webm"))
    assert streamed.json()["usage"]["seconds"] == pytest.approx(HELLO_SECONDS, abs=0.01)


# --- routing and fallback -------------------------------------------------------------------


async def test_fallback_on_rate_limit_server_error_and_connection_failure(
    stack: Stack, funded: IssuedKey
) -> None:
    for model in ("fake/fallback-429", "fake/500-then-ok", "fake/down-then-ok"):
        response = await transcribe_json(stack, funded, audio_body(model))
        assert response.status_code == 200, (model, response.text)
        assert response.json()["text"] == "fake transcript"
        assert not any(h.lower().startswith("x-ratelimit") for h in response.headers)


async def test_every_provider_rate_limited_is_429_with_largest_retry_after(
    stack: Stack, funded: IssuedKey
) -> None:
    response = await transcribe_json(stack, funded, audio_body("fake/all-429"))
    assert response.status_code == 429
    assert response.headers["retry-after"] == "7"
    error = response.json()["error"]
    assert error["code"] == 429
    assert error["metadata"] == {"provider_name": "beta", "provider_code": "rate_limit_exceeded"}

    partial = await transcribe_json(stack, funded, audio_body("fake/429-partial-hint"))
    assert partial.status_code == 429
    assert "retry-after" not in partial.headers


async def test_a_provider_that_said_wait_is_not_called_until_then(
    stack: Stack, funded: IssuedKey
) -> None:
    first = await transcribe_json(stack, funded, audio_body("fake/cooling"))
    if first.status_code == 429:  # else an earlier run on this gateway cooled it already
        assert first.headers["retry-after"] == "120"
    cooling = await transcribe_json(stack, funded, audio_body("fake/cooling"))
    assert cooling.status_code == 503, cooling.text
    assert 1 <= int(cooling.headers["retry-after"]) <= 120
    assert "No available provider" in cooling.json()["error"]["message"]


@pytest.mark.parametrize(
    ("model", "status"),
    [
        ("fake/all-5xx", 502),
        ("fake/down", 502),
        ("fake/garbage", 502),
        ("fake/wrong-credential", 502),
        ("fake/overloaded", 529),
        ("fake/slow", 504),
        ("fake/no-credential", 503),
    ],
)
async def test_final_errors(stack: Stack, funded: IssuedKey, model: str, status: int) -> None:
    before = await key_usage(stack, funded)
    response = await transcribe_json(stack, funded, audio_body(model))
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == status
    assert "fake-provider-secret" not in response.text
    after = await key_usage(stack, funded)
    assert after["usage"] == before["usage"]  # nothing charged


async def test_client_errors_are_not_retried_elsewhere(stack: Stack, funded: IssuedKey) -> None:
    beta_calls = len(stack.fake_stt.calls_for("ok"))
    response = await transcribe_json(stack, funded, audio_body("fake/client-error"))
    assert response.status_code == 400
    assert "audio file is too short" in response.json()["error"]["message"]
    assert len(stack.fake_stt.calls_for("ok")) == beta_calls


async def test_only_the_serving_providers_options_are_forwarded(
    stack: Stack, funded: IssuedKey
) -> None:
    body = audio_body(
        "fake/echo-beta",
        language="en",
        temperature=0.2,
        prompt="names",
        provider={"options": {"alpha": {"secret_alpha": "no"}, "beta": {"beam_size": 5}}},
        session_id="sess-1",
        user="end-user-9",
        trace={"trace_id": "t-1", "custom": "x"},
    )
    response = await transcribe_json(stack, funded, body)
    assert response.status_code == 200, response.text
    received = json.loads(response.json()["text"])
    assert received["beam_size"] == ["5"]
    assert received["language"] == ["en"] and received["temperature"] == ["0.2"]
    assert "secret_alpha" not in received
    sent = json.dumps(received)
    for never in ("sess-1", "end-user-9", "t-1", "session_id", "trace"):
        assert never not in sent


async def test_verbose_json_from_an_openai_compatible_provider(
    stack: Stack, funded: IssuedKey
) -> None:
    response = await transcribe_json(
        stack,
        funded,
        audio_body("fake/ok", response_format="verbose_json", timestamp_granularities=["word"]),
    )
    body = response.json()
    assert body["task"] == "transcribe" and body["language"] == "english"
    assert body["duration"] == pytest.approx(HELLO_SECONDS)
    assert body["segments"][0]["avg_logprob"] == -0.2
    assert [w["word"] for w in body["words"]] == ["fake", "transcript"]
    plain = await transcribe_json(stack, funded, audio_body("fake/ok"))
    assert set(plain.json()) == {"text", "usage"}


async def test_verbose_json_on_a_model_that_cannot_is_400(stack: Stack, funded: IssuedKey) -> None:
    response = await transcribe_json(
        stack, funded, audio_body("fake/no-verbose", response_format="verbose_json")
    )
    assert response.status_code == 400
    assert response.json()["error"]["metadata"] == {"param": "response_format"}


async def test_provider_token_usage_is_reported(stack: Stack, funded: IssuedKey) -> None:
    usage = (await transcribe_json(stack, funded, audio_body("fake/tokens"))).json()["usage"]
    assert (usage["input_tokens"], usage["output_tokens"], usage["total_tokens"]) == (12, 3, 15)


# --- metering -------------------------------------------------------------------------------


async def test_cost_is_charged_once_and_recorded(stack: Stack, funded: IssuedKey) -> None:
    response = await transcribe_json(
        stack,
        funded,
        audio_body(
            "fake/pricey",
            session_id="body-session",
            user="u-1",
            trace={"trace_id": "tr", "span_name": "s", "team": "x"},
        ),
        headers={"x-session-id": "header-session"},
    )
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["cost"] == HELLO_SECONDS  # 1 USD per second
    status = await key_usage(stack, funded)
    assert status["usage"] == HELLO_SECONDS and status["usage_daily"] == HELLO_SECONDS
    async with stack.admin.sessions() as session:
        rows = (
            await session.exec(sa.select(Generation).where(Generation.key_hash == funded.hash))
        ).all()
        holds = (
            await session.exec(
                sa.select(sa.func.count())
                .select_from(CreditHold)
                .where(CreditHold.key_hash == funded.hash)
            )
        ).one()[0]
    (generation,) = [r[0] for r in rows]
    assert generation.status == "completed" and generation.provider == "fakeai"
    assert generation.cost_micros == 1_075_125 and generation.seconds == Decimal("1.075125")
    assert generation.session_id == "body-session"  # the body wins over x-session-id
    assert generation.user == "u-1" and generation.trace == {
        "trace_id": "tr",
        "span_name": "s",
        "team": "x",
    }
    assert generation.latency_ms is not None
    assert holds == 0


async def test_session_header_is_used_without_a_body_value(stack: Stack, funded: IssuedKey) -> None:
    await transcribe_json(stack, funded, audio_body("fake/ok"), headers={"x-session-id": "hdr"})
    async with stack.admin.sessions() as session:
        (generation,) = (
            await session.exec(
                sa.select(Generation.session_id).where(Generation.key_hash == funded.hash)
            )
        ).one()
    assert generation == "hdr"


async def test_402_when_credits_or_key_limit_cannot_cover(stack: Stack, unique: str) -> None:
    workspace = await stack.admin.workspace(f"poor-{unique}")
    broke = await stack.admin.key(workspace, "broke")
    for model in ("fake/ok", "fake/free:free"):  # a balance <= 0 refuses free models too
        response = await transcribe_json(stack, broke, audio_body(model))
        assert response.status_code == 402
        assert response.json()["error"]["metadata"] == {"limit_source": "openrouter_credits"}
    await stack.admin.credits(workspace, "1")
    too_dear = await transcribe_json(stack, broke, audio_body("fake/pricey"))  # 1.075 USD
    assert too_dear.status_code == 402
    assert too_dear.json()["error"]["metadata"] == {"limit_source": "openrouter_credits"}
    await stack.admin.credits(workspace, "5")
    capped = await stack.admin.key(workspace, "capped", limit="1")
    response = await transcribe_json(stack, capped, audio_body("fake/pricey"))
    assert response.status_code == 402
    assert response.json()["error"]["metadata"] == {"limit_source": "openrouter_key_limit"}
    assert (await key_usage(stack, capped))["usage"] == 0
    assert (await key_usage(stack, broke))["usage"] == 0
    # Refused free requests were not counted; spent down to zero, free models refuse again.
    assert (await key_usage(stack, broke))["free_model_daily_requests"]["used"] == 0
    free = await transcribe_json(stack, broke, audio_body("fake/free:free"))
    assert free.status_code == 200
    await stack.admin.charge(broke, "6")
    response = await transcribe_json(stack, broke, audio_body("fake/free:free"))
    assert response.status_code == 402
    assert response.json()["error"]["metadata"] == {"limit_source": "openrouter_credits"}
    assert (await key_usage(stack, broke))["free_model_daily_requests"]["used"] == 1


async def test_free_models_count_daily_requests(stack: Stack, funded: IssuedKey) -> None:
    response = await transcribe_json(stack, funded, audio_body("fake/free:free"))
    assert response.status_code == 200 and response.json()["usage"]["cost"] == 0
    assert (await key_usage(stack, funded))["free_model_daily_requests"]["used"] == 1


# --- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input_audio": {"data": b64(fixture()), "format": "wav"}}, "model"),
        ({"model": 5, "input_audio": {"data": b64(fixture()), "format": "wav"}}, "model"),
        ({"model": "nomodel", "input_audio": {"data": b64(fixture()), "format": "wav"}}, "model"),
        (
            {"model": "fake/unknown", "input_audio": {"data": b64(fixture()), "format": "wav"}},
            "model",
        ),
        ({"model": "fake/ok"}, "input_audio"),
        ({"model": "fake/ok", "input_audio": "abc"}, "input_audio"),
        (
            {"model": "fake/ok", "input_audio": {"data": "!!!notbase64", "format": "wav"}},
            "input_audio.data",
        ),
        (
            {"model": "fake/ok", "input_audio": {"data": b64(fixture()), "format": "midi"}},
            "input_audio.format",
        ),
        (
            {"model": "fake/ok", "input_audio": {"data": b64(b"\x00" * 4000), "format": "wav"}},
            "input_audio",
        ),
        ({**audio_body("fake/ok"), "session_id": "s" * 257}, "session_id"),
        ({**audio_body("fake/ok"), "user": "u" * 257}, "user"),
        ({**audio_body("fake/ok"), "temperature": "hot"}, "temperature"),
        ({**audio_body("fake/ok"), "response_format": "srt"}, "response_format"),
        ({**audio_body("fake/ok"), "timestamp_granularities": ["char"]}, "timestamp_granularities"),
        ({**audio_body("fake/ok"), "language": "english"}, "language"),
        ({**audio_body("fake/ok"), "trace": {"trace_id": 5}}, "trace.trace_id"),
    ],
)
async def test_bad_json_input_is_400_naming_the_field(
    stack: Stack, funded: IssuedKey, body: dict[str, Any], param: str
) -> None:
    before = len(stack.fake_stt.calls)
    response = await transcribe_json(stack, funded, body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["metadata"]["param"] == param
    assert len(stack.fake_stt.calls) == before
    assert (await key_usage(stack, funded))["usage"] == 0


async def test_session_id_of_256_characters_is_accepted(stack: Stack, funded: IssuedKey) -> None:
    response = await transcribe_json(
        stack, funded, {**audio_body("fake/ok"), "session_id": "s" * 256, "user": "u" * 256}
    )
    assert response.status_code == 200


async def test_bad_multipart_input(stack: Stack, funded: IssuedKey) -> None:
    url = f"{stack.base_url}/audio/transcriptions"
    async with httpx.AsyncClient(timeout=60) as client:
        no_file = await client.post(
            url, data={"model": "fake/ok"}, files={"x": ("a", b"1")}, headers=funded.headers
        )
        assert no_file.status_code == 400
        assert no_file.json()["error"]["metadata"] == {"param": "file"}
        no_model = await client.post(
            url, files={"file": ("a.wav", fixture())}, headers=funded.headers
        )
        assert no_model.json()["error"]["metadata"] == {"param": "model"}
        not_audio = await client.post(
            url,
            data={"model": "fake/ok"},
            files={"file": ("a.wav", b"hello" * 100)},
            headers=funded.headers,
        )
        assert not_audio.status_code == 400
        assert not_audio.json()["error"]["metadata"] == {"param": "file"}
        text = await client.post(
            url, content=b"model=x", headers={**funded.headers, "content-type": "text/plain"}
        )
        assert text.status_code == 400
        big = await client.post(
            url,
            data={"model": "fake/ok"},
            files={"file": ("a.wav", b"\x00" * 25_000_001)},
            headers=funded.headers,
        )
        assert big.status_code == 413
        assert big.json()["error"]["code"] == 413
    assert (await key_usage(stack, funded))["usage"] == 0


async def test_grpc_callers_get_the_generation_id_in_metadata(
    stack: Stack, funded: IssuedKey
) -> None:
    """Transcribe (the REST route's rpc) sends x-generation-id with its status, as trailing
    metadata (the facade makes it a header); the typed CreateTranscription sends it as
    initial metadata."""
    body = json.dumps(
        {"model": "fake/ok", "input_audio": {"data": b64(fixture()), "format": "wav"}}
    )
    async with grpc.aio.insecure_channel(stack.grpc_target) as channel:
        stub = audio_pb2_grpc.AudioStub(channel)
        raw = stub.Transcribe(
            iter([httpbody_pb2.HttpBody(content_type="application/json", data=body.encode())]),
            metadata=funded.metadata,
        )
        answer = json.loads((await raw).data)
        initial, trailing = dict(await raw.initial_metadata()), dict(await raw.trailing_metadata())
        typed = stub.CreateTranscription(
            audio_pb2.TranscriptionRequest(
                model="fake/ok", input_audio=audio_pb2.InputAudio(data=fixture(), format="wav")
            ),
            metadata=funded.metadata,
        )
        await typed
        typed_initial = dict(await typed.initial_metadata())
    assert answer["text"] and "x-generation-id" not in initial
    assert str(trailing["x-generation-id"]).startswith("gen_")
    assert str(typed_initial["x-generation-id"]).startswith("gen_")
    assert typed_initial["x-generation-id"] != trailing["x-generation-id"]


async def test_typed_grpc_transcription(stack: Stack, funded: IssuedKey) -> None:
    async with grpc.aio.insecure_channel(stack.grpc_target) as channel:
        stub = audio_pb2_grpc.AudioStub(channel)
        response = await stub.CreateTranscription(
            audio_pb2.TranscriptionRequest(
                model="local/pocketsphinx-en",
                input_audio=audio_pb2.InputAudio(data=fixture("door"), format="wav"),
                response_format="verbose_json",
                timestamp_granularities=["word"],
            ),
            metadata=funded.metadata,
        )
        assert response.text == "open the door"
        assert [w.word for w in response.words] == ["open", "the", "door"]
        assert response.usage.seconds == pytest.approx(1.1495)
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await stub.CreateTranscription(
                audio_pb2.TranscriptionRequest(model="fake/ok"), metadata=funded.metadata
            )
        assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
