"""A fake Azure OpenAI transcription endpoint, written from Microsoft's documentation (checked
2026-11-27): https://learn.microsoft.com/azure/foundry/openai/reference#transcriptions---create
(`POST {endpoint}/openai/deployments/{deployment-id}/audio/transcriptions?api-version=…`,
multipart `file`, `language`, `prompt`, `response_format`, `temperature`,
`timestamp_granularities[]`; header `api-key`), the error bodies
(`{"error": {"code", "message"}}`; 401 "Access denied due to invalid subscription key or
wrong API endpoint", 404 "Resource not found" for an unknown deployment or a missing
api-version) and throttling (429 with `retry-after` and `retry-after-ms`).

Deployments (scripted): `whisper` answers OpenAI's json / verbose_json, `ratelimit-<seconds>`
throttles, `error-<status>` fails with that status; any other name is not deployed (404).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.fakes.forms import read_form

API_KEY = "fake-azure-key"
API_VERSIONS = ("2024-06-01", "2024-10-21", "2025-03-01-preview", "2025-04-01-preview")
_PATH = re.compile(r"^/openai/deployments/([^/]+)/audio/transcriptions$")


def _error(status: int, code: str, message: str, **headers: str) -> httpx.Response:
    return httpx.Response(
        status, json={"error": {"code": code, "message": message}}, headers=headers
    )


@dataclass
class FakeAzureOpenAI:
    requests: list[httpx.Request] = field(default_factory=list)
    forms: list[dict[str, list[str]]] = field(default_factory=list)

    def handle(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        if request.headers.get("api-key") != API_KEY:
            return _error(
                401,
                "401",
                "Access denied due to invalid subscription key or wrong API endpoint. Make "
                "sure to provide a valid key for an active subscription and use a correct "
                "regional API endpoint for your resource.",
            )
        found = _PATH.match(request.url.path)
        if request.method != "POST" or not found:
            return _error(404, "404", "Resource not found")
        if request.url.params.get("api-version") not in API_VERSIONS:
            return _error(404, "404", "Resource not found")
        deployment = found.group(1)
        if deployment.startswith("ratelimit-"):
            seconds = deployment.split("-", 1)[1]
            return _error(
                429,
                "429",
                f"Requests to the Audio_Transcriptions Operation have exceeded rate limit. "
                f"Please retry after {seconds} seconds.",
                **{"retry-after": seconds, "retry-after-ms": f"{int(seconds) * 1000}"},
            )
        if deployment.startswith("error-"):
            return _error(int(deployment.split("-", 1)[1]), "InternalServerError", "broke")
        if deployment != "whisper":
            return _error(
                404, "DeploymentNotFound", "The API deployment for this resource does not exist."
            )
        try:
            fields, files = read_form(request)
        except ValueError:
            return _error(400, "invalid_request_error", "Expected multipart/form-data")
        self.forms.append(fields)
        if "file" not in files:
            return _error(400, "invalid_request_error", "file is required")
        response_format = fields.get("response_format", ["json"])[0]
        body: dict[str, Any] = {"text": "Hello, world."}
        if response_format == "verbose_json":
            granularities = fields.get("timestamp_granularities[]", ["segment"])
            body.update(task="transcribe", language="english", duration=77.0)
            if "segment" in granularities:
                body["segments"] = [
                    {
                        "id": 0,
                        "seek": 0,
                        "start": 0.0,
                        "end": 1.02,
                        "text": " Hello, world.",
                        "tokens": [50364, 2425],
                        "temperature": 0.0,
                        "avg_logprob": -0.3,
                        "compression_ratio": 0.8,
                        "no_speech_prob": 0.02,
                    }
                ]
            if "word" in granularities:
                body["words"] = [
                    {"word": "Hello", "start": 0.08, "end": 0.48},
                    {"word": "world", "start": 0.56, "end": 1.02},
                ]
        return httpx.Response(200, json=body)
