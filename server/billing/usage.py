"""Per-period usage counters of keys and accounts: O(1) reads, atomic increments."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel.ext.asyncio.session import AsyncSession

from server.billing.periods import PERIODS, period_starts
from server.db.models import UsageCounter

KEY = "key"
ACCOUNT = "account"


@dataclass(frozen=True)
class PeriodUsage:
    """Micro-dollars spent, and of those through bring-your-own-key, in each current period."""

    spend: dict[str, int]
    byok: dict[str, int]
    free_requests_today: int

    @classmethod
    def empty(cls) -> PeriodUsage:
        zero = dict.fromkeys(PERIODS, 0)
        return cls(spend=dict(zero), byok=dict(zero), free_requests_today=0)


async def read_usage(
    session: AsyncSession, subject: str, subject_id: str, now: datetime
) -> PeriodUsage:
    """The current all/day/week/month counters: four primary-key rows at most."""
    starts = period_starts(now)
    table = UsageCounter.__table__  # type: ignore[attr-defined]
    wanted = sa.or_(
        *(
            sa.and_(table.c.period == period, table.c.period_start == starts.of(period))
            for period in PERIODS
        )
    )
    rows = await session.exec(
        sa.select(
            table.c.period, table.c.spend_micros, table.c.byok_micros, table.c.free_requests
        ).where(table.c.subject == subject, table.c.subject_id == subject_id, wanted)
    )
    usage = PeriodUsage.empty()
    free_today = 0
    for period, spend, byok, free_requests in rows:
        usage.spend[period] = spend
        usage.byok[period] = byok
        if period == "day":
            free_today = free_requests
    return PeriodUsage(spend=usage.spend, byok=usage.byok, free_requests_today=free_today)


async def add_usage(
    session: AsyncSession,
    subject: str,
    subject_id: str,
    now: datetime,
    *,
    spend_micros: int = 0,
    byok_micros: int = 0,
    free_requests: int = 0,
) -> None:
    """Add to the subject's four current counters (insert-or-increment, race-free)."""
    starts = period_starts(now)
    rows = [
        {
            "subject": subject,
            "subject_id": subject_id,
            "period": period,
            "period_start": starts.of(period),
            "spend_micros": spend_micros,
            "byok_micros": byok_micros,
            "free_requests": free_requests,
        }
        for period in PERIODS
    ]
    table = UsageCounter.__table__  # type: ignore[attr-defined]
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = insert(table).values(rows)
    statement = statement.on_conflict_do_update(
        index_elements=["subject", "subject_id", "period", "period_start"],
        set_={
            "spend_micros": table.c.spend_micros + statement.excluded.spend_micros,
            "byok_micros": table.c.byok_micros + statement.excluded.byok_micros,
            "free_requests": table.c.free_requests + statement.excluded.free_requests,
        },
    )
    await session.exec(statement)
