"""What every fuzz test asserts about an answer of the REST facade, the fixed hypothesis
profile they run with, and the bookkeeping that proves a fuzz run left no hold behind and
charged nothing for what it refused."""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import hypothesis
import sqlalchemy as sa
import yaml
from jsonschema_rs import Draft202012Validator  # schemathesis's own validator

from server.db.models import CreditHold, LedgerEntry
from testkit.admin import Admin, IssuedKey
from testkit.eventually import eventually

if TYPE_CHECKING:
    from tests.conftest import Stack

# The statuses the API reference documents (section 7) and DESIGN.md's error model allows.
DOCUMENTED_STATUSES = frozenset(
    {400, 401, 402, 403, 404, 408, 409, 410, 413, 429, 500, 502, 503, 504, 524, 529}
)
# A 5xx the client can cause is a bug. 504/524/529 mean "a provider timed out or is
# overloaded", which a fuzzed request on a healthy fake provider must not produce either, but
# they are only failures when the model's providers are up: see `client_caused_5xx`.
SERVER_FAULTS = frozenset({500, 502, 503})
LEAKED_HEADER_PREFIXES = ("grpc-", "x-http-status", "x-error-body")
# Every fuzzed request is bounded: a hang is a failure, not a stuck CI run.
REQUEST_TIMEOUT = 10.0

REPO = Path(__file__).resolve().parents[2]
TEST_FRAGMENTS = REPO / "tests" / "openapi"
# OpenRouter's published schemas, kept in the repository (its header says where and when they
# were taken); the other files in tests/openapi add what that file lacks.
SCHEMAS_FILE = TEST_FRAGMENTS / "openrouter-api-schemas.yaml"

# One fixed profile for every fuzz test: bounded example counts (the whole fuzz set runs in
# about a minute on two cores), no per-example deadline (each example is a real HTTP request
# through Envoy to the gRPC server and the database), derandomized so a CI failure replays
# exactly; `print_blob` prints the failing example's reproduction blob all the same.
hypothesis.settings.register_profile(
    "gateway-fuzz",
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=list(hypothesis.HealthCheck),
    phases=(hypothesis.Phase.explicit, hypothesis.Phase.generate),
)


def fuzz_settings(max_examples: int) -> hypothesis.settings:
    """The gateway-fuzz profile with `max_examples` (scaled by GATEWAY_FUZZ_SCALE, an
    operator knob for a longer local run; CI keeps 1)."""
    scale = float(os.environ.get("GATEWAY_FUZZ_SCALE", "1"))
    return hypothesis.settings(
        hypothesis.settings.get_profile("gateway-fuzz"),
        max_examples=max(1, int(max_examples * scale)),
    )


def load_openrouter_schemas() -> dict[str, Any]:
    return yaml.safe_load(SCHEMAS_FILE.read_text())  # type: ignore[no-any-return]


def load_fragment(name: str) -> dict[str, Any]:
    return yaml.safe_load((TEST_FRAGMENTS / name).read_text())  # type: ignore[no-any-return]


@dataclass
class Answer:
    """One request and its answer, as a fuzz test records it."""

    request: str  # a readable reproduction: method, path, headers, body (truncated)
    status: int | None  # None: no answer within REQUEST_TIMEOUT, or the connection broke
    headers: Mapping[str, str]
    body: bytes
    transport_error: str | None = None

    def __post_init__(self) -> None:
        # schemathesis' Response gives lists of values; httpx and raw_http give strings.
        self.headers = {
            str(name).lower(): ", ".join(value) if isinstance(value, list) else str(value)
            for name, value in dict(self.headers).items()
        }

    def summary(self) -> str:
        if self.status is None:
            return f"{self.request}\n  -> no answer: {self.transport_error}"
        return f"{self.request}\n  -> {self.status} {self.body[:300]!r}"


