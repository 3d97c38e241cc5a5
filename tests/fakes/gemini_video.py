"""A fake Gemini API (Veo) on loopback, written from Google's documentation:
https://ai.google.dev/gemini-api/docs/video (REST), https://ai.google.dev/api/models
(predictLongRunning, operations.get), https://ai.google.dev/gemini-api/docs/troubleshooting
and https://cloud.google.com/apis/design/errors (error bodies: google.rpc.Status with
ErrorInfo / RetryInfo details).

- `POST /v1beta/models/{model}:predictLongRunning`, key in `x-goog-api-key` (a wrong key is
  400 INVALID_ARGUMENT with ErrorInfo reason API_KEY_INVALID, as Google answers); parameters
  the Gemini API does not take (generateAudio, seed, ...) are 400 INVALID_ARGUMENT.
- `GET /v1beta/models/{model}/operations/{id}`: not done on the first look, then done with
  `response.generateVideoResponse.generatedSamples[].video.uri`, or `error`.
- `GET /v1beta/files/{id}:download?alt=media` (key required) redirects (302) to the file
  on a storage path, which must be fetched without the key.
Checked 2026-11-27 against https://ai.google.dev/gemini-api/docs/video (parameter table,
updated 2026-09-17): aspectRatio 16:9 | 9:16, resolution 720p | 1080p | 4k, durationSeconds
4 | 6 | 8, and 8 only with 1080p, 4k or reference images; anything else is 400
INVALID_ARGUMENT.
Prompt words script failures (tests/fakes/video_loopback.py SCRIPT); "filtered" ends the
operation with Veo's safety-filter counts and no samples."""

from __future__ import annotations

import itertools
from typing import Any

from tests.fakes.video_loopback import (
    FakeRequest,
    LoopbackServer,
    Reply,
    looks_until_done,
    scripted,
)

API_KEY = "gemini-test-key"
RESPONSE_TYPE = "type.googleapis.com/google.ai.generativelanguage.v1beta.PredictLongRunningResponse"
PARAMETERS = {
    "aspectRatio",
    "resolution",
    "durationSeconds",
    "negativePrompt",
    "personGeneration",
    "numberOfVideos",
    "sampleCount",
    "enhancePrompt",
}


def _status(code: int, status: str, message: str, details: list[Any] | None = None) -> Reply:
    body = {"error": {"code": code, "message": message, "status": status, "details": details or []}}
    return Reply.of_json(code, body)


def _refused(instance: dict[str, Any], parameters: dict[str, Any]) -> str | None:
    """Why Veo on the Gemini API refuses these parameters, if it does."""
    seconds = str(parameters.get("durationSeconds", "8"))
    resolution = parameters.get("resolution", "720p")
    if parameters.get("aspectRatio", "16:9") not in ("16:9", "9:16"):
        return "aspectRatio must be 16:9 or 9:16."
    if resolution not in ("720p", "1080p", "4k"):
        return "resolution must be 720p, 1080p or 4k."
    if seconds not in ("4", "6", "8"):
        return "durationSeconds must be 4, 6 or 8."
    if seconds != "8" and (resolution in ("1080p", "4k") or "referenceImages" in instance):
        return "durationSeconds must be 8 with 1080p, 4k or reference images."
    return None


