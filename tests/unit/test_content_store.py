"""The content store's local folder backend: a write streams chunks into a temporary file
that becomes the object only once complete (mode 0600); past its size or time bound, on a
failing producer or a cancelled write, nothing of it is left and an earlier object of that
name is kept; reads stream the object back."""

from __future__ import annotations

import asyncio
import os
import stat
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from server.videos.content import ContentTooLarge, ContentTooSlow, LocalContentStore

JOB = "vid_0123abcd"
MiB = 1024 * 1024


async def _chunks(*pieces: bytes, pause: float = 0.0) -> AsyncIterator[bytes]:
    for piece in pieces:
        if pause:
            await asyncio.sleep(pause)
        yield piece


async def _endless(piece: bytes, pause: float) -> AsyncIterator[bytes]:
    for _ in range(10_000):  # bounded: the write's deadline ends it long before
        await asyncio.sleep(pause)
        yield piece


def _left(store: LocalContentStore) -> list[str]:
    return sorted(str(p.relative_to(store.root)) for p in store.root.rglob("*"))


@pytest.fixture
def store(tmp_path: Path) -> LocalContentStore:
    return LocalContentStore(tmp_path / "content")


async def _read(store: LocalContentStore, index: int = 0) -> bytes:
    return b"".join([chunk async for chunk in store.read(JOB, index)])


async def test_a_write_streams_into_an_object_of_mode_0600_read_back_in_chunks(
    store: LocalContentStore,
) -> None:
    pieces = [os.urandom(700 * 1024) for _ in range(3)]  # more than one write batch
    size = await store.write(JOB, 0, _chunks(*pieces), max_bytes=4 * MiB, seconds=5)
    assert size == sum(len(p) for p in pieces)
    assert await store.exists(JOB, 0) and not await store.exists(JOB, 1)
    assert stat.S_IMODE(store.path(JOB, 0).stat().st_mode) == 0o600
    assert _left(store) == [JOB, f"{JOB}/0.mp4"]  # no temporary file
    chunks = [chunk async for chunk in store.read(JOB, 0)]
    assert len(chunks) > 1 and b"".join(chunks) == b"".join(pieces)
    await store.delete(JOB)
    assert _left(store) == []


async def test_past_max_bytes_the_write_stops_and_leaves_nothing(
    store: LocalContentStore,
) -> None:
    read: list[int] = []

    async def counted() -> AsyncIterator[bytes]:
        for index in range(1000):
            read.append(index)
            yield b"x" * 1024

    with pytest.raises(ContentTooLarge) as refused:
        await store.write(JOB, 0, counted(), max_bytes=10 * 1024, seconds=5)
    assert str(refused.value) == "The provider's video is larger than the limit (10 KiB)"
    assert len(read) == 11  # stopped at the first chunk past the bound
    assert _left(store) == []


async def test_past_its_deadline_an_endless_write_stops_and_leaves_nothing(
    store: LocalContentStore,
) -> None:
    started = time.monotonic()
    with pytest.raises(ContentTooSlow) as refused:
        await store.write(JOB, 0, _endless(b"x", 0.01), max_bytes=MiB, seconds=0.3)
    assert time.monotonic() - started < 2
    assert str(refused.value) == "The provider's video did not download within 0.3 s"
    assert _left(store) == []


async def test_a_failing_or_cancelled_write_keeps_the_earlier_object_whole(
    store: LocalContentStore,
) -> None:
    await store.write(JOB, 0, _chunks(b"first"), max_bytes=MiB, seconds=5)

    async def failing() -> AsyncIterator[bytes]:
        yield b"second, half"
        raise ConnectionError("the provider hung up")

    with pytest.raises(ConnectionError):
        await store.write(JOB, 0, failing(), max_bytes=MiB, seconds=5)
    writing = asyncio.create_task(
        store.write(JOB, 0, _endless(b"y", 0.01), max_bytes=MiB, seconds=30)
    )
    await asyncio.sleep(0.2)
    writing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await writing
    assert await _read(store) == b"first"
    assert _left(store) == [JOB, f"{JOB}/0.mp4"]


async def test_a_key_is_a_job_id_never_a_path(store: LocalContentStore) -> None:
    for job_id in ("../etc", "a/b", ""):
        with pytest.raises(ValueError):
            await store.write(job_id, 0, _chunks(b"x"), max_bytes=MiB, seconds=5)
        with pytest.raises(ValueError):
            await store.delete(job_id)