def error_shape_problems(status: int, headers: Mapping[str, str], body: bytes) -> list[str]:
    """What is wrong with an error answer: the documented body
    {"error": {"code": N, "message": str, "metadata"?: object|null}} with status N, N among
    the documented statuses, JSON content type, no internal headers leaked."""
    problems = []
    lowered = {k.lower(): v for k, v in headers.items()}
    if status not in DOCUMENTED_STATUSES:
        problems.append(f"status {status} is not a documented status")
    if not lowered.get("content-type", "").startswith("application/json"):
        problems.append(f"content-type {lowered.get('content-type')!r} is not JSON")
    leaked = [name for name in lowered if name.startswith(LEAKED_HEADER_PREFIXES)]
    if leaked:
        problems.append(f"internal headers leaked: {leaked}")
    try:
        document = json.loads(body)
    except ValueError:
        return [*problems, "body is not JSON"]
    error = document.get("error") if isinstance(document, dict) else None
    if not isinstance(error, dict):
        return [*problems, "body has no error object"]
    if error.get("code") != status or isinstance(error.get("code"), bool):
        problems.append(f"error.code {error.get('code')!r} != HTTP status {status}")
    if not isinstance(error.get("message"), str) or not error["message"]:
        problems.append("error.message is not a non-empty string")
    if "metadata" in error and error["metadata"] is not None:
        if not isinstance(error["metadata"], dict):
            problems.append("error.metadata is not an object")
    extra = set(document) - {"error", "user_id", "service_metadata", "openrouter_metadata"}
    if extra:
        problems.append(f"unexpected top-level members {sorted(extra)}")
    return problems


class SuccessShape:
    """The documented success answer of one operation: its status and, for a JSON body, the
    JSON Schema of OpenRouter's published spec (or the test-side fragment)."""

    def __init__(self, status: int, schema: dict[str, Any] | None, components: dict[str, Any]):
        self.status = status
        self.validator = None
        if schema is not None:
            resolved = {**schema, "components": components}
            self.validator = Draft202012Validator(resolved)

    def problems(self, headers: Mapping[str, str], body: bytes) -> list[str]:
        lowered = {k.lower(): v for k, v in headers.items()}
        if self.validator is None:  # 204: no body
            return [] if not body else [f"{self.status} with a body {body[:100]!r}"]
        if not lowered.get("content-type", "").startswith("application/json"):
            return [f"success content-type {lowered.get('content-type')!r} is not JSON"]
        try:
            document = json.loads(body)
        except ValueError:
            return ["success body is not JSON"]
        problems = [
            f"success body does not match the schema: {error.message} at "
            f"{'/'.join(map(str, error.instance_path))}"
            for error in self.validator.iter_errors(document)
        ]
        if any(name.startswith("x-ratelimit-") for name in lowered):
            problems.append("a success carries X-RateLimit-* headers")
        return problems


def success_shape(spec: dict[str, Any], path: str, method: str) -> SuccessShape:
    responses = spec["paths"][path][method]["responses"]
    components = spec.get("components", {})
    for code, response in responses.items():
        if str(code).startswith("2"):
            content = (response or {}).get("content") or {}
            schema = (content.get("application/json") or {}).get("schema")
            return SuccessShape(int(code), schema, components)
    raise LookupError(f"{method} {path} documents no success")


def answer_problems(
    answer: Answer,
    shape: SuccessShape,
    *,
    providers_down: bool = False,
    faults: frozenset[int] = SERVER_FAULTS,
) -> list[str]:
    """Every way `answer` breaks the contract; empty when it keeps it."""
    if answer.status is None:
        return [f"no answer: {answer.transport_error}"]
    if answer.status == shape.status:
        return shape.problems(answer.headers, answer.body)
    if 200 <= answer.status < 300:
        return [f"success status {answer.status}, documented {shape.status}"]
    problems = error_shape_problems(answer.status, answer.headers, answer.body)
    if answer.status in faults and not providers_down:
        problems.append(f"client-caused {answer.status}")
    return problems


