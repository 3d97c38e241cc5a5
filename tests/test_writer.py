"""The group-commit writer (server/db/writer.py) on a real SQLite file and PostgreSQL: it
batches what is queued while a commit runs, answers a caller only after its batch committed,
isolates one caller's failure from the others of its batch, and runs units in queue order."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import sqlalchemy as sa
from sqlmodel.ext.asyncio.session import AsyncSession

from server.billing.holds import Hold, place_hold
from server.db import driver as driver_module
from server.db import writer as writer_module
from server.db.driver import InlineStats, fetch_rows, insert_statement
from server.db.engine import connect_sqlite, create_engine, session_factory
from server.db.models import CreditHold, RateWindow
from server.db.writer import GUARDED_AFTER_FAILURE, StrayStatement, Writer, on_outcome
from server.errors import GatewayError
from testkit.admin import Admin
from tests.conftest import Databases

_WINDOWS = RateWindow.__table__  # type: ignore[attr-defined]
_INSERT = sa.insert(_WINDOWS)
_INSERT_HOLD = insert_statement(CreditHold.__table__)  # type: ignore[attr-defined]
_COUNT_ALL = sa.select(sa.func.count()).select_from(_WINDOWS)
Peek = Callable[[], Awaitable[set[str]]]
WHEN = datetime(2026, 7, 1, 12, 30, tzinfo=UTC)


def _row(who: str, count: int = 1) -> dict[str, object]:
    return {"subject_id": who, "period": "minute", "window_start": WHEN, "count": count}


@pytest_asyncio.fixture
async def peek(db_url: str) -> AsyncIterator[Callable[[], Awaitable[set[str]]]]:
    """What is committed, read on an engine of its own (SQLite's writer holds the other's
    only connection while a batch runs)."""
    engine = create_engine(db_url)

    async def stored() -> set[str]:
        async with engine.connect() as connection:
            rows = await connection.execute(sa.select(_WINDOWS.c.subject_id))
            return {r[0] for r in rows}

    yield stored
    await engine.dispose()


def _insert(who: str) -> object:
    async def unit(session: AsyncSession) -> str:
        await fetch_rows(session, _INSERT, _row(who))
        return who

    return unit


class Gate:
    """A unit that holds its batch open until released: what is queued meanwhile waits
    behind it, then shares the next batch. With `writes`, it first writes that row (so
    the running batch holds SQLite's write lock) and returns it."""

    def __init__(self, writes: str | None = None) -> None:
        self.writes = writes
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def unit(self, session: AsyncSession) -> str | None:
        if self.writes is not None:
            await fetch_rows(session, _INSERT, _row(self.writes))
        self.started.set()
        await self.release.wait()
        return self.writes


async def _hold(writer: Writer, writes: str | None = None) -> tuple[Gate, asyncio.Task[str | None]]:
    """A Gate run on `writer`, once its unit runs (its batch is open)."""
    gate = Gate(writes)
    task = asyncio.create_task(writer.run(gate.unit))
    await gate.started.wait()
    return gate, task


async def _in_one_batch(writer: Writer, units: Sequence[Any]) -> list[Any]:
    """`units` queued while a Gate holds `writer`'s batch, so that they run together in the
    next one: their results (or what they raised), in order."""
    gate, gate_task = await _hold(writer)
    tasks = [asyncio.create_task(writer.run(unit)) for unit in units]
    await asyncio.sleep(0)
    gate.release.set()
    await gate_task
    return await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_lone_unit_commits_in_a_batch_of_its_own(admin_db: Admin, peek: Peek) -> None:
    writer = Writer(admin_db.sessions)
    try:
        assert await writer.run(_insert("alone")) == "alone"  # type: ignore[arg-type]
        # Committed before run() returned: another session sees it.
        assert await peek() == {"alone"}
        assert list(writer.stats.sizes) == [1]
    finally:
        await writer.close()


async def test_what_queues_during_a_commit_shares_the_next_one(admin_db: Admin, peek: Peek) -> None:
    writer = Writer(admin_db.sessions)
    try:
        gate, first = await _hold(writer, writes="first")
        rest = [asyncio.create_task(writer.run(_insert(f"w{i}"))) for i in range(20)]  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
        assert not any(t.done() for t in rest)  # queued behind the running batch
        assert await peek() == set()  # nothing committed yet
        gate.release.set()
        assert await first == "first"
        assert await asyncio.gather(*rest) == [f"w{i}" for i in range(20)]
        # Twenty callers, one commit: each answered after it.
        assert list(writer.stats.sizes) == [1, 20]
        assert await peek() == {"first", *(f"w{i}" for i in range(20))}
    finally:
        await writer.close()


@pytest.mark.parametrize("failure", ["python", "database"])
async def test_one_failing_unit_fails_alone_and_writes_nothing(
    admin_db: Admin, peek: Peek, failure: str
) -> None:
    writer = Writer(admin_db.sessions)

    async def failing(session: AsyncSession) -> None:
        await fetch_rows(session, _INSERT, _row("bad-1"))  # written, then undone
        if failure == "python":
            raise ValueError("refused")
        await fetch_rows(session, _INSERT, _row("ok-0"))  # a duplicate key: a database error

    try:
        results = await _in_one_batch(writer, [_insert("ok-0"), failing, _insert("ok-2")])
        assert results[0] == "ok-0" and results[2] == "ok-2"
        if failure == "python":
            assert isinstance(results[1], ValueError)
        else:
            assert isinstance(results[1], Exception) and not isinstance(results[1], ValueError)
        assert list(writer.stats.sizes) == [1, 3] and writer.stats.failed_units == 1
        assert await peek() == {"ok-0", "ok-2"}  # nothing of the failed unit
    finally:
        await writer.close()


async def test_what_a_unit_does_after_its_outcome_is_done_once(admin_db: Admin) -> None:
    """on_outcome: a unit's action (a metric) is done once its outcome is final — after the
    commit, or with its failure — however many times the unit ran (on PostgreSQL the batch
    first runs with no savepoint, and runs again when a unit fails); outside the writer, at
    once."""
    writer = Writer(admin_db.sessions)
    done: list[str] = []

    def unit(who: str, fails: bool = False) -> Callable[[AsyncSession], Awaitable[str]]:
        async def run(session: AsyncSession) -> str:
            await fetch_rows(session, _INSERT, _row(who))
            on_outcome(session, lambda: done.append(who))
            if fails:
                raise ValueError("refused")
            return who

        return run

    try:
        results = await _in_one_batch(writer, [unit("a"), unit("b", fails=True), unit("c")])
        assert results[0] == "a" and isinstance(results[1], ValueError) and results[2] == "c"
        assert sorted(done) == ["a", "b", "c"]
        assert await writer.run(unit("d")) == "d"  # type: ignore[arg-type]
        assert sorted(done) == ["a", "b", "c", "d"]
        async with admin_db.sessions() as session:
            on_outcome(session, lambda: done.append("now"))
            assert done[-1] == "now"
    finally:
        await writer.close()


async def test_a_failed_commit_fails_every_caller_of_the_batch(admin_db: Admin, peek: Peek) -> None:
    commits = 0

    @contextlib.asynccontextmanager
    async def sessions() -> AsyncIterator[AsyncSession]:
        async with admin_db.sessions() as session:
            nonlocal commits
            commits += 1
            if commits == 2:  # the second batch's commit fails (the database went away)

                async def lost() -> None:
                    raise ConnectionError("the database connection was lost")

                session.commit = lost  # type: ignore[method-assign]
            yield session

    writer = Writer(sessions)  # type: ignore[arg-type]
    try:
        results = await _in_one_batch(writer, [_insert(f"f{i}") for i in range(3)])
        assert all(isinstance(r, ConnectionError) for r in results)
        assert await peek() == set()  # nobody was told it was written; nor was it
        # The writer goes on after a failed batch.
        assert await writer.run(_insert("after")) == "after"  # type: ignore[arg-type]
        assert await peek() == {"after"}
        assert writer.stats.failed_batches == 1
    finally:
        await writer.close()


async def test_units_run_in_queue_order_and_see_the_writes_before_them(admin_db: Admin) -> None:
    writer = Writer(admin_db.sessions)

    def counting(who: str) -> object:
        async def unit(session: AsyncSession) -> int:
            before = (await fetch_rows(session, _COUNT_ALL, {}))[0][0]
            await fetch_rows(session, _INSERT, _row(who))
            return int(before)

        return unit

    try:
        counts = await asyncio.gather(*(writer.run(counting(f"o{i}")) for i in range(30)))  # type: ignore[arg-type]
        assert counts == list(range(30))
        assert sum(writer.stats.sizes) == 30
    finally:
        await writer.close()


async def test_close_commits_what_is_queued_then_refuses(admin_db: Admin) -> None:
    writer = Writer(admin_db.sessions)
    tasks = [asyncio.create_task(writer.run(_insert(f"c{i}"))) for i in range(5)]  # type: ignore[arg-type]
    await asyncio.sleep(0)
    await writer.close()
    assert await asyncio.gather(*tasks) == [f"c{i}" for i in range(5)]
    with pytest.raises(RuntimeError):
        await writer.run(_insert("late"))  # type: ignore[arg-type]


async def test_holds_in_one_batch_stay_exact(admin_db: Admin) -> None:
    """Units reserving from one balance in one batch: each reads the holds of the units
    before it (the account is locked once per batch), so exactly as many as fit are held;
    the refused ones (402) write nothing and do not disturb the others."""
    workspace = await admin_db.workspace("batch")
    await admin_db.credits(workspace, "0.05")  # room for 5 holds of 0.01
    issued = await admin_db.key(workspace)
    now = datetime.now(UTC)
    writer = Writer(admin_db.sessions)

    def reserve(session: AsyncSession) -> Awaitable[Hold]:
        return place_hold(
            session,
            account_id=workspace.account_id,
            key_hash=issued.hash,
            amount_micros=10_000,
            now=now,
        )

    try:
        results = await _in_one_batch(writer, [reserve] * 12)
        held = [r for r in results if isinstance(r, Hold)]
        refused = [r for r in results if isinstance(r, GatewayError)]
        assert len(held) == 5 and len(refused) == 7
        assert all(r.status == 402 for r in refused)
        assert list(writer.stats.sizes) == [1, 12]
        count = await admin_db.count(
            CreditHold,
            CreditHold.account_id == workspace.account_id,  # type: ignore[arg-type]
        )
        assert count == 5
    finally:
        await writer.close()


async def test_a_caller_cancelled_while_queued_withdraws_its_unit(
    admin_db: Admin, peek: Peek
) -> None:
    writer = Writer(admin_db.sessions)
    try:
        gate, gate_task = await _hold(writer)
        kept = asyncio.create_task(writer.run(_insert("kept")))  # type: ignore[arg-type]
        gone = asyncio.create_task(writer.run(_insert("gone")))  # type: ignore[arg-type]
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.sleep(0)
        gate.release.set()
        await gate_task
        assert await kept == "kept"
        assert gone.cancelled()
        assert await peek() == {"kept"}  # the withdrawn unit never ran
        assert list(writer.stats.sizes) == [1, 1]
    finally:
        await writer.close()


async def test_failures_anywhere_in_a_batch_undo_only_their_own_unit(
    admin_db: Admin, peek: Peek
) -> None:
    """Failing units first, in a row and last in a batch: each rolls back to its own
    savepoint (one open at a time), and every other unit's writes commit."""
    writer = Writer(admin_db.sessions)

    def failing(who: str) -> Callable[[AsyncSession], Awaitable[None]]:
        async def unit(session: AsyncSession) -> None:
            await fetch_rows(session, _INSERT, _row(who))  # written, then undone
            raise ValueError("refused")

        return unit

    plan = ["bad-0", "ok-1", "bad-2", "bad-3", "ok-4", "ok-5", "bad-6"]
    try:
        results = await _in_one_batch(
            writer, [failing(who) if who.startswith("bad") else _insert(who) for who in plan]
        )
        for who, result in zip(plan, results, strict=True):
            assert isinstance(result, ValueError) if who.startswith("bad") else result == who
        assert list(writer.stats.sizes) == [1, len(plan)]
        assert await peek() == {"ok-1", "ok-4", "ok-5"}
    finally:
        await writer.close()


async def test_a_caller_cancelled_with_finish_within_still_waits_for_its_commit(
    admin_db: Admin, peek: Peek
) -> None:
    """With finish_within, cancellations (a deadline, then a client cancel) neither withdraw
    a queued unit nor cut the wait short: the caller gets CancelledError once its unit has
    committed (no __cause__), or chained from the unit's failure."""
    writer = Writer(admin_db.sessions)

    async def refused(session: AsyncSession) -> None:
        raise GatewayError(402, "refused")

    try:
        gate, gate_task = await _hold(writer)
        kept = asyncio.create_task(writer.run(_insert("kept"), finish_within=30))  # type: ignore[arg-type]
        failed = asyncio.create_task(writer.run(refused, finish_within=30))
        await asyncio.sleep(0)
        for _ in range(2):
            kept.cancel()
            failed.cancel()
            await asyncio.sleep(0.01)
        assert not kept.done() and not failed.done()  # still waiting for their batch
        gate.release.set()
        await gate_task
        with pytest.raises(asyncio.CancelledError) as committed:
            await kept
        assert committed.value.__cause__ is None
        with pytest.raises(asyncio.CancelledError) as refusal:
            await failed
        assert isinstance(refusal.value.__cause__, GatewayError)
        assert await peek() == {"kept"}  # not withdrawn: it ran and committed
        # Not cancelled: the result, or the failure, as without finish_within.
        assert await writer.run(_insert("again"), finish_within=30) == "again"  # type: ignore[arg-type]
        with pytest.raises(GatewayError):
            await writer.run(refused, finish_within=30)
    finally:
        await writer.close()


async def test_a_caller_cancelled_as_its_answer_comes_gets_the_cancellation_chained_to_it(
    admin_db: Admin, peek: Peek
) -> None:
    """With finish_within, a cancellation that reaches the caller after the writer answered
    but before the caller woke: CancelledError chained from the unit's failure (or with no
    cause once committed), and the failure is not left to asyncio as never retrieved."""
    writer = Writer(admin_db.sessions)
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: unhandled.append(context))
    callers: list[asyncio.Task[Any]] = []

    def cancelled_after(unit: Callable[[AsyncSession], Awaitable[Any]]) -> Any:
        async def run(session: AsyncSession) -> Any:
            # Once the outcome is final, before the answer: queued ahead of the caller's
            # wake-up, so the cancellation arrives with the answer already given.
            on_outcome(session, lambda: loop.call_soon(callers[-1].cancel))
            return await unit(session)

        return run

    async def refused(session: AsyncSession) -> None:
        raise GatewayError(402, "refused")

    try:
        for unit, cause in ((refused, GatewayError), (_insert("kept"), type(None))):
            callers.append(asyncio.create_task(writer.run(cancelled_after(unit), finish_within=30)))
            with pytest.raises(asyncio.CancelledError) as raised:
                await callers[-1]
            assert isinstance(raised.value.__cause__, cause)
        assert await peek() == {"kept"}
        del callers[:], raised
        gc.collect()
        assert unhandled == []
    finally:
        loop.set_exception_handler(None)
        await writer.close()


