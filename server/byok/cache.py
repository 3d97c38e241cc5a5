"""A workspace's BYOK keys, cached per process like the caller's principal (server/auth.py):
valid while the principal stamp (server/db/stamp.py) does not move, dropped with it. The
triggers of migration 0012 bump the stamp on any change to `byok_keys` (and to `vault_keys`,
whose rows wrap the keys' data key), so a key created, changed or deleted anywhere is used
or refused everywhere within the stamp's interval, and at once by the changing process.

Only the sealed form is kept: the rows as stored (ciphertext and nonce) and the workspace's
data key as the vault wraps it. A request opens the keys it is about to use
(ByokRouting.open); no plaintext outlives the request."""

from __future__ import annotations

from dataclasses import dataclass

from sqlmodel.ext.asyncio.session import AsyncSession

from server.byok import keys as store
from server.db.models import ByokKey, VaultKey
from server.db.stamp import PrincipalStampView

# Workspaces kept per process; past it the oldest is dropped (a miss costs two reads).
MAX_CACHED = 10_000


@dataclass(frozen=True)
class SealedKeys:
    """A workspace's enabled keys in the order they are tried, still sealed. Shared by the
    requests of the process while cached: read only (the rows are detached)."""

    rows: tuple[ByokKey, ...]
    wrapped_key: bytes | None  # the workspace's data key, wrapped; None: no keys, none needed
    master_key_id: str | None  # the master key that wraps it

    def __repr__(self) -> str:  # nothing sealed in a log line either
        return f"SealedKeys({len(self.rows)} keys)"


NO_KEYS = SealedKeys(rows=(), wrapped_key=None, master_key_id=None)


class ByokKeysCache:
    def __init__(self, stamp: PrincipalStampView) -> None:
        self._stamp = stamp
        self._cache: dict[str, SealedKeys] = {}
        stamp.register(self._cache)

    def cached(self, workspace_id: str) -> SealedKeys | None:
        """The workspace's keys while the stamp needs no read; None: call `of`."""
        if self._stamp.due():
            return None
        return self._cache.get(workspace_id)

    async def of(self, session: AsyncSession, workspace_id: str) -> SealedKeys:
        """The workspace's enabled keys (store.workspace_keys) and their wrapped data key,
        from the cache when the stamp allows it."""
        await self._stamp.check(session)
        cached = self._cache.get(workspace_id)
        if cached is not None:
            return cached
        generation = self._stamp.generation
        sealed = await load(session, workspace_id)
        if self._stamp.generation == generation:  # nothing changed while it was read
            if len(self._cache) >= MAX_CACHED:
                del self._cache[next(iter(self._cache))]
            self._cache[workspace_id] = sealed
        return sealed


async def load(session: AsyncSession, workspace_id: str) -> SealedKeys:
    """Read a workspace's sealed keys (no cache)."""
    rows = await store.workspace_keys(session, workspace_id)
    if not rows:
        return NO_KEYS
    vault_key = await session.get(VaultKey, store.vault_id(workspace_id))
    for row in rows:
        session.expunge(row)  # shared by requests from now on: no session owns it
    if vault_key is None:  # sealed under a data key that is gone: they cannot be opened
        return SealedKeys(rows=tuple(rows), wrapped_key=None, master_key_id=None)
    session.expunge(vault_key)
    return SealedKeys(
        rows=tuple(rows), wrapped_key=vault_key.wrapped_key, master_key_id=vault_key.master_key_id
    )
