"""The gemini, vertex, kling and minimax video adapters against fakes of the providers'
documented protocols on loopback (tests/fakes/): request shapes, polling, the download,
and how each provider's failures map onto the routing rules' kinds."""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from server.clock import ManualClock, SystemClock
from server.config import VIDEO_IMAGE_MAX_BYTES as MAX_IMAGE_BYTES
from server.providers.endpoint import Endpoint
from server.providers.failures import (
    CLIENT_ERROR,
    INVALID_RESPONSE,
    OVERLOADED,
    RATE_LIMITED,
    REJECTED_CREDENTIALS,
    SERVER_ERROR,
    TIMEOUT,
    UNREACHABLE,
    ProviderFailure,
)
from server.providers.gemini_video import GeminiVideoAdapter
from server.providers.http import Downloads, ImageFetcher
from server.providers.kling_video import KlingVideoAdapter
from server.providers.minimax_video import MiniMaxVideoAdapter
from server.providers.vertex_video import ServiceAccountTokens, VertexVideoAdapter
from server.providers.video import VideoAdapter, VideoCall, VideoProgress
from tests.fakes import gemini_video, kling_video, minimax_video
from tests.fakes.gemini_video import FakeGemini
from tests.fakes.kling_video import FakeKling
from tests.fakes.minimax_video import FakeMiniMax
from tests.fakes.vertex_video import FakeVertex
from tests.fakes.video_loopback import VIDEO
from tests.support.catalog_offers import catalog_offers
from tests.support.video_content import video_bytes

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n fake image").decode()
DATA_URL = f"data:image/png;base64,{PNG}"


@pytest.fixture(scope="module")
def gemini() -> Iterator[FakeGemini]:
    fake = FakeGemini()
    fake.start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def vertex() -> Iterator[FakeVertex]:
    fake = FakeVertex()
    fake.start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def kling() -> Iterator[FakeKling]:
    fake = FakeKling()
    fake.start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def minimax() -> Iterator[FakeMiniMax]:
    fake = FakeMiniMax()
    fake.start()
    yield fake
    fake.stop()


@pytest_asyncio.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(follow_redirects=False) as client:  # as the Core's client
        yield client


def _call(model: str, prompt: str = "a lighthouse at dusk", **params: Any) -> VideoCall:
    options = params.pop("options", {})
    base = {
        "prompt": prompt,
        "duration": 8,
        "resolution": "720p",
        "aspect_ratio": "16:9",
        "width": 1280,
        "height": 720,
        "generate_audio": False,
        "frame_images": [],
        "input_references": [],
    }
    return VideoCall(model=model, params={**base, **params}, options=options)


async def _run(adapter: VideoAdapter, endpoint: Endpoint, call: VideoCall) -> VideoProgress:
    """Submit, then poll as the worker does until the job leaves `running`."""
    progress = await adapter.submit(endpoint, call)
    for _ in range(4):
        if progress.state != "running":
            return progress
        assert progress.provider_job_id
        progress = await adapter.poll(endpoint, progress.provider_job_id, call)
    return progress


async def _failure(adapter: VideoAdapter, endpoint: Endpoint, call: VideoCall) -> ProviderFailure:
    with pytest.raises(ProviderFailure) as caught:
        await _run(adapter, endpoint, call)
    return caught.value


# --- gemini -----------------------------------------------------------------------------------


def _gemini_endpoint(
    fake: FakeGemini, monkeypatch: pytest.MonkeyPatch, key: str = gemini_video.API_KEY
) -> Endpoint:
    monkeypatch.setenv("TEST_GEMINI_KEY", key)
    return Endpoint(
        "google-ai-studio",
        "gemini",
        fake.base_url,
        "TEST_GEMINI_KEY",
        model="veo-3.1-generate-preview",
    )


