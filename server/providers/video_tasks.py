"""The one task-polling video adapter (submit → poll → result URLs → streamed by
http.Downloads), driven by a per-provider TaskSpec, and what task-style providers share
beyond HTTP: mapping images and provider.options, a reported duration, a failed task."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import httpx

from server.providers.endpoint import Endpoint
from server.providers.failures import INVALID_RESPONSE, REJECTED_CREDENTIALS, ProviderFailure
from server.providers.http import (
    MAX_PROVIDER_MESSAGE,
    Downloads,
    FailureOf,
    RemoteVideo,
    failure_from_response,
    json_object,
    same_origin,
    send,
)
from server.providers.video import VideoCall, VideoProgress

# provider.options never set where the provider calls back (the gateway polls).
UNFORWARDED_OPTIONS = frozenset({"callback_url", "callbackUrl", "webhook_url"})

# Where a provider's task stands, in the adapter's words (TaskSpec.states maps the provider's).
TaskState = Literal["running", "succeeded", "failed", "cancelled"]
Stage = Literal["submit", "poll", "result"]
Answer = dict[str, Any]
Auth = Callable[[Endpoint], dict[str, str]]
TASK_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")  # the task ids most providers hand out


def merged(body: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """The body with a client's provider.options added. What the gateway mapped from the
    request wins (the model, duration and size it charges for), and no callback URL."""
    extra = {k: v for k, v in options.items() if k not in UNFORWARDED_OPTIONS}
    return {**extra, **{k: v for k, v in body.items() if v is not None}}


def image_urls(params: dict[str, Any]) -> tuple[str | None, str | None, list[str]]:
    """(first frame, last frame, image references) of validated request parameters; audio
    and video references are left out (these providers take images only)."""
    frames = {f["frame_type"]: f["url"] for f in params.get("frame_images", [])}
    references = [
        r["url"] for r in params.get("input_references", []) if r.get("type") == "image_url"
    ]
    return frames.get("first_frame"), frames.get("last_frame"), references


def seconds_of(value: object) -> float | None:
    """A provider's reported duration ("5.04" or 5.04), when it is a positive number."""
    try:
        seconds = float(value) if isinstance(value, str | int | float) else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 < seconds < 86_400 else None


def failed(provider_job_id: str, detail: object) -> VideoProgress:
    """A provider task that ended without a video, with what the provider said (bounded)."""
    return VideoProgress(
        state="failed",
        provider_job_id=provider_job_id,
        error=f"Provider failed: {str(detail)[:MAX_PROVIDER_MESSAGE]}",
    )


def field_of(answer: object, *path: str) -> Any:
    """answer[path[0]][path[1]]...; None where a level is missing or not an object."""
    for name in path:
        answer = answer.get(name) if isinstance(answer, dict) else None
    return answer


def key_auth(scheme: str = "Bearer") -> Auth:
    """`Authorization: <scheme> <the endpoint's key>`; no key configured is said before any
    call."""

    def headers(endpoint: Endpoint) -> dict[str, str]:
        key = endpoint.credential()
        if not key:
            raise ProviderFailure(REJECTED_CREDENTIALS, "No credential is configured")
        return {"Authorization": f"{scheme} {key}"}

    return headers


async def send_json(
    http: httpx.AsyncClient,
    endpoint: Endpoint,
    method: str,
    url: str,
    headers: dict[str, str],
    failure_of: FailureOf,
    body: dict[str, Any] | None = None,
) -> httpx.Response:
    """One request with a JSON body (or none) within the endpoint's timeout."""
    request = http.build_request(
        method, url, headers=headers, json=body, timeout=endpoint.timeout_seconds
    )
    return await send(http, request, failure_of)


def states_of(
    running: tuple[str, ...], succeeded: str, failed: tuple[str, ...], cancelled: str = ""
) -> dict[str, TaskState]:
    """A provider's task states, by what they mean."""
    states: dict[str, TaskState] = {state: "running" for state in running}
    states |= {state: "failed" for state in failed}
    states[succeeded] = "succeeded"
    if cancelled:
        states[cancelled] = "cancelled"
    return states


def json_answer(response: httpx.Response, stage: Stage) -> Answer:
    return json_object(response)


