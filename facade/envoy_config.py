"""Renders the Envoy configuration of the REST facade: one source for the embedded default
(`gateway up`) and the checked-in `envoy.yaml` of the compose stack."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LUA_FILTER = Path(__file__).resolve().parent / "error_rewrite.lua"
STREAMING_LUA = Path(__file__).resolve().parent / "streaming_rewrite.lua"
# gRPC methods whose response body streams (after transcoding, routes match these paths).
STREAMING_METHODS = ("/gateway.v1.Videos/GetVideoContent",)
MIB = 1024 * 1024


@dataclass(frozen=True)
class Upstream:
    host: str
    port: int


@dataclass(frozen=True)
class EnvoyOptions:
    descriptor_path: str
    services: tuple[str, ...]
    upstreams: tuple[Upstream, ...]
    listen_host: str = "127.0.0.1"
    listen_port: int = 8080
    admin_host: str = "127.0.0.1"
    admin_port: int = 0
    lua_path: str = str(LUA_FILTER)
    max_request_bytes: int = 50 * MIB
    max_response_bytes: int = 64 * MIB
    route_timeout_seconds: int = 300
    # STATIC for IP addresses (embedded), STRICT_DNS for service names (compose).
    upstream_discovery: str = "STATIC"
    extra_routes: list[dict[str, Any]] = field(default_factory=list)


# Envoy's own replies, rewritten into the documented error body. Messages are fixed so no
# reset reason or other internal detail leaks; 400s keep the transcoder's text, which names
# the offending field.
_LOCAL_REPLY_MESSAGES: tuple[tuple[int, int, str | None], ...] = (
    (400, 400, None),
    (404, 404, "Not Found"),
    (408, 408, "Request timed out before completing"),
    (413, 413, "Request payload too large"),
    (426, 400, "Unsupported HTTP version"),
    (431, 413, "Request headers too large"),
    (500, 500, "Internal server error"),
    (502, 502, "Provider returned error"),
    (503, 503, "Service temporarily unavailable"),
    (504, 524, "Request timed out"),
)


def _local_reply_config() -> dict[str, Any]:
    mappers = []
    for matched, answered, message in _LOCAL_REPLY_MESSAGES:
        mapper: dict[str, Any] = {
            "filter": {
                "status_code_filter": {
                    "comparison": {
                        "op": "EQ",
                        "value": {"default_value": matched, "runtime_key": f"lr.{matched}"},
                    }
                }
            },
        }
        if answered != matched:
            mapper["status_code"] = answered
        if message is not None:
            mapper["body"] = {"inline_string": message}
        mappers.append(mapper)
    return {
        "mappers": mappers,
        "body_format": {
            "json_format": {"error": {"code": "%RESPONSE_CODE%", "message": "%LOCAL_REPLY_BODY%"}},
            "content_type": "application/json",
        },
    }


def streaming_source() -> str:
    """The error rewrite plus the streaming override (Lua: the later definition wins).
    Inlined, so the compose config needs no second file."""
    return LUA_FILTER.read_text() + "\n" + STREAMING_LUA.read_text()


def render(options: EnvoyOptions) -> dict[str, Any]:
    streaming_lua = {
        "envoy.filters.http.lua": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.LuaPerRoute",
            "name": "streaming",
        }
    }
    routes = [
        {
            "match": {"path": method},
            "route": {"cluster": "gateway_grpc", "timeout": f"{options.route_timeout_seconds}s"},
            "typed_per_filter_config": streaming_lua,
        }
        for method in STREAMING_METHODS
    ]
    routes += [
        # Matched after the transcoder rewrote :path to /package.Service/Method; an unknown
        # REST path finds no route and gets the 404 local reply.
        {
            "match": {"prefix": f"/{service}/"},
            "route": {"cluster": "gateway_grpc", "timeout": f"{options.route_timeout_seconds}s"},
        }
        for service in options.services
    ]
    routes.extend(options.extra_routes)
    http_connection_manager = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager."
        "v3.HttpConnectionManager",
        "stat_prefix": "public",
        "codec_type": "AUTO",
        "use_remote_address": True,
        # Every answer carries the x-request-id the server logs it under.
        "always_set_request_id_in_response": True,
        "route_config": {
            "name": "api",
            "virtual_hosts": [
                {
                    "name": "api",
                    "domains": ["*"],
                    "routes": routes,
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
        "http_filters": [
            {
                # Bounds every request body: past the limit Envoy answers 413 itself.
                "name": "envoy.filters.http.buffer",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer",
                    "max_request_bytes": options.max_request_bytes,
                },
            },
            {
                "name": "envoy.filters.http.lua",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
                    "default_source_code": {"filename": options.lua_path},
                    "source_codes": {"streaming": {"inline_string": streaming_source()}},
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
                "name": "envoy.filters.http.router",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                },
            },
        ],
    }
    cluster = {
        "name": "gateway_grpc",
        "type": options.upstream_discovery,
        "connect_timeout": "1s",
        "lb_policy": "LEAST_REQUEST",
        # gRPC health: a process that cannot reach the database, or is draining for
        # shutdown, reports NOT_SERVING and gets no new requests while others can serve.
        "health_checks": [
            {
                "timeout": "1s",
                "interval": "2s",
                "no_traffic_interval": "2s",
                "unhealthy_threshold": 1,
                "healthy_threshold": 1,
                "grpc_health_check": {},
            }
        ],
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3."
                "HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
        "load_assignment": {
            "cluster_name": "gateway_grpc",
            "endpoints": [
                {
                    "lb_endpoints": [
                        {
                            "endpoint": {
                                "address": {
                                    "socket_address": {"address": u.host, "port_value": u.port}
                                }
                            }
                        }
                        for u in options.upstreams
                    ]
                }
            ],
        },
    }
    return {
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
            "clusters": [cluster],
        },
    }


def render_json(options: EnvoyOptions) -> str:
    """JSON is YAML: Envoy reads either."""
    return json.dumps(render(options), indent=2) + "\n"
