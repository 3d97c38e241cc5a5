"""Renders the Envoy configuration of the REST facade: one source for the embedded default
(`gateway up`) and the checked-in `envoy.yaml` of the compose stack."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from server.config import DEFAULT_EDGE, EdgePolicy
from server.contract import REST_HEALTH_PATH, http_routes, rest_listener_routes
from server.errors import (
    ERROR_STATUS,
    ERROR_STATUSES,
    FALLBACK_STATUS,
    UNAVAILABLE_RETRY_SECONDS,
    EnvoyReply,
    ErrorStatus,
    GatewayError,
)
from server.hostnames import VALID_AUTHORITY
from server.ports import DEFAULT_REST_PORT

LUA_FILTER = Path(__file__).resolve().parent / "error_rewrite.lua"
REQUEST_LUA = Path(__file__).resolve().parent / "edge_request.lua"
STREAMING_LUA = Path(__file__).resolve().parent / "streaming_rewrite.lua"
# gRPC methods whose response body streams (after transcoding, routes match these paths).
STREAMING_METHODS = ("/gateway.v1.Videos/GetVideoContent",)
# Response headers a method's server sends as trailing metadata, with its status: initial
# metadata of its own would be a separate gRPC operation (and HTTP/2 frame) per call. The
# transcoder keeps trailers out of the headers, so the Lua filter of these methods' routes
# moves them there (error_rewrite.lua, HEADERS_FROM_TRAILERS); their routes mark the
# responses with HEADERS_FROM_TRAILERS_MARK so the filter runs for them.
HEADERS_FROM_TRAILERS = {"/gateway.v1.Audio/Transcribe": ("x-generation-id",)}
HEADERS_FROM_TRAILERS_MARK = "x-gateway-headers-from-trailers"
# The request headers that go on to the server (and the filters after the edge ones): what
# the server reads (authorization, x-session-id, x-request-id, traceparent/tracestate), what
# the transcoder and the cors filter read, and what Envoy itself set for this hop. Every
# other client header is dropped at the edge: the server never sees a header it does not
# use, and names or values gRPC refuses (grpc-*, *-bin, "x!y") cannot fail the call.
FORWARDED_HEADERS = (
    "authorization",
    "content-type",
    "content-length",
    "transfer-encoding",
    "x-session-id",
    "x-request-id",
    "range",  # GET /videos/{id}/content by byte range
    "traceparent",
    "tracestate",
    "origin",
    "access-control-request-method",
    "access-control-request-headers",
    "x-forwarded-for",
    "x-forwarded-proto",
)
# What the server (and the transcoder) put in a response for the facade alone: stripped from
# every response, headers and trailers, by a native filter after the Lua one.
RESPONSE_INTERNALS = (
    "grpc-status",
    "grpc-message",
    "grpc-status-details-bin",
    "grpc-accept-encoding",
    "x-http-status",
    "x-error-body",
    "x-content-length",
    "x-envoy-upstream-service-time",
    "x-gateway-transcoder-failure",
    HEADERS_FROM_TRAILERS_MARK,
)
MIB = 1024 * 1024


# The hot REST routes (the contract's REST_LISTENER_METHODS): proxied as they came to the
# server processes' REST listeners (server/rest/), skipping the transcoder and the gRPC hop
# (docs/performance.md says what that hop costs). Every other route is transcoded to gRPC.
# A media route among them skips the buffer filter too: its body streams to the server,
# which bounds it.
REST_ROUTES: tuple[tuple[str, str], ...] = rest_listener_routes()


@dataclass(frozen=True)
class Upstream:
    """A server process (or the DNS name of its replicas): its gRPC port, and its REST
    listener's (server/rest/), which the hot REST routes (REST_ROUTES) are proxied to. As a
    listen address (compose's --listen) only host and port are read."""

    host: str
    port: int
    rest_port: int = DEFAULT_REST_PORT


@dataclass(frozen=True)
class EnvoyOptions:
    descriptor_path: str
    services: tuple[str, ...]
    upstreams: tuple[Upstream, ...]
    listen_host: str = "127.0.0.1"
    listen_port: int = 8080
    admin_host: str = "127.0.0.1"
    admin_port: int = 0
    max_request_bytes: int = 50 * MIB
    max_response_bytes: int = 64 * MIB
    edge: EdgePolicy = DEFAULT_EDGE
    # STATIC for IP addresses (embedded), STRICT_DNS for service names (compose).
    upstream_discovery: str = "STATIC"
    # Kubernetes: a replica that leaves the DNS answer (it is terminating) gets no new
    # requests though its health check still passes; Envoy otherwise keeps such a host
    # until its health check fails.
    drop_hosts_leaving_dns: bool = False
    # The routes (method, path) proxied to the REST listeners; every other is transcoded.
    rest_routes: tuple[tuple[str, str], ...] = REST_ROUTES
    extra_routes: list[dict[str, Any]] = field(default_factory=list)


# The transcoder's own 400s (a body that is not JSON, a value of the wrong type) quote the
# request, which may hold a secret. They are marked for the Lua filter, which answers with a
# fixed message instead (naming the field when the transcoder named one).
TRANSCODER_FAILURE_HEADER = "x-gateway-transcoder-failure"


def _cel(expression: str) -> dict[str, Any]:
    """A local reply filter: a CEL expression over Envoy's attributes."""
    return {
        "extension_filter": {
            "name": "envoy.access_loggers.extension_filters.cel",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.filters.cel."
                "v3.ExpressionFilter",
                "expression": expression,
            },
        }
    }


