"""Run the statements every billable request executes (admission before the provider call,
settlement after it) on the session's driver connection, skipping SQLAlchemy's
per-statement machinery.

Through SQLAlchemy, one statement on aiosqlite costs three or four hand-offs to the
connection's thread (open a cursor, execute, fetch, close), and with SQLite's single pooled
connection every other request waits through each of them; aiosqlite's `execute_fetchall`
does it in one. On asyncpg the statement is one round trip either way, but SQLAlchemy's
Python around it costs about as much as the database's work. The statements are still
SQLAlchemy Core, compiled once per dialect with their parameters converted by their column
types, and they run inside the session's transaction, on its connection, so they commit or
roll back with everything else the caller does.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import operator
import os
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC
from datetime import date as date_type
from datetime import datetime as datetime_type
from typing import Any, NamedTuple, TypeVar

import asyncpg
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlmodel.ext.asyncio.session import AsyncSession

from server.db.engine import SQLITE_BUSY_TIMEOUT_MS, PoolWrites, connect_sqlite, sqlite_file
from server.db.models import UtcDateTime

log = logging.getLogger(__name__)
T = TypeVar("T")

# Raised by asyncpg when the connection or the server went away.
CONNECTION_LOST = (asyncpg.InterfaceError, asyncpg.PostgresConnectionError, OSError)


@dataclass(frozen=True)
class _Compiled:
    sql: str
    names: tuple[str, ...]  # parameter names in positional order (a name may come again)
    processors: Mapping[str, Callable[[Any], Any] | None]
    literals: Mapping[str, Any]  # values bound in the statement itself (sa.literal, x + 1)

    def __post_init__(self) -> None:
        # Each name's value is read and converted once, even where the SQL binds it at
        # several positions (a multi-row INSERT's shared values), and a C itemgetter reads
        # them all at once: `arguments` runs for every statement of the hot paths.
        unique = tuple(dict.fromkeys(self.names))
        index = {name: i for i, name in enumerate(unique)}
        object.__setattr__(self, "_unique", unique)
        # Statements with values bound in themselves (rarely given in params) take the
        # per-name path: a KeyError raised on each call would cost more than it saves.
        plain = len(unique) > 1 and not any(name in self.literals for name in unique)
        object.__setattr__(self, "_getter", operator.itemgetter(*unique) if plain else None)
        object.__setattr__(
            self,
            "_converted",
            tuple(
                (i, processor)
                for i, name in enumerate(unique)
                if (processor := self.processors[name]) is not None
            ),
        )
        object.__setattr__(
            self, "_order", None if unique == self.names else [index[n] for n in self.names]
        )

    def arguments(self, params: Mapping[str, Any]) -> list[Any]:
        getter = self._getter  # type: ignore[attr-defined]
        values: list[Any]
        if getter is not None:
            values = list(getter(params))
        else:  # a value bound in the statement itself, unless given
            literals = self.literals
            values = [
                params[name] if name in params else literals[name]
                for name in self._unique  # type: ignore[attr-defined]
            ]
        for i, processor in self._converted:  # type: ignore[attr-defined]
            values[i] = processor(values[i])
        order = self._order  # type: ignore[attr-defined]
        return values if order is None else [values[i] for i in order]


# Values the faster conversions below are checked on against the dialect's own, once per
# type: `date.isoformat` and `datetime.isoformat(" ", "microseconds")` write SQLite's text
# formats much faster than the dialect's %-formatting (a settlement binds about ten such
# values). A dialect that writes them otherwise keeps its own.
_SAMPLE_DATES = (date_type(2001, 2, 3), date_type(1999, 12, 31))
_SAMPLE_DATETIMES = (
    datetime_type(2001, 2, 3, 4, 5, 6, 7, tzinfo=UTC),
    datetime_type(1999, 12, 31, 23, 59, 59, tzinfo=UTC),
)


def _utc_text(value: Any) -> str:
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(" ", "microseconds")  # type: ignore[no-any-return]


def _processor(type_: sa.types.TypeEngine[Any], dialect: sa.Dialect) -> Callable[[Any], Any] | None:
    """The dialect's conversion of a `type_` value (SQLite stores datetimes as text in its
    format), or on SQLite an equivalent faster one for dates and UTC datetimes (checked to
    write what the dialect's writes); what that does not expect (None, a naive datetime, a
    subclass) still goes to the dialect's."""
    own = type_.dialect_impl(dialect).bind_processor(dialect)
    if own is None or dialect.name != "sqlite":
        return own
    if isinstance(type_, UtcDateTime):
        if any(own(value) != _utc_text(value) for value in _SAMPLE_DATETIMES):
            return own

        def utc_datetime(value: Any) -> Any:
            if type(value) is datetime_type and value.tzinfo is not None:
                return _utc_text(value)
            return own(value)

        return utc_datetime
    if isinstance(type_.dialect_impl(dialect), sa.Date):
        if any(own(value) != value.isoformat() for value in _SAMPLE_DATES):
            return own

        def date_(value: Any) -> Any:
            return value.isoformat() if type(value) is date_type else own(value)

        return date_
    return own


