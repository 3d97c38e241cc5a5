"""Reading a multipart/form-data request the way a provider would (for the fakes)."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from python_multipart.multipart import parse_options_header

from server.transcription.request import multipart_parts


@dataclass
class UploadedFile:
    filename: str
    content_type: str
    data: bytes


def read_form(request: httpx.Request) -> tuple[dict[str, list[str]], dict[str, UploadedFile]]:
    """The text fields (a repeated field keeps every value) and the files of the request;
    ValueError when it is not multipart/form-data."""
    kind, params = parse_options_header(request.headers.get("content-type", ""))
    if kind != b"multipart/form-data" or b"boundary" not in params:
        raise ValueError("not multipart/form-data")
    fields: dict[str, list[str]] = {}
    files: dict[str, UploadedFile] = {}
    for headers, data in multipart_parts(request.content, params[b"boundary"]):
        _, disposition = parse_options_header(headers["content-disposition"])
        name = disposition[b"name"].decode()
        if b"filename" in disposition:
            content_type = headers.get("content-type", b"application/octet-stream").decode()
            files[name] = UploadedFile(disposition[b"filename"].decode(), content_type, data)
        else:
            fields.setdefault(name, []).append(data.decode())
    return fields, files