async def test_finish_within_bounds_the_wait_and_withdraws_a_queued_unit(
    admin_db: Admin, peek: Peek
) -> None:
    writer = Writer(admin_db.sessions)
    try:
        gate, gate_task = await _hold(writer)
        late = asyncio.create_task(writer.run(_insert("late"), finish_within=0.05))  # type: ignore[arg-type]
        cancelled = asyncio.create_task(writer.run(_insert("gone"), finish_within=0.05))  # type: ignore[arg-type]
        await asyncio.sleep(0)
        cancelled.cancel()
        with pytest.raises(TimeoutError):
            await late
        with pytest.raises(asyncio.CancelledError) as timed_out:
            await cancelled
        assert isinstance(timed_out.value.__cause__, TimeoutError)
        gate.release.set()
        await gate_task
        assert await writer.run(_insert("next")) == "next"  # type: ignore[arg-type]
        assert await peek() == {"next"}  # the expired units were withdrawn: never ran
    finally:
        await writer.close()


# --- SQLite: the writer's own connection, on the event loop's thread -------------------------


@pytest_asyncio.fixture
async def sqlite_db(databases: Databases) -> AsyncIterator[Admin]:
    engine = create_engine(await databases.new("sqlite"))
    yield Admin(session_factory(engine))
    await engine.dispose()


