"""`gateway up --workers N`: N server processes behind one Envoy, on one database."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from server.db.engine import create_engine, session_factory
from testkit.admin import Admin
from testkit.processes import GatewayProcess, free_port_range
from tests.conftest import Databases


def _worker_pids(pid: int) -> list[int]:
    """The `gateway serve` children of a `gateway up` process."""
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as handle:
            found.extend(int(p) for p in handle.read().split())
    workers = []
    for child in found:
        with open(f"/proc/{child}/cmdline", "rb") as handle:
            if b"serve" in handle.read().split(b"\0"):
                workers.append(child)
    return workers


def _alive(pids: list[int]) -> bool:
    return any(os.path.exists(f"/proc/{p}") for p in pids)


async def test_two_workers_serve_behind_one_envoy(databases: Databases, tmp_path: Path) -> None:
    url = await databases.new("postgres")
    grpc_port = free_port_range(2)
    gateway = GatewayProcess(
        data_dir=tmp_path / "gw",
        database_url=url,
        grpc_port=grpc_port,
        extra_args=("--workers", "2"),
    )
    await asyncio.to_thread(gateway.start)
    engine = create_engine(url)
    workers: list[int] = []
    try:
        assert gateway.process is not None
        workers = await asyncio.to_thread(_worker_pids, gateway.process.pid)
        assert len(workers) == 2, gateway.log()
        for port in (grpc_port, grpc_port + 1):
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                reply = await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest()
                )
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        admin = Admin(session_factory(engine))
        issued = await admin.key(await admin.workspace("workers"))
        async with httpx.AsyncClient() as client:
            responses = await asyncio.gather(
                *(client.get(f"{gateway.base_url}/key", headers=issued.headers) for _ in range(40))
            )
        assert all(r.status_code == 200 for r in responses)
    finally:
        await engine.dispose()
        assert await asyncio.to_thread(gateway.stop) == 0
    assert not await asyncio.to_thread(_alive, workers)


async def test_a_worker_that_cannot_listen_stops_gateway_up_at_once(
    databases: Databases, tmp_path: Path
) -> None:
    """The second worker's port is taken: `gateway up` says so and exits, without waiting
    out the readiness timeout and without leaving a worker running."""
    url = await databases.new("sqlite")
    grpc_port = free_port_range(2)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", grpc_port + 1))
        taken.listen()
        gateway = GatewayProcess(
            data_dir=tmp_path / "gw",
            database_url=url,
            grpc_port=grpc_port,
            extra_args=("--workers", "2"),
        )
        started = time.monotonic()
        with pytest.raises(RuntimeError) as failed:
            await asyncio.to_thread(gateway.start)
        assert time.monotonic() - started < 30
    # Refused before any worker starts, naming the address and the flag that sets it.
    assert f"cannot listen on 127.0.0.1:{grpc_port + 1} (--grpc-port)" in str(failed.value)
    assert gateway.process is not None and gateway.process.returncode != 0
