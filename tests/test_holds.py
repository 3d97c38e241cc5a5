"""Credit holds on a real SQLite file and PostgreSQL: reserve, settle, release, expire."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import grpc
import pytest
import sqlalchemy as sa
from sqlmodel.ext.asyncio.session import AsyncSession

from server.billing.holds import (
    Hold,
    finish_uncancelled,
    place_hold,
    release_hold,
    reserve_slice,
    settle_hold,
    sweep_expired_holds,
)
from server.billing.money import usd_to_micros
from server.clock import ManualClock
from server.contract import audio_pb2, audio_pb2_grpc
from server.db.models import CreditHold, Generation, LedgerEntry, UsageCounter
from server.db.writer import Writer
from server.errors import GatewayError
from server.observability.generations import GENERATIONS
from testkit.admin import Admin, IssuedKey
from testkit.audio import fixture
from testkit.eventually import eventually
from tests.conftest import Stack
from tests.support.signals import admitted

# The database is the point: on SQLite and PostgreSQL (see tests/conftest.py).
pytestmark = pytest.mark.both_backends


async def _hold(admin: Admin, issued: IssuedKey, usd: str, **kw: object) -> object:
    async with admin.sessions() as session:
        hold = await place_hold(
            session,
            account_id=issued.workspace.account_id,
            key_hash=issued.hash,
            amount_micros=usd_to_micros(usd),
            now=admin.clock.now(),
            **kw,  # type: ignore[arg-type]
        )
        await session.commit()  # the caller commits a hold
        return hold


async def _refused(admin: Admin, issued: IssuedKey, usd: str) -> GatewayError:
    with pytest.raises(GatewayError) as refused:
        await _hold(admin, issued, usd)
    assert refused.value.status == 402
    return refused.value


async def test_holds_settle_release_and_in_flight_budget(admin_db: Admin) -> None:
    admin_db.clock = ManualClock(datetime(2026, 7, 1, 12, tzinfo=UTC))
    workspace = await admin_db.workspace("holds")
    await admin_db.credits(workspace, "10")
    issued = await admin_db.key(workspace, limit="1")

    first = await _hold(admin_db, issued, "0.6")
    waiting = await _refused(admin_db, issued, "0.6")
    assert waiting.metadata == {"limit_source": "openrouter_in_flight_budget"}
    assert waiting.retry_after_seconds is not None

    async with admin_db.sessions() as session:
        await settle_hold(
            session,
            first,
            cost_micros=usd_to_micros("0.5"),  # type: ignore[arg-type]
            now=admin_db.clock.now(),
            reference="gen_1",
        )
        await session.commit()  # the caller commits the settlement with its record
    over = await _refused(admin_db, issued, "0.6")  # 0.5 left of the cap
    assert over.metadata == {"limit_source": "openrouter_key_limit"}
    second = await _hold(admin_db, issued, "0.5")
    async with admin_db.sessions() as session:
        await release_hold(session, second)  # type: ignore[arg-type]
        remaining = (await session.exec(sa.select(sa.func.count()).select_from(CreditHold))).one()
    assert remaining[0] == 0
    await _hold(admin_db, issued, "0.5")  # released: available again


async def test_expired_holds_stop_counting(admin_db: Admin) -> None:
    clock = ManualClock(datetime(2026, 7, 1, 12, tzinfo=UTC))
    admin_db.clock = clock
    workspace = await admin_db.workspace("expiry")
    await admin_db.credits(workspace, "1")
    issued = await admin_db.key(workspace)
    await _hold(admin_db, issued, "1", ttl=timedelta(minutes=5))
    refused = await _refused(admin_db, issued, "0.5")
    assert refused.metadata == {"limit_source": "openrouter_in_flight_budget"}
    clock.advance(timedelta(minutes=5, seconds=1))  # the holder crashed; its hold lapsed
    await _hold(admin_db, issued, "0.5")


async def test_balance_at_zero_refuses_even_free_requests(admin_db: Admin) -> None:
    workspace = await admin_db.workspace("zero")
    issued = await admin_db.key(workspace)
    refused = await _refused(admin_db, issued, "0")
    assert refused.metadata == {"limit_source": "openrouter_credits"}
    await admin_db.credits(workspace, "1")
    await admin_db.charge(issued, "1")
    assert (await _refused(admin_db, issued, "0")).metadata == {
        "limit_source": "openrouter_credits"
    }


async def test_a_request_in_flight_across_midnight(admin_db: Admin) -> None:
    """Held before midnight, settled after: its hold keeps counting until it settles, and
    its charge lands on the day it settled (the counters are by settlement time)."""
    clock = ManualClock(datetime(2026, 7, 1, 23, 59, 59, tzinfo=UTC))
    admin_db.clock = clock
    workspace = await admin_db.workspace("midnight")
    await admin_db.credits(workspace, "10")
    issued = await admin_db.key(workspace, limit="1", limit_reset="daily")
    in_flight = await _hold(admin_db, issued, "0.6")
    clock.advance(timedelta(seconds=2))  # 2 July 00:00:01: a new day for the daily cap
    waiting = await _refused(admin_db, issued, "0.6")
    assert waiting.metadata == {"limit_source": "openrouter_in_flight_budget"}
    async with admin_db.sessions() as session:
        await settle_hold(
            session,
            in_flight,
            cost_micros=usd_to_micros("0.6"),  # type: ignore[arg-type]
            now=clock.now(),
            reference="gen_midnight",
        )
        await session.commit()
        day_rows = (
            await session.exec(
                sa.select(UsageCounter.period_start, UsageCounter.spend_micros).where(
                    UsageCounter.subject == "key",
                    UsageCounter.subject_id == issued.hash,
                    UsageCounter.period == "day",
                )
            )
        ).all()
    assert [(str(d), s) for d, s in day_rows] == [("2026-07-02", 600_000)]
    over = await _refused(admin_db, issued, "0.6")  # 0.4 left of today's cap
    assert over.metadata == {"limit_source": "openrouter_key_limit"}
    clock.advance(timedelta(days=1))  # 3 July: the cap starts afresh
    await _hold(admin_db, issued, "0.6")


async def test_lapsed_holds_are_swept(admin_db: Admin) -> None:
    clock = ManualClock(datetime(2026, 7, 1, 12, tzinfo=UTC))
    admin_db.clock = clock
    workspace = await admin_db.workspace("sweep")
    await admin_db.credits(workspace, "5")
    issued = await admin_db.key(workspace)
    await _hold(admin_db, issued, "1", ttl=timedelta(minutes=1))
    await _hold(admin_db, issued, "1", ttl=timedelta(minutes=10))
    clock.advance(timedelta(minutes=2))
    async with admin_db.sessions() as session:
        assert await sweep_expired_holds(session, clock.now()) == 1
        left = (await session.exec(sa.select(sa.func.count()).select_from(CreditHold))).one()
    assert left[0] == 1


def _record(issued: IssuedKey, generation_id: str, cost: int, now: datetime) -> dict[str, object]:
    return {
        "id": generation_id,
        "account_id": issued.workspace.account_id,
        "workspace_id": issued.workspace.id,
        "key_hash": issued.hash,
        "kind": "stt",
        "model": "fake/ok",
        "provider": "fake",
        "status": "completed",
        "cost_micros": cost,
        "is_byok": False,
        "seconds": None,
        "latency_ms": 3,
        "session_id": None,
        "user": None,
        "trace": {"a": 1},
        "error": None,
        "created_at": now,
    }


@pytest.mark.parametrize("batched", [False, True], ids=["session", "writer-batch"])
async def test_a_settlement_with_its_record_writes_all_or_nothing(
    admin_db: Admin, batched: bool
) -> None:
    """settle_hold with the request's record (one statement on PostgreSQL, through the driver
    in a writer's batch or SQLAlchemy on a plain session): the hold goes (a lease's row
    shrinks, nothing else of it changes), the ledger row, the eight counters and the record
    are written; a settlement that fails (its record's id is taken) writes none of them."""
    now = datetime(2026, 7, 1, 12, tzinfo=UTC)
    admin_db.clock = ManualClock(now)
    workspace = await admin_db.workspace("settle-row")
    await admin_db.credits(workspace, "10")
    issued = await admin_db.key(workspace)
    account = workspace.account_id
    plain = await _hold(admin_db, issued, "0.5")
    async with admin_db.sessions() as session:
        assert await reserve_slice(
            session,
            lease_id="lease_x",
            account_id=account,
            key_hash=issued.hash,
            amount_micros=usd_to_micros("1"),
            now=now,
            ttl=timedelta(minutes=5),
        )
        await session.commit()
    leased = Hold("", account, issued.hash, usd_to_micros("0.25"), False, lease_id="lease_x")
    writer = Writer(admin_db.sessions) if batched else None

    async def settle(hold: Hold, generation_id: str, cost: int) -> None:
        async def unit(session: AsyncSession) -> None:
            await settle_hold(
                session,
                hold,
                cost_micros=cost,
                now=now,
                reference=generation_id,
                row=(GENERATIONS, _record(issued, generation_id, cost, now)),
            )

        if writer is not None:
            await writer.run(unit)
            return
        async with admin_db.sessions() as session:
            await unit(session)
            await session.commit()

    async def state() -> tuple[object, ...]:
        async with admin_db.sessions() as session:
            holds = (
                await session.exec(
                    sa.select(CreditHold.id, CreditHold.amount_micros, CreditHold.expires_at)
                    .where(CreditHold.account_id == account)
                    .order_by(CreditHold.id)
                )
            ).all()
            charges = (
                await session.exec(
                    sa.select(LedgerEntry.amount_micros, LedgerEntry.reference).where(
                        LedgerEntry.account_id == account, LedgerEntry.kind == "charge"
                    )
                )
            ).all()
            counters = (
                await session.exec(
                    sa.select(UsageCounter.subject, UsageCounter.period, UsageCounter.spend_micros)
                    .where(UsageCounter.subject_id.in_([account, issued.hash]))  # type: ignore[attr-defined]
                    .order_by(UsageCounter.subject, UsageCounter.period)
                )
            ).all()
            records = (
                await session.exec(
                    sa.select(Generation.id, Generation.cost_micros, Generation.trace).where(
                        Generation.account_id == account
                    )
                )
            ).all()
        return tuple(holds), sorted(charges), tuple(counters), sorted(records)

    try:
        before = await state()
        expires = next(h[2] for h in before[0] if h[0] == "lease_x")  # type: ignore[attr-defined, index]
        await settle(plain, "gen_a", 400_000)  # type: ignore[arg-type]
        await settle(leased, "gen_b", 200_000)
        holds, charges, counters, records = await state()
        assert [tuple(h) for h in holds] == [("lease_x", 750_000, expires)]
        assert [tuple(c) for c in charges] == [(200_000, "gen_b"), (400_000, "gen_a")]
        assert [tuple(c) for c in counters] == [
            (subject, period, 600_000)
            for subject in ("account", "key")
            for period in ("all", "day", "month", "week")
        ]
        assert [tuple(r) for r in records] == [
            ("gen_a", 400_000, {"a": 1}),
            ("gen_b", 200_000, {"a": 1}),
        ]
        settled = await state()
        with pytest.raises(Exception):  # noqa: B017  # the database's duplicate-key error
            await settle(leased, "gen_a", 100_000)
        assert await state() == settled
    finally:
        if writer is not None:
            await writer.close()


# --- cancellation paths over gRPC (the real server, a slow fake provider) ----------------


async def _no_hold_left(stack: Stack, account: str) -> None:
    await stack.admin.no_hold_left(CreditHold.account_id == account)


def _request() -> audio_pb2.TranscriptionRequest:
    return audio_pb2.TranscriptionRequest(
        model="fake/slow-ok", input_audio=audio_pb2.InputAudio(data=fixture(), format="wav")
    )


async def test_grpc_deadlines_release_the_hold(stack: Stack, funded: IssuedKey) -> None:
    """Callers whose deadline passes at every stage of the call — while it is admitted,
    while its hold commits, during the provider call — leave no hold and no charge."""
    account = funded.workspace.account_id
    metadata = (("authorization", f"Bearer {funded.key}"),)
    admitted_before = await admitted(stack.gateway)
    provider_calls_before = len(stack.fake_stt.calls_for("slow-2"))
    timeouts = (0.02, 0.05, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.8, 1.2)
    async with grpc.aio.insecure_channel(stack.grpc_target) as channel:
        stub = audio_pb2_grpc.AudioStub(channel)
        for timeout in timeouts:
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                await stub.CreateTranscription(_request(), metadata=metadata, timeout=timeout)
            assert failure.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED

    async def every_admitted_call_ended() -> bool:
        # An admitted call's last write is its generation record (after its hold is released
        # or settled): once every admitted call has one, none can still hold or charge —
        # a late provider answer included.
        calls = await admitted(stack.gateway) - admitted_before
        return await stack.admin.count(Generation, Generation.account_id == account) == calls

    await eventually(every_admitted_call_ended, within=30, message="every admitted call ended")
    at_provider = len(stack.fake_stt.calls_for("slow-2")) - provider_calls_before
    assert await admitted(stack.gateway) - admitted_before >= at_provider > 0
    completed = (Generation.account_id == account, Generation.status != "failed")
    assert await stack.admin.count(Generation, *completed) == 0
    await _no_hold_left(stack, account)
    charges = (LedgerEntry.account_id == account, LedgerEntry.kind == "charge")
    assert await stack.admin.count(LedgerEntry, *charges) == 0


async def test_a_grpc_client_cancel_releases_the_hold(stack: Stack, funded: IssuedKey) -> None:
    account = funded.workspace.account_id
    calls_before = len(stack.fake_stt.calls_for("slow-2"))
    metadata = (("authorization", f"Bearer {funded.key}"),)
    async with grpc.aio.insecure_channel(stack.grpc_target) as channel:
        call = audio_pb2_grpc.AudioStub(channel).CreateTranscription(
            _request(), metadata=metadata, timeout=30
        )
        await eventually(
            lambda: len(stack.fake_stt.calls_for("slow-2")) > calls_before,
            within=10,
            message="the call reached the provider",
        )
        assert await stack.admin.count(CreditHold, CreditHold.account_id == account) == 1
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    # The cancelled call's last write is its (failed) generation record: once it is there,
    # the hold is released and no late answer can charge the call.
    await eventually(
        lambda: stack.admin.count(Generation, Generation.account_id == account),
        within=30,
        message="the cancelled call recorded its failure",
    )
    await _no_hold_left(stack, account)
    charges = (LedgerEntry.account_id == account, LedgerEntry.kind == "charge")
    assert await stack.admin.count(LedgerEntry, *charges) == 0


async def test_finish_uncancelled_completes_its_work_through_cancellations() -> None:
    """The release runs to its end however often the request's task is cancelled meanwhile,
    and the cancellation is then passed on."""
    done: list[str] = []

    async def release() -> str:
        await asyncio.sleep(0.2)
        done.append("released")
        return "ok"

    async def request() -> str:
        return await finish_uncancelled(release())

    task = asyncio.create_task(request())
    for _ in range(3):  # a deadline, then a client cancel, then a server stop
        await asyncio.sleep(0.03)
        task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert done == ["released"]
    assert await finish_uncancelled(release()) == "ok"


async def test_finish_uncancelled_passes_the_cancellation_on_chained_from_a_failure() -> None:
    """Work that fails after the caller was cancelled: the caller still gets its
    cancellation, with the failure as its cause (as Writer.run(finish_within=...) does), not
    the failure in its place."""

    async def failing_release() -> str:
        await asyncio.sleep(0.1)
        raise ValueError("the release failed")

    async def request() -> str:
        return await finish_uncancelled(failing_release())

    task = asyncio.create_task(request())
    await asyncio.sleep(0.03)
    task.cancel()
    with pytest.raises(asyncio.CancelledError) as cancelled:
        await task
    assert isinstance(cancelled.value.__cause__, ValueError)
    with pytest.raises(ValueError):  # not cancelled: the failure itself
        await finish_uncancelled(failing_release())
