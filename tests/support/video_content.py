"""A video adapter's result as bytes: what the worker would stream into the content store
(a provider's file is fetched here, as the worker fetches it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from server.providers.endpoint import Endpoint
from server.providers.http import Downloads
from server.providers.video import VideoSource


async def video_bytes(videos: Sequence[VideoSource]) -> list[bytes]:
    found: list[bytes] = []
    for video in videos:
        if isinstance(video, bytes):
            found.append(video)
        else:
            found.append(b"".join([chunk async for chunk in video.chunks()]))
    return found


async def download(downloads: Downloads, endpoint: Endpoint, url: object, **rules: Any) -> bytes:
    """What `Downloads` fetches from `url` (the whole file)."""
    (found,) = await video_bytes([downloads.remote(endpoint, url, **rules)])
    return found
