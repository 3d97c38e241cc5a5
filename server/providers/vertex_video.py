"""Google Veo through Vertex AI (catalog adapter `vertex`).

Checked 2026-11-27 against https://docs.cloud.google.com/gemini-enterprise-agent-platform/
models/veo/3-1-generate (Vertex AI's generative models now live under the Gemini Enterprise
Agent Platform name; the API host and paths are unchanged), the Veo model reference
(https://cloud.google.com/vertex-ai/generative-ai/docs/model-reference/veo-video-generation)
and googleapis' aiplatform v1 predictLongRunning / fetchPredictOperation. The model IDs
Vertex documents are the GA ones (`veo-3.1-generate-001`, `veo-3.1-fast-generate-001`), not
the Gemini API's `-preview` names. Not settled from the documentation: whether Vertex, like
the Gemini API, takes 1080p / 4k at 8 s only (sent as asked), and until when
veo-3.0-generate-001 is served on Vertex.

Protocol (https://cloud.google.com/vertex-ai/generative-ai/docs/model-reference/veo-video-generation):
submit `POST {base}/publishers/google/models/{model}:predictLongRunning` with
`{"instances": [{prompt, image, lastFrame, referenceImages}], "parameters": {aspectRatio,
resolution, durationSeconds, sampleCount, generateAudio, seed, ...}}` → `{"name":
"projects/.../operations/..."}`; poll `POST {base}/publishers/google/models/{model}:
fetchPredictOperation` with `{"operationName": name}` until `"done": true`; then `error` or
`response.videos[]`, each `{bytesBase64Encoded, mimeType}` or — when the request named a
`storageUri` — `{gcsUri}`. Clients cannot name one (provider.options never set storageUri,
sampleCount: see veo.GATEWAY_PARAMETERS); the adapter sends one only when constructed with
`storage_uri` (not configurable from the catalog yet: videos come back inline). A
`gs://bucket/object` result is downloaded with the same token through the Cloud Storage JSON API
(`GET https://storage.googleapis.com/storage/v1/b/{bucket}/o/{object}?alt=media`,
https://cloud.google.com/storage/docs/json_api/v1/objects/get); the service account needs
read access to the bucket. Auth: `Authorization: Bearer` an OAuth access token minted from a
service-account JSON file with google-auth (scope cloud-platform); the token is cached and
refreshed (in a thread: the refresh is blocking) only when google-auth says it is about to
expire. No cancel call is documented for Veo operations.

Field mapping: as the `gemini` adapter (server/providers/veo.py), plus `seed` and
`generate_audio` → `seed`, `generateAudio`, which Vertex AI honours.

How an operator configures it: the built-in base URL `https://aiplatform.googleapis.com/v1`
names no project: the service account's own `project_id` (from its key file) is used, in
DEFAULT_LOCATION (us-central1) on that region's host. To choose them, put both in the base
URL: `base_url =
"https://europe-west4-aiplatform.googleapis.com/v1/projects/MY_PROJECT/locations/europe-west4"`.
`api_key_env = "GOOGLE_APPLICATION_CREDENTIALS"`
names the variable holding the PATH of a service-account key file (JSON, role Vertex AI
User); the variable may instead hold the key file's JSON itself (as a BYOK key would).
`model` = the Veo model, e.g. `veo-3.1-generate-001`, `veo-3.1-fast-generate-001`."""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
from typing import Any
from urllib.parse import quote, urlsplit

import google.auth.exceptions
import httpx
from google.oauth2 import service_account

from server.providers import veo
from server.providers.endpoint import Endpoint
from server.providers.failures import (
    INVALID_RESPONSE,
    REJECTED_CREDENTIALS,
    UNREACHABLE,
    ProviderFailure,
)
from server.providers.http import Downloads, ImageFetcher, json_object
from server.providers.video import VideoCall, VideoProgress, VideoSource
from server.providers.video_tasks import send_json

