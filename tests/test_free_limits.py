"""Free-model (`:free`) limits through Envoy with real parallel requests: exactly 20 per
minute and the daily ceiling, 429 in the documented shape with X-RateLimit-* headers."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import sqlalchemy as sa

from server.db.models import Account, RateWindow
from server.db.stamp import CHECK_INTERVAL as PRINCIPAL_CHECK_INTERVAL
from testkit.admin import IssuedKey
from testkit.audio import b64, fixture
from tests.conftest import Stack
from tests.support.minutes import in_one_minute

# The database is the point: on SQLite and PostgreSQL (see tests/conftest.py).
pytestmark = pytest.mark.both_backends

BODY = {"model": "fake/free:free", "input_audio": {"data": b64(fixture()), "format": "wav"}}


async def burst(stack: Stack, issued: IssuedKey, n: int) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        return await asyncio.gather(
            *(
                client.post(
                    f"{stack.base_url}/audio/transcriptions", json=BODY, headers=issued.headers
                )
                for _ in range(n)
            )
        )


async def _made_earlier_today(stack: Stack, account_id: str, requests: int) -> None:
    midnight = datetime.combine(datetime.now(UTC).date(), datetime.min.time(), tzinfo=UTC)
    async with stack.admin.sessions() as session:
        session.add(
            RateWindow(subject_id=account_id, period="day", window_start=midnight, count=requests)
        )
        await session.commit()


async def _free_user(stack: Stack) -> IssuedKey:
    workspace = await stack.admin.workspace(f"free-{secrets.token_hex(4)}")
    await stack.admin.credits(workspace, "1")  # a positive balance; under 9: 50 per day
    return await stack.admin.key(workspace, "free")


@pytest.fixture
async def free_user(stack: Stack) -> IssuedKey:
    return await _free_user(stack)


async def test_exactly_20_of_200_parallel_requests_in_a_minute(stack: Stack) -> None:
    async def run() -> tuple[IssuedKey, list[httpx.Response]]:
        issued = await _free_user(stack)
        return issued, await burst(stack, issued, 200)

    free_user, responses = await in_one_minute(run)
    accepted = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code == 429]
    others = [(r.status_code, r.text[:300]) for r in responses if r.status_code not in (200, 429)]
    # Every refusal should be the free-model minute's: name the others' reasons.
    reasons = Counter(r.json()["error"]["message"] for r in refused)
    # ... and what the gateway warned of meanwhile (a failed group commit, say).
    levels = ('"level": "warning"', '"level": "error"')
    log = stack.gateway.log().splitlines()
    warned = [line[:400] for line in log if any(level in line for level in levels)][-10:]
    assert (len(accepted), len(refused), others) == (20, 180, []), (reasons, warned)
    error = refused[0].json()["error"]
    assert error == {
        "code": 429,
        "message": error["message"],
        "metadata": {"error_type": "rate_limit_exceeded"},
    }
    headers = refused[0].headers
    assert headers["x-ratelimit-limit"] == "20" and headers["x-ratelimit-remaining"] == "0"
    reset = int(headers["x-ratelimit-reset"])
    assert 0 < reset - time.time() * 1000 <= 60_000
    assert not any(h.startswith("x-ratelimit") for h in accepted[0].headers)
    async with httpx.AsyncClient() as client:
        key = (await client.get(f"{stack.base_url}/key", headers=free_user.headers)).json()
    assert key["data"]["free_model_daily_requests"] == {"used": 20, "limit": 50, "remaining": 30}


async def test_the_daily_ceiling_is_exact(stack: Stack, free_user: IssuedKey) -> None:
    today = datetime.now(UTC).date()
    await _made_earlier_today(stack, free_user.workspace.account_id, 45)
    # 12 requests stay under the 20 per minute even if they span a minute boundary.
    responses = await burst(stack, free_user, 12)
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200] * 5 + [429] * 7
    refused = next(r for r in responses if r.status_code == 429)
    assert refused.headers["x-ratelimit-limit"] == "50"
    midnight = datetime.combine(today + timedelta(days=1), datetime.min.time(), tzinfo=UTC)
    assert int(refused.headers["x-ratelimit-reset"]) == int(midnight.timestamp() * 1000)
    # The refused requests' minute counts were taken back with them.
    async with stack.admin.sessions() as session:
        minute_counts = (
            await session.exec(
                sa.select(sa.func.sum(RateWindow.count)).where(
                    RateWindow.subject_id == free_user.workspace.account_id,  # type: ignore[arg-type]
                    RateWindow.period == "minute",  # type: ignore[arg-type]
                )
            )
        ).one()[0]
    assert minute_counts == 5


async def test_higher_tier_and_exempt_accounts(stack: Stack, unique: str) -> None:
    workspace = await stack.admin.workspace(f"exempt-{unique}")
    await stack.admin.credits(workspace, "9")
    issued = await stack.admin.key(workspace)
    await _made_earlier_today(stack, workspace.account_id, 999)
    statuses = sorted(r.status_code for r in await burst(stack, issued, 3))
    assert statuses == [200, 429, 429]  # 1000 per day from 9 purchased credits
    async with stack.admin.sessions() as session:
        await session.exec(
            sa.update(Account)
            .where(Account.id == workspace.account_id)
            .values(exempt_free_limits=True)
        )
        await session.commit()
    # Changed outside the server: each process sees it within the principal cache's second
    # (server/db/stamp.py); a change through the API is seen at once by the process making it.
    await asyncio.sleep(PRINCIPAL_CHECK_INTERVAL.total_seconds())
    statuses = sorted(r.status_code for r in await burst(stack, issued, 3))
    assert statuses == [200, 200, 200]  # exempt: not gated by the daily counter
    async with httpx.AsyncClient() as client:
        key = (await client.get(f"{stack.base_url}/key", headers=issued.headers)).json()
    assert key["data"]["free_model_daily_requests"]["limit"] == 1000
    assert key["data"]["free_model_daily_requests"]["used"] == 1003


async def test_paid_models_have_no_platform_cap(stack: Stack, unique: str) -> None:
    workspace = await stack.admin.workspace(f"paid-{unique}")
    await stack.admin.credits(workspace, "5")
    issued = await stack.admin.key(workspace)
    body = {**BODY, "model": "fake/ok"}
    async with httpx.AsyncClient(timeout=60) as client:
        responses = await asyncio.gather(
            *(
                client.post(
                    f"{stack.base_url}/audio/transcriptions", json=body, headers=issued.headers
                )
                for _ in range(30)
            )
        )
    assert all(r.status_code == 200 for r in responses)
