"""What a key has spent and may still spend: the view behind GET /key and the /keys routes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlmodel.ext.asyncio.session import AsyncSession

from server.billing.periods import PERIOD_OF_RESET
from server.billing.usage import KEY, PeriodUsage, read_usage
from server.db.models import Account, ApiKey
from server.limits.free_models import (
    FreeModelDailyRequests,
    daily_limit,
    free_requests_today,
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


async def key_status(
    session: AsyncSession, key: ApiKey, account: Account, now: datetime
) -> KeyStatus:
    usage = await read_usage(session, KEY, key.hash, now)
    return KeyStatus(
        key=key,
        usage=usage,
        limit_remaining_micros=limit_remaining(key, usage),
        is_free_tier=is_free_tier(account.credits_purchased_micros),
        free_model_daily_requests=FreeModelDailyRequests(
            used=await free_requests_today(session, account.id, now),
            limit=daily_limit(account.credits_purchased_micros),
        ),
    )
