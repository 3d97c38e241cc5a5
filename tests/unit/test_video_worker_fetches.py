"""The video worker's bounds in-process (issue 29 items 4, 5), on a ManualClock: jobs run
concurrently (a slow one holds only itself), a running job's lease is renewed so no other
worker takes it over, and a provider's result past GATEWAY_VIDEO_MAX_BYTES or the download
deadline fails its job for good (uncharged, nothing stored, not fetched again)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from server.db.models import CreditHold, VideoJob
from server.providers.endpoint import Endpoint
from server.providers.failures import SERVER_ERROR, ProviderFailure
from server.providers.http import Downloads
from server.providers.video import VideoAdapter, VideoCall, VideoProgress, VideoSource
from server.videos import jobs
from server.videos.cancel import cancel_job
from server.videos.content import LocalContentStore
from server.videos.request import VideoInput
from server.workers.video_worker import VideoWorker
from testkit.admin import IssuedKey
from testkit.domain import Domain
from testkit.eventually import eventually
from tests.support.video_content import video_bytes


class ScriptedAdapter:
    """Completes a job at submission with `results[prompt]`; a prompt in `gates` first waits
    for its event (a slow provider, image host or download)."""

    def __init__(self, results: dict[str, VideoSource]) -> None:
        self.results = results
        self.gates: dict[str, asyncio.Event] = {}
        self.calls: list[str] = []
        self._ids = itertools.count(1)

    async def submit(self, endpoint: Endpoint, call: VideoCall) -> VideoProgress:
        prompt = str(call.params["prompt"])
        self.calls.append(prompt)
        gate = self.gates.get(prompt)
        if gate is not None:
            await asyncio.wait_for(gate.wait(), timeout=20)
        return VideoProgress(
            state="completed",
            provider_job_id=f"scripted-{next(self._ids)}",
            videos=[self.results[prompt]],
        )

    async def poll(
        self, endpoint: Endpoint, provider_job_id: str, call: VideoCall
    ) -> VideoProgress:
        return await self.submit(endpoint, call)


def _worker(
    domain: Domain, store: LocalContentStore, adapter: ScriptedAdapter, **bounds: object
) -> VideoWorker:
    adapters: dict[str, VideoAdapter] = {"openai": adapter}
    return VideoWorker(
        domain.sessions,
        domain.clock,
        domain.catalog,
        adapters,
        store,
        idle_wait=0.05,
        writer=domain.writer,
        **bounds,  # type: ignore[arg-type]
    )


async def _submit(domain: Domain, issued: IssuedKey, prompt: str) -> str:
    model = domain.catalog.get("unitvideo/ok")
    assert model is not None
    video = VideoInput(
        model=model,
        params={"prompt": prompt, "duration": 2, "width": 854, "height": 480},
        duration=2,
        callback_url=None,
        session_id=None,
        user=None,
        trace=None,
    )
    principal = await domain.principal(issued)
    async with domain.sessions() as session:
        job = await jobs.submit_job(
            session, principal, video, domain.clock.now(), None, domain.limits
        )
    return job.id


async def _job(domain: Domain, job_id: str) -> VideoJob:
    (job,) = await domain.rows(VideoJob, VideoJob.id == job_id)
    return job


async def _status(domain: Domain, job_id: str) -> str:
    return (await _job(domain, job_id)).status


def _files(store: LocalContentStore) -> list[str]:
    if not store.root.exists():
        return []
    return sorted(str(p.relative_to(store.root)) for p in store.root.rglob("*"))


async def _uncharged(domain: Domain, issued: IssuedKey) -> None:
    account = issued.workspace.account_id
    assert await domain.charges(account) == []
    assert await domain.count(CreditHold, CreditHold.account_id == account) == 0


async def test_a_slow_job_does_not_hold_another_workspaces_job(
    domain: Domain, tmp_path: Path
) -> None:
    """Before: one worker loop ran one job at a time, so the fast job waited for the slow
    one (its image fetch, its download) to end."""
    adapter = ScriptedAdapter({"slow": b"slow video", "fast": b"fast video"})
    adapter.gates["slow"] = asyncio.Event()
    store = LocalContentStore(tmp_path / "content")
    worker = _worker(domain, store, adapter)
    attacker = await domain.funded_key("slow-attacker")
    victim = await domain.funded_key("fast-victim")
    slow = await _submit(domain, attacker, "slow")
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    try:
        await eventually(lambda: "slow" in adapter.calls, within=10, message="slow job started")
        fast = await _submit(domain, victim, "fast")
        worker.wake.set()

        async def fast_done() -> bool:
            return await _status(domain, fast) == jobs.COMPLETED

        await eventually(fast_done, within=10, message="the fast job to complete")
        assert await _status(domain, slow) == jobs.IN_PROGRESS  # still at its provider
        adapter.gates["slow"].set()

        async def slow_done() -> bool:
            return await _status(domain, slow) == jobs.COMPLETED

        await eventually(slow_done, within=10, message="the slow job to complete")
    finally:
        stop.set()
        await asyncio.wait_for(running, timeout=10)
    assert store.path(fast, 0).read_bytes() == b"fast video"
    assert store.path(slow, 0).read_bytes() == b"slow video"


async def test_no_more_jobs_than_jobs_at_once_run_in_one_process(
    domain: Domain, tmp_path: Path
) -> None:
    adapter = ScriptedAdapter({f"job{i}": b"v" for i in range(3)})
    for i in range(3):
        adapter.gates[f"job{i}"] = asyncio.Event()
    worker = _worker(domain, LocalContentStore(tmp_path / "content"), adapter, jobs_at_once=2)
    issued = await domain.funded_key("at-once")
    ids = [await _submit(domain, issued, f"job{i}") for i in range(3)]
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    try:
        await eventually(lambda: len(adapter.calls) == 2, within=10, message="two jobs started")
        await asyncio.sleep(0.3)  # several idle polls: the third is not claimed meanwhile
        assert len(adapter.calls) == 2
        assert (await _job(domain, ids[2])).lease_owner is None
        adapter.gates[adapter.calls[0]].set()
        await eventually(lambda: len(adapter.calls) == 3, within=10, message="the third job")
        for gate in adapter.gates.values():
            gate.set()

        async def all_done() -> bool:
            return all([await _status(domain, i) == jobs.COMPLETED for i in ids])

        await eventually(all_done, within=10, message="every job to complete")
    finally:
        stop.set()
        await asyncio.wait_for(running, timeout=10)


async def test_one_workspaces_slow_jobs_leave_slots_to_the_others(
    domain: Domain, tmp_path: Path
) -> None:
    """A workspace takes at most `workspace_jobs_at_once` of the slots (across processes:
    counted in the database), even with more of its jobs due and a slot free. Before: its
    jobs were claimed oldest first into every slot, and another workspace's job waited for
    one of them to end."""
    prompts = [f"slow{i}" for i in range(4)]
    adapter = ScriptedAdapter({**{p: b"slow video" for p in prompts}, "fast": b"fast video"})
    for prompt in prompts:
        adapter.gates[prompt] = asyncio.Event()
    worker = _worker(
        domain,
        LocalContentStore(tmp_path / "content"),
        adapter,
        jobs_at_once=3,
        workspace_jobs_at_once=2,
    )
    other_worker = _worker(
        domain,
        LocalContentStore(tmp_path / "content"),
        adapter,
        jobs_at_once=3,
        workspace_jobs_at_once=2,
    )
    attacker = await domain.funded_key("many-slow-jobs")
    victim = await domain.funded_key("one-fast-job")
    slow = [await _submit(domain, attacker, prompt) for prompt in prompts]
    stop = asyncio.Event()
    running = [asyncio.create_task(w.run(stop)) for w in (worker, other_worker)]
    try:
        await eventually(lambda: len(adapter.calls) == 2, within=10, message="two slow jobs")
        await asyncio.sleep(0.3)  # several idle polls of both workers: no third is claimed
        assert len(adapter.calls) == 2
        leased = [(await _job(domain, job_id)).lease_owner is not None for job_id in slow]
        assert leased.count(True) == 2
        fast = await _submit(domain, victim, "fast")
        worker.wake.set()

        async def fast_done() -> bool:
            return await _status(domain, fast) == jobs.COMPLETED

        await eventually(fast_done, within=10, message="the other workspace's job")
        adapter.gates[adapter.calls[0]].set()
        await eventually(lambda: len(adapter.calls) == 4, within=10, message="the third slow job")
        for gate in adapter.gates.values():
            gate.set()

        async def all_done() -> bool:
            return all([await _status(domain, i) == jobs.COMPLETED for i in slow])

        await eventually(all_done, within=10, message="every slow job")
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*running), timeout=10)


async def test_a_running_jobs_lease_is_renewed_so_no_other_worker_takes_it(
    any_domain: Domain, tmp_path: Path
) -> None:
    """Before: the lease ran out during a step longer than it (a long download) and another
    process's worker took the job up and ran it a second time."""
    domain = any_domain
    adapter = ScriptedAdapter({"long": b"long video"})
    adapter.gates["long"] = asyncio.Event()
    store = LocalContentStore(tmp_path / "content")
    lease = timedelta(seconds=0.3)  # renewed every 0.1 s (real time)
    a = _worker(domain, store, adapter, lease=lease)
    b = _worker(domain, store, adapter, lease=lease)
    issued = await domain.funded_key("renewed")
    job_id = await _submit(domain, issued, "long")
    stop = asyncio.Event()
    running = asyncio.create_task(a.run(stop))
    try:
        await eventually(lambda: adapter.calls == ["long"], within=10, message="A's step")
        for _ in range(3):
            domain.clock.advance(timedelta(seconds=1))  # past the lease each time

            async def renewed() -> bool:
                job = await _job(domain, job_id)
                assert job.lease_expires_at is not None
                return job.lease_expires_at > domain.clock.now()

            await eventually(renewed, within=5, message="A to renew its lease")
            assert await b.claim() is None
        adapter.gates["long"].set()

        async def done() -> bool:
            return await _status(domain, job_id) == jobs.COMPLETED

        await eventually(done, within=10, message="the job to complete")
    finally:
        stop.set()
        await asyncio.wait_for(running, timeout=10)
    assert adapter.calls == ["long"]  # run once


