"""A fake Vertex AI (Veo) and Google OAuth token endpoint on loopback, written from:
https://cloud.google.com/vertex-ai/generative-ai/docs/model-reference/veo-video-generation
(predictLongRunning, fetchPredictOperation, the response's `videos`),
https://developers.google.com/identity/protocols/oauth2/service-account#httprest (the
service-account JWT grant: RS256 assertion with iss, scope, aud, iat, exp),
https://cloud.google.com/storage/docs/json_api/v1/objects/get (`?alt=media`) and
https://cloud.google.com/apis/design/errors (error bodies).

- `POST /token`: `grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer&assertion=...`;
  the assertion is verified with the service account's public key; answers an access token.
- `POST /v1/projects/{p}/locations/{l}/publishers/google/models/{m}:predictLongRunning`
  and `...:fetchPredictOperation` (`{"operationName"}`) need `Authorization: Bearer` a token
  it minted (else 401 UNAUTHENTICATED). The result has `bytesBase64Encoded` videos, or
  `gcsUri` ones under the request's `storageUri`.
- `GET /storage/v1/b/{bucket}/o/{object}?alt=media` (token required) serves those.
Checked 2026-11-27 against https://docs.cloud.google.com/gemini-enterprise-agent-platform/
models/veo/3-1-generate (Vertex AI is now the Gemini Enterprise Agent Platform): the model
IDs it documents (MODELS); another is 404 NOT_FOUND, as Vertex answers an unknown publisher
model. aspectRatio 16:9 | 9:16, durationSeconds 4 | 6 | 8, resolution 720p | 1080p | 4k;
else 400 INVALID_ARGUMENT.
Prompt words script failures (tests/fakes/video_loopback.py SCRIPT)."""

from __future__ import annotations

import base64
import itertools
import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.fakes.video_loopback import (
    VIDEO,
    FakeRequest,
    LoopbackServer,
    Reply,
    looks_until_done,
    scripted,
)

PROJECT = "fake-project"
LOCATION = "us-central1"
CLIENT_EMAIL = "veo-test@fake-project.iam.gserviceaccount.com"
SCOPE = "https://www.googleapis.com/auth/cloud-platform"
RESPONSE_TYPE = "type.googleapis.com/cloud.ai.large_models.vision.GenerateVideoResponse"
# The Veo model IDs Vertex AI documents (GA).
MODELS = ("veo-3.1-generate-001", "veo-3.1-fast-generate-001")
TEST_MODEL = "veo"  # the model name tests use where any served model would do
# The documented `aud` of the assertion, whatever the token URI it is posted to.
TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"


def _status(code: int, status: str, message: str, details: list[Any] | None = None) -> Reply:
    body = {"error": {"code": code, "message": message, "status": status, "details": details or []}}
    return Reply.of_json(code, body)


