"""The embedded stack of `gateway up`: the gRPC server in this process, Envoy beside it."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from facade.envoy_config import EnvoyOptions, Upstream
from facade.launcher import EnvoyBindError, EnvoyProcess, dying_with_this_process
from server.app import serve
from server.config import Settings
from server.contract import DESCRIPTOR_SET, SERVICES
from server.db.migrate import upgrade
from server.limits.admission import Limits
from server.ports import (
    ENVOY_ADMIN_PORT,
    GRPC_PORT,
    HTTP_PORT,
    METRICS_PORT,
    ListenError,
    ensure_free,
)
from server.vault.crypto import load_master_key

# The command line of server process `index` of `gateway up --workers N`.
WorkerCommand = Callable[[Settings, int], list[str]]


def envoy_options(settings: Settings, workers: int = 1) -> EnvoyOptions:
    return EnvoyOptions(
        descriptor_path=str(DESCRIPTOR_SET),
        services=SERVICES,
        upstreams=tuple(
            Upstream(settings.grpc_host, settings.grpc_port + i) for i in range(workers)
        ),
        listen_host=settings.http_host,
        listen_port=settings.http_port,
        admin_port=settings.envoy_admin_port,
        max_request_bytes=settings.max_request_bytes,
        edge=settings.edge,
    )


def check_ports(settings: Settings, workers: int = 1) -> None:
    """Refuse to start when a port of the stack is taken (ListenError naming the address
    and the flag): Envoy's listener and admin port, and each server process's gRPC and
    metrics ports. Checked before anything starts; each bind still reports its own failure."""
    options = envoy_options(settings, workers)
    ensure_free(options.listen_host, options.listen_port, HTTP_PORT)
    ensure_free(options.admin_host, options.admin_port, ENVOY_ADMIN_PORT)
    for index in range(workers):
        ensure_free(settings.grpc_host, settings.grpc_port + index, GRPC_PORT)
        if settings.metrics_port:
            ensure_free(settings.metrics_host, settings.metrics_port + index, METRICS_PORT)


async def start_envoy(envoy: EnvoyProcess) -> None:
    """Start Envoy; a listener it cannot bind is a ListenError naming the flag."""
    try:
        await envoy.start()
    except EnvoyBindError as error:
        options = envoy.options
        setting = HTTP_PORT if error.port == options.listen_port else ENVOY_ADMIN_PORT
        raise ListenError(error.host, error.port, setting, error.reason) from None


async def _serving(target: str, within: float) -> None:
    """Wait until the gRPC server at `target` reports SERVING."""
    deadline = time.monotonic() + within
    async with grpc.aio.insecure_channel(target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while True:
            with contextlib.suppress(grpc.aio.AioRpcError):
                reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=1)  # type: ignore[attr-defined]  # typeshed's HealthStub declares no methods
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the server at {target} did not become ready")
            await asyncio.sleep(0.1)


async def _worker_ready(target: str, child: asyncio.subprocess.Process) -> None:
    """Wait until the worker serves; fail at once if it exits first (a port in use, say)
    rather than after the readiness timeout."""
    serving = asyncio.create_task(_serving(target, 60))
    exited = asyncio.create_task(child.wait())
    try:
        await asyncio.wait({serving, exited}, return_when=asyncio.FIRST_COMPLETED)
        if serving.done():
            serving.result()  # re-raises the timeout
            return
    finally:
        for task in (serving, exited):
            task.cancel()
    raise RuntimeError(
        f"the server process for {target} exited with {child.returncode} before it was ready"
    )


def serve_command(
    settings: Settings, index: int, entry_point: tuple[str, ...] = ("-m", "server", "serve")
) -> list[str]:
    """`gateway serve` (or another entry point taking its options) on gRPC port
    grpc_port + index, with the stack's settings."""
    arguments = [
        sys.executable,
        *entry_point,
        "--grpc-port",
        str(settings.grpc_port + index),
        "--data-dir",
        str(settings.data_dir),
        "--database-url",
        settings.database_url,
    ]
    if settings.catalog_file:
        arguments += ["--catalog", settings.catalog_file]
    metrics_port = settings.metrics_port + index if settings.metrics_port else 0
    arguments += ["--metrics-port", str(metrics_port)]
    return arguments


async def run_workers(
    settings: Settings,
    stop: asyncio.Event,
    announce: Callable[[str], None],
    workers: int,
    worker_command: WorkerCommand = serve_command,
) -> None:
    """N server processes (`gateway serve`, gRPC ports grpc_port .. grpc_port+N-1) behind one
    Envoy that balances over them. Migrations run once, here, before any worker starts."""
    check_ports(settings, workers)
    await upgrade(settings.database_url)
    load_master_key(settings.data_dir)  # created once here, not raced by the workers
    children: list[asyncio.subprocess.Process] = []
    envoy = EnvoyProcess(envoy_options(settings, workers), settings.data_dir / "envoy")
    try:
        for index in range(workers):
            children.append(
                await asyncio.create_subprocess_exec(
                    *dying_with_this_process(*worker_command(settings, index)),
                    stdin=asyncio.subprocess.DEVNULL,
                )
            )
        await asyncio.gather(
            *(
                _worker_ready(f"{settings.grpc_host}:{settings.grpc_port + i}", child)
                for i, child in enumerate(children)
            )
        )
        await start_envoy(envoy)
        announce(f"http://{settings.http_host}:{settings.http_port}/api/v1")
        stopper = asyncio.create_task(stop.wait())
        exits = [asyncio.create_task(child.wait()) for child in children]
        await asyncio.wait({stopper, *exits}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
    finally:
        # Drain the workers first (they refuse new calls and finish the ones in flight),
        # while Envoy still carries the answers back; then stop Envoy.
        for child in children:
            if child.returncode is None:
                child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                await asyncio.wait_for(child.wait(), settings.shutdown_grace_seconds + 10)
            except TimeoutError:
                child.kill()
                await child.wait()
        await envoy.stop()


async def run_stack(
    settings: Settings,
    stop: asyncio.Event,
    announce: Callable[[str], None],
    workers: int = 1,
    *,
    limits: Limits | None = None,
    worker_command: WorkerCommand = serve_command,
) -> None:
    """`limits` (the server in this process) and `worker_command` (the server processes of
    --workers N) replace the enforced limits only to measure what they cost (bench/)."""
    if workers > 1:
        await run_workers(settings, stop, announce, workers, worker_command)
        return
    check_ports(settings)
    started = asyncio.Event()
    server_stop = asyncio.Event()
    server_task = asyncio.create_task(serve(settings, started, server_stop, limits))
    envoy = EnvoyProcess(envoy_options(settings), settings.data_dir / "envoy")
    try:
        waiter = asyncio.create_task(started.wait())
        done, _ = await asyncio.wait({server_task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if server_task in done:
            waiter.cancel()
            server_task.result()  # raises the start-up failure
            return
        await start_envoy(envoy)
        announce(f"http://{settings.http_host}:{settings.http_port}/api/v1")
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({server_task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
    finally:
        # Drain the server first (it refuses new calls and finishes the ones in flight),
        # while Envoy still carries the answers back; then stop Envoy.
        server_stop.set()
        try:
            with contextlib.suppress(asyncio.CancelledError):
                await server_task
        finally:
            await envoy.stop()
