"""A hostile HTTP peer on loopback: a provider, a webhook receiver or an image host that
answers with huge, endless or trickling bodies, or never answers at all.

Every behaviour is bounded here too (the suite must stop by itself): an endless body ends
after `max_seconds` or `max_bytes`, a trickle after `max_seconds`. Bodies are written from one
reused chunk, never held whole. Optionally over HTTPS with a certificate from a test CA
(trustme), as webhook targets must be.

Paths choose the behaviour (the query string is ignored):
- `/huge/<bytes>`: 200 with that Content-Length, written as fast as the reader takes it;
- `/endless`: 200, chunked, never finished (until the bounds);
- `/trickle/<interval_ms>`: 200, chunked, one byte every interval;
- `/trickle-length/<interval_ms>`: 200 with a Content-Length of 1 MiB, one byte every interval;
- `/stall`: reads the request, then sends nothing (until the bounds);
- `/ok` (or anything else): 200 with a small body (`ok_body`).
Every request is recorded (path, method, headers, time it arrived) before it is answered;
request bodies are read (and counted, not kept) when they announce a length.
"""

from __future__ import annotations

import contextlib
import ssl
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import trustme

from testkit.fakes.listener import BurstHTTPServer, serve_in_thread

CHUNK = 64 * 1024


@dataclass
class PeerRequest:
    method: str
    path: str
    headers: dict[str, str]
    body_bytes: int
    arrived: float  # time.monotonic()


@dataclass
class HostilePeer:
    """`start()` serves on 127.0.0.1 (a free port); `url(path)` names it."""

    tls_ca_file: Path | None = None  # HTTPS with a trustme CA written here when given
    max_seconds: float = 120.0
    max_bytes: int = 8 * 1024**3
    ok_body: bytes = b'{"ok":true}'
    ok_content_type: str = "application/json"
    # the Content-Type of the huge, endless and trickling bodies (an image host: "image/png")
    body_content_type: str = "application/octet-stream"
    requests: list[PeerRequest] = field(default_factory=list)
    bytes_sent: int = 0
    _server: BurstHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])

    def url(self, path: str) -> str:
        scheme = "https" if self.tls_ca_file is not None else "http"
        host = "localhost" if self.tls_ca_file is not None else "127.0.0.1"
        return f"{scheme}://{host}:{self.port}{path}"

    def requests_to(self, prefix: str) -> list[PeerRequest]:
        with self._lock:
            return [r for r in self.requests if r.path.startswith(prefix)]

    def start(self) -> HostilePeer:
        peer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _record(self) -> str:
                length = int(self.headers.get("Content-Length") or 0)
                read = 0
                while read < length:
                    piece = self.rfile.read(min(CHUNK, length - read))
                    if not piece:
                        break
                    read += len(piece)
                path = self.path.split("?", 1)[0]
                with peer._lock:
                    peer.requests.append(
                        PeerRequest(
                            self.command,
                            path,
                            {k.lower(): v for k, v in self.headers.items()},
                            read,
                            time.monotonic(),
                        )
                    )
                return path

            def _send(self, data: bytes) -> None:
                self.wfile.write(data)
                self.wfile.flush()
                with peer._lock:
                    peer.bytes_sent += len(data)

            def _answer(self) -> None:
                path = self._record()
                deadline = time.monotonic() + peer.max_seconds
                parts = path.strip("/").split("/")
                kind = parts[0]
                try:
                    if kind == "huge":
                        self._huge(int(parts[1]), deadline)
                    elif kind == "endless":
                        self._chunked(deadline, interval=0.0, piece=b"x" * CHUNK)
                    elif kind == "trickle":
                        self._chunked(deadline, interval=int(parts[1]) / 1000, piece=b"x")
                    elif kind == "trickle-length":
                        self._trickle_length(int(parts[1]) / 1000, deadline)
                    elif kind == "stall":
                        while time.monotonic() < deadline:
                            time.sleep(0.05)
                    else:
                        self.send_response(200)
                        self.send_header("Content-Type", peer.ok_content_type)
                        self.send_header("Content-Length", str(len(peer.ok_body)))
                        self.end_headers()
                        self._send(peer.ok_body)
                except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
                    self.close_connection = True

            def _huge(self, total: int, deadline: float) -> None:
                self.send_response(200)
                self.send_header("Content-Type", peer.body_content_type)
                self.send_header("Content-Length", str(total))
                self.end_headers()
                chunk = b"\0" * CHUNK
                left = total
                while left > 0 and time.monotonic() < deadline:
                    piece = chunk if left >= CHUNK else chunk[:left]
                    self._send(piece)
                    left -= len(piece)
                self.close_connection = True

            def _chunked(self, deadline: float, interval: float, piece: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Type", peer.body_content_type)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                framed = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
                sent = 0
                while time.monotonic() < deadline and sent < peer.max_bytes:
                    self._send(framed)
                    sent += len(piece)
                    if interval:
                        time.sleep(interval)
                self.close_connection = True

            def _trickle_length(self, interval: float, deadline: float) -> None:
                self.send_response(200)
                self.send_header("Content-Type", peer.body_content_type)
                self.send_header("Content-Length", str(1024 * 1024))
                self.end_headers()
                while time.monotonic() < deadline:
                    self._send(b"x")
                    time.sleep(interval)
                self.close_connection = True

            def do_GET(self) -> None:
                self._answer()

            def do_POST(self) -> None:
                self._answer()

            def do_PUT(self) -> None:
                self._answer()

        server = BurstHTTPServer(("127.0.0.1", 0), Handler)
        if self.tls_ca_file is not None:
            ca = trustme.CA()
            ca.cert_pem.write_to_path(str(self.tls_ca_file))
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ca.issue_cert("localhost", "127.0.0.1").configure_cert(context)
            server.socket = context.wrap_socket(server.socket, server_side=True)
        self._server = serve_in_thread(server)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            with contextlib.suppress(OSError):
                self._server.server_close()
