"""Kling (catalog adapter `kling`).

Checked 2026-11-27 against https://app.klingai.com/global/dev/document-api/apiReference/
commonInfo, .../apiReference/model/textToVideo, .../imageToVideo, .../multiImageToVideo (and,
for Kling 3.0, resellers' copies of its fields: model_name `kling-v3`, duration "3".."15",
aspect_ratio 16:9 / 9:16 / 1:1, mode std / pro, sound on / off). Not settled from the
documentation: whether Kling's newer console API keys replace the access/secret-key JWT for
every account (the JWT is what the reference documents, and what this adapter sends), and
the exact error code Kling gives a duration a model does not offer.

Protocol (https://app.klingai.com/global/dev/document-api/apiReference/commonInfo and the
video model pages under .../apiReference/model/): every request carries
`Authorization: Bearer <JWT>`, an HS256 JWT `{"iss": access key, "exp": now + 1800,
"nbf": now - 5}` signed with the secret key (minted with PyJWT; short-lived, so one per
request). Create a task `POST {base}/v1/videos/text2video`, `/v1/videos/image2video` (with a
first/last frame) or `/v1/videos/multi-image2video` (image references only); query it with
`GET {base}/v1/videos/<same kind>/{task_id}`. Every answer is `{code, message, request_id,
data: {task_id, task_status: submitted|processing|succeed|failed, task_status_msg,
task_result: {videos: [{id, url, duration}]}}}`; the video URL is downloaded without
credentials. The job id kept by the gateway is `<kind>/<task_id>`.

Field mapping: prompt; duration → `duration` ("5"/"10"); aspect_ratio → `aspect_ratio`
(text and multi-image only: image2video takes the frame's); resolution → `mode`
(`pro` for 1080p and above, `std` below); generate_audio → `sound: "on"` (models with sound);
frame_images → `image` / `image_tail` and image references → `image_list` (URLs, or raw
base64 for data: URLs). Dropped: `seed` (Kling has none), audio/video references.
`provider.options[<slug>]` are merged into the task body (e.g. `negative_prompt`,
`cfg_scale`, `camera_control`); mapped fields win and `callback_url` is not forwarded.
Kling's codes: 1000-1004 (authentication), 1100-1102
(account in arrears / resources used up), 1103 and 1304 (no permission, IP allow-list) →
rejected credentials; 1302/1303 (too fast, over concurrency) → rate limited with
Retry-After when sent; 1300/1301 (platform policy, content safety) and 12xx (bad
parameters) → the request's fault; 5000/5001 → server error; 5002 → timeout. A `failed`
task fails the job with `task_status_msg`. Kling documents no cancel call.

How an operator configures it: an endpoint `adapter = "kling"`,
`base_url = "https://api-singapore.klingai.com"` (Beijing: `https://api-beijing.klingai.com`),
`api_key_env = "KLING_ACCESS_KEY"`, `secret_key_env = "KLING_SECRET_KEY"` (the key pair from
the Kling developer console) and `model` = Kling's `model_name`, e.g. `kling-v3`,
`kling-v2-1-master`, `kling-v2-5-turbo`, `kling-v1-6`. Durations 5 / 10 s (kling-v3: 3-15 s);
aspect ratios 16:9, 9:16, 1:1."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import timedelta
from typing import Any

import httpx
import jwt

from server.clock import Clock
from server.providers.endpoint import Endpoint
from server.providers.failures import (
    CLIENT_ERROR,
    INVALID_RESPONSE,
    RATE_LIMITED,
    REJECTED_CREDENTIALS,
    SERVER_ERROR,
    TIMEOUT,
    ProviderFailure,
)
from server.providers.http import Downloads, data_url_image, http_failure, json_object, json_or_none
from server.providers.video import VideoCall
from server.providers.video_tasks import (
    Stage,
    TaskSpec,
    TaskVideoAdapter,
    field_of,
    image_urls,
    merged,
    seconds_of,
    states_of,
)

TOKEN_LIFETIME = timedelta(minutes=30)
TOKEN_LEEWAY = timedelta(seconds=5)  # nbf in the past: the provider's clock may lag
KINDS = ("text2video", "image2video", "multi-image2video")
MAX_IMAGE_LIST = 4
# The job id the gateway keeps is `<kind>/<task_id>`; it becomes part of a URL path.
_JOB_ID = re.compile(rf"(?:{'|'.join(KINDS)})/[A-Za-z0-9_-]{{1,128}}")
_CREDENTIAL_CODES = {1000, 1001, 1002, 1003, 1004, 1100, 1101, 1102, 1103, 1304}
_RATE_CODES = {1302, 1303}


def failure_of(response: httpx.Response, body: dict[str, Any] | None = None) -> ProviderFailure:
    """Kling's failure: its `code` decides; the HTTP status when there is none."""
    body = body if body is not None else json_or_none(response) or {}
    code = body.get("code")
    status = response.status_code
    if code in _CREDENTIAL_CODES or (code is None and status in (401, 403)):
        kind = REJECTED_CREDENTIALS
    elif code in _RATE_CODES or (code is None and status == 429):
        kind = RATE_LIMITED
    elif code == 5002 or status == 504:
        kind = TIMEOUT
    elif (isinstance(code, int) and (1200 <= code < 1300 or code in (1300, 1301))) or (
        code is None and 400 <= status < 500 and status not in (408, 409)
    ):
        kind = CLIENT_ERROR
    else:
        kind = SERVER_ERROR
    provider_code = code if isinstance(code, int) else status
    return http_failure(kind, response, provider_code, str(body.get("message") or ""))


