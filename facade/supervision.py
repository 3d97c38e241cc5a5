"""What `gateway up` does when one of its processes dies (a server process of --workers N,
or Envoy): say which, its pid and how it died, and start it again after a backoff, while
the others keep serving; a process dying again and again (the limit-th time within the
window) stops the gateway with a non-zero status and a line saying so. A clean stop
(SIGTERM, Ctrl-C) is not a death."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from server.clock import Clock
from server.config import Settings

log = logging.getLogger("gateway")


class ProcessDied(RuntimeError):
    """A process of the gateway died too often: the gateway stopped (exit status 1)."""


def how_it_ended(returncode: int | None) -> str:
    """`killed by SIGKILL`, `exited with status 3`."""
    if returncode is None:
        return "is still running"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"exited with status {returncode}"


@dataclass
class RestartBudget:
    """Deaths per process within the window: the backoff before the next start, or None
    once the limit is reached (give up)."""

    limit: int
    window: timedelta
    backoff: float
    backoff_max: float
    clock: Clock
    _deaths: dict[str, collections.deque[datetime]] = field(default_factory=dict)

    @classmethod
    def of(cls, settings: Settings, clock: Clock) -> RestartBudget:
        return cls(
            settings.restart_limit,
            timedelta(seconds=settings.restart_window_seconds),
            settings.restart_backoff_seconds,
            settings.restart_backoff_max_seconds,
            clock,
        )

    def died(self, name: str) -> float | None:
        now = self.clock.now()
        deaths = self._deaths.setdefault(name, collections.deque())
        deaths.append(now)
        while deaths and deaths[0] <= now - self.window:
            deaths.popleft()
        if len(deaths) >= self.limit:
            return None
        return float(min(self.backoff * 2 ** (len(deaths) - 1), self.backoff_max))

    def recent(self, name: str) -> int:
        return len(self._deaths.get(name, ()))


@dataclass
class Supervised:
    """One restartable process: its name in the log (`worker 1`, `Envoy`), the running
    process, and how to start it again (returns once it serves; raises if it cannot)."""

    name: str
    process: asyncio.subprocess.Process
    restart: Callable[[], Awaitable[asyncio.subprocess.Process]]


async def supervise(
    processes: list[Supervised],
    stop: asyncio.Event,
    budget: RestartBudget,
    also: asyncio.Future[None] | None = None,
) -> None:
    """Until `stop` is set (returns) or `also` ends (its result or exception), restarting
    processes that die; ProcessDied once one has died `limit` times within the window."""
    stopper = asyncio.ensure_future(stop.wait())
    waits: dict[asyncio.Future[int], Supervised] = {}
    try:
        while True:
            for supervised in processes:
                if supervised not in waits.values():
                    waits[asyncio.ensure_future(supervised.process.wait())] = supervised
            watched: set[asyncio.Future[object]] = {stopper, *waits}  # type: ignore[arg-type]  # futures of several result types
            if also is not None:
                watched.add(also)  # type: ignore[arg-type]  # as above
            done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
            if stopper in done:
                return
            if also is not None and also in done:
                also.result()
                return
            for ended in [w for w in waits if w in done]:
                if not await _restart(waits.pop(ended), stop, budget):
                    return  # stopped meanwhile
    finally:
        stopper.cancel()
        for wait in waits:
            wait.cancel()


async def _restart(supervised: Supervised, stop: asyncio.Event, budget: RestartBudget) -> bool:
    """Start a dead process again after its backoff (again, while it fails to start);
    False when the gateway is told to stop meanwhile. Raises ProcessDied at the limit."""
    while True:
        process = supervised.process
        how = how_it_ended(process.returncode)
        delay = budget.died(supervised.name)
        if delay is None:
            message = (
                f"{supervised.name} (pid {process.pid}) {how}; it died "
                f"{budget.recent(supervised.name)} times within "
                f"{budget.window.total_seconds():g} s: stopping the gateway"
            )
            log.error("%s", message)
            raise ProcessDied(message)
        log.warning(
            "%s (pid %d) %s; restarting it in %.1f s",
            supervised.name,
            process.pid,
            how,
            delay,
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
            return False
        try:
            started = asyncio.ensure_future(supervised.restart())
            stopper = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait({started, stopper}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopper.cancel()
            if not started.done():
                started.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await started
                return False
            supervised.process = started.result()
        except (OSError, RuntimeError, TimeoutError) as error:
            log.warning("%s did not start again: %s", supervised.name, error)
            continue  # counted as another death
        log.warning("%s restarted (pid %d)", supervised.name, supervised.process.pid)
        return True
