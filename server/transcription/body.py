"""A streamed request body, read within bounds: at most `limit` bytes per request, and a
process-wide budget shared by every body being read or parsed (issue 29).

The budget is counted in body bytes times BODY_COPIES: parsing holds the raw body and up to
three more copies of it at once (the JSON text, the base64 string and the decoded audio; a
multipart body its parts), so a request reserves that much as its bytes arrive and keeps it
until it ends. A body of declared length (Content-Length, the common case) reserves all of it
before its first byte is read; when the budget is spent it waits up to `wait_seconds` (others
end and give theirs back), holding nothing, then is refused with 503 and Retry-After. A body
of unknown length (chunked) reserves as its bytes arrive; when the budget runs out it waits
too, as long as others hold some of it, else it is refused at once (nothing it waits for
would come back). Bodies that each hold part while they wait for more would wait for each
other: when the wait of one that holds something ends, the youngest bodies holding part of
what is short are refused instead (503, at their next bytes or at once if they wait; they
give back what they held at once) and the older one waits one more `wait_seconds` for it.
A burst of chunked uploads larger than the budget, their bytes arriving interleaved, so
finishes the oldest instead of refusing all of them. Concurrent large bodies cost at most
the budget, never the process's memory.

One workspace's bodies hold at most `share` of the budget at once: the rest stays for the
other workspaces, so one tenant's burst of large uploads makes its own requests wait (then
503), not everyone's."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol

from server.errors import GatewayError, service_unavailable

# The raw body plus what parsing it holds at the same time (see the module's docstring).
BODY_COPIES = 4


def too_large(limit: int) -> GatewayError:
    return GatewayError(413, f"The request body is larger than {limit // (1024 * 1024)} MiB")


def workspace_share(capacity: int, max_body_bytes: int) -> int:
    """The default share of one workspace: the budget but room for one largest body of
    another workspace's, and never less than half of the budget."""
    return max(capacity // 2, capacity - BODY_COPIES * max_body_bytes)


class BodyBudget:
    """Bytes of request bodies this process may hold at once (`capacity`), handed out in
    reservations; waiting at most `wait_seconds` for room, then 503 + Retry-After.

    `trim` (server.compute.release_free_memory) gives the heap's free pages back; it runs in
    a thread when the budget is idle again after a quarter of it was lent since the last
    time: the memory a burst of bodies took goes back to the system once the burst is over,
    and small bodies one at a time trim rarely."""

    def __init__(
        self,
        capacity: int,
        wait_seconds: float,
        retry_after_seconds: int,
        trim: Callable[[], None] | None = None,
        share: int | None = None,
    ) -> None:
        """`share`: what one owner's (a workspace's) reservations may hold at once
        (None: the whole capacity)."""
        self.capacity = capacity
        self.share = capacity if share is None else min(share, capacity)
        self.free = capacity
        self._held_by: dict[str, int] = {}  # by owner, while it holds anything
        self._wait_seconds = wait_seconds
        self._retry_after = retry_after_seconds
        self._changed = asyncio.Condition()
        # Bodies waiting in `_changed.wait()` for room: a release with none wakes nobody (the
        # usual case — a notification costs a task and three turns of the loop, on every
        # request's way to its answer). A body not yet waiting checks the room first, after
        # the release gave it back (no await between its check and its wait).
        self._waiting = 0
        self._holding: set[Reservation] = set()  # reservations holding something
        self._ages = itertools.count()
        self._trim = trim
        self._lent_since_trim = 0
        self._trimming: asyncio.Future[None] | None = None

    def reservation(self, owner: str | None = None) -> Reservation:
        """A request's reservation, counted against `owner`'s share (None: the budget's
        only)."""
        return Reservation(self, owner, next(self._ages))

    def _fits(self, size: int, owner: str | None) -> bool:
        return self.free >= size and (
            owner is None or self._held_by.get(owner, 0) + size <= self.share
        )

    def _share_short(self, size: int, owner: str | None) -> int:
        """How much `size` more bytes of `owner`'s would go past its share (0: none)."""
        if owner is None:
            return 0
        return max(0, self._held_by.get(owner, 0) + size - self.share)

    def _may_make_room(self, size: int, owner: str | None, holding: int) -> bool:
        """Whether what other reservations hold could, given back, make room for `size`
        more bytes of one that holds `holding`: of the budget, or of the owner's share when
        that is what is short."""
        if owner is not None and self._share_short(size, owner):
            return self._held_by.get(owner, 0) > holding
        return self.capacity - self.free > holding

    def _lend(self, size: int, reservation: Reservation) -> None:
        self.free -= size
        self._lent_since_trim += size
        owner = reservation.owner
        if owner is not None:
            self._held_by[owner] = self._held_by.get(owner, 0) + size
        reservation.held += size
        self._holding.add(reservation)

    async def take(self, size: int, reservation: Reservation) -> None:
        """Lend `size` more bytes to `reservation`, waiting up to `wait_seconds` for room
        (the module's docstring says when it waits, and who is refused when it ends)."""
        owner, holding = reservation.owner, reservation.held
        if reservation.refused:  # an older body needs what it holds
            raise service_unavailable(self._retry_after)
        if size > (self.capacity if owner is None else self.share):
            # Never fits, however long it waits: not a 503 to retry.
            raise GatewayError(413, "The request body is larger than this server accepts")
        if self._fits(size, owner):  # the common case: no waiting, no lock
            self._lend(size, reservation)
            return
        if holding and not self._may_make_room(size, owner, holding):
            raise service_unavailable(self._retry_after)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._wait_seconds
        async with self._changed:
            while True:
                if reservation.refused:  # before room it may now see: an older body's
                    raise service_unavailable(self._retry_after)
                if self._fits(size, owner):
                    break
                if loop.time() >= deadline:
                    if not self._refuse_younger(reservation, size):
                        raise service_unavailable(self._retry_after)
                    self._changed.notify_all()  # they wake, give back, are answered 503
                    deadline = loop.time() + self._wait_seconds
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(deadline):
                        self._waiting += 1
                        try:
                            await self._changed.wait()
                        finally:
                            self._waiting -= 1
            self._lend(size, reservation)

    def _refuse_younger(self, reservation: Reservation, size: int) -> bool:
        """Refuse the youngest reservations holding part of what `reservation` (older,
        holding something) is short of, enough of them for its `size`: each finds out at
        its next take (a waiting one at once) and gives back what it holds; one whose body
        is already read gives it back when its request ends. False when there are none (or
        `reservation` holds nothing itself)."""
        if not reservation.held:
            return False
        owner = reservation.owner
        short = self._share_short(size, owner)
        same_owner = bool(short)
        if not same_owner:
            short = size - self.free
        younger = sorted(
            (
                other
                for other in self._holding  # each holds something (release discards it)
                if not other.refused
                and other.age > reservation.age
                and (not same_owner or other.owner == owner)
            ),
            key=lambda other: other.age,
            reverse=True,
        )
        refused = 0
        for other in younger:
            if refused >= short:
                break
            other.refused = True
            refused += other.held
        return refused > 0

    async def release(self, reservation: Reservation) -> None:
        """Take back everything `reservation` holds (at once, before the first await: no
        waiting body misses it), then wake the bodies waiting for room."""
        size, reservation.held = reservation.held, 0
        self._holding.discard(reservation)
        owner = reservation.owner
        if owner is not None:
            left = self._held_by.pop(owner, 0) - size
            if left > 0:
                self._held_by[owner] = left
        self.free += size
        if self.free == self.capacity:
            self._trim_when_due()
        if self._waiting:
            await asyncio.shield(self._notify())

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def _trim_when_due(self) -> None:
        if self._trim is None or self._lent_since_trim < self.capacity // 4:
            return
        if self._trimming is not None and not self._trimming.done():
            return
        self._lent_since_trim = 0
        self._trimming = asyncio.get_running_loop().run_in_executor(None, self._trim)


class Reservation:
    """One request's share of the budget, counted against its owner's (a workspace's);
    everything it took is given back on exit."""

    def __init__(self, budget: BodyBudget, owner: str | None = None, age: int = 0) -> None:
        self._budget = budget
        self.owner = owner
        self.age = age  # the order reservations were made in: the older is served first
        self.held = 0
        self.refused = False  # an older body needs what this one holds (BodyBudget.take)

    async def take(self, size: int) -> None:
        """Reserve `size` more bytes (BodyBudget.take says when it waits). Refused, it gives
        back what it held at once: bodies waiting with it need not wait for the request's
        end to have it."""
        try:
            await self._budget.take(size, self)
        except GatewayError:
            if self.held:
                await self._budget.release(self)
            raise

    async def __aenter__(self) -> Reservation:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.held:
            await self._budget.release(self)


@dataclass
class Body:
    data: bytes
    content_type: str


class BodySource(Protocol):
    """A request body as it streams in: its chunks, and its content type (known once the
    first chunk is read: a gRPC stream carries it in its first message)."""

    @property
    def content_type(self) -> str: ...

    def chunks(self) -> AsyncIterator[bytes]: ...


def declared_length(value: str | None) -> int | None:
    """The client's Content-Length (forwarded by the facade), when it is a plain number."""
    if value is None or not value.isdigit() or len(value) > 18:
        return None
    return int(value)


async def read_body(
    source: BodySource,
    reservation: Reservation,
    limit: int,
    length: int | None,
) -> Body:
    """The body of a streamed request (the facade sends it in as many chunks as it likes).
    `length`, the declared Content-Length, is reserved at once (a body over `limit` is
    refused before a byte is read); a body of unknown length reserves as its bytes arrive."""
    if length is not None:
        if length > limit:
            raise too_large(limit)
        await reservation.take(BODY_COPIES * length)
    # The bytes gather in one buffer, each chunk released as soon as it is copied: kept
    # side by side until a join, thousands of small allocations would fragment the heap and
    # stay with the process after the body is gone. A one-chunk body is used as it came.
    first: bytes | None = None
    gathered: bytearray | None = None
    received = 0
    async for chunk in source.chunks():
        if received + len(chunk) > limit:
            raise too_large(limit)
        if length is None or received + len(chunk) > length:
            # Unknown length, or more bytes than declared: reserve what arrives.
            extra = received + len(chunk) - max(length or 0, received)
            await reservation.take(BODY_COPIES * extra)
        if first is None:
            first = chunk
        else:
            if gathered is None:
                gathered = bytearray(first)
                first = b""
            gathered += chunk
        received += len(chunk)
        del chunk
    if gathered is not None:
        return Body(bytes(gathered), source.content_type)
    return Body(first or b"", source.content_type)


def retry_after_for(wait_seconds: float) -> int:
    """The Retry-After of a body refused for want of budget: about as long as it waited."""
    return max(1, math.ceil(wait_seconds))
