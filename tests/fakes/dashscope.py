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

Checked 2026-11-27 against the Wan 2.7 text-to-video reference (alibabacloud.com/help/en/
model-studio/text-to-video-api-reference, updated 2026-06-16), its image-to-video 2.7 guide
(alibabacloud.com/help/en/model-studio/wan-image-to-video-guide), and the Wan 2.6 / 2.5 size
tables (the earlier-protocol reference and its mirrors). What the provider checks, the fake
checks:

- wan2.7 models take `parameters.resolution` (720P | 1080P, default 1080P) and
  `parameters.ratio` (16:9 | 9:16 | 1:1 | 4:3 | 3:4, default 16:9), duration 2-15; they do
  not read `size`, so a request with `size` only comes out at the default 1920*1080. The
  shape made is recorded as the task's `shape`. Their usage reports `output_video_duration`.
- every other model (the scripts below, wan2.6/2.5/...) takes `size` from the documented
  table only (SIZES); any other `W*H`, e.g. `1080*1080`, is 400 InvalidParameter. Usage
  reports `video_duration`.

Scripted by `model` (a model named `wan...` behaves as `ok`): `ok`, `fail` (FAILED with
DataInspectionFailed on the output), `never` (stays RUNNING), `refuse` (400
DataInspectionFailed at creation), `ratelimit` (429 Throttling.RateQuota), `error-<status>`
(InternalError), `garbage` (200, not JSON).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import httpx

from testkit.fakes.video_providers import VIDEO

API_KEY = "fake-dashscope-key"
CREATE_PATHS = (
    "/api/v1/services/aigc/video-generation/video-synthesis",
    "/api/v1/services/aigc/image2video/video-synthesis",
)
TASKS = "/api/v1/tasks/"
OUTPUT_SECONDS = 5
# The documented `size` table of the size-taking Wan models (480P: wan2.5/2.2/2.1 only).
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
WAN27_RESOLUTIONS = ("720P", "1080P")
WAN27_RATIOS = ("16:9", "9:16", "1:1", "4:3", "3:4")
WAN27_DURATIONS = range(2, 16)


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
        shape = self._shape(model, body.get("parameters") or {})
        if shape is None:
            return _error(400, "InvalidParameter", "The parameters are not supported by the model")
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
        script = "ok" if model.startswith("wan") else model
        self.tasks[task_id] = {
            "model": script,
            "wan27": model.startswith("wan2.7"),
            "status": "PENDING",
            "path": path,
            "body": body,
            "shape": shape,
        }
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
            if task["wan27"]:
                body["usage"] = {
                    "duration": OUTPUT_SECONDS,
                    "input_video_duration": 0,
                    "output_video_duration": OUTPUT_SECONDS,
                    "video_count": 1,
                    "SR": int(task["shape"].split("*")[1]),
                }
            else:
                body["usage"] = {
                    "video_duration": OUTPUT_SECONDS,
                    "video_ratio": task["shape"],
                    "video_count": 1,
                }
        if task["status"] == "FAILED":
            output["code"] = "DataInspectionFailed"
            output["message"] = "Output data may contain inappropriate content."
        return body

    @staticmethod
    def _shape(model: str, parameters: dict[str, Any]) -> str | None:
        """The `W*H` the model makes of these parameters, or None where it refuses them."""
        duration = parameters.get("duration", 5)
        if model.startswith("wan2.7"):
            resolution = parameters.get("resolution", "1080P")
            ratio = parameters.get("ratio", "16:9")
            if (
                resolution not in WAN27_RESOLUTIONS
                or ratio not in WAN27_RATIOS
                or duration not in WAN27_DURATIONS
            ):
                return None
            return SIZES[(resolution, ratio)]  # the same pixel table, by tier and ratio
        size = parameters.get("size")
        if size is None:
            return SIZES.get((parameters.get("resolution", "1080P"), "16:9"))
        return size if size in SIZES.values() else None
