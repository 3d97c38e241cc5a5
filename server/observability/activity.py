"""Activity read back from the generation records: spend per UTC day, model and provider
(OpenRouter's GET /api/v1/activity) and the list of generations (GET /api/v1/generations),
each confined to one workspace and, for a key that is not a management key, to that key."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import sqlalchemy as sa
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from server.billing.money import micros_to_json_number
from server.db.models import Generation
from server.errors import bad_request

ACTIVITY_DAYS = 30
GROUP_BY = ("", "api_key")
GENERATION_STATUSES = ("", "completed", "failed")
API_TYPES = ("", "stt", "video")
DEFAULT_PAGE = 20
MAX_PAGE = 100


@dataclass(frozen=True)
class Page:
    offset: int
    limit: int


def page_of(offset: int | None, limit: int | None) -> Page:
    """Paging parameters, checked: offset ≥ 0, limit 1..100 (default 20)."""
    offset = 0 if offset is None else offset
    limit = DEFAULT_PAGE if limit is None else limit
    if offset < 0:
        raise bad_request("offset must be 0 or more", param="offset")
    if not 1 <= limit <= MAX_PAGE:
        raise bad_request(f"limit must be between 1 and {MAX_PAGE}", param="limit")
    return Page(offset, limit)


def activity_window(today: date, wanted: str) -> tuple[date, date]:
    """The first and last day asked for: the last 30 UTC days (today included), or the one
    day `wanted` (YYYY-MM-DD) among them."""
    first = today - timedelta(days=ACTIVITY_DAYS - 1)
    if not wanted:
        return first, today
    try:
        day = date.fromisoformat(wanted)
    except ValueError:
        raise bad_request("date must be a UTC day as YYYY-MM-DD", param="date") from None
    if len(wanted) != 10 or not first <= day <= today:
        raise bad_request(
            f"date must be a UTC day as YYYY-MM-DD within the last {ACTIVITY_DAYS} days",
            param="date",
        )
    return day, day


def _start_of(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=UTC)


def _utc_day(column: Any, dialect: str) -> Any:
    """The UTC day of a stored time as YYYY-MM-DD, computed by the database. SQLite keeps
    times as UTC text ("2026-11-25 10:00:00.000000"); PostgreSQL as timestamptz, read in
    UTC whatever the session's time zone. Constants are literal SQL, not parameters, so
    the GROUP BY expression is the selected one."""
    if dialect == "postgresql":
        utc = sa.func.timezone(sa.literal_column("'UTC'"), column)
        return sa.func.to_char(utc, sa.literal_column("'YYYY-MM-DD'"))
    return sa.func.date(column)


async def activity(
    session: AsyncSession,
    workspace_id: str,
    now: datetime,
    *,
    wanted_date: str = "",
    key_hash: str = "",
    group_by: str = "",
) -> list[dict[str, Any]]:
    """OpenRouter's activity items: one per day, model and provider (and key, with
    group_by=api_key), oldest day first. Charges go to `usage`, what the workspace's own
    provider keys paid to `byok_usage_inference`; every recorded generation is a request."""
    if group_by not in GROUP_BY:
        raise bad_request("group_by must be api_key or empty", param="group_by")
    first, last = activity_window(now.astimezone(UTC).date(), wanted_date)
    connection = await session.connection()
    day_of = _utc_day(col(Generation.created_at), connection.dialect.name)
    provider_of = sa.func.coalesce(col(Generation.provider), sa.literal_column("''"))
    groups: list[Any] = [day_of, col(Generation.model), provider_of]
    if group_by == "api_key":
        groups.append(col(Generation.key_hash))
    cost = col(Generation.cost_micros)
    byok = col(Generation.is_byok)
    # The sums are the database's, in integer micro-dollars: one row per group comes back.
    query = (
        sa.select(
            *groups,
            sa.func.sum(sa.case((byok, 0), else_=cost)),
            sa.func.sum(sa.case((byok, cost), else_=0)),
            sa.func.count(),
        )
        .where(
            col(Generation.workspace_id) == workspace_id,
            col(Generation.created_at) >= _start_of(first),
            col(Generation.created_at) < _start_of(last + timedelta(days=1)),
        )
        .group_by(*groups)
    )
    if key_hash:
        query = query.where(col(Generation.key_hash) == key_hash)
    totals: dict[tuple[str, str, str, str], tuple[int, int, int]] = {}
    for row in await connection.execute(query):
        row_day, model, row_provider = row[0], row[1], row[2]
        row_key = row[3] if group_by == "api_key" else ""
        charged, byok_paid, requests = row[-3:]
        totals[(str(row_day), model, row_provider, row_key)] = (
            int(charged),
            int(byok_paid),
            int(requests),
        )
    return [
        {
            "date": day,
            "model": model,
            "model_permaslug": model,
            "endpoint_id": f"{provider}:{model}" if provider else model,
            "provider_name": provider,
            "usage": micros_to_json_number(charged),
            "byok_usage_inference": micros_to_json_number(byok),
            "requests": requests,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "reasoning_tokens": 0,
            "cached_tokens": 0,
            "api_key_hash": row_key or None,
        }
        for (day, model, provider, row_key), (charged, byok, requests) in sorted(totals.items())
    ]


async def list_generations(
    session: AsyncSession,
    workspace_id: str,
    page: Page,
    *,
    key_hash: str = "",
    model: str = "",
    status: str = "",
    api_type: str = "",
) -> tuple[list[Generation], int]:
    """The workspace's generations matching every filter given, newest first, and how many
    match in all."""
    if status not in GENERATION_STATUSES:
        raise bad_request("status must be completed or failed", param="status")
    if api_type not in API_TYPES:
        raise bad_request("api_type must be stt or video", param="api_type")
    conditions: list[Any] = [Generation.workspace_id == workspace_id]
    for column, wanted in (
        (Generation.key_hash, key_hash),
        (Generation.model, model),
        (Generation.status, status),
        (Generation.kind, api_type),
    ):
        if wanted:
            conditions.append(column == wanted)
    total = (
        await session.exec(select(sa.func.count()).select_from(Generation).where(*conditions))
    ).one()
    rows = await session.exec(
        select(Generation)
        .where(*conditions)
        .order_by(col(Generation.created_at).desc(), col(Generation.id).desc())
        .offset(page.offset)
        .limit(page.limit)
    )
    return list(rows), int(total)
