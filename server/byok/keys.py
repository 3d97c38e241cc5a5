"""BYOK keys as the management API and the CLI keep them: create, list, change, delete.
The key is sealed with AES-256-GCM under a data key of the workspace's own ("byok:<id>",
wrapped by the vault's master key and rotated with it); only a masked label is ever shown.

Providers that sign with two credentials (an endpoint naming `secret_key_env`, e.g. Kling's
access key + secret key) take the key as JSON: `{"access_key": "...", "secret_key": "..."}`;
the access key becomes the endpoint's credential, the secret key its secret."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel.ext.asyncio.session import AsyncSession

from server.db.models import ByokKey
from server.errors import bad_request, not_found
from server.routing.catalog import LOCAL_ADAPTERS, Catalog
from server.vault import crypto
from server.vault.store import data_key

MAX_KEY_CHARS = 4096
MAX_NAME_CHARS = 255
MAX_LIST_ITEMS = 500
REGIONS = ("global", "europe", "us")
_SCOPE = "byok"
_KEYS = ByokKey.__table__
_PRINTABLE = re.compile(r"[\x21-\x7e]+")  # a provider key is printable ASCII, no spaces


def vault_id(workspace_id: str) -> str:
    return f"byok:{workspace_id}"


@dataclass(frozen=True)
class Credentials:
    """What a key opens to: the endpoint's credential and, for two-key providers, its secret."""

    credential: str = field(repr=False)
    secret: str | None = field(default=None, repr=False)


def _two_key_providers(catalog: Catalog) -> set[str]:
    return {e.provider for m in catalog.models.values() for e in m.endpoints if e.secret_key_env}


def byok_providers(catalog: Catalog) -> set[str]:
    """Provider slugs a workspace can bring a key for: those with a non-local endpoint."""
    return {
        e.provider
        for m in catalog.models.values()
        for e in m.endpoints
        if e.adapter not in LOCAL_ADAPTERS
    }


def check_provider(catalog: Catalog, provider: str) -> str:
    known = byok_providers(catalog)
    if provider not in known:
        raise bad_request(
            f"provider must be one of the catalog's providers: {', '.join(sorted(known))}",
            param="provider",
        )
    return provider


def _single(key: str) -> str:
    if not 1 <= len(key) <= MAX_KEY_CHARS or not _PRINTABLE.fullmatch(key):
        # Never echo the key: say only what is wrong with it.
        raise bad_request(
            f"key must be 1 to {MAX_KEY_CHARS} printable characters without spaces", param="key"
        )
    return key


def parse_key(catalog: Catalog, provider: str, key: str) -> Credentials:
    """The key's credentials, checked for the provider's form (400 naming `key`)."""
    if provider not in _two_key_providers(catalog):
        return Credentials(_single(key))
    try:
        parsed = json.loads(key)
    except ValueError:
        parsed = None
    if (
        not isinstance(parsed, dict)
        or set(parsed) != {"access_key", "secret_key"}
        or not all(isinstance(v, str) for v in parsed.values())
    ):
        raise bad_request(
            f'key for {provider} must be JSON: {{"access_key": "...", "secret_key": "..."}}',
            param="key",
        )
    return Credentials(_single(parsed["access_key"]), _single(parsed["secret_key"]))


def mask(credentials: Credentials) -> str:
    """The label shown for a key: its last 4 characters, only when it is long enough that
    they give little away."""
    visible = credentials.credential[-4:] if len(credentials.credential) >= 16 else ""
    return f"...{visible}" if visible else "****"


def open_key(master: crypto.MasterKey, row: ByokKey, key: bytes) -> str:
    """The plaintext of one of the workspace's keys, `key` being its data key."""
    return crypto.open_sealed(key, row.workspace_id, _SCOPE, row.id, row.ciphertext, row.nonce)


def _strings(values: Any, param: str) -> list[str] | None:
    if values is None:
        return None
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise bad_request(f"{param} must be a list of strings or null", param=param)
    if len(values) > MAX_LIST_ITEMS:
        raise bad_request(f"{param} may list at most {MAX_LIST_ITEMS} items", param=param)
    return sorted(set(values))


def check_changes(catalog: Catalog, given: dict[str, Any]) -> dict[str, Any]:
    """The members given (column name -> value), each checked before anything is written:
    one rule set for the API and the CLI. A new `key` is checked and sealed by
    `create_key` / `update_key`."""
    checked: dict[str, Any] = {}
    for name, value in given.items():
        if name == "name":
            if value is not None and len(value) > MAX_NAME_CHARS:
                raise bad_request(f"name must be at most {MAX_NAME_CHARS} characters", param=name)
            checked[name] = value or None  # an empty name is no name
        elif name == "allowed_models":
            models = _strings(value, name)
            for index, model in enumerate(models or []):
                if model not in catalog.models:
                    raise bad_request(f"{name}[{index}]: unknown model", param=name)
            checked[name] = models
        elif name in ("allowed_api_key_hashes", "allowed_user_ids"):
            checked[name] = _strings(value, name)
        elif name == "declared_region":
            if value is not None and value not in REGIONS:
                raise bad_request(
                    f"declared_region must be one of {', '.join(REGIONS)} or null", param=name
                )
            checked[name] = value
        elif name == "declared_zdr":
            checked[name] = None if value is None else bool(value)
        elif name in ("disabled", "is_fallback", "is_required", "is_byok_only"):
            checked[name] = bool(value)
        else:
            raise ValueError(f"not a BYOK key member: {name}")
    return checked


