"""A provider job that never ends still ends: past the job deadline the worker fails it,
releases its hold, charges nothing and (where the adapter can) cancels it upstream."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from server.db.models import CreditHold, VideoJob
from server.providers.endpoint import Endpoint
from server.providers.video import VideoCall, VideoProgress
from server.videos import jobs
from server.videos.content import LocalContentStore
from server.workers.video_worker import VideoWorker
from testkit.domain import Domain, video_input


class NeverEnding:
    """A provider whose job runs forever, with a cancel call."""

    def __init__(self) -> None:
        self.polls = 0
        self.cancelled: list[str] = []

    async def submit(self, endpoint: Endpoint, call: VideoCall) -> VideoProgress:
        return VideoProgress(state="running", provider_job_id="stuck-1")

    async def poll(
        self, endpoint: Endpoint, provider_job_id: str, call: VideoCall
    ) -> VideoProgress:
        self.polls += 1
        return VideoProgress(state="running", provider_job_id=provider_job_id)

    async def cancel(self, endpoint: Endpoint, provider_job_id: str, call: VideoCall) -> None:
        self.cancelled.append(provider_job_id)


async def test_a_job_that_never_ends_fails_at_the_deadline_and_is_cancelled(
    domain: Domain, tmp_path: Path
) -> None:
    provider = NeverEnding()
    worker = VideoWorker(
        domain.sessions,
        domain.clock,
        domain.catalog,
        {"openai": provider},  # the adapter unitvideo/ok's endpoint names
        LocalContentStore(tmp_path / "content"),
    )
    issued = await domain.funded_key("video-stuck")
    account = issued.workspace.account_id
    model = domain.catalog.get("unitvideo/ok")
    assert model is not None
    video = video_input(model)
    async with domain.sessions() as session:
        job = await jobs.submit_job(
            session, await domain.principal(issued), video, domain.clock.now(), None, domain.limits
        )

    async def step() -> VideoJob:
        claimed = await worker.claim()
        assert claimed is not None, "the job was not due"
        await worker.step(claimed)
        (row,) = await domain.rows(VideoJob, VideoJob.id == job.id)
        return row

    assert (await step()).status == jobs.IN_PROGRESS  # submitted
    for _ in range(3):  # polled: still running
        domain.clock.advance(timedelta(seconds=30))
        assert (await step()).status == jobs.IN_PROGRESS
    assert provider.polls == 3 and provider.cancelled == []

    domain.clock.set(job.created_at + jobs.JOB_DEADLINE + timedelta(seconds=1))
    row = await step()
    assert (row.status, row.error) == (jobs.FAILED, "The provider did not finish in time")
    assert provider.cancelled == ["stuck-1"]
    assert provider.polls == 3  # not polled again once past the deadline
    assert await domain.charges(account) == []
    assert await domain.count(CreditHold, CreditHold.account_id == account) == 0
    assert await worker.claim() is None
