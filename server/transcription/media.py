"""Audio the gateway is given: which container it really is, whether it decodes, and how
long it lasts.

One pass demuxes and decodes every packet (in a worker process: it is CPU-bound). The
duration billed is the end of the last audio packet — right for VBR MP3 without a Xing header
and for streamed WebM without a duration in its header, and free of codec priming — but only
once checked against what the audio really holds, the decoded sample count: packet
timestamps are the client's bytes, and a file remuxed with its timestamps divided by 1000
would otherwise be transcribed in full and billed a thousandth. Timestamps that contradict
the content are refused; audio that does not decode is refused, before anything is held.

A PCM WAV (the common upload) needs none of this: its samples are its bytes, so it is
measured in the server process from the sample bytes present (`probe_wav`, server/
transcription/wav.py), and never reaches a worker.

"""

from __future__ import annotations

import io
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any

from server.audio_decoding import OPEN_OPTIONS, audio_errors
from server.errors import GatewayError, bad_request
from server.transcription.wav import MAX_CHANNELS, read_wav

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
# How far the packets' timestamps may stray from the decoded content's length before the audio
# is refused: more than any codec's priming and padding, far less than any forgery worth
# making. At 8 kHz, the lowest common speech rate: an MP3 (FFmpeg's LAME) ends its packets
# 0.152 s past its decoded samples, an AAC in MP4 0.024 s short of them (`python -m bench.micro
# codec-priming`, 2026-11-28); AAC's priming is 1,024 samples (0.128 s) with FFmpeg's encoder
# and 2,112 (0.264 s) with Apple's (Apple's Technical Note TN2258).
TIMESTAMP_TOLERANCE = Fraction(1, 2)


@dataclass(frozen=True)
class ProbedAudio:
    format: str  # the client-facing name
    seconds: Decimal  # exact to the microsecond
    # What the provider must be sent instead of the input (a WAV rebuilt to hold exactly the
    # frames measured); None: the input as it is.
    audio: bytes | None = None


@dataclass(frozen=True)
class Refusal:
    """A probe's refusal, as a worker process hands it back (GatewayError does not pickle)."""

    status: int
    message: str
    metadata: dict[str, Any] | None


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


@dataclass(frozen=True)
class _Measured:
    demuxer: str
    timestamp_end: Fraction | None  # None: no packet carries a timestamp
    decoded: Fraction  # seconds of decoded samples


def _measure(data: bytes, param: str) -> _Measured:
    """Demux and decode the first audio stream to its end."""
    import av  # in the worker process only (server/audio_decoding.py)

    with av.open(io.BytesIO(data), mode="r", options=OPEN_OPTIONS) as container:
        streams = container.streams.audio
        if not streams:
            raise bad_request("The file contains no audio stream", param=param)
        stream = streams[0]
        if stream.codec_context is None:  # no decoder for what the header names
            raise bad_request("The audio could not be decoded", param=param)
        _check_channels(stream.codec_context.channels, param)
        stream.codec_context.thread_count = 1  # one core per worker process
        offset = Fraction(stream.start_time or 0) * Fraction(stream.time_base or 1)
        end: Fraction | None = None
        decoded = Fraction(0)
        for packet in container.demux(stream):
            if packet.pts is not None and packet.time_base is not None:
                finish = Fraction((packet.pts + (packet.duration or 0)) * packet.time_base)
                end = max(end or Fraction(0), finish - offset)
            for frame in packet.decode():
                if frame.sample_rate <= 0:
                    raise bad_request("The audio could not be decoded", param=param)
                _check_channels(frame.layout.nb_channels, param)  # a stream may change
                decoded += Fraction(frame.samples, frame.sample_rate)
        return _Measured(container.format.name, end, decoded)


def _check_channels(channels: int, param: str) -> None:
    """Refuse more channels than the gateway's own decoder downmixes (wav.MAX_CHANNELS)."""
    if channels > MAX_CHANNELS:
        raise bad_request(
            f"The audio has {channels} channels; at most {MAX_CHANNELS} are accepted",
            param=param,
        )


def _seconds(value: Fraction) -> Decimal:
    return (Decimal(value.numerator) / Decimal(value.denominator)).quantize(Decimal("0.000001"))


def probe(data: bytes, claimed_format: str | None, param: str) -> ProbedAudio:
    """Check the bytes are audio in a supported container that decodes to its end, and
    measure them. The claimed format must be a supported name; the container found in the
    bytes is what counts. Anything unreadable, or timed in contradiction with its content,
    is a 400 naming `param`. CPU-bound: call it through `probe_in_worker`."""
    if not data:
        raise bad_request("The audio is empty", param=param)
    try:
        measured = _measure(data, param)
    except audio_errors() as exc:
        raise bad_request("The audio could not be decoded", param=param) from exc
    fmt = _format_of(measured.demuxer, claimed_format)
    if fmt is None:
        raise bad_request(
            f"Unsupported audio container {measured.demuxer.split(',')[0]!r}; supported: "
            f"{', '.join(FORMATS)}",
            param=param,
        )
    if measured.decoded <= 0:
        raise bad_request("The audio has no duration", param=param)
    end = measured.timestamp_end
    if end is None:
        return ProbedAudio(format=fmt, seconds=_seconds(measured.decoded))
    if abs(end - measured.decoded) > TIMESTAMP_TOLERANCE:
        raise bad_request(
            f"The audio's timestamps ({float(end):.3f} s) contradict its content "
            f"({float(measured.decoded):.3f} s of samples)",
            param=param,
        )
    return ProbedAudio(format=fmt, seconds=_seconds(end))


def probe_wav(data: bytes, param: str) -> ProbedAudio | None:
    """A PCM WAV measured in the calling process from the sample bytes present (server/
    transcription/wav.py: no decoding, bounded work), or None when the decoder must decide
    (`probe` in a worker). A WAV without a whole frame is a 400 naming `param`."""
    wav = read_wav(data)
    if wav is None:
        return None
    if wav.frames <= 0:
        raise bad_request("The audio has no duration", param=param)
    return ProbedAudio(
        format="wav", seconds=wav.seconds, audio=None if wav.audio is data else wav.audio
    )


def refusal_of(exc: GatewayError) -> Refusal:
    """A GatewayError as a worker process hands it back."""
    return Refusal(exc.status, exc.message, dict(exc.metadata or {}) or None)


def probe_in_worker(data: bytes, claimed_format: str | None, param: str) -> ProbedAudio | Refusal:
    """`probe` as a worker process runs it: a refusal is returned, not raised."""
    try:
        return probe(data, claimed_format, param)
    except GatewayError as exc:
        return refusal_of(exc)
