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
from server.providers.http import (
    Downloads,
    data_url_image,
    http_failure,
    json_object,
    json_or_none,
    send,
)
from server.providers.video import VideoCall, VideoProgress
from server.providers.video_tasks import failed, image_urls, merged, seconds_of

TOKEN_LIFETIME = timedelta(minutes=30)
TOKEN_LEEWAY = timedelta(seconds=5)  # nbf in the past: the provider's clock may lag
KINDS = ("text2video", "image2video", "multi-image2video")
MAX_IMAGE_LIST = 4
_RUNNING = ("submitted", "processing")
_TASK_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")  # it becomes part of a URL path
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
    """(kind, body) of the create-task request."""
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
    body = {k: v for k, v in body.items() if v is not None}
    return kind, merged(body, call.options)


class KlingVideoAdapter:
    def __init__(
        self, http: httpx.AsyncClient, clock: Clock, downloads: Downloads | None = None
    ) -> None:
        self._http = http
        self._clock = clock
        self._downloads = downloads or Downloads(http)

    def _token(self, endpoint: Endpoint) -> str:
        access_key, secret_key = endpoint.credential(), endpoint.secret()
        if not access_key or not secret_key:
            raise ProviderFailure(REJECTED_CREDENTIALS, "No credential is configured")
        now = self._clock.now()
        claims = {
            "iss": access_key,
            "exp": int((now + TOKEN_LIFETIME).timestamp()),
            "nbf": int((now - TOKEN_LEEWAY).timestamp()),
        }
        return jwt.encode(claims, secret_key, algorithm="HS256", headers={"typ": "JWT"})

    async def _call(
        self, endpoint: Endpoint, method: str, path: str, body: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        request = self._http.build_request(
            method,
            f"{endpoint.base_url}{path}",
            headers={"Authorization": f"Bearer {self._token(endpoint)}"},
            json=body,
            timeout=endpoint.timeout_seconds,
        )
        response = await send(self._http, request, failure_of)
        answer = json_object(response)
        if answer.get("code") != 0:  # some refusals come with HTTP 200
            raise failure_of(response, answer)
        data = answer.get("data")
        if not isinstance(data, dict):
            raise ProviderFailure(INVALID_RESPONSE, "Provider returned an invalid response")
        return data

    async def submit(self, endpoint: Endpoint, call: VideoCall) -> VideoProgress:
        kind, body = task_body(call)
        data = await self._call(endpoint, "POST", f"/v1/videos/{kind}", body)
        return await self._progress(endpoint, kind, data)

    async def poll(
        self, endpoint: Endpoint, provider_job_id: str, call: VideoCall
    ) -> VideoProgress:
        kind, _, task_id = provider_job_id.partition("/")
        if kind not in KINDS or not task_id:
            raise ProviderFailure(INVALID_RESPONSE, "Not a Kling task id")
        data = await self._call(endpoint, "GET", f"/v1/videos/{kind}/{task_id}")
        return await self._progress(endpoint, kind, data)

    async def _progress(self, endpoint: Endpoint, kind: str, data: dict[str, Any]) -> VideoProgress:
        task_id = data.get("task_id")
        status = data.get("task_status")
        if (
            not isinstance(task_id, str)
            or not _TASK_ID.fullmatch(task_id)
            or not isinstance(status, str)
        ):
            raise ProviderFailure(INVALID_RESPONSE, "Provider returned an invalid response")
        job_id = f"{kind}/{task_id}"
        if status in _RUNNING:
            return VideoProgress(state="running", provider_job_id=job_id)
        if status != "succeed":
            return failed(job_id, data.get("task_status_msg") or status)
        result = data.get("task_result")
        entries = result.get("videos") if isinstance(result, dict) else None
        if not isinstance(entries, list) or not entries:
            raise ProviderFailure(INVALID_RESPONSE, "Provider returned no video")
        videos, seconds = [], None
        for entry in entries:
            if not isinstance(entry, dict):
                raise ProviderFailure(INVALID_RESPONSE, "Provider returned no video")
            videos.append(self._downloads.remote(endpoint, entry.get("url")))
            seconds = seconds or seconds_of(entry.get("duration"))
        return VideoProgress(
            state="completed", provider_job_id=job_id, videos=videos, seconds=seconds
        )
