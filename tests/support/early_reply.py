"""An HTTP/1.1 client that reads the answer while it is still sending the body, as curl
does: a server may refuse a request (401, 413, 503) before its body is read, and a client
that only reads once it has sent everything sees a reset instead of that answer."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass
from typing import Any

PIECE = 256 * 1024


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    seconds: float  # from the first byte sent to the answer
    sent: int  # body bytes the client got to send

    def json(self) -> Any:
        return json.loads(self.body)


async def _read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    while True:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        if status != 100:
            break
    length = int(headers.get("content-length", "0"))
    body = await reader.readexactly(length) if length else b""
    return status, headers, body


async def post(
    port: int,
    path: str,
    body: bytes,
    headers: dict[str, str],
    *,
    chunked: bool = False,
    answer_within: float = 60.0,
    method: str = "POST",
) -> Answer:
    """`method` (POST) with `body` (Content-Length, or chunked), reading the answer as soon
    as it comes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    sent = 0
    started = time.monotonic()

    async def send() -> None:
        nonlocal sent
        framing = "transfer-encoding: chunked" if chunked else f"content-length: {len(body)}"
        head = f"{method} {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n{framing}\r\n"
        head += "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        writer.write((head + "\r\n").encode("latin-1"))
        view = memoryview(body)
        for start in range(0, len(body), PIECE):
            piece = view[start : start + PIECE]
            if chunked:
                writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            else:
                writer.write(piece)
            await writer.drain()
            sent += len(piece)
        if chunked:
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    sending = asyncio.ensure_future(send())
    try:
        async with asyncio.timeout(answer_within):
            status, answer_headers, answer_body = await _read_answer(reader)
    finally:
        sending.cancel()
        with contextlib.suppress(BaseException):
            await sending
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return Answer(status, answer_headers, answer_body, time.monotonic() - started, sent)
