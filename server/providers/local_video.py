"""Offline video: renders a real, playable H.264 MP4 of the requested size and duration,
drawn from the prompt (colours and motion from the prompt and seed, the prompt as a caption),
so `gateway up` completes video jobs with no provider account. No provider API to check
against (checked 2026-11-27: nothing external; the catalog's local/renderer lists what it
renders)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import math
import textwrap
import uuid
from typing import TYPE_CHECKING, Any

from server.providers.endpoint import Endpoint
from server.providers.video import VideoCall, VideoProgress

if TYPE_CHECKING:
    import numpy as np

FPS = 24


def _palette(prompt: str, seed: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    import numpy as np

    digest = hashlib.sha256(f"{seed}:{prompt}".encode()).digest()
    colours = [np.array(list(digest[i : i + 3]), dtype=np.float32) for i in (0, 3, 6)]
    return colours[0], colours[1], colours[2]


def render_mp4(params: dict[str, Any]) -> bytes:
    # PyAV, numpy and Pillow (large in memory) load on the first render, not in every server
    # process.
    import av
    import numpy as np
    from PIL import Image, ImageDraw, ImageFont

    width, height = int(params["width"]), int(params["height"])
    frames = int(params["duration"]) * FPS
    prompt = str(params.get("prompt") or "")
    top, bottom, accent = _palette(prompt, params.get("seed"))
    gradient = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None, None]
    background = (top * (1 - gradient) + bottom * gradient).astype(np.uint8)
    background = np.repeat(background, width, axis=1)
    font = ImageFont.load_default(size=max(12, height // 18))
    caption = "\n".join(textwrap.wrap(prompt, width=max(10, width // (height // 30 + 8)))[:4])
    radius = max(4, min(width, height) // 10)
    out = io.BytesIO()
    with av.open(out, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast", "crf": "30"}
        for index in range(frames):
            image = Image.fromarray(background.copy())
            draw = ImageDraw.Draw(image)
            phase = 2 * math.pi * index / max(frames, 1)
            cx = width / 2 + (width / 3) * math.cos(phase)
            cy = height / 2 + (height / 4) * math.sin(2 * phase)
            draw.ellipse(
                (cx - radius, cy - radius, cx + radius, cy + radius),
                fill=tuple(int(c) for c in accent),
            )
            if caption:
                draw.multiline_text(
                    (width // 20, height // 20),
                    caption,
                    font=font,
                    fill=(255, 255, 255),
                    stroke_width=2,
                    stroke_fill=(0, 0, 0),
                )
            frame = av.VideoFrame.from_image(image)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return out.getvalue()


class LocalVideoAdapter:
    """Renders in worker threads, a bounded number at once (it is CPU-bound). Threads, not
    processes: libx264 and Pillow release the GIL while they work, so a render in a thread
    leaves the event loop's thread running, and the MP4 need not be copied between processes.
    `max_parallel` render at once per server process, however many jobs the video worker
    runs at once (GATEWAY_VIDEO_JOBS_AT_ONCE): the others wait for a slot."""

    def __init__(self, max_parallel: int = 1) -> None:
        self._slots = asyncio.Semaphore(max_parallel)

    async def submit(self, endpoint: Endpoint, call: VideoCall) -> VideoProgress:
        async with self._slots:
            video = await asyncio.to_thread(render_mp4, call.params)
        return VideoProgress(
            state="completed",
            provider_job_id=f"local-{uuid.uuid4().hex}",
            videos=[video],
            seconds=float(call.params["duration"]),
        )

    async def poll(
        self, endpoint: Endpoint, provider_job_id: str, call: VideoCall
    ) -> VideoProgress:
        # Rendering completes within submit; a job whose process died before it was stored is
        # rendered again (the output is a function of the parameters).
        return await self.submit(endpoint, call)