# A statement that differs by dialect (each dialect's INSERT … ON CONFLICT), by dialect name
# ("postgresql", "sqlite"); the driver picks the one of the session's database.
Statement = sa.Executable | Mapping[str, sa.Executable]

# Memo of compiled statements: they are module-level constants, so this stays small.
_compiled: dict[tuple[int, str], tuple[sa.Executable, _Compiled]] = {}


def _for_dialect(statement: Statement, dialect_name: str) -> sa.Executable:
    """The statement itself, or the one of a per-dialect mapping for `dialect_name`."""
    if isinstance(statement, Mapping):
        return statement["postgresql" if dialect_name == "postgresql" else "sqlite"]
    return statement


def _compile(statement: sa.Executable, dialect: sa.Dialect) -> _Compiled:
    key = (id(statement), dialect.name)
    known = _compiled.get(key)
    if known is not None and known[0] is statement:
        return known[1]
    result = statement.compile(dialect=dialect)  # type: ignore[attr-defined]  # sa.Executable declares no compile(); all ours have it
    names = tuple(result.positiontup or ())
    binds = {name: result.binds[name] for name in names}
    compiled = _Compiled(
        sql=result.string,
        names=names,
        # The dialect's own conversion (SQLite stores datetimes as text in its format).
        processors={name: _processor(bind.type, dialect) for name, bind in binds.items()},
        literals={name: bind.value for name, bind in binds.items() if bind.value is not None},
    )
    _compiled[key] = (statement, compiled)
    return compiled


def insert_statement(
    table: sa.Table, *, generated: tuple[str, ...] = (), prefix: str = ""
) -> sa.Insert:
    """An INSERT of every column of `table` but the `generated` ones (e.g. an autoincrement
    id), as parameters named after the columns (after `prefix`, for a statement that binds
    other parameters of those names too): a constant to run with fetch_rows."""
    return sa.insert(table).values(
        {
            c.name: sa.bindparam(prefix + c.name, type_=c.type)
            for c in table.c
            if c.name not in generated
        }
    )


async def fetch_rows(
    session: AsyncSession, statement: Statement, params: Mapping[str, Any]
) -> Sequence[Sequence[Any]]:
    """Execute `statement` (a module-level constant) with `params` in the session's
    transaction; return its rows (RETURNING's, for a write; none for a plain write)."""
    return await _run(session, statement, [params], many=False)


async def fetch_on(
    driver: Any, dialect: sa.Dialect, statement: Statement, params: Mapping[str, Any]
) -> Sequence[Sequence[Any]]:
    """Run `statement` (a module-level constant) on a PostgreSQL driver (asyncpg) connection
    outside any transaction of ours: one round trip — for a write, an implicit transaction,
    committed when it answers."""
    compiled = _compile(_for_dialect(statement, dialect.name), dialect)
    return list(await driver.fetch(compiled.sql, *compiled.arguments(params)))


async def read_rows(
    engine: AsyncEngine, statement: Statement, params: Mapping[str, Any]
) -> Sequence[Sequence[Any]]:
    """Run one read-only `statement` (a module-level constant) on a pooled connection outside
    any transaction: no session, no BEGIN and no ROLLBACK; one hand-off to aiosqlite's thread
    or one round trip to PostgreSQL (a single statement reads one snapshot either way). The
    connection goes back to the pool as it came: nothing was begun on it."""
    async with engine.connect() as connection:
        dialect = connection.dialect
        raw = await connection.get_raw_connection()
        driver: Any = raw.driver_connection
        if dialect.name == "sqlite":
            compiled = _compile(_for_dialect(statement, dialect.name), dialect)
            return list(await driver.execute_fetchall(compiled.sql, compiled.arguments(params)))
        try:
            return await fetch_on(driver, dialect, statement, params)
        except Exception as error:
            if isinstance(error, CONNECTION_LOST):
                await connection.invalidate()
                raise ConnectionError("the database connection was lost") from error
            raise


