"""The webhook outbox dispatcher: each delivery is signed both as OpenRouter signs
(`X-OpenRouter-Signature`, `X-OpenRouter-Idempotency-Key`) and as Standard Webhooks does
(server/webhooks/signing.py). Each delivery keeps one `webhook-id` and one idempotency key
across retries (at-least-once); 2xx ends it, 410 stops it, anything else is retried on a
schedule of about a day. Deliveries are claimed with a lease like video jobs, so several
server processes never send one at the same moment."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from datetime import timedelta

import httpx
import sqlalchemy as sa

from server.clock import Clock
from server.db.engine import SessionFactory
from server.db.models import WebhookDelivery
from server.vault.crypto import MasterKey
from server.vault.webhook_secrets import workspace_secret
from server.webhooks.signing import signature_headers
from server.webhooks.targets import RefusedTarget, UnresolvedTarget, resolve_target
from server.workers.leases import Claimer
from server.workers.loop import run_until_stopped

log = logging.getLogger("gateway.webhooks")

RETRY_SCHEDULE = (
    timedelta(seconds=5),
    timedelta(minutes=5),
    timedelta(minutes=30),
    timedelta(hours=2),
    timedelta(hours=5),
    timedelta(hours=10),
    timedelta(hours=10),
)
_DELIVERIES = WebhookDelivery.__table__
# Claiming a pending delivery whose next attempt is due, with a lease.
_CLAIMER = Claimer(
    WebhookDelivery, ready=_DELIVERIES.c.status == "pending", due_column="next_attempt_at"
)


def _job_status(payload: str) -> str:
    """The job status the event reports (`data.status` of the body the worker queued)."""
    try:
        data = json.loads(payload).get("data") or {}
        return str(data.get("status") or "unknown")
    except (ValueError, AttributeError):
        return "unknown"


class WebhookDispatcher:
    def __init__(
        self,
        sessions: SessionFactory,
        clock: Clock,
        http: httpx.AsyncClient,
        *,
        master: MasterKey,  # opens the workspaces' sealed signing secrets
        allow_private: bool = False,
        lease: timedelta = timedelta(minutes=1),
        idle_wait: float = 0.5,
        timeout: float = 10.0,
    ) -> None:
        self._sessions = sessions
        self._clock = clock
        self._http = http
        self._master = master
        self._allow_private = allow_private
        self._lease = lease
        self._idle_wait = idle_wait
        self._timeout = timeout
        self.owner = f"webhooks-{secrets.token_hex(6)}"
        self.wake = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        await run_until_stopped(self._work_once, stop, self.wake, self._idle_wait, log)

    async def _work_once(self) -> bool:
        delivery = await self.claim()
        if delivery is None:
            return False
        await self.attempt(delivery)
        return True

    async def claim(self) -> WebhookDelivery | None:
        async with self._sessions() as session:
            delivery: WebhookDelivery | None = await _CLAIMER.claim(
                session, owner=self.owner, now=self._clock.now(), lease=self._lease
            )
            return delivery

    async def attempt(self, delivery: WebhookDelivery) -> None:
        status: int | None = None
        error: str | None = None
        try:
            secret = await workspace_secret(
                self._sessions, self._master, delivery.workspace_id, self._clock.now()
            )
            target = await resolve_target(delivery.url, allow_private=self._allow_private)
            sent_at = self._clock.now()
            headers = {
                "content-type": "application/json",
                "host": target.host_header,
                "user-agent": "inference-gateway-webhooks/1",
                **signature_headers(
                    secret,
                    delivery.id,
                    sent_at,
                    delivery.payload,
                    job_id=delivery.job_id,
                    status=_job_status(delivery.payload),
                ),
            }
            response = await self._http.post(
                target.url,
                content=delivery.payload.encode(),
                headers=headers,
                timeout=self._timeout,
                extensions={"sni_hostname": target.sni_hostname},
            )
            status = response.status_code
        except RefusedTarget as refused:
            error = f"refused: {refused}"
        except UnresolvedTarget as unresolved:
            error = f"dns: {unresolved}"  # retried like any failed delivery
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}"
        await self._record(
            delivery, status, error, refused=error is not None and error.startswith("refused")
        )

    async def _record(
        self, delivery: WebhookDelivery, status: int | None, error: str | None, *, refused: bool
    ) -> None:
        now = self._clock.now()
        attempts = delivery.attempts + 1
        values: dict[str, object] = {
            "attempts": attempts,
            "last_status": status,
            "last_error": error,
            "lease_owner": None,
            "lease_expires_at": None,
        }
        if status is not None and 200 <= status < 300:
            values.update(status="delivered", delivered_at=now)
        elif status == 410 or refused:
            values.update(status="stopped")
        elif attempts > len(RETRY_SCHEDULE):
            values.update(status="failed")
        else:
            values.update(next_attempt_at=now + RETRY_SCHEDULE[attempts - 1])
        async with self._sessions() as session:
            await session.exec(
                sa.update(_DELIVERIES)
                .where(_DELIVERIES.c.id == delivery.id, _DELIVERIES.c.lease_owner == self.owner)
                .values(**values)
            )
            await session.commit()
        log.info(
            "webhook %s to job %s: %s",
            delivery.id,
            delivery.job_id,
            values.get("status", f"retry in {values.get('next_attempt_at')}"),
        )