async def _stored(admin: Admin) -> set[str]:
    async with admin.sessions() as session:
        rows = await fetch_rows(session, sa.select(_WINDOWS.c.subject_id), {})
    return {r[0] for r in rows}


async def test_sqlite_units_run_on_the_writers_connection_not_the_pools(
    sqlite_db: Admin,
) -> None:
    """The pool's only connection is held by a session for the whole batch: the batch does
    not need it (it would wait for it forever otherwise)."""
    writer = Writer(sqlite_db.sessions)
    assert writer.inline is not None
    try:
        async with sqlite_db.sessions() as holder:
            await holder.connection()  # the pool's one connection, checked out
            results = await asyncio.wait_for(
                asyncio.gather(*(writer.run(_insert(f"i{i}")) for i in range(5))),  # type: ignore[arg-type]
                timeout=5,
            )
        assert results == [f"i{i}" for i in range(5)]
        assert await _stored(sqlite_db) == {f"i{i}" for i in range(5)}
    finally:
        await writer.close()


async def test_sqlite_a_stray_orm_call_in_a_unit_fails_loudly(sqlite_db: Admin) -> None:
    """A unit's ORM statement would run on the pool's connection, outside the batch: its
    session cannot open one. Only that unit fails; the others of its batch commit."""
    writer = Writer(sqlite_db.sessions)

    async def stray(session: AsyncSession) -> None:
        await fetch_rows(session, _INSERT, _row("stray-driver"))
        await session.exec(_INSERT, params=_row("stray-orm"))  # type: ignore[call-overload]

    try:
        results = await _in_one_batch(writer, [_insert("s0"), stray, _insert("s2")])
        assert results[0] == "s0" and results[2] == "s2"
        assert isinstance(results[1], StrayStatement)
        assert await _stored(sqlite_db) == {"s0", "s2"}
        # Alone in its batch too (no savepoint: the whole transaction is rolled back).
        with pytest.raises(StrayStatement):
            await writer.run(stray)
        assert await _stored(sqlite_db) == {"s0", "s2"}
    finally:
        await writer.close()


