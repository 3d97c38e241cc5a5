"""The operator catalog the test gateways run with: fake providers on loopback."""

from __future__ import annotations

from pathlib import Path

from testkit.processes import refusing_port

FAKE_KEY_ENV = "FAKE_STT_KEY"


def _model(
    model_id: str, endpoints: list[str], *, price: str = "0.001", verbose: bool = True
) -> str:
    lines = [
        "[[models]]",
        f'id = "{model_id}"',
        'kind = "stt"',
        f'price_per_second = "{price}"',
        f"verbose_json = {'true' if verbose else 'false'}",
    ]
    for endpoint in endpoints:
        lines.append("[[models.endpoints]]")
        lines.append(endpoint)
    return "\n".join(lines) + "\n"


def fake_endpoint(
    base_url: str,
    upstream: str,
    provider: str = "fakeai",
    timeout: float | None = None,
    key_env: str = FAKE_KEY_ENV,
) -> str:
    parts = [
        f'provider = "{provider}"',
        'adapter = "openai"',
        f'base_url = "{base_url}"',
        f'api_key_env = "{key_env}"',
        f'model = "{upstream}"',
    ]
    if timeout is not None:
        parts.append(f"timeout_seconds = {timeout}")
    return "\n".join(parts)


def provider_video_models(video_base: str) -> list[str]:
    def model(model_id: str, endpoints: list[tuple[str, str, str]]) -> str:
        lines = [
            "[[models]]",
            f'id = "{model_id}"',
            'kind = "video"',
            'price_per_second = "0.01"',
            'resolutions = ["480p", "720p"]',
            'aspect_ratios = ["16:9", "9:16"]',
            "durations = [1, 4]",
            'input_reference_types = ["image_url", "video_url"]',
        ]
        for provider, adapter, upstream in endpoints:
            base = f"{video_base}/v1" if adapter == "openai" else f"{video_base}/queue"
            lines += [
                "[[models.endpoints]]",
                f'provider = "{provider}"',
                f'adapter = "{adapter}"',
                f'base_url = "{base}"',
                f'api_key_env = "{FAKE_KEY_ENV}"',
                f'model = "{upstream}"',
            ]
        return "\n".join(lines) + "\n"

    return [
        model("fakevideo/openai", [("openai", "openai", "ok")]),
        model("fakevideo/queue", [("fal", "queue", "ok")]),
        model("fakevideo/fallback", [("openai", "openai", "submit-500"), ("fal", "queue", "ok")]),
        model("fakevideo/provider-fails", [("openai", "openai", "fail")]),
        model("fakevideo/queue-fails", [("fal", "queue", "fail")]),
        model("fakevideo/queue-slow", [("fal", "queue", "slow")]),  # runs until cancelled
    ]


def write_test_catalog(path: Path, base_url: str, video_base: str | None = None) -> Path:
    def e(upstream: str, provider: str = "fakeai", **kw: object) -> str:
        return fake_endpoint(base_url, upstream, provider, **kw)  # type: ignore[arg-type]

    down = fake_endpoint(f"http://127.0.0.1:{refusing_port()}/v1", "ok", "downai")
    models = [
        _model("fake/ok", [e("ok")]),
        _model("fake/tokens", [e("tokens")]),
        _model("fake/echo", [e("echo", "alpha"), e("ok", "beta")]),
        _model("fake/echo-beta", [e("error-500", "alpha"), e("echo", "beta")]),
        # Each rate-limited upstream model here is used by one test model only: a provider's
        # hint cools that endpoint in the gateway (server/routing/cooldowns.py).
        _model("fake/fallback-429", [e("ratelimit-5", "alpha"), e("ok", "beta")]),
        _model("fake/all-429", [e("ratelimit-7", "alpha"), e("ratelimit-3", "beta")]),
        _model("fake/429-partial-hint", [e("ratelimit-none", "alpha"), e("ratelimit-2", "beta")]),
        _model("fake/cooling", [e("ratelimit-120", "alpha")]),
        _model("fake/500-then-ok", [e("error-500", "alpha"), e("ok", "beta")]),
        _model("fake/all-5xx", [e("error-500", "alpha"), e("error-502", "beta")]),
        _model("fake/down", [down]),
        _model("fake/down-then-ok", [down, e("ok", "beta")]),
        _model("fake/garbage", [e("garbage")]),
        _model("fake/overloaded", [e("overloaded")]),
        _model("fake/slow", [e("slow-3", timeout=0.5)]),
        _model("fake/slow-ok", [e("slow-2", timeout=10)]),
        _model("fake/client-error", [e("bad-request", "alpha"), e("ok", "beta")]),
        _model("fake/no-verbose", [e("ok")], verbose=False),
        _model("fake/no-credential", [e("ok", key_env="GATEWAY_TEST_UNSET_KEY")]),
        _model("fake/wrong-credential", [e("ok", key_env="FAKE_STT_WRONG_KEY")]),
        _model("fake/free:free", [e("ok")], price="0"),
        _model("fake/pricey", [e("ok")], price="1"),
    ]
    models.extend(VIDEO_MODELS)
    if video_base is not None:
        models.extend(provider_video_models(video_base))
    path.write_text("\n".join(models))
    return path


# Video models on the local renderer (fast, offline), with the capabilities tests need.
VIDEO_MODELS = [
    """[[models]]
id = "fakevideo/frames"
kind = "video"
price_per_second = "0.01"
resolutions = ["480p", "720p"]
aspect_ratios = ["16:9", "9:16", "1:1"]
durations = [1, 2, 4]
frame_images = ["first_frame", "last_frame"]
input_reference_types = ["image_url"]
prompt_optional_with_images = true
seed = true
generate_audio = false
default_duration = 1
[[models.endpoints]]
provider = "local"
adapter = "local"
""",
    """[[models]]
id = "fakevideo/sized"
kind = "video"
price_per_second = "0.01"
sizes = ["640x480", "480x640"]
resolutions = ["480p"]
aspect_ratios = ["4:3", "3:4"]
durations = [1]
[[models.endpoints]]
provider = "local"
adapter = "local"
""",
    """[[models]]
id = "fakevideo/upscaler"
kind = "video"
price_per_second = "0.01"
resolutions = ["480p"]
aspect_ratios = ["16:9"]
durations = [1]
upscaling = true
[[models.endpoints]]
provider = "local"
adapter = "local"
""",
    """[[models]]
id = "fakevideo/unavailable"
kind = "video"
price_per_second = "0.01"
resolutions = ["480p"]
aspect_ratios = ["16:9"]
durations = [1]
[[models.endpoints]]
provider = "nowhere"
adapter = "openai"
base_url = "https://127.0.0.1:9/v1"
api_key_env = "GATEWAY_TEST_UNSET_KEY"
""",
]