def _transcoder_failure_mapper() -> dict[str, Any]:
    # The mark's value is the request's method, as the client sent it (the transcoder makes
    # it a POST once it read the headers): a GET's failure is in its query string.
    return {
        "filter": _cel("response.code_details.contains('grpc_json_transcode_failure')"),
        "headers_to_add": [
            {
                "header": {
                    "key": TRANSCODER_FAILURE_HEADER,
                    "value": "%REQ(X-ENVOY-ORIGINAL-METHOD?:METHOD)%",
                },
                "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
            }
        ],
    }


def _local_reply_filter(reply: EnvoyReply) -> dict[str, Any]:
    if reply.keeps_lua_text:
        return _cel(f"response.code == {reply.code} && response.code_details != 'lua_response'")
    return {
        "status_code_filter": {
            "comparison": {
                "op": "EQ",
                "value": {"default_value": reply.code, "runtime_key": f"lr.{reply.code}"},
            }
        }
    }


def _local_reply_mapper(entry: ErrorStatus, reply: EnvoyReply) -> dict[str, Any]:
    """Envoy's own reply `reply`, answered with the documented status `entry`. Messages are
    fixed so no reset reason or other internal detail leaks."""
    mapper: dict[str, Any] = {"filter": _local_reply_filter(reply)}
    if entry.status != reply.code:
        mapper["status_code"] = entry.status
    mapper["body"] = {"inline_string": reply.message or entry.message}
    if reply.retry_after_seconds is not None:
        mapper["headers_to_add"] = [
            {
                "header": {"key": "retry-after", "value": str(reply.retry_after_seconds)},
                "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
            }
        ]
    if reply.metadata is not None:
        mapper["body_format_override"] = {
            "json_format": {
                "error": {
                    "code": "%RESPONSE_CODE%",
                    "message": "%LOCAL_REPLY_BODY%",
                    "metadata": dict(reply.metadata),
                }
            },
            "content_type": "application/json",
        }
    return mapper


def _local_reply_config() -> dict[str, Any]:
    """Envoy's own replies, rewritten into the documented error body (from the error table).
    The transcoder's 400s come first: they are marked for the Lua filter, which replaces
    their text."""
    mappers = [_transcoder_failure_mapper()]
    mappers += [
        _local_reply_mapper(entry, reply)
        for entry in ERROR_STATUSES
        for reply in entry.envoy_replies
    ]
    return {
        "mappers": mappers,
        "body_format": {
            "json_format": {"error": {"code": "%RESPONSE_CODE%", "message": "%LOCAL_REPLY_BODY%"}},
            "content_type": "application/json",
        },
    }


def _lua_string(text: str) -> str:
    """A Lua string literal: printable ASCII only, where JSON's escapes are Lua's."""
    if not all(" " <= c <= "~" for c in text):
        raise ValueError(f"not printable ASCII: {text!r}")
    return json.dumps(text)


def _lua_failure(entry: ErrorStatus) -> str:
    body = GatewayError(entry.status, entry.failure_message).body_json()
    return f"{{ {entry.status}, {_lua_string(body)} }}"


def lua_error_table() -> str:
    """The Lua filter's view of the error table (server/errors.py), as Lua globals:
    GRPC_FAILURES maps the gRPC code of a failure that carries no gateway error (the gRPC
    stack's own) to its HTTP status and JSON body, UNEXPECTED_FAILURE answers any other code,
    ERROR_MESSAGES is each documented status's default message."""
    by_code = {code.value[0]: entry for entry in ERROR_STATUSES for code in entry.grpc_failures}
    failures = [f"  [{n}] = {_lua_failure(by_code[n])}," for n in sorted(by_code)]
    return (
        "-- Rendered from the error table (server/errors.py).\n"
        "GRPC_FAILURES = {\n" + "\n".join(failures) + "\n}\n"
        f"UNEXPECTED_FAILURE = {_lua_failure(ERROR_STATUS[FALLBACK_STATUS])}\n"
        + _lua_error_messages()
    )


def _lua_error_messages() -> str:
    """ERROR_MESSAGES of lua_error_table, alone (what the request side needs)."""
    messages = [f"  [{e.status}] = {_lua_string(e.message)}," for e in ERROR_STATUSES]
    return "ERROR_MESSAGES = {\n" + "\n".join(messages) + "\n}\n"


def _lua_set(names: tuple[str, ...]) -> str:
    return "{" + ", ".join(f"[{_lua_string(n)}] = true" for n in names) + "}"


