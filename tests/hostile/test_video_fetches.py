"""The video worker's outbound fetches against hostile peers (issue 29, items 4 and 5), end
to end through REST: a client's image URL that trickles does not hold another workspace's
job and fails its own within the image deadline, free of charge; a provider's result that is
huge, or endless (a chunked body that never ends, a byte at a time), fails its job over
GATEWAY_VIDEO_MAX_BYTES or past the download deadline, with bounded memory, nothing partial
left in the content folder, no charge and no second fetch; an ordinary result streams into
the store and back out.

The providers here are HostilePeers answering every path with one JSON body that is at once
a fal-style queue's submission, status and result (`request_id`, `status`, `video.url`), its
result URL on the peer's own origin (the endpoint's origin is trusted, as a provider's own
host is) at `/huge/<n>` or `/trickle/<ms>`. The image host is a HostilePeer over HTTPS
(a test CA)."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from server.db.engine import create_engine, session_factory
from server.db.models import CreditHold
from testkit.admin import Admin, IssuedKey
from testkit.eventually import eventually
from testkit.processes import GatewayProcess, refusing_port
from tests.conftest import Databases
from tests.fakes.hostile_peer import HostilePeer
from tests.support.rss import RssSampler, settle_rss

MiB = 1024 * 1024
MAX_BYTES = 8 * MiB  # GATEWAY_VIDEO_MAX_BYTES of the gateway under test
DOWNLOAD_SECONDS = 3.0  # GATEWAY_VIDEO_DOWNLOAD_SECONDS
IMAGE_SECONDS = 2.0  # GATEWAY_VIDEO_IMAGE_FETCH_SECONDS
HUGE = 256 * MiB  # a result far past MAX_BYTES
NORMAL = 3 * MiB  # a result within it
KEY_ENV = "HOSTILE_VIDEO_KEY"

CAPABILITIES = """kind = "video"
price_per_second = "0.01"
resolutions = ["480p", "720p"]
aspect_ratios = ["16:9"]
durations = [1, 2]
frame_images = ["first_frame", "last_frame"]
"""


@dataclass
class Peers:
    huge: HostilePeer  # result: /huge/HUGE
    endless: HostilePeer  # result: /trickle/100, a chunked body that never ends
    normal: HostilePeer  # result: /huge/NORMAL
    images: HostilePeer  # HTTPS: a client's image host


@dataclass
class Gateway:
    process: GatewayProcess
    admin: Admin
    attacker: IssuedKey
    victim: IssuedKey

    @property
    def content_dir(self) -> Path:
        return self.process.data_dir / "content"


def _queue_body(peer: HostilePeer, result_path: str) -> bytes:
    return json.dumps(
        {"request_id": "r1", "status": "COMPLETED", "video": {"url": peer.url(result_path)}}
    ).encode()


@pytest.fixture(scope="module")
def peers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Peers]:
    folder = tmp_path_factory.mktemp("hostile-video-peers")
    # Bounded even if the gateway never stops reading: no more than this is ever sent.
    started = Peers(
        huge=HostilePeer(max_seconds=30, max_bytes=HUGE).start(),
        endless=HostilePeer(max_seconds=30).start(),
        normal=HostilePeer(max_seconds=30).start(),
        images=HostilePeer(
            tls_ca_file=folder / "ca.pem", max_seconds=20, body_content_type="image/png"
        ).start(),
    )
    started.huge.ok_body = _queue_body(started.huge, f"/huge/{HUGE}")
    started.endless.ok_body = _queue_body(started.endless, "/trickle/100")
    started.normal.ok_body = _queue_body(started.normal, f"/huge/{NORMAL}")
    yield started
    for peer in (started.huge, started.endless, started.normal, started.images):
        peer.stop()


def _catalog(peers: Peers) -> str:
    models = {
        "hostile/huge": ("queue", f"http://127.0.0.1:{peers.huge.port}/q"),
        "hostile/endless": ("queue", f"http://127.0.0.1:{peers.endless.port}/q"),
        "hostile/normal": ("queue", f"http://127.0.0.1:{peers.normal.port}/q"),
        # Never reached: the image is fetched (and fails) before anything is sent to Veo.
        "hostile/veo": ("gemini", f"http://127.0.0.1:{refusing_port()}/v1beta"),
    }
    text = ""
    for model_id, (adapter, base) in models.items():
        text += f'[[models]]\nid = "{model_id}"\n{CAPABILITIES}[[models.endpoints]]\n'
        text += f'provider = "hostile"\nadapter = "{adapter}"\nbase_url = "{base}"\n'
        text += f'api_key_env = "{KEY_ENV}"\nmodel = "m"\n\n'
    return text


@pytest_asyncio.fixture(scope="module")
async def gateway(
    peers: Peers, databases: Databases, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Gateway]:
    folder = tmp_path_factory.mktemp("hostile-video")
    catalog = folder / "catalog.toml"
    catalog.write_text(_catalog(peers))
    assert peers.images.tls_ca_file is not None
    url = await databases.new("sqlite")
    process = GatewayProcess(
        data_dir=folder / "gw",
        database_url=url,
        extra_env={
            "GATEWAY_CATALOG": str(catalog),
            KEY_ENV: "hostile-key",
            # The image host is on loopback with a certificate of a test CA.
            "GATEWAY_WEBHOOK_CA_BUNDLE": str(peers.images.tls_ca_file),
            "GATEWAY_PROVIDER_DOWNLOADS_ALLOW_PRIVATE": "1",
            "GATEWAY_VIDEO_MAX_BYTES": str(MAX_BYTES),
            "GATEWAY_VIDEO_DOWNLOAD_SECONDS": str(DOWNLOAD_SECONDS),
            "GATEWAY_VIDEO_IMAGE_FETCH_SECONDS": str(IMAGE_SECONDS),
        },
    )
    await asyncio.to_thread(process.start)
    engine = create_engine(url)
    try:
        admin = Admin(session_factory(engine))
        keys = []
        for name in ("hostile-attacker", "hostile-victim"):
            workspace = await admin.workspace(name)
            await admin.credits(workspace, "10")
            keys.append(await admin.key(workspace))
        yield Gateway(process, admin, keys[0], keys[1])
    finally:
        await engine.dispose()
        await asyncio.to_thread(process.stop)


async def _submit(
    client: httpx.AsyncClient, gateway: Gateway, issued: IssuedKey, body: dict[str, Any]
) -> str:
    created = await client.post(
        f"{gateway.process.base_url}/videos", json=body, headers=issued.headers
    )
    assert created.status_code == 202, created.text
    return str(created.json()["id"])


async def _finished(
    client: httpx.AsyncClient, gateway: Gateway, issued: IssuedKey, job_id: str, within: float
) -> dict[str, Any]:
    async def ended() -> dict[str, Any] | None:
        answer = await client.get(
            f"{gateway.process.base_url}/videos/{job_id}", headers=issued.headers
        )
        job: dict[str, Any] = answer.json()
        return job if job["status"] in ("completed", "failed") else None

    found: dict[str, Any] = await eventually(
        ended, within=within, interval=0.1, message=f"job {job_id} to end"
    )
    return found


async def _not_charged(client: httpx.AsyncClient, gateway: Gateway, issued: IssuedKey) -> None:
    await gateway.admin.no_hold_left(CreditHold.account_id == issued.workspace.account_id)
    key = await client.get(f"{gateway.process.base_url}/key", headers=issued.headers)
    assert key.json()["data"]["usage"] == 0, key.text


def _files_of(gateway: Gateway, job_id: str) -> list[str]:
    """Everything under the job's content folder and any temporary file at the top."""
    root = gateway.content_dir
    if not root.exists():
        return []
    return sorted(
        str(path.relative_to(root))
        for path in root.rglob("*")
        if job_id in str(path) or path.name.startswith(".")
    )


