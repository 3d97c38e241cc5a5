"""The webhook dispatcher in-process: delivers once and signs; retries on the backoff
schedule (a ManualClock decides when a retry is due); 410 stops; every attempt keeps the
delivery's webhook-id."""

from __future__ import annotations

import asyncio
import json
import secrets
import ssl
import time
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Coroutine, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from standardwebhooks import Webhook

from server.db.models import WebhookDelivery, Workspace
from server.providers.http import provider_client
from server.vault.crypto import MasterKey
from server.vault.webhook_secrets import workspace_secret
from server.webhooks.signing import openrouter_signature
from server.workers.webhook_dispatcher import RETRY_SCHEDULE, WebhookDispatcher
from testkit.domain import Domain
from testkit.eventually import eventually
from tests.fakes.hostile_peer import HostilePeer

PAYLOAD = json.dumps(
    {"type": "video.generation.completed", "data": {"id": "vid_x", "status": "completed"}}
)


MASTER = MasterKey(b"\x07" * 32)  # the vault's master key, which seals signing secrets


def _dispatcher(domain: Domain) -> WebhookDispatcher:
    # localhost resolves to loopback: private addresses allowed, as for the test receiver.
    return WebhookDispatcher(
        domain.sessions, domain.clock, domain.http, master=MASTER, allow_private=True
    )


async def _queue(domain: Domain, path: str) -> WebhookDelivery:
    workspace = await domain.admin.workspace(f"hooks-{secrets.token_hex(4)}")
    delivery = WebhookDelivery(
        id=f"msg_{secrets.token_hex(12)}",
        workspace_id=workspace.id,
        job_id="vid_x",
        url=f"https://localhost:8443{path}",
        payload=PAYLOAD,
        status="pending",
        next_attempt_at=domain.clock.now(),
        created_at=domain.clock.now(),
    )
    async with domain.sessions() as session:
        session.add(delivery)
        await session.commit()
    return delivery


async def _delivery(domain: Domain, delivery_id: str) -> WebhookDelivery:
    (row,) = await domain.rows(WebhookDelivery, WebhookDelivery.id == delivery_id)
    return row


async def _attempt_due(dispatcher: WebhookDispatcher) -> bool:
    """One dispatcher step: claim the due delivery, if any, and attempt it."""
    claimed = await dispatcher.claim()
    if claimed is None:
        return False
    await dispatcher.attempt(claimed)
    return True


async def test_a_delivery_is_sent_once_and_signed(domain: Domain) -> None:
    dispatcher = _dispatcher(domain)
    queued = await _queue(domain, "/ok")
    assert await _attempt_due(dispatcher)
    (sent,) = domain.providers.webhooks("/ok")
    assert sent.url.host == "127.0.0.1"  # pinned to the resolved address
    assert sent.headers["host"] == "localhost:8443"
    assert sent.headers["webhook-id"] == queued.id
    assert sent.headers["webhook-timestamp"] == str(int(domain.clock.now().timestamp()))
    secret = await workspace_secret(
        domain.sessions, MASTER, queued.workspace_id, domain.clock.now()
    )
    assert Webhook(secret).verify(sent.content, dict(sent.headers)) == json.loads(PAYLOAD)
    with pytest.raises(Exception):  # noqa: B017 (any verification failure)
        Webhook(secret).verify(sent.content + b" ", dict(sent.headers))
    # OpenRouter's header set too, under the same secret and timestamp.
    sent_at = int(domain.clock.now().timestamp())
    assert sent.headers["x-openrouter-signature"] == openrouter_signature(
        secret, sent_at, sent.content
    )
    assert sent.headers["x-openrouter-idempotency-key"] == "vid_x-completed"
    row = await _delivery(domain, queued.id)
    assert (row.status, row.attempts, row.last_status) == ("delivered", 1, 200)
    assert row.delivered_at == domain.clock.now()
    domain.clock.advance(timedelta(days=2))
    assert not await _attempt_due(dispatcher)  # delivered: never sent again
    assert len(domain.providers.webhooks("/ok")) == 1


