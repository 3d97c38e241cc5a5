"""The built-in catalog of real models, models whose credentials are not configured (listed
as such, 503 naming what the operator must set, never routed to), the startup check that
every catalog adapter is registered, and `gateway models`."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from datetime import UTC, date, datetime
from pathlib import Path

import pytest

from server.cli import main
from server.db.models import CreditHold, Generation
from server.errors import GatewayError
from server.observability.metrics import Metrics
from server.providers.endpoint import Endpoint
from server.routing.catalog import (
    LOCAL_ADAPTERS,
    STT_ADAPTERS,
    VIDEO_ADAPTERS,
    Catalog,
    CatalogError,
    load_catalog,
    served_by,
)
from server.routing.fallback import route
from server.services.videos import model_message
from server.transcription.request import TranscriptionInput
from testkit.audio import fixture
from testkit.domain import PROVIDER_KEY_ENV, Domain, video_input
from tests.support.provider_catalog import PROVIDER_CATALOG, provider_catalog

# Every credential variable the built-in catalog and the provider entries name: unset here.
BUILT_IN_VARIABLES = sorted(
    {
        name
        for model in provider_catalog().models.values()
        for e in model.endpoints
        for name in (e.api_key_env, e.secret_key_env)
        if name
    }
)
REAL_VIDEO = ("kwaivgi/kling-v3.0-std",)
REAL_STT = ("openai/whisper-1", "openai/whisper-large-v3")
# Offered before issue 34 and left out since: a figure (price, model name or capability) their
# providers' own current documentation did not confirm (catalog.toml says which).
LEFT_OUT = (
    "google/veo-3.1",
    "google/veo-3.1-fast",
    "kwaivgi/kling-v3.0-pro",
    "minimax/hailuo-2.3",
    "bytedance/seedance-2.0",
    "alibaba/wan-2.7",
    "openai/gpt-4o-transcribe",
    "openai/gpt-4o-mini-transcribe",
    "deepgram/nova-3",
    "elevenlabs/scribe-v2",
    "assemblyai/universal",
)


def _unconfirmed(catalog: Catalog, today: date) -> list[str]:
    """Built-in entries without the pages they were confirmed on, or read on a future day."""
    return [
        model.id
        for model in catalog.models.values()
        if model.built_in
        and (
            not model.sources
            or not all(source.startswith("https://") for source in model.sources)
            or model.checked is None
            or model.checked > today
        )
    ]


@pytest.fixture(autouse=True)
def no_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in BUILT_IN_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_the_built_in_catalog_lists_the_real_models_with_adapters_and_credentials() -> None:
    catalog = load_catalog()
    for model_id in REAL_VIDEO + REAL_STT:
        model = catalog.get(model_id)
        assert model is not None, model_id
        assert model.built_in and model.price_per_second > 0
        assert model.kind == ("video" if model_id in REAL_VIDEO else "stt")
    for model in catalog.models.values():
        adapters = VIDEO_ADAPTERS if model.kind == "video" else STT_ADAPTERS
        for endpoint in model.endpoints:
            assert endpoint.adapter in adapters, (model.id, endpoint.adapter)
            if endpoint.adapter in LOCAL_ADAPTERS:
                assert endpoint.api_key_env is None and endpoint.base_url is None
            else:  # a real provider: its https API and the variable holding its credential
                assert (endpoint.base_url or "").startswith("https://"), model.id
                assert endpoint.api_key_env and endpoint.api_key_env.isupper(), model.id
    kling = catalog.get("kwaivgi/kling-v3.0-std")
    assert kling is not None
    assert [(e.adapter, e.model, e.api_key_env) for e in kling.endpoints] == [
        ("fal", "fal-ai/kling-video/v3/standard/text-to-video", "FAL_KEY")
    ]
    for left_out in LEFT_OUT:
        assert catalog.get(left_out) is None, left_out
    # The local models are unchanged, and need nothing configured.
    for local in ("local/pocketsphinx-en", "local/pocketsphinx-en:free", "local/renderer"):
        model = catalog.get(local)
        assert model is not None and all(e.available for e in model.endpoints)


def test_every_built_in_entry_names_the_pages_it_was_confirmed_on_and_when() -> None:
    """Issue 34: each built-in model's name, price and capabilities come from its provider's
    current documentation, whose links (`sources`) and reading date (`checked`) are beside
    the entry; a date in the future is a typo."""
    catalog = load_catalog()
    assert all(model.built_in for model in catalog.models.values())
    assert _unconfirmed(catalog, datetime.now(UTC).date()) == []


def test_an_entry_without_its_sources_or_read_in_the_future_is_found(tmp_path: Path) -> None:
    """The check above finds what it is for: a built-in entry without sources or without
    its date, and one read after today."""
    entries = {
        "a/sourced": 'sources = ["https://a.test/pricing"]\nchecked = 2026-11-27',
        "a/unsourced": "",
        "a/insecure": 'sources = ["http://a.test/pricing"]\nchecked = 2026-11-27',
        "a/future": 'sources = ["https://a.test/pricing"]\nchecked = 2026-11-28',
    }
    path = tmp_path / "catalog.toml"
    path.write_text(
        "".join(
            f'[[models]]\nid = "{model_id}"\nkind = "stt"\nprice_per_second = "1"\n{keys}\n'
            '[[models.endpoints]]\nprovider = "local"\nadapter = "pocketsphinx"\n'
            for model_id, keys in entries.items()
            if model_id != "a/insecure"
        )
    )
    built_in = Catalog(
        {
            model.id: dataclasses.replace(model, built_in=True)
            for model in load_catalog(path).models.values()
            if model.id.startswith("a/")
        }
    )
    insecure = dataclasses.replace(
        built_in.models["a/sourced"], id="a/insecure", sources=("http://a.test/pricing",)
    )
    built_in.models[insecure.id] = insecure
    assert sorted(_unconfirmed(built_in, date(2026, 11, 27))) == [
        "a/future",
        "a/insecure",
        "a/unsourced",
    ]


def test_an_unconfigured_model_is_listed_as_such_naming_the_variables() -> None:
    catalog = provider_catalog()
    veo = catalog.get("google/veo-3.1")
    assert veo is not None
    listed = model_message(veo, date(2026, 11, 27))
    assert listed.available is False
    assert listed.unavailable_reason.string_value == (
        "the operator must set GEMINI_API_KEY or GOOGLE_APPLICATION_CREDENTIALS"
    )
    renderer = catalog.get("local/renderer")
    assert renderer is not None
    local = model_message(renderer, date(2026, 11, 27))
    assert local.available is True and local.unavailable_reason.HasField("null_value")


async def test_unconfigured_is_503_naming_the_variables_and_no_adapter_is_called(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kling = provider_catalog().get("kwaivgi/kling-v3.0-pro")
    assert kling is not None
    called: list[Endpoint] = []

    async def attempt(endpoint: Endpoint) -> str:
        called.append(endpoint)
        return "served"

    # Only one of Kling's two keys: still not configured.
    monkeypatch.setenv("KLING_ACCESS_KEY", "access-value-never-shown")
    with pytest.raises(GatewayError) as refused:
        await route(kling.id, kling.endpoints, attempt, Metrics(), "video_submit")
    assert refused.value.status == 503
    assert refused.value.message == (
        "No available provider meets the routing requirements: kwaivgi/kling-v3.0-pro has no "
        "configured provider; the operator must set KLING_SECRET_KEY"
    )
    assert "access-value-never-shown" not in refused.value.message
    assert called == []


async def test_a_partly_configured_model_routes_only_to_its_configured_endpoints(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    veo = provider_catalog().get("google/veo-3.1")
    assert veo is not None
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/secrets/sa.json")
    called: list[str] = []

    async def attempt(endpoint: Endpoint) -> str:
        called.append(endpoint.provider)
        return "served"

    routed = await route(veo.id, veo.endpoints, attempt, Metrics(), "video_submit")
    assert called == ["google-vertex"]  # the Gemini API endpoint (no key) is skipped
    assert routed.endpoint.adapter == "vertex" and routed.attempts == ()


async def test_an_unconfigured_transcription_model_is_503_before_anything_is_held(
    domain: Domain, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(PROVIDER_KEY_ENV)
    issued = await domain.funded_key("unconfigured")
    request = TranscriptionInput(
        model="unit/ok",
        audio=fixture("hello"),
        claimed_format="wav",
        filename="hello.wav",
        audio_param="file",
    )
    async with domain.sessions() as session:
        principal = await domain.principal(issued)
        with pytest.raises(GatewayError) as refused:
            await domain.transcriber().transcribe(session, principal, request)
    assert refused.value.status == 503
    assert refused.value.message.endswith(f"the operator must set {PROVIDER_KEY_ENV}")
    assert domain.providers.sent_to("stt-ok.test") == []
    assert await domain.count(CreditHold) == 0
    assert await domain.count(Generation) == 0


def _operator_catalog(tmp_path: Path, adapter: str) -> Path:
    path = tmp_path / "operator.toml"
    path.write_text(
        '[[models]]\nid = "openai/sora-2"\nkind = "video"\nprice_per_second = "0.1"\n'
        "[[models.endpoints]]\n"
        f'provider = "my-proxy"\nadapter = "{adapter}"\n'
        'base_url = "http://proxy.internal:8081/v1/"\napi_key_env = "MY_PROXY_KEY"\n'
    )
    return path


def test_an_operator_entry_points_an_adapter_at_another_base_url(tmp_path: Path) -> None:
    catalog = load_catalog(_operator_catalog(tmp_path, "openai"))
    sora = catalog.get("openai/sora-2")
    assert sora is not None and not sora.built_in
    (endpoint,) = sora.endpoints
    assert (endpoint.provider, endpoint.adapter, endpoint.base_url) == (
        "my-proxy",
        "openai",
        "http://proxy.internal:8081/v1",
    )


def test_a_catalog_adapter_this_build_does_not_register_is_a_startup_error(
    tmp_path: Path,
) -> None:
    catalog = load_catalog(_operator_catalog(tmp_path, "fal"))
    registered_stt = ("openai", "pocketsphinx")
    with pytest.raises(CatalogError, match=r"model openai/sora-2: adapter 'fal' is not"):
        served_by(catalog, registered_stt, ("local", "openai"))
    # A built-in model keeps only the endpoints this build serves; none left: not listed.
    shipped = provider_catalog()
    built_in = served_by(
        Catalog({k: dataclasses.replace(m, built_in=True) for k, m in shipped.models.items()}),
        registered_stt,
        ("local", "openai", "vertex"),
    )
    veo = built_in.get("google/veo-3.1")
    assert veo is not None and [e.adapter for e in veo.endpoints] == ["vertex"]
    assert built_in.get("kwaivgi/kling-v3.0-pro") is None
    assert built_in.get("kwaivgi/kling-v3.0-std") is None
    assert built_in.get("openai/whisper-1") is not None
    assert built_in.get("local/renderer") is not None
    # With every adapter the catalog knows registered, nothing is dropped.
    assert served_by(load_catalog(), STT_ADAPTERS, VIDEO_ADAPTERS) == load_catalog()


def test_gateway_models_shows_each_endpoint_and_why_it_is_not_routable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GEMINI_API_KEY", "gemini-value-never-shown")
    catalog = _operator_catalog(tmp_path, "openai")
    catalog.write_text(catalog.read_text() + PROVIDER_CATALOG.read_text())
    monkeypatch.setenv("GATEWAY_CATALOG", str(catalog))
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "gemini-value-never-shown" not in out
    lines = out.splitlines()
    veo = lines.index(next(line for line in lines if line.startswith("google/veo-3.1 ")))
    assert lines[veo].endswith("  routable")
    assert "adapter gemini  https://generativelanguage.googleapis.com/v1beta" in lines[veo + 1]
    assert lines[veo + 1].endswith("credentials GEMINI_API_KEY  routable")
    assert lines[veo + 2].endswith("not routable: missing GOOGLE_APPLICATION_CREDENTIALS")
    kling = next(line for line in lines if line.startswith("kwaivgi/kling-v3.0-pro "))
    assert kling.endswith(
        "not routable: the operator must set KLING_ACCESS_KEY and KLING_SECRET_KEY"
    )
    # The operator's catalog (GATEWAY_CATALOG) is read as `gateway up` reads it.
    sora = lines.index(next(line for line in lines if line.startswith("openai/sora-2 ")))
    assert "operator" in lines[sora]
    assert "provider my-proxy  adapter openai  http://proxy.internal:8081/v1" in lines[sora + 1]
    assert lines[sora + 1].endswith("not routable: missing MY_PROXY_KEY")
    renderer = next(line for line in lines if line.startswith("local/renderer "))
    assert renderer.endswith("  routable")


def test_gateway_models_runs_as_a_command(tmp_path: Path) -> None:
    environment = {k: v for k, v in os.environ.items() if k not in BUILT_IN_VARIABLES}
    environment["GROQ_API_KEY"] = "groq-value-never-shown"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "server.cli",
            "models",
            "--catalog",
            str(_operator_catalog(tmp_path, "openai")),
        ],
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "groq-value-never-shown" not in done.stdout
    lines = done.stdout.splitlines()
    whisper = next(line for line in lines if line.startswith("openai/whisper-large-v3 "))
    assert whisper.endswith("  routable")
    assert "provider my-proxy" in done.stdout


def test_the_gateway_refuses_to_start_on_an_operator_adapter_it_does_not_register(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from server.app import build_core
    from server.config import load_settings
    from server.routing import catalog as catalog_module

    path = tmp_path / "operator.toml"
    path.write_text(
        '[[models]]\nid = "acme/stt"\nkind = "stt"\nprice_per_second = "0.1"\n'
        "[[models.endpoints]]\n"
        'provider = "acme"\nadapter = "unbuilt"\nbase_url = "https://acme.test"\n'
    )
    # A name the catalog accepts but server/app.py registers no adapter for.
    monkeypatch.setattr(catalog_module, "STT_ADAPTERS", (*STT_ADAPTERS, "unbuilt"))
    with pytest.raises(CatalogError, match=r"model acme/stt: adapter 'unbuilt' is not implemented"):
        build_core(load_settings(tmp_path, catalog_file=str(path)))


async def test_a_job_whose_credentials_were_removed_fails_naming_the_variable(
    domain: Domain, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from server.db.models import VideoJob
    from server.videos import jobs
    from server.videos.content import LocalContentStore
    from server.workers.video_worker import VideoWorker

    issued = await domain.funded_key("credentials-removed")
    model = domain.catalog.get("unitvideo/ok")
    assert model is not None
    video = video_input(model)
    principal = await domain.principal(issued)
    async with domain.sessions() as session:
        job = await jobs.submit_job(
            session, principal, video, domain.clock.now(), None, domain.limits
        )
    monkeypatch.delenv(PROVIDER_KEY_ENV)  # accepted, then the operator removed the key
    worker = VideoWorker(
        domain.sessions,
        domain.clock,
        domain.catalog,
        domain.video_adapters(),
        LocalContentStore(tmp_path / "content"),
    )
    claimed = await worker.claim()
    assert claimed is not None
    await worker.step(claimed)
    (failed,) = await domain.rows(VideoJob, VideoJob.id == job.id)
    assert failed.status == jobs.FAILED
    assert failed.error.endswith(f"the operator must set {PROVIDER_KEY_ENV}")
    assert domain.providers.sent_to("video.test") == []
