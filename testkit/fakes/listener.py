"""The HTTP server of the loopback fakes: a listen backlog for bursts."""

from __future__ import annotations

from http.server import ThreadingHTTPServer


class BurstHTTPServer(ThreadingHTTPServer):
    """socketserver's listen backlog is 5: a burst of new connections (the 20 admitted
    `:free` requests of one group commit calling the fake provider at once) overflows it,
    and the kernel resets some of them (httpx.ReadError: "Provider is unreachable")."""

    request_queue_size = 1024
