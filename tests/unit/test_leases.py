"""Leased budget slices (server/limits/leases.py) in-process, on both databases: requests
far from a cap admit against one lease row, near a cap each holds for itself, and the
money always matches: ledger = counters, lease row = slice - what its requests settled."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from server.billing.holds import DEFAULT_HOLD_TTL, sweep_expired_holds
from server.db.models import CreditHold
from server.errors import GatewayError
from server.limits.leases import LEASE_WINDOW, SLICE_REQUESTS, BudgetLeases
from testkit.admin import IssuedKey
from testkit.domain import Domain


async def _holds(domain: Domain, issued: IssuedKey) -> list[CreditHold]:
    return await domain.rows(CreditHold, CreditHold.key_hash == issued.hash)


async def _outcomes(domain: Domain, issued: IssuedKey, n: int) -> list[int | str]:
    async def one() -> int | str:
        try:
            return (await domain.transcribe(issued)).cost_micros
        except GatewayError as error:
            return str((error.metadata or {}).get("limit_source", error.status))

    return list(await asyncio.gather(*(one() for _ in range(n))))


async def test_requests_far_from_a_cap_share_one_lease_row(any_domain: Domain) -> None:
    domain = any_domain
    issued = await domain.funded_key("lease-far", usd="100")
    account = issued.workspace.account_id
    costs = [(await domain.transcribe(issued)).cost_micros for _ in range(5)]
    cost = costs[0]
    assert cost > 0 and costs == [cost] * 5
    (lease,) = await _holds(domain, issued)  # one row for five requests
    assert lease.id.startswith("lease_")
    assert lease.amount_micros == SLICE_REQUESTS * cost - 5 * cost  # each settlement shrank it
    assert lease.expires_at == lease.created_at + LEASE_WINDOW + DEFAULT_HOLD_TTL
    assert await domain.charges(account) == costs
    assert (
        await domain.counted_spend(account) == await domain.counted_spend(issued.hash) == 5 * cost
    )
    await domain.drain_leases()
    assert await _holds(domain, issued) == []


async def test_parallel_requests_take_one_lease_and_the_money_matches(any_domain: Domain) -> None:
    domain = any_domain
    issued = await domain.funded_key("lease-parallel", usd="100")
    account = issued.workspace.account_id
    batches = domain.writer.stats.units
    outcomes = await _outcomes(domain, issued, 20)
    cost = outcomes[0]
    assert isinstance(cost, int) and outcomes == [cost] * 20
    # One unit took the slice, twenty settled: no request held for itself.
    assert domain.writer.stats.units - batches == 1 + 20
    (lease,) = await _holds(domain, issued)
    assert lease.amount_micros == SLICE_REQUESTS * cost - 20 * cost
    assert await domain.counted_spend(account) == sum(await domain.charges(account)) == 20 * cost


async def test_near_a_cap_every_request_holds_for_itself_exactly_k(any_domain: Domain) -> None:
    """A key cap with room for exactly 5: no slice is granted (it would not fit
    SLICE_HEADROOM times), and exactly 5 of 30 parallel requests run."""
    domain = any_domain
    probe = await domain.funded_key("lease-probe", usd="100")
    cost = (await domain.transcribe(probe)).cost_micros
    workspace = await domain.admin.workspace("lease-near")
    await domain.admin.credits(workspace, "100")
    limit = f"{(5 * cost + cost // 2) / 1_000_000:.6f}"
    issued = await domain.admin.key(workspace, limit=limit)
    outcomes = await _outcomes(domain, issued, 30)
    assert outcomes.count(cost) == 5, outcomes
    assert set(outcomes) - {cost} <= {"openrouter_key_limit", "openrouter_in_flight_budget"}
    assert await _holds(domain, issued) == []  # no lease; every hold settled
    assert await domain.counted_spend(issued.hash) == 5 * cost


async def test_exactly_k_of_n_where_leases_and_single_holds_meet(any_domain: Domain) -> None:
    """Room for 150 requests: the first slices are leased, the rest held one by one as the
    budget nears the cap; 200 parallel requests, exactly 150 run and nothing is over-spent."""
    domain = any_domain
    probe = await domain.funded_key("lease-probe2", usd="100")
    cost = (await domain.transcribe(probe)).cost_micros
    workspace = await domain.admin.workspace("lease-meet")
    await domain.admin.credits(workspace, "100")
    issued = await domain.admin.key(workspace, limit=f"{(150 * cost + cost // 2) / 1_000_000:.6f}")
    outcomes = await _outcomes(domain, issued, 200)
    assert outcomes.count(cost) == 150, sorted(map(str, outcomes))
    assert await domain.counted_spend(issued.hash) == 150 * cost
    await domain.drain_leases()
    assert await _holds(domain, issued) == []


async def test_a_failed_request_gives_its_amount_back_to_the_lease(domain: Domain) -> None:
    issued = await domain.funded_key("lease-fail", usd="100")
    cost = (await domain.transcribe(issued)).cost_micros
    assert domain.leases is not None
    (free,) = domain.leases.snapshot().values()
    with pytest.raises(GatewayError):
        await domain.transcribe(issued, "unit/all-fail")
    assert domain.leases.snapshot() == {(await _holds(domain, issued))[0].id: free}
    (lease,) = await _holds(domain, issued)
    assert lease.amount_micros == (SLICE_REQUESTS - 1) * cost  # unchanged by the failure
    assert await domain.charges(issued.workspace.account_id) == [cost]


async def test_a_changed_key_cap_retires_the_lease(domain: Domain) -> None:
    issued = await domain.funded_key("lease-cap", usd="100", limit="50")
    await domain.transcribe(issued)
    (first,) = await _holds(domain, issued)
    await domain.admin.update_key(issued, limit_micros=40_000_000)
    await domain.transcribe(issued)  # the principal now says 40 USD: a new lease
    rows = await _holds(domain, issued)
    assert [r.id for r in rows] != [first.id] and len(rows) == 1
    await domain.drain_leases()
    assert await _holds(domain, issued) == []


async def test_a_lease_goes_back_only_once_idle_for_the_whole_interval(domain: Domain) -> None:
    """Idle is counted from the lease's last request: a lease used again after its first idle
    moment stays (its one timer moves on), and goes back once unused for idle_seconds."""
    assert domain.leases is not None
    await domain.leases.close()
    leases = domain.leases = BudgetLeases(
        domain.writer, domain.clock, domain.metrics, idle_seconds=0.3
    )
    issued = await domain.funded_key("lease-idle-moves", usd="100")
    principal = await domain.principal(issued)
    hold = await leases.admit(principal, 10_000)
    assert hold is not None
    leases.released(hold)  # idle from now: due in 0.3 s
    await asyncio.sleep(0.2)
    hold = await leases.admit(principal, 10_000)  # used again, on the same lease
    assert hold is not None and len(leases.snapshot()) == 1
    leases.released(hold)  # idle again: due 0.3 s from now, not at the first moment's 0.3
    await asyncio.sleep(0.2)
    assert len(leases.snapshot()) == 1
    for _ in range(100):
        await asyncio.sleep(0.02)
        if not leases.snapshot():
            break
    assert leases.snapshot() == {}
    for _ in range(100):
        if not await _holds(domain, issued):
            break
        await asyncio.sleep(0.02)
    assert await _holds(domain, issued) == []


async def test_an_idle_lease_goes_back_and_a_crashed_one_lapses(domain: Domain) -> None:
    assert domain.leases is not None
    await domain.leases.close()
    domain.leases = BudgetLeases(domain.writer, domain.clock, domain.metrics, idle_seconds=0.05)
    issued = await domain.funded_key("lease-idle", usd="100")
    await domain.transcribe(issued)
    assert len(await _holds(domain, issued)) == 1
    for _ in range(100):
        await asyncio.sleep(0.02)
        if not await _holds(domain, issued):
            break
    assert await _holds(domain, issued) == []  # given back once idle

    # A process that dies keeps its lease row until it expires; then the sweeper takes it.
    crashed = BudgetLeases(domain.writer, domain.clock, domain.metrics)
    principal = await domain.principal(issued)
    hold = await crashed.admit(principal, 10_000)
    assert hold is not None
    assert len(await _holds(domain, issued)) == 1
    async with domain.sessions() as session:
        assert await sweep_expired_holds(session, domain.clock.now()) == 0
        later = domain.clock.now() + LEASE_WINDOW + DEFAULT_HOLD_TTL + timedelta(seconds=1)
        assert await sweep_expired_holds(session, later) == 1
    assert await _holds(domain, issued) == []