# The routes whose bodies carry media (base64 or multipart audio, data: URL images): they
# take up to max_request_bytes; every other route's body is JSON of a few KiB, bounded by
# the edge's max_control_body_bytes.
MEDIA_PATHS = ("/api/v1/audio/transcriptions", "/api/v1/videos")


def body_routes() -> dict[str, tuple[str, ...]]:
    """The REST routes with a body, by method, as Lua patterns of their paths (a path
    parameter is one segment): from the contract's http rules."""
    routes: dict[str, list[str]] = {method: [] for method in BODY_METHODS}
    for route in http_routes().values():
        method, _, template = route.partition(" ")
        if method in routes:
            segments = (
                "[^/]+" if part.startswith("{") else part.replace("-", "%-")
                for part in template.split("/")
            )
            routes[method].append("^" + "/".join(segments) + "$")
    return {method: tuple(sorted(patterns)) for method, patterns in routes.items()}


def _lua_body_routes() -> str:
    by_method = (
        f"  [{_lua_string(method)}] = {{ {', '.join(_lua_string(p) for p in patterns)} }},"
        for method, patterns in body_routes().items()
    )
    return "BODY_ROUTES = {\n" + "\n".join(by_method) + "\n}\n"


def _lua_prelude(edge: EdgePolicy, max_request_bytes: int) -> str:
    """The operator's settings the Lua filters read, as Lua globals."""
    if edge.any_origin:
        origins = "nil"
    else:
        origins = "{" + ", ".join(f"[{json.dumps(o)}] = true" for o in edge.cors_origins) + "}"
    return (
        "-- Rendered from the operator's settings (facade/envoy_config.py).\n"
        f"ALLOWED_ORIGINS = {origins}\n"
        f"MAX_REQUEST_BYTES = {max_request_bytes}\n"
        f"MAX_CONTROL_BODY_BYTES = {edge.max_control_body_bytes}\n"
        f"MEDIA_PATHS = {_lua_set(MEDIA_PATHS)}\n"
        f"FORWARDED = {_lua_set(FORWARDED_HEADERS)}\n" + _lua_body_routes()
    )


def lua_source(options: EnvoyOptions) -> str:
    """The Lua filter of the responses (the error model), inlined so the config is
    self-contained."""
    return (
        _lua_prelude(options.edge, options.max_request_bytes)
        + lua_error_table()
        + LUA_FILTER.read_text()
    )


def request_lua_source(options: EnvoyOptions) -> str:
    """The Lua filter of the requests that are not plain REST calls (edge protection)."""
    return (
        _lua_prelude(options.edge, options.max_request_bytes)
        + "-- Rendered from the error table (server/errors.py).\n"
        + _lua_error_messages()
        + REQUEST_LUA.read_text()
    )


def streaming_source(options: EnvoyOptions) -> str:
    """The Lua filter plus the streaming override (the later definition wins)."""
    return lua_source(options) + "\n" + STREAMING_LUA.read_text()


def trailers_source(options: EnvoyOptions, names: tuple[str, ...]) -> str:
    """The Lua filter for a route whose server sends the response headers `names` as
    trailing metadata: they become headers (the later definition of the global wins)."""
    listed = ", ".join(_lua_string(name) for name in names)
    return lua_source(options) + f"\nHEADERS_FROM_TRAILERS = {{ {listed} }}\n"


def _trailers_source_name(method: str) -> str:
    return "trailers:" + method


# --- Skipping the Lua filters when there is nothing for them to do -------------------------
# A Lua filter costs a coroutine per request and per response, and a call into Lua for each
# header read or written: tens of microseconds of Envoy's CPU per request. Each is wrapped in
# a matcher (envoy.filters.http.match_delegate) that skips it for a plain request or a plain
# success, whose handling native filters do: dropping the headers that are not forwarded
# (header_mutation, _forwarded_only) and stripping the gRPC internals of a response
# (header_mutation, _response_internals_removed).

SKIP_FILTER = {
    "name": "skip",
    "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.common.matcher.action.v3.SkipFilter"
    },
}


def _header_is(input_type: str, name: str, match: dict[str, Any]) -> dict[str, Any]:
    return {
        "single_predicate": {
            "input": {
                "name": name,
                "typed_config": {
                    "@type": f"type.googleapis.com/envoy.type.matcher.v3.{input_type}",
                    "header_name": name,
                },
            },
            "value_match": match,
        }
    }


def _request_header_is(name: str, match: dict[str, Any]) -> dict[str, Any]:
    return _header_is("HttpRequestHeaderMatchInput", name, match)


def _response_header_is(name: str, match: dict[str, Any]) -> dict[str, Any]:
    return _header_is("HttpResponseHeaderMatchInput", name, match)


def _regex(regex: str) -> dict[str, Any]:
    """An RE2 full match (xds StringMatcher)."""
    return {"safe_regex": {"google_re2": {}, "regex": regex}}


ANY_VALUE = _regex("(?s).*")


def _not(predicate: dict[str, Any]) -> dict[str, Any]:
    return {"not_matcher": predicate}


def _any_of(*predicates: dict[str, Any]) -> dict[str, Any]:
    return {"or_matcher": {"predicate": list(predicates)}}


