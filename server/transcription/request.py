"""Transcription requests in both REST forms — JSON with base64 audio, and the OpenAI-style
multipart upload — and the typed gRPC form, validated into one TranscriptionInput."""

from __future__ import annotations

import base64
import binascii
import functools
import json
import re
from dataclasses import dataclass, field
from typing import Annotated, Any

from google.protobuf import json_format
from pydantic import AfterValidator, BeforeValidator, Field, model_validator
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

from server.errors import GatewayError, bad_request
from server.transcription.media import MAX_AUDIO_BYTES, Refusal, normalize_format, refusal_of
from server.validation import (
    BoundedId,
    Provider,
    Shape,
    StoredText,
    Trace,
    check_json_value,
    check_struct,
    header_session,
    invalid,
    model_id,
    one_of,
    parse_shape,
)

# RFC 2046 allows 70 characters; the multipart parser accepts up to 256.
MAX_BOUNDARY_BYTES = 256
RESPONSE_FORMATS = ("json", "verbose_json")
GRANULARITIES = ("word", "segment")
# The multipart form's text fields (the audio is the `file` part).
FORM_FIELDS = (
    *("model", "language", "response_format", "temperature"),
    *("session_id", "user", "prompt"),
)
LANGUAGE = re.compile(r"^[a-z]{2}$")
# The Content-Type every multipart client sends: a boundary of token characters, nothing
# else. Its boundary is what parse_options_header finds, without its generic parameter walk.
_PLAIN_MULTIPART = re.compile(r"multipart/form-data; boundary=([0-9A-Za-z'()+_,\-./:=?]{1,256})")
# Part headers (Content-Disposition) longer than this are parsed each time, not memoized.
MAX_MEMOIZED_HEADER = 512


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


def _language(value: str) -> str:
    value = value.lower()
    if not LANGUAGE.match(value):
        raise invalid("must be an ISO-639-1 code such as 'en'")
    return value


def _granularities(values: list[Any]) -> tuple[str, ...]:
    if not all(value in GRANULARITIES for value in values):
        raise invalid("must be an array of 'word' and/or 'segment'")
    return tuple(dict.fromkeys(values)) or ("segment",)


def _empty_is_unset(value: Any) -> Any:
    return None if value == "" else value


class _Common(Shape):
    """The members every form shares (JSON, multipart fields, the gRPC message)."""

    model: Annotated[str, Field(min_length=1), AfterValidator(model_id)]
    language: Annotated[StoredText, AfterValidator(_language)] | None = None
    response_format: Annotated[
        one_of(RESPONSE_FORMATS) | None,  # type: ignore[valid-type]  # one_of() builds an Annotated[str, ...] at run time
        BeforeValidator(_empty_is_unset),
    ] = None
    temperature: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)
    # Items are checked by _granularities, so a wrong one names the array (any type).
    timestamp_granularities: Annotated[list[Any], AfterValidator(_granularities)] | None = None
    provider: Provider | None = None
    trace: Trace | None = None
    session_id: BoundedId | None = None
    user: BoundedId | None = None
    prompt: StoredText | None = None


def _common(shape: _Common, body: dict[str, Any], header_session_id: str | None) -> dict[str, Any]:
    """The TranscriptionInput members of a parsed shape; the JSON values a request stores
    (provider.options, trace) are checked member by member (NUL, NaN, depth)."""
    options: dict[str, Any] = {}
    if shape.provider is not None:
        options = check_json_value(shape.provider.options, "provider.options")
    trace = body.get("trace")
    if trace is not None:
        check_json_value(trace, "trace")  # stored with the generation record
    session = shape.session_id
    if session is None and header_session_id:
        session = header_session(header_session_id)
    return {
        "model": shape.model,
        "language": shape.language,
        "response_format": shape.response_format or "json",
        "temperature": shape.temperature,
        "timestamp_granularities": shape.timestamp_granularities or ("segment",),
        "provider_options": options,
        "session_id": session,
        "user": shape.user,
        "trace": trace,
        "prompt": shape.prompt,
    }


