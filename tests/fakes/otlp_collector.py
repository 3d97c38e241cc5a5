"""An OTLP/HTTP trace collector on loopback: what an operator's OpenTelemetry collector
receives. It decodes the real protobuf export requests (POST /v1/traces) into spans."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from testkit.eventually import eventually
from testkit.fakes.listener import serve_in_thread, stop_serving


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any]
    links: tuple[tuple[str, str], ...]  # (trace_id, span_id)
    status_code: int
    service_name: str


@dataclass
class OtlpCollector:
    spans: list[ReceivedSpan] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def traces_endpoint(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def start(self) -> OtlpCollector:
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                collector._add(request)
                answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self.server = serve_in_thread(ThreadingHTTPServer(("127.0.0.1", 0), Handler))
        return self

    def stop(self) -> None:
        stop_serving(self.server)

    def _add(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        received = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(_span(span, str(resource.get("service.name", ""))))
        with self._lock:
            self.spans.extend(received)

    async def wait_for(
        self,
        name: str,
        count: int = 1,
        within: float = 15.0,
        where: Callable[[ReceivedSpan], bool] | None = None,
    ) -> list[ReceivedSpan]:
        """The spans named `name` (and matching `where`), once at least `count` arrived."""

        def arrived() -> list[ReceivedSpan]:
            with self._lock:
                found = [s for s in self.spans if s.name == name and (where is None or where(s))]
            return found if len(found) >= count else []

        return await eventually(arrived, within=within, message=f"{count} {name!r} span(s)")


def _span(span: Span, service_name: str) -> ReceivedSpan:
    return ReceivedSpan(
        name=span.name,
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_span_id=span.parent_span_id.hex(),
        kind=span.kind,
        attributes={a.key: _value(a.value) for a in span.attributes},
        links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in span.links),
        status_code=span.status.code,
        service_name=service_name,
    )
