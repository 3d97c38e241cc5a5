"""Processes on one database must agree on the time (server/db/clockcheck.py): a host whose
clock is further than GATEWAY_MAX_CLOCK_SKEW_SECONDS from the PostgreSQL server's refuses to
start, with one line; SQLite (one host, one clock) has nothing to compare."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from server.clock import ManualClock
from server.config import Settings
from server.db.clockcheck import ClockSkew, check_clock, clock_skew
from server.db.engine import create_engine, session_factory

BOUND = Settings.model_fields["max_clock_skew_seconds"].default


@pytest.mark.parametrize("offset", [timedelta(seconds=60), timedelta(seconds=-3600)])
async def test_a_clock_far_from_the_database_server_s_is_refused_in_one_line(
    pg_database: str, offset: timedelta
) -> None:
    engine = create_engine(pg_database)
    try:
        clock = ManualClock(datetime.now(UTC) + offset)
        with pytest.raises(ClockSkew) as refused:
            await check_clock(session_factory(engine), clock, BOUND)
    finally:
        await engine.dispose()
    message = str(refused.value)
    assert "GATEWAY_MAX_CLOCK_SKEW_SECONDS" in message and "\n" not in message
    assert ("ahead of" if offset > timedelta(0) else "behind") in message
    assert pg_database not in message


async def test_a_clock_that_agrees_passes_and_sqlite_has_nothing_to_compare(
    db_url: str,
) -> None:
    engine = create_engine(db_url)
    try:
        sessions = session_factory(engine)
        skew = await clock_skew(sessions, ManualClock(datetime.now(UTC)))
        if db_url.startswith("sqlite"):
            assert skew is None
            await check_clock(sessions, ManualClock(datetime.now(UTC) + timedelta(days=1)), BOUND)
        else:
            assert skew is not None and abs(skew.total_seconds()) < BOUND
            await check_clock(sessions, ManualClock(datetime.now(UTC)), BOUND)
    finally:
        await engine.dispose()


def test_the_bound_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_MAX_CLOCK_SKEW_SECONDS", "0.5")
    assert Settings().max_clock_skew_seconds == 0.5
    assert BOUND == 2.0
