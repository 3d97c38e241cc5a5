"""Video generation values of the API reference: aspect ratios, resolutions, sizes."""

from __future__ import annotations

import re
from fractions import Fraction

ASPECT_RATIOS = ("16:9", "9:16", "1:1", "4:3", "3:4", "3:2", "2:3", "21:9", "9:21")
RESOLUTIONS = ("480p", "720p", "768p", "1080p", "1K", "2K", "4K")
FRAME_TYPES = ("first_frame", "last_frame")
REFERENCE_TYPES = ("image_url", "audio_url", "video_url")
SIZE = re.compile(r"^([1-9][0-9]{1,4})x([1-9][0-9]{1,4})$")

# The short side of each resolution name.
SHORT_SIDE = {
    "480p": 480,
    "720p": 720,
    "768p": 768,
    "1080p": 1080,
    "1K": 1080,
    "2K": 1440,
    "4K": 2160,
}


def _even(value: float) -> int:
    return max(2, round(value / 2) * 2)


def size_of(resolution: str, aspect_ratio: str) -> tuple[int, int]:
    """Pixel dimensions of a resolution at an aspect ratio (even numbers, for H.264)."""
    short = SHORT_SIDE[resolution]
    width, height = (int(part) for part in aspect_ratio.split(":"))
    if width >= height:
        return _even(short * width / height), short
    return short, _even(short * height / width)


def parse_size(size: str) -> tuple[int, int] | None:
    match = SIZE.match(size)
    return (int(match.group(1)), int(match.group(2))) if match else None


def aspect_of(width: int, height: int) -> str | None:
    """The named aspect ratio closest to the size, within 1%."""
    actual = Fraction(width, height)
    for name in ASPECT_RATIOS:
        w, h = (int(part) for part in name.split(":"))
        if abs(float(actual / Fraction(w, h)) - 1) < 0.01:
            return name
    return None


def resolution_of(width: int, height: int) -> str | None:
    short = min(width, height)
    for name in ("480p", "720p", "768p", "1080p", "2K", "4K"):
        if SHORT_SIDE[name] == short:
            return name
    return None
