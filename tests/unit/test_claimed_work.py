"""The loop the video worker and the webhook dispatcher share (server/workers/loop.py
ClaimedWork): at most `at_once` items run at a time, an item claimed again while it runs
runs once, the loop claims again as soon as a task ends, and on stop the tasks under way
get their grace, then are cancelled."""

from __future__ import annotations

import asyncio
import logging

from server.workers.loop import ClaimedWork
from testkit.eventually import eventually

log = logging.getLogger("test.claimed_work")


class Queue:
    """Claims hand out `items` in order (then None); each handled item waits for its gate."""

    def __init__(self, items: list[str]) -> None:
        self.items = list(items)
        self.started: list[str] = []
        self.cancelled: list[str] = []
        self.gates: dict[str, asyncio.Event] = {item: asyncio.Event() for item in items}

    async def claim(self) -> str | None:
        return self.items.pop(0) if self.items else None

    async def handle(self, item: str) -> None:
        self.started.append(item)
        try:
            await self.gates[item].wait()
        except asyncio.CancelledError:
            self.cancelled.append(item)
            raise


def work(queue: Queue, at_once: int, drain_seconds: float | None = None) -> ClaimedWork[str]:
    return ClaimedWork(
        claim=queue.claim,
        handle=queue.handle,
        key=lambda item: item,
        at_once=at_once,
        wake=asyncio.Event(),
        idle_wait=30.0,  # longer than the test: only a wake makes it claim again
        log=log,
        drain_seconds=drain_seconds,
    )


async def test_at_most_at_once_run_and_a_slot_that_frees_is_claimed_at_once() -> None:
    queue = Queue(["a", "b", "c"])
    stop = asyncio.Event()
    loop = asyncio.create_task(work(queue, at_once=2).run(stop))
    try:
        await eventually(lambda: queue.started == ["a", "b"], within=5, message="two running")
        await asyncio.sleep(0.1)
        assert queue.started == ["a", "b"]
        queue.gates["a"].set()
        await eventually(lambda: queue.started == ["a", "b", "c"], within=5, message="c next")
    finally:
        for gate in queue.gates.values():
            gate.set()
        stop.set()
        await asyncio.wait_for(loop, 5)


async def test_an_item_claimed_again_while_it_runs_runs_once() -> None:
    queue = Queue(["a", "a", "b"])
    stop = asyncio.Event()
    loop = asyncio.create_task(work(queue, at_once=3).run(stop))
    try:
        await eventually(lambda: queue.started == ["a", "b"], within=5, message="a and b")
        await asyncio.sleep(0.1)
        assert queue.started == ["a", "b"]
    finally:
        for gate in queue.gates.values():
            gate.set()
        stop.set()
        await asyncio.wait_for(loop, 5)


async def test_on_stop_the_tasks_get_their_grace_then_are_cancelled() -> None:
    queue = Queue(["quick", "stuck"])
    stop = asyncio.Event()
    loop = asyncio.create_task(work(queue, at_once=2, drain_seconds=0.2).run(stop))
    await eventually(lambda: len(queue.started) == 2, within=5, message="both running")
    stop.set()
    queue.gates["quick"].set()
    await asyncio.wait_for(loop, 5)
    assert queue.cancelled == ["stuck"]


async def test_a_task_that_ends_wakes_the_idle_loop() -> None:
    """Its workspace may be below its share again: the loop claims at once, not after its
    idle wait."""
    queue = Queue(["a"])
    stop = asyncio.Event()
    loop = asyncio.create_task(work(queue, at_once=3).run(stop))
    try:
        await eventually(lambda: queue.started == ["a"], within=5, message="a running")
        await asyncio.sleep(0.1)  # the loop found nothing more and sleeps (idle_wait 30 s)
        queue.items.append("b")
        queue.gates["b"] = asyncio.Event()
        queue.gates["a"].set()
        await eventually(lambda: queue.started == ["a", "b"], within=5, message="b claimed")
    finally:
        for gate in queue.gates.values():
            gate.set()
        stop.set()
        await asyncio.wait_for(loop, 5)
