"""The background loop shared by the video worker and the webhook dispatcher."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Generic, TypeVar

from server.db.engine import is_database_unavailable

T = TypeVar("T")


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


class ClaimedWork(Generic[T]):
    """Items claimed one at a time (`claim`: None when there is nothing to take) and each run
    in a task of its own (`handle`, which logs its own failures), at most `at_once` at a
    time: one item's slow peer holds only its own task. An item claimed again while its task
    runs (its lease lapsed and this very process took it afresh) runs once. When a task ends
    the loop is woken: a slot is free, and its workspace may be below its share again.

    `run(stop)` goes on until `stop`; then the tasks under way get `drain_seconds` to end
    (None: as long as they take, each being bounded by its own deadline) and the rest are
    cancelled."""

    def __init__(
        self,
        *,
        claim: Callable[[], Awaitable[T | None]],
        handle: Callable[[T], Coroutine[object, object, None]],
        key: Callable[[T], str],
        at_once: int,
        wake: asyncio.Event,
        idle_wait: float,
        log: logging.Logger,
        drain_seconds: float | None = None,
    ) -> None:
        self._claim = claim
        self._handle = handle
        self._key = key
        self._at_once = at_once
        self._wake = wake
        self._idle_wait = idle_wait
        self._log = log
        self._drain_seconds = drain_seconds
        self._running: dict[str, asyncio.Task[None]] = {}  # by item key

    async def run(self, stop: asyncio.Event) -> None:
        async def work_once() -> bool:
            if len(self._running) >= self._at_once:
                # Every slot busy: claim nothing (another process may take the items) until
                # one frees or the loop is told to stop.
                stopping = asyncio.ensure_future(stop.wait())
                try:
                    await asyncio.wait(
                        {*self._running.values(), stopping}, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    stopping.cancel()
                return True
            item = await self._claim()
            if item is None:
                return False
            key = self._key(item)
            if key in self._running:
                return True  # leased afresh by this process while it runs here: run once
            task = asyncio.create_task(self._handle(item), name=f"claimed {key}")
            self._running[key] = task
            task.add_done_callback(functools.partial(self._ended, key))
            return True

        try:
            await run_until_stopped(work_once, stop, self._wake, self._idle_wait, self._log)
        finally:
            await self._drain()

    def _ended(self, key: str, _task: asyncio.Task[None]) -> None:
        self._running.pop(key, None)
        self._wake.set()

    async def _drain(self) -> None:
        running = set(self._running.values())
        if not running:
            return
        _done, late = await asyncio.wait(running, timeout=self._drain_seconds)
        for task in late:
            task.cancel()  # its lease lapses; another process takes the item up
        if late:
            await asyncio.wait(late)
