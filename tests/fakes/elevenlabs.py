"""A fake ElevenLabs speech-to-text API, written from ElevenLabs' documentation:
https://elevenlabs.io/docs/api-reference/speech-to-text/convert (request fields, response
`{language_code, language_probability, text, words: [{text, start, end, type, speaker_id,
logprob}]}`), https://elevenlabs.io/docs/api-reference/errors (`{"detail": {"status",
"message"}}`; 422 validation errors as `{"detail": [{"loc", "msg", "type"}]}`).

`POST /v1/speech-to-text`, multipart with `file` and `model_id`, header `xi-api-key`.
Scripted by `model_id`: any model answers "Hello, world. Bye." (two sentences, with a
spacing entry between words and an audio event) except `ratelimit` (429
too_many_concurrent_requests), `busy` (429 system_busy), `error-<status>`, `garbage`
(https://help.elevenlabs.io/hc/en-us/articles/19571824571921-API-Error-Code-429).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.fakes.forms import read_form

API_KEY = "fake-elevenlabs-key"
GRANULARITIES = ("none", "word", "character")
TOKENS: list[dict[str, Any]] = [
    {"text": "Hello,", "start": 0.1, "end": 0.45, "type": "word", "speaker_id": "speaker_0"},
    {"text": " ", "start": 0.45, "end": 0.5, "type": "spacing", "speaker_id": "speaker_0"},
    {"text": "world.", "start": 0.5, "end": 0.9, "type": "word", "speaker_id": "speaker_0"},
    {"text": " ", "start": 0.9, "end": 0.95, "type": "spacing", "speaker_id": "speaker_0"},
    {"text": "(laughs)", "start": 0.95, "end": 1.2, "type": "audio_event"},
    {"text": " ", "start": 1.2, "end": 1.3, "type": "spacing", "speaker_id": "speaker_0"},
    {"text": "Bye.", "start": 1.3, "end": 1.6, "type": "word", "speaker_id": "speaker_0"},
]


def _error(status: int, code: str, message: str, **headers: str) -> httpx.Response:
    return httpx.Response(
        status, json={"detail": {"status": code, "message": message}}, headers=headers
    )


def _invalid(field_name: str, message: str) -> httpx.Response:
    detail = [{"loc": ["body", field_name], "msg": message, "type": "value_error"}]
    return httpx.Response(422, json={"detail": detail})


@dataclass
class FakeElevenLabs:
    requests: list[httpx.Request] = field(default_factory=list)
    forms: list[dict[str, list[str]]] = field(default_factory=list)

    def handle(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        if request.url.path != "/v1/speech-to-text" or request.method != "POST":
            return _error(404, "not_found", "Not found")
        if request.headers.get("xi-api-key") != API_KEY:
            return _error(401, "invalid_api_key", "Invalid API key")
        try:
            fields, files = read_form(request)
        except ValueError:
            return _invalid("file", "Expected multipart/form-data")
        self.forms.append(fields)
        if "file" not in files or not files["file"].data:
            return _invalid("file", "Field required")
        model = fields.get("model_id", [""])[0]
        if not model:
            return _invalid("model_id", "Field required")
        granularity = fields.get("timestamps_granularity", ["word"])[0]
        if granularity not in GRANULARITIES:
            return _invalid("timestamps_granularity", f"Input should be {GRANULARITIES}")
        if model == "ratelimit":
            # Over the plan's concurrency; the documented headers say how far, no Retry-After.
            return _error(
                429,
                "too_many_concurrent_requests",
                "Too many concurrent requests",
                **{"current-concurrent-requests": "16", "maximum-concurrent-requests": "15"},
            )
        if model == "busy":
            return _error(429, "system_busy", "Our services are experiencing high traffic")
        if model.startswith("error-"):
            return _error(int(model.split("-", 1)[1]), "internal_error", "upstream broke")
        if model == "garbage":
            return httpx.Response(200, content=b"<html>", headers={"Content-Type": "text/html"})
        body: dict[str, Any] = {
            "language_code": fields.get("language_code", ["eng"])[0],
            "language_probability": 0.98,
            "text": "".join(token["text"] for token in TOKENS),
            "words": [] if granularity == "none" else TOKENS,
        }
        return httpx.Response(200, json=body)
