"""Limits that hold under concurrency: real parallel requests through Envoy to two server
processes sharing one database, SQLite or PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator

import httpx
import pytest
import sqlalchemy as sa

from server.db.models import CreditHold, LedgerEntry, UsageCounter, WebhookDelivery
from testkit.admin import IssuedKey
from testkit.audio import b64, fixture
from testkit.eventually import eventually
from testkit.processes import GatewayProcess
from tests.conftest import Stack
from tests.support.minutes import in_one_minute

# The database is the point: on SQLite and PostgreSQL (see tests/conftest.py).
pytestmark = pytest.mark.both_backends

PRICEY = {"model": "fake/pricey", "input_audio": {"data": b64(fixture()), "format": "wav"}}
COST = 1_075_125  # micro-dollars: 1.075125 s at 1 USD/s


@pytest.fixture(scope="module")
async def second_process(stack: Stack) -> AsyncIterator[GatewayProcess]:
    """Another `gateway up` on the same database: two processes share one SQLite file (whose
    write lock orders their holds) or one PostgreSQL (row locks). One per backend for the
    module: each test works in workspaces of its own."""
    other = GatewayProcess(
        data_dir=stack.gateway.data_dir / "second",
        database_url=stack.gateway.database_url,
        # Its own data dir, the first's vault master key: one key per database.
        extra_env={**stack.gateway.extra_env, **stack.gateway.master_key_env()},
    )
    await asyncio.to_thread(other.start)
    yield other
    await asyncio.to_thread(other.stop)


def _urls(stack: Stack, other: GatewayProcess) -> list[str]:
    return [stack.base_url, other.base_url]


async def _parallel(
    urls: list[str], issued: IssuedKey, body: dict[str, object], n: int
) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=64)) as client:
        return await asyncio.gather(
            *(
                client.post(
                    f"{urls[i % len(urls)]}/audio/transcriptions", json=body, headers=issued.headers
                )
                for i in range(n)
            )
        )


async def _charges_and_counter(stack: Stack, issued: IssuedKey) -> tuple[int, int, int]:
    """The key's charges on the ledger (how many, their sum) and its all-time counter."""
    async with stack.admin.sessions() as session:
        count, total = (
            await session.exec(
                sa.select(sa.func.count(), sa.func.sum(LedgerEntry.amount_micros)).where(
                    LedgerEntry.key_hash == issued.hash, LedgerEntry.kind == "charge"
                )
            )
        ).one()
        counter = (
            await session.exec(
                sa.select(UsageCounter.spend_micros).where(
                    UsageCounter.subject == "key",
                    UsageCounter.subject_id == issued.hash,
                    UsageCounter.period == "all",
                )
            )
        ).one()[0]
    return int(count), int(total or 0), int(counter)


async def test_a_key_cap_admits_exactly_k_and_reconciles(
    stack: Stack, second_process: GatewayProcess, unique: str
) -> None:
    workspace = await stack.admin.workspace(f"cap-{unique}")
    await stack.admin.credits(workspace, "100")
    issued = await stack.admin.key(workspace, limit="5.5")  # room for exactly 5 requests
    responses = await _parallel(_urls(stack, second_process), issued, PRICEY, 40)
    statuses = [r.status_code for r in responses]
    assert statuses.count(200) == 5, statuses
    assert statuses.count(402) == 35
    sources = {
        r.json()["error"]["metadata"]["limit_source"] for r in responses if r.status_code == 402
    }
    assert sources <= {"openrouter_key_limit", "openrouter_in_flight_budget"}
    count, total, counter = await _charges_and_counter(stack, issued)
    assert (count, total) == (5, 5 * COST)
    assert counter == 5 * COST <= 5_500_000  # never beyond the cap


async def test_an_account_balance_admits_exactly_k(
    stack: Stack, second_process: GatewayProcess, unique: str
) -> None:
    workspace = await stack.admin.workspace(f"bal-{unique}")
    await stack.admin.credits(workspace, "3.3")  # exactly 3 requests
    keys = [await stack.admin.key(workspace, f"k{i}") for i in range(3)]
    urls = _urls(stack, second_process)
    results = await asyncio.gather(*(_parallel(urls, key, PRICEY, 10) for key in keys))
    statuses = [r.status_code for batch in results for r in batch]
    assert statuses.count(200) == 3, statuses
    async with stack.admin.sessions() as session:
        spent = (
            await session.exec(
                sa.select(sa.func.sum(LedgerEntry.amount_micros)).where(
                    LedgerEntry.account_id == workspace.account_id, LedgerEntry.kind == "charge"
                )
            )
        ).one()[0]
    assert spent == 3 * COST <= 3_300_000


