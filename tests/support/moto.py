"""An S3 endpoint on loopback for the content store's tests: moto's server mode (`moto[server]`,
the S3 REST protocol) in a subprocess of the test process, stopped by its PID. The product
only sees the standard AWS_* variables (`MotoS3.env`); the tests look inside with boto3."""

from __future__ import annotations

import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from testkit.processes import free_port

REGION = "us-east-1"
ACCESS_KEY = "moto-test-access"
SECRET_KEY = "moto-test-secret"


@dataclass
class MotoS3:
    port: int
    process: subprocess.Popen[bytes] | None = None
    buckets: list[str] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """What a gateway is given to use this endpoint (and nothing that names moto)."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_ENDPOINT_URL": self.endpoint,
        }

    def client(self) -> Any:
        import boto3  # only where an S3 endpoint is used (the fixture is in every session)

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
        )

    def start(self, ready_within: float = 20.0) -> MotoS3:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + ready_within
        while True:
            try:
                httpx.get(f"{self.endpoint}/moto-api/", timeout=1.0)
                return self
            except httpx.TransportError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("moto's S3 server did not start") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def bucket(self) -> str:
        """A new, empty bucket."""
        name = f"content-{secrets.token_hex(6)}"
        self.client().create_bucket(Bucket=name)
        self.buckets.append(name)
        return name

    def keys(self, bucket: str) -> list[str]:
        listed = self.client().list_objects_v2(Bucket=bucket)
        return sorted(item["Key"] for item in listed.get("Contents", []))

    def uploads(self, bucket: str) -> list[str]:
        """The multipart uploads begun and neither completed nor aborted."""
        listed = self.client().list_multipart_uploads(Bucket=bucket)
        return sorted(item["Key"] for item in listed.get("Uploads", []))


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    server = MotoS3(free_port()).start()
    yield server
    server.stop()
