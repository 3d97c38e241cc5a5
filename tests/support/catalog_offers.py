"""What a catalog offers a video adapter: every (resolution, aspect ratio, duration, provider
model) combination, for tests that each is a request the provider accepts. The catalog is the
built-in one with the provider entries of tests/support/provider_catalog.toml added: since
issue 34 the built-in catalog ships only models whose provider pages confirmed them, and an
operator's entries for the other adapters must still be requests the providers accept."""

from __future__ import annotations

from tests.support.provider_catalog import provider_catalog


def catalog_offers(adapter: str) -> list[tuple[str, str, int, str]]:
    """(resolution, aspect ratio, duration, provider model) of every combination the catalog
    offers on an endpoint of this adapter; a model without aspect ratios (the provider
    takes the shape from the resolution) is listed at 16:9."""
    offers = []
    for model in provider_catalog().of_kind("video"):
        caps = model.video
        assert caps is not None
        for endpoint in model.endpoints:
            if endpoint.adapter != adapter:
                continue
            assert endpoint.model is not None
            for resolution in caps.resolutions or ():
                for ratio in caps.aspect_ratios or ("16:9",):
                    for duration in caps.durations or ():
                        offers.append((resolution, ratio, duration, endpoint.model))
    assert offers, adapter
    return offers
