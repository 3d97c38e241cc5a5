"""The HTTP server of the loopback fakes: a listen backlog for bursts, served from a
thread of its own, and stopped."""

from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer
from typing import TypeVar

Server = TypeVar("Server", bound=ThreadingHTTPServer)


class BurstHTTPServer(ThreadingHTTPServer):
    """socketserver's listen backlog is 5: a burst of new connections (the 20 admitted
    `:free` requests of one group commit calling the fake provider at once) overflows it,
    and the kernel resets some of them (httpx.ReadError: "Provider is unreachable")."""

    request_queue_size = 1024


def serve_in_thread(server: Server) -> Server:
    """`server`, answering from a daemon thread (and a daemon thread per connection)."""
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def stop_serving(server: ThreadingHTTPServer | None) -> None:
    """Stop a server `serve_in_thread` started and close its socket (None: never started)."""
    if server is not None:
        server.shutdown()
        server.server_close()
