"""What a key has spent and may still spend: the view behind GET /key and the /keys routes.

Read fresh on every call (never cached: GET /key after a response includes that request's
charge, whichever process made it), in ONE statement on the raw driver connection
(server/db/driver.py): the key's four current usage counters, the account's `:free`
requests of the UTC day, and the principal stamp, which lets GET /key notice a change to
the caller made elsewhere since its principal was cached."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from typing import Any

import sqlalchemy as sa
from sqlmodel.ext.asyncio.session import AsyncSession

from server.billing.periods import PERIOD_OF_RESET, PERIODS, period_starts
from server.billing.usage import KEY, PeriodUsage
from server.db.driver import HotReads, fetch_rows
from server.db.models import Account, ApiKey, RateWindow, UsageCounter, UtcDateTime
from server.db.stamp import STAMP_VERSION
from server.limits.free_models import (
    DAY,
    FreeModelDailyRequests,
    daily_limit,
    is_free_tier,
)


@dataclass(frozen=True)
class KeyStatus:
    key: ApiKey
    usage: PeriodUsage
    limit_remaining_micros: int | None
    is_free_tier: bool
    free_model_daily_requests: FreeModelDailyRequests


def limit_remaining(key: ApiKey, usage: PeriodUsage) -> int | None:
    """What is left of the key's cap in its current reset period (None: unlimited). Credit
    holds compute the same in SQL, inside their budget query (billing/holds.py)."""
    if key.limit_micros is None:
        return None
    period = PERIOD_OF_RESET.get(key.limit_reset, "all")
    used = usage.spend[period] + (usage.byok[period] if key.include_byok_in_limit else 0)
    return max(0, key.limit_micros - used)


_COUNTERS = UsageCounter.__table__
_WINDOWS = RateWindow.__table__


# The key's counter row of each period, LEFT JOINed to a one-row base: a row holds both the
# spend and the BYOK spend, so each is looked up once (a scalar subquery per column looked
# each row up twice, and bound each period start twice).
_ONE_ROW = sa.select(sa.literal_column("1").label("one")).subquery("base")
_PERIOD_ROWS = {period: _COUNTERS.alias(f"{period}_counter") for period in PERIODS}


def _joined_counters() -> sa.FromClause:
    joined: sa.FromClause = _ONE_ROW
    for period, row in _PERIOD_ROWS.items():
        joined = joined.outerjoin(
            row,
            sa.and_(
                row.c.subject == KEY,
                row.c.subject_id == sa.bindparam("key_hash"),
                row.c.period == period,
                row.c.period_start == sa.bindparam(f"{period}_start", type_=sa.Date),
            ),
        )
    return joined


# One row: stamp, free requests today, spend per period, BYOK spend per period (PERIODS'
# order). Every part is a primary-key lookup.
_STATUS = sa.select(
    STAMP_VERSION,
    sa.func.coalesce(
        sa.select(_WINDOWS.c.count)
        .where(
            _WINDOWS.c.subject_id == sa.bindparam("account_id"),
            _WINDOWS.c.period == DAY,
            _WINDOWS.c.window_start == sa.bindparam("free_day_start", type_=UtcDateTime),
        )
        .scalar_subquery(),
        0,
    ),
    *(sa.func.coalesce(_PERIOD_ROWS[period].c.spend_micros, 0) for period in PERIODS),
    *(sa.func.coalesce(_PERIOD_ROWS[period].c.byok_micros, 0) for period in PERIODS),
).select_from(_joined_counters())


@functools.lru_cache(maxsize=4)
def _day_params(today: date) -> dict[str, Any]:
    """The parameters that depend on the UTC day alone, built once per day."""
    starts = period_starts(datetime.combine(today, time(0), tzinfo=UTC))
    params: dict[str, Any] = {f"{period}_start": starts.of(period) for period in PERIODS}
    params["free_day_start"] = datetime.combine(today, time(0), tzinfo=UTC)
    return params


def _params(key: ApiKey, account: Account, now: datetime) -> dict[str, Any]:
    return _params_of(key.hash, account.id, now)


def _params_of(key_hash: str, account_id: str, now: datetime) -> dict[str, Any]:
    params = dict(_day_params(now.astimezone(UTC).date()))
    params["key_hash"] = key_hash
    params["account_id"] = account_id
    return params


async def warm_key_status(reads: HotReads, now: datetime) -> None:
    """Run the status statement once, for no key, before the server takes requests: it is
    compiled then (tens of milliseconds of SQLAlchemy), not inside the first GET /key."""
    await reads.rows(_STATUS, _params_of("", "", now))


def _status(row: Sequence[Any], key: ApiKey, account: Account) -> tuple[KeyStatus, int]:
    stamp, free_today, *counters = row
    usage = PeriodUsage(
        spend={period: int(counters[i]) for i, period in enumerate(PERIODS)},
        byok={period: int(counters[len(PERIODS) + i]) for i, period in enumerate(PERIODS)},
    )
    status = KeyStatus(
        key=key,
        usage=usage,
        limit_remaining_micros=limit_remaining(key, usage),
        is_free_tier=is_free_tier(account.credits_purchased_micros),
        free_model_daily_requests=FreeModelDailyRequests(
            used=int(free_today), limit=daily_limit(account.credits_purchased_micros)
        ),
    )
    return status, int(stamp)


async def key_status_and_stamp(
    session: AsyncSession, key: ApiKey, account: Account, now: datetime
) -> tuple[KeyStatus, int]:
    """The key's status as of now, and the principal stamp read in the same statement, in
    the session's transaction."""
    (row,) = await fetch_rows(session, _STATUS, _params(key, account, now))
    return _status(row, key, account)


async def read_key_status_and_stamp(
    reads: HotReads, key: ApiKey, account: Account, now: datetime
) -> tuple[KeyStatus, int]:
    """The same outside any transaction (server/db/driver.py's HotReads): what GET /key
    runs when its caller needs no other database work."""
    (row,) = await reads.rows(_STATUS, _params(key, account, now))
    return _status(row, key, account)


async def key_status(
    session: AsyncSession, key: ApiKey, account: Account, now: datetime
) -> KeyStatus:
    return (await key_status_and_stamp(session, key, account, now))[0]
