"""Property-based fuzz of request header names and values through Envoy to the gRPC server:
legal token-character names that are not legal gRPC metadata keys (`X|Y`, `X!Y`), names
that mean something to gRPC or to the facade (`x-foo-bin`, `grpc-*`, `x-http-status`,
`x-error-body`, `te`), long values and non-ASCII bytes, on the key, vault, transcription and
video routes. Requests are written byte for byte on a socket (ordinary clients refuse or
rewrite some of these).

Every answer is the documented success or the documented error shape; on these routes with
healthy fake providers no 5xx is acceptable; no hang; no hold left and no charge beyond the
requests that succeeded."""

from __future__ import annotations

import asyncio
import json

import hypothesis
from hypothesis import strategies as st

from testkit.admin import IssuedKey
from testkit.audio import b64, fixture
from tests.conftest import Stack
from tests.support.fuzz import (
    Answer,
    Findings,
    answer_problems,
    charge_count,
    error_shape_problems,
    expect_charges,
    expect_no_hold_left,
    fuzz_settings,
    load_openrouter_schemas,
    raw_request,
    server_errors_since,
    success_shape,
    wait_for_jobs,
)

# The raw fuzzers run on SQLite only (the `stack` default): what they vary (header bytes,
# multipart framing, audio bytes) is parsed by Envoy and the server before any SQL runs, the
# same on both backends; the schemathesis fuzz (tests/test_fuzz_schema.py) covers both.

TCHAR = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
ALL_5XX = frozenset(range(500, 600))

# Names with a meaning to gRPC, HTTP/2, the transcoder or the facade's Lua filter.
MEANINGFUL_NAMES = [
    "X|Y", "X!Y", "x-foo-bin", "X-Foo-Bin", "grpc-timeout", "grpc-encoding",
    "grpc-accept-encoding", "grpc-status", "grpc-message", "grpc-status-details-bin",
    "grpc-previous-rpc-attempts", "grpc-tags-bin", "grpc-trace-bin", "te", "TE",
    "x-http-status", "x-error-body", "x-session-id", "x-envoy-upstream-rq-timeout-ms",
    "x-envoy-max-retries", "x-request-id", "retry-after", "user-agent", "content-type",
    "x-forwarded-for", "x-ratelimit-limit", "accept-encoding", ":authority", "a" * 300,
]  # fmt: skip

header_names = st.one_of(
    st.sampled_from(MEANINGFUL_NAMES),
    st.text(alphabet=TCHAR, min_size=1, max_size=40),
    st.builds(lambda a, b: f"{a}-{b}-bin", st.text(TCHAR, min_size=1, max_size=8), st.just("x")),
    st.builds(lambda rest: f"grpc-{rest}", st.text(TCHAR, min_size=0, max_size=12)),
).map(lambda name: name.encode("latin-1"))

# Field values: visible ASCII, obs-text (0x80-0xFF), UTF-8 of non-Latin-1 text, long ones,
# values gRPC would parse (timeouts, statuses, base64 for -bin). Never CR, LF or NUL: those
# break the framing itself (tests/test_errors_rest.py covers them).
header_values = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=64).map(
        str.encode
    ),
    st.binary(max_size=64).map(
        lambda b: bytes(c for c in b if c not in (0, 10, 13)).strip(b" \t")
    ),
    st.text(max_size=32).map(lambda t: t.replace("\r", "").replace("\n", "").encode()),
    st.sampled_from([b"1n", b"0S", b"99999999H", b"-1m", b"13", b"16", b"gzip", b"identity",
                     b"trailers", b"AAAA", b"!!!!", b"%00", b"\xff\xfe", b"\xc3\xa9",
                     b"\xe2\x82\xac", b"500", b"200", b'{"error":1}']),
    st.integers(min_value=1, max_value=70_000).map(lambda n: b"v" * n),
)  # fmt: skip

ROUTES = ["GET /key", "DELETE /vault/secrets/fuzz_secret", "POST /audio/transcriptions",
          "POST /videos"]  # fmt: skip


GRPC_METADATA_KEY_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789-_.")


