"""Every gateway method is observed through ObservedServer (server/services/rpc.py) — by the
registered handler and by the generic one alike, wrapped once, found in the server's one
method table — and the observed handler counts the call, keeps the call's metadata for the
servicer, and answers a GatewayError as the facade expects."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from opentelemetry.trace import NoOpTracer

from server.contract import keys_pb2, keys_pb2_grpc
from server.errors import unauthorized
from server.observability.in_flight import RequestsInFlight
from server.observability.metrics import Metrics
from server.services.rpc import (
    MethodTable,
    ObservedServer,
    RequestObserver,
    TableServer,
    metadata_of,
)

METHOD = "/gateway.v1.Keys/GetCurrentKey"
METADATA = (("authorization", "Bearer x"), ("x-request-id", "rid-7"))


class _Details:
    method = METHOD
    invocation_metadata = METADATA


class _Context:
    def __init__(self) -> None:
        self.reads = 0
        self.aborted: tuple[Any, ...] | None = None

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        self.reads += 1
        return METADATA

    async def abort(self, code: Any, details: str, trailing_metadata: Any = ()) -> None:
        self.aborted = (code, details, dict(trailing_metadata))
        raise grpc.aio.AbortError()


class _Keys(keys_pb2_grpc.KeysServicer):
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.seen: tuple[tuple[str, str | bytes], ...] = ()

    async def GetCurrentKey(
        self, request: keys_pb2.GetCurrentKeyRequest, context: grpc.aio.ServicerContext
    ) -> keys_pb2.CurrentKeyResponse:
        self.seen = metadata_of(context)
        if self.fail:
            raise unauthorized("Invalid API key")
        return keys_pb2.CurrentKeyResponse()


def _observed(servicer: _Keys) -> tuple[Metrics, MethodTable]:
    metrics = Metrics()
    table = MethodTable()
    server: Any = ObservedServer(table, RequestObserver(metrics, NoOpTracer()))
    keys_pb2_grpc.add_KeysServicer_to_server(servicer, server)
    return metrics, table


def _handler(table: MethodTable) -> Any:
    handler = table.service(_Details())  # type: ignore[arg-type]
    assert handler is not None
    return handler


def _count(metrics: Metrics, status: str) -> float:
    value = metrics.registry.get_sample_value(
        "gateway_requests_total", {"route": "GET /api/v1/key", "status": status}
    )
    return value or 0.0


def test_both_registrations_give_the_same_observed_handler() -> None:
    """The generated code registers a service both ways: the table's handler and the one
    its generic handler gives are the same observed handler."""
    _, table = _observed(_Keys())
    registered = _handler(table)
    assert registered.unary_unary is not _Keys.GetCurrentKey
    generic_only = MethodTable()
    server: Any = ObservedServer(generic_only, RequestObserver(Metrics(), NoOpTracer()))
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("gateway.v1.Keys", {"GetCurrentKey": registered}),)
    )
    found = generic_only.service(_Details())  # type: ignore[arg-type]
    assert found is not None and found.unary_unary is not registered.unary_unary  # wrapped
    assert generic_only.service(_Details()) is found  # once


async def test_one_table_serves_every_service() -> None:
    """The server has one generic handler, the table, and no registered method: grpc.aio
    keeps one request pending per registered method and waits on all of them for each call
    (MethodTable). Every service is still served, health and reflection unobserved."""
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    server = grpc.aio.server()
    table = MethodTable()
    server.add_generic_rpc_handlers((table,))
    observed: Any = ObservedServer(table, RequestObserver(Metrics(), NoOpTracer()))
    keys_pb2_grpc.add_KeysServicer_to_server(_Keys(), observed)
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), TableServer(table))  # type: ignore[arg-type]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            answer = await keys_pb2_grpc.KeysStub(channel).GetCurrentKey(
                keys_pb2.GetCurrentKeyRequest(), metadata=METADATA
            )
            assert isinstance(answer, keys_pb2.CurrentKeyResponse)
            status = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest()
            )
            assert status.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.aio.AioRpcError) as missing:
                await channel.unary_unary("/gateway.v1.Keys/NoSuchMethod")(b"")
            assert missing.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await server.stop(None)
    with pytest.raises(ValueError, match="registered twice"):
        keys_pb2_grpc.add_KeysServicer_to_server(_Keys(), observed)


async def test_an_observed_call_is_counted_and_reads_the_metadata_once() -> None:
    servicer = _Keys()
    metrics, registrations = _observed(servicer)
    handler = _handler(registrations)
    context = _Context()
    response = await handler.unary_unary(keys_pb2.GetCurrentKeyRequest(), context)
    assert isinstance(response, keys_pb2.CurrentKeyResponse)
    assert servicer.seen == METADATA
    assert context.reads == 1
    assert _count(metrics, "200") == 0  # counted once the answer is on its way:
    await asyncio.sleep(0)  # the loop's next turn
    assert _count(metrics, "200") == 1


async def test_a_gateway_error_is_answered_with_its_status() -> None:
    metrics, registrations = _observed(_Keys(fail=True))
    handler = _handler(registrations)
    context = _Context()
    with pytest.raises(grpc.aio.AbortError):
        await handler.unary_unary(keys_pb2.GetCurrentKeyRequest(), context)
    assert context.aborted is not None
    assert context.aborted[2]["x-http-status"] == "401"
    await asyncio.sleep(0)
    assert _count(metrics, "401") == 1


class _Counting(_Keys):
    def __init__(self, in_flight: RequestsInFlight, fail: bool = False) -> None:
        super().__init__(fail)
        self.in_flight = in_flight
        self.counted: list[int] = []

    async def GetCurrentKey(
        self, request: keys_pb2.GetCurrentKeyRequest, context: grpc.aio.ServicerContext
    ) -> keys_pb2.CurrentKeyResponse:
        self.counted.append(self.in_flight.count)
        return await super().GetCurrentKey(request, context)


@pytest.mark.parametrize("fail", [False, True])
async def test_requests_in_flight_are_counted_while_they_run(fail: bool) -> None:
    """The process's one count of requests in flight (the group-commit writer leads a lone
    request's unit when it says `alone`): one while a call runs, none once it ended, however
    it ended."""
    in_flight = RequestsInFlight()
    servicer = _Counting(in_flight, fail)
    table = MethodTable()
    server: Any = ObservedServer(
        table, RequestObserver(Metrics(), NoOpTracer(), in_flight=in_flight)
    )
    keys_pb2_grpc.add_KeysServicer_to_server(servicer, server)
    handler = _handler(table)
    context = _Context()
    if fail:
        with pytest.raises(grpc.aio.AbortError):
            await handler.unary_unary(keys_pb2.GetCurrentKeyRequest(), context)
    else:
        await handler.unary_unary(keys_pb2.GetCurrentKeyRequest(), context)
    assert servicer.counted == [1]
    assert in_flight.count == 0 and in_flight.alone()
    in_flight.begun()
    in_flight.begun()
    assert not in_flight.alone()
