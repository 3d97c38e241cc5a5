"""Video jobs on real provider protocols (fakes on loopback): the OpenAI videos API, a
fal-style queue, fallback when submission fails, provider failures."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from openrouter import OpenRouter

from testkit.admin import IssuedKey
from tests.conftest import Stack
from tests.test_videos import mp4_facts, submit, wait_for


@pytest.fixture
async def funded(stack: Stack, unique: str) -> IssuedKey:
    workspace = await stack.admin.workspace(f"vprov-{unique}")
    await stack.admin.credits(workspace, "10")
    return await stack.admin.key(workspace, "video")


@pytest.mark.parametrize("model", ["fakevideo/openai", "fakevideo/queue", "fakevideo/fallback"])
async def test_provider_jobs_complete_with_playable_content(
    stack: Stack, funded: IssuedKey, model: str
) -> None:
    response = await submit(
        stack,
        funded,
        {
            "model": model,
            "prompt": "a kite",
            "duration": 4,
            "aspect_ratio": "9:16",
            "provider": {
                "options": {"openai": {"quality": "high"}, "fal": {"steps": 30}, "other": {"x": 1}}
            },
            "session_id": "sess-v",
            "user": "user-v",
        },
    )
    assert response.status_code == 202, response.text
    job = await wait_for(stack, funded, response.json()["id"], "completed", "failed")
    assert job["status"] == "completed", job
    assert job["usage"] == {"cost": 0.04, "is_byok": False}
    async with httpx.AsyncClient() as client:
        content = await client.get(
            f"{stack.base_url}/videos/{job['id']}/content", headers=funded.headers
        )
    assert mp4_facts(content.content)[0] == "h264"
    assert stack.fake_video is not None
    sent = [s for s in stack.fake_video.submissions if s["body"].get("prompt") == "a kite"]
    served = sent[-1]
    text = str(served["body"])
    assert "sess-v" not in text and "user-v" not in text and "'x': 1" not in text
    if "/v1/" in served["path"]:
        assert served["body"]["size"] == "480x854" and served["body"]["seconds"] == "4"
        assert served["body"]["quality"] == "high"
    else:
        assert served["body"]["aspect_ratio"] == "9:16" and served["body"]["steps"] == 30


@pytest.mark.parametrize("model", ["fakevideo/provider-fails", "fakevideo/queue-fails"])
async def test_provider_failure_becomes_failed_with_error(
    stack: Stack, funded: IssuedKey, model: str
) -> None:
    response = await submit(stack, funded, {"model": model, "prompt": "a kite", "duration": 1})
    job = await wait_for(stack, funded, response.json()["id"], "completed", "failed")
    assert job["status"] == "failed"
    assert "Provider failed" in job["error"]


async def test_sdk_continues_a_completed_job_on_its_provider(
    stack: Stack, funded: IssuedKey, unique: str
) -> None:
    """The openrouter SDK's `previous_job_id`: the continuation goes to the endpoint that
    made the first video, as a remix of that provider job; a job not completed is 409."""
    with OpenRouter(api_key=funded.key, server_url=stack.base_url) as sdk:
        videos = sdk.video_generation
        first = await asyncio.to_thread(
            lambda: videos.generate(model="fakevideo/openai", prompt="a kite", duration=4)
        )
        done = await wait_for(stack, funded, first.id, "completed", "failed")
        assert done["status"] == "completed", done
        second = await asyncio.to_thread(
            lambda: videos.generate(
                model="fakevideo/openai",
                prompt=f"the kite at night {unique}",
                duration=4,
                previous_job_id=first.id,
            )
        )
        continued = await wait_for(stack, funded, second.id, "completed", "failed")
    assert continued["status"] == "completed", continued
    assert stack.fake_video is not None
    prompt = {"prompt": f"the kite at night {unique}"}
    (remix,) = [s for s in stack.fake_video.submissions if s["body"] == prompt]
    assert remix["remix_of"] is not None and remix["path"].endswith("/remix")
    async with httpx.AsyncClient() as client:
        refused = await client.post(
            f"{stack.base_url}/videos",
            headers=funded.headers,
            json={"model": "fakevideo/queue", "prompt": "x", "previous_job_id": first.id},
        )
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["metadata"]["param"] == "previous_job_id"
