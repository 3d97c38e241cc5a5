"""The embedded stack of `gateway up`: the gRPC server in this process, Envoy beside it."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from asyncio.subprocess import Process
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from facade.envoy_config import EnvoyOptions, Upstream
from facade.launcher import EnvoyBindError, EnvoyProcess, dying_with_this_process
from facade.supervision import RestartBudget, Supervised, supervise
from server.app import prepare_vault, serve
from server.clock import SystemClock
from server.config import Settings
from server.contract import DESCRIPTOR_SET, SERVICES
from server.db.migrate import upgrade
from server.limits.admission import Limits
from server.ports import (
    ENVOY_ADMIN_PORT,
    GRPC_PORT,
    HTTP_PORT,
    METRICS_PORT,
    REST_PORT,
    ListenError,
    ServedPorts,
    ensure_free,
)
from server.vault.crypto import load_master_key

# The command line of server process `index` of `gateway up --workers N` (run_workers adds
# `--port-file PATH`: the entry point writes the ports it bound there once it serves).
WorkerCommand = Callable[[Settings, int], list[str]]
# Told, once the stack serves, the REST base URL and the gRPC target of each server process,
# with the ports actually bound.
Announce = Callable[[str, list[str]], None]


def envoy_options(settings: Settings, served: Sequence[ServedPorts] | None = None) -> EnvoyOptions:
    """Envoy in front of the server processes that bound `served` (by default the ports of
    the settings)."""
    ports = (ServedPorts(settings.grpc_port, settings.rest_port),) if served is None else served
    return EnvoyOptions(
        descriptor_path=str(DESCRIPTOR_SET),
        services=SERVICES,
        upstreams=tuple(Upstream(settings.grpc_host, p.grpc, p.rest) for p in ports),
        listen_host=settings.http_host,
        listen_port=settings.http_port,
        admin_port=settings.envoy_admin_port,
        max_request_bytes=settings.max_request_bytes,
        edge=settings.edge,
    )


def worker_grpc_port(settings: Settings, index: int) -> int:
    """The gRPC port asked of server process `index`: --grpc-port onwards, or 0 (each binds
    a free port of its own and reports it) when --grpc-port is 0."""
    return settings.grpc_port + index if settings.grpc_port else 0


def worker_rest_port(settings: Settings, index: int) -> int:
    """The REST listener's port asked of server process `index`, as worker_grpc_port."""
    return settings.rest_port + index if settings.rest_port else 0


def check_ports(settings: Settings, workers: int = 1) -> None:
    """Refuse to start when a port of the stack is taken (ListenError naming the address
    and the flag): Envoy's listener and admin port, and each server process's gRPC, REST
    and metrics ports. Checked before anything starts; each bind still reports its own failure."""
    options = envoy_options(settings)
    ensure_free(options.listen_host, options.listen_port, HTTP_PORT)
    ensure_free(options.admin_host, options.admin_port, ENVOY_ADMIN_PORT)
    for index in range(workers):
        ensure_free(settings.grpc_host, worker_grpc_port(settings, index), GRPC_PORT)
        ensure_free(settings.grpc_host, worker_rest_port(settings, index), REST_PORT)
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


def _read_ports(port_file: Path) -> ServedPorts:
    grpc_port, rest_port = port_file.read_text().split()
    return ServedPorts(int(grpc_port), int(rest_port))


async def _reported_ports(port_file: Path, within: float) -> ServedPorts:
    """The ports a server process wrote to `port_file` (`gateway serve --port-file`) once it
    serves."""
    deadline = time.monotonic() + within
    while True:
        with contextlib.suppress(OSError, ValueError):
            return _read_ports(port_file)
        if time.monotonic() > deadline:
            raise TimeoutError(f"no server process reported its port in {port_file}")
        await asyncio.sleep(0.05)


async def _worker_ready(
    host: str, port_file: Path, child: asyncio.subprocess.Process
) -> ServedPorts:
    """Wait until the worker serves and return its ports; fail at once if it exits first
    (a port in use, say) rather than after the readiness timeout."""

    async def serving() -> ServedPorts:
        ports = await _reported_ports(port_file, 60)
        await _serving(f"{host}:{ports.grpc}", 60)
        return ports

    serves = asyncio.create_task(serving())
    exited = asyncio.create_task(child.wait())
    try:
        await asyncio.wait({serves, exited}, return_when=asyncio.FIRST_COMPLETED)
        if serves.done():
            return serves.result()  # or re-raises the timeout
    finally:
        for task in (serves, exited):
            task.cancel()
    raise RuntimeError(
        f"the server process writing {port_file.name} exited with {child.returncode} "
        "before it was ready"
    )


