"""Every gateway method is observed through ObservedServer (server/services/rpc.py) — by the
registered handler and by the generic one alike, wrapped once — and the observed handler
counts the call, keeps the call's metadata for the servicer, and answers a GatewayError as
the facade expects."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from opentelemetry.trace import NoOpTracer

from server.contract import keys_pb2, keys_pb2_grpc
from server.errors import unauthorized
from server.observability.metrics import Metrics
from server.services.rpc import ObservedServer, RequestObserver, metadata_of

METHOD = "/gateway.v1.Keys/GetCurrentKey"
METADATA = (("authorization", "Bearer x"), ("x-request-id", "rid-7"))


class _Registrations:
    """What the generated registration function hands the server."""

    def __init__(self) -> None:
        self.generic: list[grpc.GenericRpcHandler] = []
        self.registered: dict[str, dict[str, Any]] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self.generic.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: Any) -> None:
        self.registered[service] = handlers


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


def _observed(servicer: _Keys) -> tuple[Metrics, _Registrations]:
    metrics = Metrics()
    registrations = _Registrations()
    server: Any = ObservedServer(registrations, RequestObserver(metrics, NoOpTracer()))  # type: ignore[arg-type]
    keys_pb2_grpc.add_KeysServicer_to_server(servicer, server)
    return metrics, registrations


def _count(metrics: Metrics, status: str) -> float:
    value = metrics.registry.get_sample_value(
        "gateway_requests_total", {"route": "GET /api/v1/key", "status": status}
    )
    return value or 0.0


def test_both_registrations_give_the_same_observed_handler() -> None:
    _, registrations = _observed(_Keys())
    registered = registrations.registered["gateway.v1.Keys"]["GetCurrentKey"]
    [generic] = registrations.generic
    assert generic.service(_Details()) is registered  # type: ignore[arg-type]
    assert registered.unary_unary is not _Keys.GetCurrentKey


async def test_an_observed_call_is_counted_and_reads_the_metadata_once() -> None:
    servicer = _Keys()
    metrics, registrations = _observed(servicer)
    handler = registrations.registered["gateway.v1.Keys"]["GetCurrentKey"]
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
    handler = registrations.registered["gateway.v1.Keys"]["GetCurrentKey"]
    context = _Context()
    with pytest.raises(grpc.aio.AbortError):
        await handler.unary_unary(keys_pb2.GetCurrentKeyRequest(), context)
    assert context.aborted is not None
    assert context.aborted[2]["x-http-status"] == "401"
    await asyncio.sleep(0)
    assert _count(metrics, "401") == 1
