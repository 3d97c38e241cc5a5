"""Admission in-process, on both backends (the free-request gates are dialect-specific SQL):
free-model minute and day windows on a ManualClock; credit holds and refusals naming their
limit_source."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from server.billing.holds import Hold, release_hold
from server.db.models import CreditHold
from server.errors import GatewayError
from server.limits.free_models import DAILY_LIMIT_LOW, REQUESTS_PER_MINUTE
from testkit.admin import IssuedKey
from testkit.domain import Domain

FREE = "unit/chat:free"
START = datetime(2026, 7, 1, 10, 0, 30, tzinfo=UTC)


async def _admit(domain: Domain, issued: IssuedKey, model: str = FREE, usd: float = 0) -> Hold:
    principal = await domain.principal(issued)
    async with domain.sessions() as session:
        hold = await domain.limits.admit(
            session,
            principal,
            model_id=model,
            estimate_micros=int(usd * 1_000_000),
            now=domain.clock.now(),
        )
        await session.commit()
        return hold


async def _refusal(
    domain: Domain, issued: IssuedKey, model: str = FREE, usd: float = 0
) -> GatewayError:
    with pytest.raises(GatewayError) as refused:
        await _admit(domain, issued, model, usd)
    return refused.value


async def test_free_model_minute_window(any_domain: Domain) -> None:
    domain = any_domain
    domain.clock.set(START)
    issued = await domain.funded_key("free-minute", usd="1")
    for _ in range(REQUESTS_PER_MINUTE):
        hold = await _admit(domain, issued)
        assert hold.id == ""  # a zero estimate reserves nothing
    refused = await _refusal(domain, issued)
    assert refused.status == 429
    assert "per minute" in refused.message
    next_minute = START.replace(second=0) + timedelta(minutes=1)
    assert refused.headers["X-RateLimit-Reset"] == str(int(next_minute.timestamp() * 1000))
    domain.clock.set(next_minute - timedelta(microseconds=1))
    assert (await _refusal(domain, issued)).status == 429  # still the same minute
    domain.clock.set(next_minute)
    await _admit(domain, issued)  # a new minute
    assert domain.metrics.admissions.labels("free_model_limit")._value.get() == 2


async def test_free_model_day_window(any_domain: Domain) -> None:
    domain = any_domain
    domain.clock.set(START)
    issued = await domain.funded_key("free-day", usd="1")  # under 9 USD bought: the low limit
    for n in range(DAILY_LIMIT_LOW):
        if n and n % REQUESTS_PER_MINUTE == 0:
            domain.clock.advance(timedelta(minutes=1))
        await _admit(domain, issued)
    domain.clock.advance(timedelta(minutes=1))
    refused = await _refusal(domain, issued)
    assert refused.status == 429 and "per day" in refused.message
    assert refused.headers["X-RateLimit-Limit"] == str(DAILY_LIMIT_LOW)
    # The refused request's minute count was rolled back with it: the minute still has room.
    domain.clock.set(datetime(2026, 7, 1, 23, 59, 59, tzinfo=UTC))
    assert (await _refusal(domain, issued)).status == 429
    domain.clock.set(datetime(2026, 7, 2, tzinfo=UTC))
    await _admit(domain, issued)  # a new UTC day


async def test_free_models_need_a_positive_balance(any_domain: Domain) -> None:
    issued = await any_domain.funded_key("free-broke", usd="0")
    refused = await _refusal(any_domain, issued)
    assert (refused.status, (refused.metadata or {}).get("limit_source")) == (
        402,
        "openrouter_credits",
    )


async def test_holds_reserve_and_refuse_naming_the_limit(any_domain: Domain) -> None:
    domain = any_domain
    issued = await domain.funded_key("holds", usd="1")
    account = issued.workspace.account_id
    first = await _admit(domain, issued, "unit/ok", usd=0.6)
    assert first.amount_micros == 600_000
    assert await domain.count(CreditHold, CreditHold.account_id == account) == 1

    busy = await _refusal(domain, issued, "unit/ok", usd=0.6)  # the balance is held
    assert (busy.status, busy.metadata) == (402, {"limit_source": "openrouter_in_flight_budget"})
    assert busy.retry_after_seconds == 1
    too_much = await _refusal(domain, issued, "unit/ok", usd=1.5)  # more than the balance
    assert (too_much.status, too_much.metadata) == (402, {"limit_source": "openrouter_credits"})

    async with domain.sessions() as session:
        await release_hold(session, first)
    await _admit(domain, issued, "unit/ok", usd=0.6)  # released: room again
    assert domain.metrics.admissions.labels("in_flight_budget")._value.get() == 1
    assert domain.metrics.admissions.labels("credits")._value.get() == 1


async def test_a_key_limit_refuses_what_the_account_could_pay(any_domain: Domain) -> None:
    domain = any_domain
    issued = await domain.funded_key("capped", usd="10", limit="0.5")
    refused = await _refusal(domain, issued, "unit/ok", usd=0.6)
    assert (refused.status, refused.metadata) == (402, {"limit_source": "openrouter_key_limit"})
    hold = await _admit(domain, issued, "unit/ok", usd=0.4)
    assert hold.amount_micros == 400_000
