"""Alibaba Wan through DashScope (Alibaba Cloud Model Studio), as its API references document it
(https://www.alibabacloud.com/help/en/model-studio/text-to-video-api-reference,
https://www.alibabacloud.com/help/en/model-studio/image-to-video-api-reference, the first-and-
last-frame reference, and https://www.alibabacloud.com/help/en/model-studio/error-code):

- `POST {base}/services/aigc/video-generation/video-synthesis` with `X-DashScope-Async:
  enable` (`Authorization: Bearer <key>`) `{model, input: {prompt, img_url?, audio_url?},
  parameters: {size | resolution, duration, seed, prompt_extend, audio}}` → `{output:
  {task_id, task_status}, request_id}`; first-and-last-frame models (wan2.1-kf2v-plus) take
  `input: {first_frame_url, last_frame_url}` at `{base}/services/aigc/image2video/
  video-synthesis`.
- `GET {base}/tasks/{task_id}` → `{output: {task_status: PENDING | RUNNING | SUCCEEDED |
  FAILED | CANCELED | UNKNOWN, video_url, code, message}, usage: {video_duration}}`.
- `POST {base}/tasks/{task_id}/cancel` cancels a PENDING task.
- Errors are `{"request_id", "code", "message"}`: 401 InvalidApiKey, 429 Throttling.*,
  400 DataInspectionFailed for refused content (not retried elsewhere).

Mapping of the API reference's fields: text-to-video gets `size` as `W*H` from the request's
dimensions; image-to-video (a first frame, or else the first image reference) gets
`resolution` (480P/720P/1080P) instead, the frame fixing the shape; duration, seed, and
generate_audio → `audio` (Wan 2.5+); an audio reference → `input.audio_url` when the model
honours audio references; video references are not supported and dropped.
`provider.options.dashscope` entries go to `parameters`, never over what the gateway mapped
(duration, size: what it charges for) (e.g. `{"prompt_extend": false, "watermark": false}`),
except `negative_prompt`, which DashScope takes in `input`. A task
id that is UNKNOWN (expired after 24 h) fails the job.

How an operator configures it: an endpoint `adapter = "dashscope"`, `base_url =
"https://dashscope-intl.aliyuncs.com/api/v1"` (Singapore; `https://dashscope.aliyuncs.com/
api/v1` for Beijing, `https://dashscope-us.aliyuncs.com/api/v1` for Virginia: the key, model
and URL must share a region), `api_key_env = "DASHSCOPE_API_KEY"`, and `model` the Wan
model name, e.g. `wan2.5-t2v-preview`, `wan2.5-i2v-preview`, `wan2.1-kf2v-plus`.
"""

from __future__ import annotations

import re
from typing import Any

import httpx

from server.providers import http as provider_http
from server.providers.endpoint import Endpoint
from server.providers.failures import INVALID_RESPONSE, ProviderFailure
from server.providers.http import Downloads
from server.providers.video import VideoCall, VideoProgress
from server.providers.video_tasks import failed, merged, seconds_of

_RUNNING = ("PENDING", "RUNNING")
_TASK_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_INPUT_OPTIONS = ("negative_prompt",)
TEXT_OR_FIRST_FRAME_PATH = "services/aigc/video-generation/video-synthesis"
FIRST_AND_LAST_FRAME_PATH = "services/aigc/image2video/video-synthesis"


def read_error(response: httpx.Response) -> provider_http.ErrorFields:
    """DashScope's error body: `{"request_id", "code", "message"}`."""
    body = provider_http.json_or_none(response) or {}
    return provider_http.error_fields(body.get("code"), body.get("message"))


failure_of = provider_http.failure_reading(read_error)


