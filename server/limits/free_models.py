"""Free-model (`:free`) request limits, as the API reference sets them."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel.ext.asyncio.session import AsyncSession

from server.billing.holds import funded, unfunded
from server.billing.money import usd_to_micros
from server.db.driver import Statement, fetch_rows
from server.db.models import RateWindow, UtcDateTime
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

_WINDOWS = RateWindow.__table__
MINUTE, DAY = "minute", "day"
# The daily cap of requests that are counted but not gated (exempt, BYOK): never reached.
_UNCAPPED = 2**31 - 1


def _window_row(period: str) -> sa.Select[Any]:
    """One request of :subject_id in its `period` window, if the account's balance is
    positive (a free request holds nothing: this is its whole credit check)."""
    return sa.select(
        sa.bindparam("subject_id", type_=_WINDOWS.c.subject_id.type),
        sa.literal(period, _WINDOWS.c.period.type),
        sa.bindparam(f"{period}_start", type_=UtcDateTime),
        sa.literal(1, sa.Integer),
    ).where(funded("subject_id"))


def _gate_statement(dialect: str) -> Any:
    """Count the request in its minute and its day, each only while below its cap, in ONE
    statement RETURNING the windows that counted it: the row locks (PostgreSQL) or the write
    lock (SQLite) make it exact under any concurrency, across processes."""
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = insert(_WINDOWS).from_select(
        ["subject_id", "period", "window_start", "count"],
        sa.union_all(_window_row(MINUTE), _window_row(DAY)),
    )
    cap = sa.case(
        (statement.excluded.period == MINUTE, sa.bindparam("minute_cap", type_=sa.Integer)),
        else_=sa.bindparam("day_cap", type_=sa.Integer),
    )
    return statement.on_conflict_do_update(
        index_elements=["subject_id", "period", "window_start"],
        set_={"count": _WINDOWS.c.count + 1},
        where=_WINDOWS.c.count < cap,
    ).returning(_WINDOWS.c.period)


_GATES = {dialect: _gate_statement(dialect) for dialect in ("postgresql", "sqlite")}
_COUNT = sa.select(_WINDOWS.c.count).where(
    _WINDOWS.c.subject_id == sa.bindparam("subject_id"),
    _WINDOWS.c.period == sa.bindparam("period"),
    _WINDOWS.c.window_start == sa.bindparam("window_start", type_=UtcDateTime),
)


def _day_start(now: datetime) -> datetime:
    return datetime.combine(now.astimezone(UTC).date(), time(0), tzinfo=UTC)


async def free_requests_today(session: AsyncSession, account_id: str, now: datetime) -> int:
    """The account's `:free` requests counted in the current UTC day."""
    row = (
        await session.exec(  # type: ignore[call-overload]  # sqlmodel's exec() is typed for its own select() only
            _COUNT,
            params={"subject_id": account_id, "period": DAY, "window_start": _day_start(now)},
        )
    ).first()
    return 0 if row is None else int(row[0])


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


# On PostgreSQL, for a count in a transaction of its own (limits/free_gate.py): the same
# count, as ONE statement that counts both windows or neither. The minute is counted first
# (only while the balance is positive and the minute below its cap), then the day, only if
# the minute was counted; a day at its cap then makes the statement fail (the ELSE divides
# by zero), which takes the minute's count back with it: nothing is written. Both rows are
# locked minute first, then day, as _GATES locks them. RETURNING: both windows, or none.
def _both_or_neither() -> sa.CompoundSelect[Any]:
    columns = ["subject_id", "period", "window_start", "count"]
    keys = ["subject_id", "period", "window_start"]
    count = _WINDOWS.c.count
    minute = (
        postgresql.insert(_WINDOWS)
        .from_select(columns, _window_row(MINUTE))
        .on_conflict_do_update(
            index_elements=keys,
            set_={"count": count + 1},
            where=count < sa.bindparam("minute_cap", type_=sa.Integer),
        )
        .returning(_WINDOWS.c.period)
        .cte("minute_counted")
    )
    day_row = sa.select(
        sa.bindparam("subject_id", type_=_WINDOWS.c.subject_id.type),
        sa.literal(DAY, _WINDOWS.c.period.type),
        sa.bindparam("day_start", type_=UtcDateTime),
        sa.literal(1, sa.Integer),
    ).where(sa.exists(sa.select(minute.c.period)))
    day_full = count // sa.literal(0, sa.Integer)  # division_by_zero: the day is full
    day = (
        postgresql.insert(_WINDOWS)
        .from_select(columns, day_row)
        .on_conflict_do_update(
            index_elements=keys,
            set_={
                "count": sa.case(
                    (count < sa.bindparam("day_cap", type_=sa.Integer), count + 1),
                    else_=day_full,
                )
            },
        )
        .returning(_WINDOWS.c.period)
        .cte("day_counted")
    )
    return sa.select(minute.c.period).union_all(sa.select(day.c.period))


BOTH_OR_NEITHER = _both_or_neither()
DAY_FULL_SQLSTATE = "22012"  # division_by_zero, raised only by BOTH_OR_NEITHER's full day

Rows = Callable[[Statement, Mapping[str, Any]], Awaitable[Sequence[Sequence[Any]]]]


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
    await count_free_request(
        functools.partial(fetch_rows, session),
        _GATES,
        account_id=account_id,
        credits_purchased_micros=credits_purchased_micros,
        exempt=exempt,
        now=now,
        is_byok=is_byok,
    )


def _day_was_full(error: BaseException) -> bool:
    return getattr(error, "sqlstate", None) == DAY_FULL_SQLSTATE


async def count_free_request(
    rows: Rows,
    gate: Statement,
    *,
    account_id: str,
    credits_purchased_micros: int,
    exempt: bool,
    now: datetime,
    is_byok: bool = False,
) -> None:
    """admit_free_request with `rows` running the statements: `gate` is _GATES (in the
    caller's transaction) or BOTH_OR_NEITHER (a transaction of its own)."""
    minute = now.astimezone(UTC).replace(second=0, microsecond=0)
    day = _day_start(now)
    limit = daily_limit(credits_purchased_micros)
    gated = not (exempt or is_byok)  # exempt and BYOK requests are counted, never refused
    try:
        counted = {
            row[0]
            for row in await rows(
                gate,
                {
                    "subject_id": account_id,
                    "minute_start": minute,
                    "day_start": day,
                    "minute_cap": REQUESTS_PER_MINUTE,
                    "day_cap": limit if gated else _UNCAPPED,
                },
            )
        }
    except Exception as error:
        if not _day_was_full(error):
            raise
        # BOTH_OR_NEITHER failed: nothing was counted.
        raise rate_limited(limit, day + timedelta(days=1), "day") from None
    if MINUTE not in counted:
        if not counted:  # nothing counted: the minute is full, or the balance is not positive
            found = await rows(
                _COUNT, {"subject_id": account_id, "period": MINUTE, "window_start": minute}
            )
            if not found or found[0][0] < REQUESTS_PER_MINUTE:
                raise unfunded()
        raise rate_limited(REQUESTS_PER_MINUTE, minute + timedelta(minutes=1), "minute")
    if DAY not in counted:  # the caller's rollback takes the minute's count back
        raise rate_limited(limit, day + timedelta(days=1), "day")