class HotReads:
    """Single read-only statements of hot paths (GET /key), at the least cost each database
    allows: on PostgreSQL `read_rows` (one round trip); on SQLite a read-only connection of
    its own, used on the event loop's thread. A single-statement read of a few primary-key
    rows takes SQLite a few microseconds, while handing it to aiosqlite's thread and back
    costs several times that in CPU and, on a busy machine, far more in waiting — and
    queues behind every write on the one pooled connection. WAL readers neither wait for
    writers nor block them, and each statement reads the newest committed state (other
    processes' too). The connection never waits for a lock (timeout 0): if SQLite is busy
    (a rare recovery or exclusive lock) the read goes through the pool instead, so the loop
    is never blocked longer than the statement itself."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._sqlite_path = sqlite_file(engine)
        self._sqlite: sqlite3.Connection | None = None

    def _connection(self) -> sqlite3.Connection:
        if self._sqlite is None:
            assert self._sqlite_path is not None
            connection = sqlite3.connect(self._sqlite_path, timeout=0, isolation_level=None)
            connection.execute("PRAGMA query_only=1")
            self._sqlite = connection
        return self._sqlite

    async def rows(
        self, statement: Statement, params: Mapping[str, Any]
    ) -> Sequence[Sequence[Any]]:
        if self._sqlite_path is not None:
            compiled = _compile(_for_dialect(statement, "sqlite"), self._engine.dialect)
            try:
                return (
                    self._connection().execute(compiled.sql, compiled.arguments(params)).fetchall()
                )
            except sqlite3.OperationalError as error:
                if not _is_busy(error):
                    raise
        return await read_rows(self._engine, statement, params)

    def close(self) -> None:
        if self._sqlite is not None:
            self._sqlite.close()
            self._sqlite = None


async def execute_many(
    session: AsyncSession, statement: Statement, rows: Sequence[Mapping[str, Any]]
) -> None:
    """Execute `statement` (a module-level constant, no RETURNING) once per row of
    parameters, in one hand-off or round trip, in the session's transaction."""
    await _run(session, statement, rows, many=True)


async def _run(
    session: AsyncSession,
    statement: Statement,
    rows: Sequence[Mapping[str, Any]],
    *,
    many: bool,
) -> Sequence[Sequence[Any]]:
    inline = _inline(session)
    if inline is not None:  # a unit of the group-commit writer on SQLite: no hand-off
        return inline.run(statement, rows, many=many)
    connection = await session.connection()
    dialect = connection.dialect
    statement = _for_dialect(statement, dialect.name)
    raw = await connection.get_raw_connection()
    driver: Any = raw.driver_connection
    if dialect.name == "sqlite":
        compiled = _compile(statement, dialect)
        if many:
            await driver.executemany(compiled.sql, [compiled.arguments(r) for r in rows])
            return []
        return list(await driver.execute_fetchall(compiled.sql, compiled.arguments(rows[0])))
    if dialect.name == "postgresql" and driver.is_in_transaction():
        compiled = _compile(statement, dialect)
        try:
            if many:
                await driver.executemany(compiled.sql, [compiled.arguments(r) for r in rows])
                return []
            return list(await driver.fetch(compiled.sql, *compiled.arguments(rows[0])))
        except Exception as error:
            if isinstance(error, CONNECTION_LOST):
                # What SQLAlchemy does for its own statements: drop the connection, and
                # report the database as unreachable (a 503), not as a bug.
                await connection.invalidate()
                raise ConnectionError("the database connection was lost") from error
            raise
    # No transaction begun yet on asyncpg: SQLAlchemy's connection begins it, then runs the
    # statement as compiled here. Not `session.exec(statement)`: that compiles it again, on
    # every call for a statement SQLAlchemy cannot cache (a multi-row INSERT).
    compiled = _compile(statement, dialect)
    if many:
        await connection.exec_driver_sql(compiled.sql, [tuple(compiled.arguments(r)) for r in rows])
        return []
    result = await connection.exec_driver_sql(compiled.sql, tuple(compiled.arguments(rows[0])))
    return list(result.all()) if result.returns_rows else []