async def test_failures_are_retried_on_the_backoff_schedule(domain: Domain) -> None:
    dispatcher = _dispatcher(domain)
    domain.providers.webhook_answers["/flaky"] = [500, 503]
    queued = await _queue(domain, "/flaky")
    for attempt, backoff in enumerate(RETRY_SCHEDULE[:2], start=1):
        failed_at = domain.clock.now()
        assert await _attempt_due(dispatcher)
        row = await _delivery(domain, queued.id)
        assert (row.status, row.attempts) == ("pending", attempt)
        assert row.next_attempt_at == failed_at + backoff
        domain.clock.advance(backoff - timedelta(seconds=1))
        assert not await _attempt_due(dispatcher)  # not due yet
        domain.clock.advance(timedelta(seconds=1))
    assert await _attempt_due(dispatcher)  # the third attempt succeeds
    row = await _delivery(domain, queued.id)
    assert (row.status, row.attempts, row.last_status) == ("delivered", 3, 200)
    sent = domain.providers.webhooks("/flaky")
    assert [r.headers["webhook-id"] for r in sent] == [queued.id] * 3  # one id throughout
    assert len({r.headers["webhook-signature"] for r in sent}) == 3  # signed at each send
    assert {r.headers["x-openrouter-idempotency-key"] for r in sent} == {"vid_x-completed"}


async def test_a_410_stops_the_delivery(domain: Domain) -> None:
    dispatcher = _dispatcher(domain)
    domain.providers.webhook_answers["/gone"] = [410]
    queued = await _queue(domain, "/gone")
    assert await _attempt_due(dispatcher)
    row = await _delivery(domain, queued.id)
    assert (row.status, row.attempts, row.last_status) == ("stopped", 1, 410)
    domain.clock.advance(timedelta(days=2))
    assert not await _attempt_due(dispatcher)
    assert len(domain.providers.webhooks("/gone")) == 1


async def test_a_delivery_fails_after_the_last_scheduled_retry(domain: Domain) -> None:
    dispatcher = _dispatcher(domain)
    domain.providers.webhook_answers["/down"] = [500] * (len(RETRY_SCHEDULE) + 5)
    queued = await _queue(domain, "/down")
    for backoff in (*RETRY_SCHEDULE, timedelta(0)):
        assert await _attempt_due(dispatcher)
        domain.clock.advance(backoff)
    row = await _delivery(domain, queued.id)
    assert (row.status, row.attempts) == ("failed", len(RETRY_SCHEDULE) + 1)
    domain.clock.advance(timedelta(days=7))
    assert not await _attempt_due(dispatcher)


async def test_a_non_https_target_is_refused_without_a_request(domain: Domain) -> None:
    dispatcher = _dispatcher(domain)
    queued = await _queue(domain, "/ok")
    async with domain.sessions() as session:
        row = await session.get(WebhookDelivery, queued.id)
        assert row is not None
        row.url = "http://localhost:8443/ok"
        await session.commit()
    assert await _attempt_due(dispatcher)
    row = await _delivery(domain, queued.id)
    assert row.status == "stopped" and (row.last_error or "").startswith("refused")
    assert domain.providers.requests == []


async def test_the_run_loop_delivers_when_woken(domain: Domain) -> None:
    """The background loop, as the server runs it: a wake sends at once, and `stop` ends
    it after the current step."""
    dispatcher = _dispatcher(domain)
    stop = asyncio.Event()
    loop = asyncio.create_task(dispatcher.run(stop))
    queued = await _queue(domain, "/ok")
    dispatcher.wake.set()
    row = await eventually(
        lambda: _delivered(domain, queued.id), within=5, message="the delivery was sent"
    )
    assert row.attempts == 1
    stop.set()
    await asyncio.wait_for(loop, 5)
    assert len(domain.providers.webhooks("/ok")) == 1


async def _delivered(domain: Domain, delivery_id: str) -> WebhookDelivery | None:
    row = await _delivery(domain, delivery_id)
    return row if row.status == "delivered" else None


# Hostile receivers (issue 29, items 2 and 3): a real loopback peer over HTTPS, the one
# provider client, short bounds. What counts is the status; at most a small prefix of an
# answer is read; every attempt ends by its deadline; deliveries run concurrently, at most
# a few per workspace, so one workspace's slow receiver never holds another's webhooks.

