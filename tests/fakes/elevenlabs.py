"""A fake ElevenLabs speech-to-text API, written from ElevenLabs' documentation (checked
2026-11-27): https://elevenlabs.io/docs/api-reference/speech-to-text/convert and the
elevenlabs-python SDK (request fields; response `{language_code, language_probability, text,
words: [{text, start, end, type, speaker_id, logprob}]}`),
https://elevenlabs.io/docs/eleven-api/resources/errors (errors as `{"detail": {"type", "code",
"message", "request_id", "param"}}`, where `status` is a legacy field "no longer used", so this
fake leaves it out; a 429 has the code `rate_limit_exceeded` or `concurrent_limit_exceeded`;
FastAPI's 422 validation errors as `{"detail": [{"loc", "msg", "type"}]}`) and
https://elevenlabs.io/docs/changelog/2026/6/8 (`scribe_v1` removed on 2026-07-09: migrate to
`scribe_v2`).

`POST /v1/speech-to-text`, multipart with `file` and `model_id`, header `xi-api-key`.
Scripted by `model_id`: any model answers "Hello, world. Bye." (two sentences, with a
spacing entry between words and an audio event) except `ratelimit` (429
rate_limit_exceeded), `concurrency` (429 concurrent_limit_exceeded), `error-<status>`,
`garbage`, and the removed models (REMOVED_MODELS): ElevenLabs does not document its answer to
a removed model, so the fake answers the documented validation error shape (400
`invalid_parameters`, param `model_id`) with its own wording.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.fakes.forms import read_form

API_KEY = "fake-elevenlabs-key"
GRANULARITIES = ("none", "word", "character")
REMOVED_MODELS = frozenset({"scribe_v1"})
TOKENS: list[dict[str, Any]] = [
    {"text": "Hello,", "start": 0.1, "end": 0.45, "type": "word", "speaker_id": "speaker_0"},
    {"text": " ", "start": 0.45, "end": 0.5, "type": "spacing", "speaker_id": "speaker_0"},
    {"text": "world.", "start": 0.5, "end": 0.9, "type": "word", "speaker_id": "speaker_0"},
    {"text": " ", "start": 0.9, "end": 0.95, "type": "spacing", "speaker_id": "speaker_0"},
    {"text": "(laughs)", "start": 0.95, "end": 1.2, "type": "audio_event"},
    {"text": " ", "start": 1.2, "end": 1.3, "type": "spacing", "speaker_id": "speaker_0"},
    {"text": "Bye.", "start": 1.3, "end": 1.6, "type": "word", "speaker_id": "speaker_0"},
]


def _error(
    status: int, code: str, message: str, kind: str | None = None, param: str | None = None
) -> httpx.Response:
    detail = {"code": code, "message": message, "request_id": "fake-request-id"}
    if kind is not None:  # the error types the errors page shows (validation_error)
        detail["type"] = kind
    if param is not None:
        detail["param"] = param
    return httpx.Response(status, json={"detail": detail})


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
        if model in REMOVED_MODELS:
            message = f"The model '{model}' is no longer available. Use 'scribe_v2'."
            return _error(400, "invalid_parameters", message, "validation_error", "model_id")
        if model == "ratelimit":  # no Retry-After is documented
            return _error(429, "rate_limit_exceeded", "Too many requests")
        if model == "concurrency":
            return _error(429, "concurrent_limit_exceeded", "Too many concurrent requests")
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
