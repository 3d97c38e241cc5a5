"""The audio probe: the container is read from the bytes and the duration measured by demux."""

from __future__ import annotations

from decimal import Decimal

import pytest

from server.errors import GatewayError
from server.transcription.media import normalize_format, probe
from tests.support.audio import ENCODINGS, encode, fixture, vbr_mp3_without_xing


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
