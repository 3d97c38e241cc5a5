"""The `:free` count of a request whose whole admission it is, on PostgreSQL: one statement
(free_models.BOTH_OR_NEITHER) as an implicit transaction of its own — one round trip,
committed when it answers — on a connection of the gate's own, beside the group-commit
writer.

Why: under load the group-commit writer is busy all the time. A `:free` request was the
only one with two writer units (its count before the provider call, its settlement after),
and each unit's statement is a round trip that waits for the busy event loop: the counts
lengthened every batch and each request waited behind settlements twice, while the CPU it
used barely grew — the cost was waiting, not work. Here the count runs concurrently with
the writer and with other counts, at about a writer unit's CPU (a held asyncpg connection:
no pool checkout, no ping, no BEGIN or COMMIT round trip), and PostgreSQL commits it on its
own. The figures, before and after, are on the documentation's performance page.

What keeps the guarantees (as when the count was a writer unit):
- Exact: the statement's row locks (minute, then day: the order _GATES takes them) order it
  against every other count — the writer's, other processes' — and each window's cap is
  checked on its latest row under its lock.
- Nothing half-written: the statement counts both windows or neither (a full day fails it,
  taking the minute's count back); a refusal (429, 402) writes nothing. The request's
  admission is this count alone (admission.is_free_count_alone), so nothing after it in
  admission can refuse.
- Durable before the provider is called (synchronous_commit as configured, as for the
  writer's commits). A crash before the commit: PostgreSQL rolls it back, nothing counted and
  nothing served; after it: the request is counted and never served, as before — a crash
  never lets more requests through than the limits.
- A connection lost before the answer: ConnectionError (503), as for the writer's failed
  batch; the count may have been committed — counted and never served, never the reverse.
- A deadlock's victim (a writer batch holding the other window of a minute boundary) wrote
  nothing and is run again, like the writer's units (LOCK_RACE_RETRIES).

SQLite keeps the writer: it has one writer at a time, and its batches run on the event
loop's thread in microseconds.
"""

from __future__ import annotations

import asyncio
import collections
import functools
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import asyncpg
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.util.concurrency import await_only, in_greenlet

from server.db.driver import CONNECTION_LOST, Statement, fetch_on
from server.db.engine import CONNECT_TIMEOUT_SECONDS
from server.db.writer import LOCK_RACE_RETRIES, lost_a_lock_race
from server.errors import GatewayError
from server.limits.free_models import BOTH_OR_NEITHER, count_free_request

# The most connections the gate opens (one per count running at the same moment; a count
# is one round trip, so a few serve hundreds of requests a second).
MOST_CONNECTIONS = 4
# The driver's lost connections, and asyncpg's InternalClientError: on a connection of the
# gate's own, one whose server ended it before asyncpg read that.
_CONNECTION_LOST = (*CONNECTION_LOST, asyncpg.InternalClientError)
# What SQLAlchemy's asyncpg dialect takes from the URL for itself, not for asyncpg.connect.
_NOT_FOR_ASYNCPG = (
    "async_creator_fn",
    "prepared_statement_cache_size",
    "prepared_statement_name_func",
)