# The group-commit writer's transaction control (server/db/writer.py): one transaction per
# batch, a savepoint per caller's unit, on the batch session's own connection — or, on a
# SQLite file, on the writer's own sqlite3 connection (`InlineSqlite`), which the batch's
# session carries in its info under INLINE_SQLITE.

INLINE_SQLITE = "gateway.inline_sqlite"

# How many rows the writer may change between two checkpoints of its WAL (see InlineSqlite):
# about 80 transcriptions (12 rows each), roughly the 1,000 pages after which SQLite itself
# would checkpoint.
CHECKPOINT_AFTER_CHANGES = 1_000
# How far the WAL may grow past the last checkpoint that copied all of it (in changed rows,
# as CHECKPOINT_AFTER_CHANGES counts them) before the writer stops checkpointing beside its
# batches and checkpoints between two of them instead (see InlineSqlite): four checkpoints'
# worth, a few MiB by default.
WAL_BOUND_CHECKPOINTS = 4
# The WAL file's size past which a checkpoint beside the batches ends with a TRUNCATE one:
# commits of other processes (`gateway up --workers N`) are not seen by this process's
# count of changed rows, and checkpoints racing several steady writers never catch up.
WAL_FILE_BOUND_BYTES = 64 * 1024 * 1024
# How long that TRUNCATE checkpoint may wait for the write lock and for readers (it holds
# new writers off while it copies what is left and empties the file: a short stall).
TRUNCATE_BUSY_TIMEOUT_MS = 5_000
# A checkpoint that ended short is followed by another at the first COMMIT this long after it
# (not at once: under a steady load every COMMIT would start one, each with its fsyncs).
CATCH_UP_AFTER_SECONDS = 0.02


# How long a transaction of the pool's connection may find the write lock taken by batch
# after batch before the next batch waits for it: SQLite's busy handler retries only every
# few milliseconds, so a steady writer could otherwise keep it waiting through batch after
# batch.
POOL_FAIRNESS_SECONDS = 0.002


def _is_busy(error: sqlite3.OperationalError) -> bool:
    """SQLite refused for a lock another connection holds (whatever the wording)."""
    message = str(error)
    return (
        getattr(error, "sqlite_errorcode", None) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
        or "locked" in message
        or "busy" in message
    )


def _checkpoint(connection: sqlite3.Connection, mode: str = "PASSIVE") -> tuple[int, int, int]:
    """A checkpoint (in a thread); PASSIVE copies what no reader still needs and waits for
    nobody. (busy, the WAL's frames, the frames copied)."""
    ((busy, frames, checkpointed),) = connection.execute(
        f"PRAGMA wal_checkpoint({mode})"
    ).fetchall()
    return int(busy), int(frames), int(checkpointed)


class Bounded(NamedTuple):
    """What `_checkpoint_bounded` did: the last checkpoint's (busy, the WAL's frames, the
    frames copied), and how long its TRUNCATE checkpoint took (None: none was needed)."""

    busy: int
    frames: int
    checkpointed: int
    truncate_seconds: float | None


def _checkpoint_bounded(connection: sqlite3.Connection, wal_path: str, bound_bytes: int) -> Bounded:
    """A PASSIVE checkpoint beside the batches (in a thread); if the WAL file is still past
    `bound_bytes`, a TRUNCATE one after it: it waits (up to TRUNCATE_BUSY_TIMEOUT_MS) for
    the writers of every process and for readers, copies what is left and empties the
    file, so that the WAL stays bounded whoever writes to it. Every process's writers wait
    while it runs: its length is what InlineStats (and the writer's metrics) report."""
    result = _checkpoint(connection)
    try:
        size = os.path.getsize(wal_path)
    except OSError:
        return Bounded(*result, None)
    if size <= bound_bytes:
        return Bounded(*result, None)
    connection.execute(f"PRAGMA busy_timeout={TRUNCATE_BUSY_TIMEOUT_MS}")
    started = time.perf_counter()
    try:
        truncated = _checkpoint(connection, "TRUNCATE")
    finally:
        connection.execute("PRAGMA busy_timeout=0")
    return Bounded(*truncated, time.perf_counter() - started)


