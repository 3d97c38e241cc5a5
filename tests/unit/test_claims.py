"""Claiming a due row with a per-workspace cap (server/workers/leases.py Claimer), on each
backend: the earliest due, free, ready row of a workspace below its cap — found without
walking a capped workspace's rows (the claim steps from one workspace to the next)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from server.db.models import WebhookDelivery
from server.workers.leases import HEAD_ROWS, Claimer
from testkit.domain import Domain

_TABLE = WebhookDelivery.__table__
LEASE = timedelta(seconds=30)


def _row(
    row_id: str,
    workspace: str,
    due: datetime,
    *,
    status: str = "pending",
    leased_until: datetime | None = None,
) -> dict[str, Any]:
    return {
        "id": row_id,
        "workspace_id": workspace,
        "job_id": f"vid_{row_id}",
        "url": "https://receiver.test/hook",
        "payload": "{}",
        "status": status,
        "attempts": 0,
        "lease_owner": None if leased_until is None else "elsewhere",
        "lease_expires_at": leased_until,
        "next_attempt_at": due,
        "created_at": due,
    }


async def _claim(domain: Domain, claimer: Claimer) -> str | None:
    async with domain.sessions() as session:
        claimed = await claimer.claim(session, owner="test", now=domain.clock.now(), lease=LEASE)
    return None if claimed is None else str(claimed.id)


@pytest.mark.parametrize("backlog", [HEAD_ROWS // 2, HEAD_ROWS + 10])
async def test_a_claim_takes_the_earliest_due_row_of_a_workspace_below_its_cap(
    any_domain: Domain, backlog: int
) -> None:
    """Two ready statuses, a cap of two. Workspace A is at its cap with a backlog due before
    everything else: none of it is taken, nor its row of the second status. A lapsed lease
    is free and counts for nothing; rows not ready, or not yet due, are never taken. With a
    backlog shorter than the head the claim finds its row there; with a longer one, by the
    walk through the workspaces."""
    domain = any_domain
    now = domain.clock.now()
    claimer = Claimer(
        WebhookDelivery,
        ready_statuses=("pending", "second"),
        due_column="next_attempt_at",
        per_workspace=2,
        lock_key=0x74_65_73_74,
    )
    earlier = [now - timedelta(hours=1, seconds=n) for n in range(backlog)]
    rows = [
        _row("a-flight-1", "ws-a", now - timedelta(days=2), leased_until=now + LEASE),
        _row(
            "a-flight-2", "ws-a", now - timedelta(days=2), status="second", leased_until=now + LEASE
        ),
        *(_row(f"a-backlog-{n:02d}", "ws-a", due) for n, due in enumerate(earlier)),
        _row("a-second", "ws-a", now - timedelta(days=1), status="second"),
        _row("b-second", "ws-b", now - timedelta(seconds=10), status="second"),
        _row("b-pending", "ws-b", now - timedelta(seconds=5)),
        _row("b-third", "ws-b", now - timedelta(seconds=4)),  # B is at its cap by then
        _row("c-lapsed", "ws-c", now - timedelta(seconds=20), leased_until=now - LEASE),
        _row("d-delivered", "ws-d", now - timedelta(days=3), status="delivered"),
        _row(
            "d-leased-done",
            "ws-d",
            now - timedelta(days=3),
            status="delivered",
            leased_until=now + LEASE,
        ),
        _row("d-ready", "ws-d", now - timedelta(seconds=1)),
        _row("d-later", "ws-d", now + timedelta(minutes=1)),
    ]
    async with domain.sessions() as session:
        await session.exec(sa.insert(_TABLE), params=rows)  # type: ignore[call-overload]
        await session.commit()

    taken = [await _claim(domain, claimer) for _ in range(5)]

    # D's delivered rows under a lease are no work in flight: D is below its cap.
    assert taken == ["c-lapsed", "b-second", "b-pending", "d-ready", None]
