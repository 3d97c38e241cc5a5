"""Video jobs: accept (hold the estimate, store the job durably), look up, and describe."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlmodel.ext.asyncio.session import AsyncSession

from server.auth import Principal, visible
from server.billing.holds import place_hold, place_hold_with_row, reserve_and_insert
from server.billing.money import micros_to_json_number, usd_to_micros
from server.byok.routing import BillingPlan
from server.clock import rfc3339
from server.db.driver import fetch_rows, insert_statement
from server.db.models import VideoJob, WebhookDelivery
from server.db.writer import on_outcome
from server.errors import GatewayError, bad_request, not_found
from server.limits.admission import Limits, is_plain_credit_hold
from server.limits.guardrail_budgets import GuardrailBudget
from server.providers.endpoint import Endpoint
from server.providers.video import VideoCall
from server.routing.catalog import Model
from server.videos.content import ContentStore
from server.videos.request import VideoInput

PENDING = "pending"
IN_PROGRESS = "in_progress"
COMPLETED = "completed"
FAILED = "failed"
CANCELLED = "cancelled"
EXPIRED = "expired"
RUNNING_STATES = (PENDING, IN_PROGRESS)  # the states a worker claims and a cancel stops
# A job's credits stay held until it ends; a job that outlives this is failed.
JOB_DEADLINE = timedelta(hours=2)

_INSERT_JOB = insert_statement(VideoJob.__table__)
_JOB_COLUMNS = tuple(c.name for c in VideoJob.__table__.columns)
# PostgreSQL: a plain credit hold and the job that holds it, in one statement.
_RESERVE_AND_INSERT_JOB = reserve_and_insert(VideoJob.__table__, "hold_id")
_DELIVERIES = WebhookDelivery.__table__
_DELIVERY_COLUMNS = (
    "id",
    "workspace_id",
    "job_id",
    "url",
    "payload",
    "status",
    "attempts",
    "next_attempt_at",
    "created_at",
)
# A constant for the driver (the other columns keep their defaults: NULL).
_INSERT_DELIVERY = sa.insert(_DELIVERIES).values(
    {name: sa.bindparam(name, type_=_DELIVERIES.c[name].type) for name in _DELIVERY_COLUMNS}
)


def polling_url(job_id: str) -> str:
    return f"/api/v1/videos/{job_id}"


async def continuation_of(
    session: AsyncSession,
    principal: Principal,
    video: VideoInput,
    can_continue: Callable[[Endpoint], bool],
) -> dict[str, Any] | None:
    """What the worker needs to continue `video.previous_job_id` (the endpoint that served it
    and its provider job id), or None when the request continues nothing. The earlier job
    must be the caller's (404), of the same model (400 naming the field), completed (409),
    and served by an endpoint whose provider can continue jobs (400)."""
    if video.previous_job_id is None:
        return None
    previous = await find_job(session, principal, video.previous_job_id)
    if previous.model != video.model.id:
        raise bad_request(
            f"previous_job_id {previous.id!r} was made by {previous.model}, not "
            f"{video.model.id}: a continuation runs on the same model",
            param="previous_job_id",
        )
    if previous.status != COMPLETED:
        raise GatewayError(
            409, f"Video job {previous.id!r} is {previous.status}: only a completed job continues"
        )
    endpoints = video.model.endpoints
    if (
        previous.provider_job_id is None
        or previous.endpoint_index >= len(endpoints)
        or not can_continue(endpoints[previous.endpoint_index])
    ):
        raise bad_request(
            f"{video.model.id} does not support continuing a previous job",
            param="previous_job_id",
        )
    return {
        "job_id": previous.id,
        "endpoint_index": previous.endpoint_index,
        "provider_job_id": previous.provider_job_id,
        # The earlier job's credential: a workspace's own key (BYOK) serves its continuation.
        "byok_key_id": previous.byok_key_id,
    }


def estimate_micros(video: VideoInput) -> int:
    return usd_to_micros(video.model.video_price(video.params) * video.duration)


async def submit_job(
    session: AsyncSession,
    principal: Principal,
    video: VideoInput,
    now: datetime,
    default_callback_url: str | None,
    limits: Limits,
    allowed_providers: list[str] | None = None,
    continuation: dict[str, Any] | None = None,
    billing: BillingPlan | None = None,
    budgets: Sequence[GuardrailBudget] = (),
) -> VideoJob:
    """`store_job` in the session's transaction, then commit: the job is durable when this
    returns. (The API submits through the group-commit writer instead: `store_job` as a unit
    of its batch.)"""
    row = await store_job(
        session,
        principal,
        video,
        now,
        default_callback_url,
        limits,
        allowed_providers,
        continuation,
        billing=billing,
        budgets=budgets,
    )
    await session.commit()
    return VideoJob(**row)


async def store_job(
    session: AsyncSession,
    principal: Principal,
    video: VideoInput,
    now: datetime,
    default_callback_url: str | None,
    limits: Limits,
    allowed_providers: list[str] | None = None,
    continuation: dict[str, Any] | None = None,
    billing: BillingPlan | None = None,
    budgets: Sequence[GuardrailBudget] = (),
    admitted: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Hold the estimated cost (within the key's guardrail `budgets`) and write the job, in
    the caller's transaction: the hold and the job commit together, or neither does. `billing`:
    what to hold when the workspace's own keys may serve it (BYOK). Every statement goes
    straight to the driver (no ORM): this is a unit of the group-commit writer's batch.
    Returns the stored row (every column of video_jobs); no model instance is built, as
    the caller answers with a pending job's id and status only.

    `admitted`: given only when `limits` are the enforced ones (server/limits/admission.py),
    to count an admission. Then a job whose admission is a plain credit hold (no guardrail
    budget, no BYOK hold, not a free model) has, on PostgreSQL, its hold and its row written by
    one statement; a refusal there writes nothing and goes to `limits.admit`, which
    refuses it again (the account lock is held) and says why."""
    estimate = estimate_micros(video)
    credit_estimate = estimate if billing is None else billing.credit_hold
    ttl = JOB_DEADLINE + timedelta(minutes=10)
    row = job_row(
        principal,
        video,
        now,
        default_callback_url,
        allowed_providers=allowed_providers,
        continuation=continuation,
        hold_micros=credit_estimate,
    )
    if (
        admitted is not None
        and is_plain_credit_hold(
            video.model.id, budgets, byok=billing is not None and billing.byok_hold
        )
        and session.get_bind().dialect.name == "postgresql"
    ):
        # The enforced limits of such a job are a plain credit hold: the hold and the job
        # row in one statement (one round trip fewer per job in the writer's batch).
        hold = await place_hold_with_row(
            session,
            _RESERVE_AND_INSERT_JOB,
            row,
            account_id=principal.account.id,
            key_hash=principal.key.hash,
            amount_micros=credit_estimate,
            now=now,
            ttl=ttl,
        )
        if hold is not None:
            on_outcome(session, admitted)  # once committed (the unit may run again)
            row["hold_id"] = hold.id
            return row
        # Refused (nothing written): the limits say why, with the refusal's metric.
    hold = await limits.admit(
        session,
        principal,
        model_id=video.model.id,
        estimate_micros=credit_estimate,
        now=now,
        ttl=ttl,
        budgets=budgets,
    )
    byok_hold = (
        await place_hold(
            session,
            account_id=principal.account.id,
            key_hash=principal.key.hash,
            amount_micros=estimate,
            now=now,
            is_byok=True,
            ttl=ttl,
        )
        if billing is not None and billing.byok_hold
        else None
    )
    row["hold_id"] = hold.id
    row["byok_hold_id"] = None if byok_hold is None else byok_hold.id
    await fetch_rows(session, _INSERT_JOB, row)
    return row