def _server_pid(gateway: Gateway) -> int:
    """The process that runs the video worker: `gateway up` itself (one server process runs
    inside it; Envoy is its child)."""
    assert gateway.process.process is not None
    return gateway.process.process.pid


async def test_a_trickling_image_url_does_not_hold_another_workspaces_job(
    gateway: Gateway, peers: Peers
) -> None:
    """Issue 29 item 4: the attacker's first frame trickles one byte every 500 ms; the
    victim's local/renderer job, submitted while the worker fetches that image, completes
    as fast as it would alone, and the attacker's job fails within the image deadline,
    free of charge."""
    image = peers.images.url("/trickle/500")
    async with httpx.AsyncClient(timeout=30) as client:
        attacker_job = await _submit(
            client,
            gateway,
            gateway.attacker,
            {
                "model": "hostile/veo",
                "prompt": "p",
                "duration": 1,
                "frame_images": [
                    {"type": "image_url", "image_url": {"url": image}, "frame_type": "first_frame"}
                ],
            },
        )
        started = time.monotonic()

        async def fetching() -> bool:
            return bool(peers.images.requests_to("/trickle/"))

        await eventually(fetching, within=10, message="the worker fetching the image")
        submitted = time.monotonic()
        victim_job = await _submit(
            client,
            gateway,
            gateway.victim,
            {"model": "local/renderer", "prompt": "v", "duration": 1, "resolution": "480p"},
        )
        victim = await _finished(client, gateway, gateway.victim, victim_job, within=30)
        victim_seconds = time.monotonic() - submitted
        attacker = await _finished(client, gateway, gateway.attacker, attacker_job, within=30)
        attacker_seconds = time.monotonic() - started
        assert victim["status"] == "completed", victim
        # A 1 s 480p render takes about a second; the trickle lasts 20 s (the peer's bound):
        # it must not show in the victim's time (margin for a loaded machine).
        assert victim_seconds < 6, victim_seconds
        assert attacker["status"] == "failed", attacker
        assert "image" in attacker["error"].lower(), attacker
        assert attacker_seconds < IMAGE_SECONDS + 6, attacker_seconds
        await _not_charged(client, gateway, gateway.attacker)


