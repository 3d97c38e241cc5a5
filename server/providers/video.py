"""What every video adapter takes and returns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from server.providers.endpoint import Endpoint
from server.providers.http import RemoteVideo

# A finished video: its bytes (rendered here, or inline in the provider's answer), or the
# provider's file to be streamed into the content store (never read whole into memory).
VideoSource = bytes | RemoteVideo

CONTINUE_JOB = "continue_job"  # the optional adapter method that continues a finished job


def can_continue(adapter: object) -> bool:
    return callable(getattr(adapter, CONTINUE_JOB, None))


@dataclass(frozen=True)
class VideoCall:
    model: str  # the provider's model name
    params: dict[str, Any]  # validated request parameters (prompt, width, height, duration, ...)
    options: dict[str, Any] = field(default_factory=dict)  # this provider's options only


@dataclass
class VideoProgress:
    """Where a provider job stands. `videos` is set once it completed (MP4 bytes or the
    provider's files, which the worker streams into the content store)."""

    state: str  # "running" | "completed" | "failed"
    provider_job_id: str | None = None
    videos: Sequence[VideoSource] = field(default_factory=list)
    error: str | None = None
    seconds: float | None = None  # output duration, when the provider reports it


class VideoAdapter(Protocol):
    """Optional, where the provider's API has them (the worker checks with `hasattr`):
    `async def continue_job(self, endpoint, previous_provider_job_id, call) -> VideoProgress`
    starts a job that continues (remixes/extends) one the provider finished (POST /videos
    `previous_job_id`); `async def cancel(self, endpoint, provider_job_id, call) -> None`
    stops a running one."""

    async def submit(self, endpoint: Endpoint, call: VideoCall) -> VideoProgress: ...

    async def poll(
        self, endpoint: Endpoint, provider_job_id: str, call: VideoCall
    ) -> VideoProgress: ...