async def test_sqlite_a_failed_commit_fails_every_caller_of_the_batch(sqlite_db: Admin) -> None:
    """A real failure of the writer's COMMIT: a foreign key checked only at the commit
    (PRAGMA defer_foreign_keys) is violated by one unit. Every caller of the batch gets the
    error, nothing of the batch is written, and the next batch commits."""
    writer = Writer(sqlite_db.sessions)

    async def orphan_hold(session: AsyncSession) -> str:
        await fetch_rows(session, sa.text("PRAGMA defer_foreign_keys=ON"), {})
        await fetch_rows(
            session,
            _INSERT_HOLD,
            {
                "id": "hold_orphan",
                "account_id": "no-such-account",
                "key_hash": "k",
                "amount_micros": 1,
                "counts_against_balance": True,
                "counts_against_key_limit": True,
                "created_at": WHEN,
                "expires_at": WHEN,
            },
        )
        return "orphan"

    try:
        results = await _in_one_batch(writer, [_insert("f0"), orphan_hold, _insert("f2")])
        assert all(isinstance(r, sqlite3.IntegrityError) for r in results), results
        assert writer.stats.failed_batches == 1
        assert await _stored(sqlite_db) == set()
        assert await writer.run(_insert("after")) == "after"  # type: ignore[arg-type]
        assert await _stored(sqlite_db) == {"after"}
    finally:
        await writer.close()


@contextlib.asynccontextmanager
async def _write_lock_held(
    admin: Admin, holder: str
) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """SQLite's write lock held, by a session of the pool (`holder` "pool") or by a
    connection the writer knows nothing of (as another process's); yields its commit."""
    if holder == "pool":
        async with admin.sessions() as session:
            await fetch_rows(session, _INSERT, _row("holder"))
            yield session.commit
        return
    bind = admin.sessions.kw["bind"]
    other = sqlite3.connect(bind.url.database, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    other.execute(
        "INSERT INTO rate_windows (subject_id, period, window_start, count) "
        "VALUES ('holder', 'minute', '2026-07-01 12:30:00.000000', 1)"
    )

    async def commit() -> None:
        other.execute("COMMIT")

    try:
        yield commit
    finally:
        other.close()


@pytest.mark.parametrize("holder", ["pool", "other"])
async def test_sqlite_the_batch_waits_for_the_write_lock_off_the_loop(
    sqlite_db: Admin, holder: str
) -> None:
    """Another connection holds SQLite's write lock (it wrote and has not committed): the
    batch's BEGIN IMMEDIATE waits while the event loop goes on — for this process's pool, on
    the loop until the pool's transaction ends; for any other, in a thread (SQLite's busy
    handler) — and commits once the lock is free."""
    writer = Writer(sqlite_db.sessions)
    assert writer.inline is not None
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.005)

    ticking = asyncio.create_task(ticker())
    try:
        async with _write_lock_held(sqlite_db, holder) as commit:
            queued = asyncio.create_task(writer.run(_insert("writer")))  # type: ignore[arg-type]
            ticks_before = ticks
            await asyncio.sleep(0.2)
            assert not queued.done()
            # A blocked loop would tick once; a busy machine may slow it.
            assert ticks - ticks_before >= 5, ticks
            stats = writer.inline.stats
            if holder == "pool":
                assert stats.pool_waits >= 1 and stats.busy_waits == 0
            else:
                assert stats.busy_waits == 1
            await commit()
            assert await asyncio.wait_for(queued, timeout=5) == "writer"
        assert await _stored(sqlite_db) == {"holder", "writer"}
    finally:
        ticking.cancel()
        await writer.close()


