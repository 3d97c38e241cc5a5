"""Veo's images (first frame, last frame, up to three references) go inline in the
request: they are fetched at once, each within its own bounds, not one after another (five
slow image hosts would otherwise add up); the first failure is the request's, and the
other fetches are cancelled."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest

from server.errors import GatewayError
from server.providers.http import InlineImage
from server.providers.veo import request_body
from server.providers.video import VideoCall

FRAMES = [
    {"frame_type": "first_frame", "url": "https://img.test/first.png"},
    {"frame_type": "last_frame", "url": "https://img.test/last.png"},
]
REFERENCES = [{"type": "image_url", "url": f"https://img.test/ref{i}.png"} for i in range(4)]


class GatedImages:
    """Each fetch waits until every expected fetch has started: fetched one after another,
    the first would wait forever (bounded here by `within`)."""

    def __init__(self, expected: int, failing: str | None = None) -> None:
        self.expected = expected
        self.failing = failing
        self.started: list[str] = []
        self.cancelled: list[str] = []
        self.all_started = asyncio.Event()

    async def inline(self, url: str, timeout_seconds: float) -> InlineImage:
        self.started.append(url)
        if len(self.started) == self.expected:
            self.all_started.set()
        try:
            if url == self.failing:
                raise GatewayError(400, "frame_images: the image could not be fetched")
            await asyncio.wait_for(self.all_started.wait(), timeout=5)
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            self.cancelled.append(url)
            raise
        return InlineImage(url.encode(), "image/png")


def _call(**params: Any) -> VideoCall:
    return VideoCall(model="veo-3.1-generate-preview", params={"prompt": "p", **params})


async def test_every_image_is_fetched_at_once_and_kept_in_its_place() -> None:
    images = GatedImages(expected=5)
    body = await request_body(
        _call(frame_images=FRAMES, input_references=REFERENCES),
        images,  # type: ignore[arg-type]
        30.0,
        vertex=False,
    )
    instance = body["instances"][0]
    assert len(images.started) == 5  # the fourth reference is beyond Veo's three
    assert instance["image"]["mimeType"] == "image/png"
    decoded = [
        instance["image"]["bytesBase64Encoded"],
        instance["lastFrame"]["bytesBase64Encoded"],
        *(ref["image"]["bytesBase64Encoded"] for ref in instance["referenceImages"]),
    ]
    assert [base64.b64decode(d).decode() for d in decoded] == [
        "https://img.test/first.png",
        "https://img.test/last.png",
        "https://img.test/ref0.png",
        "https://img.test/ref1.png",
        "https://img.test/ref2.png",
    ]
    assert all(ref["referenceType"] == "asset" for ref in instance["referenceImages"])


async def test_the_first_failure_is_raised_and_the_other_fetches_are_cancelled() -> None:
    images = GatedImages(expected=99, failing="https://img.test/last.png")
    with pytest.raises(GatewayError, match="could not be fetched"):
        await request_body(
            _call(frame_images=FRAMES, input_references=REFERENCES[:1]),
            images,  # type: ignore[arg-type]
            30.0,
            vertex=False,
        )
    assert sorted(images.cancelled) == ["https://img.test/first.png", "https://img.test/ref0.png"]
