"""Schemathesis against the real stack, from OpenRouter's published schemas: GET /key,
POST /videos, POST /audio/transcriptions (JSON and multipart) and DELETE
/vault/secrets/{name} (a test-side fragment: that route is not in the published file), with
data that fits the schemas and data that does not, headers included.

Every answer must be the documented success or the documented error shape with a documented
status equal to error.code; no client-caused 500/502/503 and no hang. After the run the fuzz
key holds no credit and was charged only for the requests that succeeded."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import httpx
import hypothesis
import pytest
import requests
import schemathesis
from hypothesis import strategies as st
from schemathesis import GenerationMode

from testkit.admin import IssuedKey
from testkit.audio import b64, fixture
from tests.conftest import Stack
from tests.support.fuzz import (
    REQUEST_TIMEOUT,
    Answer,
    Findings,
    SuccessShape,
    answer_problems,
    charge_count,
    charged_micros,
    expect_charges,
    expect_no_hold_left,
    fuzz_settings,
    load_fragment,
    load_openrouter_schemas,
    server_errors_since,
    success_shape,
    wait_for_jobs,
)

# Models of the test catalog (testkit/catalog.py) that a fuzzed body may name instead
# of the random string the schema allows, so that fuzzed fields get past model lookup and
# reach validation, holds, providers and billing. All are served by healthy fakes, so a
# 500/502/503 on them is the gateway's fault.
VIDEO_MODELS = ("fakevideo/openai", "fakevideo/queue", "fakevideo/frames", "fakevideo/sized")
STT_MODELS = ("fake/ok", "fake/echo", "fake/no-verbose")
SEEDED_SECRETS = ("a", "key", "token_1", "x1")

OPERATIONS = [
    ("/key", "get", None, "GET-key"),
    ("/videos", "post", "application/json", "POST-videos"),
    ("/audio/transcriptions", "post", "application/json", "POST-transcriptions-json"),
    ("/audio/transcriptions", "post", "multipart/form-data", "POST-transcriptions-multipart"),
    ("/vault/secrets/{name}", "delete", None, "DELETE-vault-secret"),
]


def fuzz_spec(media_type: str | None = None) -> dict[str, Any]:
    """The published schemas plus the test-side fragment; with `media_type`, request bodies
    of that media type only (so one run fuzzes the JSON form, another the multipart form)."""
    spec = copy.deepcopy(load_openrouter_schemas())
    fragment = load_fragment("vault-delete.yaml")
    spec["paths"].update(fragment["paths"])
    extras = load_fragment("request-extras.yaml")["properties"]
    for name in ("VideoGenerationRequest", "STTRequest"):
        spec["components"]["schemas"][name]["properties"].update(copy.deepcopy(extras))
    if media_type is not None:
        for item in spec["paths"].values():
            for operation in item.values():
                content = (
                    operation.get("requestBody", {}).get("content")
                    if isinstance(operation, dict)
                    else None
                )
                if content and media_type in content:
                    for other in [t for t in content if t != media_type]:
                        del content[other]
    # The gateway authenticates with a bearer key it is given; schemathesis fuzzes
    # everything else, headers included (HTTP-Referer, X-OpenRouter-Title/-Categories).
    spec.pop("security", None)
    return spec


def callback_urls() -> st.SearchStrategy[str]:
    """callback_url values that can only ever point at loopback: the webhook sender connects
    to whatever a job names, and a fuzz run must not send traffic off this machine. Ports and
    schemes are fuzzed (out-of-range, zero, non-numeric, http)."""
    port = st.one_of(
        st.integers(min_value=-1, max_value=70_000).map(str),
        st.sampled_from(["", "0", "65535", "65536", "99999999999", "x", "443"]),
    )
    return st.builds(
        lambda scheme, host, p, path: f"{scheme}://{host}{':' + p if p is not None else ''}{path}",
        st.sampled_from(["https", "http", "HTTPS", "ftp"]),
        st.sampled_from(["127.0.0.1", "localhost", "[::1]"]),
        st.none() | port,
        st.sampled_from(["", "/", "/hook", "/a?b=c", "/%00"]),
    ) | st.text(alphabet=st.characters(exclude_characters=":/"), max_size=20)


# Members whose allowed values depend on the model's capabilities in the catalog: a steered
# request sometimes drops them, so that it gets past validation to holds, jobs and billing.
CAPABILITY_MEMBERS = (
    "resolution",
    "aspect_ratio",
    "size",
    "duration",
    "frame_images",
    "input_references",
    "creativity",
    "upscale_factor",
    "language",
    "response_format",
    "timestamp_granularities",
    "temperature",
    "timestamp_granularities[]",
)


def adjusted(case: Any, data: st.DataObject) -> None:
    """Steer half of the generated bodies at the test catalog (a known model, sometimes real
    audio, sometimes without the capability-bound members), and keep webhooks on loopback.
    Every other member stays as schemathesis generated it."""
    body = case.body
    if not isinstance(body, dict):
        return
    if "callback_url" in body:
        body["callback_url"] = data.draw(callback_urls(), label="callback_url")
    if not data.draw(st.booleans(), label="steer at the catalog"):
        return
    if case.path == "/videos":
        body["model"] = data.draw(st.sampled_from(VIDEO_MODELS), label="model")
        if not isinstance(body.get("prompt"), str) or not body["prompt"]:
            body["prompt"] = "a fuzzed prompt"
    else:
        body["model"] = data.draw(st.sampled_from(STT_MODELS), label="model")
        if data.draw(st.booleans(), label="real audio"):
            audio = fixture(data.draw(st.sampled_from(["hello", "door"]), label="fixture"))
            if case.media_type == "multipart/form-data":
                body["file"] = audio
            else:
                body["input_audio"] = {"data": b64(audio), "format": "wav"}
    if data.draw(st.booleans(), label="drop capability members"):
        for member in CAPABILITY_MEMBERS:
            body.pop(member, None)


def describe(case: Any, headers: dict[str, str]) -> str:
    body = case.body
    shown = repr(body)
    if len(shown) > 600:
        shown = shown[:600] + "..."
    fuzzed = {k: v for k, v in (case.headers or {}).items() if k != "Authorization"}
    return (
        f"{case.method} {case.formatted_path} query={case.query!r} headers={fuzzed!r} "
        f"media_type={case.media_type!r} body={shown}"
    )


def run_operation(
    base_url: str,
    issued: IssuedKey,
    path: str,
    method: str,
    media_type: str | None,
    mode: GenerationMode,
    max_examples: int,
    log: list[str],
) -> tuple[Findings, list[str], int]:
    """Fuzz one operation in one mode; the findings, the video job ids accepted, and how
    many requests succeeded (each may be charged)."""
    spec = fuzz_spec(media_type)
    schema = schemathesis.openapi.from_dict(spec)
    operation = schema[path][method.upper()]
    shape: SuccessShape = success_shape(spec, path, method)
    findings = Findings()
    jobs: list[str] = []
    successes = 0
    auth = {"Authorization": f"Bearer {issued.key}"}
    strategy = operation.as_strategy(generation_mode=mode, headers=auth)

    @fuzz_settings(max_examples)
    @hypothesis.given(case=strategy, data=st.data())
    def fuzz(case: Any, data: st.DataObject) -> None:
        nonlocal successes
        adjusted(case, data)
        request = describe(case, auth)
        mark = len(log)
        try:
            response = case.call(base_url=base_url, timeout=REQUEST_TIMEOUT)
        except requests.RequestException as exc:
            findings.record(Answer(request, None, {}, b"", repr(exc)), [f"no answer: {exc!r}"])
            return
        answer = Answer(request, response.status_code, response.headers, response.content)
        problems = answer_problems(answer, shape)
        findings.record(answer, problems, server_errors_since(log, mark) if problems else "")
        if response.status_code == shape.status:
            successes += 1
            if path == "/videos":
                jobs.append(response.json()["id"])

    fuzz()
    return findings, jobs, successes


@pytest.fixture
async def fuzz_key(stack: Stack, funded: IssuedKey) -> IssuedKey:
    """The funded key, in a workspace of the intern programme (else every vault route is a
    404 and DELETE never gets past the gate), with a few secrets to delete."""
    async with stack.admin.sessions() as session:
        workspace = await session.get(type(funded.workspace), funded.workspace.id)
        assert workspace is not None
        workspace.intern_programme = True
        session.add(workspace)
        await session.commit()
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT) as client:
        for name in SEEDED_SECRETS:
            response = await client.put(
                f"{stack.base_url}/vault/secrets/{name}",
                json={"value": "v", "hosts": ["example.com"]},
                headers=funded.headers,
            )
            assert response.status_code == 200, response.text
    return funded


# The schema fuzz runs on both backends: the requests it sends reach holds, the ledger and the
# vault tables, whose SQL differs per dialect. Example counts are per operation and mode.
EXAMPLES = {GenerationMode.POSITIVE: 15, GenerationMode.NEGATIVE: 15}


CASES = [
    pytest.param(
        path,
        method,
        media_type,
        mode,
        id=f"{name}-{mode.value}",
    )
    for path, method, media_type, name in OPERATIONS
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    # GET /key has nothing to negate: its only parameters are headers of type string, and
    # whatever arrives in a header is a string (schemathesis reports Unsatisfiable). Its
    # headers are fuzzed beyond the schema by tests/test_fuzz_headers.py.
    if not (path == "/key" and mode is GenerationMode.NEGATIVE)
]


@pytest.mark.both_backends
@pytest.mark.parametrize(("path", "method", "media_type", "mode"), CASES)
async def test_schema_fuzz(
    stack: Stack,
    fuzz_key: IssuedKey,
    path: str,
    method: str,
    media_type: str | None,
    mode: GenerationMode,
) -> None:
    charged_before = await charged_micros(stack.admin, fuzz_key)
    charges_before = await charge_count(stack.admin, fuzz_key)
    findings, jobs, successes = await asyncio.to_thread(
        run_operation,
        stack.base_url,
        fuzz_key,
        path,
        method,
        media_type,
        mode,
        EXAMPLES[mode],
        stack.gateway.output,
    )
    completed = await wait_for_jobs(stack, fuzz_key, jobs)
    await expect_no_hold_left(findings, stack.admin, fuzz_key)
    # One charge per 200 transcription or completed job.
    expected = completed if path == "/videos" else (successes if "audio" in path else 0)
    await expect_charges(findings, stack.admin, fuzz_key, charges_before, expected)
    if expected == 0:
        charged = await charged_micros(stack.admin, fuzz_key) - charged_before
        findings.expect(charged == 0, f"charged {charged} micro-USD for refusals only")
    findings.check(
        f"{stack.gateway.database_url.split(':')[0]} {method} {path} {media_type} {mode}"
    )