@dataclass
class Findings:
    """Problems found during a fuzz run, grouped so that one bug is reported once with the
    first request that showed it (and how many more did)."""

    by_signature: dict[str, list[Answer]] = field(default_factory=dict)
    requests: int = 0
    statuses: dict[int | None, int] = field(default_factory=dict)
    # (status, error message) -> count: what the fuzz reached, for the report
    outcomes: dict[tuple[int | None, str], int] = field(default_factory=dict)
    # broken invariants of the whole run (holds left, charges that do not add up)
    violations: list[str] = field(default_factory=list)

    def expect(self, holds: bool, violation: str) -> None:
        if not holds:
            self.violations.append(violation)

    def record(self, answer: Answer, problems: list[str], cause: str = "") -> None:
        """`cause`: what in the request the failure was narrowed down to, if known."""
        self.requests += 1
        self.statuses[answer.status] = self.statuses.get(answer.status, 0) + 1
        message = ""
        try:
            message = str(json.loads(answer.body)["error"]["message"])[:80]
        except (ValueError, KeyError, TypeError):
            message = answer.body[:80].decode("latin-1")
        outcome = (answer.status, message[:50])
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        if not problems:
            return
        signature = f"{answer.status} {message!r}: {'; '.join(problems)}"
        if cause:
            signature = f"[{cause}] {signature}"
        self.by_signature.setdefault(signature, []).append(answer)

    def report(self) -> str:
        lines = [f"! {violation}" for violation in self.violations]
        lines += [
            f"{len(self.by_signature)} distinct failure(s) in {self.requests} requests "
            f"(statuses {dict(sorted(self.statuses.items(), key=str))}):"
        ]
        common = sorted(self.outcomes.items(), key=lambda item: -item[1])[:12]
        lines.append("  outcomes: " + "; ".join(f"{s} {m!r} x{n}" for (s, m), n in common))
        for signature, answers in self.by_signature.items():
            lines.append(f"* {signature}  [{len(answers)}x]")
            lines.append("  " + answers[0].summary().replace("\n", "\n  "))
        return "\n".join(lines)

    def check(self, title: str = "") -> None:
        print(self.report())
        if os.environ.get("GATEWAY_FUZZ_REPORT"):  # collect the findings of a whole run
            with open(os.environ["GATEWAY_FUZZ_REPORT"], "a") as out:
                out.write(f"## {title}\n{self.report()}\n\n")
        assert not self.by_signature and not self.violations, self.report()


async def holds_of(admin: Admin, issued: IssuedKey) -> int:
    return await admin.count(CreditHold, CreditHold.key_hash == issued.hash)


async def charge_count(admin: Admin, issued: IssuedKey) -> int:
    return await admin.count(
        LedgerEntry, LedgerEntry.key_hash == issued.hash, LedgerEntry.kind == "charge"
    )


async def expect_no_hold_left(findings: Findings, admin: Admin, issued: IssuedKey) -> None:
    """No hold outlives its request (video jobs: once terminal), nor a budget lease its
    requests: a lease (server/limits/leases.py) goes back within a second of its last
    request's end, and only if every request on it settled or gave its amount back."""
    try:
        await admin.no_hold_left(CreditHold.key_hash == issued.hash)
    except AssertionError:
        holds = await holds_of(admin, issued)
        findings.expect(holds == 0, f"{holds} credit hold(s) left behind after the run")


async def expect_charges(
    findings: Findings, admin: Admin, issued: IssuedKey, before: int, successes: int
) -> None:
    """Only what succeeded is charged: one charge per success since `before` charges."""
    charged = await charge_count(admin, issued) - before
    findings.expect(charged == successes, f"{charged} charges for {successes} successes")


async def charged_micros(admin: Admin, issued: IssuedKey) -> int:
    async with admin.sessions() as session:
        statement = sa.select(sa.func.coalesce(sa.func.sum(LedgerEntry.amount_micros), 0)).where(
            LedgerEntry.key_hash == issued.hash, LedgerEntry.kind == "charge"
        )
        return int((await session.exec(statement)).scalar_one())


