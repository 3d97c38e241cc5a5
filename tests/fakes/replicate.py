"""A fake Replicate predictions API, written from Replicate's HTTP API reference
(https://replicate.com/docs/reference/http: models.predictions.create, predictions.get,
predictions.cancel; https://replicate.com/docs/topics/predictions/rate-limits).

`POST /v1/models/{owner}/{name}/predictions` `{input}` (or `POST /v1/predictions` `{version,
input}`) with `Authorization: Bearer <token>` → 201 the prediction `{id, model, version,
input, logs, output: null, error: null, status: starting, created_at, urls: {get, cancel,
stream, web}}`; `GET /v1/predictions/{id}` → starting, processing, then succeeded with
`output` a file URL (replicate.delivery) and `metrics.predict_time`; `POST
/v1/predictions/{id}/cancel` → the prediction, canceled. Errors are problem details
`{"title", "detail", "status"}`; a 429 says when to retry in its detail ("Request was
throttled. Expected available in N seconds.").

Scripted by the model name (`owner/<name>`): `ok` (output one URL), `ok-list` (a list of
URLs), `fail` (failed: E005 flagged as sensitive), `never` (stays processing), `invalid` (422
input validation), `ratelimit` (429, expected available in 7 seconds), `error-<status>`,
`garbage` (200, not JSON). Checked 2026-11-27 against the same pages: unchanged.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Any

import httpx

from testkit.fakes.video_providers import VIDEO

API_KEY = "r8_fake-replicate-token"
THROTTLE_SECONDS = 7
_CREATE = re.compile(r"^/v1/models/([^/]+)/([^/]+)/predictions$")


def _problem(status: int, title: str, detail: str) -> httpx.Response:
    return httpx.Response(
        status,
        json={"title": title, "detail": detail, "status": status},
        headers={"Content-Type": "application/problem+json"},
    )


@dataclass
class FakeReplicate:
    requests: list[httpx.Request] = field(default_factory=list)
    predictions: dict[str, dict[str, Any]] = field(default_factory=dict)
    _ids: Any = field(default_factory=lambda: itertools.count(1))

    def created(self) -> list[dict[str, Any]]:
        return [p["input"] for p in self.predictions.values()]

    def handle(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        path = request.url.path
        if path.startswith("/files/"):
            return httpx.Response(200, content=VIDEO, headers={"Content-Type": "video/mp4"})
        if request.headers.get("authorization") != f"Bearer {API_KEY}":
            return _problem(401, "Unauthenticated", "You did not pass a valid authentication token")
        created = _CREATE.match(path)
        if request.method == "POST" and (created or path == "/v1/predictions"):
            name = f"{created.group(1)}/{created.group(2)}" if created else None
            return self._create(request, name)
        prediction_id, _, action = path.removeprefix("/v1/predictions/").partition("/")
        prediction = self.predictions.get(prediction_id)
        if prediction is None or not path.startswith("/v1/predictions/"):
            return _problem(404, "Not found", "The requested resource could not be found.")
        if request.method == "GET" and not action:
            self._advance(request, prediction)
            return httpx.Response(200, json=prediction)
        if request.method == "POST" and action == "cancel":
            if prediction["status"] in ("starting", "processing"):
                prediction["status"] = "canceled"
            return httpx.Response(200, json=prediction)
        return _problem(404, "Not found", "The requested resource could not be found.")

    def _create(self, request: httpx.Request, name: str | None) -> httpx.Response:
        try:
            body = httpx.Response(200, content=request.content).json()
        except ValueError:
            return _problem(400, "Bad request", "Invalid JSON")
        if not isinstance(body.get("input"), dict) or (name is None and "version" not in body):
            return _problem(422, "Input validation failed", "- input: input is required")
        name = name or f"owner/{body['version']}"
        script = name.split("/", 1)[1]
        if script == "invalid":
            return _problem(
                422, "Input validation failed", "- input.duration: duration must be one of: 5, 10"
            )
        if script == "ratelimit":
            return _problem(
                429,
                "Request was throttled",
                f"Request was throttled. Expected available in {THROTTLE_SECONDS} seconds.",
            )
        if script.startswith("error-"):
            return _problem(int(script.split("-", 1)[1]), "Internal server error", "Try again")
        if script == "garbage":
            return httpx.Response(200, content=b"<html>", headers={"Content-Type": "text/html"})
        prediction_id = f"gm3qorzdhgbfurvjtvhg6dckhu{next(self._ids):02d}"
        api = f"{request.url.scheme}://{request.url.netloc.decode()}/v1/predictions/{prediction_id}"
        prediction = {
            "id": prediction_id,
            "model": name,
            "version": body.get("version", "hidden"),
            "input": body["input"],
            "logs": "",
            "output": None,
            "data_removed": False,
            "error": None,
            "status": "starting",
            "created_at": "2026-11-23T21:00:00.000Z",
            "urls": {
                "get": api,
                "cancel": f"{api}/cancel",
                "web": f"https://replicate.com/p/{prediction_id}",
            },
        }
        self.predictions[prediction_id] = prediction
        return httpx.Response(201, json=prediction)

    def _advance(self, request: httpx.Request, prediction: dict[str, Any]) -> None:
        script = prediction["model"].split("/", 1)[1]
        if prediction["status"] == "starting":
            prediction["status"] = "processing"
        elif prediction["status"] == "processing" and script != "never":
            if script == "fail":
                prediction["status"] = "failed"
                prediction["error"] = (
                    "The input or output was flagged as sensitive. "
                    "Please try again with different inputs. (E005)"
                )
                return
            origin = f"{request.url.scheme}://{request.url.netloc.decode()}"
            url = f"{origin}/files/{prediction['id']}/output.mp4"
            prediction["status"] = "succeeded"
            prediction["output"] = [url, url] if script == "ok-list" else url
            prediction["metrics"] = {"predict_time": 41.2, "total_time": 45.0}
