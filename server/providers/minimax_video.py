"""MiniMax Hailuo (catalog adapter `minimax`).

Checked 2026-11-27 against https://platform.minimax.io/docs/api-reference/video-generation-t2v,
.../video-generation-i2v, .../video-generation-fl2v, .../video-generation-query,
.../video-generation-download, .../errorcode (and resellers' copies of the Hailuo 2.3 limits):
MiniMax-Hailuo-2.3 and -02 take duration 6 or 10 at 768P, 6 only at 1080P (1080P x 10 s is a
client error here, before any call); Hailuo 2.3 takes a first frame only (last frames:
Hailuo-02). Not settled from the documentation: the exact status_msg MiniMax gives a refused
resolution/duration pair.

Protocol (https://platform.minimax.io/docs/api-reference/video-generation-t2v,
.../video-generation-i2v, .../video-generation-query, .../video-generation-download and
https://platform.minimax.io/docs/api-reference/errorcode): `Authorization: Bearer <API key>`.
Create `POST {base}/v1/video_generation` → `{task_id, base_resp}`; query
`GET {base}/v1/query/video_generation?task_id=` → `{task_id, status: Queueing | Preparing |
Processing | Success | Fail, file_id, video_width, video_height, base_resp}`; then
`GET {base}/v1/files/retrieve?file_id=` → `{file: {file_id, download_url, ...}, base_resp}`;
the download_url is fetched without credentials. Every answer carries
`base_resp: {status_code, status_msg}` (0 = success), usually with HTTP 200.

Field mapping: prompt; duration → `duration` (6 / 10); resolution → `resolution` ("768P",
"1080P", ...); frame_images → `first_frame_image` / `last_frame_image` and image
references → `subject_reference: [{type: "character", image: [url]}]` (URLs or data: URLs,
both accepted). Dropped: aspect_ratio (Hailuo derives it from the resolution or the first
frame), seed (none), generate_audio (Hailuo has no sound), audio/video references.
`provider.options[<slug>]` are merged into the body (e.g. `prompt_optimizer`,
`fast_pretreatment`); mapped fields win and `callback_url` is not forwarded.
base_resp codes: 1002 / 1039 (rate limits) → rate limited; 1004 /
2049 (authentication, invalid key) and 1008 (insufficient balance) → rejected credentials;
1026 / 1027 (sensitive input / output), 1042 (illegal characters), 2013 (bad parameters) →
the request's fault when submitting, a failed job when polling; 1001 → timeout; 1000 /
1013 and others → server error. MiniMax documents no cancel call.

How an operator configures it: an endpoint `adapter = "minimax"`,
`base_url = "https://api.minimax.io"` (mainland China: `https://api.minimaxi.com`),
`api_key_env = "MINIMAX_API_KEY"` and `model` = e.g. `MiniMax-Hailuo-02`,
`MiniMax-Hailuo-2.3`, `T2V-01-Director`, `I2V-01`, `S2V-01` (subject reference). Hailuo 2.3
and 02 take durations 6 / 10 s at 768P and 6 s at 1080P."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx

from server.providers.failures import (
    CLIENT_ERROR,
    INVALID_RESPONSE,
    RATE_LIMITED,
    REJECTED_CREDENTIALS,
    SERVER_ERROR,
    TIMEOUT,
    ProviderFailure,
)
from server.providers.http import failure_from_response, http_failure, json_object, json_or_none
from server.providers.video import VideoCall
from server.providers.video_tasks import (
    TASK_ID,
    Stage,
    TaskSpec,
    TaskVideoAdapter,
    field_of,
    image_urls,
    merged,
    states_of,
)

_RATE_CODES = {1002, 1039}
_CREDENTIAL_CODES = {1004, 1008, 2049}
_CLIENT_CODES = {1026, 1027, 1042, 2013}


def failure_of_code(response: httpx.Response, code: int, message: str) -> ProviderFailure:
    if code in _RATE_CODES:
        kind = RATE_LIMITED
    elif code in _CREDENTIAL_CODES:
        kind = REJECTED_CREDENTIALS
    elif code in _CLIENT_CODES:
        kind = CLIENT_ERROR
    elif code == 1001:
        kind = TIMEOUT
    else:
        kind = SERVER_ERROR
    return http_failure(kind, response, code, message)


def _base_resp(body: dict[str, Any]) -> tuple[int, str] | None:
    base = body.get("base_resp")
    if not isinstance(base, dict) or not isinstance(base.get("status_code"), int):
        return None
    return base["status_code"], str(base.get("status_msg") or "")


def failure_of(response: httpx.Response) -> ProviderFailure:
    """An HTTP error: base_resp's code when the body has one, else the HTTP status."""
    body = json_or_none(response)
    coded = _base_resp(body) if body is not None else None
    if coded is None:
        return failure_from_response(response)
    return failure_of_code(response, *coded)


def checked(response: httpx.Response, stage: Stage) -> dict[str, Any]:
    """An answer whose base_resp says success. A refused input (sensitive content, bad
    parameters) is the request's fault when submitting, a failed task when polling."""
    answer = json_object(response)
    coded = _base_resp(answer)
    if coded is None:
        raise ProviderFailure(INVALID_RESPONSE, "Provider returned an invalid response")
    code, _ = coded
    if stage == "poll" and code in _CLIENT_CODES and answer.get("status") != "Success":
        return {**answer, "status": "Fail"}
    if code != 0:
        raise failure_of_code(response, *coded)
    return answer


def task_body(call: VideoCall) -> dict[str, Any]:
    params = call.params
    if str(params.get("resolution")).upper() == "1080P" and params.get("duration") == 10:
        # MiniMax refuses it (2013); said here, before a call, in plain words.
        raise ProviderFailure(CLIENT_ERROR, "MiniMax makes 1080P videos of 6 s only")
    first, last, references = image_urls(params)
    body: dict[str, Any] = {
        "model": call.model,
        "prompt": params.get("prompt", ""),
        "duration": params.get("duration"),
        "resolution": str(params["resolution"]).upper() if params.get("resolution") else None,
        "first_frame_image": first,
        "last_frame_image": last,
    }
    if references:
        body["subject_reference"] = [{"type": "character", "image": references[:1]}]
    return merged(body, call.options)


def _file(answer: dict[str, Any], task: str) -> str:
    file_id = answer.get("file_id")
    if not isinstance(file_id, str | int) or not str(file_id):
        raise ProviderFailure(INVALID_RESPONSE, "Provider returned an invalid response")
    return f"v1/files/retrieve?file_id={quote(str(file_id))}"


SPEC = TaskSpec(
    request=lambda call: ("v1/video_generation", task_body(call)),
    task_id=lambda answer, path, endpoint: answer.get("task_id"),
    id_pattern=TASK_ID,
    poll_path="v1/query/video_generation?task_id={task}",
    state=lambda answer: answer.get("status"),
    states=states_of(
        running=("Queueing", "Preparing", "Processing"), succeeded="Success", failed=("Fail",)
    ),
    result_path=_file,
    videos=lambda answer: [field_of(answer, "file", "download_url")],
    error=lambda answer: field_of(answer, "base_resp", "status_msg") or "the task failed",
    failure_of=failure_of,
    answer=checked,
)


class MiniMaxVideoAdapter(TaskVideoAdapter):
    spec = SPEC
