"""The restart rule of `gateway up` (facade/supervision.py) on a ManualClock: the backoff
doubles with each death within the window up to its max, deaths older than the window
are forgotten, and the limit-th death within it gives up; how a process ended, in words."""

from __future__ import annotations

import signal
from datetime import timedelta

from facade.supervision import RestartBudget, how_it_ended
from testkit.domain import start_clock


def test_the_backoff_doubles_up_to_its_max_and_the_limit_gives_up() -> None:
    clock = start_clock()
    budget = RestartBudget(
        limit=5, window=timedelta(seconds=60), backoff=0.5, backoff_max=1.5, clock=clock
    )
    assert [budget.died("worker 1") for _ in range(4)] == [0.5, 1.0, 1.5, 1.5]
    assert budget.died("Envoy") == 0.5  # each process has its own count
    assert budget.died("worker 1") is None  # the fifth within the window


def test_deaths_older_than_the_window_are_forgotten() -> None:
    clock = start_clock()
    budget = RestartBudget(
        limit=2, window=timedelta(seconds=60), backoff=0.5, backoff_max=10, clock=clock
    )
    assert budget.died("worker 0") == 0.5
    clock.advance(timedelta(seconds=60))
    assert budget.died("worker 0") == 0.5  # the first is out of the window
    clock.advance(timedelta(seconds=59))
    assert budget.died("worker 0") is None
    assert budget.recent("worker 0") == 2


def test_how_a_process_ended() -> None:
    assert how_it_ended(-signal.SIGKILL) == "killed by SIGKILL"
    assert how_it_ended(-signal.SIGSEGV) == "killed by SIGSEGV"
    assert how_it_ended(3) == "exited with status 3"
    assert how_it_ended(0) == "exited with status 0"
