"""Tables. Money is integer micro-dollars (1 USD = 1_000_000); time is UTC."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, ClassVar

import sqlalchemy as sa
from sqlmodel import Field, SQLModel


class UtcDateTime(sa.types.TypeDecorator[datetime]):
    """A datetime stored as UTC and always read back timezone-aware (SQLite drops the zone)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


if TYPE_CHECKING:

    class TableModel(SQLModel):
        # SQLAlchemy sets __table__ on each table=True model; SQLModel does not declare it.
        __table__: ClassVar[sa.Table]

else:
    TableModel = SQLModel  # at run time the models are plain SQLModel subclasses


class Account(TableModel, table=True):
    __tablename__ = "accounts"

    id: str = Field(primary_key=True, max_length=40)
    name: str = Field(max_length=255)
    credits_purchased_micros: int = Field(default=0, sa_type=sa.BigInteger)
    exempt_free_limits: bool = False
    # Bumped to serialize credit holds per account (row lock on PostgreSQL; on SQLite it takes
    # the write lock before a hold that reads first), so concurrent requests never overspend.
    lock_version: int = Field(default=0, sa_type=sa.BigInteger)
    created_at: datetime = Field(sa_type=UtcDateTime)


class PrincipalStamp(TableModel, table=True):
    """One row (id 1) whose version triggers bump on every change to keys, workspaces,
    accounts and guardrails (migration 0010): what processes' principal caches compare."""

    __tablename__ = "principal_stamp"

    id: int = Field(primary_key=True, sa_column_kwargs={"autoincrement": False})
    version: int = Field(default=0, sa_type=sa.BigInteger)


class Agreement(TableModel, table=True):
    """What every process on one database must agree on, by name (migration 0016): the
    first process to start writes its value, every later one compares its own with it
    before serving. "vault-master-key": the vault master key's check value
    (server/vault/keycheck.py), never the key."""

    __tablename__ = "agreements"

    name: str = Field(primary_key=True, max_length=64)
    value: str = Field(max_length=128)
    updated_at: datetime = Field(sa_type=UtcDateTime)


class Workspace(TableModel, table=True):
    __tablename__ = "workspaces"

    id: str = Field(primary_key=True, max_length=40)
    account_id: str = Field(foreign_key="accounts.id", index=True, max_length=40)
    name: str = Field(unique=True, max_length=255)
    intern_programme: bool = False
    vault_writes_disabled: bool = False
    # The operator's switch (migration 0015): while on, every key of the workspace is refused.
    disabled: bool = Field(default=False, sa_column_kwargs={"server_default": sa.false()})
    default_callback_url: str | None = Field(default=None, max_length=2048)
    # Standard Webhooks signing secret ("whsec_..."), created when first needed and sealed
    # (server/vault/webhook_secrets.py): AES-256-GCM ciphertext and nonce.
    webhook_secret_sealed: bytes | None = Field(default=None, sa_type=sa.LargeBinary)
    webhook_secret_nonce: bytes | None = Field(default=None, sa_type=sa.LargeBinary)
    # Where gateways before migration 0014 kept it in clear: sealed and cleared at start,
    # never written.
    webhook_secret: str | None = Field(default=None, max_length=128)
    created_at: datetime = Field(sa_type=UtcDateTime)


class Intern(TableModel, table=True):
    __tablename__ = "interns"
    __table_args__ = (sa.UniqueConstraint("workspace_id", "name"),)

    id: str = Field(primary_key=True, max_length=40)
    workspace_id: str = Field(foreign_key="workspaces.id", index=True, max_length=40)
    name: str = Field(max_length=255)
    created_at: datetime = Field(sa_type=UtcDateTime)


class ApiKey(TableModel, table=True):
    """An API key, stored as the SHA-256 of the key; the key itself is never stored."""

    __tablename__ = "api_keys"

    hash: str = Field(primary_key=True, max_length=64)
    workspace_id: str = Field(foreign_key="workspaces.id", index=True, max_length=40)
    intern_id: str | None = Field(default=None, foreign_key="interns.id", max_length=40)
    name: str = Field(max_length=255)
    label: str = Field(max_length=64)
    limit_micros: int | None = Field(default=None, sa_type=sa.BigInteger)
    limit_reset: str | None = Field(default=None, max_length=16)
    include_byok_in_limit: bool = False
    disabled: bool = False
    is_management: bool = False
    exempt_free_limits: bool = False
    expires_at: datetime | None = Field(default=None, sa_type=UtcDateTime)
    creator_user_id: str | None = Field(default=None, max_length=255)
    external_user: str | None = Field(default=None, max_length=255)
    created_at: datetime = Field(sa_type=UtcDateTime)
    updated_at: datetime | None = Field(default=None, sa_type=UtcDateTime)
    last_used_at: datetime | None = Field(default=None, sa_type=UtcDateTime)


