"""Cancelling a video job in-process, on a ManualClock: the hold is released (no charge),
the cancelled webhook is queued, the job is never claimed again, the provider is asked to
cancel where its adapter can; and the races — a poll in flight that completes, a
submission in flight, a completion that commits first — decided one way each."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from server.auth import Principal
from server.db.models import CreditHold, VideoJob, WebhookDelivery
from server.errors import GatewayError
from server.providers.endpoint import Endpoint
from server.providers.openai_video import OpenAIVideoAdapter
from server.providers.video import VideoAdapter, VideoCall
from server.videos import jobs
from server.videos.cancel import cancel_job
from server.videos.content import LocalContentStore
from server.videos.request import VideoInput
from server.workers.video_worker import VideoWorker
from testkit.admin import IssuedKey
from testkit.domain import Domain

HOOK = "https://hooks.test/cancel"


class CancellingAdapter(OpenAIVideoAdapter):
    """The OpenAI protocol plus a cancel (which that API lacks), recorded."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.cancelled: list[tuple[str, str]] = []

    async def cancel(self, endpoint: Endpoint, provider_job_id: str, call: VideoCall) -> None:
        self.cancelled.append((provider_job_id, call.model))


@pytest.fixture
def adapter(domain: Domain) -> CancellingAdapter:
    return CancellingAdapter(domain.http)


@pytest.fixture
def store(tmp_path: Path) -> LocalContentStore:
    return LocalContentStore(tmp_path / "content")


def _worker(
    domain: Domain, store: LocalContentStore, adapters: dict[str, VideoAdapter]
) -> VideoWorker:
    return VideoWorker(domain.sessions, domain.clock, domain.catalog, adapters, store)


async def _submit(domain: Domain, issued: IssuedKey) -> tuple[Principal, str]:
    model = domain.catalog.get("unitvideo/ok")
    assert model is not None
    video = VideoInput(
        model=model,
        params={"prompt": "a lighthouse", "duration": 2, "width": 854, "height": 480},
        duration=2,
        callback_url=HOOK,
        session_id=None,
        user=None,
        trace=None,
    )
    principal = await domain.principal(issued)
    async with domain.sessions() as session:
        job = await jobs.submit_job(
            session, principal, video, domain.clock.now(), None, domain.limits
        )
    return principal, job.id


async def _cancel(
    domain: Domain, principal: Principal, job_id: str, adapters: dict[str, VideoAdapter]
) -> VideoJob:
    """What the service does: the worker (any process's) asks the provider to cancel."""
    worker = _worker(domain, LocalContentStore(Path("/nonexistent")), adapters)
    return await cancel_job(
        domain.sessions, principal, job_id, domain.clock.now(), worker.cancel_at_provider
    )


async def _job(domain: Domain, job_id: str) -> VideoJob:
    (job,) = await domain.rows(VideoJob, VideoJob.id == job_id)
    return job


async def _hooks(domain: Domain, job_id: str) -> list[str]:
    rows = await domain.rows(WebhookDelivery, WebhookDelivery.job_id == job_id)
    return [json.loads(r.payload)["type"] for r in rows]


async def _released_and_uncharged(domain: Domain, issued: IssuedKey) -> bool:
    account = issued.workspace.account_id
    holds = await domain.count(CreditHold, CreditHold.account_id == account)
    return holds == 0 and await domain.charges(account) == []


async def test_cancelling_a_running_job_stops_it_everywhere(
    domain: Domain, store: LocalContentStore, adapter: CancellingAdapter
) -> None:
    adapters: dict[str, VideoAdapter] = {"openai": adapter}
    worker = _worker(domain, store, adapters)
    issued = await domain.funded_key("cancel-running")
    principal, job_id = await _submit(domain, issued)
    claimed = await worker.claim()
    assert claimed is not None
    await worker.step(claimed)  # submitted: provider job pv_1 running
    assert (await _job(domain, job_id)).provider_job_id == "pv_1"

    answered = await _cancel(domain, principal, job_id, adapters)
    assert jobs.job_document(answered)["status"] == "cancelled"
    assert adapter.cancelled == [("pv_1", "ok")]  # asked once, with the provider's job id
    assert await _released_and_uncharged(domain, issued)
    assert await _hooks(domain, job_id) == ["video.generation.cancelled"]
    domain.clock.advance(timedelta(hours=1))
    assert await worker.claim() is None  # never polled again
    polls = [r for r in domain.providers.sent_to("video.test") if r.method == "GET"]
    assert polls == []

    # A second cancel changes nothing and says why; another workspace's job is unknown.
    with pytest.raises(GatewayError) as again:
        await _cancel(domain, principal, job_id, adapters)
    assert again.value.status == 409 and "already cancelled" in again.value.message
    stranger = await domain.principal(await domain.funded_key("cancel-stranger"))
    with pytest.raises(GatewayError) as hidden:
        await _cancel(domain, stranger, job_id, adapters)
    assert hidden.value.status == 404
    assert adapter.cancelled == [("pv_1", "ok")]
    assert await _hooks(domain, job_id) == ["video.generation.cancelled"]


