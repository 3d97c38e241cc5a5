"""The facade's fast path (facade/envoy_config.py): the Lua filters are skipped for a plain
request and a plain success, whose handling native filters do. The skip conditions are
evaluated here on the rendered config, by a small interpreter of the matcher predicates, on
the requests and responses the Lua filters act on (they must run) and on plain ones (they
are skipped). Envoy's behaviour on both paths is covered by tests/test_edge*.py."""

from __future__ import annotations

import re
from typing import Any

import pytest

from facade.compose import compose_envoy_options
from facade.envoy_config import (
    DECLARED_LENGTH_HEADER,
    FORWARDED_HEADERS,
    HEADERS_FROM_TRAILERS,
    HEADERS_FROM_TRAILERS_MARK,
    RESPONSE_INTERNALS,
    TRANSCODER_FAILURE_HEADER,
    _at_most,
    _none_of,
    render,
)
from server.config import DEFAULT_EDGE, EdgePolicy

Headers = dict[str, str]


def _manager(edge: EdgePolicy = DEFAULT_EDGE) -> dict[str, Any]:
    config = render(compose_envoy_options(edge=edge))
    listener = config["static_resources"]["listeners"][0]
    return listener["filter_chains"][0]["filters"][0]["typed_config"]  # type: ignore[no-any-return]


def _filters(edge: EdgePolicy = DEFAULT_EDGE) -> dict[str, dict[str, Any]]:
    return {f["name"]: f["typed_config"] for f in _manager(edge)["http_filters"]}


def _skip_predicate(name: str, edge: EdgePolicy = DEFAULT_EDGE) -> dict[str, Any]:
    matcher = _filters(edge)[name]["xds_matcher"]["matcher_list"]["matchers"]
    assert len(matcher) == 1 and matcher[0]["on_match"]["action"]["name"] == "skip"
    return matcher[0]["predicate"]  # type: ignore[no-any-return]


def _string_match(match: dict[str, Any], value: str) -> bool:
    if "exact" in match:
        return value == match["exact"]
    if "prefix" in match:
        return value.startswith(match["prefix"])
    return re.fullmatch(match["safe_regex"]["regex"], value) is not None


def _holds(predicate: dict[str, Any], request: Headers, response: Headers | None) -> bool:
    """The predicate on a request's (and, once there, the response's) headers. RE2 and
    Python's re agree on the regexes rendered (classes, alternatives, counted repeats)."""
    if "and_matcher" in predicate:
        return all(_holds(p, request, response) for p in predicate["and_matcher"]["predicate"])
    if "or_matcher" in predicate:
        return any(_holds(p, request, response) for p in predicate["or_matcher"]["predicate"])
    if "not_matcher" in predicate:
        return not _holds(predicate["not_matcher"], request, response)
    single = predicate["single_predicate"]
    data_input = single["input"]["typed_config"]
    headers = request if data_input["@type"].endswith("RequestHeaderMatchInput") else response
    assert headers is not None, "a request's skip must not wait for the response"
    value = headers.get(data_input["header_name"])
    return value is not None and _string_match(single["value_match"], value)


WELL_FORMED_KEY = "Bearer sk-gw-v1-" + "0" * 64
PLAIN = {
    ":method": "GET",
    ":path": "/api/v1/key",
    ":authority": "gw",
    "authorization": "Bearer sk-x",
    "user-agent": "curl/8",
    "accept": "*/*",
    "x-forwarded-proto": "http",
    "x-request-id": "6a6c2f1e-0000-4000-8000-000000000000",
}


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {
            ":method": "POST",
            "content-type": "application/json",
            "content-length": "999999",
            "authorization": WELL_FORMED_KEY,
        },
        {":method": "PUT", "authorization": "bearer  sk-gw-op-" + "0" * 64},
        {"x-other": "caf\xe9", "grpc-timeout": "1S", "x-foo-bin": "AAA"},  # dropped natively
        {"origin": "https://any.example"},
        {"x-session-id": "s1", "traceparent": "00-1-2-01", "tracestate": "a=b"},
    ],
)
def test_a_plain_request_skips_the_request_lua(changes: Headers) -> None:
    assert _holds(_skip_predicate("gateway.edge_request"), {**PLAIN, **changes}, None)


@pytest.mark.parametrize(
    "changes",
    [
        {":path": "/console/"},
        {":path": "/console"},
        {":path": "/gateway.v1.Keys/GetCurrentKey"},
        {":path": "/api/v1"},
        {":method": "OPTIONS"},
        {":method": "CONNECT"},
        {"upgrade": "websocket"},
        {"content-length": "52428801"},
        {"content-length": "10000000"},  # under the limit, but the Lua filter decides
        {"content-length": "1000000"},  # under a control route's limit: the Lua decides too
        {"content-length": "1, 2"},
        {"authorization": "Bearer caf\xe9"},
        {"x-session-id": "a\x7fb"},
        {"x-request-id": "\x01"},
        # A body without a well-formed key: refused by the Lua filter before it is read.
        {":method": "POST", "content-type": "application/json", "content-length": "9"},
        {":method": "POST", "authorization": "Bearer sk-x"},
        {":method": "PATCH", "authorization": "Basic " + WELL_FORMED_KEY[7:]},
        {":method": "PUT", "authorization": WELL_FORMED_KEY.upper()},
        {":method": "POST", "authorization": WELL_FORMED_KEY + "0"},
    ],
)
def test_what_the_request_lua_acts_on_is_never_skipped(changes: Headers) -> None:
    assert not _holds(_skip_predicate("gateway.edge_request"), {**PLAIN, **changes}, None)


