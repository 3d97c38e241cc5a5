"""POST /api/v1/videos through Envoy to each vendor video adapter (seedance, dashscope, fal,
replicate): one gateway (SQLite) whose catalog routes a model to each provider's fake on
loopback (tests/fakes/), one case per adapter: the job completes and GET
/videos/{id}/content serves the fake's MP4. What each adapter sends, its failure mapping and
fallback across adapters are tested in-process (tests/unit/test_video_adapters.py,
tests/unit/test_video_fallback.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from server.db.engine import create_engine, session_factory
from testkit.admin import Admin, IssuedKey
from testkit.eventually import eventually
from testkit.fakes.video_providers import VIDEO
from testkit.processes import GatewayProcess
from tests.conftest import Databases
from tests.fakes import dashscope, fal, replicate, seedance
from tests.fakes.loopback import LoopbackServer


@dataclass
class Fakes:
    seedance: seedance.FakeSeedance
    dashscope: dashscope.FakeDashScope
    fal: fal.FakeFal
    replicate: replicate.FakeReplicate
    servers: dict[str, LoopbackServer]


@pytest.fixture(scope="module")
def fakes() -> Iterator[Fakes]:
    made = Fakes(
        seedance.FakeSeedance(),
        dashscope.FakeDashScope(),
        fal.FakeFal(),
        replicate.FakeReplicate(),
        {},
    )
    for name in ("seedance", "dashscope", "fal", "replicate"):
        made.servers[name] = LoopbackServer(getattr(made, name).handle).start()
    yield made
    for server in made.servers.values():
        server.stop()


def vendor_catalog(path: Path, fakes: Fakes) -> Path:
    """One model per adapter, configured as an operator would (the adapters' docstrings),
    with the base URLs pointing at the fakes."""

    def model(adapter: str, base_path: str, key_env: str, upstream: str) -> str:
        return f"""
[[models]]
id = "{adapter}/test-video"
kind = "video"
price_per_second = "0.01"
resolutions = ["720p"]
aspect_ratios = ["16:9"]
durations = [5]
[[models.endpoints]]
provider = "{adapter}"
adapter = "{adapter}"
base_url = "{fakes.servers[adapter].base_url}{base_path}"
api_key_env = "{key_env}"
model = "{upstream}"
"""

    path.write_text(
        model("seedance", "/api/v3", "ARK_API_KEY", "ok")
        + model("dashscope", "/api/v1", "DASHSCOPE_API_KEY", "ok")
        + model("fal", "", "FAL_KEY", "fal-ai/test-video/v2/ok")
        + model("replicate", "/v1", "REPLICATE_API_TOKEN", "owner/ok")
    )
    return path


@dataclass
class VendorGateway:
    gateway: GatewayProcess
    issued: IssuedKey


@pytest_asyncio.fixture(scope="module")
async def vendor_gateway(
    databases: Databases, tmp_path_factory: pytest.TempPathFactory, fakes: Fakes
) -> AsyncIterator[VendorGateway]:
    folder = tmp_path_factory.mktemp("video-vendors")
    url = await databases.new("sqlite")
    gateway = GatewayProcess(
        data_dir=folder / "gw",
        database_url=url,
        extra_env={
            "GATEWAY_CATALOG": str(vendor_catalog(folder / "catalog.toml", fakes)),
            "ARK_API_KEY": seedance.API_KEY,
            "DASHSCOPE_API_KEY": dashscope.API_KEY,
            "FAL_KEY": fal.API_KEY,
            "REPLICATE_API_TOKEN": replicate.API_KEY,
        },
    )
    await asyncio.to_thread(gateway.start)
    engine = create_engine(url)
    try:
        admin = Admin(session_factory(engine))
        workspace = await admin.workspace("video-vendors")
        await admin.credits(workspace, "10")
        yield VendorGateway(gateway, await admin.key(workspace))
    finally:
        await engine.dispose()
        await asyncio.to_thread(gateway.stop)


# model, what the job costs: 0.01 USD/s for the seconds the provider reports (Seedance 4 s,
# DashScope 5 s) or else the 5 s requested
CASES = [
    ("seedance/test-video", 0.04),
    ("dashscope/test-video", 0.05),
    ("fal/test-video", 0.05),
    ("replicate/test-video", 0.05),
]


@pytest.mark.parametrize(("model", "cost"), CASES)
async def test_a_video_job_through_each_vendor_adapter(
    vendor_gateway: VendorGateway, model: str, cost: float
) -> None:
    base, headers = vendor_gateway.gateway.base_url, vendor_gateway.issued.headers
    async with httpx.AsyncClient(timeout=30) as client:
        submitted = await client.post(
            f"{base}/videos",
            headers=headers,
            json={"model": model, "prompt": "a lighthouse at dusk", "duration": 5},
        )
        assert submitted.status_code == 202, submitted.text
        job_id = submitted.json()["id"]

        async def finished() -> dict[str, Any] | None:
            job: dict[str, Any] = (
                await client.get(f"{base}/videos/{job_id}", headers=headers)
            ).json()
            return job if job["status"] in ("completed", "failed") else None

        job = await eventually(finished, within=30, interval=0.1, message=f"{model} finished")
        assert job["status"] == "completed", job
        assert job["usage"] == {"cost": pytest.approx(cost), "is_byok": False}
        assert job["unsigned_urls"] == [f"/api/v1/videos/{job_id}/content?index=0"]
        content = await client.get(f"{base}/videos/{job_id}/content", headers=headers)
    assert content.status_code == 200
    assert content.headers["content-type"].startswith("video/mp4")
    assert content.content == VIDEO
