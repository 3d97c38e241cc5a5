"""fal.ai's queue, as fal documents it (https://docs.fal.ai/model-apis/model-endpoints/queue,
https://docs.fal.ai/model-apis/errors):

- submit `POST https://queue.fal.run/{model_id}` (`Authorization: Key <FAL_KEY>`, the model's
  input as the JSON body) → `{request_id, response_url, status_url, cancel_url}`. fal says to
  use the returned URLs: for a model id with a sub-path (`fal-ai/kling-video/v2.1/master/
  text-to-video`) they sit under the app id only (`…/fal-ai/kling-video/requests/{id}`).
- status `GET {response_url}/status` → `{status: IN_QUEUE | IN_PROGRESS | COMPLETED}` (a
  COMPLETED request that failed carries `error`); result `GET {response_url}` → the model's
  output, `{video: {url}}` for video models (an error status with fal's `{detail}` body when
  the run failed); cancel `PUT {response_url}/cancel`.
- Errors: `{"detail": "…"}` or, for invalid input, 422 `{"detail": [{loc, msg, type}]}` (a
  refused prompt is `type: content_policy_violation`): not retried elsewhere.

The job's provider_job_id is the path of `response_url` below the endpoint's base URL (e.g.
`fal-ai/kling-video/requests/764cabcf-…`): status_url and cancel_url are that URL plus
`/status` and `/cancel`, as fal builds them. A response_url off the endpoint's host (or
outside its base path) is refused as an invalid response, so a provider's answer can never
make the gateway send its key elsewhere; the video itself (fal's CDN) is fetched without it.

Mapping of the API reference's fields (fal's common video input names): prompt, duration,
resolution, aspect_ratio, seed, generate_audio; frame_images → `image_url` (first frame)
and `end_image_url` (last frame); image references → `reference_urls`; audio and video
references are dropped. `provider.options.fal` is added to the input in the model's own
names (e.g. `{"negative_prompt": "blur", "cfg_scale": 0.5}`), never over what the gateway
mapped (the duration it charges for) nor a callback URL.

Checked 2026-11-27 against https://docs.fal.ai/model-apis/model-endpoints/queue,
https://docs.fal.ai/model-apis/errors, fal-client's queue calls, and the model pages
https://fal.ai/models/fal-ai/kling-video/v2.6/pro/text-to-video/llms.txt and
https://fal.ai/docs/model-api-reference/video-generation-api/kling-video-v3-standard.md: the
queue protocol, auth and error bodies are as above. Not settled from the documentation, and
left as they are (the adapters get per-model shapes in a later issue): fal's Kling endpoints
up to v2.6 document `duration` as a string enum ("5", "10") where this adapter sends a
number, and the v3 text-to-video page's type could not be read; Kling v3 image-to-video on
fal is a separate endpoint taking `start_image_url` / `end_image_url`, so a first frame sent
as `image_url` to a text-to-video model id is not used by it.

How an operator configures it: an endpoint `adapter = "fal"`, `base_url =
"https://queue.fal.run"`, `api_key_env = "FAL_KEY"`, and `model` the fal model id, e.g.
`fal-ai/kling-video/v2.1/master/text-to-video`.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

import httpx

from server.providers import http as provider_http
from server.providers.endpoint import Endpoint
from server.providers.failures import INVALID_RESPONSE, ProviderFailure
from server.providers.http import Downloads
from server.providers.queue_video import queue_input
from server.providers.video import VideoCall, VideoProgress
from server.providers.video_tasks import failed, merged

AUTH_SCHEME = "Key"
_RUNNING = ("IN_QUEUE", "IN_PROGRESS")
_JOB_PATH = re.compile(r"^[A-Za-z0-9._~-]+(/[A-Za-z0-9._~-]+)*/requests/[A-Za-z0-9_-]+$")


def read_error(response: httpx.Response) -> provider_http.ErrorFields:
    """fal's error body: `{"detail": "…"}` or `{"detail": [{"loc", "msg", "type"}]}`."""
    detail = (provider_http.json_or_none(response) or {}).get("detail")
    if isinstance(detail, list) and detail and isinstance(detail[0], dict):
        return provider_http.error_fields(detail[0].get("type"), detail[0].get("msg"))
    return provider_http.error_fields(None, detail)