async def test_sqlite_the_pool_waits_for_the_writers_batch(sqlite_db: Admin) -> None:
    """A batch holds the write lock while its units run: a write through the pool waits
    (in aiosqlite's thread, SQLite's busy handler) and goes through after the commit."""
    writer = Writer(sqlite_db.sessions)

    async def pool_write() -> None:
        async with sqlite_db.sessions() as session:
            await fetch_rows(session, _INSERT, _row("pool"))
            await session.commit()

    try:
        gate, batch = await _hold(writer, writes="batch")
        pooled = asyncio.create_task(pool_write())
        await asyncio.sleep(0.1)
        assert not pooled.done()  # waiting for the batch's write lock
        gate.release.set()
        assert await batch == "batch"
        await asyncio.wait_for(pooled, timeout=5)
        assert await _stored(sqlite_db) == {"batch", "pool"}
    finally:
        await writer.close()


async def test_sqlite_a_writer_stopped_during_a_lock_wait_leaves_no_transaction(
    sqlite_db: Admin,
) -> None:
    """The writer's task is cancelled (the loop shutting down) while its thread waits for the
    write lock: the thread cannot be stopped, so what it begins once the lock is free is
    rolled back, and the writer's next batch runs on a clean connection."""
    writer = Writer(sqlite_db.sessions)
    assert writer.inline is not None
    try:
        async with _write_lock_held(sqlite_db, "other") as commit:
            queued = asyncio.create_task(writer.run(_insert("lost")))  # type: ignore[arg-type]
            await asyncio.sleep(0.05)
            assert writer.inline.stats.busy_waits == 1
            # The writer's task, running the batch, as shutdown cancels it.
            task = writer._task
            assert task is not None
            task.cancel()
            with pytest.raises(ConnectionError):
                await queued
            await commit()
            await asyncio.sleep(0.1)  # the thread gets the lock, and gives it back
        # The pool can write: the abandoned BEGIN holds no lock.
        async with sqlite_db.sessions() as session:
            await fetch_rows(session, _INSERT, _row("pool-after"))
            await session.commit()
        assert await writer.run(_insert("next")) == "next"  # type: ignore[arg-type]
        assert await _stored(sqlite_db) == {"holder", "pool-after", "next"}
    finally:
        await writer.close()


async def test_sqlite_a_unit_handed_to_an_idle_writer_runs_in_the_writers_task(
    sqlite_db: Admin,
) -> None:
    """Every batch runs in the writer's task, never in a caller's: a lone unit commits as
    a batch of one; a batch that has to wait (another connection holds the write lock)
    keeps the writer busy, and what is queued meanwhile shares the next batch, in order."""
    writer = Writer(sqlite_db.sessions)
    try:
        caller = asyncio.current_task()
        ran_in: list[asyncio.Task[Any] | None] = []

        async def unit(session: AsyncSession) -> str:
            ran_in.append(asyncio.current_task())
            return await _insert("lone")(session)  # type: ignore[operator]

        assert await writer.run(unit, finish_within=5) == "lone"  # type: ignore[arg-type]
        assert ran_in and ran_in[0] is not caller
        assert await _stored(sqlite_db) == {"lone"}

        async with _write_lock_held(sqlite_db, "other") as commit:
            first = asyncio.create_task(writer.run(_insert("first")))  # type: ignore[arg-type]
            await asyncio.sleep(0.05)  # its batch is waiting for the lock, in a thread
            rest = [asyncio.create_task(writer.run(_insert(f"r{i}"))) for i in range(3)]  # type: ignore[arg-type]
            await asyncio.sleep(0.01)
            await commit()
            assert await asyncio.wait_for(first, timeout=5) == "first"
            assert await asyncio.wait_for(asyncio.gather(*rest), timeout=5) == ["r0", "r1", "r2"]
        assert list(writer.stats.sizes) == [1, 1, 3]
    finally:
        await writer.close()


def _alone() -> bool:
    return True


async def test_sqlite_a_lone_requests_unit_commits_in_its_callers_task(sqlite_db: Admin) -> None:
    """With no other request in flight (`alone`) and the writer idle, the caller's task runs
    its unit as a batch of one: committed when run() returns, no hand-off to the writer's
    task. With another request in flight it goes to the writer's task as before."""
    in_flight = [1]
    writer = Writer(sqlite_db.sessions, alone=lambda: in_flight[0] <= 1)
    try:
        caller = asyncio.current_task()
        ran_in: list[asyncio.Task[Any] | None] = []

        def unit(who: str) -> Callable[[AsyncSession], Awaitable[str]]:
            async def run(session: AsyncSession) -> str:
                ran_in.append(asyncio.current_task())
                return await _insert(who)(session)  # type: ignore[operator, no-any-return]

            return run

        assert await writer.run(unit("led")) == "led"
        assert await writer.run(unit("led-bounded"), finish_within=5) == "led-bounded"
        assert ran_in == [caller, caller]
        assert await _stored(sqlite_db) == {"led", "led-bounded"}
        in_flight[0] = 2
        assert await writer.run(unit("handed")) == "handed"
        assert ran_in[2] is not caller
        assert writer.stats.led == 2
        assert list(writer.stats.sizes) == [1, 1, 1]
    finally:
        await writer.close()


