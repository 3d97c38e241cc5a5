"""A catalog entry's retirement date (server/routing/catalog.py): from that UTC day on the
model is listed as unavailable, saying it was retired, requests for it are a 404 naming the
date, and `gateway models` says so. Before it, nothing changes."""

from __future__ import annotations

import dataclasses
from datetime import UTC, date, datetime
from pathlib import Path

import pytest
from google.protobuf import json_format

from server.cli import main
from server.contract import videos_pb2
from server.errors import GatewayError
from server.routing.catalog import Catalog, CatalogError, load_catalog
from server.routing.listing import describe
from server.routing.readiness import report
from server.services.videos import model_message
from server.videos.request import parse_video_request
from testkit.domain import Domain, write_unit_catalog

RETIRES = date(2026, 9, 24)
DAY_BEFORE = date(2026, 9, 23)


def _retiring(folder: Path) -> Catalog:
    """The unit catalog with its STT model `unit/ok` and video model `unitvideo/ok` retiring on
    RETIRES (as an operator writes it: `retires = 2026-09-24`, a TOML date)."""
    text = write_unit_catalog(folder).read_text()
    for model_id in ("unit/ok", "unitvideo/ok"):
        line = f'id = "{model_id}"\n'
        assert line in text
        text = text.replace(line, f"{line}retires = 2026-09-24\n", 1)
    path = folder / "retiring.toml"
    path.write_text(text)
    return load_catalog(path)


def test_the_date_is_read_from_the_catalog_as_a_toml_date(tmp_path: Path) -> None:
    catalog = _retiring(tmp_path)
    ok = catalog.get("unit/ok")
    assert ok is not None and ok.retires == RETIRES
    other = catalog.get("unit/all-fail")
    assert other is not None and other.retires is None
    # A string is not a date: refused where it is written, as any wrong catalog value.
    path = tmp_path / "bad.toml"
    path.write_text(
        '[[models]]\nid = "acme/x"\nkind = "stt"\nprice_per_second = "0.01"\n'
        'retires = "someday"\n[[models.endpoints]]\nprovider = "acme"\nadapter = "pocketsphinx"\n'
    )
    with pytest.raises(CatalogError, match=r"bad\.toml, line 5: models\[0\]\.retires"):
        load_catalog(path)


def test_listed_as_unavailable_from_the_date_on(tmp_path: Path) -> None:
    model = _retiring(tmp_path).get("unit/ok")
    assert model is not None
    before = describe(model, DAY_BEFORE)
    assert before.available and before.unavailable_reason is None
    for day in (RETIRES, date(2027, 1, 1)):
        listed = describe(model, day)
        assert not listed.available
        assert listed.unavailable_reason == (
            "retired on 2026-09-24: its provider no longer serves it"
        )


def test_video_models_listing_says_retired(tmp_path: Path) -> None:
    model = _retiring(tmp_path).get("unitvideo/ok")
    assert model is not None
    assert model_message(model, DAY_BEFORE).available
    retired = model_message(model, RETIRES)
    assert retired.available is False
    assert retired.unavailable_reason.string_value.startswith("retired on 2026-09-24")


async def test_a_transcription_of_a_retired_model_is_404_naming_the_date(
    domain: Domain, tmp_path: Path
) -> None:
    retiring = dataclasses.replace(domain, catalog=_retiring(tmp_path))
    issued = await domain.funded_key("retired-stt")
    domain.clock.set(datetime(2026, 9, 23, 23, 59, 59, tzinfo=UTC))
    assert (await retiring.transcribe(issued)).generation_id  # the day before: served
    domain.clock.set(datetime(2026, 9, 24, 0, 0, 0, tzinfo=UTC))
    sent = len(domain.providers.requests)
    with pytest.raises(GatewayError) as refused:
        await retiring.transcribe(issued)
    assert refused.value.status == 404
    assert refused.value.message == (
        "Model unit/ok was retired on 2026-09-24: its provider no longer serves it"
    )
    assert len(domain.providers.requests) == sent  # no provider was called


def test_a_video_request_for_a_retired_model_is_404_naming_the_date(tmp_path: Path) -> None:
    catalog = _retiring(tmp_path)
    request = json_format.ParseDict(
        {"model": "unitvideo/ok", "prompt": "a lighthouse"}, videos_pb2.CreateVideoRequest()
    )
    assert parse_video_request(request, catalog, None, DAY_BEFORE).model.id == "unitvideo/ok"
    with pytest.raises(GatewayError) as refused:
        parse_video_request(request, catalog, None, RETIRES)
    assert refused.value.status == 404
    assert "retired on 2026-09-24" in refused.value.message


def test_gateway_models_says_retired(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    catalog = _retiring(tmp_path)
    lines = report(catalog, RETIRES)
    line = next(line for line in lines if line.startswith("unit/ok "))
    assert line.endswith("not routable: retired on 2026-09-24: its provider no longer serves it")
    before = next(line for line in report(catalog, DAY_BEFORE) if line.startswith("unit/ok "))
    assert "retired" not in before
    # The command itself, on today's date (2026-09-24 is past).
    monkeypatch.setenv("GATEWAY_CATALOG", str(tmp_path / "retiring.toml"))
    assert main(["models"]) == 0
    printed = next(
        line for line in capsys.readouterr().out.splitlines() if line.startswith("unit/ok ")
    )
    assert "not routable: retired on 2026-09-24" in printed


def test_no_built_in_model_is_retired_or_on_a_retired_api() -> None:
    """OpenAI shut down its Videos API and the Sora 2 models on 2026-09-24: the built-in
    catalog offers no model on the `openai` video adapter (an operator's own catalog may, for
    OpenAI-compatible video servers), and none whose retirement date has passed."""
    today = datetime.now(UTC).date()
    catalog = load_catalog()
    assert catalog.models and all(model.built_in for model in catalog.models.values())
    for model in catalog.models.values():
        assert model.retirement(today) is None, model.id
        if model.kind == "video":
            assert all(e.adapter != "openai" for e in model.endpoints), model.id
