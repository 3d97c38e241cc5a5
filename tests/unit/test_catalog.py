"""The catalog parser on a small operator file: what it reads, and the entries it refuses
(naming where)."""

from __future__ import annotations

from datetime import date
from decimal import Decimal
from pathlib import Path

import pytest

from server.routing.catalog import CatalogError, load_catalog
from testkit.domain import PROVIDER_KEY_ENV, unit_catalog


def test_the_unit_catalog_parses_with_endpoints_in_fallback_order(tmp_path: Path) -> None:
    catalog = unit_catalog(tmp_path)
    model = catalog.get("unit/fallback-429")
    assert model is not None
    assert (model.kind, model.price_per_second) == ("stt", Decimal("0.01"))
    assert [e.provider for e in model.endpoints] == ["alpha", "beta"]
    assert model.endpoints[0].base_url == "http://stt-429.test/v1"
    assert model.endpoints[0].api_key_env == PROVIDER_KEY_ENV
    assert model.endpoints[0].model is None and model.upstream_name == "fallback-429"
    ok = catalog.get("unit/ok")
    assert ok is not None and ok.endpoints[0].base_url == "http://stt-ok.test/v1"  # no "/"
    video = catalog.get("unitvideo/ok")
    assert video is not None and video.video is not None
    assert (video.video.durations, video.video.resolutions) == ((2,), ("480p",))
    assert {m.id for m in catalog.of_kind("video")} >= {"unitvideo/ok", "unitvideo/fail"}
    # The built-in models are still there next to the operator's.
    assert set(load_catalog().models) <= set(catalog.models)


def test_an_operator_entry_replaces_the_built_in_one_of_the_same_id(tmp_path: Path) -> None:
    model_id = load_catalog().of_kind("stt")[0].id
    path = tmp_path / "catalog.toml"
    path.write_text(
        f'[[models]]\nid = "{model_id}"\nkind = "stt"\nprice_per_second = "42"\n'
        '[[models.endpoints]]\nprovider = "mine"\nadapter = "pocketsphinx"\n'
    )
    replaced = load_catalog(path).get(model_id)
    assert replaced is not None
    assert replaced.price_per_second == Decimal(42)
    assert [e.provider for e in replaced.endpoints] == ["mine"]


ENDPOINT = '[[models.endpoints]]\nprovider = "p"\nadapter = "openai"\nbase_url = "http://x.test"\n'


def _model(body: str, endpoint: str = ENDPOINT) -> str:
    return f"[[models]]\n{body}\n{endpoint}"


