"""Alibaba Wan through DashScope (Alibaba Cloud Model Studio), as its API references document it.

Checked 2026-11-27 against:
https://www.alibabacloud.com/help/en/model-studio/text-to-video-api-reference (Wan 2.7,
updated 2026-06-16), https://www.alibabacloud.com/help/en/model-studio/wan-image-to-video-guide
(Wan 2.7 image-to-video), https://docs.platform.qianwenai.com/developer-guides/video-generation/
image-to-video-first-last, the Wan 2.6 / 2.5 size tables of the earlier protocol
(https://www.alibabacloud.com/help/en/model-studio/text-to-video-api-reference before 2.7, as
mirrored by providers that resell it), https://www.alibabacloud.com/help/en/model-studio/
error-code, and dashscope-sdk-python (VideoSynthesis).

- `POST {base}/services/aigc/video-generation/video-synthesis` with `X-DashScope-Async:
  enable` (`Authorization: Bearer <key>`) `{model, input: {prompt, negative_prompt?,
  audio_url?, img_url? | media?}, parameters: {...}}` → `{output: {task_id, task_status},
  request_id}`; first-and-last-frame models before 2.7 (wan2.1-kf2v-plus, wan2.2-kf2v-flash)
  take `input: {first_frame_url, last_frame_url}` at `{base}/services/aigc/image2video/
  video-synthesis`.
- The parameters differ by model version:
  - wan2.7 (the new protocol): `resolution` (720P | 1080P) and, text-to-video, `ratio`
    (16:9, 9:16, 1:1, 4:3, 3:4); it does not read `size`. Duration 2-15 s. Images go in
    `input.media` (`{type: first_frame | last_frame | driving_audio, url}`), the image fixing
    the ratio. The reference documents no `audio` switch (the video has sound, or follows
    `audio_url`), so none is sent: a request's generate_audio=false is not honoured on 2.7
    (unconfirmed whether it can be).
  - earlier text-to-video (wan2.6, wan2.5, ...): `size` `W*H` from the documented table only
    (SIZES: 1080P 1:1 is 1440*1440, 720P 4:3 is 1088*832, ...); a shape outside it is a
    client error here, before any call. `audio` (Wan 2.5+). Image-to-video: `resolution`
    (480P/720P/1080P), the frame fixing the shape.
- `GET {base}/tasks/{task_id}` → `{output: {task_status: PENDING | RUNNING | SUCCEEDED |
  FAILED | CANCELED | UNKNOWN, video_url, code, message}, usage: {video_duration}}` (wan2.7:
  `usage.output_video_duration`).
- `POST {base}/tasks/{task_id}/cancel` cancels a PENDING task.
- Errors are `{"request_id", "code", "message"}`: 401 InvalidApiKey, 429 Throttling.*,
  400 InvalidParameter, 400 DataInspectionFailed for refused content (not retried elsewhere).

Also mapped: seed; an audio reference → `input.audio_url` (2.7 image-to-video: a
`driving_audio` media entry); video references are not supported and dropped.
`provider.options.dashscope` entries go to `parameters`, never over what the gateway mapped
(duration, size / resolution / ratio: what it charges for) (e.g. `{"prompt_extend": false,
"watermark": false}`), except `negative_prompt`, which DashScope takes in `input`. A task
id that is UNKNOWN (expired after 24 h) fails the job.

How an operator configures it: an endpoint `adapter = "dashscope"`, `base_url =
"https://dashscope-intl.aliyuncs.com/api/v1"` (Singapore; the reference recommends the
workspace host `https://{WorkspaceId}.ap-southeast-1.maas.aliyuncs.com/api/v1`, the old one
"remains fully functional"; `https://dashscope.aliyuncs.com/api/v1` for Beijing,
`https://dashscope-us.aliyuncs.com/api/v1` for Virginia: the key, model and URL must share a
region), `api_key_env = "DASHSCOPE_API_KEY"`, and `model` the Wan model name, e.g.
`wan2.7-t2v`, `wan2.7-i2v`, `wan2.6-t2v`, `wan2.5-i2v-preview`, `wan2.1-kf2v-plus`.
"""

from __future__ import annotations

from typing import Any

import httpx

from server.providers import http as provider_http
from server.providers.failures import CLIENT_ERROR, ProviderFailure
from server.providers.video import VideoCall
from server.providers.video_tasks import (
    TASK_ID,
    TaskSpec,
    TaskVideoAdapter,
    field_of,
    merged,
    seconds_of,
    states_of,
)

