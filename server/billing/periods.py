"""UTC accounting periods: day, ISO week (Monday), calendar month, all time."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

EPOCH = date(1970, 1, 1)
PERIODS = ("all", "day", "week", "month")
LIMIT_RESETS = ("daily", "weekly", "monthly")
PERIOD_OF_RESET = {"daily": "day", "weekly": "week", "monthly": "month", None: "all"}


@dataclass(frozen=True)
class PeriodStarts:
    all: date
    day: date
    week: date
    month: date

    def of(self, period: str) -> date:
        start: date = getattr(self, period)
        return start


def period_starts(now: datetime) -> PeriodStarts:
    today = now.astimezone(UTC).date()
    return PeriodStarts(
        all=EPOCH,
        day=today,
        week=today - timedelta(days=today.weekday()),
        month=today.replace(day=1),
    )


def next_reset(limit_reset: str | None, now: datetime) -> datetime | None:
    """When a key limit of this reset type next starts afresh (None: it never resets)."""
    starts = period_starts(now)
    if limit_reset == "daily":
        start = starts.day + timedelta(days=1)
    elif limit_reset == "weekly":
        start = starts.week + timedelta(days=7)
    elif limit_reset == "monthly":
        month = starts.month
        start = date(month.year + month.month // 12, month.month % 12 + 1, 1)
    else:
        return None
    return datetime.combine(start, time(0), tzinfo=UTC)
