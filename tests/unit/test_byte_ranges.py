"""`byte_range`: the one Range header GET /videos/{id}/content honours (RFC 9110), and what it
ignores (answering the whole file, as a server may)."""

from __future__ import annotations

import pytest

from server.videos.content import byte_range


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("bytes=0-99", (0, 99)),
        ("bytes=100-", (100, 999)),
        ("bytes=-10", (990, 999)),
        ("bytes=-5000", (0, 999)),  # more than the file: all of it, as a range
        ("bytes=900-5000", (900, 999)),  # the end clamped to the file's
        (" bytes = 5-5 ", None),  # spaces around '=' are no range syntax
        ("bytes=5-5", (5, 5)),
        ("", None),
        ("items=0-1", None),
        ("bytes=0-1,5-6", None),  # several ranges: the whole file
        ("bytes=1000-", None),  # starts past the end
        ("bytes=5-1", None),
        ("bytes=-0", None),
        ("bytes=a-b", None),
        ("bytes=-", None),
        ("bytes=0x10-", None),
    ],
)
def test_one_range_or_the_whole_file(header: str, expected: tuple[int, int] | None) -> None:
    assert byte_range(header, 1000) == expected


def test_an_empty_file_has_no_range() -> None:
    assert byte_range("bytes=0-", 0) is None
