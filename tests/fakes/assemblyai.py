"""A fake AssemblyAI asynchronous transcription API, written from AssemblyAI's documentation
(checked 2026-11-27): https://www.assemblyai.com/docs/api-reference/files/upload
(`POST /v2/upload`, raw bytes → `{upload_url}`),
https://www.assemblyai.com/docs/api-reference/transcripts/submit (`POST /v2/transcript` → the
transcript with `id`, `status`), https://www.assemblyai.com/docs/api-reference/transcripts/get
(`GET /v2/transcript/{id}`: `text`, `words` [{text, start, end, confidence, speaker}] in
milliseconds, `language_code`, `audio_duration`, `speech_model_used`),
https://www.assemblyai.com/docs/api-reference/transcripts/get-sentences,
https://www.assemblyai.com/docs/pre-recorded-audio/transcript-status (queued → processing →
completed | error), https://www.assemblyai.com/docs/api-reference/overview and the OpenAPI spec
https://github.com/AssemblyAI/assemblyai-api-spec (openapi.yml 1.3.4: errors as
`{"error": "..."}`, `Authorization: <key>` without a scheme).

The model is chosen by `speech_models`, a list of model names in priority order
(https://www.assemblyai.com/docs/pre-recorded-audio/select-the-speech-model). The singular
`speech_model` is retired: AssemblyAI refuses a request carrying it with 400 "speech_model is
deprecated. Use 'speech_models' instead", and so does this fake. A request without
`speech_models` gets the account's default model (DEFAULT_MODEL here).

Scripted by the first of `speech_models`: `polls-<n>` is `processing` for n looks, then
completed (any other model completes at the first look); `ratelimit-<seconds>` refuses the
submission (429, Retry-After), `error-<status>` refuses it with that status, `fails` ends in
`error`. An `audio_url` the fake did not issue ends in a download error, as AssemblyAI's would.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, field
from typing import Any

import httpx

API_KEY = "fake-assemblyai-key"
CLAIMED_DURATION = 42
WORDS = [
    {"text": "Hello,", "start": 80, "end": 480, "confidence": 0.99, "speaker": None},
    {"text": "world.", "start": 560, "end": 1020, "confidence": 0.97, "speaker": None},
]
TEXT = "Hello, world."
DEFAULT_MODEL = "universal-2"
RETIRED_PARAMETER = "speech_model is deprecated. Use 'speech_models' instead"
# The pre-recorded models AssemblyAI's documentation names today (model selection page,
# model-versions-and-deprecations and the assemblyai-stt-3-7 migration guide, 2026-11); the
# fake does not refuse other names (its scripts are model names), the catalog test uses these.
DOCUMENTED_MODELS = frozenset({"assemblyai-stt-3-7", "universal-3-5-pro", "universal-2"})
_TRANSCRIPT = re.compile(r"^/v2/transcript/([^/]+)(/sentences)?$")


def _error(status: int, message: str, **headers: str) -> httpx.Response:
    return httpx.Response(status, json={"error": message}, headers=headers)


@dataclass
class FakeAssemblyAI:
    requests: list[httpx.Request] = field(default_factory=list)
    uploads: dict[str, bytes] = field(default_factory=dict)
    transcripts: dict[str, dict[str, Any]] = field(default_factory=dict)
    _ids: Any = field(default_factory=lambda: itertools.count(1))

    def polls(self, transcript_id: str) -> int:
        return sum(1 for r in self.requests if r.url.path == f"/v2/transcript/{transcript_id}")

    def handle(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        if request.headers.get("authorization") != API_KEY:
            return _error(401, "Authentication error, API token missing/invalid")
        path = request.url.path
        if request.method == "POST" and path == "/v2/upload":
            if not request.content:
                return _error(400, "Upload failed: empty body")
            url = f"https://cdn.assemblyai.test/upload/{next(self._ids):08x}"
            self.uploads[url] = request.content
            return httpx.Response(200, json={"upload_url": url})
        if request.method == "POST" and path == "/v2/transcript":
            return self._submit(request)
        found = _TRANSCRIPT.match(path)
        if request.method == "GET" and found and found.group(1) in self.transcripts:
            job = self.transcripts[found.group(1)]
            return self._sentences(job) if found.group(2) else self._look(job)
        return _error(404, "Transcript not found")

    def _submit(self, request: httpx.Request) -> httpx.Response:
        try:
            body = json.loads(request.content)
        except ValueError:
            return _error(400, "Invalid JSON")
        if not isinstance(body, dict) or not isinstance(body.get("audio_url"), str):
            return _error(400, "audio_url is required")
        if body.get("language_code") and body.get("language_detection"):
            return _error(400, "language_code and language_detection cannot both be set")
        if body.get("speech_model") is not None:
            return _error(400, RETIRED_PARAMETER)
        models = body.get("speech_models", [DEFAULT_MODEL])
        if (
            not isinstance(models, list)
            or not models
            or not all(isinstance(m, str) and m for m in models)
        ):
            return _error(400, "speech_models must be a non-empty list of model names")
        model = models[0]
        if model.startswith("ratelimit-"):
            return _error(429, "Too Many Requests", **{"Retry-After": model.split("-", 1)[1]})
        if model.startswith("error-"):
            return _error(int(model.split("-", 1)[1]), "Internal server error")
        transcript_id = f"tr_{next(self._ids):06d}"
        job = {"id": transcript_id, "request": body, "looks": 0, "model": model}
        self.transcripts[transcript_id] = job
        return httpx.Response(200, json=self._view(job, "queued"))

    def _view(self, job: dict[str, Any], status: str) -> dict[str, Any]:
        request = job["request"]
        return {
            "id": job["id"],
            "status": status,
            "audio_url": request["audio_url"],
            "speech_models": request.get("speech_models"),
            "speech_model_used": job["model"],
            "language_code": request.get("language_code"),
            "language_detection": request.get("language_detection", False),
            "text": None,
            "words": None,
            "audio_duration": None,
            "error": None,
        }

    def _look(self, job: dict[str, Any]) -> httpx.Response:
        job["looks"] += 1
        model: str = job["model"]
        wanted = int(model.split("-", 1)[1]) if model.startswith("polls-") else 0
        if job["looks"] <= wanted:
            return httpx.Response(200, json=self._view(job, "processing"))
        view = self._view(job, "completed")
        if model == "fails" or job["request"]["audio_url"] not in self.uploads:
            view.update(status="error", error="Download error, unable to download audio")
            return httpx.Response(200, json=view)
        job["done"] = True
        view.update(
            text=TEXT,
            words=WORDS,
            audio_duration=CLAIMED_DURATION,
            confidence=0.98,
            language_code=job["request"].get("language_code") or "en_us",
        )
        return httpx.Response(200, json=view)

    def _sentences(self, job: dict[str, Any]) -> httpx.Response:
        if not job.get("done"):
            return _error(400, "Transcript is not completed")
        sentence = {
            "text": TEXT,
            "start": WORDS[0]["start"],
            "end": WORDS[-1]["end"],
            "confidence": 0.98,
            "speaker": None,
            "words": WORDS,
        }
        body = {
            "id": job["id"],
            "confidence": 0.98,
            "audio_duration": CLAIMED_DURATION,
            "sentences": [sentence],
        }
        return httpx.Response(200, json=body)