async def test_sqlite_a_lone_unit_is_not_led_past_units_queued_or_a_held_lock(
    sqlite_db: Admin,
) -> None:
    """A lone caller does not jump the queue: while a batch runs (or units wait), its unit
    queues behind them; and it never waits for the write lock in its own task (another
    connection holds it): the writer's task takes the unit and commits it once the lock is
    free."""
    writer = Writer(sqlite_db.sessions, alone=_alone)
    try:
        gate, gated = await _hold(writer, writes="gate")
        queued = asyncio.create_task(writer.run(_insert("after-gate")))  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
        assert not queued.done()  # behind the running batch
        gate.release.set()
        assert await gated == "gate"
        assert await queued == "after-gate"
        assert writer.stats.led == 1  # the gate's, led in its own caller's task; not the second

        async with _write_lock_held(sqlite_db, "other") as commit:
            waiting = asyncio.create_task(writer.run(_insert("after-lock")))  # type: ignore[arg-type]
            await asyncio.sleep(0.05)
            assert not waiting.done()
            await commit()
            assert await asyncio.wait_for(waiting, timeout=5) == "after-lock"
        assert writer.stats.led == 1
        assert await writer.run(_insert("led")) == "led"  # type: ignore[arg-type]
        assert writer.stats.led == 2
        assert await _stored(sqlite_db) == {"gate", "after-gate", "holder", "after-lock", "led"}
    finally:
        await writer.close()


async def test_sqlite_a_led_unit_that_fails_writes_nothing(sqlite_db: Admin) -> None:
    writer = Writer(sqlite_db.sessions, alone=_alone)

    async def failing(session: AsyncSession) -> None:
        await fetch_rows(session, _INSERT, _row("undone"))
        raise GatewayError(402, "refused")

    try:
        with pytest.raises(GatewayError):
            await writer.run(failing)
        assert writer.stats.led == 1 and writer.stats.failed_units == 1
        assert await writer.run(_insert("next")) == "next"  # type: ignore[arg-type]
        assert await _stored(sqlite_db) == {"next"}
    finally:
        await writer.close()


@pytest.mark.parametrize("bounded", [False, True])
async def test_sqlite_a_led_unit_that_waits_and_loses_its_caller_still_commits(
    sqlite_db: Admin, bounded: bool
) -> None:
    """A unit must only run statements; one that waits on something else all the same, led
    in its caller's task, and whose caller is cancelled meanwhile, is rolled back and run
    again by the writer's task: it commits, as a begun unit whose caller left does. A
    `finish_within` caller waits for that commit, then gets its CancelledError."""
    writer = Writer(sqlite_db.sessions, alone=_alone)
    runs: list[asyncio.Task[Any] | None] = []
    release = asyncio.Event()
    started = asyncio.Event()

    async def waits(session: AsyncSession) -> str:
        runs.append(asyncio.current_task())
        started.set()
        await fetch_rows(session, _INSERT, _row(f"run{len(runs)}"))
        await release.wait()
        return "done"

    try:
        caller = asyncio.create_task(writer.run(waits, finish_within=5 if bounded else None))
        await started.wait()
        caller.cancel()
        await asyncio.sleep(0.05)
        assert caller.done() is not bounded  # a bounded caller waits for the unit's commit
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(caller, timeout=5)
        for _ in range(100):
            if await _stored(sqlite_db):
                break
            await asyncio.sleep(0.01)
        assert len(runs) == 2 and runs[0] is not runs[1]
        # The first run's row was rolled back; the writer's run committed.
        assert await _stored(sqlite_db) == {"run2"}
        assert await writer.run(_insert("after")) == "after"  # type: ignore[arg-type]
    finally:
        await writer.close()


async def test_sqlite_a_led_unit_cancelled_mid_unit_is_still_bounded_by_finish_within(
    sqlite_db: Admin,
) -> None:
    """A led unit sets no timer while it runs to its end; one cancelled mid-unit (handed to
    the writer's task to run again) still has its caller's bound: past `finish_within` the
    caller stops waiting (CancelledError, chained from the TimeoutError) even though the
    unit's second run has not ended."""
    writer = Writer(sqlite_db.sessions, alone=_alone)
    release = asyncio.Event()
    started = asyncio.Event()

    async def waits(session: AsyncSession) -> str:
        started.set()
        await fetch_rows(session, _INSERT, _row("slow"))
        await release.wait()
        return "done"

    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    handler = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        caller = asyncio.create_task(writer.run(waits, finish_within=0.2))
        await started.wait()
        began = loop.time()
        caller.cancel()
        with pytest.raises(asyncio.CancelledError) as ended:
            await asyncio.wait_for(caller, timeout=5)
        assert loop.time() - began < 2
        assert isinstance(ended.value.__cause__, TimeoutError)
        release.set()
        await writer.close()  # the second run ends; nothing holds the unit any more
        del caller, ended
        gc.collect()
        # The caller's own future is dropped, not left holding the TimeoutError unread.
        assert not [c for c in reported if "never retrieved" in str(c.get("message"))]
    finally:
        loop.set_exception_handler(handler)
        release.set()
        await writer.close()


def _size(path: Path) -> int:
    return path.stat().st_size


async def _wal_sizes(
    admin: Admin, first: int, total: int, pause: float, checkpoint_after: int = 20, tag: str = "c"
) -> tuple[InlineStats, int, int]:
    """`total` lone units (`pause` seconds apart) through a writer that checkpoints every
    `checkpoint_after` changed rows: its connection's stats, and the WAL file's size after
    the `first` and after all of them (every row stored)."""
    writer = Writer(admin.sessions)
    inline = writer.inline
    assert inline is not None
    inline.checkpoint_after_changes = checkpoint_after
    wal = Path(admin.sessions.kw["bind"].url.database + "-wal")
    size_after_first = 0
    stored = len(await _stored(admin))
    try:
        for i in range(total):
            await writer.run(_insert(f"{tag}{i}"))  # type: ignore[arg-type]
            if pause:
                await asyncio.sleep(pause)
            if i == first - 1:
                size_after_first = _size(wal)
        assert len(await _stored(admin)) == stored + total
        return inline.stats, size_after_first, _size(wal)
    finally:
        await writer.close()


