"""Generations service: GET /api/v1/generation?id= (one stored generation the caller sees,
server/auth.py `sees`, in OpenRouter's shape)."""

from __future__ import annotations

import grpc
from google.protobuf import json_format

from server.auth import Authenticator, visible
from server.billing.settlements import Settlements
from server.contract import generations_pb2, generations_pb2_grpc
from server.db.engine import SessionFactory
from server.observability.generations import (
    find_generation,
    generation_document,
    generation_not_found,
)
from server.services.rpc import metadata_of


class GenerationsService(generations_pb2_grpc.GenerationsServicer):
    def __init__(
        self, auth: Authenticator, sessions: SessionFactory, settlements: Settlements | None = None
    ) -> None:
        self._auth = auth
        self._sessions = sessions
        # The caller's charges still committing here are waited for: its record is read
        # (none given: nothing ever commits beside an answer).
        self._settlements = settlements if settlements is not None else Settlements()

    async def GetGeneration(
        self, request: generations_pb2.GetGenerationRequest, context: grpc.aio.ServicerContext
    ) -> generations_pb2.GenerationResponse:
        async with self._sessions() as session:
            principal = await self._auth.authenticate(session, metadata_of(context))
            await self._settlements.settled(principal.account.id)
            record = visible(
                principal,
                await find_generation(session, request.id),
                generation_not_found(request.id),
            )
        data = json_format.ParseDict(generation_document(record), generations_pb2.Generation())
        return generations_pb2.GenerationResponse(data=data)
