"""AssemblyAI asynchronous speech-to-text, waited on within one request.

Checked 2026-11-27 against https://www.assemblyai.com/docs/api-reference/transcripts/submit,
https://www.assemblyai.com/docs/api-reference/transcripts/get,
https://www.assemblyai.com/docs/api-reference/transcripts/get-sentences,
https://www.assemblyai.com/docs/api-reference/files/upload,
https://www.assemblyai.com/docs/pre-recorded-audio/transcript-status,
https://www.assemblyai.com/docs/pre-recorded-audio/select-the-speech-model,
https://www.assemblyai.com/docs/getting-started/model-versions-and-deprecations, the OpenAPI
spec https://github.com/AssemblyAI/assemblyai-api-spec (openapi.yml 1.3.4) and the Python SDK
https://github.com/AssemblyAI/assemblyai-python-sdk (1.x, 2026-08).

1. `POST {base_url}/v2/upload` with the raw audio → `{upload_url}`;
2. `POST {base_url}/v2/transcript` `{audio_url, speech_models: [model], language_code |
   language_detection: true, …}` → `{id, status}`. The model goes in `speech_models` (a list
   in priority order): the singular `speech_model` is retired and AssemblyAI refuses it with
   400 "speech_model is deprecated. Use 'speech_models' instead";
3. `GET {base_url}/v2/transcript/{id}` until `status` is `completed` or `error` (`queued` and
   `processing` mean wait): first at once, then after POLL_INTERVALS (half a second growing to
   POLL_INTERVAL_MAX, the three seconds AssemblyAI's examples wait), all within the endpoint's
   `timeout_seconds` counted from the upload (past it: a provider timeout, so routing tries
   the next endpoint); the gateway's own deadline for the request cuts it shorter when that
   comes first;
4. for verbose_json, `GET {base_url}/v2/transcript/{id}/sentences` for the segments.

Every request carries `authorization: <key>` (the key itself; AssemblyAI also takes a
`Bearer` prefix). Times (`start`, `end`) are milliseconds and converted to seconds;
`language_code` is the language AssemblyAI reports. `audio_duration` is not used: the gateway
bills the duration it measured itself. `provider.options[<slug>]` members (slug: the
endpoint's `provider`) are further JSON fields of the transcript request as AssemblyAI
documents them (`speaker_labels`, `keyterms_prompt`, `prompt`, `temperature`, …); they cannot
replace what the gateway sends (`speech_models` included), nor set a webhook, nor bring back
the retired `speech_model`. The request's own `prompt` and `temperature` are not sent: only
some of AssemblyAI's models take them (an option can, for a model that does). Errors: HTTP
failures carry `{"error": "..."}`; a transcript that ends in `error` is a provider failure with
its message.

How an operator configures it: an endpoint with `adapter = "assemblyai"`,
`base_url = "https://api.assemblyai.com"` (EU: `https://api.eu.assemblyai.com`),
`api_key_env = "ASSEMBLYAI_API_KEY"` and `model` = one of AssemblyAI's current pre-recorded
models (`universal-2`, `assemblyai-stt-3-7`, …; the bare `universal`, `best`, `nano` and
`slam-1` are retired names); set ASSEMBLYAI_API_KEY to an AssemblyAI API key. Give the
endpoint a `timeout_seconds` that covers AssemblyAI's processing of the longest audio
accepted (it takes a fraction of the audio's length; the default is 120 s).

Not settled from the documentation: the model-versions page says a request naming a retired
model is routed to its replacement, while client libraries report 400s for some retired
names; the catalog therefore names a current model (`universal-2`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx

from server.providers.endpoint import Endpoint
from server.providers.failures import SERVER_ERROR, TIMEOUT, ProviderFailure
from server.providers.http import MAX_PROVIDER_MESSAGE, json_object, send
from server.providers.stt import Segment, SttCall, Transcript, Word, reading_answer, seconds

POLL_INTERVALS = (0.5, 1.0, 2.0)
POLL_INTERVAL_MAX = 3.0
# What options cannot set: the audio, the model list, an answer sent elsewhere, and the
# retired singular model parameter AssemblyAI refuses.
_RESERVED = frozenset({"audio_url", "speech_models", "speech_model", "webhook_url"})
_RESERVED |= {"webhook_auth_header_name", "webhook_auth_header_value"}
_WORD_KEYS = ("text", "start", "end")
_SEGMENT_KEYS = ("text", "start", "end", "words")

Sleep = Callable[[float], Awaitable[None]]


def transcript_request(call: SttCall, audio_url: str) -> dict[str, Any]:
    body: dict[str, Any] = {"audio_url": audio_url, "speech_models": [call.model]}
    if call.language:
        body["language_code"] = call.language
    elif "language_code" not in call.options:  # AssemblyAI refuses both at once
        body["language_detection"] = True
    for name, value in call.options.items():
        if name not in body and name not in _RESERVED:
            body[name] = value
    return body


def _ms(value: Any) -> float:
    return seconds(value) / 1000


def words_of(raw_words: list[dict[str, Any]]) -> list[Word]:
    return [
        Word(
            word=str(raw["text"]),
            start=_ms(raw["start"]),
            end=_ms(raw["end"]),
            extra={k: v for k, v in raw.items() if k not in _WORD_KEYS},
        )
        for raw in raw_words
    ]


def parse(body: dict[str, Any], sentences: list[dict[str, Any]] | None) -> Transcript:
    text = body.get("text")
    if text is None:
        text = ""  # a completed transcript of audio without speech
    if not isinstance(text, str):
        raise ValueError("no text")
    language = body.get("language_code")
    transcript = Transcript(text=text, language=language if isinstance(language, str) else None)
    if sentences is None:
        return transcript
    transcript.words = words_of(body.get("words") or [])
    transcript.segments = [
        Segment(
            id=index,
            start=_ms(raw["start"]),
            end=_ms(raw["end"]),
            text=str(raw["text"]),
            extra={k: v for k, v in raw.items() if k not in _SEGMENT_KEYS},
        )
        for index, raw in enumerate(sentences)
    ]
    return transcript


def poll_intervals() -> Iterator[float]:
    yield from POLL_INTERVALS
    while True:
        yield POLL_INTERVAL_MAX


class AssemblyAISttAdapter:
    def __init__(
        self,
        http: httpx.AsyncClient,
        sleep: Sleep = asyncio.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._http = http
        self._sleep = sleep  # injectable: tests poll without waiting
        self._monotonic = monotonic

    async def _request(
        self, endpoint: Endpoint, deadline: float, method: str, path: str, **kwargs: Any
    ) -> dict[str, Any]:
        remaining = deadline - self._monotonic()
        if remaining <= 0:
            raise ProviderFailure(TIMEOUT, "Provider timed out")
        headers = dict(kwargs.pop("headers", {}))
        credential = endpoint.credential()
        if credential:
            headers["authorization"] = credential  # the key itself: AssemblyAI has no scheme
        request = self._http.build_request(
            method, f"{endpoint.base_url}{path}", headers=headers, timeout=remaining, **kwargs
        )
        return json_object(await send(self._http, request))

    async def transcribe(self, endpoint: Endpoint, call: SttCall) -> Transcript:
        deadline = self._monotonic() + endpoint.timeout_seconds
        with reading_answer():
            uploaded = await self._request(
                endpoint,
                deadline,
                "POST",
                "/v2/upload",
                content=call.audio,
                headers={"Content-Type": "application/octet-stream"},
            )
            audio_url = uploaded["upload_url"]
            if not isinstance(audio_url, str):
                raise ValueError("no upload_url")
            submitted = await self._request(
                endpoint,
                deadline,
                "POST",
                "/v2/transcript",
                json=transcript_request(call, audio_url),
            )
            transcript_id = str(submitted["id"])
            body = await self._wait(endpoint, deadline, transcript_id)
            sentences = None
            if call.verbose:
                answer = await self._request(
                    endpoint, deadline, "GET", f"/v2/transcript/{transcript_id}/sentences"
                )
                sentences = answer["sentences"]
            return parse(body, sentences)

    async def _wait(
        self, endpoint: Endpoint, deadline: float, transcript_id: str
    ) -> dict[str, Any]:
        """The transcript once AssemblyAI has finished it (polled, sleeping in between)."""
        intervals = poll_intervals()
        while True:
            body = await self._request(endpoint, deadline, "GET", f"/v2/transcript/{transcript_id}")
            status = body.get("status")
            if status == "completed":
                return body
            if status == "error":
                message = body.get("error")
                detail = message[:MAX_PROVIDER_MESSAGE] if isinstance(message, str) else ""
                raise ProviderFailure(
                    SERVER_ERROR,
                    f"Provider failed the transcription: {detail}".rstrip(": "),
                    status=200,
                    provider_code="error",
                )
            if status not in ("queued", "processing"):
                raise ValueError(f"unknown status {status!r}")
            pause = next(intervals)
            if self._monotonic() + pause >= deadline:
                raise ProviderFailure(TIMEOUT, "Provider did not finish the transcription in time")
            await self._sleep(pause)
