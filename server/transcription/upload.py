"""POST /api/v1/audio/transcriptions with its raw body (JSON or multipart), as both ways in
serve it — the gRPC Transcribe rpc (the facade transcodes the body into a stream of
messages) and the REST listener (server/rest/, the body as Envoy proxies it): the key is
checked from the headers before a byte of the body is read, so an anonymous or wrong key
costs no body memory, and the body is read within the request's and the process's bounds,
in memory and in time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from server.auth import Authenticator
from server.db.engine import SessionFactory
from server.errors import GatewayError
from server.transcription.body import BodyBudget, BodySource, read_body
from server.transcription.session import LazySession
from server.transcription.transcriber import Transcriber, TranscriptionResult


class Uploads:
    def __init__(
        self,
        auth: Authenticator,
        sessions: SessionFactory,
        transcriber: Transcriber,
        bodies: BodyBudget,
        max_body_bytes: int,
        max_seconds: float,
    ) -> None:
        """`max_seconds`: the longest a request may take, its body's arrival included, when
        its caller set no shorter deadline (the edge's upstream timeout: Envoy gives up on
        the answer then)."""
        self._auth = auth
        self._sessions = sessions
        self.transcriber = transcriber
        self._bodies = bodies
        self._max_body_bytes = max_body_bytes
        self._max_seconds = max_seconds

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
        the caller's deadline in seconds (None: none), which a body still arriving when it
        passes does not outlive (408), and whose rest the transcription gets."""
        seconds = self._max_seconds if time_remaining is None else time_remaining
        deadline = time.monotonic() + min(seconds, self._max_seconds)
        async with LazySession(self._sessions) as session:
            principal = await self._auth.authenticate(session, headers)
            if session.in_transaction():
                await session.commit()  # no transaction held while a slow client uploads
            async with self._bodies.reservation(principal.workspace.id) as reservation:
                try:
                    async with asyncio.timeout(deadline - time.monotonic()):
                        raw = await read_body(
                            body, reservation, self._max_body_bytes, declared_length
                        )
                except TimeoutError:
                    raise GatewayError(
                        408, "The request body did not arrive within the request's deadline"
                    ) from None
                parsed = await self.transcriber.parse(raw.data, raw.content_type, session_id)
                del raw  # parsed holds the audio; the raw body can go
                return await self.transcriber.transcribe(
                    session, principal, parsed, deadline - time.monotonic()
                )
