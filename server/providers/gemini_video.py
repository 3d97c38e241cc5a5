"""Google Veo through the Gemini API (catalog adapter `gemini`).

Checked 2026-11-27 against https://ai.google.dev/gemini-api/docs/video (the Veo parameter
table, updated 2026-09-17), https://ai.google.dev/api/models#method:-models.predictlongrunning
and https://ai.google.dev/gemini-api/docs/deprecations (veo-3.0-generate-001 shut down
2026-06-30; the veo-3.1 previews have no shutdown date), and google-genai's
generate_videos: durationSeconds 4 / 6 / 8, and 8 only with 1080p, 4k or reference images
(a client error here, before any call); aspectRatio 16:9 / 9:16; resolution 720p / 1080p /
4k. Not settled from the documentation: whether a first frame and reference images may be
combined in one request (sent as given).

Protocol (https://ai.google.dev/gemini-api/docs/video, REST tab;
https://ai.google.dev/api/models#method:-models.predictlongrunning):
submit `POST {base}/models/{model}:predictLongRunning` with the `x-goog-api-key` header and
`{"instances": [{prompt, image, lastFrame, referenceImages}], "parameters": {aspectRatio,
resolution, durationSeconds, ...}}` → an operation `{"name": "models/.../operations/..."}`;
poll `GET {base}/{name}` until `"done": true`; then `error` (google.rpc.Status) or
`response.generateVideoResponse.generatedSamples[].video.uri`, each downloaded with the key
(the download answers with a redirect to storage, followed once without the key).

Field mapping: prompt; frame_images → `image` / `lastFrame` and image input_references →
`referenceImages` (asset, up to 3), all inline: data: URLs as given, public https URLs
fetched by the gateway (http.ImageFetcher; Veo reads no web URLs);
aspect_ratio, resolution, duration → aspectRatio, resolution, durationSeconds. Dropped:
`seed` and `generate_audio` (the Gemini API refuses both; Veo 3 always generates sound),
audio/video references. `provider.options[<slug>]` are Veo parameters merged into
`parameters` (e.g. `{"negativePrompt": "...", "personGeneration": "allow_adult"}`).
Failures: 400 API_KEY_INVALID / 401 / 403 → rejected credentials; 429 RESOURCE_EXHAUSTED →
rate limited with RetryInfo's delay; other 4xx (e.g. a refused prompt) → the request's
fault; 503 → overloaded; 5xx → server error; an operation `error` or a safety-filtered
result → the job fails. No cancel call is documented for Veo operations.

How an operator configures it: an endpoint `adapter = "gemini"`,
`base_url = "https://generativelanguage.googleapis.com/v1beta"`,
`api_key_env = "GEMINI_API_KEY"` (an API key from Google AI Studio) and `model` = the Veo
model name, e.g. `veo-3.1-generate-preview`, `veo-3.1-fast-generate-preview`,
`veo-3.1-lite-generate-preview`. Veo 3.1 takes aspect ratios 16:9 / 9:16, resolutions 720p /
1080p / 4k, durations 4 / 6 / 8 s (1080p and 4k: 8 s); list `generate_audio = true` (it
always has sound)."""

from __future__ import annotations

from typing import Any

import httpx

from server.providers import veo
from server.providers.endpoint import Endpoint
from server.providers.failures import (
    CLIENT_ERROR,
    INVALID_RESPONSE,
    REJECTED_CREDENTIALS,
    ProviderFailure,
)
from server.providers.http import Downloads, ImageFetcher, json_object
from server.providers.video import VideoCall, VideoProgress
from server.providers.video_tasks import image_urls, send_json


def _check_duration(call: VideoCall) -> None:
    """What the Gemini API refuses (400 INVALID_ARGUMENT), said before a call in plain words:
    1080p, 4k and reference images take 8 s only."""
    params = call.params
    if params.get("duration", 8) == 8:
        return
    if str(params.get("resolution", "")).lower() in ("1080p", "4k"):
        raise ProviderFailure(CLIENT_ERROR, "Veo makes 1080p and 4k videos of 8 s only")
    if image_urls(params)[2]:
        raise ProviderFailure(CLIENT_ERROR, "Veo takes reference images for 8 s videos only")


class GeminiVideoAdapter:
    def __init__(
        self,
        http: httpx.AsyncClient,
        images: ImageFetcher | None = None,
        downloads: Downloads | None = None,
    ) -> None:
        self._http = http
        self._images = images or ImageFetcher(http)
        self._downloads = downloads or Downloads(http)

    def _headers(self, endpoint: Endpoint) -> dict[str, str]:
        key = endpoint.credential()
        if not key:
            raise ProviderFailure(REJECTED_CREDENTIALS, "No credential is configured")
        return {"x-goog-api-key": key}

    async def _call(
        self, endpoint: Endpoint, method: str, url: str, body: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        headers = self._headers(endpoint)
        return json_object(
            await send_json(self._http, endpoint, method, url, headers, veo.failure_of, body)
        )

    async def submit(self, endpoint: Endpoint, call: VideoCall) -> VideoProgress:
        _check_duration(call)
        body = await veo.request_body(call, self._images, endpoint.timeout_seconds, vertex=False)
        operation = await self._call(
            endpoint, "POST", f"{endpoint.base_url}/models/{call.model}:predictLongRunning", body
        )
        return await self._progress(endpoint, operation)

    async def poll(
        self, endpoint: Endpoint, provider_job_id: str, call: VideoCall
    ) -> VideoProgress:
        operation = await self._call(endpoint, "GET", f"{endpoint.base_url}/{provider_job_id}")
        return await self._progress(endpoint, operation)

    async def _progress(self, endpoint: Endpoint, operation: dict[str, Any]) -> VideoProgress:
        name, progress = veo.unfinished(operation)
        if progress is not None:
            return progress
        response = operation.get("response")
        result = response.get("generateVideoResponse") if isinstance(response, dict) else None
        if not isinstance(result, dict):
            raise ProviderFailure(INVALID_RESPONSE, "Provider returned an invalid response")
        samples = result.get("generatedSamples") or []
        if not isinstance(samples, list):
            raise ProviderFailure(INVALID_RESPONSE, "Provider returned an invalid response")
        uris = [s.get("video", {}).get("uri") for s in samples if isinstance(s, dict)]
        if not uris:
            return veo.filtered(name, result)
        # The key goes only to the API's own host, never to a host the response names.
        videos = [
            self._downloads.remote(
                endpoint, uri, headers=self._headers(endpoint), failure_of=veo.failure_of
            )
            for uri in uris
        ]
        return VideoProgress(state="completed", provider_job_id=name, videos=videos)