async def test_gemini_submits_polls_and_downloads_through_the_redirect(
    gemini: FakeGemini, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = _gemini_endpoint(gemini, monkeypatch)
    call = _call(
        "veo-3.1-generate-preview",
        seed=7,
        generate_audio=True,
        resolution="1080p",
        frame_images=[{"frame_type": "first_frame", "url": DATA_URL}],
        input_references=[
            {"type": "image_url", "url": DATA_URL},
            {"type": "video_url", "url": "https://example.com/clip.mp4"},
        ],
        options={"negativePrompt": "rain", "durationSeconds": 4},
    )
    progress = await _run(GeminiVideoAdapter(http), endpoint, call)
    assert progress.state == "completed", progress
    assert await video_bytes(progress.videos) == [VIDEO]
    body = gemini.submissions()[-1]
    (instance,) = body["instances"]
    assert instance["prompt"] == "a lighthouse at dusk"
    assert instance["image"] == {"bytesBase64Encoded": PNG, "mimeType": "image/png"}
    assert instance["referenceImages"] == [
        {"image": {"bytesBase64Encoded": PNG, "mimeType": "image/png"}, "referenceType": "asset"}
    ]
    # seed and generateAudio are Vertex-only: dropped; options become parameters.
    assert body["parameters"] == {
        "aspectRatio": "16:9",
        "resolution": "1080p",
        "durationSeconds": 8,
        "negativePrompt": "rain",
    }
    storage = [r for r in gemini.requests if r.path.startswith("/storage/")]
    assert storage and "x-goog-api-key" not in storage[-1].headers


async def test_gemini_every_combination_the_catalog_offers_is_accepted_or_refused_first(
    gemini: FakeGemini, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Veo on the Gemini API makes 1080p (and 4k) videos of 8 s only: the catalog's 1080p at 4
    or 6 s is refused here before any call; every other combination is accepted."""
    adapter = GeminiVideoAdapter(http)
    for resolution, ratio, duration, model in catalog_offers("gemini"):
        endpoint = dataclasses.replace(_gemini_endpoint(gemini, monkeypatch), model=model)
        call = _call(model, resolution=resolution, aspect_ratio=ratio, duration=duration)
        sent = len(gemini.submissions())
        if resolution == "1080p" and duration != 8:
            with pytest.raises(ProviderFailure) as refused:
                await adapter.submit(endpoint, call)
            assert refused.value.kind == CLIENT_ERROR
            assert refused.value.message == "Veo makes 1080p and 4k videos of 8 s only"
            assert len(gemini.submissions()) == sent
            continue
        await adapter.submit(endpoint, call)  # the fake refuses what the Gemini API does
        parameters = gemini.submissions()[-1]["parameters"]
        assert (parameters["resolution"], parameters["aspectRatio"]) == (resolution, ratio)
        assert parameters["durationSeconds"] == duration


@pytest.mark.parametrize(
    ("prompt", "kind", "retry_after"),
    [
        ("ratelimit please", RATE_LIMITED, 17),
        ("refuse this", CLIENT_ERROR, None),
        ("servererror", SERVER_ERROR, None),
        ("garbage", INVALID_RESPONSE, None),
    ],
)
async def test_gemini_failures_map_to_routing_kinds(
    gemini: FakeGemini,
    http: httpx.AsyncClient,
    monkeypatch: pytest.MonkeyPatch,
    prompt: str,
    kind: str,
    retry_after: int | None,
) -> None:
    failure = await _failure(
        GeminiVideoAdapter(http), _gemini_endpoint(gemini, monkeypatch), _call("veo", prompt)
    )
    assert (failure.kind, failure.retry_after) == (kind, retry_after)


async def test_gemini_bad_key_operation_error_and_filtered_result(
    gemini: FakeGemini, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    adapter = GeminiVideoAdapter(http)
    refused = await _failure(adapter, _gemini_endpoint(gemini, monkeypatch, "wrong"), _call("veo"))
    assert refused.kind == REJECTED_CREDENTIALS and "wrong" not in refused.message
    endpoint = _gemini_endpoint(gemini, monkeypatch)
    failed = await _run(adapter, endpoint, _call("veo", "fail"))
    assert (failed.state, failed.error) == ("failed", "Provider failed: Video generation failed.")
    filtered = await _run(adapter, endpoint, _call("veo", "filtered"))
    assert filtered.state == "failed" and "content filtered" in str(filtered.error)
    # Image URLs the gateway will not fetch: plain http, and a private address.
    for url in ("http://images.example/a.png", "https://127.0.0.1:9/a.png"):
        web_image = _call("veo", frame_images=[{"frame_type": "first_frame", "url": url}])
        failure = await _failure(adapter, endpoint, web_image)
        assert failure.kind == CLIENT_ERROR and url not in failure.message


def _image_host(request: httpx.Request) -> httpx.Response:
    """An image host at a (test-allowed) literal address, as the fetcher pins it."""
    assert request.headers["host"] == "127.0.0.1:8443" and not request.headers.get("x-goog-api-key")
    if request.url.path == "/big.png":
        return httpx.Response(
            200, content=b"x" * (MAX_IMAGE_BYTES + 1), headers={"content-type": "image/png"}
        )
    if request.url.path == "/page.html":
        return httpx.Response(200, content=b"<html>", headers={"content-type": "text/html"})
    return httpx.Response(200, content=b"\x89PNG fetched", headers={"content-type": "image/png"})


async def test_gemini_fetches_https_images_inline_and_refuses_bad_ones(
    gemini: FakeGemini, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with httpx.AsyncClient(transport=httpx.MockTransport(_image_host)) as image_http:
        images = ImageFetcher(image_http, allow_private=True)
        adapter = GeminiVideoAdapter(http, images)
        endpoint = _gemini_endpoint(gemini, monkeypatch)
        frames = [{"frame_type": "last_frame", "url": "https://127.0.0.1:8443/frame.png"}]
        assert (
            await _run(adapter, endpoint, _call("veo", frame_images=frames))
        ).state == "completed"
        image = gemini.submissions()[-1]["instances"][0]["lastFrame"]
        assert base64.b64decode(image["bytesBase64Encoded"]) == b"\x89PNG fetched"
        assert image["mimeType"] == "image/png"
        for path in ("/big.png", "/page.html"):
            url = f"https://127.0.0.1:8443{path}"
            frames = [{"frame_type": "first_frame", "url": url}]
            assert (
                await _failure(adapter, endpoint, _call("veo", frame_images=frames))
            ).kind == CLIENT_ERROR


# --- vertex -----------------------------------------------------------------------------------


def _vertex_endpoint(fake: FakeVertex, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Endpoint:
    key_file = fake.write_service_account(tmp_path / "service-account.json")
    monkeypatch.setenv("TEST_VERTEX_CREDENTIALS", str(key_file))
    return Endpoint(
        "google-vertex",
        "vertex",
        fake.base_url,
        "TEST_VERTEX_CREDENTIALS",
        model="veo-3.1-generate-001",
    )


async def test_vertex_every_combination_the_catalog_offers_is_accepted(
    vertex: FakeVertex, http: httpx.AsyncClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    adapter = VertexVideoAdapter(http)
    for resolution, ratio, duration, model in catalog_offers("vertex"):
        endpoint = dataclasses.replace(_vertex_endpoint(vertex, tmp_path, monkeypatch), model=model)
        call = _call(model, resolution=resolution, aspect_ratio=ratio, duration=duration)
        progress = await adapter.submit(endpoint, call)  # the fake refuses what Vertex does
        assert progress.state == "running", (model, resolution, ratio, duration)


async def test_vertex_mints_a_token_once_and_returns_inline_videos(
    vertex: FakeVertex, http: httpx.AsyncClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = _vertex_endpoint(vertex, tmp_path, monkeypatch)
    minted = len(vertex.tokens)
    adapter = VertexVideoAdapter(http)
    call = _call(
        "veo-3.1-generate-001",
        seed=7,
        generate_audio=True,
        # A client's options cannot ask for more videos or name a bucket.
        options={"personGeneration": "allow_adult", "sampleCount": 4, "storageUri": "gs://x"},
    )
    progress = await _run(adapter, endpoint, call)
    assert (progress.state, await video_bytes(progress.videos)) == ("completed", [VIDEO])
    again = await _run(adapter, endpoint, call)
    assert again.state == "completed"
    assert len(vertex.tokens) == minted + 1  # one token for two jobs (submit + 2 polls each)
    parameters = vertex.submissions()[-1]["parameters"]
    assert parameters == {
        "aspectRatio": "16:9",
        "resolution": "720p",
        "durationSeconds": 8,
        "sampleCount": 1,
        "generateAudio": True,
        "seed": 7,
        "personGeneration": "allow_adult",
    }


async def test_vertex_refreshes_an_expiring_token_and_downloads_gcs_results(
    vertex: FakeVertex, http: httpx.AsyncClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = _vertex_endpoint(vertex, tmp_path, monkeypatch)
    tokens = ServiceAccountTokens()
    adapter = VertexVideoAdapter(
        http, tokens, storage_base=vertex.origin, storage_uri="gs://veo-out/jobs"
    )
    call = _call("veo-3.1-generate-001")
    progress = await _run(adapter, endpoint, call)
    assert (progress.state, await video_bytes(progress.videos)) == ("completed", [VIDEO])
    assert vertex.storage_paths()[-1].startswith("/storage/v1/b/veo-out/o/jobs/")
    minted = len(vertex.tokens)
    # google-auth refreshes a token close to its expiry: make it so.
    credentials = next(iter(tokens._credentials.values()))
    credentials.expiry = datetime.now(UTC).replace(tzinfo=None) + timedelta(seconds=30)
    await adapter.submit(endpoint, _call("veo-3.1-generate-001"))
    assert len(vertex.tokens) == minted + 1


@pytest.mark.parametrize(
    ("prompt", "kind", "retry_after"),
    [
        ("ratelimit", RATE_LIMITED, 23),
        ("refuse", CLIENT_ERROR, None),
        ("servererror", OVERLOADED, None),
        ("garbage", INVALID_RESPONSE, None),
    ],
)
async def test_vertex_failures_map_to_routing_kinds(
    vertex: FakeVertex,
    http: httpx.AsyncClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    prompt: str,
    kind: str,
    retry_after: int | None,
) -> None:
    endpoint = _vertex_endpoint(vertex, tmp_path, monkeypatch)
    failure = await _failure(VertexVideoAdapter(http), endpoint, _call("veo", prompt))
    assert (failure.kind, failure.retry_after) == (kind, retry_after)


async def test_vertex_refused_or_missing_service_account_and_failed_operation(
    vertex: FakeVertex, http: httpx.AsyncClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = _vertex_endpoint(vertex, tmp_path, monkeypatch)
    adapter = VertexVideoAdapter(http)
    failed = await _run(adapter, endpoint, _call("veo", "fail"))
    assert (failed.state, failed.error) == (
        "failed",
        "Provider failed: Unable to generate the video.",
    )
    # A key file whose key the token endpoint does not know: Google refuses the grant.
    other = FakeVertex()
    other.server = vertex.server  # the same token_uri, another RSA key
    foreign = other.write_service_account(tmp_path / "foreign.json")
    monkeypatch.setenv("TEST_VERTEX_CREDENTIALS", str(foreign))
    assert (await _failure(adapter, endpoint, _call("veo"))).kind == REJECTED_CREDENTIALS
    # The key's JSON itself (a workspace's own key) serves as well as its path.
    monkeypatch.setenv("TEST_VERTEX_CREDENTIALS", (tmp_path / "service-account.json").read_text())
    assert (await _run(adapter, endpoint, _call("veo"))).state == "completed"
    monkeypatch.setenv("TEST_VERTEX_CREDENTIALS", str(tmp_path / "missing.json"))
    missing = await _failure(adapter, endpoint, _call("veo"))
    assert missing.kind == REJECTED_CREDENTIALS and "missing.json" not in missing.message


# --- kling ------------------------------------------------------------------------------------


def _kling_endpoint(
    fake: FakeKling, monkeypatch: pytest.MonkeyPatch, secret: str = kling_video.SECRET_KEY
) -> Endpoint:
    monkeypatch.setenv("TEST_KLING_ACCESS", kling_video.ACCESS_KEY)
    monkeypatch.setenv("TEST_KLING_SECRET", secret)
    return Endpoint(
        "kling",
        "kling",
        fake.base_url,
        "TEST_KLING_ACCESS",
        "TEST_KLING_SECRET",
        model="kling-v2-1-master",
    )


async def test_kling_text_to_video_with_a_signed_jwt(
    kling: FakeKling, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = _kling_endpoint(kling, monkeypatch)
    call = _call(
        "kling-v2-1-master",
        duration=5,
        seed=3,
        aspect_ratio="9:16",
        options={"cfg_scale": 0.7, "model_name": "kling-pricier", "callback_url": "https://x.test"},
    )
    progress = await _run(KlingVideoAdapter(http, SystemClock()), endpoint, call)
    assert (progress.state, await video_bytes(progress.videos), progress.seconds) == (
        "completed",
        [VIDEO],
        5.04,
    )
    assert progress.provider_job_id and progress.provider_job_id.startswith("text2video/")
    kind, body = kling.submissions()[-1]
    assert kind == "text2video"
    assert body == {
        "model_name": "kling-v2-1-master",
        "prompt": "a lighthouse at dusk",
        "duration": "5",
        "mode": "std",
        "aspect_ratio": "9:16",
        "cfg_scale": 0.7,
    }
    claims = kling.claims[-1]
    assert claims["iss"] == kling_video.ACCESS_KEY and claims["exp"] - claims["nbf"] == 1805


async def test_kling_frames_go_to_image2video_as_raw_base64(
    kling: FakeKling, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = _kling_endpoint(kling, monkeypatch)
    frames = [
        {"frame_type": "first_frame", "url": "https://example.com/first.png"},
        {"frame_type": "last_frame", "url": DATA_URL},
    ]
    call = _call("kling-v2-1-master", duration=10, resolution="1080p", frame_images=frames)
    progress = await _run(KlingVideoAdapter(http, SystemClock()), endpoint, call)
    assert progress.state == "completed"
    kind, body = kling.submissions()[-1]
    assert kind == "image2video" and "aspect_ratio" not in body
    assert (body["image"], body["image_tail"], body["mode"]) == (
        "https://example.com/first.png",
        PNG,
        "pro",
    )


async def test_kling_every_ratio_and_duration_the_catalog_offers_is_accepted(
    kling: FakeKling, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    adapter = KlingVideoAdapter(http, SystemClock())
    for resolution, ratio, duration, model in catalog_offers("kling"):
        endpoint = dataclasses.replace(_kling_endpoint(kling, monkeypatch), model=model)
        call = _call(model, resolution=resolution, aspect_ratio=ratio, duration=duration)
        await adapter.submit(endpoint, call)  # the fake refuses what Kling does
        _, body = kling.submissions()[-1]
        assert (body["aspect_ratio"], body["duration"]) == (ratio, str(duration))
        assert body["mode"] == ("pro" if resolution == "1080p" else "std")


@pytest.mark.parametrize(
    ("prompt", "kind", "code"),
    [
        ("ratelimit", RATE_LIMITED, 1302),
        ("refuse", CLIENT_ERROR, 1301),
        ("servererror", SERVER_ERROR, 5000),
        ("garbage", INVALID_RESPONSE, None),
    ],
)
async def test_kling_codes_map_to_routing_kinds(
    kling: FakeKling,
    http: httpx.AsyncClient,
    monkeypatch: pytest.MonkeyPatch,
    prompt: str,
    kind: str,
    code: int | None,
) -> None:
    endpoint = _kling_endpoint(kling, monkeypatch)
    failure = await _failure(
        KlingVideoAdapter(http, SystemClock()), endpoint, _call("k", prompt, duration=5)
    )
    assert failure.kind == kind
    if code is not None:
        assert failure.provider_code == code


async def test_kling_refused_tokens_and_failed_tasks(
    kling: FakeKling, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong_secret = _kling_endpoint(kling, monkeypatch, "not-the-secret-but-32-characters-long")
    adapter = KlingVideoAdapter(http, SystemClock())
    failure = await _failure(adapter, wrong_secret, _call("k", duration=5))
    assert (failure.kind, failure.provider_code) == (REJECTED_CREDENTIALS, 1002)
    endpoint = _kling_endpoint(kling, monkeypatch)
    stale_clock = ManualClock(datetime.now(UTC) - timedelta(hours=2))  # the token has expired
    failure = await _failure(KlingVideoAdapter(http, stale_clock), endpoint, _call("k", duration=5))
    assert (failure.kind, failure.provider_code) == (REJECTED_CREDENTIALS, 1004)
    failed = await _run(adapter, endpoint, _call("k", "fail", duration=5))
    assert (failed.state, failed.error) == (
        "failed",
        "Provider failed: Failure to pass the risk control system",
    )


# --- minimax ----------------------------------------------------------------------------------


def _minimax_endpoint(
    fake: FakeMiniMax, monkeypatch: pytest.MonkeyPatch, key: str = minimax_video.API_KEY
) -> Endpoint:
    monkeypatch.setenv("TEST_MINIMAX_KEY", key)
    return Endpoint(
        "minimax", "minimax", fake.base_url, "TEST_MINIMAX_KEY", model="MiniMax-Hailuo-02"
    )


async def test_minimax_creates_queries_retrieves_and_downloads(
    minimax: FakeMiniMax, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = _minimax_endpoint(minimax, monkeypatch)
    call = _call(
        "MiniMax-Hailuo-02",
        duration=6,
        resolution="768p",
        seed=4,
        frame_images=[{"frame_type": "first_frame", "url": DATA_URL}],
        options={"prompt_optimizer": False, "model": "other", "duration": 10},
    )
    progress = await _run(MiniMaxVideoAdapter(http), endpoint, call)
    assert (progress.state, await video_bytes(progress.videos)) == ("completed", [VIDEO])
    assert minimax.submissions()[-1] == {
        "model": "MiniMax-Hailuo-02",
        "prompt": "a lighthouse at dusk",
        "duration": 6,
        "resolution": "768P",
        "first_frame_image": DATA_URL,
        "prompt_optimizer": False,
    }


async def test_minimax_every_combination_the_catalog_offers_is_accepted_or_refused_first(
    minimax: FakeMiniMax, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hailuo makes 10 s videos at 768P only: the catalog's 1080p x 10 s is refused here, before
    any call, with what MiniMax would say; every other combination is a request it accepts."""
    adapter = MiniMaxVideoAdapter(http)
    for resolution, _, duration, model in catalog_offers("minimax"):
        endpoint = dataclasses.replace(_minimax_endpoint(minimax, monkeypatch), model=model)
        call = _call(model, resolution=resolution, duration=duration)
        sent = len(minimax.submissions())
        if (resolution, duration) == ("1080p", 10):
            with pytest.raises(ProviderFailure) as refused:
                await adapter.submit(endpoint, call)
            assert refused.value.kind == CLIENT_ERROR
            assert refused.value.message == "MiniMax makes 1080P videos of 6 s only"
            assert len(minimax.submissions()) == sent
            continue
        await adapter.submit(endpoint, call)  # the fake refuses what MiniMax does
        body = minimax.submissions()[-1]
        assert (body["resolution"], body["duration"]) == (resolution.upper(), duration)


@pytest.mark.parametrize(
    ("key", "prompt", "kind", "code"),
    [
        ("wrong", "a cat", REJECTED_CREDENTIALS, 1004),
        (minimax_video.API_KEY, "ratelimit", RATE_LIMITED, 1002),
        (minimax_video.API_KEY, "refuse", CLIENT_ERROR, 1026),
        (minimax_video.API_KEY, "servererror", SERVER_ERROR, 500),
        (minimax_video.API_KEY, "garbage", INVALID_RESPONSE, None),
    ],
)
async def test_minimax_base_resp_codes_map_to_routing_kinds(
    minimax: FakeMiniMax,
    http: httpx.AsyncClient,
    monkeypatch: pytest.MonkeyPatch,
    key: str,
    prompt: str,
    kind: str,
    code: int | None,
) -> None:
    endpoint = _minimax_endpoint(minimax, monkeypatch, key)
    failure = await _failure(MiniMaxVideoAdapter(http), endpoint, _call("m", prompt, duration=6))
    assert (failure.kind, failure.provider_code) == (kind, code)
    assert "wrong" not in failure.message


async def test_minimax_failed_task_fails_the_job(
    minimax: FakeMiniMax, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = _minimax_endpoint(minimax, monkeypatch)
    failed = await _run(MiniMaxVideoAdapter(http), endpoint, _call("m", "fail", duration=6))
    assert (failed.state, failed.error) == ("failed", "Provider failed: output video new_sensitive")


# --- transport failures (shared by the four) --------------------------------------------------


def _raising(exc: Exception) -> httpx.AsyncClient:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


@pytest.mark.parametrize(
    ("exc", "kind"),
    [(httpx.ReadTimeout("slow"), TIMEOUT), (httpx.ConnectError("refused"), UNREACHABLE)],
)
async def test_timeouts_and_unreachable_providers(
    monkeypatch: pytest.MonkeyPatch, exc: Exception, kind: str
) -> None:
    monkeypatch.setenv("TEST_KEY", "k")
    monkeypatch.setenv("TEST_SECRET", "s" * 32)
    async with _raising(exc) as client:
        adapters: list[VideoAdapter] = [
            GeminiVideoAdapter(client),
            KlingVideoAdapter(client, SystemClock()),
            MiniMaxVideoAdapter(client),
        ]
        for adapter in adapters:
            endpoint = Endpoint(
                "p", "x", "http://provider.test", "TEST_KEY", "TEST_SECRET", model="m"
            )
            failure = await _failure(adapter, endpoint, _call("m", duration=5))
            assert failure.kind == kind, adapter


async def test_vertex_without_a_project_in_its_base_url_uses_the_service_accounts(
    vertex: FakeVertex, http: httpx.AsyncClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The built-in catalog's base URL names no project: the key file's project_id, in the
    # default location (the fake serves that project in that location).
    endpoint = dataclasses.replace(
        _vertex_endpoint(vertex, tmp_path, monkeypatch), base_url=f"{vertex.origin}/v1"
    )
    progress = await _run(VertexVideoAdapter(http), endpoint, _call("veo-3.1-generate-001"))
    assert (progress.state, await video_bytes(progress.videos)) == ("completed", [VIDEO])


# --- result URLs off the provider's host ------------------------------------------------------

INSIDE = "https://storage.inside.test/out.mp4"  # a name that resolves inside the gateway


async def _inside_lookup(host: str, port: int) -> list[str]:
    assert host == "storage.inside.test"
    return ["10.0.0.7"]


def _answers_with_inside_url(request: httpx.Request) -> httpx.Response:
    """Kling's and MiniMax's documented answers for a finished task, naming INSIDE."""
    assert request.url.host == "provider.test", "the result URL must not be fetched"
    path = request.url.path
    if path.startswith("/v1/videos/text2video/"):  # Kling: query task
        result = {"videos": [{"id": "v1", "url": INSIDE, "duration": "5"}]}
        data = {"task_id": "t1", "task_status": "succeed", "task_result": result}
        return httpx.Response(200, json={"code": 0, "message": "SUCCEED", "data": data})
    ok = {"status_code": 0, "status_msg": "success"}
    if path == "/v1/query/video_generation":  # MiniMax: query, then retrieve the file
        return httpx.Response(
            200, json={"task_id": "t1", "status": "Success", "file_id": 7, "base_resp": ok}
        )
    assert path == "/v1/files/retrieve"
    return httpx.Response(
        200, json={"file": {"file_id": 7, "download_url": INSIDE}, "base_resp": ok}
    )


@pytest.mark.parametrize("name", ["kling", "minimax"])
async def test_a_result_url_that_resolves_inside_is_not_downloaded(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_KEY", "k")
    monkeypatch.setenv("TEST_SECRET", "s" * 32)
    endpoint = Endpoint("p", name, "https://provider.test", "TEST_KEY", "TEST_SECRET", model="m")
    async with httpx.AsyncClient(transport=httpx.MockTransport(_answers_with_inside_url)) as client:
        downloads = Downloads(client, lookup=_inside_lookup)
        adapter: VideoAdapter = (
            KlingVideoAdapter(client, SystemClock(), downloads)
            if name == "kling"
            else MiniMaxVideoAdapter(client, downloads)
        )
        job_id = "text2video/t1" if name == "kling" else "t1"
        progress = await adapter.poll(endpoint, job_id, _call("m", duration=5))
        with pytest.raises(ProviderFailure) as failed:  # refused when it is fetched
            await video_bytes(progress.videos)
    assert failed.value.kind == INVALID_RESPONSE
