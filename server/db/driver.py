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

import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlmodel.ext.asyncio.session import AsyncSession

# Raised by asyncpg when the connection or the server went away.
_CONNECTION_LOST = (asyncpg.InterfaceError, asyncpg.PostgresConnectionError, OSError)


@dataclass(frozen=True)
class _Compiled:
    sql: str
    names: tuple[str, ...]  # parameter names in positional order
    processors: Mapping[str, Callable[[Any], Any] | None]
    literals: Mapping[str, Any]  # values bound in the statement itself (sa.literal, x + 1)

    def arguments(self, params: Mapping[str, Any]) -> list[Any]:
        values = []
        for name in self.names:
            value = params[name] if name in params else self.literals[name]
            processor = self.processors[name]
            values.append(value if processor is None else processor(value))
        return values


# A statement that differs by dialect (each dialect's INSERT … ON CONFLICT), by dialect name
# ("postgresql", "sqlite"); the driver picks the one of the session's database.
Statement = sa.Executable | Mapping[str, sa.Executable]

# Memo of compiled statements: they are module-level constants, so this stays small.
_compiled: dict[tuple[int, str], tuple[sa.Executable, _Compiled]] = {}


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
        processors={
            name: bind.type.dialect_impl(dialect).bind_processor(dialect)
            for name, bind in binds.items()
        },
        literals={name: bind.value for name, bind in binds.items() if bind.value is not None},
    )
    _compiled[key] = (statement, compiled)
    return compiled


def insert_statement(table: sa.Table, *, generated: tuple[str, ...] = ()) -> sa.Insert:
    """An INSERT of every column of `table` but the `generated` ones (e.g. an autoincrement
    id), as parameters named after the columns: a constant to run with fetch_rows."""
    return sa.insert(table).values(
        {c.name: sa.bindparam(c.name, type_=c.type) for c in table.c if c.name not in generated}
    )


async def fetch_rows(
    session: AsyncSession, statement: Statement, params: Mapping[str, Any]
) -> Sequence[Sequence[Any]]:
    """Execute `statement` (a module-level constant) with `params` in the session's
    transaction; return its rows (RETURNING's, for a write; none for a plain write)."""
    return await _run(session, statement, [params], many=False)


async def read_rows(
    engine: AsyncEngine, statement: Statement, params: Mapping[str, Any]
) -> Sequence[Sequence[Any]]:
    """Run one read-only `statement` (a module-level constant) on a pooled connection outside
    any transaction: no session, no BEGIN and no ROLLBACK; one hand-off to aiosqlite's thread
    or one round trip to PostgreSQL (a single statement reads one snapshot either way). The
    connection goes back to the pool as it came: nothing was begun on it."""
    async with engine.connect() as connection:
        dialect = connection.dialect
        if isinstance(statement, Mapping):
            statement = statement["postgresql" if dialect.name == "postgresql" else "sqlite"]
        compiled = _compile(statement, dialect)
        raw = await connection.get_raw_connection()
        driver: Any = raw.driver_connection
        if dialect.name == "sqlite":
            return list(await driver.execute_fetchall(compiled.sql, compiled.arguments(params)))
        try:
            return list(await driver.fetch(compiled.sql, *compiled.arguments(params)))
        except Exception as error:
            if isinstance(error, _CONNECTION_LOST):
                await connection.invalidate()
                raise ConnectionError("the database connection was lost") from error
            raise


class HotReads:
    """Single read-only statements of hot paths (GET /key), at the least cost each database
    allows: on PostgreSQL `read_rows` (one round trip); on SQLite a read-only connection of
    its own, used on the event loop's thread. A single-statement read of a few primary-key
    rows takes SQLite ~15 us, while handing it to aiosqlite's thread and back costs several
    times that in CPU and, on a busy machine, hundreds of microseconds of waiting — and
    queues behind every write on the one pooled connection. WAL readers neither wait for
    writers nor block them, and each statement reads the newest committed state (other
    processes' too). The connection never waits for a lock (timeout 0): if SQLite is busy
    (a rare recovery or exclusive lock) the read goes through the pool instead, so the loop
    is never blocked longer than the statement itself."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        url = engine.url
        database = url.database if url.get_backend_name() == "sqlite" else None
        self._sqlite_path = database if database and database != ":memory:" else None
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
            if isinstance(statement, Mapping):
                statement = statement["sqlite"]
            compiled = _compile(statement, self._engine.dialect)
            try:
                return (
                    self._connection().execute(compiled.sql, compiled.arguments(params)).fetchall()
                )
            except sqlite3.OperationalError as error:
                if "locked" not in str(error) and "busy" not in str(error):
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
    connection = await session.connection()
    dialect = connection.dialect
    if isinstance(statement, Mapping):
        statement = statement["postgresql" if dialect.name == "postgresql" else "sqlite"]
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
            if isinstance(error, _CONNECTION_LOST):
                # What SQLAlchemy does for its own statements: drop the connection, and
                # report the database as unreachable (a 503), not as a bug.
                await connection.invalidate()
                raise ConnectionError("the database connection was lost") from error
            raise
    # No transaction begun yet on asyncpg: SQLAlchemy's path begins it.
    params = list(rows) if many else rows[0]
    result = await session.exec(statement, params=params)  # type: ignore[call-overload]  # sqlmodel's exec() is typed for its own select() only
    return list(result.all()) if result.returns_rows else []
