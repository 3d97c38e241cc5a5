"""Transcription requests in both REST forms — JSON with base64 audio, and the OpenAI-style
multipart upload — and the typed gRPC form, validated into one TranscriptionInput."""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

from server.errors import GatewayError, bad_request
from server.transcription.media import MAX_AUDIO_BYTES, normalize_format
from server.validation import check_json_value, check_struct, check_text

MAX_ID_CHARS = 256
# RFC 2046 allows 70 characters; the multipart parser accepts up to 256.
MAX_BOUNDARY_BYTES = 256
RESPONSE_FORMATS = ("json", "verbose_json")
GRANULARITIES = ("word", "segment")
MODEL_ID = re.compile(r"^[^/\s]+/[^/\s].*$")
LANGUAGE = re.compile(r"^[a-z]{2}$")
TRACE_STRING_KEYS = ("trace_id", "trace_name", "span_name", "generation_name", "parent_span_id")


@dataclass
class TranscriptionInput:
    model: str
    audio: bytes
    claimed_format: str | None  # from input_audio.format or the upload's file name
    filename: str
    audio_param: str  # where the audio came from, for error messages: input_audio | file
    language: str | None = None
    prompt: str | None = None
    response_format: str = "json"
    temperature: float | None = None
    timestamp_granularities: tuple[str, ...] = ("segment",)
    provider_options: dict[str, Any] = field(default_factory=dict)
    session_id: str | None = None
    user: str | None = None
    trace: dict[str, Any] | None = None

    @property
    def verbose(self) -> bool:
        return self.response_format == "verbose_json"


def _string(value: Any, param: str, *, required: bool = False) -> str | None:
    if value is None:
        if required:
            raise bad_request(f"{param} is required", param=param)
        return None
    if not isinstance(value, str):
        raise bad_request(f"{param} must be a string", param=param)
    check_text(value, param)  # NUL or a lone surrogate cannot be stored
    if required and not value:
        raise bad_request(f"{param} is required", param=param)
    return value


def _bounded_id(value: Any, param: str) -> str | None:
    text = _string(value, param)
    if text is not None and len(text) > MAX_ID_CHARS:
        raise bad_request(f"{param} must be at most {MAX_ID_CHARS} characters", param=param)
    return text


def _check_common(
    *,
    model: Any,
    language: Any,
    response_format: Any,
    temperature: Any,
    granularities: Any,
    provider: Any,
    session_id: Any,
    header_session_id: str | None,
    user: Any,
    trace: Any,
    prompt: Any,
) -> dict[str, Any]:
    model_id = _string(model, "model", required=True)
    assert model_id is not None
    if not MODEL_ID.match(model_id):
        raise bad_request("model must look like <provider_prefix>/<model_name>", param="model")
    lang = _string(language, "language")
    if lang is not None:
        lang = lang.lower()
        if not LANGUAGE.match(lang):
            raise bad_request("language must be an ISO-639-1 code such as 'en'", param="language")
    fmt = _string(response_format, "response_format") or "json"
    if fmt not in RESPONSE_FORMATS:
        raise bad_request(
            f"response_format must be one of {', '.join(RESPONSE_FORMATS)}",
            param="response_format",
        )
    temp = None
    if temperature is not None:
        if isinstance(temperature, bool) or not isinstance(temperature, int | float):
            raise bad_request("temperature must be a number", param="temperature")
        if not 0 <= temperature <= 1:
            raise bad_request("temperature must be between 0 and 1", param="temperature")
        temp = float(temperature)
    grains: tuple[str, ...] = ("segment",)
    if granularities is not None:
        if not isinstance(granularities, list) or not all(
            isinstance(g, str) and g in GRANULARITIES for g in granularities
        ):
            raise bad_request(
                "timestamp_granularities must be an array of 'word' and/or 'segment'",
                param="timestamp_granularities",
            )
        grains = tuple(dict.fromkeys(granularities)) or ("segment",)
    options: dict[str, Any] = {}
    if provider is not None:
        if not isinstance(provider, dict):
            raise bad_request("provider must be an object", param="provider")
        raw_options = provider.get("options", {})
        if not isinstance(raw_options, dict) or not all(
            isinstance(v, dict) for v in raw_options.values()
        ):
            raise bad_request(
                "provider.options must map provider slugs to objects", param="provider.options"
            )
        options = check_json_value(raw_options, "provider.options")
    if trace is not None:
        if not isinstance(trace, dict):
            raise bad_request("trace must be an object", param="trace")
        check_json_value(trace, "trace")  # stored with the generation record
        for key in TRACE_STRING_KEYS:
            if key in trace and not isinstance(trace[key], str):
                raise bad_request(f"trace.{key} must be a string", param=f"trace.{key}")
    session = _bounded_id(session_id, "session_id")
    if session is None and header_session_id:
        session = _bounded_id(header_session_id, "x-session-id")
    return {
        "model": model_id,
        "language": lang,
        "response_format": fmt,
        "temperature": temp,
        "timestamp_granularities": grains,
        "provider_options": options,
        "session_id": session,
        "user": _bounded_id(user, "user"),
        "trace": trace,
        "prompt": _string(prompt, "prompt"),
    }


