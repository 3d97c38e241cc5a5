"""CPU per provider call through the pooled httpx client, A/B: one OpenAI-compatible
transcription (`transcribe_form`, a 32 KB upload) against the fast fake provider
(bench/harness/stt.py, a process of its own), timed with this process's CPU clock, the
variants interleaved round by round so that the noise of a shared machine falls on all:
the adapter before issue 17; today's adapter and client on the gateway's transport
(server/providers/transport.py), on httpx's own (httpcore), and on aiohttp's pool and
parser under the same httpx client (httpx-aiohttp's transport); the same call on aiohttp's
client directly; and the floor — the same bytes on a bare asyncio stream. aiohttp and
httpx-aiohttp come with the `bench` extra.

    python -m bench.provider_call --rounds 8 --calls 400 --concurrency 1 --concurrency 16
"""

from __future__ import annotations

import argparse
import asyncio
import http.cookiejar
import json
import os
import re
import ssl
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from bench.harness.stt import UPSTREAM_MODEL, running_fake_provider
from server.providers.endpoint import Endpoint
from server.providers.http import (
    PROVIDER_LIMITS,
    PROVIDER_TIMEOUT,
    _RefuseCookies,
    authorized,
    multipart_form,
    provider_client,
    send,
)
from server.providers.openai_stt import MIME, OpenAISttAdapter, form_fields, parse
from server.providers.stt import SttCall, Transcript, reading_answer
from server.providers.transport import _head
from testkit.catalog import FAKE_KEY_ENV

AUDIO_BYTES = 32 * 1024
TIMEOUT, LIMITS = PROVIDER_TIMEOUT, PROVIDER_LIMITS


def httpx_client() -> httpx.AsyncClient:
    """The gateway's client on httpx's own transport (httpcore's pool, h11, anyio) instead
    of server/providers/transport.py."""
    return provider_client(ssl.create_default_context(), transport="httpx")


def aiohttp_transport_client() -> httpx.AsyncClient:
    """The gateway's client on aiohttp's pool and llhttp parser (httpx-aiohttp's transport
    under the one httpx client)."""
    return provider_client(ssl.create_default_context(), transport="aiohttp")


def before_client() -> httpx.AsyncClient:
    """The client build_core made before issue 17: httpx's own transport, a jar refusing
    each cookie by policy."""
    return httpx.AsyncClient(
        verify=ssl.create_default_context(),
        timeout=TIMEOUT,
        limits=LIMITS,
        follow_redirects=False,
        cookies=http.cookiejar.CookieJar(policy=_RefuseCookies()),
    )


def _form(call: SttCall) -> dict[str, str | list[str]]:
    """The fields as a dict, as transcribe_form gave them to httpx's encoder before."""
    form: dict[str, str | list[str]] = {}
    for name, value in form_fields(call):
        existing = form.get(name)
        if existing is None:
            form[name] = value
        else:
            form[name] = [*([existing] if isinstance(existing, str) else existing), value]
    return form


def _upload(http: httpx.AsyncClient, endpoint: Endpoint, call: SttCall) -> httpx.Request:
    """The transcription's request as transcribe_form built it before issue 17 (the URL
    parsed by httpx on every call), read."""
    request = http.build_request(
        "POST",
        f"{endpoint.base_url}/audio/transcriptions",
        data=_form(call),
        files={"file": (call.filename, call.audio, MIME.get(call.format, "audio/wav"))},
        headers=authorized(endpoint),
        timeout=endpoint.timeout_seconds,
    )
    request.read()
    return request


class BeforeAdapter(OpenAISttAdapter):
    """transcribe_form as it was before issue 17: the URL parsed by httpx on every call."""

    async def transcribe(self, endpoint: Endpoint, call: SttCall) -> Transcript:
        request = _upload(self._http, endpoint, call)
        response = await send(self._http, request)
        with reading_answer():
            return parse(response.json(), call.verbose)


def gateway_client() -> httpx.AsyncClient:
    """The client build_core makes now: server/providers/transport.py."""
    return provider_client(ssl.create_default_context())


