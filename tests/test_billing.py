"""Ledger, usage counters and key status on a real SQLite file and the real PostgreSQL,
with an injectable clock for the UTC period boundaries."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from server.billing.periods import next_reset, period_starts
from server.billing.usage import ACCOUNT, KEY
from server.clock import ManualClock
from server.db.models import Account, ApiKey, LedgerEntry, UsageCounter
from server.limits.free_models import daily_limit, is_free_tier
from server.limits.key_status import key_status
from testkit.admin import Admin, IssuedKey

# A Sunday, one second before midnight UTC: the day and the ISO week end together.
SUNDAY_LAST_SECOND = datetime(2026, 5, 31, 23, 59, 59, tzinfo=UTC)


async def _status(admin: Admin, issued: IssuedKey) -> Any:
    async with admin.sessions() as session:
        key = await session.get(ApiKey, issued.hash)
        account = await session.get(Account, issued.workspace.account_id)
        assert key is not None and account is not None
        return await key_status(session, key, account, admin.clock.now())


def _usd(micros: int) -> float:
    return micros / 1_000_000


def test_period_starts_are_utc_day_monday_week_and_month() -> None:
    starts = period_starts(datetime(2026, 6, 3, 1, 0, tzinfo=UTC))  # a Wednesday
    assert str(starts.day) == "2026-06-03"
    assert str(starts.week) == "2026-06-01"
    assert str(starts.month) == "2026-06-01"
    # 23:30 on 2 June in UTC-5 is already 3 June in UTC.
    from datetime import timezone

    local = datetime(2026, 6, 2, 23, 30, tzinfo=timezone(timedelta(hours=-5)))
    assert str(period_starts(local).day) == "2026-06-03"


def test_next_reset_boundaries() -> None:
    now = datetime(2026, 12, 31, 12, 0, tzinfo=UTC)  # a Thursday
    assert next_reset("daily", now) == datetime(2027, 1, 1, tzinfo=UTC)
    assert next_reset("weekly", now) == datetime(2027, 1, 4, tzinfo=UTC)
    assert next_reset("monthly", now) == datetime(2027, 1, 1, tzinfo=UTC)
    assert next_reset(None, now) is None


async def test_usage_rolls_over_at_utc_midnight_monday_and_month(admin_db: Admin) -> None:
    clock = ManualClock(SUNDAY_LAST_SECOND)
    admin_db.clock = clock
    workspace = await admin_db.workspace("periods")
    issued = await admin_db.key(workspace, limit="10", limit_reset="daily")

    await admin_db.charge(issued, "2")
    status = await _status(admin_db, issued)
    assert [_usd(status.usage.spend[p]) for p in ("day", "week", "month", "all")] == [2, 2, 2, 2]
    assert _usd(status.limit_remaining_micros) == 8

    clock.advance(timedelta(seconds=1))  # Monday 1 June 00:00:00: new day, week and month
    status = await _status(admin_db, issued)
    assert [_usd(status.usage.spend[p]) for p in ("day", "week", "month", "all")] == [0, 0, 0, 2]
    assert _usd(status.limit_remaining_micros) == 10  # the daily cap starts afresh

    await admin_db.charge(issued, "1.5")
    clock.advance(timedelta(days=1))  # Tuesday: same week and month
    await admin_db.charge(issued, "0.25", is_byok=True)
    status = await _status(admin_db, issued)
    assert _usd(status.usage.spend["day"]) == 0
    assert _usd(status.usage.spend["week"]) == 1.5
    assert _usd(status.usage.spend["month"]) == 1.5
    assert _usd(status.usage.spend["all"]) == 3.5
    assert _usd(status.usage.byok["day"]) == 0.25
    assert _usd(status.usage.byok["all"]) == 0.25


@pytest.mark.parametrize(
    ("reset", "expected_remaining"),
    [(None, 4.0), ("monthly", 5.0), ("weekly", 6.0), ("daily", 9.0)],
)
async def test_limit_remaining_follows_limit_reset(
    admin_db: Admin, reset: str | None, expected_remaining: float
) -> None:
    clock = ManualClock(datetime(2026, 5, 20, 12, tzinfo=UTC))  # Wednesday
    admin_db.clock = clock
    workspace = await admin_db.workspace("resets")
    issued = await admin_db.key(workspace, limit="10", limit_reset=reset)
    await admin_db.charge(issued, "1", at=datetime(2026, 4, 30, 12, tzinfo=UTC))  # last month
    await admin_db.charge(issued, "1", at=datetime(2026, 5, 4, 12, tzinfo=UTC))  # this month
    await admin_db.charge(issued, "3", at=datetime(2026, 5, 18, 12, tzinfo=UTC))  # this week
    await admin_db.charge(issued, "1", at=datetime(2026, 5, 20, 9, tzinfo=UTC))  # today
    status = await _status(admin_db, issued)
    assert _usd(status.limit_remaining_micros) == expected_remaining


async def test_byok_counts_toward_the_limit_only_when_included(admin_db: Admin) -> None:
    workspace = await admin_db.workspace("byok")
    excluded = await admin_db.key(workspace, "excluded", limit="5")
    included = await admin_db.key(workspace, "included", limit="5", include_byok_in_limit=True)
    for issued in (excluded, included):
        await admin_db.charge(issued, "1")
        await admin_db.charge(issued, "2", is_byok=True)
    assert _usd((await _status(admin_db, excluded)).limit_remaining_micros) == 4
    assert _usd((await _status(admin_db, included)).limit_remaining_micros) == 2


async def test_limit_remaining_never_goes_negative(admin_db: Admin) -> None:
    workspace = await admin_db.workspace("over")
    issued = await admin_db.key(workspace, limit="1")
    await admin_db.charge(issued, "1.5")
    assert (await _status(admin_db, issued)).limit_remaining_micros == 0


async def test_ledger_reconciles_with_counters(admin_db: Admin) -> None:
    clock = ManualClock(datetime(2026, 1, 28, tzinfo=UTC))
    admin_db.clock = clock
    workspace = await admin_db.workspace("reconcile")
    keys = [await admin_db.key(workspace, f"k{i}") for i in range(3)]
    amounts = ["0.000001", "0.1", "0.2", "1.333333", "7", "0.3"]
    for day in range(10):  # crosses a month boundary
        for index, issued in enumerate(keys):
            await admin_db.charge(
                issued, amounts[(day + index) % len(amounts)], is_byok=(day + index) % 4 == 0
            )
        clock.advance(timedelta(days=1))
    async with admin_db.sessions() as session:
        ledger = (
            await session.exec(
                sa.select(LedgerEntry.is_byok, sa.func.sum(LedgerEntry.amount_micros))
                .where(LedgerEntry.account_id == workspace.account_id, LedgerEntry.kind == "charge")
                .group_by(LedgerEntry.is_byok)
            )
        ).all()
        by_kind = {bool(is_byok): total for is_byok, total in ledger}
        counter = (
            await session.exec(
                sa.select(UsageCounter.spend_micros, UsageCounter.byok_micros).where(
                    UsageCounter.subject == ACCOUNT,
                    UsageCounter.subject_id == workspace.account_id,
                    UsageCounter.period == "all",
                )
            )
        ).one()
        key_totals = (
            await session.exec(
                sa.select(
                    sa.func.sum(UsageCounter.spend_micros), sa.func.sum(UsageCounter.byok_micros)
                ).where(
                    UsageCounter.subject == KEY,
                    UsageCounter.period == "all",
                    UsageCounter.subject_id.in_([k.hash for k in keys]),
                )  # type: ignore[attr-defined]
            )
        ).one()
        monthly = (
            await session.exec(
                sa.select(sa.func.sum(UsageCounter.spend_micros + UsageCounter.byok_micros)).where(
                    UsageCounter.subject == ACCOUNT,
                    UsageCounter.subject_id == workspace.account_id,
                    UsageCounter.period == "month",
                )
            )
        ).one()
    assert (counter[0], counter[1]) == (by_kind[False], by_kind[True])
    assert (key_totals[0], key_totals[1]) == (by_kind[False], by_kind[True])
    assert monthly[0] == by_kind[False] + by_kind[True]


async def test_reading_status_is_constant_in_history_size(admin_db: Admin) -> None:
    """GET /key's cost does not grow with the number of past charges."""
    clock = ManualClock(datetime(2026, 3, 1, tzinfo=UTC))
    admin_db.clock = clock
    workspace = await admin_db.workspace("history")
    issued = await admin_db.key(workspace)

    async def statements_and_rows() -> tuple[int, int]:
        engine = admin_db.sessions.kw["bind"]
        seen: list[Any] = []

        def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            seen.append(statement)

        sa.event.listen(engine.sync_engine, "after_cursor_execute", record)
        try:
            status = await _status(admin_db, issued)
        finally:
            sa.event.remove(engine.sync_engine, "after_cursor_execute", record)
        return len(seen), status.usage.spend["all"]

    await admin_db.charge(issued, "1")
    small, _ = await statements_and_rows()
    for day in range(120):
        await admin_db.charge(issued, "0.01", at=clock.now() - timedelta(days=day))
    large, spent = await statements_and_rows()
    assert large == small
    assert spent == 1_000_000 + 120 * 10_000
    async with admin_db.sessions() as session:
        # The counter rows the read touched are the four current ones, whatever the history.
        rows = (
            await session.exec(
                sa.select(sa.func.count())
                .select_from(UsageCounter)
                .where(UsageCounter.subject == KEY, UsageCounter.subject_id == issued.hash)
            )
        ).one()[0]
    assert rows > 100  # history exists; the read still issued the same statements


@pytest.mark.parametrize(
    ("purchased", "limit", "free_tier"),
    [
        ("0", 50, True),
        ("1", 50, False),
        ("8.999999", 50, False),
        ("9", 1000, False),
        ("10", 1000, False),
        ("500", 1000, False),
    ],
)
async def test_free_model_tier_follows_purchases(
    admin_db: Admin, purchased: str, limit: int, free_tier: bool
) -> None:
    workspace = await admin_db.workspace("tier")
    issued = await admin_db.key(workspace)
    if purchased != "0":
        await admin_db.credits(workspace, purchased)
    status = await _status(admin_db, issued)
    assert status.free_model_daily_requests.limit == limit
    assert status.free_model_daily_requests.remaining == limit
    assert status.is_free_tier is free_tier


def test_tier_thresholds_in_micros() -> None:
    assert daily_limit(8_999_999) == 50 and daily_limit(9_000_000) == 1000
    assert is_free_tier(0) and not is_free_tier(1)
