"""The REST listener's routes: POST /api/v1/audio/transcriptions and GET /api/v1/key, and
/healthz for Envoy's health check of the listener. Anything else is a 404 in the documented
shape."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from aiohttp import web
from google.protobuf import json_format
from google.protobuf.message import Message

from server.contract import REST_HEALTH_PATH, REST_LISTENER_METHODS, http_routes
from server.errors import GatewayError, not_found
from server.services.keys import KeysService
from server.services.rpc import (
    ENVOY_TIMEOUT_HEADER,
    RequestObserver,
    envoy_timeout,
    metadata_value,
)
from server.transcription.upload import Uploads

TRANSCRIPTIONS = "/api/v1/audio/transcriptions"
KEY = "/api/v1/key"
# Envoy's health check of the listener (facade/envoy_config.py): 200 while the process
# serves, 503 while it cannot reach its database or drains for shutdown — as its gRPC health.
HEALTH_PATH = REST_HEALTH_PATH
_JSON = "application/json"

Handler = Callable[[web.BaseRequest, Sequence[tuple[str, str]]], Awaitable[web.Response]]


class RequestBody:
    """A request's body as it arrives (aiohttp holds at most its read buffer of it unread
    and stops reading the socket past that), as a BodySource."""

    def __init__(self, request: web.BaseRequest) -> None:
        self.content_type = request.headers.get("content-type", "")
        self._content = request.content

    async def chunks(self) -> AsyncIterator[bytes]:
        async for chunk in self._content.iter_any():
            yield chunk


def error_response(error: GatewayError) -> web.Response:
    """The documented error, as the facade renders a failed rpc's."""
    return web.Response(
        status=error.status,
        body=error.body_json().encode("ascii"),
        content_type=_JSON,
        headers=error.response_headers(),
    )


def json_of(message: Message) -> bytes:
    """A response message as the facade's transcoder prints it (facade/envoy_config.py:
    proto field names, fields without presence printed at their defaults, on one line)."""
    text: str = json_format.MessageToJson(
        message,
        always_print_fields_with_no_presence=True,
        preserving_proto_field_name=True,
        indent=None,
        ensure_ascii=False,
    )
    return text.encode()


def _headers(request: web.BaseRequest) -> tuple[tuple[str, str], ...]:
    """The request's headers as the domain code reads them (gRPC metadata's shape: lower
    case names, str values)."""
    return tuple(
        (name.decode("latin-1").lower(), value.decode("latin-1"))
        for name, value in request.raw_headers
    )


class RestApi:
    """aiohttp's request handler (a low-level web.Server's): each route's answer through the
    request observer; `serving` is the process's health, set as its gRPC health is."""

    def __init__(self, uploads: Uploads, keys: KeysService, observer: RequestObserver) -> None:
        self._uploads = uploads
        self._keys = keys
        self._observer = observer
        self.serving = False
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        # By the rpc each route stands for: the routes the facade proxies here are the
        # contract's REST_LISTENER_METHODS, and each is answered as that rpc is.
        handlers: dict[str, Handler] = {
            "/gateway.v1.Audio/Transcribe": self._transcribe,
            "/gateway.v1.Keys/GetCurrentKey": self._current_key,
        }
        if set(handlers) != set(REST_LISTENER_METHODS):
            raise AssertionError("the REST listener answers other rpcs than the contract's")
        routes = http_routes()
        self._routes: dict[tuple[str, str], tuple[str, Handler]] = {}
        for rpc, handle in handlers.items():
            method, _, path = routes[rpc].partition(" ")
            self._routes[(method, path)] = (routes[rpc], handle)

    async def __call__(self, request: web.BaseRequest) -> web.StreamResponse:
        found = self._routes.get((request.method, request.path))
        if found is None:
            if request.path == HEALTH_PATH and request.method in ("GET", "HEAD"):
                return web.Response(status=200 if self.serving else 503)
            return error_response(not_found("Not Found"))
        route, handle = found
        headers = _headers(request)
        self._in_flight += 1
        self._idle.clear()
        try:
            response = await self._observer.answer(
                route, headers, lambda: handle(request, headers), error_response
            )
            # Sent here, in the handler's own step: aiohttp would send a returned response
            # from the connection's task, a turn of the loop later and after the request's
            # metrics and access line (queued by the observer for the next turn). Sent, the
            # response is returned done; aiohttp's own send of it then does nothing.
            with contextlib.suppress(ConnectionError):  # gone: aiohttp's send finds it out
                await response.prepare(request)
                await response.write_eof()
            return response
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()

    async def idle(self) -> None:
        """Wait until no request is being answered."""
        await self._idle.wait()

    async def _transcribe(
        self, request: web.BaseRequest, headers: Sequence[tuple[str, str]]
    ) -> web.Response:
        result = await self._uploads.transcribe(
            headers,
            RequestBody(request),
            # This hop's framing (the parser holds the body to it); None when chunked.
            request.content_length,
            metadata_value(headers, "x-session-id"),
            envoy_timeout(metadata_value(headers, ENVOY_TIMEOUT_HEADER)),
        )
        # As OpenRouter: the id GET /generation looks the transcription up by.
        return web.Response(
            body=result.json_body(),
            content_type=_JSON,
            headers={"x-generation-id": result.generation_id},
        )

    async def _current_key(
        self, request: web.BaseRequest, headers: Sequence[tuple[str, str]]
    ) -> web.Response:
        response = await self._keys.current_key(headers)
        return web.Response(body=json_of(response), content_type=_JSON)
