"""Per-period usage counters of keys and accounts: O(1) reads, atomic increments."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel.ext.asyncio.session import AsyncSession

from server.billing.periods import PERIODS, period_starts
from server.db.driver import fetch_rows
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


def _upsert_statement(dialect: str, subjects: int) -> sa.Insert:
    """One INSERT of `subjects` subjects' four current counters (bound as subject_<i> and
    subject_id_<i>, the periods' starts as <period>_start, the amounts once), each row
    insert-or-increment. One statement rather than an executemany of a row per counter:
    one set of arguments to build and, on PostgreSQL, one execution instead of eight. Its
    rows are locked in the order written (subject by subject, `PERIODS`' order), as before,
    so two processes' batches still take the counters in one order."""
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    c = _TABLE.c
    spend = sa.bindparam("spend_micros", type_=c.spend_micros.type)
    byok = sa.bindparam("byok_micros", type_=c.byok_micros.type)
    starts = {p: sa.bindparam(f"{p}_start", type_=c.period_start.type) for p in PERIODS}
    rows = [
        {
            "subject": sa.bindparam(f"subject_{i}", type_=c.subject.type),
            "subject_id": sa.bindparam(f"subject_id_{i}", type_=c.subject_id.type),
            # Written into the SQL: no argument to bind.
            "period": sa.literal_column(f"'{period}'"),
            "period_start": starts[period],
            "spend_micros": spend,
            "byok_micros": byok,
        }
        for i in range(subjects)
        for period in PERIODS
    ]
    statement = insert(_TABLE).values(rows)
    return statement.on_conflict_do_update(
        index_elements=["subject", "subject_id", "period", "period_start"],
        set_={
            "spend_micros": _TABLE.c.spend_micros + statement.excluded.spend_micros,
            "byok_micros": _TABLE.c.byok_micros + statement.excluded.byok_micros,
        },
    )


# Built once per dialect and number of subjects (a charge has two: its key and its account),
# compiled once by the driver.
_UPSERTS: dict[int, dict[str, sa.Insert]] = {}


def upsert_statement(subjects: int) -> dict[str, sa.Insert]:
    """The per-dialect counters upsert of `subjects` subjects (see `usage_params`)."""
    known = _UPSERTS.get(subjects)
    if known is None:
        known = {d: _upsert_statement(d, subjects) for d in ("postgresql", "sqlite")}
        _UPSERTS[subjects] = known
    return known


def usage_params(
    subjects: list[tuple[str, str]], now: datetime, spend_micros: int, byok_micros: int
) -> dict[str, object]:
    """The parameters of `upsert_statement(len(subjects))`. The subjects must differ: one
    statement may not increment a row twice (PostgreSQL refuses it)."""
    if len(set(subjects)) != len(subjects):
        raise ValueError("each subject's counters are added to once per statement")
    starts = period_starts(now)
    params: dict[str, object] = {f"{p}_start": starts.of(p) for p in PERIODS}
    params["spend_micros"] = spend_micros
    params["byok_micros"] = byok_micros
    for i, (subject, subject_id) in enumerate(subjects):
        params[f"subject_{i}"] = subject
        params[f"subject_id_{i}"] = subject_id
    return params


async def add_usages(
    session: AsyncSession,
    subjects: list[tuple[str, str]],
    now: datetime,
    *,
    spend_micros: int = 0,
    byok_micros: int = 0,
) -> None:
    """Add to each subject's four current counters (insert-or-increment, race-free), in one
    statement. The subjects must differ."""
    params = usage_params(subjects, now, spend_micros, byok_micros)
    await fetch_rows(session, upsert_statement(len(subjects)), params)
