"""WAV read and measured in the server process: the common upload needs no decoder. PCM
samples are the bytes themselves, so measuring a WAV is reading its chunk headers (a bounded
walk over at most MAX_CHUNKS of them, constant work each) and counting the sample bytes that
are really there.

The header is the client's and is never trusted for money. What counts is the data actually
present: a data chunk claiming more bytes than the file holds is measured to the end of the
file, one claiming fewer is measured as claimed, and either way the provider is sent a file
holding exactly the frames measured. Unless the input already says exactly that of itself
(`fmt ` then `data` and nothing between them, the RIFF, data, block and byte-rate fields
consistent, the data running whole frames to the end of the file), it is rebuilt as a
canonical 44-byte-header WAV of those frames, so no decoder at the provider (one that trusts
the sizes, one that reads to the end, one that computes from the byte rate) hears more or
less than what was billed.

Anything this reader does not measure itself — another codec in a WAV (ADPCM, u-law), RF64,
big-endian RIFX, an unusual layout, no `fmt ` before the chunks run out — is left to the
decoder in the worker processes (server/transcription/media.py), as before."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from decimal import Decimal

MAX_CHUNKS = 64  # chunk headers read before the file is left to the decoder
PCM = 0x0001
IEEE_FLOAT = 0x0003
EXTENSIBLE = 0xFFFE
# WAVE_FORMAT_EXTENSIBLE's subformat GUID after its leading format code.
SUBFORMAT_TAIL = b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"
SAMPLE_BITS = {PCM: frozenset({8, 16, 24, 32}), IEEE_FLOAT: frozenset({32, 64})}
# The most channels an upload may have: every count up to it has a layout in FFmpeg's
# resampler, which downmixes to mono for the local model; some above it (9, 31, 32) have
# none. A WAV with more is left to the decoder, whose probe refuses it (media.py).
MAX_CHANNELS = 8
SAMPLE_RATES = range(1000, 768_001)  # Hz measured here; others go to the decoder
# A data size of 0 or 0xFFFFFFFF is a streaming writer's placeholder: the samples run to the
# end of the file (as FFmpeg reads it).
STREAMING_SIZES = (0, 0xFFFFFFFF)
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_FMT = struct.Struct("<HHIIHH")  # tag, channels, rate, byte rate, block align, bits
_CANONICAL = struct.Struct("<4sI4s4sIHHIIHH4sI")


@dataclass(frozen=True)
class Wav:
    tag: int  # PCM or IEEE_FLOAT (an extensible file's subformat)
    channels: int
    sample_rate: int
    bits: int
    frames: int  # whole frames present in the data the provider is sent
    audio: bytes  # what the provider is sent: the input itself, or the canonical rebuild

    @property
    def seconds(self) -> Decimal:
        """frames / sample rate, exact to the microsecond (rounded half-even)."""
        return micro_seconds(self.frames, self.sample_rate)


def micro_seconds(frames: int, rate: int) -> Decimal:
    """frames / rate in seconds, rounded half-even to the microsecond, as
    `(Decimal(frames) / Decimal(rate)).quantize(Decimal("0.000001"))` makes it — in integers
    (a Fraction and two Decimal operations cost microseconds per request). The same value:
    an exact quotient off a half-microsecond is off it by at least 1/(2 * rate) us, far more
    than the 28-digit division's error, so rounding twice never differs from once."""
    micros, rest = divmod(frames * 1_000_000, rate)
    if 2 * rest > rate or (2 * rest == rate and micros & 1):
        micros += 1
    return Decimal(micros).scaleb(-6)


@dataclass(frozen=True)
class _Format:
    tag: int
    channels: int
    sample_rate: int
    bits: int
    consistent: bool  # block align and byte rate agree with the fields above

    @property
    def frame_bytes(self) -> int:
        return self.channels * self.bits // 8


def _format(data: bytes, body: int, size: int) -> _Format | None:
    """The `fmt ` chunk at `body` (its declared `size`), when it is one measured here."""
    if size < _FMT.size or body + _FMT.size > len(data):
        return None
    tag, channels, rate, byte_rate, block_align, bits = _FMT.unpack_from(data, body)
    if tag == EXTENSIBLE:
        if size < 40 or body + 40 > len(data) or data[body + 26 : body + 40] != SUBFORMAT_TAIL:
            return None
        tag = _U16.unpack_from(data, body + 24)[0]
    if bits not in SAMPLE_BITS.get(tag, ()):
        return None
    if not 1 <= channels <= MAX_CHANNELS or rate not in SAMPLE_RATES:
        return None
    frame = channels * bits // 8
    consistent = block_align == frame and byte_rate == rate * frame
    return _Format(tag, channels, rate, bits, consistent)


def canonical_wav(
    tag: int, channels: int, sample_rate: int, bits: int, payload: bytes | memoryview
) -> bytes:
    """A WAV of exactly `payload` (whole frames): the 44-byte header and the samples."""
    frame = channels * bits // 8
    size = memoryview(payload).nbytes
    pad = b"\x00" if size % 2 else b""
    header = _CANONICAL.pack(
        b"RIFF",
        36 + size + len(pad),
        b"WAVE",
        b"fmt ",
        16,
        tag,
        channels,
        sample_rate,
        sample_rate * frame,
        frame,
        bits,
        b"data",
        size,
    )
    return b"".join((header, payload, pad))


def read_wav(data: bytes) -> Wav | None:
    """The WAV in `data` measured from the bytes present, or None when it is not a WAV this
    reader measures (the decoder decides). Never raises for any input."""
    n = len(data)
    if n < 12 or n > 0xFFFFFFFF or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return None
    fmt: _Format | None = None
    fmt_seen = False
    found: tuple[int, int] | None = None  # the data chunk: where its samples start, size
    data_first = False
    others = False  # a chunk other than `fmt ` before the samples
    position = 12
    for _ in range(MAX_CHUNKS):
        if position + 8 > n:
            break
        chunk_id = data[position : position + 4]
        size = _U32.unpack_from(data, position + 4)[0]
        body = position + 8
        if chunk_id == b"fmt ":
            if fmt_seen:
                return None  # two formats: not a layout measured here
            fmt_seen = True
            fmt = _format(data, body, size)
            if fmt is None:
                return None
            if found is not None:
                break  # data came first; its size was followed to get here
        elif chunk_id == b"data" and found is None:
            found = (body, size)
            data_first = not fmt_seen
            if fmt_seen or size in STREAMING_SIZES:
                break  # nothing after the samples is read
        elif found is None:
            others = True
        position = body + size + (size & 1)
    if fmt is None or found is None:
        return None
    start, declared = found
    available = n - start
    if declared in STREAMING_SIZES or declared > available:
        length = available  # measured to the end of what was sent
    else:
        length = declared
    frame = fmt.frame_bytes
    frames = length // frame
    whole = frames * frame
    exact = (
        not data_first
        # Chunks before the samples (LIST, JUNK, …) are dropped: decoders disagree on odd
        # ones (FFmpeg refuses an empty LIST), and a transcription needs none of them.
        and not others
        and fmt.consistent
        and declared == whole
        and available - declared in (0, declared & 1)  # nothing after them but a pad
        and _U32.unpack_from(data, 4)[0] == n - 8
    )
    audio = (
        data
        if exact
        else canonical_wav(
            fmt.tag,
            fmt.channels,
            fmt.sample_rate,
            fmt.bits,
            memoryview(data)[start : start + whole],
        )
    )
    return Wav(fmt.tag, fmt.channels, fmt.sample_rate, fmt.bits, frames, audio)
