"""Housekeeping of the shared tables: one task per server process, every few seconds.

Each step is a conditional statement over rows whose time has passed — a DELETE, or an
UPDATE that re-checks the row's state — so any number of server processes may run it on one
database: a row is deleted or expired by exactly one of them, and a step that finds nothing
to do changes nothing. Videos and rate windows go in batches of BATCH rows, each its own
transaction (on PostgreSQL a batch's rows are locked with `FOR UPDATE SKIP LOCKED`, so
processes take different rows and never wait on each other; on SQLite the write lock orders
them); lapsed holds are few (only a crashed process's) and go in one statement.

- `holds`: credit holds past their expiry (their request died with its process). A lapsed
  hold already stopped counting against the budget; deleting it keeps the table small.
- `videos`: completed jobs past their retention become `expired` (GET answers 410), their
  `video.generation.expired` webhook is queued in the same transaction, and their content
  is deleted — after the commit, by the process whose UPDATE expired them.
- `rate_windows`: `:free` request windows (minute and UTC day) that ended more than
  `WINDOW_GRACE` ago. Admission counts only into the current minute and day, and GET /key
  reads only the current day (limits/free_models.py, limits/key_status.py); the grace
  keeps the last window of a process whose clock lags slightly behind.

Not pruned: webhook deliveries (the outbox keeps delivered, stopped and failed rows as the
record of what was sent; no retention is defined for them), expired job rows (GET still
answers for them), ledger and generation rows (the account's history).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from server.billing.holds import sweep_expired_holds
from server.clock import Clock
from server.db.engine import SessionFactory, is_database_unavailable
from server.db.models import RateWindow, UtcDateTime, VideoJob
from server.limits.free_models import DAY, MINUTE
from server.observability.metrics import Metrics
from server.videos import jobs
from server.videos.content import ContentStore
from server.workers.loop import run_until_stopped

log = logging.getLogger("gateway.maintenance")

DEFAULT_INTERVAL_SECONDS = 5.0
BATCH = 1000  # rows per statement (and transaction): no step holds locks for long
# A window is pruned this long after it ended, not at once: a process whose clock lags
# behind the pruning one may still be counting into it.
WINDOW_GRACE = timedelta(minutes=1)

HOLDS, VIDEOS, RATE_WINDOWS = "holds", "videos", "rate_windows"
TASKS = (HOLDS, VIDEOS, RATE_WINDOWS)

_JOBS = VideoJob.__table__
_WINDOWS = RateWindow.__table__

_NOW = sa.bindparam("now", type_=UtcDateTime)
_PAST_RETENTION = sa.and_(_JOBS.c.status == jobs.COMPLETED, _JOBS.c.expires_at <= _NOW)
_ENDED_WINDOW = sa.or_(
    sa.and_(
        _WINDOWS.c.period == MINUTE,
        _WINDOWS.c.window_start < sa.bindparam("minutes_before", type_=UtcDateTime),
    ),
    sa.and_(
        _WINDOWS.c.period == DAY,
        _WINDOWS.c.window_start < sa.bindparam("days_before", type_=UtcDateTime),
    ),
)


def _batch(
    dialect: str, columns: tuple[sa.ColumnElement[Any], ...], where: sa.ColumnElement[bool]
) -> sa.Select[Any]:
    """Up to BATCH keys of rows matching `where`; on PostgreSQL those no other process has
    locked (and locked for this one), so concurrent runs split the work without waiting."""
    keys = sa.select(*columns).where(where).limit(BATCH)
    if dialect == "postgresql":
        keys = keys.with_for_update(skip_locked=True)
    return keys


def _statements(dialect: str) -> dict[str, Any]:
    # The outer WHERE repeats the condition: PostgreSQL re-checks it on a row changed since
    # the batch was read, so a row is only ever touched while it still qualifies.
    window_key = (_WINDOWS.c.subject_id, _WINDOWS.c.period, _WINDOWS.c.window_start)
    return {
        VIDEOS: sa.update(_JOBS)
        .where(_JOBS.c.id.in_(_batch(dialect, (_JOBS.c.id,), _PAST_RETENTION)), _PAST_RETENTION)
        .values(status=jobs.EXPIRED, updated_at=_NOW)
        .returning(_JOBS.c.id),
        RATE_WINDOWS: sa.delete(_WINDOWS).where(
            sa.tuple_(*window_key).in_(_batch(dialect, window_key, _ENDED_WINDOW)),
            _ENDED_WINDOW,
        ),
    }


_STATEMENTS = {dialect: _statements(dialect) for dialect in ("postgresql", "sqlite")}


class Maintenance:
    """The housekeeping of one server process: `run_once(now)` does every step once;
    `run(stop)` repeats it every `interval` seconds until `stop`."""

    def __init__(
        self,
        sessions: SessionFactory,
        clock: Clock,
        content: ContentStore,
        metrics: Metrics,
        *,
        interval: float = DEFAULT_INTERVAL_SECONDS,
    ) -> None:
        self._sessions = sessions
        self._clock = clock
        self._content = content
        self._metrics = metrics
        self._interval = interval
        self.wake = asyncio.Event()  # set to run before the interval is over

    async def run(self, stop: asyncio.Event) -> None:
        """Run every `interval` seconds until `stop`; the run in hand finishes first."""

        async def once() -> bool:
            await self.run_once(self._clock.now())
            return False  # then wait for the interval

        await run_until_stopped(once, stop, self.wake, self._interval, log)

    async def run_once(self, now: datetime) -> dict[str, int]:
        """Every step once, as of `now`: the rows each step changed. A failing step is
        logged and counted (gateway_maintenance_failures_total) and the others still run;
        the last-run timestamp is set only when all of them succeeded."""
        steps: dict[str, Callable[[datetime], Awaitable[int]]] = {
            HOLDS: self.sweep_holds,
            VIDEOS: self.expire_videos,
            RATE_WINDOWS: self.prune_rate_windows,
        }
        done: dict[str, int] = {}
        for task, step in steps.items():
            try:
                rows = await step(now)
            except Exception as exc:
                self._metrics.maintenance_failures.labels(task).inc()
                if is_database_unavailable(exc):
                    log.warning("maintenance step %s skipped: database unavailable", task)
                else:
                    log.exception("maintenance step %s failed", task)
                continue
            done[task] = rows
            if rows:
                log.info("maintenance: %s: %d rows", task, rows)
        if len(done) == len(steps):
            self._metrics.maintenance_last_run.set(now.timestamp())
        return done

    async def sweep_holds(self, now: datetime) -> int:
        """Delete credit holds past their expiry: billing's own sweep, one statement (only
        the holds of requests whose process died lapse: there are few)."""
        async with self._sessions() as session:
            rows = await sweep_expired_holds(session, now)
        self._count(HOLDS, rows)
        return rows

    async def prune_rate_windows(self, now: datetime) -> int:
        """Delete `:free` request windows that ended more than WINDOW_GRACE before `now`."""
        return await self._delete(
            RATE_WINDOWS,
            {
                "minutes_before": now - timedelta(minutes=1) - WINDOW_GRACE,
                "days_before": now - timedelta(days=1) - WINDOW_GRACE,
            },
        )

    async def expire_videos(self, now: datetime) -> int:
        """Completed jobs past their retention become `expired`; their content is deleted
        once that is committed (a crash in between leaves files behind, never a completed
        job without its content)."""
        total = 0
        while True:
            async with self._sessions() as session:
                statement = _STATEMENTS[_dialect(session)][VIDEOS]
                expired = list((await session.exec(statement, params={"now": now})).scalars())
                if expired:
                    await self._queue_expired_webhooks(session, expired, now)
                await session.commit()
            for job_id in expired:
                try:
                    await self._content.delete(job_id)
                except Exception:
                    # Object storage out of reach: this job's content stays behind (logged,
                    # counted); the other expired jobs' content is still deleted.
                    self._metrics.maintenance_failures.labels(VIDEOS).inc()
                    log.exception("video %s expired but its content was not deleted", job_id)
            self._count(VIDEOS, len(expired))
            total += len(expired)
            if len(expired) < BATCH:
                return total

    async def _queue_expired_webhooks(
        self, session: AsyncSession, job_ids: list[str], now: datetime
    ) -> None:
        """OpenRouter sends `video.generation.expired` too: queued with the expiry."""
        hooked = await session.exec(
            select(VideoJob).where(
                col(VideoJob.id).in_(job_ids), col(VideoJob.callback_url).is_not(None)
            )
        )
        for job in hooked.all():
            await jobs.queue_webhook(session, job, now)

    async def _delete(self, task: str, params: dict[str, Any]) -> int:
        """Run `task`'s DELETE batch by batch, each in its own transaction."""
        total = 0
        while True:
            async with self._sessions() as session:
                result = await session.exec(_STATEMENTS[_dialect(session)][task], params=params)
                await session.commit()
            rows = int(result.rowcount or 0)
            self._count(task, rows)
            total += rows
            if rows < BATCH:
                return total

    def _count(self, task: str, rows: int) -> None:
        if rows:
            self._metrics.maintenance_rows.labels(task).inc(rows)


def _dialect(session: AsyncSession) -> str:
    return session.get_bind().dialect.name