def _all_of(*predicates: dict[str, Any]) -> dict[str, Any]:
    return {"and_matcher": {"predicate": list(predicates)}}


def _absent(is_: Any, name: str) -> dict[str, Any]:
    return _not(is_(name, ANY_VALUE))


def _skipped_when(filter_config: dict[str, Any], predicate: dict[str, Any]) -> dict[str, Any]:
    """`filter_config` (a filter's typed_config), skipped when `predicate` holds."""
    return {
        "@type": "type.googleapis.com/envoy.extensions.common.matching.v3.ExtensionWithMatcher",
        "extension_config": {"name": "gateway.skippable", "typed_config": filter_config},
        "xds_matcher": {
            "matcher_list": {
                "matchers": [{"predicate": predicate, "on_match": {"action": SKIP_FILTER}}]
            }
        },
    }


def _at_most(limit: int) -> str:
    """A regex of the decimal numbers that are surely not over `limit` (fewer digits)."""
    digits = len(str(limit + 1)) - 1
    return f"[0-9]{{1,{digits}}}" if digits > 0 else "0"


# Methods whose requests carry a body (every route with one needs a key).
BODY_METHODS = ("POST", "PUT", "PATCH")
BODY_METHODS_REGEX = "|".join(BODY_METHODS)
# What the server's bearer_token and key patterns accept (server/auth.py, API and operator
# keys): anything else is refused by the server too, so the edge refuses it first.
WELL_FORMED_AUTHORIZATION = r"[ \t]*[Bb][Ee][Aa][Rr][Ee][Rr] +sk-gw-(?:v1|op)-[0-9a-f]{64}[ \t]*"


def _plain_request(edge: EdgePolicy, max_request_bytes: int) -> dict[str, Any]:
    """A request edge_request.lua would let through untouched but for the headers it drops:
    an /api/v1/ path, no protocol upgrade, no CONNECT or OPTIONS, a Content-Length well
    under the limit, printable forwarded headers, an allowed Origin (or none)."""
    conditions = [
        _request_header_is(":path", {"prefix": "/api/v1/"}),
        _not(_request_header_is(":method", _regex("CONNECT|OPTIONS"))),
        _absent(_request_header_is, "upgrade"),
        _any_of(
            _absent(_request_header_is, "content-length"),
            _request_header_is(
                "content-length",
                _regex(_at_most(min(max_request_bytes, edge.max_control_body_bytes))),
            ),
        ),
        # A method with a body carries a well-formed key: edge_request.lua refuses one
        # without before its body is read.
        _any_of(
            _not(_request_header_is(":method", _regex(BODY_METHODS_REGEX))),
            _request_header_is("authorization", _regex(WELL_FORMED_AUTHORIZATION)),
        ),
    ]
    conditions += [
        _any_of(
            _absent(_request_header_is, name),
            _request_header_is(name, _regex("[\\t -~]*")),
        )
        for name in FORWARDED_HEADERS
    ]
    if not edge.any_origin:
        conditions.append(
            _any_of(
                _absent(_request_header_is, "origin"),
                *(_request_header_is("origin", {"exact": o}) for o in edge.cors_origins),
            )
        )
    return _all_of(*conditions)


# What a request whose Host is not a valid host (server/hostnames.py VALID_AUTHORITY, after
# Envoy stripped one trailing dot and this listener's port) is answered; the filter that
# answers it is skipped for every valid one.
INVALID_HOST_MESSAGE = (
    "Invalid Host header: a host name, an IPv4 address or a [bracketed] IPv6 address, "
    "optionally with a port 1-65535"
)
INVALID_HOST_LUA = f"""
function envoy_on_request(handle)
  handle:respond({{ [":status"] = "400" }}, {json.dumps(INVALID_HOST_MESSAGE)})
end
"""


def _plain_success() -> dict[str, Any]:
    """A response error_rewrite.lua would only strip gRPC internals from."""
    return _all_of(
        _any_of(
            _absent(_response_header_is, "grpc-status"),
            _response_header_is("grpc-status", {"exact": "0"}),
        ),
        *(
            _absent(_response_header_is, name)
            for name in (
                "x-http-status",
                "x-ratelimit-window-ms",
                TRANSCODER_FAILURE_HEADER,
                HEADERS_FROM_TRAILERS_MARK,
            )
        ),
    )


def _regex_escape(char: str) -> str:
    return char if char.isalnum() else "\\" + char


def _none_of(words: tuple[str, ...]) -> str:
    """An RE2 regex that matches any header name but `words` and the pseudo-headers (":…")."""
    trie: dict[str, Any] = {}
    for word in words:
        node = trie
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}

    def rest(node: dict[str, Any], first: bool) -> str:
        chars = sorted(c for c in node if c)
        excluded = "".join(_regex_escape(c) for c in ([":"] if first else []) + chars)
        alternatives = [] if "" in node or first else [""]
        alternatives.append(f"[^{excluded}].*" if excluded else ".+")
        alternatives += [_regex_escape(c) + rest(node[c], False) for c in chars]
        return "(?:" + "|".join(alternatives) + ")"

    return "(?s)" + rest(trie, True)