def test_every_forwarded_header_must_be_printable_to_skip() -> None:
    predicate = _skip_predicate("gateway.edge_request")
    for name in FORWARDED_HEADERS:
        assert not _holds(predicate, {**PLAIN, name: "\xff"}, None), name


def test_with_listed_origins_only_those_skip() -> None:
    edge = EdgePolicy.model_validate({"cors_origins": ["https://app.example"]})
    predicate = _skip_predicate("gateway.edge_request", edge)
    assert _holds(predicate, PLAIN, None)
    assert _holds(predicate, {**PLAIN, "origin": "https://app.example"}, None)
    assert not _holds(predicate, {**PLAIN, "origin": "https://evil.example"}, None)


SUCCESS = {":status": "200", "content-type": "application/json", "grpc-accept-encoding": "gzip"}


@pytest.mark.parametrize("changes", [{}, {"grpc-status": "0", "grpc-message": ""}])
def test_a_plain_success_skips_the_error_lua(changes: Headers) -> None:
    predicate = _skip_predicate("envoy.filters.http.lua")
    assert _holds(predicate, PLAIN, {**SUCCESS, **changes})


@pytest.mark.parametrize(
    "changes",
    [
        {"grpc-status": "5"},
        {"grpc-status": "16", "x-http-status": "401", "x-error-body": "{}"},
        {"grpc-status": "0", "x-http-status": "204"},
        {"x-http-status": "202"},
        {":status": "429", "x-ratelimit-window-ms": "1000"},
        {":status": "400", TRANSCODER_FAILURE_HEADER: "GET"},
        {HEADERS_FROM_TRAILERS_MARK: "1"},
    ],
)
def test_what_the_error_lua_acts_on_is_never_skipped(changes: Headers) -> None:
    assert not _holds(_skip_predicate("envoy.filters.http.lua"), PLAIN, {**SUCCESS, **changes})


def test_the_error_lua_runs_last_but_for_the_internals_stripping() -> None:
    names = [f["name"] for f in _manager()["http_filters"]]
    assert names[:5] == [
        "gateway.response_internals",
        "envoy.filters.http.lua",
        "gateway.valid_host",
        "gateway.edge_request",
        "envoy.filters.http.header_mutation",
    ]
    stripping = _filters()["gateway.response_internals"]["mutations"]
    for mutations in (stripping["response_mutations"], stripping["response_trailers_mutations"]):
        assert {m["remove"] for m in mutations} == set(RESPONSE_INTERNALS)
    assert {"grpc-status", "grpc-message", "x-http-status", HEADERS_FROM_TRAILERS_MARK} <= set(
        RESPONSE_INTERNALS
    )


def test_the_headers_from_trailers_routes_mark_their_responses() -> None:
    routes = _manager()["route_config"]["virtual_hosts"][0]["routes"]
    for method in HEADERS_FROM_TRAILERS:
        (route,) = [r for r in routes if r["match"].get("path") == method]
        added = [h["header"] for h in route["response_headers_to_add"]]
        assert {"key": HEADERS_FROM_TRAILERS_MARK, "value": "1"} in added


def test_only_the_forwarded_headers_are_kept() -> None:
    dropped = re.compile(_none_of(FORWARDED_HEADERS))
    for name in FORWARDED_HEADERS:
        assert not dropped.fullmatch(name), name
        assert dropped.fullmatch(name + "x") and dropped.fullmatch(name[:-1]), name
    for name in (":path", ":authority", ":method", ":scheme"):
        assert not dropped.fullmatch(name), name
    for name in ("host", "te", "x", "grpc-timeout", "x-foo-bin", "x-forwarded-host", "accept"):
        assert dropped.fullmatch(name), name
    mutation = _filters()["envoy.filters.http.header_mutation"]["mutations"]
    allowlist, declared_length = mutation["request_mutations"]
    assert allowlist["remove_on_match"]["key_matcher"]["safe_regex"]["regex"] == dropped.pattern
    # Set after the allowlist, by Envoy alone: a client's own value never reaches the server.
    assert declared_length["append"]["header"] == {
        "key": DECLARED_LENGTH_HEADER,
        "value": "%REQ(CONTENT-LENGTH)%",
    }
    assert declared_length["append"]["append_action"] == "OVERWRITE_IF_EXISTS_OR_ADD"
    assert dropped.fullmatch(DECLARED_LENGTH_HEADER)


@pytest.mark.parametrize("limit", [0, 5, 9, 10, 999, 1000, 52428800])
def test_a_content_length_skips_only_when_surely_under_the_limit(limit: int) -> None:
    under = re.compile(_at_most(limit))
    assert under.fullmatch("0")
    candidates = {limit, limit + 1, 2 * limit + 1} | {10**k - 1 for k in range(1, 10)}
    candidates |= {10**k for k in range(1, 10)}
    for value in sorted(candidates):
        if under.fullmatch(str(value)):
            assert value <= limit
    assert not under.fullmatch(str(limit + 1)) and not under.fullmatch("1e3")


def test_envoy_closes_its_idle_rest_connections_before_the_listener_does() -> None:
    """A connection to a REST listener that Envoy keeps idle is closed by Envoy first: the
    listener (which closes one without a whole request after listener_idle_seconds) never
    closes one Envoy is about to send a request on."""
    edge = EdgePolicy(GATEWAY_EDGE_IDLE_TIMEOUT_SECONDS=42)
    clusters = render(compose_envoy_options(edge=edge))["static_resources"]["clusters"]
    (rest,) = [c for c in clusters if c["name"] == "gateway_rest"]
    options = rest["typed_extension_protocol_options"][
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    ]
    idle = options["common_http_protocol_options"]["idle_timeout"]
    assert idle == "42s"
    assert edge.listener_idle_seconds > float(idle.removesuffix("s"))
