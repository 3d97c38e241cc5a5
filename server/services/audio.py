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
from server.transcription.body import declared_length
from server.transcription.request import from_message
from server.transcription.session import LazySession
from server.transcription.upload import Uploads


class HttpBodyMessages:
    """The Transcribe rpc's stream of HttpBody messages as a BodySource: the bytes of each,
    the content type of the first."""

    def __init__(self, messages: AsyncIterator[httpbody_pb2.HttpBody]) -> None:
        self._messages = messages
        self.content_type = ""

    async def chunks(self) -> AsyncIterator[bytes]:
        first = True
        async for message in self._messages:
            if first:
                self.content_type, first = message.content_type, False
            data = message.data
            del message  # the chunk is the reader's to let go of
            yield data


class AudioService(audio_pb2_grpc.AudioServicer):
    def __init__(self, auth: Authenticator, sessions: SessionFactory, uploads: Uploads) -> None:
        self._auth = auth
        self._sessions = sessions
        self._uploads = uploads
        self._transcriber = uploads.transcriber

    async def Transcribe(
        self,
        requests: AsyncIterator[httpbody_pb2.HttpBody],
        context: grpc.aio.ServicerContext,
    ) -> httpbody_pb2.HttpBody:
        # The body streams in (the facade forwards it as it arrives).
        result = await self._uploads.transcribe(
            metadata_of(context),
            HttpBodyMessages(requests),
            declared_length(header_value(context, "x-gateway-content-length")),
            header_value(context, "x-session-id"),
            time_remaining(context),
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
