"""Test audio: the shipped WAV fixtures, re-encoded with PyAV into every supported container."""

from __future__ import annotations

import base64
import functools
import io
from collections.abc import Callable
from pathlib import Path

import av

FIXTURES = Path(__file__).resolve().parent / "fixtures"

# container format, codec, muxer options, codec options
ENCODINGS: dict[str, tuple[str, str, dict[str, str], dict[str, str]]] = {
    "mp3": ("mp3", "libmp3lame", {}, {"q": "5"}),  # VBR, no Xing header written to a stream
    "flac": ("flac", "flac", {}, {}),
    "ogg": ("ogg", "flac", {}, {}),  # FFmpeg here has no Vorbis encoder; FLAC-in-Ogg
    "opus": ("ogg", "libopus", {}, {}),
    "webm": ("webm", "libopus", {"live": "1"}, {}),  # streamed: no duration in the header
    "m4a": ("ipod", "aac", {}, {}),
}


def fixture(name: str = "hello") -> bytes:
    return (FIXTURES / f"{name}.wav").read_bytes()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def encode(fmt: str, name: str = "hello") -> bytes:
    """The fixture re-encoded into `fmt` (one of ENCODINGS)."""
    return encode_bytes(fmt, fixture(name))


def vbr_mp3_without_xing(seconds_silence: int = 2, seconds_noise: int = 2) -> bytes:
    """A VBR MP3 with no Xing/Info header: quiet frames first (tiny), then noise (large), so
    a duration estimated from the first frame's bitrate is far off."""
    import numpy as np

    rate = 16000
    rng = np.random.default_rng(7)
    samples = np.concatenate(
        [
            np.zeros(rate * seconds_silence, dtype=np.int16),
            rng.integers(-20000, 20000, rate * seconds_noise, dtype=np.int16),
        ]
    )
    out = io.BytesIO()
    with av.open(out, mode="w", format="mp3", options={"write_xing": "0"}) as target:
        stream = target.add_stream("libmp3lame", rate=rate, options={"q": "5"})
        stream.layout = "mono"
        for start in range(0, len(samples), 1152):
            chunk = samples[start : start + 1152].reshape(1, -1)
            frame = av.AudioFrame.from_ndarray(chunk, format="s16", layout="mono")
            frame.sample_rate = rate
            for packet in stream.encode(frame):
                target.mux(packet)
        for packet in stream.encode(None):
            target.mux(packet)
    return out.getvalue()


def speech(seconds: float, fmt: str = "wav") -> bytes:
    """About `seconds` of real speech ("open the door hello world ..."): the two fixtures
    and short pauses, looped, as a WAV or re-encoded into `fmt` (one of ENCODINGS)."""
    import numpy as np

    clips = []
    for name in ("door", "hello"):
        resampler = av.AudioResampler(format="s16", layout="mono", rate=16000)
        with av.open(io.BytesIO(fixture(name)), mode="r") as source:
            frames = [out for f in source.decode(audio=0) for out in resampler.resample(f)]
        frames += resampler.resample(None)
        clips.append(np.concatenate([f.to_ndarray().reshape(-1) for f in frames]))
    pause = np.zeros(4000, dtype=np.int16)  # a quarter second
    total = int(seconds * 16000)
    pieces: list[np.ndarray] = []
    length = 0
    while length < total:
        clip = clips[len(pieces) // 2 % 2] if len(pieces) % 2 == 0 else pause
        pieces.append(clip)
        length += len(clip)
    samples = np.concatenate(pieces)[:total].astype(np.int16)
    out = io.BytesIO()
    with av.open(out, mode="w", format="wav") as target:
        stream = target.add_stream("pcm_s16le", rate=16000)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = 16000
        for packet in stream.encode(frame):
            target.mux(packet)
        for packet in stream.encode(None):
            target.mux(packet)
    wav = out.getvalue()
    return wav if fmt == "wav" else encode_bytes(fmt, wav)


def encode_bytes(fmt: str, wav: bytes) -> bytes:
    """A WAV re-encoded into `fmt` (one of ENCODINGS)."""
    container_format, codec, mux_options, codec_options = ENCODINGS[fmt]
    out = io.BytesIO()
    with av.open(io.BytesIO(wav), mode="r") as source:
        with av.open(out, mode="w", format=container_format, options=mux_options) as target:
            rate = 48000 if codec == "libopus" else 16000 if codec != "aac" else 44100
            stream = target.add_stream(codec, rate=rate, options=codec_options)
            assert isinstance(stream, av.AudioStream), codec
            stream.layout = "mono"
            resampler = av.AudioResampler(format=stream.format.name, layout="mono", rate=rate)
            for frame in source.decode(audio=0):
                for converted in resampler.resample(frame):
                    for packet in stream.encode(converted):
                        target.mux(packet)
            for converted in resampler.resample(None):
                for packet in stream.encode(converted):
                    target.mux(packet)
            for packet in stream.encode(None):
                target.mux(packet)
    return out.getvalue()


def retimed(data: bytes, divide_by: float, container_format: str = "webm") -> bytes:
    """`data` remuxed (no re-encoding) with every packet's pts, dts and duration divided by
    `divide_by`: the samples are all there, the timestamps claim a fraction of them."""
    out = io.BytesIO()
    with av.open(io.BytesIO(data), mode="r") as source:
        with av.open(out, mode="w", format=container_format) as target:
            original = source.streams.audio[0]
            stream = target.add_stream_from_template(original)
            for packet in source.demux(original):
                if packet.dts is None:  # the demuxer's flush packet
                    continue
                packet.pts = int(packet.pts / divide_by) if packet.pts is not None else None
                packet.dts = int(packet.dts / divide_by)
                packet.duration = int((packet.duration or 0) / divide_by)
                packet.stream = stream
                target.mux(packet)
    return out.getvalue()


def adts(name: str = "hello") -> bytes:
    """The fixture as raw AAC in ADTS frames (the `aac` format): the M4A's packets remuxed."""
    out = io.BytesIO()
    with av.open(io.BytesIO(encode("m4a", name)), mode="r") as source:
        with av.open(out, mode="w", format="adts") as target:
            original = source.streams.audio[0]
            stream = target.add_stream_from_template(original)
            for packet in source.demux(original):
                if packet.dts is None:
                    continue
                packet.stream = stream
                target.mux(packet)
    return out.getvalue()


@functools.cache
def sample(fmt: str) -> bytes:
    """The `hello` fixture in any supported format (ENCODINGS, wav, aac)."""
    if fmt == "wav":
        return fixture()
    if fmt == "aac":
        return adts()
    return encode(fmt)


def overwritten(data: bytes, at: float, filler: bytes) -> bytes:
    """`data` with `filler` written over it at the fraction `at` of its length."""
    index = int(len(data) * at)
    return data[:index] + filler + data[index + len(filler) :]


# Damaged files that the container-level probe used to accept and only the decoder refuses
# (each was a 502 "Provider returned error" on the local model): (format, damage).
DAMAGED: dict[str, tuple[str, Callable[[bytes], bytes]]] = {
    "mp3": ("mp3", lambda d: overwritten(d, 0.5, bytes(range(7, 7 + 64 * 3, 3)))),
    "flac": ("flac", lambda d: d[: int(len(d) * 0.75)]),  # truncated mid-frame
    "m4a": ("m4a", lambda d: overwritten(d, 0.5, b"\xff" * 16)),
    "aac": ("aac", lambda d: d[: int(len(d) * 0.75)]),  # truncated mid-frame
}


def damaged(case: str) -> tuple[str, bytes]:
    fmt, damage = DAMAGED[case]
    return fmt, damage(sample(fmt))
