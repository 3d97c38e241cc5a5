"""What the task-style video adapters share beyond HTTP (server/providers/http.py): mapping a
request's images and a client's provider.options, reading a reported duration, and a task
that ended without a video."""

from __future__ import annotations

from typing import Any

from server.providers.http import MAX_PROVIDER_MESSAGE
from server.providers.video import VideoProgress

# provider.options never set where the provider calls back (the gateway polls).
UNFORWARDED_OPTIONS = frozenset({"callback_url", "callbackUrl", "webhook_url"})


def merged(body: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """The body with a client's provider.options added. What the gateway mapped from the
    request wins (the model, duration and size it charges for), and no callback URL."""
    extra = {k: v for k, v in options.items() if k not in UNFORWARDED_OPTIONS}
    return {**extra, **{k: v for k, v in body.items() if v is not None}}


def image_urls(params: dict[str, Any]) -> tuple[str | None, str | None, list[str]]:
    """(first frame, last frame, image references) of validated request parameters; audio
    and video references are left out (these providers take images only)."""
    frames = {f["frame_type"]: f["url"] for f in params.get("frame_images", [])}
    references = [
        r["url"] for r in params.get("input_references", []) if r.get("type") == "image_url"
    ]
    return frames.get("first_frame"), frames.get("last_frame"), references


def seconds_of(value: object) -> float | None:
    """A provider's reported duration ("5.04" or 5.04), when it is a positive number."""
    try:
        seconds = float(value) if isinstance(value, str | int | float) else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 < seconds < 86_400 else None


def failed(provider_job_id: str, detail: object) -> VideoProgress:
    """A provider task that ended without a video, with what the provider said (bounded)."""
    return VideoProgress(
        state="failed",
        provider_job_id=provider_job_id,
        error=f"Provider failed: {str(detail)[:MAX_PROVIDER_MESSAGE]}",
    )