def _image(url: str) -> str:
    """Kling takes an image URL, or its raw base64 (no data: prefix)."""
    image = data_url_image(url)
    return image.base64 if image is not None else url


def task_body(call: VideoCall) -> tuple[str, dict[str, Any]]:
    """(path, body) of the create-task request."""
    params = call.params
    first, last, references = image_urls(params)
    body: dict[str, Any] = {
        "model_name": call.model,
        "prompt": params.get("prompt", ""),
        "duration": str(params["duration"]),
        # Kling's modes: std is 720p, pro is 1080p.
        "mode": "pro" if params.get("resolution") in ("1080p", "1K", "2K", "4K") else "std",
    }
    if params.get("generate_audio"):
        body["sound"] = "on"
    if first or last:
        kind = "image2video"
        if first:
            body["image"] = _image(first)
        if last:
            body["image_tail"] = _image(last)
    elif references:
        kind = "multi-image2video"
        body["image_list"] = [{"image": _image(url)} for url in references[:MAX_IMAGE_LIST]]
        body["aspect_ratio"] = params.get("aspect_ratio")
    else:
        kind = "text2video"
        body["aspect_ratio"] = params.get("aspect_ratio")
    return f"v1/videos/{kind}", merged(body, call.options)


def data(response: httpx.Response, stage: Stage) -> dict[str, Any]:
    """The answer's `data`; a `code` other than 0 is a failure, even with HTTP 200."""
    answer = json_object(response)
    if answer.get("code") != 0:
        raise failure_of(response, answer)
    payload = answer.get("data")
    if not isinstance(payload, dict):
        raise ProviderFailure(INVALID_RESPONSE, "Provider returned an invalid response")
    return payload


def _job_id(data: dict[str, Any], path: str, endpoint: Endpoint) -> object:
    task_id = data.get("task_id")
    return f"{path.rsplit('/', 1)[-1]}/{task_id}" if isinstance(task_id, str) else None


def _entries(data: dict[str, Any]) -> list[Any]:
    entries = field_of(data, "task_result", "videos")
    return entries if isinstance(entries, list) else []


def _seconds(data: dict[str, Any]) -> float | None:
    reported = (seconds_of(field_of(e, "duration")) for e in _entries(data))
    return next((s for s in reported if s is not None), None)


SPEC = TaskSpec(
    request=task_body,
    task_id=_job_id,
    id_pattern=_JOB_ID,
    poll_path="v1/videos/{task}",
    state=lambda data: data.get("task_status"),
    states=states_of(running=("submitted", "processing"), succeeded="succeed", failed=("failed",)),
    videos=lambda data: [field_of(e, "url") for e in _entries(data)],
    seconds=_seconds,
    error=lambda data: data.get("task_status_msg"),
    failure_of=failure_of,
    answer=data,
)


class JwtAuth:
    """`Authorization: Bearer <JWT>`: an HS256 JWT of the access key signed with the secret
    key, minted for each request (it is short-lived) at the injected clock's time."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    def __call__(self, endpoint: Endpoint) -> dict[str, str]:
        access_key, secret_key = endpoint.credential(), endpoint.secret()
        if not access_key or not secret_key:
            raise ProviderFailure(REJECTED_CREDENTIALS, "No credential is configured")
        now = self._clock.now()
        claims = {
            "iss": access_key,
            "exp": int((now + TOKEN_LIFETIME).timestamp()),
            "nbf": int((now - TOKEN_LEEWAY).timestamp()),
        }
        token = jwt.encode(claims, secret_key, algorithm="HS256", headers={"typ": "JWT"})
        return {"Authorization": f"Bearer {token}"}


class KlingVideoAdapter(TaskVideoAdapter):
    """Kling's task API with its JWT, minted at `clock`'s time."""

    spec = SPEC

    def __init__(
        self, http: httpx.AsyncClient, clock: Clock, downloads: Downloads | None = None
    ) -> None:
        super().__init__(http, downloads, spec=replace(SPEC, auth=JwtAuth(clock)))
