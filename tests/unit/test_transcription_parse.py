"""A REST transcription body is parsed where it cannot stall other requests
(Transcriber.parse): a small one on the event loop, a large one (JSON with base64 audio, or
multipart) in a decoder process — with the same result and the same refusals either way, a
full pool answered 503 with Retry-After, and a body that crashes the decoder twice refused."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from opentelemetry.trace import NoOpTracer

from server.compute import ComputePool, PoolBusy, WorkerLost
from server.errors import GatewayError
from server.transcription.request import from_http, from_http_in_worker
from server.transcription.transcriber import INLINE_PARSE_BYTES, Transcriber
from testkit.audio import speech
from testkit.domain import Domain

T = TypeVar("T")


class RecordingPool:
    """Runs jobs in this process (as testkit's InlinePool) and records which it was given;
    `fail` raises instead of running (a full pool, a crashed worker)."""

    def __init__(self, fail: list[BaseException] | None = None) -> None:
        self.jobs: list[Callable[..., Any]] = []
        self.fail = fail or []

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        self.jobs.append(fn)
        if self.fail:
            raise self.fail.pop(0)
        return fn(*args)


def transcriber(domain: Domain, pool: RecordingPool) -> Transcriber:
    decoder: ComputePool = pool  # type: ignore[assignment]
    return Transcriber(
        domain.catalog,
        {},
        domain.clock,
        domain.limits,
        domain.metrics,
        NoOpTracer(),
        decoder,
        writer=domain.writer,
    )


def json_body(audio: bytes, **fields: Any) -> bytes:
    return json.dumps(
        {
            "model": "unit/ok",
            "input_audio": {"data": base64.b64encode(audio).decode(), "format": "wav"},
            **fields,
        }
    ).encode()


LARGE_AUDIO = speech(40.0)  # 1.28 MB of WAV: its base64 JSON body is over INLINE_PARSE_BYTES


async def test_a_small_body_is_parsed_on_the_loop(domain: Domain) -> None:
    pool = RecordingPool()
    body = json_body(speech(1.0), language="en")
    assert len(body) <= INLINE_PARSE_BYTES
    parsed = await transcriber(domain, pool).parse(body, "application/json", "s-1")
    assert parsed == from_http(body, "application/json", "s-1")
    assert pool.jobs == []


async def test_a_large_body_is_parsed_in_a_decoder_process_with_the_same_result(
    domain: Domain,
) -> None:
    pool = RecordingPool()
    body = json_body(LARGE_AUDIO, language="en", temperature=0.2)
    assert len(body) > INLINE_PARSE_BYTES
    parsed = await transcriber(domain, pool).parse(body, "application/json", None)
    assert pool.jobs == [from_http_in_worker]
    assert parsed == from_http(body, "application/json", None)
    assert parsed.audio == LARGE_AUDIO


@pytest.mark.parametrize(
    "body, content_type",
    [
        (b"{" + b" " * (INLINE_PARSE_BYTES + 1), "application/json"),
        (json_body(LARGE_AUDIO)[:-3] + b"!}}", "application/json"),
        (json_body(LARGE_AUDIO, temperature="hot"), "application/json"),
        (json_body(LARGE_AUDIO), "text/plain"),
    ],
)
async def test_a_large_body_is_refused_as_a_small_one_would_be(
    domain: Domain, body: bytes, content_type: str
) -> None:
    with pytest.raises(GatewayError) as inline:
        from_http(body, content_type, None)
    pool = RecordingPool()
    with pytest.raises(GatewayError) as in_worker:
        await transcriber(domain, pool).parse(body, content_type, None)
    assert pool.jobs == [from_http_in_worker]
    assert (in_worker.value.status, in_worker.value.message, in_worker.value.metadata) == (
        inline.value.status,
        inline.value.message,
        inline.value.metadata,
    )


async def test_a_full_pool_is_503_with_retry_after(domain: Domain) -> None:
    pool = RecordingPool(fail=[PoolBusy("audio decoding", retry_after=4)])
    with pytest.raises(GatewayError) as busy:
        await transcriber(domain, pool).parse(json_body(LARGE_AUDIO), "application/json", None)
    assert busy.value.status == 503
    assert busy.value.retry_after_seconds == 4


async def test_a_body_that_crashes_the_decoder_is_tried_once_more_then_refused(
    domain: Domain,
) -> None:
    body = json_body(LARGE_AUDIO)
    once = RecordingPool(fail=[WorkerLost("lost")])
    parsed = await transcriber(domain, once).parse(body, "application/json", None)
    assert parsed.audio == LARGE_AUDIO and len(once.jobs) == 2
    twice = RecordingPool(fail=[WorkerLost("lost"), WorkerLost("lost")])
    with pytest.raises(GatewayError) as refused:
        await transcriber(domain, twice).parse(body, "application/json", None)
    assert refused.value.status == 400
    assert refused.value.message == "The request body could not be read"
