"""Bursts that must land in one UTC minute (the free models' 20 per minute), without
sleeping until the next minute starts: a burst that spanned a boundary is run again on
fresh state."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TypeVar

T = TypeVar("T")


def _minute() -> datetime:
    return datetime.now(UTC).replace(second=0, microsecond=0)


async def in_one_minute(run: Callable[[], Awaitable[T]], tries: int = 3) -> T:
    """What `run()` returns when it started and ended in the same UTC minute. `run` must
    start from fresh state each time (a new workspace): a run that spanned a minute
    boundary saw two minute windows, so its outcome is discarded and it runs again."""
    for _ in range(tries):
        started = _minute()
        result = await run()
        if _minute() == started:
            return result
    raise AssertionError(f"{tries} runs in a row spanned a minute boundary")
