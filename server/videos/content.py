"""Where finished videos are kept: the content store, one object per job and index, written
from a stream of chunks under a size and a time bound and read back as a stream. One
interface (`ContentStore`) for its backends; the local folder (`LocalContentStore`, the
embedded default) is the one there is. Several server processes on one host share the
folder (compose: a shared volume)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import AsyncIterable, AsyncIterator
from pathlib import Path
from typing import BinaryIO, Protocol

CHUNK = 256 * 1024  # read back in pieces of this size
# Received chunks are gathered up to this much before one write (one thread hand-off per
# write, not per network chunk).
_WRITE_BATCH = 1024 * 1024
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


class ContentRefused(Exception):
    """A write past one of its bounds: nothing was stored, nothing partial is left. The
    message says which bound, in words a job's `error` can carry."""


class ContentTooLarge(ContentRefused):
    def __init__(self, max_bytes: int) -> None:
        super().__init__(f"The provider's video is larger than the limit ({_size(max_bytes)})")
        self.max_bytes = max_bytes


class ContentTooSlow(ContentRefused):
    def __init__(self, seconds: float) -> None:
        super().__init__(f"The provider's video did not download within {seconds:g} s")
        self.seconds = seconds


def _size(count: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if count >= scale and count % scale == 0:
            return f"{count // scale} {unit}"
    return f"{count} bytes"


def content_key(job_id: str, index: int) -> str:
    """The object's name in any backend: `<job id>/<index>.mp4`."""
    if not job_id.replace("_", "").isalnum() or index < 0:
        raise ValueError("bad job id")
    return f"{job_id}/{index}.mp4"


class ContentStore(Protocol):
    """A job's videos. `write` stores what `chunks` yields under the job and index, all or
    nothing: past `max_bytes` it raises ContentTooLarge, past `seconds` (the whole write,
    the producer's waits included) ContentTooSlow, and on any failure no object and nothing
    partial is left; an earlier object of that name is replaced only by a complete one.
    `read` streams an object back; `delete` removes a job's objects."""

    async def write(
        self,
        job_id: str,
        index: int,
        chunks: AsyncIterable[bytes],
        *,
        max_bytes: int,
        seconds: float,
    ) -> int: ...

    def read(
        self, job_id: str, index: int, start: int = 0, end: int | None = None
    ) -> AsyncIterator[bytes]:
        """The object's bytes from `start` up to `end` (exclusive; None: its end)."""
        ...

    async def size(self, job_id: str, index: int) -> int: ...

    async def exists(self, job_id: str, index: int) -> bool: ...

    async def delete(self, job_id: str) -> None: ...


class LocalContentStore:
    """Objects as files under `root` (`<job id>/<index>.mp4`, mode 0600). A write goes to a
    temporary file in the job's folder (same file system) and is renamed over the name once
    complete: a reader sees a whole video or none. File work runs in threads, off the event
    loop."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, job_id: str, index: int) -> Path:
        return self.root / content_key(job_id, index)

    async def write(
        self,
        job_id: str,
        index: int,
        chunks: AsyncIterable[bytes],
        *,
        max_bytes: int,
        seconds: float,
    ) -> int:
        path = self.path(job_id, index)
        handle, scratch = await asyncio.to_thread(self._scratch, path)
        stored = False
        try:
            try:
                async with asyncio.timeout(seconds):
                    size = await self._copy(chunks, handle, max_bytes)
            except TimeoutError:
                raise ContentTooSlow(seconds) from None
            await asyncio.to_thread(self._commit, handle, scratch, path)
            stored = True
            return size
        finally:
            if not stored:
                # Shielded: a cancelled write still removes what it wrote.
                await asyncio.shield(asyncio.to_thread(self._discard, handle, scratch))

    async def _copy(self, chunks: AsyncIterable[bytes], handle: BinaryIO, max_bytes: int) -> int:
        size = 0
        batch: list[bytes] = []
        batched = 0
        try:
            async for chunk in chunks:
                size += len(chunk)
                if size > max_bytes:
                    raise ContentTooLarge(max_bytes)
                batch.append(chunk)
                batched += len(chunk)
                if batched >= _WRITE_BATCH:
                    await asyncio.to_thread(handle.write, b"".join(batch))
                    batch, batched = [], 0
        finally:
            # The producer (an HTTP download) is closed whatever happened: its connection
            # is given back or dropped now, not when the generator is collected.
            closer = getattr(chunks, "aclose", None)
            if closer is not None:
                await closer()
        if batch:
            await asyncio.to_thread(handle.write, b"".join(batch))
        return size

    @staticmethod
    def _scratch(path: Path) -> tuple[BinaryIO, str]:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, scratch = tempfile.mkstemp(dir=path.parent, prefix=".partial-")  # mode 0600
        return os.fdopen(fd, "wb"), scratch

    @staticmethod
    def _commit(handle: BinaryIO, scratch: str, path: Path) -> None:
        handle.flush()
        os.fsync(handle.fileno())
        handle.close()
        os.replace(scratch, path)

    @staticmethod
    def _discard(handle: BinaryIO, scratch: str) -> None:
        handle.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(scratch)
        with contextlib.suppress(OSError):  # the job's folder, when nothing else is in it
            os.rmdir(os.path.dirname(scratch))

    async def exists(self, job_id: str, index: int) -> bool:
        return await asyncio.to_thread(self.path(job_id, index).is_file)

    async def read(
        self, job_id: str, index: int, start: int = 0, end: int | None = None
    ) -> AsyncIterator[bytes]:
        handle = await asyncio.to_thread(open, self.path(job_id, index), "rb")
        try:
            await asyncio.to_thread(handle.seek, start)
            left = None if end is None else end - start
            while left is None or left > 0:
                want = CHUNK if left is None else min(CHUNK, left)
                chunk = await asyncio.to_thread(handle.read, want)
                if not chunk:
                    return
                if left is not None:
                    left -= len(chunk)
                yield chunk
        finally:
            handle.close()

    async def size(self, job_id: str, index: int) -> int:
        stat = await asyncio.to_thread(self.path(job_id, index).stat)
        return stat.st_size

    async def delete(self, job_id: str) -> None:
        content_key(job_id, 0)  # a job id, never a path
        await asyncio.to_thread(shutil.rmtree, self.root / job_id, True)
