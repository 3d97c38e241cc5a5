"""The guardrails in force for a key, cached per process like the caller's principal: valid
while the principal stamp (server/db/stamp.py) does not move, dropped with it."""

from __future__ import annotations

from sqlmodel.ext.asyncio.session import AsyncSession

from server.db.stamp import PrincipalStampView
from server.guardrails.policy import Guardrails, guardrails_of

# (workspace, key) pairs kept per process; past it the oldest is dropped.
MAX_CACHED = 10_000


class GuardrailsCache:
    def __init__(self, stamp: PrincipalStampView) -> None:
        self._stamp = stamp
        self._cache: dict[tuple[str, str], Guardrails] = {}
        stamp.register(self._cache)

    def cached(self, workspace_id: str, key_hash: str) -> Guardrails | None:
        """The cached guardrails while the stamp needs no read; None: call `of`."""
        if self._stamp.due():
            return None
        return self._cache.get((workspace_id, key_hash))

    async def of(self, session: AsyncSession, workspace_id: str, key_hash: str) -> Guardrails:
        """What `guardrails_of` reads, from the cache when the stamp allows it."""
        await self._stamp.check(session)
        wanted = (workspace_id, key_hash)
        cached = self._cache.get(wanted)
        if cached is not None:
            return cached
        generation = self._stamp.generation
        guardrails = await guardrails_of(session, workspace_id, key_hash)
        for rule in guardrails.rules:
            session.expunge(rule)  # shared by requests from now on: no session owns it
        if self._stamp.generation == generation:
            if len(self._cache) >= MAX_CACHED:
                del self._cache[next(iter(self._cache))]
            self._cache[wanted] = guardrails
        return guardrails
