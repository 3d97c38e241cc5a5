"""Small pieces the task-style video adapters (seedance, dashscope, fal, replicate) share."""

from __future__ import annotations

from server.providers.http import MAX_PROVIDER_MESSAGE
from server.providers.video import VideoProgress


def failed(provider_job_id: str, detail: object) -> VideoProgress:
    """A provider task that ended without a video, with what the provider said (bounded)."""
    return VideoProgress(
        state="failed",
        provider_job_id=provider_job_id,
        error=f"Provider failed: {str(detail)[:MAX_PROVIDER_MESSAGE]}",
    )


def reported_seconds(value: object) -> float | None:
    """An output duration the provider reported, when it is a positive number."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return None
    return float(value)
