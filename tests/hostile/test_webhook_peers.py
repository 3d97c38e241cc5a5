"""Hostile webhook receivers against a real gateway (issue 29, items 2 and 3): a receiver at
a client-chosen callback URL answering a huge or endless body, or trickling, or never
answering. The server reads at most a small prefix of an answer (its RSS stays put), every
attempt ends by its deadline, and one workspace's slow receiver — and its retries — never
delays another workspace's webhook.

One gateway for the module, with short bounds (a 3 s deadline, 4 deliveries at once, 2 per
workspace) and a HostilePeer over HTTPS with a test CA it trusts. Deliveries are queued
straight into the outbox (as a finished job queues them), so each test controls which
receiver is slow and when the other workspace's webhook is due."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
import pytest_asyncio

from server.db.engine import create_engine, session_factory
from server.db.models import WebhookDelivery, Workspace
from testkit.admin import Admin
from testkit.eventually import eventually
from testkit.processes import GatewayProcess
from tests.conftest import Databases
from tests.fakes.hostile_peer import HostilePeer
from tests.support.rss import RssSampler, rss_bytes, settle_rss

MiB = 1024 * 1024
DEADLINE = 3.0
PAYLOAD = '{"type":"video.generation.completed","data":{"id":"vid_x","status":"completed"}}'


@dataclass
class Hostile:
    gateway: GatewayProcess
    peer: HostilePeer
    admin: Admin

    @property
    def pid(self) -> int:
        assert self.gateway.process is not None
        return self.gateway.process.pid

    async def queue(self, workspace: Workspace, path: str) -> str:
        """A due delivery of `workspace` to the peer's `path`; its id."""
        now = datetime.now(UTC)
        delivery_id = f"msg_{secrets.token_hex(12)}"
        async with self.admin.sessions() as session:
            session.add(
                WebhookDelivery(
                    id=delivery_id,
                    workspace_id=workspace.id,
                    job_id="vid_x",
                    url=self.peer.url(path),
                    payload=PAYLOAD,
                    status="pending",
                    next_attempt_at=now,
                    created_at=now,
                )
            )
            await session.commit()
        return delivery_id

    async def row(self, delivery_id: str) -> WebhookDelivery:
        async with self.admin.sessions() as session:
            row = await session.get(WebhookDelivery, delivery_id, populate_existing=True)
        assert row is not None
        return row

    async def settled(self, delivery_id: str, within: float = 30) -> WebhookDelivery:
        async def ended() -> WebhookDelivery | None:
            row = await self.row(delivery_id)
            return row if row.status != "pending" else None

        return await eventually(ended, within=within, message=f"{delivery_id} settled")

    async def attempted(self, delivery_id: str, attempts: int, within: float = 30) -> None:
        """Until the delivery's `attempts`-th attempt has been recorded."""

        async def recorded() -> bool:
            return (await self.row(delivery_id)).attempts >= attempts

        await eventually(recorded, within=within, message=f"{delivery_id} tried {attempts}x")

    def arrived(self, delivery_id: str) -> list[float]:
        """When each attempt of the delivery reached the peer (time.monotonic())."""
        return [r.arrived for r in self.peer.requests if r.headers.get("webhook-id") == delivery_id]

    async def reached(self, delivery_id: str, count: int = 1, within: float = 30) -> None:
        await eventually(
            lambda: len(self.arrived(delivery_id)) >= count,
            within=within,
            message=f"{count} requests of {delivery_id} at the peer",
        )


@pytest_asyncio.fixture(scope="module")
async def hostile(
    tmp_path_factory: pytest.TempPathFactory, databases: Databases
) -> AsyncIterator[Hostile]:
    folder = tmp_path_factory.mktemp("webhook-peers")
    # The peer's own bounds end what an unbounded reader would take (the suite stops by
    # itself even against a dispatcher that reads without end).
    peer = HostilePeer(tls_ca_file=folder / "ca.pem", max_seconds=20, max_bytes=512 * MiB)
    peer.start()
    url = await databases.new("sqlite")
    gateway = GatewayProcess(
        data_dir=folder / "gw",
        database_url=url,
        extra_env={
            "GATEWAY_WEBHOOK_CA_BUNDLE": str(folder / "ca.pem"),
            "GATEWAY_WEBHOOK_ALLOW_PRIVATE": "1",
            "GATEWAY_WEBHOOK_DEADLINE_SECONDS": str(DEADLINE),
            "GATEWAY_WEBHOOK_CONCURRENCY": "4",
            "GATEWAY_WEBHOOK_WORKSPACE_CONCURRENCY": "2",
        },
    )
    engine = create_engine(url)
    try:
        await asyncio.to_thread(gateway.start)
        yield Hostile(gateway, peer, Admin(session_factory(engine)))
    finally:
        await engine.dispose()
        await asyncio.to_thread(gateway.stop)
        peer.stop()