async def test_a_result_past_max_bytes_fails_the_job_for_good(
    any_domain: Domain, tmp_path: Path
) -> None:
    domain = any_domain
    adapter = ScriptedAdapter({"big": b"x" * 17})
    store = LocalContentStore(tmp_path / "content")
    worker = _worker(domain, store, adapter, max_video_bytes=16)
    issued = await domain.funded_key("too-big")
    job_id = await _submit(domain, issued, "big")
    claimed = await worker.claim()
    assert claimed is not None
    await worker.step(claimed)
    job = await _job(domain, job_id)
    assert (job.status, job.error) == (
        jobs.FAILED,
        "The provider's video is larger than the limit (16 bytes)",
    )
    await _uncharged(domain, issued)
    assert _files(store) == []
    domain.clock.advance(timedelta(hours=1))
    assert await worker.claim() is None  # terminal: never fetched again
    assert adapter.calls == ["big"]


async def test_an_endless_download_fails_the_job_within_the_deadline_for_good(
    any_domain: Domain, tmp_path: Path
) -> None:
    """A provider file that never ends (a byte every 50 ms) against a 0.5 s deadline."""
    domain = any_domain
    fetched: list[httpx.Request] = []

    async def trickle() -> AsyncIterator[bytes]:
        for _ in range(400):  # 20 s at most: the deadline ends it long before
            await asyncio.sleep(0.05)
            yield b"x"

    def provider(request: httpx.Request) -> httpx.Response:
        fetched.append(request)
        return httpx.Response(200, content=trickle())

    endpoint = Endpoint("vidco", "openai", "http://video.test/v1", model="ok")
    async with httpx.AsyncClient(transport=httpx.MockTransport(provider)) as http:
        remote = Downloads(http).remote(endpoint, "http://video.test/v1/files/out.mp4")
        adapter = ScriptedAdapter({"endless": remote})
        store = LocalContentStore(tmp_path / "content")
        worker = _worker(domain, store, adapter, download_seconds=0.5)
        issued = await domain.funded_key("endless")
        job_id = await _submit(domain, issued, "endless")
        claimed = await worker.claim()
        assert claimed is not None
        started = asyncio.get_running_loop().time()
        await worker.step(claimed)
        assert asyncio.get_running_loop().time() - started < 3
    job = await _job(domain, job_id)
    assert (job.status, job.error) == (
        jobs.FAILED,
        "The provider's video did not download within 0.5 s",
    )
    await _uncharged(domain, issued)
    assert _files(store) == []
    domain.clock.advance(timedelta(hours=1))
    assert await worker.claim() is None
    assert len(fetched) == 1


