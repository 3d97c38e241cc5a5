"""What the seedance, dashscope, fal and replicate adapters share beyond video_http.py."""

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