async def test_leased_slices_on_two_processes_spend_exactly_the_cap(
    stack: Stack, second_process: GatewayProcess, unique: str
) -> None:
    """Far from the cap each process leases slices of the key's budget (server/limits/
    leases.py), then, nearer to it, holds request by request. Nothing is ever spent beyond
    the cap; a slice's unused part can be held by one process while the other is refused
    (in_flight_budget, retry shortly), and comes back once that process is idle — so over
    time exactly k requests run, and the ledger matches the counters."""
    k = 160
    workspace = await stack.admin.workspace(f"lease-{unique}")
    await stack.admin.credits(workspace, "1000")
    issued = await stack.admin.key(workspace, limit=f"{k * COST / 1_000_000 + 0.5:.6f}")
    urls = _urls(stack, second_process)
    first = await _parallel(urls, issued, PRICEY, 240)
    ran = [r.status_code for r in first].count(200)
    print(f"{ran} of {k} ran in the first burst of 240")
    assert 0 < ran <= k
    odd = [r.text for r in first if r.status_code not in (200, 402)]
    assert not odd, (odd[:3], stack.gateway.log()[-3000:], second_process.log()[-3000:])
    await stack.admin.no_hold_left(CreditHold.key_hash == issued.hash)  # leases went back
    rest = [await _parallel(urls, issued, PRICEY, 10) for _ in range((k - ran) // 10 + 2)]
    statuses = [r.status_code for batch in rest for r in batch]
    assert ran + statuses.count(200) == k, (ran, statuses)
    assert await _charges_and_counter(stack, issued) == (k, k * COST, k * COST)


async def test_free_minute_limit_across_processes(
    stack: Stack, second_process: GatewayProcess, unique: str
) -> None:
    body = {**PRICEY, "model": "fake/free:free"}

    async def run() -> list[httpx.Response]:
        workspace = await stack.admin.workspace(f"fm-{unique}-{secrets.token_hex(2)}")
        await stack.admin.credits(workspace, "1")
        issued = await stack.admin.key(workspace)
        return await _parallel(_urls(stack, second_process), issued, body, 100)

    responses = await in_one_minute(run)
    assert [r.status_code for r in responses].count(200) == 20


async def test_two_processes_never_run_one_video_job_twice(
    stack: Stack, second_process: GatewayProcess, unique: str
) -> None:
    """Both processes' workers poll one queue, and both dispatchers one webhook outbox: every
    job is submitted to the provider once, completes once, is charged once, and its webhook
    arrives once."""
    workspace = await stack.admin.workspace(f"jobs-{unique}")
    await stack.admin.credits(workspace, "50")
    issued = await stack.admin.key(workspace)
    urls = _urls(stack, second_process)
    prompts = [f"job {unique} {i}" for i in range(16)]
    async with httpx.AsyncClient(timeout=30) as client:
        submitted = await asyncio.gather(
            *(
                client.post(
                    f"{urls[i % len(urls)]}/videos",
                    headers=issued.headers,
                    json={
                        "model": "fakevideo/openai",
                        "prompt": p,
                        "duration": 1,
                        "callback_url": stack.webhooks.url(f"/exact/{unique}"),
                    },
                )
                for i, p in enumerate(prompts)
            )
        )
        ids = [r.json()["id"] for r in submitted]

        async def finished() -> list[str]:
            states = [
                (await client.get(f"{stack.base_url}/videos/{i}", headers=issued.headers)).json()[
                    "status"
                ]
                for i in ids
            ]
            return states if all(s in ("completed", "failed") for s in states) else []

        states = await eventually(finished, within=90, message="every job finished")
    assert states == ["completed"] * len(ids)
    assert stack.fake_video is not None
    sent = [
        s["body"]["prompt"]
        for s in stack.fake_video.submissions
        if s["body"].get("prompt", "").startswith(f"job {unique}")
    ]
    assert sorted(sent) == sorted(prompts)  # each job submitted exactly once
    async with stack.admin.sessions() as session:
        charges = (
            await session.exec(
                sa.select(sa.func.count())
                .select_from(LedgerEntry)
                .where(LedgerEntry.key_hash == issued.hash, LedgerEntry.kind == "charge")
            )
        ).one()[0]
    assert charges == len(ids)

    async def settled() -> list[WebhookDelivery]:
        # Every delivery recorded as ended: none is sent again, so no duplicate can follow.
        async with stack.admin.sessions() as session:
            rows = (
                (
                    await session.exec(
                        sa.select(WebhookDelivery).where(WebhookDelivery.job_id.in_(ids))  # type: ignore[attr-defined]
                    )
                )
                .scalars()
                .all()
            )
        return (
            list(rows) if len(rows) == len(ids) and all(r.status != "pending" for r in rows) else []
        )

    deliveries = await eventually(settled, within=30, message="every webhook delivered")
    assert [(d.status, d.attempts) for d in deliveries] == [("delivered", 1)] * len(ids)
    hooks = stack.webhooks.hooks(f"/exact/{unique}")
    delivered = sorted(json.loads(h.body)["data"]["id"] for h in hooks)
    assert delivered == sorted(ids)  # each job's webhook exactly once
