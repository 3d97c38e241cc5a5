"""Model discovery (server/routing/listing.py): OpenRouter's modality filters and paging over
the catalog."""

from __future__ import annotations

from datetime import date
from decimal import Decimal
from pathlib import Path

import pytest

from server.errors import GatewayError
from server.routing.catalog import Catalog
from server.routing.listing import ModelQuery, describe, list_models, usd_string
from testkit import domain
from testkit.domain import PROVIDER_KEY_ENV

TODAY = date(2026, 11, 27)


def unit_catalog(folder: Path) -> Catalog:
    """The unit catalog's own models, without the built-in ones."""
    models = domain.unit_catalog(folder).models
    return Catalog({id_: model for id_, model in models.items() if id_.startswith("unit")})


def _ids(catalog_dir: Path, **query: object) -> list[str]:
    page = list_models(unit_catalog(catalog_dir), ModelQuery(**query), TODAY)  # type: ignore[arg-type]
    return [listed.model.id for listed in page.models]


def test_default_is_text_output_as_on_openrouter(tmp_path: Path) -> None:
    assert _ids(tmp_path) == []  # the catalog holds no text-output model


def test_output_modalities_choose_transcription_video_or_all(tmp_path: Path) -> None:
    stt = ["unit/all-fail", "unit/fallback-429", "unit/ok"]
    video = ["unitvideo/fail", "unitvideo/ok"]
    assert _ids(tmp_path, output_modalities="transcription") == stt
    assert _ids(tmp_path, output_modalities="video") == video
    assert _ids(tmp_path, output_modalities="video, transcription") == stt + video
    assert _ids(tmp_path, output_modalities="all") == stt + video
    assert _ids(tmp_path, output_modalities="all", input_modalities="audio") == stt


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ({"output_modalities": "music"}, "output_modalities"),
        ({"output_modalities": "all", "input_modalities": "smell"}, "input_modalities"),
        ({"output_modalities": "all", "limit": 0}, "limit"),
        ({"output_modalities": "all", "limit": 1001}, "limit"),
        ({"output_modalities": "all", "offset": -1}, "param"),
    ],
)
def test_bad_filters_are_400_naming_the_parameter(
    tmp_path: Path, query: dict[str, object], param: str
) -> None:
    with pytest.raises(GatewayError) as raised:
        _ids(tmp_path, **query)
    assert raised.value.status == 400
    assert raised.value.metadata == {"param": param if param != "param" else "offset"}


def test_pages_link_to_the_next(tmp_path: Path) -> None:
    catalog = unit_catalog(tmp_path)
    first = list_models(catalog, ModelQuery(output_modalities="all", offset=0, limit=2), TODAY)
    assert [m.model.id for m in first.models] == ["unit/all-fail", "unit/fallback-429"]
    assert first.total_count == 5
    assert first.next_url == "/api/v1/models?offset=2&limit=2&output_modalities=all"
    last = list_models(catalog, ModelQuery(output_modalities="all", offset=4, limit=2), TODAY)
    assert [m.model.id for m in last.models] == ["unitvideo/ok"] and last.next_url is None


def test_description_prices_and_availability(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog = unit_catalog(tmp_path)
    stt = describe(catalog.models["unit/ok"], TODAY)
    assert (stt.input_modalities, stt.output_modalities) == (("audio",), ("transcription",))
    assert stt.modality == "audio->transcription" and stt.per_second_usd == "0.01"
    assert stt.available
    video = describe(catalog.models["unitvideo/ok"], TODAY)
    assert video.output_modalities == ("video",) and video.per_second_usd == "0.05"
    assert {"duration", "resolution", "aspect_ratio"} <= set(video.supported_parameters)
    monkeypatch.delenv(PROVIDER_KEY_ENV)
    assert not describe(catalog.models["unit/ok"], TODAY).available
    assert usd_string(Decimal("0.0000001")) == "0.0000001" and usd_string(Decimal("2.50")) == "2.5"
