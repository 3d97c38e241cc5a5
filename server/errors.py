"""The one error type and the one error table. Every handler failure is a GatewayError; the
service layer turns it into gRPC status + rich details for gRPC callers and the documented
JSON body for REST callers. ERROR_STATUSES says, per documented status, what every layer
answers with it; the facade renders its Lua tables and Envoy's local replies from it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc


@dataclass(frozen=True)
class EnvoyReply:
    """One of Envoy's own replies (a local reply: unknown path, body over the limit, flood
    protection, server unreachable...) that the facade answers with a documented status."""

    code: int  # the status Envoy answers with
    message: str | None = None  # None: the documented status's default message
    # True: the Lua filter's own replies with this code keep their (specific) text, and only
    # the replies Envoy makes itself get `message`.
    keeps_lua_text: bool = False
    metadata: Mapping[str, str] | None = None
    retry_after_seconds: int | None = None  # sent as Retry-After with the reply


# How soon a 503 for a server out of rotation (database unreachable, draining, down) is worth
# retrying: Envoy's health check looks at every server again within this many seconds.
UNAVAILABLE_RETRY_SECONDS = 2


@dataclass(frozen=True)
class ErrorStatus:
    """A documented HTTP error status and everything that answers with it."""

    status: int
    grpc_code: grpc.StatusCode  # the closest canonical code, for gRPC callers
    reason: str  # google.rpc.ErrorInfo.reason
    message: str  # the default message
    # gRPC failures that did not come from a handler (the gRPC stack's own: no x-http-status),
    # which the facade answers with this status, and the message it gives them.
    grpc_failures: tuple[grpc.StatusCode, ...] = ()
    grpc_failure_message: str | None = None  # None: `message`
    envoy_replies: tuple[EnvoyReply, ...] = ()

    @property
    def failure_message(self) -> str:
        return self.grpc_failure_message or self.message


_CODE = grpc.StatusCode

# THE error table: every HTTP status the API reference documents. The server (gRPC code,
# ErrorInfo reason), the Lua filter (gRPC failures without a gateway error) and Envoy's
# local_reply_config (its own replies) are all rendered from it (facade/envoy_config.py).
ERROR_STATUSES: tuple[ErrorStatus, ...] = (
    ErrorStatus(
        400,
        _CODE.INVALID_ARGUMENT,
        "INVALID_REQUEST",
        "Invalid request",
        grpc_failures=(_CODE.INVALID_ARGUMENT, _CODE.FAILED_PRECONDITION, _CODE.OUT_OF_RANGE),
        envoy_replies=(
            # Requests Envoy cannot parse (no Host, a fragment in the target, a bad header...)
            # come with an empty or internal text.
            EnvoyReply(400, "Bad Request", keeps_lua_text=True),
            EnvoyReply(426, "Unsupported HTTP version"),
            EnvoyReply(
                501, "Unsupported HTTP feature (such as a Transfer-Encoding other than chunked)"
            ),
        ),
    ),
    ErrorStatus(
        401,
        _CODE.UNAUTHENTICATED,
        "UNAUTHENTICATED",
        "Missing or invalid API key",
        grpc_failures=(_CODE.UNAUTHENTICATED,),
    ),
    ErrorStatus(402, _CODE.FAILED_PRECONDITION, "INSUFFICIENT_CREDITS", "Insufficient credits"),
    ErrorStatus(
        403,
        _CODE.PERMISSION_DENIED,
        "FORBIDDEN",
        "Forbidden",
        grpc_failures=(_CODE.PERMISSION_DENIED,),
    ),
    ErrorStatus(
        404,
        _CODE.NOT_FOUND,
        "NOT_FOUND",
        "Not Found",
        grpc_failures=(_CODE.NOT_FOUND, _CODE.UNIMPLEMENTED),  # an unknown method too
        envoy_replies=(EnvoyReply(404),),
    ),
    ErrorStatus(
        408,
        _CODE.DEADLINE_EXCEEDED,
        "REQUEST_TIMEOUT",
        "Request timed out before completing",
        grpc_failures=(_CODE.CANCELLED,),
        grpc_failure_message="Request cancelled before completing",
        envoy_replies=(EnvoyReply(408),),
    ),
    ErrorStatus(
        409,
        _CODE.FAILED_PRECONDITION,
        "CONFLICT",
        "Conflict",
        grpc_failures=(_CODE.ALREADY_EXISTS, _CODE.ABORTED),
    ),
    ErrorStatus(410, _CODE.NOT_FOUND, "GONE", "The resource is no longer available"),
    ErrorStatus(
        413,
        _CODE.RESOURCE_EXHAUSTED,
        "PAYLOAD_TOO_LARGE",
        "Request payload too large",
        grpc_failures=(_CODE.RESOURCE_EXHAUSTED,),
        envoy_replies=(EnvoyReply(413), EnvoyReply(431, "Request headers too large")),
    ),
    # GET /videos/{id}/content with a Range outside the video (RFC 9110 §15.5.17): sent with
    # `Content-Range: bytes */size`.
    ErrorStatus(416, _CODE.OUT_OF_RANGE, "RANGE_NOT_SATISFIABLE", "Range not satisfiable"),
    ErrorStatus(
        429,
        _CODE.RESOURCE_EXHAUSTED,
        "RATE_LIMITED",
        "Rate limit exceeded",
        envoy_replies=(
            # only the flood protection answers 429 itself
            EnvoyReply(
                429,
                "Rate limit exceeded: too many requests from this client",
                metadata={"error_type": "rate_limit_exceeded"},
            ),
        ),
    ),
    ErrorStatus(
        500,
        _CODE.INTERNAL,
        "INTERNAL",
        "Internal server error",
        grpc_failures=(_CODE.UNKNOWN, _CODE.INTERNAL, _CODE.DATA_LOSS),
        envoy_replies=(EnvoyReply(500),),
    ),
    ErrorStatus(
        502,
        _CODE.UNAVAILABLE,
        "PROVIDER_ERROR",
        "Provider returned error",
        envoy_replies=(EnvoyReply(502),),
    ),
    ErrorStatus(
        503,
        _CODE.UNAVAILABLE,
        "UNAVAILABLE",
        "Service temporarily unavailable",
        grpc_failures=(_CODE.UNAVAILABLE,),
        envoy_replies=(EnvoyReply(503, retry_after_seconds=UNAVAILABLE_RETRY_SECONDS),),
    ),
    ErrorStatus(
        504,
        _CODE.DEADLINE_EXCEEDED,
        "TIMEOUT",
        "Operation aborted due to timeout",
        grpc_failures=(_CODE.DEADLINE_EXCEEDED,),
    ),
    ErrorStatus(
        524,
        _CODE.DEADLINE_EXCEEDED,
        "TIMEOUT",
        "Request timed out",
        envoy_replies=(EnvoyReply(504),),  # the upstream timeout
    ),
    ErrorStatus(
        529, _CODE.UNAVAILABLE, "PROVIDER_OVERLOADED", "Provider returned error (overloaded)"
    ),
)

ERROR_STATUS: dict[int, ErrorStatus] = {entry.status: entry for entry in ERROR_STATUSES}
# What a failure of an unexpected kind (a gRPC code no entry names) is answered with.
FALLBACK_STATUS = 500


def error_status_for_grpc_failure(code: grpc.StatusCode) -> ErrorStatus:
    """The status the facade answers a gRPC failure that carries no gateway error with."""
    for entry in ERROR_STATUSES:
        if code in entry.grpc_failures:
            return entry
    return ERROR_STATUS[FALLBACK_STATUS]


def default_message(status: int) -> str:
    return ERROR_STATUS[status].message


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
        if self.status not in ERROR_STATUS:
            raise ValueError(f"undocumented error status {self.status}")
        # The one place every error passes: what it echoes of a request is bounded here.
        self.message = bounded_text(self.message, MAX_MESSAGE_CHARS)
        if self.metadata is not None:
            self.metadata = _bounded_metadata(self.metadata)
        super().__init__(self.message)

    @property
    def grpc_code(self) -> grpc.StatusCode:
        return ERROR_STATUS[self.status].grpc_code

    @property
    def reason(self) -> str:
        return ERROR_STATUS[self.status].reason

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


def unauthorized(message: str = default_message(401)) -> GatewayError:
    return GatewayError(401, message)


def forbidden(message: str) -> GatewayError:
    return GatewayError(403, message)


def not_found(message: str) -> GatewayError:
    return GatewayError(404, message)


INTERNAL_ERROR = GatewayError(500, default_message(500))
SERVICE_UNAVAILABLE = GatewayError(503, default_message(503))


def service_unavailable(retry_after_seconds: int) -> GatewayError:
    """503 when the gateway knows when to retry (e.g. the database monitor's next check)."""
    return GatewayError(503, default_message(503), retry_after_seconds=retry_after_seconds)
