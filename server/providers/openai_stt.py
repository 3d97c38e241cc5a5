"""OpenAI-compatible `POST {base_url}/audio/transcriptions` (OpenAI, Groq, Together,
Fireworks, DeepInfra, self-hosted Whisper servers).

Checked 2026-11-27 against https://platform.openai.com/docs/api-reference/audio/createTranscription,
https://platform.openai.com/docs/api-reference/authentication and openai-python
https://github.com/openai/openai-python (types/audio/transcription_create_params.py,
transcription.py, _base_client.py `_serialize_multipartform`; 2026-08).

Request: `Authorization: Bearer <key>`; multipart `file`, `model`, `response_format`
(`verbose_json` for verbose, else `json`), `language`, `prompt`, `temperature`,
`timestamp_granularities[]` (verbose only), and the members of `provider.options[<slug>]`
(slug: the endpoint's `provider`) as further fields, encoded as openai-python encodes them: an
array as `name[]` once per value, an object's members as `name[key]`, booleans as true/false.
Options cannot replace what the gateway sends, nor set `stream` (a streamed answer is
server-sent events, not the one JSON body read here).

Response: `{text, usage?}`, verbose_json adds `language`, `duration`, `segments`, `words`.
`usage` is `{type: "tokens", input_tokens, output_tokens, …}` (kept for token-priced models) or
`{type: "duration", seconds}` (not used: the gateway bills the duration it measured). Errors:
OpenAI's `{"error": {"message", "type", "code"}}` (http.openai_error).

Not settled from the documentation: whether every OpenAI-compatible server (Groq, Together,
self-hosted) reads the bracketed array form; OpenAI's own SDK sends it.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from server.providers.endpoint import Endpoint
from server.providers.http import authorized, multipart_form, parsed_url, send
from server.providers.stt import Segment, SttCall, Transcript, Word, reading_answer, seconds

MIME = {
    "wav": "audio/wav",
    "mp3": "audio/mpeg",
    "flac": "audio/flac",
    "m4a": "audio/mp4",
    "aac": "audio/aac",
    "ogg": "audio/ogg",
    "opus": "audio/ogg",
    "webm": "audio/webm",
}
_SEGMENT_KEYS = ("id", "start", "end", "text")
# Options cannot ask for a streamed (server-sent events) answer: the answer is read as JSON.
_RESERVED = frozenset({"file", "stream"})
_WORD_KEYS = ("word", "start", "end")


def form_fields(call: SttCall) -> list[tuple[str, str]]:
    """The multipart fields (also Azure OpenAI's), in order; a repeated field
    (timestamp_granularities[]) once per value."""
    fields: list[tuple[str, str]] = [
        ("model", call.model),
        ("response_format", "verbose_json" if call.verbose else "json"),
    ]
    if call.language:
        fields.append(("language", call.language))
    if call.prompt:
        fields.append(("prompt", call.prompt))
    if call.temperature is not None:
        fields.append(("temperature", repr(call.temperature)))
    if call.verbose:
        fields.extend(("timestamp_granularities[]", g) for g in call.timestamp_granularities)
    reserved = {name for name, _ in fields} | _RESERVED
    for name, value in call.options.items():
        if name in reserved or f"{name}[]" in reserved:
            continue  # options cannot override what the gateway sends
        fields.extend(option_fields(name, value))
    return fields


def option_fields(name: str, value: Any) -> list[tuple[str, str]]:
    """One option as openai-python's multipart encoding sends it: a list as `name[]` once per
    value, an object's members as `name[key]`, true/false, None left out."""
    if isinstance(value, dict):
        return [
            pair for key, item in value.items() for pair in option_fields(f"{name}[{key}]", item)
        ]
    if isinstance(value, list | tuple):
        return [pair for item in value for pair in option_fields(f"{name}[]", item)]
    if value is None:
        return []
    if isinstance(value, bool):
        return [(name, "true" if value else "false")]
    return [(name, value if isinstance(value, str) else json.dumps(value))]


def parse(body: Any, verbose: bool) -> Transcript:
    if not isinstance(body, dict) or not isinstance(body.get("text"), str):
        raise ValueError("no text")
    transcript = Transcript(text=body["text"])
    usage = body.get("usage")
    if isinstance(usage, dict):
        transcript.input_tokens = int(usage.get("input_tokens") or 0)
        transcript.output_tokens = int(usage.get("output_tokens") or 0)
    if not verbose:
        return transcript
    if isinstance(body.get("language"), str):
        transcript.language = body["language"]
    if body.get("duration") is not None:
        transcript.duration = seconds(body["duration"])
    for index, raw in enumerate(body.get("segments") or []):
        transcript.segments.append(
            Segment(
                id=int(raw.get("id", index)),
                start=seconds(raw["start"]),
                end=seconds(raw["end"]),
                text=str(raw["text"]),
                extra={k: v for k, v in raw.items() if k not in _SEGMENT_KEYS},
            )
        )
    for raw in body.get("words") or []:
        transcript.words.append(
            Word(
                word=str(raw["word"]),
                start=seconds(raw["start"]),
                end=seconds(raw["end"]),
                extra={k: v for k, v in raw.items() if k not in _WORD_KEYS},
            )
        )
    return transcript


async def transcribe_form(
    http: httpx.AsyncClient,
    endpoint: Endpoint,
    call: SttCall,
    url: str,
    headers: dict[str, str],
    params: dict[str, str] | None = None,
) -> Transcript:
    """POST OpenAI's multipart form (`form_fields`) to `url` and read OpenAI's answer (`parse`):
    OpenAI-compatible servers and Azure OpenAI differ only in the URL and credential header."""
    content_type, body = multipart_form(
        form_fields(call), "file", call.filename, call.audio, MIME.get(call.format, "audio/wav")
    )
    request = http.build_request(
        "POST",
        parsed_url(url),
        params=params,
        content=body,
        headers={**headers, "Content-Type": content_type},
        timeout=endpoint.timeout_seconds,
    )
    response = await send(http, request)
    with reading_answer():
        return parse(response.json(), call.verbose)


class OpenAISttAdapter:
    def __init__(self, http: httpx.AsyncClient) -> None:
        self._http = http

    async def transcribe(self, endpoint: Endpoint, call: SttCall) -> Transcript:
        return await transcribe_form(
            self._http,
            endpoint,
            call,
            f"{endpoint.base_url}/audio/transcriptions",
            authorized(endpoint),
        )
