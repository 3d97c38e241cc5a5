"""Where finished videos are kept: files under the content folder, one per job and index.
Several server processes on one host share the folder (compose: a shared volume)."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

CHUNK = 256 * 1024
# One byte range, ASCII digits only (bounded: no number longer than a file size could be).
_ONE_RANGE = re.compile(r"(?i:bytes)=(?P<first>[0-9]{0,19})-(?P<last>[0-9]{0,19})")


def byte_range(header: str, size: int) -> tuple[int, int] | None:
    """The one range of a `Range: bytes=…` header (RFC 9110) within a file of `size` bytes,
    as (first, last) inclusive; None when the whole file is to be sent: no header, another
    unit, several ranges or one that cannot be satisfied (a server may ignore Range, and a
    200 with the whole file is what every player handles)."""
    match = _ONE_RANGE.fullmatch(header)
    if match is None or size <= 0:
        return None
    first_text, last_text = match["first"], match["last"]
    if not first_text:  # the last N bytes
        if not last_text or int(last_text) == 0:
            return None
        return max(0, size - int(last_text)), size - 1
    first = int(first_text)
    last = min(int(last_text), size - 1) if last_text else size - 1
    if first >= size or last < first:
        return None
    return first, last


class ContentStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, job_id: str, index: int) -> Path:
        if not job_id.replace("_", "").isalnum():
            raise ValueError("bad job id")
        return self.root / job_id / f"{index}.mp4"

    def save(self, job_id: str, index: int, data: bytes) -> None:
        """Written whole to a temporary file, then renamed: a reader never sees half a video."""
        path = self._path(job_id, index)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, scratch = tempfile.mkstemp(dir=path.parent, prefix=".partial-")
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(scratch, path)

    def exists(self, job_id: str, index: int) -> bool:
        return self._path(job_id, index).is_file()

    def size(self, job_id: str, index: int) -> int:
        return self._path(job_id, index).stat().st_size

    def chunks(
        self, job_id: str, index: int, start: int = 0, end: int | None = None
    ) -> Iterator[bytes]:
        """The file's bytes from `start` up to `end` (exclusive; None: its end)."""
        with open(self._path(job_id, index), "rb") as handle:
            handle.seek(start)
            left = None if end is None else end - start
            while left is None or left > 0:
                chunk = handle.read(CHUNK if left is None else min(CHUNK, left))
                if not chunk:
                    return
                if left is not None:
                    left -= len(chunk)
                yield chunk

    def delete(self, job_id: str) -> None:
        shutil.rmtree(self.root / job_id, ignore_errors=True)
