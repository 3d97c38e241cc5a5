"""The principal stamp: when a process may keep using what it cached about its callers.

A process caches each caller's key, workspace, account and guardrails (server/auth.py,
server/guardrails/cache.py) and the workspace's sealed BYOK keys (server/byok/cache.py), so
that a request needs no database read to know who calls and what it may use. The cache is
only as good as its invalidation, in two places:

- Other processes (other server processes, the CLI, SQL typed by an operator): triggers
  (migrations 0011 and 0012) bump `principal_stamp.version` in the same transaction as any
  change to a key, workspace, account, guardrail or BYOK key. A process reads the version
  at most once per `interval` (one second) and drops everything when it moved. A request
  that finds the last read older than the interval waits for a fresh one (concurrent
  requests share it), so a request never uses what was cached before a change committed
  more than `interval` ago: a key disabled or deleted anywhere is refused everywhere
  within that second.
- This process: `watch(engine, stamp)` sees every statement that goes through SQLAlchemy on
  the engine (the ORM, the management API, the CLI's own process); one that changes those
  tables marks its connection, and its commit drops the caches at once (and again when the
  connection returns to the pool, after the commit has landed, so a load that raced the
  commit cannot survive it).

A load that started before a drop is not stored (`generation`), so a cache never keeps what
was read before a change it has already heard of.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import MutableMapping
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlmodel.ext.asyncio.session import AsyncSession

from server.clock import Clock
from server.db.driver import fetch_rows
from server.db.models import PrincipalStamp as _StampRow

CHECK_INTERVAL = timedelta(seconds=1)

_STAMP = _StampRow.__table__
# 0 when the row is missing (a table emptied by hand; the triggers' upsert recreates it).
STAMP_VERSION = sa.func.coalesce(
    sa.select(_STAMP.c.version).where(_STAMP.c.id == 1).scalar_subquery(), 0
)
_READ_STAMP = sa.select(STAMP_VERSION.label("version"))

# What migrations 0011 and 0012's triggers watch, by table: the statements that change it and, for
# UPDATE, the columns whose change alone alters nothing a cache holds.
WATCHED: dict[str, frozenset[str]] = {
    "api_keys": frozenset({"UPDATE", "DELETE"}),
    "workspaces": frozenset({"UPDATE", "DELETE"}),
    "accounts": frozenset({"UPDATE", "DELETE"}),
    "guardrails": frozenset({"INSERT", "UPDATE", "DELETE"}),
    "guardrail_key_assignments": frozenset({"INSERT", "UPDATE", "DELETE"}),
    # Migration 0012: a workspace's BYOK keys (server/byok/cache.py) and the data keys
    # that wrap them (a new one is only made before its first key is sealed).
    "byok_keys": frozenset({"INSERT", "UPDATE", "DELETE"}),
    "vault_keys": frozenset({"UPDATE", "DELETE"}),
}
UNWATCHED_COLUMNS: dict[str, frozenset[str]] = {
    "api_keys": frozenset({"last_used_at"}),
    "accounts": frozenset({"lock_version"}),
}
_DML = re.compile(r"\s*(UPDATE|DELETE\s+FROM|INSERT\s+INTO)\s+\"?(\w+)\"?", re.IGNORECASE)
_SET_COLUMN = re.compile(r"(?:^|,)\s*\"?(\w+)\"?\s*=")
_WHERE = re.compile(r"\sWHERE\s|\sRETURNING\s", re.IGNORECASE)

_CHANGED = "principal_stamp.changed"  # on a connection: it ran a watched change
_COMMITTED = "principal_stamp.committed"  # and committed it: drop again at check-in


def changes_principals(statement: str) -> bool:
    """Whether an SQL statement (as SQLAlchemy compiles it) changes what the stamp covers."""
    match = _DML.match(statement)
    if match is None:
        return False
    kind = match.group(1).split()[0].upper()
    table = match.group(2).lower()
    if kind not in WATCHED.get(table, frozenset()):
        return False
    unwatched = UNWATCHED_COLUMNS.get(table)
    if kind != "UPDATE" or not unwatched:
        return True
    rest = statement[match.end() :]
    set_start = rest.upper().find("SET")
    if set_start < 0:
        return True
    set_clause = rest[set_start + 3 :]
    end = _WHERE.search(set_clause)
    if end is not None:
        set_clause = set_clause[: end.start()]
    columns = {c.lower() for c in _SET_COLUMN.findall(set_clause.strip())}
    return not columns or not columns <= unwatched


class PrincipalStampView:
    """One process's view of the stamp, and the caches it keeps honest."""

    def __init__(self, clock: Clock, interval: timedelta = CHECK_INTERVAL) -> None:
        self._clock = clock
        self._interval = interval
        self._version: int | None = None
        self._checked_at: datetime | None = None  # when the last read began
        self._pending: asyncio.Future[None] | None = None
        self._caches: list[MutableMapping[Any, Any]] = []
        self.generation = 0  # moves on every drop; a load that straddles one is not kept

    def register(self, cache: MutableMapping[Any, Any]) -> None:
        """Clear `cache` whenever the stamp moves or this process changes a principal."""
        self._caches.append(cache)

    def invalidate(self) -> None:
        """Drop every cache now, and read the stamp again before the next use."""
        for cache in self._caches:
            cache.clear()
        self.generation += 1
        self._checked_at = None

    def due(self) -> bool:
        if self._checked_at is None:
            return True
        age = self._clock.now() - self._checked_at
        return age >= self._interval or age < timedelta(0)  # a clock set back: read again

    def observe(self, version: int, read_at: datetime) -> bool:
        """Record a version read by a statement that began at `read_at`; True when it moved
        (the caches were dropped). Any difference counts, a lower one too (the table was
        emptied by hand): at worst a spurious drop, never a missed one."""
        moved = version != self._version
        if moved:
            self._version = version
            self.invalidate()
        if self._checked_at is None or read_at > self._checked_at:
            self._checked_at = read_at
        return moved

    async def check(self, session: AsyncSession) -> None:
        """Make the caches valid for a request starting now: read the stamp when the last
        read began `interval` ago or more. Requests that arrive while a read is under way
        wait for it rather than read again — unless their session already holds a
        connection: waiting while holding one could wait for ever on a read that needs it
        (SQLite's one pooled connection), so such a request reads for itself."""
        while self.due():
            pending = self._pending
            if pending is not None and not session.in_transaction():
                # Then look again: the read may have failed, or gone with its request.
                await asyncio.shield(pending)
                continue
            mine = pending is None
            if mine:
                pending = self._pending = asyncio.get_running_loop().create_future()
            try:
                read_at = self._clock.now()
                ((version,),) = await fetch_rows(session, _READ_STAMP, {})
                self.observe(int(version), read_at)
            finally:
                if mine:
                    self._pending = None
                    assert pending is not None
                    pending.set_result(None)
            return


