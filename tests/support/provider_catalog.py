"""Real providers' models as an operator would configure them (provider_catalog.toml): the
shapes tests check against the provider fakes, and multi-endpoint / two-key models."""

from __future__ import annotations

from pathlib import Path

from server.routing.catalog import Catalog, load_catalog

PROVIDER_CATALOG = Path(__file__).with_name("provider_catalog.toml")


def provider_catalog() -> Catalog:
    """The built-in catalog with the provider entries added, as `gateway up --catalog` loads it."""
    return load_catalog(PROVIDER_CATALOG)
