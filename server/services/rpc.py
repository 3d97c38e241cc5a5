"""What every service shares: the request observer (request ids, spans, metrics, access
log, and GatewayErrors turned into gRPC failures the facade renders), non-200 success
statuses, and JSON-null-capable values."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextvars import ContextVar, Token
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, TypeAlias, TypeVar

import grpc
from google.protobuf import duration_pb2, struct_pb2
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status
from opentelemetry.trace import NoOpTracer, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from server.billing.money import AmountError, exact_micros, micros_to_json_number
from server.clock import rfc3339
from server.contract import http_routes
from server.db.engine import is_database_unavailable
from server.errors import (
    INTERNAL_ERROR,
    UNAVAILABLE_RETRY_SECONDS,
    GatewayError,
    bad_request,
    service_unavailable,
)
from server.observability.in_flight import RequestsInFlight
from server.observability.logs import REQUEST_ID, log_access
from server.observability.metrics import Metrics
from server.validation import MAX_JSON_DEPTH, check_struct, check_struct_value, check_text

log = logging.getLogger("gateway.rpc")

ERROR_DOMAIN = "gateway"


def rich_status(error: GatewayError) -> status_pb2.Status:
    """google.rpc.Status with ErrorInfo (reason, HTTP status, metadata) and RetryInfo."""
    info = error_details_pb2.ErrorInfo(
        reason=error.reason,
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
    return status


def status_details(error: GatewayError) -> bytes:
    """The rich status, serialized (grpc-status-details-bin)."""
    serialized: bytes = rich_status(error).SerializeToString()  # google.rpc is untyped
    return serialized


async def abort_with(context: grpc.aio.ServicerContext, error: GatewayError) -> None:
    """Fail the rpc with the error's rich status (grpcio-status puts it in
    grpc-status-details-bin) plus what the REST facade renders: x-http-status, x-error-body
    and the error's headers."""
    status = rpc_status.to_status(rich_status(error))
    trailing: tuple[tuple[str, str | bytes], ...] = (
        *status.trailing_metadata,
        ("x-http-status", str(error.status)),
        ("x-error-body", error.body_json()),
        *error.response_headers().items(),
    )
    await context.abort(status.code, status.details, trailing_metadata=trailing)


def failure_error(exc: Exception, database_retry_seconds: int) -> GatewayError:
    """The error an rpc answers for `exc`. An unreachable database is a 503 with Retry-After:
    the database monitor's next check, which puts the process back in service."""
    if isinstance(exc, GatewayError):
        return exc
    if is_database_unavailable(exc):
        log.warning("database unavailable: %s", type(exc).__name__)
        return service_unavailable(database_retry_seconds)
    log.exception("unhandled error in an rpc")
    return INTERNAL_ERROR


@dataclass(slots=True)
class _Call:
    """What the observer knows about the rpc it wraps: its context and metadata (read from
    gRPC once per call, see metadata_of) and the HTTP status it answers."""

    context: grpc.aio.ServicerContext | None  # None: a request of the REST listener
    metadata: Sequence[tuple[str, str | bytes]]
    request_id: str
    started: float  # time.perf_counter()
    status: int = 200
    # To restore the context variables as they were when the call ends.
    tokens: tuple[Token[_Call | None], Token[str | None]] | None = None


_CALL: ContextVar[_Call | None] = ContextVar("rpc_call", default=None)
_PROPAGATOR = TraceContextTextMapPropagator()
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def _request_id(metadata: Sequence[tuple[str, str | bytes]]) -> str:
    """Envoy's x-request-id (or a direct caller's), else a new one."""
    for key, value in metadata:
        if key == "x-request-id" and isinstance(value, str) and _REQUEST_ID.match(value):
            return value
    return uuid.uuid4().hex


async def _answer_failure(
    context: grpc.aio.ServicerContext,
    call: _Call,
    exc: BaseException,
    database_retry_seconds: int = UNAVAILABLE_RETRY_SECONDS,
) -> None:
    """Abort the rpc with the failure's documented error; re-raise what is not a failure."""
    if isinstance(exc, grpc.aio.AbortError):
        raise exc
    if isinstance(exc, asyncio.CancelledError):
        call.status = 499  # the caller went away (or the server stopped) first
        raise exc
    if not isinstance(exc, Exception):
        raise exc
    await abort_with(context, _failed(call, exc, database_retry_seconds))


