"""OpenTelemetry traces, exported over OTLP/HTTP when the operator configures an endpoint
(the standard OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_TRACES_ENDPOINT variables):
the broadcast destination of the API reference's `trace`, `session_id` and `user`.

Each rpc gets a server span. Each generation (a transcription, a finished video job) gets a
span named by `trace.generation_name`, carrying the model, provider, cost, `session.id`,
`user.id` and the request's trace keys; a `trace.span_name` wraps it in a span of that name.
`trace.trace_id` / `trace.parent_span_id` place it in the caller's trace: W3C ids are used as
they are, other strings are hashed, so requests that share a trace_id share a trace."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    Tracer,
)

from server.billing.money import micros_to_json_number
from server.db.models import Generation

SERVICE_NAME = "inference-gateway"
# Keys of the API reference's TraceConfig with a meaning of their own; others are custom.
KNOWN_TRACE_KEYS = ("trace_id", "trace_name", "span_name", "generation_name", "parent_span_id")
_TRACE_ID = re.compile(r"^[0-9a-f]{32}$")
_SPAN_ID = re.compile(r"^[0-9a-f]{16}$")


def tracer_provider_from_environment(
    environ: Mapping[str, str] = os.environ,
) -> TracerProvider | None:
    """A provider exporting over OTLP/HTTP, or None when no endpoint is configured."""
    configured = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if not configured or environ.get("OTEL_TRACES_EXPORTER", "otlp") == "none":
        return None
    # Imported here: the exporter (and its HTTP stack) is only loaded when used.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    provider = TracerProvider(
        resource=Resource.create({"service.name": environ.get("OTEL_SERVICE_NAME", SERVICE_NAME)})
    )
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


def tracer_of(provider: TracerProvider | None) -> Tracer:
    """The gateway's tracer; a no-op one when tracing is not configured."""
    if provider is None:
        return trace.NoOpTracer()
    return provider.get_tracer("inference-gateway")


def _id(value: object, pattern: re.Pattern[str], size: int) -> int | None:
    """A W3C id as given, or a stable hash of any other non-empty string."""
    if not isinstance(value, str) or not value:
        return None
    if pattern.match(value) and int(value, 16) != 0:
        return int(value, 16)
    return int.from_bytes(hashlib.sha256(value.encode()).digest()[:size], "big") or 1


def caller_context(trace_config: Mapping[str, Any] | None) -> Context | None:
    """The caller's trace from `trace.trace_id` (+ `parent_span_id`), if it named one."""
    if not trace_config:
        return None
    trace_id = _id(trace_config.get("trace_id"), _TRACE_ID, 16)
    if trace_id is None:
        return None
    # Without a parent span id, hang the generation under a stable root of that trace.
    parent = _id(trace_config.get("parent_span_id"), _SPAN_ID, 8) or _id(
        f"root:{trace_config['trace_id']}", _SPAN_ID, 8
    )
    assert parent is not None
    remote = SpanContext(
        trace_id=trace_id,
        span_id=parent,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    return trace.set_span_in_context(NonRecordingSpan(remote))


def _attribute(value: object) -> str | bool | int | float:
    if isinstance(value, str | bool | int | float):
        return value
    return str(value)


OPERATIONS = {"stt": "transcription", "video": "video_generation"}


def generation_attributes(
    record: Generation, request_id: str | None = None
) -> dict[str, str | bool | int | float]:
    attributes: dict[str, str | bool | int | float] = {
        "gen_ai.operation.name": OPERATIONS.get(record.kind, record.kind),
        "gen_ai.request.model": record.model,
        "gateway.generation.id": record.id,
        "gateway.generation.status": record.status,
        "gateway.cost_usd": micros_to_json_number(record.cost_micros),
        "gateway.is_byok": record.is_byok,
    }
    if record.provider:
        attributes["gen_ai.provider.name"] = record.provider
    if record.seconds is not None:
        attributes["gateway.media_seconds"] = float(record.seconds)
    if record.session_id:
        attributes["session.id"] = record.session_id
    if record.user:
        attributes["user.id"] = record.user
    if request_id:
        attributes["gateway.request_id"] = request_id
    for key, value in (record.trace or {}).items():
        if value is None:
            continue
        if key in KNOWN_TRACE_KEYS:
            attributes[f"gateway.trace.{key}"] = _attribute(value)
        else:
            attributes[f"gateway.trace.metadata.{key}"] = _attribute(value)
    return attributes


def _ns(when: datetime) -> int:
    return int(when.timestamp() * 1_000_000_000)


def emit_generation_span(
    tracer: Tracer, record: Generation, started_at: datetime, request_id: str | None = None
) -> None:
    """Record a finished generation (and its `span_name` wrapper) after the fact: from
    `started_at` to the record's creation."""
    if isinstance(tracer, trace.NoOpTracer):
        return  # tracing is off: nothing to build
    config = record.trace or {}
    error = None if record.status == "completed" else (record.error or "failed")
    attributes = generation_attributes(record, request_id)
    default_name = f"{OPERATIONS.get(record.kind, record.kind)} {record.model}"
    context = caller_context(config)
    links: list[Link] = []
    current = trace.get_current_span().get_span_context()
    if context is not None and current.is_valid:
        links.append(Link(current))  # the rpc that produced it, in the gateway's own trace
    start, end = _ns(started_at), _ns(record.created_at)
    wrapper = None
    span_name = config.get("span_name")
    if isinstance(span_name, str) and span_name:
        wrapper = tracer.start_span(span_name, context=context, links=links, start_time=start)
        context = trace.set_span_in_context(wrapper, context)
        links = []
    name = config.get("generation_name")
    span = tracer.start_span(
        name if isinstance(name, str) and name else default_name,
        context=context,
        kind=SpanKind.INTERNAL,
        attributes=attributes,
        links=links,
        start_time=start,
    )
    if error is not None:
        span.set_status(Status(StatusCode.ERROR, error))
    span.end(end_time=end)
    if wrapper is not None:
        if error is not None:
            wrapper.set_status(Status(StatusCode.ERROR, error))
        wrapper.end(end_time=end)
