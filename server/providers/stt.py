"""What every speech-to-text adapter takes and returns."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from server.providers.endpoint import Endpoint
from server.providers.failures import INVALID_RESPONSE, ProviderFailure


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


@contextmanager
def reading_answer() -> Iterator[None]:
    """Around reading a provider's (successful) answer: a shape the adapter does not expect
    is an invalid response, not a crash."""
    try:
        yield
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise ProviderFailure(
            INVALID_RESPONSE, "Provider returned an invalid response", status=200
        ) from exc


# A pause this long between two words starts a new segment (providers without segments).
SEGMENT_PAUSE_SECONDS = 1.0
_SENTENCE_END = (".", "?", "!", "\u3002", "\uff1f", "\uff01")  # and CJK full stops


def seconds(value: Any) -> float:
    """A provider's time value as float seconds; anything but a number is invalid."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("not a number")
    return float(value)


def segments_from_words(words: list[Word]) -> list[Segment]:
    """Segments for a provider that returns only words: a segment ends after a word ending a
    sentence (. ? !) or before a pause of SEGMENT_PAUSE_SECONDS; its text is its words
    joined by spaces, its span from its first word's start to its last word's end."""
    groups: list[list[Word]] = []
    for word in words:
        if groups and (
            groups[-1][-1].word.endswith(_SENTENCE_END)
            or word.start - groups[-1][-1].end >= SEGMENT_PAUSE_SECONDS
        ):
            groups.append([word])
        elif groups:
            groups[-1].append(word)
        else:
            groups.append([word])
    return [
        Segment(id=i, start=g[0].start, end=g[-1].end, text=" ".join(w.word for w in g))
        for i, g in enumerate(groups)
    ]
