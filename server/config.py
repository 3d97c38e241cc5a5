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
VIDEO_WORKSPACE_JOBS_AT_ONCE = 6  # of them, one workspace's at once across every process
ANY_ORIGIN = "*"
ORIGIN = re.compile(r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?$")


# Variables read where they are used rather than through Settings (each reader names its
# variable); listed here so that the configuration reference, generated from this module,
# names every variable the gateway reads. tests/unit/test_docs.py keeps the list complete.
READ_ELSEWHERE: dict[str, tuple[str, str]] = {
    "GATEWAY_VAULT_MASTER_KEY": (
        "a key file in the data dir",
        "The vault's master key (base64 of 32 bytes); every process on one database must "
        "hold the same one (checked at start); `gateway vault rotate-master-key` re-wraps the "
        "data keys under a new one.",
    ),
    "GATEWAY_CONTENT_DIR": (
        "DATA_DIR/content",
        "The local folder of finished videos, when GATEWAY_CONTENT_URL is empty.",
    ),
    "GATEWAY_LOG_FORMAT": ("json", "`json` (one object per line on stderr) or `text`."),
    "GATEWAY_ENVOY_LOG_LEVEL": (
        "warning",
        "Envoy's log level; its log is DATA_DIR/envoy/envoy.log, crashes in envoy.stderr.",
    ),
    "GATEWAY_MIGRATE_DATABASE_URL": (
        "",
        "Internal: how a migration's child process is told the database; never set it.",
    ),
}


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


def _seconds(default: float, variable: str, description: str) -> Any:
    return Field(default, gt=0, allow_inf_nan=False, alias=variable, description=description)


# How much longer a REST listener keeps an idle connection than Envoy does.
LISTENER_IDLE_MARGIN_SECONDS = 5.0


class EdgePolicy(BaseModel):
    """What Envoy enforces before a request reaches a server: CORS, flood protection,
    timeouts and header size. Generous defaults: normal use never meets them. Each field
    is read from the variable its alias names."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="ignore")

    cors_origins: Origins = Field(
        (ANY_ORIGIN,),
        alias="GATEWAY_CORS_ORIGINS",
        description="Comma-separated origins allowed to call from a browser; `*`: any.",
    )
    client_requests_per_second: int = Field(
        300,
        gt=0,
        alias="GATEWAY_EDGE_CLIENT_RPS",
        description="Requests per second one client address may sustain (flood protection).",
    )
    client_burst: int = Field(
        600,
        gt=0,
        alias="GATEWAY_EDGE_CLIENT_BURST",
        description="Requests one client address may send in a burst above its rate.",
    )
    global_requests_per_second: int = Field(
        5000,
        gt=0,
        alias="GATEWAY_EDGE_GLOBAL_RPS",
        description="Requests per second all clients of one Envoy may sustain together.",
    )
    global_burst: int = Field(
        10000,
        gt=0,
        alias="GATEWAY_EDGE_GLOBAL_BURST",
        description="Requests all clients of one Envoy may send together in a burst.",
    )
    headers_timeout_seconds: float = _seconds(
        10,
        "GATEWAY_EDGE_HEADERS_TIMEOUT_SECONDS",
        "Request headers must arrive within this (else 408).",
    )
    request_timeout_seconds: float = _seconds(
        300,
        "GATEWAY_EDGE_REQUEST_TIMEOUT_SECONDS",
        "The whole request, body included, must arrive within this (else 408).",
    )
    idle_timeout_seconds: float = _seconds(
        60,
        "GATEWAY_EDGE_IDLE_TIMEOUT_SECONDS",
        "A connection with no bytes either way for this long is closed (408).",
    )
    upstream_timeout_seconds: float = _seconds(
        300,
        "GATEWAY_EDGE_UPSTREAM_TIMEOUT_SECONDS",
        "How long Envoy waits for the server's answer (524 after it).",
    )
    max_request_headers_kb: int = Field(
        60,
        gt=0,
        alias="GATEWAY_EDGE_MAX_HEADERS_KB",
        description="Larger request headers are refused (413).",
    )
    max_connections: int = Field(
        10000,
        gt=0,
        alias="GATEWAY_EDGE_MAX_CONNECTIONS",
        description="Open client connections per Envoy; more are refused.",
    )
    max_control_body_bytes: int = Field(
        1024 * 1024,
        gt=0,
        alias="GATEWAY_EDGE_MAX_CONTROL_BODY_BYTES",
        description="The body of a request to a route that carries no media (keys, vault, "
        "guardrails, workspaces, BYOK: JSON of a few KiB); 413 past it, refused before it is "
        "read when announced. Media routes take up to GATEWAY_MAX_REQUEST_BYTES.",
    )
    max_heap_bytes: int = Field(
        1024**3,
        ge=64 * 1024**2,
        alias="GATEWAY_EDGE_MAX_HEAP_BYTES",
        description="Envoy's heap: past 95% of it new requests get 503 with Retry-After "
        "until it falls (the heap is shrunk from 90%).",
    )

    @property
    def any_origin(self) -> bool:
        return ANY_ORIGIN in self.cors_origins

    @property
    def upstream_idle_seconds(self) -> float:
        """Envoy closes a connection to a server process's REST listener that carried no
        request for this long."""
        return self.idle_timeout_seconds

    @property
    def listener_idle_seconds(self) -> float:
        """A REST listener closes a connection that brought no whole request for this long:
        later than Envoy closes its own idle ones (upstream_idle_seconds), so Envoy never
        sends a request on a connection the listener is closing."""
        return self.idle_timeout_seconds + LISTENER_IDLE_MARGIN_SECONDS


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

    data_dir: Path = Field(
        Path(DEFAULT_DATA_DIR),
        description="Folder of the embedded SQLite database, the keys and Envoy's runtime "
        "files; kept private to its owner.",
    )
    database_url: str = Field(
        "",
        description="SQLAlchemy URL of the database; `postgresql://…` uses asyncpg. "
        "Empty: a SQLite file in the data dir.",
    )
    grpc_host: str = Field("127.0.0.1", description="Address the gRPC server listens on.")
    grpc_port: int = Field(
        50051, ge=0, le=65535, description="Port of the gRPC server; 0: a free port."
    )
    rest_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Port of the server's HTTP/1.1 listener for the hot REST routes "
        "(POST /audio/transcriptions, GET /key: Envoy proxies them there instead of "
        "transcoding them to gRPC), on the gRPC server's address; 0: a free port.",
    )
    http_host: str = Field("127.0.0.1", description="Address Envoy serves REST on.")
    http_port: int = Field(8080, ge=0, le=65535, description="Envoy's REST port; 0: a free port.")
    envoy_admin_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Envoy's admin endpoint on 127.0.0.1; 0: a free port Envoy picks.",
    )
    max_request_bytes: int = Field(
        50 * 1024 * 1024,
        gt=0,
        description="A media route's request body (transcriptions, video submissions), per "
        "request: Envoy's 413 and the server's, streamed or not.",
    )
    body_budget_bytes: int = Field(
        512 * 1024 * 1024,
        gt=0,
        description="Request bodies one server process holds at once, each counted as 4x its "
        "bytes (what parsing holds at the peak; server/transcription/body.py): a body that "
        "finds it spent waits GATEWAY_BODY_BUDGET_WAIT_SECONDS, then is refused with 503 and "
        "Retry-After (413 if it could never fit).",
    )
    body_budget_workspace_bytes: int | None = Field(
        None,
        gt=0,
        description="What one workspace's request bodies may hold of the body budget at once "
        "(counted as the budget counts them), so that one tenant's burst of large uploads "
        "leaves room for the others; unset: the budget but room for one largest body "
        "(4x GATEWAY_MAX_REQUEST_BYTES), and at least half of it.",
    )
    body_budget_wait_seconds: float = Field(
        2.0,
        ge=0,
        allow_inf_nan=False,
        description="How long a request body waits for the body budget before its 503.",
    )
    catalog_file: str | None = Field(
        None,
        validation_alias=_variable("GATEWAY_CATALOG"),
        description="The operator's provider catalog (TOML), added to the built-in one.",
    )
    job_lease_seconds: float = Field(
        120.0,
        gt=0,
        allow_inf_nan=False,
        description="How long a video worker holds a job before another process may take it "
        "over (the holder is presumed dead).",
    )
    video_max_bytes: int = Field(
        VIDEO_MAX_BYTES,
        gt=0,
        description="A provider's result file, streamed into the content store (never held "
        "whole in memory): past this many bytes the job fails for good, uncharged, nothing "
        "partial is left and it is not fetched again.",
    )
    video_download_seconds: float = Field(
        VIDEO_DOWNLOAD_SECONDS,
        gt=0,
        allow_inf_nan=False,
        description="One provider result download, start to end: past it the job fails as "
        "for GATEWAY_VIDEO_MAX_BYTES.",
    )
    video_image_max_bytes: int = Field(
        VIDEO_IMAGE_MAX_BYTES,
        gt=0,
        description="A client's image URL the gateway fetches for a provider that takes "
        "images inline (Veo): past this many bytes the job fails as the client's fault, "
        "uncharged.",
    )
    video_image_fetch_seconds: float = Field(
        VIDEO_IMAGE_FETCH_SECONDS,
        gt=0,
        allow_inf_nan=False,
        description="One client image fetch, start to end (past it: as for "
        "GATEWAY_VIDEO_IMAGE_MAX_BYTES).",
    )
    video_jobs_at_once: int = Field(
        VIDEO_JOBS_AT_ONCE,
        ge=2,
        description="Video jobs one server process works on concurrently, each lease renewed "
        "while it runs: a slow provider, image host or download holds only its own job.",
    )
    video_workspace_jobs_at_once: int = Field(
        VIDEO_WORKSPACE_JOBS_AT_ONCE,
        ge=1,
        description="Video jobs of one workspace under way at once across all processes "
        "(counted in the database); below GATEWAY_VIDEO_JOBS_AT_ONCE, so that one "
        "workspace's slow jobs leave slots to the others.",
    )
    video_retention_seconds: float = Field(
        86400.0,
        gt=0,
        allow_inf_nan=False,
        description="How long a finished video's content is kept.",
    )
    content_url: Annotated[str, AfterValidator(_content_url)] = Field(
        "",
        description="Where finished videos are kept: empty, the local folder "
        "GATEWAY_CONTENT_DIR; `file:///absolute/path`, that folder; `s3://bucket/prefix`, "
        "S3-compatible object storage shared by several hosts (credentials, region and "
        "endpoint from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, "
        "AWS_ENDPOINT_URL; never in the URL).",
    )
    content_check_seconds: float = Field(
        10.0,
        gt=0,
        le=300,
        allow_inf_nan=False,
        description="The content store is checked before serving (the bucket exists and "
        "answers) within this, or the server stops with one line naming GATEWAY_CONTENT_URL.",
    )
    content_part_bytes: int = Field(
        8 * 1024**2,
        ge=5 * 1024**2,
        le=5 * 1024**3,
        description="An upload to object storage holds one part of this many bytes in memory "
        "per video being stored (S3's parts: 5 MiB to 5 GiB).",
    )
    maintenance_interval_seconds: float = Field(
        5.0,
        gt=0,
        allow_inf_nan=False,
        description="How often each process runs housekeeping (server/maintenance/): lapsed "
        "holds, expired videos, ended rate windows.",
    )
    webhook_ca_bundle: str | None = Field(
        None, description="An extra CA file trusted for webhook TLS."
    )
    provider_transport: Literal["gateway", "httpx", "aiohttp"] = Field(
        "gateway",
        description="The HTTP transport under the one provider client: the gateway's own "
        "(server/providers/transport.py), httpx's default, or aiohttp's (httpx-aiohttp, needs "
        "the `bench` extra); for measuring them side by side "
        "(bench.transcription --provider-transport).",
    )
    webhook_allow_private: bool = Field(
        False, description="Allow webhook targets on loopback or private addresses."
    )
    webhook_deadline_seconds: float = Field(
        10.0,
        gt=0,
        le=300,
        allow_inf_nan=False,
        description="One webhook attempt, whole (DNS, connect, TLS, request, status, the "
        "answer's prefix): without a status by then it failed and is retried on the backoff "
        "schedule.",
    )
    # one workspace's slow receiver holds at most its own share, never every slot
    webhook_concurrency: int = Field(
        16, ge=2, le=1024, description="Webhook deliveries in flight at once per server process."
    )
    webhook_workspace_concurrency: int = Field(
        4,
        ge=1,
        le=1024,
        description="Webhook deliveries of one workspace in flight at once across all "
        "processes (counted in the database); below GATEWAY_WEBHOOK_CONCURRENCY.",
    )
    webhook_max_answer_bytes: int = Field(
        16 * 1024,
        ge=0,
        le=1024 * 1024,
        description="The most of a receiver's answer read past its status (which alone "
        "counts); a longer answer's connection is closed, not drained.",
    )
    provider_downloads_allow_private: bool = Field(
        False,
        description="Allow provider result downloads and image fetches off the endpoint's own "
        "origin to reach loopback or private addresses (a provider CDN inside the operator's "
        "network); otherwise they must be https to a public address, checked after DNS.",
    )
    regional_hosts: Hosts = Field(
        frozenset(), description="Comma-separated hostnames refused (403) on vault routes."
    )
    metrics_host: str = Field("127.0.0.1", description="Address of the Prometheus /metrics.")
    # off unless asked for, so that gateways and workers on one host never contend for a port
    metrics_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Port of this process's Prometheus /metrics; 0: not served.",
    )
    shutdown_grace_seconds: float = Field(
        30.0,
        ge=0,
        allow_inf_nan=False,
        description="How long in-flight requests may finish after SIGTERM.",
    )
    key_rotation_grace_seconds: int = Field(
        86400,
        ge=0,
        le=31 * 86400,
        description="Key rotation (POST /api/v1/keys/{hash}/rotate): how long the old key "
        "keeps working when the request names no grace_seconds.",
    )
    key_rotation_max_grace_seconds: int = Field(
        30 * 86400,
        ge=0,
        le=366 * 86400,
        description="The longest grace a key rotation request may ask for.",
    )
    restart_limit: int = Field(
        5,
        ge=1,
        description="`gateway up` stops (exit 1) at the limit-th death of one of its server "
        "processes or Envoy within the restart window.",
    )
    restart_window_seconds: float = Field(
        60.0,
        gt=0,
        allow_inf_nan=False,
        description="The window in which deaths of one process are counted.",
    )
    restart_backoff_seconds: float = Field(
        0.5,
        ge=0,
        allow_inf_nan=False,
        description="The first wait before a dead process is restarted; it doubles with each "
        "death in the window.",
    )
    restart_backoff_max_seconds: float = Field(
        10.0, ge=0, allow_inf_nan=False, description="The longest wait before a restart."
    )
    health_interval_seconds: float = Field(
        2.0,
        gt=0,
        allow_inf_nan=False,
        description="How often each process pings the database for its gRPC health.",
    )
    max_clock_skew_seconds: float = Field(
        2.0,
        gt=0,
        le=3600,
        allow_inf_nan=False,
        description="How far this host's clock may be from the database server's "
        "(PostgreSQL) at start: processes on one database compare times each of them wrote "
        "(server/db/clockcheck.py).",
    )
    # CPU-bound work runs in worker processes (server.compute), never on the event loop; a
    # request finding the pool and its queue full is answered 429, never left to stall others
    decode_workers: int = Field(
        2,
        ge=1,
        description=(
            "Worker processes per server process decoding audio, and parsing transcription"
            " bodies over 1 MiB, before admission."
        ),
    )
    local_stt_workers: int = Field(
        2, ge=1, description="Worker processes per server process running the local speech model."
    )
    local_stt_queue: int = Field(
        2,
        ge=0,
        description="Requests queued for the local speech model beyond its workers; more are "
        "answered 429 with Retry-After.",
    )
    byok_fee_percent: Decimal = Field(
        Decimal(5),
        ge=0,
        le=100,
        allow_inf_nan=False,
        description="The platform fee on requests served with a workspace's own provider key "
        "(BYOK), as a percentage of the provider cost the catalog prices (OpenRouter's: 5%).",
    )
    byok_free_requests_per_month: int = Field(
        1_000_000,
        ge=0,
        description="BYOK requests per account and UTC month free of the platform fee.",
    )
    edge: EdgePolicy = Field(
        default_factory=lambda: edge_policy_from_environment(os.environ),
        description="What Envoy enforces before a request reaches a server (the "
        "GATEWAY_EDGE_* and GATEWAY_CORS_ORIGINS variables).",
    )

    @model_validator(mode="after")
    def _database(self) -> Settings:
        url = normalize_database_url(self.database_url or sqlite_url(self.data_dir))
        object.__setattr__(self, "database_url", url)
        return self

    @model_validator(mode="after")
    def _webhook_shares(self) -> Settings:
        if (
            self.body_budget_workspace_bytes is not None
            and self.body_budget_workspace_bytes > self.body_budget_bytes
        ):
            raise ValueError(
                "GATEWAY_BODY_BUDGET_WORKSPACE_BYTES "
                f"({self.body_budget_workspace_bytes}) must not be above "
                f"GATEWAY_BODY_BUDGET_BYTES ({self.body_budget_bytes})"
            )
        if self.video_workspace_jobs_at_once >= self.video_jobs_at_once:
            raise ValueError(
                "GATEWAY_VIDEO_WORKSPACE_JOBS_AT_ONCE "
                f"({self.video_workspace_jobs_at_once}) must be below "
                f"GATEWAY_VIDEO_JOBS_AT_ONCE ({self.video_jobs_at_once}): one workspace's "
                "slow jobs must leave slots to the others"
            )
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
