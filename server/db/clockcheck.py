"""Every process on one database must agree on the time: job leases, budget leases, holds'
expiry, the free-request windows, key expiry and the ledger's periods are all written with
one process's clock and read with another's. A host whose clock is off by more than
GATEWAY_MAX_CLOCK_SKEW_SECONDS from the database server's refuses to start (ClockSkew, one
line), before serving. The database server's clock is the one reference every process
shares; SQLite has none (its processes share one host, hence one clock): nothing to check.

The check is made once, at start: a clock that drifts later is the host's time service's
to correct."""

from __future__ import annotations

from datetime import datetime, timedelta

import sqlalchemy as sa

from server.clock import Clock
from server.db.engine import SessionFactory


class ClockSkew(RuntimeError):
    """This host's clock is too far from the database server's: it must not start."""

    def __init__(self, skew: timedelta, bound: float) -> None:
        seconds = skew.total_seconds()
        side = "ahead of" if seconds > 0 else "behind"
        super().__init__(
            f"this host's clock is {abs(seconds):.1f} s {side} the database server's (more "
            f"than GATEWAY_MAX_CLOCK_SKEW_SECONDS, {bound:g} s): every process on one database "
            "must agree on the time (leases, rate windows, key expiry); synchronise this "
            "host's clock (NTP)"
        )


async def clock_skew(sessions: SessionFactory, clock: Clock) -> timedelta | None:
    """This clock minus the database server's, less the query's round trip (the smallest
    skew its timing allows); None on SQLite."""
    async with sessions() as session:
        if session.get_bind().dialect.name != "postgresql":
            return None
        before = clock.now()
        server: datetime = (
            await session.exec(sa.select(sa.func.clock_timestamp()))  # type: ignore[call-overload]  # sqlmodel's exec() is typed for its own select() only
        ).one()[0]
        after = clock.now()
    # The server read its clock somewhere between `before` and `after`.
    if server < before:
        return before - server
    if server > after:
        return after - server
    return timedelta(0)


async def check_clock(sessions: SessionFactory, clock: Clock, bound: float) -> None:
    """Raise ClockSkew when this clock is more than `bound` seconds from the database's."""
    skew = await clock_skew(sessions, clock)
    if skew is not None and abs(skew.total_seconds()) > bound:
        raise ClockSkew(skew, bound)