def header_cause(name: bytes, value: bytes) -> str:
    """A failing header's class: the kinds of bug this fuzz tells apart."""
    lowered = name.decode("latin-1").lower()
    if lowered == "grpc-timeout":
        return "grpc-timeout header"
    if not set(lowered) <= GRPC_METADATA_KEY_CHARS:
        return "name with characters illegal in gRPC metadata keys"
    if lowered.endswith("-bin"):  # gRPC binary metadata (any value, even valid base64)
        return "-bin name"
    if lowered.startswith("grpc-"):
        return "grpc-* name"
    if len(value) > 8192:
        return "long value"
    if any(byte >= 0x80 for byte in value):
        return "non-ASCII value"
    return f"header {lowered[:40]}"


def route_request(route: str) -> tuple[str, str, bytes, list[tuple[bytes, bytes]]]:
    method, path = route.split(" ", 1)
    if path == "/audio/transcriptions":
        body = json.dumps(
            {"model": "fake/ok", "input_audio": {"data": b64(fixture()), "format": "wav"}}
        ).encode()
    elif path == "/videos":
        body = json.dumps({"model": "fakevideo/openai", "prompt": "x", "duration": 1}).encode()
    else:
        body = b""
    headers = [(b"Content-Type", b"application/json")] if body else []
    return method, path, body, headers


def run_header_fuzz(
    port: int, issued: IssuedKey, max_examples: int, log: list[str]
) -> tuple[Findings, int, list[str]]:
    spec = load_openrouter_schemas()
    shapes = {
        "GET /key": success_shape(spec, "/key", "get"),
        "POST /audio/transcriptions": success_shape(spec, "/audio/transcriptions", "post"),
        "POST /videos": success_shape(spec, "/videos", "post"),
    }
    findings = Findings()
    charged = 0
    jobs: list[str] = []
    auth = (b"Authorization", f"Bearer {issued.key}".encode())

    @fuzz_settings(max_examples)
    @hypothesis.given(
        route=st.sampled_from(ROUTES),
        extra=st.lists(st.tuples(header_names, header_values), min_size=1, max_size=4),
    )
    def fuzz(route: str, extra: list[tuple[bytes, bytes]]) -> None:
        method, path, body, headers = route_request(route)

        def send(extra: list[tuple[bytes, bytes]]) -> tuple[Answer, list[str]]:
            nonlocal charged
            answer = raw_request(port, method, f"/api/v1{path}", [auth, *headers, *extra], body)
            # Every request counts, the narrowing ones too: each success may be charged.
            if route == "POST /audio/transcriptions" and answer.status == 200:
                charged += 1
            if route == "POST /videos" and answer.status == 202:
                jobs.append(json.loads(answer.body)["id"])
            if route.startswith("DELETE"):
                # The secret never exists (and the workspace is outside the intern
                # programme): only refusals are right, in the error shape, none a 5xx.
                return answer, _vault_problems(answer)
            return answer, answer_problems(answer, shapes[route], faults=ALL_5XX)

        mark = len(log)
        answer, problems = send(extra)
        cause = ""
        if problems:  # narrow it down to one header, to tell distinct bugs apart
            culprits = [(n, v) for n, v in extra if len(extra) == 1 or send([(n, v)])[1]]
            cause = "; ".join(sorted({header_cause(n, v) for n, v in culprits})) or "combination"
            cause = f"{route}: {cause}"
            logged = server_errors_since(log, mark)
            if logged:
                cause += f"; server logged {logged}"
        findings.record(answer, problems, cause)

    fuzz()
    return findings, charged, jobs


def _vault_problems(answer: Answer) -> list[str]:
    if answer.status is None:
        return [f"no answer: {answer.transport_error}"]
    problems = error_shape_problems(answer.status, answer.headers, answer.body)
    if answer.status >= 500:
        problems.append(f"client-caused {answer.status}")
    return problems


async def test_header_fuzz(stack: Stack, funded: IssuedKey) -> None:
    charges_before = await charge_count(stack.admin, funded)
    findings, successes, jobs = await asyncio.to_thread(
        run_header_fuzz, stack.gateway.http_port, funded, 40, stack.gateway.output
    )
    completed = await wait_for_jobs(stack, funded, jobs)
    await expect_no_hold_left(findings, stack.admin, funded)
    await expect_charges(findings, stack.admin, funded, charges_before, successes + completed)
    findings.check("headers")
