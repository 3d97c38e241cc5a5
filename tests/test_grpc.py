"""The gRPC face of the server: rich error details, health and reflection (grpcurl-ready)."""

from __future__ import annotations

import json

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status

from server.contract import (
    SERVICES,
    management_pb2,
    management_pb2_grpc,
    vault_pb2,
    vault_pb2_grpc,
)
from tests.conftest import Stack


def _error_info(error: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo:
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    raise AssertionError("no ErrorInfo in the status details")


async def test_errors_carry_error_info_with_http_status_and_metadata(
    stack: Stack, unique: str
) -> None:
    workspace = await stack.admin.workspace(f"rich-{unique}")
    issued = await stack.admin.key(workspace, management=True)
    async with grpc.aio.insecure_channel(stack.grpc_target) as channel:
        stub = management_pb2_grpc.ManagementStub(channel)
        request = management_pb2.CreateKeyRequest(name="x")
        request.limit_reset.string_value = "yearly"
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await stub.CreateKey(request, metadata=issued.metadata)
    error = failure.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "limit_reset" in (error.details() or "")
    info = _error_info(error)
    assert info.domain == "gateway"
    assert info.reason == "INVALID_REQUEST"
    assert info.metadata["http_status"] == "400"
    assert info.metadata["param"] == "limit_reset"
    # The same documented body the REST facade shows travels in the trailers.
    trailers = dict(error.trailing_metadata() or ())
    assert json.loads(trailers["x-error-body"])["error"]["metadata"] == {"param": "limit_reset"}


async def test_not_found_carries_the_http_status(stack: Stack, unique: str) -> None:
    workspace = await stack.admin.workspace(f"nf-{unique}")  # outside the intern programme
    issued = await stack.admin.key(workspace)
    async with grpc.aio.insecure_channel(stack.grpc_target) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await vault_pb2_grpc.VaultStub(channel).DeleteSecret(
                vault_pb2.DeleteSecretRequest(name="x"), metadata=issued.metadata
            )
    assert failure.value.code() == grpc.StatusCode.NOT_FOUND
    assert _error_info(failure.value).metadata["http_status"] == "404"


async def test_health_reports_serving(stack: Stack) -> None:
    async with grpc.aio.insecure_channel(stack.grpc_target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", *SERVICES):
            response = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert response.status == health_pb2.HealthCheckResponse.SERVING


async def test_reflection_lists_every_service(stack: Stack) -> None:
    async with grpc.aio.insecure_channel(stack.grpc_target) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        responses = [r async for r in stub.ServerReflectionInfo(iter([request]))]
        names = {s.name for s in responses[0].list_services_response.service}
        assert set(SERVICES) <= names
        assert "grpc.health.v1.Health" in names
        # grpcurl describes a service by fetching its file descriptor.
        by_symbol = reflection_pb2.ServerReflectionRequest(file_containing_symbol="gateway.v1.Keys")
        described = [r async for r in stub.ServerReflectionInfo(iter([by_symbol]))]
        assert described[0].file_descriptor_response.file_descriptor_proto