class UsageCounter(TableModel, table=True):
    """Spend of one key or one account in one period, so reading usage is O(1).

    `period` is `all` (period_start 1970-01-01), `day`, `week` (Monday) or `month` (the 1st).
    """

    __tablename__ = "usage_counters"

    subject: str = Field(primary_key=True, max_length=8)  # "key" | "account"
    subject_id: str = Field(primary_key=True, max_length=64)
    period: str = Field(primary_key=True, max_length=8)
    period_start: date = Field(primary_key=True)
    spend_micros: int = Field(default=0, sa_type=sa.BigInteger)
    byok_micros: int = Field(default=0, sa_type=sa.BigInteger)


class LedgerEntry(TableModel, table=True):
    """The audit trail: one row per purchase or charge; reconciles with the counters."""

    __tablename__ = "ledger_entries"
    # The purchases list's (an account's purchases, newest first); no other index: each is
    # one more page every charge writes (migration 0018).
    __table_args__ = (
        sa.Index("ix_ledger_entries_account_kind_created", "account_id", "kind", "created_at"),
    )

    id: int | None = Field(default=None, primary_key=True)
    account_id: str = Field(foreign_key="accounts.id", max_length=40)
    key_hash: str | None = Field(default=None, max_length=64)
    kind: str = Field(max_length=16)  # "purchase" | "charge"
    amount_micros: int = Field(sa_type=sa.BigInteger)
    is_byok: bool = False
    reference: str | None = Field(default=None, max_length=255)
    created_at: datetime = Field(sa_type=UtcDateTime)


class CreditHold(TableModel, table=True):
    """Credits reserved by a request still running. Expired holds (a crashed process) no
    longer count and are swept."""

    __tablename__ = "credit_holds"

    id: str = Field(primary_key=True, max_length=40)
    account_id: str = Field(foreign_key="accounts.id", index=True, max_length=40)
    key_hash: str = Field(index=True, max_length=64)
    amount_micros: int = Field(sa_type=sa.BigInteger)
    counts_against_balance: bool = True  # false for BYOK: the provider bills the workspace
    counts_against_key_limit: bool = True
    created_at: datetime = Field(sa_type=UtcDateTime)
    expires_at: datetime = Field(sa_type=UtcDateTime)


class Generation(TableModel, table=True):
    """One request's record for observability. Never audio, prompts or secret values."""

    __tablename__ = "generations"
    # One secondary index, not one per column: every transcription inserts a row, and every
    # read (activity, the generation list) is one workspace's rows by time (migration 0013).
    __table_args__ = (sa.Index("ix_generations_workspace_created", "workspace_id", "created_at"),)

    id: str = Field(primary_key=True, max_length=40)
    account_id: str = Field(max_length=40)
    workspace_id: str = Field(max_length=40)
    key_hash: str = Field(max_length=64)
    kind: str = Field(max_length=16)  # "stt" | "video"
    model: str = Field(max_length=255)
    provider: str | None = Field(default=None, max_length=64)
    status: str = Field(max_length=16)  # "completed" | "failed"
    cost_micros: int = Field(default=0, sa_type=sa.BigInteger)
    is_byok: bool = False
    seconds: Decimal | None = Field(default=None, sa_type=sa.Numeric(18, 6))
    latency_ms: int | None = None
    session_id: str | None = Field(default=None, max_length=256)
    user: str | None = Field(default=None, max_length=256)
    trace: dict[str, Any] | None = Field(default=None, sa_type=sa.JSON)
    error: str | None = Field(default=None, max_length=1000)
    created_at: datetime = Field(sa_type=UtcDateTime)


