"""Video generation through Envoy: submit, poll, content, models, the official SDK, the
worker (leases, exactly-once charge, restart), expiry and every validation rule."""

from __future__ import annotations

import asyncio
import io
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import av
import httpx
import pytest
import sqlalchemy as sa
from openrouter import OpenRouter

from server.accounts.workspaces import update_workspace, workspace_by_id
from server.db.engine import create_engine, session_factory
from server.db.models import LedgerEntry, VideoJob
from server.errors import GatewayError
from testkit.admin import Admin, IssuedKey
from testkit.eventually import eventually
from testkit.processes import GatewayProcess
from tests.conftest import Stack


@pytest.fixture
async def funded(stack: Stack, unique: str) -> IssuedKey:
    workspace = await stack.admin.workspace(f"vid-{unique}")
    await stack.admin.credits(workspace, "10")
    return await stack.admin.key(workspace, "video")


async def submit(stack: Stack, issued: IssuedKey, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(timeout=30) as client:
        return await client.post(f"{stack.base_url}/videos", json=body, headers=issued.headers)


async def wait_for(
    stack: Stack, issued: IssuedKey, job_id: str, *statuses: str, within: float = 30.0
) -> dict[str, Any]:
    async with httpx.AsyncClient() as client:

        async def reached() -> dict[str, Any] | None:
            job = (
                await client.get(f"{stack.base_url}/videos/{job_id}", headers=issued.headers)
            ).json()
            return job if job["status"] in statuses else None  # type: ignore[no-any-return]

        return await eventually(
            reached, within=within, interval=0.1, message=f"{job_id} {statuses}"
        )


def mp4_facts(data: bytes) -> tuple[str, int, int, float]:
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        return (
            stream.codec_context.name,
            stream.width,
            stream.height,
            container.duration / 1_000_000,
        )


async def test_sdk_generate_poll_download_and_list(stack: Stack, funded: IssuedKey) -> None:
    # The SDK is synchronous: each call runs in a thread, the waiting in the event loop.
    with OpenRouter(api_key=funded.key, server_url=stack.base_url) as sdk:
        videos = sdk.video_generation
        job = await asyncio.to_thread(
            lambda: videos.generate(
                model="local/renderer",
                prompt="a lighthouse in a storm",
                duration=2,
                resolution="480p",
                aspect_ratio="16:9",
                seed=7,
            )
        )

        async def completed() -> Any:
            done = await asyncio.to_thread(lambda: videos.get_generation(job_id=job.id))
            return done if done.status == "completed" else None

        done = await eventually(completed, within=30, interval=0.1, message="the job completed")
        content = await asyncio.to_thread(
            lambda: videos.get_video_content(job_id=job.id, index=0).read()
        )
        models = [m.id for m in (await asyncio.to_thread(videos.list_videos_models)).data]
    assert job.status == "pending" and job.polling_url == f"/api/v1/videos/{job.id}"
    assert done.status == "completed" and done.generation_id
    assert done.usage.cost == 0.002 and done.usage.is_byok is False  # 2 s x 0.001
    codec, width, height, seconds = mp4_facts(content)
    assert (codec, width, height) == ("h264", 854, 480)
    assert seconds == pytest.approx(2.0, abs=0.1)
    assert "local/renderer" in models and "fakevideo/frames" in models


async def test_submit_answers_202_pending_and_charges_once(stack: Stack, funded: IssuedKey) -> None:
    response = await submit(
        stack,
        funded,
        {"model": "fakevideo/frames", "prompt": "waves", "duration": 2, "size": "720x720"},
    )
    assert response.status_code == 202
    body = response.json()
    assert body["status"] == "pending" and body["polling_url"] == f"/api/v1/videos/{body['id']}"
    done = await wait_for(stack, funded, body["id"], "completed", "failed")
    assert done["status"] == "completed", done
    assert done["usage"] == {"cost": 0.02, "is_byok": False}
    async with httpx.AsyncClient() as client:
        key = (await client.get(f"{stack.base_url}/key", headers=funded.headers)).json()["data"]
        content = await client.get(
            f"{stack.base_url}/videos/{body['id']}/content", headers=funded.headers
        )
    assert key["usage"] == 0.02
    assert content.headers["content-type"] == "video/mp4"
    assert mp4_facts(content.content)[1:3] == (720, 720)
    async with stack.admin.sessions() as session:
        charges = (
            await session.exec(
                sa.select(sa.func.count())
                .select_from(LedgerEntry)
                .where(LedgerEntry.key_hash == funded.hash, LedgerEntry.kind == "charge")
            )
        ).one()[0]
    assert charges == 1


async def test_failed_job_releases_its_hold_and_content_is_409(
    stack: Stack, funded: IssuedKey
) -> None:
    response = await submit(stack, funded, {"model": "fakevideo/provider-fails", "prompt": "x"})
    job = await wait_for(stack, funded, response.json()["id"], "failed")
    assert job["status"] == "failed" and "provider" in job["error"].lower()
    assert "usage" not in job
    async with httpx.AsyncClient() as client:
        content = await client.get(
            f"{stack.base_url}/videos/{job['id']}/content", headers=funded.headers
        )
        key = (await client.get(f"{stack.base_url}/key", headers=funded.headers)).json()["data"]
    assert content.status_code == 409
    assert content.json()["error"]["code"] == 409
    assert key["usage"] == 0


async def test_expired_content_is_410_and_index_out_of_range_is_400(
    stack: Stack, funded: IssuedKey
) -> None:
    response = await submit(
        stack, funded, {"model": "fakevideo/sized", "prompt": "x", "size": "480x640"}
    )
    job_id = response.json()["id"]
    await wait_for(stack, funded, job_id, "completed")
    url = f"{stack.base_url}/videos/{job_id}/content"
    async with httpx.AsyncClient() as client:
        out_of_range = await client.get(url, params={"index": 1}, headers=funded.headers)
        assert out_of_range.status_code == 400
        assert out_of_range.json()["error"]["metadata"] == {"param": "index"}
        async with stack.admin.sessions() as session:
            await session.exec(
                sa.update(VideoJob)
                .where(VideoJob.id == job_id)
                .values(expires_at=datetime.now(UTC) - timedelta(seconds=1))
            )
            await session.commit()
        job = await wait_for(stack, funded, job_id, "expired")
        assert job["status"] == "expired" and "usage" not in job
        gone = await client.get(url, headers=funded.headers)
    assert gone.status_code == 410


async def test_other_workspaces_jobs_are_404(stack: Stack, funded: IssuedKey, unique: str) -> None:
    job_id = (
        await submit(stack, funded, {"model": "local/renderer", "prompt": "x", "duration": 1})
    ).json()["id"]
    await wait_for(stack, funded, job_id, "completed")
    other_ws = await stack.admin.workspace(f"other-{unique}")
    other = await stack.admin.key(other_ws)
    async with httpx.AsyncClient() as client:
        for path in (f"/videos/{job_id}", f"/videos/{job_id}/content", "/videos/vid_nope"):
            response = await client.get(f"{stack.base_url}{path}", headers=other.headers)
            assert response.status_code == 404, path


async def test_image_only_generation_and_dropped_references(
    stack: Stack, funded: IssuedKey
) -> None:
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    response = await submit(
        stack,
        funded,
        {
            "model": "fakevideo/frames",
            "frame_images": [{**image, "frame_type": "first_frame"}],
            "input_references": [
                image,
                {"type": "video_url", "video_url": {"url": "https://example.com/v.mp4"}},
            ],
        },
    )
    assert response.status_code == 202, response.text
    async with stack.admin.sessions() as session:
        job = await session.get(VideoJob, response.json()["id"])
    assert job is not None
    assert [r["type"] for r in job.params["input_references"]] == ["image_url"]
    assert job.params["frame_images"] == [
        {"frame_type": "first_frame", "url": "https://example.com/a.png"}
    ]


async def test_402_when_credits_cannot_cover_the_estimate(stack: Stack, unique: str) -> None:
    workspace = await stack.admin.workspace(f"poorvid-{unique}")
    await stack.admin.credits(workspace, "0.005")
    issued = await stack.admin.key(workspace)
    response = await submit(
        stack, issued, {"model": "fakevideo/frames", "prompt": "x", "duration": 1}
    )  # 0.01 > 0.005
    assert response.status_code == 402
    assert response.json()["error"]["metadata"] == {"limit_source": "openrouter_credits"}
    async with stack.admin.sessions() as session:
        jobs = (
            await session.exec(
                sa.select(sa.func.count())
                .select_from(VideoJob)
                .where(VideoJob.key_hash == issued.hash)
            )
        ).one()[0]
    assert jobs == 0


IMAGE = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x"}, "model"),
        ({"model": "nomodel", "prompt": "x"}, "model"),
        ({"model": "acme/unknown", "prompt": "x"}, "model"),
        ({"model": "local/pocketsphinx-en", "prompt": "x"}, "model"),
        ({"model": "local/renderer"}, "prompt"),
        ({"model": "local/renderer", "prompt": "x", "aspect_ratio": "5:4"}, "aspect_ratio"),
        ({"model": "local/renderer", "prompt": "x", "resolution": "8K"}, "resolution"),
        ({"model": "local/renderer", "prompt": "x", "resolution": "1080p"}, "resolution"),
        ({"model": "local/renderer", "prompt": "x", "size": "big"}, "size"),
        ({"model": "local/renderer", "prompt": "x", "size": "1000x1000"}, "size"),
        (
            {"model": "local/renderer", "prompt": "x", "size": "854x480", "resolution": "720p"},
            "size",
        ),
        (
            {"model": "local/renderer", "prompt": "x", "size": "854x480", "aspect_ratio": "9:16"},
            "size",
        ),
        ({"model": "fakevideo/sized", "prompt": "x", "size": "480x480"}, "size"),
        ({"model": "local/renderer", "prompt": "x", "duration": 0}, "duration"),
        ({"model": "local/renderer", "prompt": "x", "duration": 7}, "duration"),
        ({"model": "local/renderer", "prompt": "x", "generate_audio": True}, "generate_audio"),
        ({"model": "local/renderer", "prompt": "x", "creativity": 3}, "creativity"),
        ({"model": "local/renderer", "prompt": "x", "upscale_factor": 2}, "upscale_factor"),
        ({"model": "fakevideo/upscaler", "prompt": "x", "upscale_factor": 0}, "upscale_factor"),
        ({"model": "fakevideo/upscaler", "prompt": "x", "upscale_factor": -1}, "upscale_factor"),
        (
            {
                "model": "local/renderer",
                "prompt": "x",
                "frame_images": [{**IMAGE, "frame_type": "first_frame"}],
            },
            "frame_images[0].frame_type",
        ),
        (
            {
                "model": "fakevideo/frames",
                "prompt": "x",
                "frame_images": [{**IMAGE, "frame_type": "middle_frame"}],
            },
            "frame_images[0].frame_type",
        ),
        (
            {
                "model": "fakevideo/frames",
                "prompt": "x",
                "frame_images": [
                    {**IMAGE, "frame_type": "first_frame"},
                    {**IMAGE, "frame_type": "first_frame"},
                ],
            },
            "frame_images[1].frame_type",
        ),
        (
            {
                "model": "fakevideo/frames",
                "prompt": "x",
                "frame_images": [
                    {
                        "type": "image_url",
                        "image_url": {"url": "ftp://x/a.png"},
                        "frame_type": "first_frame",
                    }
                ],
            },
            "frame_images[0].image_url.url",
        ),
        (
            {
                "model": "fakevideo/frames",
                "prompt": "x",
                "input_references": [{"type": "text_url", "image_url": {"url": "https://x"}}],
            },
            "input_references[0].type",
        ),
        (
            {
                "model": "fakevideo/frames",
                "prompt": "x",
                "input_references": [{"type": "audio_url"}],
            },
            "input_references[0].audio_url.url",
        ),
        (
            {"model": "local/renderer", "prompt": "x", "callback_url": "http://example.com/h"},
            "callback_url",
        ),
        ({"model": "local/renderer", "prompt": "x", "callback_url": "not a url"}, "callback_url"),
        ({"model": "local/renderer", "prompt": "x", "session_id": "s" * 257}, "session_id"),
        ({"model": "local/renderer", "prompt": "x", "user": "u" * 257}, "user"),
        ({"model": "local/renderer", "prompt": "x", "trace": {"trace_id": 1}}, "trace.trace_id"),
        (
            {"model": "local/renderer", "prompt": "x", "provider": {"options": {"local": 1}}},
            "provider.options",
        ),
    ],
)
async def test_every_rule_is_a_400_naming_the_field(
    stack: Stack, funded: IssuedKey, body: dict[str, Any], param: str
) -> None:
    response = await submit(stack, funded, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["metadata"]["param"] == param, error


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com:99999/h",
        "https://example.com:0/h",
        "https://example.com:http/h",
        "https://user:pass@example.com/h",
        "https://:443/h",
        "https:///h",
        "https://exa mple.com/h",
        "https://example.com/h\x00",
        "https://" + "a" * 64 + ".example.com/h",
        "https://example.com/" + "p" * 2100,
    ],
)
async def test_callback_urls_are_checked_in_full_at_submit(
    stack: Stack, funded: IssuedKey, url: str
) -> None:
    """A URL the webhook sender could never call is refused when given, not on every
    delivery attempt afterwards; the workspace default is held to the same rules."""
    response = await submit(
        stack, funded, {"model": "local/renderer", "prompt": "x", "callback_url": url}
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["metadata"] == {"param": "callback_url"}
    account = funded.workspace.account_id
    assert await stack.admin.count(VideoJob, VideoJob.account_id == account) == 0
    async with stack.admin.sessions() as session:
        workspace = await workspace_by_id(session, funded.workspace.id)
        assert workspace is not None
        with pytest.raises(GatewayError) as refused:
            await update_workspace(session, workspace, default_callback_url=url)
    assert refused.value.status == 400
    assert refused.value.metadata == {"param": "default_callback_url"}


async def test_wrong_enum_values_list_the_allowed_ones(stack: Stack, funded: IssuedKey) -> None:
    response = await submit(
        stack, funded, {"model": "local/renderer", "prompt": "x", "aspect_ratio": "5:4"}
    )
    error = response.json()["error"]
    assert "16:9" in error["message"] and "9:21" in error["message"]
    assert "16:9" in error["metadata"]["allowed"]


async def test_wrong_types_are_400(stack: Stack, funded: IssuedKey) -> None:
    for body in (
        {"model": "local/renderer", "prompt": "x", "duration": "long"},
        {"model": "local/renderer", "prompt": "x", "duration": 1.5},
        {"model": "local/renderer", "prompt": 5},
        {"model": "local/renderer", "prompt": "x", "frame_images": {}},
    ):
        response = await submit(stack, funded, body)
        assert response.status_code == 400, body
        assert response.json()["error"]["code"] == 400


def _alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def _child_pids(pid: int) -> list[int]:
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        children.extend(int(c) for c in text)
    return children


async def test_a_killed_server_resumes_its_job_and_charges_once(tmp_path: Path) -> None:
    """SIGKILL the gateway mid-job; a new process on the same database finishes the job
    after the dead worker's lease lapses, and the job is charged exactly once."""
    data_dir = tmp_path / "gw"
    url = f"sqlite+aiosqlite:///{data_dir / 'gateway.db'}"
    env = {"GATEWAY_JOB_LEASE_SECONDS": "2"}
    first = GatewayProcess(data_dir=data_dir, database_url=url, extra_env=env)
    await asyncio.to_thread(first.start)
    engine = create_engine(url)
    admin = Admin(session_factory(engine))
    try:
        workspace = await admin.workspace("resume")
        await admin.credits(workspace, "5")
        issued = await admin.key(workspace)
        async with httpx.AsyncClient(timeout=30) as client:
            response = await client.post(
                f"{first.base_url}/videos",
                headers=issued.headers,
                json={
                    "model": "local/renderer",
                    "prompt": "long",
                    # rendered twice (killed, then resumed): ~2 s each, long enough to be
                    # killed mid-render
                    "duration": 5,
                    "resolution": "480p",
                },
            )
        job_id = response.json()["id"]

        async def running() -> bool:
            async with admin.sessions() as session:
                job = await session.get(VideoJob, job_id, populate_existing=True)
            return job is not None and job.status == "in_progress"

        await eventually(running, within=20, interval=0.02, message="the job is running")
        assert first.process is not None
        envoy_pids = _child_pids(first.process.pid)
        first.process.kill()  # no cleanup at all
        first.process.wait(10)
        await eventually(  # Envoy follows its parent (PR_SET_PDEATHSIG)
            lambda: not any(_alive(pid) for pid in envoy_pids),
            within=5,
            message="Envoy exited with the gateway",
        )
        async with admin.sessions() as session:
            job = await session.get(VideoJob, job_id, populate_existing=True)
        assert job is not None and job.status == "in_progress"  # killed mid-job

        second = GatewayProcess(data_dir=data_dir, database_url=url, extra_env=env)
        await asyncio.to_thread(second.start)
        try:
            async with httpx.AsyncClient(timeout=30) as client:

                async def ended() -> dict[str, Any] | None:
                    body = (
                        await client.get(
                            f"{second.base_url}/videos/{job_id}", headers=issued.headers
                        )
                    ).json()
                    return body if body["status"] in ("completed", "failed") else None

                body = await eventually(ended, within=60, interval=0.2, message="the job ended")
                assert body["status"] == "completed", body
                content = await client.get(
                    f"{second.base_url}/videos/{job_id}/content", headers=issued.headers
                )
            assert mp4_facts(content.content)[0] == "h264"
            async with admin.sessions() as session:
                charges = (
                    await session.exec(
                        sa.select(LedgerEntry.amount_micros).where(
                            LedgerEntry.key_hash == issued.hash, LedgerEntry.kind == "charge"
                        )
                    )
                ).all()
            assert [c[0] for c in charges] == [5_000]  # 5 s x 0.001, once
        finally:
            await asyncio.to_thread(second.stop)
    finally:
        await engine.dispose()
        await asyncio.to_thread(first.stop)
