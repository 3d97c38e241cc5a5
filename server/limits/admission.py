"""Admission: the limits a billable request passes before it runs — the free-model request
limits, then a credit hold against the account balance and the key's cap (a `:free` request
with a zero estimate holds nothing: its count checks the balance)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Protocol, runtime_checkable

from sqlalchemy.ext.asyncio import AsyncEngine
from sqlmodel.ext.asyncio.session import AsyncSession

from server.auth import Principal
from server.billing.holds import DEFAULT_HOLD_TTL, Hold, place_hold
from server.db.writer import on_outcome
from server.errors import GatewayError
from server.limits.free_gate import FreeGate
from server.limits.free_models import admit_free_request, is_free_model
from server.limits.guardrail_budgets import GuardrailBudget, check_budgets
from server.observability.metrics import Metrics


class Limits(Protocol):
    async def admit(
        self,
        session: AsyncSession,
        principal: Principal,
        *,
        model_id: str,
        estimate_micros: int,
        now: datetime,
        ttl: timedelta = DEFAULT_HOLD_TTL,
        is_byok: bool = False,
        budgets: Sequence[GuardrailBudget] = (),
    ) -> Hold:
        """Admit the request (its hold is part of the caller's transaction) or raise 402/429,
        or 403 over one of the key's guardrail `budgets`."""
        ...


def is_plain_credit_hold(model_id: str, budgets: Sequence[GuardrailBudget], *, byok: bool) -> bool:
    """Whether EnforcedLimits.admit comes down to one credit hold for this request — no
    `:free` count, no guardrail budget, nothing held or admitted as BYOK — so that another
    way of taking that hold (a lease's slice, limits/leases.py; the hold and the video job
    in one statement, videos/jobs.py) applies the same rules. A new rule in `admit` must
    narrow this too."""
    return not byok and not budgets and not is_free_model(model_id)


def is_free_count_alone(
    model_id: str, estimate_micros: int, budgets: Sequence[GuardrailBudget], *, byok: bool
) -> bool:
    """Whether EnforcedLimits.admit comes down to the `:free` count alone — a `:free` model,
    a zero estimate, no guardrail budget, nothing held or admitted as BYOK — so that it can
    run as a transaction of its own (AloneAdmission). A new rule in `admit` must narrow this
    too."""
    return is_free_model(model_id) and estimate_micros == 0 and not budgets and not byok


@runtime_checkable
class AloneAdmission(Protocol):
    async def admit_alone(
        self, engine: AsyncEngine, principal: Principal, *, model_id: str, now: datetime
    ) -> Hold:
        """Admit a request for which is_free_count_alone holds, in a transaction of its own,
        committed when this returns; or raise as `admit` would (nothing written)."""
        ...


class EnforcedLimits:
    """The limits of the API reference. The caller commits the hold (and the free-request
    count) with whatever else belongs to accepting the request; a later rollback takes both
    back."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._gates: dict[AsyncEngine, FreeGate] = {}  # admit_alone's, by engine

    async def admit(
        self,
        session: AsyncSession,
        principal: Principal,
        *,
        model_id: str,
        estimate_micros: int,
        now: datetime,
        ttl: timedelta = DEFAULT_HOLD_TTL,
        is_byok: bool = False,
        budgets: Sequence[GuardrailBudget] = (),
    ) -> Hold:
        try:
            hold: Hold | None = None
            if budgets:
                # Takes the account's hold lock (when it will hold), as place_hold does.
                await check_budgets(
                    session,
                    account_id=principal.account.id,
                    key_hash=principal.key.hash,
                    budgets=budgets,
                    amount_micros=estimate_micros,
                    now=now,
                    is_byok=is_byok,
                )
            if is_free_model(model_id):
                await admit_free_request(
                    session,
                    account_id=principal.account.id,
                    credits_purchased_micros=principal.account.credits_purchased_micros,
                    exempt=principal.account.exempt_free_limits or principal.key.exempt_free_limits,
                    now=now,
                    is_byok=is_byok,
                )
                if estimate_micros == 0 and not is_byok:
                    # Counting it checked the balance, and it would reserve nothing.
                    hold = Hold.unreserved(principal.account.id, principal.key.hash)
            if hold is None:
                hold = await place_hold(
                    session,
                    account_id=principal.account.id,
                    key_hash=principal.key.hash,
                    amount_micros=estimate_micros,
                    now=now,
                    is_byok=is_byok,
                    ttl=ttl,
                )
        except GatewayError as refused:
            # Counted once the decision is final: a writer unit may run more than once.
            on_outcome(session, functools.partial(self._metrics.admission, _refusal(refused)))
            raise
        on_outcome(session, functools.partial(self._metrics.admission, "admitted"))
        return hold

    async def admit_alone(
        self, engine: AsyncEngine, principal: Principal, *, model_id: str, now: datetime
    ) -> Hold:
        """AloneAdmission: what `admit` does for such a request (its count, which checks the
        balance; no hold), in a transaction of its own (limits/free_gate.py; PostgreSQL)."""
        gate = self._gates.get(engine)
        if gate is None:
            gate = self._gates[engine] = FreeGate(engine)
        try:
            await gate.count(
                account_id=principal.account.id,
                credits_purchased_micros=principal.account.credits_purchased_micros,
                exempt=principal.account.exempt_free_limits or principal.key.exempt_free_limits,
                now=now,
            )
        except GatewayError as refused:
            self._metrics.admission(_refusal(refused))
            raise
        self._metrics.admission("admitted")
        return Hold.unreserved(principal.account.id, principal.key.hash)


def _refusal(error: GatewayError) -> str:
    """The metrics label of a refusal: the 402's (or a budget's 403's) limit_source, or the
    free-model limit."""
    if error.status == 429:
        return "free_model_limit"
    # The label keeps its short name (credits, key_limit, in_flight_budget).
    return str((error.metadata or {}).get("limit_source", error.status)).removeprefix("openrouter_")
