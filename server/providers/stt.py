"""What every speech-to-text adapter takes and returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from server.providers.endpoint import Endpoint


@dataclass(frozen=True)
class SttCall:
    """One transcription as sent to one provider (no session_id/user/trace: never forwarded)."""

    audio: bytes
    format: str
    filename: str
    model: str  # the provider's model name
    language: str | None = None
    prompt: str | None = None
    verbose: bool = False
    temperature: float | None = None
    timestamp_granularities: tuple[str, ...] = ("segment",)
    options: dict[str, Any] = field(default_factory=dict)  # this provider's options only


@dataclass
class Segment:
    id: int
    start: float
    end: float
    text: str
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Word:
    word: str
    start: float
    end: float
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Transcript:
    text: str
    language: str | None = None
    duration: float | None = None
    segments: list[Segment] = field(default_factory=list)
    words: list[Word] = field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0


class SttAdapter(Protocol):
    async def transcribe(self, endpoint: Endpoint, call: SttCall) -> Transcript: ...
