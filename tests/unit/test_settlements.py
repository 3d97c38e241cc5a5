"""A leased request's charge commits beside its answer (server/billing/settlements.py,
Transcriber._charge_after_answer): the answer does not wait for the commit, the lease keeps
the amount held until it, a reader of the account waits for it, a failed commit is tried
again and, given up, is not charged and is counted; shutdown waits for what is still
committing."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

import pytest
from sqlalchemy.exc import OperationalError

from server.billing.holds import DEFAULT_HOLD_TTL, sweep_expired_holds
from server.billing.settlements import Settlements
from server.db.models import CreditHold, Generation
from server.limits.leases import LEASE_WINDOW, SLICE_REQUESTS
from server.transcription import transcriber as transcriber_module
from server.transcription.transcriber import TranscriptionResult
from testkit.admin import IssuedKey
from testkit.domain import Domain, stt_input


async def _answered(domain: Domain, issued: IssuedKey) -> TranscriptionResult:
    """A transcription as the service answers it: returned without waiting for its charge."""
    async with domain.sessions() as session:
        principal = await domain.principal(issued)
        return await domain.transcriber().transcribe(session, principal, stt_input("unit/ok"))


async def _lease_row(domain: Domain, issued: IssuedKey) -> int:
    (lease,) = await domain.rows(CreditHold, CreditHold.key_hash == issued.hash)
    assert lease.id.startswith("lease_")
    return int(lease.amount_micros)


def _lost(domain: Domain) -> tuple[float | None, float | None]:
    """gateway_charges_lost_total and its USD, as Prometheus reads them."""
    registry = domain.metrics.registry
    return (
        registry.get_sample_value("gateway_charges_lost_total"),
        registry.get_sample_value("gateway_charges_lost_usd_total"),
    )


async def test_the_answer_does_not_wait_for_its_charge(
    domain: Domain, monkeypatch: pytest.MonkeyPatch
) -> None:
    issued = await domain.funded_key("beside-answer", usd="100")
    account = issued.workspace.account_id
    first = await domain.transcribe(issued)  # takes the lease; its charge commits
    cost = first.cost_micros
    assert cost > 0
    real_run = domain.writer.run
    committing = asyncio.Event()
    units = []

    async def held_run(unit, **kwargs):  # type: ignore[no-untyped-def]
        units.append(unit)
        await committing.wait()
        return await real_run(unit, **kwargs)

    monkeypatch.setattr(domain.writer, "run", held_run)
    result = await _answered(domain, issued)
    # Answered, with what the credits pay, while its charge has not committed.
    assert result.cost_micros == cost
    assert domain.settlements.pending == 1
    assert await domain.charges(account) == [cost]
    # The lease's row still holds the amount (no other request can spend it meanwhile).
    assert await _lease_row(domain, issued) == (SLICE_REQUESTS - 1) * cost
    assert await domain.count(Generation, Generation.id == result.generation_id) == 0
    # The charge waiting for the writer keeps none of the audio (its body's budget is back).
    (unit,) = units
    assert unit.keywords["request"].audio == b""
    assert unit.keywords["request"].session_id == result.request.session_id
    reader = asyncio.ensure_future(domain.settlements.settled(account))
    await asyncio.sleep(0.01)
    assert not reader.done()  # a reader of the account waits for it
    committing.set()
    await asyncio.wait_for(reader, 5)
    assert domain.settlements.pending == 0
    assert await domain.charges(account) == [cost, cost]
    assert await domain.counted_spend(account) == 2 * cost
    assert await _lease_row(domain, issued) == (SLICE_REQUESTS - 2) * cost
    (generation,) = await domain.rows(Generation, Generation.id == result.generation_id)
    assert (generation.status, generation.cost_micros) == ("completed", cost)
    assert generation.latency_ms is not None and generation.latency_ms >= 0
    await domain.drain_leases()
    assert await domain.count(CreditHold, CreditHold.account_id == account) == 0


async def test_a_charge_that_fails_after_its_answer_is_tried_again(
    domain: Domain, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transcriber_module, "CHARGE_RETRY_PAUSES", (0.0, 0.0))
    real_run = domain.writer.run
    failures = 2

    async def flaky_run(unit, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal failures
        if failures:
            failures -= 1
            raise OperationalError("COMMIT", {}, Exception("disk I/O error"))
        return await real_run(unit, **kwargs)

    issued = await domain.funded_key("beside-retried", usd="100")
    account = issued.workspace.account_id
    first = await domain.transcribe(issued)  # takes the lease; its charge commits
    monkeypatch.setattr(domain.writer, "run", flaky_run)
    result = await _answered(domain, issued)
    await domain.settlements.settled(account)
    assert failures == 0
    assert await domain.charges(account) == [first.cost_micros, result.cost_micros]
    assert _lost(domain) == (0, 0)


async def test_a_charge_given_up_is_not_charged_and_is_counted(
    domain: Domain, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(transcriber_module, "CHARGE_RETRY_PAUSES", (0.0, 0.0))
    issued = await domain.funded_key("beside-lost", usd="100")
    account = issued.workspace.account_id
    # The lease is taken by a first request, whose charge commits.
    first = await domain.transcribe(issued)
    real_run = domain.writer.run
    attempts = 0

    async def failing_run(unit, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal attempts
        attempts += 1
        raise OperationalError("COMMIT", {}, Exception("disk I/O error"))

    monkeypatch.setattr(domain.writer, "run", failing_run)
    with caplog.at_level(logging.ERROR, logger="gateway.transcription"):
        result = await _answered(domain, issued)
        await domain.settlements.settled(account)
    monkeypatch.setattr(domain.writer, "run", real_run)
    assert attempts == 3  # once, then after each pause
    assert await domain.charges(account) == [first.cost_micros]  # the second not charged
    assert _lost(domain) == (1, result.cost_micros / 1_000_000)
    (line,) = [r.getMessage() for r in caplog.records if "not charged" in r.getMessage()]
    assert result.generation_id in line and issued.key not in line
    # Its amount is the lease's again: the lease has nothing running, and goes back whole
    # but for the first charge.
    assert await _lease_row(domain, issued) == (SLICE_REQUESTS - 1) * first.cost_micros
    await domain.drain_leases()
    assert await domain.count(CreditHold, CreditHold.account_id == account) == 0


async def test_a_process_that_dies_before_its_charge_commits_charges_nothing(
    domain: Domain, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The crash window after the answer: the charge never commits, and the lease's row,
    which still holds the amount, lapses like any hold of a dead process. The request is
    free (the operator's loss); nothing is half-written."""
    issued = await domain.funded_key("beside-crash", usd="100")
    account = issued.workspace.account_id
    first = await domain.transcribe(issued)  # takes the lease; its charge commits
    never = asyncio.Event()

    async def stuck_run(unit, **kwargs):  # type: ignore[no-untyped-def]
        await never.wait()

    monkeypatch.setattr(domain.writer, "run", stuck_run)
    answered = await _answered(domain, issued)
    assert answered.cost_micros == first.cost_micros
    for tasks in domain.settlements._pending.values():  # the process dies
        for task in tasks:
            task.cancel()
    await asyncio.sleep(0)
    monkeypatch.undo()
    async with domain.sessions() as session:
        later = domain.clock.now() + LEASE_WINDOW + DEFAULT_HOLD_TTL + timedelta(seconds=1)
        assert await sweep_expired_holds(session, later) == 1
    assert await domain.charges(account) == [first.cost_micros]
    assert await domain.counted_spend(account) == first.cost_micros
    assert await domain.count(Generation, Generation.id == answered.generation_id) == 0
    assert await domain.count(CreditHold, CreditHold.account_id == account) == 0


async def test_a_reader_waits_for_its_own_accounts_charges_only() -> None:
    settlements = Settlements()
    committing = asyncio.Event()

    async def charge() -> None:
        await committing.wait()

    settlements.start("acct_a", charge())
    await settlements.settled("acct_b")  # another account: nothing to wait for
    waiting = asyncio.ensure_future(settlements.settled("acct_a"))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    committing.set()
    await asyncio.wait_for(waiting, 1)
    assert settlements.pending == 0


async def test_a_readers_wait_is_bounded_and_close_waits_for_every_charge() -> None:
    settlements = Settlements()
    committing = asyncio.Event()

    async def charge() -> None:
        await committing.wait()

    settlements.start("acct_a", charge())
    settlements.start("acct_b", charge())
    async with asyncio.timeout(1):
        await settlements.settled("acct_a", within=0.01)  # returns at its bound
    assert settlements.pending == 2
    closing = asyncio.ensure_future(settlements.close(within=5))
    await asyncio.sleep(0.01)
    assert not closing.done()
    committing.set()
    await asyncio.wait_for(closing, 1)
    assert settlements.pending == 0
