"""The background loop shared by the video worker and the webhook dispatcher."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from server.db.engine import is_database_unavailable


async def run_until_stopped(
    work_once: Callable[[], Awaitable[bool]],
    stop: asyncio.Event,
    wake: asyncio.Event,
    idle_wait: float,
    log: logging.Logger,
) -> None:
    """Call `work_once` while it finds work; when it finds none, sleep until `wake`, `stop`
    or `idle_wait` seconds (other processes' work is found by polling). A failing step is
    logged and the loop goes on; on `stop` the current step finishes first."""
    while not stop.is_set():
        try:
            if await work_once():
                continue
        except Exception as exc:
            if is_database_unavailable(exc):  # health reports it; retried after idle_wait
                log.warning("background step skipped: database unavailable")
            else:
                log.exception("background step failed; continuing")
        wake.clear()
        waiter = asyncio.ensure_future(wake.wait())
        stopper = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait(
                {waiter, stopper}, timeout=idle_wait, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            waiter.cancel()
            stopper.cancel()
