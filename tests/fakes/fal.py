"""A fake fal.ai queue, written from fal's documentation
(https://docs.fal.ai/model-apis/model-endpoints/queue, https://docs.fal.ai/model-apis/errors).

`POST /{model_id}` with `Authorization: Key <key>` and the model's input as the body →
`{request_id, response_url, status_url, cancel_url, queue_position}`, the URLs under the app
id only (the model id's first two segments: `fal-ai/kling-video/v2/master/text-to-video`
answers under `/fal-ai/kling-video/requests/{id}`; the submit path plus `/requests/…` is 404,
as on fal). `GET …/requests/{id}/status` → IN_QUEUE, IN_PROGRESS, then COMPLETED (with
`error` and `error_type` when the run failed); `GET …/requests/{id}` → `{video: {url,
content_type, file_name, file_size}, seed}`; `PUT …/requests/{id}/cancel` → 202
CANCELLATION_REQUESTED, or 400 ALREADY_COMPLETED. Errors are `{"detail": …}`.

Scripted by the model id's last segment: `ok`, `fail` (COMPLETED with an error), `never`
(stays IN_PROGRESS), `refuse` (422 content_policy_violation at submit), `ratelimit` (429),
`error-<status>`, `garbage` (200, not JSON), `offhost` (a response_url on another host).
Result files are served from FILES_HOST when set (fal's CDN), else from the queue's host.
Checked 2026-11-27 against the same pages: unchanged.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import httpx

from testkit.fakes.video_providers import VIDEO

API_KEY = "fake-fal-key"


def _detail(status: int, detail: Any) -> httpx.Response:
    return httpx.Response(status, json={"detail": detail})


@dataclass
class FakeFal:
    files_origin: str | None = None  # e.g. "https://v3.fal.media"
    requests: list[httpx.Request] = field(default_factory=list)
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    _ids: Any = field(default_factory=lambda: itertools.count(1))

    def submitted(self) -> list[tuple[str, dict[str, Any]]]:
        return [(j["model_id"], j["input"]) for j in self.jobs.values()]

    def handle(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        path = request.url.path
        if path.startswith("/files/"):
            return httpx.Response(200, content=VIDEO, headers={"Content-Type": "video/mp4"})
        if request.headers.get("authorization") != f"Key {API_KEY}":
            return _detail(401, "No user found for Key ID and Secret")
        parts = path.strip("/").split("/")
        if request.method == "POST":
            return self._submit(request, "/".join(parts))
        if len(parts) >= 4 and parts[2] == "requests":
            job = self.jobs.get(parts[3])
            if job is None or job["app"] != "/".join(parts[:2]):
                return _detail(404, "Request not found")
            action = "/".join(parts[4:])
            if request.method == "GET" and action == "status":
                return httpx.Response(200, json=self._status(request, parts[3], job))
            if request.method == "GET" and not action:
                return self._result(request, parts[3], job)
            if request.method == "PUT" and action == "cancel":
                if job["status"] == "COMPLETED":
                    return httpx.Response(400, json={"status": "ALREADY_COMPLETED"})
                job["status"] = "COMPLETED"
                job["cancelled"] = True
                return httpx.Response(202, json={"status": "CANCELLATION_REQUESTED"})
        return _detail(404, "Not Found")

    def _submit(self, request: httpx.Request, model_id: str) -> httpx.Response:
        try:
            body = httpx.Response(200, content=request.content).json()
        except ValueError:
            return _detail(422, [{"loc": ["body"], "msg": "Invalid JSON", "type": "json_invalid"}])
        script = model_id.rsplit("/", 1)[-1]
        if script == "refuse":
            return _detail(
                422,
                [
                    {
                        "loc": ["body", "prompt"],
                        "msg": "The content could not be processed because it contained "
                        "material flagged by a content checker.",
                        "type": "content_policy_violation",
                        "url": "https://docs.fal.ai/errors#content_policy_violation",
                    }
                ],
            )
        if script == "ratelimit":
            return _detail(429, "Rate limit exceeded: too many concurrent requests")
        if script.startswith("error-"):
            return _detail(int(script.split("-", 1)[1]), "Internal server error")
        if script == "garbage":
            return httpx.Response(200, content=b"<html>", headers={"Content-Type": "text/html"})
        request_id = f"764cabcf-b745-4b3e-ae38-{next(self._ids):012d}"
        app = "/".join(model_id.split("/")[:2])
        self.jobs[request_id] = {
            "model_id": model_id,
            "app": app,
            "script": script,
            "input": body,
            "status": "IN_QUEUE",
        }
        origin = f"{request.url.scheme}://{request.url.netloc.decode()}"
        if script == "offhost":
            origin = "http://169.254.169.254"
        response_url = f"{origin}/{app}/requests/{request_id}"
        return httpx.Response(
            200,
            json={
                "request_id": request_id,
                "response_url": response_url,
                "status_url": f"{response_url}/status",
                "cancel_url": f"{response_url}/cancel",
                "queue_position": 0,
            },
        )

    def _status(self, request: httpx.Request, request_id: str, job: dict[str, Any]) -> Any:
        if job["status"] == "IN_QUEUE":
            job["status"] = "IN_PROGRESS"
        elif job["status"] == "IN_PROGRESS" and job["script"] != "never":
            job["status"] = "COMPLETED"
        origin = f"{request.url.scheme}://{request.url.netloc.decode()}"
        body: dict[str, Any] = {
            "status": job["status"],
            "request_id": request_id,
            "response_url": f"{origin}/{job['app']}/requests/{request_id}",
        }
        if job["status"] == "IN_QUEUE":
            body["queue_position"] = 0
        if job["status"] == "COMPLETED":
            body["logs"] = None
            if job["script"] == "fail":
                body["error"] = "Internal error while generating the video"
                body["error_type"] = "internal_error"
        return body

    def _result(self, request: httpx.Request, request_id: str, job: dict[str, Any]) -> Any:
        if job["status"] != "COMPLETED":
            return _detail(400, "Request is still in progress")
        origin = self.files_origin or f"{request.url.scheme}://{request.url.netloc.decode()}"
        return httpx.Response(
            200,
            json={
                "video": {
                    "url": f"{origin}/files/{request_id}/output.mp4",
                    "content_type": "video/mp4",
                    "file_name": "output.mp4",
                    "file_size": len(VIDEO),
                },
                "seed": 42,
            },
        )
