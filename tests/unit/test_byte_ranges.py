"""`byte_range` (server/videos/ranges.py): the one Range header GET /videos/{id}/content
honours (RFC 9110 §14), what it ignores (answering the whole video, as a server may) and what
no byte of the video satisfies (416)."""

from __future__ import annotations

import pytest

from server.videos.ranges import ByteRange, Unsatisfiable, byte_range


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("bytes=0-99", (0, 100)),
        ("bytes=100-", (100, 1000)),
        ("bytes=-10", (990, 1000)),
        ("bytes=-5000", (0, 1000)),  # more than the video: all of it, as a range
        ("bytes=900-5000", (900, 1000)),  # the end cut to the video's
        ("bytes=5-5", (5, 6)),
        (None, None),
        ("", None),
        ("items=0-1", None),
        ("bytes=0-1,5-6", None),  # several ranges: the whole video
        ("bytes=5-1", None),  # inverted: ignored (§14.1.1)
        ("bytes=a-b", None),
        ("bytes=-", None),
        ("bytes=0x10-", None),
    ],
)
def test_one_range_or_the_whole_video(header: str | None, expected: tuple[int, int] | None) -> None:
    found = byte_range(header, 1000)
    assert (None if found is None else (found.start, found.end)) == expected


@pytest.mark.parametrize("header", ["bytes=1000-", "bytes=5000-6000", "bytes=-0"])
def test_a_range_no_byte_of_the_video_satisfies_is_refused(header: str) -> None:
    with pytest.raises(Unsatisfiable) as refused:
        byte_range(header, 1000)
    assert refused.value.size == 1000


def test_the_content_range_names_the_bytes_and_the_whole() -> None:
    assert ByteRange(0, 100, 1000).content_range == "bytes 0-99/1000"
