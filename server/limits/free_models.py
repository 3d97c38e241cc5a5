"""Free-model (`:free`) request limits, as the API reference sets them."""

from __future__ import annotations

from dataclasses import dataclass

from server.billing.money import usd_to_micros

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
