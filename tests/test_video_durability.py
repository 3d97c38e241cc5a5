"""A 202 from POST /videos means the job and its credit hold are committed: submissions
answered through the group-commit writer survive SIGKILL of the gateway right after the last
202, and a restarted gateway serves every accepted job."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from server.db.models import CreditHold, VideoJob
from server.videos.jobs import RUNNING_STATES
from testkit.fakes.openai_stt import FakeSttProvider
from testkit.fakes.webhook_receiver import WebhookReceiver
from tests.conftest import Databases, own_gateway

SUBMISSIONS = 48
CONCURRENCY = 16  # enough for batches of several callers


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_every_202_survives_a_kill_9_right_after(
    backend: str,
    databases: Databases,
    tmp_path: Path,
    fake_stt: FakeSttProvider,
    webhook_receiver: WebhookReceiver,
) -> None:
    async with own_gateway(databases, backend, tmp_path, fake_stt, webhook_receiver) as own:
        accepted: list[str] = []
        todo = iter(range(SUBMISSIONS))

        async def submit(client: httpx.AsyncClient) -> None:
            for _ in todo:
                response = await client.post(
                    f"{own.gateway.base_url}/videos",
                    headers=own.issued.headers,
                    json={"model": "fakevideo/frames", "prompt": "p", "duration": 1},
                )
                assert response.status_code == 202, response.text
                accepted.append(response.json()["id"])

        async with httpx.AsyncClient(timeout=30) as client:
            await asyncio.gather(*(submit(client) for _ in range(CONCURRENCY)))
        process = own.gateway.process
        assert process is not None
        process.kill()  # SIGKILL right after the last 202: no shutdown, no flush
        await asyncio.to_thread(process.wait, 10)
        assert len(accepted) == SUBMISSIONS

        async with own.admin.sessions() as session:
            jobs = {
                job.id: job
                for job in (
                    await session.exec(sa.select(VideoJob).where(VideoJob.id.in_(accepted)))  # type: ignore[attr-defined]
                ).scalars()
            }
            holds = {
                hold.id: hold for hold in (await session.exec(sa.select(CreditHold))).scalars()
            }
        assert set(jobs) == set(accepted)  # every accepted job was committed
        for job in jobs.values():
            if job.status in RUNNING_STATES:  # not finished by the worker before the kill
                hold = holds.get(job.hold_id or "")
                assert hold is not None, job.id  # ...and its hold with it
                assert hold.amount_micros == job.hold_micros == 10_000

        restarted = dataclasses.replace(own.gateway, process=None, output=[])
        await asyncio.to_thread(restarted.start)
        try:
            async with httpx.AsyncClient(timeout=30) as client:
                for job_id in accepted:
                    response = await client.get(
                        f"{restarted.base_url}/videos/{job_id}", headers=own.issued.headers
                    )
                    assert response.status_code == 200, response.text
        finally:
            await asyncio.to_thread(restarted.stop)