def raw_request(
    port: int,
    method: str,
    path: str,
    headers: list[tuple[bytes, bytes]],
    body: bytes = b"",
    *,
    content_length: int | None = None,
    timeout: float = REQUEST_TIMEOUT,
) -> Answer:
    """One HTTP/1.1 request written byte for byte (header names and values exactly as
    given, any bytes), `Connection: close`, and its answer read to EOF within `timeout`.
    `content_length` announces another length than the body's (a truncated body)."""
    length = len(body) if content_length is None else content_length
    head = [f"{method} {path} HTTP/1.1".encode(), b"Host: gateway"]
    head += [name + b": " + value for name, value in headers]
    if body or method in ("POST", "PUT"):
        head.append(b"Content-Length: " + str(length).encode())
    head.append(b"Connection: close")
    data = b"\r\n".join(head) + b"\r\n\r\n" + body
    shown = b"\r\n".join(head).decode("latin-1")
    request = f"{shown}\n  [body {len(body)} bytes] {body[:400]!r}"
    deadline = time.monotonic() + timeout
    raw = b""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(data)
            if content_length is not None and content_length > len(body):
                sock.shutdown(socket.SHUT_WR)  # the rest of the body never comes
            while not _complete(raw):
                sock.settimeout(max(0.05, deadline - time.monotonic()))
                chunk = sock.recv(65536)
                if not chunk:
                    break
                raw += chunk
    except (TimeoutError, OSError) as exc:
        if b"\r\n\r\n" not in raw:
            return Answer(request, None, {}, raw, f"{type(exc).__name__}: {exc}")
    if not raw:
        return Answer(request, None, {}, b"", "connection closed without an answer")
    head_bytes, _, payload = raw.partition(b"\r\n\r\n")
    lines = head_bytes.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    answer_headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        answer_headers[name.strip().lower()] = value.strip()
    if answer_headers.get("transfer-encoding", "").lower() == "chunked":
        payload = _dechunk(payload)
    return Answer(request, status, answer_headers, payload)


def _complete(raw: bytes) -> bool:
    """Whether `raw` holds a whole response (Envoy keeps a connection it answered itself
    open for a second before closing it: reading to EOF would wait for that)."""
    head, separator, payload = raw.partition(b"\r\n\r\n")
    if not separator:
        return False
    fields = {}
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        fields[name.strip().lower()] = value.strip().lower()
    if b"content-length" in fields:
        return len(payload) >= int(fields[b"content-length"])
    if fields.get(b"transfer-encoding") == b"chunked":
        return payload.endswith(b"0\r\n\r\n")
    return head.split(b" ")[1:2] in ([b"204"], [b"304"])


def _dechunk(payload: bytes) -> bytes:
    out = b""
    while payload:
        size_line, _, rest = payload.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out += rest[:size]
        payload = rest[size + 2 :]
    return out


async def wait_for_jobs(stack: Stack, issued: IssuedKey, jobs: list[str]) -> int:
    """Poll the accepted jobs to a terminal state; how many completed (each charged once)."""
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT) as client:

        async def ended(job: str) -> str | None:
            response = await client.get(f"{stack.base_url}/videos/{job}", headers=issued.headers)
            status = str(response.json()["status"])
            return status if status in ("completed", "failed", "cancelled", "expired") else None

        finals = [
            await eventually(lambda: ended(job), within=60, interval=0.2, message=f"job {job}")  # noqa: B023
            for job in jobs
        ]
    return sum(status in ("completed", "expired") for status in finals)


def server_errors_since(output: list[str], mark: int) -> str:
    """The unhandled exceptions the gateway logged after line `mark` of its output, each as
    its last traceback line with numbers blanked: what tells one 500 from another when the
    client only sees "Internal server error"."""
    found = []
    for line in output[mark:]:
        if '"level": "error"' not in line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        exception = str(record.get("exception") or record.get("message") or "")
        lines = exception.strip().splitlines() or [""]
        # The exception's own line, not a trailing "(Background on this error at: ...)".
        raised = [x for x in lines if re.match(r"^[\w.]+(Error|Exception|Warning)\b", x)]
        last = raised[-1] if raised else lines[-1]
        last = re.sub(r"(character '.*?'|characters) in position [\d-]+", "character(s)", last)
        last = re.sub(r"0x[0-9a-fA-F]+", "0x?", last)
        found.append(re.sub(r"\d+", "N", last)[:160])
    return " | ".join(sorted(set(found)))
