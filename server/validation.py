"""What every value a request may store must be: text free of NUL (PostgreSQL refuses it in
text and JSON) and encodable as UTF-8 (no lone surrogates, which JSON's `\\ud800` escape can
produce), numbers finite and within bounds. Checked before admission, so a refused request
holds and charges nothing; each failure is a 400 naming the field."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Annotated, Any, TypeVar

from google.protobuf import struct_pb2
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import ErrorDetails, PydanticCustomError

from server.errors import GatewayError, bad_request

# JSON values (trace) are at most this deep; integers fit a signed 64-bit integer (what
# PostgreSQL's JSON, OTLP attributes and most JSON readers take exactly).
MAX_JSON_DEPTH = 32
MAX_JSON_INT = 2**63 - 1


def param_of(loc: tuple[str | int, ...]) -> str:
    """A pydantic error location as the API names the field: ("frame_images", 1, "image_url")
    is `frame_images[1].image_url`."""
    param = ""
    for part in loc:
        if isinstance(part, int):
            param += f"[{part}]"
        else:
            param += f".{part}" if param else str(part)
    return param


class Shape(BaseModel):
    """A request's declared shape: the fields, their types and bounds. Parsed with
    `parse_shape`, whose failures are the documented 400 naming `metadata.param`."""

    model_config = ConfigDict(frozen=True, extra="ignore", strict=True)


ShapeT = TypeVar("ShapeT", bound=Shape)


def invalid(message: str, at: str = "", **extra: Any) -> PydanticCustomError:
    """A failure raised in a validator: `message` follows the field's name ("must be ...");
    `at` names a member below the field validated (`audio_url.url`); `extra` goes to the
    error's metadata (`allowed`)."""
    return PydanticCustomError("invalid", message, {"at": at, "extra": extra})


# What a requested model id must look like (whether the catalog has it is the catalog's say).
MODEL_ID = re.compile(r"^[^/\s]+/[^/\s].*$")


def model_id(value: str) -> str:
    """The `model` member of a transcription or video request."""
    if not MODEL_ID.match(value):
        raise invalid("must look like <provider_prefix>/<model_name>")
    return value


def _one_of(allowed: tuple[str, ...]) -> Any:
    def check(value: str) -> str:
        if value not in allowed:
            raise invalid(f"must be one of {', '.join(allowed)}", allowed=list(allowed))
        return value

    return AfterValidator(check)


def one_of(allowed: Iterable[str]) -> Any:
    """A string that must be one of `allowed` (the 400 lists them in metadata.allowed)."""
    return Annotated[str, _one_of(tuple(allowed))]


def _storable(value: str) -> str:
    problem = text_problem(value)
    if problem is not None:
        raise invalid(problem)
    return value


# Text a request may store: no NUL, no lone surrogate.
StoredText = Annotated[str, AfterValidator(_storable)]

MAX_ID_CHARS = 256
# A session id or user: stored text of at most MAX_ID_CHARS characters.
BoundedId = Annotated[StoredText, Field(max_length=MAX_ID_CHARS)]
TRACE_STRING_KEYS = ("trace_id", "trace_name", "span_name", "generation_name", "parent_span_id")


class Trace(Shape):
    """`trace`: any JSON object; the keys an exporter reads must be strings."""

    model_config = ConfigDict(extra="allow")

    trace_id: str = ""
    trace_name: str = ""
    span_name: str = ""
    generation_name: str = ""
    parent_span_id: str = ""


def _by_provider(options: dict[str, Any]) -> dict[str, Any]:
    if not all(isinstance(value, dict) for value in options.values()):
        raise invalid("must map provider slugs to objects")
    return options


class Provider(Shape):
    """`provider`: options for each provider slug, passed on to that provider."""

    options: Annotated[dict[str, Any], AfterValidator(_by_provider)] = {}


class SessionHeader(Shape):
    session: BoundedId = Field(alias="x-session-id")


def header_session(value: str | None) -> str | None:
    """The x-session-id header, held to the session_id rules (400 naming the header)."""
    if value is None:
        return None
    return parse_shape(SessionHeader, {"x-session-id": value}).session


_SENTENCES = {
    "missing": "is required",
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be an integer",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "finite_number": "must be a finite number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "dict_type": "must be an object",
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
    "list_type": "must be an array",
    "tuple_type": "must be an array",
    "greater_than": "must be greater than {gt}",
    "greater_than_equal": "must be at least {ge}",
    "less_than": "must be less than {lt}",
    "less_than_equal": "must be at most {le}",
    "string_too_short": "is required",
    "string_too_long": "must be at most {max_length} characters",
    "too_long": "must have at most {max_length} items",
    "too_short": "must have at least {min_length} items",
}


