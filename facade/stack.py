"""The embedded stack of `gateway up`: the gRPC server in this process, Envoy beside it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from facade.envoy_config import EnvoyOptions, Upstream
from facade.launcher import EnvoyProcess
from server.app import serve
from server.config import Settings
from server.contract import DESCRIPTOR_SET, SERVICES


def envoy_options(settings: Settings) -> EnvoyOptions:
    return EnvoyOptions(
        descriptor_path=str(DESCRIPTOR_SET),
        services=SERVICES,
        upstreams=(Upstream(settings.grpc_host, settings.grpc_port),),
        listen_host=settings.http_host,
        listen_port=settings.http_port,
        admin_port=settings.envoy_admin_port,
        max_request_bytes=settings.max_request_bytes,
    )


async def run_stack(
    settings: Settings, stop: asyncio.Event, announce: Callable[[str], None]
) -> None:
    started = asyncio.Event()
    server_stop = asyncio.Event()
    server_task = asyncio.create_task(serve(settings, started, server_stop))
    envoy = EnvoyProcess(envoy_options(settings), settings.data_dir / "envoy")
    try:
        waiter = asyncio.create_task(started.wait())
        done, _ = await asyncio.wait({server_task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if server_task in done:
            waiter.cancel()
            server_task.result()  # raises the start-up failure
            return
        await envoy.start()
        announce(f"http://{settings.http_host}:{settings.http_port}/api/v1")
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({server_task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
    finally:
        # Envoy first: stop taking requests, then drain the server.
        await envoy.stop()
        server_stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await server_task
