"""Each server process caches its callers (key, workspace, account, guardrails) and checks a
stamp at most once a second (server/db/stamp.py). What must still hold, with two server
processes on one database (SQLite file or PostgreSQL):

- a key disabled or deleted on one process is refused at once there, and within 1 s on the
  other, on every route (not only GET /key, which reads the stamp with its usage);
- GET /key after a request's response includes that request's charge, whichever process
  charged it: usage is never cached."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from server.billing.money import usd_to_micros
from testkit.admin import IssuedKey
from testkit.audio import b64, fixture
from testkit.processes import GatewayProcess
from tests.conftest import Stack

pytestmark = pytest.mark.both_backends

PRICEY = {"model": "fake/pricey", "input_audio": {"data": b64(fixture()), "format": "wav"}}
COST_USD = 1.075125  # 1.075125 s at 1 USD/s
# The guarantee is 1 s from the change's commit; a request's own latency on a busy 2-core
# machine comes on top of it (the first refused request must have *started* within 1 s).
WITHIN = 1.0
REQUEST_SLACK = 0.5


@pytest.fixture
async def second_process(stack: Stack) -> AsyncIterator[GatewayProcess]:
    other = GatewayProcess(
        data_dir=stack.gateway.data_dir / "second-principals",
        database_url=stack.gateway.database_url,
        # Its own data dir, the first's vault master key: one key per database.
        extra_env={**stack.gateway.extra_env, **stack.gateway.master_key_env()},
    )
    await asyncio.to_thread(other.start)
    yield other
    await asyncio.to_thread(other.stop)


async def _generation_status(client: httpx.AsyncClient, base_url: str, issued: IssuedKey) -> int:
    """An authenticated route other than GET /key: 404 for a caller it accepts, 401 else."""
    response = await client.get(
        f"{base_url}/generation", params={"id": "gen-none"}, headers=issued.headers
    )
    return response.status_code


async def _refused_within(
    client: httpx.AsyncClient, base_url: str, issued: IssuedKey, changed_at: float
) -> float:
    """Poll the route until it refuses the key; the seconds from the change to the start of
    the first refused request."""
    while True:
        started = time.monotonic()
        status = await _generation_status(client, base_url, issued)
        if status == 401:
            return started - changed_at
        assert status == 404, status
        assert started - changed_at < WITHIN + REQUEST_SLACK, "still accepted after 1 s"
        await asyncio.sleep(0.02)


async def _cached_on_both(client: httpx.AsyncClient, urls: list[str], issued: IssuedKey) -> None:
    for url in urls:
        for _ in range(3):  # cached after the first
            assert await _generation_status(client, url, issued) == 404


async def test_a_key_disabled_on_one_process_is_refused_on_the_other_within_1_s(
    stack: Stack, second_process: GatewayProcess, unique: str
) -> None:
    workspace = await stack.admin.workspace(f"pc-dis-{unique}")
    manager = await stack.admin.key(workspace, "manager", management=True)
    issued = await stack.admin.key(workspace, "victim")
    urls = [stack.base_url, second_process.base_url]
    async with httpx.AsyncClient(timeout=30) as client:
        await _cached_on_both(client, urls, issued)
        patched = await client.patch(
            f"{stack.base_url}/keys/{issued.hash}", json={"disabled": True}, headers=manager.headers
        )
        assert patched.status_code == 200
        changed_at = time.monotonic()
        # The process that changed it: at once.
        assert await _generation_status(client, stack.base_url, issued) == 401
        elapsed = await _refused_within(client, second_process.base_url, issued, changed_at)
        assert elapsed < WITHIN + REQUEST_SLACK
        # And it stays refused on both, GET /key included.
        for url in urls:
            assert (await client.get(f"{url}/key", headers=issued.headers)).status_code == 401


async def test_a_key_deleted_on_one_process_is_refused_on_the_other_within_1_s(
    stack: Stack, second_process: GatewayProcess, unique: str
) -> None:
    workspace = await stack.admin.workspace(f"pc-del-{unique}")
    manager = await stack.admin.key(workspace, "manager", management=True)
    issued = await stack.admin.key(workspace, "victim")
    urls = [stack.base_url, second_process.base_url]
    async with httpx.AsyncClient(timeout=30) as client:
        await _cached_on_both(client, urls, issued)
        deleted = await client.delete(
            f"{second_process.base_url}/keys/{issued.hash}", headers=manager.headers
        )
        assert deleted.status_code == 200
        changed_at = time.monotonic()
        assert await _generation_status(client, second_process.base_url, issued) == 401
        await _refused_within(client, stack.base_url, issued, changed_at)


async def test_a_key_disabled_outside_any_server_is_refused_within_1_s(
    stack: Stack, second_process: GatewayProcess, unique: str
) -> None:
    """A change no server process made (the CLI, an operator's SQL; here the test's own
    connection): the stamp's triggers carry it to every process."""
    workspace = await stack.admin.workspace(f"pc-out-{unique}")
    issued = await stack.admin.key(workspace, "victim")
    urls = [stack.base_url, second_process.base_url]
    async with httpx.AsyncClient(timeout=30) as client:
        await _cached_on_both(client, urls, issued)
        await stack.admin.update_key(issued, disabled=True)
        changed_at = time.monotonic()
        for url in urls:
            await _refused_within(client, url, issued, changed_at)


async def test_get_key_includes_a_charge_made_by_the_other_process(
    stack: Stack, second_process: GatewayProcess, unique: str
) -> None:
    workspace = await stack.admin.workspace(f"pc-use-{unique}")
    await stack.admin.credits(workspace, "100")
    issued = await stack.admin.key(workspace, limit="50")
    async with httpx.AsyncClient(timeout=60) as client:
        for n, (charging, reading) in enumerate(
            [
                (stack.base_url, second_process.base_url),
                (second_process.base_url, stack.base_url),
                (stack.base_url, stack.base_url),
            ],
            start=1,
        ):
            before = await client.get(f"{reading}/key", headers=issued.headers)  # cached now
            assert before.status_code == 200
            done = await client.post(
                f"{charging}/audio/transcriptions", json=PRICEY, headers=issued.headers
            )
            assert done.status_code == 200, done.text
            after = (await client.get(f"{reading}/key", headers=issued.headers)).json()["data"]
            spent = usd_to_micros(str(COST_USD)) * n
            assert usd_to_micros(str(after["usage"])) == spent
            assert usd_to_micros(str(after["usage_daily"])) == spent
            assert usd_to_micros(str(after["limit_remaining"])) == usd_to_micros("50") - spent
