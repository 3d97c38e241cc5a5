"""The catalog file is declared (server/routing/catalog.py): a wrong or unknown key stops the
gateway with a message naming the file, the line and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.config import SettingsError
from server.routing.catalog import CatalogError, load_catalog

GOOD = """\
[[models]]
id = "acme/whisper"
kind = "stt"
price_per_second = "0.001"
[[models.endpoints]]
provider = "acme"
adapter = "openai"
base_url = "https://acme.example/v1/"
"""


def _load(tmp_path: Path, text: str) -> str:
    path = tmp_path / "catalog.toml"
    path.write_text(text)
    with pytest.raises(CatalogError) as caught:
        load_catalog(path)
    return str(caught.value)


def test_built_in_and_operator_models_load(tmp_path: Path) -> None:
    path = tmp_path / "catalog.toml"
    path.write_text(GOOD)
    catalog = load_catalog(path)
    model = catalog.get("acme/whisper")
    assert model is not None and model.endpoints[0].base_url == "https://acme.example/v1"
    assert catalog.get("local/renderer") is not None
    assert catalog.get("local/renderer").video.durations == (1, 2, 3, 4, 5, 6, 8, 10)  # type: ignore[union-attr]


def test_unknown_keys_name_the_key_and_line(tmp_path: Path) -> None:
    message = _load(tmp_path, GOOD + "timeout = 3\n")
    assert "catalog.toml, line 9: models[0].endpoints[0].timeout: unknown key" in message
    message = _load(tmp_path, GOOD.replace('kind = "stt"', 'kind = "stt"\nverbse_json = true'))
    assert "line 4: models[0].verbse_json: unknown key" in message
    message = _load(tmp_path, GOOD + "[extra]\nx = 1\n")
    assert "line 9: extra: unknown key" in message


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ('id = "acme/whisper"', 'id = "whisper"', "id must look like"),
        ('kind = "stt"', 'kind = "image"', "models[0].kind"),
        ('"0.001"', "-1", "models[0].price_per_second"),
        ('"0.001"', '"cheap"', "models[0].price_per_second"),
        ('adapter = "openai"', 'adapter = "local"', "adapter must be one of openai, azure-openai"),
        ('base_url = "https://acme.example/v1/"', "", "adapter 'openai' needs base_url"),
        ('provider = "acme"', "", "models[0].endpoints[0].provider: missing"),
        ('provider = "acme"', "provider = 3", "models[0].endpoints[0].provider"),
    ],
)
def test_wrong_values_are_refused(tmp_path: Path, old: str, new: str, expected: str) -> None:
    assert expected in _load(tmp_path, GOOD.replace(old, new))


def test_a_catalog_error_is_a_settings_error(tmp_path: Path) -> None:
    """`gateway up` reports settings errors without a traceback (server/cli.py)."""
    assert issubclass(CatalogError, SettingsError)
    assert "line 1" in _load(tmp_path, "[[modelz]]\n")