def task_request(call: VideoCall) -> tuple[str, dict[str, Any]]:
    """The path and body that start the task."""
    params = call.params
    frames = {f["frame_type"]: f["url"] for f in params.get("frame_images", [])}
    references = params.get("input_references", [])
    image_refs = [r["url"] for r in references if r["type"] == "image_url"]
    audio_refs = [r["url"] for r in references if r["type"] == "audio_url"]
    task_input: dict[str, Any] = {}
    if params.get("prompt"):
        task_input["prompt"] = params["prompt"]
    parameters: dict[str, Any] = {}
    path = TEXT_OR_FIRST_FRAME_PATH
    first = frames.get("first_frame") or (image_refs[0] if image_refs else None)
    if "last_frame" in frames:
        path = FIRST_AND_LAST_FRAME_PATH
        if first is not None:
            task_input["first_frame_url"] = first
        task_input["last_frame_url"] = frames["last_frame"]
    elif first is not None:
        task_input["img_url"] = first
    if "img_url" in task_input or "last_frame_url" in task_input:
        resolution = str(params.get("resolution", "")).upper()
        if resolution in ("480P", "720P", "1080P"):
            parameters["resolution"] = resolution
    elif "width" in params and "height" in params:
        parameters["size"] = f"{params['width']}*{params['height']}"
    if audio_refs:
        task_input["audio_url"] = audio_refs[0]
    if "duration" in params:
        parameters["duration"] = params["duration"]
    if "seed" in params:
        parameters["seed"] = params["seed"]
    if "generate_audio" in params:  # explicit both ways: Wan 2.5+ adds audio unless told not to
        parameters["audio"] = bool(params["generate_audio"])
    options = dict(call.options)
    for name in _INPUT_OPTIONS:
        if name in options:
            task_input[name] = options.pop(name)
    return path, {
        "model": call.model,
        "input": task_input,
        "parameters": merged(parameters, options),
    }


def _task_id(value: object) -> str:
    if not isinstance(value, str) or not _TASK_ID.match(value):
        raise ProviderFailure(INVALID_RESPONSE, "Provider returned an invalid task id")
    return value


class DashScopeVideoAdapter:
    def __init__(self, http: httpx.AsyncClient, downloads: Downloads | None = None) -> None:
        self._http = http
        self._downloads = downloads or Downloads(http)

    async def submit(self, endpoint: Endpoint, call: VideoCall) -> VideoProgress:
        path, body = task_request(call)
        response = await provider_http.call(
            self._http,
            endpoint,
            "POST",
            f"{endpoint.base_url}/{path}",
            json=body,
            headers={"X-DashScope-Async": "enable"},
            failure_of=failure_of,
        )
        output = provider_http.json_object(response).get("output")
        task_id = _task_id(output.get("task_id") if isinstance(output, dict) else None)
        return VideoProgress(state="running", provider_job_id=task_id)

    async def poll(
        self, endpoint: Endpoint, provider_job_id: str, call: VideoCall
    ) -> VideoProgress:
        url = f"{endpoint.base_url}/tasks/{_task_id(provider_job_id)}"
        body = provider_http.json_object(
            await provider_http.call(self._http, endpoint, "GET", url, failure_of=failure_of)
        )
        output = body.get("output")
        if not isinstance(output, dict) or not isinstance(output.get("task_status"), str):
            raise ProviderFailure(INVALID_RESPONSE, "Provider returned an invalid response")
        status = output["task_status"]
        if status in _RUNNING:
            return VideoProgress(state="running", provider_job_id=provider_job_id)
        if status == "SUCCEEDED":
            video = self._downloads.remote(endpoint, output.get("video_url"))
            usage = body.get("usage")
            duration = usage.get("video_duration") if isinstance(usage, dict) else None
            seconds = seconds_of(duration)
            return VideoProgress(
                state="completed", provider_job_id=provider_job_id, videos=[video], seconds=seconds
            )
        detail = output.get("message") or output.get("code") or status
        return failed(provider_job_id, detail)

    async def cancel(self, endpoint: Endpoint, provider_job_id: str, call: VideoCall) -> None:
        url = f"{endpoint.base_url}/tasks/{_task_id(provider_job_id)}/cancel"
        await provider_http.call(self._http, endpoint, "POST", url, failure_of=failure_of)
