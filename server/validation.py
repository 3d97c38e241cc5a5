"""What every value a request may store must be: text free of NUL (PostgreSQL refuses it in
text and JSON) and encodable as UTF-8 (no lone surrogates, which JSON's `\\ud800` escape can
produce), numbers finite and within bounds. Checked before admission, so a refused request
holds and charges nothing; each failure is a 400 naming the field."""

from __future__ import annotations

import math
from typing import Any

from google.protobuf import struct_pb2

from server.errors import bad_request

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