async def test_a_huge_answer_leaves_the_server_rss_bounded(hostile: Hostile) -> None:
    """The issue's 1.2 GiB answer: the delivery counts by its status (200), only a small
    prefix is read, and the connection is closed rather than drained."""
    workspace = await hostile.admin.workspace(f"huge-{secrets.token_hex(4)}")
    size = 1229 * MiB
    before = settle_rss(hostile.pid, within=3)
    sent_before = hostile.peer.bytes_sent
    with RssSampler(hostile.pid) as sampler:
        delivery_id = await hostile.queue(workspace, f"/huge/{size}")
        row = await hostile.settled(delivery_id, within=30)
    assert (row.status, row.last_status, row.attempts) == ("delivered", 200, 1)
    grown = sampler.peak - before
    assert grown < 48 * MiB, f"server RSS grew {grown / MiB:.0f} MiB for a huge answer"
    # The peer could push only what the sockets' buffers and the prefix took.
    await asyncio.sleep(0.2)
    assert hostile.peer.bytes_sent - sent_before < 64 * MiB
    assert rss_bytes(hostile.pid) - before < 48 * MiB


async def test_an_endless_answer_does_not_hold_the_delivery(hostile: Hostile) -> None:
    workspace = await hostile.admin.workspace(f"endless-{secrets.token_hex(4)}")
    started = time.monotonic()
    delivery_id = await hostile.queue(workspace, "/endless")
    row = await hostile.settled(delivery_id, within=DEADLINE + 10)
    assert time.monotonic() - started < DEADLINE + 2
    assert (row.status, row.last_status) == ("delivered", 200)


async def test_a_stalled_receiver_is_cut_at_the_deadline_and_retried(hostile: Hostile) -> None:
    workspace = await hostile.admin.workspace(f"stall-{secrets.token_hex(4)}")
    delivery_id = await hostile.queue(workspace, "/stall")
    await hostile.reached(delivery_id)
    (arrived,) = hostile.arrived(delivery_id)
    await hostile.attempted(delivery_id, 1, within=DEADLINE + 10)
    assert time.monotonic() - arrived < DEADLINE + 1.5
    row = await hostile.row(delivery_id)
    assert row.status == "pending" and row.last_status is None
    assert row.last_error is not None and "deadline" in row.last_error
    assert row.next_attempt_at > datetime.now(UTC) - timedelta(seconds=1)  # on the backoff


async def _latency(hostile: Hostile, delivery_id: str) -> float:
    row = await hostile.settled(delivery_id, within=30)
    assert (row.status, row.last_status) == ("delivered", 200)
    assert row.delivered_at is not None
    return (row.delivered_at - row.created_at).total_seconds()


async def test_a_slow_workspace_does_not_delay_another_workspaces_webhooks(
    hostile: Hostile,
) -> None:
    """Workspace A's receiver trickles a byte every 2 s (as in the issue) or never answers,
    with more deliveries than A may run at once; B's webhook, queued while A's are in
    flight, is delivered at once — before any of A's attempts ends — and again while A's
    stalled deliveries are being retried."""
    slow = await hostile.admin.workspace(f"slow-{secrets.token_hex(4)}")
    other = await hostile.admin.workspace(f"other-{secrets.token_hex(4)}")
    trickling = [await hostile.queue(slow, "/trickle/2000") for _ in range(2)]
    stalled = [await hostile.queue(slow, "/stall") for _ in range(2)]
    slow_ids = trickling + stalled
    # Two of A's deliveries are in flight (A's cap): B's comes due now.
    await eventually(
        lambda: sum(1 for d in slow_ids if hostile.arrived(d)) >= 2,
        within=10,
        message="A's first deliveries reached the peer",
    )
    first_started = min(t for d in slow_ids for t in hostile.arrived(d))
    fast = await hostile.queue(other, "/ok")
    latency = await _latency(hostile, fast)
    assert latency < 2.5, f"B's webhook took {latency:.1f} s behind A's slow receiver"
    (fast_arrived,) = hostile.arrived(fast)
    # B's reached its receiver before any of A's attempts could have ended.
    assert fast_arrived - first_started < DEADLINE
    # A's stalled deliveries fail at the deadline and are retried after 5 s: B's next
    # webhook, queued while a retry of A's is in flight, is not held either.
    for delivery_id in stalled:
        await hostile.attempted(delivery_id, 1, within=4 * DEADLINE + 10)
    await eventually(
        lambda: any(len(hostile.arrived(d)) >= 2 for d in stalled),
        within=2 * DEADLINE + 10,
        message="a retry of A's stalled delivery reached the peer",
    )
    again = await hostile.queue(other, "/ok")
    latency = await _latency(hostile, again)
    assert latency < 2.5, f"B's webhook took {latency:.1f} s behind A's retries"
