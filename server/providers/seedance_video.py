"""ByteDance Seedance through BytePlus ModelArk's content-generation tasks API, as its API
reference documents it (https://docs.byteplus.com/en/docs/ModelArk, "Video generation API":
create a task, retrieve a task, cancel or delete a task; "Error codes").

Checked 2026-11-27 against https://docs.byteplus.com/en/docs/ModelArk (video generation API)
and https://docs.byteplus.com/docs/ModelArk/2291680 (Seedance 2.0 series tutorial); the
model IDs as ModelArk lists them (`dreamina-seedance-2-0-260128`,
`dreamina-seedance-2-0-fast-260128`, `seedance-1-5-pro-251215`, `seedance-1-0-pro-250528`).
Not settled from the documentation: whether Seedance 2.0 fast takes 1080p (resellers say
not), and the exact error code ModelArk gives frames mixed with references.

- `POST {base}/contents/generations/tasks` (`Authorization: Bearer <ARK API key>`)
  `{model, content: [{type: "text", text}, {type: "image_url", image_url: {url}, role:
  first_frame | last_frame | reference_image}, ...], resolution, ratio, duration, seed,
  generate_audio}` → `{id}`. The generation parameters go as body fields, the current form
  (the older `--resolution 720p --ratio 16:9 ...` flags inside the text are not used).
- `GET {base}/contents/generations/tasks/{id}` → `{id, status: queued | running | succeeded
  | failed | cancelled | expired, content: {video_url}, error: {code, message}, duration,
  usage}`; the MP4 is fetched from `content.video_url` (signed storage: no credential sent).
- `DELETE {base}/contents/generations/tasks/{id}` cancels a queued task (a running one cannot
  be stopped; the provider refuses, which the gateway ignores).
- Errors are `{"error": {"code", "message"}}`: 401 AuthenticationError, 429
  RateLimitExceeded / QuotaExceeded, 400 InputTextSensitiveContentDetected and the like for
  refused content (not retried elsewhere).

Mapping of the API reference's fields: resolution (480p/720p/1080p; others are left to the
model's default), aspect_ratio → `ratio` (16:9, 4:3, 1:1, 3:4, 9:16, 21:9), duration (2.0: 4-15
s), seed, generate_audio (Seedance 1.5+), frame_images → image content with role first_frame
/ last_frame, input_references → reference_image / reference_video / reference_audio (the
catalog's input_reference_types says which the model honours; the request drops the rest).
First/last-frame generation and reference generation are two modes: frames together with
references are a client error here, before any call. `provider.options.seedance` is
added to the body, never over what the gateway mapped (model, duration: what it
charges for) nor a callback URL (e.g. `{"camera_fixed": true, "watermark": false}`).

How an operator configures it: an endpoint `adapter = "seedance"`, `base_url =
"https://ark.ap-southeast.bytepluses.com/api/v3"` (an Ark key works in its own region only),
`api_key_env = "ARK_API_KEY"` (the environment variable holding the ModelArk API key) and
`model` the ModelArk model ID, e.g. `dreamina-seedance-2-0-260128`,
`seedance-1-5-pro-251215` or `seedance-1-0-pro-250528`.
"""

from __future__ import annotations

from typing import Any

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

RESOLUTIONS = ("480p", "720p", "1080p")
RATIOS = ("16:9", "4:3", "1:1", "3:4", "9:16", "21:9")
_REFERENCE_ROLES = {
    "image_url": "reference_image",
    "video_url": "reference_video",
    "audio_url": "reference_audio",
}
TASKS = "contents/generations/tasks"


def task_body(call: VideoCall) -> dict[str, Any]:
    params = call.params
    if params.get("frame_images") and params.get("input_references"):
        raise ProviderFailure(
            CLIENT_ERROR,
            "Seedance takes first/last frames or reference content, not both in one request",
        )
    content: list[dict[str, Any]] = []
    if params.get("prompt"):
        content.append({"type": "text", "text": params["prompt"]})
    for frame in params.get("frame_images", []):
        content.append(
            {"type": "image_url", "image_url": {"url": frame["url"]}, "role": frame["frame_type"]}
        )
    for reference in params.get("input_references", []):
        kind = reference["type"]
        content.append(
            {"type": kind, kind: {"url": reference["url"]}, "role": _REFERENCE_ROLES[kind]}
        )
    body: dict[str, Any] = {"model": call.model, "content": content}
    if params.get("resolution") in RESOLUTIONS:
        body["resolution"] = params["resolution"]
    if params.get("aspect_ratio") in RATIOS:
        body["ratio"] = params["aspect_ratio"]
    if "duration" in params:
        body["duration"] = params["duration"]
    if "seed" in params:
        body["seed"] = params["seed"]
    if "generate_audio" in params:
        body["generate_audio"] = bool(params["generate_audio"])
    return merged(body, call.options)


SPEC = TaskSpec(
    request=lambda call: (TASKS, task_body(call)),
    task_id=lambda answer, path, endpoint: answer.get("id"),
    id_pattern=TASK_ID,
    poll_path=TASKS + "/{task}",
    state=lambda answer: answer.get("status"),
    states=states_of(
        running=("queued", "running"),
        succeeded="succeeded",
        failed=("failed", "expired"),
        cancelled="cancelled",
    ),
    videos=lambda answer: [field_of(answer, "content", "video_url")],
    seconds=lambda answer: seconds_of(answer.get("duration")),
    error=lambda answer: field_of(answer, "error", "message") or field_of(answer, "error", "code"),
    # A running task cannot be stopped: the provider refuses, which the gateway ignores.
    cancel=("DELETE", TASKS + "/{task}"),
)


class SeedanceVideoAdapter(TaskVideoAdapter):
    spec = SPEC
