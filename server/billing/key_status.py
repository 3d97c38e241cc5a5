"""What a key has spent and may still spend: the view behind GET /key and the /keys routes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlmodel.ext.asyncio.session import AsyncSession

from server.billing.periods import PERIOD_OF_RESET
from server.billing.usage import ACCOUNT, KEY, PeriodUsage, read_usages
from server.db.models import Account, ApiKey
from server.limits.free_models import FreeModelDailyRequests, daily_limit, is_free_tier


@dataclass(frozen=True)
class KeyStatus:
    key: ApiKey
    usage: PeriodUsage
    limit_remaining_micros: int | None
    is_free_tier: bool
    free_model_daily_requests: FreeModelDailyRequests


def remaining_under_limit(
    limit_micros: int, limit_reset: str | None, include_byok: bool, usage: PeriodUsage
) -> int:
    """What is left of a cap in its current reset period."""
    period = PERIOD_OF_RESET.get(limit_reset, "all")
    used = usage.spend[period] + (usage.byok[period] if include_byok else 0)
    return max(0, limit_micros - used)


def limit_remaining(key: ApiKey, usage: PeriodUsage) -> int | None:
    """What is left of the key's cap in its current reset period (None: unlimited)."""
    if key.limit_micros is None:
        return None
    return remaining_under_limit(
        key.limit_micros, key.limit_reset, key.include_byok_in_limit, usage
    )


async def key_status(
    session: AsyncSession, key: ApiKey, account: Account, now: datetime
) -> KeyStatus:
    usages = await read_usages(session, [(KEY, key.hash), (ACCOUNT, account.id)], now)
    usage, account_usage = usages[(KEY, key.hash)], usages[(ACCOUNT, account.id)]
    return KeyStatus(
        key=key,
        usage=usage,
        limit_remaining_micros=limit_remaining(key, usage),
        is_free_tier=is_free_tier(account.credits_purchased_micros),
        free_model_daily_requests=FreeModelDailyRequests(
            used=account_usage.free_requests_today,
            limit=daily_limit(account.credits_purchased_micros),
        ),
    )