RE2_MAX_PROGRAM_SIZE = 4096


def _forwarded_only() -> dict[str, Any]:
    """Request headers not in FORWARDED_HEADERS are dropped (what edge_request.lua does for
    the requests it sees)."""
    return {
        "remove_on_match": {"key_matcher": {"safe_regex": {"regex": _none_of(FORWARDED_HEADERS)}}}
    }


# The client's Content-Length, for the server: the transcoder drops the header when it turns
# a streamed body into messages, and the server reserves a body's memory from it before
# reading the body (server/transcription/body.py). Set here, so no client can send its own.
DECLARED_LENGTH_HEADER = "x-gateway-content-length"


def _declared_length() -> dict[str, Any]:
    return {
        "append": {
            "header": {"key": DECLARED_LENGTH_HEADER, "value": "%REQ(CONTENT-LENGTH)%"},
            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
        }
    }


def _response_internals_removed() -> list[dict[str, Any]]:
    return [{"remove": name} for name in RESPONSE_INTERNALS]


def _seconds(value: float) -> str:
    return f"{value:g}s"


def _cors_policy(edge: EdgePolicy) -> dict[str, Any]:
    origins = (
        [{"safe_regex": {"regex": ".*"}}]
        if edge.any_origin
        else [{"exact": o} for o in edge.cors_origins]
    )
    return {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.cors.v3.CorsPolicy",
        "allow_origin_string_match": origins,
        "allow_methods": "GET, POST, PUT, PATCH, DELETE, OPTIONS",
        "allow_headers": "authorization, content-type, x-session-id, x-request-id, traceparent",
        "expose_headers": "x-request-id, retry-after, x-ratelimit-limit, x-ratelimit-remaining, "
        "x-ratelimit-reset, x-generation-id",
        "max_age": "86400",
        # A preflight from an origin that is not allowed gets no allow headers.
        "forward_not_matching_preflights": False,
    }


def _flood_protection(edge: EdgePolicy) -> dict[str, Any]:
    """Token buckets: one per client address (created as clients appear), and one for all."""
    return {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3."
        "LocalRateLimit",
        "stat_prefix": "flood_protection",
        "token_bucket": {
            "max_tokens": edge.global_burst,
            "tokens_per_fill": edge.global_requests_per_second,
            "fill_interval": "1s",
        },
        "descriptors": [
            {
                "entries": [{"key": "remote_address", "value": ""}],  # "": one per address
                "token_bucket": {
                    "max_tokens": edge.client_burst,
                    "tokens_per_fill": edge.client_requests_per_second,
                    "fill_interval": "1s",
                },
            }
        ],
        "rate_limits": [{"actions": [{"remote_address": {}}]}],
        "max_dynamic_descriptors": 10000,
        "always_consume_default_token_bucket": True,
        "filter_enabled": {
            "runtime_key": "flood_protection_enabled",
            "default_value": {"numerator": 100, "denominator": "HUNDRED"},
        },
        "filter_enforced": {
            "runtime_key": "flood_protection_enforced",
            "default_value": {"numerator": 100, "denominator": "HUNDRED"},
        },
        "response_headers_to_add": [
            {
                "header": {
                    "key": "x-ratelimit-limit",
                    "value": str(edge.client_requests_per_second),
                },
                "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
            },
            {
                "header": {"key": "x-ratelimit-remaining", "value": "0"},
                "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
            },
            {
                # The Lua filter turns this into X-RateLimit-Reset (epoch ms).
                "header": {"key": "x-ratelimit-window-ms", "value": "1000"},
                "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
            },
        ],
    }


# What Envoy keeps of a request's body to send it again (below): a body past it is not
# retried, so retries cost at most this much memory per request. (It caps the copy kept for
# retries only; a stream's own buffer limit is not lowered by it.)
RETRY_BUFFER_BYTES = 64 * 1024


def _retry_unsent() -> dict[str, Any]:
    """Requests that never reached a server process — its port refused the connection (a
    process that just died, before the health check marks it down), it refused the
    stream, or the stream was reset before the request was sent — are sent again, to
    another process. Only those: a request a server received is never sent twice."""
    return {
        "retry_on": "connect-failure,refused-stream,reset-before-request",
        "num_retries": 2,
        "retry_host_predicate": [
            {
                "name": "envoy.retry_host_predicates.previous_hosts",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts."
                    "v3.PreviousHostsPredicate"
                },
            }
        ],
        "host_selection_retry_max_attempts": 3,
    }


def _heap_trigger(threshold: float) -> dict[str, Any]:
    return {"name": "envoy.resource_monitors.fixed_heap", "threshold": {"value": threshold}}


# What one client connection may make Envoy hold before it stops reading from it (Envoy's
# default, stated): a body streamed to the server passes through within this.
CONNECTION_BUFFER_BYTES = 1024 * 1024
# HTTP/2 clients: how much a stream (and a connection) may send before Envoy reads it —
# Envoy's own defaults (256 MiB) would let one client's bodies sit in Envoy's memory. The
# values of Envoy's edge best practices.
CLIENT_STREAM_WINDOW_BYTES = 64 * 1024
CLIENT_CONNECTION_WINDOW_BYTES = 1024 * 1024


