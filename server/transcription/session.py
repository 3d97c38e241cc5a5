"""The request's database session, opened only if the request turns out to need one.

A transcription by a cached caller (server/auth.py, guardrails and BYOK caches) reads
nothing in its own session: admission goes through its lease or the group-commit writer,
settlement through the writer. Making and closing an AsyncSession nobody uses costs
SQLAlchemy's work on every request; LazySession makes it on first use (a stamp read, a cache
miss, the failure path) and closes only what it made."""

from __future__ import annotations

from types import TracebackType
from typing import Any, cast

from sqlmodel.ext.asyncio.session import AsyncSession

from server.db.engine import SessionFactory


class LazySession:
    """Stands for an AsyncSession (`async with LazySession(factory) as session`); every
    attribute but in_transaction() makes the real one first."""

    def __init__(self, factory: SessionFactory) -> None:
        self._factory = factory
        self._session: AsyncSession | None = None

    @property
    def opened(self) -> bool:
        return self._session is not None

    def _real(self) -> AsyncSession:
        if self._session is None:
            self._session = self._factory()
        return self._session

    def in_transaction(self) -> bool:
        # No session yet: none began (and none is made just to say so).
        return self._session is not None and self._session.in_transaction()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real(), name)

    async def __aenter__(self) -> AsyncSession:
        return cast(AsyncSession, self)

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._session is not None:
            # AsyncSession's own exit: its close is shielded from a cancellation.
            await self._session.__aexit__(kind, value, traceback)
