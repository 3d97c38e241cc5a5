"""A small HTTP server on loopback for provider fakes: each fake answers `route(request)`.
Every request is recorded. The scripted behaviour of the video fakes is chosen by words in
the prompt (see SCRIPT), so one fake serves unit and end-to-end tests alike."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from testkit.fakes.listener import BurstHTTPServer, serve_in_thread, stop_serving
from testkit.fakes.video_providers import VIDEO

# Prompt words that script a video fake (otherwise a job completes on its second look):
# "refuse" - the provider refuses the prompt (its content-safety error) at submission;
# "ratelimit" - the provider's rate-limit answer at submission;
# "servererror" - a 5xx at submission; "garbage" - a body that is not JSON;
# "fail" - the task fails while running; "never" - the task never ends;
# "at once" - the task is done on its first look (end-to-end tests, to save a poll).
SCRIPT = ("refuse", "ratelimit", "servererror", "garbage", "fail", "never")
__all__ = [
    "SCRIPT",
    "VIDEO",
    "FakeRequest",
    "LoopbackServer",
    "Reply",
    "looks_until_done",
    "scripted",
]


def looks_until_done(prompt: object) -> int:
    return 1 if "at once" in str(prompt or "") else 2


def scripted(prompt: object) -> str | None:
    text = str(prompt or "")
    return next((word for word in SCRIPT if word in text), None)


@dataclass
class FakeRequest:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body or b"null")


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of_json(cls, status: int, body: Any, headers: dict[str, str] | None = None) -> Reply:
        return cls(
            status,
            json.dumps(body).encode(),
            {"Content-Type": "application/json", **(headers or {})},
        )

    @classmethod
    def video(cls) -> Reply:
        return cls(200, VIDEO, {"Content-Type": "video/mp4"})


class LoopbackServer:
    """Subclasses implement `route`."""

    def __init__(self) -> None:
        self.requests: list[FakeRequest] = []
        self.server: ThreadingHTTPServer | None = None
        self.lock = threading.Lock()

    @property
    def origin(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def route(self, request: FakeRequest) -> Reply:
        raise NotImplementedError

    def start(self) -> LoopbackServer:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                parts = urlsplit(self.path)
                length = int(self.headers.get("Content-Length", "0"))
                request = FakeRequest(
                    method=self.command,
                    path=parts.path,
                    query={k: v[0] for k, v in parse_qs(parts.query).items()},
                    headers={k.lower(): v for k, v in self.headers.items()},
                    body=self.rfile.read(length) if length else b"",
                )
                with fake.lock:
                    fake.requests.append(request)
                    try:
                        reply = fake.route(request)
                    except Exception as exc:  # a fake's bug shows as a 500 with its text
                        reply = Reply(500, repr(exc).encode())
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)

            do_GET = do_POST = do_DELETE = _serve

        self.server = serve_in_thread(BurstHTTPServer(("127.0.0.1", 0), Handler))
        return self

    def stop(self) -> None:
        stop_serving(self.server)