def _failed(call: _Call, exc: Exception, database_retry_seconds: int) -> GatewayError:
    """The documented error a failed call answers (the call's status set to it).

    The exception's tracebacks are dropped: gRPC keeps the abort's exception, and with it
    (as its context) this one, past the call, and its traceback's frames would keep the
    handler's locals — a request body of megabytes — alive until a full garbage collection.
    Logged by failure_error first. Never frame.clear(): a frame in the traceback may belong
    to a coroutine still running for others (the writer's group commit), which clearing
    would finalize."""
    error = failure_error(exc, database_retry_seconds)
    call.status = error.status
    _drop_tracebacks(exc)
    return error


def _drop_tracebacks(exc: BaseException) -> None:
    """Let go of the frames `exc` and the exceptions chained to it reference."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        current.__traceback__ = None
        pending += [current.__context__, current.__cause__]


@dataclass(frozen=True)
class _Undecodable:
    """What a request message that does not parse becomes (see `_tolerant`)."""


def _tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """The rpc's deserializer, turning bytes that are not its message into `_Undecodable`:
    grpc would answer UNKNOWN with no details; the interceptor answers 400 /
    INVALID_ARGUMENT with ErrorInfo, as for every other error."""
    if deserializer is None:
        return None

    def deserialize(raw: bytes) -> Any:
        try:
            return deserializer(raw)
        except Exception:  # DecodeError, or invalid UTF-8 in a string field
            return _Undecodable()

    return deserialize


def check_request(request: Any) -> None:
    """Refuse, as a 400 naming the field, a request message that is not a message, or that
    carries a string with NUL (the database refuses it) or a number that is not finite, in
    any field (nested messages, lists, maps, Struct values) — before a handler uses it."""
    if isinstance(request, _Undecodable):
        raise bad_request(
            "The request is malformed: text that is not valid UTF-8 (a path parameter such as "
            "%C3), or bytes that are not this method's message"
        )
    if isinstance(request, Message):
        _check_message(request, "", 0)


def _check_scalar(field: FieldDescriptor, value: Any, param: str) -> None:
    if field.type == FieldDescriptor.TYPE_STRING:
        check_text(value, param)
    elif field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        if not math.isfinite(value):
            raise bad_request(f"{param} must be a finite number", param=param)


def _check_value(field: FieldDescriptor, value: Any, param: str, depth: int) -> None:
    if field.type != FieldDescriptor.TYPE_MESSAGE:
        _check_scalar(field, value, param)
        return
    message = field.message_type
    assert message is not None  # a TYPE_MESSAGE field always names its message type
    name = message.full_name
    if name == "google.protobuf.Struct":
        check_struct(value, param, depth)
    elif name == "google.protobuf.Value":
        check_struct_value(value, param, depth)
    elif name == "google.protobuf.ListValue":
        for index, item in enumerate(value.values):
            check_struct_value(item, f"{param}[{index}]", depth + 1)
    else:
        _check_message(value, f"{param}.", depth + 1)


def _check_message(message: Message, prefix: str, depth: int) -> None:
    if depth > MAX_JSON_DEPTH:
        raise bad_request(f"{prefix.rstrip('.') or 'the request'} is nested too deeply")
    for field, value in message.ListFields():
        param = prefix + field.name
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key_field = field.message_type.fields_by_name["key"]
            value_field = field.message_type.fields_by_name["value"]
            for key, item in value.items():
                _check_scalar(key_field, key, param)
                _check_value(value_field, item, f"{param}.{str(key)[:64]}", depth + 1)
        elif field.is_repeated:
            for index, item in enumerate(value):
                _check_value(field, item, f"{param}[{index}]", depth)
        else:
            _check_value(field, value, param, depth)


_Answer = TypeVar("_Answer")
MethodHandler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"  # generic in the stubs only


class RequestObserver:
    """The one place every gateway rpc passes: its request id (logs), server span (traces,
    when exported), route and status (metrics, access log), and failures — a GatewayError as
    it says, anything else as a bare 500 (the exception is logged, never shown).

    Each method's handler is wrapped once, when it is registered (ObservedServer), not per
    call by a grpc.aio interceptor: grpc then finds the handler as it does for a server
    without interceptors, and a call costs one coroutine of ours around the servicer's."""

    def __init__(
        self,
        metrics: Metrics,
        tracer: Tracer,
        *,
        database_retry_seconds: int = UNAVAILABLE_RETRY_SECONDS,
        in_flight: RequestsInFlight | None = None,
    ) -> None:
        """`in_flight`: counts the requests observed while they run (the process's one
        counter, which the group-commit writer reads)."""
        self._metrics = metrics
        self._in_flight = in_flight or RequestsInFlight()
        self._tracer = tracer
        # Not exported (no OTLP endpoint): no span to start, no traceparent to parse.
        self._tracing = not isinstance(tracer, NoOpTracer)
        self._database_retry_seconds = database_retry_seconds
        self._routes = http_routes()

    def wrap(self, method: str, handler: MethodHandler) -> MethodHandler:
        """`handler` of the rpc `method` (/package.Service/Method), observed."""
        route = self._routes.get(method, method)
        deserializer = _tolerant(handler.request_deserializer)
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(handler.unary_unary, route),
                request_deserializer=deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._stream(handler.unary_stream, route),
                request_deserializer=deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                self._client_stream(handler.stream_unary, route),
                request_deserializer=deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler

    def _begin(
        self,
        context: grpc.aio.ServicerContext | None,
        metadata: Sequence[tuple[str, str | bytes]] | None = None,
    ) -> _Call:
        started = time.perf_counter()
        if metadata is None:
            assert context is not None
            metadata = tuple(context.invocation_metadata() or ())
        call = _Call(context, metadata, _request_id(metadata), started)
        call.tokens = (_CALL.set(call), REQUEST_ID.set(call.request_id))
        self._in_flight.begun()
        return call

    async def answer(
        self,
        route: str,
        headers: Sequence[tuple[str, str | bytes]],
        handle: Callable[[], Awaitable[_Answer]],
        refuse: Callable[[GatewayError], _Answer],
    ) -> _Answer:
        """A request the REST listener serves (server/rest/), observed as an rpc is: its
        request id, span, metrics and access log; `handle`'s answer, or for a failure
        `refuse`'s rendering of its documented error (the error table's, as the facade
        renders a failed rpc's)."""
        call = self._begin(None, headers)
        with self._span(route, call):
            try:
                return await handle()
            except asyncio.CancelledError:
                call.status = 499  # the caller went away (or the server stopped) first
                raise
            except Exception as exc:
                return refuse(_failed(call, exc, self._database_retry_seconds))
            finally:
                self._end(route, call)

    def _end(self, route: str, call: _Call) -> None:
        self._in_flight.ended()
        elapsed = time.perf_counter() - call.started
        if call.tokens is not None:
            REQUEST_ID.reset(call.tokens[1])
            _CALL.reset(call.tokens[0])
        # Counted and logged in the loop's next turn: by then gRPC has the answer on its way,
        # so a caller waits for neither.
        asyncio.get_running_loop().call_soon(
            self._done, route, call.status, elapsed, call.request_id
        )

    def _done(self, route: str, status: int, elapsed: float, request_id: str) -> None:
        self._metrics.request_done(route, status, elapsed)
        log_access(log, route, status, elapsed * 1000, request_id)

    def _span(self, route: str, call: _Call) -> contextlib.AbstractContextManager[object]:
        """The rpc's server span, current while it runs (generation spans link to it)."""
        if not self._tracing:
            return _NO_SPAN
        return self._server_span(route, call)

    @contextlib.contextmanager
    def _server_span(self, route: str, call: _Call) -> Iterator[object]:
        parent = _PROPAGATOR.extract({k: v for k, v in call.metadata if isinstance(v, str)})
        with self._tracer.start_as_current_span(
            route, context=parent, kind=SpanKind.SERVER, record_exception=False
        ) as span:
            try:
                yield span
            finally:
                span.set_attribute("http.response.status_code", call.status)
                span.set_attribute("gateway.request_id", call.request_id)
                if call.status >= 500:
                    span.set_status(Status(StatusCode.ERROR))

    def _unary(self, inner: Any, route: str) -> Any:
        async def observed(request: Any, context: grpc.aio.ServicerContext) -> Any:
            call = self._begin(context)
            with self._span(route, call):
                try:
                    check_request(request)
                    return await inner(request, context)
                except BaseException as exc:
                    await _answer_failure(context, call, exc, self._database_retry_seconds)
                finally:
                    self._end(route, call)

        return observed

    def _stream(self, inner: Any, route: str) -> Any:
        async def observed(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            call = self._begin(context)
            with self._span(route, call):
                try:
                    check_request(request)
                    async for item in inner(request, context):
                        yield item
                except BaseException as exc:
                    await _answer_failure(context, call, exc, self._database_retry_seconds)
                finally:
                    self._end(route, call)

        return observed

    def _client_stream(self, inner: Any, route: str) -> Any:
        async def observed(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            call = self._begin(context)
            with self._span(route, call):
                try:
                    return await inner(_checked(requests), context)
                except BaseException as exc:
                    await _answer_failure(context, call, exc, self._database_retry_seconds)
                finally:
                    self._end(route, call)

        return observed


async def _checked(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """A client stream's messages, each checked as a unary request is (check_request); the
    handler pulls them, so it decides when (and whether) the body is read."""
    async for request in requests:
        check_request(request)
        yield request


_NO_SPAN = contextlib.nullcontext()


class MethodTable(grpc.GenericRpcHandler):
    """The server's one generic handler: each method's handler by its full name
    (/package.Service/Method), then the generic handlers registered without their methods,
    asked in order.

    Nothing is registered with grpc as a registered method: for each one, grpc.aio's server
    keeps a request for the method's next call pending and, for every call that arrives,
    waits on all of them at once (asyncio.wait adds and removes a callback on each) — work
    per call that grows with the number of methods. One generic handler keeps one request
    pending, and a call's handler is one dict lookup here."""

    def __init__(self) -> None:
        self._methods: dict[str, MethodHandler] = {}
        self._generic: list[grpc.GenericRpcHandler] = []

    def add(self, method: str, handler: MethodHandler) -> None:
        if method in self._methods:
            raise ValueError(f"{method} is registered twice")
        self._methods[method] = handler

    def add_generic(self, handler: grpc.GenericRpcHandler) -> None:
        self._generic.append(handler)

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> MethodHandler | None:
        handler = self._methods.get(handler_call_details.method)
        if handler is not None:
            return handler
        for generic in self._generic:
            handler = generic.service(handler_call_details)
            if handler is not None:
                return handler
        return None


class TableServer:
    """Stands for the grpc.aio server in generated add_<Service>Servicer_to_server functions
    (grpc's own health and reflection services among them): puts each method's handler in
    the table — both ways the generated code registers them —, as it is (no access log, no
    metrics)."""

    def __init__(self, table: MethodTable) -> None:
        self._table = table

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        for handler in handlers:
            self._table.add_generic(self._generic(handler))

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, MethodHandler]
    ) -> None:
        for name, handler in handlers.items():
            method = f"/{service}/{name}"
            self._table.add(method, self._handler(method, handler))

    def _generic(self, handler: grpc.GenericRpcHandler) -> grpc.GenericRpcHandler:
        return handler

    def _handler(self, method: str, handler: MethodHandler) -> MethodHandler:
        return handler


class ObservedServer(TableServer):
    """A TableServer for the gateway's own services: each method's handler goes in the
    table wrapped by the observer, once, whichever way the generated code registered it."""

    def __init__(self, table: MethodTable, observer: RequestObserver) -> None:
        super().__init__(table)
        self._observer = observer
        self._wrapped: dict[str, MethodHandler] = {}  # by method (/package.Service/Method)

    def observed(self, method: str, handler: MethodHandler) -> MethodHandler:
        known = self._wrapped.get(method)
        if known is None:
            known = self._wrapped[method] = self._observer.wrap(method, handler)
        return known

    def _generic(self, handler: grpc.GenericRpcHandler) -> grpc.GenericRpcHandler:
        return _ObservedGenericHandler(handler, self)

    def _handler(self, method: str, handler: MethodHandler) -> MethodHandler:
        return self.observed(method, handler)


class _ObservedGenericHandler(grpc.GenericRpcHandler):
    """A generic handler whose method handlers are the observed ones (the table asks it for
    a method it has no handler for)."""

    def __init__(self, inner: grpc.GenericRpcHandler, server: ObservedServer) -> None:
        self._inner = inner
        self._server = server

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> MethodHandler | None:
        handler = self._inner.service(handler_call_details)
        if handler is None:
            return None
        return self._server.observed(handler_call_details.method, handler)


async def answer_with_status(
    context: grpc.aio.ServicerContext,
    http_status: int,
    headers: tuple[tuple[str, str], ...] = (),
) -> None:
    """A success status other than 200 (202, 204, 206) for the REST facade to apply, with
    response headers of its own (initial metadata the facade passes on as headers)."""
    call = _CALL.get()
    if call is not None:
        call.status = http_status
    await context.send_initial_metadata((("x-http-status", str(http_status)), *headers))


def string_or_null(value: struct_pb2.Value, param: str) -> str | None:
    """A JSON member that may be a string or null (proto Value)."""
    kind = value.WhichOneof("kind")
    if kind == "null_value":
        return None
    if kind != "string_value":
        raise bad_request(f"{param} must be a string or null", param=param)
    return value.string_value


def bool_or_null(value: struct_pb2.Value, param: str) -> bool | None:
    """A JSON member that may be a boolean or null (proto Value)."""
    kind = value.WhichOneof("kind")
    if kind == "null_value":
        return None
    if kind != "bool_value":
        raise bad_request(f"{param} must be a boolean or null", param=param)
    return value.bool_value


def number_or_null(value: struct_pb2.Value, param: str) -> Decimal | None:
    """A JSON number or null, as the decimal the client wrote."""
    kind = value.WhichOneof("kind")
    if kind == "null_value":
        return None
    if kind != "number_value" or not math.isfinite(value.number_value):
        raise bad_request(f"{param} must be a number or null", param=param)
    # repr() gives the shortest decimal that round-trips: the number the client wrote.
    return Decimal(repr(value.number_value))


def usd_or_null(value: struct_pb2.Value, param: str) -> int | None:
    """A JSON number of USD (or null) as exact micro-dollars: 0 to 1e9 USD, at most six
    decimal places; anything else is a 400 naming the field."""
    usd = number_or_null(value, param)
    if usd is None:
        return None
    try:
        return exact_micros(usd)
    except AmountError as exc:
        raise bad_request(f"{param} {exc}", param=param) from exc


def integer_or_null(value: struct_pb2.Value, param: str) -> int | None:
    number = number_or_null(value, param)
    if number is None:
        return None
    if number != number.to_integral_value():
        raise bad_request(f"{param} must be a whole number or null", param=param)
    return int(number)


def strings_or_null(value: struct_pb2.Value, param: str) -> list[str] | None:
    """A JSON array of strings, or null."""
    kind = value.WhichOneof("kind")
    if kind == "null_value":
        return None
    if kind != "list_value" or not all(
        item.WhichOneof("kind") == "string_value" for item in value.list_value.values
    ):
        raise bad_request(f"{param} must be an array of strings or null", param=param)
    return [item.string_value for item in value.list_value.values]


def list_or_null(values: Sequence[Any] | None) -> struct_pb2.Value:
    if values is None:
        return null()
    value = struct_pb2.Value()
    value.list_value.extend(list(values))
    return value


def null() -> struct_pb2.Value:
    return struct_pb2.Value(null_value=struct_pb2.NULL_VALUE)


def nullable_string(value: str | None) -> struct_pb2.Value:
    return null() if value is None else struct_pb2.Value(string_value=value)


def nullable_bool(value: bool | None) -> struct_pb2.Value:
    return null() if value is None else struct_pb2.Value(bool_value=value)


def nullable_usd(micros: int | None) -> struct_pb2.Value:
    return (
        null() if micros is None else struct_pb2.Value(number_value=micros_to_json_number(micros))
    )


def nullable_timestamp(value: datetime | None) -> struct_pb2.Value:
    return null() if value is None else struct_pb2.Value(string_value=rfc3339(value))


def metadata_of(context: grpc.aio.ServicerContext) -> Sequence[tuple[str, str | bytes]]:
    """The call's metadata. Read from gRPC once per observed call (each read converts every
    header Envoy forwards into new Python strings) and kept for the call's handler."""
    call = _CALL.get()
    if call is not None and call.context is context:
        return call.metadata
    return tuple(context.invocation_metadata() or ())


def time_remaining(context: grpc.aio.ServicerContext) -> float | None:
    """Seconds left to answer: the caller's gRPC deadline, or the one Envoy set from its
    route timeout (x-envoy-expected-rq-timeout-ms, measured from when it sent the call)."""
    remaining = context.time_remaining()
    from_envoy = envoy_timeout(header_value(context, ENVOY_TIMEOUT_HEADER))
    if from_envoy is not None:
        remaining = from_envoy if remaining is None else min(remaining, from_envoy)
    return remaining


# The route timeout Envoy set for the request, in ms, sent with it to the server.
ENVOY_TIMEOUT_HEADER = "x-envoy-expected-rq-timeout-ms"


def envoy_timeout(value: str | None) -> float | None:
    """Seconds of ENVOY_TIMEOUT_HEADER's value, when it is a plain number."""
    if value is None or not value.isdigit() or len(value) > 12:
        return None
    return int(value) / 1000


def header_value(context: grpc.aio.ServicerContext, name: str) -> str | None:
    """A request header (gRPC metadata; Envoy forwards the HTTP headers as metadata)."""
    return metadata_value(metadata_of(context), name)


def metadata_value(metadata: Sequence[tuple[str, str | bytes]], name: str) -> str | None:
    """The value of header `name` (lower case) among a request's headers or metadata."""
    for key, value in metadata:
        if key.lower() == name:
            return value.decode("latin-1") if isinstance(value, bytes) else value
    return None
