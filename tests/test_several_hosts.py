"""Gateways on several hosts (issue 30): two `gateway up` with their own data dirs (what two
hosts look like) on one PostgreSQL database and one S3 endpoint on loopback (moto's server,
tests/support/moto.py: the gateways only see GATEWAY_CONTENT_URL and the AWS_* variables),
with the same vault master key.

- A video made through A is polled, listed and downloaded (whole and by Range) through B;
  its webhook is delivered once; its expiry deletes its object, whichever host expires it.
- `kill -9` of A while its worker holds a job: B finishes the job after A's lease lapses, it
  is charged once and its content is in the store.
- A 300 MiB provider answer streams into the store and back out through GET /content while
  neither server process's RSS grows by 50 MiB.

The provider is a HostilePeer answering every path with one fal-style queue body (submission,
status and result at once) whose result URL is on its own origin."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import sqlalchemy as sa

from server.db.engine import create_engine, session_factory
from server.db.models import CreditHold, LedgerEntry, VideoJob, WebhookDelivery
from server.vault.crypto import MasterKey
from testkit.admin import Admin, IssuedKey
from testkit.eventually import eventually
from testkit.fakes.webhook_receiver import WebhookReceiver
from testkit.processes import GatewayProcess
from tests.conftest import Databases
from tests.fakes.hostile_peer import HostilePeer
from tests.support.moto import MotoS3
from tests.support.rss import RssSampler, settle_rss

MiB = 1024 * 1024
HUGE = 300 * MiB  # the provider answer streamed through the store
SMALL = 3 * MiB
PREFIX = "videos"
KEY_ENV = "SEVERAL_HOSTS_VIDEO_KEY"
LEASE_SECONDS = 2  # GATEWAY_JOB_LEASE_SECONDS: how soon a dead host's job is taken over

CAPABILITIES = """kind = "video"
price_per_second = "0.01"
resolutions = ["480p", "720p"]
aspect_ratios = ["16:9"]
durations = [1, 2]
"""


def _queue_body(peer: HostilePeer, result_path: str) -> bytes:
    return json.dumps(
        {"request_id": "r1", "status": "COMPLETED", "video": {"url": peer.url(result_path)}}
    ).encode()


@dataclass
class Host:
    name: str
    process: GatewayProcess

    @property
    def base_url(self) -> str:
        return self.process.base_url

    @property
    def pid(self) -> int:
        """`gateway up` itself runs the server process (Envoy is its child)."""
        assert self.process.process is not None
        return self.process.process.pid


@dataclass
class Hosts:
    a: Host
    b: Host | None
    admin: Admin
    issued: IssuedKey
    moto: MotoS3
    bucket: str
    folder: Path
    env: dict[str, str]
    database_url: str

    def start_b(self) -> Host:
        process = GatewayProcess(
            data_dir=self.folder / "b", database_url=self.database_url, extra_env=self.env
        )
        process.start()
        self.b = Host("B", process)
        return self.b

    def objects(self) -> list[str]:
        return self.moto.keys(self.bucket)

    async def charges(self) -> list[int]:
        async with self.admin.sessions() as session:
            rows = await session.exec(
                sa.select(LedgerEntry.amount_micros).where(
                    LedgerEntry.key_hash == self.issued.hash, LedgerEntry.kind == "charge"
                )
            )
            return [row[0] for row in rows.all()]


def _catalog(peer: HostilePeer) -> str:
    return (
        f'[[models]]\nid = "hosts/queue"\n{CAPABILITIES}[[models.endpoints]]\n'
        f'provider = "hosts"\nadapter = "queue"\nbase_url = "http://127.0.0.1:{peer.port}/q"\n'
        f'api_key_env = "{KEY_ENV}"\nmodel = "m"\n'
    )


@asynccontextmanager
async def several_hosts(
    databases: Databases,
    moto: MotoS3,
    receiver: WebhookReceiver,
    peer: HostilePeer,
    folder: Path,
    *,
    start_b: bool = True,
) -> AsyncIterator[Hosts]:
    """Gateways A (and B) on one fresh PostgreSQL database and one new bucket."""
    url = await databases.new("postgres")
    bucket = moto.bucket()
    catalog = folder / "catalog.toml"
    catalog.write_text(_catalog(peer))
    env = {
        "GATEWAY_CATALOG": str(catalog),
        KEY_ENV: "hosts-key",
        "GATEWAY_PROVIDER_DOWNLOADS_ALLOW_PRIVATE": "1",
        "GATEWAY_WEBHOOK_CA_BUNDLE": str(receiver.ca_file),
        "GATEWAY_WEBHOOK_ALLOW_PRIVATE": "1",
        "GATEWAY_JOB_LEASE_SECONDS": str(LEASE_SECONDS),
        "GATEWAY_MAINTENANCE_INTERVAL_SECONDS": "0.5",
        # What every host shares: the database (above), the master key, the content URL.
        "GATEWAY_VAULT_MASTER_KEY": MasterKey.generate_base64(),
        "GATEWAY_CONTENT_URL": f"s3://{bucket}/{PREFIX}",
        **moto.env,
    }
    a = GatewayProcess(data_dir=folder / "a", database_url=url, extra_env=env)
    engine = create_engine(url)
    hosts: Hosts | None = None
    try:
        await asyncio.to_thread(a.start)
        admin = Admin(session_factory(engine))
        workspace = await admin.workspace("hosts")
        await admin.credits(workspace, "10")
        issued = await admin.key(workspace)
        hosts = Hosts(Host("A", a), None, admin, issued, moto, bucket, folder, env, url)
        if start_b:
            await asyncio.to_thread(hosts.start_b)
        yield hosts
    finally:
        await engine.dispose()
        await asyncio.to_thread(a.stop)
        if hosts is not None and hosts.b is not None:
            await asyncio.to_thread(hosts.b.process.stop)


@pytest.fixture(scope="module")
def peer() -> Iterator[HostilePeer]:
    # Bounded even if a gateway never stops reading: no more than this is ever sent.
    started = HostilePeer(max_seconds=60, max_bytes=HUGE).start()
    started.ok_body = _queue_body(started, f"/huge/{SMALL}")
    yield started
    started.stop()


@pytest_asyncio.fixture(scope="module")
async def hosts(
    databases: Databases,
    moto_s3: MotoS3,
    webhook_receiver: WebhookReceiver,
    peer: HostilePeer,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Hosts]:
    folder = tmp_path_factory.mktemp("several-hosts")
    async with several_hosts(databases, moto_s3, webhook_receiver, peer, folder) as started:
        yield started


async def _submit(
    client: httpx.AsyncClient, host: Host, issued: IssuedKey, body: dict[str, Any]
) -> str:
    created = await client.post(f"{host.base_url}/videos", json=body, headers=issued.headers)
    assert created.status_code == 202, created.text
    return str(created.json()["id"])


async def _ended(
    client: httpx.AsyncClient,
    host: Host,
    issued: IssuedKey,
    job_id: str,
    within: float,
    statuses: tuple[str, ...] = ("completed", "failed"),
) -> dict[str, Any]:
    async def ended() -> dict[str, Any] | None:
        job: dict[str, Any] = (
            await client.get(f"{host.base_url}/videos/{job_id}", headers=issued.headers)
        ).json()
        return job if job["status"] in statuses else None

    found: dict[str, Any] = await eventually(
        ended, within=within, interval=0.1, message=f"job {job_id} to end through {host.name}"
    )
    return found


async def test_a_video_made_through_a_is_polled_listed_and_downloaded_through_b(
    hosts: Hosts, webhook_receiver: WebhookReceiver
) -> None:
    a, b, issued = hosts.a, hosts.b, hosts.issued
    assert b is not None
    hook_path = f"/ok/several-hosts-{os.urandom(4).hex()}"
    async with httpx.AsyncClient(timeout=30) as client:
        job_id = await _submit(
            client,
            a,
            issued,
            {
                "model": "local/renderer",
                "prompt": "two hosts",
                "duration": 1,
                "callback_url": webhook_receiver.url(hook_path),
            },
        )
        job = await _ended(client, b, issued, job_id, within=30)
        assert job["status"] == "completed", job
        listed = await client.get(f"{b.base_url}/videos", headers=issued.headers)
        assert listed.status_code == 200, listed.text
        assert job_id in [item["id"] for item in listed.json()["data"]]

        url = f"/videos/{job_id}/content"
        whole_b = await client.get(f"{b.base_url}{url}", headers=issued.headers)
        whole_a = await client.get(f"{a.base_url}{url}", headers=issued.headers)
        assert (whole_b.status_code, whole_a.status_code) == (200, 200), whole_b.text
        video = whole_b.content
        assert video == whole_a.content and video[4:8] == b"ftyp"
        assert whole_b.headers["accept-ranges"] == "bytes"
        assert hosts.objects() == [f"{PREFIX}/{job_id}/0.mp4"]

        ranged = await client.get(
            f"{b.base_url}{url}", headers={**issued.headers, "Range": "bytes=100-1123"}
        )
        assert ranged.status_code == 206
        assert ranged.headers["content-range"] == f"bytes 100-1123/{len(video)}"
        assert ranged.content == video[100:1124]
        tail = await client.get(
            f"{b.base_url}{url}", headers={**issued.headers, "Range": "bytes=-16"}
        )
        assert tail.status_code == 206 and tail.content == video[-16:]

        # Its webhook: delivered once, by whichever host's dispatcher took it.
        async def delivered() -> bool:
            rows = await hosts.admin.count(
                WebhookDelivery,
                WebhookDelivery.job_id == job_id,
                WebhookDelivery.status == "delivered",
            )
            return rows == 1

        await eventually(delivered, within=20, message="the webhook delivered")
        assert await hosts.admin.count(WebhookDelivery, WebhookDelivery.job_id == job_id) == 1
        assert len(webhook_receiver.hooks(hook_path)) == 1
        assert await hosts.charges() == [1_000]  # 1 s x 0.001, once

        # Expiry deletes the object, whichever host's housekeeping expires the job.
        async with hosts.admin.sessions() as session:
            await session.exec(
                sa.update(VideoJob)
                .where(VideoJob.id == job_id)
                .values(expires_at=datetime.now(UTC) - timedelta(seconds=1))
            )
            await session.commit()
        expired = await _ended(client, a, issued, job_id, within=20, statuses=("expired",))
        assert expired["status"] == "expired"
        await eventually(lambda: hosts.objects() == [], within=10, message="the object deleted")
        gone = await client.get(f"{b.base_url}{url}", headers=issued.headers)
        assert gone.status_code == 410


async def test_a_300_mib_answer_streams_into_the_store_and_out_with_bounded_memory(
    hosts: Hosts, peer: HostilePeer
) -> None:
    a, b, issued = hosts.a, hosts.b, hosts.issued
    assert b is not None
    peer.ok_body = _queue_body(peer, f"/huge/{HUGE}")
    before = {host.name: settle_rss(host.pid, within=3) for host in (a, b)}
    try:
        async with httpx.AsyncClient(timeout=60) as client:
            with RssSampler(a.pid) as on_a, RssSampler(b.pid) as on_b:
                job_id = await _submit(
                    client, a, issued, {"model": "hosts/queue", "prompt": "big", "duration": 1}
                )
                job = await _ended(client, b, issued, job_id, within=120)
                assert job["status"] == "completed", job
                received = 0
                async with client.stream(
                    "GET", f"{b.base_url}/videos/{job_id}/content", headers=issued.headers
                ) as content:
                    assert content.status_code == 200
                    async for piece in content.aiter_bytes():
                        received += len(piece)
            assert received == HUGE
    finally:
        peer.ok_body = _queue_body(peer, f"/huge/{SMALL}")
    assert hosts.moto.uploads(hosts.bucket) == []
    for host, sampler in ((a, on_a), (b, on_b)):
        grown = sampler.peak - before[host.name]
        assert grown < 50 * MiB, f"{host.name}'s RSS grew by {grown // MiB} MiB for 300 MiB"


async def test_a_killed_host_leaves_its_job_to_the_other_charged_once(
    databases: Databases,
    moto_s3: MotoS3,
    webhook_receiver: WebhookReceiver,
    tmp_path: Path,
) -> None:
    """A's worker holds the job (downloading a result that trickles) when A is killed; B,
    running meanwhile, takes the job over once A's lease lapses, fetches the result again
    (now a normal one) into the store, and the job is charged once."""
    slow = HostilePeer(max_seconds=60, max_bytes=64 * MiB).start()
    slow.ok_body = _queue_body(slow, "/trickle-length/50")
    try:
        async with several_hosts(
            databases, moto_s3, webhook_receiver, slow, tmp_path, start_b=False
        ) as hosts:
            async with httpx.AsyncClient(timeout=30) as client:
                job_id = await _submit(
                    client,
                    hosts.a,
                    hosts.issued,
                    {"model": "hosts/queue", "prompt": "killed", "duration": 1},
                )
                # Only A runs: its worker holds the job while the download trickles.
                await eventually(
                    lambda: slow.requests_to("/trickle-length/"),
                    within=20,
                    message="A's worker downloading",
                )
                b = await asyncio.to_thread(hosts.start_b)
                slow.ok_body = _queue_body(slow, f"/huge/{SMALL}")
                assert hosts.a.process.process is not None
                hosts.a.process.process.kill()  # kill -9: no cleanup at all
                hosts.a.process.process.wait(10)
                async with hosts.admin.sessions() as session:
                    held = await session.get(VideoJob, job_id, populate_existing=True)
                assert held is not None and held.status == "in_progress"

                job = await _ended(client, b, hosts.issued, job_id, within=40)
                assert job["status"] == "completed", job
                content = await client.get(
                    f"{b.base_url}/videos/{job_id}/content", headers=hosts.issued.headers
                )
            assert content.status_code == 200 and content.content == b"\0" * SMALL
            assert await hosts.charges() == [10_000]  # 1 s x 0.01, once
            await hosts.admin.no_hold_left(
                CreditHold.account_id == hosts.issued.workspace.account_id
            )
            assert hosts.objects() == [f"{PREFIX}/{job_id}/0.mp4"]
            assert moto_s3.uploads(hosts.bucket) == []
    finally:
        slow.stop()


async def test_a_missing_bucket_stops_startup_with_one_line(
    moto_s3: MotoS3, databases: Databases, tmp_path: Path
) -> None:
    url = await databases.new("sqlite")
    gateway = GatewayProcess(
        data_dir=tmp_path / "gw",
        database_url=url,
        extra_env={**moto_s3.env, "GATEWAY_CONTENT_URL": "s3://no-such-bucket-anywhere/videos"},
    )
    with pytest.raises(RuntimeError):
        await asyncio.to_thread(gateway.start, 30.0)
    assert gateway.process is not None and gateway.process.returncode not in (None, 0)
    lines = [line for line in gateway.output if "GATEWAY_CONTENT_URL" in line]
    assert [line.strip() for line in lines] == [
        "gateway: error: GATEWAY_CONTENT_URL s3://no-such-bucket-anywhere/videos: "
        "the bucket does not exist"
    ], gateway.log()
    assert moto_s3.env["AWS_SECRET_ACCESS_KEY"] not in gateway.log()
