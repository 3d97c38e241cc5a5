"""Worker-process pools (server.compute) and the local speech model on them: bounded,
refusing at once when full, surviving a crashed worker, and bounding each job's length."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from server.compute import ComputePool, PoolBusy, WorkerLost
from server.providers.endpoint import Endpoint
from server.providers.failures import CLIENT_ERROR, RATE_LIMITED, ProviderFailure
from server.providers.pocketsphinx_stt import PocketsphinxAdapter
from server.providers.stt import SttCall
from testkit.audio import fixture, speech

LOCAL = Endpoint(provider="local", adapter="pocketsphinx")


async def test_a_full_pool_refuses_at_once_and_frees_its_places() -> None:
    pool = ComputePool("test", workers=1, queue=1, retry_after=3)
    try:
        running = [asyncio.create_task(pool.run(time.sleep, 1.0)) for _ in range(2)]
        await asyncio.sleep(0)
        started = time.monotonic()
        with pytest.raises(PoolBusy) as busy:
            await pool.run(time.sleep, 0)
        assert time.monotonic() - started < 0.5
        assert busy.value.retry_after == 3
        await asyncio.gather(*running)
        assert pool.admitted == 0
        assert await pool.run(abs, -4) == 4
    finally:
        await pool.close()


async def test_a_crashed_worker_is_reported_and_the_pool_starts_again() -> None:
    pool = ComputePool("test", workers=1, queue=0)
    try:
        with pytest.raises(WorkerLost):
            await pool.run(os._exit, 3)
        assert await pool.run(abs, -2) == 2
    finally:
        await pool.close()


async def test_the_local_model_answers_rate_limited_when_its_queue_is_full() -> None:
    pool = ComputePool("local", workers=1, queue=0, retry_after=7)
    adapter = PocketsphinxAdapter(pool)
    call = SttCall(audio=fixture("door"), format="wav", filename="a.wav", model="en")
    try:
        first = asyncio.create_task(adapter.transcribe(LOCAL, call))
        await asyncio.sleep(0)
        with pytest.raises(ProviderFailure) as failure:
            await adapter.transcribe(LOCAL, call)
        assert failure.value.kind == RATE_LIMITED and failure.value.retry_after == 7
        assert (await first).text == "open the door"
    finally:
        await pool.close()


async def test_the_local_model_refuses_audio_longer_than_its_bound() -> None:
    pool = ComputePool("local", workers=1, queue=0)
    adapter = PocketsphinxAdapter(pool, max_seconds=2)
    call = SttCall(audio=speech(3), format="wav", filename="a.wav", model="en")
    try:
        with pytest.raises(ProviderFailure) as failure:
            await adapter.transcribe(LOCAL, call)
        assert failure.value.kind == CLIENT_ERROR
        assert "at most 2 seconds" in failure.value.message
    finally:
        await pool.close()


async def test_a_large_body_is_parsed_in_a_worker_process_and_its_refusal_comes_back() -> None:
    """Transcriber.parse hands a large REST body to the decoders: the parsed request (its
    audio bytes) and a refusal both cross the process boundary."""
    import base64
    import json

    from server.transcription.media import Refusal
    from server.transcription.request import from_http, from_http_in_worker

    audio = speech(40.0)
    body = json.dumps(
        {
            "model": "unit/ok",
            "input_audio": {"data": base64.b64encode(audio).decode(), "format": "wav"},
        }
    ).encode()
    pool = ComputePool("audio decoding", workers=1, queue=1)
    try:
        parsed = await pool.run(from_http_in_worker, body, "application/json", "s-9")
        assert parsed == from_http(body, "application/json", "s-9")
        refused = await pool.run(from_http_in_worker, body[:-2], "application/json", None)
        assert refused == Refusal(400, "The request body is not valid JSON", None)
    finally:
        await pool.close()