def _disabled(filter_type: str) -> dict[str, Any]:
    """A filter's per-route config that turns it off for the route."""
    if filter_type == "buffer":
        return {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.BufferPerRoute",
            "disabled": True,
        }
    return {"@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig", "disabled": True}


def _rest_routes(options: EnvoyOptions, timeout: str) -> list[dict[str, Any]]:
    """The hot REST routes, to the REST listeners as they came: the transcoder is off for
    them (it would turn them into gRPC calls), and so is the buffer filter for a media path."""
    return [
        {
            "match": {
                "path": path,
                "headers": [
                    {"name": ":method", "string_match": {"exact": method}},
                    # A protocol upgrade (WebSocket) matches no route before transcoding, so
                    # the edge's Lua refuses it with the documented 400: a route it matched
                    # would have Envoy refuse it first, with a bare 403.
                    {"name": "upgrade", "present_match": True, "invert_match": True},
                ],
            },
            "route": {"cluster": "gateway_rest", "timeout": timeout},
            "typed_per_filter_config": {
                "envoy.filters.http.grpc_json_transcoder": _disabled("transcoder"),
                **(
                    {"envoy.filters.http.buffer": _disabled("buffer")}
                    if path in MEDIA_PATHS
                    else {}
                ),
            },
        }
        for method, path in options.rest_routes
    ]


def _media_routes(options: EnvoyOptions, timeout: str) -> list[dict[str, Any]]:
    """The media routes' REST paths (but the REST listeners'), matched before transcoding
    (the filters before the transcoder see the REST path): they skip the buffer filter. The
    transcoder then clears the route, and the request is routed by its gRPC path like every
    other."""
    return [
        {
            "match": {
                "path": path,
                "headers": [{"name": ":method", "string_match": {"exact": "POST"}}],
            },
            "route": {"cluster": "gateway_grpc", "timeout": timeout},
            "typed_per_filter_config": {"envoy.filters.http.buffer": _disabled("buffer")},
        }
        for path in MEDIA_PATHS
        if ("POST", path) not in options.rest_routes
    ]


def _cluster(
    name: str,
    options: EnvoyOptions,
    endpoints: list[tuple[str, int]],
    health_check: dict[str, Any],
    protocol_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A cluster of the server processes (`endpoints`: one port of each), balanced to the
    one with the fewest requests, health-checked as often as a 503's Retry-After says."""
    cluster: dict[str, Any] = {
        "name": name,
        "type": options.upstream_discovery,
        "connect_timeout": "1s",
        "lb_policy": "LEAST_REQUEST",
        "health_checks": [
            {
                "timeout": "1s",
                "interval": f"{UNAVAILABLE_RETRY_SECONDS}s",  # the 503's Retry-After
                "no_traffic_interval": f"{UNAVAILABLE_RETRY_SECONDS}s",
                "unhealthy_threshold": 1,
                "healthy_threshold": 1,
                **health_check,
            }
        ],
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [
                {
                    "lb_endpoints": [
                        {
                            "endpoint": {
                                "address": {"socket_address": {"address": host, "port_value": port}}
                            }
                        }
                        for host, port in endpoints
                    ]
                }
            ],
        },
    }
    if protocol_options is not None:
        cluster["typed_extension_protocol_options"] = protocol_options
    if options.drop_hosts_leaving_dns:
        cluster["ignore_health_on_host_removal"] = True
    return cluster


