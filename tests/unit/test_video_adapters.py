"""The seedance, dashscope, fal and replicate video adapters against fakes of their providers
written from the providers' documentation (tests/fakes/), in-process over httpx.MockTransport:
the request each sends, polling to the fake's MP4, failure mapping, cancel."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from server.providers.dashscope_video import FIRST_AND_LAST_FRAME_PATH, DashScopeVideoAdapter
from server.providers.endpoint import Endpoint
from server.providers.failures import (
    CLIENT_ERROR,
    INVALID_RESPONSE,
    RATE_LIMITED,
    REJECTED_CREDENTIALS,
    SERVER_ERROR,
    TIMEOUT,
    UNREACHABLE,
    ProviderFailure,
)
from server.providers.fal_video import QUEUE_SPEC, FalVideoAdapter
from server.providers.http import Downloads
from server.providers.openai_video import OpenAIVideoAdapter
from server.providers.replicate_video import ReplicateVideoAdapter
from server.providers.seedance_video import SeedanceVideoAdapter
from server.providers.video import VideoAdapter, VideoCall, VideoProgress
from server.videos.options import size_of
from server.webhooks.targets import dns_lookup
from testkit.fakes.video_providers import VIDEO
from tests.fakes import dashscope, fal, replicate, seedance
from tests.support.catalog_offers import catalog_offers
from tests.support.video_content import download, video_bytes

FAL_CDN = "https://v3.fal.test"
# The test's DNS: fal's CDN is a public address, another name resolves inside the gateway's
# network; other names (localhost, literal addresses) as the system resolves them.
DNS = {"v3.fal.test": ["93.184.216.34"], "cdn.inside.test": ["10.0.0.7"]}


async def lookup(host: str, port: int) -> list[str]:
    return DNS[host] if host in DNS else await dns_lookup(host, port)


@dataclass
class Fakes:
    seedance: seedance.FakeSeedance
    dashscope: dashscope.FakeDashScope
    fal: fal.FakeFal
    replicate: replicate.FakeReplicate

    def routes(self) -> dict[str, Callable[[httpx.Request], httpx.Response]]:
        return {
            "ark.test": self.seedance.handle,
            "dashscope.test": self.dashscope.handle,
            "queue.fal.test": self.fal.handle,
            "v3.fal.test": self.fal.handle,
            "api.replicate.test": self.replicate.handle,
        }

    def of(self, name: str) -> Any:
        return getattr(self, name)

    def transport(self, broken: bool = False) -> httpx.MockTransport:
        routes = self.routes()

        def handle(request: httpx.Request) -> httpx.Response:
            if broken:
                raise httpx.ReadTimeout("timed out", request=request)
            # By name: a download to a checked address keeps the name in Host.
            return routes[request.headers["host"]](request)

        return httpx.MockTransport(handle)


@dataclass(frozen=True)
class Provider:
    adapter: str
    base_url: str
    key_env: str
    key: str
    adapter_class: Callable[[httpx.AsyncClient, Downloads], Any]
    model: Callable[[str], str]  # a fake's script name -> the provider model name
    seconds: float | None  # the output length the provider reports

    def make(self, http: httpx.AsyncClient) -> Any:
        return self.adapter_class(http, Downloads(http, lookup=lookup))

    def endpoint(self, script: str) -> Endpoint:
        return Endpoint(
            provider=self.adapter,
            adapter=self.adapter,
            base_url=self.base_url,
            api_key_env=self.key_env,
            model=self.model(script),
        )


PROVIDERS = {
    "seedance": Provider(
        "seedance",
        "https://ark.test/api/v3",
        "TEST_ARK_API_KEY",
        seedance.API_KEY,
        SeedanceVideoAdapter,
        lambda script: script,
        seedance.OUTPUT_SECONDS,
    ),
    "dashscope": Provider(
        "dashscope",
        "https://dashscope.test/api/v1",
        "TEST_DASHSCOPE_API_KEY",
        dashscope.API_KEY,
        DashScopeVideoAdapter,
        lambda script: script,
        dashscope.OUTPUT_SECONDS,
    ),
    "fal": Provider(
        "fal",
        "https://queue.fal.test",
        "TEST_FAL_KEY",
        fal.API_KEY,
        FalVideoAdapter,
        lambda script: f"fal-ai/test-video/v2/master/{script}",  # a model id with a sub-path
        None,
    ),
    "replicate": Provider(
        "replicate",
        "https://api.replicate.test/v1",
        "TEST_REPLICATE_API_TOKEN",
        replicate.API_KEY,
        ReplicateVideoAdapter,
        lambda script: f"owner/{script}",
        None,
    ),
}
NAMES = list(PROVIDERS)


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch) -> Fakes:
    for provider in PROVIDERS.values():
        monkeypatch.setenv(provider.key_env, provider.key)
    return Fakes(
        seedance.FakeSeedance(),
        dashscope.FakeDashScope(),
        fal.FakeFal(files_origin=FAL_CDN),
        replicate.FakeReplicate(),
    )


def _params(**extra: Any) -> dict[str, Any]:
    return {
        "prompt": "a lighthouse at dusk",
        "duration": 5,
        "width": 1280,
        "height": 720,
        "resolution": "720p",
        "aspect_ratio": "16:9",
        "generate_audio": False,
        "frame_images": [],
        "input_references": [],
        **extra,
    }


def _call(endpoint: Endpoint, options: dict[str, Any] | None = None, **extra: Any) -> VideoCall:
    assert endpoint.model is not None
    return VideoCall(model=endpoint.model, params=_params(**extra), options=options or {})


async def _run(adapter: VideoAdapter, endpoint: Endpoint, call: VideoCall) -> VideoProgress:
    """Submit, then poll until the job leaves `running` (each fake takes a few looks); its
    videos fetched, as the worker fetches them into the store."""
    progress = await adapter.submit(endpoint, call)
    for _ in range(5):
        if progress.state != "running":
            progress.videos = await video_bytes(progress.videos)
            return progress
        assert progress.provider_job_id is not None
        progress = await adapter.poll(endpoint, progress.provider_job_id, call)
    raise AssertionError("the job never finished")


@pytest.mark.parametrize("name", NAMES)
async def test_a_job_completes_with_the_providers_mp4(fakes: Fakes, name: str) -> None:
    provider = PROVIDERS[name]
    async with httpx.AsyncClient(transport=fakes.transport()) as http:
        endpoint = provider.endpoint("ok")
        progress = await _run(provider.make(http), endpoint, _call(endpoint))
    assert progress.state == "completed"
    assert await video_bytes(progress.videos) == [VIDEO]
    assert progress.seconds == provider.seconds
    requests = fakes.of(name).requests
    downloads = [r for r in requests if "/files/" in r.url.path]
    assert len(downloads) == 1
    assert "authorization" not in downloads[0].headers  # the key stays with the API host
    api_calls = [r for r in requests if "/files/" not in r.url.path]
    assert all(r.url.host == httpx.URL(provider.base_url).host for r in api_calls)


FAILURES = [
    (name, script, kind)
    for name in NAMES
    for script, kind in [
        ("ratelimit", RATE_LIMITED),
        ("error-500", SERVER_ERROR),
        ("error-503", SERVER_ERROR),
        ("garbage", INVALID_RESPONSE),
        ("invalid" if name == "replicate" else "refuse", CLIENT_ERROR),
    ]
]


@pytest.mark.parametrize(("name", "script", "kind"), FAILURES)
async def test_submission_failures_are_mapped(
    fakes: Fakes, name: str, script: str, kind: str
) -> None:
    provider = PROVIDERS[name]
    async with httpx.AsyncClient(transport=fakes.transport()) as http:
        endpoint = provider.endpoint(script)
        with pytest.raises(ProviderFailure) as failed:
            await provider.make(http).submit(endpoint, _call(endpoint))
    assert failed.value.kind == kind
    if kind == RATE_LIMITED:
        expected = replicate.THROTTLE_SECONDS if name == "replicate" else None
        assert (failed.value.status, failed.value.retry_after) == (429, expected)
    if kind == CLIENT_ERROR:
        assert failed.value.status in (400, 422)
        assert failed.value.provider_code is not None  # the provider's own code or title


async def test_refusals_carry_the_providers_words(fakes: Fakes) -> None:
    async with httpx.AsyncClient(transport=fakes.transport()) as http:
        said = {}
        for name in ("seedance", "dashscope", "fal"):
            provider = PROVIDERS[name]
            endpoint = provider.endpoint("refuse")
            with pytest.raises(ProviderFailure) as failed:
                await provider.make(http).submit(endpoint, _call(endpoint))
            said[name] = (failed.value.provider_code, failed.value.message)
    assert said["seedance"][0] == "InputTextSensitiveContentDetected"
    assert said["dashscope"][0] == "DataInspectionFailed"
    assert said["fal"][0] == "content_policy_violation"
    assert "content checker" in said["fal"][1]


@pytest.mark.parametrize("name", NAMES)
async def test_rejected_credentials_and_timeouts(
    fakes: Fakes, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = PROVIDERS[name]
    endpoint = provider.endpoint("ok")
    async with httpx.AsyncClient(transport=fakes.transport(broken=True)) as http:
        with pytest.raises(ProviderFailure) as timed_out:
            await provider.make(http).submit(endpoint, _call(endpoint))
    assert timed_out.value.kind == TIMEOUT
    monkeypatch.setenv(provider.key_env, "wrong-key")
    async with httpx.AsyncClient(transport=fakes.transport()) as http:
        with pytest.raises(ProviderFailure) as refused:
            await provider.make(http).submit(endpoint, _call(endpoint))
    assert (refused.value.kind, refused.value.status) == (REJECTED_CREDENTIALS, 401)
    assert "wrong-key" not in refused.value.message


@pytest.mark.parametrize("name", NAMES)
async def test_a_task_the_provider_fails_fails_the_job(fakes: Fakes, name: str) -> None:
    provider = PROVIDERS[name]
    async with httpx.AsyncClient(transport=fakes.transport()) as http:
        endpoint = provider.endpoint("fail")
        progress = await _run(provider.make(http), endpoint, _call(endpoint))
    assert progress.state == "failed" and await video_bytes(progress.videos) == []
    assert progress.error is not None and progress.error.startswith("Provider failed: ")
    assert len(progress.error) > len("Provider failed: ")


@pytest.mark.parametrize("name", NAMES)
async def test_cancel_stops_the_task_at_the_provider(fakes: Fakes, name: str) -> None:
    provider = PROVIDERS[name]
    async with httpx.AsyncClient(transport=fakes.transport()) as http:
        adapter = provider.make(http)
        endpoint = provider.endpoint("never")
        call = _call(endpoint)
        progress = await adapter.submit(endpoint, call)
        assert progress.provider_job_id is not None
        await adapter.cancel(endpoint, progress.provider_job_id, call)
        if name == "fal":
            assert next(iter(fakes.fal.jobs.values())).get("cancelled") is True
            assert fakes.fal.requests[-1].method == "PUT"
        else:
            after = await adapter.poll(endpoint, progress.provider_job_id, call)
            assert after.state == "failed"
    if name == "seedance":
        assert fakes.seedance.requests[-2].method == "DELETE"
    if name == "dashscope":
        assert fakes.dashscope.requests[-2].url.path.endswith("/cancel")
    if name == "replicate":
        assert fakes.replicate.requests[-2].url.path.endswith("/cancel")


# --- what each adapter sends -----------------------------------------------------------------


async def test_seedance_sends_content_parts_and_generation_fields(fakes: Fakes) -> None:
    provider = PROVIDERS["seedance"]
    endpoint = provider.endpoint("ok")
    call = _call(
        endpoint,
        options={"camera_fixed": True, "watermark": False},
        seed=11,
        generate_audio=True,
        frame_images=[
            {"frame_type": "first_frame", "url": "https://img.test/a.png"},
            {"frame_type": "last_frame", "url": "https://img.test/b.png"},
        ],
    )
    references = _call(
        endpoint, input_references=[{"type": "image_url", "url": "https://img.test/ref.png"}]
    )
    async with httpx.AsyncClient(transport=fakes.transport()) as http:
        await provider.make(http).submit(endpoint, call)
        await provider.make(http).submit(endpoint, references)
    body, referenced = fakes.seedance.created()
    assert body["content"] == [
        {"type": "text", "text": "a lighthouse at dusk"},
        {
            "type": "image_url",
            "image_url": {"url": "https://img.test/a.png"},
            "role": "first_frame",
        },
        {"type": "image_url", "image_url": {"url": "https://img.test/b.png"}, "role": "last_frame"},
    ]
    assert referenced["content"][1] == {
        "type": "image_url",
        "image_url": {"url": "https://img.test/ref.png"},
        "role": "reference_image",
    }
    assert {k: body[k] for k in ("resolution", "ratio", "duration", "seed", "generate_audio")} == {
        "resolution": "720p",
        "ratio": "16:9",
        "duration": 5,
        "seed": 11,
        "generate_audio": True,
    }
    assert (body["camera_fixed"], body["watermark"]) == (True, False)
    assert not any("--" in part.get("text", "") for part in body["content"])


async def test_seedance_frames_and_references_together_are_a_clear_client_error(
    fakes: Fakes,
) -> None:
    """First/last-frame and reference generation are two modes on ModelArk: never both."""
    provider = PROVIDERS["seedance"]
    endpoint = provider.endpoint("ok")
    call = _call(
        endpoint,
        frame_images=[{"frame_type": "first_frame", "url": "https://img.test/a.png"}],
        input_references=[{"type": "image_url", "url": "https://img.test/ref.png"}],
    )
    async with httpx.AsyncClient(transport=fakes.transport()) as http:
        with pytest.raises(ProviderFailure) as refused:
            await provider.make(http).submit(endpoint, call)
    assert refused.value.kind == CLIENT_ERROR
    assert "reference" in refused.value.message
    assert fakes.seedance.requests == []  # refused before any call


async def test_seedance_every_shape_and_duration_the_catalog_offers_is_accepted(
    fakes: Fakes,
) -> None:
    provider = PROVIDERS["seedance"]
    async with httpx.AsyncClient(transport=fakes.transport()) as http:
        adapter = provider.make(http)
        for resolution, ratio, duration, model in catalog_offers("seedance"):
            endpoint = provider.endpoint(model)
            call = _call(endpoint, resolution=resolution, aspect_ratio=ratio, duration=duration)
            await adapter.submit(endpoint, call)  # the fake refuses what ModelArk does
            body = fakes.seedance.created()[-1]
            assert (body["resolution"], body["ratio"], body["duration"]) == (
                resolution,
                ratio,
                duration,
            )


async def test_seedance_leaves_resolutions_it_lacks_to_the_model(fakes: Fakes) -> None:
    provider = PROVIDERS["seedance"]
    endpoint = provider.endpoint("ok")
    async with httpx.AsyncClient(transport=fakes.transport()) as http:
        await provider.make(http).submit(
            endpoint, _call(endpoint, resolution="4K", aspect_ratio="3:2")
        )
    (body,) = fakes.seedance.created()
    assert "resolution" not in body and "ratio" not in body


async def test_dashscope_text_to_video_sends_size_and_parameters(fakes: Fakes) -> None:
    provider = PROVIDERS["dashscope"]
    endpoint = provider.endpoint("ok")
    call = _call(
        endpoint,
        options={"prompt_extend": False, "negative_prompt": "blur"},
        seed=7,
        generate_audio=True,
        input_references=[
            {"type": "audio_url", "url": "https://audio.test/a.mp3"},
            {"type": "video_url", "url": "https://video.test/v.mp4"},
        ],
    )
    async with httpx.AsyncClient(transport=fakes.transport()) as http:
        await provider.make(http).submit(endpoint, call)
    ((path, body),) = fakes.dashscope.created()
    assert path.endswith("/video-generation/video-synthesis")
    assert body["input"] == {
        "prompt": "a lighthouse at dusk",
        "negative_prompt": "blur",
        "audio_url": "https://audio.test/a.mp3",
    }
    assert body["parameters"] == {
        "size": "1280*720",
        "duration": 5,
        "seed": 7,
        "audio": True,
        "prompt_extend": False,
    }


async def test_dashscope_image_inputs_use_img_url_or_the_first_and_last_frame_api(
    fakes: Fakes,
) -> None:
    provider = PROVIDERS["dashscope"]
    endpoint = provider.endpoint("ok")
    first = {"frame_type": "first_frame", "url": "https://img.test/a.png"}
    last = {"frame_type": "last_frame", "url": "https://img.test/b.png"}
    async with httpx.AsyncClient(transport=fakes.transport()) as http:
        adapter = provider.make(http)
        await adapter.submit(endpoint, _call(endpoint, frame_images=[first]))
        await adapter.submit(endpoint, _call(endpoint, frame_images=[first, last]))
    (i2v_path, i2v), (kf_path, kf) = fakes.dashscope.created()
    assert i2v_path.endswith("/video-generation/video-synthesis")
    assert i2v["input"]["img_url"] == "https://img.test/a.png"
    assert i2v["parameters"]["resolution"] == "720P" and "size" not in i2v["parameters"]
    assert i2v["parameters"]["audio"] is False  # asked without audio: said so explicitly
    assert kf_path.endswith(FIRST_AND_LAST_FRAME_PATH)
    assert (kf["input"]["first_frame_url"], kf["input"]["last_frame_url"]) == (
        "https://img.test/a.png",
        "https://img.test/b.png",
    )


async def test_dashscope_wan27_asks_for_resolution_and_ratio_not_size(fakes: Fakes) -> None:
    """Wan 2.7 reads `resolution` + `ratio`; a `size` alone leaves it at its default shape."""
    provider = PROVIDERS["dashscope"]
    endpoint = provider.endpoint("wan2.7-t2v")
    call = _call(endpoint, resolution="1080p", aspect_ratio="9:16", width=1080, height=1920)
    async with httpx.AsyncClient(transport=fakes.transport()) as http:
        progress = await _run(provider.make(http), endpoint, call)
    ((_, body),) = fakes.dashscope.created()
    assert (body["parameters"]["resolution"], body["parameters"]["ratio"]) == ("1080P", "9:16")
    assert "size" not in body["parameters"]
    (task,) = fakes.dashscope.tasks.values()
    assert task["shape"] == "1080*1920"
    assert progress.state == "completed"
    assert progress.seconds == dashscope.OUTPUT_SECONDS  # wan2.7 reports output_video_duration


async def test_dashscope_size_models_get_the_documented_size_of_the_tier_and_ratio(
    fakes: Fakes,
) -> None:
    """Wan 2.6 at 1080p 1:1 is 1440*1440 in the size table; 1080*1080 is refused."""
    provider = PROVIDERS["dashscope"]
    endpoint = provider.endpoint("wan2.6-t2v")
    call = _call(endpoint, resolution="1080p", aspect_ratio="1:1", width=1080, height=1080)
    async with httpx.AsyncClient(transport=fakes.transport()) as http:
        await provider.make(http).submit(endpoint, call)
    ((_, body),) = fakes.dashscope.created()
    assert body["parameters"]["size"] == "1440*1440"


async def test_dashscope_wan27_images_go_in_media(fakes: Fakes) -> None:
    provider = PROVIDERS["dashscope"]
    endpoint = provider.endpoint("wan2.7-i2v")
    call = _call(
        endpoint,
        frame_images=[
            {"frame_type": "first_frame", "url": "https://img.test/a.png"},
            {"frame_type": "last_frame", "url": "https://img.test/b.png"},
        ],
        input_references=[{"type": "audio_url", "url": "https://audio.test/a.mp3"}],
    )
    async with httpx.AsyncClient(transport=fakes.transport()) as http:
        await provider.make(http).submit(endpoint, call)
    ((path, body),) = fakes.dashscope.created()
    assert path.endswith("/video-generation/video-synthesis")
    assert body["input"]["media"] == [
        {"type": "first_frame", "url": "https://img.test/a.png"},
        {"type": "last_frame", "url": "https://img.test/b.png"},
        {"type": "driving_audio", "url": "https://audio.test/a.mp3"},
    ]
    assert body["parameters"] == {"resolution": "720P", "duration": 5}


async def test_dashscope_every_shape_and_duration_the_catalog_offers_is_in_the_table(
    fakes: Fakes, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = PROVIDERS["dashscope"]
    async with httpx.AsyncClient(transport=fakes.transport()) as http:
        adapter = provider.make(http)
        for resolution, ratio, duration, model in catalog_offers("dashscope"):
            endpoint = provider.endpoint(model)
            width, height = size_of(resolution, ratio)
            call = _call(
                endpoint,
                resolution=resolution,
                aspect_ratio=ratio,
                width=width,
                height=height,
                duration=duration,
            )
            progress = await adapter.submit(endpoint, call)  # the fake refuses what Wan does
            task = fakes.dashscope.tasks[progress.provider_job_id]
            expected = dashscope.SIZES[(resolution.upper(), ratio)]
            assert task["shape"] == expected, (model, resolution, ratio)
            assert task["body"]["parameters"]["duration"] == duration


async def test_fal_follows_the_returned_urls_under_the_app_id(fakes: Fakes) -> None:
    provider = PROVIDERS["fal"]
    endpoint = provider.endpoint("ok")
    call = _call(
        endpoint,
        options={"negative_prompt": "blur"},
        frame_images=[{"frame_type": "first_frame", "url": "https://img.test/a.png"}],
        input_references=[
            {"type": "image_url", "url": "https://img.test/ref.png"},
            {"type": "video_url", "url": "https://video.test/v.mp4"},
        ],
    )
    async with httpx.AsyncClient(transport=fakes.transport()) as http:
        progress = await _run(provider.make(http), endpoint, call)
    assert progress.state == "completed"
    assert progress.provider_job_id is not None
    assert progress.provider_job_id.startswith("fal-ai/test-video/requests/")
    ((model_id, sent),) = fakes.fal.submitted()
    assert model_id == "fal-ai/test-video/v2/master/ok"
    assert sent["image_url"] == "https://img.test/a.png"
    assert sent["reference_urls"] == ["https://img.test/ref.png"]  # the video reference dropped
    assert sent["negative_prompt"] == "blur"
    paths = [(r.method, r.headers["host"], r.url.path) for r in fakes.fal.requests]
    assert paths[0] == ("POST", "queue.fal.test", "/fal-ai/test-video/v2/master/ok")
    assert all(
        p.startswith("/fal-ai/test-video/requests/")
        for _, host, p in paths[1:]
        if host != "v3.fal.test"
    )
    assert paths[-1][1] == "v3.fal.test"


async def test_fal_refuses_a_response_url_off_its_host(fakes: Fakes) -> None:
    provider = PROVIDERS["fal"]
    endpoint = provider.endpoint("offhost")
    async with httpx.AsyncClient(transport=fakes.transport()) as http:
        with pytest.raises(ProviderFailure) as failed:
            await provider.make(http).submit(endpoint, _call(endpoint))
        with pytest.raises(ProviderFailure):  # nor a stored path that climbs out of the base
            await provider.make(http).poll(endpoint, "../evil/requests/1", _call(endpoint))
    assert failed.value.kind == INVALID_RESPONSE
    assert {r.url.host for r in fakes.fal.requests} == {"queue.fal.test"}


async def test_replicate_sends_input_and_downloads_every_output(fakes: Fakes) -> None:
    provider = PROVIDERS["replicate"]
    endpoint = provider.endpoint("ok-list")
    call = _call(
        endpoint,
        options={"negative_prompt": "blur"},
        seed=3,
        frame_images=[
            {"frame_type": "first_frame", "url": "https://img.test/a.png"},
            {"frame_type": "last_frame", "url": "https://img.test/b.png"},
        ],
    )
    async with httpx.AsyncClient(transport=fakes.transport()) as http:
        progress = await _run(provider.make(http), endpoint, call)
        pinned = Endpoint(**{**endpoint.__dict__, "model": "owner/ok:5c7d5dc6dd8b"})
        await provider.make(http).submit(pinned, _call(pinned))
    assert await video_bytes(progress.videos) == [VIDEO, VIDEO]
    first = fakes.replicate.created()[0]
    assert first == {
        "prompt": "a lighthouse at dusk",
        "duration": 5,
        "resolution": "720p",
        "aspect_ratio": "16:9",
        "seed": 3,
        "generate_audio": False,
        "image": "https://img.test/a.png",
        "last_frame_image": "https://img.test/b.png",
        "negative_prompt": "blur",
    }
    assert fakes.replicate.requests[0].url.path == "/v1/models/owner/ok-list/predictions"
    assert fakes.replicate.requests[-1].url.path == "/v1/predictions"
    assert json.loads(fakes.replicate.requests[-1].read())["version"] == "5c7d5dc6dd8b"


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://v3.fal.test/files/out.mp4", True),  # a public CDN
        ("https://ark.test/files/out.mp4", True),  # the endpoint's own origin
        ("http://v3.fal.test/files/out.mp4", False),  # plain HTTP off the endpoint's origin
        ("https://cdn.inside.test/out.mp4", False),  # a name that resolves inside
        ("https://169.254.169.254/latest/meta-data", False),
        ("https://10.0.0.7/out.mp4", False),
        ("https://[::1]/out.mp4", False),
        ("https://localhost/out.mp4", False),
        ("file:///etc/passwd", False),
        (None, False),
    ],
)
async def test_only_public_or_same_origin_video_urls_are_downloaded(
    fakes: Fakes, url: str | None, allowed: bool
) -> None:
    endpoint = PROVIDERS["seedance"].endpoint("ok")
    async with httpx.AsyncClient(transport=fakes.transport()) as http:
        downloads = Downloads(http, lookup=lookup)
        if allowed:
            assert await download(downloads, endpoint, url) == VIDEO
            return
        with pytest.raises(ProviderFailure) as failed:
            await download(downloads, endpoint, url)
    assert failed.value.kind == INVALID_RESPONSE
    assert fakes.seedance.requests == [] and fakes.fal.requests == []


async def test_a_cdn_download_goes_to_the_checked_address_without_the_key(fakes: Fakes) -> None:
    endpoint = PROVIDERS["seedance"].endpoint("ok")
    async with httpx.AsyncClient(transport=fakes.transport()) as http:
        downloads = Downloads(http, lookup=lookup)
        assert await download(downloads, endpoint, f"{FAL_CDN}/files/out.mp4") == VIDEO
        (request,) = fakes.fal.requests
        assert (request.url.host, request.headers["host"]) == ("93.184.216.34", "v3.fal.test")
        assert request.extensions["sni_hostname"] == "v3.fal.test"
        assert "authorization" not in request.headers
        # A credential stays on its own origin: a CDN URL with one is refused.
        with pytest.raises(ProviderFailure) as failed:
            await download(
                downloads,
                endpoint,
                f"{FAL_CDN}/files/out.mp4",
                headers={"Authorization": "Bearer k"},
            )
    assert failed.value.kind == INVALID_RESPONSE and len(fakes.fal.requests) == 1


@pytest.mark.parametrize(
    ("location", "kind"),
    [("https://10.0.0.7/out.mp4", INVALID_RESPONSE), ("/files/out.mp4", None)],
)
async def test_a_redirect_is_checked_as_the_url_itself(location: str, kind: str | None) -> None:
    seen: list[httpx.Request] = []

    def storage(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/v1/files/out.mp4":
            return httpx.Response(302, headers={"location": location})
        return httpx.Response(200, content=VIDEO)

    endpoint = Endpoint("p", "x", "https://api.test/v1", model="m")
    async with httpx.AsyncClient(transport=httpx.MockTransport(storage)) as http:
        fetch = download(
            Downloads(http, lookup=lookup),
            endpoint,
            "https://api.test/v1/files/out.mp4",
            headers={"Authorization": "Bearer k"},
        )
        if kind is None:
            assert await fetch == VIDEO
            assert seen[-1].url.path == "/files/out.mp4"
            assert "authorization" not in seen[-1].headers  # the key went to the API URL only
        else:
            with pytest.raises(ProviderFailure) as failed:
                await fetch
            assert failed.value.kind == kind and len(seen) == 1


async def test_a_video_host_that_does_not_resolve_is_unreachable() -> None:
    async def nowhere(host: str, port: int) -> list[str]:
        raise socket.gaierror("no such name")

    async with httpx.AsyncClient(
        transport=httpx.MockTransport(lambda r: httpx.Response(500))
    ) as http:
        with pytest.raises(ProviderFailure) as failed:
            await download(
                Downloads(http, lookup=nowhere),
                PROVIDERS["seedance"].endpoint("ok"),
                "https://cdn.gone.test/out.mp4",
            )
    assert failed.value.kind == UNREACHABLE


@pytest.mark.parametrize("name", NAMES)
async def test_provider_options_cannot_override_what_the_gateway_charges_for(
    fakes: Fakes, name: str
) -> None:
    provider = PROVIDERS[name]
    endpoint = provider.endpoint("ok")
    options = {"duration": 60, "callback_url": "https://elsewhere.test/hook", "style": "anime"}
    async with httpx.AsyncClient(transport=fakes.transport()) as http:
        await provider.make(http).submit(endpoint, _call(endpoint, options=options))
    sent: dict[str, Any] = {
        "seedance": lambda: fakes.seedance.created()[0],
        "dashscope": lambda: fakes.dashscope.created()[0][1]["parameters"],
        "fal": lambda: fakes.fal.submitted()[0][1],
        "replicate": lambda: fakes.replicate.created()[0],
    }[name]()
    assert (sent["duration"], sent["style"]) == (5, "anime")
    assert "callback_url" not in sent


async def test_openai_provider_options_cannot_override_what_the_gateway_charges_for() -> None:
    """The model, seconds and size sent are the ones the job is charged for."""
    sent: list[dict[str, Any]] = []

    def videos_api(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(200, json={"id": "video_1", "object": "video", "status": "queued"})

    endpoint = Endpoint(
        provider="openai",
        adapter="openai",
        base_url="https://api.openai.test/v1",
        api_key_env="TEST_OPENAI_KEY",
        model="sora-2",
    )
    call = VideoCall(
        model="sora-2",
        params=_params(duration=4, width=720, height=1280),
        options={"seconds": "12", "size": "1792x1024", "model": "sora-2-pro", "style": "x"},
    )
    async with httpx.AsyncClient(transport=httpx.MockTransport(videos_api)) as http:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("TEST_OPENAI_KEY", "sk-test")
            progress = await OpenAIVideoAdapter(http).submit(endpoint, call)
    assert progress.state == "running"
    assert {k: sent[0][k] for k in ("model", "seconds", "size", "style")} == {
        "model": "sora-2",
        "seconds": "4",
        "size": "720x1280",
        "style": "x",
    }


async def test_queue_provider_options_cannot_override_what_the_gateway_charges_for() -> None:
    sent: list[dict[str, Any]] = []

    def queue_api(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(200, json={"request_id": "req-1", "status": "IN_QUEUE"})

    endpoint = Endpoint(
        provider="queue",
        adapter="queue",
        base_url="https://queue.test",
        api_key_env="TEST_QUEUE_KEY",
        model="some/model",
    )
    call = VideoCall(
        model="some/model",
        params=_params(),
        options={"duration": 60, "callback_url": "https://elsewhere.test/hook", "style": "x"},
    )
    async with httpx.AsyncClient(transport=httpx.MockTransport(queue_api)) as http:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("TEST_QUEUE_KEY", "queue-key")
            await FalVideoAdapter(http, spec=QUEUE_SPEC).submit(endpoint, call)
    assert (sent[0]["duration"], sent[0]["style"]) == (5, "x")
    assert "callback_url" not in sent[0]
