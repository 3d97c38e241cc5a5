"""The `queue` adapter (server/providers/fal_video.py with QUEUE_SPEC) keeps the provider key on the
provider's API host: the result JSON is read with it, a video file on a CDN without it."""

from __future__ import annotations

import httpx
import pytest

from server.providers.endpoint import Endpoint
from server.providers.failures import INVALID_RESPONSE, ProviderFailure
from server.providers.fal_video import QUEUE_SPEC, FalVideoAdapter
from server.providers.http import Downloads
from server.providers.video import VideoCall
from tests.support.video_content import video_bytes

BASE = "https://queue.test/queue"
KEY = "queue-test-key"


async def lookup(host: str, port: int) -> list[str]:
    """The test's DNS: the CDN's name is a public address."""
    return {"cdn.example.com": ["93.184.216.34"]}.get(host, ["10.0.0.5"])


def adapter_with(video_url: str, seen: list[httpx.Request]) -> FalVideoAdapter:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        path = request.url.path
        if path.endswith("/status"):
            return httpx.Response(200, json={"status": "COMPLETED"})
        if path.startswith("/queue/m/requests/"):
            return httpx.Response(200, json={"video": {"url": video_url}})
        return httpx.Response(200, content=b"mp4-bytes")

    http = httpx.AsyncClient(transport=httpx.MockTransport(handle))
    return FalVideoAdapter(http, Downloads(http, lookup=lookup), spec=QUEUE_SPEC)


def endpoint() -> Endpoint:
    return Endpoint(provider="q", adapter="queue", base_url=BASE, api_key_env="TEST_QUEUE_KEY")


async def poll(video_url: str, seen: list[httpx.Request]) -> list[bytes]:
    progress = await adapter_with(video_url, seen).poll(
        endpoint(), "r1", VideoCall(model="m", params={"duration": 4})
    )
    return await video_bytes(progress.videos)


async def test_cdn_video_is_fetched_without_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_QUEUE_KEY", KEY)
    seen: list[httpx.Request] = []
    assert await poll("https://cdn.example.com/v/r1.mp4", seen) == [b"mp4-bytes"]
    by_host = {r.headers["host"]: r.headers.get("Authorization") for r in seen}
    assert by_host["queue.test"] == f"Bearer {KEY}"
    assert by_host["cdn.example.com"] is None


async def test_video_under_the_base_url_keeps_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_QUEUE_KEY", KEY)
    seen: list[httpx.Request] = []
    assert await poll(f"{BASE}/files/r1.mp4", seen) == [b"mp4-bytes"]
    assert seen[-1].url.path == "/queue/files/r1.mp4"
    assert seen[-1].headers["Authorization"] == f"Bearer {KEY}"


@pytest.mark.parametrize(
    "url", ["http://cdn.example.com/r1.mp4", "https://10.0.0.5/r1.mp4", "file:///etc/passwd"]
)
async def test_unsafe_video_urls_are_refused(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("TEST_QUEUE_KEY", KEY)
    seen: list[httpx.Request] = []
    with pytest.raises(ProviderFailure) as failure:
        await poll(url, seen)
    assert failure.value.kind == INVALID_RESPONSE
    assert all(r.url.host == "queue.test" for r in seen)
