"""The event loop every gateway process runs on: uvloop (libuv), not asyncio's own: in the
whole stack it answers a transcription sooner at concurrency 1 and serves more per second of
CPU at 16 (the figures: Design notes, "uvloop"). The gateway's code uses only asyncio's
public API, which uvloop implements; the tests run on it too (tests/conftest.py), so there
is one loop to support."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")


def new_event_loop() -> asyncio.AbstractEventLoop:
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


# For what makes its loops through asyncio's policy (the tests' pytest-asyncio).
EventLoopPolicy = uvloop.EventLoopPolicy


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on the gateway's event loop."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)
