"""VideoWorker in-process: claim, submit, poll on a ManualClock, settle once; failure
releases; a lapsed lease lets another worker resume the job."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from server.db.models import CreditHold, Generation, VideoJob
from server.videos import jobs
from server.videos.content import LocalContentStore
from server.workers.video_worker import VideoWorker
from testkit.admin import IssuedKey
from testkit.domain import VIDEO_BYTES, Domain, video_input

PRICE_MICROS = 100_000  # 0.05 USD/s for 2 s


def _worker(
    domain: Domain, store: LocalContentStore, lease: timedelta = timedelta(minutes=2)
) -> VideoWorker:
    adapters = domain.video_adapters()
    return VideoWorker(
        domain.sessions,
        domain.clock,
        domain.catalog,
        adapters,
        store,
        lease=lease,
        writer=domain.writer,  # as build_core wires it
    )


async def _submit(domain: Domain, issued: IssuedKey, model: str) -> str:
    catalog_model = domain.catalog.get(model)
    assert catalog_model is not None
    video = video_input(catalog_model)
    principal = await domain.principal(issued)
    async with domain.sessions() as session:
        job = await jobs.submit_job(
            session, principal, video, domain.clock.now(), None, domain.limits
        )
    return job.id


async def _job(domain: Domain, job_id: str) -> VideoJob:
    (job,) = await domain.rows(VideoJob, VideoJob.id == job_id)
    return job


async def _run_step(worker: VideoWorker) -> str:
    claimed = await worker.claim()
    assert claimed is not None, "no job was due"
    await worker.step(claimed)
    return claimed.id


async def test_a_job_is_submitted_polled_completed_and_charged_once(
    any_domain: Domain, tmp_path: Path
) -> None:
    domain = any_domain
    store = LocalContentStore(tmp_path / "content")
    worker = _worker(domain, store)
    issued = await domain.funded_key("video-ok")
    account = issued.workspace.account_id
    job_id = await _submit(domain, issued, "unitvideo/ok")
    assert await domain.count(CreditHold, CreditHold.account_id == account) == 1

    assert await _run_step(worker) == job_id  # submitted; the provider says queued
    job = await _job(domain, job_id)
    assert (job.status, job.provider_job_id, job.attempts) == (jobs.IN_PROGRESS, "pv_1", 1)
    assert job.lease_owner is None  # given back until the next poll is due
    assert await worker.claim() is None  # the next poll is 1 s away

    domain.clock.advance(timedelta(seconds=1))
    await _run_step(worker)  # first poll: still running
    assert (await _job(domain, job_id)).status == jobs.IN_PROGRESS
    assert await worker.claim() is None
    domain.clock.advance(timedelta(seconds=2))
    await _run_step(worker)  # second poll: completed, content fetched

    job = await _job(domain, job_id)
    assert (job.status, job.cost_micros, job.content_count) == (jobs.COMPLETED, PRICE_MICROS, 1)
    assert store.path(job_id, 0).is_file() and store.path(job_id, 0).read_bytes() == VIDEO_BYTES
    assert await domain.charges(account) == [PRICE_MICROS]
    assert await domain.counted_spend(account) == PRICE_MICROS
    assert await domain.count(CreditHold, CreditHold.account_id == account) == 0
    (generation,) = await domain.rows(Generation, Generation.account_id == account)
    assert (generation.id, generation.status) == (job.generation_id, "completed")
    assert [r.method for r in domain.providers.sent_to("video.test")] == [
        "POST",
        "GET",
        "GET",
        "GET",
    ]
    domain.clock.advance(timedelta(hours=1))
    assert await worker.claim() is None  # finished: never claimed again


async def test_a_provider_failure_releases_the_hold_and_charges_nothing(
    domain: Domain, tmp_path: Path
) -> None:
    worker = _worker(domain, LocalContentStore(tmp_path / "content"))
    issued = await domain.funded_key("video-fail")
    account = issued.workspace.account_id
    job_id = await _submit(domain, issued, "unitvideo/fail")
    await _run_step(worker)
    for _ in range(2):
        domain.clock.advance(timedelta(seconds=30))
        await _run_step(worker)
    job = await _job(domain, job_id)
    assert job.status == jobs.FAILED
    assert job.error == "Provider failed: content policy"
    assert job.cost_micros is None
    assert await domain.charges(account) == []
    assert await domain.count(CreditHold, CreditHold.account_id == account) == 0
    (generation,) = await domain.rows(Generation, Generation.account_id == account)
    assert (generation.status, generation.cost_micros) == ("failed", 0)


@pytest.mark.parametrize("late_finish", [False, True])
async def test_a_lapsed_lease_lets_another_worker_resume_the_job(
    any_domain: Domain, tmp_path: Path, late_finish: bool
) -> None:
    """Worker A claims the job and stalls (its process died, or hangs); B cannot take it
    while A's lease runs, takes it once it lapses, and completes it. A's late finish (if it
    wakes up) changes nothing: the job is charged once."""
    domain = any_domain
    store = LocalContentStore(tmp_path / "content")
    lease = timedelta(minutes=2)
    a, b = _worker(domain, store, lease=lease), _worker(domain, store, lease=lease)
    issued = await domain.funded_key("video-lease")
    account = issued.workspace.account_id
    job_id = await _submit(domain, issued, "unitvideo/ok")

    stalled = await a.claim()
    assert stalled is not None and stalled.lease_owner == a.owner
    assert await b.claim() is None  # leased to A
    domain.clock.advance(lease - timedelta(seconds=1))
    assert await b.claim() is None  # still A's
    domain.clock.advance(timedelta(seconds=2))
    for _ in range(3):  # submit, poll (running), poll (completed)
        assert await _run_step(b) == job_id
        domain.clock.advance(timedelta(seconds=5))
    if late_finish:
        await a.finish(stalled, domain.catalog.get("unitvideo/ok"), videos=1)
    job = await _job(domain, job_id)
    assert job.status == jobs.COMPLETED
    assert await domain.charges(account) == [PRICE_MICROS]
    assert await domain.count(Generation, Generation.account_id == account) == 1
    assert len([r for r in domain.providers.sent_to("video.test") if r.method == "POST"]) == 1
