"""Guardrail budgets in-process, on both backends (the hold lock and the budget read are
dialect-specific): exactly as many concurrent admissions as the budget holds, settled spend
counted in the reset window, assignment to keys, 403 naming the budget."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from server.billing.holds import Hold, settle_hold
from server.billing.money import usd_to_micros
from server.billing.usage import KEY, read_usage
from server.db.engine import SessionFactory, create_engine, session_factory
from server.errors import GatewayError
from server.guardrails import store
from server.guardrails.policy import guardrails_of
from server.limits.guardrail_budgets import (
    LIMIT_SOURCE,
    GuardrailBudget,
    budget_layers,
    effective_budget,
)
from testkit.admin import IssuedKey
from testkit.domain import Domain

START = datetime(2026, 7, 1, 10, 0, tzinfo=UTC)  # a Wednesday
PRICE = usd_to_micros(Decimal("0.3"))


async def _budgeted(
    domain: Domain, name: str, limit_usd: str = "1", reset: str = "daily", **extra: object
) -> tuple[IssuedKey, str]:
    """A funded key whose workspace has one guardrail with a budget."""
    issued = await domain.funded_key(name, usd="100")
    changes = store.check_changes(
        domain.catalog,
        {"limit_micros": usd_to_micros(Decimal(limit_usd)), "reset_interval": reset, **extra},
    )
    async with domain.sessions() as session:
        guardrail = await store.create_guardrail(
            session, issued.workspace.id, {"name": "budget", **changes}, domain.clock.now()
        )
        await session.commit()
        return issued, guardrail.id


async def _budgets(domain: Domain, issued: IssuedKey) -> tuple[GuardrailBudget, ...]:
    async with domain.sessions() as session:
        return (await guardrails_of(session, issued.workspace.id, issued.hash)).budgets


async def _admit(
    domain: Domain, issued: IssuedKey, micros: int = PRICE, is_byok: bool = False
) -> Hold:
    principal = await domain.principal(issued)
    budgets = await _budgets(domain, issued)
    async with domain.sessions() as session:
        hold = await domain.limits.admit(
            session,
            principal,
            model_id="unit/ok",
            estimate_micros=micros,
            now=domain.clock.now(),
            budgets=budgets,
            is_byok=is_byok,
        )
        await session.commit()
        return hold


async def _refused(domain: Domain, issued: IssuedKey, micros: int = PRICE) -> GatewayError:
    with pytest.raises(GatewayError) as refused:
        await _admit(domain, issued, micros)
    return refused.value


async def test_concurrent_admissions_stop_exactly_at_the_budget(any_domain: Domain) -> None:
    domain = any_domain
    domain.clock.set(START)
    issued, guardrail_id = await _budgeted(domain, "budget-race")
    results = await asyncio.gather(
        *(_admit(domain, issued) for _ in range(12)), return_exceptions=True
    )
    admitted = [r for r in results if isinstance(r, Hold)]
    refusals = [r for r in results if isinstance(r, GatewayError)]
    assert len(admitted) == 3 and len(refusals) == 9  # 3 x 0.3 of 1 USD
    refusal = refusals[0]
    assert refusal.status == 403
    assert refusal.metadata == {
        "limit_source": LIMIT_SOURCE,
        "guardrail_id": guardrail_id,
        "limit_usd": 1.0,
        "spend_usd": 0.0,  # nothing settled yet: the holds are what filled it
        "resets_at": "2026-07-02T00:00:00.000Z",
    }
    # Settled at a lower cost, the budget has room for one more; spend is reported.
    async with domain.sessions() as session:
        for hold in admitted:
            await settle_hold(
                session, hold, cost_micros=usd_to_micros(Decimal("0.2")), now=START, reference="g"
            )
        await session.commit()
    await _admit(domain, issued)  # 0.6 spent + 0.3 fits within 1
    assert (await _refused(domain, issued)).metadata["spend_usd"] == 0.6  # type: ignore[index]
    domain.clock.set(START + timedelta(days=1))  # a new UTC day: the daily budget is fresh
    for _ in range(3):
        await _admit(domain, issued)
    assert (await _refused(domain, issued)).status == 403


async def test_a_spent_budget_refuses_even_free_requests(domain: Domain) -> None:
    domain.clock.set(START)
    issued, _ = await _budgeted(domain, "budget-spent", limit_usd="0.3", reset="monthly")
    hold = await _admit(domain, issued)
    async with domain.sessions() as session:
        await settle_hold(session, hold, cost_micros=PRICE, now=START, reference="g")
        await session.commit()
    refused = await _refused(domain, issued, micros=0)
    assert refused.status == 403 and refused.metadata["resets_at"] == "2026-08-01T00:00:00.000Z"  # type: ignore[index]


async def test_byok_counts_only_when_the_guardrail_includes_it(domain: Domain) -> None:
    domain.clock.set(START)
    issued, _ = await _budgeted(domain, "budget-byok", limit_usd="0.3")
    await _admit(domain, issued, is_byok=True)  # not counted: include_byok_in_budgets off
    await _admit(domain, issued, is_byok=True)
    await _admit(domain, issued)
    included, _ = await _budgeted(
        domain, "budget-byok-in", limit_usd="0.3", include_byok_in_budgets=True
    )
    await _admit(domain, included, is_byok=True)
    with pytest.raises(GatewayError):
        await _admit(domain, included, is_byok=True)


async def test_an_assigned_guardrail_binds_its_keys_only(domain: Domain) -> None:
    domain.clock.set(START)
    issued, guardrail_id = await _budgeted(domain, "budget-assign", limit_usd="0.3")
    other = await domain.admin.key(issued.workspace, "other")
    foreign = await domain.funded_key("budget-foreign")
    async with domain.sessions() as session:
        guardrail = await store.find_guardrail(session, guardrail_id, [issued.workspace.id])
        assert await store.assign_keys(session, guardrail, [issued.hash], START) == 1
        assert await store.assign_keys(session, guardrail, [issued.hash], START) == 0
        await session.commit()
        rows, total = await store.list_key_assignments(session, issued.workspace.id, guardrail_id)
        assert total == 1 and rows[0][0].key_hash == issued.hash
        with pytest.raises(GatewayError) as wrong_workspace:
            await store.assign_keys(session, guardrail, [foreign.hash], START)
        assert wrong_workspace.value.metadata == {"param": "key_hashes"}
    assert len(await _budgets(domain, issued)) == 1
    assert await _budgets(domain, other) == ()  # no longer the whole workspace's
    await _admit(domain, issued)
    assert (await _refused(domain, issued)).status == 403
    async with domain.sessions() as session:
        assert await store.unassign_keys(session, guardrail, [issued.hash]) == 1
        await session.commit()
    assert len(await _budgets(domain, other)) == 1  # unassigned: the workspace's again


def test_a_budget_needs_both_limit_and_interval() -> None:
    with pytest.raises(GatewayError) as half:
        store.check_budget(1_000_000, None)
    assert half.value.metadata == {"param": "reset_interval"}
    with pytest.raises(GatewayError) as bad:
        store.check_reset_interval("hourly")
    assert bad.value.status == 400
    store.check_budget(None, None)


async def test_key_status_layers_list_guardrail_budgets_then_the_key_limit(domain: Domain) -> None:
    domain.clock.set(START)
    issued, guardrail_id = await _budgeted(domain, "budget-layers", limit_usd="0.3")
    await domain.admin.update_key(issued, limit_micros=usd_to_micros(Decimal("5")))
    hold = await _admit(domain, issued)
    async with domain.sessions() as session:
        await settle_hold(session, hold, cost_micros=PRICE, now=START, reference="g")
        await session.commit()
    principal = await domain.principal(issued)
    async with domain.sessions() as session:
        usage = await read_usage(session, KEY, issued.hash, START)
    layers = budget_layers(await _budgets(domain, issued), principal.key, usage, START)
    assert [(x.scope, x.guardrail_id, x.remaining_micros) for x in layers] == [
        ("workspace_default_key", guardrail_id, 0),
        ("key_limit", None, usd_to_micros(Decimal("4.7"))),
    ]
    assert effective_budget(layers) is layers[0]  # spent: it blocks first
    assert effective_budget(layers[1:]) is layers[1] and effective_budget([]) is None


async def test_two_engines_on_one_database_never_pass_the_budget(any_domain: Domain) -> None:
    """Two engines on one database stand for two server processes: on SQLite each has its
    own connection (and aiosqlite thread), so only the database's write lock orders them."""
    domain = any_domain
    domain.clock.set(START)
    issued, _ = await _budgeted(domain, "budget-processes", limit_usd="2")
    engine = domain.sessions.kw["bind"]
    second = create_engine(engine.url.render_as_string(hide_password=False))
    other_sessions = session_factory(second)
    principal = await domain.principal(issued)
    budgets = await _budgets(domain, issued)

    async def admit(sessions: SessionFactory) -> Hold | GatewayError:
        try:
            async with sessions() as session:
                hold = await domain.limits.admit(
                    session,
                    principal,
                    model_id="unit/ok",
                    estimate_micros=PRICE,
                    now=START,
                    budgets=budgets,
                )
                await session.commit()
                return hold
        except GatewayError as refused:
            return refused

    try:
        results = await asyncio.gather(
            *(admit(domain.sessions if n % 2 else other_sessions) for n in range(16))
        )
    finally:
        await second.dispose()
    assert sum(isinstance(r, Hold) for r in results) == 6  # 6 x 0.3 of 2 USD
    assert all(r.status == 403 for r in results if isinstance(r, GatewayError))
