"""A fake Deepgram pre-recorded transcription API, written from Deepgram's documentation
(checked 2026-11-27, with the deepgram-python-sdk 7.6.0 types):
https://developers.deepgram.com/reference/speech-to-text/listen-pre-recorded (request and
response), https://developers.deepgram.com/docs/errors (error bodies),
https://developers.deepgram.com/docs/utterances, /docs/language-detection, /docs/smart-format.

`POST /v1/listen?model=…` with the raw audio as the body (`Content-Type: audio/*`) and
`Authorization: Token <key>`. Scripted by the `model` query parameter: any model answers a
transcript of "hello world" except `ratelimit` (429 TOO_MANY_REQUESTS, no retry hint documented),
`error-<status>` (that status, Deepgram's error body), `garbage` (200, not JSON).
`metadata.duration` claims CLAIMED_DURATION seconds, which the gateway must not bill.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

API_KEY = "fake-deepgram-key"
CLAIMED_DURATION = 99.5
WORDS = [("hello", "Hello,", 0.08, 0.48, 0.99), ("world", "world.", 0.56, 1.02, 0.97)]


def _error(status: int, code: str, message: str, **headers: str) -> httpx.Response:
    body = {"err_code": code, "err_msg": message, "request_id": "fake-request-id"}
    return httpx.Response(status, json=body, headers=headers)


@dataclass
class FakeDeepgram:
    requests: list[httpx.Request] = field(default_factory=list)

    def handle(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        if request.url.path != "/v1/listen" or request.method != "POST":
            return _error(404, "NOT_FOUND", "Not found")
        if request.headers.get("authorization") != f"Token {API_KEY}":
            return _error(401, "INVALID_AUTH", "Invalid credentials.")
        if not request.headers.get("content-type", "").startswith("audio/") or not request.content:
            return _error(400, "Bad Request", "Bad Request: failed to process audio")
        params = request.url.params
        model = params.get("model", "")
        if model == "ratelimit":
            # Deepgram limits concurrent requests; its 429 carries no documented Retry-After.
            return _error(429, "TOO_MANY_REQUESTS", "Too many requests. Please try again later")
        if model.startswith("error-"):
            return _error(int(model.split("-", 1)[1]), "INTERNAL_SERVER_ERROR", "upstream broke")
        if model == "garbage":
            return httpx.Response(200, content=b"<html>", headers={"Content-Type": "text/html"})
        return httpx.Response(200, json=self._result(params))

    def _result(self, params: httpx.QueryParams) -> dict[str, Any]:
        smart = params.get("smart_format") == "true" or params.get("punctuate") == "true"
        words = [
            {
                "word": word,
                "start": start,
                "end": end,
                "confidence": confidence,
                **({"punctuated_word": punctuated} if smart else {}),
            }
            for word, punctuated, start, end, confidence in WORDS
        ]
        text = " ".join(w.get("punctuated_word", w["word"]) for w in words)
        channel: dict[str, Any] = {
            "alternatives": [{"transcript": text, "confidence": 0.98, "words": words}]
        }
        if params.get("detect_language") == "true":
            channel["detected_language"] = "en"
            channel["language_confidence"] = 0.97
        results: dict[str, Any] = {"channels": [channel]}
        if params.get("utterances") == "true":
            results["utterances"] = [
                {
                    "start": words[0]["start"],
                    "end": words[-1]["end"],
                    "confidence": 0.98,
                    "channel": 0,
                    "transcript": text,
                    "words": words,
                    "speaker": 0,
                    "id": "0f4c3b52-0000-4000-8000-000000000000",
                }
            ]
        metadata = {
            "request_id": "fake-request-id",
            "duration": CLAIMED_DURATION,
            "channels": 1,
            "models": ["fake-model-uuid"],
        }
        return {"metadata": metadata, "results": results}