# The columns a new job leaves at their defaults (no provider, no lease, no result yet).
_JOB_DEFAULTS = {
    name: field.default
    for name, field in VideoJob.model_fields.items()
    if not field.is_required() and name in _JOB_COLUMNS
}


def job_row(
    principal: Principal,
    video: VideoInput,
    now: datetime,
    default_callback_url: str | None,
    *,
    allowed_providers: list[str] | None,
    continuation: dict[str, Any] | None,
    hold_micros: int,
) -> dict[str, Any]:
    """Every column of a new pending job's row (its holds' ids still None)."""
    params = {**video.params, "provider_options": video.provider_options}
    if allowed_providers is not None:
        params["allowed_providers"] = allowed_providers
    if continuation is not None:
        # The gateway's own: which finished job (and endpoint) this one continues.
        params["continuation"] = continuation
    return {
        **_JOB_DEFAULTS,
        "id": f"vid_{secrets.token_hex(12)}",
        "account_id": principal.account.id,
        "workspace_id": principal.workspace.id,
        "key_hash": principal.key.hash,
        "model": video.model.id,
        "status": PENDING,
        "params": params,
        "session_id": video.session_id,
        "user": video.user,
        "trace": video.trace,
        "callback_url": video.callback_url or default_callback_url,
        "hold_micros": hold_micros,
        "next_run_at": now,
        "created_at": now,
        "updated_at": now,
    }


async def find_job(session: AsyncSession, principal: Principal, job_id: str) -> VideoJob:
    """The job if the caller sees it (server/auth.py `sees`: a management key its
    workspace's, another key its own); any other is indistinguishable from none."""
    job = await session.get(VideoJob, job_id)
    return visible(principal, job, not_found(f"Video job {job_id!r} not found"))


async def check_content(job: VideoJob, index: int, store: ContentStore) -> int:
    """The size of the job's video `index`, if the caller may download it now."""
    if job.status == EXPIRED:
        raise GatewayError(410, "The video has expired and its content was deleted")
    if job.status != COMPLETED:
        raise GatewayError(409, f"The video is not ready (status {job.status})")
    if index < 0 or index >= job.content_count:
        raise bad_request(f"index must be between 0 and {job.content_count - 1}", param="index")
    size = await store.size(job.id, index)
    if size is None:
        raise GatewayError(410, "The video content is no longer available")
    return size


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


async def queue_webhook(session: AsyncSession, job: VideoJob, now: datetime) -> None:
    """Queue the job's terminal-state webhook in the caller's transaction (the outbox).
    Through the driver: the worker's finish runs it as a unit of the group-commit writer."""
    await fetch_rows(
        session,
        _INSERT_DELIVERY,
        {
            "id": f"msg_{secrets.token_hex(12)}",
            "workspace_id": job.workspace_id,
            "job_id": job.id,
            "url": job.callback_url,
            "payload": json.dumps(webhook_payload(job, now), separators=(",", ":")),
            "status": "pending",
            "attempts": 0,
            "next_attempt_at": now,
            "created_at": now,
        },
    )


def provider_call(job: VideoJob, model: Model, endpoint: Endpoint) -> VideoCall:
    """What the serving endpoint's adapter is handed for `job`."""
    params = dict(job.params)
    provider_options = params.pop("provider_options", {}) or {}
    params.pop("allowed_providers", None)  # the gateway's, not the provider's
    params.pop("continuation", None)
    return VideoCall(
        model=endpoint.model or model.upstream_name,
        params=params,
        # Only the serving provider's options are forwarded.
        options=dict(provider_options.get(endpoint.provider, {})),
    )
