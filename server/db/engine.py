"""The one database engine and session factory."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlmodel.ext.asyncio.session import AsyncSession

SessionFactory = async_sessionmaker[AsyncSession]
CONNECT_TIMEOUT_SECONDS = 5


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    # WAL lets readers (and other processes) work while one writer commits;
    # busy_timeout makes a second writer wait instead of failing at once.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def create_engine(url: str, **kwargs: Any) -> AsyncEngine:
    if url.startswith("sqlite"):
        # SQLite has one writer at a time. Contending connections wait in SQLite's busy
        # handler, which sleeps in steps of up to 100 ms; one pooled connection instead
        # queues transactions in the event loop, in order, with no sleeping.
        kwargs.setdefault("pool_size", 1)
        kwargs.setdefault("max_overflow", 0)
        kwargs.setdefault("pool_timeout", 120)
        # Sessions always end their transactions (commit, or rollback on close), so the
        # pool's extra ROLLBACK on every check-in would only add a hop to aiosqlite's thread.
        kwargs.setdefault("pool_reset_on_return", None)
        engine = create_async_engine(url, **kwargs)
        sa.event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        return engine
    kwargs.setdefault("pool_size", 10)
    kwargs.setdefault("max_overflow", 10)
    kwargs.setdefault("pool_pre_ping", True)
    # Fail fast when the server is unreachable (asyncpg waits 60 s by default).
    kwargs.setdefault("connect_args", {"timeout": CONNECT_TIMEOUT_SECONDS})
    return create_async_engine(url, **kwargs)


def is_database_unavailable(exc: BaseException) -> bool:
    """The database could not be reached (refused, reset, timed out, connection lost) or
    handed out no connection in time: a 503, not a bug."""
    if isinstance(exc, ConnectionError | TimeoutError | sa.exc.TimeoutError):
        return True
    return isinstance(exc, sa.exc.DBAPIError) and bool(exc.connection_invalidated)


def session_factory(engine: AsyncEngine) -> SessionFactory:
    return async_sessionmaker(engine, class_=AsyncSession, expire_on_commit=False)
