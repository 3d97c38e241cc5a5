"""Group commit: many callers' writes committed in one transaction, each caller answered only
once that transaction has committed.

A caller hands the writer a *unit*: an async function of the batch's session that runs its
statements (through `server.db.driver`, one hand-off per statement) and returns a result.
The writer runs units in the order they were queued. Each time the previous commit ends, it
takes whatever is queued, runs every unit inside a savepoint of one transaction, and commits:
no fixed wait, so a lone request is not delayed, and under load one commit (one fsync, one
round trip) serves many requests.

- A unit that raises is rolled back to its savepoint and its caller gets the exception at
  once (nothing of it is written); the other units of the batch go on and commit.
- A failed commit (or a database that went away mid-batch) fails every caller whose unit was
  in the batch: nothing of the batch is written, and nobody was told otherwise.
- `run` returns only after the unit's batch has committed: what it wrote is durable.
- Units run one after another in the writer's transaction, so a unit sees every write of the
  units before it: a reservation that reads the budget in the statement that writes it (a
  credit hold) stays exact within a batch, and the batch's row locks (PostgreSQL) or write
  lock (SQLite) keep it exact against other processes until the commit.

A unit must only run statements: it holds the batch (and, on SQLite, the process's only
connection) while it runs. A caller cancelled while its unit waits in the queue withdraws
it (it never runs); once its batch has begun, the cancellation does not stop it: the unit
still commits with its batch (like a request whose client went away after its transaction
began to commit).

One writer per process, created with the engine and passed to whoever writes through it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from sqlmodel.ext.asyncio.session import AsyncSession

from server.db.driver import begin_batch, next_unit, rollback_unit
from server.db.engine import SessionFactory

T = TypeVar("T")
Unit = Callable[[AsyncSession], Awaitable[T]]

log = logging.getLogger(__name__)

# The most units one transaction takes; the rest wait for the next commit.
DEFAULT_MAX_BATCH = 256


@dataclass(eq=False)
class _Queued(Generic[T]):
    unit: Unit[T]
    future: asyncio.Future[T]
    result: Any = None
    error: BaseException | None = None


@dataclass
class WriterStats:
    """What the writer did, for tests and benchmarks."""

    batches: int = 0
    units: int = 0
    failed_units: int = 0
    failed_batches: int = 0
    largest_batch: int = 0
    sizes: list[int] = field(default_factory=list)  # the last batches' sizes (bounded)


class Writer:
    """The process's group-commit writer over `sessions` (see the module docstring)."""

    def __init__(self, sessions: SessionFactory, *, max_batch: int = DEFAULT_MAX_BATCH) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._sessions = sessions
        self._max_batch = max_batch
        self._queue: list[_Queued[Any]] = []
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.stats = WriterStats()

    async def run(self, unit: Unit[T]) -> T:
        """Run `unit` in the next batch; return its result once the batch has committed, or
        raise what the unit raised (it wrote nothing) or why the batch failed."""
        if self._closed:
            raise RuntimeError("the writer is closed")
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        queued = _Queued(unit, future)
        self._queue.append(queued)
        self._ready.set()
        if self._task is None or self._task.done():  # first use, or after a crash of its loop
            self._task = asyncio.create_task(self._loop(), name="group-commit writer")
        try:
            # Shielded: a cancelled caller must not cancel a unit that is part of a batch.
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            if any(q is queued for q in self._queue):  # not begun: withdrawn, never run
                self._queue.remove(queued)
                future.cancel()
            raise

    async def close(self) -> None:
        """Commit what is queued, then stop."""
        self._closed = True
        task, self._task = self._task, None
        if task is None:
            return
        self._ready.set()
        await task

    async def _loop(self) -> None:
        while True:
            if not self._queue:
                if self._closed:
                    return
                self._ready.clear()
                await self._ready.wait()
                continue
            batch = self._queue[: self._max_batch]
            del self._queue[: self._max_batch]
            try:
                await self._commit(batch)
            except asyncio.CancelledError:
                self._fail(batch, ConnectionError("the writer stopped before the commit"))
                self._fail(self._queue, ConnectionError("the writer stopped"))
                self._queue.clear()
                raise
            except Exception as error:  # the batch failed as a whole: nothing of it is written
                self.stats.failed_batches += 1
                log.warning("group commit of %d units failed: %r", len(batch), error)
                self._fail(batch, error)
            else:
                for queued in batch:
                    future = queued.future
                    if future.done():
                        continue
                    if queued.error is not None:
                        future.set_exception(queued.error)
                    else:
                        future.set_result(queued.result)

    async def _commit(self, batch: list[_Queued[Any]]) -> None:
        stats = self.stats
        stats.batches += 1
        stats.units += len(batch)
        stats.largest_batch = max(stats.largest_batch, len(batch))
        stats.sizes = [*stats.sizes[-99:], len(batch)]
        async with self._sessions() as session:
            if len(batch) == 1:
                # A lone unit needs no savepoint: its failure rolls the transaction back.
                queued = batch[0]
                try:
                    queued.result = await queued.unit(session)
                except Exception as error:
                    await session.rollback()
                    stats.failed_units += 1
                    queued.error = error
                    return
                await session.commit()
                return
            await begin_batch(session)
            for index, queued in enumerate(batch):
                await next_unit(session, index)
                try:
                    queued.result = await queued.unit(session)
                except Exception as error:
                    # Only this unit's writes go; a failed ROLLBACK TO fails the batch.
                    await rollback_unit(session, index)
                    stats.failed_units += 1
                    queued.error = error
                    # Answer at once: nothing of it will be written.
                    if not queued.future.done():
                        queued.future.set_exception(error)
            await session.commit()

    @staticmethod
    def _fail(batch: list[_Queued[Any]], error: BaseException) -> None:
        for queued in batch:
            if not queued.future.done():
                queued.future.set_exception(error)