def watch(engine: AsyncEngine, stamp: PrincipalStampView) -> None:
    """Drop `stamp`'s caches as soon as this process commits a change to a principal
    through `engine` (statements run on the raw driver connection are the hot path's own:
    counters, holds, windows, `last_used_at`; none is a principal change)."""
    sync_engine = engine.sync_engine

    def before_cursor_execute(
        conn: sa.Connection,
        _cursor: Any,
        statement: str,
        _parameters: Any,
        _context: Any,
        _executemany: bool,
    ) -> None:
        if changes_principals(statement):
            conn.info[_CHANGED] = True

    def commit(conn: sa.Connection) -> None:
        if conn.info.pop(_CHANGED, False):
            conn.info[_COMMITTED] = True
            stamp.invalidate()

    def rollback(conn: sa.Connection) -> None:
        conn.info.pop(_CHANGED, None)

    def checkin(_dbapi_connection: Any, record: Any) -> None:
        if record is not None and record.info.pop(_COMMITTED, False):
            stamp.invalidate()

    sa.event.listen(sync_engine, "before_cursor_execute", before_cursor_execute)
    sa.event.listen(sync_engine, "commit", commit)
    sa.event.listen(sync_engine, "rollback", rollback)
    sa.event.listen(sync_engine, "checkin", checkin)
