"""A raw HTTP/1.1 client on loopback for what ordinary clients cannot do: stall halfway
through the headers or the body, announce a body and send only part of it, or speak from
another loopback address (127.0.0.x) as another client."""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes
    seconds: float  # from the last byte sent to the answer

    def json(self) -> Any:
        return json.loads(self.body)


def _read_response(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def exchange(
    port: int,
    *parts: bytes,
    pause: float = 0.0,
    source: str = "127.0.0.1",
    timeout: float = 15.0,
) -> RawResponse:
    """Send `parts` (waiting `pause` seconds between them), then read one response."""
    with socket.create_connection(
        ("127.0.0.1", port), timeout=timeout, source_address=(source, 0)
    ) as sock:
        for index, part in enumerate(parts):
            if index and pause:
                time.sleep(pause)
            sock.sendall(part)
        sent = time.monotonic()
        raw = _read_response(sock)
    return _parse(raw, time.monotonic() - sent)


def _parse(raw: bytes, seconds: float) -> RawResponse:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return RawResponse(int(lines[0].split()[1]), headers, body, seconds)


def stream_until_answered(
    port: int, head: bytes, chunks: Iterator[bytes], timeout: float = 30.0
) -> tuple[RawResponse, int]:
    """Send `head`, then `chunks` one by one until the server answers; the response and how
    many body bytes were sent by then."""
    sent_bytes = 0
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head)
        for chunk in chunks:
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                break
            try:
                sock.sendall(chunk)
            except OSError:
                break  # the server closed its side after answering
            sent_bytes += len(chunk)
        started = time.monotonic()
        raw = _read_response(sock)
    return _parse(raw, time.monotonic() - started), sent_bytes
