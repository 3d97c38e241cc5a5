"""The REST listener of one server process: aiohttp's low-level HTTP/1.1 server (llhttp's
parser; measured beside a bare httptools server: docs/performance.md) serving RestApi on the
gRPC server's address and --rest-port."""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import web

from server.ports import REST_PORT, listen_error
from server.rest.api import RestApi

# What aiohttp's shutdown may take, once the requests are done or out of time: closing the
# idle connections, and cancelling what is still running.
CLOSE_SECONDS = 1.0


class RestListener:
    def __init__(
        self, api: RestApi, host: str, port: int, max_header_bytes: int, idle_seconds: float
    ) -> None:
        """`idle_seconds`: how long a connection may go without a whole request — a new one,
        one between two requests, one whose caller trickles its headers — before it is
        closed. Envoy closes its own idle connections to the listener sooner
        (facade/envoy_config.py), so it never reuses one the listener is closing."""
        self._api = api
        self._host = host
        self._port = port
        self._max_header_bytes = max_header_bytes
        self._idle_seconds = idle_seconds
        self._server: web.Server | None = None
        self._listening: asyncio.Server | None = None

    async def start(self) -> int:
        """Listen; the port bound (a free one for port 0). A port that cannot be taken is
        a ListenError naming the address and the flag."""
        self._server = web.Server(
            self._api,
            # A request whose caller went away (Envoy resets the connection when its
            # client does) is cancelled, as an rpc is: its holds and provider call end.
            handler_cancellation=True,
            access_log=None,  # the request observer logs each request once
            # Everything Envoy forwards within its header limit: the request line and one
            # header may each be as long as all the headers (aiohttp's defaults: 8 KiB).
            max_line_size=self._max_header_bytes,
            max_field_size=self._max_header_bytes,
            # A body is the bytes that came, counted against its limits as they are: none is
            # inflated here (the edge forwards no Content-Encoding; a direct caller's gzip
            # would otherwise be unpacked past what it sent).
            auto_decompress=False,
            # aiohttp's keep-alive timer runs from the connection's start and after each
            # answer, and closes the connection only while no request is being handled:
            # headers that never end are bounded too (a body is bounded by the upload).
            keepalive_timeout=self._idle_seconds,
        )
        try:
            self._listening = await asyncio.get_running_loop().create_server(
                self._server, self._host, self._port, reuse_address=True, reuse_port=False
            )
        except OSError as error:
            raise listen_error(self._host, self._port, REST_PORT, error) from None
        port: int = self._listening.sockets[0].getsockname()[1]
        return port

    async def stop(self, grace: float) -> None:
        """Accept no more connections; requests in flight get `grace` seconds to finish,
        then are cancelled. The wait is ours: aiohttp's shutdown stops reading at once, so
        a request still receiving its body would never finish."""
        if self._listening is not None:
            self._listening.close()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await self._api.idle()
        if self._server is not None:
            await self._server.shutdown(CLOSE_SECONDS)
        if self._listening is not None:
            await self._listening.wait_closed()
