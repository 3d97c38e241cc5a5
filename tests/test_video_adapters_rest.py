"""End to end through REST, one case per adapter: POST /api/v1/videos on a model served by
the gemini, vertex, kling or minimax adapter (fakes of the providers on loopback) →
completed → GET /videos/{id}/content returns the provider's MP4, stored by the gateway."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import pytest_asyncio

from server.db.engine import create_engine, session_factory
from testkit.admin import Admin, IssuedKey
from testkit.eventually import eventually
from testkit.processes import GatewayProcess
from tests.conftest import Databases
from tests.fakes import gemini_video, kling_video, minimax_video
from tests.fakes.gemini_video import FakeGemini
from tests.fakes.kling_video import FakeKling
from tests.fakes.minimax_video import FakeMiniMax
from tests.fakes.vertex_video import FakeVertex
from tests.fakes.video_loopback import VIDEO

CAPABILITIES = """kind = "video"
price_per_second = "0.01"
resolutions = ["720p", "768p", "1080p"]
aspect_ratios = ["16:9", "9:16"]
durations = [5, 6, 8]
frame_images = ["first_frame", "last_frame"]
"""


@dataclass
class Fakes:
    gemini: FakeGemini
    vertex: FakeVertex
    kling: FakeKling
    minimax: FakeMiniMax


@dataclass
class Gateway:
    process: GatewayProcess
    issued: IssuedKey


def _catalog(fakes: Fakes) -> str:
    endpoints = {
        "e2e-google/veo": (
            "google-ai-studio",
            "gemini",
            fakes.gemini.base_url,
            "E2E_GEMINI_API_KEY",
            None,
            "veo-3.1-generate-preview",
        ),
        "e2e-vertex/veo": (
            "google-vertex",
            "vertex",
            fakes.vertex.base_url,
            "E2E_GOOGLE_CREDENTIALS",
            None,
            "veo-3.1-generate-001",
        ),
        "e2e-kling/kling": (
            "kling",
            "kling",
            fakes.kling.base_url,
            "E2E_KLING_ACCESS_KEY",
            "E2E_KLING_SECRET_KEY",
            "kling-v2-1-master",
        ),
        "e2e-minimax/hailuo": (
            "minimax",
            "minimax",
            fakes.minimax.base_url,
            "E2E_MINIMAX_API_KEY",
            None,
            "MiniMax-Hailuo-02",
        ),
    }
    text = ""
    for model_id, (provider, adapter, base, key_env, secret_env, upstream) in endpoints.items():
        text += f'[[models]]\nid = "{model_id}"\n{CAPABILITIES}[[models.endpoints]]\n'
        text += f'provider = "{provider}"\nadapter = "{adapter}"\nbase_url = "{base}"\n'
        text += f'api_key_env = "{key_env}"\nmodel = "{upstream}"\n'
        if secret_env:
            text += f'secret_key_env = "{secret_env}"\n'
        text += "\n"
    return text


@pytest.fixture(scope="module")
def fakes() -> Iterator[Fakes]:
    started = Fakes(FakeGemini(), FakeVertex(), FakeKling(), FakeMiniMax())
    servers = [started.gemini, started.vertex, started.kling, started.minimax]
    for server in servers:
        server.start()
    yield started
    for server in servers:
        server.stop()


@pytest_asyncio.fixture(scope="module")
async def gateway(
    fakes: Fakes, databases: Databases, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Gateway]:
    folder = tmp_path_factory.mktemp("video-adapters")
    catalog = folder / "catalog.toml"
    catalog.write_text(_catalog(fakes))
    credentials = fakes.vertex.write_service_account(folder / "service-account.json")
    url = await databases.new("sqlite")
    process = GatewayProcess(
        data_dir=folder / "gw",
        database_url=url,
        extra_env={
            "GATEWAY_CATALOG": str(catalog),
            "E2E_GEMINI_API_KEY": gemini_video.API_KEY,
            "E2E_GOOGLE_CREDENTIALS": str(credentials),
            "E2E_KLING_ACCESS_KEY": kling_video.ACCESS_KEY,
            "E2E_KLING_SECRET_KEY": kling_video.SECRET_KEY,
            "E2E_MINIMAX_API_KEY": minimax_video.API_KEY,
        },
    )
    await asyncio.to_thread(process.start)
    engine = create_engine(url)
    try:
        admin = Admin(session_factory(engine))
        workspace = await admin.workspace("video-adapters")
        await admin.credits(workspace, "10")
        yield Gateway(process, await admin.key(workspace))
    finally:
        await engine.dispose()
        await asyncio.to_thread(process.stop)


@pytest.mark.parametrize(
    ("model", "request_fields", "cost"),
    [
        ("e2e-google/veo", {"duration": 8, "resolution": "1080p"}, 0.08),
        ("e2e-vertex/veo", {"duration": 8, "seed": 11}, 0.08),
        # Kling reports 5.04 s for 5 asked: billed 5 (a provider cannot bill past the request)
        ("e2e-kling/kling", {"duration": 5, "aspect_ratio": "9:16"}, 0.05),
        ("e2e-minimax/hailuo", {"duration": 6, "resolution": "768p"}, 0.06),
    ],
)
async def test_a_video_job_completes_and_serves_the_providers_mp4(
    gateway: Gateway, fakes: Fakes, model: str, request_fields: dict[str, Any], cost: float
) -> None:
    base = gateway.process.base_url
    headers = gateway.issued.headers
    body = {"model": model, "prompt": f"a paper boat for {model}, at once", **request_fields}
    async with httpx.AsyncClient(timeout=30) as client:
        created = await client.post(f"{base}/videos", json=body, headers=headers)
        assert created.status_code == 202, created.text
        job_id = created.json()["id"]

        async def finished() -> dict[str, Any] | None:
            job = (await client.get(f"{base}/videos/{job_id}", headers=headers)).json()
            return job if job["status"] in ("completed", "failed") else None  # type: ignore[no-any-return]

        job = await eventually(finished, within=30, interval=0.1, message=f"{model} job")
        assert job["status"] == "completed", job
        assert job["usage"] == {"cost": cost, "is_byok": False}
        # The gateway serves the video it stored, not the provider's URL.
        assert job["unsigned_urls"] == [f"/api/v1/videos/{job_id}/content?index=0"]
        content = await client.get(f"{base}/videos/{job_id}/content", headers=headers)
    assert content.status_code == 200
    assert content.content == VIDEO
