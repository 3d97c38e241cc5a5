"""A raw HTTP/2 (prior knowledge, cleartext) client for what ordinary clients do not send:
request trailers, and header names or values of any kind."""

from __future__ import annotations

import socket
import time

import h2.config
import h2.connection
import h2.events

Header = tuple[bytes, bytes]


def h2_exchange(
    port: int,
    headers: list[Header],
    body: bytes = b"",
    trailers: list[Header] | None = None,
    timeout: float = 15.0,
) -> tuple[int | None, bytes]:
    """One request on a new connection: its status (None when the stream was reset) and body."""
    config = h2.config.H2Configuration(
        client_side=True,
        header_encoding=None,
        validate_outbound_headers=False,
        normalize_outbound_headers=False,
    )
    connection = h2.connection.H2Connection(config)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        connection.initiate_connection()
        stream = connection.get_next_available_stream_id()
        connection.send_headers(stream, headers, end_stream=not body and trailers is None)
        if body:
            connection.send_data(stream, body, end_stream=trailers is None)
        if trailers is not None:
            connection.send_headers(stream, trailers, end_stream=True)
        sock.sendall(connection.data_to_send())
        status: int | None = None
        data = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            chunk = sock.recv(65536)
            if not chunk:
                break
            ended = False
            for event in connection.receive_data(chunk):
                if isinstance(event, h2.events.ResponseReceived):
                    status = int(dict(event.headers)[b":status"])
                elif isinstance(event, h2.events.DataReceived):
                    data += event.data
                    connection.acknowledge_received_data(event.flow_controlled_length, stream)
                elif isinstance(
                    event,
                    h2.events.StreamEnded | h2.events.StreamReset | h2.events.ConnectionTerminated,
                ):
                    ended = True
            sock.sendall(connection.data_to_send())
            if ended:
                break
    return status, data
