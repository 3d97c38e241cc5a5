"""The in-process WAV reader (server/transcription/wav.py): money follows the sample bytes
the gateway measured, never what the client's header claims. Whatever the header says (RIFF
and data sizes, byte rate, block align, chunk order, chunks of any size before and after the
samples, a truncated file), the reader either leaves the file to the decoder (None), or
measures frames that are really in the input, and sends the provider a file that holds
exactly those frames — read back by two independent readers (the stdlib's `wave` and PyAV)."""

from __future__ import annotations

import io
import struct
import sys
import wave
from dataclasses import dataclass
from decimal import Decimal

import av
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from server.errors import GatewayError
from server.transcription.media import probe, probe_wav
from server.transcription.wav import (
    EXTENSIBLE,
    IEEE_FLOAT,
    MAX_CHUNKS,
    PCM,
    SUBFORMAT_TAIL,
    read_wav,
)
from testkit.audio import fixture, speech

U32 = st.integers(0, 0xFFFFFFFF)
SETTINGS = settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@dataclass(frozen=True)
class Layout:
    """A WAV as a writer (honest or not) lays it out."""

    tag: int
    channels: int
    rate: int
    bits: int
    samples: bytes  # the sample bytes actually written after the data chunk's header
    extensible: bool = False
    riff_size: int | None = None  # None: the true one
    data_size: int | None = None  # None: len(samples)
    byte_rate: int | None = None
    block_align: int | None = None
    before: tuple[tuple[bytes, bytes, int | None], ...] = ()  # (id, body, forged size)
    after: bytes = b""  # whatever follows the samples
    data_first: bool = False

    @property
    def frame(self) -> int:
        return self.channels * self.bits // 8

    def fmt_chunk(self) -> bytes:
        byte_rate = self.rate * self.frame if self.byte_rate is None else self.byte_rate
        align = self.frame if self.block_align is None else self.block_align
        tag = EXTENSIBLE if self.extensible else self.tag
        body = struct.pack("<HHIIHH", tag, self.channels, self.rate, byte_rate, align, self.bits)
        if self.extensible:
            body += struct.pack("<HHI", 22, self.bits, 0) + struct.pack("<H", self.tag)
            body += SUBFORMAT_TAIL
        return b"fmt " + struct.pack("<I", len(body)) + body

    def build(self) -> tuple[bytes, int]:
        """The file, and where its samples start."""
        extra = b""
        for chunk_id, body, size in self.before:
            declared = len(body) if size is None else size
            extra += chunk_id + struct.pack("<I", declared) + body + b"\x00" * (len(body) % 2)
        declared = len(self.samples) if self.data_size is None else self.data_size
        data_header = b"data" + struct.pack("<I", declared)
        fmt = self.fmt_chunk()
        if self.data_first:
            head = b"WAVE" + extra + data_header
            tail = self.samples + self.after + fmt
        else:
            head = b"WAVE" + fmt + extra + data_header
            tail = self.samples + self.after
        size = 4 + len(head) + len(tail) - 4 if self.riff_size is None else self.riff_size
        prefix = b"RIFF" + struct.pack("<I", size & 0xFFFFFFFF)
        return prefix + head + tail, len(prefix) + len(head)


FORMATS = st.sampled_from([(PCM, 8), (PCM, 16), (PCM, 24), (PCM, 32), (IEEE_FLOAT, 32)])
LIST_CHUNK = b"LIST\x04\x00\x00\x00INFO"
# Chunks before the samples (a second `fmt ` or `data` there: see the tests below).
CHUNK_IDS = st.sampled_from([b"LIST", b"JUNK", b"fact", b"bext", b"\x00\x00\x00\x00"])


