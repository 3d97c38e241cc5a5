"""A fake OpenAI-compatible transcription provider on loopback. It speaks the real protocol
(multipart `POST /v1/audio/transcriptions`, JSON answers, OpenAI error bodies) and behaves
according to the `model` form field, so one server can play every scripted provider:

ok, verbose, echo, ratelimit-<seconds>|ratelimit-none, error-<status>, overloaded, garbage,
slow-<seconds>, bad-request, tokens.

Authentication as OpenAI documents it (https://platform.openai.com/docs/api-reference/authentication):
`Authorization: Bearer <key>`; any other key gets OpenAI's 401 `invalid_api_key`. `api_keys` are
the keys this instance accepts (a test playing a workspace's own account sets its BYOK key).

`stream=true` (https://platform.openai.com/docs/api-reference/audio/createTranscription,
checked 2026-11-27) makes `ok` and `tokens` answer server-sent events
(`transcript.text.delta` … `transcript.text.done`) instead of one JSON body, as OpenAI's
streaming models do. Array fields arrive as OpenAI's SDK sends them (openai-python
`_serialize_multipartform`: `name[]` once per value, an object's members as `name[key]`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from python_multipart.multipart import parse_options_header

from server.transcription.request import multipart_parts
from testkit.fakes.listener import BurstHTTPServer, serve_in_thread, stop_serving

API_KEY = "fake-provider-secret"


@dataclass
class ReceivedCall:
    model: str
    fields: dict[str, list[str]]
    filename: str
    audio_bytes: int
    authorization: str | None


@dataclass
class FakeSttProvider:
    calls: list[ReceivedCall] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None
    api_keys: tuple[str, ...] = (API_KEY,)

    @property
    def base_url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def calls_for(self, model: str) -> list[ReceivedCall]:
        return [c for c in self.calls if c.model == model]

    def start(self) -> FakeSttProvider:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _send(
                self,
                status: int,
                body: bytes,
                headers: dict[str, str] | None = None,
                content_type: str = "application/json",
            ) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                try:
                    self.wfile.write(body)
                except BrokenPipeError:
                    pass  # the gateway gave up waiting (the "slow" script)

            def _error(
                self, status: int, message: str, code: str, headers: dict[str, str] | None = None
            ) -> None:
                body = {"error": {"message": message, "type": code, "code": code}}
                self._send(status, json.dumps(body).encode(), headers)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(length)
                if self.path != "/v1/audio/transcriptions":
                    self._error(404, "not found", "not_found")
                    return
                _, params = parse_options_header(self.headers.get("Content-Type", ""))
                fields: dict[str, list[str]] = {}
                filename, audio = "", b""
                for headers, data in multipart_parts(raw, params[b"boundary"]):
                    _, disposition = parse_options_header(headers["content-disposition"])
                    name = disposition[b"name"].decode()
                    if name == "file":
                        filename, audio = disposition.get(b"filename", b"").decode(), data
                    else:
                        fields.setdefault(name, []).append(data.decode())
                model = fields.get("model", [""])[0]
                provider.calls.append(
                    ReceivedCall(
                        model, fields, filename, len(audio), self.headers.get("Authorization")
                    )
                )
                if self.headers.get("Authorization") not in {
                    f"Bearer {key}" for key in provider.api_keys
                }:
                    self._error(401, "bad key", "invalid_api_key")
                    return
                self._respond(model, fields)

            def _respond(self, model: str, fields: dict[str, list[str]]) -> None:
                verbose = fields.get("response_format", ["json"])[0] == "verbose_json"
                streamed = fields.get("stream", ["false"])[0] == "true"
                if streamed and model in ("ok", "tokens"):
                    events = [
                        {"type": "transcript.text.delta", "delta": "fake "},
                        {"type": "transcript.text.delta", "delta": "transcript"},
                        {"type": "transcript.text.done", "text": "fake transcript"},
                    ]
                    events_body = b"".join(
                        b"data: " + json.dumps(e).encode() + b"\n\n" for e in events
                    )
                    self._send(200, events_body, content_type="text/event-stream")
                elif model == "ok" or model == "tokens":
                    body: dict[str, Any] = {"text": "fake transcript"}
                    if model == "tokens":
                        body["usage"] = {
                            "type": "tokens",
                            "input_tokens": 12,
                            "output_tokens": 3,
                            "total_tokens": 15,
                        }
                    if verbose:
                        body.update(_verbose_body())
                    self._send(200, json.dumps(body).encode())
                elif model == "echo":
                    self._send(
                        200, json.dumps({"text": json.dumps(fields, sort_keys=True)}).encode()
                    )
                elif model.startswith("ratelimit-"):
                    hint = model.split("-", 1)[1]
                    headers = {} if hint == "none" else {"Retry-After": hint}
                    self._error(429, "slow down", "rate_limit_exceeded", headers)
                elif model.startswith("error-"):
                    self._error(int(model.split("-", 1)[1]), "upstream broke", "server_error")
                elif model == "overloaded":
                    self._error(529, "overloaded", "overloaded_error")
                elif model == "garbage":
                    self._send(200, b"<html>not json</html>", content_type="text/html")
                elif model.startswith("slow-"):
                    time.sleep(float(model.split("-", 1)[1]))
                    self._send(200, b'{"text": "late"}')
                elif model == "bad-request":
                    self._error(400, "audio file is too short", "invalid_request_error")
                else:
                    self._error(404, f"model {model} not found", "model_not_found")

        self.server = serve_in_thread(BurstHTTPServer(("127.0.0.1", 0), Handler))
        return self

    def stop(self) -> None:
        stop_serving(self.server)


def _verbose_body() -> dict[str, Any]:
    return {
        "task": "transcribe",
        "language": "english",
        "duration": 1.07,
        "segments": [
            {
                "id": 0,
                "seek": 0,
                "start": 0.0,
                "end": 1.07,
                "text": "fake transcript",
                "tokens": [1, 2],
                "temperature": 0.0,
                "avg_logprob": -0.2,
                "compression_ratio": 0.9,
                "no_speech_prob": 0.01,
            }
        ],
        "words": [
            {"word": "fake", "start": 0.0, "end": 0.5},
            {"word": "transcript", "start": 0.5, "end": 1.07},
        ],
    }