@dataclass(frozen=True)
class TaskSpec:
    """One provider's task API. Paths are below the endpoint's base URL; `{task}` in them
    is where the job's task lives (`locate` of the id the gateway keeps)."""

    # (path, body) of the submit POST; raises a client error for what the provider refuses
    request: Callable[[VideoCall], tuple[str, dict[str, Any]]]
    # the job id the gateway keeps, from the submit answer and path
    task_id: Callable[[Answer, str, Endpoint], object]
    # every job id, on submit and poll, must match it whole (it becomes part of a URL)
    id_pattern: re.Pattern[str]
    poll_path: str
    state: Callable[[Answer], object]  # the provider's state in a poll answer
    states: Mapping[str, TaskState]  # the provider's states, in the adapter's words
    videos: Callable[[Answer], Sequence[object]]  # result URLs of a succeeded task
    error: Callable[[Answer], object]  # what a failed task's answer says about why
    failure_of: FailureOf = failure_from_response  # an HTTP error, in ProviderFailure kinds
    seconds: Callable[[Answer], float | None] = lambda answer: None  # output length reported
    # a second GET for the result of a succeeded task (its path from the poll answer)
    result_path: Callable[[Answer, str], str] | None = None
    # where a succeeded task's video is, when it is not in the answer (OpenAI's /content)
    content_path: str | None = None
    cancel: tuple[str, str] | None = None  # (method, path) that cancels a task
    auth: Auth = field(default_factory=key_auth)
    submit_headers: Mapping[str, str] = field(default_factory=dict)
    answer: Callable[[httpx.Response, Stage], Answer] = json_answer  # unwraps an envelope
    locate: Callable[[str, VideoCall], str] = lambda task_id, call: task_id  # its `{task}`


class TaskVideoAdapter:
    """Submit, poll, result URLs, for any provider a TaskSpec describes. A result URL on the
    endpoint's own base URL is fetched with the credential, any other (a CDN, signed
    storage) without it."""

    spec: ClassVar[TaskSpec]

    def __init__(
        self,
        http: httpx.AsyncClient,
        downloads: Downloads | None = None,
        *,
        spec: TaskSpec | None = None,
    ) -> None:
        self._http = http
        self._downloads = downloads or Downloads(http)
        self._spec = spec or self.spec

    async def _answer(
        self, endpoint: Endpoint, method: str, path: str, stage: Stage, body: Answer | None = None
    ) -> Answer:
        return self._spec.answer(await self._send(endpoint, method, path, stage, body), stage)

    async def _send(
        self, endpoint: Endpoint, method: str, path: str, stage: Stage | None, body: Answer | None
    ) -> httpx.Response:
        extra = self._spec.submit_headers if stage == "submit" else {}
        url = f"{str(endpoint.base_url).rstrip('/')}/{path}"
        headers = {**extra, **self._spec.auth(endpoint)}
        return await send_json(
            self._http, endpoint, method, url, headers, self._spec.failure_of, body
        )

    def _checked(self, task_id: object) -> str:
        if not isinstance(task_id, str) or not self._spec.id_pattern.fullmatch(task_id):
            raise ProviderFailure(INVALID_RESPONSE, "Provider returned an invalid task id")
        return task_id

    async def submit(self, endpoint: Endpoint, call: VideoCall) -> VideoProgress:
        path, body = self._spec.request(call)
        answer = await self._answer(endpoint, "POST", path, "submit", body)
        task_id = self._checked(self._spec.task_id(answer, path, endpoint))
        return VideoProgress(state="running", provider_job_id=task_id)

    async def poll(
        self, endpoint: Endpoint, provider_job_id: str, call: VideoCall
    ) -> VideoProgress:
        task = self._spec.locate(self._checked(provider_job_id), call)
        answer = await self._answer(endpoint, "GET", self._spec.poll_path.format(task=task), "poll")
        provider_state = self._spec.state(answer)
        state = self._spec.states.get(provider_state) if isinstance(provider_state, str) else None
        if state is None:
            raise ProviderFailure(INVALID_RESPONSE, "Provider returned an invalid status")
        if state == "running":
            return VideoProgress(state="running", provider_job_id=provider_job_id)
        if state != "succeeded":
            return failed(provider_job_id, self._spec.error(answer) or provider_state)
        result = answer
        if self._spec.result_path is not None:
            result = await self._answer(
                endpoint, "GET", self._spec.result_path(answer, task), "result"
            )
        content = self._spec.content_path
        base = str(endpoint.base_url).rstrip("/")
        urls = [f"{base}/{content.format(task=task)}"] if content else self._spec.videos(result)
        if not urls:
            raise ProviderFailure(INVALID_RESPONSE, "Provider returned no video URL")
        videos = [self._download(endpoint, url) for url in urls]
        return VideoProgress(
            state="completed",
            provider_job_id=provider_job_id,
            videos=videos,
            seconds=self._spec.seconds(answer),
        )

    def _download(self, endpoint: Endpoint, url: object) -> RemoteVideo:
        own = endpoint.base_url is not None and same_origin(url, endpoint.base_url)
        return self._downloads.remote(
            endpoint, url, headers=self._spec.auth(endpoint) if own else None
        )

    async def cancel(self, endpoint: Endpoint, provider_job_id: str, call: VideoCall) -> None:
        """Best effort; nothing to send where the provider has no cancel call (the gateway's
        side of a cancel does not depend on it)."""
        if self._spec.cancel is None:
            return
        method, path = self._spec.cancel
        task = self._spec.locate(self._checked(provider_job_id), call)
        await self._send(endpoint, method, path.format(task=task), None, None)
