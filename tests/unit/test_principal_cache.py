"""The principal cache in-process, on a ManualClock: what it trusts, for how long, and what
drops it (server/auth.py, server/db/stamp.py, server/guardrails/cache.py).

"Another process" is the domain's own engine, which the cache under test does not watch:
its changes reach the cache only through the stamp's triggers. The cache's own engine is
watched, as `build_core` wires it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
import pytest_asyncio
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from server.accounts.keys import delete_key, key_by_hash, update_key
from server.accounts.workspaces import update_workspace, workspace_by_id
from server.auth import Authenticator
from server.clock import ManualClock
from server.db import stamp as stamp_module
from server.db.driver import HotReads
from server.db.engine import SessionFactory, create_engine, session_factory
from server.db.models import ApiKey
from server.db.stamp import PrincipalStampView, changes_principals, watch
from server.errors import GatewayError
from server.guardrails.cache import GuardrailsCache
from server.guardrails.store import create_guardrail
from server.limits.free_models import admit_free_request
from server.limits.key_status import key_status_and_stamp, read_key_status_and_stamp
from testkit.admin import IssuedKey
from testkit.domain import Domain


@dataclass
class Process:
    """One server process's view: its own engine (watched), stamp and caches."""

    engine: AsyncEngine
    sessions: SessionFactory
    auth: Authenticator
    guardrails: GuardrailsCache
    statements: list[str]

    async def authenticate(self, issued: IssuedKey) -> Any:
        async with self.sessions() as session:
            return await self.auth.authenticate(session, issued.metadata)

    async def refusal(self, issued: IssuedKey) -> str | None:
        try:
            await self.authenticate(issued)
        except GatewayError as error:
            assert error.status == 401
            return error.message
        return None


