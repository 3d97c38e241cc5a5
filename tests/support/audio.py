"""Test audio: the shipped WAV fixtures, re-encoded with PyAV into every supported container."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import av

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"

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
    container_format, codec, mux_options, codec_options = ENCODINGS[fmt]
    out = io.BytesIO()
    with av.open(io.BytesIO(fixture(name))) as source:
        with av.open(out, mode="w", format=container_format, options=mux_options) as target:
            rate = 48000 if codec == "libopus" else 16000 if codec != "aac" else 44100
            stream = target.add_stream(codec, rate=rate, options=codec_options)
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
