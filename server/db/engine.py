"""The one database engine and session factory."""

from __future__ import annotations

import asyncio
import sqlite3
import time
import weakref
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.sqlite.aiosqlite import SQLiteDialect_aiosqlite
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlmodel.ext.asyncio.session import AsyncSession

from server.db.datadir import private_file

SessionFactory = async_sessionmaker[AsyncSession]
CONNECT_TIMEOUT_SECONDS = 5


# Every SQLite connection's: WAL lets readers (and other processes) work while one writer
# commits; NORMAL syncs the WAL at checkpoints only (a commit survives a process crash; a
# power cut may lose the last commits, never consistency).
SQLITE_PRAGMAS = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=NORMAL",
    "PRAGMA foreign_keys=ON",
)
# How long a connection waits for another's write lock before it fails ("database is
# locked"); the pool's connection waits in aiosqlite's thread, never on the event loop.
SQLITE_BUSY_TIMEOUT_MS = 30_000


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    for pragma in SQLITE_PRAGMAS:
        cursor.execute(pragma)
    # A second writer waits instead of failing at once.
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.close()


def sqlite_file(engine: AsyncEngine) -> str | None:
    """The path of the engine's SQLite file; None for PostgreSQL or an in-memory database
    (which only the pool's one connection can see)."""
    url = engine.url
    if url.get_backend_name() != "sqlite":
        return None
    database = url.database
    if not database or database == ":memory:" or url.query.get("mode") == "memory":
        return None
    return database


def _private_sqlite_files(engine: AsyncEngine) -> None:
    """The database file created 0600 before SQLite opens it, whatever the umask (SQLite
    gives its -wal and -shm files the database file's mode); existing ones tightened. A
    file in a folder that does not exist is left to SQLite's own error."""
    database = sqlite_file(engine)
    if database is None or database.startswith("file:"):
        return
    path = Path(database)
    if not path.parent.is_dir():
        return
    private_file(path)
    for suffix in ("-wal", "-shm"):
        companion = path.with_name(path.name + suffix)
        if companion.exists():
            private_file(companion)


def connect_sqlite(path: str, *, cached_statements: int = 128) -> sqlite3.Connection:
    """A plain sqlite3 connection to the engine's file, used on the event loop's thread: the
    pool's pragmas, autocommit (isolation_level None: the caller writes BEGIN and COMMIT)
    and a busy timeout of 0 (it never sleeps in SQLite's busy handler; the caller decides
    where to wait). `check_same_thread` is off so that a wait can be handed to a thread
    while the loop does not touch the connection."""
    connection = sqlite3.connect(
        path,
        timeout=0,
        isolation_level=None,
        check_same_thread=False,
        cached_statements=cached_statements,
    )
    for pragma in SQLITE_PRAGMAS:
        connection.execute(pragma)
    return connection


class PoolWrites:
    """Whether the pool's SQLite connection is in a write transaction, and a wait for its end
    on the event loop — for the group-commit writer's own connection (server/db/driver.py's
    InlineSqlite), whose BEGIN IMMEDIATE then waits for the pool's COMMIT or ROLLBACK to
    return instead of sleeping in SQLite's busy handler (1, 2, 5, 10… ms steps)."""

    def __init__(self) -> None:
        self._connections: weakref.WeakSet[Any] = weakref.WeakSet()  # aiosqlite connections
        self._waiters: list[asyncio.Future[None]] = []
        self._writing_since: float | None = None  # when `starved` first saw a transaction

    def connected(self, driver_connection: Any) -> None:
        self._connections.add(driver_connection)

    def writing(self) -> bool:
        """A pooled connection of this process has a transaction open (Python's sqlite3
        begins one only before a write). Read on the loop's thread, no hand-off."""
        for connection in self._connections:
            try:
                if connection.in_transaction:
                    return True
            except (AttributeError, ValueError):  # closed
                continue
        return False

    def starved(self, after: float) -> bool:
        """A pooled transaction has been open for `after` seconds or more, as seen by the
        writer's checks (each batch start asks): likely waiting for the write lock."""
        if not self.writing():
            self._writing_since = None
            return False
        now = time.monotonic()
        if self._writing_since is None:
            self._writing_since = now
        return now - self._writing_since >= after

    async def ended(self, at_most: float) -> None:
        """Until a pooled transaction ends, or `at_most` seconds (a connection closed or
        invalidated mid-transaction ends its transaction without telling)."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, at_most)
        except TimeoutError:
            pass
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def transaction_ended(self) -> None:
        """A pooled transaction ended (IdleEndsSkipped): wake who waits for it."""
        self._writing_since = None
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


_pool_writes: weakref.WeakKeyDictionary[sa.Engine, PoolWrites] = weakref.WeakKeyDictionary()


def pool_writes(engine: AsyncEngine) -> PoolWrites | None:
    """The SQLite engine's PoolWrites (None: PostgreSQL, or an engine not made here)."""
    return _pool_writes.get(engine.sync_engine)


