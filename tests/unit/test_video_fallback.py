"""One model served by two different adapters (fal, then Replicate), in-process with
VideoWorker: a retryable submission failure at fal falls back to Replicate and the job is
served and charged once; a content refusal does not fall back (another provider would be
asked the same thing); a job past its deadline is cancelled at its provider."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from server.db.models import CreditHold, Generation, VideoJob
from server.providers.fal_video import FalVideoAdapter
from server.providers.replicate_video import ReplicateVideoAdapter
from server.providers.seedance_video import SeedanceVideoAdapter
from server.providers.video import VideoAdapter
from server.routing.catalog import Catalog, load_catalog
from server.videos import jobs
from server.videos.content import LocalContentStore
from server.workers.video_worker import VideoWorker
from testkit.admin import IssuedKey
from testkit.domain import Domain, video_input
from testkit.fakes.video_providers import VIDEO
from tests.fakes import fal, replicate, seedance

PRICE_MICROS = 100_000  # 0.05 USD/s for 2 s
CAPS = """kind = "video"
price_per_second = "0.05"
resolutions = ["480p"]
aspect_ratios = ["16:9"]
durations = [2]
"""


def _endpoint(adapter: str, base: str, key_env: str, model: str) -> str:
    return f"""[[models.endpoints]]
provider = "{adapter}"
adapter = "{adapter}"
base_url = "{base}"
api_key_env = "{key_env}"
model = "{model}"
"""


def _catalog(folder: Path, fal_script: str) -> Catalog:
    path = folder / "catalog.toml"
    path.write_text(
        f'[[models]]\nid = "mixed/video"\n{CAPS}'
        + _endpoint("fal", "https://queue.fal.test", "TEST_FAL_KEY", f"fal-ai/mixed/{fal_script}")
        + _endpoint("replicate", "https://api.replicate.test/v1", "TEST_REPLICATE", "owner/ok")
        # Seedance 2.0 makes 4 to 15 s videos (its fake refuses others, as ModelArk does).
        + f'[[models]]\nid = "mixed/endless"\n{CAPS.replace("[2]", "[4]")}'
        + _endpoint("seedance", "https://ark.test/api/v3", "TEST_ARK", "never")
    )
    return load_catalog(path)


class Providers:
    def __init__(self) -> None:
        self.fal = fal.FakeFal()
        self.replicate = replicate.FakeReplicate()
        self.seedance = seedance.FakeSeedance()

    def handle(self, request: httpx.Request) -> httpx.Response:
        routes: dict[str, Callable[[httpx.Request], httpx.Response]] = {
            "queue.fal.test": self.fal.handle,
            "api.replicate.test": self.replicate.handle,
            "ark.test": self.seedance.handle,
        }
        return routes[request.url.host](request)


@pytest.fixture
def providers(monkeypatch: pytest.MonkeyPatch) -> Providers:
    monkeypatch.setenv("TEST_FAL_KEY", fal.API_KEY)
    monkeypatch.setenv("TEST_REPLICATE", replicate.API_KEY)
    monkeypatch.setenv("TEST_ARK", seedance.API_KEY)
    return Providers()


def _worker(
    domain: Domain, catalog: Catalog, http: httpx.AsyncClient, store: LocalContentStore
) -> VideoWorker:
    adapters: dict[str, VideoAdapter] = {
        "fal": FalVideoAdapter(http),
        "replicate": ReplicateVideoAdapter(http),
        "seedance": SeedanceVideoAdapter(http),
    }
    return VideoWorker(domain.sessions, domain.clock, catalog, adapters, store)


async def _submit(domain: Domain, catalog: Catalog, issued: IssuedKey, model_id: str) -> str:
    model = catalog.get(model_id)
    assert model is not None and model.video is not None and model.video.durations
    video = video_input(model)
    seconds = model.video.durations[0]
    video = dataclasses.replace(
        video, duration=seconds, params={**video.params, "duration": seconds}
    )
    principal = await domain.principal(issued)
    async with domain.sessions() as session:
        job = await jobs.submit_job(
            session, principal, video, domain.clock.now(), None, domain.limits
        )
    return job.id


async def _step(worker: VideoWorker) -> None:
    claimed = await worker.claim()
    assert claimed is not None, "no job was due"
    await worker.step(claimed)


async def _job(domain: Domain, job_id: str) -> VideoJob:
    (job,) = await domain.rows(VideoJob, VideoJob.id == job_id)
    assert isinstance(job, VideoJob)
    return job


def _posts(fake: fal.FakeFal | replicate.FakeReplicate) -> int:
    return len([r for r in fake.requests if r.method == "POST"])


async def test_a_retryable_failure_at_fal_falls_back_to_replicate_and_charges_once(
    domain: Domain, providers: Providers, tmp_path: Path
) -> None:
    catalog = _catalog(tmp_path, "error-503")
    store = LocalContentStore(tmp_path / "content")
    issued = await domain.funded_key("mixed-fallback")
    account = issued.workspace.account_id
    async with httpx.AsyncClient(transport=httpx.MockTransport(providers.handle)) as http:
        worker = _worker(domain, catalog, http, store)
        job_id = await _submit(domain, catalog, issued, "mixed/video")
        await _step(worker)  # fal answers 503; Replicate takes the job
        job = await _job(domain, job_id)
        assert (job.provider, job.endpoint_index, job.status) == ("replicate", 1, jobs.IN_PROGRESS)
        for _ in range(2):  # processing, then succeeded
            domain.clock.advance(timedelta(seconds=30))
            await _step(worker)
    job = await _job(domain, job_id)
    assert (job.status, job.cost_micros, job.content_count) == (jobs.COMPLETED, PRICE_MICROS, 1)
    assert store.path(job_id, 0).read_bytes() == VIDEO
    assert (_posts(providers.fal), _posts(providers.replicate)) == (1, 1)
    assert await domain.charges(account) == [PRICE_MICROS]
    assert await domain.count(CreditHold, CreditHold.account_id == account) == 0
    (generation,) = await domain.rows(Generation, Generation.account_id == account)
    assert (generation.provider, generation.status) == ("replicate", "completed")


async def test_a_content_refusal_at_fal_does_not_fall_back(
    domain: Domain, providers: Providers, tmp_path: Path
) -> None:
    catalog = _catalog(tmp_path, "refuse")
    issued = await domain.funded_key("mixed-refused")
    account = issued.workspace.account_id
    async with httpx.AsyncClient(transport=httpx.MockTransport(providers.handle)) as http:
        worker = _worker(domain, catalog, http, LocalContentStore(tmp_path / "content"))
        job_id = await _submit(domain, catalog, issued, "mixed/video")
        await _step(worker)
    job = await _job(domain, job_id)
    assert job.status == jobs.FAILED
    assert job.error is not None and "content checker" in job.error
    assert (_posts(providers.fal), providers.replicate.requests) == (1, [])
    assert await domain.charges(account) == []
    assert await domain.count(CreditHold, CreditHold.account_id == account) == 0


async def test_a_job_that_never_ends_is_failed_and_cancelled_at_its_provider(
    domain: Domain, providers: Providers, tmp_path: Path
) -> None:
    catalog = _catalog(tmp_path, "ok")
    issued = await domain.funded_key("mixed-endless")
    account = issued.workspace.account_id
    async with httpx.AsyncClient(transport=httpx.MockTransport(providers.handle)) as http:
        worker = _worker(domain, catalog, http, LocalContentStore(tmp_path / "content"))
        job_id = await _submit(domain, catalog, issued, "mixed/endless")
        await _step(worker)  # submitted: queued at the provider
        domain.clock.advance(jobs.JOB_DEADLINE + timedelta(minutes=1))
        await _step(worker)
    job = await _job(domain, job_id)
    assert (job.status, job.error) == (jobs.FAILED, "The provider did not finish in time")
    (task,) = providers.seedance.tasks.values()
    assert task["status"] == "cancelled"
    assert providers.seedance.requests[-1].method == "DELETE"
    assert await domain.charges(account) == []
