"""How many requests the process is answering: the request observer counts them
(server/services/rpc.py), and the group-commit writer asks whether a request is alone
(server/db/writer.py: a lone request's settlement then commits in its own task)."""

from __future__ import annotations


class RequestsInFlight:
    """The process's requests in flight (gRPC and the REST listener's, every observed rpc)."""

    def __init__(self) -> None:
        self.count = 0

    def begun(self) -> None:
        self.count += 1

    def ended(self) -> None:
        self.count -= 1

    def alone(self) -> bool:
        """No request is in flight but (at most) the caller's own."""
        return self.count <= 1
