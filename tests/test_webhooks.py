"""Signed webhooks for video jobs (Standard Webhooks), delivered over real HTTPS to a
receiver with a test CA; retries, 410, and the address rules."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import httpx
import pytest
import sqlalchemy as sa
from standardwebhooks import Webhook

from server.accounts.workspaces import update_workspace, workspace_by_id
from server.db.models import WebhookDelivery
from server.vault.crypto import MasterKey, load_master_key
from server.vault.webhook_secrets import workspace_secret
from server.webhooks.targets import RefusedTarget, resolve_target
from server.workers.webhook_dispatcher import WebhookDispatcher
from testkit.admin import Admin, IssuedKey
from testkit.eventually import eventually
from testkit.fakes.webhook_receiver import ReceivedHook
from tests.conftest import Stack
from tests.support.openrouter_webhooks import verify_openrouter


@pytest.fixture
async def funded(stack: Stack, unique: str) -> IssuedKey:
    workspace = await stack.admin.workspace(f"hook-{unique}")
    await stack.admin.credits(workspace, "10")
    return await stack.admin.key(workspace, "hooks")


async def hooks_for(stack: Stack, path: str, count: int, within: float = 20) -> list[ReceivedHook]:
    def arrived() -> list[ReceivedHook]:
        hooks = stack.webhooks.hooks(path)
        return hooks if len(hooks) >= count else []

    return await eventually(arrived, within=within, message=f"{count} webhooks to {path}")


async def settled_delivery(stack: Stack, job_id: str, within: float = 20) -> WebhookDelivery:
    """The job's delivery once the dispatcher has recorded its end (delivered, stopped or
    failed): from then on it is never sent again, so no further hook can arrive."""

    async def ended() -> WebhookDelivery | None:
        async with stack.admin.sessions() as session:
            row = (
                await session.exec(
                    sa.select(WebhookDelivery).where(WebhookDelivery.job_id == job_id)
                )
            ).scalar_one_or_none()
        return row if row is not None and row.status != "pending" else None

    return await eventually(ended, within=within, message=f"the webhook of {job_id} settled")


async def submit(stack: Stack, issued: IssuedKey, **body: object) -> str:
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{stack.base_url}/videos",
            headers=issued.headers,
            json={"prompt": "x", "duration": 1, **body},
        )
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


async def test_completed_job_sends_one_verifiable_signed_webhook(
    stack: Stack, funded: IssuedKey, unique: str
) -> None:
    path = f"/ok/{unique}"
    job_id = await submit(
        stack, funded, model="local/renderer", callback_url=stack.webhooks.url(path)
    )
    (hook,) = await hooks_for(stack, path, 1)
    secret = await workspace_secret(
        stack.admin.sessions,
        load_master_key(stack.gateway.data_dir),
        funded.workspace.id,
        datetime.now(UTC),
    )
    assert secret.startswith("whsec_")
    payload = Webhook(secret).verify(hook.body, hook.headers)
    assert hook.headers["webhook-id"].startswith("msg_")
    assert abs(int(hook.headers["webhook-timestamp"]) - time.time()) < 60
    assert payload["type"] == "video.generation.completed"
    assert payload["data"]["id"] == job_id and payload["data"]["status"] == "completed"
    assert payload["data"]["model"] == "local/renderer"
    assert payload["data"]["usage"] == {"cost": 0.001, "is_byok": False}
    with pytest.raises(Exception):  # noqa: B017 (any verification failure)
        Webhook(secret).verify(hook.body + b" ", hook.headers)
    # A receiver written for OpenRouter verifies the same delivery unchanged.
    assert verify_openrouter(secret, hook.body, hook.headers["x-openrouter-signature"])
    assert not verify_openrouter(secret, hook.body + b" ", hook.headers["x-openrouter-signature"])
    assert hook.headers["x-openrouter-idempotency-key"] == f"{job_id}-completed"
    delivery = await settled_delivery(stack, job_id)
    assert (delivery.status, delivery.attempts) == ("delivered", 1)
    assert len(stack.webhooks.hooks(path)) == 1  # delivered once


async def test_failed_job_webhook_and_workspace_default_url(
    stack: Stack, funded: IssuedKey, unique: str
) -> None:
    path = f"/ok/default-{unique}"
    async with stack.admin.sessions() as session:
        workspace = await workspace_by_id(session, funded.workspace.id)
        assert workspace is not None
        await update_workspace(session, workspace, default_callback_url=stack.webhooks.url(path))
        await session.commit()
    await submit(stack, funded, model="fakevideo/provider-fails")
    (hook,) = await hooks_for(stack, path, 1)
    payload = json.loads(hook.body)
    assert payload["type"] == "video.generation.failed"
    assert payload["data"]["status"] == "failed" and payload["data"]["error"]


async def test_410_stops_and_errors_are_retried_with_the_same_id(
    stack: Stack, funded: IssuedKey, unique: str
) -> None:
    gone, flaky = f"/gone/{unique}", f"/flaky/{unique}"
    gone_job = await submit(
        stack, funded, model="local/renderer", callback_url=stack.webhooks.url(gone)
    )
    await submit(stack, funded, model="local/renderer", callback_url=stack.webhooks.url(flaky))
    first, retried = await hooks_for(stack, flaky, 2, within=30)  # retry after ~5 s
    assert first.headers["webhook-id"] == retried.headers["webhook-id"]
    stopped = await settled_delivery(stack, gone_job)
    assert (stopped.status, stopped.attempts, stopped.last_status) == ("stopped", 1, 410)
    assert len(stack.webhooks.hooks(gone)) == 1


@pytest.mark.parametrize(
    "url",
    [
        "https://127.0.0.1/hook",
        "https://localhost/hook",
        "https://10.1.2.3/hook",
        "https://192.168.0.10/hook",
        "https://169.254.169.254/latest/meta-data",
        "https://[::1]/hook",
        "https://[::ffff:127.0.0.1]/hook",
        "https://0.0.0.0/hook",
        "http://93.184.216.34/hook",
    ],
)
async def test_non_public_or_plain_http_targets_are_refused(url: str) -> None:
    with pytest.raises(RefusedTarget):
        await resolve_target(url, allow_private=False)


async def test_public_targets_are_pinned_to_the_checked_address() -> None:
    target = await resolve_target("https://93.184.216.34:8443/h?x=1", allow_private=False)
    assert target.url == "https://93.184.216.34:8443/h?x=1"
    assert target.host_header == "93.184.216.34:8443"
    allowed = await resolve_target("https://localhost:9999/h", allow_private=True)
    assert allowed.url.startswith("https://127.0.0.1:9999/") or "[::1]" in allowed.url
    assert allowed.sni_hostname == "localhost"


async def test_a_private_target_is_never_contacted(admin_db: Admin, unique: str) -> None:
    """Without the operator's permission the dispatcher refuses after resolving the name,
    and the delivery stops without a request being sent."""
    workspace = await admin_db.workspace(f"ssrf-{unique}")
    now = datetime.now(UTC)
    async with admin_db.sessions() as session:
        session.add(
            WebhookDelivery(
                id=f"msg_{unique}",
                workspace_id=workspace.id,
                job_id="vid_x",
                url="https://localhost:1/hook",
                payload="{}",
                status="pending",
                next_attempt_at=now,
                created_at=now,
            )
        )
        await session.commit()
    async with httpx.AsyncClient() as http:
        dispatcher = WebhookDispatcher(
            admin_db.sessions, admin_db.clock, http, master=MasterKey(b"\x07" * 32)
        )
        delivery = await dispatcher.claim()
        assert delivery is not None
        await dispatcher.attempt(delivery)
    async with admin_db.sessions() as session:
        stored = await session.get(WebhookDelivery, f"msg_{unique}", populate_existing=True)
    assert stored is not None and stored.status == "stopped"
    assert stored.last_error is not None and "non-public" in stored.last_error
    assert stored.last_status is None


async def _attempt_once(admin_db: Admin, delivery_id: str, url: str) -> WebhookDelivery:
    workspace = await admin_db.workspace(f"w-{delivery_id}")
    now = datetime.now(UTC)
    async with admin_db.sessions() as session:
        session.add(
            WebhookDelivery(
                id=delivery_id,
                workspace_id=workspace.id,
                job_id="vid_x",
                url=url,
                payload="{}",
                status="pending",
                next_attempt_at=now,
                created_at=now,
            )
        )
        await session.commit()
    async with httpx.AsyncClient() as http:
        dispatcher = WebhookDispatcher(
            admin_db.sessions, admin_db.clock, http, master=MasterKey(b"\x07" * 32)
        )
        delivery = await dispatcher.claim()
        assert delivery is not None and delivery.id == delivery_id
        await dispatcher.attempt(delivery)
    async with admin_db.sessions() as session:
        stored = await session.get(WebhookDelivery, delivery_id, populate_existing=True)
    assert stored is not None
    return stored


async def test_a_host_that_does_not_resolve_is_retried(admin_db: Admin, unique: str) -> None:
    """A failed DNS lookup may be temporary: the delivery stays pending with the normal
    backoff (5 s after the first attempt), it is not stopped."""
    before = datetime.now(UTC)
    stored = await _attempt_once(admin_db, f"msg_dns_{unique}", "https://does-not-exist.invalid/h")
    assert stored.status == "pending"
    assert stored.attempts == 1
    assert stored.last_error is not None and "resolve" in stored.last_error
    assert stored.next_attempt_at is not None
    wait = (stored.next_attempt_at.replace(tzinfo=UTC) - before).total_seconds()
    assert 4 <= wait <= 60


async def test_a_stored_url_with_an_invalid_port_stops_instead_of_raising(
    admin_db: Admin, unique: str
) -> None:
    """A URL stored before URLs were checked in full is refused once, not retried forever."""
    stored = await _attempt_once(admin_db, f"msg_port_{unique}", "https://example.com:99999/h")
    assert stored.status == "stopped"
    assert stored.last_error is not None and "valid URL" in stored.last_error
