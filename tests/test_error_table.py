"""There is one error table (server/errors.py): the server's gRPC codes and ErrorInfo reasons,
the Lua filter's answers to bare gRPC failures and Envoy's local replies all come from it,
and the error body keeps its documented shape."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from opentelemetry.trace import NoOpTracer

from facade.compose import compose_envoy_options
from facade.envoy_config import (
    LUA_FILTER,
    REQUEST_LUA,
    REST_ROUTES,
    STREAMING_LUA,
    EnvoyOptions,
    Upstream,
    lua_source,
    render,
)
from facade.launcher import EnvoyProcess
from server.config import EdgePolicy
from server.contract import DESCRIPTOR_SET, SERVICES, keys_pb2, keys_pb2_grpc
from server.errors import (
    ERROR_STATUS,
    ERROR_STATUSES,
    FALLBACK_STATUS,
    ErrorStatus,
    GatewayError,
    error_status_for_grpc_failure,
)
from server.observability.metrics import Metrics
from server.rest.api import RestApi
from server.rest.listener import RestListener
from server.services.rpc import RequestObserver, abort_with
from testkit.processes import refusing_port

# The error model (DESIGN.md, docs/rest-api.md): the only statuses an error may have.(416: a video
# content's Range outside the video).
DOCUMENTED = (400, 401, 402, 403, 404, 408, 409, 410, 413, 416, 429, 500, 502, 503, 504, 524, 529)
FAILURE_CODES = tuple(code for code in grpc.StatusCode if code is not grpc.StatusCode.OK)


def _local_reply_config() -> dict[str, Any]:
    config = render(compose_envoy_options())
    listener = config["static_resources"]["listeners"][0]
    manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
    return manager["local_reply_config"]  # type: ignore[no-any-return]


def _lua_table(source: str, name: str) -> dict[int, str]:
    """`NAME = { [key] = value, ... }` of the rendered Lua, as {key: value's source text}."""
    block = re.search(rf"^{name} = {{\n(.*?)\n}}\n", source, re.S | re.M)
    assert block is not None, f"{name} is not rendered"
    entries = re.findall(r"^  \[(\d+)\] = (.*),$", block.group(1), re.M)
    return {int(key): value for key, value in entries}


def _lua_failure(text: str) -> tuple[int, dict[str, Any]]:
    """`{ status, "json body" }` -> (status, body)."""
    match = re.fullmatch(r'\{ (\d+), (".*") \}', text)
    assert match is not None, text
    return int(match.group(1)), json.loads(json.loads(match.group(2)))


def test_the_table_has_every_documented_status_once() -> None:
    assert tuple(entry.status for entry in ERROR_STATUSES) == DOCUMENTED
    assert set(ERROR_STATUS) == set(DOCUMENTED)
    for entry in ERROR_STATUSES:
        assert entry.message and entry.reason.isupper()
    with pytest.raises(ValueError):
        GatewayError(501, "not documented")


def test_every_grpc_failure_code_has_one_status() -> None:
    named = [code for entry in ERROR_STATUSES for code in entry.grpc_failures]
    assert sorted(named, key=lambda c: c.value[0]) == list(FAILURE_CODES)


def test_the_lua_tables_are_rendered_from_the_table() -> None:
    source = lua_source(compose_envoy_options())
    failures = _lua_table(source, "GRPC_FAILURES")
    assert set(failures) == {code.value[0] for code in FAILURE_CODES}
    for code in FAILURE_CODES:
        entry = error_status_for_grpc_failure(code)
        assert _lua_failure(failures[code.value[0]]) == (
            entry.status,
            {"error": {"code": entry.status, "message": entry.failure_message}},
        )
    unexpected = re.search(r"^UNEXPECTED_FAILURE = (.*)$", source, re.M)
    assert unexpected is not None
    internal = ERROR_STATUS[FALLBACK_STATUS]
    assert _lua_failure(unexpected.group(1)) == (
        internal.status,
        {"error": {"code": internal.status, "message": internal.message}},
    )
    messages = _lua_table(source, "ERROR_MESSAGES")
    assert {status: json.loads(text) for status, text in messages.items()} == {
        entry.status: entry.message for entry in ERROR_STATUSES
    }


def test_nothing_of_the_table_is_hand_written_in_lua() -> None:
    hand_written = LUA_FILTER.read_text() + STREAMING_LUA.read_text() + REQUEST_LUA.read_text()
    for entry in ERROR_STATUSES:
        for message in (entry.message, entry.failure_message):
            assert f'"{message}"' not in hand_written, message
    for name in ("GRPC_FAILURES", "UNEXPECTED_FAILURE", "ERROR_MESSAGES"):
        assert re.search(rf"^\s*(local\s+)?{name}\s*=", hand_written, re.M) is None, name


def test_envoy_local_replies_are_rendered_from_the_table() -> None:
    config = _local_reply_config()
    mappers = config["mappers"]
    # The first only marks the transcoder's 400s for the Lua filter; every other one is a row
    # of the table.
    assert "body" not in mappers[0] and "status_code" not in mappers[0]
    rows = [(entry, reply) for entry in ERROR_STATUSES for reply in entry.envoy_replies]
    assert len(mappers[1:]) == len(rows)
    for mapper, (entry, reply) in zip(mappers[1:], rows, strict=True):
        filter_text = json.dumps(mapper["filter"])
        if reply.keeps_lua_text:
            assert f"response.code == {reply.code} " in filter_text
            assert "lua_response" in filter_text
        else:
            assert (
                mapper["filter"]["status_code_filter"]["comparison"]["value"]["default_value"]
                == reply.code
            )
        assert mapper.get("status_code", reply.code) == entry.status
        assert mapper["body"] == {"inline_string": reply.message or entry.message}
        if reply.metadata is not None:
            override = mapper["body_format_override"]["json_format"]["error"]
            assert override["metadata"] == dict(reply.metadata)
    answered = {reply.code for _, reply in rows}
    # Envoy's own statuses that are not documented are answered with documented ones.
    assert {426, 431, 501, 504} <= answered
    assert all(mapper.get("status_code", 0) in (0, *DOCUMENTED) for mapper in mappers)


def test_the_error_body_shape_is_unchanged() -> None:
    plain = GatewayError(404, "No such key")
    assert plain.body_json() == '{"error":{"code":404,"message":"No such key"}}'
    rich = GatewayError(402, "Insufficient credits", {"limit_source": "openrouter_credits"})
    assert rich.body_json() == (
        '{"error":{"code":402,"message":"Insufficient credits",'
        '"metadata":{"limit_source":"openrouter_credits"}}}'
    )
    assert _local_reply_config()["body_format"] == {
        "json_format": {"error": {"code": "%RESPONSE_CODE%", "message": "%LOCAL_REPLY_BODY%"}},
        "content_type": "application/json",
    }


class _FailingKeys(keys_pb2_grpc.KeysServicer):
    """GET /api/v1/key fails as x-session-id says: `gateway-N` with the gateway error of status
    N (the table's default message), `grpc-N` with a bare gRPC code N (as the gRPC stack
    itself would, with a message that must not reach REST clients)."""

    async def GetCurrentKey(
        self, request: object, context: grpc.aio.ServicerContext
    ) -> keys_pb2.CurrentKeyResponse:
        wanted = dict(context.invocation_metadata() or ())["x-session-id"]
        kind, number = str(wanted).split("-")
        if kind == "gateway":
            status = int(number)
            await abort_with(
                context,
                GatewayError(status, ERROR_STATUS[status].message, retry_after_seconds=7),
            )
        await context.abort(grpc.StatusCode(_code(int(number))), "internal detail")
        raise AssertionError("unreachable")


def _code(number: int) -> tuple[int, str]:
    return next(code.value for code in grpc.StatusCode if code.value[0] == number)


@pytest.fixture
async def failing_server() -> AsyncIterator[int]:
    server = grpc.aio.server()
    keys_pb2_grpc.add_KeysServicer_to_server(_FailingKeys(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield port
    await server.stop(grace=None)


async def test_grpc_callers_get_the_table_code_and_rich_status(failing_server: int) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{failing_server}") as channel:
        stub = keys_pb2_grpc.KeysStub(channel)
        for entry in ERROR_STATUSES:
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                await stub.GetCurrentKey(
                    keys_pb2.GetCurrentKeyRequest(),
                    metadata=(("x-session-id", f"gateway-{entry.status}"),),
                )
            assert failure.value.code() == entry.grpc_code
            assert failure.value.details() == entry.message
            status = rpc_status.from_call(failure.value)  # type: ignore[arg-type]
            assert status is not None and status.message == entry.message
            info = error_details_pb2.ErrorInfo()
            retry = error_details_pb2.RetryInfo()
            assert status.details[0].Unpack(info) and status.details[1].Unpack(retry)
            assert info.reason == entry.reason and info.domain == "gateway"
            assert dict(info.metadata) == {"http_status": str(entry.status)}
            assert retry.retry_delay.seconds == 7


@contextlib.asynccontextmanager
async def _envoy_in_front(
    tmp_path: Path, upstream: Upstream, rest_routes: tuple[tuple[str, str], ...] = REST_ROUTES
) -> AsyncIterator[str]:
    """The facade's Envoy in front of `upstream`; its base URL."""
    envoy = EnvoyProcess(
        EnvoyOptions(
            descriptor_path=str(DESCRIPTOR_SET),
            services=SERVICES,
            upstreams=(upstream,),
            listen_port=0,  # Envoy binds a free port (envoy.listen_port)
            edge=EdgePolicy(),
            rest_routes=rest_routes,
        ),
        tmp_path / "envoy",
        concurrency=1,
    )
    await envoy.start()
    try:
        yield f"http://127.0.0.1:{envoy.listen_port}"
    finally:
        await envoy.stop()


def _assert_the_table_answer(response: httpx.Response, entry: ErrorStatus) -> None:
    """A gateway error of the table (raised with Retry-After 7) as a REST client sees it."""
    assert response.status_code == entry.status, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.headers["retry-after"] == "7"
    assert response.json() == {"error": {"code": entry.status, "message": entry.message}}
    assert not any(h.startswith(("grpc-", "x-http-", "x-error-")) for h in response.headers)


async def test_rest_round_trip_gives_the_table_status_and_message(
    tmp_path: Path, failing_server: int
) -> None:
    # The facade's gRPC path: GET /key transcoded, as every route was before the REST listener.
    upstream = Upstream("127.0.0.1", failing_server, refusing_port())
    async with _envoy_in_front(tmp_path, upstream, rest_routes=()) as base:
        async with httpx.AsyncClient(timeout=10) as client:

            async def get(path: str, session: str = "") -> httpx.Response:
                return await client.get(f"{base}{path}", headers={"x-session-id": session})

            for entry in ERROR_STATUSES:  # a gateway error of each status
                _assert_the_table_answer(await get("/api/v1/key", f"gateway-{entry.status}"), entry)
            for code in FAILURE_CODES:  # a failure of the gRPC stack, with each code
                response = await get("/api/v1/key", f"grpc-{code.value[0]}")
                entry = error_status_for_grpc_failure(code)
                assert response.status_code == entry.status, (code, response.text)
                assert response.json() == {
                    "error": {"code": entry.status, "message": entry.failure_message}
                }
            # Envoy's own reply: an unknown path
            response = await get("/api/v1/no-such-path")
            assert response.status_code == 404
            assert response.json() == {"error": {"code": 404, "message": ERROR_STATUS[404].message}}


class _FailingCurrentKey:
    """KeysService.current_key failing as the x-session-id header says (`gateway-N`: the
    gateway error of status N; `crash`: an exception that is no gateway error)."""

    async def current_key(self, metadata: Sequence[tuple[str, str | bytes]]) -> None:
        wanted = str(dict(metadata)["x-session-id"])
        if wanted == "crash":
            raise RuntimeError("internal detail")
        status = int(wanted.removeprefix("gateway-"))
        raise GatewayError(status, ERROR_STATUS[status].message, retry_after_seconds=7)


@pytest.fixture
async def failing_rest_listener() -> AsyncIterator[int]:
    observer = RequestObserver(Metrics(), NoOpTracer())
    api = RestApi(None, _FailingCurrentKey(), observer)  # type: ignore[arg-type]
    listener = RestListener(api, "127.0.0.1", 0, 64 * 1024, idle_seconds=60)
    port = await listener.start()
    api.serving = True
    yield port
    await listener.stop(1)


async def test_the_rest_listener_round_trip_gives_the_table_status_and_message(
    tmp_path: Path, failing_rest_listener: int
) -> None:
    """The hot REST routes (server/rest/) answer a failure themselves: through Envoy, the
    same status, body and headers as a failed rpc's, and nothing internal."""
    upstream = Upstream("127.0.0.1", refusing_port(), failing_rest_listener)
    async with _envoy_in_front(tmp_path, upstream) as base:
        async with httpx.AsyncClient(timeout=10) as client:

            async def get(session: str) -> httpx.Response:
                return await client.get(f"{base}/api/v1/key", headers={"x-session-id": session})

            for entry in ERROR_STATUSES:
                _assert_the_table_answer(await get(f"gateway-{entry.status}"), entry)
            crashed = await get("crash")
            assert crashed.status_code == 500
            assert crashed.json() == {"error": {"code": 500, "message": ERROR_STATUS[500].message}}
            assert "internal detail" not in crashed.text