SCOPE = "https://www.googleapis.com/auth/cloud-platform"
GLOBAL_HOST = "aiplatform.googleapis.com"
# Where Veo runs when the base URL names no location (Veo's documented region).
DEFAULT_LOCATION = "us-central1"
STORAGE_BASE = "https://storage.googleapis.com"


def _refresh(credentials: service_account.Credentials) -> None:
    """Mint a token (blocking: runs in a worker thread). google-auth's transport brings in
    `requests` and urllib3, whose memory every server process would carry: imported here, on
    a gateway's first Vertex call, rather than at start-up by every gateway."""
    import google.auth.transport.requests

    credentials.refresh(google.auth.transport.requests.Request())  # type: ignore[no-untyped-call]


class ServiceAccountTokens:
    """OAuth access tokens per service account, minted and refreshed by google-auth. The
    credential is the path of a service-account key file or (a workspace's own key, BYOK)
    the key file's JSON itself. One refresh at a time per account; the blocking load and
    refresh run in a worker thread."""

    def __init__(self) -> None:
        self._credentials: dict[str, service_account.Credentials] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def _load(self, credential: str) -> service_account.Credentials:
        try:
            if credential.lstrip().startswith("{"):
                info = json.loads(credential)
                loaded = service_account.Credentials.from_service_account_info(  # type: ignore[no-untyped-call]  # google-auth's classmethod has no annotations
                    info, scopes=[SCOPE]
                )
            else:
                loaded = service_account.Credentials.from_service_account_file(  # type: ignore[no-untyped-call]  # google-auth's classmethod has no annotations
                    credential, scopes=[SCOPE]
                )
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            # Neither the path nor the key's content belongs in a message.
            raise ProviderFailure(
                REJECTED_CREDENTIALS, "The service-account key cannot be read"
            ) from exc
        assert isinstance(loaded, service_account.Credentials)
        return loaded

    async def token(self, credential: str) -> str:
        # Keyed by a digest: a key's JSON is not kept as a dictionary key.
        account = hashlib.sha256(credential.encode()).hexdigest()
        lock = self._locks.setdefault(account, asyncio.Lock())
        async with lock:
            credentials = self._credentials.get(account)
            if credentials is None:
                credentials = await asyncio.to_thread(self._load, credential)
                self._credentials[account] = credentials
            if not credentials.valid:  # no token yet, or it expires within minutes
                try:
                    await asyncio.to_thread(_refresh, credentials)
                except google.auth.exceptions.RefreshError as exc:
                    raise ProviderFailure(
                        REJECTED_CREDENTIALS, "Google refused the service account"
                    ) from exc
                except google.auth.exceptions.TransportError as exc:
                    raise ProviderFailure(
                        UNREACHABLE, "Google's token endpoint is unreachable"
                    ) from exc
            return str(credentials.token)

    async def project_id(self, credential: str) -> str:
        """The Google Cloud project the service account belongs to (its key file says)."""
        await self.token(credential)  # loads the account (and mints its first token)
        account = hashlib.sha256(credential.encode()).hexdigest()
        project = getattr(self._credentials[account], "project_id", None)
        if not isinstance(project, str) or not project:
            raise ProviderFailure(
                REJECTED_CREDENTIALS, "The service-account key names no project_id"
            )
        return project