async def test_a_transient_download_failure_is_retried_at_the_next_poll(
    domain: Domain, tmp_path: Path
) -> None:
    answers = iter([httpx.Response(503), httpx.Response(200, content=b"the video")])
    endpoint = Endpoint("vidco", "openai", "http://video.test/v1", model="ok")
    async with httpx.AsyncClient(transport=httpx.MockTransport(lambda r: next(answers))) as http:
        remote = Downloads(http).remote(endpoint, "http://video.test/v1/files/out.mp4")
        adapter = ScriptedAdapter({"flaky": remote})
        store = LocalContentStore(tmp_path / "content")
        worker = _worker(domain, store, adapter)
        issued = await domain.funded_key("flaky")
        job_id = await _submit(domain, issued, "flaky")
        for _ in range(2):
            claimed = await worker.claim()
            assert claimed is not None
            await worker.step(claimed)
            domain.clock.advance(timedelta(seconds=30))
    assert await _status(domain, job_id) == jobs.COMPLETED
    assert store.path(job_id, 0).read_bytes() == b"the video"


async def test_a_result_files_credential_is_not_in_its_repr() -> None:
    """A RemoteVideo carries the credential its download sends on the provider's own
    origin: a log line or a traceback that shows the object must not show the key."""
    endpoint = Endpoint("vidco", "openai", "http://video.test/v1", model="ok")
    async with httpx.AsyncClient() as http:
        remote = Downloads(http).remote(
            endpoint, "http://video.test/v1/out.mp4", headers={"Authorization": "Bearer sk-x"}
        )
    assert "sk-x" not in repr(remote) and "video.test/v1/out.mp4" in repr(remote)


