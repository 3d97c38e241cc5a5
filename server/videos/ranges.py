"""One byte range of a video's content (RFC 9110 §14): `Range: bytes=a-b`, `a-` or `-n`.
A server may ignore a Range header (§14.2): several ranges (a multipart/byteranges answer no
video player needs), another unit or a malformed value are answered with the whole video."""

from __future__ import annotations

import re
from dataclasses import dataclass

_ONE_RANGE = re.compile(r"^bytes=(?:(\d{1,19})-(\d{0,19})|-(\d{1,19}))$")


@dataclass(frozen=True)
class ByteRange:
    start: int
    end: int  # exclusive
    size: int  # of the whole video

    @property
    def content_range(self) -> str:
        return f"bytes {self.start}-{self.end - 1}/{self.size}"


class Unsatisfiable(Exception):
    """No byte of the range is in the video (416, `Content-Range: bytes */size`)."""

    def __init__(self, size: int) -> None:
        super().__init__(f"The requested range is not within the video's {size} bytes")
        self.size = size


def byte_range(header: str | None, size: int) -> ByteRange | None:
    """The one range `header` asks for in a video of `size` bytes; None: the whole video
    (no header, or one to ignore). Raises Unsatisfiable."""
    if header is None:
        return None
    found = _ONE_RANGE.match(header.strip().replace(" ", ""))
    if found is None:
        return None
    first, last, suffix = found.groups()
    if suffix is not None:
        length = int(suffix)
        if length == 0 or size == 0:
            raise Unsatisfiable(size)
        return ByteRange(max(0, size - length), size, size)
    start = int(first)
    if last and int(last) < start:
        return None  # invalid (§14.1.1): ignored
    if start >= size:
        raise Unsatisfiable(size)
    end = size if not last else min(int(last) + 1, size)
    return ByteRange(start, end, size)