MiB = 1024 * 1024


@pytest.fixture
def peer(tmp_path: Path) -> Iterator[HostilePeer]:
    hostile = HostilePeer(tls_ca_file=tmp_path / "peer-ca.pem", max_seconds=15, max_bytes=96 * MiB)
    hostile.start()
    yield hostile
    hostile.stop()


@pytest_asyncio.fixture
async def tls_http(peer: HostilePeer) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway's one client (its own transport), trusting the peer's test CA."""
    tls = ssl.create_default_context()
    tls.load_verify_locations(cafile=peer.tls_ca_file)
    http = provider_client(tls)
    yield http
    await http.aclose()


async def _queue_to(domain: Domain, workspace: Workspace, url: str) -> WebhookDelivery:
    delivery = WebhookDelivery(
        id=f"msg_{secrets.token_hex(12)}",
        workspace_id=workspace.id,
        job_id="vid_x",
        url=url,
        payload=PAYLOAD,
        status="pending",
        next_attempt_at=domain.clock.now(),
        created_at=domain.clock.now(),
    )
    async with domain.sessions() as session:
        session.add(delivery)
        await session.commit()
    return delivery


def _arrivals(peer: HostilePeer, deliveries: list[WebhookDelivery]) -> int:
    ids = {d.id for d in deliveries}
    return sum(1 for r in list(peer.requests) if r.headers.get("webhook-id") in ids)


async def test_a_huge_answer_is_read_only_to_a_small_prefix(
    domain: Domain, peer: HostilePeer, tls_http: httpx.AsyncClient
) -> None:
    """The issue's receiver answering 1.2 GiB, scaled down: the status (200) delivers it, at
    most a small prefix of the body is read and the connection is closed, not drained."""
    dispatcher = WebhookDispatcher(
        domain.sessions, domain.clock, tls_http, master=MASTER, allow_private=True
    )
    workspace = await domain.admin.workspace("huge-answer")
    queued = await _queue_to(domain, workspace, peer.url(f"/huge/{256 * MiB}"))
    assert await _attempt_due(dispatcher)
    row = await _delivery(domain, queued.id)
    assert (row.status, row.last_status, row.attempts) == ("delivered", 200, 1)
    await asyncio.sleep(0.2)  # what the peer could still push before it saw the close
    assert peer.bytes_sent < 16 * MiB, f"{peer.bytes_sent / MiB:.0f} MiB of the answer read"


async def test_an_endless_answer_is_cut_after_its_prefix(
    domain: Domain, peer: HostilePeer, tls_http: httpx.AsyncClient
) -> None:
    dispatcher = WebhookDispatcher(
        domain.sessions, domain.clock, tls_http, master=MASTER, allow_private=True
    )
    workspace = await domain.admin.workspace("endless-answer")
    queued = await _queue_to(domain, workspace, peer.url("/endless"))
    started = time.monotonic()
    assert await _attempt_due(dispatcher)
    assert time.monotonic() - started < 5
    row = await _delivery(domain, queued.id)
    assert (row.status, row.last_status) == ("delivered", 200)
    await asyncio.sleep(0.2)
    assert peer.bytes_sent < 16 * MiB, f"{peer.bytes_sent / MiB:.0f} MiB of the answer read"


async def test_an_attempt_without_an_answer_fails_at_its_deadline(
    domain: Domain, peer: HostilePeer, tls_http: httpx.AsyncClient
) -> None:
    """No status within the deadline (connect, send, status): the attempt fails then and is
    retried on the backoff schedule, whatever the per-read timeouts would allow."""
    dispatcher = WebhookDispatcher(
        domain.sessions, domain.clock, tls_http, master=MASTER, allow_private=True, deadline=1.0
    )
    workspace = await domain.admin.workspace("stalled")
    queued = await _queue_to(domain, workspace, peer.url("/stall"))
    failed_at = domain.clock.now()
    started = time.monotonic()
    assert await _attempt_due(dispatcher)
    assert time.monotonic() - started < 2.5
    row = await _delivery(domain, queued.id)
    assert (row.status, row.attempts, row.last_status) == ("pending", 1, None)
    assert row.last_error is not None and "deadline" in row.last_error
    assert row.next_attempt_at == failed_at + RETRY_SCHEDULE[0]
    assert row.lease_owner is None


async def test_a_trickling_answer_counts_by_its_status_within_the_deadline(
    domain: Domain, peer: HostilePeer, tls_http: httpx.AsyncClient
) -> None:
    """A 200 whose body trickles (a byte a second, 1 MiB announced): the status came, so it
    is delivered; the body is not waited for past the deadline."""
    dispatcher = WebhookDispatcher(
        domain.sessions, domain.clock, tls_http, master=MASTER, allow_private=True, deadline=1.0
    )
    workspace = await domain.admin.workspace("trickling")
    queued = await _queue_to(domain, workspace, peer.url("/trickle-length/1000"))
    started = time.monotonic()
    assert await _attempt_due(dispatcher)
    assert time.monotonic() - started < 2.5
    row = await _delivery(domain, queued.id)
    assert (row.status, row.last_status, row.attempts) == ("delivered", 200, 1)


async def test_a_slow_workspace_leaves_the_other_slots_to_other_workspaces(
    domain: Domain, peer: HostilePeer, tls_http: httpx.AsyncClient
) -> None:
    """Workspace A has four deliveries to a receiver that never answers, B two to a fast
    one, and A's were due first. A runs at most two at once (its cap); B's are delivered at
    once, not after A's deadlines — and again while A's first attempts are retried."""
    dispatcher = WebhookDispatcher(
        domain.sessions,
        domain.clock,
        tls_http,
        master=MASTER,
        allow_private=True,
        deadline=3.0,
        concurrency=3,
        workspace_concurrency=2,
    )
    slow = await domain.admin.workspace("slow-receiver")
    fast = await domain.admin.workspace("fast-receiver")
    stalled = [await _queue_to(domain, slow, peer.url("/stall")) for _ in range(4)]
    domain.clock.advance(timedelta(seconds=1))  # B's come due after A's
    quick = [await _queue_to(domain, fast, peer.url("/ok")) for _ in range(2)]
    stop = asyncio.Event()
    started = time.monotonic()
    loop = asyncio.create_task(dispatcher.run(stop))
    try:
        for delivery in quick:
            await eventually(
                lambda d=delivery: _delivered(domain, d.id), within=5, message="B's webhook"
            )
        assert time.monotonic() - started < 2.5  # before A's first attempts end (3 s)
        assert _arrivals(peer, stalled) == 2  # A's cap, not all four
        # A's first two fail at their deadline (retry due in 5 s); its other two follow.
        await eventually(lambda: _arrivals(peer, stalled) == 4, within=6, message="A's next")
        domain.clock.advance(RETRY_SCHEDULE[0])
        again = await _queue_to(domain, fast, peer.url("/ok"))
        dispatcher.wake.set()
        waited = time.monotonic()
        await eventually(lambda: _delivered(domain, again.id), within=5, message="B's next")
        assert time.monotonic() - waited < 2.5
    finally:
        stop.set()
        await asyncio.wait_for(loop, 10)


async def test_deliveries_run_concurrently_up_to_the_bound(
    domain: Domain, peer: HostilePeer, tls_http: httpx.AsyncClient
) -> None:
    dispatcher = WebhookDispatcher(
        domain.sessions,
        domain.clock,
        tls_http,
        master=MASTER,
        allow_private=True,
        deadline=2.0,
        concurrency=3,
        workspace_concurrency=3,
    )
    stalled = [
        await _queue_to(domain, await domain.admin.workspace(f"many-{i}"), peer.url("/stall"))
        for i in range(5)
    ]
    stop = asyncio.Event()
    loop = asyncio.create_task(dispatcher.run(stop))
    try:
        await eventually(lambda: _arrivals(peer, stalled) == 3, within=5, message="three at once")
        await asyncio.sleep(0.5)  # still within their deadline: no fourth has started
        assert _arrivals(peer, stalled) == 3
    finally:
        stop.set()
        await asyncio.wait_for(loop, 10)


async def test_stopping_waits_for_attempts_in_flight_at_most_their_deadline(
    domain: Domain, peer: HostilePeer, tls_http: httpx.AsyncClient
) -> None:
    dispatcher = WebhookDispatcher(
        domain.sessions, domain.clock, tls_http, master=MASTER, allow_private=True, deadline=1.5
    )
    workspace = await domain.admin.workspace("drained")
    queued = await _queue_to(domain, workspace, peer.url("/stall"))
    stop = asyncio.Event()
    loop = asyncio.create_task(dispatcher.run(stop))
    await eventually(lambda: _arrivals(peer, [queued]) == 1, within=5, message="in flight")
    stopped = time.monotonic()
    stop.set()
    await asyncio.wait_for(loop, 10)
    assert time.monotonic() - stopped < 2.5
    row = await _delivery(domain, queued.id)  # the attempt ended and was recorded
    assert (row.status, row.attempts, row.lease_owner) == ("pending", 1, None)


async def test_the_workspace_cap_holds_across_processes(any_domain: Domain) -> None:
    """Dispatchers of several processes claim from one outbox: each delivery exactly once,
    and no more of one workspace's deliveries in flight at once than its cap, counted in
    the database — also when the claims race (PostgreSQL: separate connections)."""
    domain = any_domain
    dispatchers = [
        WebhookDispatcher(
            domain.sessions,
            domain.clock,
            domain.http,
            master=MASTER,
            concurrency=8,
            workspace_concurrency=2,
        )
        for _ in range(3)
    ]
    slow = await domain.admin.workspace("cap-slow")
    other = await domain.admin.workspace("cap-other")
    for _ in range(6):
        await _queue_to(domain, slow, "https://slow.test/hook")
    domain.clock.advance(timedelta(seconds=1))
    for _ in range(3):
        await _queue_to(domain, other, "https://other.test/hook")
    claimed = [c for c in await asyncio.gather(*claims_of(dispatchers, 4)) if c is not None]
    ids = [c.id for c in claimed]
    assert len(ids) == len(set(ids))  # nothing claimed twice
    assert sorted(c.workspace_id for c in claimed) == sorted([slow.id] * 2 + [other.id] * 2)
    # A lease that lapsed (its process died) no longer counts against the cap.
    lease = claimed[0].lease_expires_at
    assert lease is not None
    assert lease - domain.clock.now() >= timedelta(seconds=10)  # outlives an attempt
    domain.clock.set(lease + timedelta(seconds=1))
    more = [c for c in await asyncio.gather(*claims_of(dispatchers, 4)) if c is not None]
    assert sorted(c.workspace_id for c in more) == sorted([slow.id] * 2 + [other.id] * 2)


def claims_of(
    dispatchers: list[WebhookDispatcher], each: int
) -> list[Coroutine[Any, Any, WebhookDelivery | None]]:
    return [d.claim() for d in dispatchers for _ in range(each)]


class _GzipBomb(httpx.AsyncByteStream):
    """A gzip body of `size` zero bytes, compressed as it is streamed (about a thousandth
    of its size on the wire): an answer small to receive and huge once inflated."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.chunks_sent = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        packer = zlib.compressobj(wbits=31)  # gzip framing
        block = bytes(MiB)
        for _ in range(self.size // MiB):
            piece = packer.compress(block)
            if piece:
                self.chunks_sent += 1
                yield piece
        yield packer.flush()


async def test_a_compressed_answer_is_never_inflated(domain: Domain) -> None:
    """Content-Encoding: gzip on 256 MiB of zeros: the prefix is read raw, so what the
    dispatcher holds is bounded by the bytes received, not by what they would inflate to."""
    bomb = _GzipBomb(256 * MiB)

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-encoding": "gzip"}, stream=bomb)

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
        dispatcher = WebhookDispatcher(
            domain.sessions, domain.clock, http, master=MASTER, allow_private=True
        )
        workspace = await domain.admin.workspace("gzip-bomb")
        queued = await _queue_to(domain, workspace, "https://localhost:8443/bomb")
        tracemalloc.start()
        try:
            assert await _attempt_due(dispatcher)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    row = await _delivery(domain, queued.id)
    assert (row.status, row.last_status) == ("delivered", 200)
    assert peak < 16 * MiB, f"{peak / MiB:.0f} MiB held for a compressed answer"
    assert bomb.chunks_sent < 64  # the rest of the body was never asked for