@pytest_asyncio.fixture
async def process(domain: Domain, clock: ManualClock) -> AsyncIterator[Process]:
    engine = create_engine(str(domain.sessions.kw["bind"].url))
    stamp = PrincipalStampView(clock)
    watch(engine, stamp)
    statements: list[str] = []

    def record(_c: Any, _cu: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    sa.event.listen(engine.sync_engine, "before_cursor_execute", record)
    yield Process(
        engine,
        session_factory(engine),
        Authenticator(clock, stamp),
        GuardrailsCache(stamp),
        statements,
    )
    await engine.dispose()


async def _change_elsewhere(domain: Domain, issued: IssuedKey, **values: object) -> None:
    await domain.admin.update_key(issued, **values)


async def test_a_cached_caller_costs_no_statement_within_the_second(
    domain: Domain, process: Process, clock: ManualClock
) -> None:
    issued = await domain.funded_key("pc-hit")
    first = await process.authenticate(issued)
    process.statements.clear()
    clock.advance(timedelta(milliseconds=900))
    again = await process.authenticate(issued)
    assert again is first
    assert process.statements == []
    assert process.auth.cached(issued.metadata) is first


async def test_a_change_elsewhere_is_seen_once_the_second_has_passed(
    domain: Domain, process: Process, clock: ManualClock
) -> None:
    issued = await domain.funded_key("pc-dis")
    await process.authenticate(issued)
    await _change_elsewhere(domain, issued, disabled=True)
    clock.advance(timedelta(milliseconds=999))
    assert await process.refusal(issued) is None  # still inside the cache's second
    clock.advance(timedelta(milliseconds=1))
    assert await process.refusal(issued) == "API key is disabled"
    assert process.auth.cached(issued.metadata) is None  # disabled keys are never cached


async def test_a_key_deleted_elsewhere_is_refused_after_the_second(
    domain: Domain, process: Process, clock: ManualClock
) -> None:
    issued = await domain.funded_key("pc-del")
    await process.authenticate(issued)
    async with domain.sessions() as session:
        await delete_key(session, await key_by_hash(session, issued.hash))
        await session.commit()
    clock.advance(timedelta(seconds=1))
    assert await process.refusal(issued) == "Invalid API key"


async def test_this_process_s_own_change_drops_the_cache_at_once(
    domain: Domain, process: Process, clock: ManualClock
) -> None:
    issued = await domain.funded_key("pc-own")
    other = await domain.admin.key(issued.workspace, "bystander")
    await process.authenticate(issued)
    await process.authenticate(other)
    async with process.sessions() as session:
        key = await key_by_hash(session, issued.hash)
        await update_key(session, key, {"disabled": True}, clock.now())
        await session.commit()
    # No clock movement: the commit itself dropped it (every caller, to be safe).
    assert process.auth.cached(other.metadata) is None
    assert await process.refusal(issued) == "API key is disabled"
    assert await process.refusal(other) is None


async def test_a_rolled_back_change_drops_nothing(domain: Domain, process: Process) -> None:
    issued = await domain.funded_key("pc-rb")
    principal = await process.authenticate(issued)
    async with process.sessions() as session:
        await session.exec(
            sa.update(ApiKey).where(ApiKey.hash == issued.hash).values(disabled=True)  # type: ignore[arg-type]
        )
        await session.rollback()
    assert process.auth.cached(issued.metadata) is principal


async def test_expiry_is_checked_on_every_request_against_the_clock(
    domain: Domain, process: Process, clock: ManualClock
) -> None:
    issued = await domain.funded_key("pc-exp", expires_at=clock.now() + timedelta(seconds=30))
    await process.authenticate(issued)
    clock.advance(timedelta(milliseconds=500))
    assert await process.refusal(issued) is None
    clock.advance(timedelta(seconds=30))
    assert await process.refusal(issued) == "API key has expired"
    with pytest.raises(GatewayError):
        process.auth.cached(issued.metadata)


async def test_last_used_is_written_at_most_once_a_minute(
    domain: Domain, process: Process, clock: ManualClock
) -> None:
    issued = await domain.funded_key("pc-used")

    async def last_used() -> Any:
        async with domain.sessions() as session:
            return (await key_by_hash(session, issued.hash)).last_used_at

    await process.authenticate(issued)
    first = await last_used()
    assert first == clock.now()
    # Set back elsewhere: a write by this process within its minute would show.
    await domain.admin.update_key(issued, last_used_at=first - timedelta(hours=1))
    for _ in range(5):
        clock.advance(timedelta(seconds=11))
        await process.authenticate(issued)
    assert await last_used() == first - timedelta(hours=1)
    clock.advance(timedelta(seconds=5))  # 60 s after the first
    await process.authenticate(issued)
    assert await last_used() == clock.now()


async def test_guardrails_are_cached_and_dropped_with_the_stamp(
    domain: Domain, process: Process, clock: ManualClock
) -> None:
    issued = await domain.funded_key("pc-guard")
    async with process.sessions() as session:
        assert (await process.guardrails.of(session, issued.workspace.id, issued.hash)).rules == ()
    async with domain.sessions() as session:  # elsewhere
        await create_guardrail(
            session,
            issued.workspace.id,
            {"name": "budget", "limit_micros": 1_000_000, "reset_interval": "daily"},
            clock.now(),
        )
        await session.commit()
    assert process.guardrails.cached(issued.workspace.id, issued.hash) is not None
    clock.advance(timedelta(seconds=1))
    assert process.guardrails.cached(issued.workspace.id, issued.hash) is None
    async with process.sessions() as session:
        rules = (await process.guardrails.of(session, issued.workspace.id, issued.hash)).rules
    assert [rule.name for rule in rules] == ["budget"]


async def test_key_status_is_never_cached_and_reads_the_stamp(
    any_domain: Domain, clock: ManualClock
) -> None:
    """One statement, on a session or outside any (GET /key's common case): a charge made
    elsewhere is in the next read; the stamp moves with a change to a key."""
    domain = any_domain
    issued = await domain.funded_key("pc-status", limit="5", limit_reset="daily")
    engine: AsyncEngine = domain.sessions.kw["bind"]
    reads = HotReads(engine)
    try:
        async with domain.sessions() as session:
            key = await key_by_hash(session, issued.hash)
            principal = await Authenticator(clock).authenticate(session, issued.metadata)
            status, stamp = await key_status_and_stamp(session, key, principal.account, clock.now())
        assert status.usage.spend["all"] == 0 and status.limit_remaining_micros == 5_000_000
        await domain.admin.charge(issued, "1.25")
        await domain.admin.charge(issued, "0.5", is_byok=True)
        fresh, same = await read_key_status_and_stamp(reads, key, principal.account, clock.now())
        assert same == stamp
        assert fresh.usage.spend == {
            "all": 1_250_000,
            "day": 1_250_000,
            "week": 1_250_000,
            "month": 1_250_000,
        }
        assert fresh.usage.byok["day"] == 500_000
        assert fresh.limit_remaining_micros == 3_750_000
        assert fresh.free_model_daily_requests.used == 0
        for _ in range(2):
            async with domain.sessions() as session:
                await admit_free_request(
                    session,
                    account_id=principal.account.id,
                    credits_purchased_micros=0,
                    exempt=False,
                    now=clock.now(),
                )
                await session.commit()
        counted, _ = await read_key_status_and_stamp(reads, key, principal.account, clock.now())
        assert counted.free_model_daily_requests.used == 2
        async with domain.sessions() as session:
            in_session, _ = await key_status_and_stamp(session, key, principal.account, clock.now())
        assert in_session == counted
        await domain.admin.update_key(issued, name="renamed")
        _, moved = await read_key_status_and_stamp(reads, key, principal.account, clock.now())
        assert moved != stamp
    finally:
        reads.close()


@pytest.mark.parametrize(
    ("statement", "changes"),
    [
        ("UPDATE api_keys SET last_used_at=? WHERE api_keys.hash = ?", False),
        ("UPDATE api_keys SET disabled=?, updated_at=? WHERE api_keys.hash = ?", True),
        ("UPDATE api_keys SET updated_at=$1::TIMESTAMP WITH TIME ZONE, name=$2", True),
        (
            "UPDATE accounts SET lock_version=(accounts.lock_version + ?) WHERE accounts.id = ?",
            False,
        ),
        (
            "UPDATE accounts SET credits_purchased_micros=(accounts.credits_purchased_micros + ?)"
            " WHERE accounts.id = ?",
            True,
        ),
        ("INSERT INTO api_keys (hash, workspace_id) VALUES (?, ?)", False),
        ("DELETE FROM api_keys WHERE api_keys.hash = ?", True),
        ("INSERT INTO guardrails (id, workspace_id) VALUES (?, ?)", True),
        ("DELETE FROM guardrail_key_assignments WHERE id = ?", True),
        ("UPDATE workspaces SET webhook_secret=? WHERE workspaces.id = ?", True),
        ("UPDATE video_jobs SET status=? WHERE video_jobs.id = ?", False),
        ("SELECT api_keys.hash FROM api_keys", False),
        # A workspace's BYOK keys and their data keys (migration 0012).
        ("INSERT INTO byok_keys (id, workspace_id) VALUES (?, ?)", True),
        ("UPDATE byok_keys SET disabled=? WHERE byok_keys.id = ?", True),
        ("DELETE FROM byok_keys WHERE byok_keys.id = ?", True),
        ("INSERT INTO vault_keys (vault_id, wrapped_key) VALUES (?, ?) ON CONFLICT", False),
        ("UPDATE vault_keys SET wrapped_key=?, master_key_id=? WHERE vault_id = ?", True),
        ("UPDATE byok_monthly_requests SET requests=? WHERE account_id = ?", False),
    ],
)
def test_which_statements_change_principals(statement: str, changes: bool) -> None:
    assert changes_principals(statement) is changes


async def test_one_stamp_read_serves_the_requests_waiting_for_it(
    domain: Domain, process: Process, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    issued = await domain.funded_key("pc-one-read")
    await process.authenticate(issued)
    reads: list[object] = []
    real = stamp_module.fetch_rows

    async def counted(*args: Any, **kwargs: Any) -> Any:
        reads.append(args[1])
        return await real(*args, **kwargs)

    monkeypatch.setattr(stamp_module, "fetch_rows", counted)
    clock.advance(timedelta(seconds=1))
    principals = await asyncio.gather(*(process.authenticate(issued) for _ in range(10)))
    assert len(reads) == 1
    assert len({id(p) for p in principals}) == 1


async def test_a_request_holding_the_connection_never_waits_on_another_s_stamp_read(
    domain: Domain, process: Process, clock: ManualClock
) -> None:
    """SQLite has one pooled connection: a request that holds it must not wait for a read
    that needs it (it reads the stamp itself)."""
    issued = await domain.funded_key("pc-no-deadlock")
    await process.authenticate(issued)
    clock.advance(timedelta(seconds=1))
    async with process.sessions() as holding:
        await holding.exec(sa.select(sa.literal(1)))  # type: ignore[call-overload]
        waiting = asyncio.create_task(process.authenticate(issued))  # reads: needs the pool
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await asyncio.wait_for(process.auth.stamp.check(holding), timeout=5)
    await asyncio.wait_for(waiting, timeout=5)


async def test_a_workspace_disabled_elsewhere_refuses_its_keys_after_the_second(
    domain: Domain, process: Process, clock: ManualClock
) -> None:
    """The operator's switch (migration 0015): every key of a disabled workspace is refused
    like a disabled key, everywhere within the stamp's second; enabled again, they work."""
    issued = await domain.funded_key("pc-ws-off")
    await process.authenticate(issued)
    async with domain.sessions() as session:
        workspace = await workspace_by_id(session, issued.workspace.id)
        assert workspace is not None
        await update_workspace(session, workspace, disabled=True)
        await session.commit()
    clock.advance(timedelta(seconds=1))
    assert await process.refusal(issued) == "API key's workspace is disabled"
    assert process.auth.cached(issued.metadata) is None
    async with domain.sessions() as session:
        workspace = await workspace_by_id(session, issued.workspace.id)
        assert workspace is not None
        await update_workspace(session, workspace, disabled=False)
        await session.commit()
    clock.advance(timedelta(seconds=1))
    assert await process.refusal(issued) is None
