"""The audio probe: the container is read from the bytes, every packet decoded, and the
duration measured by demux and checked against the decoded samples."""

from __future__ import annotations

import struct
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from server.errors import GatewayError
from server.providers.pocketsphinx_stt import pcm_16k_mono
from server.transcription.media import normalize_format, probe
from testkit.audio import (
    DAMAGED,
    ENCODINGS,
    damaged,
    encode,
    fixture,
    retimed,
    sample,
    speech,
    vbr_mp3_without_xing,
)

FORMATS = sorted({*ENCODINGS, "wav", "aac"})


@pytest.mark.parametrize("fmt", sorted(ENCODINGS))
def test_every_container_is_recognized_and_measured(fmt: str) -> None:
    probed = probe(encode(fmt), None, "file")
    expected = "ogg" if fmt == "opus" else fmt  # Opus in Ogg is an Ogg file
    assert probed.format == expected
    assert abs(probed.seconds - Decimal("1.075125")) < Decimal("0.01")


def test_claimed_name_is_kept_when_the_container_matches() -> None:
    assert probe(encode("opus"), "opus", "file").format == "opus"
    assert probe(fixture(), "mp3", "file").format == "wav"  # the bytes decide


def test_vbr_mp3_without_a_xing_header_is_measured_by_its_packets() -> None:
    assert abs(probe(vbr_mp3_without_xing(), "mp3", "file").seconds - Decimal("4.104")) < Decimal(
        "0.01"
    )


def test_an_mp3_behind_a_large_id3_tag_is_recognized() -> None:
    """The small probe still places an MP3 whose first 200 KB are a tag (cover art)."""
    payload = b"\x00" * 200_000
    size = len(payload) + 10  # one frame header + payload
    syncsafe = bytes(((size >> shift) & 0x7F) for shift in (21, 14, 7, 0))
    frame = b"PRIV" + len(payload).to_bytes(4, "big") + b"\x00\x00" + payload
    tag = b"ID3\x03\x00\x00" + syncsafe + frame
    probed = probe(tag + encode("mp3"), "mp3", "file")
    assert probed.format == "mp3"
    assert abs(probed.seconds - Decimal("1.08")) < Decimal("0.02")


@pytest.mark.parametrize("data", [b"", b"hello" * 1000, b"RIFF\x00\x00"])
def test_unreadable_audio_is_400_naming_the_field(data: bytes) -> None:
    with pytest.raises(GatewayError) as failure:
        probe(data, "wav", "input_audio")
    assert failure.value.status == 400
    assert failure.value.metadata == {"param": "input_audio"}


@pytest.mark.parametrize(
    ("name", "expected"),
    [("WAV", "wav"), (".mp3", "mp3"), ("mpeg", "mp3"), ("mp4", "m4a"), ("webm", "webm")],
)
def test_format_names(name: str, expected: str) -> None:
    assert normalize_format(name, "format") == expected


def test_unknown_format_names_are_refused() -> None:
    with pytest.raises(GatewayError) as failure:
        normalize_format("midi", "input_audio.format")
    assert failure.value.metadata == {"param": "input_audio.format"}


# --- timestamps are checked against the samples --------------------------------------------


@pytest.fixture(scope="module")
def webm_23s() -> bytes:
    return speech(23, "webm")


def test_a_long_recording_is_measured_by_its_timestamps(webm_23s: bytes) -> None:
    assert abs(probe(webm_23s, "webm", "file").seconds - Decimal(23)) < Decimal("0.01")


@pytest.mark.parametrize("divide_by", [1000, 40, 2, 1.5])
def test_timestamps_that_contradict_the_samples_are_refused(
    webm_23s: bytes, divide_by: float
) -> None:
    """Remuxed with every pts/dts/duration divided: all 23 s of samples are there (the old
    probe billed 0.016 s for /1000, 0.568 s for /40)."""
    forged = retimed(webm_23s, divide_by)
    with pytest.raises(GatewayError) as failure:
        probe(forged, "webm", "input_audio")
    assert failure.value.status == 400
    assert failure.value.metadata == {"param": "input_audio"}
    assert "timestamps" in failure.value.message


def test_timestamps_stretched_beyond_the_samples_are_refused(webm_23s: bytes) -> None:
    with pytest.raises(GatewayError) as failure:
        probe(retimed(webm_23s, 0.5), "webm", "file")
    assert failure.value.metadata == {"param": "file"}


# --- audio that does not decode is refused here, not by the provider -----------------------


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_damaged_audio_is_refused_naming_the_field(case: str) -> None:
    fmt, data = damaged(case)
    with pytest.raises(GatewayError) as failure:
        probe(data, fmt, "file")
    assert failure.value.status == 400
    assert failure.value.metadata == {"param": "file"}


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_decodes_in_the_probe_and_for_the_local_model(fmt: str) -> None:
    probed = probe(sample(fmt), None, "file")
    assert abs(probed.seconds - Decimal("1.075")) < Decimal("0.05")
    assert len(pcm_16k_mono(sample(fmt))) > 16000 * 2  # over a second of 16 kHz s16


@pytest.mark.parametrize("channels", [9, 31, 182])
def test_more_channels_than_the_decoder_downmixes_are_refused(channels: int) -> None:
    """Found by the test below: a WAV whose header says 9 or more channels passed the probe
    (measured in process up to 32, by the decoder above), and the local model's resampler
    then failed on it — FFmpeg has no layout for some of those counts."""
    data = bytearray(sample("wav"))
    struct.pack_into("<HIIH", data, 22, channels, 8000, 8000 * 2 * channels, 2 * channels)
    with pytest.raises(GatewayError) as failure:
        probe(bytes(data), "wav", "file")
    assert failure.value.status == 400
    assert failure.value.metadata == {"param": "file"}
    struct.pack_into("<HIIH", data, 22, 8, 8000, 8000 * 2 * 8, 2 * 8)
    probed = probe(bytes(data), "wav", "file")
    assert pcm_16k_mono(probed.audio or bytes(data))


@settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    fmt=st.sampled_from(FORMATS),
    cut=st.floats(0.05, 1.0),
    flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), max_size=12),
)
@example(fmt="m4a", cut=0.9453125, flips=[])  # found by this test: a stream with no decoder
@example(fmt="wav", cut=0.12, flips=[(0.0108, 182)])  # found by this test: 182 channels
def test_mutated_audio_is_refused_or_decodes_for_the_provider(
    fmt: str, cut: float, flips: list[tuple[float, int]]
) -> None:
    """Whatever the probe admits, the local model can decode: a damaged file is a 400
    naming the field before anything is held, never a provider error after."""
    data = bytearray(sample(fmt)[: max(1, int(len(sample(fmt)) * cut))])
    for where, value in flips:
        data[int(where * len(data))] = value
    try:
        probed = probe(bytes(data), fmt, "input_audio")
    except GatewayError as refused:
        assert refused.status == 400
        assert refused.metadata == {"param": "input_audio"}
        return
    assert Decimal(0) < probed.seconds < Decimal(30)
    assert pcm_16k_mono(bytes(data))
