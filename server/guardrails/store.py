"""Guardrails as the management API and the CLI keep them: create, list, change, delete,
each checked against the catalog before anything is written."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel.ext.asyncio.session import AsyncSession

from server.db.models import Guardrail
from server.errors import GatewayError, bad_request, not_found
from server.routing.catalog import Catalog

MAX_NAME_CHARS = 255
MAX_DESCRIPTION_CHARS = 1000
MAX_LIST_ITEMS = 500
_GUARDRAILS = Guardrail.__table__

# Members of the OpenRouter guardrail this gateway does not enforce: setting one is refused
# rather than silently ignored. (Spending limits are per key here: `limit` on /keys.)
UNSUPPORTED = ("limit_usd", "reset_interval", "allowed_data_regions", "content_filters")


def check_name(name: str) -> str:
    name = name.strip()
    if not name or len(name) > MAX_NAME_CHARS:
        raise bad_request(f"name must be 1 to {MAX_NAME_CHARS} characters", param="name")
    return name


def check_description(description: str | None) -> str | None:
    if description is not None and len(description) > MAX_DESCRIPTION_CHARS:
        raise bad_request(
            f"description must be at most {MAX_DESCRIPTION_CHARS} characters",
            param="description",
        )
    return description


def _known(values: list[str] | None, known: set[str], param: str, what: str) -> list[str] | None:
    if values is None:
        return None
    if len(values) > MAX_LIST_ITEMS:
        raise bad_request(f"{param} may list at most {MAX_LIST_ITEMS} {what}s", param=param)
    for index, value in enumerate(values):
        if value not in known:
            raise bad_request(f"{param}[{index}]: unknown {what} {value!r}", param=param)
    return sorted(set(values))


def check_models(catalog: Catalog, values: list[str] | None, param: str) -> list[str] | None:
    return _known(values, set(catalog.models), param, "model")


def check_providers(catalog: Catalog, values: list[str] | None, param: str) -> list[str] | None:
    providers = {e.provider for m in catalog.models.values() for e in m.endpoints}
    return _known(values, providers, param, "provider")


MAX_VIDEO_DURATION_SECONDS = 86_400  # a day: far beyond any model, well inside the column


def check_max_video_duration(seconds: int | None) -> int | None:
    if seconds is not None and not 1 <= seconds <= MAX_VIDEO_DURATION_SECONDS:
        raise bad_request(
            f"max_video_duration_seconds must be 1 to {MAX_VIDEO_DURATION_SECONDS}",
            param="max_video_duration_seconds",
        )
    return seconds


def check_max_cost(micros: int | None) -> int | None:
    if micros is not None and micros < 0:
        raise bad_request(
            "max_cost_per_request_usd must be 0 or more", param="max_cost_per_request_usd"
        )
    return micros


def check_changes(catalog: Catalog, given: dict[str, Any]) -> dict[str, Any]:
    """The members given (column name → value; only those being set), each validated, so that
    nothing is written before all pass: one rule set for the API and the CLI."""
    checks: dict[str, Any] = {
        "name": check_name,
        "description": check_description,
        "allowed_models": lambda v: check_models(catalog, v, "allowed_models"),
        "ignored_models": lambda v: check_models(catalog, v, "ignored_models"),
        "allowed_providers": lambda v: check_providers(catalog, v, "allowed_providers"),
        "ignored_providers": lambda v: check_providers(catalog, v, "ignored_providers"),
        "max_cost_per_request_micros": check_max_cost,
        "max_video_duration_seconds": check_max_video_duration,
        "include_byok_in_budgets": bool,
    }
    return {name: checks[name](value) for name, value in given.items()}


def apply(guardrail: Guardrail, changes: dict[str, Any]) -> None:
    for name, value in changes.items():
        setattr(guardrail, name, value)


async def create_guardrail(
    session: AsyncSession, workspace_id: str, changes: dict[str, Any], now: datetime
) -> Guardrail:
    guardrail = Guardrail(
        id=f"gr_{secrets.token_hex(12)}",
        workspace_id=workspace_id,
        name=changes.pop("name"),
        created_at=now,
    )
    apply(guardrail, changes)
    session.add(guardrail)
    return guardrail


async def update_guardrail(
    session: AsyncSession, guardrail: Guardrail, changes: dict[str, Any], now: datetime
) -> Guardrail:
    apply(guardrail, changes)
    guardrail.updated_at = now
    session.add(guardrail)
    return guardrail


async def delete_guardrail(session: AsyncSession, guardrail: Guardrail) -> None:
    await session.delete(guardrail)


async def find_guardrail(
    session: AsyncSession, guardrail_id: str, workspace_ids: Sequence[str]
) -> Guardrail:
    """One of these workspaces' guardrails; any other is indistinguishable from none."""
    guardrail = await session.get(Guardrail, guardrail_id)
    if guardrail is None or guardrail.workspace_id not in workspace_ids:
        raise not_found(f"guardrail {guardrail_id!r} not found")
    return guardrail


async def list_guardrails(
    session: AsyncSession, workspace_id: str, *, offset: int = 0, limit: int = 50
) -> list[Guardrail]:
    if offset < 0:
        raise bad_request("offset must be 0 or more", param="offset")
    if not 1 <= limit <= 100:
        raise bad_request("limit must be 1 to 100", param="limit")
    statement = (
        sa.select(Guardrail)
        .where(_GUARDRAILS.c.workspace_id == workspace_id)
        .order_by(_GUARDRAILS.c.created_at, _GUARDRAILS.c.id)
        .offset(offset)
        .limit(limit)
    )
    return list((await session.exec(statement)).scalars().all())  # type: ignore[call-overload]  # sqlmodel's exec() is typed for its own select() only


def refuse_unsupported(name: str) -> GatewayError:
    return bad_request(
        f"{name} is not supported by this gateway (spending limits are set per key)",
        param=name,
    )
