"""The content store in S3-compatible object storage (AWS S3, MinIO, Cloudflare R2, Google
Cloud Storage's S3 API), for gateways on several hosts: `GATEWAY_CONTENT_URL=s3://bucket/
prefix`, credentials, region and endpoint from the standard AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_REGION and AWS_ENDPOINT_URL. The bucket is the operator's.

aiobotocore, not obstore: obstore's streaming upload leaves its multipart upload open when
it is cancelled (a drain, a cancelled job) or its writer is dropped (it has no abort), and
the parts of an open upload stay stored and billed. Here a write's multipart upload is
completed or aborted, whatever stops it.

A write streams: one part in memory at a time (GATEWAY_CONTENT_PART_BYTES, at least S3's
minimum, larger for a large bound so that the bound fits in S3's 10,000 parts), a small
video in one PUT. A read
is one ranged GET, streamed in pieces."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from server.videos.content import (
    CHUNK,
    ContentStoreUnavailable,
    content_key,
    within_size,
    within_time,
)

if TYPE_CHECKING:
    from types_aiobotocore_s3 import S3Client

MIN_PART = 5 * 1024 * 1024  # S3's smallest part (but the last)
MAX_PARTS = 10_000  # S3's most parts in one upload
# One request (a part's upload, a GET's next bytes) making no progress for this long fails.
_READ_TIMEOUT_SECONDS = 60
_CONNECT_TIMEOUT_SECONDS = 10


def parse_s3_url(url: str) -> tuple[str, str]:
    """`s3://bucket/prefix` (checked by the settings) as (bucket, prefix without slashes at
    its ends)."""
    parts = urlsplit(url)
    return parts.netloc, parts.path.strip("/")


def part_size(max_bytes: int, part_bytes: int = MIN_PART) -> int:
    """The part size an upload bounded by `max_bytes` uses: `part_bytes` (at least S3's
    minimum), or larger when the bound would need more than S3's 10,000 parts."""
    return max(MIN_PART, part_bytes, -(-max_bytes // MAX_PARTS))


class S3ContentStore:
    """Objects `<prefix>/<job id>/<index>.mp4` in `bucket`. The client is opened by
    `start`, which also checks the bucket, and closed by `close`."""

    def __init__(
        self,
        bucket: str,
        prefix: str,
        *,
        env: Mapping[str, str],
        check_seconds: float,
        part_bytes: int = MIN_PART,
    ) -> None:
        self.bucket = bucket
        self.part_bytes = part_bytes
        self.prefix = prefix
        self._env = env
        self._check_seconds = check_seconds
        self._stack = contextlib.AsyncExitStack()
        self._client: S3Client | None = None

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        check_seconds: float,
        part_bytes: int = MIN_PART,
        env: Mapping[str, str] | None = None,
    ) -> S3ContentStore:
        bucket, prefix = parse_s3_url(url)
        return cls(
            bucket,
            prefix,
            env=os.environ if env is None else env,
            check_seconds=check_seconds,
            part_bytes=part_bytes,
        )

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def key(self, job_id: str, index: int) -> str:
        return self._under(content_key(job_id, index))

    def _under(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    @property
    def client(self) -> S3Client:
        if self._client is None:
            raise RuntimeError("the content store is not started")
        return self._client

    async def start(self) -> None:
        """Open the client and check the bucket exists and is reachable, within the check's
        time: otherwise ContentStoreUnavailable, one line naming GATEWAY_CONTENT_URL."""
        config = AioConfig(
            connect_timeout=_CONNECT_TIMEOUT_SECONDS,
            read_timeout=_READ_TIMEOUT_SECONDS,
            retries={"max_attempts": 3, "mode": "standard"},
            # Checksums only where S3 requires them: several S3-compatible stores refuse
            # the newer default ones.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        session = get_session()
        region = self._env.get("AWS_REGION") or self._env.get("AWS_DEFAULT_REGION")
        endpoint = self._env.get("AWS_ENDPOINT_URL") or None
        # Given here when set; otherwise botocore's own chain (a shared credentials file, an
        # instance or pod role).
        self._client = await self._stack.enter_async_context(
            session.create_client(
                "s3",
                region_name=region,
                endpoint_url=endpoint,
                aws_access_key_id=self._env.get("AWS_ACCESS_KEY_ID") or None,
                aws_secret_access_key=self._env.get("AWS_SECRET_ACCESS_KEY") or None,
                aws_session_token=self._env.get("AWS_SESSION_TOKEN") or None,
                config=config,
            )
        )
        where = f"GATEWAY_CONTENT_URL {self.url}"
        try:
            async with asyncio.timeout(self._check_seconds):
                await self.client.head_bucket(Bucket=self.bucket)
        except TimeoutError:
            await self.close()
            raise ContentStoreUnavailable(
                f"{where}: the bucket did not answer within {self._check_seconds:g} s"
            ) from None
        except ClientError as error:
            await self.close()
            status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status == 404:
                problem = "the bucket does not exist"
            elif status in (401, 403):
                problem = "access to the bucket is denied (check AWS_ACCESS_KEY_ID)"
            else:
                problem = f"the bucket cannot be used (HTTP {status})"
            raise ContentStoreUnavailable(f"{where}: {problem}") from None
        except NoCredentialsError:
            await self.close()
            raise ContentStoreUnavailable(
                f"{where}: no credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
            ) from None
        except BotoCoreError as error:
            await self.close()
            # botocore's messages name the endpoint and the problem, never the secret.
            raise ContentStoreUnavailable(
                f"{where}: the storage is not reachable ({type(error).__name__})"
            ) from None

    async def close(self) -> None:
        self._client = None
        await self._stack.aclose()

    async def write(
        self,
        job_id: str,
        index: int,
        chunks: AsyncIterable[bytes],
        *,
        max_bytes: int,
        seconds: float,
    ) -> int:
        key = self.key(job_id, index)
        upload: dict[str, Any] = {}  # the multipart upload, once one was begun
        stored = False
        try:
            async with within_time(seconds):
                size = await self._upload(key, chunks, max_bytes, upload)
            stored = True
            return size
        finally:
            if not stored and "UploadId" in upload:
                # Shielded: a cancelled write still aborts its upload (its parts go).
                await asyncio.shield(self._abort(key, upload["UploadId"]))

    async def _upload(
        self,
        key: str,
        chunks: AsyncIterable[bytes],
        max_bytes: int,
        upload: dict[str, Any],
    ) -> int:
        part_bytes = part_size(max_bytes, self.part_bytes)
        parts: list[dict[str, Any]] = []
        buffer = bytearray()
        size = 0
        async with contextlib.aclosing(within_size(chunks, max_bytes)) as bounded:
            async for chunk in bounded:
                size += len(chunk)
                buffer += chunk
                if len(buffer) >= part_bytes:
                    await self._part(key, upload, parts, buffer)
        if "UploadId" not in upload:  # a small video: one PUT, visible whole or not at all
            await self.client.put_object(
                Bucket=self.bucket, Key=key, Body=bytes(buffer), ContentType="video/mp4"
            )
            return size
        if buffer:
            await self._part(key, upload, parts, buffer)
        await self.client.complete_multipart_upload(
            Bucket=self.bucket,
            Key=key,
            UploadId=upload["UploadId"],
            MultipartUpload={"Parts": parts},  # type: ignore[typeddict-item]  # built as the API wants
        )
        return size

    async def _part(
        self, key: str, upload: dict[str, Any], parts: list[dict[str, Any]], buffer: bytearray
    ) -> None:
        if "UploadId" not in upload:
            begun = await self.client.create_multipart_upload(
                Bucket=self.bucket, Key=key, ContentType="video/mp4"
            )
            upload["UploadId"] = begun["UploadId"]
        number = len(parts) + 1
        sent = await self.client.upload_part(
            Bucket=self.bucket,
            Key=key,
            UploadId=upload["UploadId"],
            PartNumber=number,
            Body=buffer,  # type: ignore[arg-type]  # botocore sends any bytes-like body; no copy
        )
        parts.append({"ETag": sent["ETag"], "PartNumber": number})
        buffer.clear()

    async def _abort(self, key: str, upload_id: str) -> None:
        try:
            await self.client.abort_multipart_upload(
                Bucket=self.bucket, Key=key, UploadId=upload_id
            )
        except (ClientError, BotoCoreError):
            # Left to the bucket's AbortIncompleteMultipartUpload rule (docs/operating.md).
            pass

    async def exists(self, job_id: str, index: int) -> bool:
        return await self.size(job_id, index) is not None

    async def size(self, job_id: str, index: int) -> int | None:
        try:
            head = await self.client.head_object(Bucket=self.bucket, Key=self.key(job_id, index))
        except ClientError as error:
            if error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                return None
            raise
        return int(head["ContentLength"])

    async def read(
        self, job_id: str, index: int, start: int = 0, end: int | None = None
    ) -> AsyncIterator[bytes]:
        if end is not None and end <= start:
            return
        key = self.key(job_id, index)
        if start == 0 and end is None:  # whole (a Range on an empty object would be refused)
            answer = await self.client.get_object(Bucket=self.bucket, Key=key)
        else:
            span = f"bytes={start}-{'' if end is None else end - 1}"
            answer = await self.client.get_object(Bucket=self.bucket, Key=key, Range=span)
        async with answer["Body"] as body:
            while chunk := await body.read(CHUNK):
                yield chunk

    async def delete(self, job_id: str) -> None:
        """The job's objects, and any upload of them still open (a host killed mid-write
        leaves its multipart upload open, its parts stored and billed)."""
        folder = self._under(content_key(job_id, 0).rsplit("/", 1)[0] + "/")
        listed = await self.client.list_objects_v2(Bucket=self.bucket, Prefix=folder)
        keys = [{"Key": item["Key"]} for item in listed.get("Contents", [])]
        if keys:
            await self.client.delete_objects(
                Bucket=self.bucket,
                Delete={"Objects": keys, "Quiet": True},  # type: ignore[typeddict-item]
            )
        uploads = await self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=folder)
        for upload in uploads.get("Uploads", []):
            await self._abort(upload["Key"], upload["UploadId"])