@dataclass
class InlineStats:
    """What the writer's connection waited for, for tests and benchmarks."""

    begins: int = 0
    pool_waits: int = 0  # BEGIN IMMEDIATE found the lock held by this process's pool
    busy_waits: int = 0  # ... held elsewhere (another process): waited in a thread
    busy_wait_seconds: float = 0.0
    checkpoints: int = 0
    checkpoints_between_batches: int = 0  # the WAL past its bound: the writer waited for it
    checkpoint_seconds: float = 0.0
    checkpointed_frames: int = 0
    # TRUNCATE checkpoints (the WAL file past WAL_FILE_BOUND_BYTES): every process's writers
    # wait while one runs.
    truncations: int = 0
    truncation_seconds: float = 0.0
    longest_truncation_seconds: float = 0.0


class InlineSqlite:
    """The group-commit writer's own connection to a SQLite file, used on the event loop's
    thread: a batch's statements cost SQLite's own few microseconds each instead of a
    hand-off to aiosqlite's thread and back (figures: docs/performance.md). The loop never
    sleeps in SQLite:

    - The batch takes the write lock with BEGIN IMMEDIATE at busy timeout 0. When this
      process's pool holds it, the batch waits on the loop for the pool's transaction to
      end (engine.py's PoolWrites) and tries again; when another process holds it, a thread
      waits for it with the pool's busy timeout. The loop goes on meanwhile. Once the lock
      is held no statement of the batch can wait: WAL readers never block a writer.
    - COMMIT runs inline. In WAL mode with synchronous=NORMAL a commit appends the batch's
      pages to the WAL with no fsync, cheaper than the hand-off a thread would cost
      (figures: docs/performance.md). What can take milliseconds is the
      automatic checkpoint SQLite runs inside a commit once the WAL passes 1000 pages (it
      copies pages into the database and fsyncs both files: its tail latency, measured, is
      in docs/performance.md). So this connection has wal_autocheckpoint=0, and once the
      batches changed CHECKPOINT_AFTER_CHANGES rows a COMMIT starts a PASSIVE checkpoint on
      a connection of its own, in a thread (`_start_checkpoint`): the batches go on
      meanwhile (a WAL checkpointer and a writer do not wait for each other), so no request
      waits for the copy and its fsync. SQLite restarts the WAL from its beginning only at
      a write that begins when a checkpoint had copied all of it; commits that land while a
      checkpoint runs leave it short, so a checkpoint that ended short is followed by
      another at the first COMMIT CATCH_UP_AFTER_SECONDS later: a short one, that needs
      little time and ends between two batches. A writer that never pauses long enough
      would still grow the WAL without end (a checkpoint racing a steady writer never
      catches up: figures in docs/performance.md): once the batches changed
      WAL_BOUND_CHECKPOINTS times CHECKPOINT_AFTER_CHANGES rows since the last checkpoint
      that copied all of the WAL, `checkpoint_if_due` checkpoints between two batches
      instead, with the writer's own connection, and units queued meanwhile wait for the
      next batch, as they wait for a commit. Other processes' commits (`--workers N`) are
      not in that count: a checkpoint beside the batches that leaves the WAL file past
      WAL_FILE_BOUND_BYTES ends with a TRUNCATE one, which holds every process's writers
      off while it copies what is left and empties the file (a short stall, only then).

    The pool's aiosqlite connection still writes too (workers' claims, management writes,
    a failed request's release); it waits for this one in SQLite's busy handler on
    aiosqlite's thread, and once it has waited POOL_FAIRNESS_SECONDS the next batch lets
    it go first."""

    def __init__(
        self,
        path: str,
        dialect: sa.Dialect,
        *,
        pool: PoolWrites | None = None,
        busy_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS,
        checkpoint_after_changes: int = CHECKPOINT_AFTER_CHANGES,
    ) -> None:
        self._path = path
        self._dialect = dialect
        self._pool = pool
        self._busy_timeout_ms = busy_timeout_ms
        self.checkpoint_after_changes = checkpoint_after_changes
        self.wal_file_bound = WAL_FILE_BOUND_BYTES
        self._connection: sqlite3.Connection | None = None
        self._changes_at_checkpoint = 0
        # The checkpoint running beside the batches, on `_checkpointer` (one at a time).
        self._beside: asyncio.Future[Bounded] | None = None
        self._checkpointer: sqlite3.Connection | None = None
        self._short = False  # the last checkpoint left frames committed while it ran
        # total_changes when the last checkpoint that copied the whole WAL began.
        self._complete_at = 0
        self._ended_at = 0.0  # (perf_counter) when the last checkpoint ended
        # A thread using the connection (a lock wait, a checkpoint): while it runs, the loop
        # must not touch the connection, even when the batch that started it was cancelled.
        self._thread: asyncio.Future[Any] | None = None
        self._epoch = 0  # bumped whenever the connection is handed to a thread or taken back
        self.stats = InlineStats()

    @property
    def connection(self) -> sqlite3.Connection:
        if self._connection is None:
            connection = connect_sqlite(self._path, cached_statements=512)
            connection.execute("PRAGMA wal_autocheckpoint=0")
            # A unit's savepoint journals the original of each page it changes (the
            # sub-journal), by default in a temporary file: in memory instead, which with
            # `next_unit`'s one savepoint at a time costs a batch less CPU (figures:
            # docs/performance.md).
            connection.execute("PRAGMA temp_store=MEMORY")
            self._connection = connection
        return self._connection

    def run(
        self, statement: Statement, rows: Sequence[Mapping[str, Any]], *, many: bool
    ) -> Sequence[Sequence[Any]]:
        compiled = _compile(_for_dialect(statement, "sqlite"), self._dialect)
        if many:
            self.connection.executemany(compiled.sql, [compiled.arguments(r) for r in rows])
            return []
        return self.connection.execute(compiled.sql, compiled.arguments(rows[0])).fetchall()

    def execute(self, sql: str) -> None:
        self.connection.execute(sql)

    async def begin(self) -> None:
        """BEGIN IMMEDIATE: the write lock, without sleeping on the loop."""
        await self._thread_done()
        connection = self.connection
        self._epoch += 1
        self.stats.begins += 1
        deadline = time.monotonic() + self._busy_timeout_ms / 1000
        started = time.perf_counter()
        if self._pool is not None and self._pool.starved(POOL_FAIRNESS_SECONDS):
            # The pool's transaction has been waiting for the lock (in SQLite's busy handler,
            # which retries only every few ms) through batch after batch: let it have it.
            self.stats.pool_waits += 1
            await self._pool.ended(at_most=0.05)
        while True:
            try:
                connection.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as error:
                if not _is_busy(error) or time.monotonic() > deadline:
                    raise
            if self._pool is not None and self._pool.writing():
                # This process's pool holds the lock: its COMMIT or ROLLBACK wakes this
                # wait, with no sleep in SQLite's busy handler.
                self.stats.pool_waits += 1
                try:
                    await self._pool.ended(at_most=0.05)
                finally:
                    self.stats.busy_wait_seconds += time.perf_counter() - started
                    started = time.perf_counter()
                continue
            # Another process: SQLite's busy handler, in a thread.
            self.stats.busy_waits += 1
            try:
                await self._in_thread(self._begin_waiting)
            finally:
                self.stats.busy_wait_seconds += time.perf_counter() - started
            return

    def begin_at_once(self) -> bool:
        """BEGIN IMMEDIATE now, without a turn of the loop; False (nothing begun) when that
        could mean waiting: a thread has the connection, a checkpoint is due, this
        process's pool holds the write lock, or another process does (busy). `begin` and
        the writer's task then take over."""
        thread = self._thread
        if thread is not None or self.checkpoint_due():
            return False  # (a checkpoint between batches: the WAL is past its bound)
        if self._pool is not None and self._pool.writing():
            return False
        connection = self.connection
        try:
            connection.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as error:
            if _is_busy(error):
                return False
            raise
        self._epoch += 1
        self.stats.begins += 1
        return True

    def _begin_waiting(self) -> None:
        connection = self.connection
        connection.execute(f"PRAGMA busy_timeout={self._busy_timeout_ms}")
        try:
            connection.execute("BEGIN IMMEDIATE")
        finally:
            connection.execute("PRAGMA busy_timeout=0")

    def commit(self) -> None:
        self.connection.execute("COMMIT")
        self._start_checkpoint()

    def rollback(self) -> None:
        """End the batch's transaction if it is still open (a failure, a cancellation). A
        thread still using the connection (a cancelled lock wait) ends it once it is done,
        unless the connection was used again meanwhile."""
        thread = self._thread
        if thread is not None and not thread.done():
            epoch = self._epoch
            thread.add_done_callback(lambda _: self._rollback_abandoned(epoch))
            return
        connection = self._connection
        if connection is not None and connection.in_transaction:
            connection.execute("ROLLBACK")

    def _rollback_abandoned(self, epoch: int) -> None:
        if epoch == self._epoch:
            self.rollback()

    async def checkpoint_if_due(self) -> None:
        """Between batches, only once the WAL is past its bound (the class docstring): the
        checkpoint beside the batches ends first, then a PASSIVE one runs in a thread on
        this connection, with no batch alongside it, so it copies the whole WAL."""
        await self._thread_done()  # (reading the connection would wait for the thread's)
        if not self.checkpoint_due():
            return
        await self._beside_done()
        began_at = self._changes_at_checkpoint = self.connection.total_changes
        started = time.perf_counter()
        try:
            result = await self._in_thread(functools.partial(_checkpoint, self.connection))
            self._record(result, began_at)
        finally:
            self._checkpoint_ended(started)
            self.stats.checkpoints_between_batches += 1

    def checkpoint_due(self) -> bool:
        """A checkpoint between batches is due: the WAL may be past its bound (the batches
        changed WAL_BOUND_CHECKPOINTS times CHECKPOINT_AFTER_CHANGES rows since the last
        checkpoint that copied all of it began)."""
        changes = self.connection.total_changes - self._complete_at
        return changes > WAL_BOUND_CHECKPOINTS * self.checkpoint_after_changes

    def _start_checkpoint(self) -> None:
        """After a COMMIT: a PASSIVE checkpoint beside the batches, on the checkpointer's
        own connection in a thread, once the batches changed CHECKPOINT_AFTER_CHANGES rows
        since the last one began, or at once when the last one ended short."""
        if self._beside is not None:
            return
        changes = self.connection.total_changes - self._changes_at_checkpoint
        if changes < self.checkpoint_after_changes and not (
            self._short and time.perf_counter() - self._ended_at >= CATCH_UP_AFTER_SECONDS
        ):
            return
        began_at = self._changes_at_checkpoint = self.connection.total_changes
        if self._checkpointer is None:
            self._checkpointer = connect_sqlite(self._path)
        beside = asyncio.ensure_future(
            asyncio.to_thread(
                _checkpoint_bounded, self._checkpointer, f"{self._path}-wal", self.wal_file_bound
            )
        )
        self._beside = beside
        started = time.perf_counter()

        def ended(done: asyncio.Future[Bounded]) -> None:
            self._beside = None
            self._checkpoint_ended(started)
            if done.cancelled():
                return
            error = done.exception()
            if error is not None:
                log.warning("WAL checkpoint failed: %r", error)
                return
            bounded = done.result()
            if bounded.truncate_seconds is not None:
                stats = self.stats
                stats.truncations += 1
                stats.truncation_seconds += bounded.truncate_seconds
                stats.longest_truncation_seconds = max(
                    stats.longest_truncation_seconds, bounded.truncate_seconds
                )
            self._record(bounded[:3], began_at)

        beside.add_done_callback(ended)

    def _checkpoint_ended(self, started: float) -> None:
        """Count a checkpoint (either kind) that began at `started` (perf_counter) and ended
        now."""
        self._ended_at = time.perf_counter()
        self.stats.checkpoints += 1
        self.stats.checkpoint_seconds += self._ended_at - started

    async def _beside_done(self) -> None:
        """Wait for the checkpoint beside the batches, if one runs (a failure of it is
        logged by its own callback)."""
        beside = self._beside
        if beside is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(beside)

    def _record(self, result: tuple[int, int, int], began_at: int) -> None:
        """What a checkpoint that began at `began_at` (total_changes) found: (busy, the
        WAL's frames, the frames it copied). A PASSIVE checkpoint copies the WAL as it was
        when it began: it has copied all of it only if it copied every frame it saw and no
        batch committed while it ran."""
        busy, frames, checkpointed = result
        self.stats.checkpointed_frames += max(0, checkpointed)
        connection = self._connection  # (None: closed meanwhile)
        committed_meanwhile = connection is None or connection.total_changes != began_at
        self._short = bool(busy) or checkpointed < frames or committed_meanwhile
        if not self._short:
            self._complete_at = began_at

    async def _in_thread(self, work: Callable[[], T]) -> T:
        # Shielded: a cancelled caller leaves the thread running (it cannot be stopped);
        # `_thread` keeps the loop off the connection until it ends.
        self._epoch += 1
        thread = asyncio.ensure_future(asyncio.to_thread(work))
        self._thread = thread
        result = await asyncio.shield(thread)
        self._thread = None
        return result

    async def _thread_done(self) -> None:
        """Wait for a thread that a cancelled caller left using the connection, and end
        what it began (nobody will commit it)."""
        thread = self._thread
        if thread is None:
            return
        if not thread.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(thread)
        self._thread = None
        self._epoch += 1
        self.rollback()

    async def close(self) -> None:
        await self._thread_done()
        await self._beside_done()
        if self._checkpointer is not None:
            self._checkpointer.close()
            self._checkpointer = None
        if self._connection is not None:
            self.rollback()
            self._connection.close()
            self._connection = None


