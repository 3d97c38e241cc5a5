"""Admission and settlement statements on the driver connection (server/db/driver.py), on a
real SQLite file and PostgreSQL: they run in the caller's transaction, convert parameters by
column type, and keep the values bound in the statement itself."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects.sqlite.aiosqlite import dialect as sqlite_dialect

from server.db.driver import _compile, execute_many, fetch_rows
from server.db.models import RateWindow, UtcDateTime
from testkit.admin import Admin

_WINDOWS = RateWindow.__table__  # type: ignore[attr-defined]
_INSERT = sa.insert(_WINDOWS).returning(_WINDOWS.c.window_start, _WINDOWS.c.count)
_PLAIN_INSERT = sa.insert(_WINDOWS)
_BUMP = (
    sa.update(_WINDOWS)
    .where(_WINDOWS.c.subject_id == sa.bindparam("who"))
    .values(count=_WINDOWS.c.count + 5)  # a value bound in the statement
    .returning(_WINDOWS.c.count)
)
_PLAIN_BUMP = (
    sa.update(_WINDOWS).where(_WINDOWS.c.subject_id == sa.bindparam("who")).values(count=0)
)
WHEN = datetime(2026, 7, 1, 12, 30, tzinfo=UTC)


async def _count(admin: Admin, who: str) -> int | None:
    async with admin.sessions() as session:
        row = (
            await session.exec(sa.select(_WINDOWS.c.count).where(_WINDOWS.c.subject_id == who))
        ).first()
    return None if row is None else row[0]


async def test_rows_typed_values_and_the_callers_transaction(admin_db: Admin) -> None:
    async with admin_db.sessions() as session:
        # First in its transaction (asyncpg has not begun one yet), then after.
        rows = await fetch_rows(
            session,
            _INSERT,
            {"subject_id": "acct-1", "period": "minute", "window_start": WHEN, "count": 1},
        )
        assert len(rows) == 1 and rows[0][1] == 1
        stored = rows[0][0]  # the UTC datetime was stored as such
        assert (stored if isinstance(stored, str) else stored.isoformat()).startswith("2026-07-01")
        assert [tuple(r) for r in await fetch_rows(session, _BUMP, {"who": "acct-1"})] == [(6,)]
        assert await fetch_rows(session, _PLAIN_BUMP, {"who": "nobody"}) == []
        await session.rollback()
    assert await _count(admin_db, "acct-1") is None  # rolled back with the caller

    async with admin_db.sessions() as session:
        await session.exec(sa.select(1))  # the session's transaction has begun
        await fetch_rows(
            session,
            _INSERT,
            {"subject_id": "acct-2", "period": "minute", "window_start": WHEN, "count": 2},
        )
        await fetch_rows(session, _BUMP, {"who": "acct-2"})
        await session.commit()
    assert await _count(admin_db, "acct-2") == 7
    async with admin_db.sessions() as session:
        # Found by SQLAlchemy's own comparison: stored in the dialect's format.
        window = (
            await session.exec(
                sa.select(RateWindow).where(
                    RateWindow.subject_id == "acct-2",  # type: ignore[arg-type]
                    RateWindow.window_start == WHEN,  # type: ignore[arg-type]
                )
            )
        ).one()[0]
    assert window.window_start == WHEN


async def test_execute_many_writes_every_row_in_the_callers_transaction(admin_db: Admin) -> None:
    rows = [
        {"subject_id": f"many-{i}", "period": "minute", "window_start": WHEN, "count": i}
        for i in range(1, 4)
    ]
    async with admin_db.sessions() as session:
        await execute_many(session, _PLAIN_INSERT, rows)  # first in its transaction
        await session.rollback()
    assert await _count(admin_db, "many-1") is None
    async with admin_db.sessions() as session:
        await session.exec(sa.select(1))
        await execute_many(session, _PLAIN_INSERT, rows)
        await session.commit()
    assert [await _count(admin_db, f"many-{i}") for i in range(1, 4)] == [1, 2, 3]


def test_sqlite_fast_conversions_write_what_the_dialect_writes() -> None:
    """On SQLite the driver formats dates and UTC datetimes itself (faster): the same text as
    SQLAlchemy's own conversion, for any zone, microsecond or year; what it does not expect
    (None, a naive datetime) gets the dialect's own answer or error."""
    dialect = sqlite_dialect()
    statement = sa.select(
        sa.bindparam("when", type_=UtcDateTime), sa.bindparam("day", type_=sa.Date)
    )
    fast = _compile(statement, dialect)
    values = [
        datetime(2026, 7, 1, 12, 30, tzinfo=UTC),
        datetime(2026, 7, 1, 12, 30, 0, 1, tzinfo=timezone(timedelta(hours=-5, minutes=-30))),
        datetime(5, 1, 1, 23, 59, 59, 999_999, tzinfo=timezone(timedelta(hours=3))),
        datetime(2026, 12, 31, 23, 0, tzinfo=timezone(timedelta(hours=-2))),
    ]
    days = [date(2026, 7, 1), date(5, 1, 9), date(9999, 12, 31)]
    for value in values:
        for day in days:
            params = {"when": value, "day": day}
            expected = [
                UtcDateTime().dialect_impl(dialect).bind_processor(dialect)(value),  # type: ignore[misc]
                sa.Date().dialect_impl(dialect).bind_processor(dialect)(day),  # type: ignore[misc]
            ]
            assert fast.arguments(params) == expected
    assert fast.arguments({"when": None, "day": None}) == [None, None]
    with pytest.raises(ValueError):
        fast.arguments({"when": datetime(2026, 7, 1), "day": days[0]})  # naive


def test_a_name_bound_at_several_positions_is_converted_once_per_position() -> None:
    dialect = sqlite_dialect()
    day = sa.bindparam("day", type_=sa.Date)
    statement = sa.select(day, sa.bindparam("n", type_=sa.Integer), day, sa.literal(7))
    compiled = _compile(statement, dialect)
    assert compiled.arguments({"day": date(2026, 7, 1), "n": 3}) == [
        "2026-07-01",
        3,
        "2026-07-01",
        7,
    ]
