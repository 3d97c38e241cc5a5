"""A fake BytePlus ModelArk video-generation task API (Seedance), written from ModelArk's API
reference (https://docs.byteplus.com/en/docs/ModelArk, "Video generation API": create a task,
retrieve a task, cancel or delete a task; "Error codes").

`POST /api/v3/contents/generations/tasks` `{model, content: [...], resolution, ratio,
duration, seed, generate_audio}` with `Authorization: Bearer <key>` → `{"id": "cgt-…"}`;
`GET /api/v3/contents/generations/tasks/{id}` → the task (`status` queued → running →
succeeded, `content.video_url`, `duration`, `usage`); `DELETE` of a queued task cancels it
(a running one cannot be cancelled). Errors are `{"error": {"code", "message", "type"}}`.

Checked 2026-11-27 against ModelArk's video generation API reference and the Seedance 2.0
series tutorial (https://docs.byteplus.com/docs/ModelArk/2291680): what the provider refuses,
the fake refuses — a model ID it does not serve (404 InvalidEndpointOrModel.NotFound; the
Seedance IDs are dated, e.g. `dreamina-seedance-2-0-260128`), a resolution other than
480p/720p/1080p, a ratio other than 16:9/4:3/1:1/3:4/9:16/21:9/adaptive, a duration outside
4-15 s (or -1, the model's choice) (400 InvalidParameter), and first/last frames together
with reference images, videos or audio (two different generation modes: 400
InvalidParameter).

Scripted by `model` (a served Seedance model ID behaves as `ok`): `ok` (queued, running, then
succeeded), `fail` (the output is refused:
failed with OutputVideoSensitiveContentDetected), `never` (stays running), `refuse` (400
InputTextSensitiveContentDetected at creation), `ratelimit` (429 RateLimitExceeded),
`error-<status>` (that status, InternalServiceError), `garbage` (200, not JSON).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import httpx

from testkit.fakes.video_providers import VIDEO

API_KEY = "fake-ark-key"
PREFIX = "/api/v3/contents/generations/tasks"
CONTENT_TYPES = ("text", "image_url", "video_url", "audio_url")
OUTPUT_SECONDS = 4
# Model IDs BytePlus ModelArk serves (besides the scripts below).
MODELS = (
    "dreamina-seedance-2-0-260128",
    "dreamina-seedance-2-0-fast-260128",
    "seedance-1-5-pro-251215",
    "seedance-1-0-pro-250528",
    "seedance-1-0-pro-fast-251015",
)
SCRIPTS = ("ok", "fail", "never", "refuse", "ratelimit", "garbage")
RESOLUTIONS = ("480p", "720p", "1080p")
RATIOS = ("16:9", "4:3", "1:1", "3:4", "9:16", "21:9", "adaptive")
DURATIONS = (-1, *range(4, 16))


def _error(status: int, code: str, message: str, kind: str = "BadRequest") -> httpx.Response:
    return httpx.Response(status, json={"error": {"code": code, "message": message, "type": kind}})


@dataclass
class FakeSeedance:
    requests: list[httpx.Request] = field(default_factory=list)
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    _ids: Any = field(default_factory=lambda: itertools.count(1))

    def created(self) -> list[dict[str, Any]]:
        return [t["body"] for t in self.tasks.values()]

    def handle(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        path = request.url.path
        if path.startswith("/files/"):
            return httpx.Response(200, content=VIDEO, headers={"Content-Type": "video/mp4"})
        if request.headers.get("authorization") != f"Bearer {API_KEY}":
            return _error(
                401,
                "AuthenticationError",
                "The API key in the request is missing or invalid.",
                "Unauthorized",
            )
        if path == PREFIX and request.method == "POST":
            return self._create(request)
        task = self.tasks.get(path.removeprefix(PREFIX + "/"))
        if not path.startswith(PREFIX + "/") or task is None:
            return _error(404, "ResourceNotFound", "The specified task is not found.", "NotFound")
        if request.method == "GET":
            return httpx.Response(200, json=self._look(request, task))
        if request.method == "DELETE":
            if task["status"] == "queued":
                task["status"] = "cancelled"
                return httpx.Response(200, json={})
            if task["status"] == "running":
                return _error(
                    400, "InvalidParameter", "A running task cannot be cancelled or deleted."
                )
            del self.tasks[task["id"]]
            return httpx.Response(200, json={})
        return _error(405, "MethodNotAllowed", "Method not allowed")

    def _create(self, request: httpx.Request) -> httpx.Response:
        try:
            body = httpx.Response(200, content=request.content).json()
        except ValueError:
            return _error(400, "InvalidParameter", "The request body is not valid JSON.")
        content = body.get("content")
        if (
            not isinstance(body.get("model"), str)
            or not isinstance(content, list)
            or not content
            or any(item.get("type") not in CONTENT_TYPES for item in content)
        ):
            return _error(400, "MissingParameter", "model and content are required.")
        model = body["model"]
        if model not in MODELS + SCRIPTS and not model.startswith("error-"):
            return _error(
                404,
                "InvalidEndpointOrModel.NotFound",
                "The model or endpoint does not exist or you do not have access to it.",
                "NotFound",
            )
        refused = self._refused(body)
        if refused is not None:
            return _error(400, "InvalidParameter", refused)
        if model in MODELS:
            model = "ok"
        if model == "refuse":
            return _error(
                400,
                "InputTextSensitiveContentDetected",
                "The request failed because the input text may contain sensitive information.",
            )
        if model == "ratelimit":
            return _error(
                429,
                "RateLimitExceeded.EndpointRPMExceeded",
                "The request has exceeded the RPM rate limit.",
                "TooManyRequests",
            )
        if model.startswith("error-"):
            return _error(
                int(model.split("-", 1)[1]),
                "InternalServiceError",
                "The service encountered an unexpected internal error.",
                "InternalServerError",
            )
        if model == "garbage":
            return httpx.Response(200, content=b"<html>", headers={"Content-Type": "text/html"})
        task_id = f"cgt-20261123-{next(self._ids):04d}"
        self.tasks[task_id] = {"id": task_id, "model": model, "status": "queued", "body": body}
        return httpx.Response(200, json={"id": task_id})

    def _look(self, request: httpx.Request, task: dict[str, Any]) -> dict[str, Any]:
        if task["status"] == "queued":
            task["status"] = "running"
        elif task["status"] == "running" and task["model"] != "never":
            task["status"] = "failed" if task["model"] == "fail" else "succeeded"
        body: dict[str, Any] = {
            "id": task["id"],
            "model": task["model"],
            "status": task["status"],
            "created_at": 1763900000,
            "updated_at": 1763900060,
        }
        if task["status"] == "succeeded":
            origin = f"{request.url.scheme}://{request.url.netloc.decode()}"
            body["content"] = {"video_url": f"{origin}/files/{task['id']}.mp4?X-Tos-Signature=x"}
            body["usage"] = {"completion_tokens": 108900, "total_tokens": 108900}
            body.update(duration=OUTPUT_SECONDS, ratio="16:9", resolution="720p", seed=11)
        if task["status"] == "failed":
            body["error"] = {
                "code": "OutputVideoSensitiveContentDetected",
                "message": "The generated video may contain sensitive information.",
            }
        return body

    @staticmethod
    def _refused(body: dict[str, Any]) -> str | None:
        """Why ModelArk refuses these generation fields, if it does."""
        if body.get("resolution", "720p") not in RESOLUTIONS:
            return "The parameter `resolution` specified in the request is not valid."
        if body.get("ratio", "16:9") not in RATIOS:
            return "The parameter `ratio` specified in the request is not valid."
        if body.get("duration", 5) not in DURATIONS:
            return "The parameter `duration` specified in the request is not valid."
        roles = {item.get("role") for item in body["content"] if item.get("type") != "text"}
        if roles & {"first_frame", "last_frame"} and roles - {"first_frame", "last_frame"}:
            return "First and last frames cannot be combined with reference content."
        return None
