"""The content store in S3-compatible object storage, against moto's S3 server on loopback: a
write streams in parts (multipart past one part, one PUT below) and the object appears only
when complete; past its size or time bound, on a failing producer or a cancelled write, the
multipart upload is aborted (no object, no upload left) and an earlier object is kept; reads
stream the whole object or one byte range; delete removes a job's objects, twice harmlessly;
the start-up check refuses a missing bucket or an unreachable endpoint in one line naming
GATEWAY_CONTENT_URL and no credential. Also: the range arithmetic of the local folder."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from server.config import SettingsError, load_settings
from server.videos.content import (
    ContentStoreUnavailable,
    ContentTooLarge,
    ContentTooSlow,
    LocalContentStore,
    content_store,
)
from server.videos.s3_content import MIN_PART, S3ContentStore, part_size
from testkit.processes import refusing_port
from tests.support.moto import SECRET_KEY, MotoS3

JOB = "vid_0123abcd"
MiB = 1024 * 1024


async def _chunks(*pieces: bytes) -> AsyncIterator[bytes]:
    for piece in pieces:
        yield piece


async def _endless(piece: bytes, pause: float) -> AsyncIterator[bytes]:
    for _ in range(10_000):  # bounded: the write's deadline ends it long before
        await asyncio.sleep(pause)
        yield piece


@pytest_asyncio.fixture
async def store(moto_s3: MotoS3) -> AsyncIterator[S3ContentStore]:
    store = S3ContentStore(moto_s3.bucket(), "videos", env=moto_s3.env, check_seconds=5)
    await store.start()
    yield store
    await store.close()


async def _read(
    store: S3ContentStore | LocalContentStore, start: int = 0, end: int | None = None
) -> bytes:
    return b"".join([chunk async for chunk in store.read(JOB, 0, start, end)])


async def test_a_large_write_goes_up_in_parts_and_streams_back(
    store: S3ContentStore,
    moto_s3: MotoS3,
) -> None:
    body = os.urandom(2 * MIN_PART + 1234)  # three parts
    size = await store.write(
        JOB,
        0,
        _chunks(*(body[i : i + MiB] for i in range(0, len(body), MiB))),
        max_bytes=64 * MiB,
        seconds=20,
    )
    assert size == len(body)
    assert moto_s3.keys(store.bucket) == [f"videos/{JOB}/0.mp4"]
    assert moto_s3.uploads(store.bucket) == []
    assert await store.size(JOB, 0) == len(body) and await store.size(JOB, 1) is None
    assert await store.exists(JOB, 0) and not await store.exists(JOB, 1)
    chunks = [chunk async for chunk in store.read(JOB, 0)]
    assert len(chunks) > 1 and b"".join(chunks) == body
    assert await _read(store, 5, 105) == body[5:105]
    assert await _read(store, len(body) - 7) == body[-7:]
    assert await _read(store, MIN_PART - 3, MIN_PART + 3) == body[MIN_PART - 3 : MIN_PART + 3]


async def test_a_small_write_is_one_put_and_reads_by_range(
    store: S3ContentStore, moto_s3: MotoS3
) -> None:
    assert await store.write(JOB, 0, _chunks(b"0123", b"456789"), max_bytes=MiB, seconds=5) == 10
    assert await _read(store) == b"0123456789"
    assert await _read(store, 2, 5) == b"234"
    assert await _read(store, 9) == b"9"
    assert moto_s3.uploads(store.bucket) == []


async def test_past_max_bytes_the_upload_is_aborted_and_nothing_is_left(
    store: S3ContentStore,
    moto_s3: MotoS3,
) -> None:
    async def counted() -> AsyncIterator[bytes]:
        for _ in range(100):
            yield b"x" * MiB

    with pytest.raises(ContentTooLarge):
        await store.write(JOB, 0, counted(), max_bytes=12 * MiB, seconds=20)
    assert moto_s3.keys(store.bucket) == []
    assert moto_s3.uploads(store.bucket) == []  # the two parts sent went with the upload


async def test_past_its_deadline_the_upload_is_aborted_and_nothing_is_left(
    store: S3ContentStore,
    moto_s3: MotoS3,
) -> None:
    async def slow() -> AsyncIterator[bytes]:
        yield b"x" * (MIN_PART + 1)  # one part sent
        async for piece in _endless(b"y", 0.05):
            yield piece

    started = time.monotonic()
    with pytest.raises(ContentTooSlow):
        await store.write(JOB, 0, slow(), max_bytes=64 * MiB, seconds=1.0)
    assert time.monotonic() - started < 5
    assert moto_s3.keys(store.bucket) == []
    assert moto_s3.uploads(store.bucket) == []


async def test_a_failing_or_cancelled_write_aborts_and_keeps_the_earlier_object(
    store: S3ContentStore,
    moto_s3: MotoS3,
) -> None:
    await store.write(JOB, 0, _chunks(b"first"), max_bytes=64 * MiB, seconds=5)

    async def failing() -> AsyncIterator[bytes]:
        yield b"x" * (MIN_PART + 1)
        raise ConnectionError("the provider hung up")

    with pytest.raises(ConnectionError):
        await store.write(JOB, 0, failing(), max_bytes=64 * MiB, seconds=20)
    parted = asyncio.Event()

    async def then_endless() -> AsyncIterator[bytes]:
        yield b"x" * (MIN_PART + 1)
        yield b"y"  # asked for once the first part is up
        parted.set()
        async for piece in _endless(b"y", 0.05):
            yield piece

    writing = asyncio.create_task(
        store.write(JOB, 0, then_endless(), max_bytes=64 * MiB, seconds=30)
    )
    await asyncio.wait_for(parted.wait(), 10)
    writing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await writing
    assert await _read(store) == b"first"
    assert moto_s3.keys(store.bucket) == [f"videos/{JOB}/0.mp4"]
    assert moto_s3.uploads(store.bucket) == []


async def test_delete_removes_a_jobs_objects_and_again_is_harmless(
    store: S3ContentStore,
    moto_s3: MotoS3,
) -> None:
    other = "vid_0123abcdef"  # a job id the first one is a prefix of
    for job, index in ((JOB, 0), (JOB, 1), (other, 0)):
        await store.write(job, index, _chunks(b"v"), max_bytes=MiB, seconds=5)
    await store.delete(JOB)
    await store.delete(JOB)
    assert moto_s3.keys(store.bucket) == [f"videos/{other}/0.mp4"]
    with pytest.raises(ValueError):
        await store.delete("../x")


async def test_start_refuses_a_missing_bucket_or_an_unreachable_endpoint_in_one_line(
    moto_s3: MotoS3,
) -> None:
    missing = S3ContentStore("no-such-bucket-here", "p", env=moto_s3.env, check_seconds=5)
    with pytest.raises(ContentStoreUnavailable) as refused:
        await missing.start()
    assert str(refused.value) == (
        "GATEWAY_CONTENT_URL s3://no-such-bucket-here/p: the bucket does not exist"
    )
    env = {**moto_s3.env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{refusing_port()}"}
    unreachable = S3ContentStore("any-bucket", "", env=env, check_seconds=3)
    started = time.monotonic()
    with pytest.raises(ContentStoreUnavailable) as refused:
        await unreachable.start()
    assert time.monotonic() - started < 10
    message = str(refused.value)
    assert message.startswith("GATEWAY_CONTENT_URL s3://any-bucket: ")
    assert "\n" not in message and SECRET_KEY not in message


def test_the_setting_chooses_the_backend_and_refuses_bad_urls(tmp_path: Path) -> None:
    assert load_settings(tmp_path).content_url == ""
    assert load_settings(tmp_path, content_url="s3://bucket/a/b").content_url == "s3://bucket/a/b"
    for bad in ("s3://key:secret@bucket/p", "http://bucket/p", "s3:///p", "file://relative"):
        with pytest.raises(SettingsError) as refused:
            load_settings(tmp_path, content_url=bad)
        assert "GATEWAY_CONTENT_URL" in str(refused.value) or "--content-url" in str(refused.value)
        assert "secret" not in str(refused.value)
    local = content_store("", tmp_path / "content", check_seconds=1)
    assert isinstance(local, LocalContentStore) and local.root == tmp_path / "content"
    chosen = content_store(f"file://{tmp_path}/elsewhere", tmp_path / "content", check_seconds=1)
    assert isinstance(chosen, LocalContentStore) and chosen.root == tmp_path / "elsewhere"
    s3 = content_store("s3://bucket/a/b/", tmp_path, check_seconds=1)
    assert isinstance(s3, S3ContentStore) and (s3.bucket, s3.prefix) == ("bucket", "a/b")


def test_the_part_size_fits_the_bound_in_s3s_parts() -> None:
    assert part_size(2 * 1024**3) == MIN_PART
    assert part_size(100 * 1024**3) * 10_000 >= 100 * 1024**3


async def test_the_local_folder_reads_ranges_too(tmp_path: Path) -> None:
    store = LocalContentStore(tmp_path)
    body = os.urandom(600 * 1024)
    await store.write(JOB, 0, _chunks(body), max_bytes=MiB, seconds=5)
    assert await store.size(JOB, 0) == len(body) and await store.size(JOB, 1) is None
    assert await _read(store, 10, 300 * 1024) == body[10 : 300 * 1024]
    assert await _read(store, len(body) - 1) == body[-1:]
    assert await _read(store) == body


def test_the_deployments_object_storage_settings_are_the_ones_the_store_reads(
    tmp_path: Path,
) -> None:
    """The Kubernetes example's object-storage secret names GATEWAY_CONTENT_URL and the AWS_*
    variables the store reads (and nothing else); its URL is one the settings accept."""
    root = Path(__file__).resolve().parents[2]
    env_file = root / "deploy/kubernetes/overlays/example/secrets/object-storage.env"
    pairs = dict(
        line.split("=", 1)
        for line in env_file.read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert set(pairs) == {
        "GATEWAY_CONTENT_URL",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_REGION",
        "AWS_ENDPOINT_URL",
    }
    url = load_settings(tmp_path, content_url=pairs["GATEWAY_CONTENT_URL"]).content_url
    store = content_store(url, tmp_path, check_seconds=1)
    assert isinstance(store, S3ContentStore) and store.bucket == "CHANGE-ME-bucket"


async def test_delete_aborts_an_upload_a_dead_host_left_open(
    store: S3ContentStore, moto_s3: MotoS3
) -> None:
    """A host killed mid-upload leaves its multipart upload open (its parts stored and
    billed): deleting the job's content (expiry, a failed job) aborts it."""
    client = moto_s3.client()
    begun = client.create_multipart_upload(Bucket=store.bucket, Key=store.key(JOB, 0))
    client.upload_part(
        Bucket=store.bucket,
        Key=store.key(JOB, 0),
        UploadId=begun["UploadId"],
        PartNumber=1,
        Body=b"x" * MIN_PART,
    )
    other = client.create_multipart_upload(Bucket=store.bucket, Key=store.key("vid_other", 0))
    await store.delete(JOB)
    assert moto_s3.uploads(store.bucket) == [store.key("vid_other", 0)]
    client.abort_multipart_upload(
        Bucket=store.bucket, Key=store.key("vid_other", 0), UploadId=other["UploadId"]
    )
