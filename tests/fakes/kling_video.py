"""A fake Kling API on loopback, written from Kling's documentation:
https://app.klingai.com/global/dev/document-api/apiReference/commonInfo (JWT auth: HS256,
iss = access key, exp, nbf; the error-code table) and the video model pages
(https://app.klingai.com/global/dev/document-api/apiReference/model/textToVideo,
.../imageToVideo, .../multiImageToVideo).

- Every request needs `Authorization: Bearer <JWT>` signed with SECRET_KEY, iss ACCESS_KEY,
  valid now (exp/nbf checked): else 401 with code 1000-1004.
- `POST /v1/videos/{text2video|image2video|multi-image2video}` → `{code: 0, message,
  request_id, data: {task_id, task_status: "submitted", created_at, updated_at}}`.
- `GET /v1/videos/{kind}/{task_id}`: "processing", then "succeed" with
  `task_result.videos[{id, url, duration}]` (or "failed" with task_status_msg).
- `GET /files/{id}.mp4`: the video, no credentials.
Checked 2026-11-27 (the same pages; kling-v3 as Kling 3.0 is documented): duration is a
string, "5"/"10" (kling-v1 .. v2.x) or "3".."15" (kling-v3*); aspect_ratio 16:9 | 9:16 | 1:1;
mode std | pro; anything else is 400 code 1201.
Prompt words script failures (tests/fakes/video_loopback.py SCRIPT): refusals are 400 code 1301,
rate limits 429 code 1302, server errors 500 code 5000."""

from __future__ import annotations

import itertools
import time
import uuid
from typing import Any

import jwt

from tests.fakes.video_loopback import (
    FakeRequest,
    LoopbackServer,
    Reply,
    looks_until_done,
    scripted,
)

ACCESS_KEY = "kling-test-access"
SECRET_KEY = "kling-test-secret-0123456789abcdef"
KINDS = ("text2video", "image2video", "multi-image2video")
ASPECT_RATIOS = ("16:9", "9:16", "1:1")
V3_DURATIONS = tuple(str(seconds) for seconds in range(3, 16))


def _error(status: int, code: int, message: str) -> Reply:
    return Reply.of_json(
        status, {"code": code, "message": message, "request_id": str(uuid.uuid4())}
    )


def _ok(data: dict[str, Any]) -> Reply:
    return Reply.of_json(
        200, {"code": 0, "message": "SUCCEED", "request_id": str(uuid.uuid4()), "data": data}
    )


class FakeKling(LoopbackServer):
    def __init__(self) -> None:
        super().__init__()
        self.tasks: dict[str, dict[str, Any]] = {}
        self.claims: list[dict[str, Any]] = []
        self._ids = itertools.count(860000000000000001)

    @property
    def base_url(self) -> str:
        return self.origin

    def submissions(self) -> list[tuple[str, dict[str, Any]]]:
        return [(r.path.rsplit("/", 1)[1], r.json()) for r in self.requests if r.method == "POST"]

    def _auth(self, request: FakeRequest) -> Reply | None:
        authorization = request.headers.get("authorization", "")
        if not authorization.startswith("Bearer "):
            return _error(401, 1001, "Authorization is empty")
        try:
            claims = jwt.decode(
                authorization[7:],
                SECRET_KEY,
                algorithms=["HS256"],
                options={"require": ["iss", "exp", "nbf"]},
            )
        except jwt.ExpiredSignatureError:
            return _error(401, 1004, "Authorization has expired")
        except jwt.ImmatureSignatureError:
            return _error(401, 1003, "Authorization is not yet valid")
        except jwt.PyJWTError:
            return _error(401, 1002, "Authorization is invalid")
        if claims["iss"] != ACCESS_KEY:
            return _error(401, 1000, "Authentication failed")
        self.claims.append(claims)
        return None

    def route(self, request: FakeRequest) -> Reply:
        if request.path.startswith("/files/"):
            return Reply.video()
        refused = self._auth(request)
        if refused is not None:
            return refused
        parts = request.path.strip("/").split("/")
        if parts[:2] != ["v1", "videos"] or len(parts) < 3 or parts[2] not in KINDS:
            return _error(404, 1203, "Requested resource does not exist")
        if request.method == "POST" and len(parts) == 3:
            return self._create(parts[2], request.json())
        if request.method == "GET" and len(parts) == 4:
            return self._query(parts[2], parts[3])
        return _error(404, 1202, "Invalid request method")

    def _create(self, kind: str, body: dict[str, Any]) -> Reply:
        model = str(body.get("model_name") or "")
        durations = V3_DURATIONS if model.startswith("kling-v3") else ("5", "10")
        if not model or body.get("duration") not in durations:
            return _error(400, 1201, "Invalid parameters: model_name, duration")
        if body.get("aspect_ratio", "16:9") not in ASPECT_RATIOS:
            return _error(400, 1201, "Invalid parameters: aspect_ratio")
        if kind == "image2video" and not (body.get("image") or body.get("image_tail")):
            return _error(400, 1201, "image is required")
        if kind == "multi-image2video" and not body.get("image_list"):
            return _error(400, 1201, "image_list is required")
        if body.get("mode", "std") not in ("std", "pro"):
            return _error(400, 1201, "mode must be std or pro")
        script = scripted(body.get("prompt"))
        if script == "refuse":
            return _error(400, 1301, "Trigger the content security policy")
        if script == "ratelimit":
            return _error(429, 1302, "The API request is too fast, please slow down")
        if script == "servererror":
            return _error(500, 5000, "Server internal error")
        if script == "garbage":
            return Reply(200, b"upstream connect error", {"Content-Type": "text/plain"})
        task_id = str(next(self._ids))
        self.tasks[task_id] = {
            "kind": kind,
            "looks": 0,
            "until": looks_until_done(body.get("prompt")),
            "script": script,
            "duration": body["duration"],
        }
        now = int(time.time() * 1000)
        return _ok(
            {"task_id": task_id, "task_status": "submitted", "created_at": now, "updated_at": now}
        )

    def _query(self, kind: str, task_id: str) -> Reply:
        task = self.tasks.get(task_id)
        if task is None or task["kind"] != kind:
            return _error(404, 1203, "Requested resource does not exist")
        task["looks"] += 1
        data: dict[str, Any] = {
            "task_id": task_id,
            "task_status": "processing",
            "task_status_msg": "",
            "created_at": 0,
            "updated_at": 0,
        }
        if task["looks"] >= task["until"] and task["script"] != "never":
            if task["script"] == "fail":
                data.update(
                    task_status="failed", task_status_msg="Failure to pass the risk control system"
                )
            else:
                data.update(
                    task_status="succeed",
                    task_result={
                        "videos": [
                            {
                                "id": f"v{task_id}",
                                "url": f"{self.origin}/files/{task_id}.mp4",
                                "duration": f"{task['duration']}.04",
                            }
                        ]
                    },
                )
        return _ok(data)