async def test_a_pending_job_is_cancelled_without_a_provider_call(
    domain: Domain, store: LocalContentStore
) -> None:
    """OpenAI's videos API has no cancel: the adapter has none and nothing is sent."""
    adapters: dict[str, VideoAdapter] = {"openai": OpenAIVideoAdapter(domain.http)}
    issued = await domain.funded_key("cancel-pending")
    principal, job_id = await _submit(domain, issued)
    await _cancel(domain, principal, job_id, adapters)
    assert (await _job(domain, job_id)).status == jobs.CANCELLED
    assert await _worker(domain, store, adapters).claim() is None
    assert domain.providers.sent_to("video.test") == []
    assert await _released_and_uncharged(domain, issued)


async def test_a_poll_in_flight_that_completes_after_the_cancel_changes_nothing(
    domain: Domain, store: LocalContentStore, adapter: CancellingAdapter
) -> None:
    adapters: dict[str, VideoAdapter] = {"openai": adapter}
    worker = _worker(domain, store, adapters)
    issued = await domain.funded_key("cancel-race")
    principal, job_id = await _submit(domain, issued)
    for _ in range(2):  # submit, then a first poll (still running)
        claimed = await worker.claim()
        assert claimed is not None
        await worker.step(claimed)
        domain.clock.advance(timedelta(seconds=30))
    in_flight = await worker.claim()  # this poll will find the video completed...
    assert in_flight is not None
    await _cancel(domain, principal, job_id, adapters)  # ...but the cancel commits first
    await worker.step(in_flight)
    job = await _job(domain, job_id)
    assert (job.status, job.cost_micros, job.content_count) == (jobs.CANCELLED, None, 0)
    assert not store.path(job_id, 0).is_file()  # the downloaded video was thrown away
    assert await _released_and_uncharged(domain, issued)
    assert await _hooks(domain, job_id) == ["video.generation.cancelled"]


async def test_a_completion_committed_first_makes_the_cancel_a_409(
    domain: Domain, store: LocalContentStore, adapter: CancellingAdapter
) -> None:
    adapters: dict[str, VideoAdapter] = {"openai": adapter}
    worker = _worker(domain, store, adapters)
    issued = await domain.funded_key("cancel-late")
    principal, job_id = await _submit(domain, issued)
    while (claimed := await worker.claim()) is not None or (
        (await _job(domain, job_id)).status == jobs.IN_PROGRESS
    ):
        if claimed is not None:
            await worker.step(claimed)
        domain.clock.advance(timedelta(seconds=30))
    assert (await _job(domain, job_id)).status == jobs.COMPLETED
    with pytest.raises(GatewayError) as late:
        await _cancel(domain, principal, job_id, adapters)
    assert late.value.status == 409
    assert adapter.cancelled == []
    assert len(await domain.charges(issued.workspace.account_id)) == 1  # charged once


async def test_a_submission_in_flight_when_cancelled_is_cancelled_at_the_provider(
    domain: Domain, store: LocalContentStore, adapter: CancellingAdapter
) -> None:
    adapters: dict[str, VideoAdapter] = {"openai": adapter}
    worker = _worker(domain, store, adapters)
    issued = await domain.funded_key("cancel-submitting")
    principal, job_id = await _submit(domain, issued)
    submitting = await worker.claim()  # about to submit: no provider job id yet
    assert submitting is not None
    await _cancel(domain, principal, job_id, adapters)
    assert adapter.cancelled == []  # nothing known to cancel yet
    await worker.step(submitting)  # the provider accepts the job: pv_1
    assert adapter.cancelled == [("pv_1", "ok")]  # the worker cancels what it started
    job = await _job(domain, job_id)
    assert (job.status, job.provider_job_id) == (jobs.CANCELLED, None)
    domain.clock.advance(timedelta(hours=1))
    assert await worker.claim() is None
    assert await _released_and_uncharged(domain, issued)