def _input_audio_url(data: Any) -> Any:
    if isinstance(data, dict) and "url" in data and "data" not in data:
        raise invalid("is not supported: send the audio as base64 in input_audio.data", at="url")
    return data


class _InputAudio(Shape):
    data: Annotated[StoredText, Field(min_length=1)]
    format: Annotated[StoredText, Field(min_length=1)]

    _url = model_validator(mode="before")(_input_audio_url)


class _JsonBody(_Common):
    """POST /audio/transcriptions as JSON, base64 audio in input_audio."""

    input_audio: _InputAudio


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
    shape = parse_shape(_JsonBody, body)
    common = _common(shape, body, header_session_id)
    data, claimed = shape.input_audio.data, shape.input_audio.format
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

    data: list[bytes] = []  # the part's pieces: most parts arrive in one (no copy to join)

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
        data.append(chunk[start:end])

    def on_part_end() -> None:
        parts.append((dict(headers), b"".join(data)))

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


@functools.lru_cache(maxsize=256)
def _memoized_options(value: bytes) -> tuple[bytes, dict[bytes, bytes]]:
    return parse_options_header(value)


def _part_options(value: bytes) -> tuple[bytes, dict[bytes, bytes]]:
    """parse_options_header of a part's header, memoized: a client sends the same
    Content-Disposition values request after request. A pure function of the bytes; the
    dict returned is shared, so it is only read."""
    if len(value) > MAX_MEMOIZED_HEADER:
        return parse_options_header(value)
    return _memoized_options(value)


def _boundary(content_type: str) -> bytes | None:
    plain = _PLAIN_MULTIPART.fullmatch(content_type)
    if plain is not None:
        return plain.group(1).encode("ascii")
    # The header arrives as text (a proto string); its bytes are what the client sent.
    _, params = parse_options_header(content_type.encode("utf-8"))
    return params.get(b"boundary")


def from_multipart(
    raw: bytes, content_type: str, header_session_id: str | None
) -> TranscriptionInput:
    boundary = _boundary(content_type)
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
        _, disposition = _part_options(headers.get("content-disposition", b""))
        name = _text(disposition.get(b"name", b""))
        if name == "file":
            filename = _text(disposition.get(b"filename", b"audio"))
            upload = (filename or "audio", data)
        elif name:
            fields.setdefault(name, []).append(data.decode("utf-8", "replace"))
    if upload is None:
        raise bad_request("file is required", param="file")

    form: dict[str, Any] = {}
    for name in FORM_FIELDS:  # a field sent more than once: its last value
        values = fields.get(name)
        if values:
            form[name] = values[-1]
    granularities = fields.get("timestamp_granularities[]") or fields.get("timestamp_granularities")
    if granularities:
        form["timestamp_granularities"] = granularities
    # Form fields are text: numbers are read from it (lax), the rest is declared alike.
    common = _common(parse_shape(_Common, form, strict=False), form, header_session_id)
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


def from_http_in_worker(
    raw: bytes, content_type: str, header_session_id: str | None
) -> TranscriptionInput | Refusal:
    """`from_http` as a worker process runs it: a refusal is returned, not raised."""
    try:
        return from_http(raw, content_type, header_session_id)
    except GatewayError as exc:
        return refusal_of(exc)


def from_message(request: Any, header_session_id: str | None) -> TranscriptionInput:
    """The typed gRPC form (gateway.v1.TranscriptionRequest)."""
    if request.HasField("trace"):
        check_struct(request.trace, "trace")  # NaN cannot even become a dict
    if request.HasField("provider") and request.provider.HasField("options"):
        check_struct(request.provider.options, "provider.options")
    as_dict = json_format.MessageToDict(request, preserving_proto_field_name=True)
    as_dict.pop("input_audio", None)  # bytes, read below
    # Typed by the message already; lax for what MessageToDict writes as text (NaN).
    common = _common(parse_shape(_Common, as_dict, strict=False), as_dict, header_session_id)
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
