"""Leased budget slices: admission without a database transaction in the common case.

A request's credit hold must be durable before the provider is called, so that no process
spends beyond an account's balance or a key's cap. Instead of one hold per request, a
process holds a *slice* of a key's budget in one credit_holds row (a lease, id `lease_…`),
taken by the same atomic check-and-insert as a hold (billing/holds.py `reserve_slice`), and
admits that key's requests against it in memory. A request admitted against a lease settles
by shrinking the lease's row by what it held, in the transaction that records its charge;
a request that fails gives its amount back to the lease, with no write at all.

Models: Envoy's rate-limit quota service (a client leases a quota assignment and spends it
locally until it expires) and TigerBeetle's pending transfers (a reservation that is posted
or voided later, and times out on its own).

What keeps the guarantees:
- Exactness near a cap: a slice is taken only when the budget could take it SLICE_HEADROOM
  times over (other holds and leases included). Near a cap no slice is granted, and every
  request holds for itself as before: exactly k of N still holds.
- The row holds what the process may admit: local admission never takes more than the
  row's amount minus what is running, so no process spends beyond what it reserved.
- Crash: a lease's row expires like a hold (the sweeper deletes it); its expiry covers the
  admission window plus a request's whole hold TTL, so a request admitted at the end of the
  window is still covered.
- Changes to the key: a lease remembers the key's cap settings; once the principal cache
  (refreshed within a second of a change on any process) shows other settings, the lease
  admits nothing more and is given back once its requests finish.
- A lease admits only during its window (LEASE_WINDOW) and is given back (its row deleted)
  once its requests have finished and it is past its window, exhausted, or idle for
  IDLE_SECONDS: budget a process no longer uses returns within about a second.

Eligible: paid, non-BYOK transcriptions of keys without guardrail budgets (the caller
decides; `:free` requests are counted per request anyway, BYOK holds and budgets keep their
per-request rules).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from server.auth import Principal
from server.billing.holds import DEFAULT_HOLD_TTL, Hold, delete_holds, reserve_slice
from server.clock import Clock
from server.db.writer import Writer
from server.observability.metrics import Metrics

log = logging.getLogger(__name__)

# How many requests of the first one's estimate a slice covers.
SLICE_REQUESTS = 32
# How long a lease admits requests; its row expires this long after the hold TTL.
LEASE_WINDOW = timedelta(seconds=10)
# A lease nobody uses for this long is given back.
IDLE_SECONDS = 1.0
# After the budget refused a slice, requests of that key hold for themselves this long
# before a slice is asked for again (near a cap, most requests would be refused one).
REFUSED_SECONDS = 1.0

_BudgetKey = tuple[str, str]  # (account id, key hash)
_CapSettings = tuple[int | None, str | None, bool]


def _cap_settings(principal: Principal) -> _CapSettings:
    key = principal.key
    return (key.limit_micros, key.limit_reset, bool(key.include_byok_in_limit))


@dataclass(eq=False)
class Lease:
    id: str
    account_id: str
    key_hash: str
    amount_micros: int  # what its row holds now
    admits_until: datetime
    caps: _CapSettings
    running: dict[int, int] = field(default_factory=dict)  # ref -> amount held
    closed: bool = False  # admits nothing more; given back once nothing runs
    idle_since: float = 0.0  # loop time it last had no request running
    idle_timer: bool = False  # a check of its idleness is scheduled

    @property
    def in_flight(self) -> int:
        return sum(self.running.values())


class BudgetLeases:
    """The process's leases, one per (account, key) at a time. Owned by the process and
    passed to the transcriber; `close` gives every lease back."""

    def __init__(
        self,
        writer: Writer,
        clock: Clock,
        metrics: Metrics,
        *,
        slice_requests: int = SLICE_REQUESTS,
        window: timedelta = LEASE_WINDOW,
        idle_seconds: float = IDLE_SECONDS,
    ) -> None:
        self._writer = writer
        self._clock = clock
        self._metrics = metrics
        self._slice_requests = slice_requests
        self._window = window
        self._idle_seconds = idle_seconds
        self._leases: dict[_BudgetKey, Lease] = {}  # the one that admits, per key
        self._retired: dict[str, Lease] = {}  # admit no more, requests still running
        self._acquiring: dict[_BudgetKey, asyncio.Task[Lease | None]] = {}
        self._refused_until: dict[_BudgetKey, float] = {}
        self._returning: set[asyncio.Task[None]] = set()
        self._refs = itertools.count(1)
        self._closed = False

    def _take(self, lease: Lease | None, principal: Principal, amount: int) -> Hold | None:
        if lease is None or lease.closed:
            return None
        if lease.caps != _cap_settings(principal) or self._clock.now() >= lease.admits_until:
            self._retire(lease)
            return None
        if lease.amount_micros - lease.in_flight < amount:
            if not lease.running:  # what is left is too little for this request
                self._retire(lease)
            return None
        ref = next(self._refs)
        lease.running[ref] = amount
        self._metrics.admission("admitted")
        return Hold("", lease.account_id, lease.key_hash, amount, False, lease.id, ref)

    async def admit(self, principal: Principal, amount_micros: int) -> Hold | None:
        """Admit a request holding `amount_micros` against the key's lease, taking a slice
        first if there is none; None: the request must hold for itself (near a cap, or the
        budget refused a slice a moment ago)."""
        if self._closed or amount_micros <= 0:
            return None
        budget = (principal.account.id, principal.key.hash)
        hold = self._take(self._leases.get(budget), principal, amount_micros)
        if hold is not None:
            return hold
        loop = asyncio.get_running_loop()
        if self._refused_until.get(budget, 0.0) > loop.time():
            return None
        acquiring = self._acquiring.get(budget)
        if acquiring is None:
            # Its own task: a caller that goes away must not leave a committed lease unknown.
            acquiring = asyncio.ensure_future(
                self._acquire(budget, principal, amount_micros * self._slice_requests)
            )
            self._acquiring[budget] = acquiring
        lease = await asyncio.shield(acquiring)
        return self._take(lease, principal, amount_micros)

    async def _acquire(self, budget: _BudgetKey, principal: Principal, amount: int) -> Lease | None:
        try:
            now = self._clock.now()
            lease = Lease(
                id=f"lease_{secrets.token_hex(12)}",
                account_id=budget[0],
                key_hash=budget[1],
                amount_micros=amount,
                admits_until=now + self._window,
                caps=_cap_settings(principal),
            )
            unit = functools.partial(
                reserve_slice,
                lease_id=lease.id,
                account_id=lease.account_id,
                key_hash=lease.key_hash,
                amount_micros=amount,
                now=now,
                ttl=self._window + DEFAULT_HOLD_TTL,
            )
            try:
                granted = await self._writer.run(unit)
            except Exception as error:  # the requests hold for themselves
                log.warning("no budget lease: %s", type(error).__name__)
                granted = False
            if not granted:
                now_s = asyncio.get_running_loop().time()
                if len(self._refused_until) >= 4096:  # bounded: forget the lapsed ones
                    self._refused_until = {
                        key: until for key, until in self._refused_until.items() if until > now_s
                    }
                self._refused_until[budget] = now_s + REFUSED_SECONDS
                return None
            self._refused_until.pop(budget, None)
            if self._closed:  # closed while it was taken: give it straight back
                self._give_back([lease])
                return None
            previous = self._leases.get(budget)
            if previous is not None:
                self._retire(previous)
            self._leases[budget] = lease
            self._watch_idle(lease)
            return lease
        finally:
            self._acquiring.pop(budget, None)

    def settled(self, hold: Hold) -> None:
        """`hold`'s settlement committed: its lease's row gave up what it held."""
        lease = self._lease_of(hold)
        if lease is not None and lease.running.pop(hold.ref, None) is not None:
            lease.amount_micros -= hold.amount_micros
            self._after(lease)

    def released(self, hold: Hold) -> None:
        """`hold`'s request failed (nothing was charged): its amount is the lease's again."""
        lease = self._lease_of(hold)
        if lease is not None and lease.running.pop(hold.ref, None) is not None:
            self._after(lease)

    def _lease_of(self, hold: Hold) -> Lease | None:
        if not hold.lease_id:
            return None
        lease = self._leases.get((hold.account_id, hold.key_hash))
        if lease is not None and lease.id == hold.lease_id:
            return lease
        return self._retired.get(hold.lease_id)

    def _retire(self, lease: Lease) -> None:
        """Admit nothing more; give the row back once nothing runs on it."""
        lease.closed = True
        budget = (lease.account_id, lease.key_hash)
        if self._leases.get(budget) is lease:
            del self._leases[budget]
        if lease.running:
            self._retired[lease.id] = lease
        else:
            self._retired.pop(lease.id, None)
            self._give_back([lease])

    def _after(self, lease: Lease) -> None:
        if lease.running:
            return
        if lease.closed:
            self._retired.pop(lease.id, None)
            self._give_back([lease])
        else:
            self._watch_idle(lease)

    def _watch_idle(self, lease: Lease) -> None:
        """Retire the lease once it has been idle for idle_seconds on end. One timer per
        lease, moved on when it fires early (a timer per idle moment cost microseconds
        per request at low concurrency, where every request leaves the lease idle)."""
        loop = asyncio.get_running_loop()
        lease.idle_since = loop.time()
        if lease.idle_timer:
            return

        def check() -> None:
            lease.idle_timer = False
            if lease.closed or lease.running:
                return  # running again: its end watches anew
            due = lease.idle_since + self._idle_seconds
            if loop.time() >= due - 0.001:  # the loop may run a timer a hair early
                self._retire(lease)
            else:  # used since the timer was set, idle again since idle_since
                lease.idle_timer = True
                loop.call_at(due, check)

        lease.idle_timer = True
        loop.call_at(lease.idle_since + self._idle_seconds, check)

    def _give_back(self, leases: list[Lease]) -> None:
        task = asyncio.ensure_future(self._delete(leases))
        self._returning.add(task)
        task.add_done_callback(self._returning.discard)

    async def _delete(self, leases: list[Lease]) -> None:
        unit = functools.partial(delete_holds, ids=[lease.id for lease in leases])
        try:
            await self._writer.run(unit)
        except Exception as error:  # its row lapses at its expiry; the sweeper deletes it
            log.warning("a budget lease was not given back: %s", type(error).__name__)

    async def drain(self) -> int:
        """Admit nothing more on the current leases and give back every lease nothing runs
        on (the others go back when their last request ends); returns how many rows are
        still out (leases with requests running)."""
        for lease in list(self._leases.values()):
            self._retire(lease)
        if self._returning:
            await asyncio.wait(list(self._returning))
        return len(self._retired)

    async def close(self) -> None:
        """Give every lease back: the process stops (its requests have finished; a lease
        whose requests did not is given back all the same, as its requests are over)."""
        self._closed = True
        for task in list(self._acquiring.values()):
            await asyncio.wait([task])
        await self.drain()
        leases = list(self._retired.values())
        self._retired.clear()
        if leases:
            await self._delete(leases)

    def snapshot(self) -> dict[str, int]:
        """Lease id -> amount still free to admit (for tests and metrics)."""
        return {lease.id: lease.amount_micros - lease.in_flight for lease in self._leases.values()}
