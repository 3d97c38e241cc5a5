"""The `:free` count in a transaction of its own on PostgreSQL (server/limits/free_gate.py):
exact under concurrency (alone, and beside the writer's units), both windows or neither,
402 on a balance that is not positive, exempt requests counted and never refused, and its
connections closed with the engine."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from bench.unlimited import NoLimits
from server.db.models import RateWindow
from server.errors import GatewayError
from server.limits.admission import AloneAdmission, is_free_count_alone
from server.limits.free_gate import FreeGate
from server.limits.free_models import DAILY_LIMIT_LOW, REQUESTS_PER_MINUTE
from server.limits.guardrail_budgets import GuardrailBudget
from testkit.admin import IssuedKey
from testkit.domain import Domain
from testkit.eventually import eventually

NOW = datetime(2026, 7, 1, 10, 0, 30, tzinfo=UTC)
MINUTE = NOW.replace(second=0)
MIDNIGHT = NOW.replace(hour=0, minute=0, second=0)


def _engine(domain: Domain) -> sa.ext.asyncio.AsyncEngine:
    return domain.sessions.kw["bind"]


async def _count(gate: FreeGate, issued: IssuedKey, *, exempt: bool = False) -> str:
    """The outcome: "ok", or the refusal ("402", "429 minute", "429 day")."""
    try:
        await gate.count(
            account_id=issued.workspace.account_id,
            credits_purchased_micros=1_000_000,
            exempt=exempt,
            now=NOW,
        )
    except GatewayError as refused:
        which = refused.message.rsplit(" ", 1)[-1] if refused.status == 429 else ""
        return f"{refused.status} {which}".strip()
    return "ok"


async def _windows(domain: Domain, account_id: str) -> dict[str, int]:
    rows = await domain.rows(RateWindow, RateWindow.subject_id == account_id)
    return {row.period: row.count for row in rows}


async def _made_earlier_today(domain: Domain, account_id: str, requests: int) -> None:
    async with domain.sessions() as session:
        session.add(
            RateWindow(subject_id=account_id, period="day", window_start=MIDNIGHT, count=requests)
        )
        await session.commit()


async def test_exactly_20_of_60_concurrent_counts(pg_domain: Domain) -> None:
    issued = await pg_domain.funded_key("gate-minute", usd="1")
    gate = FreeGate(_engine(pg_domain))
    outcomes = Counter(await asyncio.gather(*(_count(gate, issued) for _ in range(60))))
    assert outcomes == {"ok": REQUESTS_PER_MINUTE, "429 minute": 40}
    assert await _windows(pg_domain, issued.workspace.account_id) == {
        "minute": REQUESTS_PER_MINUTE,
        "day": REQUESTS_PER_MINUTE,
    }


async def test_a_full_day_counts_neither_window(pg_domain: Domain) -> None:
    """The day's refusal takes the minute's count back: one statement counts both or none."""
    issued = await pg_domain.funded_key("gate-day", usd="1")
    account = issued.workspace.account_id
    await _made_earlier_today(pg_domain, account, DAILY_LIMIT_LOW - 5)
    gate = FreeGate(_engine(pg_domain))
    outcomes = Counter(await asyncio.gather(*(_count(gate, issued) for _ in range(12))))
    assert outcomes == {"ok": 5, "429 day": 7}
    assert await _windows(pg_domain, account) == {"minute": 5, "day": DAILY_LIMIT_LOW}
    # Exempt: counted, never refused by the day.
    assert await _count(gate, issued, exempt=True) == "ok"
    assert await _windows(pg_domain, account) == {"minute": 6, "day": DAILY_LIMIT_LOW + 1}


async def test_a_balance_not_positive_is_402_and_writes_nothing(pg_domain: Domain) -> None:
    issued = await pg_domain.funded_key("gate-broke", usd="0")
    gate = FreeGate(_engine(pg_domain))
    assert await _count(gate, issued) == "402"
    assert await _windows(pg_domain, issued.workspace.account_id) == {}


async def test_exact_beside_the_writers_units(pg_domain: Domain) -> None:
    """Counts of one account through the writer's batches (EnforcedLimits.admit as a unit,
    the way a BYOK or budgeted `:free` request is admitted) and through the gate at the same
    time: exactly 20 in the minute, and no lock race reaches a caller."""
    domain = pg_domain
    domain.clock.set(NOW)
    issued = await domain.funded_key("gate-mixed", usd="1")
    principal = await domain.principal(issued)
    limits = domain.limits
    gate = FreeGate(_engine(domain))

    async def through_writer() -> str:
        try:
            await domain.writer.run(
                lambda session: limits.admit(
                    session, principal, model_id="unit/chat:free", estimate_micros=0, now=NOW
                )
            )
        except GatewayError as refused:
            return str(refused.status)
        return "ok"

    async def through_gate() -> str:
        return (await _count(gate, issued)).split()[0]

    outcomes = Counter(
        await asyncio.gather(*(f() for _ in range(30) for f in (through_writer, through_gate)))
    )
    assert outcomes == {"ok": REQUESTS_PER_MINUTE, "429": 40}
    assert (await _windows(domain, issued.workspace.account_id))["minute"] == 20


async def test_enforced_limits_admit_alone_counts_metrics(pg_domain: Domain) -> None:
    domain = pg_domain
    issued = await domain.funded_key("gate-metrics", usd="1")
    principal = await domain.principal(issued)
    limits = domain.limits
    for _ in range(REQUESTS_PER_MINUTE):
        hold = await limits.admit_alone(
            _engine(domain), principal, model_id="unit/chat:free", now=NOW
        )
        assert (hold.id, hold.amount_micros) == ("", 0)  # a zero estimate reserves nothing
    with pytest.raises(GatewayError) as refused:
        await limits.admit_alone(_engine(domain), principal, model_id="unit/chat:free", now=NOW)
    assert refused.value.status == 429
    assert refused.value.headers["X-RateLimit-Reset"] == str(
        int((MINUTE + timedelta(minutes=1)).timestamp() * 1000)
    )
    assert domain.metrics.admissions.labels("admitted")._value.get() == REQUESTS_PER_MINUTE
    assert domain.metrics.admissions.labels("free_model_limit")._value.get() == 1


async def test_connections_close_with_the_engine_and_come_back(pg_domain: Domain) -> None:
    issued = await pg_domain.funded_key("gate-dispose", usd="1")
    engine = _engine(pg_domain)
    gate = FreeGate(engine, most=2)
    await asyncio.gather(*(_count(gate, issued) for _ in range(4)))
    opened = list(gate._idle)
    assert 1 <= len(opened) <= 2
    await engine.dispose()
    assert all(connection.is_closed() for connection in opened) and not gate._idle
    assert await _count(gate, issued) == "ok"  # opened anew


async def test_a_connection_the_server_ended_is_replaced(pg_domain: Domain) -> None:
    issued = await pg_domain.funded_key("gate-lost", usd="1")
    gate = FreeGate(_engine(pg_domain), most=1)
    assert await _count(gate, issued) == "ok"
    (connection,) = gate._idle
    async with pg_domain.sessions() as session:
        await session.exec(  # type: ignore[call-overload]
            sa.text("SELECT pg_terminate_backend(:pid)"),
            params={"pid": connection.get_server_pid()},
        )
    await eventually(connection.is_closed)
    assert await _count(gate, issued) == "ok"  # a new connection in its place
    assert gate._idle != [connection]
    assert (await _windows(pg_domain, issued.workspace.account_id))["minute"] == 2


async def test_a_connection_lost_mid_count_is_a_connection_error(pg_domain: Domain) -> None:
    """Lost before its answer, a count may or may not have been committed: the caller gets
    a ConnectionError (503, as for the writer's failed batch) — never more admitted than
    counted — and the gate goes on with a new connection."""
    issued = await pg_domain.funded_key("gate-cut", usd="1")
    gate = FreeGate(_engine(pg_domain), most=1)
    assert await _count(gate, issued) == "ok"
    (connection,) = gate._idle
    connection._transport.abort()  # type: ignore[attr-defined]  # the socket, cut
    with pytest.raises(ConnectionError):
        await _count(gate, issued)
    assert await _count(gate, issued) == "ok"


def test_only_a_lone_free_count_is_admitted_alone() -> None:
    budget = GuardrailBudget("g1", "cap", 1_000_000, "daily", include_byok=False)
    assert is_free_count_alone("unit/chat:free", 0, (), byok=False)
    assert not is_free_count_alone("unit/ok", 0, (), byok=False)  # paid
    assert not is_free_count_alone("unit/chat:free", 5, (), byok=False)  # holds too
    assert not is_free_count_alone("unit/chat:free", 0, (budget,), byok=False)
    assert not is_free_count_alone("unit/chat:free", 0, (), byok=True)


async def test_the_transcriber_admits_alone_on_postgresql_only(any_domain: Domain) -> None:
    """On SQLite the count stays a unit of the writer's batch; limits that cannot admit
    alone (bench/unlimited.py's) always go through the writer."""
    alone = any_domain.transcriber()._alone
    assert (alone is not None) == (any_domain.dialect == "postgres")

    assert isinstance(any_domain.limits, AloneAdmission)
    assert not isinstance(NoLimits(), AloneAdmission)
