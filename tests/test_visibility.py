"""Issue 29 item 11, end to end: who sees and acts on a video job or a generation by its id
(the rule: server/auth.py `sees`). A standard key only on what it created itself; a
management key on everything of its workspace; anything else is answered exactly as an
unknown id is (404, never revealing that the id exists) — over REST and over gRPC."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import pytest

from server.contract import (
    console_pb2,
    console_pb2_grpc,
    generations_pb2,
    generations_pb2_grpc,
    videos_pb2,
    videos_pb2_grpc,
)
from testkit.admin import IssuedKey
from tests.conftest import Stack
from tests.test_videos import submit, wait_for

UNKNOWN_JOB = "vid_" + "0" * 24
UNKNOWN_GENERATION = "gen_" + "0" * 24


@dataclass
class Keys:
    owner: IssuedKey  # a standard key: it submits the jobs
    sibling: IssuedKey  # another standard key of the same workspace
    manager: IssuedKey  # the workspace's management key
    stranger: IssuedKey  # another workspace's management key


@pytest.fixture
async def keys(stack: Stack, unique: str) -> Keys:
    workspace = await stack.admin.workspace(f"sees-{unique}")
    await stack.admin.credits(workspace, "10")
    other = await stack.admin.workspace(f"sees-other-{unique}")
    await stack.admin.credits(other, "10")
    return Keys(
        owner=await stack.admin.key(workspace, "owner"),
        sibling=await stack.admin.key(workspace, "sibling"),
        manager=await stack.admin.key(workspace, "manager", management=True),
        stranger=await stack.admin.key(other, "stranger", management=True),
    )


@pytest.fixture
async def completed(stack: Stack, keys: Keys) -> dict[str, Any]:
    """A completed job of the owner's (its generation stored, its content kept)."""
    created = await submit(
        stack, keys.owner, {"model": "fakevideo/frames", "prompt": "x", "duration": 1}
    )
    assert created.status_code == 202, created.text
    job = await wait_for(stack, keys.owner, created.json()["id"], "completed", "failed")
    assert job["status"] == "completed", job
    return job


async def _running(stack: Stack, owner: IssuedKey) -> str:
    created = await submit(
        stack, owner, {"model": "fakevideo/queue-slow", "prompt": "x", "duration": 1}
    )
    assert created.status_code == 202, created.text
    return str(created.json()["id"])


def _routes(job_id: str, generation_id: str) -> dict[str, str]:
    return {
        "job": f"/videos/{job_id}",
        "content": f"/videos/{job_id}/content",
        "webhooks": f"/videos/{job_id}/webhooks",
        "generation": f"/generation?id={generation_id}",
    }


async def test_reads_by_id_follow_the_rule_over_rest(
    stack: Stack, keys: Keys, completed: dict[str, Any]
) -> None:
    job_id, generation_id = completed["id"], completed["generation_id"]
    known = _routes(job_id, generation_id)
    unknown = _routes(UNKNOWN_JOB, UNKNOWN_GENERATION)
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=30) as client:
        for name, path in known.items():
            for key in (keys.owner, keys.manager):
                seen = await client.get(path, headers=key.headers)
                assert seen.status_code == 200, (name, key.hash[:8], seen.text)
            for key in (keys.sibling, keys.stranger):
                hidden = await client.get(path, headers=key.headers)
                none = await client.get(unknown[name], headers=key.headers)
                assert hidden.status_code == 404, (name, key.hash[:8], hidden.text)
                # Word for word an unknown id's answer: nothing says the id exists.
                expected = _with(
                    _with(none.json(), UNKNOWN_JOB, job_id), UNKNOWN_GENERATION, generation_id
                )
                assert hidden.json() == expected, name


def _with(body: Any, unknown: str, known: str) -> Any:
    message = body["error"]["message"].replace(unknown, known)
    return {**body, "error": {**body["error"], "message": message}}


async def test_cancel_follows_the_rule_over_rest(stack: Stack, keys: Keys) -> None:
    mine, managed = await _running(stack, keys.owner), await _running(stack, keys.owner)
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=30) as client:

        async def cancel(job_id: str, key: IssuedKey) -> httpx.Response:
            return await client.post(f"/videos/{job_id}/cancel", headers=key.headers)

        for key in (keys.sibling, keys.stranger):
            refused = await cancel(mine, key)
            none = await cancel(UNKNOWN_JOB, key)
            assert refused.status_code == 404, (key.hash[:8], refused.text)
            assert refused.json() == _with(none.json(), UNKNOWN_JOB, mine)
        assert (await client.get(f"/videos/{mine}", headers=keys.owner.headers)).json()[
            "status"
        ] in ("pending", "in_progress")  # untouched by the refused cancels
        by_owner = await cancel(mine, keys.owner)
        by_manager = await cancel(managed, keys.manager)
    assert by_owner.status_code == 200 and by_owner.json()["status"] == "cancelled"
    assert by_manager.status_code == 200 and by_manager.json()["status"] == "cancelled"


Call = Callable[[grpc.aio.Channel, tuple[tuple[str, str], ...]], Awaitable[object]]


def _grpc_calls(job_id: str, generation_id: str) -> dict[str, Call]:
    async def get_video(channel: grpc.aio.Channel, metadata: Any) -> object:
        stub = videos_pb2_grpc.VideosStub(channel)
        return await stub.GetVideo(videos_pb2.GetVideoRequest(job_id=job_id), metadata=metadata)

    async def content(channel: grpc.aio.Channel, metadata: Any) -> object:
        stub = videos_pb2_grpc.VideosStub(channel)
        request = videos_pb2.GetVideoContentRequest(job_id=job_id)
        return [chunk async for chunk in stub.GetVideoContent(request, metadata=metadata)]

    async def webhooks(channel: grpc.aio.Channel, metadata: Any) -> object:
        stub = console_pb2_grpc.ActivityStub(channel)
        request = console_pb2.ListVideoWebhooksRequest(job_id=job_id)
        return await stub.ListVideoWebhooks(request, metadata=metadata)

    async def generation(channel: grpc.aio.Channel, metadata: Any) -> object:
        stub = generations_pb2_grpc.GenerationsStub(channel)
        request = generations_pb2.GetGenerationRequest(id=generation_id)
        return await stub.GetGeneration(request, metadata=metadata)

    return {"job": get_video, "content": content, "webhooks": webhooks, "generation": generation}


async def test_reads_and_cancel_by_id_follow_the_rule_over_grpc(
    stack: Stack, keys: Keys, completed: dict[str, Any]
) -> None:
    running = await _running(stack, keys.owner)
    calls = _grpc_calls(completed["id"], completed["generation_id"])

    async def cancel(channel: grpc.aio.Channel, metadata: Any) -> object:
        stub = videos_pb2_grpc.VideosStub(channel)
        request = videos_pb2.CancelVideoRequest(job_id=running)
        return await stub.CancelVideo(request, metadata=metadata)

    async with grpc.aio.insecure_channel(stack.grpc_target) as channel:
        for name, call in {**calls, "cancel": cancel}.items():
            for key in (keys.sibling, keys.stranger):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call(channel, key.metadata)
                assert refused.value.code() == grpc.StatusCode.NOT_FOUND, (name, key.hash[:8])
        for call in calls.values():
            for key in (keys.owner, keys.manager):
                await call(channel, key.metadata)  # no error
        cancelled = await cancel(channel, keys.manager.metadata)
    assert isinstance(cancelled, videos_pb2.VideoJob) and cancelled.status == "cancelled"
