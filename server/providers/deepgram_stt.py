"""Deepgram pre-recorded speech-to-text: `POST {base_url}/v1/listen?model=…` with the raw audio
as the body.

Checked 2026-11-27 against https://developers.deepgram.com/reference/speech-to-text/listen-pre-recorded,
https://developers.deepgram.com/docs/errors, https://developers.deepgram.com/docs/language-detection,
https://developers.deepgram.com/docs/utterances, https://developers.deepgram.com/docs/smart-format
and the Python SDK https://github.com/deepgram/deepgram-python-sdk (7.6.0, 2026-07:
listen/v1/media/raw_client.py, types/listen_v1response_*.py, requests/error_response_*.py);
no mismatch found.

Request: `Authorization: Token <key>`, `Content-Type` of the audio; query parameters `model`,
`language` (or `detect_language=true` when the caller names none), `smart_format=true`
(punctuation and formatting; an option can turn it off) and, for verbose_json,
`utterances=true`. `provider.options[<slug>]` members (slug: the endpoint's `provider`) are
further query parameters as Deepgram documents them (true/false for booleans, a list repeats the
parameter, e.g. `{"keyterm": ["Acme", "Zorp"]}`, `{"language": "multi"}` when the request names
no language); they cannot replace the model, the request's language or utterances, nor ask for a
`callback` (the answer must come back on this request). Deepgram has no temperature and no
free-text prompt (keyterm prompting takes a list of terms), so neither is sent: key terms go in
the `keyterm` option.

Response: `results.channels[0].alternatives[0]` gives the transcript and its words
(`punctuated_word` when smart formatting is on, with `confidence`); segments are
`results.utterances` (`transcript`, `start`, `end`), or, without them, built from the words
(stt.segments_from_words). The language is the caller's, or `detected_language`.
`metadata.duration` is not used: the gateway bills the duration it measured itself.
Errors: `{"err_code", "err_msg", "request_id"}` (legacy) or `{"category", "message",
"details", "request_id"}` bodies, or plain text.

How an operator configures it: an endpoint with `adapter = "deepgram"`,
`base_url = "https://api.deepgram.com"` (or a self-hosted Deepgram), `api_key_env =
"DEEPGRAM_API_KEY"` and `model = "nova-3"` (any Deepgram model name; without `model` the
part of the catalog id after the slash is used); set DEEPGRAM_API_KEY to a Deepgram API key.
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
    parsed_url,
    send,
)
from server.providers.openai_stt import MIME
from server.providers.stt import (
    Segment,
    SttCall,
    Transcript,
    Word,
    reading_answer,
    seconds,
    segments_from_words,
)

# An option may not ask for an asynchronous answer (callback, callback_method): Deepgram
# would answer that URL instead of this request.
_RESERVED_PREFIX = "callback"
_WORD_KEYS = ("word", "punctuated_word", "start", "end")


def read_error(response: httpx.Response) -> ErrorFields:
    """Deepgram's error bodies: {"err_code", "err_msg"} or {"category", "message"}."""
    body = json_or_none(response) or {}
    return error_fields(
        body.get("err_code") or body.get("category"), body.get("err_msg") or body.get("message")
    )


failure_of = failure_reading(read_error)


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else json.dumps(value)


def query(call: SttCall) -> tuple[tuple[str, str], ...]:
    """The query parameters, in order; a list-valued option repeats its parameter. Options
    may change the defaults (smart_format; language detection when the request names no
    language, e.g. `{"language": "multi"}`), not what the request decided."""
    params: list[tuple[str, str]] = [("model", call.model)]
    if call.language:
        params.append(("language", call.language))
    if call.verbose:
        params.append(("utterances", "true"))
    defaults = {"smart_format": "true"}
    if not call.language:
        defaults["detect_language"] = "true"
    decided = {name for name, _ in params}
    for name, value in call.options.items():
        if name in decided or name.startswith(_RESERVED_PREFIX):
            continue
        defaults.pop(name, None)
        if name == "language":
            defaults.pop("detect_language", None)
        values = value if isinstance(value, list) else [value]
        params.extend((name, _query_value(v)) for v in values if v is not None)
    params.extend(defaults.items())
    return tuple(params)


def parse(body: dict[str, Any], call: SttCall) -> Transcript:
    channel = body["results"]["channels"][0]
    alternative = channel["alternatives"][0]
    if not isinstance(alternative["transcript"], str):
        raise ValueError("no transcript")
    transcript = Transcript(text=alternative["transcript"])
    detected = channel.get("detected_language")
    transcript.language = call.language or (detected if isinstance(detected, str) else None)
    if not call.verbose:
        return transcript
    for raw in alternative.get("words") or []:
        transcript.words.append(
            Word(
                word=str(raw.get("punctuated_word") or raw["word"]),
                start=seconds(raw["start"]),
                end=seconds(raw["end"]),
                extra={k: v for k, v in raw.items() if k not in _WORD_KEYS},
            )
        )
    utterances = body["results"].get("utterances")
    if utterances:
        for index, raw in enumerate(utterances):
            extra = {"confidence": raw["confidence"]} if "confidence" in raw else {}
            if "speaker" in raw:
                extra["speaker"] = raw["speaker"]
            transcript.segments.append(
                Segment(
                    id=index,
                    start=seconds(raw["start"]),
                    end=seconds(raw["end"]),
                    text=str(raw["transcript"]),
                    extra=extra,
                )
            )
    else:
        transcript.segments = segments_from_words(transcript.words)
    return transcript


class DeepgramSttAdapter:
    def __init__(self, http: httpx.AsyncClient) -> None:
        self._http = http

    async def transcribe(self, endpoint: Endpoint, call: SttCall) -> Transcript:
        headers = {"Content-Type": MIME.get(call.format, "audio/wav")}
        credential = endpoint.credential()
        if credential:
            headers["Authorization"] = f"Token {credential}"
        request = self._http.build_request(
            "POST",
            parsed_url(f"{endpoint.base_url}/v1/listen"),
            params=query(call),
            content=call.audio,
            headers=headers,
            timeout=endpoint.timeout_seconds,
        )
        response = await send(self._http, request, failure_of)
        with reading_answer():
            return parse(json_object(response), call)
