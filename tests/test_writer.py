"""The group-commit writer (server/db/writer.py) on a real SQLite file and PostgreSQL: it
batches what is queued while a commit runs, answers a caller only after its batch committed,
isolates one caller's failure from the others of its batch, and runs units in queue order."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime

import pytest
import pytest_asyncio
import sqlalchemy as sa
from sqlmodel.ext.asyncio.session import AsyncSession

from server.billing.holds import Hold, place_hold
from server.db.driver import fetch_rows
from server.db.engine import create_engine
from server.db.models import CreditHold, RateWindow
from server.db.writer import Writer
from server.errors import GatewayError
from tests.support.admin import Admin

_WINDOWS = RateWindow.__table__  # type: ignore[attr-defined]
_INSERT = sa.insert(_WINDOWS)
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


async def test_a_lone_unit_commits_in_a_batch_of_its_own(admin_db: Admin, peek: Peek) -> None:
    writer = Writer(admin_db.sessions)
    try:
        assert await writer.run(_insert("alone")) == "alone"  # type: ignore[arg-type]
        # Committed before run() returned: another session sees it.
        assert await peek() == {"alone"}
        assert writer.stats.sizes == [1]
    finally:
        await writer.close()


async def test_what_queues_during_a_commit_shares_the_next_one(admin_db: Admin, peek: Peek) -> None:
    writer = Writer(admin_db.sessions)
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(session: AsyncSession) -> str:
        await fetch_rows(session, _INSERT, _row("first"))
        started.set()
        await release.wait()
        return "first"

    try:
        first = asyncio.create_task(writer.run(slow))
        await started.wait()
        rest = [asyncio.create_task(writer.run(_insert(f"w{i}"))) for i in range(20)]  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
        assert not any(t.done() for t in rest)  # queued behind the running batch
        assert await peek() == set()  # nothing committed yet
        release.set()
        assert await first == "first"
        assert await asyncio.gather(*rest) == [f"w{i}" for i in range(20)]
        # Twenty callers, one commit: each answered after it.
        assert writer.stats.sizes == [1, 20]
        assert await peek() == {"first", *(f"w{i}" for i in range(20))}
    finally:
        await writer.close()


@pytest.mark.parametrize("failure", ["python", "database"])
async def test_one_failing_unit_fails_alone_and_writes_nothing(
    admin_db: Admin, peek: Peek, failure: str
) -> None:
    writer = Writer(admin_db.sessions)
    started, release = asyncio.Event(), asyncio.Event()

    async def gate(session: AsyncSession) -> None:
        started.set()
        await release.wait()

    async def failing(session: AsyncSession) -> None:
        await fetch_rows(session, _INSERT, _row("bad-1"))  # written, then undone
        if failure == "python":
            raise ValueError("refused")
        await fetch_rows(session, _INSERT, _row("ok-0"))  # a duplicate key: a database error

    try:
        gate_task = asyncio.create_task(writer.run(gate))
        await started.wait()
        tasks = [
            asyncio.create_task(writer.run(_insert("ok-0"))),  # type: ignore[arg-type]
            asyncio.create_task(writer.run(failing)),
            asyncio.create_task(writer.run(_insert("ok-2"))),  # type: ignore[arg-type]
        ]
        await asyncio.sleep(0)
        release.set()
        await gate_task
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert results[0] == "ok-0" and results[2] == "ok-2"
        if failure == "python":
            assert isinstance(results[1], ValueError)
        else:
            assert isinstance(results[1], Exception) and not isinstance(results[1], ValueError)
        assert writer.stats.sizes == [1, 3] and writer.stats.failed_units == 1
        assert await peek() == {"ok-0", "ok-2"}  # nothing of the failed unit
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
    started, release = asyncio.Event(), asyncio.Event()

    async def gate(session: AsyncSession) -> None:
        started.set()
        await release.wait()

    try:
        gate_task = asyncio.create_task(writer.run(gate))
        await started.wait()
        tasks = [asyncio.create_task(writer.run(_insert(f"f{i}"))) for i in range(3)]  # type: ignore[arg-type]
        await asyncio.sleep(0)
        release.set()
        await gate_task
        results = await asyncio.gather(*tasks, return_exceptions=True)
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
    started, release = asyncio.Event(), asyncio.Event()

    async def gate(session: AsyncSession) -> None:
        started.set()
        await release.wait()

    def reserve(session: AsyncSession) -> Awaitable[Hold]:
        return place_hold(
            session,
            account_id=workspace.account_id,
            key_hash=issued.hash,
            amount_micros=10_000,
            now=now,
        )

    try:
        gate_task = asyncio.create_task(writer.run(gate))
        await started.wait()
        tasks = [asyncio.create_task(writer.run(reserve)) for _ in range(12)]
        await asyncio.sleep(0)
        release.set()
        await gate_task
        results = await asyncio.gather(*tasks, return_exceptions=True)
        held = [r for r in results if isinstance(r, Hold)]
        refused = [r for r in results if isinstance(r, GatewayError)]
        assert len(held) == 5 and len(refused) == 7
        assert all(r.status == 402 for r in refused)
        assert writer.stats.sizes == [1, 12]
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
    started, release = asyncio.Event(), asyncio.Event()

    async def gate(session: AsyncSession) -> None:
        started.set()
        await release.wait()

    try:
        gate_task = asyncio.create_task(writer.run(gate))
        await started.wait()
        kept = asyncio.create_task(writer.run(_insert("kept")))  # type: ignore[arg-type]
        gone = asyncio.create_task(writer.run(_insert("gone")))  # type: ignore[arg-type]
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.sleep(0)
        release.set()
        await gate_task
        assert await kept == "kept"
        assert gone.cancelled()
        assert await peek() == {"kept"}  # the withdrawn unit never ran
        assert writer.stats.sizes == [1, 1]
    finally:
        await writer.close()
