"""Operator settings: command-line flags over environment variables (GATEWAY_*) over
defaults, declared as a pydantic-settings model; a wrong value is a SettingsError naming
the variable."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from server.hostnames import dns_name

DEFAULT_DATA_DIR = "gateway-data"
# The video worker's outbound bounds (defaults of the settings below, used where a component
# is built without settings: tests, benches).
VIDEO_MAX_BYTES = 2 * 1024**3  # one provider result file
VIDEO_DOWNLOAD_SECONDS = 900.0  # one provider result download, start to end
VIDEO_IMAGE_MAX_BYTES = 20 * 1024**2  # one client image (Veo's own inline limit)
VIDEO_IMAGE_FETCH_SECONDS = 30.0  # one client image fetch, start to end
VIDEO_JOBS_AT_ONCE = 8  # jobs one server process's video worker runs concurrently
ANY_ORIGIN = "*"
ORIGIN = re.compile(r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?$")


class SettingsError(ValueError):
    """An operator setting is wrong; the message names it."""


def _listed(value: Any) -> Any:
    """A comma-separated variable as its items (blank items dropped)."""
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


def _origin(origin: str) -> str:
    if origin != ANY_ORIGIN and not ORIGIN.match(origin):
        raise ValueError(f"{origin!r} is not an origin like https://app.example.com")
    return origin


Origins = Annotated[tuple[Annotated[str, AfterValidator(_origin)], ...], BeforeValidator(_listed)]
Hosts = Annotated[
    frozenset[Annotated[str, AfterValidator(dns_name)]], NoDecode, BeforeValidator(_listed)
]


def _content_url(url: str) -> str:
    """GATEWAY_CONTENT_URL: empty, file:///absolute/path or s3://bucket/prefix. The value is
    never echoed: a mistyped one may carry a secret."""
    if not url or (url.startswith("file:///") and len(url) > len("file:///")):
        return url
    if url.startswith("s3://"):
        parts = urlsplit(url)
        if parts.username is not None or parts.password is not None or "@" in parts.netloc:
            raise ValueError(
                "must not carry credentials: they come from AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY"
            )
        if parts.netloc and not parts.query and not parts.fragment and ":" not in parts.netloc:
            return url
    raise ValueError("must be s3://bucket/prefix or file:///absolute/path (or empty)")


def _seconds(default: float, variable: str) -> Any:
    return Field(default, gt=0, allow_inf_nan=False, alias=variable)


class EdgePolicy(BaseModel):
    """What Envoy enforces before a request reaches a server: CORS, flood protection,
    timeouts and header size. Generous defaults: normal use never meets them. Each field
    is read from the variable its alias names."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="ignore")

    cors_origins: Origins = Field((ANY_ORIGIN,), alias="GATEWAY_CORS_ORIGINS")  # or "*": any
    # per client address, sustained... and in a burst
    client_requests_per_second: int = Field(300, gt=0, alias="GATEWAY_EDGE_CLIENT_RPS")
    client_burst: int = Field(600, gt=0, alias="GATEWAY_EDGE_CLIENT_BURST")
    # all clients of one Envoy together
    global_requests_per_second: int = Field(5000, gt=0, alias="GATEWAY_EDGE_GLOBAL_RPS")
    global_burst: int = Field(10000, gt=0, alias="GATEWAY_EDGE_GLOBAL_BURST")
    # request headers must arrive within this (408)
    headers_timeout_seconds: float = _seconds(10, "GATEWAY_EDGE_HEADERS_TIMEOUT_SECONDS")
    # the whole request, body included (408)
    request_timeout_seconds: float = _seconds(300, "GATEWAY_EDGE_REQUEST_TIMEOUT_SECONDS")
    # no bytes either way for this long (408)
    idle_timeout_seconds: float = _seconds(60, "GATEWAY_EDGE_IDLE_TIMEOUT_SECONDS")
    # the server's answer (524 after it)
    upstream_timeout_seconds: float = _seconds(300, "GATEWAY_EDGE_UPSTREAM_TIMEOUT_SECONDS")
    # larger headers are refused (413)
    max_request_headers_kb: int = Field(60, gt=0, alias="GATEWAY_EDGE_MAX_HEADERS_KB")
    # open client connections per Envoy; more are refused
    max_connections: int = Field(10000, gt=0, alias="GATEWAY_EDGE_MAX_CONNECTIONS")
    # the body of a request to a route that carries no media (keys, vault, guardrails,
    # workspaces, BYOK: JSON of a few KiB); 413 past it. Media routes (transcriptions, video
    # submissions) take up to GATEWAY_MAX_REQUEST_BYTES
    max_control_body_bytes: int = Field(
        1024 * 1024, gt=0, alias="GATEWAY_EDGE_MAX_CONTROL_BODY_BYTES"
    )
    # Envoy's heap: past 95% of it new requests get 503 + Retry-After until it falls
    max_heap_bytes: int = Field(1024**3, ge=64 * 1024**2, alias="GATEWAY_EDGE_MAX_HEAP_BYTES")

    @property
    def any_origin(self) -> bool:
        return ANY_ORIGIN in self.cors_origins