def render(options: EnvoyOptions) -> dict[str, Any]:
    edge = options.edge
    timeout = _seconds(edge.upstream_timeout_seconds)
    streaming_lua = {
        "envoy.filters.http.lua": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.LuaPerRoute",
            "name": "streaming",
        }
    }
    routes = _rest_routes(options, timeout) + _media_routes(options, timeout)
    routes += [
        {
            "match": {"path": method},
            "route": {"cluster": "gateway_grpc", "timeout": timeout},
            "typed_per_filter_config": streaming_lua,
        }
        for method in STREAMING_METHODS
    ]
    routes += [
        {
            "match": {"path": method},
            "route": {"cluster": "gateway_grpc", "timeout": timeout},
            # Added by the router, before the filters see the response: the Lua filter runs.
            "response_headers_to_add": [
                {
                    "header": {"key": HEADERS_FROM_TRAILERS_MARK, "value": "1"},
                    "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
                }
            ],
            "typed_per_filter_config": {
                "envoy.filters.http.lua": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.LuaPerRoute",
                    "name": _trailers_source_name(method),
                }
            },
        }
        for method in HEADERS_FROM_TRAILERS
    ]
    routes += [
        # Matched after the transcoder rewrote :path to /package.Service/Method; an unknown
        # REST path finds no route and gets the 404 local reply.
        {
            "match": {"prefix": f"/{service}/"},
            "route": {"cluster": "gateway_grpc", "timeout": timeout},
        }
        for service in options.services
    ]
    # CORS preflights are answered by the cors filter, which needs a route to act on: REST
    # paths only have one once the transcoder turned them into gRPC paths.
    routes.append(
        {
            "match": {
                "prefix": "/api/v1/",
                "headers": [{"name": ":method", "string_match": {"exact": "OPTIONS"}}],
            },
            # The cors filter answers a preflight before it gets here; any other OPTIONS
            # reaches the server as an unknown method: 404.
            "route": {"cluster": "gateway_grpc", "timeout": timeout},
        }
    )
    routes.extend(options.extra_routes)
    http_connection_manager = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager."
        "v3.HttpConnectionManager",
        "stat_prefix": "public",
        "codec_type": "AUTO",
        "use_remote_address": True,
        # Slow or stalled clients get 408 instead of holding a connection open.
        "request_headers_timeout": _seconds(edge.headers_timeout_seconds),
        "request_timeout": _seconds(edge.request_timeout_seconds),
        "stream_idle_timeout": _seconds(edge.idle_timeout_seconds),
        "max_request_headers_kb": edge.max_request_headers_kb,
        "http2_protocol_options": {
            "initial_stream_window_size": CLIENT_STREAM_WINDOW_BYTES,
            "initial_connection_window_size": CLIENT_CONNECTION_WINDOW_BYTES,
        },
        # Every answer carries the x-request-id the server logs it under.
        "always_set_request_id_in_response": True,
        # The authority normalised once, before any filter or route reads it: one trailing
        # dot (the DNS root) and a port naming this listener's are dropped; what is left must
        # be a valid host (gateway.valid_host). Absolute-form targets are not taken apart:
        # their :path is no path, which Envoy answers 404 itself, so the Host header is the
        # one authority a request has, routed on and passed to the server.
        "strip_trailing_host_dot": True,
        "strip_matching_host_port": True,
        "http_protocol_options": {"allow_absolute_url": False},
        "route_config": {
            "name": "api",
            "virtual_hosts": [
                {
                    "name": "api",
                    "domains": ["*"],
                    "routes": routes,
                    "retry_policy": _retry_unsent(),
                    "request_body_buffer_limit": RETRY_BUFFER_BYTES,
                    "typed_per_filter_config": {"envoy.filters.http.cors": _cors_policy(edge)},
                    # The host the client asked for (vault routes refuse regional hostnames);
                    # set by Envoy, so a client cannot supply its own.
                    "request_headers_to_add": [
                        {
                            "header": {
                                "key": "x-gateway-authority",
                                "value": "%REQ(:AUTHORITY)%",
                            },
                            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
                        }
                    ],
                }
            ],
        },
        "local_reply_config": _local_reply_config(),
        # Order: requests run top-down, responses bottom-up. The error model's Lua comes first
        # so that it sees (and shapes) every response, Envoy's own replies included; only the
        # stripping of the gRPC internals comes after it.
        "http_filters": [
            {
                "name": "gateway.response_internals",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation."
                    "v3.HeaderMutation",
                    "mutations": {
                        "response_mutations": _response_internals_removed(),
                        "response_trailers_mutations": _response_internals_removed(),
                    },
                },
            },
            {
                "name": "envoy.filters.http.lua",
                "typed_config": _skipped_when(
                    {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
                        "default_source_code": {"inline_string": lua_source(options)},
                        "source_codes": {
                            "streaming": {"inline_string": streaming_source(options)},
                            **{
                                _trailers_source_name(method): {
                                    "inline_string": trailers_source(options, names)
                                }
                                for method, names in HEADERS_FROM_TRAILERS.items()
                            },
                        },
                    },
                    _plain_success(),
                ),
            },
            {
                # Before anything reads the authority: an invalid Host is a 400.
                "name": "gateway.valid_host",
                "typed_config": _skipped_when(
                    {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
                        "default_source_code": {"inline_string": INVALID_HOST_LUA},
                    },
                    _request_header_is(":authority", _regex(VALID_AUTHORITY)),
                ),
            },
            {
                "name": "gateway.edge_request",
                "typed_config": _skipped_when(
                    {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
                        "default_source_code": {"inline_string": request_lua_source(options)},
                    },
                    _plain_request(edge, options.max_request_bytes),
                ),
            },
            {
                # Only the forwarded headers go on (edge_request.lua drops the others from
                # the requests it sees; a plain request skips it). Request trailers (HTTP/2
                # clients may send them) would reach the server as gRPC metadata, where names
                # or values gRPC refuses fail the call: the API reads none, so none go on.
                "name": "envoy.filters.http.header_mutation",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation."
                    "v3.HeaderMutation",
                    "mutations": {
                        "request_mutations": [_forwarded_only(), _declared_length()],
                        "request_trailers_mutations": [
                            {"remove_on_match": {"key_matcher": {"safe_regex": {"regex": ".*"}}}}
                        ],
                    },
                },
            },
            {
                # Before anything reads a body: a flood is refused at the door.
                "name": "envoy.filters.http.local_ratelimit",
                "typed_config": _flood_protection(edge),
            },
            {
                # Bounds the body of every route without media (keys, vault, ...: JSON of a
                # few KiB), announced or chunked: past the limit Envoy answers 413 itself. The
                # media routes (MEDIA_PATHS) skip it (_media_routes): the transcriber's body
                # streams to the server, a video submission is bounded by the transcoder.
                "name": "envoy.filters.http.buffer",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer",
                    "max_request_bytes": edge.max_control_body_bytes,
                },
            },
            {
                "name": "envoy.filters.http.grpc_json_transcoder",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http."
                    "grpc_json_transcoder.v3.GrpcJsonTranscoder",
                    "proto_descriptor": options.descriptor_path,
                    "services": list(options.services),
                    "max_request_body_size": options.max_request_bytes,
                    "max_response_body_size": options.max_response_bytes,
                    "ignore_unknown_query_parameters": True,
                    "convert_grpc_status": False,
                    "print_options": {
                        "add_whitespace": False,
                        "always_print_primitive_fields": True,
                        "always_print_enums_as_ints": False,
                        "preserve_proto_field_names": True,
                    },
                },
            },
            {
                # After the transcoder: REST paths have a route only once they are gRPC paths.
                "name": "envoy.filters.http.cors",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors"
                },
            },
            {
                "name": "envoy.filters.http.router",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                },
            },
        ],
    }
    clusters = [
        _cluster(
            "gateway_grpc",
            options,
            [(u.host, u.port) for u in options.upstreams],
            # gRPC health: a process that cannot reach the database, or is draining for
            # shutdown, reports NOT_SERVING and gets no new requests while others can serve.
            {"grpc_health_check": {}},
            {
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3."
                    "HttpProtocolOptions",
                    "explicit_http_config": {"http2_protocol_options": {}},
                }
            },
        ),
    ]
    if options.rest_routes:
        # HTTP/1.1 (Envoy's default for a cluster); the listener's health is the process's.
        clusters.append(
            _cluster(
                "gateway_rest",
                options,
                [(u.host, u.rest_port) for u in options.upstreams],
                {"http_health_check": {"path": REST_HEALTH_PATH}},
                {
                    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3."
                        "HttpProtocolOptions",
                        # Closed before the listener closes them (EdgePolicy).
                        "common_http_protocol_options": {
                            "idle_timeout": _seconds(edge.upstream_idle_seconds)
                        },
                        "explicit_http_config": {"http_protocol_options": {}},
                    }
                },
            )
        )
    return {
        "layered_runtime": {
            "layers": [
                {
                    "name": "static",
                    # _none_of's regex (the forwarded headers' complement) is a larger RE2
                    # program than Envoy's default limit of 100 allows.
                    "static_layer": {"re2.max_program_size.error_level": RE2_MAX_PROGRAM_SIZE},
                },
                {"name": "admin", "admin_layer": {}},
            ]
        },
        # Flood protection for connections: past this many open ones, new ones are refused.
        "overload_manager": {
            "refresh_interval": "0.25s",
            "resource_monitors": [
                {
                    "name": "envoy.resource_monitors.global_downstream_max_connections",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.resource_monitors."
                        "downstream_connections.v3.DownstreamConnectionsConfig",
                        "max_active_downstream_connections": edge.max_connections,
                    },
                },
                {
                    # Envoy's memory as a whole: bodies in its buffers (the transcoder holds a
                    # JSON body whole) count here, whatever the number of clients.
                    "name": "envoy.resource_monitors.fixed_heap",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.resource_monitors."
                        "fixed_heap.v3.FixedHeapConfig",
                        "max_heap_size_bytes": edge.max_heap_bytes,
                    },
                },
            ],
            "actions": [
                {
                    "name": "envoy.overload_actions.shrink_heap",
                    "triggers": [_heap_trigger(0.90)],
                },
                {
                    # New requests get a 503 (with Retry-After, from the error table) while
                    # the heap is this full; those in flight go on.
                    "name": "envoy.overload_actions.stop_accepting_requests",
                    "triggers": [_heap_trigger(0.95)],
                },
            ],
        },
        "admin": {
            "address": {
                "socket_address": {
                    "address": options.admin_host,
                    "port_value": options.admin_port,
                }
            }
        },
        "static_resources": {
            "listeners": [
                {
                    "name": "public",
                    "address": {
                        "socket_address": {
                            "address": options.listen_host,
                            "port_value": options.listen_port,
                        }
                    },
                    # Envoy shares a port with SO_REUSEPORT by default: a second gateway
                    # on this port would then split the clients with the first. Refuse.
                    "enable_reuse_port": False,
                    "per_connection_buffer_limit_bytes": CONNECTION_BUFFER_BYTES,
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": http_connection_manager,
                                }
                            ]
                        }
                    ],
                }
            ],
            "clusters": clusters,
        },
    }


def render_json(options: EnvoyOptions) -> str:
    """JSON is YAML: Envoy reads either."""
    return json.dumps(render(options), indent=2) + "\n"
