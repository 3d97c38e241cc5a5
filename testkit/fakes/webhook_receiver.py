"""A webhook receiver on loopback over real HTTPS, with a certificate from a test CA
(trustme). Answers by path: /ok 200, /gone 410, /flaky 500 once then 200, /slow-ok 200."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import trustme

from testkit.fakes.listener import serve_in_thread, stop_serving


@dataclass
class ReceivedHook:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class WebhookReceiver:
    ca_file: Path
    received: list[ReceivedHook] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None
    _flaky_seen: set[str] = field(default_factory=set)

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.server_address[1])

    def url(self, path: str) -> str:
        return f"https://localhost:{self.port}{path}"

    def hooks(self, path: str) -> list[ReceivedHook]:
        return [hook for hook in self.received if hook.path == path]

    def start(self) -> WebhookReceiver:
        ca = trustme.CA()
        ca.cert_pem.write_to_path(str(self.ca_file))
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert("localhost", "127.0.0.1").configure_cert(context)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                path = self.path.split("?", 1)[0]
                receiver.received.append(
                    ReceivedHook(path, {k.lower(): v for k, v in self.headers.items()}, body)
                )
                status = 200
                if path.startswith("/gone"):
                    status = 410
                elif path.startswith("/flaky"):
                    hook_id = self.headers.get("webhook-id", "")
                    status = 200 if hook_id in receiver._flaky_seen else 500
                    receiver._flaky_seen.add(hook_id)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        self.server = serve_in_thread(server)
        return self

    def stop(self) -> None:
        stop_serving(self.server)