@st.composite
def layouts(draw: st.DrawFn, forged: bool = True) -> Layout:
    tag, bits = draw(FORMATS)
    channels = draw(st.integers(1, 3))
    rate = draw(st.sampled_from([8000, 16000, 22050, 44100, 48000]))
    samples = draw(st.binary(min_size=0, max_size=600))
    if not forged:
        samples = samples[: len(samples) - len(samples) % (channels * bits // 8)]
        return Layout(tag, channels, rate, bits, samples, extensible=draw(st.booleans()))
    maybe = lambda strategy: draw(st.one_of(st.none(), strategy))  # noqa: E731
    before = draw(
        st.lists(
            st.tuples(CHUNK_IDS, st.binary(max_size=24), st.none() | U32),
            max_size=3,
        )
    )
    return Layout(
        tag,
        channels,
        rate,
        bits,
        samples,
        extensible=draw(st.booleans()),
        riff_size=maybe(U32),
        data_size=maybe(st.one_of(U32, st.sampled_from([0, 0xFFFFFFFF]), st.integers(0, 700))),
        byte_rate=maybe(U32),
        block_align=maybe(st.integers(0, 0xFFFF)),
        before=tuple(before),
        after=draw(
            st.one_of(st.just(b""), st.binary(max_size=64), st.just(b"LIST\x04\x00\x00\x00INFO"))
        ),
        data_first=draw(st.booleans()),
    )


def frames_in(audio: bytes) -> tuple[bytes, int, int, int]:
    """The provider's file read as a decoder that trusts its header would: (the samples of
    its data chunk, channels, rate, bytes per sample). Its header must be the 44-byte one."""
    riff, size, wave_id, fmt_id, fmt_size = struct.unpack_from("<4sI4s4sI", audio)
    assert (riff, wave_id, fmt_id, fmt_size) == (b"RIFF", b"WAVE", b"fmt ", 16)
    _tag, channels, rate, byte_rate, align, bits = struct.unpack_from("<HHIIHH", audio, 20)
    data_id, data_size = struct.unpack_from("<4sI", audio, 36)
    assert data_id == b"data"
    assert align == channels * bits // 8 and byte_rate == rate * align
    assert size == len(audio) - 8
    assert len(audio) - 44 - data_size in (0, data_size & 1)  # the samples run to the end
    return audio[44 : 44 + data_size], channels, rate, bits // 8


def pyav_samples(audio: bytes) -> int:
    with av.open(io.BytesIO(audio)) as container:
        return sum(frame.samples for frame in container.decode(audio=0))


@SETTINGS
@given(layout=layouts(), cut=st.one_of(st.none(), st.integers(0, 2000)))
@example(layout=Layout(PCM, 1, 16000, 16, b"\x01\x02" * 100, data_size=20), cut=None)
@example(layout=Layout(PCM, 1, 16000, 16, b"\x01\x02" * 100, data_size=0xFFFFFFFF), cut=None)
@example(layout=Layout(PCM, 1, 16000, 16, b"\x01\x02" * 100, data_size=10**9), cut=120)
@example(
    layout=Layout(PCM, 1, 16000, 16, b"\x01\x02" * 100, before=((b"LIST", b"", 0xFFFFFFF0),)),
    cut=None,
)
@example(layout=Layout(PCM, 2, 8000, 16, b"\x01\x02" * 100, data_first=True), cut=None)
def test_a_forged_header_never_moves_the_money(layout: Layout, cut: int | None) -> None:
    data, start = layout.build()
    if cut is not None:
        data = data[:cut]
    measured = read_wav(data)
    if measured is None:
        return  # the decoder in the worker process decides, as for any other file
    frame = layout.frame
    # Never more than the sample bytes the client sent.
    assert measured.frames * frame <= max(0, len(data) - start)
    assert measured.seconds == (Decimal(measured.frames) / Decimal(layout.rate)).quantize(
        Decimal("0.000001")
    )
    declared = len(layout.samples) if layout.data_size is None else layout.data_size
    if measured.audio is data:
        # Sent as it is only when its header says exactly what is there: nothing forged,
        # nothing cut, nothing after the samples.
        assert layout.riff_size in (None, len(data) - 8)
        assert layout.byte_rate in (None, layout.rate * frame)
        assert layout.block_align in (None, frame)
        assert not layout.data_first
        assert len(data) - start - declared in (0, declared % 2)
        assert declared == measured.frames * frame
    else:
        # Rebuilt: the provider's file holds exactly the measured frames, and they are the
        # client's own samples, from where its data chunk starts.
        samples, channels, rate, width = frames_in(measured.audio)
        assert (channels, rate, width) == (layout.channels, layout.rate, layout.bits // 8)
        assert len(samples) == measured.frames * frame
        assert samples == data[start : start + len(samples)]
    # A data size the bytes bear out is what is measured (streaming sizes read to the end).
    if declared not in (0, 0xFFFFFFFF) and start + declared <= len(data):
        assert measured.frames == declared // frame


@settings(max_examples=60, deadline=None, database=None)
@given(layout=layouts(), cut=st.one_of(st.none(), st.integers(0, 2000)))
def test_the_provider_decodes_exactly_what_was_measured(layout: Layout, cut: int | None) -> None:
    """An independent decoder (FFmpeg, through PyAV; the stdlib's reader for integer PCM)
    finds in the provider's file the very frames that were billed."""
    data, _ = layout.build()
    measured = read_wav(data if cut is None else data[:cut])
    if measured is None or measured.frames == 0:
        return
    assert pyav_samples(measured.audio) == measured.frames
    # The stdlib reads WAVE_FORMAT_EXTENSIBLE only from Python 3.12 on.
    extensible = measured.audio[20:22] == struct.pack("<H", EXTENSIBLE)
    if layout.tag == PCM and (sys.version_info >= (3, 12) or not extensible):
        with wave.open(io.BytesIO(measured.audio)) as reader:
            assert reader.getnframes() == measured.frames
            assert len(reader.readframes(measured.frames + 10)) == measured.frames * layout.frame


@SETTINGS
@given(layout=layouts(forged=False))
def test_an_honest_file_is_sent_as_it_is_and_billed_as_the_decoder_measures(
    layout: Layout,
) -> None:
    data, _ = layout.build()
    measured = read_wav(data)
    assert measured is not None
    assert measured.frames == len(layout.samples) // layout.frame
    if measured.frames:
        # the same figure as the decoder's probe
        assert probe(data, "wav", "file").seconds == measured.seconds
    assert measured.audio is data  # nothing to correct: no copy


@SETTINGS
@given(tail=st.binary(max_size=300), size=U32)
def test_any_bytes_after_a_riff_header_are_read_without_error(tail: bytes, size: int) -> None:
    data = b"RIFF" + struct.pack("<I", size) + b"WAVE" + tail
    measured = read_wav(data)
    if measured is not None:
        assert measured.frames * measured.channels * measured.bits // 8 <= len(data)


def test_the_walk_is_bounded() -> None:
    chunks = b"JUNK\x00\x00\x00\x00" * (MAX_CHUNKS + 10)
    data = Layout(PCM, 1, 16000, 16, b"\x00\x01" * 50).build()[0]
    many = data[:12] + chunks + data[12:]
    assert read_wav(many) is None  # left to the decoder
    assert read_wav(data) is not None


def test_fixtures_are_read_here_as_the_decoder_reads_them() -> None:
    for audio in (fixture(), fixture("door"), speech(2)):
        measured = probe_wav(audio, "file")
        assert measured is not None
        assert measured.seconds == probe(audio, "wav", "file").seconds
    assert probe_wav(fixture(), "file").audio is None  # canonical: sent as it is


def test_a_decoy_data_chunk_is_what_is_measured_and_all_the_provider_gets() -> None:
    """Two data chunks: the first is measured, and the provider gets only that one (a
    decoder that plays on into the second would otherwise hear unbilled audio)."""
    layout = Layout(
        PCM, 1, 16000, 16, b"\x05\x06" * 500, before=((b"data", b"\x01\x02" * 4, None),)
    )
    data, _ = layout.build()
    measured = read_wav(data)
    assert measured is not None and measured.frames == 4
    assert pyav_samples(measured.audio) == 4
    assert frames_in(measured.audio)[0] == b"\x01\x02" * 4


def test_two_format_chunks_are_left_to_the_decoder() -> None:
    layout = Layout(PCM, 1, 16000, 16, b"\x05\x06" * 50)
    data, _ = layout.build()
    fmt = layout.fmt_chunk()
    assert read_wav(data[:12] + fmt + data[12:]) is None


def test_other_codecs_in_a_wav_are_left_to_the_decoder() -> None:
    mulaw = Layout(7, 1, 8000, 8, b"\x00" * 80).build()[0]
    assert read_wav(mulaw) is None
    assert read_wav(b"RIFX" + fixture()[4:]) is None
    assert read_wav(fixture()[:30]) is None  # the format chunk cut short


def test_a_wav_without_a_whole_frame_is_refused_naming_the_field() -> None:
    empty = Layout(PCM, 2, 16000, 16, b"\x01\x02\x03").build()[0]
    with pytest.raises(GatewayError) as failure:
        probe_wav(empty, "input_audio")
    assert failure.value.status == 400
    assert failure.value.metadata == {"param": "input_audio"}
