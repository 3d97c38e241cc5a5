"""Accounts, workspaces and interns. A workspace created here gets an account of its own."""

from __future__ import annotations

import re
import secrets
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from server.db.models import Account, Intern, Workspace
from server.errors import GatewayError, bad_request, not_found
from server.webhooks.targets import check_callback_url

DEFAULT_WORKSPACE = "default"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def _check_name(name: str, what: str) -> None:
    if not _NAME.match(name):
        raise bad_request(
            f"{what} name must be 1-64 letters, digits, '.', '_' or '-', starting with a "
            "letter or digit",
            param="name",
        )


async def create_workspace(
    session: AsyncSession, name: str, now: datetime, *, intern_programme: bool = False
) -> Workspace:
    _check_name(name, "workspace")
    account = Account(id=new_id("acct"), name=name, created_at=now)
    workspace = Workspace(
        id=new_id("ws"),
        account_id=account.id,
        name=name,
        intern_programme=intern_programme,
        created_at=now,
    )
    session.add(account)
    await session.flush()
    session.add(workspace)
    try:
        await session.flush()
    except IntegrityError as exc:
        raise GatewayError(409, f"workspace {name!r} already exists") from exc
    return workspace


async def workspace_by_name(session: AsyncSession, name: str) -> Workspace:
    workspace = (await session.exec(select(Workspace).where(Workspace.name == name))).one_or_none()
    if workspace is None:
        raise not_found(f"no workspace named {name!r}")
    return workspace


async def workspace_by_id(session: AsyncSession, workspace_id: str) -> Workspace | None:
    return await session.get(Workspace, workspace_id)


async def default_workspace(session: AsyncSession, now: datetime) -> Workspace:
    """The workspace operator commands use when none is named; created on first use."""
    workspace = (
        await session.exec(select(Workspace).where(Workspace.name == DEFAULT_WORKSPACE))
    ).one_or_none()
    return workspace or await create_workspace(session, DEFAULT_WORKSPACE, now)


async def update_workspace(
    session: AsyncSession,
    workspace: Workspace,
    *,
    intern_programme: bool | None = None,
    vault_writes_disabled: bool | None = None,
    default_callback_url: str | None = None,
    disabled: bool | None = None,
) -> Workspace:
    if disabled is not None:
        workspace.disabled = disabled
    if intern_programme is not None:
        workspace.intern_programme = intern_programme
    if vault_writes_disabled is not None:
        workspace.vault_writes_disabled = vault_writes_disabled
    if default_callback_url is not None:
        if default_callback_url:
            check_callback_url(default_callback_url, "default_callback_url")
        workspace.default_callback_url = default_callback_url or None
    session.add(workspace)
    await session.flush()
    return workspace


async def create_intern(
    session: AsyncSession, workspace: Workspace, name: str, now: datetime
) -> Intern:
    _check_name(name, "intern")
    intern = Intern(id=new_id("intern"), workspace_id=workspace.id, name=name, created_at=now)
    session.add(intern)
    try:
        await session.flush()
    except IntegrityError as exc:
        raise GatewayError(409, f"intern {name!r} already exists in {workspace.name!r}") from exc
    return intern


async def intern_by_name(session: AsyncSession, workspace: Workspace, name: str) -> Intern:
    """The workspace's intern of that name (names are unique within a workspace); 404 else."""
    intern = (
        await session.exec(
            select(Intern).where(Intern.workspace_id == workspace.id, Intern.name == name)
        )
    ).one_or_none()
    if intern is None:
        raise GatewayError(404, f"no intern named {name!r} in that workspace")
    return intern


async def account_of(session: AsyncSession, workspace: Workspace) -> Account:
    account = await session.get(Account, workspace.account_id)
    if account is None:  # a foreign key guarantees it; a missing row is corruption
        raise RuntimeError(f"workspace {workspace.id} has no account")
    return account


async def workspace_ids_of_account(session: AsyncSession, account_id: str) -> list[str]:
    rows = await session.exec(  # type: ignore[call-overload]  # sqlmodel's exec() is typed for its own select() only
        sa.select(col(Workspace.id)).where(col(Workspace.account_id) == account_id)
    )
    return [row[0] for row in rows]


async def workspace_of_account(
    session: AsyncSession, account_id: str, wanted: str | None, default: str
) -> str:
    """A workspace a management request may act on: `wanted` if it belongs to the account
    (404 otherwise: another account's workspace is indistinguishable from none), else
    `default` (the caller's own)."""
    if not wanted:
        return default
    if wanted not in await workspace_ids_of_account(session, account_id):
        raise not_found(f"workspace {wanted!r} not found")
    return wanted
