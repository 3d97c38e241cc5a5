"""Queue-style video APIs (fal's queue, and the same shape elsewhere): submit
`POST {base}/{model}` → `{request_id}`; status `GET {base}/{model}/requests/{id}/status` →
`{status: IN_QUEUE | IN_PROGRESS | COMPLETED | FAILED}`; result
`GET {base}/{model}/requests/{id}` → `{video: {url}}` or `{videos: [{url}, ...]}`; cancel
`PUT {base}/{model}/requests/{id}/cancel` → 202 `{status: CANCELLATION_REQUESTED}` (400
`ALREADY_COMPLETED` once done) — https://docs.fal.ai/model-apis/model-endpoints/queue.
fal.ai itself has its own adapter (fal_video.py), which follows the URLs fal returns.
Checked 2026-11-27 against that page (statuses, cancel answers; `Authorization: Key`):
unchanged. provider.options are added to the input, never over what the gateway mapped
(the duration it charges for) nor a callback URL. The input names (prompt, duration,
resolution, aspect_ratio, generate_audio, seed, image_url, end_image_url, reference_urls) are
the common ones; each model's own schema is not checked here (a later issue gives the
adapters per-model shapes).
The result JSON is read with the key (it lives on the API host); the video file it names is
fetched with the key only when it lies under the base URL, otherwise (a CDN) without it."""

from __future__ import annotations

from typing import Any, cast

import httpx

from server.providers import http as provider_http
from server.providers.endpoint import Endpoint
from server.providers.failures import INVALID_RESPONSE, ProviderFailure
from server.providers.http import Downloads, RemoteVideo
from server.providers.video import VideoCall, VideoProgress
from server.providers.video_tasks import merged


def queue_input(call: VideoCall) -> dict[str, Any]:
    params = call.params
    body: dict[str, Any] = {
        "prompt": params.get("prompt", ""),
        "duration": params["duration"],
        "resolution": params.get("resolution"),
        "aspect_ratio": params.get("aspect_ratio"),
        "generate_audio": params.get("generate_audio", False),
    }
    if "seed" in params:
        body["seed"] = params["seed"]
    for frame in params.get("frame_images", []):
        body["image_url" if frame["frame_type"] == "first_frame" else "end_image_url"] = frame[
            "url"
        ]
    if params.get("input_references"):
        body["reference_urls"] = [r["url"] for r in params["input_references"]]
    # What the gateway mapped wins over provider.options (the duration it charges for).
    return merged(body, call.options)


class QueueVideoAdapter:
    def __init__(self, http: httpx.AsyncClient, downloads: Downloads | None = None) -> None:
        self._http = http
        self._downloads = downloads or Downloads(http)

    def _base(self, endpoint: Endpoint, call: VideoCall) -> str:
        return f"{endpoint.base_url}/{call.model}"

    async def submit(self, endpoint: Endpoint, call: VideoCall) -> VideoProgress:
        response = await provider_http.call(
            self._http, endpoint, "POST", self._base(endpoint, call), json=queue_input(call)
        )
        request_id = provider_http.json_object(response).get("request_id")
        if not isinstance(request_id, str) or not request_id:
            raise ProviderFailure(INVALID_RESPONSE, "Provider returned no request_id")
        return VideoProgress(state="running", provider_job_id=request_id)

    async def cancel(self, endpoint: Endpoint, provider_job_id: str, call: VideoCall) -> None:
        """Ask the queue to drop the request (a running one may still finish: its result is
        then ignored)."""
        await provider_http.call(
            self._http,
            endpoint,
            "PUT",
            f"{self._base(endpoint, call)}/requests/{provider_job_id}/cancel",
        )

    async def poll(
        self, endpoint: Endpoint, provider_job_id: str, call: VideoCall
    ) -> VideoProgress:
        base = f"{self._base(endpoint, call)}/requests/{provider_job_id}"
        status = provider_http.json_object(
            await provider_http.call(self._http, endpoint, "GET", f"{base}/status")
        )
        state = status.get("status")
        if state in ("IN_QUEUE", "IN_PROGRESS"):
            return VideoProgress(state="running", provider_job_id=provider_job_id)
        if state != "COMPLETED":
            detail = status.get("error") or state
            return VideoProgress(
                state="failed", provider_job_id=provider_job_id, error=f"Provider failed: {detail}"
            )
        result = provider_http.json_object(
            await provider_http.call(self._http, endpoint, "GET", base)
        )
        entries = result.get("videos") or ([result["video"]] if "video" in result else [])
        urls = [e.get("url") for e in entries if isinstance(e, dict)]
        if not urls or not all(isinstance(u, str) for u in urls):
            raise ProviderFailure(INVALID_RESPONSE, "Provider returned no video URL")
        videos = []
        for url in cast(list[str], urls):  # all str: checked just above
            videos.append(await self._fetch(endpoint, url))
        return VideoProgress(state="completed", provider_job_id=provider_job_id, videos=videos)

    async def _fetch(self, endpoint: Endpoint, url: str) -> RemoteVideo:
        """A result file: with the key only under the endpoint's base URL (the API host);
        elsewhere (fal's CDN) without it, and only from a public https host."""
        if endpoint.base_url and provider_http.same_origin(url, endpoint.base_url):
            return self._downloads.remote(endpoint, url, headers=provider_http.authorized(endpoint))
        return self._downloads.remote(endpoint, url)
