"""Per-period usage counters of keys and accounts: O(1) reads, atomic increments."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel.ext.asyncio.session import AsyncSession

from server.billing.periods import PERIODS, period_starts
from server.db.driver import execute_many
from server.db.models import UsageCounter

KEY = "key"
ACCOUNT = "account"


@dataclass(frozen=True)
class PeriodUsage:
    """Micro-dollars spent, and of those through bring-your-own-key, in each current period."""

    spend: dict[str, int]
    byok: dict[str, int]

    @classmethod
    def empty(cls) -> PeriodUsage:
        zero = dict.fromkeys(PERIODS, 0)
        return cls(spend=dict(zero), byok=dict(zero))


_TABLE = UsageCounter.__table__

# Built once: the statement is compiled and cached, each read only binds values.
_CURRENT_COUNTERS = sa.select(
    _TABLE.c.subject,
    _TABLE.c.subject_id,
    _TABLE.c.period,
    _TABLE.c.spend_micros,
    _TABLE.c.byok_micros,
).where(
    _TABLE.c.subject_id.in_(sa.bindparam("subject_ids", expanding=True)),
    sa.or_(
        *(
            sa.and_(
                _TABLE.c.period == period,
                _TABLE.c.period_start == sa.bindparam(f"{period}_start"),
            )
            for period in PERIODS
        )
    ),
)


async def read_usages(
    session: AsyncSession, subjects: list[tuple[str, str]], now: datetime
) -> dict[tuple[str, str], PeriodUsage]:
    """The current all/day/week/month counters of several subjects in one query: four
    primary-key rows per subject at most, whatever the history."""
    starts = period_starts(now)
    params = {f"{period}_start": starts.of(period) for period in PERIODS}
    rows = await session.exec(  # type: ignore[call-overload]  # sqlmodel's exec() is typed for its own select() only
        _CURRENT_COUNTERS, params={"subject_ids": [sid for _, sid in subjects], **params}
    )
    usages = {subject: PeriodUsage.empty() for subject in subjects}
    for subject, subject_id, period, spend, byok in rows:
        usage = usages.get((subject, subject_id))
        if usage is None:
            continue
        usage.spend[period] = spend
        usage.byok[period] = byok
    return usages


async def read_usage(
    session: AsyncSession, subject: str, subject_id: str, now: datetime
) -> PeriodUsage:
    return (await read_usages(session, [(subject, subject_id)], now))[(subject, subject_id)]


def _upsert_statement(dialect: str) -> sa.Insert:
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = insert(_TABLE)
    return statement.on_conflict_do_update(
        index_elements=["subject", "subject_id", "period", "period_start"],
        set_={
            "spend_micros": _TABLE.c.spend_micros + statement.excluded.spend_micros,
            "byok_micros": _TABLE.c.byok_micros + statement.excluded.byok_micros,
        },
    )


# Built once per dialect and run as executemany: compiled once, cached.
_UPSERTS = {dialect: _upsert_statement(dialect) for dialect in ("postgresql", "sqlite")}


async def add_usages(
    session: AsyncSession,
    subjects: list[tuple[str, str]],
    now: datetime,
    *,
    spend_micros: int = 0,
    byok_micros: int = 0,
) -> None:
    """Add to each subject's four current counters (insert-or-increment, race-free)."""
    starts = period_starts(now)
    rows = [
        {
            "subject": subject,
            "subject_id": subject_id,
            "period": period,
            "period_start": starts.of(period),
            "spend_micros": spend_micros,
            "byok_micros": byok_micros,
        }
        for subject, subject_id in subjects
        for period in PERIODS
    ]
    await execute_many(session, _UPSERTS, rows)
