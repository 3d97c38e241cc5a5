"""POST /api/v1/audio/transcriptions through Envoy to each vendor speech-to-text adapter
(deepgram, elevenlabs, assemblyai, azure-openai): one gateway (SQLite) whose catalog routes a
model to each provider's fake on loopback (tests/fakes/), one verbose_json case per adapter.
What each adapter sends and how it maps answers and failures is tested in-process in
tests/unit/test_stt_adapters.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from server.db.engine import create_engine, session_factory
from testkit.admin import Admin, IssuedKey
from testkit.audio import fixture
from testkit.processes import GatewayProcess
from tests.conftest import Databases
from tests.fakes import assemblyai, azure_openai, deepgram, elevenlabs
from tests.fakes.loopback import LoopbackServer

HELLO_SECONDS = 1.075125  # testkit/fixtures/hello.wav as the gateway measures it


@dataclass
class Fakes:
    deepgram: deepgram.FakeDeepgram
    elevenlabs: elevenlabs.FakeElevenLabs
    assemblyai: assemblyai.FakeAssemblyAI
    azure: azure_openai.FakeAzureOpenAI
    servers: dict[str, LoopbackServer]


@pytest.fixture(scope="module")
def fakes() -> Iterator[Fakes]:
    made = Fakes(
        deepgram.FakeDeepgram(),
        elevenlabs.FakeElevenLabs(),
        assemblyai.FakeAssemblyAI(),
        azure_openai.FakeAzureOpenAI(),
        {},
    )
    for name, fake in (
        ("deepgram", made.deepgram),
        ("elevenlabs", made.elevenlabs),
        ("assemblyai", made.assemblyai),
        ("azure-openai", made.azure),
    ):
        made.servers[name] = LoopbackServer(fake.handle).start()
    yield made
    for server in made.servers.values():
        server.stop()


def vendor_catalog(path: Path, fakes: Fakes) -> Path:
    """One model per adapter, configured as an operator would (the adapters' docstrings),
    with the base URLs pointing at the fakes."""

    def model(model_id: str, adapter: str, key_env: str, upstream: str, extra: str = "") -> str:
        return f"""
[[models]]
id = "{model_id}"
kind = "stt"
price_per_second = "0.001"
verbose_json = true
[[models.endpoints]]
provider = "{adapter}"
adapter = "{adapter}"
base_url = "{fakes.servers[adapter].base_url}"
api_key_env = "{key_env}"
model = "{upstream}"
{extra}
"""

    path.write_text(
        model("deepgram/nova-3", "deepgram", "DEEPGRAM_API_KEY", "nova-3")
        + model("elevenlabs/scribe-v2", "elevenlabs", "ELEVENLABS_API_KEY", "scribe_v2")
        + model("assemblyai/universal", "assemblyai", "ASSEMBLYAI_API_KEY", "universal-2")
        + model(
            "azure/whisper",
            "azure-openai",
            "AZURE_OPENAI_API_KEY",
            "whisper",
            'api_version = "2024-10-21"',
        )
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
    folder = tmp_path_factory.mktemp("stt-vendors")
    url = await databases.new("sqlite")
    gateway = GatewayProcess(
        data_dir=folder / "gw",
        database_url=url,
        extra_env={
            "GATEWAY_CATALOG": str(vendor_catalog(folder / "catalog.toml", fakes)),
            "DEEPGRAM_API_KEY": deepgram.API_KEY,
            "ELEVENLABS_API_KEY": elevenlabs.API_KEY,
            "ASSEMBLYAI_API_KEY": assemblyai.API_KEY,
            "AZURE_OPENAI_API_KEY": azure_openai.API_KEY,
        },
    )
    await asyncio.to_thread(gateway.start)
    engine = create_engine(url)
    try:
        admin = Admin(session_factory(engine))
        workspace = await admin.workspace("stt-vendors")
        await admin.credits(workspace, "10")
        yield VendorGateway(gateway, await admin.key(workspace))
    finally:
        await engine.dispose()
        await asyncio.to_thread(gateway.stop)


# model, the text its fake answers, its first word, its segment count
CASES = [
    ("deepgram/nova-3", "Hello, world.", "Hello,", 1),
    ("elevenlabs/scribe-v2", "Hello, world. (laughs) Bye.", "Hello,", 2),
    ("assemblyai/universal", "Hello, world.", "Hello,", 1),
    ("azure/whisper", "Hello, world.", "Hello", 1),
]


@pytest.mark.parametrize(("model", "text", "first_word", "segments"), CASES)
async def test_verbose_json_through_each_vendor_adapter(
    vendor_gateway: VendorGateway, model: str, text: str, first_word: str, segments: int
) -> None:
    async with httpx.AsyncClient(timeout=60) as client:
        answer = await client.post(
            f"{vendor_gateway.gateway.base_url}/audio/transcriptions",
            headers=vendor_gateway.issued.headers,
            data={
                "model": model,
                "response_format": "verbose_json",
                "timestamp_granularities[]": ["word", "segment"],
            },
            files={"file": ("hello.wav", fixture("hello"), "audio/wav")},
        )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["text"] == text
    assert body["duration"] == pytest.approx(HELLO_SECONDS)  # measured, not the provider's
    assert body["usage"]["seconds"] == pytest.approx(HELLO_SECONDS)
    assert body["usage"]["cost"] > 0
    assert len(body["segments"]) == segments
    assert body["segments"][0]["start"] < body["segments"][0]["end"]
    assert body["words"][0]["word"] == first_word
    assert 0 <= body["words"][0]["start"] < body["words"][0]["end"] < 2