class IdleEndsSkipped(SQLiteDialect_aiosqlite):
    """SQLAlchemy's aiosqlite dialect, ending SQLite transactions on aiosqlite's thread only
    when SQLite has one open (`do_rollback` and `do_commit`, the dialect's documented
    methods for it, overridden in a dialect of our own, registered below).

    Python's sqlite3 begins a transaction before the first write and never for a read, so a
    session that only read holds no SQLite transaction; its ROLLBACK (or COMMIT) at close
    changes nothing, yet costs a hand-off to aiosqlite's thread and back, on the one pooled
    connection every request waits for (figures: docs/performance.md). aiosqlite's
    `in_transaction` is read on the loop's thread, when the session's statements are done
    (nothing runs on the connection then). Both run on the loop's thread (in SQLAlchemy's
    greenlet), so they can wake the writer's waiters (`pool_writes`) once the transaction
    has ended."""

    # The parent's statement caching holds: this only changes how transactions end.
    supports_statement_cache = True
    pool_writes: PoolWrites | None = None  # set by create_engine for its engine's dialect

    def do_rollback(self, dbapi_connection: Any) -> None:
        if _sqlite_in_transaction(dbapi_connection):
            try:
                super().do_rollback(dbapi_connection)  # type: ignore[no-untyped-call]
            finally:
                if self.pool_writes is not None:
                    self.pool_writes.transaction_ended()

    def do_commit(self, dbapi_connection: Any) -> None:
        if _sqlite_in_transaction(dbapi_connection):
            try:
                super().do_commit(dbapi_connection)  # type: ignore[no-untyped-call]
            finally:
                if self.pool_writes is not None:
                    self.pool_writes.transaction_ended()


def _sqlite_in_transaction(dbapi_connection: Any) -> bool:
    # Unknown shape, or a closed connection: end it the ordinary way.
    try:
        return bool(dbapi_connection.driver_connection.in_transaction)
    except (AttributeError, ValueError):
        return True


_IDLE_ENDS_SKIPPED = "gateway_aiosqlite"
sa.dialects.registry.register(f"sqlite.{_IDLE_ENDS_SKIPPED}", __name__, "IdleEndsSkipped")


def create_engine(url: str, **kwargs: Any) -> AsyncEngine:
    if url.startswith("sqlite"):
        # SQLite has one writer at a time. Contending connections wait in SQLite's busy
        # handler, which sleeps in steps of up to 100 ms; one pooled connection instead
        # queues transactions in the event loop, in order, with no sleeping. (The
        # group-commit writer has a connection of its own, server/db/driver.py's
        # InlineSqlite, which waits for this one's transactions on the loop: PoolWrites.)
        kwargs.setdefault("pool_size", 1)
        kwargs.setdefault("max_overflow", 0)
        kwargs.setdefault("pool_timeout", 120)
        # Sessions always end their transactions (commit, or rollback on close), so the
        # pool's extra ROLLBACK on every check-in would only add a hop to aiosqlite's thread.
        kwargs.setdefault("pool_reset_on_return", None)
        parsed = sa.make_url(url)
        if parsed.drivername == "sqlite+aiosqlite":
            parsed = parsed.set(drivername=f"sqlite+{_IDLE_ENDS_SKIPPED}")
        engine = create_async_engine(parsed, **kwargs)
        _private_sqlite_files(engine)
        sa.event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        writes = PoolWrites()
        _pool_writes[engine.sync_engine] = writes
        sa.event.listen(
            engine.sync_engine,
            "connect",
            lambda dbapi_connection, _record: writes.connected(dbapi_connection.driver_connection),
        )
        dialect = engine.sync_engine.dialect
        if isinstance(dialect, IdleEndsSkipped):
            dialect.pool_writes = writes
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
