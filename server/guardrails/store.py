"""Guardrails as the management API and the CLI keep them: create, list, change, delete,
each checked against the catalog before anything is written."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel.ext.asyncio.session import AsyncSession

from server.billing.periods import LIMIT_RESETS
from server.db.models import ApiKey, Guardrail, GuardrailKeyAssignment
from server.errors import GatewayError, bad_request, not_found
from server.routing.catalog import Catalog

MAX_NAME_CHARS = 255
MAX_DESCRIPTION_CHARS = 1000
MAX_LIST_ITEMS = 500
_GUARDRAILS = Guardrail.__table__

# Members of the OpenRouter guardrail this gateway does not enforce: setting one is refused
# rather than silently ignored.
UNSUPPORTED = ("allowed_data_regions", "content_filters")
RESET_INTERVALS = LIMIT_RESETS
MAX_BUDGET_MICROS = 1_000_000_000 * 1_000_000  # 1e9 USD, as a key's limit
MAX_KEY_HASHES = 100
_ASSIGNMENTS = GuardrailKeyAssignment.__table__
_KEYS = ApiKey.__table__


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


def check_budget_limit(micros: int | None) -> int | None:
    if micros is not None and not 0 < micros <= MAX_BUDGET_MICROS:
        raise bad_request("limit_usd must be more than 0 and at most 1e9", param="limit_usd")
    return micros


def check_reset_interval(interval: str | None) -> str | None:
    if interval is not None and interval not in RESET_INTERVALS:
        raise bad_request(
            f"reset_interval must be one of {', '.join(RESET_INTERVALS)}", param="reset_interval"
        )
    return interval


def check_budget(limit_micros: int | None, reset_interval: str | None) -> None:
    """A budget is a limit over an interval: both or neither (OpenRouter's rule)."""
    if (limit_micros is None) != (reset_interval is None):
        missing = "reset_interval" if limit_micros is not None else "limit_usd"
        raise bad_request("limit_usd and reset_interval must be given together", param=missing)


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
        "limit_micros": check_budget_limit,
        "reset_interval": check_reset_interval,
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
    check_budget(guardrail.limit_micros, guardrail.reset_interval)
    session.add(guardrail)
    return guardrail


async def update_guardrail(
    session: AsyncSession, guardrail: Guardrail, changes: dict[str, Any], now: datetime
) -> Guardrail:
    check_budget(
        changes.get("limit_micros", guardrail.limit_micros),
        changes.get("reset_interval", guardrail.reset_interval),
    )
    apply(guardrail, changes)
    guardrail.updated_at = now
    session.add(guardrail)
    return guardrail


async def delete_guardrail(session: AsyncSession, guardrail: Guardrail) -> None:
    await session.exec(sa.delete(_ASSIGNMENTS).where(_ASSIGNMENTS.c.guardrail_id == guardrail.id))
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


def check_key_hashes(hashes: list[str]) -> list[str]:
    if not 1 <= len(hashes) <= MAX_KEY_HASHES:
        raise bad_request(
            f"key_hashes must list 1 to {MAX_KEY_HASHES} key hashes", param="key_hashes"
        )
    return sorted(set(hashes))


async def _keys_of_workspace(
    session: AsyncSession, workspace_id: str, hashes: list[str]
) -> list[str]:
    """The hashes, each of a key of the workspace (else 400 naming none of the others)."""
    found = set(
        (
            await session.exec(  # type: ignore[call-overload]  # sqlmodel's exec() is typed for its own select() only
                sa.select(_KEYS.c.hash).where(
                    _KEYS.c.workspace_id == workspace_id, _KEYS.c.hash.in_(hashes)
                )
            )
        )
        .scalars()
        .all()
    )
    for index, key_hash in enumerate(hashes):
        if key_hash not in found:
            raise bad_request(
                f"key_hashes[{index}]: no key of the guardrail's workspace has this hash",
                param="key_hashes",
            )
    return hashes


async def copy_assignments(
    session: AsyncSession, from_hash: str, to_hash: str, now: datetime
) -> int:
    """Assign to_hash every guardrail from_hash is assigned (a rotated key's successor keeps
    its policy); the number copied. The caller commits."""
    rows = await session.exec(  # type: ignore[call-overload]  # sqlmodel's exec() is typed for its own select() only
        sa.select(_ASSIGNMENTS.c.guardrail_id).where(_ASSIGNMENTS.c.key_hash == from_hash)
    )
    guardrail_ids = [str(value) for value in rows.scalars().all()]
    for guardrail_id in guardrail_ids:
        session.add(
            GuardrailKeyAssignment(
                id=f"gka_{secrets.token_hex(12)}",
                guardrail_id=guardrail_id,
                key_hash=to_hash,
                created_at=now,
            )
        )
    return len(guardrail_ids)


async def assign_keys(
    session: AsyncSession, guardrail: Guardrail, hashes: list[str], now: datetime
) -> int:
    """Assign the guardrail to these keys of its workspace; the number newly assigned.
    From then on it applies to its assigned keys only. The caller commits."""
    hashes = await _keys_of_workspace(session, guardrail.workspace_id, check_key_hashes(hashes))
    assigned = set(
        (
            await session.exec(  # type: ignore[call-overload]  # sqlmodel's exec() is typed for its own select() only
                sa.select(_ASSIGNMENTS.c.key_hash).where(
                    _ASSIGNMENTS.c.guardrail_id == guardrail.id,
                    _ASSIGNMENTS.c.key_hash.in_(hashes),
                )
            )
        )
        .scalars()
        .all()
    )
    new = [h for h in hashes if h not in assigned]
    for key_hash in new:
        session.add(
            GuardrailKeyAssignment(
                id=f"gka_{secrets.token_hex(12)}",
                guardrail_id=guardrail.id,
                key_hash=key_hash,
                created_at=now,
            )
        )
    return len(new)


async def unassign_keys(session: AsyncSession, guardrail: Guardrail, hashes: list[str]) -> int:
    """Remove these keys' assignments; the number removed. The caller commits."""
    result = await session.exec(
        sa.delete(_ASSIGNMENTS).where(
            _ASSIGNMENTS.c.guardrail_id == guardrail.id,
            _ASSIGNMENTS.c.key_hash.in_(check_key_hashes(hashes)),
        )
    )
    return int(result.rowcount or 0)


async def list_key_assignments(
    session: AsyncSession,
    workspace_id: str,
    guardrail_id: str | None,
    *,
    offset: int = 0,
    limit: int = 50,
) -> tuple[list[tuple[GuardrailKeyAssignment, str, str]], int]:
    """The workspace's key assignments (of one guardrail, when given), oldest first, each with
    its key's name and label; and how many there are in all."""
    if offset < 0:
        raise bad_request("offset must be 0 or more", param="offset")
    if not 1 <= limit <= 100:
        raise bad_request("limit must be 1 to 100", param="limit")
    conditions = [_GUARDRAILS.c.workspace_id == workspace_id]
    if guardrail_id is not None:
        conditions.append(_ASSIGNMENTS.c.guardrail_id == guardrail_id)
    joined = _ASSIGNMENTS.join(_GUARDRAILS, _GUARDRAILS.c.id == _ASSIGNMENTS.c.guardrail_id).join(
        _KEYS, _KEYS.c.hash == _ASSIGNMENTS.c.key_hash
    )
    rows = (
        await session.exec(  # type: ignore[call-overload]  # sqlmodel's exec() is typed for its own select() only
            sa.select(GuardrailKeyAssignment, _KEYS.c.name, _KEYS.c.label)
            .select_from(joined)
            .where(*conditions)
            .order_by(_ASSIGNMENTS.c.created_at, _ASSIGNMENTS.c.id)
            .offset(offset)
            .limit(limit)
        )
    ).all()
    total = (
        await session.exec(  # type: ignore[call-overload]  # sqlmodel's exec() is typed for its own select() only
            sa.select(sa.func.count()).select_from(joined).where(*conditions)
        )
    ).scalar_one()
    return [(row[0], row[1], row[2]) for row in rows], int(total)
