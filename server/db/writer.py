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
- On PostgreSQL (and a pooled SQLite) a savepoint costs a round trip, as much as a unit's
  own statement: a batch first runs with none (`_run_unguarded`). Should a unit raise, that
  transaction is rolled back whole and the batch runs again with a savepoint per unit, as
  above (and so do the next GUARDED_AFTER_FAILURE batches). A unit may so run more than
  once (as after a lock race): what it does outside the database (a metric it counts) goes
  through `on_outcome`, done once its outcome is final.
- A unit PostgreSQL picks as a deadlock's victim (two processes' batches locking an account
  and its counters in opposite orders) is rolled back to its savepoint and run again in the
  next batch, after this one committed and let the other side go on (LOCK_RACE_RETRIES).
- A failed commit (or a database that went away mid-batch) fails every caller whose unit was
  in the batch: nothing of the batch is written, and nobody was told otherwise.
- `run` returns only after the unit's batch has committed: what it wrote is durable.
- Units run one after another in the writer's transaction, so a unit sees every write of the
  units before it: a reservation that reads the budget in the statement that writes it (a
  credit hold) stays exact within a batch, and the batch's row locks (PostgreSQL) or write
  lock (SQLite) keep it exact against other processes until the commit.

On a SQLite file the writer has a sqlite3 connection of its own and the batch's statements
run on the event loop's thread (server/db/driver.py's InlineSqlite: SQLite's microseconds
instead of a hand-off to aiosqlite's thread per statement). A unit then gets a session that
carries that connection and has no other: every statement must go through the driver
(`fetch_rows`, `execute_many`); an ORM call (session.exec, get, add + flush) raises
`StrayStatement` rather than write outside the batch. PostgreSQL, and an in-memory SQLite
database (which only the pool's connection sees), batch on a pooled session's connection.

A unit must only run statements: it holds the batch (and its connection) while it runs.
A caller cancelled while its unit waits in the queue withdraws it (it never runs); once its
batch has begun, the cancellation does not stop it: the unit still commits with its batch
(like a request whose client went away after its transaction began to commit).

A unit is run by the writer's task (one per writer): the caller's task only queues it and
waits for its future, so the caller's cancellation (or a timeout scoped to the caller's task)
never reaches a batch under way. One exception saves the two turns of the loop that hand-off
costs a lone request (to the writer's task and back): on a SQLite file, when no other request
is in flight in the process (`alone`, from the request observer) and the writer is idle, the
caller's task runs its unit as a batch of one at once (`_lead`) — nothing could have joined
the batch, and the batch cannot wait: its BEGIN IMMEDIATE is taken only if it is free at once
(InlineSqlite.begin_at_once), and its statements and COMMIT run inline. Should the unit wait
on something all the same and its caller be cancelled meanwhile, it is rolled back and handed
to the writer's task to run again, as a begun unit whose caller left is.

One writer per process, created with the engine and passed to whoever writes through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, NoReturn, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlmodel.ext.asyncio.session import AsyncSession

from server.db.driver import (
    INLINE_SQLITE,
    InlineSqlite,
    begin_batch,
    begin_batch_at_once,
    commit_batch,
    next_unit,
    rollback_batch,
    rollback_unit,
)
from server.db.engine import SessionFactory, pool_writes, sqlite_file

T = TypeVar("T")
Unit = Callable[[AsyncSession], Awaitable[T]]

log = logging.getLogger(__name__)

# How often a unit that lost a lock race (a deadlock on PostgreSQL) is run again.
LOCK_RACE_RETRIES = 3
# PostgreSQL's deadlock_detected and serialization_failure.
_LOCK_RACES = frozenset({"40P01", "40001"})


def lost_a_lock_race(error: BaseException) -> bool:
    """Whether PostgreSQL rolled `error`'s transaction back to break a deadlock (or keep a
    snapshot serializable): nothing of it was written, and a later try can succeed."""
    # asyncpg's own exception (the driver path), or SQLAlchemy's wrapper of it.
    for candidate in (error, getattr(error, "orig", None), error.__cause__):
        code = getattr(candidate, "sqlstate", None) or getattr(candidate, "pgcode", None)
        if code in _LOCK_RACES:
            return True
    return False


# How many of the last batches' sizes WriterStats keeps.
SIZES_KEPT = 100
# The most units one transaction takes; the rest wait for the next commit.
DEFAULT_MAX_BATCH = 256
# After a batch had to be run again (a unit failed with no savepoint to roll back to), this
# many batches run a savepoint per unit from the start: a run of refusals (a key at its
# cap) does not run every batch twice.
GUARDED_AFTER_FAILURE = 16


# session.info key of the unit running in the batch's session: what it asked to do once its
# outcome is final (on_outcome).
_UNIT_ACTIONS = "gateway.unit_actions"


def on_outcome(session: AsyncSession, action: Callable[[], None]) -> None:
    """Do `action` (count a metric, say) once the outcome of the work it belongs to is final.
    In a unit of the writer's batch: once the batch committed, or once the unit's failure is
    given to its caller; a run of the unit that is thrown away (rolled back to run again,
    after a lost lock race or in a batch run again) drops it, so a unit run twice does it
    once. Outside the writer: at once."""
    actions: list[Callable[[], None]] | None = session.info.get(_UNIT_ACTIONS)
    if actions is None:
        action()
    else:
        actions.append(action)


async def _run_unit(session: AsyncSession, queued: _Queued[Any]) -> None:
    queued.actions = []
    session.info[_UNIT_ACTIONS] = queued.actions
    try:
        queued.result = await queued.unit(session)
    finally:
        del session.info[_UNIT_ACTIONS]


def _act(queued: _Queued[Any]) -> None:
    """Do what the unit's kept run asked (on_outcome), once."""
    actions, queued.actions = queued.actions, []
    for action in actions:
        try:
            action()
        except Exception:  # a metric that failed must not fail a committed unit
            log.exception("an action after a group commit failed")


class StrayStatement(RuntimeError):
    """A writer unit ran a statement outside the driver (an ORM call) on SQLite, where the
    batch's connection is the writer's own: it would have run outside the batch."""


async def _refuse_connection() -> NoReturn:
    raise StrayStatement(
        "a group-commit writer unit may run statements only through server.db.driver "
        "(fetch_rows, execute_many): this one would run outside the batch's transaction"
    )


@dataclass(eq=False)
class _Queued(Generic[T]):
    unit: Unit[T]
    future: asyncio.Future[T]  # what the caller awaits (its cancellation may cancel it)
    result: Any = None
    error: BaseException | None = None
    attempts: int = 0  # runs that lost a lock race and were rolled back (retried later)
    retry: bool = False  # lost one in the current batch: runs again in the next
    # What the unit's current run asked to do once its outcome is final (`on_outcome`).
    actions: list[Callable[[], None]] = field(default_factory=list)
    # The answer given (`answer`): (None, result) or (the failure, None).
    answered: tuple[BaseException | None, Any] | None = None
    # A `run(finish_within=...)` caller cancelled before the answer waits on this instead.
    outcome: asyncio.Future[T] | None = None
    # Begun in its caller's task (`Writer._lead`), then handed to the writer's task: a
    # cancelled caller does not withdraw it.
    begun: bool = False

    def answer(self, error: BaseException | None = None) -> None:
        """Give the caller the unit's outcome: `error`, else its result."""
        self.answered = (error, None if error is not None else self.result)
        for waiter in (self.future, self.outcome):
            if waiter is None or waiter.done():
                continue
            if error is None:
                waiter.set_result(self.result)
            else:
                waiter.set_exception(error)


def _expire(queue: list[_Queued[Any]], queued: _Queued[Any]) -> None:
    """`run(finish_within=...)`'s bound passed: a unit still queued is withdrawn (it never
    runs); a begun one still commits with its batch, but its caller stops waiting."""
    if any(q is queued for q in queue):
        queue.remove(queued)
    if queued.answered is None:
        queued.answer(TimeoutError("the group commit did not end in time"))


@dataclass
class WriterStats:
    """What the writer did, for tests and benchmarks."""

    batches: int = 0
    units: int = 0
    failed_units: int = 0
    failed_batches: int = 0
    largest_batch: int = 0
    led: int = 0  # lone units run in their caller's task (Writer._lead)
    lock_race_retries: int = 0  # units run again after losing a deadlock (PostgreSQL)
    unguarded_reruns: int = 0  # batches run again with savepoints after a unit failed
    # The last batches' sizes (the last SIZES_KEPT).
    sizes: deque[int] = field(default_factory=lambda: deque(maxlen=SIZES_KEPT))


async def wait_uncancelled(future: asyncio.Future[T]) -> T:
    """Await `future` to its end through the caller's cancellations (one or more), then
    re-raise the cancellation, chained (`__cause__`) from the future's failure if it failed;
    never cancelled: its result, or what it raised. The future itself cancelled (the loop
    shutting down): CancelledError at once."""
    cancelled = False
    while not future.done():
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            if future.cancelled():
                raise
            cancelled = True
        except Exception:  # the future's failure: raised below
            pass
    if cancelled:
        error = future.exception()
        if error is not None:
            raise asyncio.CancelledError from error
        raise asyncio.CancelledError
    return future.result()


async def _answer_of(queued: _Queued[Any]) -> BaseException | None:
    """For a `run(finish_within=...)` caller cancelled while it waited: wait for the unit's
    answer (through further cancellations; the bound still ends the wait), and return its
    failure, if it failed."""
    if queued.answered is None:  # not yet: the writer answers `outcome` too
        outcome = queued.outcome = asyncio.get_running_loop().create_future()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await wait_uncancelled(outcome)
    assert queued.answered is not None  # answered, or the bound passed (_expire)
    return queued.answered[0]


class Writer:
    """The process's group-commit writer over `sessions` (see the module docstring)."""

    def __init__(
        self,
        sessions: SessionFactory,
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        inline_sqlite: bool = True,
        alone: Callable[[], bool] | None = None,
    ) -> None:
        """`inline_sqlite`: on a SQLite file, run batches on a connection of the writer's own
        on the loop's thread (the module docstring); off, through the pool's as PostgreSQL.
        `alone`: whether no other request than the caller's is in flight in the process
        (RequestsInFlight.alone): a lone unit then runs in its caller's task (`_lead`).
        Without it every unit goes to the writer's task."""
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._sessions = sessions
        self._max_batch = max_batch
        self.inline: InlineSqlite | None = None
        # What a unit's session is bound to in inline mode: the database's dialect, and a
        # pool that refuses to connect (a stray ORM call fails instead of using the pool).
        self._no_pool: AsyncEngine | None = None
        self._inline_session: AsyncSession | None = None  # the inline batches' (see below)
        engine = getattr(sessions, "kw", {}).get("bind")
        # The engine its sessions are bound to (None: a factory of another kind).
        self.engine: AsyncEngine | None = engine if isinstance(engine, AsyncEngine) else None
        path = sqlite_file(engine) if isinstance(engine, AsyncEngine) and inline_sqlite else None
        if engine is not None and path is not None:
            self.inline = InlineSqlite(path, engine.dialect, pool=pool_writes(engine))
            self._no_pool = create_async_engine(engine.url, async_creator=_refuse_connection)
        self._alone = alone
        self._queue: list[_Queued[Any]] = []
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._busy = False  # the writer's task is running a batch
        self._closed = False
        # Batches left to run a savepoint per unit at once (see _run_unguarded).
        self._guarded_batches = 0
        self.stats = WriterStats()

    async def run(self, unit: Unit[T], *, finish_within: float | None = None) -> T:
        """Run `unit` in the next batch; return its result once the batch has committed, or
        raise what the unit raised (it wrote nothing) or why the batch failed.

        A caller cancelled meanwhile gets CancelledError at once: its unit, if still queued,
        is withdrawn (it never runs); once begun, it commits with its batch. With
        `finish_within` (seconds), the cancellation (one or more) neither withdraws the unit
        nor cuts the wait short: run waits for the unit's batch to end, then raises
        CancelledError, chained (`__cause__`) from the unit's or the batch's failure if it
        failed — billing.holds.finish_uncancelled's contract, without a task of its own. The
        wait is bounded: past `finish_within` it raises TimeoutError (chained likewise when
        cancelled), withdrawing the unit if it is still queued."""
        if self._closed:
            raise RuntimeError("the writer is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        queued = _Queued(unit, future)
        if finish_within is None:
            try:
                if not await self._lead(queued):
                    self._queue.append(queued)
                    self._wake_loop()
                # Not shielded: cancelling the future only drops the answer (the writer skips
                # a done future), never the unit of a batch that has begun.
                return await future
            except asyncio.CancelledError:
                # Nobody awaits the caller's future now (cancelled while led, it was not
                # awaited yet): dropped, so that a later failure is not left unretrieved.
                future.cancel()
                if not queued.begun and any(q is queued for q in self._queue):
                    self._queue.remove(queued)  # not begun: withdrawn, never run
                raise
        # The bound counts from here; its timer is set only once the unit may wait (queued,
        # handed on, or led and cancelled mid-unit): a lone unit led to its end needs none.
        deadline = loop.time() + finish_within
        expiry: asyncio.TimerHandle | None = None
        try:
            try:
                led = await self._lead(queued)
            except asyncio.CancelledError:
                expiry = loop.call_at(deadline, _expire, self._queue, queued)
                raise
            if not future.done():  # queued now, or led and handed on to run again
                expiry = loop.call_at(deadline, _expire, self._queue, queued)
            if not led:
                self._queue.append(queued)
                self._wake_loop()
            # Awaited directly, not through wait_uncancelled's shield: the answer reaches the
            # caller one turn of the loop sooner. A cancellation cancels this future, not the
            # unit (the writer answers a unit whatever became of its future).
            return await future
        except asyncio.CancelledError:
            future.cancel()  # (as above: the answer comes through `outcome` now)
            error = await _answer_of(queued)
            raise asyncio.CancelledError from error
        finally:
            if expiry is not None:
                expiry.cancel()

    async def _lead(self, queued: _Queued[Any]) -> bool:
        """Run a lone request's unit in its caller's task, as a batch of one, when nothing
        could join it (the module docstring); True once it is answered (or handed on, see
        below). False: it was not run (another request is in flight, the writer is busy or
        has units queued, or the batch could not begin at once): the caller queues it."""
        if (
            self._alone is None
            or self.inline is None
            or self._busy
            or self._queue
            or not self._alone()
        ):
            return False
        session = self._inline_batch_session()
        if not begin_batch_at_once(session):
            return False
        self._busy = True
        try:
            self._count([queued])
            self.stats.led += 1
            queued.begun = True
            try:
                await self._commit_lone(session, queued)
            except asyncio.CancelledError:
                # It waited on something after all, and its caller left meanwhile: nothing
                # of this run is kept; the writer's task runs it again, as a begun unit.
                queued.actions = []
                self._queue.insert(0, queued)
                raise
            except Exception as error:
                self._batch_failed([queued], error)
            else:
                self._answer([queued])
            return True
        finally:
            await self._end_inline_batch(session)
            self._busy = False
            if self._queue:  # queued meanwhile, or handed on: the writer's task takes them
                self._wake_loop()

    async def close(self) -> None:
        """Commit what is queued, then stop."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            self._ready.set()
            await task
        if self.inline is not None:
            await self.inline.close()
        if self._inline_session is not None:
            await self._inline_session.close()
        if self._no_pool is not None:
            await self._no_pool.dispose()

    async def _loop(self) -> None:
        while True:
            if not self._queue or self._busy:
                if self._closed and not self._queue:
                    return
                self._ready.clear()
                await self._ready.wait()
                continue
            batch = self._queue[: self._max_batch]
            del self._queue[: self._max_batch]
            await self._batch(batch)

    async def _batch(self, batch: list[_Queued[Any]]) -> None:
        """Commit `batch` and answer its callers; units queued meanwhile wait for its end."""
        self._busy = True
        try:
            try:
                await self._commit(batch)
            except asyncio.CancelledError:
                self._fail(batch, ConnectionError("the writer stopped before the commit"))
                self._fail(self._queue, ConnectionError("the writer stopped"))
                self._queue.clear()
                raise
            except Exception as error:
                self._batch_failed(batch, error)
            else:
                self._answer(batch)
        finally:
            self._busy = False
            if self._queue:  # queued meanwhile (or to retry): the writer's task takes them
                self._wake_loop()

    def _batch_failed(self, batch: list[_Queued[Any]], error: Exception) -> None:
        """The batch failed as a whole: nothing of it is written; its callers get `error`."""
        self.stats.failed_batches += 1
        log.warning("group commit of %d units failed: %r", len(batch), error)
        self._fail(batch, error)

    def _answer(self, batch: list[_Queued[Any]]) -> None:
        """The batch committed: each caller gets its unit's outcome, but units that lost a
        lock race, which go first in the queue to run again."""
        retries = [queued for queued in batch if queued.retry]
        for queued in retries:
            queued.retry = False
        # The batch that held the other side of the race has committed by now.
        self._queue[:0] = retries
        for queued in batch:
            if queued.answered is not None or queued in retries:
                continue
            queued.answer(queued.error)

    def _wake_loop(self) -> None:
        """Have the writer's task take what is queued: woken, or started (first use, or
        after its loop crashed)."""
        self._ready.set()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._loop(), name="group-commit writer")

    def _count(self, batch: list[_Queued[Any]]) -> None:
        stats = self.stats
        stats.batches += 1
        stats.units += len(batch)
        stats.largest_batch = max(stats.largest_batch, len(batch))
        stats.sizes.append(len(batch))

    async def _commit(self, batch: list[_Queued[Any]]) -> None:
        self._count(batch)
        async with self._batch_session() as session:
            if len(batch) == 1:
                # A lone unit needs no savepoint: its failure rolls the transaction back.
                if self.inline is not None:  # autocommit connection: begin explicitly
                    await begin_batch(session)
                await self._commit_lone(session, batch[0])
                return
            await begin_batch(session)
            if self.inline is None:
                if self._guarded_batches:
                    self._guarded_batches -= 1
                elif await self._run_unguarded(session, batch):
                    return
                else:  # nothing of the batch was written: again, a savepoint per unit
                    await begin_batch(session)
            for index, queued in enumerate(batch):
                await next_unit(session, index)
                try:
                    await _run_unit(session, queued)
                except Exception as error:
                    # Only this unit's writes go; a failed ROLLBACK TO fails the batch.
                    await rollback_unit(session, index)
                    if self._failed(queued, error) and queued.answered is None:
                        # Answer at once: nothing of it will be written.
                        queued.answer(error)
            await commit_batch(session)
            for queued in batch:  # a failed unit acted already, a retried one has nothing
                _act(queued)

    async def _commit_lone(self, session: AsyncSession, queued: _Queued[Any]) -> None:
        """A batch of one unit, its transaction begun: no savepoint (the unit's failure
        rolls the transaction back), then the commit."""
        try:
            await _run_unit(session, queued)
        except Exception as error:
            await rollback_batch(session)
            self._failed(queued, error)
            return
        await commit_batch(session)
        _act(queued)

    async def _run_unguarded(self, session: AsyncSession, batch: list[_Queued[Any]]) -> bool:
        """Run the batch's units with no savepoint between them, and commit: on PostgreSQL
        a savepoint is a round trip per unit, as many as the units' own statements. True:
        committed. False: a unit raised — which, with no savepoint to roll back to, takes the
        transaction with it: it is rolled back whole (nothing of the batch written, no caller
        answered) for the caller to run the batch again, a savepoint per unit, where that
        unit fails alone; the next GUARDED_AFTER_FAILURE batches take savepoints at once."""
        for queued in batch:
            try:
                await _run_unit(session, queued)
            except Exception:
                await rollback_batch(session)
                for dropped in batch:  # these runs are thrown away, and what they asked
                    dropped.actions = []
                self.stats.unguarded_reruns += 1
                self._guarded_batches = GUARDED_AFTER_FAILURE
                return False
        await commit_batch(session)
        for queued in batch:
            _act(queued)
        return True

    def _failed(self, queued: _Queued[Any], error: Exception) -> bool:
        """A unit raised (and was rolled back): True when that is its outcome — its actions
        run, its caller gets `error`; False when it runs again in the next batch (a lost
        lock race): this run's actions are dropped."""
        if self._retry_later(queued, error):
            queued.actions = []
            return False
        self.stats.failed_units += 1
        queued.error = error
        _act(queued)
        return True

    @contextlib.asynccontextmanager
    async def _batch_session(self) -> AsyncIterator[AsyncSession]:
        inline = self.inline
        if inline is None:
            async with self._sessions() as session:
                yield session
            return
        # Between batches, so that the checkpoint is not racing the batch's writes.
        await inline.checkpoint_if_due()
        session = self._inline_batch_session()
        try:
            yield session
        finally:
            await self._end_inline_batch(session)

    async def _end_inline_batch(self, session: AsyncSession) -> None:
        """After an inline batch: one that failed (or was cancelled) before its COMMIT
        writes nothing."""
        assert self.inline is not None
        self.inline.rollback()
        if session.in_transaction():  # a stray ORM call began one (it failed): drop it
            await session.rollback()

    def _inline_batch_session(self) -> AsyncSession:
        """The session of every inline batch: it only carries the connection to the driver
        functions (its pool refuses to connect, so it never holds a connection, a
        transaction or an object); building one per batch would cost CPU for nothing."""
        if self._inline_session is None:
            self._inline_session = AsyncSession(bind=self._no_pool, expire_on_commit=False)
            self._inline_session.info[INLINE_SQLITE] = self.inline
        return self._inline_session

    def _retry_later(self, queued: _Queued[Any], error: BaseException) -> bool:
        """Whether the unit, rolled back, runs again in the next batch: PostgreSQL chose it
        to break a deadlock (another process's batch locked an account and wants a counter
        row this batch updated, or the other way round), or failed it to keep a snapshot
        serializable. Nothing of it was written, and once this batch commits the other side
        can go on, so a later try succeeds; its caller never sees the race."""
        if queued.attempts >= LOCK_RACE_RETRIES or not lost_a_lock_race(error):
            return False
        queued.attempts += 1
        queued.retry = True
        self.stats.lock_race_retries += 1
        return True

    @staticmethod
    def _fail(batch: list[_Queued[Any]], error: BaseException) -> None:
        for queued in batch:
            if queued.answered is None:
                queued.answer(error)