class FakeVertex(LoopbackServer):
    def __init__(self) -> None:
        super().__init__()
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.tokens: list[str] = []  # minted, in order
        self.operations: dict[str, dict[str, Any]] = {}
        self._ids = itertools.count(1)

    @property
    def base_url(self) -> str:
        return f"{self.origin}/v1/projects/{PROJECT}/locations/{LOCATION}"

    def write_service_account(self, path: Path) -> Path:
        """A service-account key file as the Cloud console issues it, its token_uri here."""
        pem = self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode()
        path.write_text(
            json.dumps(
                {
                    "type": "service_account",
                    "project_id": PROJECT,
                    "private_key_id": "fakekeyid1",
                    "private_key": pem,
                    "client_email": CLIENT_EMAIL,
                    "client_id": "1234567890",
                    "auth_uri": "https://accounts.google.com/o/oauth2/auth",
                    "token_uri": f"{self.origin}/token",
                }
            )
        )
        return path

    def submissions(self) -> list[dict[str, Any]]:
        return [r.json() for r in self.requests if r.path.endswith(":predictLongRunning")]

    def route(self, request: FakeRequest) -> Reply:
        if request.path == "/token" and request.method == "POST":
            return self._token(request)
        authorization = request.headers.get("authorization", "")
        if authorization.removeprefix("Bearer ") not in self.tokens:
            return _status(
                401, "UNAUTHENTICATED", "Request had invalid authentication credentials."
            )
        if request.path.startswith("/storage/v1/b/") and request.query.get("alt") == "media":
            return Reply.video()
        prefix = f"/v1/projects/{PROJECT}/locations/{LOCATION}/publishers/google/models/"
        if request.method != "POST" or not request.path.startswith(prefix):
            return _status(404, "NOT_FOUND", "not found")
        model, _, verb = request.path.removeprefix(prefix).partition(":")
        if verb == "predictLongRunning":
            return self._submit(model, request.json())
        if verb == "fetchPredictOperation":
            return self._look(request.json().get("operationName", ""))
        return _status(404, "NOT_FOUND", "not found")

    def _token(self, request: FakeRequest) -> Reply:
        form = {k: v[0] for k, v in parse_qs(request.body.decode()).items()}
        if form.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
            return Reply.of_json(400, {"error": "unsupported_grant_type"})
        try:
            claims = jwt.decode(
                form.get("assertion", ""),
                self.key.public_key(),
                algorithms=["RS256"],
                audience=TOKEN_AUDIENCE,
                issuer=CLIENT_EMAIL,
                options={"require": ["exp", "iat", "aud", "iss"]},
            )
        except jwt.PyJWTError:
            return Reply.of_json(
                400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."}
            )
        if SCOPE not in str(claims.get("scope", "")).split():
            return Reply.of_json(400, {"error": "invalid_scope"})
        token = f"ya29.fake-{len(self.tokens) + 1}-{int(time.time())}"
        self.tokens.append(token)
        return Reply.of_json(
            200, {"access_token": token, "expires_in": 3599, "token_type": "Bearer"}
        )

    def _submit(self, model: str, body: Any) -> Reply:
        if model not in (*MODELS, TEST_MODEL):
            return _status(
                404,
                "NOT_FOUND",
                f"Publisher Model `publishers/google/models/{model}` was not found or your "
                "project does not have access to it.",
            )
        instances = body.get("instances") if isinstance(body, dict) else None
        if not isinstance(instances, list) or len(instances) != 1 or "prompt" not in instances[0]:
            return _status(400, "INVALID_ARGUMENT", "instances[0].prompt is required")
        parameters = body.get("parameters", {})
        if (
            parameters.get("aspectRatio", "16:9") not in ("16:9", "9:16")
            or str(parameters.get("durationSeconds", 8)) not in ("4", "6", "8")
            or parameters.get("resolution", "720p") not in ("720p", "1080p", "4k")
        ):
            return _status(400, "INVALID_ARGUMENT", "Unsupported aspectRatio, duration or size.")
        script = scripted(instances[0]["prompt"])
        if script == "refuse":
            return _status(
                400,
                "INVALID_ARGUMENT",
                "The prompt contains sensitive words that violate Google's Responsible AI "
                "practices.",
            )
        if script == "ratelimit":
            return _status(
                429,
                "RESOURCE_EXHAUSTED",
                "Quota exceeded for aiplatform.googleapis.com/"
                "online_prediction_requests_per_base_model.",
                [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "23s"}],
            )
        if script == "servererror":
            return _status(503, "UNAVAILABLE", "The service is currently unavailable.")
        if script == "garbage":
            return Reply(200, b"{not json", {"Content-Type": "application/json"})
        model_name = f"projects/{PROJECT}/locations/{LOCATION}/publishers/google/models/{model}"
        name = f"{model_name}/operations/{next(self._ids)}"
        self.operations[name] = {
            "looks": 0,
            "until": looks_until_done(instances[0]["prompt"]),
            "script": script,
            "storage": parameters.get("storageUri"),
        }
        return Reply.of_json(200, {"name": name})

    def _look(self, name: str) -> Reply:
        operation = self.operations.get(name)
        if operation is None:
            return _status(404, "NOT_FOUND", "Operation not found")
        operation["looks"] += 1
        if operation["looks"] < operation["until"] or operation["script"] == "never":
            return Reply.of_json(200, {"name": name})
        if operation["script"] == "fail":
            return Reply.of_json(
                200,
                {
                    "name": name,
                    "done": True,
                    "error": {"code": 3, "message": "Unable to generate the video."},
                },
            )
        if operation["storage"]:
            video = {
                "gcsUri": f"{operation['storage'].rstrip('/')}/{name.rsplit('/', 1)[1]}/s0.mp4",
                "mimeType": "video/mp4",
            }
        else:
            video = {
                "bytesBase64Encoded": base64.b64encode(VIDEO).decode(),
                "mimeType": "video/mp4",
            }
        return Reply.of_json(
            200,
            {
                "name": name,
                "done": True,
                "response": {
                    "@type": RESPONSE_TYPE,
                    "raiMediaFilteredCount": 0,
                    "videos": [video],
                },
            },
        )

    def storage_paths(self) -> list[str]:
        return [unquote(r.path) for r in self.requests if r.path.startswith("/storage/")]
