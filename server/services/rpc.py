"""What every service shares: turning GatewayErrors into gRPC failures the facade renders,
non-200 success statuses, and JSON-null-capable values."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import Any

import grpc
from google.protobuf import duration_pb2, struct_pb2
from google.rpc import error_details_pb2, status_pb2

from server.billing.money import micros_to_json_number
from server.clock import rfc3339
from server.errors import INTERNAL_ERROR, GatewayError

log = logging.getLogger("gateway.rpc")

ERROR_DOMAIN = "gateway"
_REASONS = {
    400: "INVALID_REQUEST",
    401: "UNAUTHENTICATED",
    402: "INSUFFICIENT_CREDITS",
    403: "FORBIDDEN",
    404: "NOT_FOUND",
    408: "REQUEST_TIMEOUT",
    409: "CONFLICT",
    410: "GONE",
    413: "PAYLOAD_TOO_LARGE",
    429: "RATE_LIMITED",
    500: "INTERNAL",
    501: "NOT_IMPLEMENTED",
    502: "PROVIDER_ERROR",
    503: "UNAVAILABLE",
    504: "TIMEOUT",
    524: "TIMEOUT",
    529: "PROVIDER_OVERLOADED",
}


def status_details(error: GatewayError) -> bytes:
    """google.rpc.Status with ErrorInfo (HTTP status, metadata) and RetryInfo, serialized."""
    info = error_details_pb2.ErrorInfo(
        reason=_REASONS.get(error.status, "ERROR"),
        domain=ERROR_DOMAIN,
        metadata={"http_status": str(error.status)},
    )
    for name, value in (error.metadata or {}).items():
        info.metadata[name] = value if isinstance(value, str) else json.dumps(value)
    status = status_pb2.Status(code=error.grpc_code.value[0], message=error.message)
    status.details.add().Pack(info)
    if error.retry_after_seconds is not None:
        retry = error_details_pb2.RetryInfo(
            retry_delay=duration_pb2.Duration(seconds=error.retry_after_seconds)
        )
        status.details.add().Pack(retry)
    return status.SerializeToString()


async def abort_with(context: grpc.aio.ServicerContext, error: GatewayError) -> None:
    trailing: list[tuple[str, str | bytes]] = [
        ("grpc-status-details-bin", status_details(error)),
        ("x-http-status", str(error.status)),
        ("x-error-body", error.body_json()),
    ]
    trailing.extend(error.response_headers().items())
    await context.abort(error.grpc_code, error.message, trailing_metadata=tuple(trailing))


def _failure(exc: Exception) -> GatewayError:
    if isinstance(exc, GatewayError):
        return exc
    log.exception("unhandled error in an rpc")
    return INTERNAL_ERROR


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """The one place failures become responses: a GatewayError as it says, anything else as
    a bare 500 (the exception is logged, never shown)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _guard_unary(handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _guard_stream(handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler


def _guard_unary(inner: Any) -> Any:
    async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await inner(request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await abort_with(context, _failure(exc))

    return guarded


def _guard_stream(inner: Any) -> Any:
    async def guarded(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        try:
            async for item in inner(request, context):
                yield item
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await abort_with(context, _failure(exc))

    return guarded


async def answer_with_status(context: grpc.aio.ServicerContext, http_status: int) -> None:
    """A success status other than 200 (202, 204) for the REST facade to apply."""
    await context.send_initial_metadata((("x-http-status", str(http_status)),))


def null() -> struct_pb2.Value:
    return struct_pb2.Value(null_value=struct_pb2.NULL_VALUE)


def nullable_string(value: str | None) -> struct_pb2.Value:
    return null() if value is None else struct_pb2.Value(string_value=value)


def nullable_usd(micros: int | None) -> struct_pb2.Value:
    return (
        null() if micros is None else struct_pb2.Value(number_value=micros_to_json_number(micros))
    )


def nullable_timestamp(value: datetime | None) -> struct_pb2.Value:
    return null() if value is None else struct_pb2.Value(string_value=rfc3339(value))


def metadata_of(context: grpc.aio.ServicerContext) -> tuple[tuple[str, str | bytes], ...]:
    return tuple(context.invocation_metadata() or ())


def header_value(context: grpc.aio.ServicerContext, name: str) -> str | None:
    """A request header (gRPC metadata; Envoy forwards the HTTP headers as metadata)."""
    for key, value in metadata_of(context):
        if key.lower() == name:
            return value.decode("latin-1") if isinstance(value, bytes) else value
    return None
