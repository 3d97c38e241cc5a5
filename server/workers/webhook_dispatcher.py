"""The webhook outbox dispatcher: each delivery is signed both as OpenRouter signs
(`X-OpenRouter-Signature`, `X-OpenRouter-Idempotency-Key`) and as Standard Webhooks does
(server/webhooks/signing.py). Each delivery keeps one `webhook-id` and one idempotency key
across retries (at-least-once); 2xx ends it, 410 stops it, anything else is retried on a
schedule of about a day. Deliveries are claimed with a lease like video jobs, so several
server processes never send one at the same moment.

A receiver is whoever a client named, so every attempt is bounded in memory and time: one
deadline covers it whole — DNS, connect, TLS, the request, the answer's status and a small
prefix of its body; the status is what counts, the rest of a body is never read (the
connection is closed rather than drained). Attempts run concurrently, up to
`concurrency` per process, and at most `workspace_concurrency` of one workspace's at once
across every process (the claim counts the workspace's live leases in the database): a
workspace whose receiver is slow fills its own share, and every other workspace's webhooks
go out beside it. On stop nothing new is claimed and the attempts in flight end by their
deadline."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import AsyncGenerator
from datetime import timedelta
from typing import cast

import httpx
import sqlalchemy as sa

from server.clock import Clock
from server.db.engine import SessionFactory, is_database_unavailable
from server.db.models import WebhookDelivery
from server.vault.crypto import MasterKey
from server.vault.webhook_secrets import workspace_secret
from server.webhooks.signing import signature_headers
from server.webhooks.targets import (
    Lookup,
    RefusedTarget,
    UnresolvedTarget,
    dns_lookup,
    resolve_target,
)
from server.workers.leases import Claimer
from server.workers.loop import ClaimedWork

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
# The defaults of the settings (server/config.py: GATEWAY_WEBHOOK_*).
DEADLINE_SECONDS = 10.0
CONCURRENCY = 16
WORKSPACE_CONCURRENCY = 4
MAX_ANSWER_BYTES = 16 * 1024
# A lease outlives its attempt's deadline by this much: room for reading the workspace's
# secret before the attempt and recording its outcome after it, so that another process
# never takes up a delivery still being attempted.
LEASE_MARGIN = timedelta(minutes=1)
# PostgreSQL: webhook claims of every process take this transaction lock in turn (Claimer).
CLAIM_LOCK_KEY = 0x67_77_68_6B

_DELIVERIES = WebhookDelivery.__table__


def _claimer(workspace_concurrency: int) -> Claimer:
    """Claiming a pending delivery whose next attempt is due, with a lease, of a workspace
    with fewer than `workspace_concurrency` deliveries leased (in flight) right now."""
    return Claimer(
        WebhookDelivery,
        ready_statuses=("pending",),
        due_column="next_attempt_at",
        per_workspace=workspace_concurrency,
        lock_key=CLAIM_LOCK_KEY,
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
        deadline: float = DEADLINE_SECONDS,
        concurrency: int = CONCURRENCY,
        workspace_concurrency: int = WORKSPACE_CONCURRENCY,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
        idle_wait: float = 0.5,
        lookup: Lookup = dns_lookup,
    ) -> None:
        self._sessions = sessions
        self._clock = clock
        self._http = http
        self._master = master
        self._allow_private = allow_private
        self._deadline = deadline
        self._concurrency = concurrency
        self._max_answer_bytes = max_answer_bytes
        self._lease = timedelta(seconds=deadline) + LEASE_MARGIN
        self._claimer = _claimer(workspace_concurrency)
        self._idle_wait = idle_wait
        self._lookup = lookup
        self.owner = f"webhooks-{secrets.token_hex(6)}"
        self.wake = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        """Claim and attempt due deliveries, up to `concurrency` at a time, until `stop`;
        then wait for the attempts in flight, each of which ends by its deadline."""
        await ClaimedWork(
            claim=self.claim,
            handle=self._attempt_logged,
            key=lambda delivery: delivery.id,
            at_once=self._concurrency,
            wake=self.wake,
            idle_wait=self._idle_wait,
            log=log,
        ).run(stop)

    async def _attempt_logged(self, delivery: WebhookDelivery) -> None:
        """One attempt in its own task; a failure to record it leaves the lease to lapse,
        and the delivery is taken up again then."""
        try:
            await self.attempt(delivery)
        except Exception as exc:
            if is_database_unavailable(exc):
                log.warning("webhook %s: outcome not recorded, database unavailable", delivery.id)
            else:
                log.exception("webhook %s: attempt failed", delivery.id)

    async def claim(self) -> WebhookDelivery | None:
        async with self._sessions() as session:
            delivery: WebhookDelivery | None = await self._claimer.claim(
                session, owner=self.owner, now=self._clock.now(), lease=self._lease
            )
            return delivery

    async def attempt(self, delivery: WebhookDelivery) -> None:
        status: int | None = None
        error: str | None = None
        refused = False
        secret = await workspace_secret(
            self._sessions, self._master, delivery.workspace_id, self._clock.now()
        )
        try:
            async with asyncio.timeout(self._deadline):
                response = await self._post(delivery, secret)
                try:
                    status = response.status_code
                    await self._read_prefix(response)
                finally:
                    await response.aclose()  # closes the connection unless the body ended
        except TimeoutError:
            if status is None:
                error = f"deadline: no answer within {self._deadline:g} s"
            # else the status came and counts: only reading the prefix was cut short
        except RefusedTarget as exc:
            error, refused = f"refused: {exc}", True
        except UnresolvedTarget as exc:
            error = f"dns: {exc}"  # retried like any failed delivery
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}"
        await self._record(delivery, status, error, refused=refused)

    async def _post(self, delivery: WebhookDelivery, secret: str) -> httpx.Response:
        """POST the delivery to its checked, pinned address; the answer as soon as its head
        is in (its body not read)."""
        target = await resolve_target(
            delivery.url, allow_private=self._allow_private, lookup=self._lookup
        )
        headers = {
            "content-type": "application/json",
            "host": target.host_header,
            "user-agent": "inference-gateway-webhooks/1",
            **signature_headers(
                secret,
                delivery.id,
                self._clock.now(),
                delivery.payload,
                job_id=delivery.job_id,
                status=_job_status(delivery.payload),
            ),
        }
        request = self._http.build_request(
            "POST",
            target.url,
            content=delivery.payload.encode(),
            headers=headers,
            timeout=self._deadline,
            extensions={"sni_hostname": target.sni_hostname},
        )
        return await self._http.send(request, stream=True)

    async def _read_prefix(self, response: httpx.Response) -> None:
        """Read at most `max_answer_bytes` of the answer's body and drop them: a body that
        ends within them leaves its connection to be reused; the rest of a longer one is
        never read. Raw bytes: a compressed body is not inflated (a small answer could
        inflate to a huge one). The status already counts: a body cut short changes
        nothing."""
        if response.is_stream_consumed:  # it arrived whole with the head, already read
            return
        read = 0
        with contextlib.suppress(httpx.HTTPError):
            raw = cast(AsyncGenerator[bytes, None], response.aiter_raw())  # a generator
            async with contextlib.aclosing(raw) as chunks:
                async for chunk in chunks:
                    read += len(chunk)
                    if read >= self._max_answer_bytes:
                        return

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