class FakeGemini(LoopbackServer):
    def __init__(self) -> None:
        super().__init__()
        self.operations: dict[str, dict[str, Any]] = {}
        self._ids = itertools.count(1)

    @property
    def base_url(self) -> str:
        return f"{self.origin}/v1beta"

    def submissions(self) -> list[dict[str, Any]]:
        return [r.json() for r in self.requests if r.path.endswith(":predictLongRunning")]

    def route(self, request: FakeRequest) -> Reply:
        if request.path.startswith("/storage/"):
            if "x-goog-api-key" in request.headers:
                return _status(400, "INVALID_ARGUMENT", "storage got the API key")
            return Reply.video()
        if request.headers.get("x-goog-api-key") != API_KEY:
            return _status(
                400,
                "INVALID_ARGUMENT",
                "API key not valid. Please pass a valid API key.",
                [
                    {
                        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                        "reason": "API_KEY_INVALID",
                        "domain": "googleapis.com",
                    }
                ],
            )
        path = request.path.removeprefix("/v1beta/")
        if request.method == "POST" and path.endswith(":predictLongRunning"):
            return self._submit(
                path.removeprefix("models/").removesuffix(":predictLongRunning"), request.json()
            )
        if request.method == "GET" and path.startswith("files/") and path.endswith(":download"):
            file_id = path.removeprefix("files/").removesuffix(":download")
            return Reply(302, b"", {"Location": f"{self.origin}/storage/{file_id}.mp4"})
        if request.method == "GET" and path in self.operations:
            return self._look(path)
        return _status(404, "NOT_FOUND", "Requested entity was not found.")

    def _submit(self, model: str, body: Any) -> Reply:
        instances = body.get("instances") if isinstance(body, dict) else None
        if not isinstance(instances, list) or len(instances) != 1 or "prompt" not in instances[0]:
            return _status(400, "INVALID_ARGUMENT", "instances[0].prompt is required")
        unknown = set(body.get("parameters", {})) - PARAMETERS
        if unknown:
            return _status(
                400, "INVALID_ARGUMENT", f"{sorted(unknown)[0]} isn't supported by this model."
            )
        for key in ("image", "lastFrame"):
            image = instances[0].get(key)
            if image is not None and set(image) != {"bytesBase64Encoded", "mimeType"}:
                return _status(
                    400, "INVALID_ARGUMENT", f"{key} needs bytesBase64Encoded and mimeType"
                )
        refused = _refused(instances[0], body.get("parameters", {}))
        if refused is not None:
            return _status(400, "INVALID_ARGUMENT", refused)
        script = scripted(instances[0]["prompt"])
        if script == "refuse":
            return _status(
                400,
                "INVALID_ARGUMENT",
                "The prompt could not be submitted: it violates the usage guidelines.",
            )
        if script == "ratelimit":
            return _status(
                429,
                "RESOURCE_EXHAUSTED",
                "You exceeded your current quota.",
                [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "17s"}],
            )
        if script == "servererror":
            return _status(500, "INTERNAL", "An internal error has occurred.")
        if script == "garbage":
            return Reply(200, b"<html>not json</html>", {"Content-Type": "text/html"})
        name = f"models/{model}/operations/op{next(self._ids)}"
        self.operations[name] = {
            "looks": 0,
            "until": looks_until_done(instances[0]["prompt"]),
            "script": script,
            "prompt": instances[0]["prompt"],
        }
        return Reply.of_json(200, {"name": name})

    def _look(self, name: str) -> Reply:
        operation = self.operations[name]
        operation["looks"] += 1
        if operation["looks"] < operation["until"] or operation["script"] == "never":
            return Reply.of_json(200, {"name": name, "metadata": {}})
        if operation["script"] == "fail":
            return Reply.of_json(
                200,
                {
                    "name": name,
                    "done": True,
                    "error": {"code": 13, "message": "Video generation failed."},
                },
            )
        result: dict[str, Any] = {"@type": RESPONSE_TYPE}
        if "filtered" in operation["prompt"]:
            result["generateVideoResponse"] = {
                "raiMediaFilteredCount": 1,
                "raiMediaFilteredReasons": [
                    "The video could not be generated: it may violate the usage guidelines."
                ],
            }
        else:
            file_id = name.rsplit("/", 1)[1]
            uri = f"{self.base_url}/files/{file_id}:download?alt=media"
            result["generateVideoResponse"] = {"generatedSamples": [{"video": {"uri": uri}}]}
        return Reply.of_json(200, {"name": name, "done": True, "response": result})