def _number(value: Any) -> Any:
    """A bound as written in a message: 0, not 0.0."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def request_error(error: ErrorDetails) -> GatewayError:
    """THE adapter: one pydantic error as the documented 400, `metadata.param` naming the
    field (`input_audio.format`, `frame_images[1].image_url.url`)."""
    ctx: dict[str, Any] = dict(error.get("ctx") or {})
    loc = tuple(error["loc"])
    extra: dict[str, Any] = {}
    if error["type"] == "invalid":
        loc += tuple(part for part in str(ctx.get("at", "")).split(".") if part)
        extra = ctx.get("extra") or {}
        sentence = str(error["msg"])
    elif error["type"] in _SENTENCES:
        kind = error["type"]
        if kind in ("too_long", "too_short") and isinstance(error.get("input"), str):
            kind = f"string_{kind}"  # a length declared after a validator
        numbers = {k: _number(v) for k, v in ctx.items()}
        sentence = _SENTENCES[kind].format(**numbers)
    else:
        sentence = "is invalid: " + str(error["msg"]).removeprefix("Value error, ")
    param = param_of(loc)
    if not param:
        return bad_request(f"The request {sentence}", **extra)
    return bad_request(f"{param} {sentence}", param=param, **extra)


def parse_shape(shape: type[ShapeT], data: Any, *, strict: bool | None = None) -> ShapeT:
    """`data` as `shape`, or the 400 for its first failure (fields in declared order)."""
    try:
        return shape.model_validate(data, strict=strict)
    except ValidationError as exc:
        raise request_error(exc.errors()[0]) from None


def text_problem(value: str) -> str | None:
    """Why `value` cannot be stored as text, or None."""
    if "\x00" in value:
        return "must not contain NUL characters"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "must be valid Unicode text (no lone surrogates)"
    return None


def check_text(value: str, param: str) -> str:
    problem = text_problem(value)
    if problem is not None:
        raise bad_request(f"{param} {problem}", param=param)
    return value


def check_json_value(value: Any, param: str, depth: int = 0) -> Any:
    """A decoded JSON value (dict, list, str, number, bool, None) whose every string and key
    is storable text and every number finite; nested paths name the field
    (`trace.metadata.k`, `trace.tags[2]`)."""
    if depth > MAX_JSON_DEPTH:
        raise bad_request(f"{param} is nested too deeply", param=param)
    if isinstance(value, str):
        return check_text(value, param)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        if not -MAX_JSON_INT - 1 <= value <= MAX_JSON_INT:
            raise bad_request(f"{param} is out of range", param=param)
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise bad_request(f"{param} must be a finite number", param=param)
        return value
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise bad_request(f"{param} keys must be strings", param=param)
            problem = text_problem(key)
            if problem is not None:
                raise bad_request(f"{param}: a key {problem}", param=param)
            check_json_value(item, f"{param}.{key[:64]}", depth + 1)
        return value
    if isinstance(value, list):
        for index, item in enumerate(value):
            check_json_value(item, f"{param}[{index}]", depth + 1)
        return value
    raise bad_request(f"{param} must be JSON", param=param)


def check_struct_value(value: struct_pb2.Value, param: str, depth: int = 0) -> None:
    """The same rules for a protobuf Struct/Value a gRPC caller sent (which, unlike JSON
    text, can carry NaN and infinities), checked before it is converted to a dict."""
    if depth > MAX_JSON_DEPTH:
        raise bad_request(f"{param} is nested too deeply", param=param)
    kind = value.WhichOneof("kind")
    if kind == "number_value" and not math.isfinite(value.number_value):
        raise bad_request(f"{param} must be a finite number", param=param)
    if kind == "string_value":
        check_text(value.string_value, param)
    elif kind == "struct_value":
        check_struct(value.struct_value, param, depth + 1)
    elif kind == "list_value":
        for index, item in enumerate(value.list_value.values):
            check_struct_value(item, f"{param}[{index}]", depth + 1)


def check_struct(struct: struct_pb2.Struct, param: str, depth: int = 0) -> None:
    for key, item in struct.fields.items():
        problem = text_problem(key)
        if problem is not None:
            raise bad_request(f"{param}: a key {problem}", param=param)
        check_struct_value(item, f"{param}.{key[:64]}", depth)
