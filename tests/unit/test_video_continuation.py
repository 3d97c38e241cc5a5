"""POST /videos `previous_job_id` in-process: which earlier jobs may be continued (404, 400,
409), and that the worker continues on the endpoint that served the earlier job, passing
its provider job id (OpenAI's remix)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from server.errors import GatewayError
from server.providers.video import can_continue
from server.routing.catalog import Model
from server.videos import jobs
from server.videos.content import LocalContentStore
from server.videos.request import VideoInput
from server.workers.video_worker import VideoWorker
from testkit.admin import IssuedKey
from testkit.domain import Domain


def _video(model: Model, previous_job_id: str | None = None) -> VideoInput:
    return VideoInput(
        model=model,
        params={"prompt": "now at night", "duration": 2, "width": 854, "height": 480},
        duration=2,
        callback_url=None,
        session_id=None,
        user=None,
        trace=None,
        previous_job_id=previous_job_id,
    )


def _model(domain: Domain, model_id: str) -> Model:
    model = domain.catalog.get(model_id)
    assert model is not None
    return model


async def _submit(
    domain: Domain, worker: VideoWorker, issued: IssuedKey, model: str, previous: str | None = None
) -> str:
    principal = await domain.principal(issued)
    video = _video(_model(domain, model), previous)
    async with domain.sessions() as session:
        continuation = await jobs.continuation_of(
            session,
            principal,
            video,
            lambda endpoint: can_continue(worker.adapters.get(endpoint.adapter)),
        )
        job = await jobs.submit_job(
            session,
            principal,
            video,
            domain.clock.now(),
            None,
            domain.limits,
            None,
            continuation,
        )
    return job.id


async def _run_until_done(domain: Domain, worker: VideoWorker) -> None:
    for _ in range(10):
        claimed = await worker.claim()
        if claimed is None:
            domain.clock.advance(timedelta(seconds=30))
            claimed = await worker.claim()
            if claimed is None:
                return
        await worker.step(claimed)


@pytest.fixture
def worker(domain: Domain, tmp_path: Path) -> VideoWorker:
    store = LocalContentStore(tmp_path / "content")
    return VideoWorker(
        domain.sessions, domain.clock, domain.catalog, domain.video_adapters(), store
    )


async def test_a_continuation_runs_on_the_earlier_endpoint_with_its_provider_job_id(
    domain: Domain, worker: VideoWorker
) -> None:
    issued = await domain.funded_key("continue")
    first = await _submit(domain, worker, issued, "unitvideo/ok")
    await _run_until_done(domain, worker)
    (done,) = await domain.rows(jobs.VideoJob, jobs.VideoJob.id == first)
    assert done.status == jobs.COMPLETED and done.provider_job_id == "pv_1"

    second = await _submit(domain, worker, issued, "unitvideo/ok", previous=first)
    await _run_until_done(domain, worker)
    (continued,) = await domain.rows(jobs.VideoJob, jobs.VideoJob.id == second)
    assert continued.status == jobs.COMPLETED
    assert (continued.provider, continued.endpoint_index) == (done.provider, done.endpoint_index)
    remix = [r for r in domain.providers.sent_to("video.test") if r.method == "POST"][-1]
    assert remix.url.path == "/v1/videos/pv_1/remix"
    assert json.loads(remix.content) == {"prompt": "now at night"}
    assert "continuation" not in remix.content.decode()


async def test_which_earlier_jobs_can_be_continued(domain: Domain, worker: VideoWorker) -> None:
    issued = await domain.funded_key("continue-rules")
    other = await domain.funded_key("continue-other")
    running = await _submit(domain, worker, issued, "unitvideo/ok")
    with pytest.raises(GatewayError) as not_done:
        await _submit(domain, worker, issued, "unitvideo/ok", previous=running)
    assert not_done.value.status == 409
    await _run_until_done(domain, worker)

    with pytest.raises(GatewayError) as other_model:
        await _submit(domain, worker, issued, "unitvideo/fail", previous=running)
    assert other_model.value.status == 400
    assert (other_model.value.metadata or {}).get("param") == "previous_job_id"

    for stranger, job_id in ((other, running), (issued, "vid_unknown")):
        with pytest.raises(GatewayError) as hidden:
            await _submit(domain, worker, stranger, "unitvideo/ok", previous=job_id)
        assert hidden.value.status == 404

    # A provider without a continuation API: 400 naming the field, nothing held.
    no_continuation = VideoWorker(
        domain.sessions, domain.clock, domain.catalog, {}, LocalContentStore(Path("/nonexistent"))
    )
    with pytest.raises(GatewayError) as unsupported:
        await _submit(domain, no_continuation, issued, "unitvideo/ok", previous=running)
    assert unsupported.value.status == 400
    assert (unsupported.value.metadata or {}).get("param") == "previous_job_id"
