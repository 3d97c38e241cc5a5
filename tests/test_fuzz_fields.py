"""Property-based fuzz of the JSON members the API reference documents (sections 2.1, 2.3,
2.5) one at a time, on an otherwise valid request, with values a JSON encoder would not write
but a client can send: NUL and lone surrogates (as \\u escapes), NaN/Infinity, numbers beyond
64 bits or beyond double range, wrong types, over-long strings, deep nesting, callback_url
ports out of range.

Every answer is the documented success or error shape; no client-caused 500/502/503; no
hang; no hold left; charged only for what succeeded. Runs on both backends: these values end
up in the generation record (session_id, user, trace), whose columns differ per dialect
(PostgreSQL text refuses NUL, for one)."""

from __future__ import annotations

import asyncio
import json
import re

import hypothesis
from hypothesis import strategies as st

from testkit.admin import IssuedKey
from testkit.audio import b64, fixture
from tests.conftest import Stack
from tests.support.fuzz import (
    Findings,
    answer_problems,
    charge_count,
    expect_charges,
    expect_no_hold_left,
    fuzz_settings,
    load_openrouter_schemas,
    raw_request,
    server_errors_since,
    success_shape,
    wait_for_jobs,
)

VIDEO_BASE = {"model": "fakevideo/openai", "prompt": "a fuzzed prompt", "duration": 1}
STT_BASE = {"model": "fake/ok", "input_audio": {"data": b64(fixture()), "format": "wav"}}

VIDEO_MEMBERS = ["session_id", "user", "trace", "seed", "duration", "callback_url", "prompt",
                 "size", "resolution", "upscale_factor", "creativity", "generate_audio",
                 "provider", "model"]  # fmt: skip
STT_MEMBERS = ["session_id", "user", "trace", "temperature", "language", "response_format",
               "timestamp_granularities", "provider", "model", "input_audio"]  # fmt: skip

# Raw JSON fragments: what a hand-written or non-Python client can put on the wire.
RAW_TOKENS = [
    "NaN", "Infinity", "-Infinity", "nan", "1e400", "-1e400", "1e-400", "18446744073709551616",
    "9223372036854775808", "-9223372036854775809", "340282366920938463463374607431768211456",
    "0", "-1", "1.5", "-0.0", "true", "false", "null", "[]", "{}", '""', '"\\u0000"',
    '"a\\u0000b"', '"\\ud800"', '"a\\udc00b"', '"\\udbff\\udfff"', '"\\u202e"', '"%00"',
    '{"trace_id": "\\u0000"}', '{"trace_id": NaN}', '{"\\u0000": 1}', '{"": ""}',
    '{"trace_id": 1e400}', '{"options": {"openai": {"x": "\\u0000"}}}',
    '{"options": {"": {}}}', '{"trace_id": "\\ud800", "span_name": [1]}',
]  # fmt: skip


LOOPBACK = re.compile(r"//(127\.0\.0\.1|localhost|\[::1\])[:/]")


def json_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=True)


callback_ports = st.one_of(
    st.integers(-1, 70_000).map(str), st.sampled_from(["", "0", "65536", "99999999999999", "x"])
)
raw_values = st.one_of(
    st.sampled_from(RAW_TOKENS),
    # any code point, lone surrogates included, \u-escaped: NUL, controls, U+D800...
    st.text(st.characters(exclude_categories=()), max_size=40).map(json_string),
    st.integers(min_value=-(2**80), max_value=2**80).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.integers(250, 300).map(lambda n: json_string("u" * n)),  # around the 256 bound
    st.integers(1, 70_000).map(lambda n: json_string("v" * n)),
    st.integers(1, 2_000).map(lambda n: "[" * n + "]" * n),  # deep nesting
    st.builds(
        lambda host, port: json_string(f"https://{host}:{port}/hook"),
        st.sampled_from(["127.0.0.1", "localhost", "[::1]"]),
        callback_ports,
    ),
    st.dictionaries(st.text(max_size=8), st.text(max_size=8) | st.integers(), max_size=3).map(
        json.dumps
    ),
)