async def test_sqlite_the_wal_is_checkpointed_beside_the_batches_and_restarts(
    sqlite_db: Admin,
) -> None:
    """The writer's connection does not checkpoint inside its commits; once enough was
    written a COMMIT starts a PASSIVE checkpoint beside the batches (a connection and a
    thread of its own), and with the pauses between requests a server has, the WAL restarts:
    four times as many commits grow it far less than they do without checkpoints, and no
    batch waited for one."""
    # The same commits with no checkpoint at all, first (in the same run, so that a slow
    # machine slows both): the WAL grows with them (5.4 times, measured). Then emptied.
    unchecked, unchecked_first, unchecked_size = await _wal_sizes(
        sqlite_db, 60, 300, pause=0.002, checkpoint_after=10**9, tag="u"
    )
    assert unchecked.checkpoints == 0
    database = sqlite3.connect(sqlite_db.sessions.kw["bind"].url.database)
    try:
        database.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        database.close()
    stats, size_after_first, size = await _wal_sizes(sqlite_db, 60, 300, pause=0.002)
    assert stats.checkpoints >= 10
    assert stats.checkpointed_frames > 0
    assert stats.checkpoints_between_batches == 0
    # Restarted from its beginning after the checkpoints: it grew by at most half as much
    # as without them (typically not at all; about twice its size on a loaded machine).
    assert size / size_after_first < 0.5 * (unchecked_size / unchecked_first)


async def test_sqlite_a_writer_that_never_pauses_still_bounds_its_wal(
    sqlite_db: Admin,
) -> None:
    """Commits back to back leave no moment for a checkpoint beside them to catch up with
    the WAL's end (and SQLite restarts it only once one did): past its bound, the writer
    checkpoints between two batches instead, and the WAL stays within the bound."""
    stats, size_after_first, size = await _wal_sizes(sqlite_db, 400, 2000, pause=0)
    assert stats.checkpoints_between_batches > 0
    # Four times as many commits, and the WAL (its file keeps its largest size) is no
    # larger: its growth is bounded (WAL_BOUND_CHECKPOINTS checkpoints' worth of rows past
    # the last checkpoint that copied all of it).
    assert size < 2 * size_after_first


@pytest.mark.parametrize("past_bound", [False, True])
async def test_sqlite_a_wal_file_past_its_bound_is_emptied(
    sqlite_db: Admin, past_bound: bool
) -> None:
    """Other processes' commits are not in the writer's count of changed rows: a checkpoint
    beside the batches that leaves the WAL file past its bound (wherever its frames came
    from) ends with a TRUNCATE checkpoint, which empties the file; within the bound the file
    is left as it is (PASSIVE only)."""
    bind = sqlite_db.sessions.kw["bind"]
    path = bind.url.database
    wal = Path(path + "-wal")
    other = sqlite3.connect(path, isolation_level=None)  # as another process's
    other.execute("PRAGMA wal_autocheckpoint=0")
    for count in range(300):
        other.execute(
            "INSERT INTO rate_windows (subject_id, period, window_start, count) "
            f"VALUES ('other-{count}', 'minute', '2026-07-01 12:30:00.000000', 1)"
        )
    size = _size(wal)
    assert size > 100_000
    checkpointer = connect_sqlite(path)
    try:
        bound = size // 2 if past_bound else size * 2
        bounded = await asyncio.to_thread(
            driver_module._checkpoint_bounded, checkpointer, str(wal), bound
        )
        assert bounded.busy == 0
        assert _size(wal) == (0 if past_bound else size)
        # Timed when it ran (its stall is what the writer's metrics report), else None.
        assert (bounded.truncate_seconds is not None) == past_bound
        assert len(await _stored(sqlite_db)) == 300  # nothing lost either way
    finally:
        checkpointer.close()
        other.close()


