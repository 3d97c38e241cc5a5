"""The platform fee on BYOK usage: a percentage of the provider cost the catalog prices (the
provider bills the workspace for that cost itself), charged from credits like any cost, after
a number of free BYOK requests per account and UTC month (OpenRouter: 5% after the first
1,000,000 BYOK requests a month). Money is integer micro-dollars."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_HALF_EVEN, Decimal

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel.ext.asyncio.session import AsyncSession

from server.db.driver import fetch_rows
from server.db.models import ByokMonthlyRequests

DEFAULT_FEE_PERCENT = Decimal(5)
DEFAULT_FREE_REQUESTS_PER_MONTH = 1_000_000
_TABLE = ByokMonthlyRequests.__table__


@dataclass(frozen=True)
class ByokFees:
    percent: Decimal = DEFAULT_FEE_PERCENT  # 0 to 100
    free_requests_per_month: int = DEFAULT_FREE_REQUESTS_PER_MONTH

    def fee(self, provider_cost_micros: int) -> int:
        """The fee on a BYOK request that is not free: `percent` of the provider cost,
        rounded half-even to the micro-dollar (never more than the cost itself)."""
        exact = Decimal(provider_cost_micros) * self.percent / 100
        return int(exact.quantize(Decimal(1), rounding=ROUND_HALF_EVEN))

    def charged(self, provider_cost_micros: int, request_of_month: int) -> int:
        """The fee for the account's `request_of_month`-th BYOK request of the month."""
        if request_of_month <= self.free_requests_per_month:
            return 0
        return self.fee(provider_cost_micros)


def month_start(now: datetime) -> datetime:
    return now.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def _count_statement(dialect: str) -> sa.Insert:
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = insert(_TABLE).values(
        account_id=sa.bindparam("account_id"),
        month_start=sa.bindparam("month_start", type_=sa.Date),
        requests=1,
    )
    return statement.on_conflict_do_update(
        index_elements=["account_id", "month_start"],
        set_={"requests": _TABLE.c.requests + 1},
    ).returning(_TABLE.c.requests)


_COUNTS = {dialect: _count_statement(dialect) for dialect in ("postgresql", "sqlite")}


async def count_byok_request(session: AsyncSession, account_id: str, now: datetime) -> int:
    """Count one BYOK request of the account in the current UTC month and return which one
    of the month it is (race-free: insert-or-increment in one statement). The caller commits
    (with the request's charge, so a rolled-back charge is not counted)."""
    rows = await fetch_rows(
        session, _COUNTS, {"account_id": account_id, "month_start": month_start(now).date()}
    )
    return int(rows[0][0])


async def byok_requests_this_month(session: AsyncSession, account_id: str, now: datetime) -> int:
    row = (
        await session.exec(  # type: ignore[call-overload]  # sqlmodel's exec() is typed for its own select() only
            sa.select(_TABLE.c.requests).where(
                _TABLE.c.account_id == account_id,
                _TABLE.c.month_start == month_start(now).date(),
            )
        )
    ).first()
    return 0 if row is None else int(row[0])