def _check_combination(row: ByokKey) -> None:
    if row.is_fallback and (row.is_byok_only or row.is_required):
        raise bad_request(
            "is_fallback cannot be combined with is_byok_only or is_required",
            param="is_fallback",
        )


async def _seal(
    session: AsyncSession,
    master: crypto.MasterKey,
    catalog: Catalog,
    row: ByokKey,
    key: str,
    now: datetime,
) -> None:
    credentials = parse_key(catalog, row.provider, key)
    sealing_key = await data_key(session, master, vault_id(row.workspace_id), now)
    row.ciphertext, row.nonce = crypto.seal(sealing_key, row.workspace_id, _SCOPE, row.id, key)
    row.label = mask(credentials)


async def create_key(
    session: AsyncSession,
    master: crypto.MasterKey,
    catalog: Catalog,
    *,
    workspace_id: str,
    provider: str,
    key: str,
    changes: dict[str, Any],
    now: datetime,
) -> ByokKey:
    """A new key, tried after the provider's existing ones. The caller commits."""
    check_provider(catalog, provider)
    parse_key(catalog, provider, key)  # refused before anything is written
    last = (
        await session.exec(  # type: ignore[call-overload]  # sqlmodel's exec() is typed for its own select() only
            sa.select(sa.func.max(_KEYS.c.sort_order)).where(
                _KEYS.c.workspace_id == workspace_id, _KEYS.c.provider == provider
            )
        )
    ).scalar()
    row = ByokKey(
        id=f"byok_{secrets.token_hex(12)}",
        workspace_id=workspace_id,
        provider=provider,
        label="",
        ciphertext=b"",
        nonce=b"",
        sort_order=0 if last is None else last + 1,
        created_at=now,
    )
    for name, value in changes.items():
        setattr(row, name, value)
    _check_combination(row)
    await _seal(session, master, catalog, row, key, now)
    session.add(row)
    await session.flush()
    return row


async def update_key(
    session: AsyncSession,
    master: crypto.MasterKey,
    catalog: Catalog,
    row: ByokKey,
    changes: dict[str, Any],
    now: datetime,
) -> ByokKey:
    """Apply checked changes, and `changes["key"]` (a new key, sealed in place of the old)
    when given. The caller commits; a refusal leaves the row as it was."""
    key = changes.get("key")
    if key is not None:
        parse_key(catalog, row.provider, key)
    before = {name: getattr(row, name) for name in changes if name != "key"}
    for name, value in changes.items():
        if name != "key":
            setattr(row, name, value)
    try:
        _check_combination(row)
    except Exception:
        for name, value in before.items():
            setattr(row, name, value)
        raise
    if key is not None:
        await _seal(session, master, catalog, row, key, now)
    row.updated_at = now
    session.add(row)
    await session.flush()
    return row


async def delete_key(session: AsyncSession, row: ByokKey) -> None:
    await session.delete(row)


async def find_key(session: AsyncSession, key_id: str, workspace_ids: Sequence[str]) -> ByokKey:
    """One of these workspaces' keys; any other is indistinguishable from none."""
    row = await session.get(ByokKey, key_id)
    if row is None or row.workspace_id not in workspace_ids:
        raise not_found(f"BYOK key {key_id!r} not found")
    return row


def _ordered(statement: sa.Select) -> sa.Select:
    return statement.order_by(_KEYS.c.provider, _KEYS.c.sort_order, _KEYS.c.created_at, _KEYS.c.id)


async def list_keys(
    session: AsyncSession,
    workspace_id: str,
    *,
    provider: str | None = None,
    offset: int = 0,
    limit: int = 50,
) -> tuple[list[ByokKey], int]:
    """One page of the workspace's keys (by provider, then the order they are tried) and
    how many there are in all."""
    if offset < 0:
        raise bad_request("offset must be 0 or more", param="offset")
    if not 1 <= limit <= 100:
        raise bad_request("limit must be 1 to 100", param="limit")
    where = [_KEYS.c.workspace_id == workspace_id]
    if provider is not None:
        where.append(_KEYS.c.provider == provider)
    page = _ordered(sa.select(ByokKey).where(*where)).offset(offset).limit(limit)
    rows = list((await session.exec(page)).scalars().all())  # type: ignore[call-overload]  # sqlmodel's exec() is typed for its own select() only
    total = (
        await session.exec(  # type: ignore[call-overload]  # sqlmodel's exec() is typed for its own select() only
            sa.select(sa.func.count()).select_from(_KEYS).where(*where)
        )
    ).scalar()
    return rows, int(total or 0)


async def workspace_keys(session: AsyncSession, workspace_id: str) -> list[ByokKey]:
    """Every enabled key of the workspace, in the order they are tried."""
    statement = _ordered(
        sa.select(ByokKey).where(_KEYS.c.workspace_id == workspace_id, _KEYS.c.disabled.is_(False))
    )
    return list((await session.exec(statement)).scalars().all())  # type: ignore[call-overload]  # sqlmodel's exec() is typed for its own select() only
