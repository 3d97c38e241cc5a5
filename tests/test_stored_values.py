"""What a request stores must be storable: text without NUL and valid Unicode, finite numbers.
A value that is not is a 400 naming the field, before anything is held, sent to a provider or
charged (a NUL used to reach the provider and then fail the generation record's INSERT on
PostgreSQL, leaving its hold behind for 15 minutes)."""

from __future__ import annotations

import json
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf import struct_pb2

from server.contract import audio_pb2, audio_pb2_grpc, videos_pb2, videos_pb2_grpc
from server.db.models import CreditHold, Generation, LedgerEntry, VideoJob
from testkit.admin import IssuedKey
from testkit.audio import b64, fixture
from tests.conftest import Stack
from tests.test_grpc import _error_info

# The database is the point: on SQLite and PostgreSQL (see tests/conftest.py).
pytestmark = pytest.mark.both_backends

# Raw JSON text: `\\ud800` is the JSON escape of a lone surrogate, NaN is what Python's (and
# many clients') JSON writers emit for a float NaN.
NUL = '"a\\u0000b"'
SURROGATE = '"a\\ud800b"'

TRANSCRIPTION_CASES = [
    ('"session_id": ' + NUL, "session_id"),
    ('"session_id": ' + SURROGATE, "session_id"),
    ('"user": ' + NUL, "user"),
    ('"user": ' + SURROGATE, "user"),
    ('"trace": {"trace_name": ' + NUL + "}", "trace.trace_name"),
    ('"trace": {"metadata": {"deep": [1, ' + SURROGATE + "]}}", "trace.metadata.deep[1]"),
    ('"trace": {"score": NaN}', "trace.score"),
    ('"trace": {"nested": {"x": Infinity}}', "trace.nested.x"),
    ('"trace": {' + NUL + ": 1}", "trace"),
    ('"prompt": ' + NUL, "prompt"),
]


async def _nothing_happened(stack: Stack, issued: IssuedKey, provider_calls: int) -> None:
    account = issued.workspace.account_id
    assert len(stack.fake_stt.calls) == provider_calls, "the provider was called"
    assert await stack.admin.count(CreditHold, CreditHold.account_id == account) == 0
    assert await stack.admin.count(Generation, Generation.account_id == account) == 0
    assert await stack.admin.count(VideoJob, VideoJob.account_id == account) == 0
    charges = (LedgerEntry.account_id == account, LedgerEntry.kind == "charge")
    assert await stack.admin.count(LedgerEntry, *charges) == 0


@pytest.mark.parametrize(("member", "param"), TRANSCRIPTION_CASES)
async def test_transcription_json_refuses_unstorable_values(
    stack: Stack, funded: IssuedKey, member: str, param: str
) -> None:
    audio = json.dumps({"data": b64(fixture()), "format": "wav"})
    raw = '{"model": "fake/ok", "input_audio": ' + audio + ", " + member + "}"
    calls = len(stack.fake_stt.calls)
    async with httpx.AsyncClient(timeout=60) as client:
        response = await client.post(
            f"{stack.base_url}/audio/transcriptions",
            content=raw.encode(),
            headers={**funded.headers, "content-type": "application/json"},
        )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["metadata"] == {"param": param}
    await _nothing_happened(stack, funded, calls)
    # The key is not blocked by a leftover hold: the same request without it runs.
    async with httpx.AsyncClient(timeout=60) as client:
        ok = await client.post(
            f"{stack.base_url}/audio/transcriptions",
            json={"model": "fake/ok", "input_audio": json.loads(audio)},
            headers=funded.headers,
        )
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("name", ["session_id", "user", "prompt"])
async def test_transcription_multipart_refuses_nul(
    stack: Stack, funded: IssuedKey, name: str
) -> None:
    calls = len(stack.fake_stt.calls)
    async with httpx.AsyncClient(timeout=60) as client:
        response = await client.post(
            f"{stack.base_url}/audio/transcriptions",
            data={"model": "fake/ok", name: "a\x00b"},
            files={"file": ("hello.wav", fixture(), "audio/wav")},
            headers=funded.headers,
        )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["metadata"] == {"param": name}
    await _nothing_happened(stack, funded, calls)