async def test_a_huge_result_fails_the_job_with_bounded_memory_and_nothing_left(
    gateway: Gateway, peers: Peers
) -> None:
    """Issue 29 item 5: a 256 MiB result past an 8 MiB GATEWAY_VIDEO_MAX_BYTES fails the job
    as soon as the bound is passed: the server's memory grows by far less than the result,
    no file of the job (nor a temporary one) is left, the hold is released, and the peer
    sent little more than the bound."""
    pid = _server_pid(gateway)
    before = settle_rss(pid, within=3)
    async with httpx.AsyncClient(timeout=30) as client:
        with RssSampler(pid) as sampler:
            job_id = await _submit(
                client,
                gateway,
                gateway.attacker,
                {"model": "hostile/huge", "prompt": "p", "duration": 1},
            )
            job = await _finished(client, gateway, gateway.attacker, job_id, within=30)
        assert job["status"] == "failed", job
        assert "larger than" in job["error"], job
        grown = sampler.peak - before
        assert grown < 64 * MiB, f"RSS grew by {grown // MiB} MiB for a {HUGE // MiB} MiB result"
        assert _files_of(gateway, job_id) == []
        assert peers.huge.bytes_sent < HUGE // 2, peers.huge.bytes_sent
        await _not_charged(client, gateway, gateway.attacker)
        assert len(peers.huge.requests_to("/huge/")) == 1


async def test_an_endless_result_fails_within_the_deadline_and_is_not_fetched_again(
    gateway: Gateway, peers: Peers
) -> None:
    """Issue 29 item 5: an endless result body fails the job once the download deadline
    passes (it is not fetched again every poll for the job's 2 h), nothing is left, and the
    hold is released."""
    async with httpx.AsyncClient(timeout=30) as client:
        job_id = await _submit(
            client,
            gateway,
            gateway.attacker,
            {"model": "hostile/endless", "prompt": "p", "duration": 1},
        )

        async def downloading() -> bool:
            return bool(peers.endless.requests_to("/trickle/"))

        await eventually(downloading, within=10, message="the result download to start")
        started = time.monotonic()
        job = await _finished(client, gateway, gateway.attacker, job_id, within=20)
        took = time.monotonic() - started
        assert job["status"] == "failed", job
        assert "did not download within" in job["error"], job
        assert took < DOWNLOAD_SECONDS + 3, took
        await _not_charged(client, gateway, gateway.attacker)
        assert _files_of(gateway, job_id) == []
        await asyncio.sleep(DOWNLOAD_SECONDS)  # the next polls (1 s, 2 s, ...) would be due
        assert len(peers.endless.requests_to("/trickle/")) == 1


async def test_a_normal_result_streams_into_the_store_and_back_out(
    gateway: Gateway, peers: Peers
) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        job_id = await _submit(
            client,
            gateway,
            gateway.victim,
            {"model": "hostile/normal", "prompt": "p", "duration": 1},
        )
        job = await _finished(client, gateway, gateway.victim, job_id, within=30)
        assert job["status"] == "completed", job
        content = await client.get(
            f"{gateway.process.base_url}/videos/{job_id}/content", headers=gateway.victim.headers
        )
    assert content.status_code == 200
    assert content.headers["content-type"] == "video/mp4"
    assert len(content.content) == NORMAL and content.content == b"\0" * NORMAL
    stored = gateway.content_dir / job_id / "0.mp4"
    assert stat.S_IMODE(os.stat(stored).st_mode) == 0o600
    assert _files_of(gateway, job_id) == [job_id, f"{job_id}/0.mp4"]