class VertexVideoAdapter:
    def __init__(
        self,
        http: httpx.AsyncClient,
        tokens: ServiceAccountTokens | None = None,
        storage_base: str = STORAGE_BASE,
        images: ImageFetcher | None = None,
        storage_uri: str | None = None,
        downloads: Downloads | None = None,
    ) -> None:
        self._http = http
        self._storage_uri = storage_uri
        self._images = images or ImageFetcher(http)
        self._downloads = downloads or Downloads(http)
        self._tokens = tokens or ServiceAccountTokens()
        self._storage_base = storage_base.rstrip("/")

    async def _headers(self, endpoint: Endpoint) -> dict[str, str]:
        credential = endpoint.credential()
        if not credential:
            raise ProviderFailure(REJECTED_CREDENTIALS, "No credential is configured")
        return {"Authorization": f"Bearer {await self._tokens.token(credential)}"}

    async def _model_url(self, endpoint: Endpoint, call: VideoCall, verb: str) -> str:
        return f"{await self._project_base(endpoint)}/publishers/google/models/{call.model}:{verb}"

    async def _project_base(self, endpoint: Endpoint) -> str:
        """The base URL with project and location: as configured when it names them, else the
        service account's own project in DEFAULT_LOCATION, on that region's host."""
        base = endpoint.base_url or ""
        if "/projects/" in base:
            return base
        credential = endpoint.credential()
        if not credential:
            raise ProviderFailure(REJECTED_CREDENTIALS, "No credential is configured")
        project = quote(await self._tokens.project_id(credential), safe="")
        parts = urlsplit(base)
        if parts.hostname == GLOBAL_HOST:  # Veo is served from regional hosts
            base = f"{parts.scheme}://{DEFAULT_LOCATION}-{GLOBAL_HOST}{parts.path}"
        return f"{base}/projects/{project}/locations/{DEFAULT_LOCATION}"

    async def _post(self, endpoint: Endpoint, url: str, body: dict[str, Any]) -> dict[str, Any]:
        headers = await self._headers(endpoint)
        return json_object(
            await send_json(self._http, endpoint, "POST", url, headers, veo.failure_of, body)
        )

    async def submit(self, endpoint: Endpoint, call: VideoCall) -> VideoProgress:
        body = await veo.request_body(
            call,
            self._images,
            endpoint.timeout_seconds,
            vertex=True,
            storage_uri=self._storage_uri,
        )
        operation = await self._post(
            endpoint, await self._model_url(endpoint, call, "predictLongRunning"), body
        )
        return await self._progress(endpoint, operation)

    async def poll(
        self, endpoint: Endpoint, provider_job_id: str, call: VideoCall
    ) -> VideoProgress:
        operation = await self._post(
            endpoint,
            await self._model_url(endpoint, call, "fetchPredictOperation"),
            {"operationName": provider_job_id},
        )
        return await self._progress(endpoint, operation)

    async def _progress(self, endpoint: Endpoint, operation: dict[str, Any]) -> VideoProgress:
        name, progress = veo.unfinished(operation)
        if progress is not None:
            return progress
        result = operation.get("response")
        videos = result.get("videos") if isinstance(result, dict) else None
        if not isinstance(result, dict) or not isinstance(videos, list | None):
            raise ProviderFailure(INVALID_RESPONSE, "Provider returned an invalid response")
        if not videos:
            return veo.filtered(name, result)
        content = [await self._video(endpoint, video) for video in videos]
        return VideoProgress(state="completed", provider_job_id=name, videos=content)

    async def _video(self, endpoint: Endpoint, video: object) -> VideoSource:
        if isinstance(video, dict) and isinstance(video.get("bytesBase64Encoded"), str):
            try:
                return base64.b64decode(video["bytesBase64Encoded"], validate=True)
            except (binascii.Error, ValueError) as exc:
                raise ProviderFailure(INVALID_RESPONSE, "Provider returned a bad video") from exc
        uri = video.get("gcsUri") if isinstance(video, dict) else None
        if not isinstance(uri, str) or not uri.startswith("gs://") or "/" not in uri[5:]:
            raise ProviderFailure(INVALID_RESPONSE, "Provider returned no video")
        bucket, _, name = uri[5:].partition("/")
        url = (
            f"{self._storage_base}/storage/v1/b/{quote(bucket, safe='')}"
            f"/o/{quote(name, safe='')}?alt=media"
        )
        return self._downloads.remote(
            endpoint,
            url,
            headers=await self._headers(endpoint),
            failure_of=veo.failure_of,
            origin=self._storage_base,
        )
