"""Cancelling a video job (POST /videos/{id}/cancel; beyond OpenRouter's API).

One transaction moves a pending or in-progress job to `cancelled` — whoever holds its lease —
releases its hold (nothing is charged) and queues the `video.generation.cancelled` webhook.
The worker's own writes are guarded by its lease and by `status = in_progress`, and the
cancel clears the lease, so a poll in flight on any process can neither charge nor complete
the job afterwards; a job is claimed only while pending or in progress, so it is never polled
again. Whichever commits first wins: a completion committed first makes the cancel a 409.

Then, where the provider's API can cancel (the adapter has `cancel`), the provider job is
cancelled too, best effort: the job is cancelled for the caller either way."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime

import sqlalchemy as sa

from server.auth import Principal
from server.billing.holds import Hold, drop_hold
from server.db.engine import SessionFactory
from server.db.models import VideoJob
from server.errors import GatewayError
from server.providers.endpoint import Endpoint
from server.providers.failures import ProviderFailure
from server.providers.video import VideoCall
from server.videos import jobs

log = logging.getLogger("gateway.jobs")

_JOBS = VideoJob.__table__
CANCEL = "cancel"  # the optional adapter method


async def cancel_at_provider(
    adapters: Mapping[str, object], endpoint: Endpoint, provider_job_id: str, call: VideoCall
) -> bool:
    """Ask the provider to stop `provider_job_id` if its adapter can; True if it was asked.
    A failure is logged, not raised: the gateway's side of the cancel already happened."""
    cancel = getattr(adapters.get(endpoint.adapter), CANCEL, None)
    if not callable(cancel):
        return False
    try:
        await cancel(endpoint, provider_job_id, call)
    except ProviderFailure as failure:
        log.warning("cancelling %s at %s failed: %s", provider_job_id, endpoint.provider, failure)
    return True


async def cancel_job(
    sessions: SessionFactory,
    principal: Principal,
    job_id: str,
    now: datetime,
    provider_cancel: Callable[[VideoJob], Awaitable[None]] | None = None,
) -> VideoJob:
    """Cancel the caller's job (404 for another workspace's or none; 409 once terminal,
    a second cancel included) and answer it as it now stands. `provider_cancel` then stops
    the provider job (the worker's: it knows the credential that submitted it)."""
    async with sessions() as session:
        job = await jobs.find_job(session, principal, job_id)
        cancelled = await session.exec(
            sa.update(_JOBS)
            .where(_JOBS.c.id == job.id, _JOBS.c.status.in_(jobs.RUNNING_STATES))
            .values(
                status=jobs.CANCELLED,
                error="Cancelled by the caller",
                lease_owner=None,
                lease_expires_at=None,
                updated_at=now,
                completed_at=now,
            )
        )
        if cancelled.rowcount != 1:
            await session.rollback()
            await session.refresh(job)
            raise GatewayError(
                409, f"Video job {job.id!r} is already {job.status}: only a running job cancels"
            )
        # Both holds go back: the credits' and the provider cost held for BYOK.
        await drop_hold(
            session, Hold(job.hold_id or "", job.account_id, job.key_hash, job.hold_micros, False)
        )
        await drop_hold(
            session, Hold(job.byok_hold_id or "", job.account_id, job.key_hash, 0, True)
        )
        await session.refresh(job)
        if job.callback_url:
            await jobs.queue_webhook(session, job, now)
        await session.commit()
    if provider_cancel is not None:
        await provider_cancel(job)
    log.info("video job %s cancelled", job.id)
    return job
