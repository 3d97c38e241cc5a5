"""Bearer-key authentication: who is calling, in which workspace and account."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import sqlalchemy as sa
from sqlalchemy.orm.attributes import set_committed_value
from sqlmodel import col
from sqlmodel.ext.asyncio.session import AsyncSession

from server.accounts.keys import KEY_PATTERN, hash_key, hashes_match
from server.clock import Clock
from server.db.models import Account, ApiKey, Workspace
from server.errors import forbidden, unauthorized

# last_used_at is refreshed at most this often, to keep reads free of writes.
LAST_USED_GRANULARITY = timedelta(minutes=1)


# Built once: compiled and cached; each request only binds the hash.
_PRINCIPAL_BY_HASH = (
    sa.select(ApiKey, Workspace, Account)
    .join(Workspace, col(Workspace.id) == ApiKey.workspace_id)
    .join(Account, col(Account.id) == Workspace.account_id)
    .where(col(ApiKey.hash) == sa.bindparam("hash"))
)


@dataclass(frozen=True)
class Principal:
    key: ApiKey
    workspace: Workspace
    account: Account


def bearer_token(metadata: Sequence[tuple[str, str | bytes]]) -> str:
    """The key from `authorization: Bearer <key>`; 401 when absent or malformed."""
    values = [v for k, v in metadata if k.lower() == "authorization"]
    if not values:
        raise unauthorized("Missing Authorization header: send 'Authorization: Bearer <API key>'")
    if len(values) > 1:
        raise unauthorized("More than one Authorization header")
    value = values[0]
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    scheme, _, token = value.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise unauthorized("Malformed Authorization header: expected 'Bearer <API key>'")
    return token


class Authenticator:
    """Resolves the caller inside the request's own session (one session per request)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    async def authenticate(
        self, session: AsyncSession, metadata: Sequence[tuple[str, str | bytes]]
    ) -> Principal:
        token = bearer_token(metadata)
        if not KEY_PATTERN.match(token):
            raise unauthorized("Invalid API key")
        presented = hash_key(token)
        now = self._clock.now()
        row = (await session.exec(_PRINCIPAL_BY_HASH, params={"hash": presented})).one_or_none()  # type: ignore[call-overload]  # sqlmodel's exec() is typed for its own select() only
        if row is None or not hashes_match(row[0].hash, presented):
            raise unauthorized("Invalid API key")
        key, workspace, account = row
        if key.disabled:
            raise unauthorized("API key is disabled")
        if key.expires_at is not None and key.expires_at <= now:
            raise unauthorized("API key has expired")
        if key.last_used_at is None or now - key.last_used_at >= LAST_USED_GRANULARITY:
            await session.exec(
                sa.update(ApiKey).where(col(ApiKey.hash) == key.hash).values(last_used_at=now)
            )
            await session.commit()
            # Reflect the stored value without marking the row dirty again.
            set_committed_value(key, "last_used_at", now)
        return Principal(key=key, workspace=workspace, account=account)

    async def authenticate_management(
        self, session: AsyncSession, metadata: Sequence[tuple[str, str | bytes]]
    ) -> Principal:
        principal = await self.authenticate(session, metadata)
        if not principal.key.is_management:
            raise forbidden("This operation requires a management key")
        return principal
