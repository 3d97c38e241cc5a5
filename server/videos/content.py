"""Where finished videos are kept: the content store, one object per job and index, written
from a stream of chunks under a size and a time bound and read back as a stream (whole or
one byte range). One interface (`ContentStore`) for its backends, chosen by
GATEWAY_CONTENT_URL (`content_store`): the local folder (`LocalContentStore`, the embedded
default; several server processes on one host share it, compose: a shared volume) and
S3-compatible object storage (server/videos/s3_content.py), which hosts share."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator
from pathlib import Path
from typing import BinaryIO, Protocol

CHUNK = 256 * 1024  # read back in pieces of this size
# Received chunks are gathered up to this much before one write (one thread hand-off per
# write, not per network chunk).
_WRITE_BATCH = 1024 * 1024


class ContentRefused(Exception):
    """A write past one of its bounds: nothing was stored, nothing partial is left. The
    message says which bound, in words a job's `error` can carry."""


class ContentStoreUnavailable(RuntimeError):
    """The configured store cannot be used (checked before serving): the message names
    GATEWAY_CONTENT_URL and what is wrong, never a credential."""


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


async def within_size(chunks: AsyncIterable[bytes], max_bytes: int) -> AsyncGenerator[bytes, None]:
    """`chunks` as they come, refused past `max_bytes` (ContentTooLarge); the producer (an
    HTTP download) is closed whatever happened: its connection given back or dropped now, not
    when the generator is collected. Every backend's write reads through it (in
    `contextlib.aclosing`, so a write that fails on its side closes the producer too)."""
    size = 0
    try:
        async for chunk in chunks:
            size += len(chunk)
            if size > max_bytes:
                raise ContentTooLarge(max_bytes)
            yield chunk
    finally:
        closer = getattr(chunks, "aclose", None)
        if closer is not None:
            await closer()


@contextlib.asynccontextmanager
async def within_time(seconds: float) -> AsyncIterator[None]:
    """A write's whole time bound, the producer's waits included: ContentTooSlow past it (a
    TimeoutError of anything else inside goes on as it is)."""
    deadline = asyncio.timeout(seconds)
    try:
        async with deadline:
            yield
    except TimeoutError:
        if deadline.expired():
            raise ContentTooSlow(seconds) from None
        raise


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
    `read` streams an object back, from byte `start` up to `end` (exclusive; None: its
    end); `size` is an object's size (None: there is none); `delete` removes a job's
    objects (again: nothing happens). `start` checks the store is usable before serving
    (ContentStoreUnavailable otherwise); `close` lets its connections go."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

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
    ) -> AsyncIterator[bytes]: ...

    async def exists(self, job_id: str, index: int) -> bool: ...

    async def size(self, job_id: str, index: int) -> int | None: ...

    async def delete(self, job_id: str) -> None: ...


class LocalContentStore:
    """Objects as files under `root` (`<job id>/<index>.mp4`, mode 0600). A write goes to a
    temporary file in the job's folder (same file system) and is renamed over the name once
    complete: a reader sees a whole video or none. File work runs in threads, off the event
    loop."""

    def __init__(self, root: Path) -> None:
        self.root = root

    async def start(self) -> None:
        pass  # the folder is made by the first write

    async def close(self) -> None:
        pass

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
            async with within_time(seconds):
                size = await self._copy(chunks, handle, max_bytes)
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
        async with contextlib.aclosing(within_size(chunks, max_bytes)) as bounded:
            async for chunk in bounded:
                size += len(chunk)
                batch.append(chunk)
                batched += len(chunk)
                if batched >= _WRITE_BATCH:
                    await asyncio.to_thread(handle.write, b"".join(batch))
                    batch, batched = [], 0
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

    async def size(self, job_id: str, index: int) -> int | None:
        try:
            stat = await asyncio.to_thread(self.path(job_id, index).stat)
        except FileNotFoundError:
            return None
        return stat.st_size

    async def read(
        self, job_id: str, index: int, start: int = 0, end: int | None = None
    ) -> AsyncIterator[bytes]:
        handle = await asyncio.to_thread(open, self.path(job_id, index), "rb")
        try:
            if start:
                await asyncio.to_thread(handle.seek, start)
            left = None if end is None else end - start
            while left is None or left > 0:
                chunk = await asyncio.to_thread(
                    handle.read, CHUNK if left is None else min(CHUNK, left)
                )
                if not chunk:
                    break
                if left is not None:
                    left -= len(chunk)
                yield chunk
        finally:
            handle.close()

    async def delete(self, job_id: str) -> None:
        content_key(job_id, 0)  # a job id, never a path
        await asyncio.to_thread(shutil.rmtree, self.root / job_id, True)


def content_store(
    url: str, root: Path, *, check_seconds: float, part_bytes: int = 8 * 1024 * 1024
) -> ContentStore:
    """The store GATEWAY_CONTENT_URL names (already checked by the settings): `s3://bucket
    /prefix`: object storage (its credentials, region and endpoint from the standard AWS_*
    variables); empty or `file:///path`: the local folder (`root` when empty)."""
    if url.startswith("s3://"):
        # Imported only when used: the embedded default never loads the S3 client.
        from server.videos.s3_content import S3ContentStore

        return S3ContentStore.from_url(url, check_seconds=check_seconds, part_bytes=part_bytes)
    if url.startswith("file://"):
        return LocalContentStore(Path(url.removeprefix("file://")))
    return LocalContentStore(root)