class VideoJob(TableModel, table=True):
    """An asynchronous video generation job. The worker that holds the lease runs it."""

    __tablename__ = "video_jobs"
    __table_args__ = (
        sa.Index("ix_video_jobs_claim", "status", "next_run_at"),
        # The claim's walk over workspaces and its capped ones (server/workers/leases.py).
        sa.Index("ix_video_jobs_workspace_due", "status", "workspace_id", "next_run_at"),
        sa.Index("ix_video_jobs_lease", "lease_expires_at"),
    )

    id: str = Field(primary_key=True, max_length=40)
    account_id: str = Field(max_length=40)
    workspace_id: str = Field(index=True, max_length=40)
    key_hash: str = Field(max_length=64)
    model: str = Field(max_length=255)
    status: str = Field(max_length=16)
    params: dict[str, Any] = Field(sa_type=sa.JSON)  # the validated request, for the provider
    session_id: str | None = Field(default=None, max_length=256)
    user: str | None = Field(default=None, max_length=256)
    trace: dict[str, Any] | None = Field(default=None, sa_type=sa.JSON)
    callback_url: str | None = Field(default=None, max_length=2048)
    hold_id: str | None = Field(default=None, max_length=40)
    hold_micros: int = Field(default=0, sa_type=sa.BigInteger)
    # BYOK: the provider cost held apart (the key's limit, if it counts BYOK), and the
    # workspace key the job was submitted with (None: the operator's credential)
    byok_hold_id: str | None = Field(default=None, max_length=40)
    byok_key_id: str | None = Field(default=None, max_length=40)
    cost_micros: int | None = Field(default=None, sa_type=sa.BigInteger)
    is_byok: bool = False
    generation_id: str | None = Field(default=None, max_length=40)
    error: str | None = Field(default=None, max_length=1000)
    provider: str | None = Field(default=None, max_length=64)
    endpoint_index: int = 0
    provider_job_id: str | None = Field(default=None, max_length=255)
    content_count: int = 0
    attempts: int = 0
    lease_owner: str | None = Field(default=None, max_length=64)
    lease_expires_at: datetime | None = Field(default=None, sa_type=UtcDateTime)
    next_run_at: datetime = Field(sa_type=UtcDateTime)
    created_at: datetime = Field(sa_type=UtcDateTime)
    updated_at: datetime = Field(sa_type=UtcDateTime)
    completed_at: datetime | None = Field(default=None, sa_type=UtcDateTime)
    expires_at: datetime | None = Field(default=None, sa_type=UtcDateTime)


class WebhookDelivery(TableModel, table=True):
    """The outbox: one row per event to deliver, retried with backoff until done."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        sa.Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),
        # The claim's walk over workspaces and its capped ones (server/workers/leases.py).
        sa.Index(
            "ix_webhook_deliveries_workspace_due", "status", "workspace_id", "next_attempt_at"
        ),
        sa.Index("ix_webhook_deliveries_lease", "lease_expires_at"),
    )

    id: str = Field(primary_key=True, max_length=40)  # the stable webhook-id
    workspace_id: str = Field(max_length=40)
    job_id: str = Field(index=True, max_length=40)
    url: str = Field(max_length=2048)
    payload: str  # the exact JSON body that is signed and sent
    status: str = Field(max_length=16)  # pending | delivered | stopped | failed
    attempts: int = 0
    last_status: int | None = None
    last_error: str | None = Field(default=None, max_length=500)
    lease_owner: str | None = Field(default=None, max_length=64)
    lease_expires_at: datetime | None = Field(default=None, sa_type=UtcDateTime)
    next_attempt_at: datetime = Field(sa_type=UtcDateTime)
    created_at: datetime = Field(sa_type=UtcDateTime)
    delivered_at: datetime | None = Field(default=None, sa_type=UtcDateTime)


class VaultKey(TableModel, table=True):
    """One vault's data key (a workspace's, or one intern's), wrapped by the master key."""

    __tablename__ = "vault_keys"

    vault_id: str = Field(primary_key=True, max_length=100)  # "ws:<id>" | "intern:<id>"
    wrapped_key: bytes = Field(sa_type=sa.LargeBinary)
    master_key_id: str = Field(max_length=16)
    created_at: datetime = Field(sa_type=UtcDateTime)


class VaultSecret(TableModel, table=True):
    """A host-bound secret: only ciphertext is stored. `scope` is "workspace" or the intern
    id, so the name is unique per scope (NULLs would not be)."""

    __tablename__ = "vault_secrets"
    __table_args__ = (sa.UniqueConstraint("workspace_id", "scope", "name"),)

    id: str = Field(primary_key=True, max_length=40)
    workspace_id: str = Field(index=True, max_length=40)
    scope: str = Field(max_length=40)
    name: str = Field(max_length=255)
    ciphertext: bytes = Field(sa_type=sa.LargeBinary)
    nonce: bytes = Field(sa_type=sa.LargeBinary)
    hosts: list[str] = Field(sa_type=sa.JSON)
    fingerprint: str = Field(max_length=64)
    created_at: datetime = Field(sa_type=UtcDateTime)
    updated_at: datetime = Field(sa_type=UtcDateTime)


