"""Each server process caches a workspace's sealed BYOK keys under the principal stamp
(server/byok/cache.py, migration 0012). What must still hold, with two server processes on
one database (SQLite file or PostgreSQL) sharing a vault master key:

- a BYOK key created on one process serves that process's next request at once, and the
  other's within 1 s;
- a key deleted on one process stops serving there at once, and on the other within 1 s;
- a key disabled outside any server (the CLI, an operator's SQL) stops serving within 1 s
  on both.

The model's only endpoint has no operator credential: a request succeeds (200) only with
the workspace's key, and is refused (503) without it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest_asyncio
import sqlalchemy as sa

from server.db.engine import create_engine, session_factory
from server.db.models import ByokKey
from server.vault.crypto import MasterKey
from testkit.admin import Admin, IssuedKey
from testkit.audio import b64, fixture
from testkit.catalog import fake_endpoint
from testkit.fakes.openai_stt import FakeSttProvider
from testkit.processes import GatewayProcess

OWN_KEY = "sk-own-provider-account-cache-0123456789"
WITHIN = 1.0
REQUEST_SLACK = 0.5  # a request's own latency on a busy 2-core machine comes on top
BODY = {"model": "byok/whisper", "input_audio": {"data": b64(fixture()), "format": "wav"}}


@dataclass
class TwoProcesses:
    first: GatewayProcess
    second: GatewayProcess
    provider: FakeSttProvider
    manager: IssuedKey
    member: IssuedKey
    sessions_url: str


@pytest_asyncio.fixture
async def two_processes(db_url: str, tmp_path: Path) -> AsyncIterator[TwoProcesses]:
    provider = FakeSttProvider(api_keys=(OWN_KEY,)).start()
    catalog = tmp_path / "catalog.toml"
    endpoint = fake_endpoint(provider.base_url, "ok", provider="openai", key_env="BYOK_UNSET_KEY")
    catalog.write_text(
        '[[models]]\nid = "byok/whisper"\nkind = "stt"\nprice_per_second = "0.01"\n'
        f"[[models.endpoints]]\n{endpoint}\n"
    )
    env = {
        "GATEWAY_CATALOG": str(catalog),
        "GATEWAY_VAULT_MASTER_KEY": MasterKey.generate_base64(),  # one vault for both
        "GATEWAY_BYOK_FREE_REQUESTS_PER_MONTH": "1000",
    }
    first = GatewayProcess(data_dir=tmp_path / "first", database_url=db_url, extra_env=env)
    second = GatewayProcess(data_dir=tmp_path / "second", database_url=db_url, extra_env=env)
    engine = create_engine(db_url)
    try:
        await asyncio.gather(asyncio.to_thread(first.start), asyncio.to_thread(second.start))
        admin = Admin(session_factory(engine))
        workspace = await admin.workspace("byok-cache")
        await admin.credits(workspace, "10")
        yield TwoProcesses(
            first,
            second,
            provider,
            await admin.key(workspace, "manager", management=True),
            await admin.key(workspace, "member"),
            db_url,
        )
    finally:
        await engine.dispose()
        await asyncio.gather(asyncio.to_thread(first.stop), asyncio.to_thread(second.stop))
        provider.stop()


async def _status(client: httpx.AsyncClient, process: GatewayProcess, member: IssuedKey) -> int:
    response = await client.post(
        f"{process.base_url}/audio/transcriptions", json=BODY, headers=member.headers
    )
    assert response.status_code in (200, 503), response.text
    return response.status_code


async def _becomes(
    client: httpx.AsyncClient,
    process: GatewayProcess,
    member: IssuedKey,
    wanted: int,
    changed_at: float,
) -> None:
    """Poll until the process answers `wanted`; the first such request must have started
    within 1 s of the change (plus one request's latency)."""
    while True:
        started = time.monotonic()
        if await _status(client, process, member) == wanted:
            assert started - changed_at < WITHIN + REQUEST_SLACK
            return
        assert started - changed_at < WITHIN + REQUEST_SLACK, f"still not {wanted} after 1 s"
        await asyncio.sleep(0.02)


async def test_a_byok_key_created_or_deleted_on_one_process_is_seen_by_the_other_within_1_s(
    two_processes: TwoProcesses,
) -> None:
    stack = two_processes
    both = (stack.first, stack.second)
    async with httpx.AsyncClient(timeout=60) as client:
        for process in both:  # no key yet: cached as "none" on both
            for _ in range(3):
                assert await _status(client, process, stack.member) == 503

        created = await client.post(
            f"{stack.first.base_url}/byok",
            json={"provider": "openai", "key": OWN_KEY},
            headers=stack.manager.headers,
        )
        assert created.status_code == 201, created.text
        changed_at = time.monotonic()
        # The process that created it: at once; the other within the second.
        assert await _status(client, stack.first, stack.member) == 200
        assert stack.provider.calls[-1].authorization == f"Bearer {OWN_KEY}"
        await _becomes(client, stack.second, stack.member, 200, changed_at)
        for process in both:  # now cached with the key on both
            assert await _status(client, process, stack.member) == 200

        key_id = created.json()["data"]["id"]
        deleted = await client.delete(
            f"{stack.second.base_url}/byok/{key_id}", headers=stack.manager.headers
        )
        assert deleted.status_code == 200, deleted.text
        changed_at = time.monotonic()
        assert await _status(client, stack.second, stack.member) == 503
        await _becomes(client, stack.first, stack.member, 503, changed_at)


async def test_a_byok_key_disabled_outside_any_server_stops_serving_within_1_s(
    two_processes: TwoProcesses,
) -> None:
    stack = two_processes
    async with httpx.AsyncClient(timeout=60) as client:
        created = await client.post(
            f"{stack.first.base_url}/byok",
            json={"provider": "openai", "key": OWN_KEY},
            headers=stack.manager.headers,
        )
        assert created.status_code == 201, created.text
        for process in (stack.first, stack.second):
            await _becomes(client, process, stack.member, 200, time.monotonic())
            assert await _status(client, process, stack.member) == 200  # cached
        # The test's own connection, as the CLI or an operator's SQL would.
        engine = create_engine(stack.sessions_url)
        try:
            async with engine.begin() as connection:
                table = ByokKey.__table__  # type: ignore[attr-defined]  # SQLModel's table
                await connection.execute(sa.update(table).values(disabled=True))
        finally:
            await engine.dispose()
        changed_at = time.monotonic()
        for process in (stack.first, stack.second):
            await _becomes(client, process, stack.member, 503, changed_at)