async def test_cancelling_a_downloading_job_stops_its_download_and_frees_its_slot(
    domain: Domain, tmp_path: Path
) -> None:
    """Before: a cancelled job's download went on to its end (or its deadline), holding the
    worker's slot, and the next job waited for it."""
    chunks_sent: list[int] = []

    async def trickle() -> AsyncIterator[bytes]:
        for _ in range(400):  # 20 s at most
            await asyncio.sleep(0.05)
            chunks_sent.append(1)
            yield b"x"

    endpoint = Endpoint("vidco", "openai", "http://video.test/v1", model="ok")
    transport = httpx.MockTransport(lambda r: httpx.Response(200, content=trickle()))
    async with httpx.AsyncClient(transport=transport) as http:
        remote = Downloads(http).remote(endpoint, "http://video.test/v1/files/out.mp4")
        adapter = ScriptedAdapter({"downloading": remote, "next": b"next video"})
        store = LocalContentStore(tmp_path / "content")
        worker = _worker(
            domain,
            store,
            adapter,
            lease=timedelta(seconds=0.3),
            download_seconds=20,
            jobs_at_once=1,
        )
        issued = await domain.funded_key("cancelled-download")
        job_id = await _submit(domain, issued, "downloading")
        stop = asyncio.Event()
        running = asyncio.create_task(worker.run(stop))
        try:
            await eventually(lambda: len(chunks_sent) > 2, within=10, message="downloading")
            await cancel_job(
                domain.sessions,
                await domain.principal(issued),
                job_id,
                domain.clock.now(),
                worker.cancel_at_provider,
            )
            next_job = await _submit(domain, issued, "next")
            worker.wake.set()
            started = asyncio.get_running_loop().time()

            async def next_done() -> bool:
                return await _status(domain, next_job) == jobs.COMPLETED

            await eventually(next_done, within=10, message="the next job to complete")
            assert asyncio.get_running_loop().time() - started < 3
            sent = len(chunks_sent)
            await asyncio.sleep(0.3)
            assert len(chunks_sent) == sent  # the download was stopped, not left running
        finally:
            stop.set()
            await asyncio.wait_for(running, timeout=10)
    assert await _status(domain, job_id) == jobs.CANCELLED
    assert _files(store) == [next_job, f"{next_job}/0.mp4"]
    assert await domain.count(CreditHold, CreditHold.account_id == issued.workspace.account_id) == 0


async def test_a_download_errors_body_is_read_only_in_part() -> None:
    """A provider answering its result URL with an error and an endless body: the failure
    is read from the first 64 KiB, the rest never read (before: the whole body was read
    into memory to find the error's words)."""
    sent: list[int] = []

    async def endless() -> AsyncIterator[bytes]:
        for _ in range(100_000):  # bounded: a few reads are all that is taken
            sent.append(1)
            yield b'{"error": "x' + b"x" * 8192

    transport = httpx.MockTransport(lambda r: httpx.Response(503, content=endless()))
    endpoint = Endpoint("vidco", "openai", "http://video.test/v1", model="ok")
    async with httpx.AsyncClient(transport=transport) as http:
        remote = Downloads(http).remote(endpoint, "http://video.test/v1/files/out.mp4")
        with pytest.raises(ProviderFailure) as failed:
            await asyncio.wait_for(video_bytes([remote]), timeout=10)
    assert failed.value.kind == SERVER_ERROR and failed.value.status == 503
    assert len(sent) <= 10
