"""Failures outside the handlers: a crashed query, an unreachable server, a slow server.
Internals (exception text, Envoy reset reasons) never reach the client."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import pytest
from aiohttp import web

from facade.envoy_config import REST_HEALTH_PATH, REST_ROUTES, EnvoyOptions, Upstream
from facade.launcher import EnvoyProcess
from server.config import EdgePolicy
from server.contract import DESCRIPTOR_SET, SERVICES, keys_pb2, keys_pb2_grpc
from server.db.engine import create_engine, session_factory
from server.errors import UNAVAILABLE_RETRY_SECONDS
from testkit.admin import Admin
from testkit.processes import GatewayProcess, refusing_port


async def _envoy(
    tmp_path: Path,
    upstream: Upstream,
    timeout_s: int = 300,
    rest_routes: tuple[tuple[str, str], ...] = REST_ROUTES,
) -> EnvoyProcess:
    envoy = EnvoyProcess(
        EnvoyOptions(
            descriptor_path=str(DESCRIPTOR_SET),
            services=SERVICES,
            upstreams=(upstream,),
            listen_port=0,  # Envoy binds a free port (envoy.listen_port)
            edge=EdgePolicy(upstream_timeout_seconds=timeout_s),
            rest_routes=rest_routes,
        ),
        tmp_path / "envoy",
        concurrency=1,
    )
    await envoy.start()
    return envoy


def _url(envoy: EnvoyProcess, path: str) -> str:
    return f"http://127.0.0.1:{envoy.listen_port}{path}"


async def test_unreachable_server_is_503_without_reset_reason(tmp_path: Path) -> None:
    # nothing listens there, neither gRPC nor the REST listener GET /key is proxied to
    envoy = await _envoy(tmp_path, Upstream("127.0.0.1", refusing_port(), refusing_port()))
    try:
        async with httpx.AsyncClient() as client:
            response = await client.get(_url(envoy, "/api/v1/key"))
    finally:
        await envoy.stop()
    assert response.status_code == 503
    assert response.json() == {"error": {"code": 503, "message": "Service temporarily unavailable"}}
    assert "reset" not in response.text and "upstream" not in response.text
    # The health check looks again within UNAVAILABLE_RETRY_SECONDS: when to retry.
    assert response.headers["retry-after"] == str(UNAVAILABLE_RETRY_SECONDS)


class _SlowKeys(keys_pb2_grpc.KeysServicer):
    async def GetCurrentKey(self, request: object, context: object) -> keys_pb2.CurrentKeyResponse:
        await asyncio.sleep(5)
        return keys_pb2.CurrentKeyResponse()


@pytest.fixture
async def slow_grpc_server() -> AsyncIterator[int]:
    server = grpc.aio.server()
    keys_pb2_grpc.add_KeysServicer_to_server(_SlowKeys(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield port
    await server.stop(grace=None)


async def _slow(request: web.BaseRequest) -> web.Response:
    """A REST listener that is healthy and slow to answer anything else."""
    if request.path != REST_HEALTH_PATH:
        await asyncio.sleep(5)
    return web.Response()


@pytest.fixture
async def slow_rest_listener() -> AsyncIterator[int]:
    server = web.Server(_slow)
    listening = await asyncio.get_running_loop().create_server(server, "127.0.0.1", 0)
    yield int(listening.sockets[0].getsockname()[1])
    listening.close()
    await server.shutdown(0.1)


@pytest.mark.parametrize("way_in", ["gRPC", "REST"])
async def test_upstream_timeout_is_524(
    tmp_path: Path, slow_grpc_server: int, slow_rest_listener: int, way_in: str
) -> None:
    """GET /key transcoded to a slow gRPC server, or proxied to a slow REST listener."""
    if way_in == "gRPC":
        upstream = Upstream("127.0.0.1", slow_grpc_server, refusing_port())
        envoy = await _envoy(tmp_path, upstream, timeout_s=1, rest_routes=())
    else:
        upstream = Upstream("127.0.0.1", refusing_port(), slow_rest_listener)
        envoy = await _envoy(tmp_path, upstream, timeout_s=1)
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            response = await client.get(_url(envoy, "/api/v1/key"))
    finally:
        await envoy.stop()
    assert response.status_code == 524
    assert response.json() == {"error": {"code": 524, "message": "Request timed out"}}


async def test_an_unhandled_exception_is_a_bare_500(tmp_path: Path) -> None:
    """A real failure inside a handler (the database lost a table) becomes the documented
    500 for REST and INTERNAL for gRPC; the exception text appears in neither."""
    data_dir = tmp_path / "gw"
    url = f"sqlite+aiosqlite:///{data_dir / 'gateway.db'}"
    gateway = GatewayProcess(data_dir=data_dir, database_url=url)
    await asyncio.to_thread(gateway.start)
    engine = create_engine(url)
    try:
        admin = Admin(session_factory(engine))
        issued = await admin.key(await admin.workspace("broken"))
        with sqlite3.connect(data_dir / "gateway.db") as connection:
            connection.execute("DROP TABLE usage_counters")
        async with httpx.AsyncClient() as client:
            response = await client.get(f"{gateway.base_url}/key", headers=issued.headers)
        assert response.status_code == 500
        assert response.json() == {"error": {"code": 500, "message": "Internal server error"}}
        async with grpc.aio.insecure_channel(gateway.grpc_target) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                await keys_pb2_grpc.KeysStub(channel).GetCurrentKey(
                    keys_pb2.GetCurrentKeyRequest(), metadata=issued.metadata
                )
        assert failure.value.code() == grpc.StatusCode.INTERNAL
        assert failure.value.details() == "Internal server error"
        assert "usage_counters" not in str(failure.value.trailing_metadata())
    finally:
        await engine.dispose()
        await asyncio.to_thread(gateway.stop)
    assert "usage_counters" in gateway.log()  # logged for the operator, not shown to clients
