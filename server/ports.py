"""The ports the stack listens on: a port that cannot be taken is an error naming the
address and the flag or environment variable that chose it."""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass

GRPC_PORT = "--grpc-port"
REST_PORT = "--rest-port / GATEWAY_REST_PORT"
# The REST listener's port of a server process whose ports are fixed (compose, Kubernetes):
# the gRPC port's default (50051) plus one.
DEFAULT_REST_PORT = 50052
HTTP_PORT = "--http-port"
METRICS_PORT = "--metrics-port / GATEWAY_METRICS_PORT"
ENVOY_ADMIN_PORT = "GATEWAY_ENVOY_ADMIN_PORT"


@dataclass(frozen=True)
class ServedPorts:
    """The ports a server process bound: its gRPC server's and its REST listener's."""

    grpc: int
    rest: int


class ListenError(OSError):
    """A port of the stack could not be listened on; the message says which and why."""

    def __init__(self, host: str, port: int, setting: str, reason: str) -> None:
        super().__init__(f"cannot listen on {_address(host, port)} ({setting}): {reason}")
        self.host = host
        self.port = port
        self.setting = setting


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def reason(error: OSError) -> str:
    """'address already in use', 'permission denied', ... (strerror, lower case)."""
    if error.errno == errno.EADDRINUSE:
        return "address already in use"
    text = error.strerror or str(error)
    return text[:1].lower() + text[1:]


def bind_problem(host: str, port: int) -> OSError | None:
    """Why host:port cannot be listened on right now, or None. Binds as the servers do
    (SO_REUSEADDR, no SO_REUSEPORT), so a port that anyone listens on is reported, and
    connections of a stopped server lingering in TIME_WAIT are not."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except OSError as error:
        return error
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as error:
            return error
    return None


def ensure_free(host: str, port: int, setting: str) -> None:
    """Raise ListenError when host:port (a fixed port; 0 is always free) is taken."""
    if port == 0:
        return
    problem = bind_problem(host, port)
    if problem is not None:
        raise ListenError(host, port, setting, reason(problem))


def listen_error(host: str, port: int, setting: str, error: BaseException | None) -> ListenError:
    """The ListenError for a bind that failed with `error` (which may not say why: gRPC's
    does not, so the port is probed for the reason)."""
    if isinstance(error, OSError) and error.errno is not None:
        return ListenError(host, port, setting, reason(error))
    problem = bind_problem(host, port)
    return ListenError(host, port, setting, reason(problem) if problem else "bind failed")
