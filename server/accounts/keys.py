"""API keys: issued once in plaintext, stored only as their SHA-256, managed by hash."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from server.billing.periods import LIMIT_RESETS
from server.db.models import ApiKey, Workspace
from server.errors import bad_request, not_found

KEY_PREFIX = "sk-gw-v1-"
KEY_PATTERN = re.compile(r"^sk-gw-v1-[0-9a-f]{64}$")
HASH_PATTERN = re.compile(r"^[0-9a-f]{64}$")
MAX_NAME = 255
PAGE_SIZE = 100


def generate_key() -> str:
    return KEY_PREFIX + secrets.token_hex(32)


def hash_key(key: str) -> str:
    # Keys carry 256 random bits, so a plain SHA-256 cannot be brute-forced.
    return hashlib.sha256(key.encode()).hexdigest()


def hashes_match(stored: str, presented: str) -> bool:
    return hmac.compare_digest(stored.encode(), presented.encode())


def label_for(key: str) -> str:
    secret = key[len(KEY_PREFIX) :]
    return f"{KEY_PREFIX}{secret[:3]}...{secret[-3:]}"


@dataclass(frozen=True)
class KeyLimit:
    """A key's credit cap: `limit_micros` None means unlimited."""

    limit_micros: int | None
    limit_reset: str | None


def check_name(name: str) -> str:
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME:
        raise bad_request(f"name must be 1 to {MAX_NAME} characters", param="name")
    return name


def check_limit(limit_micros: int | None) -> int | None:
    if limit_micros is not None and limit_micros < 0:
        raise bad_request("limit must be at least 0", param="limit")
    return limit_micros


def check_limit_reset(limit_reset: str | None) -> str | None:
    if limit_reset is not None and limit_reset not in LIMIT_RESETS:
        raise bad_request(
            f"limit_reset must be one of {', '.join(LIMIT_RESETS)} or null",
            param="limit_reset",
        )
    return limit_reset


_SECONDS_PRECISION = re.compile(r"T\d{2}:\d{2}:\d{2}")


def parse_expiry(text: str, param: str = "expires_at") -> datetime:
    """An ISO 8601 timestamp with seconds, in UTC (no offset: taken as UTC)."""
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        parsed = None
    if parsed is None or not _SECONDS_PRECISION.search(text):
        raise bad_request(
            f"{param} must be an ISO 8601 UTC timestamp with seconds (YYYY-MM-DDTHH:MM:SSZ)",
            param=param,
        )
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


async def create_key(
    session: AsyncSession,
    *,
    workspace: Workspace,
    name: str,
    now: datetime,
    limit: KeyLimit = KeyLimit(None, None),
    include_byok_in_limit: bool = False,
    expires_at: datetime | None = None,
    management: bool = False,
    creator_user_id: str | None = None,
    external_user: str | None = None,
    intern_id: str | None = None,
) -> tuple[ApiKey, str]:
    """Issue a key; returns the stored row and the plaintext key (shown once)."""
    check_name(name)
    check_limit(limit.limit_micros)
    check_limit_reset(limit.limit_reset)
    if expires_at is not None and expires_at <= now:
        raise bad_request("expires_at must be in the future", param="expires_at")
    plaintext = generate_key()
    key = ApiKey(
        hash=hash_key(plaintext),
        workspace_id=workspace.id,
        intern_id=intern_id,
        name=name,
        label=label_for(plaintext),
        limit_micros=limit.limit_micros,
        limit_reset=limit.limit_reset,
        include_byok_in_limit=include_byok_in_limit,
        is_management=management,
        expires_at=expires_at,
        creator_user_id=creator_user_id,
        external_user=external_user,
        created_at=now,
    )
    session.add(key)
    await session.flush()
    return key, plaintext


async def find_key(session: AsyncSession, key_hash: str, workspace_ids: list[str]) -> ApiKey:
    """A key by hash among the given workspaces; 404 for anything else (never reveal more)."""
    if not HASH_PATTERN.match(key_hash):
        raise not_found("API key not found")
    key = await session.get(ApiKey, key_hash)
    if key is None or key.workspace_id not in workspace_ids:
        raise not_found("API key not found")
    return key


async def key_by_hash(session: AsyncSession, key_hash: str) -> ApiKey:
    """Any workspace's key by hash: the operator's view (the CLI); 404 when there is none."""
    key = await session.get(ApiKey, key_hash)
    if key is None:
        raise not_found(f"no API key with hash {key_hash}")
    return key


async def update_key(
    session: AsyncSession, key: ApiKey, changes: Mapping[str, object], now: datetime
) -> ApiKey:
    """Apply changes already validated (column → value) at once: nothing is half-applied."""
    for name, value in changes.items():
        setattr(key, name, value)
    key.updated_at = now
    session.add(key)
    return key


async def delete_key(session: AsyncSession, key: ApiKey) -> None:
    await session.delete(key)


async def list_keys(
    session: AsyncSession,
    workspace_ids: list[str],
    now: datetime,
    *,
    include_disabled: bool = False,
    include_expired: bool = False,
    offset: int = 0,
) -> list[ApiKey]:
    if offset < 0:
        raise bad_request("offset must be at least 0", param="offset")
    query = select(ApiKey).where(col(ApiKey.workspace_id).in_(workspace_ids))
    if not include_disabled:
        query = query.where(col(ApiKey.disabled).is_(False))
    if not include_expired:
        query = query.where(sa.or_(col(ApiKey.expires_at).is_(None), col(ApiKey.expires_at) > now))
    query = query.order_by(col(ApiKey.created_at), col(ApiKey.hash)).offset(offset).limit(PAGE_SIZE)
    return list((await session.exec(query)).all())
