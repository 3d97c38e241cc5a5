"""Serve an in-process fake provider (a function from httpx.Request to httpx.Response, as
httpx.MockTransport takes) on loopback, so the same fake answers unit tests in-process and a
`gateway up` subprocess over TCP."""

from __future__ import annotations

from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from testkit.fakes.listener import BurstHTTPServer, serve_in_thread, stop_serving

Handler = Callable[[httpx.Request], httpx.Response]


class LoopbackServer:
    def __init__(self, handle: Handler) -> None:
        self._handle = handle
        self._server: ThreadingHTTPServer | None = None

    @property
    def base_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> LoopbackServer:
        handle = self._handle

        class Served(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length) if length else b""
                request = httpx.Request(
                    self.command,
                    f"http://{self.headers.get('Host', '127.0.0.1')}{self.path}",
                    headers=list(self.headers.items()),
                    content=body,
                )
                response = handle(request)
                content = response.read()
                self.send_response(response.status_code)
                for name, value in response.headers.items():
                    if name.lower() not in ("content-length", "transfer-encoding"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            do_GET = do_POST = do_PUT = do_DELETE = _serve

        self._server = serve_in_thread(BurstHTTPServer(("127.0.0.1", 0), Served))
        return self

    def stop(self) -> None:
        stop_serving(self._server)
