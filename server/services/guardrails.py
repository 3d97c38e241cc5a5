"""Guardrails service: /api/v1/guardrails, for management keys only."""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf import struct_pb2
from sqlmodel.ext.asyncio.session import AsyncSession

from server.accounts.workspaces import workspace_ids_of_account, workspace_of_account
from server.auth import Authenticator, Principal
from server.billing.money import micros_to_json_number
from server.clock import Clock, rfc3339
from server.contract import guardrails_pb2, guardrails_pb2_grpc
from server.db.engine import SessionFactory
from server.db.models import Guardrail
from server.guardrails import store
from server.routing.catalog import Catalog
from server.services.rpc import (
    answer_with_status,
    integer_or_null,
    list_or_null,
    metadata_of,
    null,
    nullable_string,
    nullable_timestamp,
    string_or_null,
    strings_or_null,
    usd_or_null,
)

Changes = guardrails_pb2.CreateGuardrailRequest | guardrails_pb2.UpdateGuardrailRequest


def guardrail_message(guardrail: Guardrail) -> guardrails_pb2.Guardrail:
    ceiling = guardrail.max_cost_per_request_micros
    duration = guardrail.max_video_duration_seconds
    return guardrails_pb2.Guardrail(
        id=guardrail.id,
        name=guardrail.name,
        description=nullable_string(guardrail.description),
        workspace_id=guardrail.workspace_id,
        allowed_models=list_or_null(guardrail.allowed_models),
        ignored_models=list_or_null(guardrail.ignored_models),
        allowed_providers=list_or_null(guardrail.allowed_providers),
        ignored_providers=list_or_null(guardrail.ignored_providers),
        max_cost_per_request_usd=null()
        if ceiling is None
        else struct_pb2.Value(number_value=micros_to_json_number(ceiling)),
        max_video_duration_seconds=null()
        if duration is None
        else struct_pb2.Value(number_value=duration),
        include_byok_in_budgets=guardrail.include_byok_in_budgets,
        limit_usd=null()
        if guardrail.limit_micros is None
        else struct_pb2.Value(number_value=micros_to_json_number(guardrail.limit_micros)),
        reset_interval=nullable_string(guardrail.reset_interval),
        created_at=rfc3339(guardrail.created_at),
        updated_at=nullable_timestamp(guardrail.updated_at),
    )


