"""The gateway's processes and its tests run on one event loop (server/event_loop.py)."""

from __future__ import annotations

import asyncio

import uvloop

from server import event_loop


async def _loop_type() -> type:
    return type(asyncio.get_running_loop())


def test_the_gateway_runs_on_uvloop() -> None:
    assert issubclass(event_loop.run(_loop_type()), uvloop.Loop)


async def test_the_tests_run_on_the_gateways_loop() -> None:
    assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