DEFAULT_EDGE = EdgePolicy()


def _problem(error: ErrorDetails, name: str) -> str:
    """One pydantic error as the sentence an operator reads, naming the variable."""
    kind = error["type"]
    if kind in ("int_parsing", "float_parsing", "int_from_float"):
        return f"{name} must be a number, not {error['input']!r}"
    if kind == "bool_parsing":
        return f"{name} must be 1 or 0 (true or false), not {error['input']!r}"
    if kind in ("greater_than", "greater_than_equal", "less_than_equal"):
        return f"{name} {str(error['msg']).replace('Input should be', 'must be')}"
    return f"{name}: {str(error['msg']).removeprefix('Value error, ')}"


def settings_error(exc: ValidationError, name_of: Callable[[str], str] = str) -> SettingsError:
    """The one adapter from a pydantic ValidationError to the operator's message; `name_of`
    turns the field (the first part of the error's location) into what the operator set."""
    return SettingsError(
        "; ".join(
            _problem(e, name_of(str(e["loc"][0])) if e["loc"] else "settings") for e in exc.errors()
        )
    )


def edge_policy_from_environment(env: Mapping[str, str]) -> EdgePolicy:
    """The edge policy the environment asks for; an empty variable means its default."""
    names = {field.alias for field in EdgePolicy.model_fields.values()}
    given = {name: value for name, value in env.items() if name in names and value}
    try:
        return EdgePolicy.model_validate(given)
    except ValidationError as exc:
        raise settings_error(exc) from None


def _variable(name: str) -> Any:
    return AliasChoices(name, name.removeprefix("GATEWAY_").lower())


