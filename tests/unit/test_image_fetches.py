"""A client's image URL fetched for a provider that takes images inline (Veo), against
hosts that trickle or send too much (issue 29 item 4): the whole fetch has a deadline
(GATEWAY_VIDEO_IMAGE_FETCH_SECONDS) whatever its per-read timeouts, and a size bound
(GATEWAY_VIDEO_IMAGE_MAX_BYTES), read as it streams; each refusal is the client's fault."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from server.providers.failures import CLIENT_ERROR, ProviderFailure
from server.providers.http import ImageFetcher

URL = "https://127.0.0.1:8443/image.png"  # a literal address: allowed with allow_private
PNG = {"content-type": "image/png"}


async def _trickle(sent: list[int]) -> AsyncIterator[bytes]:
    for _ in range(400):  # 20 s at most: the deadline ends it long before
        await asyncio.sleep(0.05)
        sent.append(1)
        yield b"x"


async def _failure(images: ImageFetcher, timeout_seconds: float = 60) -> ProviderFailure:
    with pytest.raises(ProviderFailure) as failed:
        await images.inline(URL, timeout_seconds)
    return failed.value


async def test_a_trickling_image_host_fails_the_fetch_at_its_deadline() -> None:
    """Before: each byte arrived within the per-read timeout (the endpoint's), so a host
    sending a byte at a time held the fetch (and the job) for as long as it liked."""
    sent: list[int] = []
    transport = httpx.MockTransport(
        lambda r: httpx.Response(200, headers=PNG, content=_trickle(sent))
    )
    async with httpx.AsyncClient(transport=transport) as http:
        images = ImageFetcher(http, allow_private=True, seconds=0.5)
        started = time.monotonic()
        failure = await _failure(images)
    assert time.monotonic() - started < 2
    assert failure.kind == CLIENT_ERROR
    assert failure.message == "An image URL did not answer within 0.5 s"
    assert URL not in failure.message
    assert 0 < len(sent) < 40  # the body stopped being read at the deadline


async def test_an_image_past_max_bytes_is_refused_announced_or_streamed() -> None:
    served: list[str] = []

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(100):
            served.append("chunk")
            yield b"x" * 1000

    def host(request: httpx.Request) -> httpx.Response:
        if request.url.params.get("announced"):
            return httpx.Response(200, headers={**PNG, "content-length": "5001"}, content=chunks())
        return httpx.Response(200, headers=PNG, content=chunks())

    async with httpx.AsyncClient(transport=httpx.MockTransport(host)) as http:
        images = ImageFetcher(http, allow_private=True, max_bytes=5000)
        with pytest.raises(ProviderFailure) as announced:
            await images.inline(f"{URL}?announced=1", 10)
        assert served == []  # refused on its Content-Length, before the body
        streamed = await _failure(images, 10)
        assert len(served) == 6  # stopped at the first chunk past the bound
    for failure in (announced.value, streamed):
        assert failure.kind == CLIENT_ERROR
        assert failure.message == "An image is larger than the limit (5000 bytes)"


async def test_an_image_within_the_bounds_is_fetched_whole() -> None:
    transport = httpx.MockTransport(lambda r: httpx.Response(200, headers=PNG, content=b"\x89PNG"))
    async with httpx.AsyncClient(transport=transport) as http:
        image = await ImageFetcher(http, allow_private=True, max_bytes=4, seconds=5).inline(URL, 5)
    assert (image.data, image.mime_type) == (b"\x89PNG", "image/png")