class FreeGate:
    """Counts `:free` requests on PostgreSQL on up to MOST_CONNECTIONS connections of its
    own, opened when needed; the engine's disposal closes them (they are opened anew if the
    engine is used after it)."""

    def __init__(self, engine: AsyncEngine, most: int = MOST_CONNECTIONS) -> None:
        if engine.dialect.name != "postgresql":
            raise ValueError("the free-model gate runs on PostgreSQL only")
        self._engine = engine
        self._most = most
        self._places = 0  # connections open or being opened
        self._idle: list[asyncpg.Connection] = []
        self._busy: set[asyncpg.Connection] = set()
        self._stale: set[asyncpg.Connection] = set()  # busy at the disposal: closed once back
        # Counts waiting for a connection: handed one, or None when a place is free.
        self._waiting: collections.deque[asyncio.Future[asyncpg.Connection | None]] = (
            collections.deque()
        )
        sa.event.listen(engine.sync_engine, "engine_disposed", self._disposed)

    async def count(
        self, *, account_id: str, credits_purchased_micros: int, exempt: bool, now: datetime
    ) -> None:
        """Count one `:free` request (free_models.count_free_request: 429, or 402 when the
        balance is not positive), committed when this returns."""
        for attempt in range(LOCK_RACE_RETRIES + 1):
            connection = await self._acquire()
            reusable = False  # a cancellation mid-statement leaves it in an unknown state
            try:
                await count_free_request(
                    functools.partial(self._rows, connection),
                    BOTH_OR_NEITHER,
                    account_id=account_id,
                    credits_purchased_micros=credits_purchased_micros,
                    exempt=exempt,
                    now=now,
                )
                reusable = True
                return
            except _CONNECTION_LOST as error:
                raise ConnectionError("the database connection was lost") from error
            except (GatewayError, asyncpg.PostgresError) as error:
                # A refusal, or a statement that failed whole: the connection is as it was.
                reusable = True
                if attempt == LOCK_RACE_RETRIES or not lost_a_lock_race(error):
                    raise
            finally:
                self._release(connection, reusable)

    async def _rows(
        self, connection: asyncpg.Connection, statement: Statement, params: Mapping[str, Any]
    ) -> Sequence[Sequence[Any]]:
        return await fetch_on(connection, self._engine.dialect, statement, params)

    async def _acquire(self) -> asyncpg.Connection:
        while True:
            if self._idle:
                connection = self._idle.pop()
                if connection.is_closed():  # the server ended it meanwhile (a restart)
                    self._places -= 1
                    continue
                self._busy.add(connection)
                return connection
            if self._places < self._most:
                self._places += 1
                try:
                    connection = await self._connect()
                except BaseException:
                    self._places -= 1
                    self._wake()
                    raise
                self._busy.add(connection)
                return connection
            waiter: asyncio.Future[asyncpg.Connection | None] = (
                asyncio.get_running_loop().create_future()
            )
            self._waiting.append(waiter)
            try:
                handed = await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    given = waiter.result()
                    if given is None:
                        self._wake()  # the free place goes to the next waiter
                    else:
                        self._release(given, reusable=True)
                raise
            if handed is not None:
                return handed  # still in _busy: handed over by _release

    async def _connect(self) -> asyncpg.Connection:
        engine = self._engine
        args, options = engine.dialect.create_connect_args(engine.url)
        for name in _NOT_FOR_ASYNCPG:
            options.pop(name, None)
        options.setdefault("timeout", CONNECT_TIMEOUT_SECONDS)
        try:
            return await asyncpg.connect(*args, **options)
        except _CONNECTION_LOST as error:
            raise ConnectionError("the database could not be reached") from error

    def _release(self, connection: asyncpg.Connection, reusable: bool) -> None:
        if not reusable or connection in self._stale or connection.is_closed():
            self._busy.discard(connection)
            self._stale.discard(connection)
            connection.terminate()
            self._places -= 1
            self._wake()
            return
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(connection)  # stays busy: the waiter's now
                return
        self._busy.discard(connection)
        self._idle.append(connection)

    def _wake(self) -> None:
        """A place is free: the first waiter opens a connection in it."""
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _disposed(self, _engine: Any) -> None:
        """The engine was disposed (the process is stopping, a test is done): close the idle
        connections now and the busy ones when they come back. Runs in SQLAlchemy's
        greenlet (AsyncEngine.dispose), where the close can be awaited; outside one, the
        connections are closed at once."""
        idle, self._idle = self._idle, []
        self._places -= len(idle)
        self._stale |= self._busy
        for connection in idle:
            if in_greenlet():
                try:
                    await_only(connection.close(timeout=CONNECT_TIMEOUT_SECONDS))
                    continue
                except Exception:  # the server went away: closed below
                    pass
            connection.terminate()