class Settings(BaseSettings):
    """The resolved settings. Each field reads GATEWAY_<FIELD> (or the variable its alias
    names) unless given on the command line (init arguments win)."""

    model_config = SettingsConfigDict(
        env_prefix="GATEWAY_",
        env_ignore_empty=True,  # an empty variable is as good as unset
        frozen=True,
        extra="ignore",
        populate_by_name=True,
    )

    data_dir: Path = Path(DEFAULT_DATA_DIR)
    database_url: str = ""  # empty: SQLite in data_dir
    grpc_host: str = "127.0.0.1"
    grpc_port: int = Field(50051, ge=0, le=65535)
    http_host: str = "127.0.0.1"
    http_port: int = Field(8080, ge=0, le=65535)
    envoy_admin_port: int = Field(0, ge=0, le=65535)  # 0: Envoy picks a free port
    # A request body's bytes, per request (Envoy's 413 and the server's, streamed or not).
    max_request_bytes: int = Field(50 * 1024 * 1024, gt=0)
    # Request bodies one server process holds at once, counted as 4x their bytes (what
    # parsing holds at the peak): a body that finds it spent waits body_budget_wait_seconds,
    # then is refused with 503 and Retry-After (server/transcription/body.py).
    body_budget_bytes: int = Field(512 * 1024 * 1024, gt=0)
    body_budget_wait_seconds: float = Field(2.0, ge=0, allow_inf_nan=False)
    # the operator's catalog, added to the built-in one
    catalog_file: str | None = Field(None, validation_alias=_variable("GATEWAY_CATALOG"))
    job_lease_seconds: float = Field(120.0, gt=0, allow_inf_nan=False)  # dead worker's job
    # A provider's result file: streamed into the content store, at most this many bytes
    # and within this many seconds (past either the job fails, uncharged, and is not
    # fetched again).
    video_max_bytes: int = Field(VIDEO_MAX_BYTES, gt=0)
    video_download_seconds: float = Field(VIDEO_DOWNLOAD_SECONDS, gt=0, allow_inf_nan=False)
    # A client's image URL the gateway fetches for a provider that takes images inline
    # (Veo): at most this many bytes, within this many seconds (past either: the job fails).
    video_image_max_bytes: int = Field(VIDEO_IMAGE_MAX_BYTES, gt=0)
    video_image_fetch_seconds: float = Field(VIDEO_IMAGE_FETCH_SECONDS, gt=0, allow_inf_nan=False)
    # Video jobs one server process works on at once (a slow fetch holds only its own job).
    video_jobs_at_once: int = Field(VIDEO_JOBS_AT_ONCE, ge=1)
    video_retention_seconds: float = Field(86400.0, gt=0, allow_inf_nan=False)
    # Where finished videos are kept: empty (the default: DATA_DIR/content, or
    # GATEWAY_CONTENT_DIR), file:///path (a local folder), or s3://bucket/prefix
    # (S3-compatible object storage shared by several hosts; credentials, region and
    # endpoint from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT_URL).
    content_url: Annotated[str, AfterValidator(_content_url)] = ""
    # The store is checked before serving (the bucket exists and answers) within this.
    content_check_seconds: float = Field(10.0, gt=0, le=300, allow_inf_nan=False)
    # An upload to object storage holds one part of this many bytes in memory per video
    # being stored (S3's parts: 5 MiB at least, 5 GiB at most).
    content_part_bytes: int = Field(8 * 1024**2, ge=5 * 1024**2, le=5 * 1024**3)
    # how often housekeeping runs (server/maintenance/)
    maintenance_interval_seconds: float = Field(5.0, gt=0, allow_inf_nan=False)
    webhook_ca_bundle: str | None = None  # an extra CA file trusted for webhook TLS
    # The HTTP transport under the one provider client: the gateway's own (server/providers/
    # transport.py), httpx's default (httpcore), or aiohttp's (needs the `bench` extra's
    # httpx-aiohttp). For measurement side by side (bench.transcription --provider-transport).
    provider_transport: Literal["gateway", "httpx", "aiohttp"] = "gateway"
    webhook_allow_private: bool = False  # allow loopback/private webhook targets
    # One webhook attempt, whole (DNS, connect, TLS, request, status, the answer's prefix):
    # without a status by then it failed and is retried on the backoff schedule.
    webhook_deadline_seconds: float = Field(10.0, gt=0, le=300, allow_inf_nan=False)
    # Deliveries in flight at once per server process, and of one workspace at once across
    # all processes (counted in the database): one workspace's slow receiver holds at most
    # its own share, never every slot.
    webhook_concurrency: int = Field(16, ge=2, le=1024)
    webhook_workspace_concurrency: int = Field(4, ge=1, le=1024)
    # The most of a receiver's answer read past its status (which alone counts); a longer
    # answer's connection is closed, not drained.
    webhook_max_answer_bytes: int = Field(16 * 1024, ge=0, le=1024 * 1024)
    # allow provider result downloads and image fetches (not on the endpoint's own origin)
    # from loopback/private addresses: a provider whose CDN lives inside the operator's network
    provider_downloads_allow_private: bool = False
    regional_hosts: Hosts = frozenset()  # hostnames refused on vault routes
    metrics_host: str = "127.0.0.1"
    # Prometheus /metrics of this process; 0 (the default): not served. Off unless asked
    # for, so that gateways and workers on one host never contend for one fixed port.
    metrics_port: int = Field(0, ge=0, le=65535)
    shutdown_grace_seconds: float = Field(30.0, ge=0, allow_inf_nan=False)
    # Key rotation (POST /api/v1/keys/{hash}/rotate): how long the old key keeps working when
    # the request names no grace_seconds, and the longest grace a request may ask for.
    key_rotation_grace_seconds: int = Field(86400, ge=0, le=31 * 86400)
    key_rotation_max_grace_seconds: int = Field(30 * 86400, ge=0, le=366 * 86400)
    # `gateway up` restarts a server process (--workers N) or Envoy that dies, after a
    # backoff that starts here and doubles with each death in the window, up to the max;
    # the limit-th death of one process within the window stops the gateway (exit 1).
    restart_limit: int = Field(5, ge=1)
    restart_window_seconds: float = Field(60.0, gt=0, allow_inf_nan=False)
    restart_backoff_seconds: float = Field(0.5, ge=0, allow_inf_nan=False)
    restart_backoff_max_seconds: float = Field(10.0, ge=0, allow_inf_nan=False)
    health_interval_seconds: float = Field(2.0, gt=0, allow_inf_nan=False)
    # How far this host's clock may be from the database server's (PostgreSQL) at start:
    # processes on one database compare times each of them wrote (server/db/clockcheck.py).
    max_clock_skew_seconds: float = Field(2.0, gt=0, le=3600, allow_inf_nan=False)
    # Worker processes for CPU-bound work (server.compute), per server process: audio
    # decoding before admission, and the local speech model with its queue (a request
    # finding both full is answered 429 with Retry-After, never left to stall others).
    decode_workers: int = Field(2, ge=1)
    local_stt_workers: int = Field(2, ge=1)
    local_stt_queue: int = Field(2, ge=0)
    # The platform fee on requests served with a workspace's own provider key (BYOK): this
    # percentage of the provider cost the catalog prices, after this many free BYOK
    # requests per account and UTC month (OpenRouter's: 5% after 1,000,000).
    byok_fee_percent: Decimal = Field(Decimal(5), ge=0, le=100, allow_inf_nan=False)
    byok_free_requests_per_month: int = Field(1_000_000, ge=0)
    edge: EdgePolicy = Field(default_factory=lambda: edge_policy_from_environment(os.environ))

    @model_validator(mode="after")
    def _database(self) -> Settings:
        url = normalize_database_url(self.database_url or sqlite_url(self.data_dir))
        object.__setattr__(self, "database_url", url)
        return self

    @model_validator(mode="after")
    def _webhook_shares(self) -> Settings:
        if self.webhook_workspace_concurrency >= self.webhook_concurrency:
            raise ValueError(
                "GATEWAY_WEBHOOK_WORKSPACE_CONCURRENCY "
                f"({self.webhook_workspace_concurrency}) must be below "
                f"GATEWAY_WEBHOOK_CONCURRENCY ({self.webhook_concurrency}): one workspace's "
                "slow receiver must leave deliveries to the others"
            )
        return self

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
    given = {k: v for k, v in overrides.items() if v is not None}
    if data_dir:
        given["data_dir"] = Path(data_dir)
    if database_url:
        given["database_url"] = database_url

    def name_of(field: str) -> str:
        if field in given:  # a command-line flag
            return f"--{field.replace('_', '-')}"
        return field if field.startswith("GATEWAY_") else f"GATEWAY_{field.upper()}"

    try:
        return Settings(**given)  # type: ignore[arg-type]  # **overrides: object; pydantic checks each field
    except ValidationError as exc:
        raise settings_error(exc, name_of) from None


def normalize_database_url(url: str) -> str:
    """Accept the plain URLs operators write and pick the async driver for them."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://") :]
    if url.startswith("postgresql://"):
        return "postgresql+asyncpg://" + url[len("postgresql://") :]
    if url.startswith("sqlite:///"):
        return "sqlite+aiosqlite:///" + url[len("sqlite:///") :]
    return url
