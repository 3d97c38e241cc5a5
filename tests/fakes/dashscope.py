"""A fake DashScope (Alibaba Cloud Model Studio) Wan video API, written from its API references
(https://www.alibabacloud.com/help/en/model-studio/text-to-video-api-reference,
https://www.alibabacloud.com/help/en/model-studio/image-to-video-api-reference, the first-and-
last-frame reference, https://www.alibabacloud.com/help/en/model-studio/error-code).

`POST /api/v1/services/aigc/video-generation/video-synthesis` (and
`/api/v1/services/aigc/image2video/video-synthesis` for first-and-last-frame models) with
`Authorization: Bearer <key>` and `X-DashScope-Async: enable` (without it: 403 AccessDenied,
"current user api does not support synchronous calls") → `{request_id, output: {task_id,
task_status: PENDING}}`; `GET /api/v1/tasks/{task_id}` → PENDING, RUNNING, then SUCCEEDED with
`output.video_url` and `usage.video_duration`; `POST /api/v1/tasks/{task_id}/cancel` cancels a
PENDING task. Errors are `{"request_id", "code", "message"}`.

Scripted by `model`: `ok`, `fail` (FAILED with DataInspectionFailed on the output), `never`
(stays RUNNING), `refuse` (400 DataInspectionFailed at creation), `ratelimit` (429
Throttling.RateQuota), `error-<status>` (InternalError), `garbage` (200, not JSON).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.fakes.video_providers import VIDEO

API_KEY = "fake-dashscope-key"
CREATE_PATHS = (
    "/api/v1/services/aigc/video-generation/video-synthesis",
    "/api/v1/services/aigc/image2video/video-synthesis",
)
TASKS = "/api/v1/tasks/"
OUTPUT_SECONDS = 5


def _error(status: int, code: str, message: str) -> httpx.Response:
    return httpx.Response(
        status, json={"request_id": "fake-request-id", "code": code, "message": message}
    )


@dataclass
class FakeDashScope:
    requests: list[httpx.Request] = field(default_factory=list)
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    _ids: Any = field(default_factory=lambda: itertools.count(1))

    def created(self) -> list[tuple[str, dict[str, Any]]]:
        return [(t["path"], t["body"]) for t in self.tasks.values()]

    def handle(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        path = request.url.path
        if path.startswith("/files/"):
            return httpx.Response(200, content=VIDEO, headers={"Content-Type": "video/mp4"})
        if request.headers.get("authorization") != f"Bearer {API_KEY}":
            return _error(401, "InvalidApiKey", "Invalid API-key provided.")
        if path in CREATE_PATHS and request.method == "POST":
            return self._create(request, path)
        task_id, _, action = path.removeprefix(TASKS).partition("/")
        task = self.tasks.get(task_id) if path.startswith(TASKS) else None
        if task is None:
            return _error(404, "NotFound", "task not found")
        if request.method == "GET" and not action:
            return httpx.Response(200, json=self._look(request, task))
        if request.method == "POST" and action == "cancel":
            if task["status"] != "PENDING":
                return _error(400, "UnsupportedOperation", "Only PENDING tasks can be canceled.")
            task["status"] = "CANCELED"
            return httpx.Response(200, json={"request_id": "fake-request-id"})
        return _error(404, "NotFound", "not found")

    def _create(self, request: httpx.Request, path: str) -> httpx.Response:
        if request.headers.get("x-dashscope-async") != "enable":
            return _error(
                403, "AccessDenied", "current user api does not support synchronous calls"
            )
        try:
            body = httpx.Response(200, content=request.content).json()
        except ValueError:
            return _error(400, "InvalidParameter", "Request body is not valid JSON")
        if not isinstance(body.get("model"), str) or not isinstance(body.get("input"), dict):
            return _error(400, "InvalidParameter", "Field required: input")
        model = body["model"]
        if model == "refuse":
            return _error(
                400, "DataInspectionFailed", "Input data may contain inappropriate content."
            )
        if model == "ratelimit":
            return _error(
                429, "Throttling.RateQuota", "Requests rate limit exceeded, please try again later."
            )
        if model.startswith("error-"):
            return _error(
                int(model.split("-", 1)[1]),
                "InternalError",
                "An internal error has occured, please try again later.",
            )
        if model == "garbage":
            return httpx.Response(200, content=b"<html>", headers={"Content-Type": "text/html"})
        task_id = f"0385dc79-5ff8-4d82-bcb6-{next(self._ids):012d}"
        self.tasks[task_id] = {"model": model, "status": "PENDING", "path": path, "body": body}
        return httpx.Response(
            200,
            json={
                "request_id": "fake-request-id",
                "output": {"task_id": task_id, "task_status": "PENDING"},
            },
        )

    def _look(self, request: httpx.Request, task: dict[str, Any]) -> dict[str, Any]:
        if task["status"] == "PENDING":
            task["status"] = "RUNNING"
        elif task["status"] == "RUNNING" and task["model"] != "never":
            task["status"] = "FAILED" if task["model"] == "fail" else "SUCCEEDED"
        task_id = next(k for k, v in self.tasks.items() if v is task)
        output: dict[str, Any] = {"task_id": task_id, "task_status": task["status"]}
        body: dict[str, Any] = {"request_id": "fake-request-id", "output": output}
        if task["status"] == "SUCCEEDED":
            origin = f"{request.url.scheme}://{request.url.netloc.decode()}"
            output["video_url"] = f"{origin}/files/{task_id}.mp4?Expires=1&Signature=x"
            body["usage"] = {
                "video_duration": OUTPUT_SECONDS,
                "video_ratio": "1280*720",
                "video_count": 1,
            }
        if task["status"] == "FAILED":
            output["code"] = "DataInspectionFailed"
            output["message"] = "Output data may contain inappropriate content."
        return body
