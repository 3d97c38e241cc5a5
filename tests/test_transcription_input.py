"""POST /audio/transcriptions with what real clients and broken clients send: file names
and field names outside Latin-1, absurd boundaries, malformed multipart bodies."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from server.errors import GatewayError
from server.transcription.request import from_multipart
from testkit.admin import IssuedKey
from testkit.audio import fixture
from tests.conftest import Stack


async def _usage(stack: Stack, issued: IssuedKey) -> Any:
    async with httpx.AsyncClient() as client:
        return (await client.get(f"{stack.base_url}/key", headers=issued.headers)).json()["data"][
            "usage"
        ]


async def _post_raw(
    stack: Stack, issued: IssuedKey, body: bytes, boundary: bytes
) -> httpx.Response:
    async with httpx.AsyncClient(timeout=60) as client:
        return await client.post(
            f"{stack.base_url}/audio/transcriptions",
            content=body,
            headers={
                **issued.headers,
                "content-type": b"multipart/form-data; boundary=" + boundary,
            },
        )


def _part(boundary: bytes, disposition: bytes, data: bytes) -> bytes:
    return (
        b"--"
        + boundary
        + b"\r\nContent-Disposition: form-data; "
        + disposition
        + (b"\r\n\r\n" + data + b"\r\n")
    )


@pytest.mark.parametrize("name", ["音声メモ.wav", "дверь.wav", "voix née.wav"])
async def test_a_users_file_name_in_any_script_is_transcribed(
    stack: Stack, funded: IssuedKey, name: str
) -> None:
    """The unchanged `openai` SDK sends the name as UTF-8 in the part's header."""
    client = AsyncOpenAI(api_key=funded.key, base_url=stack.base_url)
    try:
        result = await client.audio.transcriptions.create(
            file=(name, fixture("door")), model="local/pocketsphinx-en"
        )
    finally:
        await client.close()
    assert result.text == "open the door"


async def test_a_field_name_outside_latin1_is_ignored_like_any_unknown_field(
    stack: Stack, funded: IssuedKey
) -> None:
    boundary = b"b0undary"
    body = (
        _part(boundary, b'name="model"', b"fake/ok")
        + _part(boundary, 'name="ключ"'.encode(), "значение".encode())
        + _part(boundary, 'name="file"; filename="запись.wav"'.encode(), fixture())
        + b"--"
        + boundary
        + b"--\r\n"
    )
    response = await _post_raw(stack, funded, body, boundary)
    assert response.status_code == 200, response.text
    assert response.json()["text"] == "fake transcript"


async def test_a_boundary_outside_ascii_is_400_in_the_documented_shape(
    stack: Stack, funded: IssuedKey
) -> None:
    """RFC 2046 boundaries are ASCII; the edge refuses other bytes in any header value."""
    boundary = "граница".encode()
    body = (
        _part(boundary, b'name="model"', b"fake/ok")
        + _part(boundary, b'name="file"; filename="a.wav"', fixture())
        + b"--"
        + boundary
        + b"--\r\n"
    )
    response = await _post_raw(stack, funded, body, boundary)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == 400
    assert await _usage(stack, funded) == 0


@pytest.mark.parametrize(
    ("boundary", "body", "param"),
    [
        ("a" * 300, None, "content-type"),  # the parser's limit is 256
        ("x" * 257, None, "content-type"),
        ("xyz", b"garbage\xff\xfe with no boundary at all", None),
        ("xyz", b'--xyz\r\nContent-Disposition: form-data; name="file"\r\nbroken', None),
    ],
)
async def test_malformed_multipart_is_400_in_the_documented_shape(
    stack: Stack, funded: IssuedKey, boundary: str, body: bytes | None, param: str | None
) -> None:
    if body is None:
        raw = boundary.encode()
        body = (
            _part(raw, b'name="model"', b"fake/ok")
            + _part(raw, b'name="file"; filename="a.wav"', fixture())
            + b"--"
            + raw
            + b"--\r\n"
        )
    before = len(stack.fake_stt.calls)
    response = await _post_raw(stack, funded, body, boundary.encode())
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == 400 and error["message"]
    if param is not None:
        assert error["metadata"] == {"param": param}
    assert len(stack.fake_stt.calls) == before
    assert await _usage(stack, funded) == 0


def test_the_parser_takes_utf8_names_and_boundaries_from_grpc_callers() -> None:
    """gRPC callers reach the parser without the edge's header checks: UTF-8 in the
    content type or the part headers is read, never a UnicodeEncodeError (a 500)."""
    boundary = "граница".encode()
    body = (
        _part(boundary, b'name="model"', b"fake/ok")
        + _part(boundary, 'name="ключ"'.encode(), b"x")
        + _part(boundary, 'name="file"; filename="音声メモ.wav"'.encode(), fixture())
        + b"--"
        + boundary
        + b"--\r\n"
    )
    parsed = from_multipart(body, "multipart/form-data; boundary=граница", None)
    assert parsed.filename == "音声メモ.wav" and parsed.claimed_format == "wav"
    with pytest.raises(GatewayError) as failure:
        from_multipart(body, "multipart/form-data; boundary=" + "b" * 300, None)
    assert failure.value.status == 400
    assert failure.value.metadata == {"param": "content-type"}
