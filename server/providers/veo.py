"""Google Veo's request and result shapes, shared by the Gemini API (`gemini` adapter) and
Vertex AI (`vertex` adapter): the `predictLongRunning` body, Google's error body
(google.rpc.Status with RetryInfo / ErrorInfo details) and the long-running operation.

Docs: https://ai.google.dev/gemini-api/docs/video (Gemini API),
https://cloud.google.com/vertex-ai/generative-ai/docs/model-reference/veo-video-generation
(Vertex AI), https://cloud.google.com/apis/design/errors (the error model). Checked
2026-11-27 (with https://docs.cloud.google.com/gemini-enterprise-agent-platform/models/veo/
3-1-generate): the body, the error model and the operation are unchanged; what differs
between the two APIs (the Gemini API's 8 s rule, the model IDs) is in each adapter."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx

from server.providers.failures import (
    CLIENT_ERROR,
    INVALID_RESPONSE,
    OVERLOADED,
    RATE_LIMITED,
    REJECTED_CREDENTIALS,
    SERVER_ERROR,
    TIMEOUT,
    ProviderFailure,
)
from server.providers.http import (
    MAX_PROVIDER_MESSAGE,
    ImageFetcher,
    http_failure,
    json_or_none,
)
from server.providers.video import VideoCall, VideoProgress
from server.providers.video_tasks import failed, image_urls

MAX_REFERENCE_IMAGES = 3  # Veo takes up to three "asset" reference images
# Parameters the gateway decides, never a client's provider.options: one video per job (it is
# charged as one), and output stays off Cloud Storage buckets a client could name.
GATEWAY_PARAMETERS = frozenset({"sampleCount", "numberOfVideos", "storageUri", "pubsubTopic"})
_DELAY = re.compile(r"^(\d+)(?:\.\d+)?s$")
# Google's ErrorInfo reasons that mean the credential itself is refused (sent as 400).
_KEY_REASONS = ("API_KEY_INVALID", "API_KEY_EXPIRED", "API_KEY_SERVICE_BLOCKED")


async def _inline_all(
    images: ImageFetcher, urls: list[str], timeout_seconds: float
) -> list[dict[str, str]]:
    """Veo's inline form of each image, fetched concurrently; the first failure is raised
    and the other fetches are cancelled."""

    async def inline(url: str) -> dict[str, str]:
        image = await images.inline(url, timeout_seconds)
        return {"bytesBase64Encoded": image.base64, "mimeType": image.mime_type}

    fetches = [asyncio.ensure_future(inline(url)) for url in urls]
    try:
        return list(await asyncio.gather(*fetches))
    except BaseException:
        for fetch in fetches:
            fetch.cancel()
        await asyncio.gather(*fetches, return_exceptions=True)
        raise


async def request_body(
    call: VideoCall,
    images: ImageFetcher,
    timeout_seconds: float,
    *,
    vertex: bool,
    storage_uri: str | None = None,
) -> dict[str, Any]:
    """The predictLongRunning body. Images go inline (Veo reads no web URLs): data: URLs
    as they are, https URLs fetched by `images`. The Gemini API refuses `generateAudio` and
    `seed` (Vertex AI only): there Veo 3 always has sound and seed is dropped (the
    reference allows it: determinism is not guaranteed for all providers).
    provider.options are Veo `parameters` (negativePrompt, personGeneration, enhancePrompt,
    ...) but for GATEWAY_PARAMETERS."""

    params = call.params
    instance: dict[str, Any] = {"prompt": params.get("prompt", "")}
    first, last, references = image_urls(params)
    references = references[:MAX_REFERENCE_IMAGES]
    # Fetched at once (each within its own bounds), not one after another.
    inlined = await _inline_all(
        images, [url for url in (first, last) if url] + references, timeout_seconds
    )
    if first:
        instance["image"] = inlined.pop(0)
    if last:
        instance["lastFrame"] = inlined.pop(0)
    if references:
        instance["referenceImages"] = [
            {"image": image, "referenceType": "asset"} for image in inlined
        ]
    parameters: dict[str, Any] = {
        "aspectRatio": params.get("aspect_ratio"),
        # Veo names resolutions "720p", "1080p", "4k".
        "resolution": str(params["resolution"]).lower() if params.get("resolution") else None,
        "durationSeconds": params.get("duration"),
    }
    if vertex:
        parameters["sampleCount"] = 1
        parameters["generateAudio"] = bool(params.get("generate_audio"))
        if "seed" in params:
            parameters["seed"] = params["seed"]
        if storage_uri:
            parameters["storageUri"] = storage_uri
    parameters = {k: v for k, v in parameters.items() if v is not None}
    options = dict(call.options)
    nested = options.pop("parameters", None)  # {"parameters": {...}} is accepted too
    options = {**(nested if isinstance(nested, dict) else {}), **options}
    extra = {k: v for k, v in options.items() if k not in GATEWAY_PARAMETERS}
    # What the gateway mapped from the request wins (the duration it charges for).
    return {"instances": [instance], "parameters": {**extra, **parameters}}


def _retry_delay(details: list[Any]) -> int | None:
    for detail in details:
        if isinstance(detail, dict) and str(detail.get("@type", "")).endswith("RetryInfo"):
            match = _DELAY.match(str(detail.get("retryDelay", "")))
            if match:
                return int(match.group(1)) + (1 if "." in str(detail["retryDelay"]) else 0)
    return None


def failure_of(response: httpx.Response) -> ProviderFailure:
    """Google's HTTP error: `{"error": {"code", "message", "status", "details"}}`."""
    status = response.status_code
    body = json_or_none(response) or {}
    error = body.get("error") if isinstance(body.get("error"), dict) else {}
    assert isinstance(error, dict)
    code = error.get("status") if isinstance(error.get("status"), str) else status
    details = error.get("details") if isinstance(error.get("details"), list) else []
    assert isinstance(details, list)
    reasons = {d.get("reason") for d in details if isinstance(d, dict)}
    retry_after = None
    if status in (401, 403) or reasons.intersection(_KEY_REASONS):
        kind = REJECTED_CREDENTIALS
    elif status == 429:
        kind, retry_after = RATE_LIMITED, _retry_delay(details)
    elif status == 503:
        kind = OVERLOADED
    elif status == 504:
        kind = TIMEOUT
    elif 400 <= status < 500 and status not in (408, 409):
        kind = CLIENT_ERROR
    else:
        kind = SERVER_ERROR
    return http_failure(kind, response, code, str(error.get("message") or ""), retry_after)


