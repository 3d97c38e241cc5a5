"""The one error type. Every handler failure is a GatewayError; the service layer turns it into
gRPC status + rich details for gRPC callers and the documented JSON body for REST callers."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc

# Closest canonical gRPC code for each HTTP status the API reference documents.
GRPC_CODE_FOR_STATUS: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    402: grpc.StatusCode.FAILED_PRECONDITION,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    410: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    500: grpc.StatusCode.INTERNAL,
    501: grpc.StatusCode.UNIMPLEMENTED,
    502: grpc.StatusCode.UNAVAILABLE,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
    524: grpc.StatusCode.DEADLINE_EXCEEDED,
    529: grpc.StatusCode.UNAVAILABLE,
}

# Error bodies travel to Envoy in trailers (x-error-body, grpc-message and the rich details,
# each carrying the message): they must stay far below header-size limits whatever a client
# sent, so a message echoing a 30,000-character model id is cut, and so are metadata values.
MAX_MESSAGE_CHARS = 500
MAX_METADATA_VALUE_CHARS = 200
MAX_METADATA_ITEMS = 20
MAX_METADATA_JSON_CHARS = 2000  # all of it, as the ASCII JSON the trailer carries
ELLIPSIS = "..."


def bounded_text(text: str, limit: int) -> str:
    """`text`, cut to at most `limit` characters (an ellipsis marks the cut)."""
    if len(text) <= limit:
        return text
    return text[: limit - len(ELLIPSIS)] + ELLIPSIS


def _bounded_value(value: Any) -> Any:
    if isinstance(value, str):
        return bounded_text(value, MAX_METADATA_VALUE_CHARS)
    if isinstance(value, Mapping):
        items = list(value.items())[:MAX_METADATA_ITEMS]
        return {bounded_text(str(k), MAX_METADATA_VALUE_CHARS): _bounded_value(v) for k, v in items}
    if isinstance(value, list | tuple):
        return [_bounded_value(v) for v in list(value)[:MAX_METADATA_ITEMS]]
    return value


def _json_chars(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=True, default=str))


def _bounded_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Each value bounded, and the whole: past MAX_METADATA_JSON_CHARS only scalar members
    stay, the first ones first."""
    bounded: dict[str, Any] = _bounded_value(metadata)
    if _json_chars(bounded) <= MAX_METADATA_JSON_CHARS:
        return bounded
    kept: dict[str, Any] = {}
    for name, value in bounded.items():
        if isinstance(value, str | int | float | bool) or value is None:
            if _json_chars({**kept, name: value}) <= MAX_METADATA_JSON_CHARS:
                kept[name] = value
    return kept


@dataclass
class GatewayError(Exception):
    """A failure with its HTTP status, client-facing message, optional metadata and headers.

    `message` and `metadata` are shown to the client as they are: never put secrets,
    exception text or other internals in them.
    """

    status: int
    message: str
    metadata: Mapping[str, Any] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    retry_after_seconds: int | None = None

    def __post_init__(self) -> None:
        if self.status not in GRPC_CODE_FOR_STATUS:
            raise ValueError(f"undocumented error status {self.status}")
        # The one place every error passes: what it echoes of a request is bounded here.
        self.message = bounded_text(self.message, MAX_MESSAGE_CHARS)
        if self.metadata is not None:
            self.metadata = _bounded_metadata(self.metadata)
        super().__init__(self.message)

    @property
    def grpc_code(self) -> grpc.StatusCode:
        return GRPC_CODE_FOR_STATUS[self.status]

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.status, "message": self.message}
        if self.metadata is not None:
            error["metadata"] = dict(self.metadata)
        return {"error": error}

    def body_json(self) -> str:
        # ensure_ascii keeps the body valid as an HTTP header value.
        return json.dumps(self.body(), separators=(",", ":"), ensure_ascii=True)

    def response_headers(self) -> dict[str, str]:
        headers = {k.lower(): v for k, v in self.headers.items()}
        if self.retry_after_seconds is not None:
            headers["retry-after"] = str(self.retry_after_seconds)
        return headers


def bad_request(message: str, param: str | None = None, **extra: Any) -> GatewayError:
    metadata: dict[str, Any] | None = None
    if param is not None or extra:
        metadata = {**({"param": param} if param is not None else {}), **extra}
    return GatewayError(400, message, metadata)


def unauthorized(message: str = "Missing or invalid API key") -> GatewayError:
    return GatewayError(401, message)


def forbidden(message: str) -> GatewayError:
    return GatewayError(403, message)


def not_found(message: str) -> GatewayError:
    return GatewayError(404, message)


INTERNAL_ERROR = GatewayError(500, "Internal server error")
SERVICE_UNAVAILABLE = GatewayError(503, "Service temporarily unavailable")