def _check_size(audio: bytes, param: str) -> None:
    if len(audio) > MAX_AUDIO_BYTES:
        raise GatewayError(
            413, f"The audio is larger than {MAX_AUDIO_BYTES // 1_000_000} MB", {"param": param}
        )


def _unsupported_flags(body: dict[str, Any]) -> None:
    # Newer clients send these; no provider in this gateway supports them.
    for flag in ("diarize", "keyterms"):
        if body.get(flag):
            raise bad_request(f"{flag} is not supported by the selected model", param=flag)


def from_json(raw: bytes, header_session_id: str | None) -> TranscriptionInput:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request("The request body is not valid JSON") from exc
    except RecursionError as exc:  # nested deeper than the parser goes
        raise bad_request("The request body is nested too deeply") from exc
    except ValueError as exc:  # an integer of more digits than Python converts
        raise bad_request("The request body has a number too large to read") from exc
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object")
    _unsupported_flags(body)
    common = _check_common(
        model=body.get("model"),
        language=body.get("language"),
        response_format=body.get("response_format"),
        temperature=body.get("temperature"),
        granularities=body.get("timestamp_granularities"),
        provider=body.get("provider"),
        session_id=body.get("session_id"),
        header_session_id=header_session_id,
        user=body.get("user"),
        trace=body.get("trace"),
        prompt=body.get("prompt"),
    )
    audio_in = body.get("input_audio")
    if audio_in is None:
        raise bad_request("input_audio is required", param="input_audio")
    if not isinstance(audio_in, dict):
        raise bad_request("input_audio must be an object {data, format}", param="input_audio")
    if "url" in audio_in and "data" not in audio_in:
        raise bad_request(
            "input_audio.url is not supported: send the audio as base64 in input_audio.data",
            param="input_audio.url",
        )
    data = _string(audio_in.get("data"), "input_audio.data", required=True)
    claimed = _string(audio_in.get("format"), "input_audio.format", required=True)
    assert data is not None and claimed is not None
    fmt = normalize_format(claimed, "input_audio.format")
    if len(data) > (MAX_AUDIO_BYTES * 4) // 3 + 4:
        raise GatewayError(
            413,
            f"The audio is larger than {MAX_AUDIO_BYTES // 1_000_000} MB",
            {"param": "input_audio.data"},
        )
    try:
        audio = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise bad_request("input_audio.data is not valid base64", param="input_audio.data") from exc
    _check_size(audio, "input_audio.data")
    return TranscriptionInput(
        audio=audio,
        claimed_format=fmt,
        filename=f"audio.{fmt}",
        audio_param="input_audio",
        **common,
    )


def multipart_parts(raw: bytes, boundary: bytes) -> list[tuple[dict[str, bytes], bytes]]:
    """The parts of a multipart body, each with its headers as raw bytes: header values are
    UTF-8 in practice (RFC 7578 §5.1: browsers and the `openai` SDK send file names such as
    `дверь.wav` unescaped), so they are never forced through Latin-1 text."""
    parts: list[tuple[dict[str, bytes], bytes]] = []
    headers: dict[str, bytes] = {}
    name_buf = bytearray()
    value_buf = bytearray()
    data = bytearray()

    def on_part_begin() -> None:
        headers.clear()
        data.clear()

    def on_header_field(chunk: bytes, start: int, end: int) -> None:
        name_buf.extend(chunk[start:end])

    def on_header_value(chunk: bytes, start: int, end: int) -> None:
        value_buf.extend(chunk[start:end])

    def on_header_end() -> None:
        headers[name_buf.decode("latin-1").lower()] = bytes(value_buf)
        name_buf.clear()
        value_buf.clear()

    def on_part_data(chunk: bytes, start: int, end: int) -> None:
        data.extend(chunk[start:end])

    def on_part_end() -> None:
        parts.append((dict(headers), bytes(data)))

    try:
        parser = MultipartParser(
            boundary,
            {
                "on_part_begin": on_part_begin,
                "on_header_field": on_header_field,
                "on_header_value": on_header_value,
                "on_header_end": on_header_end,
                "on_part_data": on_part_data,
                "on_part_end": on_part_end,
            },
        )
        parser.write(raw)
        parser.finalize()
    except FormParserError as exc:
        raise bad_request("The multipart body is malformed") from exc
    return parts