def serve_command(
    settings: Settings, index: int, entry_point: tuple[str, ...] = ("-m", "server", "serve")
) -> list[str]:
    """`gateway serve` (or another entry point taking its options) on gRPC port
    grpc_port + index and REST port rest_port + index (0 for 0), with the stack's settings."""
    arguments = [
        sys.executable,
        *entry_point,
        "--grpc-port",
        str(worker_grpc_port(settings, index)),
        "--rest-port",
        str(worker_rest_port(settings, index)),
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
    announce: Announce,
    workers: int,
    worker_command: WorkerCommand = serve_command,
) -> None:
    """N server processes (`gateway serve`, gRPC ports grpc_port .. grpc_port+N-1, or each a
    free one for 0) behind one Envoy that balances over them. Each process writes the port
    it bound to a file of the data dir (--port-file), read before Envoy's config is
    written. Migrations run once, here, before any worker starts. A worker or Envoy that
    dies is started again (facade/supervision.py), on the port it had."""
    check_ports(settings, workers)
    await upgrade(settings.database_url)
    # Created once here, not raced by the workers, and refused here when it is not the
    # database's (before any worker or Envoy starts); what is left in clear sealed here too.
    await prepare_vault(settings, load_master_key(settings.data_dir))
    ports_dir = settings.data_dir / "ports"
    ports_dir.mkdir(parents=True, exist_ok=True)
    port_files = [ports_dir / f"grpc-{index}" for index in range(workers)]
    for port_file in port_files:
        port_file.unlink(missing_ok=True)  # a previous run's
    children: list[asyncio.subprocess.Process] = []
    envoy: EnvoyProcess | None = None

    async def spawn(index: int, ports: ServedPorts | None = None) -> asyncio.subprocess.Process:
        command = [*worker_command(settings, index), "--port-file", str(port_files[index])]
        if ports is not None:
            # A restart: the ports Envoy sends to (argparse takes the last of each flag).
            command += ["--grpc-port", str(ports.grpc), "--rest-port", str(ports.rest)]
        port_files[index].unlink(missing_ok=True)
        return await asyncio.create_subprocess_exec(
            *dying_with_this_process(*command), stdin=asyncio.subprocess.DEVNULL
        )

    def restart_worker(index: int, ports: ServedPorts) -> Callable[[], Awaitable[Process]]:
        async def restart() -> Process:
            child = await spawn(index, ports)
            try:
                await _worker_ready(settings.grpc_host, port_files[index], child)
            except BaseException:
                if child.returncode is None:
                    child.kill()
                    await child.wait()
                raise
            children[index] = child
            return child

        return restart

    async def restart_envoy() -> Process:
        nonlocal envoy
        assert envoy is not None
        again = EnvoyProcess(replace(envoy.options, listen_port=envoy.listen_port), envoy.work_dir)
        await start_envoy(again)
        envoy = again
        assert again.process is not None
        return again.process

    try:
        for index in range(workers):
            children.append(await spawn(index))
        served = await asyncio.gather(
            *(
                _worker_ready(settings.grpc_host, port_file, child)
                for port_file, child in zip(port_files, children, strict=True)
            )
        )
        envoy = EnvoyProcess(envoy_options(settings, served), settings.data_dir / "envoy")
        await start_envoy(envoy)
        announce(
            _base_url(settings, envoy), [f"{settings.grpc_host}:{ports.grpc}" for ports in served]
        )
        assert envoy.process is not None
        supervised = [
            Supervised(f"worker {index}", child, restart_worker(index, ports))
            for index, (child, ports) in enumerate(zip(children, served, strict=True))
        ]
        supervised.append(Supervised("Envoy", envoy.process, restart_envoy))
        await supervise(supervised, stop, RestartBudget.of(settings, SystemClock()))
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
        if envoy is not None:
            await envoy.stop()


def _base_url(settings: Settings, envoy: EnvoyProcess) -> str:
    """The REST base URL on the port Envoy's listener is bound to."""
    return f"http://{settings.http_host}:{envoy.listen_port}/api/v1"


async def run_stack(
    settings: Settings,
    stop: asyncio.Event,
    announce: Announce,
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
    served: list[ServedPorts] = []
    server_task = asyncio.create_task(
        serve(settings, started, server_stop, limits, listening=served.append)
    )
    envoy: EnvoyProcess | None = None
    try:
        waiter = asyncio.create_task(started.wait())
        done, _ = await asyncio.wait({server_task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if server_task in done:
            waiter.cancel()
            server_task.result()  # raises the start-up failure
            return
        envoy = EnvoyProcess(envoy_options(settings, served), settings.data_dir / "envoy")
        await start_envoy(envoy)
        announce(_base_url(settings, envoy), [f"{settings.grpc_host}:{served[0].grpc}"])

        async def restart_envoy() -> Process:
            nonlocal envoy
            assert envoy is not None
            again = EnvoyProcess(
                replace(envoy.options, listen_port=envoy.listen_port), envoy.work_dir
            )
            await start_envoy(again)
            envoy = again
            assert again.process is not None
            return again.process

        assert envoy.process is not None
        # The server runs in this process: its end (a failure) ends the gateway; Envoy is
        # started again when it dies.
        await supervise(
            [Supervised("Envoy", envoy.process, restart_envoy)],
            stop,
            RestartBudget.of(settings, SystemClock()),
            also=server_task,
        )
    finally:
        # Drain the server first (it refuses new calls and finishes the ones in flight),
        # while Envoy still carries the answers back; then stop Envoy.
        server_stop.set()
        try:
            with contextlib.suppress(asyncio.CancelledError):
                await server_task
        finally:
            if envoy is not None:
                await envoy.stop()
