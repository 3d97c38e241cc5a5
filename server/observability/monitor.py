"""The database monitor of a server process: pings the database so gRPC health tells
whether this process can serve, and refreshes the queue gauges (job queue depth, webhook
backlog, open credit holds) from the shared tables."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable

import sqlalchemy as sa

from server.billing.money import micros_to_json_number
from server.clock import Clock
from server.db.engine import SessionFactory
from server.db.models import CreditHold, UtcDateTime, VideoJob, WebhookDelivery
from server.errors import UNAVAILABLE_RETRY_SECONDS
from server.observability.metrics import Metrics

log = logging.getLogger("gateway.monitor")

_HOLDS = CreditHold.__table__
_JOBS = VideoJob.__table__
_DELIVERIES = WebhookDelivery.__table__
QUEUED_JOB_STATES = ("pending", "in_progress")

_PING = sa.text("SELECT 1")
_OPEN_HOLDS = sa.select(
    sa.func.count(), sa.func.coalesce(sa.func.sum(_HOLDS.c.amount_micros), 0)
).where(_HOLDS.c.expires_at > sa.bindparam("now", type_=UtcDateTime))
_QUEUED_JOBS = (
    sa.select(_JOBS.c.status, sa.func.count())
    .where(_JOBS.c.status.in_(QUEUED_JOB_STATES))
    .group_by(_JOBS.c.status)
)
_WEBHOOK_BACKLOG = sa.select(sa.func.count()).where(_DELIVERIES.c.status == "pending")


def recovery_retry_seconds(interval: float) -> int:
    """The Retry-After of a 503 for an unreachable database: the monitor looks again within
    `interval` seconds, and Envoy's health check within UNAVAILABLE_RETRY_SECONDS."""
    return max(1, math.ceil(interval)) + UNAVAILABLE_RETRY_SECONDS


class DatabaseMonitor:
    def __init__(
        self,
        sessions: SessionFactory,
        clock: Clock,
        metrics: Metrics,
        set_serving: Callable[[bool], Awaitable[None]],
        *,
        interval: float = 2.0,
        gauges_every: int = 5,
        ping_timeout: float = 5.0,
    ) -> None:
        self._sessions = sessions
        self._clock = clock
        self._metrics = metrics
        self._set_serving = set_serving
        self._interval = interval
        self._gauges_every = gauges_every
        self._ping_timeout = ping_timeout
        self.serving = True  # the server starts SERVING once migrations ran

    async def run(self, stop: asyncio.Event) -> None:
        tick = 0
        while not stop.is_set():
            reachable = await self.ping()
            if reachable != self.serving:
                self.serving = reachable
                if reachable:
                    log.info("database reachable again: serving")
                else:
                    log.error("database unreachable: health is NOT_SERVING")
                await self._set_serving(reachable)
            if reachable and tick % self._gauges_every == 0:
                try:
                    await self.refresh_gauges()
                except Exception:
                    log.warning("could not refresh the queue gauges", exc_info=True)
            tick += 1
            try:
                await asyncio.wait_for(stop.wait(), self._interval)
            except TimeoutError:
                pass

    async def ping(self) -> bool:
        try:
            async with asyncio.timeout(self._ping_timeout), self._sessions() as session:
                await session.exec(_PING)  # type: ignore[call-overload]  # sqlmodel's exec() is typed for its own select() only
        except Exception as exc:
            log.debug("database ping failed: %s", type(exc).__name__)
            self._metrics.database_up.set(0)
            return False
        self._metrics.database_up.set(1)
        return True

    async def refresh_gauges(self) -> None:
        async with self._sessions() as session:
            count, held = (await session.exec(_OPEN_HOLDS, params={"now": self._clock.now()})).one()  # type: ignore[call-overload]  # sqlmodel's exec() is typed for its own select() only
            queued = dict.fromkeys(QUEUED_JOB_STATES, 0)
            for status, jobs in (await session.exec(_QUEUED_JOBS)).all():  # type: ignore[call-overload]  # sqlmodel's exec() is typed for its own select() only
                queued[status] = jobs
            backlog = (await session.exec(_WEBHOOK_BACKLOG)).scalar_one()  # type: ignore[call-overload]  # sqlmodel's exec() is typed for its own select() only
        self._metrics.holds_open.set(count)
        self._metrics.holds_open_usd.set(micros_to_json_number(int(held)))
        for status, jobs in queued.items():
            self._metrics.video_jobs.labels(status).set(jobs)
        self._metrics.webhook_backlog.set(backlog)
