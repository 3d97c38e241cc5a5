"""The webhook dispatcher in-process: delivers once and signs; retries on the backoff
schedule (a ManualClock decides when a retry is due); 410 stops; every attempt keeps the
delivery's webhook-id."""

from __future__ import annotations

import asyncio
import json
import secrets
from datetime import timedelta

import pytest
from standardwebhooks import Webhook

from server.db.models import WebhookDelivery
from server.vault.crypto import MasterKey
from server.vault.webhook_secrets import workspace_secret
from server.webhooks.signing import openrouter_signature
from server.workers.webhook_dispatcher import RETRY_SCHEDULE, WebhookDispatcher
from tests.support.domain import Domain
from tests.support.eventually import eventually

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