def _inline(session: AsyncSession) -> InlineSqlite | None:
    inline: InlineSqlite | None = session.info.get(INLINE_SQLITE)
    return inline


async def _driver_of(session: AsyncSession) -> tuple[str, Any]:
    connection = await session.connection()
    raw = await connection.get_raw_connection()
    return connection.dialect.name, raw.driver_connection


# session.info key of the writer's batch session: the accounts whose hold lock the batch's
# transaction already has (server/billing/holds.py locks each once per batch). Cleared when
# a unit is rolled back, since that gives back what the unit locked.
LOCKED_IN_BATCH = "gateway.locked_in_batch"


async def begin_batch(session: AsyncSession) -> None:
    """Begin the batch's transaction. SQLite: BEGIN IMMEDIATE, so the savepoints nest in it
    (Python's sqlite3 begins no transaction before a SAVEPOINT, and a SAVEPOINT outside one
    would become the transaction: its RELEASE would commit) and the write lock is taken
    before the first unit reads. PostgreSQL: begun by the first unit's savepoint."""
    session.info[LOCKED_IN_BATCH] = set()
    inline = _inline(session)
    if inline is not None:
        await inline.begin()
        return
    dialect, driver = await _driver_of(session)
    if dialect == "sqlite":
        await driver.execute_fetchall("BEGIN IMMEDIATE")