async def test_sqlite_a_batch_does_not_wait_for_a_checkpoint_beside_it(
    sqlite_db: Admin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint beside the batches (its copy and fsync can take milliseconds) holds no
    batch up: units commit while it runs; close waits for it."""
    writer = Writer(sqlite_db.sessions)
    inline = writer.inline
    assert inline is not None
    inline.checkpoint_after_changes = 1  # the first commit starts one
    started, release = threading.Event(), threading.Event()
    checkpoint = driver_module._checkpoint

    def held(connection: sqlite3.Connection) -> tuple[int, int, int]:
        started.set()
        release.wait(10)
        return checkpoint(connection)

    monkeypatch.setattr(driver_module, "_checkpoint", held)
    try:
        assert await writer.run(_insert("first")) == "first"  # type: ignore[arg-type]
        assert await asyncio.to_thread(started.wait, 10)  # the checkpoint runs, held
        inline.checkpoint_after_changes = 100  # (its bound far off: no wait for it)
        for i in range(5):
            assert await asyncio.wait_for(writer.run(_insert(f"w{i}")), 5) == f"w{i}"  # type: ignore[arg-type]
        assert inline.stats.checkpoints == 0  # still running
        release.set()
    finally:
        release.set()
        await writer.close()
    assert inline.stats.checkpoints >= 1
    assert inline.stats.checkpoints_between_batches == 0


async def test_sqlite_without_inline_batches_on_the_pool(databases: Databases) -> None:
    """inline_sqlite=False: no connection of the writer's own; batches run on a pooled
    session's connection, as on PostgreSQL."""
    engine = create_engine(await databases.new("sqlite"))
    writer = Writer(session_factory(engine), inline_sqlite=False)
    try:
        assert writer.inline is None
        assert await writer.run(_insert("pooled")) == "pooled"  # type: ignore[arg-type]
    finally:
        await writer.close()
        await engine.dispose()


_BUMP = (
    sa.update(_WINDOWS)
    .where(_WINDOWS.c.subject_id == sa.bindparam("who"))
    .values(count=_WINDOWS.c.count + 1)
)


async def test_postgres_a_deadlock_victim_runs_again_in_the_next_batch(
    databases: Databases,
) -> None:
    """Two processes' batches lock two rows in opposite orders (as one process's batch
    locks an account for a hold and then a counter row for a settlement while another's
    does the reverse): PostgreSQL breaks the deadlock by failing one unit; that unit is run
    again once its batch committed, and every caller succeeds with every write made once."""
    url = await databases.new("postgres")
    engines = [create_engine(url), create_engine(url)]
    first, second = (Writer(session_factory(engine)) for engine in engines)
    async with session_factory(engines[0])() as session:
        for who in ("r1", "r2"):
            await fetch_rows(session, _INSERT, _row(who))
        await session.commit()
    locked = {"r1": asyncio.Event(), "r2": asyncio.Event()}

    def bump(who: str, after: str | None = None) -> object:
        async def unit(session: AsyncSession) -> str:
            if after is not None:
                await locked[after].wait()  # the other batch holds `after` by now
            await fetch_rows(session, _BUMP, {"who": who})
            locked[who].set()
            return who

        return unit

    gate = asyncio.Event()

    async def gated(session: AsyncSession) -> str:
        await gate.wait()
        return "gate"

    try:
        # Each writer's first unit begins its batch at once and waits at the gate, so the
        # two after it queue into one batch together.
        runs = [
            asyncio.ensure_future(run)
            for run in (
                first.run(gated),
                first.run(bump("r1")),  # type: ignore[arg-type]
                first.run(bump("r2", after="r2")),  # type: ignore[arg-type]
                second.run(gated),
                second.run(bump("r2")),  # type: ignore[arg-type]
                second.run(bump("r1", after="r1")),  # type: ignore[arg-type]
            )
        ]
        await asyncio.sleep(0.05)
        gate.set()
        done = await asyncio.wait_for(asyncio.gather(*runs), timeout=30)
        assert done == ["gate", "r1", "r2", "gate", "r2", "r1"]
        # The victim's batch ran with no savepoints (rolled back whole, then run again a
        # savepoint per unit), or with them (its unit alone rolled back and retried).
        stats = (first.stats, second.stats)
        assert sum(s.lock_race_retries + s.unguarded_reruns for s in stats) >= 1
        assert first.stats.failed_units == second.stats.failed_units == 0
        async with session_factory(engines[0])() as session:
            counts = dict(
                (await session.exec(sa.select(_WINDOWS.c.subject_id, _WINDOWS.c.count))).all()  # type: ignore[call-overload]
            )
        assert counts == {"r1": 3, "r2": 3}  # each bump made exactly once
    finally:
        for writer in (first, second):
            await writer.close()
        for engine in engines:
            await engine.dispose()


async def test_postgres_a_batch_takes_savepoints_only_after_a_unit_failed(
    databases: Databases, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL a savepoint is a round trip: a batch runs its units with none. A unit
    that fails there takes the transaction with it: the batch is rolled back whole and run
    again with a savepoint per unit, where the failure stays its own; the next batches take
    savepoints at once, then go back to none."""
    url = await databases.new("postgres")
    engine = create_engine(url)
    writer = Writer(session_factory(engine))
    savepoints = 0
    real_next_unit = writer_module.next_unit

    async def counted(session: AsyncSession, index: int) -> None:
        nonlocal savepoints
        savepoints += 1
        await real_next_unit(session, index)

    monkeypatch.setattr(writer_module, "next_unit", counted)

    async def failing(session: AsyncSession) -> None:
        await fetch_rows(session, _INSERT, _row("bad"))  # written, then undone
        await fetch_rows(session, _INSERT, _row("a0"))  # a duplicate key: a database error

    async def stored() -> set[str]:
        async with engine.connect() as connection:
            return {r[0] for r in await connection.execute(sa.select(_WINDOWS.c.subject_id))}

    try:
        assert await _in_one_batch(writer, [_insert("a0"), _insert("a1")]) == ["a0", "a1"]
        assert savepoints == 0 and writer.stats.unguarded_reruns == 0
        results = await _in_one_batch(writer, [_insert("b0"), failing, _insert("b2")])
        assert results[0] == "b0" and results[2] == "b2"
        assert isinstance(results[1], Exception)
        assert writer.stats.unguarded_reruns == 1 and writer.stats.failed_units == 1
        assert savepoints == 3  # the batch again, a savepoint per unit
        assert await stored() == {"a0", "a1", "b0", "b2"}  # nothing of the failed unit
        for batch in range(GUARDED_AFTER_FAILURE):
            assert await _in_one_batch(writer, [_insert(f"c{batch}"), _insert(f"d{batch}")])
        assert savepoints == 3 + 2 * GUARDED_AFTER_FAILURE
        assert await _in_one_batch(writer, [_insert("e0"), _insert("e1")]) == ["e0", "e1"]
        assert savepoints == 3 + 2 * GUARDED_AFTER_FAILURE  # none again
    finally:
        await writer.close()
        await engine.dispose()
