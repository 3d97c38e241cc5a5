"""Property-based fuzz of POST /audio/transcriptions bodies written byte for byte: multipart
framing (random field names including non-Latin-1 ones, filenames, boundaries, truncated
parts, missing closing boundaries, bare-LF line ends) and audio bytes (mutations of the WAV
fixtures in testkit/fixtures and of their re-encodings, in both request forms).

Every answer is the documented success or the documented error shape; no client-caused
500/502/503 (the fake provider behind `fake/ok` is healthy and does not decode audio, so the
gateway's own probing is what is exercised); no hang; no hold left; the key is charged for
exactly the answers that succeeded, the cost each reported, and never for more audio seconds
than the bytes hold."""

from __future__ import annotations

import asyncio
import io
import json
import struct
from decimal import Decimal
from typing import Any

import av
import hypothesis
import pytest
from hypothesis import strategies as st

from testkit.admin import IssuedKey
from testkit.audio import b64, encode, fixture
from tests.conftest import Stack
from tests.support.fuzz import (
    Findings,
    answer_problems,
    charged_micros,
    expect_no_hold_left,
    fuzz_settings,
    load_openrouter_schemas,
    raw_request,
    server_errors_since,
    success_shape,
)

# SQLite only (the `stack` default), as tests/test_fuzz_headers.py: framing and audio bytes
# are parsed before any SQL runs; holds and billing are still checked on every answer.

PATH = "/api/v1/audio/transcriptions"
MODEL = "fake/ok"
# Both fixtures last under 1.2 s; a mutated file holds at most two of them (concatenation).
MAX_AUDIO_SECONDS = 2.5
BCHARS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ'()+_,-./:=? "

field_names = st.one_of(
    st.sampled_from(["file", "model", "language", "prompt", "response_format", "temperature",
                     "timestamp_granularities[]", "session_id", "user", "", "FILE", "model "]),
    st.text(max_size=12),  # any code point: Latin-1 and beyond, quotes, backslashes
)  # fmt: skip
filenames = st.one_of(
    st.none(),
    st.sampled_from(["a.wav", "hello.wav", "a.mp3", "noext", "", ".wav", "a.WAV", "a.exe"]),
    st.text(max_size=16).map(lambda t: t + ".wav"),
)
boundaries = st.one_of(
    st.text(alphabet=BCHARS, min_size=1, max_size=70).filter(lambda b: not b.endswith(" ")),
    st.text(alphabet=BCHARS, min_size=71, max_size=120),
    st.sampled_from(["", "-", "--", "a b", "x;y", 'q"q', "é", "\u4e2d"]),
)


