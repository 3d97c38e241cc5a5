"""BYOK service: /api/v1/byok, for management keys only. The key itself never leaves: each
answer shows its masked label."""

from __future__ import annotations

from typing import Any

import grpc
from sqlmodel.ext.asyncio.session import AsyncSession

from server.accounts.workspaces import workspace_ids_of_account, workspace_of_account
from server.auth import Authenticator, Principal
from server.byok import keys as store
from server.clock import Clock, rfc3339
from server.contract import byok_pb2, byok_pb2_grpc
from server.db.engine import SessionFactory
from server.db.models import ByokKey
from server.routing.catalog import Catalog
from server.services.rpc import (
    answer_with_status,
    bool_or_null,
    list_or_null,
    metadata_of,
    nullable_bool,
    nullable_string,
    string_or_null,
    strings_or_null,
)
from server.vault.crypto import MasterKey

Changes = byok_pb2.CreateByokKeyRequest | byok_pb2.UpdateByokKeyRequest
_FLAGS = ("is_fallback", "is_required", "is_byok_only", "disabled")
_LISTS = ("allowed_models", "allowed_api_key_hashes", "allowed_user_ids")


def byok_key_message(row: ByokKey) -> byok_pb2.ByokKey:
    return byok_pb2.ByokKey(
        id=row.id,
        provider=row.provider,
        name=nullable_string(row.name),
        label=row.label,
        sort_order=row.sort_order,
        is_fallback=row.is_fallback,
        is_required=row.is_required,
        is_byok_only=row.is_byok_only,
        disabled=row.disabled,
        allowed_models=list_or_null(row.allowed_models),
        allowed_api_key_hashes=list_or_null(row.allowed_api_key_hashes),
        allowed_user_ids=list_or_null(row.allowed_user_ids),
        declared_region=nullable_string(row.declared_region),
        declared_zdr=nullable_bool(row.declared_zdr),
        workspace_id=nullable_string(row.workspace_id),
        created_at=rfc3339(row.created_at),
    )


class ByokService(byok_pb2_grpc.ByokServicer):
    def __init__(
        self,
        auth: Authenticator,
        sessions: SessionFactory,
        clock: Clock,
        catalog: Catalog,
        master: MasterKey,
    ) -> None:
        self._auth = auth
        self._sessions = sessions
        self._clock = clock
        self._catalog = catalog
        self._master = master

    async def _principal(
        self, session: AsyncSession, context: grpc.aio.ServicerContext
    ) -> Principal:
        return await self._auth.authenticate_management(session, metadata_of(context))

    def _changes(self, request: Changes) -> dict[str, Any]:
        """The members the request sets, validated; nothing is written before all pass."""
        given: dict[str, Any] = {}
        if request.HasField("name"):
            given["name"] = string_or_null(request.name, "name")
        for flag in _FLAGS:
            if request.HasField(flag):
                given[flag] = getattr(request, flag)
        for name in _LISTS:
            if request.HasField(name):
                given[name] = strings_or_null(getattr(request, name), name)
        if request.HasField("declared_region"):
            given["declared_region"] = string_or_null(request.declared_region, "declared_region")
        if request.HasField("declared_zdr"):
            given["declared_zdr"] = bool_or_null(request.declared_zdr, "declared_zdr")
        return store.check_changes(self._catalog, given)

    async def _workspace_id(
        self,
        session: AsyncSession,
        principal: Principal,
        request: byok_pb2.ListByokKeysRequest | byok_pb2.CreateByokKeyRequest,
    ) -> str:
        """The workspace the request names (one of the account's), else the caller's own."""
        named = request.workspace_id if request.HasField("workspace_id") else None
        return await workspace_of_account(
            session, principal.account.id, named, principal.workspace.id
        )

    async def _account_key(
        self, session: AsyncSession, principal: Principal, key_id: str
    ) -> ByokKey:
        workspace_ids = await workspace_ids_of_account(session, principal.account.id)
        return await store.find_key(session, key_id, workspace_ids)

    async def ListByokKeys(
        self, request: byok_pb2.ListByokKeysRequest, context: grpc.aio.ServicerContext
    ) -> byok_pb2.ListByokKeysResponse:
        async with self._sessions() as session:
            principal = await self._principal(session, context)
            workspace_id = await self._workspace_id(session, principal, request)
            rows, total = await store.list_keys(
                session,
                workspace_id,
                provider=request.provider if request.HasField("provider") else None,
                offset=request.offset if request.HasField("offset") else 0,
                limit=request.limit if request.HasField("limit") else 50,
            )
        return byok_pb2.ListByokKeysResponse(
            data=[byok_key_message(row) for row in rows], total_count=total
        )

    async def CreateByokKey(
        self, request: byok_pb2.CreateByokKeyRequest, context: grpc.aio.ServicerContext
    ) -> byok_pb2.ByokKeyResponse:
        async with self._sessions() as session:
            principal = await self._principal(session, context)
            changes = self._changes(request)
            workspace_id = await self._workspace_id(session, principal, request)
            row = await store.create_key(
                session,
                self._master,
                self._catalog,
                workspace_id=workspace_id,
                provider=request.provider,
                key=request.key,
                changes=changes,
                now=self._clock.now(),
            )
            await session.commit()
        await answer_with_status(context, 201)
        return byok_pb2.ByokKeyResponse(data=byok_key_message(row))

    async def GetByokKey(
        self, request: byok_pb2.GetByokKeyRequest, context: grpc.aio.ServicerContext
    ) -> byok_pb2.ByokKeyResponse:
        async with self._sessions() as session:
            principal = await self._principal(session, context)
            row = await self._account_key(session, principal, request.id)
        return byok_pb2.ByokKeyResponse(data=byok_key_message(row))

    async def UpdateByokKey(
        self, request: byok_pb2.UpdateByokKeyRequest, context: grpc.aio.ServicerContext
    ) -> byok_pb2.ByokKeyResponse:
        async with self._sessions() as session:
            principal = await self._principal(session, context)
            changes = self._changes(request)
            if request.HasField("key"):
                changes["key"] = request.key
            row = await self._account_key(session, principal, request.id)
            await store.update_key(
                session, self._master, self._catalog, row, changes, self._clock.now()
            )
            await session.commit()
        return byok_pb2.ByokKeyResponse(data=byok_key_message(row))

    async def DeleteByokKey(
        self, request: byok_pb2.DeleteByokKeyRequest, context: grpc.aio.ServicerContext
    ) -> byok_pb2.DeleteByokKeyResponse:
        async with self._sessions() as session:
            principal = await self._principal(session, context)
            row = await self._account_key(session, principal, request.id)
            await store.delete_key(session, row)
            await session.commit()
        return byok_pb2.DeleteByokKeyResponse(deleted=True)
