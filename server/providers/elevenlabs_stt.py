"""ElevenLabs speech-to-text (Scribe): multipart `POST {base_url}/v1/speech-to-text`.

Checked 2026-11-27 against https://elevenlabs.io/docs/api-reference/speech-to-text/convert,
https://elevenlabs.io/docs/eleven-api/resources/errors,
https://elevenlabs.io/docs/capabilities/speech-to-text,
https://elevenlabs.io/docs/changelog/2026/6/8 (`scribe_v1` removed on 2026-07-09) and the
Python SDK https://github.com/elevenlabs/elevenlabs-python (speech_to_text/raw_client.py,
2026-07).

Request: header `xi-api-key: <key>`; form fields `file`, `model_id`, `language_code` (when the
caller names one; otherwise ElevenLabs detects it), `temperature`, and `timestamps_granularity`
= `word` for verbose_json, `none` otherwise. `provider.options[<slug>]` members (slug: the
endpoint's `provider`) are further form fields as ElevenLabs documents them (`diarize`,
`num_speakers`, `tag_audio_events`, `keyterms`, …: booleans as true/false, other values as
text, lists and objects as JSON as the SDK sends them); they cannot replace what the gateway
sends, name other audio than the request's (`source_url`, `cloud_storage_url`: the gateway
bills the audio it measured), nor ask for an answer elsewhere (`webhook`, `webhook_id`,
`webhook_metadata`). Scribe takes no free-text prompt, so a `prompt` is not sent.

Response: `{language_code, text, words: [{text, start, end, type, speaker_id?, logprob?}]}`
with times in seconds; `type` is `word`, `spacing` or `audio_event`. Words are the entries of
type `word`; ElevenLabs returns no segments, so they are built from those words: a segment
ends after a word ending a sentence (. ? !) or before a pause of a second or more
(stt.segments_from_words). `audio_duration_secs` is not used: the gateway bills the duration it
measured. Errors: `{"detail": {"type", "code", "message", "request_id", "param"}}` (`code`
names the error; `status` is a legacy field, read only when `code` is missing; a 429's code is
`rate_limit_exceeded` or `concurrent_limit_exceeded`), or for a 422
`{"detail": [{"loc", "msg", "type"}]}`.

How an operator configures it: an endpoint with `adapter = "elevenlabs"`,
`base_url = "https://api.elevenlabs.io"`, `api_key_env = "ELEVENLABS_API_KEY"` and
`model = "scribe_v2"` (`scribe_v1` is removed); set ELEVENLABS_API_KEY to an ElevenLabs API
key.

Not settled from the documentation: what ElevenLabs answers to a removed `model_id` (the
fake answers the documented validation error shape), and `use_multi_channel` (an option the
adapter forwards) answers a multichannel shape this adapter does not read.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from server.providers.endpoint import Endpoint
from server.providers.http import (
    ErrorFields,
    error_fields,
    failure_reading,
    json_object,
    json_or_none,
    multipart_form,
    parsed_url,
    send,
)
from server.providers.openai_stt import MIME
from server.providers.stt import (
    SttCall,
    Transcript,
    Word,
    reading_answer,
    seconds,
    segments_from_words,
)

_WORD_KEYS = ("text", "start", "end", "type")
# What options cannot set: other audio than the request's, and an answer sent elsewhere.
_RESERVED = frozenset({"file", "source_url", "cloud_storage_url"})
_RESERVED |= {"webhook", "webhook_id", "webhook_metadata"}


def read_error(response: httpx.Response) -> ErrorFields:
    """ElevenLabs' error bodies: {"detail": {"code" (or the legacy "status"), "message"}}, a
    validation list, or a plain {"detail": "..."}."""
    detail = (json_or_none(response) or {}).get("detail")
    if isinstance(detail, dict):
        return error_fields(detail.get("code") or detail.get("status"), detail.get("message"))
    if isinstance(detail, list) and detail and isinstance(detail[0], dict):
        return error_fields(detail[0].get("type"), detail[0].get("msg"))
    return error_fields(None, detail)


failure_of = failure_reading(read_error)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else json.dumps(value)


def form(call: SttCall) -> dict[str, str]:
    fields = {
        "model_id": call.model,
        "timestamps_granularity": "word" if call.verbose else "none",
    }
    if call.language:
        fields["language_code"] = call.language
    if call.temperature is not None:
        fields["temperature"] = repr(call.temperature)
    for name, value in call.options.items():
        if name not in fields and name not in _RESERVED:
            fields[name] = _text(value)
    return fields


def parse(body: dict[str, Any], call: SttCall) -> Transcript:
    if not isinstance(body.get("text"), str):
        raise ValueError("no text")
    transcript = Transcript(text=body["text"])
    language = body.get("language_code")
    transcript.language = language if isinstance(language, str) else call.language
    if not call.verbose:
        return transcript
    for raw in body.get("words") or []:
        if raw.get("type", "word") != "word":
            continue
        transcript.words.append(
            Word(
                word=str(raw["text"]),
                start=seconds(raw["start"]),
                end=seconds(raw["end"]),
                extra={k: v for k, v in raw.items() if k not in _WORD_KEYS},
            )
        )
    transcript.segments = segments_from_words(transcript.words)
    return transcript


class ElevenLabsSttAdapter:
    def __init__(self, http: httpx.AsyncClient) -> None:
        self._http = http

    async def transcribe(self, endpoint: Endpoint, call: SttCall) -> Transcript:
        credential = endpoint.credential()
        content_type, body = multipart_form(
            form(call).items(),
            "file",
            call.filename,
            call.audio,
            MIME.get(call.format, "audio/wav"),
        )
        headers = {"Content-Type": content_type}
        if credential:
            headers["xi-api-key"] = credential
        request = self._http.build_request(
            "POST",
            parsed_url(f"{endpoint.base_url}/v1/speech-to-text"),
            content=body,
            headers=headers,
            timeout=endpoint.timeout_seconds,
        )
        response = await send(self._http, request, failure_of)
        with reading_answer():
            return parse(json_object(response), call)