def _operation_name(body: dict[str, Any]) -> str:
    name = body.get("name")
    if not isinstance(name, str) or not name or ".." in name or name.startswith("/"):
        raise ProviderFailure(INVALID_RESPONSE, "Provider returned no operation name")
    return name


def unfinished(operation: dict[str, Any]) -> tuple[str, VideoProgress | None]:
    """The operation's name, and its progress while it runs or once it failed with an
    `error` (google.rpc.Status); None when it ended with a result to read."""
    name = _operation_name(operation)
    if not operation.get("done"):
        return name, VideoProgress(state="running", provider_job_id=name)
    error = operation.get("error")
    if error is None:
        return name, None
    message = error.get("message") if isinstance(error, dict) else None
    return name, failed(name, message or "the operation failed")


def filtered(name: str, result: dict[str, Any]) -> VideoProgress:
    """An operation that ended without videos: why (Veo's safety filter), when it says."""
    reasons = result.get("raiMediaFilteredReasons")
    if isinstance(reasons, list) and reasons:
        text = "; ".join(str(r) for r in reasons)[:MAX_PROVIDER_MESSAGE]
        error = f"Provider failed: content filtered: {text}"
    elif result.get("raiMediaFilteredCount"):
        error = "Provider failed: content filtered"
    else:
        error = "Provider failed: no video was returned"
    return VideoProgress(state="failed", provider_job_id=name, error=error)
