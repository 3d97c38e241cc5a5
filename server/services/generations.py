"""Generations service: GET /api/v1/generation?id= (one stored generation of the caller's
workspace, in OpenRouter's shape)."""

from __future__ import annotations

import grpc
from google.protobuf import json_format

from server.auth import Authenticator
from server.contract import generations_pb2, generations_pb2_grpc
from server.db.engine import SessionFactory
from server.observability.generations import find_generation, generation_document
from server.services.rpc import metadata_of


class GenerationsService(generations_pb2_grpc.GenerationsServicer):
    def __init__(self, auth: Authenticator, sessions: SessionFactory) -> None:
        self._auth = auth
        self._sessions = sessions

    async def GetGeneration(
        self, request: generations_pb2.GetGenerationRequest, context: grpc.aio.ServicerContext
    ) -> generations_pb2.GenerationResponse:
        async with self._sessions() as session:
            principal = await self._auth.authenticate(session, metadata_of(context))
            record = await find_generation(session, principal.workspace.id, request.id)
        data = json_format.ParseDict(generation_document(record), generations_pb2.Generation())
        return generations_pb2.GenerationResponse(data=data)