VIDEO_CASES = [
    ('"session_id": ' + NUL, "session_id"),
    ('"user": ' + NUL, "user"),
    ('"prompt": ' + NUL, "prompt"),
    ('"trace": {"trace_name": ' + NUL + "}", "trace.trace_name"),
    ('"trace": {"metadata": {"deep": [1, ' + NUL + "]}}", "trace.metadata.deep[1]"),
]


@pytest.mark.parametrize(("member", "param"), VIDEO_CASES)
async def test_video_submit_refuses_unstorable_values(
    stack: Stack, funded: IssuedKey, member: str, param: str
) -> None:
    prompt = "" if member.startswith('"prompt"') else '"prompt": "x", '
    raw = '{"model": "local/renderer", "duration": 1, ' + prompt + member + "}"
    async with httpx.AsyncClient(timeout=60) as client:
        response = await client.post(
            f"{stack.base_url}/videos",
            content=raw.encode(),
            headers={**funded.headers, "content-type": "application/json"},
        )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["metadata"]["param"] == param
    await _nothing_happened(stack, funded, len(stack.fake_stt.calls))


@pytest.mark.parametrize("member", ['"user": ' + SURROGATE, '"trace": {"x": NaN}'])
async def test_video_submit_refuses_what_json_cannot_carry(
    stack: Stack, funded: IssuedKey, member: str
) -> None:
    """A lone surrogate or NaN in a POST /videos body is refused as a 400 (the facade's
    JSON parser, or the server), and nothing is stored or held."""
    raw = '{"model": "local/renderer", "prompt": "x", "duration": 1, ' + member + "}"
    async with httpx.AsyncClient(timeout=60) as client:
        response = await client.post(
            f"{stack.base_url}/videos",
            content=raw.encode(),
            headers={**funded.headers, "content-type": "application/json"},
        )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == 400
    await _nothing_happened(stack, funded, len(stack.fake_stt.calls))


async def _grpc_failure(stack: Stack, issued: IssuedKey, call: Any) -> grpc.aio.AioRpcError:
    async with grpc.aio.insecure_channel(stack.grpc_target) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await call(channel, (("authorization", f"Bearer {issued.key}"),))
    return failure.value


def _param(error: grpc.aio.AioRpcError) -> str:
    return _error_info(error).metadata["param"]


async def test_grpc_forms_refuse_nul_and_nan(stack: Stack, funded: IssuedKey) -> None:
    calls = len(stack.fake_stt.calls)
    audio = audio_pb2.InputAudio(data=fixture(), format="wav")
    nan_trace = struct_pb2.Struct()
    nan_trace.update({"score": float("nan")})
    cases: list[tuple[Any, str]] = [
        (audio_pb2.TranscriptionRequest(model="fake/ok", input_audio=audio, user="a\0"), "user"),
        (
            audio_pb2.TranscriptionRequest(model="fake/ok", input_audio=audio, trace=nan_trace),
            "trace.score",
        ),
    ]
    for message, param in cases:

        async def transcribe(channel: grpc.aio.Channel, metadata: Any, m: Any = message) -> Any:
            return await audio_pb2_grpc.AudioStub(channel).CreateTranscription(m, metadata=metadata)

        error = await _grpc_failure(stack, funded, transcribe)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
        assert _param(error) == param

    async def video(channel: grpc.aio.Channel, metadata: Any) -> Any:
        request = videos_pb2.CreateVideoRequest(
            model="local/renderer", prompt="x", duration=1, trace=nan_trace
        )
        return await videos_pb2_grpc.VideosStub(channel).CreateVideo(request, metadata=metadata)

    error = await _grpc_failure(stack, funded, video)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _param(error) == "trace.score"
    await _nothing_happened(stack, funded, calls)