class BareAdapter(OpenAISttAdapter):
    """The floor: the bytes the gateway's client sends for this call (built once by it),
    written on a bare asyncio stream, and the answer read by its Content-Length and parsed
    as the adapter does. No pool, no timeouts, no checks: what a provider call cannot go
    below in this process."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        super().__init__(http)
        self._payload: bytes | None = None
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def transcribe(self, endpoint: Endpoint, call: SttCall) -> Transcript:
        if self._payload is None:
            request = _upload(self._http, endpoint, call)
            self._payload = _head(request).head + request.content
        assert endpoint.base_url is not None
        url = httpx.URL(endpoint.base_url)
        if self._idle:
            reader, writer = self._idle.pop()
        else:
            reader, writer = await asyncio.open_connection(url.host, url.port)
        writer.write(self._payload)
        head = await reader.readuntil(b"\r\n\r\n")
        length = _CONTENT_LENGTH.search(head)
        assert length is not None
        body = await reader.readexactly(int(length.group(1)))
        self._idle.append((reader, writer))
        return parse(json.loads(body), call.verbose)

    async def close(self) -> None:
        for _, writer in self._idle:
            writer.close()


_CONTENT_LENGTH = re.compile(rb"(?i)\r\ncontent-length:\s*(\d+)")


class AiohttpAdapter(OpenAISttAdapter):
    """The same call (the same multipart bytes, credential and timeout) on aiohttp's own
    client: a ClientSession with the gateway's pool size, no cookies kept, the answer read
    and parsed as the adapter does."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        super().__init__(http)
        self._session: Any = None

    async def transcribe(self, endpoint: Endpoint, call: SttCall) -> Transcript:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=LIMITS.max_connections or 0, ssl=ssl.create_default_context()
                ),
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        content_type, body = multipart_form(
            form_fields(call), "file", call.filename, call.audio, MIME.get(call.format, "audio/wav")
        )
        async with self._session.post(
            f"{endpoint.base_url}/audio/transcriptions",
            data=body,
            headers={**authorized(endpoint), "Content-Type": content_type},
            timeout=aiohttp.ClientTimeout(total=endpoint.timeout_seconds),
            allow_redirects=False,
        ) as response:
            answer = await response.read()
            assert response.status == 200, response.status
        with reading_answer():
            return parse(json.loads(answer), call.verbose)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


VARIANTS: dict[str, tuple[Callable[[], httpx.AsyncClient], type[OpenAISttAdapter]]] = {
    "before": (before_client, BeforeAdapter),  # main before issue 17
    "httpx": (httpx_client, OpenAISttAdapter),  # today's adapter on httpx's own transport
    "gateway": (gateway_client, OpenAISttAdapter),  # today's adapter as build_core wires it
    # today's adapter and client on aiohttp's transport (httpx-aiohttp)
    "aiohttp-httpx": (aiohttp_transport_client, OpenAISttAdapter),
    "aiohttp": (gateway_client, AiohttpAdapter),  # the same call on aiohttp's own client
    "bare": (gateway_client, BareAdapter),  # the floor: the same bytes, a bare connection
}


async def _calls(
    adapter: OpenAISttAdapter, endpoint: Endpoint, call: SttCall, calls: int, concurrency: int
) -> float:
    """CPU seconds per call for `calls` transcriptions, `concurrency` at a time."""
    per_worker = calls // concurrency

    async def worker() -> None:
        for _ in range(per_worker):
            transcript = await adapter.transcribe(endpoint, call)
            assert transcript.text

    started = time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return (time.process_time() - started) / (per_worker * concurrency)


async def measure(
    base_url: str, variants: Sequence[str], rounds: int, calls: int, concurrency: int
) -> dict[str, list[float]]:
    endpoint = Endpoint(
        provider="fake",
        adapter="openai",
        base_url=base_url,
        api_key_env=FAKE_KEY_ENV,
    )
    call = SttCall(
        audio=os.urandom(AUDIO_BYTES), format="wav", filename="audio.wav", model=UPSTREAM_MODEL
    )
    clients = {name: VARIANTS[name][0]() for name in variants}
    adapters = {name: VARIANTS[name][1](clients[name]) for name in variants}
    results: dict[str, list[float]] = {name: [] for name in variants}
    try:
        for name in variants:  # warm up: connections open, code paths hot
            await _calls(adapters[name], endpoint, call, 2 * concurrency, concurrency)
        for round_ in range(rounds):
            order = list(variants) if round_ % 2 == 0 else list(reversed(variants))
            for name in order:
                results[name].append(
                    await _calls(adapters[name], endpoint, call, calls, concurrency)
                )
    finally:
        for adapter in adapters.values():
            if isinstance(adapter, BareAdapter | AiohttpAdapter):
                await adapter.close()
        for client in clients.values():
            await client.aclose()
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--concurrency", type=int, action="append")
    parser.add_argument("--variant", action="append", choices=sorted(VARIANTS))
    args = parser.parse_args(argv)
    variants = args.variant or list(VARIANTS)
    with running_fake_provider() as provider:
        os.environ[FAKE_KEY_ENV] = provider.api_key
        for concurrency in args.concurrency or [1, 16]:
            results = asyncio.run(
                measure(provider.base_url, variants, args.rounds, args.calls, concurrency)
            )
            print(f"concurrency {concurrency}, {args.calls} calls x {args.rounds} rounds:")
            base = results[variants[0]]
            for name in variants:
                median = statistics.median(results[name])
                # Paired: each round's ratio to the first variant in the same round.
                ratio = statistics.median(a / b for a, b in zip(results[name], base, strict=True))
                print(
                    f"  {name:>10}: {median * 1e6:7.1f} us CPU/call (median of rounds;"
                    f" min {min(results[name]) * 1e6:.1f}), x{ratio:.2f} paired"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
