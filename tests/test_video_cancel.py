"""POST /api/v1/videos/{id}/cancel end to end: through Envoy on a queue provider that
documents a cancel (the fake fal queue), with the cancelled webhook signed both ways; and
the gRPC rpc's 409/404 as rich status."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import grpc
import httpx
import pytest
import sqlalchemy as sa
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from standardwebhooks import Webhook

from server.contract import videos_pb2, videos_pb2_grpc
from server.db.models import CreditHold, VideoJob
from server.vault.crypto import load_master_key
from server.vault.webhook_secrets import workspace_secret
from testkit.admin import IssuedKey
from testkit.eventually import eventually
from tests.conftest import Stack
from tests.support.openrouter_webhooks import verify_openrouter
from tests.test_videos import wait_for
from tests.test_webhooks import hooks_for


@pytest.fixture
async def funded(stack: Stack, unique: str) -> IssuedKey:
    workspace = await stack.admin.workspace(f"vcancel-{unique}")
    await stack.admin.credits(workspace, "10")
    return await stack.admin.key(workspace, "video")


async def _provider_job_id(stack: Stack, job_id: str) -> str:
    async def submitted() -> str | None:
        async with stack.admin.sessions() as session:
            job = await session.get(VideoJob, job_id)
        return None if job is None else job.provider_job_id

    return await eventually(submitted, within=20, message=f"{job_id} at the provider")


async def test_rest_cancel_stops_the_job_at_the_provider_and_sends_the_webhook(
    stack: Stack, funded: IssuedKey, unique: str
) -> None:
    path = f"/ok/cancel-{unique}"
    async with httpx.AsyncClient() as client:
        created = await client.post(
            f"{stack.base_url}/videos",
            headers=funded.headers,
            json={
                "model": "fakevideo/queue-slow",
                "prompt": "x",
                "duration": 1,
                "callback_url": stack.webhooks.url(path),
            },
        )
        assert created.status_code == 202, created.text
        job_id = created.json()["id"]
        provider_job_id = await _provider_job_id(stack, job_id)
        cancelled = await client.post(
            f"{stack.base_url}/videos/{job_id}/cancel", headers=funded.headers
        )
        again = await client.post(  # with a JSON body, as some clients send: ignored
            f"{stack.base_url}/videos/{job_id}/cancel", headers=funded.headers, json={}
        )
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled" and cancelled.json()["id"] == job_id
    assert again.status_code == 409 and again.json()["error"]["code"] == 409
    assert stack.fake_video is not None and provider_job_id in stack.fake_video.cancelled
    assert (await wait_for(stack, funded, job_id, "cancelled"))["status"] == "cancelled"
    async with stack.admin.sessions() as session:
        holds = (
            await session.exec(
                sa.select(CreditHold).where(CreditHold.account_id == funded.workspace.account_id)
            )
        ).all()
    assert holds == []  # released, nothing charged
    (hook,) = await hooks_for(stack, path, 1)
    secret = await workspace_secret(
        stack.admin.sessions,
        load_master_key(stack.gateway.data_dir),
        funded.workspace.id,
        datetime.now(UTC),
    )
    assert Webhook(secret).verify(hook.body, hook.headers)["type"] == "video.generation.cancelled"
    assert verify_openrouter(secret, hook.body, hook.headers["x-openrouter-signature"])
    assert hook.headers["x-openrouter-idempotency-key"] == f"{job_id}-cancelled"
    assert json.loads(hook.body)["data"]["status"] == "cancelled"


async def test_grpc_cancel_of_a_finished_or_foreign_job(
    stack: Stack, funded: IssuedKey, unique: str
) -> None:
    stranger = await stack.admin.key(await stack.admin.workspace(f"vcancel-x-{unique}"), "x")
    async with httpx.AsyncClient() as client:
        created = await client.post(
            f"{stack.base_url}/videos",
            headers=funded.headers,
            json={"model": "local/renderer", "prompt": "x", "duration": 1},
        )
    job_id = created.json()["id"]
    await wait_for(stack, funded, job_id, "completed")
    async with grpc.aio.insecure_channel(stack.grpc_target) as channel:
        stub = videos_pb2_grpc.VideosStub(channel)
        request = videos_pb2.CancelVideoRequest(job_id=job_id)
        with pytest.raises(grpc.aio.AioRpcError) as done:
            await stub.CancelVideo(request, metadata=funded.metadata)
        with pytest.raises(grpc.aio.AioRpcError) as foreign:
            await stub.CancelVideo(request, metadata=stranger.metadata)
    assert done.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert foreign.value.code() == grpc.StatusCode.NOT_FOUND
    status = rpc_status.from_call(done.value)
    assert status is not None
    info = error_details_pb2.ErrorInfo()
    status.details[0].Unpack(info)
    assert info.metadata["http_status"] == "409"
