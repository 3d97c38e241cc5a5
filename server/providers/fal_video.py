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

The `queue` adapter name is this adapter for servers that speak fal's queue protocol with
`Authorization: Bearer <key>` (the fakes, a self-hosted queue): it is the same adapter with
that one difference. Such a server may answer the submit with `{request_id}` only: the job
id is then that request id, its URLs `{model}/requests/{request_id}`, as fal builds them
for a model id without a sub-path. A `FAILED` status (such servers send it) fails the job;
a result file under the endpoint's base URL is fetched with the key, any other without.

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
from server.providers.video import VideoCall
from server.providers.video_tasks import (
    TaskSpec,
    TaskVideoAdapter,
    image_urls,
    key_auth,
    merged,
    states_of,
)

_REQUEST_ID = r"[A-Za-z0-9_-]{1,128}"
_SEGMENT = r"(?!\.\.?/)[A-Za-z0-9._~-]+"  # a path segment, never . or ..
# fal's job path (`fal-ai/kling-video/requests/{id}`), or a bare request id
_JOB_PATH = re.compile(rf"{_SEGMENT}(?:/{_SEGMENT})*/requests/{_REQUEST_ID}|{_REQUEST_ID}")


def read_error(response: httpx.Response) -> provider_http.ErrorFields:
    """fal's error body: `{"detail": "…"}` or `{"detail": [{"loc", "msg", "type"}]}`; an
    OpenAI-style `{"error": {...}}` from a queue server that answers so."""
    body = provider_http.json_or_none(response) or {}
    detail = body.get("detail")
    if isinstance(detail, list) and detail and isinstance(detail[0], dict):
        return provider_http.error_fields(detail[0].get("type"), detail[0].get("msg"))
    if detail is None and "error" in body:
        return provider_http.openai_error(response)
    return provider_http.error_fields(None, detail)


failure_of = provider_http.failure_reading(read_error)


def fal_input(call: VideoCall) -> dict[str, Any]:
    """fal's common video input names; images only (audio and video references dropped)."""
    params = call.params
    first, last, references = image_urls(params)
    body: dict[str, Any] = {
        "prompt": params.get("prompt", ""),
        "duration": params["duration"],
        "resolution": params.get("resolution"),
        "aspect_ratio": params.get("aspect_ratio"),
        "generate_audio": params.get("generate_audio", False),
        "seed": params.get("seed"),
        "image_url": first,
        "end_image_url": last,
        "reference_urls": references or None,
    }
    # What the gateway mapped wins over provider.options (the duration it charges for).
    return merged(body, call.options)


def job_path(answer: dict[str, Any], path: str, endpoint: Endpoint) -> object:
    """The path of fal's response_url below the endpoint's base URL, once it is checked (a
    response_url off the endpoint's host is refused); the request_id when the answer has
    no response_url."""
    response_url = answer.get("response_url")
    if response_url is None:
        return answer.get("request_id")
    base = str(endpoint.base_url).rstrip("/")
    if not provider_http.same_origin(response_url, base) or not str(response_url).isprintable():
        raise ProviderFailure(INVALID_RESPONSE, "Provider returned a response URL off its host")
    return urlsplit(str(response_url)).path[len(urlsplit(base).path) :].strip("/")


def _located(task_id: str, call: VideoCall) -> str:
    return task_id if "/requests/" in task_id else f"{call.model}/requests/{task_id}"


def _state(answer: dict[str, Any]) -> object:
    status = answer.get("status")
    return "FAILED" if status == "COMPLETED" and answer.get("error") else status


def _videos(result: dict[str, Any]) -> list[object]:
    entries = result.get("videos") or ([result["video"]] if "video" in result else [])
    return [e.get("url") if isinstance(e, dict) else None for e in entries]


SPEC = TaskSpec(
    request=lambda call: (call.model, fal_input(call)),
    task_id=job_path,
    id_pattern=_JOB_PATH,
    poll_path="{task}/status",
    state=_state,
    states=states_of(
        running=("IN_QUEUE", "IN_PROGRESS"), succeeded="COMPLETED", failed=("FAILED",)
    ),
    result_path=lambda answer, task: task,
    videos=_videos,
    error=lambda answer: answer.get("error"),
    failure_of=failure_of,
    cancel=("PUT", "{task}/cancel"),
    auth=key_auth("Key"),
    locate=_located,
)
# The `queue` adapter: the same protocol with `Authorization: Bearer`.
QUEUE_SPEC = replace(SPEC, auth=key_auth("Bearer"))


class FalVideoAdapter(TaskVideoAdapter):
    spec = SPEC