BAD = {
    "id without a provider prefix": (
        _model('id = "noslash"\nkind = "stt"\nprice_per_second = "1"'),
        "id must look like <provider_prefix>/<model_name>",
    ),
    "missing kind": (_model('id = "a/b"\nprice_per_second = "1"'), "models[0].kind: missing"),
    "unknown kind": (
        _model('id = "a/b"\nkind = "chat"\nprice_per_second = "1"'),
        "models[0].kind: Input should be 'stt' or 'video'",
    ),
    "price not a decimal": (
        _model('id = "a/b"\nkind = "stt"\nprice_per_second = "cheap"'),
        "models[0].price_per_second: Input should be a valid decimal",
    ),
    "negative price": (
        _model('id = "a/b"\nkind = "stt"\nprice_per_second = "-1"'),
        "models[0].price_per_second: Input should be greater than or equal to 0",
    ),
    "infinite price": (
        _model('id = "a/b"\nkind = "stt"\nprice_per_second = "Infinity"'),
        "models[0].price_per_second: Input should be a finite number",
    ),
    "no endpoints": (
        '[[models]]\nid = "a/b"\nkind = "stt"\nprice_per_second = "1"\n',
        "models[0].endpoints: missing",
    ),
    "video adapter on an stt model": (
        _model(
            'id = "a/b"\nkind = "stt"\nprice_per_second = "1"',
            '[[models.endpoints]]\nprovider = "p"\nadapter = "local"\n',
        ),
        "endpoints[0].adapter must be one of openai, azure-openai, deepgram",
    ),
    "openai adapter without base_url": (
        _model(
            'id = "a/b"\nkind = "stt"\nprice_per_second = "1"',
            '[[models.endpoints]]\nprovider = "p"\nadapter = "openai"\n',
        ),
        "adapter 'openai' needs base_url",
    ),
    "endpoint without provider": (
        _model(
            'id = "a/b"\nkind = "stt"\nprice_per_second = "1"',
            '[[models.endpoints]]\nadapter = "openai"\nbase_url = "http://x.test"\n',
        ),
        "models[0].endpoints[0].provider: missing",
    ),
    "video durations not integers": (
        _model(
            'id = "a/v"\nkind = "video"\nprice_per_second = "1"\ndurations = [0, "4"]',
            '[[models.endpoints]]\nprovider = "p"\nadapter = "local"\n',
        ),
        "models[0].durations[0]: Input should be greater than 0",
    ),
    "video resolutions not strings": (
        _model(
            'id = "a/v"\nkind = "video"\nprice_per_second = "1"\nresolutions = [480]',
            '[[models.endpoints]]\nprovider = "p"\nadapter = "local"\n',
        ),
        "models[0].resolutions[0]: Input should be a valid string",
    ),
    "sources not a list": (
        _model('id = "a/b"\nkind = "stt"\nprice_per_second = "1"\nsources = "https://x.test"'),
        "models[0].sources: Input should be a valid list",
    ),
    "a source that is not an https link": (
        _model(
            'id = "a/b"\nkind = "stt"\nprice_per_second = "1"\n'
            'sources = ["http://x.test/pricing"]\nchecked = 2026-11-27'
        ),
        "models[0].sources[0]: must be an https:// link",
    ),
    "checked as a string, not a TOML date": (
        _model(
            'id = "a/b"\nkind = "stt"\nprice_per_second = "1"\n'
            'sources = ["https://x.test/pricing"]\nchecked = "2026-11-27"'
        ),
        "models[0].checked: Input should be a valid date",
    ),
    "sources without the date they were read": (
        _model(
            'id = "a/b"\nkind = "stt"\nprice_per_second = "1"\nsources = ["https://x.test/pricing"]'
        ),
        "sources and checked go together",
    ),
    "a date read without the sources": (
        _model('id = "a/b"\nkind = "stt"\nprice_per_second = "1"\nchecked = 2026-11-27'),
        "sources and checked go together",
    ),
    "no sources at all": (
        _model(
            'id = "a/b"\nkind = "stt"\nprice_per_second = "1"\nsources = []\nchecked = 2026-11-27'
        ),
        "models[0].sources: List should have at least 1 item",
    ),
    "not TOML": ("[[models]\nid = ", ""),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_entries_are_refused_naming_where(tmp_path: Path, name: str) -> None:
    text, expected = BAD[name]
    path = tmp_path / "catalog.toml"
    path.write_text(text)
    with pytest.raises(CatalogError) as refused:
        load_catalog(path)
    message = str(refused.value)
    assert message.startswith(str(path))
    assert expected in message
    if expected and name != "not TOML":
        assert "models[0]" in message


_PRICED = """[[models]]
id = "acme/video"
kind = "video"
price_per_second = "0.30"
resolutions = ["720p", "1080p"]
sizes = ["1280x720", "1792x1024"]
output_prices = { "1080p" = "0.40", "1792x1024" = "0.50" }
[[models.endpoints]]
provider = "acme"
adapter = "local"
"""


def test_an_output_priced_apart_costs_its_own_price(tmp_path: Path) -> None:
    path = tmp_path / "catalog.toml"
    path.write_text(_PRICED)
    model = load_catalog(path).get("acme/video")
    assert model is not None
    assert model.video_price({"resolution": "720p", "width": 1280, "height": 720}) == Decimal(
        "0.30"
    )
    assert model.video_price({"resolution": "1080p", "width": 1920, "height": 1080}) == Decimal(
        "0.40"
    )
    # A size's own price comes before its resolution's.
    assert model.video_price({"resolution": "1080p", "width": 1792, "height": 1024}) == Decimal(
        "0.50"
    )


def test_a_price_for_an_output_the_model_does_not_offer_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "catalog.toml"
    path.write_text(_PRICED.replace('"1080p" = "0.40"', '"4K" = "0.90"'))
    with pytest.raises(CatalogError, match=r"output_prices\.4K"):
        load_catalog(path)


def test_an_entry_names_the_pages_it_was_confirmed_on_and_when(tmp_path: Path) -> None:
    """`sources` (https links) and `checked` (a TOML date): optional for an operator's entry,
    kept on the model when given."""
    path = tmp_path / "catalog.toml"
    path.write_text(
        _model(
            'id = "acme/sourced"\nkind = "stt"\nprice_per_second = "0.0001"\n'
            'sources = ["https://acme.test/pricing", "https://acme.test/models"]\n'
            "checked = 2026-11-27"
        )
        + _model('id = "acme/unsourced"\nkind = "stt"\nprice_per_second = "0.0001"')
    )
    catalog = load_catalog(path)
    sourced = catalog.get("acme/sourced")
    assert sourced is not None
    assert sourced.sources == ("https://acme.test/pricing", "https://acme.test/models")
    assert sourced.checked == date(2026, 11, 27)
    unsourced = catalog.get("acme/unsourced")
    assert unsourced is not None and (unsourced.sources, unsourced.checked) == ((), None)
