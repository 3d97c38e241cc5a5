"""Audio the gateway is given: which container it really is, and how long it lasts.

Duration is measured by demuxing (no decoding): the end of the last audio packet, which is
right for VBR MP3 without a Xing header and for streamed WebM without a duration in its
header, where the container's own estimate is wrong or missing."""

from __future__ import annotations

import io
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

import av

from server.errors import bad_request

# Client-facing format names -> the FFmpeg demuxers that read them.
FORMATS: dict[str, frozenset[str]] = {
    "wav": frozenset({"wav"}),
    "mp3": frozenset({"mp3"}),
    "flac": frozenset({"flac"}),
    "m4a": frozenset({"mov,mp4,m4a,3gp,3g2,mj2"}),
    "aac": frozenset({"aac", "mov,mp4,m4a,3gp,3g2,mj2"}),
    "ogg": frozenset({"ogg"}),
    "opus": frozenset({"ogg"}),
    "webm": frozenset({"matroska,webm"}),
}
ALIASES = {"mpeg": "mp3", "mpga": "mp3", "mp4": "m4a", "oga": "ogg", "x-wav": "wav"}
MAX_AUDIO_BYTES = 25 * 1000 * 1000
# Only the container and the packets' timing are needed, not codec parameters: a small probe
# and no stream analysis make opening several times cheaper, with the same results for every
# supported format (FFmpeg skips ID3 tags before probing; tests cover a 200 KB tag).
_OPEN_OPTIONS = {"probesize": "4096", "analyzeduration": "0"}


@dataclass(frozen=True)
class ProbedAudio:
    format: str  # the client-facing name
    seconds: Decimal  # exact to the microsecond


def normalize_format(name: str, param: str) -> str:
    """A supported format name, or a 400 naming `param`."""
    key = name.strip().lower().lstrip(".")
    key = ALIASES.get(key, key)
    if key not in FORMATS:
        raise bad_request(
            f"Unsupported audio format {name!r}; supported: {', '.join(FORMATS)}", param=param
        )
    return key


def _format_of(demuxer: str, claimed: str | None) -> str | None:
    """The client-facing name of what was actually found, preferring the claimed one."""
    if claimed is not None and demuxer in FORMATS[claimed]:
        return claimed
    return next((name for name, demuxers in FORMATS.items() if demuxer in demuxers), None)


def _demux_end(data: bytes, param: str) -> tuple[str, Fraction]:
    """The demuxer's name and the end time of the last audio packet, in seconds."""
    with av.open(io.BytesIO(data), mode="r", options=_OPEN_OPTIONS) as container:
        streams = container.streams.audio
        if not streams:
            raise bad_request("The file contains no audio stream", param=param)
        stream = streams[0]
        offset = Fraction(stream.start_time or 0) * Fraction(stream.time_base or 1)
        end = Fraction(0)
        for packet in container.demux(stream):
            if packet.pts is None or packet.time_base is None:
                continue
            finish = (packet.pts + (packet.duration or 0)) * packet.time_base
            end = max(end, Fraction(finish) - offset)
        return container.format.name, end


def probe(data: bytes, claimed_format: str | None, param: str) -> ProbedAudio:
    """Check the bytes are audio in a supported container and measure them. The claimed
    format must be a supported name; the container found in the bytes is what counts.
    Anything unreadable is a 400 naming `param`."""
    if not data:
        raise bad_request("The audio is empty", param=param)
    try:
        demuxer, end = _demux_end(data, param)
    except av.error.FFmpegError as exc:
        raise bad_request("The audio could not be decoded", param=param) from exc
    fmt = _format_of(demuxer, claimed_format)
    if fmt is None:
        raise bad_request(
            f"Unsupported audio container {demuxer.split(',')[0]!r}; supported: "
            f"{', '.join(FORMATS)}",
            param=param,
        )
    if end <= 0:
        raise bad_request("The audio has no duration", param=param)
    seconds = Decimal(end.numerator) / Decimal(end.denominator)
    return ProbedAudio(format=fmt, seconds=seconds.quantize(Decimal("0.000001")))
