"""Fake video providers on loopback speaking two real protocols, scripted by model name:

- the OpenAI videos API under /v1 (POST /v1/videos, GET /v1/videos/{id}, .../content, and
  POST /v1/videos/{id}/remix {prompt}: a new job from a completed one,
  https://platform.openai.com/docs/api-reference/videos/remix);
- a fal-style queue under /queue (POST /queue/{model}, GET .../requests/{id}/status,
  GET .../requests/{id} -> {"video": {"url"}}, and the file itself (outside /queue, as
  on fal's CDN, served without the key); PUT
  .../requests/{id}/cancel -> 202 {"status": "CANCELLATION_REQUESTED"}, 400
  {"status": "ALREADY_COMPLETED"} once done: https://docs.fal.ai/model-apis/model-endpoints/queue).

Models: "ok" completes on the second look, "fail" fails, "submit-500" refuses submission,
"slow" runs until cancelled.
Checked 2026-11-27: the queue as fal documents it (unchanged); the OpenAI videos API as its
reference documented it before OpenAI removed it (2026-09-24,
https://developers.openai.com/api/docs/deprecations).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from server.providers.local_video import render_mp4
from testkit.fakes.listener import serve_in_thread, stop_serving
from testkit.fakes.openai_stt import API_KEY

VIDEO = render_mp4({"width": 320, "height": 240, "duration": 1, "prompt": "fake provider"})


@dataclass
class FakeVideoProviders:
    submissions: list[dict[str, Any]] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)  # provider job ids cancelled
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    server: ThreadingHTTPServer | None = None
    _ids: Any = field(default_factory=lambda: itertools.count(1))

    @property
    def base(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> FakeVideoProviders:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _json(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _bytes(self, data: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "video/mp4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorized(self) -> bool:
                if self.headers.get("Authorization") == f"Bearer {API_KEY}":
                    return True
                self._json(401, {"error": {"message": "bad key", "code": "invalid_api_key"}})
                return False

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                if not self._authorized():
                    return
                parts = self.path.strip("/").split("/")
                model = body.get("model") if parts[:2] == ["v1", "videos"] else parts[-1]
                remix_of = None
                if parts[:2] == ["v1", "videos"] and parts[-1] == "remix":
                    source = fake.jobs.get(parts[2])
                    if source is None or source["looks"] < 2:  # not completed
                        self._json(400, {"error": {"message": "not completed", "code": "invalid"}})
                        return
                    model, remix_of = source["model"], parts[2]
                fake.submissions.append(
                    {"path": self.path, "model": model, "body": body, "remix_of": remix_of}
                )
                if model == "submit-500":
                    self._json(500, {"error": {"message": "down", "code": "server_error"}})
                    return
                job_id = f"job_{next(fake._ids)}"
                fake.jobs[job_id] = {"model": model, "looks": 0}
                if parts[0] == "v1":
                    self._json(200, {"id": job_id, "object": "video", "status": "queued"})
                else:
                    self._json(200, {"request_id": job_id})

            def do_PUT(self) -> None:
                if not self._authorized():
                    return
                parts = self.path.strip("/").split("/")  # queue {model} requests {id} cancel
                job = fake.jobs.get(parts[3]) if len(parts) == 5 else None
                if parts[0] != "queue" or parts[-1] != "cancel" or job is None:
                    self._json(404, {"detail": "Request not found"})
                    return
                if job.get("cancelled") or (job["looks"] >= 2 and job["model"] != "slow"):
                    self._json(400, {"status": "ALREADY_COMPLETED"})
                    return
                job["cancelled"] = True
                fake.cancelled.append(parts[3])
                self._json(202, {"status": "CANCELLATION_REQUESTED"})

            def do_GET(self) -> None:
                parts = self.path.strip("/").split("/")
                if parts[0] == "files":  # the result file, as on fal's CDN: no key needed
                    self._bytes(VIDEO)
                    return
                if not self._authorized():
                    return
                job_id = parts[2] if parts[0] == "v1" else parts[3]
                job = fake.jobs.get(job_id)
                if job is None:
                    self._json(404, {"error": {"message": "no such job", "code": "not_found"}})
                    return
                if parts[0] == "v1" and parts[-1] == "content":
                    self._bytes(VIDEO)
                    return
                if parts[0] == "queue" and parts[-1] != "status":
                    self._json(200, {"video": {"url": f"{fake.base}/files/{job_id}.mp4"}})
                    return
                job["looks"] += 1
                done = job["looks"] >= 2 and job["model"] != "slow"
                if parts[0] == "v1":
                    if job["model"] == "fail" and done:
                        self._json(
                            200,
                            {
                                "id": job_id,
                                "status": "failed",
                                "error": {"message": "content policy"},
                            },
                        )
                    else:
                        self._json(
                            200, {"id": job_id, "status": "completed" if done else "in_progress"}
                        )
                else:
                    state = (
                        ("FAILED" if job["model"] == "fail" else "COMPLETED")
                        if done
                        else "IN_PROGRESS"
                    )
                    self._json(200, {"status": state})

        self.server = serve_in_thread(ThreadingHTTPServer(("127.0.0.1", 0), Handler))
        return self

    def stop(self) -> None:
        stop_serving(self.server)