class RateWindow(TableModel, table=True):
    """`:free` requests of one account in one fixed UTC window: `period` "minute" (the
    per-minute limit) or "day" (the daily limit; window_start is midnight UTC)."""

    __tablename__ = "rate_windows"

    subject_id: str = Field(primary_key=True, max_length=64)
    period: str = Field(primary_key=True, max_length=8)
    window_start: datetime = Field(primary_key=True, sa_type=UtcDateTime)
    count: int = 0


class Guardrail(TableModel, table=True):
    """A workspace's policy: every guardrail of a workspace applies to its requests."""

    __tablename__ = "guardrails"

    id: str = Field(primary_key=True, max_length=40)
    workspace_id: str = Field(foreign_key="workspaces.id", index=True, max_length=40)
    name: str = Field(max_length=255)
    description: str | None = Field(default=None, max_length=1000)
    allowed_models: list[str] | None = Field(default=None, sa_type=sa.JSON)  # None: any
    ignored_models: list[str] | None = Field(default=None, sa_type=sa.JSON)
    allowed_providers: list[str] | None = Field(default=None, sa_type=sa.JSON)  # None: any
    ignored_providers: list[str] | None = Field(default=None, sa_type=sa.JSON)
    max_cost_per_request_micros: int | None = Field(default=None, sa_type=sa.BigInteger)
    max_video_duration_seconds: int | None = None
    include_byok_in_budgets: bool = False
    # A spending budget, counted per key it applies to over reset_interval (both or neither).
    limit_micros: int | None = Field(default=None, sa_type=sa.BigInteger)
    reset_interval: str | None = Field(default=None, max_length=16)  # daily | weekly | monthly
    created_at: datetime = Field(sa_type=UtcDateTime)
    updated_at: datetime | None = Field(default=None, sa_type=UtcDateTime)


class ByokKey(TableModel, table=True):
    """A workspace's own provider key (bring your own key), sealed like vault values: the
    key never leaves except to its provider; `label` is the masked form shown everywhere."""

    __tablename__ = "byok_keys"
    __table_args__ = (sa.Index("ix_byok_keys_workspace_provider", "workspace_id", "provider"),)

    id: str = Field(primary_key=True, max_length=40)
    workspace_id: str = Field(foreign_key="workspaces.id", max_length=40)
    provider: str = Field(max_length=64)
    name: str | None = Field(default=None, max_length=255)
    label: str = Field(max_length=32)
    ciphertext: bytes = Field(sa_type=sa.LargeBinary)
    nonce: bytes = Field(sa_type=sa.LargeBinary)
    sort_order: int = 0
    is_fallback: bool = False
    is_required: bool = False  # "always use": no operator credential for its models
    is_byok_only: bool = False  # "always use" for every model of the provider
    disabled: bool = False
    allowed_models: list[str] | None = Field(default=None, sa_type=sa.JSON)  # None: any
    allowed_api_key_hashes: list[str] | None = Field(default=None, sa_type=sa.JSON)
    allowed_user_ids: list[str] | None = Field(default=None, sa_type=sa.JSON)
    declared_region: str | None = Field(default=None, max_length=16)
    declared_zdr: bool | None = None
    created_at: datetime = Field(sa_type=UtcDateTime)
    updated_at: datetime | None = Field(default=None, sa_type=UtcDateTime)


class ByokMonthlyRequests(TableModel, table=True):
    """BYOK requests an account made in a UTC month: the first ones each month pay no fee."""

    __tablename__ = "byok_monthly_requests"

    account_id: str = Field(primary_key=True, max_length=40)
    month_start: date = Field(primary_key=True)
    requests: int = Field(default=0, sa_type=sa.BigInteger)


class GuardrailKeyAssignment(TableModel, table=True):
    """A guardrail assigned to a key: an assigned guardrail applies to its keys only."""

    __tablename__ = "guardrail_key_assignments"
    __table_args__ = (
        sa.UniqueConstraint("guardrail_id", "key_hash", name="uq_guardrail_key_assignment"),
    )

    id: str = Field(primary_key=True, max_length=40)
    guardrail_id: str = Field(foreign_key="guardrails.id", max_length=40)
    key_hash: str = Field(foreign_key="api_keys.hash", index=True, max_length=64)
    created_at: datetime = Field(sa_type=UtcDateTime)


class OperatorKey(TableModel, table=True):
    """The operator credential: one row (id 1), the SHA-256 of the key only; the plaintext
    is written once to a file of mode 0600 in the data dir (server/accounts/operator.py)."""

    __tablename__ = "operator_keys"

    id: int = Field(primary_key=True, sa_column_kwargs={"autoincrement": False})
    key_hash: str = Field(max_length=64)
    created_at: datetime = Field(sa_type=UtcDateTime)
