"""`multipart_form` (server/providers/http.py) writes the bytes httpx's own multipart encoder
writes for the same fields, file and boundary — for any names, values and file names,
hostile ones included (quotes, backslashes, CR/LF, NUL, non-Latin-1) — and python-multipart
(the gateway's own parser) reads back what was put in."""

from __future__ import annotations

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st
from python_multipart.multipart import MultipartParser

from server.providers.http import multipart_form

BOUNDARY = b"0123456789abcdef0123456789abcdef"
_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)
_names = _text.filter(bool)


def httpx_body(
    fields: list[tuple[str, str]], filename: str, content: bytes, content_type: str
) -> bytes:
    data: dict[str, str | list[str]] = {}
    for name, value in fields:  # httpx takes a repeated field as a list, in place
        existing = data.get(name)
        data[name] = (
            value
            if existing is None
            else [*([existing] if isinstance(existing, str) else existing), value]
        )
    request = httpx.Request(
        "POST",
        "http://127.0.0.1/upload",
        data=data,
        files={"file": (filename, content, content_type)},
        headers={"Content-Type": f"multipart/form-data; boundary={BOUNDARY.decode()}"},
    )
    return request.read()


def parsed(body: bytes) -> list[tuple[bytes, bytes]]:
    parts: list[tuple[bytes, bytes]] = []
    headers: list[bytes] = []
    data: list[bytes] = []

    def on_header_value(chunk: bytes, start: int, end: int) -> None:
        headers.append(chunk[start:end])

    def on_part_data(chunk: bytes, start: int, end: int) -> None:
        data.append(chunk[start:end])

    def on_part_end() -> None:
        parts.append((b"".join(headers), b"".join(data)))
        headers.clear()
        data.clear()

    parser = MultipartParser(
        BOUNDARY,
        {
            "on_header_value": on_header_value,
            "on_part_data": on_part_data,
            "on_part_end": on_part_end,
        },
    )
    parser.write(body)
    parser.finalize()
    return parts


def _grouped(fields: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The order httpx writes fields in: a repeated name's values together, at its first."""
    order: dict[str, list[str]] = {}
    for name, value in fields:
        order.setdefault(name, []).append(value)
    return [(name, value) for name, values in order.items() for value in values]


@settings(max_examples=300, deadline=None)
@given(
    fields=st.lists(st.tuples(_names, _text), max_size=6),
    filename=_text,
    content=st.binary(max_size=300),
    content_type=st.sampled_from(["audio/wav", "audio/mpeg", "application/octet-stream"]),
)
def test_the_same_bytes_as_httpx(
    fields: list[tuple[str, str]], filename: str, content: bytes, content_type: str
) -> None:
    fields = [(n, v) for n, v in _grouped(fields) if n != "file"]
    media_type, body = multipart_form(fields, "file", filename, content, content_type, BOUNDARY)
    assert media_type == f"multipart/form-data; boundary={BOUNDARY.decode()}"
    assert body == httpx_body(fields, filename, content, content_type)
    parts = parsed(body)
    assert [data for _, data in parts] == [v.encode() for _, v in fields] + [content]


def test_a_hostile_file_name_stays_in_its_header() -> None:
    _, body = multipart_form(
        [("model", "whisper-1")],
        "file",
        'a"\r\nContent-Type: text/html\r\n\r\nx\\.wav',
        b"RIFF",
        "audio/wav",
        BOUNDARY,
    )
    assert b'filename="a%22%0D%0AContent-Type: text/html%0D%0A%0D%0Ax\\\\.wav"' in body
    assert [data for _, data in parsed(body)] == [b"whisper-1", b"RIFF"]


def test_a_fresh_boundary_each_time() -> None:
    first, _ = multipart_form([], "file", "a.wav", b"", "audio/wav")
    second, _ = multipart_form([], "file", "a.wav", b"", "audio/wav")
    assert first != second and first.startswith("multipart/form-data; boundary=")
