"""Operator settings: command-line flags over environment variables over defaults."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from server.hostnames import dns_name

DEFAULT_DATA_DIR = "gateway-data"
ANY_ORIGIN = "*"
ORIGIN = re.compile(r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?$")


class SettingsError(ValueError):
    """An operator setting is wrong; the message names it."""


@dataclass(frozen=True)
class EdgePolicy:
    """What Envoy enforces before a request reaches a server: CORS, flood protection,
    timeouts and header size. Generous defaults: normal use never meets them."""

    cors_origins: tuple[str, ...] = (ANY_ORIGIN,)  # exact origins, or "*" for any
    client_requests_per_second: int = 300  # per client address, sustained...
    client_burst: int = 600  # ...and in a burst
    global_requests_per_second: int = 5000  # all clients of one Envoy together
    global_burst: int = 10000
    headers_timeout_seconds: float = 10  # request headers must arrive within this (408)
    request_timeout_seconds: float = 300  # the whole request, body included (408)
    idle_timeout_seconds: float = 60  # no bytes either way for this long (408)
    upstream_timeout_seconds: float = 300  # the server's answer (524 after it)
    max_request_headers_kb: int = 60  # larger headers are refused (413)
    max_connections: int = 10000  # open client connections per Envoy; more are refused

    @property
    def any_origin(self) -> bool:
        return ANY_ORIGIN in self.cors_origins


DEFAULT_EDGE = EdgePolicy()

_EDGE_VARIABLES = {
    "client_requests_per_second": ("GATEWAY_EDGE_CLIENT_RPS", int),
    "client_burst": ("GATEWAY_EDGE_CLIENT_BURST", int),
    "global_requests_per_second": ("GATEWAY_EDGE_GLOBAL_RPS", int),
    "global_burst": ("GATEWAY_EDGE_GLOBAL_BURST", int),
    "headers_timeout_seconds": ("GATEWAY_EDGE_HEADERS_TIMEOUT_SECONDS", float),
    "request_timeout_seconds": ("GATEWAY_EDGE_REQUEST_TIMEOUT_SECONDS", float),
    "idle_timeout_seconds": ("GATEWAY_EDGE_IDLE_TIMEOUT_SECONDS", float),
    "upstream_timeout_seconds": ("GATEWAY_EDGE_UPSTREAM_TIMEOUT_SECONDS", float),
    "max_request_headers_kb": ("GATEWAY_EDGE_MAX_HEADERS_KB", int),
    "max_connections": ("GATEWAY_EDGE_MAX_CONNECTIONS", int),
}


def edge_policy_from_environment(env: Mapping[str, str]) -> EdgePolicy:
    values: dict[str, object] = {}
    origins = env.get("GATEWAY_CORS_ORIGINS")
    if origins:
        listed = tuple(o.strip() for o in origins.split(",") if o.strip())
        for origin in listed:
            if origin != ANY_ORIGIN and not ORIGIN.match(origin):
                raise SettingsError(
                    f"GATEWAY_CORS_ORIGINS: {origin!r} is not an origin like https://app.example.com"
                )
        values["cors_origins"] = listed
    for name, (variable, kind) in _EDGE_VARIABLES.items():
        if env.get(variable):
            try:
                value = kind(env[variable])
            except ValueError as exc:
                raise SettingsError(f"{variable} must be a number, not {env[variable]!r}") from exc
            if value <= 0:
                raise SettingsError(f"{variable} must be greater than 0")
            values[name] = value
    return EdgePolicy(**values)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Settings:
    data_dir: Path
    database_url: str
    grpc_host: str = "127.0.0.1"
    grpc_port: int = 50051
    http_host: str = "127.0.0.1"
    http_port: int = 8080
    envoy_admin_port: int = 0  # GATEWAY_ENVOY_ADMIN_PORT; 0: Envoy picks a free port
    max_request_bytes: int = 50 * 1024 * 1024
    catalog_file: str | None = None  # the operator's catalog, added to the built-in one
    job_lease_seconds: float = 120.0  # a dead worker's job is taken up again after this
    video_retention_seconds: float = 86400.0  # completed videos expire after this
    maintenance_interval_seconds: float = 5.0  # how often housekeeping runs (maintenance/)
    webhook_ca_bundle: str | None = None  # an extra CA file trusted for webhook TLS
    webhook_allow_private: bool = False  # allow loopback/private webhook targets
    regional_hosts: frozenset[str] = frozenset()  # hostnames refused on vault routes
    metrics_host: str = "127.0.0.1"
    # Prometheus /metrics of this process; 0 (the default): not served. Off unless asked
    # for, so that gateways and workers on one host never contend for one fixed port.
    metrics_port: int = 0
    shutdown_grace_seconds: float = 30.0  # in-flight requests may finish within this
    health_interval_seconds: float = 2.0  # how often the database is pinged for health
    # Worker processes for CPU-bound work (server.compute), per server process: audio
    # decoding before admission, and the local speech model with its queue (a request
    # finding both full is answered 429 with Retry-After, never left to stall others).
    decode_workers: int = 2
    local_stt_workers: int = 2
    local_stt_queue: int = 2
    edge: EdgePolicy = DEFAULT_EDGE

    @property
    def content_dir(self) -> Path:
        """Where finished videos are kept (GATEWAY_CONTENT_DIR, default DATA_DIR/content)."""
        return Path(os.environ.get("GATEWAY_CONTENT_DIR") or self.data_dir / "content")

    @property
    def grpc_target(self) -> str:
        return f"{self.grpc_host}:{self.grpc_port}"


def sqlite_url(data_dir: Path) -> str:
    return f"sqlite+aiosqlite:///{(data_dir / 'gateway.db').resolve()}"


def load_settings(
    data_dir: str | os.PathLike[str] | None = None,
    database_url: str | None = None,
    **overrides: object,
) -> Settings:
    """Resolve settings; `None` means "not given on the command line"."""
    env = os.environ
    folder = Path(data_dir or env.get("GATEWAY_DATA_DIR") or DEFAULT_DATA_DIR)
    url = database_url or env.get("GATEWAY_DATABASE_URL") or sqlite_url(folder)
    given = {k: v for k, v in overrides.items() if v is not None}
    if "catalog_file" not in given and env.get("GATEWAY_CATALOG"):
        given["catalog_file"] = env["GATEWAY_CATALOG"]
    if "regional_hosts" not in given and env.get("GATEWAY_REGIONAL_HOSTS"):
        given["regional_hosts"] = frozenset(
            dns_name(h) for h in env["GATEWAY_REGIONAL_HOSTS"].split(",") if h.strip()
        )
    if "webhook_ca_bundle" not in given and env.get("GATEWAY_WEBHOOK_CA_BUNDLE"):
        given["webhook_ca_bundle"] = env["GATEWAY_WEBHOOK_CA_BUNDLE"]
    if "webhook_allow_private" not in given:
        given["webhook_allow_private"] = env.get("GATEWAY_WEBHOOK_ALLOW_PRIVATE") == "1"
    for name, variable in (
        ("job_lease_seconds", "GATEWAY_JOB_LEASE_SECONDS"),
        ("video_retention_seconds", "GATEWAY_VIDEO_RETENTION_SECONDS"),
        ("shutdown_grace_seconds", "GATEWAY_SHUTDOWN_GRACE_SECONDS"),
        ("health_interval_seconds", "GATEWAY_HEALTH_INTERVAL_SECONDS"),
        ("maintenance_interval_seconds", "GATEWAY_MAINTENANCE_INTERVAL_SECONDS"),
    ):
        if name not in given and env.get(variable):
            given[name] = float(env[variable])
    for name, variable in (
        ("decode_workers", "GATEWAY_DECODE_WORKERS"),
        ("local_stt_workers", "GATEWAY_LOCAL_STT_WORKERS"),
        ("local_stt_queue", "GATEWAY_LOCAL_STT_QUEUE"),
    ):
        if name not in given and env.get(variable):
            given[name] = int(env[variable])
    if "edge" not in given:
        given["edge"] = edge_policy_from_environment(env)
    if "metrics_host" not in given and env.get("GATEWAY_METRICS_HOST"):
        given["metrics_host"] = env["GATEWAY_METRICS_HOST"]
    if "metrics_port" not in given and env.get("GATEWAY_METRICS_PORT"):
        given["metrics_port"] = int(env["GATEWAY_METRICS_PORT"])
    if "envoy_admin_port" not in given and env.get("GATEWAY_ENVOY_ADMIN_PORT"):
        given["envoy_admin_port"] = int(env["GATEWAY_ENVOY_ADMIN_PORT"])

    return Settings(data_dir=folder, database_url=normalize_database_url(url), **given)  # type: ignore[arg-type]


def normalize_database_url(url: str) -> str:
    """Accept the plain URLs operators write and pick the async driver for them."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://") :]
    if url.startswith("postgresql://"):
        return "postgresql+asyncpg://" + url[len("postgresql://") :]
    if url.startswith("sqlite:///"):
        return "sqlite+aiosqlite:///" + url[len("sqlite:///") :]
    return url
