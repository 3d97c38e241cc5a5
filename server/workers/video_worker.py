"""The video job worker: runs inside every server process. Jobs are claimed with a lease
(a conditional UPDATE, and on PostgreSQL `FOR UPDATE SKIP LOCKED` to skip rows another
process is claiming), so no two processes run one job; a process that dies leaves its lease
to lapse and the job is taken up again, while a live worker renews the leases of the jobs it
is working on. The charge and the terminal state commit together, guarded by the lease, so a
job is charged exactly once.

A process works on up to `jobs_at_once` jobs concurrently: one job's slow provider, image
host or download holds only that job; and one workspace's jobs take at most
`workspace_jobs_at_once` of them across every process, so a workspace with many slow jobs
leaves the other slots to the other workspaces. A provider's result is streamed into the content
store under a size and a time bound; past either the job fails for good (its hold
released, nothing stored), it is not fetched again."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from opentelemetry.trace import NoOpTracer, Tracer
from sqlmodel.ext.asyncio.session import AsyncSession

from server.billing.holds import Hold, drop_hold, settle_hold
from server.billing.money import usd_to_micros
from server.byok.routing import ByokRouting, PlannedAttempt
from server.clock import Clock
from server.config import (
    VIDEO_DOWNLOAD_SECONDS,
    VIDEO_JOBS_AT_ONCE,
    VIDEO_MAX_BYTES,
    VIDEO_WORKSPACE_JOBS_AT_ONCE,
)
from server.db.driver import fetch_rows
from server.db.engine import SessionFactory, is_database_unavailable
from server.db.models import Generation, VideoJob
from server.db.writer import Writer
from server.observability.generations import store_generation
from server.observability.metrics import Metrics
from server.observability.tracing import emit_generation_span
from server.providers.endpoint import Endpoint
from server.providers.failures import CLIENT_ERROR, REJECTED_CREDENTIALS, ProviderFailure
from server.providers.video import (
    CONTINUE_JOB,
    VideoAdapter,
    VideoCall,
    VideoProgress,
    VideoSource,
    can_continue,
)
from server.routing.catalog import Catalog, Model
from server.routing.cooldowns import Cooldowns
from server.routing.fallback import no_provider
from server.videos import jobs
from server.videos.cancel import cancel_at_provider
from server.videos.content import ContentRefused, ContentStore
from server.workers.leases import Claimer
from server.workers.loop import ClaimedWork

log = logging.getLogger("gateway.jobs")

_JOBS = VideoJob.__table__

# PostgreSQL: video job claims of every process take this transaction lock in turn (Claimer).
CLAIM_LOCK_KEY = 0x76_69_64_65


def _claimer(workspace_jobs_at_once: int) -> Claimer:
    """Claiming a due job (pending, or in progress at a provider) with a lease, of a
    workspace with fewer than `workspace_jobs_at_once` jobs leased (under way) right now."""
    return Claimer(
        VideoJob,
        ready_statuses=(jobs.PENDING, jobs.IN_PROGRESS),
        due_column="next_run_at",
        extra_columns=("status", "updated_at"),
        per_workspace=workspace_jobs_at_once,
        lock_key=CLAIM_LOCK_KEY,
    )


# What `finish` sets on the job.
_FINISH_COLUMNS = (
    "status",
    "error",
    "cost_micros",
    "generation_id",
    "content_count",
    "lease_owner",
    "lease_expires_at",
    "updated_at",
    "completed_at",
    "expires_at",
)
# The terminal update, guarded by the lease and by the job still being in progress: a
# constant compiled once (server/db/driver.py), one hand-off to the driver per job instead of
# SQLAlchemy's per-statement compile and cache-key work. RETURNING says whether it applied.
_FINISH_JOB = (
    sa.update(_JOBS)
    .where(
        _JOBS.c.id == sa.bindparam("job_id", type_=_JOBS.c.id.type),
        _JOBS.c.lease_owner == sa.bindparam("owner", type_=_JOBS.c.lease_owner.type),
        _JOBS.c.status == sa.bindparam("in_progress", type_=_JOBS.c.status.type),
    )
    .values(
        {name: sa.bindparam(f"new_{name}", type_=_JOBS.c[name].type) for name in _FINISH_COLUMNS}
    )
    .returning(_JOBS.c.id)
)


class _LeaseLost(Exception):
    """The job's terminal update found it no longer leased to this worker, or no longer in
    progress: its finish writes nothing."""


async def _chunks_of(video: VideoSource) -> AsyncIterator[bytes]:
    """A video's bytes as the content store takes them: a provider's file fetched as it is
    read, or bytes already here in one piece."""
    if isinstance(video, bytes):
        yield video
        return
    download = video.chunks()
    try:
        async for chunk in download:
            yield chunk
    finally:
        await download.aclose()


def poll_delay(attempts: int) -> timedelta:
    """Provider polling backoff: 1 s doubling to 30 s."""
    return timedelta(seconds=min(30, 2 ** min(attempts, 5)))


class VideoWorker:
    def __init__(
        self,
        sessions: SessionFactory,
        clock: Clock,
        catalog: Catalog,
        adapters: Mapping[str, VideoAdapter],
        store: ContentStore,
        *,
        lease: timedelta = timedelta(minutes=2),
        retention: timedelta = timedelta(days=1),
        idle_wait: float = 0.5,
        on_webhook_queued: Callable[[], None] | None = None,
        metrics: Metrics | None = None,
        tracer: Tracer | None = None,
        byok: ByokRouting | None = None,
        cooldowns: Cooldowns | None = None,
        writer: Writer | None = None,
        max_video_bytes: int = VIDEO_MAX_BYTES,
        download_seconds: float = VIDEO_DOWNLOAD_SECONDS,
        jobs_at_once: int = VIDEO_JOBS_AT_ONCE,
        workspace_jobs_at_once: int = VIDEO_WORKSPACE_JOBS_AT_ONCE,
        drain_seconds: float = 30.0,
    ) -> None:
        # Bounds of each result file streamed into the store (server/config.py).
        self._max_video_bytes = max_video_bytes
        self._download_seconds = download_seconds
        self._jobs_at_once = jobs_at_once
        self._claimer = _claimer(workspace_jobs_at_once)
        # On stop, how long jobs under way may take to finish before they are cancelled
        # (their leases then lapse and another process takes them up).
        self._drain_seconds = drain_seconds
        # The process's group-commit writer, which commits each job's terminal transaction
        # (None: a session of its own per job).
        self._writer = writer
        self._cooldowns = cooldowns  # providers that asked to wait (None: none remembered)
        self._byok = byok  # None: the operator's endpoints only
        self._on_webhook_queued = on_webhook_queued
        self._metrics = metrics or Metrics()
        self._tracer = tracer or NoOpTracer()
        self._sessions = sessions
        self._clock = clock
        self._catalog = catalog
        self._adapters = adapters
        self._store = store
        self._lease = lease
        self._retention = retention
        self._idle_wait = idle_wait
        self.owner = f"worker-{secrets.token_hex(6)}"
        # Set, per job under way in run(), once its lease is no longer this worker's (the
        # job was cancelled, or taken over): its download stops.
        self._lease_lost: dict[str, asyncio.Event] = {}
        self.wake = asyncio.Event()  # set on submit: no need to wait for the next poll

    # --- the loop -----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Claim due jobs and run each as a task of its own, up to `jobs_at_once` at a time,
        until `stop`; then let the steps under way finish (for up to `drain_seconds`, then
        they are cancelled) and return."""
        await ClaimedWork(
            claim=self.claim,
            handle=self._run_job,
            key=lambda job: job.id,
            at_once=self._jobs_at_once,
            wake=self.wake,
            idle_wait=self._idle_wait,
            log=log,
            drain_seconds=self._drain_seconds,
        ).run(stop)

    async def _run_job(self, job: VideoJob) -> None:
        """One step of one claimed job, its lease renewed while it runs; a failure is logged
        (the job's lease lapses and it is taken up again)."""
        lost = self._lease_lost[job.id] = asyncio.Event()
        renewing = asyncio.create_task(self._keep_leased(job, lost))
        try:
            await self.step(job)
        except Exception as exc:
            if is_database_unavailable(exc):
                log.warning("video job %s skipped: database unavailable", job.id)
            else:
                log.exception("video job %s step failed; it will be taken up again", job.id)
        finally:
            renewing.cancel()
            await asyncio.wait({renewing})
            del self._lease_lost[job.id]

    async def _keep_leased(self, job: VideoJob, lost: asyncio.Event) -> None:
        """Renews the job's lease every third of it while its step runs (a download may
        take longer than one lease); once the lease is no longer this worker's, sets
        `lost` and stops."""
        every = self._lease.total_seconds() / 3
        while True:
            await asyncio.sleep(every)
            try:
                async with self._sessions() as session:
                    kept = await self._claimer.renew(
                        session,
                        row_id=job.id,
                        owner=self.owner,
                        now=self._clock.now(),
                        lease=self._lease,
                    )
            except Exception as exc:
                if not is_database_unavailable(exc):
                    log.exception("renewing the lease of %s failed; no longer renewed", job.id)
                    return
                log.warning("renewing the lease of %s: database unavailable", job.id)
                continue
            if not kept:
                lost.set()  # cancelled, or taken over: its finish would write nothing
                return

    async def claim(self) -> VideoJob | None:
        now = self._clock.now()
        # Its own transaction, not a writer unit: through the writer every claim would join
        # the submissions' batches, and on SQLite the worker then ran its jobs during a
        # submission burst instead of after it (bench.videos: fewer 202s/s, no less work).
        async with self._sessions() as session:
            job: VideoJob | None = await self._claimer.claim(
                session,
                owner=self.owner,
                now=now,
                lease=self._lease,
                extra_values={"status": jobs.IN_PROGRESS, "updated_at": now},
            )
            return job

    # --- one step of one job ------------------------------------------------------------------

    async def step(self, job: VideoJob) -> None:
        model = self._catalog.get(job.model)
        now = self._clock.now()
        if model is None:
            await self.finish(job, None, error="The model is no longer in the catalog")
            return
        if now - job.created_at > jobs.JOB_DEADLINE:
            # Given up on: stopped at the provider too, so it does not go on running there.
            await self.cancel_at_provider(job)
            await self.finish(job, model, error="The provider did not finish in time")
            return
        if job.provider_job_id is None:
            progress = await self._submit(job, model)
        else:
            endpoint = await self._submitted_endpoint(job, model)
            if endpoint is None:
                await self.finish(job, model, error="The BYOK key of this job was removed")
                return
            try:
                with self._metrics.provider_call(endpoint.provider, "video_poll"):
                    progress = await self._adapters[endpoint.adapter].poll(
                        endpoint, job.provider_job_id, self._call(job, model, endpoint)
                    )
            except ProviderFailure as failure:
                if failure.kind in (CLIENT_ERROR, REJECTED_CREDENTIALS):
                    await self.finish(job, model, error=f"Provider error: {failure.message}")
                    return
                log.warning("polling %s failed: %s; will retry", job.id, failure.message)
                await self._reschedule(job)
                return
        if progress is None or progress.state == "cancelled":
            return  # ended elsewhere (or cancelled meanwhile): nothing more to do here
        if progress.state == "running":
            await self._reschedule(job)
        elif progress.state == "completed":
            if not await self._store_videos(job, model, progress.videos):
                return
            seconds = Decimal(str(progress.seconds)) if progress.seconds else None
            if not await self.finish(job, model, videos=len(progress.videos), seconds=seconds):
                # Cancelled (or taken over) meanwhile: the files saved above are nobody's.
                await self._store.delete(job.id)
        else:
            await self.finish(job, model, error=progress.error or "The provider failed")

    async def _store_videos(
        self, job: VideoJob, model: Model, videos: Sequence[VideoSource]
    ) -> bool:
        """Stream the job's videos into the store, each within the size and time bounds.
        False when they are not all stored (none is left then): a bound passed fails the job
        for good; a provider's transient failure has it polled (and fetched) again later."""
        writing = asyncio.ensure_future(self._write_videos(job, videos))
        lost = self._lease_lost.get(job.id)
        if lost is not None:
            losing = asyncio.ensure_future(lost.wait())
            try:
                await asyncio.wait({writing, losing}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                losing.cancel()
                if not writing.done():
                    # Cancelled meanwhile, or taken over (or this step is being cancelled):
                    # the download stops now and leaves nothing.
                    writing.cancel()
                    await asyncio.wait({writing})
        try:
            await writing
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if lost is None or not lost.is_set() or (current is not None and current.cancelling()):
                raise  # this step itself is being cancelled (a drain)
            log.info("video job %s: download stopped, the job is no longer this worker's", job.id)
            return False
        except ContentRefused as refused:
            log.warning("video job %s: %s", job.id, refused)
            await self.finish(job, model, error=str(refused))
            return False
        except ProviderFailure as failure:
            if failure.kind in (CLIENT_ERROR, REJECTED_CREDENTIALS):
                await self.finish(job, model, error=f"Provider error: {failure.message}")
            else:
                log.warning("downloading %s failed: %s; will retry", job.id, failure.message)
                await self._reschedule(job)
            return False
        return True

    async def _write_videos(self, job: VideoJob, videos: Sequence[VideoSource]) -> None:
        try:
            for index, video in enumerate(videos):
                await self._store.write(
                    job.id,
                    index,
                    _chunks_of(video),
                    max_bytes=self._max_video_bytes,
                    seconds=self._download_seconds,
                )
        except BaseException:
            # Shielded: a cancelled download (a cancel, a drain) still removes what it stored.
            await asyncio.shield(self._store.delete(job.id))
            raise

    @property
    def adapters(self) -> Mapping[str, VideoAdapter]:
        return self._adapters

    async def _continue(
        self, job: VideoJob, model: Model, continuation: dict[str, Any]
    ) -> VideoProgress | None:
        """A continuation runs on the endpoint that served the earlier job, or fails: another
        provider knows nothing of that job, so there is no fallback."""
        index = int(continuation["endpoint_index"])
        allowed = job.params.get("allowed_providers")
        endpoint = model.endpoints[index] if index < len(model.endpoints) else None
        key_id = continuation.get("byok_key_id")
        if endpoint is not None and key_id is not None:
            endpoint = await self._key_endpoint(endpoint, str(key_id))
        adapter = self._adapters.get(endpoint.adapter) if endpoint is not None else None
        if (
            endpoint is None
            or not endpoint.available
            or not can_continue(adapter)
            or (allowed is not None and endpoint.provider not in allowed)
        ):
            await self.finish(
                job, model, error="The provider of the previous job is no longer available"
            )
            return None
        try:
            with self._metrics.provider_call(endpoint.provider, "video_submit"):
                progress: VideoProgress = await getattr(adapter, CONTINUE_JOB)(
                    endpoint, str(continuation["provider_job_id"]), self._call(job, model, endpoint)
                )
        except ProviderFailure as failure:
            await self.finish(job, model, error=f"Provider returned error: {failure.message}")
            return None
        await self._record_submission(job, PlannedAttempt(index, endpoint, key_id), progress)
        return progress

    async def _submit(self, job: VideoJob, model: Model) -> VideoProgress | None:
        """Submit to the endpoints in order; a submission failure falls back to the next."""
        continuation = job.params.get("continuation")
        if continuation is not None:
            return await self._continue(job, model, continuation)
        # None usable (a credential removed since the job was accepted): say what to set.
        last_error = no_provider(model.id, model.endpoints).message
        failed: str | None = None  # the provider that failed last
        cooling: list[float] = []  # seconds until each endpoint that asked to wait may be called
        allowed = job.params.get("allowed_providers")  # set when guardrails restrict them
        for attempt in await self._attempts(job, model):
            index, endpoint = attempt.index, attempt.endpoint
            if index < job.endpoint_index or not endpoint.available:
                continue
            if allowed is not None and endpoint.provider not in allowed:
                continue
            wait = self._cooldowns.remaining(endpoint) if self._cooldowns is not None else None
            if wait is not None:  # it asked to wait: not called until then
                cooling.append(wait)
                continue
            if failed is not None:
                self._metrics.fallbacks.labels(model.id, failed).inc()
            call = self._call(job, model, endpoint)
            try:
                with self._metrics.provider_call(endpoint.provider, "video_submit"):
                    progress = await self._adapters[endpoint.adapter].submit(endpoint, call)
            except ProviderFailure as failure:
                log.warning(
                    "submitting %s to %s failed: %s", job.id, endpoint.provider, failure.message
                )
                last_error = f"Provider returned error: {failure.message}"
                if failure.kind == CLIENT_ERROR:
                    # The request itself was refused (invalid, or its content): another
                    # provider would refuse it too (server/routing/fallback.py's rule).
                    break
                failed = endpoint.provider
                if self._cooldowns is not None:
                    self._cooldowns.note(endpoint, failure)
                continue
            await self._record_submission(job, attempt, progress)
            return progress
        if failed is None and cooling:
            # Every usable endpoint asked to wait: the job waits with them (it is accepted
            # already), and is submitted once the first of them may be called.
            await self._reschedule(job, delay=timedelta(seconds=min(cooling)))
            return None
        await self.finish(job, model, error=last_error)
        return None

    def _call(self, job: VideoJob, model: Model, endpoint: Endpoint) -> VideoCall:
        return jobs.provider_call(job, model, endpoint)

    async def _attempts(self, job: VideoJob, model: Model) -> list[PlannedAttempt]:
        """The model's endpoints with the workspace's own keys around them (BYOK)."""
        operator = [PlannedAttempt(i, e, None) for i, e in enumerate(model.endpoints)]
        if self._byok is None:
            return operator
        async with self._sessions() as session:
            return await self._byok.attempts(
                session,
                workspace_id=job.workspace_id,
                key_hash=job.key_hash,
                model_id=model.id,
                endpoints=model.endpoints,
                user=job.user,
                now=self._clock.now(),
            )

    async def _submitted_endpoint(self, job: VideoJob, model: Model) -> Endpoint | None:
        """The endpoint the job was submitted to, with the same credential."""
        endpoint = model.endpoints[min(job.endpoint_index, len(model.endpoints) - 1)]
        if job.byok_key_id is None:
            return endpoint
        return await self._key_endpoint(endpoint, job.byok_key_id)

    async def _key_endpoint(self, endpoint: Endpoint, key_id: str) -> Endpoint | None:
        """`endpoint` with the workspace's key `key_id` (None: that key is gone)."""
        if self._byok is None:
            return None
        async with self._sessions() as session:
            return await self._byok.key_endpoint(session, endpoint, key_id, self._clock.now())

    async def _record_submission(
        self, job: VideoJob, attempt: PlannedAttempt, progress: VideoProgress
    ) -> None:
        index, provider = attempt.index, attempt.endpoint.provider
        job.endpoint_index = index
        job.provider = provider
        job.provider_job_id = progress.provider_job_id
        job.byok_key_id = attempt.key_id
        job.is_byok = attempt.key_id is not None
        async with self._sessions() as session:
            recorded = await session.exec(
                sa.update(_JOBS)
                .where(_JOBS.c.id == job.id, _JOBS.c.lease_owner == self.owner)
                .values(
                    endpoint_index=index,
                    provider=provider,
                    provider_job_id=progress.provider_job_id,
                    byok_key_id=job.byok_key_id,
                    is_byok=job.is_byok,
                    updated_at=self._clock.now(),
                )
            )
            await session.commit()
            current = None if recorded.rowcount == 1 else await session.get(VideoJob, job.id)
        if current is not None and current.status == jobs.CANCELLED and progress.provider_job_id:
            # Cancelled while this submission was on its way: nobody else knows the provider
            # job, so stop it here (where the provider's API can).
            model = self._catalog.get(job.model)
            if model is not None:
                await cancel_at_provider(
                    self._adapters,
                    attempt.endpoint,  # with the credential that submitted it
                    progress.provider_job_id,
                    self._call(job, model, attempt.endpoint),
                )
            progress.state = "cancelled"

    async def cancel_at_provider(self, job: VideoJob) -> None:
        """After a cancel: ask the provider to stop the job's provider job, with the
        credential that submitted it, where the adapter can."""
        model = self._catalog.get(job.model)
        if job.provider_job_id is None or model is None or not model.endpoints:
            return
        endpoint = await self._submitted_endpoint(job, model)
        if endpoint is None:
            return  # the workspace's key that submitted it is gone
        call = self._call(job, model, endpoint)
        await cancel_at_provider(self._adapters, endpoint, job.provider_job_id, call)

    async def _reschedule(self, job: VideoJob, delay: timedelta | None = None) -> None:
        now = self._clock.now()
        async with self._sessions() as session:
            await session.exec(
                sa.update(_JOBS)
                .where(_JOBS.c.id == job.id, _JOBS.c.lease_owner == self.owner)
                .values(
                    attempts=job.attempts + 1,
                    next_run_at=now + (delay or poll_delay(job.attempts)),
                    lease_owner=None,
                    lease_expires_at=None,
                    updated_at=now,
                )
            )
            await session.commit()

    async def finish(
        self,
        job: VideoJob,
        model: Model | None,
        *,
        videos: int = 0,
        seconds: Decimal | None = None,
        error: str | None = None,
    ) -> bool:
        """Move the job to its terminal state, charging (or releasing) its hold and queueing
        its webhook, all in one transaction guarded by the lease and by the job still being
        in progress (a cancel clears the lease). False when it no longer was: nothing
        changed."""
        now = self._clock.now()
        status = jobs.FAILED if error else jobs.COMPLETED
        requested = Decimal(int(job.params.get("duration", 0)))
        # A provider's reported length bills what it delivered, never more than was asked for
        # (and held): a provider's claim cannot raise the caller's bill.
        duration = min(seconds, requested) if seconds else requested
        cost = usd_to_micros(model.video_price(job.params) * duration) if model and not error else 0
        generation_id = f"gen_{secrets.token_hex(12)}"
        values = {
            "status": status,
            "error": error,
            "cost_micros": cost if not error else None,
            "generation_id": generation_id,
            "content_count": videos,
            "lease_owner": None,
            "lease_expires_at": None,
            "updated_at": now,
            "completed_at": now,
            "expires_at": now + self._retention if not error else None,
        }
        hold = Hold(job.hold_id or "", job.account_id, job.key_hash, job.hold_micros, False)
        # The provider cost held apart for a job the workspace's keys may serve (BYOK).
        byok_hold = Hold(job.byok_hold_id or "", job.account_id, job.key_hash, 0, True)
        # Served with the workspace's key: the provider cost goes to the BYOK counters, the
        # platform fee to the credits (and is the job's cost).
        served_by_key = job.is_byok and self._byok is not None and not error

        async def terminal(session: AsyncSession) -> Generation:
            """The terminal transaction's statements; _LeaseLost when the lease was lost or
            the job is no longer in progress (what it wrote, a BYOK request's count, is
            then rolled back: the writer's savepoint, or the session's transaction)."""
            charged = cost
            if served_by_key:
                assert self._byok is not None
                charged = await self._byok.fee_for(session, job.account_id, cost, now)
                values["cost_micros"] = charged
            done = await fetch_rows(
                session,
                _FINISH_JOB,
                {
                    "job_id": job.id,
                    "owner": self.owner,
                    "in_progress": jobs.IN_PROGRESS,
                    **{f"new_{name}": value for name, value in values.items()},
                },
            )
            if len(done) != 1:
                # The lease was lost (another worker owns the job) or the job was cancelled.
                raise _LeaseLost
            if served_by_key:
                await settle_hold(
                    session, byok_hold, cost_micros=cost, now=now, reference=generation_id
                )
            else:
                await drop_hold(session, byok_hold)
            if job.hold_id:
                if error:
                    await drop_hold(session, hold)
                else:
                    await settle_hold(
                        session, hold, cost_micros=charged, now=now, reference=generation_id
                    )
            record = Generation(
                id=generation_id,
                account_id=job.account_id,
                workspace_id=job.workspace_id,
                key_hash=job.key_hash,
                kind="video",
                model=job.model,
                provider=job.provider,
                status=status,
                cost_micros=charged,
                is_byok=job.is_byok,
                seconds=duration if not error else None,
                latency_ms=int((now - job.created_at).total_seconds() * 1000),
                session_id=job.session_id,
                user=job.user,
                trace=job.trace,
                error=error,
                created_at=now,
            )
            await store_generation(session, record)
            for name, value in values.items():
                setattr(job, name, value)
            if job.callback_url:
                await self._queue_webhook(session, job, now)
            return record

        try:
            if self._writer is not None:
                # A unit of the group-commit writer: the job's terminal transaction shares a
                # commit with the submissions and other jobs' finishes of its batch.
                record = await self._writer.run(terminal)
            else:
                async with self._sessions() as session:
                    try:
                        record = await terminal(session)
                    except _LeaseLost:
                        await session.rollback()
                        raise
                    await session.commit()
        except _LeaseLost:
            return False
        if job.callback_url and self._on_webhook_queued is not None:
            self._on_webhook_queued()
        emit_generation_span(self._tracer, record, job.created_at)
        log.info("video job %s %s", job.id, status)
        return True

    async def _queue_webhook(self, session: AsyncSession, job: VideoJob, now: datetime) -> None:
        await jobs.queue_webhook(session, job, now)
