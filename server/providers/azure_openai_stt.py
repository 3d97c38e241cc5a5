"""Azure OpenAI speech-to-text on a model deployment: multipart
`POST {resource}/openai/deployments/{deployment}/audio/transcriptions?api-version=…`.

Checked 2026-11-27 against https://learn.microsoft.com/azure/foundry/openai/reference
(the audio operations of the 2024-10-21 GA data plane, still the GA version that page
documents for transcriptions; its API table names `v1` as the latest data plane release, the
`/openai/v1/` routes, not used here: they take the model in the body instead of a deployment
in the path) and https://learn.microsoft.com/azure/foundry/openai/reference-preview
(2025-04-01-preview).

The request and answer are OpenAI's (openai_stt.form_fields / openai_stt.parse: `file`,
`model`, `response_format`, `language`, `prompt`, `temperature`, `timestamp_granularities[]`,
and the members of `provider.options[<slug>]` (slug: the endpoint's `provider`) as further form
fields, encoded as openai-python does, never `stream`); the differences are the URL, which
names the deployment and the API version, and the credential header `api-key: <key>`
(Microsoft Entra tokens as `Authorization: Bearer` are not supported here).
Errors are OpenAI-shaped (`{"error": {"code", "message"}}`); a 429 carries `retry-after`
and/or `retry-after-ms`.

How an operator configures it: an endpoint with `adapter = "azure-openai"`, `base_url` = the
resource's endpoint (`https://<resource>.openai.azure.com`, without `/openai`), `model` =
the deployment's name (e.g. `whisper`; without `model` the part of the catalog id after the
slash is used), optionally `api_version` (default DEFAULT_API_VERSION, the current GA data
plane version for audio), and `api_key_env = "AZURE_OPENAI_API_KEY"`; set AZURE_OPENAI_API_KEY
to one of the resource's keys. A Whisper deployment answers verbose_json (set
`verbose_json = true` on the model); gpt-4o-transcribe deployments answer json only and need a
preview `api_version` (2025-03-01-preview or later).
"""

from __future__ import annotations

from urllib.parse import quote

import httpx

from server.providers.endpoint import Endpoint
from server.providers.openai_stt import transcribe_form
from server.providers.stt import SttCall, Transcript

DEFAULT_API_VERSION = "2024-10-21"


class AzureOpenAISttAdapter:
    def __init__(self, http: httpx.AsyncClient) -> None:
        self._http = http

    async def transcribe(self, endpoint: Endpoint, call: SttCall) -> Transcript:
        credential = endpoint.credential()
        deployment = quote(call.model, safe="")
        return await transcribe_form(
            self._http,
            endpoint,
            call,
            f"{endpoint.base_url}/openai/deployments/{deployment}/audio/transcriptions",
            {"api-key": credential} if credential else {},
            {"api-version": endpoint.api_version or DEFAULT_API_VERSION},
        )
