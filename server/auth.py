"""Bearer-key authentication: who is calling, in which workspace and account; and what a
caller may see of its workspace's records (`sees`, `own_records`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol, TypeVar

import sqlalchemy as sa
from sqlmodel import col
from sqlmodel.ext.asyncio.session import AsyncSession

from server.accounts.keys import KEY_PATTERN, hash_key, hashes_match
from server.clock import Clock
from server.db.driver import fetch_rows
from server.db.models import Account, ApiKey, UtcDateTime, Workspace
from server.db.stamp import PrincipalStampView
from server.errors import GatewayError, forbidden, unauthorized

# last_used_at is refreshed at most this often, to keep reads free of writes.
LAST_USED_GRANULARITY = timedelta(minutes=1)
# Callers kept per process; past it the oldest is dropped (a miss costs one read).
MAX_CACHED_PRINCIPALS = 10_000


# Built once: compiled and cached; each request only binds the hash.
_PRINCIPAL_BY_HASH = (
    sa.select(ApiKey, Workspace, Account)
    .join(Workspace, col(Workspace.id) == ApiKey.workspace_id)
    .join(Account, col(Account.id) == Workspace.account_id)
    .where(col(ApiKey.hash) == sa.bindparam("hash"))
)


_KEYS = ApiKey.__table__
# Raw (server/db/driver.py): no ORM, and no write when another process refreshed it already.
_TOUCH = (
    sa.update(_KEYS)
    .where(
        _KEYS.c.hash == sa.bindparam("hash"),
        sa.or_(
            _KEYS.c.last_used_at.is_(None),
            _KEYS.c.last_used_at <= sa.bindparam("stale_before", type_=UtcDateTime),
        ),
    )
    .values(last_used_at=sa.bindparam("now", type_=UtcDateTime))
)


@dataclass(frozen=True)
class Principal:
    """Who calls. Shared by every request of the process while cached: read only (the rows
    are detached from any session)."""

    key: ApiKey
    workspace: Workspace
    account: Account


class Owned(Protocol):
    """A record a key created (a video job, a generation): whose it is."""

    @property
    def workspace_id(self) -> str: ...

    @property
    def key_hash(self) -> str: ...


OwnedT = TypeVar("OwnedT", bound=Owned)


def sees(principal: Principal, record: Owned) -> bool:
    """The one visibility rule of records a key created: a management key sees and acts on
    everything of its workspace; any other key only on what it created itself; nobody on
    another workspace's."""
    if record.workspace_id != principal.workspace.id:
        return False
    return principal.key.is_management or record.key_hash == principal.key.hash


def visible(principal: Principal, record: OwnedT | None, not_found: GatewayError) -> OwnedT:
    """The record looked up by id if the caller `sees` it; else `not_found`, the very answer
    an unknown id gets, so a hidden record's existence is never revealed."""
    if record is None or not sees(principal, record):
        raise not_found
    return record


def own_records(principal: Principal, wanted: str = "") -> str:
    """The key whose records a listing shows ("" = every key of the workspace): `sees` for
    lists. A management key may narrow it to `wanted`; any other key gets its own, and
    asking for another key's is a 403 (the listing's filter is no id lookup)."""
    if principal.key.is_management:
        return wanted
    if wanted and wanted != principal.key.hash:
        raise forbidden("A key that is not a management key sees only its own activity")
    return principal.key.hash


@dataclass
class _Cached:
    principal: Principal
    last_used_at: datetime | None  # as this process last wrote or read it


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


def _presented_hash(metadata: Sequence[tuple[str, str | bytes]]) -> str:
    token = bearer_token(metadata)
    if not KEY_PATTERN.match(token):
        raise unauthorized("Invalid API key")
    return hash_key(token)


class Authenticator:
    """Resolves the caller inside the request's own session (one session per request).

    A usable key's principal is cached by key hash and trusted while the principal stamp
    (server/db/stamp.py) says nothing changed: no database read in the common case, and a
    change anywhere refused within a second. Disabled and unknown keys are never cached.
    Expiry is checked on every request against the clock."""

    def __init__(self, clock: Clock, stamp: PrincipalStampView | None = None) -> None:
        self._clock = clock
        self.stamp = stamp if stamp is not None else PrincipalStampView(clock)
        self._cache: dict[str, _Cached] = {}
        self.stamp.register(self._cache)

    def cached(self, metadata: Sequence[tuple[str, str | bytes]]) -> Principal | None:
        """The caller without any database work, when nothing calls for it: the stamp was
        read within the second, the key is cached and its last use is recent. None means
        "call authenticate". Raises what authenticate would for a malformed or expired key."""
        presented = _presented_hash(metadata)
        if self.stamp.due():
            return None
        cached = self._cache.get(presented)
        if cached is None:
            return None
        now = self._clock.now()
        key = cached.principal.key
        if key.expires_at is not None and key.expires_at <= now:
            raise unauthorized("API key has expired")
        if cached.last_used_at is None or now - cached.last_used_at >= LAST_USED_GRANULARITY:
            return None
        return cached.principal

    async def authenticate(
        self, session: AsyncSession, metadata: Sequence[tuple[str, str | bytes]]
    ) -> Principal:
        presented = _presented_hash(metadata)
        await self.stamp.check(session)
        now = self._clock.now()
        cached = self._cache.get(presented)
        if cached is None:
            cached = await self._load(session, presented)
        key = cached.principal.key
        if key.expires_at is not None and key.expires_at <= now:
            raise unauthorized("API key has expired")
        if cached.last_used_at is None or now - cached.last_used_at >= LAST_USED_GRANULARITY:
            cached.last_used_at = now  # claimed first: concurrent requests do not write too
            await fetch_rows(
                session,
                _TOUCH,
                {"hash": key.hash, "now": now, "stale_before": now - LAST_USED_GRANULARITY},
            )
            await session.commit()
        return cached.principal

    async def _load(self, session: AsyncSession, presented: str) -> _Cached:
        generation = self.stamp.generation
        row = (await session.exec(_PRINCIPAL_BY_HASH, params={"hash": presented})).one_or_none()  # type: ignore[call-overload]  # sqlmodel's exec() is typed for its own select() only
        if row is None or not hashes_match(row[0].hash, presented):
            raise unauthorized("Invalid API key")
        key, workspace, account = row
        if key.disabled:
            raise unauthorized("API key is disabled")
        if workspace.disabled:
            raise unauthorized("API key's workspace is disabled")
        for loaded in (key, workspace, account):
            session.expunge(loaded)  # shared by requests from now on: no session owns it
        cached = _Cached(Principal(key=key, workspace=workspace, account=account), key.last_used_at)
        if self.stamp.generation == generation:  # nothing changed while it was read
            if len(self._cache) >= MAX_CACHED_PRINCIPALS:
                del self._cache[next(iter(self._cache))]
            self._cache[presented] = cached
        return cached

    async def warm(self, session: AsyncSession) -> None:
        """Run the principal query once, for no key, before the server takes requests:
        the ORM compiles it then (its three joined models take tens of milliseconds), not
        inside the first request of a caller not yet cached."""
        await session.exec(_PRINCIPAL_BY_HASH, params={"hash": ""})  # type: ignore[call-overload]  # as in _load

    async def authenticate_management(
        self, session: AsyncSession, metadata: Sequence[tuple[str, str | bytes]]
    ) -> Principal:
        principal = await self.authenticate(session, metadata)
        if not principal.key.is_management:
            raise forbidden("This operation requires a management key")
        return principal