def _text(value: bytes) -> str:
    """A header parameter or field as text: UTF-8, else Latin-1 (every byte is a character)."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value.decode("latin-1")


def from_multipart(
    raw: bytes, content_type: str, header_session_id: str | None
) -> TranscriptionInput:
    # The header arrives as text (a proto string); its bytes are what the client sent.
    _, params = parse_options_header(content_type.encode("utf-8"))
    boundary = params.get(b"boundary")
    if not boundary:
        raise bad_request("multipart/form-data needs a boundary", param="content-type")
    if len(boundary) > MAX_BOUNDARY_BYTES:
        raise bad_request(
            f"The multipart boundary must be at most {MAX_BOUNDARY_BYTES} characters",
            param="content-type",
        )
    fields: dict[str, list[str]] = {}
    upload: tuple[str, bytes] | None = None
    for headers, data in multipart_parts(raw, boundary):
        _, disposition = parse_options_header(headers.get("content-disposition", b""))
        name = _text(disposition.get(b"name", b""))
        if name == "file":
            filename = _text(disposition.get(b"filename", b"audio"))
            upload = (filename or "audio", data)
        elif name:
            fields.setdefault(name, []).append(data.decode("utf-8", "replace"))
    if upload is None:
        raise bad_request("file is required", param="file")

    def one(name: str) -> str | None:
        values = fields.get(name)
        return values[-1] if values else None

    temperature: Any = one("temperature")
    if temperature is not None:
        try:
            temperature = float(temperature)
        except ValueError as exc:
            raise bad_request("temperature must be a number", param="temperature") from exc
    granularities = fields.get("timestamp_granularities[]") or fields.get("timestamp_granularities")
    common = _check_common(
        model=one("model"),
        language=one("language"),
        response_format=one("response_format"),
        temperature=temperature,
        granularities=granularities,
        provider=None,
        session_id=one("session_id"),
        header_session_id=header_session_id,
        user=one("user"),
        trace=None,
        prompt=one("prompt"),
    )
    filename, audio = upload
    _check_size(audio, "file")
    extension = filename.rsplit(".", 1)[1] if "." in filename else None
    claimed = None
    if extension:
        try:
            claimed = normalize_format(extension, "file")
        except GatewayError:
            claimed = None  # the bytes decide; an unsupported container is refused by the probe
    return TranscriptionInput(
        audio=audio, claimed_format=claimed, filename=filename, audio_param="file", **common
    )


def from_http(raw: bytes, content_type: str, header_session_id: str | None) -> TranscriptionInput:
    media_type = content_type.split(";", 1)[0].strip().lower()
    if media_type == "multipart/form-data":
        return from_multipart(raw, content_type, header_session_id)
    if media_type in ("application/json", "") or media_type.endswith("+json"):
        return from_json(raw, header_session_id)
    raise GatewayError(
        400,
        "Content-Type must be application/json or multipart/form-data",
        {"param": "content-type"},
    )


def from_message(request: Any, header_session_id: str | None) -> TranscriptionInput:
    """The typed gRPC form (gateway.v1.TranscriptionRequest)."""
    if request.HasField("trace"):
        check_struct(request.trace, "trace")  # NaN cannot even become a dict
    if request.HasField("provider") and request.provider.HasField("options"):
        check_struct(request.provider.options, "provider.options")
    as_dict = json_format.MessageToDict(request, preserving_proto_field_name=True)
    common = _check_common(
        model=request.model or None,
        language=request.language if request.HasField("language") else None,
        response_format=request.response_format if request.HasField("response_format") else None,
        temperature=request.temperature if request.HasField("temperature") else None,
        granularities=list(request.timestamp_granularities) or None,
        provider=as_dict.get("provider"),
        session_id=request.session_id if request.HasField("session_id") else None,
        header_session_id=header_session_id,
        user=request.user if request.HasField("user") else None,
        trace=as_dict.get("trace"),
        prompt=request.prompt if request.HasField("prompt") else None,
    )
    if not request.HasField("input_audio") or not request.input_audio.data:
        raise bad_request("input_audio is required", param="input_audio")
    fmt = normalize_format(request.input_audio.format or "", "input_audio.format")
    audio = bytes(request.input_audio.data)
    _check_size(audio, "input_audio.data")
    return TranscriptionInput(
        audio=audio,
        claimed_format=fmt,
        filename=f"audio.{fmt}",
        audio_param="input_audio",
        **common,
    )