_INPUT_OPTIONS = ("negative_prompt",)
TEXT_OR_FIRST_FRAME_PATH = "services/aigc/video-generation/video-synthesis"
FIRST_AND_LAST_FRAME_PATH = "services/aigc/image2video/video-synthesis"
# The `size` values the size-taking Wan models accept, by tier and ratio (480P: wan2.5 and
# earlier only; wan2.6 has 720P and 1080P).
SIZES = {
    ("480P", "16:9"): "832*480",
    ("480P", "9:16"): "480*832",
    ("480P", "1:1"): "624*624",
    ("720P", "16:9"): "1280*720",
    ("720P", "9:16"): "720*1280",
    ("720P", "1:1"): "960*960",
    ("720P", "4:3"): "1088*832",
    ("720P", "3:4"): "832*1088",
    ("1080P", "16:9"): "1920*1080",
    ("1080P", "9:16"): "1080*1920",
    ("1080P", "1:1"): "1440*1440",
    ("1080P", "4:3"): "1632*1248",
    ("1080P", "3:4"): "1248*1632",
}
# Wan 2.7's resolution + ratio protocol (the models named wan2.7-...).
NEW_PROTOCOL_PREFIX = "wan2.7"


def _tier(params: dict[str, Any]) -> str:
    return str(params.get("resolution", "")).upper()


def _size(params: dict[str, Any]) -> str:
    size = SIZES.get((_tier(params), str(params.get("aspect_ratio"))))
    if size is None:
        raise ProviderFailure(
            CLIENT_ERROR,
            f"DashScope has no size for {params.get('resolution')} at {params.get('aspect_ratio')}",
        )
    return size


def read_error(response: httpx.Response) -> provider_http.ErrorFields:
    """DashScope's error body: `{"request_id", "code", "message"}`."""
    body = provider_http.json_or_none(response) or {}
    return provider_http.error_fields(body.get("code"), body.get("message"))


failure_of = provider_http.failure_reading(read_error)


def task_request(call: VideoCall) -> tuple[str, dict[str, Any]]:
    """The path and body that start the task."""
    params = call.params
    new_protocol = call.model.startswith(NEW_PROTOCOL_PREFIX)
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
    images = first is not None or "last_frame" in frames
    if images and new_protocol:
        media = [{"type": "first_frame", "url": first}] if first is not None else []
        if "last_frame" in frames:
            media.append({"type": "last_frame", "url": frames["last_frame"]})
        media += [{"type": "driving_audio", "url": url} for url in audio_refs[:1]]
        task_input["media"] = media
    elif "last_frame" in frames:
        path = FIRST_AND_LAST_FRAME_PATH
        if first is not None:
            task_input["first_frame_url"] = first
        task_input["last_frame_url"] = frames["last_frame"]
    elif first is not None:
        task_input["img_url"] = first
    if images:
        if _tier(params) in ("480P", "720P", "1080P"):
            parameters["resolution"] = _tier(params)
    elif new_protocol:
        if _tier(params):
            parameters["resolution"] = _tier(params)
        if params.get("aspect_ratio"):
            parameters["ratio"] = params["aspect_ratio"]
    elif "resolution" in params and "aspect_ratio" in params:
        parameters["size"] = _size(params)
    if audio_refs and "media" not in task_input:
        task_input["audio_url"] = audio_refs[0]
    if "duration" in params:
        parameters["duration"] = params["duration"]
    if "seed" in params:
        parameters["seed"] = params["seed"]
    # Explicit both ways where documented (Wan 2.5/2.6 add audio unless told not to).
    if "generate_audio" in params and not new_protocol:
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


def _seconds(answer: dict[str, Any]) -> float | None:
    usage = answer.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    # wan2.7 reports output_video_duration; earlier models video_duration.
    return seconds_of(usage.get("output_video_duration", usage.get("video_duration")))


SPEC = TaskSpec(
    request=task_request,
    task_id=lambda answer, path, endpoint: field_of(answer, "output", "task_id"),
    id_pattern=TASK_ID,
    poll_path="tasks/{task}",
    state=lambda answer: field_of(answer, "output", "task_status"),
    # UNKNOWN: the task expired (after 24 h)
    states=states_of(
        running=("PENDING", "RUNNING"),
        succeeded="SUCCEEDED",
        failed=("FAILED", "UNKNOWN"),
        cancelled="CANCELED",
    ),
    videos=lambda answer: [field_of(answer, "output", "video_url")],
    seconds=_seconds,
    error=lambda answer: (
        field_of(answer, "output", "message") or field_of(answer, "output", "code")
    ),
    failure_of=failure_of,
    cancel=("POST", "tasks/{task}/cancel"),
    submit_headers={"X-DashScope-Async": "enable"},
)


class DashScopeVideoAdapter(TaskVideoAdapter):
    spec = SPEC
