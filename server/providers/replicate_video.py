"""Replicate predictions, as Replicate documents them
(https://replicate.com/docs/reference/http#models.predictions.create,
https://replicate.com/docs/reference/http#predictions.get,
https://replicate.com/docs/reference/http#predictions.cancel,
https://replicate.com/docs/topics/predictions/rate-limits):

- `POST {base}/models/{owner}/{name}/predictions` (`Authorization: Bearer <token>`)
  `{input: {...}}` → 201 the prediction `{id, status, urls, ...}`; a model pinned to a
  version (`owner/name:version`) goes to `POST {base}/predictions` `{version, input}`.
- `GET {base}/predictions/{id}` → `{status: starting | processing | succeeded | failed |
  canceled, output: a URL or a list of URLs, error}`; the output files are fetched without
  the token (replicate.delivery).
- `POST {base}/predictions/{id}/cancel`.
- Errors are problem details `{"title", "detail", "status"}`; 429 says when to come back in
  `Retry-After` or in the detail ("Request was throttled. Expected available in 3
  seconds."); 422 is invalid input. A refused prompt fails the prediction (`error`).

Mapping of the API reference's fields (the input names most Replicate video models use):
prompt, duration, resolution, aspect_ratio, seed, generate_audio; frame_images → `image`
(first frame) and `last_frame_image`; image references → `reference_images`; audio and video
references are dropped. Replicate does not report the output's length, so the job is billed
on the requested duration. `provider.options.replicate` is added to `input` in the model's
own names (e.g. `{"start_image": "https://…", "negative_prompt": "blur"}`), never over what
the gateway mapped (the duration it charges for) nor a callback URL.

Checked 2026-11-27 against the pages above and replicate-python's predictions calls: the
protocol, auth (`Authorization: Bearer`), statuses and error bodies are as above. Input names
are each model's own; the common ones above are not every model's (Kling 3.0 on Replicate,
`kwaivgi/kling-v3-video`, takes `start_image` / `end_image` and `mode` standard | pro, not
`image` / `resolution`): not checked per model here (a later issue gives the adapters
per-model shapes).

How an operator configures it: an endpoint `adapter = "replicate"`, `base_url =
"https://api.replicate.com/v1"`, `api_key_env = "REPLICATE_API_TOKEN"`, and `model`
`owner/name` (e.g. `bytedance/seedance-1-pro`, `wan-video/wan-2.5-t2v`) or
`owner/name:version`.
"""

from __future__ import annotations

import re
from typing import Any

import httpx

from server.providers import http as provider_http
from server.providers.failures import RATE_LIMITED, ProviderFailure
from server.providers.video import VideoCall
from server.providers.video_tasks import (
    TaskSpec,
    TaskVideoAdapter,
    merged,
    states_of,
)

_THROTTLED = re.compile(r"available in (\d+) seconds?", re.IGNORECASE)


def read_error(response: httpx.Response) -> provider_http.ErrorFields:
    """Replicate's problem details: `{"title", "detail", "status"}`."""
    body = provider_http.json_or_none(response) or {}
    return provider_http.error_fields(body.get("title"), body.get("detail"))


def failure_of(response: httpx.Response) -> ProviderFailure:
    """The status decides; a 429 without Retry-After says when in its detail ("Request was
    throttled. Expected available in 3 seconds.")."""
    failure = provider_http.failure_from_response(response, read_error)
    if failure.kind == RATE_LIMITED and failure.retry_after is None:
        match = _THROTTLED.search(read_error(response)[1])
        failure.retry_after = int(match.group(1)) if match else None
    return failure


def prediction_input(call: VideoCall) -> dict[str, Any]:
    params = call.params
    body: dict[str, Any] = {"prompt": params.get("prompt", "")}
    for name in ("duration", "resolution", "aspect_ratio", "seed"):
        if params.get(name) is not None:
            body[name] = params[name]
    if "generate_audio" in params:
        body["generate_audio"] = bool(params["generate_audio"])
    for frame in params.get("frame_images", []):
        body["image" if frame["frame_type"] == "first_frame" else "last_frame_image"] = frame["url"]
    images = [r["url"] for r in params.get("input_references", []) if r["type"] == "image_url"]
    if images:
        body["reference_images"] = images
    return merged(body, call.options)


def prediction_request(call: VideoCall) -> tuple[str, dict[str, Any]]:
    """A model pinned to a version (`owner/name:version`) goes to /predictions."""
    owner_name, _, version = call.model.partition(":")
    if version:
        return "predictions", {"version": version, "input": prediction_input(call)}
    return f"models/{owner_name}/predictions", {"input": prediction_input(call)}


def _output(answer: dict[str, Any]) -> list[object]:
    output = answer.get("output")
    return output if isinstance(output, list) else [output]


SPEC = TaskSpec(
    request=prediction_request,
    task_id=lambda answer, path, endpoint: answer.get("id"),
    id_pattern=re.compile(r"[A-Za-z0-9]{1,64}"),
    poll_path="predictions/{task}",
    state=lambda answer: answer.get("status"),
    states=states_of(
        running=("starting", "processing"),
        succeeded="succeeded",
        failed=("failed",),
        cancelled="canceled",
    ),
    videos=_output,
    error=lambda answer: answer.get("error"),
    failure_of=failure_of,
    cancel=("POST", "predictions/{task}/cancel"),
)


class ReplicateVideoAdapter(TaskVideoAdapter):
    spec = SPEC
