"""A fake MiniMax (Hailuo) video API on loopback, written from MiniMax's documentation:
https://platform.minimax.io/docs/api-reference/video-generation-t2v (and -i2v, -fl2v,
-s2v), https://platform.minimax.io/docs/api-reference/video-generation-query,
https://platform.minimax.io/docs/api-reference/video-generation-download (files/retrieve)
and https://platform.minimax.io/docs/api-reference/errorcode (base_resp status codes).

- `Authorization: Bearer API_KEY` on every API call, else HTTP 200 with base_resp 1004.
- `POST /v1/video_generation` → `{task_id, base_resp}`.
- `GET /v1/query/video_generation?task_id=` → `{task_id, status, file_id, video_width,
  video_height, base_resp}`: "Queueing", "Processing", then "Success" (or "Fail").
- `GET /v1/files/retrieve?file_id=` → `{file: {file_id, bytes, created_at, filename,
  purpose, download_url}, base_resp}`; `GET /files/{id}.mp4` serves it without credentials.
Checked 2026-11-27 (the same pages, MiniMax-Hailuo-2.3 and -02): duration 6 or 10, and 10 s
only at 768P (1080P is 6 s only): anything else is base_resp 2013.
Prompt words script failures (tests/fakes/video_loopback.py SCRIPT): refusals are base_resp 1026,
rate limits 1002, server errors HTTP 500; "fail" ends the task with Fail / 1027."""

from __future__ import annotations

import itertools
from typing import Any

from tests.fakes.video_loopback import (
    VIDEO,
    FakeRequest,
    LoopbackServer,
    Reply,
    looks_until_done,
    scripted,
)

API_KEY = "minimax-test-key"
RESOLUTIONS = ("512P", "720P", "768P", "1080P")


def _answer(code: int, message: str, **fields: Any) -> Reply:
    return Reply.of_json(200, {**fields, "base_resp": {"status_code": code, "status_msg": message}})


class FakeMiniMax(LoopbackServer):
    def __init__(self) -> None:
        super().__init__()
        self.tasks: dict[str, dict[str, Any]] = {}
        self._ids = itertools.count(106916112212032)

    @property
    def base_url(self) -> str:
        return self.origin

    def submissions(self) -> list[dict[str, Any]]:
        return [r.json() for r in self.requests if r.path == "/v1/video_generation"]

    def route(self, request: FakeRequest) -> Reply:
        if request.path.startswith("/files/"):
            return Reply.video()
        if request.headers.get("authorization") != f"Bearer {API_KEY}":
            return _answer(
                1004, "login fail: Please carry the API secret key in the 'Authorization' field"
            )
        if request.method == "POST" and request.path == "/v1/video_generation":
            return self._create(request.json())
        if request.method == "GET" and request.path == "/v1/query/video_generation":
            return self._query(request.query.get("task_id", ""))
        if request.method == "GET" and request.path == "/v1/files/retrieve":
            file_id = request.query.get("file_id", "")
            if file_id not in {t.get("file_id") for t in self.tasks.values()}:
                return _answer(2013, "invalid params, file not found")
            return _answer(
                0,
                "success",
                file={
                    "file_id": int(file_id),
                    "bytes": len(VIDEO),
                    "created_at": 1700469398,
                    "filename": "output.mp4",
                    "purpose": "video_generation",
                    "download_url": f"{self.origin}/files/{file_id}.mp4",
                },
            )
        return Reply(404, b"404 page not found")

    def _create(self, body: dict[str, Any]) -> Reply:
        if not body.get("model"):
            return _answer(2013, "invalid params, model is required")
        if "resolution" in body and body["resolution"] not in RESOLUTIONS:
            return _answer(
                2013, f"invalid params, resolution {body['resolution']} is not supported"
            )
        if body.get("duration") not in (None, 6, 10):
            return _answer(2013, "invalid params, duration must be 6 or 10")
        if body.get("resolution") == "1080P" and body.get("duration") == 10:
            return _answer(2013, "invalid params, 1080P supports only 6-second videos")
        script = scripted(body.get("prompt"))
        if script == "refuse":
            return _answer(1026, "input new_sensitive", task_id="")
        if script == "ratelimit":
            return _answer(1002, "rate limit exceeded(RPM)", task_id="")
        if script == "servererror":
            return Reply(500, b"internal server error")
        if script == "garbage":
            return Reply(200, b"<html>gateway</html>", {"Content-Type": "text/html"})
        task_id = str(next(self._ids))
        self.tasks[task_id] = {
            "looks": 0,
            "until": looks_until_done(body.get("prompt")),
            "script": script,
        }
        return _answer(0, "success", task_id=task_id)

    def _query(self, task_id: str) -> Reply:
        task = self.tasks.get(task_id)
        if task is None:
            return _answer(
                2013, "invalid params, task not found", task_id=task_id, status="", file_id=""
            )
        task["looks"] += 1
        if task["looks"] < task["until"] or task["script"] == "never":
            status = "Queueing" if task["looks"] < 2 else "Processing"
            return _answer(0, "success", task_id=task_id, status=status, file_id="")
        if task["script"] == "fail":
            return _answer(
                1027, "output video new_sensitive", task_id=task_id, status="Fail", file_id=""
            )
        task["file_id"] = str(int(task_id) + 7)
        return _answer(
            0,
            "success",
            task_id=task_id,
            status="Success",
            file_id=task["file_id"],
            video_width=1366,
            video_height=768,
        )