def body_with(base: dict[str, object], member: str, raw: str) -> bytes:
    """`base` as JSON with `member` set to the raw fragment `raw` (first or last)."""
    rest = {k: v for k, v in base.items() if k != member}
    inner = json.dumps(rest)[1:-1]
    return ("{" + inner + (", " if inner else "") + json.dumps(member) + ": " + raw + "}").encode()


def run_field_fuzz(
    port: int, issued: IssuedKey, max_examples: int, log: list[str]
) -> tuple[Findings, int, list[str]]:
    spec = load_openrouter_schemas()
    shapes = {
        "/videos": success_shape(spec, "/videos", "post"),
        "/audio/transcriptions": success_shape(spec, "/audio/transcriptions", "post"),
    }
    findings = Findings()
    successes = 0
    jobs: list[str] = []
    auth = (b"Authorization", f"Bearer {issued.key}".encode())
    routes = st.one_of(
        st.tuples(st.just("/videos"), st.sampled_from(VIDEO_MEMBERS)),
        st.tuples(st.just("/audio/transcriptions"), st.sampled_from(STT_MEMBERS)),
    )

    @fuzz_settings(max_examples)
    @hypothesis.given(route=routes, raw=raw_values)
    # Each run also sends one representative of each hostile class, whatever is drawn.
    @hypothesis.example(route=("/videos", "session_id"), raw='"\\ud800"')
    @hypothesis.example(route=("/audio/transcriptions", "trace"), raw='{"trace_id": "\\udc00"}')
    @hypothesis.example(route=("/videos", "user"), raw='"a\\u0000b"')
    @hypothesis.example(route=("/audio/transcriptions", "session_id"), raw='"\\u0000"')
    @hypothesis.example(route=("/videos", "trace"), raw='{"trace_id": NaN}')
    @hypothesis.example(route=("/videos", "seed"), raw="18446744073709551616")
    @hypothesis.example(route=("/videos", "duration"), raw="1e400")
    @hypothesis.example(route=("/videos", "callback_url"), raw='"https://127.0.0.1:99999/h"')
    @hypothesis.example(route=("/audio/transcriptions", "provider"), raw="[" * 500 + "]" * 500)
    def fuzz(route: tuple[str, str], raw: str) -> None:
        nonlocal successes
        path, member = route
        base = VIDEO_BASE if path == "/videos" else STT_BASE
        if member == "callback_url" and "//" in raw and not LOOPBACK.search(raw):
            raw = json_string("https://127.0.0.1:1/hook")  # webhooks never leave this machine
        body = body_with(base, member, raw)
        mark = len(log)
        answer = raw_request(
            port, "POST", f"/api/v1{path}", [auth, (b"Content-Type", b"application/json")], body
        )
        problems = answer_problems(answer, shapes[path])
        cause = ""
        if problems:
            logged = server_errors_since(log, mark)
            cause = f"{path} {member}" + (f"; server logged {logged}" if logged else "")
        findings.record(answer, problems, cause)
        if answer.status == shapes[path].status:
            if path == "/videos":
                jobs.append(json.loads(answer.body)["id"])
            else:
                successes += 1

    fuzz()
    return findings, successes, jobs


async def test_json_member_fuzz(stack: Stack, funded: IssuedKey) -> None:
    charges_before = await charge_count(stack.admin, funded)
    findings, successes, jobs = await asyncio.to_thread(
        run_field_fuzz, stack.gateway.http_port, funded, 50, stack.gateway.output
    )
    completed = await wait_for_jobs(stack, funded, jobs)
    await expect_no_hold_left(findings, stack.admin, funded)
    await expect_charges(findings, stack.admin, funded, charges_before, successes + completed)
    findings.check(f"json members {stack.gateway.database_url.split(':')[0]}")
