"""Charges that commit as the answer leaves.

A request admitted against a leased budget slice (limits/leases.py) holds its amount in the
lease, durably, before its provider is called. Once the provider has answered, what it owes
is known (the gateway measured it) and no other request can spend it: the lease keeps the
amount as running until the charge has committed. So the answer need not wait for that
commit — the charge, its ledger row, the usage counters and the generation record commit
through the group-commit writer while the answer travels (`start`), and at concurrency 1 the
commit no longer adds to the caller's latency (figures: docs/performance.md).

What a reader of the caller's account sees stays as before in this process: GET /generation,
/key, /credits and the activity first wait, bounded, for that account's charges still
committing here (`settled`). Another process or host sees them once committed, within a
batch (milliseconds). If the process dies between the answer and the commit, the lease's row
expires and the request is not charged: the operator, not the caller, bears that window
(before, the charge committed first and a crash before the answer charged a caller who got
none). Shutdown waits for every charge still committing (`close`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Coroutine
from typing import Any

# How long a reader waits for its account's charges still committing; a batch takes
# milliseconds, so this bounds only a writer that is failing (each charge is retried).
READ_WAIT_SECONDS = 2.0


class Settlements:
    """The charges of this process still committing after their answers, by account. Owned
    by the process and passed to the transcriber and to the services that read an account's
    charges."""

    def __init__(self) -> None:
        self._pending: dict[str, set[asyncio.Task[None]]] = {}

    @property
    def pending(self) -> int:
        return sum(len(tasks) for tasks in self._pending.values())

    def start(self, account_id: str, settle: Coroutine[Any, Any, None]) -> None:
        """Run `settle` (the charge to its end, its failures its own) beside the answer."""
        task = asyncio.ensure_future(settle)
        self._pending.setdefault(account_id, set()).add(task)
        task.add_done_callback(functools.partial(self._ended, account_id))

    def _ended(self, account_id: str, task: asyncio.Task[None]) -> None:
        tasks = self._pending.get(account_id)
        if tasks is not None:
            tasks.discard(task)
            if not tasks:
                del self._pending[account_id]

    async def settled(self, account_id: str, within: float = READ_WAIT_SECONDS) -> None:
        """Wait, at most `within` seconds, until the account's charges that are committing
        now have ended. Nothing to wait for (the common case) costs a dict lookup."""
        tasks = self._pending.get(account_id)
        if tasks:
            await asyncio.wait(set(tasks), timeout=within)

    async def close(self, within: float) -> None:
        """Wait, at most `within` seconds, for every charge still committing."""
        tasks = {task for pending in self._pending.values() for task in pending}
        if tasks:
            await asyncio.wait(tasks, timeout=within)
