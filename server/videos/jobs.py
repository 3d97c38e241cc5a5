"""Video jobs: accept (hold the estimate, store the job durably), look up, and describe."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlmodel.ext.asyncio.session import AsyncSession

from server.auth import Principal
from server.billing.money import micros_to_json_number, usd_to_micros
from server.clock import rfc3339
from server.db.models import VideoJob
from server.errors import GatewayError, bad_request, not_found
from server.limits.admission import Limits
from server.limits.guardrail_budgets import GuardrailBudget
from server.videos.content import ContentStore
from server.videos.request import VideoInput

PENDING = "pending"
IN_PROGRESS = "in_progress"
COMPLETED = "completed"
FAILED = "failed"
EXPIRED = "expired"
# A job's credits stay held until it ends; a job that outlives this is failed.
JOB_DEADLINE = timedelta(hours=2)

_INSERT_JOB = sa.insert(VideoJob.__table__)


def polling_url(job_id: str) -> str:
    return f"/api/v1/videos/{job_id}"


def estimate_micros(video: VideoInput) -> int:
    return usd_to_micros(video.model.price_per_second * video.duration)


async def submit_job(
    session: AsyncSession,
    principal: Principal,
    video: VideoInput,
    now: datetime,
    default_callback_url: str | None,
    limits: Limits,
    allowed_providers: list[str] | None = None,
    budgets: Sequence[GuardrailBudget] = (),
) -> VideoJob:
    """Hold the estimated cost (within the key's guardrail `budgets`) and store the job; it is
    durable when this returns."""
    estimate = estimate_micros(video)
    hold = await limits.admit(
        session,
        principal,
        model_id=video.model.id,
        estimate_micros=estimate,
        now=now,
        ttl=JOB_DEADLINE + timedelta(minutes=10),
        budgets=budgets,
    )
    job = VideoJob(
        id=f"vid_{secrets.token_hex(12)}",
        account_id=principal.account.id,
        workspace_id=principal.workspace.id,
        key_hash=principal.key.hash,
        model=video.model.id,
        status=PENDING,
        params={
            **video.params,
            "provider_options": video.provider_options,
            **({"allowed_providers": allowed_providers} if allowed_providers is not None else {}),
        },
        session_id=video.session_id,
        user=video.user,
        trace=video.trace,
        callback_url=video.callback_url or default_callback_url,
        hold_id=hold.id,
        hold_micros=estimate,
        next_run_at=now,
        created_at=now,
        updated_at=now,
    )
    # The hold and the job commit together: one transaction per accepted submission.
    await session.exec(_INSERT_JOB, params=job.model_dump())
    await session.commit()
    return job


async def find_job(session: AsyncSession, principal: Principal, job_id: str) -> VideoJob:
    """The caller's job; another workspace's job is indistinguishable from none."""
    job = await session.get(VideoJob, job_id)
    if job is None or job.workspace_id != principal.workspace.id:
        raise not_found(f"Video job {job_id!r} not found")
    return job


def check_content(job: VideoJob, index: int, store: ContentStore) -> None:
    if job.status == EXPIRED:
        raise GatewayError(410, "The video has expired and its content was deleted")
    if job.status != COMPLETED:
        raise GatewayError(409, f"The video is not ready (status {job.status})")
    if index < 0 or index >= job.content_count:
        raise bad_request(f"index must be between 0 and {job.content_count - 1}", param="index")
    if not store.exists(job.id, index):
        raise GatewayError(410, "The video content is no longer available")


def job_document(job: VideoJob) -> dict[str, Any]:
    """The job object of the API reference (2.2), as JSON-ready data."""
    document: dict[str, Any] = {
        "id": job.id,
        "polling_url": polling_url(job.id),
        "status": job.status,
    }
    if job.generation_id:
        document["generation_id"] = job.generation_id
    if job.error:
        document["error"] = job.error
    if job.status == COMPLETED:
        document["unsigned_urls"] = [
            f"{polling_url(job.id)}/content?index={i}" for i in range(job.content_count)
        ]
        document["usage"] = {
            "cost": None if job.cost_micros is None else micros_to_json_number(job.cost_micros),
            "is_byok": job.is_byok,
        }
    return document


def webhook_payload(job: VideoJob, now: datetime) -> dict[str, Any]:
    return {
        "type": f"video.generation.{job.status}",
        "created_at": rfc3339(now),
        "data": {**job_document(job), "model": job.model},
    }
