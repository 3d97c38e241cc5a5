"""What the operator does to workspaces — list and create them, issue a workspace's
management key, add credits to its account — for both the operator CLI (server/cli.py) and
the operator routes (/api/v1/workspaces..., server/services/operator.py): one set of rules."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from server.accounts import keys as key_store
from server.accounts.workspaces import account_of
from server.billing.ledger import add_credits
from server.billing.money import AmountError, exact_micros, micros_to_json_number
from server.billing.usage import ACCOUNT, read_usage, read_usages
from server.clock import rfc3339
from server.db.models import Account, ApiKey, Generation, LedgerEntry, VideoJob, Workspace
from server.errors import GatewayError, bad_request, not_found

# A video job still to finish (server/videos: pending → in_progress → a terminal state).
UNFINISHED_JOB_STATUSES = ("pending", "in_progress")


@dataclass(frozen=True)
class WorkspaceView:
    """A workspace with its account's money, as the operator sees it."""

    workspace: Workspace
    credits_purchased_micros: int
    usage_micros: int
    counts: WorkspaceCounts

    def document(self) -> dict[str, Any]:
        w = self.workspace
        return {
            "id": w.id,
            "name": w.name,
            "account_id": w.account_id,
            "intern_programme": w.intern_programme,
            "vault_writes_disabled": w.vault_writes_disabled,
            "default_callback_url": w.default_callback_url,
            "created_at": rfc3339(w.created_at),
            "total_credits": micros_to_json_number(self.credits_purchased_micros),
            "total_usage": micros_to_json_number(self.usage_micros),
            "disabled": w.disabled,
            "requests": self.counts.requests,
            "keys": self.counts.keys,
            "unfinished_video_jobs": self.counts.unfinished_video_jobs,
        }


@dataclass(frozen=True)
class WorkspaceCounts:
    """What the operator weighs before turning a workspace off: its requests so far, the
    keys that would be refused, the video jobs still running (they finish either way)."""

    requests: int = 0
    keys: int = 0
    unfinished_video_jobs: int = 0


async def workspace_counts(
    session: AsyncSession, workspace_ids: list[str]
) -> dict[str, WorkspaceCounts]:
    """The counts of these workspaces, three grouped statements for the whole page."""
    if not workspace_ids:
        return {}
    found: dict[str, dict[str, int]] = {w: {} for w in workspace_ids}
    queries = {
        "requests": select(Generation.workspace_id, sa.func.count())
        .where(col(Generation.workspace_id).in_(workspace_ids))
        .group_by(col(Generation.workspace_id)),
        "keys": select(ApiKey.workspace_id, sa.func.count())
        .where(col(ApiKey.workspace_id).in_(workspace_ids))
        .group_by(col(ApiKey.workspace_id)),
        "unfinished_video_jobs": select(VideoJob.workspace_id, sa.func.count())
        .where(
            col(VideoJob.workspace_id).in_(workspace_ids),
            col(VideoJob.status).in_(UNFINISHED_JOB_STATUSES),
        )
        .group_by(col(VideoJob.workspace_id)),
    }
    for name, query in queries.items():
        for workspace_id, count in (await session.exec(query)).all():
            found[workspace_id][name] = int(count)
    return {w: WorkspaceCounts(**counts) for w, counts in found.items()}


async def workspace_view(
    session: AsyncSession, workspace: Workspace, now: datetime
) -> WorkspaceView:
    account = await account_of(session, workspace)
    await session.refresh(account)  # a purchase in this transaction is seen
    usage = await read_usage(session, ACCOUNT, account.id, now)
    counts = await workspace_counts(session, [workspace.id])
    return WorkspaceView(
        workspace, account.credits_purchased_micros, usage.spend["all"], counts[workspace.id]
    )


async def list_workspaces(
    session: AsyncSession, now: datetime, offset: int, limit: int
) -> tuple[list[WorkspaceView], int]:
    """Every workspace, by name, paged, and how many there are."""
    total = (await session.exec(select(sa.func.count()).select_from(Workspace))).one()
    rows = await session.exec(
        select(Workspace, Account)
        .join(Account, col(Account.id) == Workspace.account_id)
        .order_by(col(Workspace.name))
        .offset(offset)
        .limit(limit)
    )
    pairs = rows.all()
    usages = await read_usages(session, [(ACCOUNT, account.id) for _, account in pairs], now)
    counts = await workspace_counts(session, [workspace.id for workspace, _ in pairs])
    views = [
        WorkspaceView(
            workspace,
            account.credits_purchased_micros,
            usages[(ACCOUNT, account.id)].spend["all"],
            counts[workspace.id],
        )
        for workspace, account in pairs
    ]
    return views, int(total)


async def workspace_for_operator(session: AsyncSession, workspace_id: str) -> Workspace:
    workspace = await session.get(Workspace, workspace_id)
    if workspace is None:
        raise not_found(f"no workspace {workspace_id!r}")
    return workspace


async def issue_management_key(
    session: AsyncSession,
    workspace: Workspace,
    name: str,
    now: datetime,
    *,
    expires_at: datetime | None = None,
) -> tuple[ApiKey, str]:
    """A management key of the workspace (its first one, typically): the plaintext is
    returned once and never stored. The caller commits."""
    return await key_store.create_key(
        session,
        workspace=workspace,
        name=key_store.check_name(name),
        now=now,
        limit=key_store.KeyLimit(None, None),
        management=True,
        expires_at=expires_at,
    )


async def add_workspace_credits(
    session: AsyncSession,
    workspace: Workspace,
    amount: Decimal | str,
    now: datetime,
    *,
    reference: str,
    param: str = "amount",
) -> LedgerEntry:
    """Record a credit purchase for the workspace's account: more than 0, at most 1e9 USD,
    whole micro-dollars (refused, never rounded), and the account's purchases stay within
    1e9 USD in total; anything else is a 400 naming `param`. The caller commits."""
    try:
        micros = exact_micros(amount)
    except AmountError as exc:
        raise _refused(param, exc) from exc
    if micros <= 0:
        raise bad_request(f"{param} must be greater than 0", param=param)
    try:
        return await add_credits(session, workspace.account_id, micros, now, reference=reference)
    except AmountError as exc:
        raise _refused(param, exc) from exc


def _refused(param: str, error: AmountError) -> GatewayError:
    """ "amount must be ...", "amount would take ...", "amount: not an amount of money"."""
    reason = str(error)
    joined = " " if reason.startswith(("must", "would")) else ": "
    return bad_request(f"{param}{joined}{reason}", param=param)
