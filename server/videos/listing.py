"""Video jobs and their webhook deliveries read back for the console: GET /api/v1/videos
(the workspace's jobs, newest first, paged) and GET /api/v1/videos/{id}/webhooks (a job's
deliveries with their attempts and outcomes — never the signing secret)."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from server.auth import Principal
from server.billing.money import micros_to_json_number
from server.clock import rfc3339
from server.db.models import VideoJob, WebhookDelivery
from server.errors import bad_request
from server.observability.activity import Page
from server.videos.jobs import find_job

JOB_STATUSES = ("", "pending", "in_progress", "completed", "failed", "cancelled", "expired")
FINISHED_DELIVERIES = ("delivered", "stopped", "failed")


async def list_jobs(
    session: AsyncSession,
    workspace_id: str,
    page: Page,
    *,
    key_hash: str = "",
    status: str = "",
    job_id: str = "",
) -> tuple[list[VideoJob], int]:
    if status not in JOB_STATUSES:
        raise bad_request(f"status must be one of {', '.join(JOB_STATUSES[1:])}", param="status")
    conditions: list[Any] = [VideoJob.workspace_id == workspace_id]
    if key_hash:
        conditions.append(VideoJob.key_hash == key_hash)
    if status:
        conditions.append(VideoJob.status == status)
    if job_id:
        conditions.append(VideoJob.id == job_id)
    total = (
        await session.exec(select(sa.func.count()).select_from(VideoJob).where(*conditions))
    ).one()
    rows = await session.exec(
        select(VideoJob)
        .where(*conditions)
        .order_by(col(VideoJob.created_at).desc(), col(VideoJob.id).desc())
        .offset(page.offset)
        .limit(page.limit)
    )
    return list(rows), int(total)


def job_summary(job: VideoJob) -> dict[str, Any]:
    return {
        "id": job.id,
        "model": job.model,
        "status": job.status,
        "error": job.error,
        "generation_id": job.generation_id,
        "provider_name": job.provider,
        "created_at": rfc3339(job.created_at),
        "updated_at": rfc3339(job.updated_at),
        "completed_at": rfc3339(job.completed_at) if job.completed_at else None,
        "content_count": job.content_count,
        "attempts": job.attempts,
        "cost": None if job.cost_micros is None else micros_to_json_number(job.cost_micros),
        "is_byok": job.is_byok,
        "api_key_hash": job.key_hash,
        "session_id": job.session_id,
        "prompt": job.params.get("prompt"),
        "duration": job.params.get("duration"),
        "resolution": job.params.get("resolution"),
        "aspect_ratio": job.params.get("aspect_ratio"),
        "callback_url": job.callback_url,
    }


async def job_deliveries(
    session: AsyncSession, principal: Principal, job_id: str
) -> list[WebhookDelivery]:
    """The deliveries of the caller's job, oldest first (404 for another workspace's job)."""
    job = await find_job(session, principal, job_id)
    rows = await session.exec(
        select(WebhookDelivery)
        .where(WebhookDelivery.job_id == job.id, WebhookDelivery.workspace_id == job.workspace_id)
        .order_by(col(WebhookDelivery.created_at), col(WebhookDelivery.id))
    )
    return list(rows)


def delivery_document(delivery: WebhookDelivery) -> dict[str, Any]:
    try:
        event = str(json.loads(delivery.payload).get("type", ""))
    except (ValueError, AttributeError):
        event = ""
    finished = delivery.status in FINISHED_DELIVERIES
    return {
        "id": delivery.id,
        "event": event,
        "url": delivery.url,
        "status": delivery.status,
        "attempts": delivery.attempts,
        "last_status": delivery.last_status,
        "last_error": delivery.last_error,
        "created_at": rfc3339(delivery.created_at),
        "next_attempt_at": None if finished else rfc3339(delivery.next_attempt_at),
        "delivered_at": rfc3339(delivery.delivered_at) if delivery.delivered_at else None,
    }
