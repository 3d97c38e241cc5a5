"""Activity service: GET /api/v1/activity, /api/v1/generations, /api/v1/videos and
/api/v1/videos/{id}/webhooks — what the console reads. A management key sees its
workspace; any other key only what it made itself (server/auth.py `own_records`, `sees`)."""

from __future__ import annotations

import grpc
from google.protobuf import json_format
from sqlmodel.ext.asyncio.session import AsyncSession

from server.accounts.interns import intern_document, list_interns
from server.auth import Authenticator, Principal, own_records
from server.billing.purchases import list_purchases, purchase_document
from server.billing.settlements import Settlements
from server.clock import Clock
from server.contract import console_pb2, console_pb2_grpc
from server.db.engine import SessionFactory
from server.observability.activity import Page, activity, list_generations, page_of
from server.observability.generations import generation_document
from server.services.rpc import metadata_of
from server.videos.listing import delivery_document, job_deliveries, job_summary, list_jobs


def _page(
    request: console_pb2.ListGenerationsRequest
    | console_pb2.ListVideosRequest
    | console_pb2.ListCreditPurchasesRequest,
) -> Page:
    return page_of(
        request.offset if request.HasField("offset") else None,
        request.limit if request.HasField("limit") else None,
    )


class ActivityService(console_pb2_grpc.ActivityServicer):
    def __init__(
        self,
        auth: Authenticator,
        sessions: SessionFactory,
        clock: Clock,
        settlements: Settlements | None = None,
    ) -> None:
        self._auth = auth
        self._sessions = sessions
        self._clock = clock
        # The caller's charges still committing here are waited for before a read (none
        # given: nothing ever commits beside an answer).
        self._settlements = settlements if settlements is not None else Settlements()

    async def _principal(
        self, session: AsyncSession, context: grpc.aio.ServicerContext
    ) -> Principal:
        principal = await self._auth.authenticate(session, metadata_of(context))
        await self._settlements.settled(principal.account.id)
        return principal

    async def GetActivity(
        self, request: console_pb2.GetActivityRequest, context: grpc.aio.ServicerContext
    ) -> console_pb2.ActivityResponse:
        async with self._sessions() as session:
            principal = await self._principal(session, context)
            items = await activity(
                session,
                principal.workspace.id,
                self._clock.now(),
                wanted_date=request.date,
                key_hash=own_records(principal, request.api_key_hash),
                group_by=request.group_by,
            )
        return json_format.ParseDict({"data": items}, console_pb2.ActivityResponse())

    async def ListGenerations(
        self, request: console_pb2.ListGenerationsRequest, context: grpc.aio.ServicerContext
    ) -> console_pb2.GenerationListResponse:
        async with self._sessions() as session:
            principal = await self._principal(session, context)
            page = _page(request)
            records, total = await list_generations(
                session,
                principal.workspace.id,
                page,
                key_hash=own_records(principal, request.api_key_hash),
                model=request.model,
                status=request.status,
                api_type=request.api_type,
            )
        response = console_pb2.GenerationListResponse(total_count=total)
        for record in records:
            json_format.ParseDict(generation_document(record), response.data.add())
        return response

    async def ListVideos(
        self, request: console_pb2.ListVideosRequest, context: grpc.aio.ServicerContext
    ) -> console_pb2.VideoJobListResponse:
        async with self._sessions() as session:
            principal = await self._principal(session, context)
            page = _page(request)
            jobs, total = await list_jobs(
                session,
                principal.workspace.id,
                page,
                key_hash=own_records(principal),
                status=request.status,
                job_id=request.id,
            )
        response = console_pb2.VideoJobListResponse(total_count=total)
        for job in jobs:
            json_format.ParseDict(job_summary(job), response.data.add())
        return response

    async def ListCreditPurchases(
        self, request: console_pb2.ListCreditPurchasesRequest, context: grpc.aio.ServicerContext
    ) -> console_pb2.CreditPurchaseListResponse:
        async with self._sessions() as session:
            principal = await self._auth.authenticate_management(session, metadata_of(context))
            page = _page(request)
            entries, total = await list_purchases(
                session, principal.account.id, page.offset, page.limit
            )
        return json_format.ParseDict(
            {"data": [purchase_document(e) for e in entries], "total_count": total},
            console_pb2.CreditPurchaseListResponse(),
        )

    async def ListInterns(
        self, request: console_pb2.ListInternsRequest, context: grpc.aio.ServicerContext
    ) -> console_pb2.InternListResponse:
        async with self._sessions() as session:
            principal = await self._auth.authenticate_management(session, metadata_of(context))
            interns = await list_interns(session, principal.workspace)
        return json_format.ParseDict(
            {"data": [intern_document(i) for i in interns]}, console_pb2.InternListResponse()
        )

    async def ListVideoWebhooks(
        self, request: console_pb2.ListVideoWebhooksRequest, context: grpc.aio.ServicerContext
    ) -> console_pb2.WebhookDeliveryListResponse:
        async with self._sessions() as session:
            principal = await self._principal(session, context)
            deliveries = await job_deliveries(session, principal, request.job_id)
        return json_format.ParseDict(
            {"data": [delivery_document(d) for d in deliveries]},
            console_pb2.WebhookDeliveryListResponse(),
        )
