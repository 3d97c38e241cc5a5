"""Transcriber in-process: admission, routing with fallback, settlement, release."""

from __future__ import annotations

import asyncio

import pytest

from server.db.models import CreditHold, Generation
from server.errors import GatewayError
from testkit.domain import Domain, stt_input


async def test_success_charges_once_and_the_counters_match_the_ledger(domain: Domain) -> None:
    issued = await domain.funded_key("stt-ok")
    account = issued.workspace.account_id
    result = await domain.transcribe(issued, "unit/ok")
    assert result.transcript.text == "in-process transcript"
    assert result.provider == "alpha"
    assert result.cost_micros > 0
    (sent,) = domain.providers.sent_to("stt-ok.test")
    assert sent.url.path == "/v1/audio/transcriptions"  # the catalog's trailing / is dropped
    assert b'name="model"\r\n\r\nwhisper-a' in sent.content  # the endpoint's model name
    assert await domain.charges(account) == [result.cost_micros]
    assert await domain.counted_spend(account) == result.cost_micros
    assert await domain.counted_spend(issued.hash) == result.cost_micros
    await domain.drain_leases()
    assert await domain.count(CreditHold, CreditHold.account_id == account) == 0
    (generation,) = await domain.rows(Generation, Generation.account_id == account)
    assert (generation.id, generation.status) == (result.generation_id, "completed")
    assert generation.cost_micros == result.cost_micros


async def test_a_provider_429_falls_back_to_the_next_endpoint(domain: Domain) -> None:
    issued = await domain.funded_key("stt-429")
    result = await domain.transcribe(issued, "unit/fallback-429")
    assert result.provider == "beta"
    assert len(domain.providers.sent_to("stt-429.test")) == 1
    assert len(domain.providers.sent_to("stt-ok.test")) == 1
    assert await domain.charges(issued.workspace.account_id) == [result.cost_micros]
    assert domain.metrics.fallbacks.labels("unit/fallback-429", "alpha")._value.get() == 1


async def test_when_every_provider_fails_the_hold_is_released_and_nothing_charged(
    domain: Domain,
) -> None:
    issued = await domain.funded_key("stt-fail")
    account = issued.workspace.account_id
    with pytest.raises(GatewayError) as failure:
        await domain.transcribe(issued, "unit/all-fail")
    # The last provider's answer (a 429) is the caller's, naming that provider.
    assert failure.value.status == 429
    assert (failure.value.metadata or {}).get("provider_name") == "beta"
    assert len(domain.providers.sent_to("stt-500.test")) == 1
    assert len(domain.providers.sent_to("stt-429.test")) == 1
    assert await domain.charges(account) == []
    assert await domain.counted_spend(account) == 0
    await domain.drain_leases()
    assert await domain.count(CreditHold, CreditHold.account_id == account) == 0
    (generation,) = await domain.rows(Generation, Generation.account_id == account)
    assert (generation.status, generation.cost_micros) == ("failed", 0)


async def test_an_unfunded_account_is_refused_before_any_provider_call(domain: Domain) -> None:
    issued = await domain.funded_key("stt-broke", usd="0")
    with pytest.raises(GatewayError) as refused:
        await domain.transcribe(issued, "unit/ok")
    assert refused.value.status == 402
    assert (refused.value.metadata or {}).get("limit_source") == "openrouter_credits"
    assert domain.providers.requests == []


async def test_a_failure_after_a_rollback_is_still_recorded(
    domain: Domain, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caller authenticated in the request's own session (as the service does), and the
    settlement fails mid-transaction: the rollback expires the caller's rows, yet the hold is
    released and the failure recorded (it went unrecorded: MissingGreenlet). A charge that
    commits before its answer (one not leased; test_settlements.py has the leased one's)."""
    domain.charges_beside_answers = False
    from server.auth import Authenticator
    from server.transcription import transcriber as module

    real_settle = module.settle_hold

    async def settle_then_fail(*args: object, **kwargs: object) -> None:
        await real_settle(*args, **kwargs)  # type: ignore[arg-type]
        raise RuntimeError("the charge could not be committed")

    monkeypatch.setattr(module, "settle_hold", settle_then_fail)
    issued = await domain.funded_key("stt-settle-fails")
    account = issued.workspace.account_id
    async with domain.sessions() as session:
        principal = await Authenticator(domain.clock).authenticate(session, issued.metadata)
        with pytest.raises(RuntimeError):
            await domain.transcriber().transcribe(session, principal, stt_input("unit/ok"))
    assert await domain.charges(account) == []
    await domain.drain_leases()
    assert await domain.count(CreditHold, CreditHold.account_id == account) == 0
    (generation,) = await domain.rows(Generation, Generation.account_id == account)
    assert (generation.status, generation.cost_micros) == ("failed", 0)


@pytest.mark.parametrize("settlement_fails", [False, True])
async def test_a_caller_cancelled_during_its_settlement_waits_for_its_end(
    domain: Domain, monkeypatch: pytest.MonkeyPatch, settlement_fails: bool
) -> None:
    """The request's task is cancelled (a deadline, then a client cancel) while its charge
    is in the writer's batch: the settlement still runs to its end, the lease learns of it,
    and only then is the cancellation passed on. A settlement that fails releases the hold
    and records the failure, as when nobody cancels. A charge that commits before its
    answer (a leased one's commits after it, whatever becomes of its caller)."""
    domain.charges_beside_answers = False
    from server.transcription import transcriber as module

    real_settle = module.settle_hold
    settling, release = asyncio.Event(), asyncio.Event()

    async def slow_settle(*args: object, **kwargs: object) -> None:
        settling.set()
        await release.wait()
        await real_settle(*args, **kwargs)  # type: ignore[arg-type]
        if settlement_fails:
            raise RuntimeError("the charge could not be committed")

    monkeypatch.setattr(module, "settle_hold", slow_settle)
    issued = await domain.funded_key(f"stt-cancel-settle-{settlement_fails}")
    account = issued.workspace.account_id
    request = asyncio.create_task(domain.transcribe(issued))
    await settling.wait()
    for _ in range(2):
        request.cancel()
        await asyncio.sleep(0.01)
    assert not request.done()  # waits for its settlement
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await request
    charges = await domain.charges(account)
    await domain.drain_leases()
    assert await domain.count(CreditHold, CreditHold.account_id == account) == 0
    (generation,) = await domain.rows(Generation, Generation.account_id == account)
    if settlement_fails:
        assert charges == [] and generation.status == "failed"
    else:
        assert len(charges) == 1 and generation.status == "completed"
        assert await domain.counted_spend(account) == charges[0]
