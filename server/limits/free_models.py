"""Free-model (`:free`) request limits, as the API reference sets them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel.ext.asyncio.session import AsyncSession

from server.billing.holds import funded, unfunded
from server.billing.money import usd_to_micros
from server.db.driver import fetch_rows
from server.db.models import RateWindow, UsageCounter, UtcDateTime
from server.errors import GatewayError

FREE_SUFFIX = ":free"
REQUESTS_PER_MINUTE = 20
DAILY_LIMIT_LOW = 50
DAILY_LIMIT_HIGH = 1000
# The higher ceiling is granted from 9 purchased credits upward: one below the 10-credit
# threshold, for rounding and top-up fees.
HIGH_TIER_PURCHASED_MICROS = usd_to_micros(9)


def is_free_model(model_id: str) -> bool:
    return model_id.endswith(FREE_SUFFIX)


def daily_limit(credits_purchased_micros: int) -> int:
    if credits_purchased_micros >= HIGH_TIER_PURCHASED_MICROS:
        return DAILY_LIMIT_HIGH
    return DAILY_LIMIT_LOW


def is_free_tier(credits_purchased_micros: int) -> bool:
    """True only while the account never paid for credits."""
    return credits_purchased_micros <= 0


@dataclass(frozen=True)
class FreeModelDailyRequests:
    used: int
    limit: int

    @property
    def remaining(self) -> int:
        return max(0, self.limit - self.used)


# --- the gate ---------------------------------------------------------------------------------

_WINDOWS = RateWindow.__table__  # type: ignore[attr-defined]
_COUNTERS = UsageCounter.__table__  # type: ignore[attr-defined]


def _insert(dialect: str) -> Any:
    return postgresql.insert if dialect == "postgresql" else sqlite.insert


# The other columns a counting upsert's INSERT sets (one request counted).
_INSERTED = {
    _WINDOWS.name: ["count"],
    _COUNTERS.name: ["spend_micros", "byok_micros", "free_requests"],
}


def _counting_upsert(
    dialect: str,
    table: sa.Table,
    keys: list[str],
    column: str,
    *,
    capped: bool,
    only_if: sa.ColumnElement[bool] | None = None,
) -> Any:
    """INSERT one, or add one — only while below :cap when capped, and only if `only_if`
    holds — RETURNING the count. One statement: the row lock (PostgreSQL) or the write lock
    (SQLite) makes it exact under any concurrency, across processes."""
    names = [*keys, *_INSERTED[table.name]]
    if only_if is None:
        statement = _insert(dialect)(table).values({n: sa.bindparam(n) for n in names})
    else:
        row = sa.select(*(sa.bindparam(n, type_=table.c[n].type) for n in names))
        statement = _insert(dialect)(table).from_select(names, row.where(only_if))
    update = statement.on_conflict_do_update(
        index_elements=keys,
        set_={column: table.c[column] + 1},
        where=(table.c[column] < sa.bindparam("cap")) if capped else None,
    )
    return update.returning(table.c[column])


_DAY_KEYS = ["subject", "subject_id", "period", "period_start"]
_STATEMENTS = {
    (dialect, name): statement
    for dialect in ("postgresql", "sqlite")
    for name, statement in (
        # The minute's count also checks the balance: a free request holds nothing, so this
        # is its whole credit check, in the same statement.
        (
            "minute",
            _counting_upsert(
                dialect,
                _WINDOWS,
                ["subject_id", "window_start"],
                "count",
                capped=True,
                only_if=funded("subject_id"),
            ),
        ),
        (
            "day_capped",
            _counting_upsert(dialect, _COUNTERS, _DAY_KEYS, "free_requests", capped=True),
        ),
        ("day", _counting_upsert(dialect, _COUNTERS, _DAY_KEYS, "free_requests", capped=False)),
    )
}
_MINUTE_COUNT = sa.select(_WINDOWS.c.count).where(
    _WINDOWS.c.subject_id == sa.bindparam("subject_id"),
    _WINDOWS.c.window_start == sa.bindparam("window_start", type_=UtcDateTime),
)


def _epoch_ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


def rate_limited(limit: int, resets_at: datetime, which: str) -> GatewayError:
    return GatewayError(
        429,
        f"Rate limit exceeded: {limit} free-model requests per {which}",
        {"error_type": "rate_limit_exceeded"},
        headers={
            "X-RateLimit-Limit": str(limit),
            "X-RateLimit-Remaining": "0",
            "X-RateLimit-Reset": str(_epoch_ms(resets_at)),
        },
    )


async def admit_free_request(
    session: AsyncSession,
    *,
    account_id: str,
    credits_purchased_micros: int,
    exempt: bool,
    now: datetime,
    is_byok: bool = False,
) -> None:
    """Count one `:free` request against the account's per-minute and daily limits, or raise
    429; raise 402 (credits) when the account's balance is not positive. Runs in the caller's
    transaction: if the request is refused later, the caller's rollback takes the count back.
    A request with a zero estimate needs no credit hold after this."""
    dialect = "postgresql" if session.get_bind().dialect.name == "postgresql" else "sqlite"
    minute = now.astimezone(UTC).replace(second=0, microsecond=0)
    counted = await fetch_rows(
        session,
        _STATEMENTS[(dialect, "minute")],
        {"subject_id": account_id, "window_start": minute, "count": 1, "cap": REQUESTS_PER_MINUTE},
    )
    if not counted:  # the minute is full, or the balance is not positive
        full = (
            await session.exec(
                _MINUTE_COUNT, params={"subject_id": account_id, "window_start": minute}
            )
        ).first()
        if full is None or full[0] < REQUESTS_PER_MINUTE:
            raise unfunded()
        raise rate_limited(REQUESTS_PER_MINUTE, minute + timedelta(minutes=1), "minute")
    today = now.astimezone(UTC).date()
    gated = not (exempt or is_byok)  # exempt and BYOK requests are counted, never refused
    limit = daily_limit(credits_purchased_micros)
    row = dict(
        subject="account",
        subject_id=account_id,
        period="day",
        period_start=today,
        spend_micros=0,
        byok_micros=0,
        free_requests=1,
    )
    counted = await fetch_rows(
        session, _STATEMENTS[(dialect, "day_capped" if gated else "day")], {**row, "cap": limit}
    )
    if not counted:
        tomorrow = datetime.combine(today + timedelta(days=1), time(0), tzinfo=UTC)
        raise rate_limited(limit, tomorrow, "day")
