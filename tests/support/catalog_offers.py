"""What the built-in catalog offers a video adapter: every (resolution, aspect ratio, duration,
provider model) combination, for tests that each is a request the provider accepts."""

from __future__ import annotations

from server.routing.catalog import load_catalog


def catalog_offers(adapter: str) -> list[tuple[str, str, int, str]]:
    """(resolution, aspect ratio, duration, provider model) of every combination the built-in
    catalog offers on an endpoint of this adapter; a model without aspect ratios (the provider
    takes the shape from the resolution) is listed at 16:9."""
    offers = []
    for model in load_catalog().of_kind("video"):
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