failure_of = provider_http.failure_reading(read_error)


def fal_input(call: VideoCall) -> dict[str, Any]:
    images_only = [r for r in call.params.get("input_references", []) if r["type"] == "image_url"]
    mapped = queue_input(
        replace(call, params={**call.params, "input_references": images_only}, options={})
    )
    return merged(mapped, call.options)


def _job_path(endpoint: Endpoint, response_url: object) -> str:
    """The path of fal's response_url below the endpoint's base URL, once it is checked."""
    base = str(endpoint.base_url).rstrip("/")
    if not provider_http.same_origin(response_url, base):
        raise ProviderFailure(INVALID_RESPONSE, "Provider returned a response URL off its host")
    path = urlsplit(str(response_url)).path[len(urlsplit(base).path) :].strip("/")
    if not _JOB_PATH.match(path):
        raise ProviderFailure(INVALID_RESPONSE, "Provider returned an invalid response URL")
    return path


class FalVideoAdapter:
    def __init__(self, http: httpx.AsyncClient, downloads: Downloads | None = None) -> None:
        self._http = http
        self._downloads = downloads or Downloads(http)

    async def _call(self, endpoint: Endpoint, method: str, url: str, **kwargs: Any) -> Any:
        return await provider_http.call(
            self._http,
            endpoint,
            method,
            url,
            auth_scheme=AUTH_SCHEME,
            failure_of=failure_of,
            **kwargs,
        )

    def _url(self, endpoint: Endpoint, provider_job_id: str, suffix: str = "") -> str:
        if not _JOB_PATH.match(provider_job_id):
            raise ProviderFailure(INVALID_RESPONSE, "Invalid fal request path")
        return f"{str(endpoint.base_url).rstrip('/')}/{provider_job_id}{suffix}"

    async def submit(self, endpoint: Endpoint, call: VideoCall) -> VideoProgress:
        response = await self._call(
            endpoint, "POST", f"{endpoint.base_url}/{call.model}", json=fal_input(call)
        )
        body = provider_http.json_object(response)
        return VideoProgress(
            state="running", provider_job_id=_job_path(endpoint, body.get("response_url"))
        )

    async def poll(
        self, endpoint: Endpoint, provider_job_id: str, call: VideoCall
    ) -> VideoProgress:
        status = provider_http.json_object(
            await self._call(endpoint, "GET", self._url(endpoint, provider_job_id, "/status"))
        )
        state = status.get("status")
        if state in _RUNNING:
            return VideoProgress(state="running", provider_job_id=provider_job_id)
        if state != "COMPLETED":
            raise ProviderFailure(INVALID_RESPONSE, "Provider returned an invalid status")
        if status.get("error"):
            return failed(provider_job_id, status["error"])
        result = provider_http.json_object(
            await self._call(endpoint, "GET", self._url(endpoint, provider_job_id))
        )
        entries = result.get("videos") or ([result["video"]] if "video" in result else [])
        urls = [e.get("url") if isinstance(e, dict) else None for e in entries]
        if not urls:
            raise ProviderFailure(INVALID_RESPONSE, "Provider returned no video URL")
        videos = [self._downloads.remote(endpoint, url) for url in urls]
        return VideoProgress(state="completed", provider_job_id=provider_job_id, videos=videos)

    async def cancel(self, endpoint: Endpoint, provider_job_id: str, call: VideoCall) -> None:
        await self._call(endpoint, "PUT", self._url(endpoint, provider_job_id, "/cancel"))
