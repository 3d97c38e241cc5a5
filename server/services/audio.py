"""Audio service: POST /api/v1/audio/transcriptions (raw body: JSON or multipart) and the
typed CreateTranscription rpc for gRPC callers."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from google.api import httpbody_pb2
from google.protobuf import json_format

from server.auth import Authenticator
from server.contract import audio_pb2, audio_pb2_grpc
from server.db.engine import SessionFactory
from server.services.rpc import header_value, metadata_of, time_remaining
from server.transcription.body import BodyBudget, declared_length, read_body
from server.transcription.request import from_message
from server.transcription.session import LazySession
from server.transcription.transcriber import Transcriber


class AudioService(audio_pb2_grpc.AudioServicer):
    def __init__(
        self,
        auth: Authenticator,
        sessions: SessionFactory,
        transcriber: Transcriber,
        bodies: BodyBudget,
        max_body_bytes: int,
    ) -> None:
        self._auth = auth
        self._sessions = sessions
        self._transcriber = transcriber
        self._bodies = bodies
        self._max_body_bytes = max_body_bytes

    async def Transcribe(
        self,
        requests: AsyncIterator[httpbody_pb2.HttpBody],
        context: grpc.aio.ServicerContext,
    ) -> httpbody_pb2.HttpBody:
        # The body streams in (the facade forwards it as it arrives): the key is checked
        # from the headers before a byte of it is read, so an anonymous or wrong key costs
        # no body memory, and the body is read within the request's and the process's bounds.
        async with LazySession(self._sessions) as session:
            principal = await self._auth.authenticate(session, metadata_of(context))
            if session.in_transaction():
                await session.commit()  # no transaction held while a slow client uploads
            async with self._bodies.reservation(principal.workspace.id) as reservation:
                body = await read_body(
                    requests,
                    reservation,
                    self._max_body_bytes,
                    declared_length(header_value(context, "x-gateway-content-length")),
                )
                parsed = await self._transcriber.parse(
                    body.data, body.content_type, header_value(context, "x-session-id")
                )
                del body  # parsed holds the audio; the raw body can go
                result = await self._transcriber.transcribe(
                    session, principal, parsed, time_remaining(context)
                )
        # As OpenRouter: the id GET /generation looks the transcription up by. Sent with the
        # status as trailing metadata (initial metadata would cost a gRPC operation of its own
        # per call); the facade's Lua filter makes it the X-Generation-Id response header.
        context.set_trailing_metadata((("x-generation-id", result.generation_id),))
        return httpbody_pb2.HttpBody(
            content_type="application/json",
            data=result.json_body(),
        )

    async def CreateTranscription(
        self, request: audio_pb2.TranscriptionRequest, context: grpc.aio.ServicerContext
    ) -> audio_pb2.TranscriptionResponse:
        async with LazySession(self._sessions) as session:
            principal = await self._auth.authenticate(session, metadata_of(context))
            parsed = from_message(request, header_value(context, "x-session-id"))
            result = await self._transcriber.transcribe(
                session, principal, parsed, time_remaining(context)
            )
        # As OpenRouter: the id GET /generation looks the transcription up by.
        await context.send_initial_metadata((("x-generation-id", result.generation_id),))
        return json_format.ParseDict(
            result.body(), audio_pb2.TranscriptionResponse(), ignore_unknown_fields=True
        )