def begin_batch_at_once(session: AsyncSession) -> bool:
    """Begin the batch's transaction on the writer's own SQLite connection at once (no turn
    of the loop), or return False, having begun nothing, when that could wait
    (InlineSqlite.begin_at_once)."""
    inline = _inline(session)
    if inline is None or not inline.begin_at_once():
        return False
    session.info[LOCKED_IN_BATCH] = set()
    return True


async def next_unit(session: AsyncSession, index: int) -> None:
    """Mark the start of unit `index` of the batch (a savepoint to roll back to). A unit
    that succeeded needs nothing more: its savepoint ends with the next one or the commit."""
    inline = _inline(session)
    if inline is not None:
        # One savepoint at a time, not nested ones: under nested savepoints each unit
        # journals again the pages the units before it changed, and the sub-journal grows
        # to the commit, so a batch's later units run slower than its first (figures:
        # docs/performance.md); releasing the open one empties it.
        if index:
            inline.execute("RELEASE u")
        inline.execute("SAVEPOINT u")
        return
    connection = await session.connection()
    if connection.dialect.name == "sqlite":
        # Nested and never released (the COMMIT ends them all): one statement per unit.
        _, driver = await _driver_of(session)
        await driver.execute_fetchall(f"SAVEPOINT u{index}")
    elif index == 0:
        # Through SQLAlchemy, which begins the transaction first.
        await connection.exec_driver_sql("SAVEPOINT u")
    else:
        # The previous unit's savepoint ends and this one's starts in one round trip.
        _, driver = await _driver_of(session)
        await driver.execute("RELEASE SAVEPOINT u; SAVEPOINT u")


async def rollback_unit(session: AsyncSession, index: int) -> None:
    """Undo what unit `index` wrote; the units before it keep theirs."""
    session.info.get(LOCKED_IN_BATCH, set()).clear()
    inline = _inline(session)
    if inline is not None:
        inline.execute("ROLLBACK TO u")
        return
    dialect, driver = await _driver_of(session)
    if dialect == "sqlite":
        await driver.execute_fetchall(f"ROLLBACK TO u{index}")
    else:
        await driver.execute("ROLLBACK TO SAVEPOINT u")


async def commit_batch(session: AsyncSession) -> None:
    """Commit the batch's transaction."""
    inline = _inline(session)
    if inline is not None:
        inline.commit()
    else:
        await session.commit()


async def rollback_batch(session: AsyncSession) -> None:
    """Roll the whole batch back."""
    inline = _inline(session)
    if inline is not None:
        inline.rollback()
    else:
        await session.rollback()
