"""The OpenAI videos API (https://platform.openai.com/docs/api-reference/videos):
`POST {base}/videos`, `GET {base}/videos/{id}`, `GET {base}/videos/{id}/content` (MP4), and
`POST {base}/videos/{id}/remix` `{prompt}` to continue a completed video (the gateway's
`previous_job_id`). The API has no cancel (DELETE removes a finished video only).

Checked 2026-11-27 against https://platform.openai.com/docs/api-reference/videos (create:
`model`, `prompt`, `seconds` "4" | "8" | "12" as a string, `size` "720x1280" | "1280x720" |
"1024x1792" | "1792x1024"; statuses queued, in_progress, completed, failed; Bearer key) and
https://developers.openai.com/api/docs/deprecations: OpenAI deprecated the Videos API,
`sora-2` and `sora-2-pro` on 2026-03-24 and removed them from the API on 2026-09-24, naming
no replacement. The adapter is kept for compatible servers (the fakes, or a provider that
speaks this protocol); OpenAI's own endpoint no longer answers it. provider.options are
added to the body, never over the model, seconds and size the job is charged for."""

from __future__ import annotations

from typing import Any

import httpx

from server.providers import http as provider_http
from server.providers.endpoint import Endpoint
from server.providers.failures import INVALID_RESPONSE, ProviderFailure
from server.providers.http import Downloads
from server.providers.video import VideoCall, VideoProgress
from server.providers.video_tasks import failed, field_of, merged

_RUNNING = ("queued", "in_progress", "processing", "pending")


class OpenAIVideoAdapter:
    def __init__(self, http: httpx.AsyncClient, downloads: Downloads | None = None) -> None:
        self._http = http
        self._downloads = downloads or Downloads(http)

    def _progress(self, body: dict[str, Any]) -> VideoProgress:
        status = body.get("status")
        job_id = body.get("id")
        if not isinstance(job_id, str) or not isinstance(status, str):
            raise ProviderFailure(INVALID_RESPONSE, "Provider returned an invalid response")
        if status in _RUNNING:
            return VideoProgress(state="running", provider_job_id=job_id)
        if status == "completed":
            return VideoProgress(state="completed", provider_job_id=job_id)
        return failed(job_id, field_of(body, "error", "message") or status)

    async def submit(self, endpoint: Endpoint, call: VideoCall) -> VideoProgress:
        params = call.params
        body = merged(
            {
                "model": call.model,
                "prompt": params.get("prompt", ""),
                "seconds": str(params["duration"]),
                "size": f"{params['width']}x{params['height']}",
            },
            call.options,
        )
        response = await provider_http.call(
            self._http, endpoint, "POST", f"{endpoint.base_url}/videos", json=body
        )
        return await self._finish(endpoint, self._progress(provider_http.json_object(response)))

    async def continue_job(
        self, endpoint: Endpoint, previous_provider_job_id: str, call: VideoCall
    ) -> VideoProgress:
        """A remix of the finished video under the new prompt (its size and length are the
        original's: the remix endpoint takes only the prompt)."""
        response = await provider_http.call(
            self._http,
            endpoint,
            "POST",
            f"{endpoint.base_url}/videos/{previous_provider_job_id}/remix",
            json={"prompt": call.params.get("prompt", "")},
        )
        return await self._finish(endpoint, self._progress(provider_http.json_object(response)))

    async def poll(
        self, endpoint: Endpoint, provider_job_id: str, call: VideoCall
    ) -> VideoProgress:
        response = await provider_http.call(
            self._http, endpoint, "GET", f"{endpoint.base_url}/videos/{provider_job_id}"
        )
        return await self._finish(endpoint, self._progress(provider_http.json_object(response)))

    async def _finish(self, endpoint: Endpoint, progress: VideoProgress) -> VideoProgress:
        if progress.state == "completed":
            content = self._downloads.remote(
                endpoint,
                f"{endpoint.base_url}/videos/{progress.provider_job_id}/content",
                headers=provider_http.authorized(endpoint),
            )
            progress.videos = [content]
        return progress
