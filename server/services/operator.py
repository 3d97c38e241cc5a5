"""Operator service: /api/v1/workspaces... — workspaces, a workspace's management key and
credits, for the operator key only (server/accounts/operator.py); the rules are the CLI's
(server/accounts/provisioning.py)."""

from __future__ import annotations

from decimal import Decimal

import grpc
from google.protobuf import json_format, struct_pb2
from sqlmodel.ext.asyncio.session import AsyncSession

from server.accounts import provisioning
from server.accounts.keys import parse_expiry
from server.accounts.operator import OPERATOR_KEY_PATTERN, is_operator_key
from server.accounts.workspaces import account_of, create_workspace, update_workspace
from server.auth import Authenticator, bearer_token
from server.billing.purchases import purchase_document
from server.clock import Clock
from server.contract import management_pb2, management_pb2_grpc
from server.db.engine import SessionFactory
from server.errors import bad_request, forbidden, unauthorized
from server.observability.activity import page_of
from server.services.management import api_key_message
from server.services.rpc import answer_with_status, metadata_of, number_or_null, string_or_null

OPERATOR_REFERENCE = "operator API"


def _amount(value: struct_pb2.Value) -> Decimal | str:
    """The amount as the client wrote it: a JSON number, or a decimal string (exact, read by
    `parse_usd`'s grammar: no surrounding whitespace)."""
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return value.string_value
    if kind == "number_value":
        number = number_or_null(value, "amount")
        assert number is not None
        return number
    raise bad_request("amount must be a number of USD", param="amount")


class OperatorService(management_pb2_grpc.OperatorServicer):
    def __init__(self, auth: Authenticator, sessions: SessionFactory, clock: Clock) -> None:
        self._auth = auth
        self._sessions = sessions
        self._clock = clock

    async def _operator(self, session: AsyncSession, context: grpc.aio.ServicerContext) -> None:
        """Only the operator key: any valid API key (a management key included) is a 403, a
        wrong or missing key a 401."""
        metadata = metadata_of(context)
        token = bearer_token(metadata)
        if OPERATOR_KEY_PATTERN.match(token):
            if await is_operator_key(session, token):
                return
            raise unauthorized("Invalid operator key")
        await self._auth.authenticate(session, metadata)  # a 401 unless a valid API key
        raise forbidden("This operation requires the operator key")

    async def ListWorkspaces(
        self, request: management_pb2.ListWorkspacesRequest, context: grpc.aio.ServicerContext
    ) -> management_pb2.WorkspaceListResponse:
        page = page_of(
            request.offset if request.HasField("offset") else None,
            request.limit if request.HasField("limit") else None,
        )
        async with self._sessions() as session:
            await self._operator(session, context)
            views, total = await provisioning.list_workspaces(
                session, self._clock.now(), page.offset, page.limit
            )
        return json_format.ParseDict(
            {"data": [v.document() for v in views], "total_count": total},
            management_pb2.WorkspaceListResponse(),
        )

    async def CreateWorkspace(
        self, request: management_pb2.CreateWorkspaceRequest, context: grpc.aio.ServicerContext
    ) -> management_pb2.WorkspaceResponse:
        async with self._sessions() as session:
            await self._operator(session, context)
            now = self._clock.now()
            workspace = await create_workspace(
                session, request.name, now, intern_programme=request.intern_programme
            )
            await session.commit()
            view = await provisioning.workspace_view(session, workspace, now)
        await answer_with_status(context, 201)
        return management_pb2.WorkspaceResponse(
            data=json_format.ParseDict(view.document(), management_pb2.Workspace())
        )

    async def UpdateWorkspace(
        self, request: management_pb2.UpdateWorkspaceRequest, context: grpc.aio.ServicerContext
    ) -> management_pb2.WorkspaceResponse:
        async with self._sessions() as session:
            await self._operator(session, context)
            workspace = await provisioning.workspace_for_operator(session, request.workspace_id)
            await update_workspace(
                session,
                workspace,
                intern_programme=request.intern_programme
                if request.HasField("intern_programme")
                else None,
                vault_writes_disabled=request.vault_writes_disabled
                if request.HasField("vault_writes_disabled")
                else None,
                default_callback_url=request.default_callback_url
                if request.HasField("default_callback_url")
                else None,
                disabled=request.disabled if request.HasField("disabled") else None,
            )
            await session.commit()
            view = await provisioning.workspace_view(session, workspace, self._clock.now())
        return management_pb2.WorkspaceResponse(
            data=json_format.ParseDict(view.document(), management_pb2.Workspace())
        )

    async def CreateWorkspaceManagementKey(
        self,
        request: management_pb2.CreateWorkspaceKeyRequest,
        context: grpc.aio.ServicerContext,
    ) -> management_pb2.CreateKeyResponse:
        async with self._sessions() as session:
            await self._operator(session, context)
            expires_text = (
                string_or_null(request.expires_at, "expires_at")
                if request.HasField("expires_at")
                else None
            )
            expires_at = None if expires_text is None else parse_expiry(expires_text)
            workspace = await provisioning.workspace_for_operator(session, request.workspace_id)
            now = self._clock.now()
            key, plaintext = await provisioning.issue_management_key(
                session, workspace, request.name, now, expires_at=expires_at
            )
            await session.commit()
            message = await api_key_message(session, key, await account_of(session, workspace), now)
        await answer_with_status(context, 201)
        return management_pb2.CreateKeyResponse(data=message, key=plaintext)

    async def AddWorkspaceCredits(
        self,
        request: management_pb2.AddWorkspaceCreditsRequest,
        context: grpc.aio.ServicerContext,
    ) -> management_pb2.AddWorkspaceCreditsResponse:
        async with self._sessions() as session:
            await self._operator(session, context)
            amount = _amount(request.amount)
            workspace = await provisioning.workspace_for_operator(session, request.workspace_id)
            now = self._clock.now()
            entry = await provisioning.add_workspace_credits(
                session, workspace, amount, now, reference=OPERATOR_REFERENCE
            )
            await session.commit()
            view = await provisioning.workspace_view(session, workspace, now)
            purchase = purchase_document(entry)
        await answer_with_status(context, 201)
        return management_pb2.AddWorkspaceCreditsResponse(
            data=json_format.ParseDict(view.document(), management_pb2.Workspace()),
            purchase=json_format.ParseDict(purchase, management_pb2.CreditPurchaseRecord()),
        )