def quote(value: str) -> bytes:
    """A Content-Disposition parameter as browsers and python-multipart's clients write it:
    quoted, UTF-8, with quotes and backslashes escaped."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\r", "").replace("\n", "")
    return b'"' + escaped.encode("utf-8", "surrogatepass") + b'"'


@st.composite
def multipart_bodies(draw: st.DrawFn) -> tuple[bytes, bytes, str, bytes | None]:
    """(Content-Type value, body, what is unusual about it, the audio: None, the fixture)."""
    boundary = draw(boundaries, label="boundary")
    parts: list[tuple[str, str | None, bytes]] = []
    if draw(st.booleans(), label="a model part"):
        parts.append(("model", None, MODEL.encode()))
    if draw(st.booleans(), label="an audio part"):
        parts.append(("file", draw(filenames, label="file name"), fixture()))
    for _ in range(draw(st.integers(0, 4), label="extra parts")):
        data = draw(st.binary(max_size=32) | st.text(max_size=16).map(str.encode))
        parts.append((draw(field_names), draw(filenames), data))
    parts = draw(st.permutations(parts))
    newline = draw(st.sampled_from([b"\r\n", b"\r\n", b"\n"]), label="line end")
    delimiter = b"--" + boundary.encode("utf-8")
    chunks = []
    if draw(st.booleans(), label="preamble"):
        chunks.append(b"preamble junk" + newline)
    for name, filename, data in parts:
        disposition = b"Content-Disposition: form-data; name=" + quote(name)
        if filename is not None:
            disposition += b"; filename=" + quote(filename)
        head = [delimiter, disposition]
        if filename is not None:
            head.append(b"Content-Type: " + draw(st.sampled_from([b"audio/wav", b"x/y", b""])))
        chunks.append(newline.join(head) + newline + newline + data + newline)
    closing = draw(st.sampled_from([delimiter + b"--" + newline, delimiter + b"--", b""]))
    body = b"".join(chunks) + closing
    cut = draw(st.none() | st.integers(0, max(0, len(body) - 1)), label="truncate at")
    if cut is not None:
        body = body[:cut]
    quoted = draw(st.booleans(), label="quoted boundary")
    announced = draw(st.sampled_from(["same", "same", "other", "none"]), label="announced")
    if announced == "other":
        boundary = draw(boundaries)
    param = b""
    if announced != "none":
        value = boundary.encode("utf-8")
        param = b'; boundary="' + value + b'"' if quoted else b"; boundary=" + value
    content_type = b"multipart/form-data" + param
    names = [name for name, _, _ in parts] + [f for _, f, _ in parts if f]
    non_latin1 = any(not _latin1(text) for text in [*names, boundary])
    return content_type, body, "non-Latin-1 name, filename or boundary" * non_latin1, None


def _latin1(text: str) -> bool:
    try:
        text.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


# --- audio mutations ------------------------------------------------------------------------


def _wav_field(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    size = struct.calcsize(fmt)
    if len(data) < offset + size:
        return data
    return data[:offset] + struct.pack(fmt, value) + data[offset + size :]


@st.composite
def mutated_audio(draw: st.DrawFn, sources: dict[str, bytes]) -> tuple[str, bytes, str]:
    """(claimed format, bytes, the mutations applied)."""
    fmt = draw(st.sampled_from(sorted(sources)), label="source")
    data = bytearray(sources[fmt])
    applied = []
    for _ in range(draw(st.integers(1, 3), label="mutations")):
        kind = draw(
            st.sampled_from(
                ["flip", "truncate", "insert", "delete", "header", "wav-field", "concat", "empty"]
            )
        )
        applied.append(kind)
        if kind == "flip" and data:
            for _ in range(draw(st.integers(1, 16))):
                at = draw(st.integers(0, len(data) - 1))
                data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            data = data[: draw(st.integers(0, len(data)))]
        elif kind == "insert":
            at = draw(st.integers(0, len(data)))
            data[at:at] = draw(st.binary(min_size=1, max_size=64))
        elif kind == "delete" and data:
            at = draw(st.integers(0, len(data) - 1))
            del data[at : at + draw(st.integers(1, 256))]
        elif kind == "header":
            data[: min(len(data), 64)] = draw(st.binary(min_size=0, max_size=64))
        elif kind == "wav-field":
            # RIFF size, fmt channels, sample rate, byte rate, block align, bits, data size
            offset, pack = draw(
                st.sampled_from(
                    [
                        (4, "<I"),
                        (22, "<H"),
                        (24, "<I"),
                        (28, "<I"),
                        (32, "<H"),
                        (34, "<H"),
                        (40, "<I"),
                    ]
                )
            )
            value = draw(st.sampled_from([0, 1, 7, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF])
                         | st.integers(0, 0xFFFF))  # fmt: skip
            if pack == "<H":
                value &= 0xFFFF
            data = bytearray(_wav_field(bytes(data), offset, pack, value))
        elif kind == "concat":
            data += sources[draw(st.sampled_from(sorted(sources)))]
        elif kind == "empty":
            data = bytearray()
    claimed = draw(st.sampled_from([fmt.split("-")[0], "wav", "mp3", "flac"]), label="format")
    return claimed, bytes(data), "+".join(applied)


def decoded_seconds(data: bytes) -> float | None:
    """What the audio really holds, decoded to its end with PyAV (samples / rate); None when
    it does not decode cleanly to its end."""
    try:
        with av.open(io.BytesIO(data)) as container:
            if not container.streams.audio:
                return None
            samples = 0.0
            for frame in container.decode(audio=0):
                samples += frame.samples / frame.sample_rate
            return samples
    except (av.FFmpegError, ValueError, OSError, EOFError, ZeroDivisionError):
        return None


def billing_problems(usage: dict[str, Any], audio: bytes | None) -> list[str]:
    """Billed seconds against the audio: never more than the bytes can hold and, for audio
    that decodes cleanly, what it decodes to (item 7: not what its timestamps claim)."""
    seconds = float(usage.get("seconds") or 0)
    if seconds > MAX_AUDIO_SECONDS:
        return [f"billed {seconds} s of audio; the bytes hold at most {MAX_AUDIO_SECONDS} s"]
    decoded = decoded_seconds(audio) if audio is not None else None
    if decoded is not None and abs(seconds - decoded) > max(0.1, 0.05 * decoded):
        return [f"billed {seconds} s of audio that decodes to {decoded:.3f} s"]
    return []


def run_fuzz(
    port: int,
    issued: IssuedKey,
    max_examples: int,
    log: list[str],
    requests: st.SearchStrategy[tuple[bytes, bytes, str, bytes | None]],
    explicit: list[tuple[bytes, bytes, str, bytes | None]] | None = None,
) -> tuple[Findings, list[Decimal]]:
    """Send each generated (content type, body, note); the findings and the cost of every
    success."""
    shape = success_shape(load_openrouter_schemas(), "/audio/transcriptions", "post")
    findings = Findings()
    costs: list[Decimal] = []
    auth = (b"Authorization", f"Bearer {issued.key}".encode())

    def send(request: tuple[bytes, bytes, str, bytes | None]) -> None:
        content_type, body, note, audio = request
        mark = len(log)
        answer = raw_request(port, "POST", PATH, [auth, (b"Content-Type", content_type)], body)
        problems = answer_problems(answer, shape)
        if answer.status == 200 and not problems:
            usage = json.loads(answer.body).get("usage") or {}
            costs.append(Decimal(str(usage.get("cost", 0))))
            problems += billing_problems(usage, audio)
        cause = note
        if problems:
            logged = server_errors_since(log, mark)
            cause = f"{note}; server logged {logged}" if logged else note
        findings.record(answer, problems, cause)

    @fuzz_settings(max_examples)
    @hypothesis.given(request=requests)
    def fuzz(request: tuple[bytes, bytes, str, bytes | None]) -> None:
        send(request)

    for request in explicit or []:  # representatives sent on every run, whatever is drawn
        send(request)
    fuzz()
    return findings, costs


async def check_run(
    stack: Stack,
    issued: IssuedKey,
    requests: Any,
    max_examples: int,
    title: str,
    explicit: list[tuple[bytes, bytes, str, bytes | None]] | None = None,
) -> None:
    before = await charged_micros(stack.admin, issued)
    findings, costs = await asyncio.to_thread(
        run_fuzz,
        stack.gateway.http_port,
        issued,
        max_examples,
        stack.gateway.output,
        requests,
        explicit,
    )
    await expect_no_hold_left(findings, stack.admin, issued)
    # Charged exactly what the successes reported, to the micro-dollar (costs are rounded to
    # micros when reported); refusals charged nothing.
    charged = await charged_micros(stack.admin, issued) - before
    reported = sum(int(cost * 1_000_000) for cost in costs)
    findings.expect(
        abs(charged - reported) <= len(costs),
        f"charged {charged} micro-USD, the {len(costs)} successes reported {reported}",
    )
    findings.check(title)


def json_requests(
    sources: dict[str, bytes], model: str = MODEL
) -> st.SearchStrategy[tuple[bytes, bytes, str, bytes | None]]:
    return mutated_audio(sources).map(
        lambda audio: (
            b"application/json",
            json.dumps(
                {"model": model, "input_audio": {"data": b64(audio[1]), "format": audio[0]}}
            ).encode(),
            f"json audio {audio[2]}",
            audio[1],
        )
    )


def multipart_audio_requests(
    sources: dict[str, bytes],
) -> st.SearchStrategy[tuple[bytes, bytes, str, bytes | None]]:
    def build(audio: tuple[str, bytes, str]) -> tuple[bytes, bytes, str, bytes | None]:
        claimed, data, note = audio
        boundary = b"fuzzboundary"
        body = (
            b'--fuzzboundary\r\nContent-Disposition: form-data; name="model"\r\n\r\n'
            + MODEL.encode()
            + b'\r\n--fuzzboundary\r\nContent-Disposition: form-data; name="file"; '
            + b'filename="audio.'
            + claimed.encode()
            + b'"\r\nContent-Type: application/octet-stream\r\n\r\n'
            + data
            + b"\r\n--fuzzboundary--\r\n"
        )
        return b"multipart/form-data; boundary=" + boundary, body, f"multipart audio {note}", data

    return mutated_audio(sources).map(build)


@pytest.fixture(scope="module")
def audio_sources() -> dict[str, bytes]:
    """The WAV fixtures and two re-encodings (a compressed container with a header-declared
    duration, and a streamed one without)."""
    return {
        "wav": fixture("hello"),
        "wav-door": fixture("door"),
        "mp3": encode("mp3"),
        "flac": encode("flac"),
        "m4a": encode("m4a"),
        "webm": encode("webm"),
    }


async def test_multipart_framing_fuzz(stack: Stack, funded: IssuedKey) -> None:
    await check_run(stack, funded, multipart_bodies(), 60, "multipart framing")


async def test_audio_bytes_fuzz(
    stack: Stack, funded: IssuedKey, audio_sources: dict[str, bytes]
) -> None:
    requests = st.one_of(json_requests(audio_sources), multipart_audio_requests(audio_sources))
    await check_run(stack, funded, requests, 60, "audio bytes")


async def test_audio_bytes_fuzz_on_the_local_model(
    stack: Stack, funded: IssuedKey, audio_sources: dict[str, bytes]
) -> None:
    """The same mutations on the local model, which decodes what it is given: audio that
    passes the probe but does not decode must be the request's fault (400), not a 502. Few
    examples: every one runs the speech model."""
    model = "local/pocketsphinx-en"
    compressed = {k: v for k, v in audio_sources.items() if k in ("flac", "m4a", "mp3")}

    def request(fmt: str, data: bytes, note: str) -> tuple[bytes, bytes, str, bytes | None]:
        body = {"model": model, "input_audio": {"data": b64(data), "format": fmt}}
        return b"application/json", json.dumps(body).encode(), note, data

    flac, m4a = audio_sources["flac"], bytearray(audio_sources["m4a"])
    third = len(m4a) // 3
    m4a[third : third + 40] = bytes(b ^ 0xFF for b in m4a[third : third + 40])
    explicit = [
        request("flac", flac[: len(flac) // 2], "flac cut in half"),
        request("m4a", bytes(m4a), "m4a with 40 bytes inverted a third in"),
    ]
    await check_run(
        stack, funded, json_requests(compressed, model), 6, "audio bytes, local model", explicit
    )