class GuardrailsService(guardrails_pb2_grpc.GuardrailsServicer):
    def __init__(
        self, auth: Authenticator, sessions: SessionFactory, clock: Clock, catalog: Catalog
    ) -> None:
        self._auth = auth
        self._sessions = sessions
        self._clock = clock
        self._catalog = catalog

    async def _principal(
        self, session: AsyncSession, context: grpc.aio.ServicerContext
    ) -> Principal:
        return await self._auth.authenticate_management(session, metadata_of(context))

    async def _workspace_id(
        self, session: AsyncSession, principal: Principal, wanted: str | None
    ) -> str:
        """A workspace of the caller's account; by default the caller's own."""
        return await workspace_of_account(
            session, principal.account.id, wanted, principal.workspace.id
        )

    def _changes(self, request: Changes) -> dict[str, Any]:
        """The members the request sets, validated; nothing is written before all pass."""
        for name in store.UNSUPPORTED:
            value = getattr(request, name)
            if request.HasField(name) and value.WhichOneof("kind") != "null_value":
                raise store.refuse_unsupported(name)
        given: dict[str, Any] = {}
        if request.HasField("description"):
            given["description"] = string_or_null(request.description, "description")
        for name in ("allowed_models", "ignored_models", "allowed_providers", "ignored_providers"):
            if request.HasField(name):
                given[name] = strings_or_null(getattr(request, name), name)
        if request.HasField("max_cost_per_request_usd"):
            given["max_cost_per_request_micros"] = usd_or_null(
                request.max_cost_per_request_usd, "max_cost_per_request_usd"
            )
        if request.HasField("max_video_duration_seconds"):
            given["max_video_duration_seconds"] = integer_or_null(
                request.max_video_duration_seconds, "max_video_duration_seconds"
            )
        if request.HasField("include_byok_in_budgets"):
            given["include_byok_in_budgets"] = request.include_byok_in_budgets
        if request.HasField("limit_usd"):
            given["limit_micros"] = usd_or_null(request.limit_usd, "limit_usd")
        if request.HasField("reset_interval"):
            given["reset_interval"] = string_or_null(request.reset_interval, "reset_interval")
        return store.check_changes(self._catalog, given)

    async def ListGuardrails(
        self, request: guardrails_pb2.ListGuardrailsRequest, context: grpc.aio.ServicerContext
    ) -> guardrails_pb2.ListGuardrailsResponse:
        async with self._sessions() as session:
            principal = await self._principal(session, context)
            workspace_id = await self._workspace_id(
                session,
                principal,
                request.workspace_id if request.HasField("workspace_id") else None,
            )
            rows = await store.list_guardrails(
                session,
                workspace_id,
                offset=request.offset if request.HasField("offset") else 0,
                limit=request.limit if request.HasField("limit") else 50,
            )
        return guardrails_pb2.ListGuardrailsResponse(
            data=[guardrail_message(g) for g in rows], total_count=len(rows)
        )

    async def CreateGuardrail(
        self, request: guardrails_pb2.CreateGuardrailRequest, context: grpc.aio.ServicerContext
    ) -> guardrails_pb2.GuardrailResponse:
        async with self._sessions() as session:
            principal = await self._principal(session, context)
            changes = self._changes(request)
            changes["name"] = store.check_name(request.name)
            workspace_id = await self._workspace_id(
                session,
                principal,
                request.workspace_id if request.HasField("workspace_id") else None,
            )
            guardrail = await store.create_guardrail(
                session, workspace_id, changes, self._clock.now()
            )
            await session.commit()
        await answer_with_status(context, 201)
        return guardrails_pb2.GuardrailResponse(data=guardrail_message(guardrail))

    async def _account_guardrail(
        self, session: AsyncSession, principal: Principal, guardrail_id: str
    ) -> Guardrail:
        workspace_ids = await workspace_ids_of_account(session, principal.account.id)
        return await store.find_guardrail(session, guardrail_id, workspace_ids)

    async def GetGuardrail(
        self, request: guardrails_pb2.GetGuardrailRequest, context: grpc.aio.ServicerContext
    ) -> guardrails_pb2.GuardrailResponse:
        async with self._sessions() as session:
            principal = await self._principal(session, context)
            guardrail = await self._account_guardrail(session, principal, request.id)
        return guardrails_pb2.GuardrailResponse(data=guardrail_message(guardrail))

    async def UpdateGuardrail(
        self, request: guardrails_pb2.UpdateGuardrailRequest, context: grpc.aio.ServicerContext
    ) -> guardrails_pb2.GuardrailResponse:
        async with self._sessions() as session:
            principal = await self._principal(session, context)
            changes = self._changes(request)
            if request.HasField("name"):
                changes["name"] = store.check_name(request.name)
            guardrail = await self._account_guardrail(session, principal, request.id)
            await store.update_guardrail(session, guardrail, changes, self._clock.now())
            await session.commit()
        return guardrails_pb2.GuardrailResponse(data=guardrail_message(guardrail))

    async def DeleteGuardrail(
        self, request: guardrails_pb2.DeleteGuardrailRequest, context: grpc.aio.ServicerContext
    ) -> guardrails_pb2.DeleteGuardrailResponse:
        async with self._sessions() as session:
            principal = await self._principal(session, context)
            guardrail = await self._account_guardrail(session, principal, request.id)
            await store.delete_guardrail(session, guardrail)
            await session.commit()
        return guardrails_pb2.DeleteGuardrailResponse(deleted=True)

    async def AssignKeys(
        self, request: guardrails_pb2.KeyHashesRequest, context: grpc.aio.ServicerContext
    ) -> guardrails_pb2.AssignKeysResponse:
        async with self._sessions() as session:
            principal = await self._principal(session, context)
            guardrail = await self._account_guardrail(session, principal, request.id)
            count = await store.assign_keys(
                session, guardrail, list(request.key_hashes), self._clock.now()
            )
            await session.commit()
        return guardrails_pb2.AssignKeysResponse(assigned_count=count)

    async def UnassignKeys(
        self, request: guardrails_pb2.KeyHashesRequest, context: grpc.aio.ServicerContext
    ) -> guardrails_pb2.UnassignKeysResponse:
        async with self._sessions() as session:
            principal = await self._principal(session, context)
            guardrail = await self._account_guardrail(session, principal, request.id)
            count = await store.unassign_keys(session, guardrail, list(request.key_hashes))
            await session.commit()
        return guardrails_pb2.UnassignKeysResponse(unassigned_count=count)

    async def _assignments(
        self,
        request: guardrails_pb2.ListKeyAssignmentsRequest,
        context: grpc.aio.ServicerContext,
        of_guardrail: bool,
    ) -> guardrails_pb2.KeyAssignmentsResponse:
        async with self._sessions() as session:
            principal = await self._principal(session, context)
            workspace_id, guardrail_id = principal.workspace.id, None
            if of_guardrail:
                guardrail = await self._account_guardrail(session, principal, request.id)
                workspace_id, guardrail_id = guardrail.workspace_id, guardrail.id
            rows, total = await store.list_key_assignments(
                session,
                workspace_id,
                guardrail_id,
                offset=request.offset if request.HasField("offset") else 0,
                limit=request.limit if request.HasField("limit") else 50,
            )
        return guardrails_pb2.KeyAssignmentsResponse(
            data=[
                guardrails_pb2.KeyAssignment(
                    id=assignment.id,
                    guardrail_id=assignment.guardrail_id,
                    key_hash=assignment.key_hash,
                    key_name=name,
                    key_label=label,
                    assigned_by=null(),
                    created_at=rfc3339(assignment.created_at),
                )
                for assignment, name, label in rows
            ],
            total_count=total,
        )

    async def ListGuardrailKeyAssignments(
        self, request: guardrails_pb2.ListKeyAssignmentsRequest, context: grpc.aio.ServicerContext
    ) -> guardrails_pb2.KeyAssignmentsResponse:
        return await self._assignments(request, context, of_guardrail=True)

    async def ListKeyAssignments(
        self, request: guardrails_pb2.ListKeyAssignmentsRequest, context: grpc.aio.ServicerContext
    ) -> guardrails_pb2.KeyAssignmentsResponse:
        return await self._assignments(request, context, of_guardrail=False)
