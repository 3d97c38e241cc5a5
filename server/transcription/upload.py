"""POST /api/v1/audio/transcriptions with its raw body (JSON or multipart), as both ways in
serve it — the gRPC Transcribe rpc (the facade transcodes the body into a stream of
messages) and the REST listener (server/rest/, the body as Envoy proxies it): the key is
checked from the headers before a byte of the body is read, so an anonymous or wrong key
costs no body memory, and the body is read within the request's and the process's bounds,
in memory and in time."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from server.auth import Authenticator
from server.db.engine import SessionFactory
from server.errors import GatewayError, default_message
from server.transcription.body import BodyBudget, BodySource, read_body
from server.transcription.session import LazySession
from server.transcription.transcriber import Transcriber, TranscriptionResult

# How much longer than the edge's request timeout a body is waited for here.
EDGE_MARGIN_SECONDS = 1.0


class Uploads:
    def __init__(
        self,
        auth: Authenticator,
        sessions: SessionFactory,
        transcriber: Transcriber,
        bodies: BodyBudget,
        max_body_bytes: int,
        edge_request_seconds: float,
    ) -> None:
        """`edge_request_seconds`: how long the edge gives a whole request, body included, to
        arrive (Envoy answers 408 after it). A body is waited for a little longer here
        (EDGE_MARGIN_SECONDS: behind Envoy, Envoy's own 408 comes first), which bounds a
        caller that reached the server without Envoy, too."""
        self._auth = auth
        self._sessions = sessions
        self.transcriber = transcriber
        self._bodies = bodies
        self._max_body_bytes = max_body_bytes
        self._body_seconds = edge_request_seconds + EDGE_MARGIN_SECONDS

    async def transcribe(
        self,
        headers: Sequence[tuple[str, str | bytes]],
        body: BodySource,
        declared_length: int | None,
        session_id: str | None,
        time_remaining: float | None,
    ) -> TranscriptionResult:
        """`headers`: the request's (lower-case names), the key among them;
        `declared_length`: the client's Content-Length, when it sent one; `time_remaining`:
        the transcription's deadline in seconds (None: none). Envoy's route timeout, which
        it is when Envoy set it, counts from the end of the request's body, so the body's
        own arrival is bounded apart (408 past it)."""
        body_deadline = asyncio.get_running_loop().time() + self._body_seconds
        async with LazySession(self._sessions) as session:
            principal = await self._auth.authenticate(session, headers)
            if session.in_transaction():
                await session.commit()  # no transaction held while a slow client uploads
            async with self._bodies.reservation(principal.workspace.id) as reservation:
                try:
                    async with asyncio.timeout_at(body_deadline):
                        raw = await read_body(
                            body, reservation, self._max_body_bytes, declared_length
                        )
                except TimeoutError:
                    # The words of the edge's own 408 (a body too slow for Envoy's timeout).
                    raise GatewayError(408, default_message(408)) from None
                parsed = await self.transcriber.parse(raw.data, raw.content_type, session_id)
                del raw  # parsed holds the audio; the raw body can go
                return await self.transcriber.transcribe(session, principal, parsed, time_remaining)
