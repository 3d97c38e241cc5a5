"""Guardrail budgets: a guardrail's `limit_usd` over its `reset_interval`, enforced on every
key the guardrail applies to exactly as a key's own limit is (server/billing/holds.py): the
request's estimate is held up front, the real cost settled after, and the check reads the
key's settled spend in the window and its running holds in one statement while the account's
holds are serialized — so concurrent requests, on one process or many, never spend past it.
A request over it is refused with 403 and `metadata.limit_source: openrouter_guardrail_budget`
(OpenRouter's budget layers answer 403)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlmodel.ext.asyncio.session import AsyncSession

from server.billing.holds import lock_account
from server.billing.money import micros_to_json_number
from server.billing.periods import PERIOD_OF_RESET, next_reset, period_starts
from server.billing.usage import KEY, PeriodUsage
from server.clock import rfc3339
from server.db.driver import fetch_rows
from server.db.models import ApiKey, CreditHold, UsageCounter, UtcDateTime
from server.errors import GatewayError

LIMIT_SOURCE = "openrouter_guardrail_budget"


@dataclass(frozen=True)
class GuardrailBudget:
    guardrail_id: str
    name: str
    limit_micros: int
    reset_interval: str  # daily | weekly | monthly
    include_byok: bool  # BYOK spend (and BYOK requests) count too
    assigned: bool = False  # assigned to the key (else its workspace's, for every key)


_HOLDS = CreditHold.__table__
_COUNTERS = UsageCounter.__table__
_INCLUDE_BYOK = sa.bindparam("include_byok", type_=sa.Boolean)

# The key's spend in the window and its running holds, in ONE statement (one snapshot): a
# settlement (hold deleted, charge counted, one transaction) is seen whole or not at all.
_BUDGET_USE = sa.select(
    sa.func.coalesce(
        sa.select(
            _COUNTERS.c.spend_micros + sa.case((_INCLUDE_BYOK, _COUNTERS.c.byok_micros), else_=0)
        )
        .where(
            _COUNTERS.c.subject == KEY,
            _COUNTERS.c.subject_id == sa.bindparam("key_hash"),
            _COUNTERS.c.period == sa.bindparam("period"),
            _COUNTERS.c.period_start == sa.bindparam("period_start", type_=sa.Date),
        )
        .scalar_subquery(),
        0,
    ).label("spent"),
    sa.select(sa.func.coalesce(sa.func.sum(_HOLDS.c.amount_micros), 0))
    .where(
        _HOLDS.c.key_hash == sa.bindparam("key_hash"),
        _HOLDS.c.expires_at > sa.bindparam("now", type_=UtcDateTime),
        sa.or_(_HOLDS.c.counts_against_balance.is_(True), _INCLUDE_BYOK),
    )
    .scalar_subquery()
    .label("held"),
)


def budget_exceeded(budget: GuardrailBudget, spent: int, now: datetime) -> GatewayError:
    resets_at = next_reset(budget.reset_interval, now)
    return GatewayError(
        403,
        f"Guardrail {budget.name!r}: this request exceeds its budget of "
        f"{micros_to_json_number(budget.limit_micros)} USD ({budget.reset_interval})",
        {
            "limit_source": LIMIT_SOURCE,
            "guardrail_id": budget.guardrail_id,
            "limit_usd": micros_to_json_number(budget.limit_micros),
            "spend_usd": micros_to_json_number(spent),
            "resets_at": rfc3339(resets_at) if resets_at is not None else None,
        },
    )


async def check_budgets(
    session: AsyncSession,
    *,
    account_id: str,
    key_hash: str,
    budgets: Sequence[GuardrailBudget],
    amount_micros: int,
    now: datetime,
    is_byok: bool = False,
) -> None:
    """Refuse (403) a request the key's guardrail budgets cannot take. A request that will
    hold something first takes the account's hold lock, kept to the caller's commit, so the
    hold placed next is decided on what this read saw."""
    applicable = [b for b in budgets if b.include_byok or not is_byok]
    if not applicable:
        return
    if amount_micros > 0:
        await lock_account(session, account_id)
    starts = period_starts(now)
    for budget in applicable:
        period = PERIOD_OF_RESET[budget.reset_interval]
        ((spent, held),) = await fetch_rows(
            session,
            _BUDGET_USE,
            {
                "key_hash": key_hash,
                "period": period,
                "period_start": starts.of(period),
                "now": now,
                "include_byok": budget.include_byok,
            },
        )
        if spent >= budget.limit_micros or amount_micros > budget.limit_micros - spent - held:
            raise budget_exceeded(budget, spent, now)


@dataclass(frozen=True)
class BudgetLayer:
    """One budget GET /key reports (OpenRouter's KeyBudget): settled spend in its window."""

    scope: str  # workspace_default_key | api_key | key_limit
    guardrail_id: str | None
    include_byok: bool
    limit_micros: int
    spent_micros: int
    reset_interval: str | None
    resets_at: datetime | None

    @property
    def remaining_micros(self) -> int:
        return self.limit_micros - self.spent_micros


def _spent(usage: PeriodUsage, reset_interval: str | None, include_byok: bool) -> int:
    period = PERIOD_OF_RESET.get(reset_interval, "all")
    return usage.spend[period] + (usage.byok[period] if include_byok else 0)


def budget_layers(
    budgets: Sequence[GuardrailBudget], key: ApiKey, usage: PeriodUsage, now: datetime
) -> list[BudgetLayer]:
    """Every budget checked for the key, in the order it is checked: its guardrails' budgets,
    then its own limit."""
    layers = [
        BudgetLayer(
            scope="api_key" if budget.assigned else "workspace_default_key",
            guardrail_id=budget.guardrail_id,
            include_byok=budget.include_byok,
            limit_micros=budget.limit_micros,
            spent_micros=_spent(usage, budget.reset_interval, budget.include_byok),
            reset_interval=budget.reset_interval,
            resets_at=next_reset(budget.reset_interval, now),
        )
        for budget in budgets
    ]
    if key.limit_micros is not None:
        layers.append(
            BudgetLayer(
                scope="key_limit",
                guardrail_id=None,
                include_byok=key.include_byok_in_limit,
                limit_micros=key.limit_micros,
                spent_micros=_spent(usage, key.limit_reset, key.include_byok_in_limit),
                reset_interval=key.limit_reset,
                resets_at=next_reset(key.limit_reset, now),
            )
        )
    return layers


def effective_budget(layers: Sequence[BudgetLayer]) -> BudgetLayer | None:
    """The budget that blocks first: the first one spent, else the one with least left."""
    spent = [layer for layer in layers if layer.remaining_micros <= 0]
    if spent:
        return spent[0]
    return min(layers, key=lambda layer: layer.remaining_micros, default=None)
