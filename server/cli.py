"""`gateway`: run the gateway and administer keys, workspaces, interns and credits."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import logging
import os
import re
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any, TypeVar

import asyncpg
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlmodel.ext.asyncio.session import AsyncSession

from server import event_loop
from server.accounts import keys as key_store
from server.accounts import workspaces
from server.accounts.operator import ensure_operator_key, rotate_operator_key
from server.accounts.provisioning import add_workspace_credits
from server.billing.money import AmountError, exact_micros, micros_to_usd, parse_usd
from server.billing.periods import LIMIT_RESETS
from server.clock import SystemClock, rfc3339
from server.config import Settings, SettingsError, edge_policy_from_environment, load_settings
from server.db.datadir import (
    DataDirMismatch,
    check_database,
    remember_database,
    tighten_data_dir,
)
from server.db.engine import SessionFactory, create_engine, session_factory
from server.db.migrate import upgrade
from server.errors import GatewayError
from server.observability.logs import configure_logging_from_environment
from server.ports import DEFAULT_REST_PORT, ServedPorts

log = logging.getLogger("gateway")

# asyncpg's refusals while connecting: no such database or role, a wrong password, a server
# starting or shutting down.
_CONNECT_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.InvalidCatalogNameError,
    asyncpg.InvalidAuthorizationSpecificationError,
    asyncpg.InvalidPasswordError,
    asyncpg.CannotConnectNowError,
    ConnectionError,
)


def _usd(text: str) -> Decimal:
    """An amount in USD, exactly as given, by the API's grammar (`parse_usd`): 0 to 1e9, at
    most six decimal places (a finer amount is refused, not rounded)."""
    try:
        return micros_to_usd(parse_usd(text))
    except AmountError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: amount {exc}") from exc


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from exc
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"port must be 1-65535: {text!r}")
    return port


# A DNS name (letters, digits, hyphens, dots) or an IP address; IPv6 in brackets.
_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]")


def _host_port(text: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets: [::]:8080)."""
    host, colon, port = text.rpartition(":")
    if not colon or not _HOST.fullmatch(host):
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, not {text!r}")
    return host.strip("[]"), _port(port)


def _port_or_off(text: str) -> int:
    return 0 if text.strip() == "0" else _port(text)


def _port_or_any(text: str) -> int:
    """A port, or 0: a free one picked when binding (the actual one is printed)."""
    return _port_or_off(text)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from exc
    if not 1 <= value <= 64:
        raise argparse.ArgumentTypeError(f"must be 1 to 64: {text!r}")
    return value


def _positive_seconds(text: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a whole number of seconds: {text!r}") from exc
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def _on_off(text: str) -> bool:
    if text.lower() in ("on", "true", "yes", "1"):
        return True
    if text.lower() in ("off", "false", "no", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected on or off, not {text!r}")


def _settings(args: argparse.Namespace) -> Settings:
    return _prepared(load_settings(args.data_dir, args.database_url))


def _prepared(settings: Settings, *, create: bool = False) -> Settings:
    """Refuse a data dir that belongs to another database (before anything is created);
    then the data dir private (0700, its secrets 0600): created when `create` (a server
    keeps its files there) or for the embedded default, tightened when it exists."""
    check_database(settings.data_dir, settings.database_url)
    if create or settings.database_url.startswith("sqlite") or settings.data_dir.is_dir():
        tighten_data_dir(settings.data_dir)
    return settings


T = TypeVar("T")


async def _with_sessions(settings: Settings, work: Callable[[SessionFactory], Awaitable[T]]) -> T:
    """Migrate, run `work` with a session factory of its own, dispose of the engine. The
    data dir (when there is one, or `work` made it) remembers the database reached."""
    await upgrade(settings.database_url)
    remember_database(settings.data_dir, settings.database_url)
    engine = create_engine(settings.database_url)
    try:
        result = await work(session_factory(engine))
    finally:
        await engine.dispose()
    remember_database(settings.data_dir, settings.database_url)
    return result


async def _with_session(
    args: argparse.Namespace, work: Callable[[AsyncSession, datetime], Awaitable[Any]]
) -> Any:
    """Migrate, run `work` in one transaction, commit."""

    async def in_one_transaction(sessions: SessionFactory) -> Any:
        async with sessions() as session:
            result = await work(session, SystemClock().now())
            await session.commit()
            return result

    return await _with_sessions(_settings(args), in_one_transaction)


async def _workspace(session: AsyncSession, name: str | None, now: datetime) -> Any:
    if name is None:
        return await workspaces.default_workspace(session, now)
    return await workspaces.workspace_by_name(session, name)


def _server_settings(args: argparse.Namespace, **overrides: object) -> Settings:
    settings = load_settings(
        args.data_dir,
        args.database_url,
        catalog_file=args.catalog,
        metrics_port=args.metrics_port,
        **overrides,
    )
    return _prepared(settings, create=True)


def stop_on_signals() -> asyncio.Event:
    """An event set by Ctrl-C or SIGTERM: the server then drains and stops cleanly."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    return stop


# --- commands -------------------------------------------------------------------------------


async def cmd_up(args: argparse.Namespace) -> int:
    from facade.stack import run_stack  # Envoy is only needed here

    settings = _server_settings(
        args,
        grpc_port=args.grpc_port,
        rest_port=args.rest_port,
        http_port=args.http_port,
        http_host=args.host,
    )
    stop = stop_on_signals()
    await _agreements(settings)  # before anything is written: no operator key for a refused host
    await _operator_key(settings)

    def announce(base_url: str, grpc_targets: list[str]) -> None:
        print(f"Gateway ready: REST {base_url}  gRPC {', '.join(grpc_targets)}", flush=True)
        print(f"Console: {base_url.removesuffix('/api/v1')}/console/", flush=True)
        print("Press Ctrl-C to stop.", flush=True)

    await run_stack(settings, stop, announce, workers=args.workers)
    print("Gateway stopped.", flush=True)
    return 0


async def cmd_serve(args: argparse.Namespace) -> int:
    """The gRPC server alone (a worker of `gateway up --workers N`, or a compose replica)."""
    from server.app import serve

    settings = _server_settings(
        args, grpc_port=args.grpc_port, rest_port=args.rest_port, grpc_host=args.grpc_host
    )
    await upgrade(settings.database_url)  # serve's own is then one query
    remember_database(settings.data_dir, settings.database_url)
    port_file = args.port_file
    await serve(
        settings,
        stop=stop_on_signals(),
        listening=None if port_file is None else lambda ports: write_port_file(port_file, ports),
    )
    return 0


def write_port_file(path: str, ports: ServedPorts) -> None:
    """Write the ports bound to `path` whole (a reader never sees a partial file): the gRPC
    port, then the REST listener's, on one line."""
    partial = f"{path}.partial"
    with open(partial, "w") as file:
        file.write(f"{ports.grpc} {ports.rest}\n")
    os.replace(partial, path)


async def cmd_health(args: argparse.Namespace) -> int:
    """Exit 0 when the server at --grpc-target reports SERVING (container health checks)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    async with grpc.aio.insecure_channel(args.grpc_target) as channel:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(  # type: ignore[attr-defined]  # typeshed's HealthStub declares no methods
                health_pb2.HealthCheckRequest(), timeout=args.timeout
            )
        except grpc.aio.AioRpcError as error:
            print(f"{args.grpc_target}: unreachable ({error.code().name})")
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"{args.grpc_target}: {status}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


async def cmd_envoy_config(args: argparse.Namespace) -> int:
    from facade.compose import COMPOSE_UPSTREAM, LISTEN, compose_envoy_yaml
    from facade.envoy_config import Upstream
    from facade.kubernetes import KUBERNETES_UPSTREAM, kubernetes_envoy_yaml

    edge = edge_policy_from_environment(os.environ)
    listen = LISTEN if args.listen is None else Upstream(*args.listen)
    default = KUBERNETES_UPSTREAM if args.kubernetes else COMPOSE_UPSTREAM
    host, port = (default.host, default.port) if args.upstream is None else args.upstream
    upstream = Upstream(host, port, args.rest_port)
    if args.kubernetes:
        sys.stdout.write(kubernetes_envoy_yaml(edge, upstream, listen))
    else:
        sys.stdout.write(compose_envoy_yaml(edge, upstream, listen))
    return 0


async def _agreements(settings: Settings) -> None:
    """Migrate, and refuse what this host must agree on with every other process on the
    database and does not: its vault master key (the database keeps the first one's check
    value: server/vault/keycheck.py) and its clock (server/db/clockcheck.py)."""
    from server.db.clockcheck import check_clock
    from server.vault import keycheck
    from server.vault.crypto import load_master_key

    master = load_master_key(settings.data_dir)
    clock = SystemClock()

    async def check(sessions: SessionFactory) -> None:
        await keycheck.verify(sessions, master, clock.now())
        await check_clock(sessions, clock, settings.max_clock_skew_seconds)

    await _with_sessions(settings, check)


async def _operator_key(settings: Settings) -> None:
    """Migrate, and issue the operator key when the database has none. Only the file's
    path is printed, never the key."""
    found = await _with_sessions(
        settings,
        lambda sessions: ensure_operator_key(sessions, settings.data_dir, SystemClock().now()),
    )
    if found.created:
        print(f"Operator key: written to {found.path} (mode 0600)", flush=True)
    elif found.present:
        print(f"Operator key: {found.path}", flush=True)
    else:
        print(
            f"Operator key: not in {found.path} (issued elsewhere); "
            "`gateway operator-key rotate` issues a new one",
            flush=True,
        )


async def cmd_migrate(args: argparse.Namespace) -> int:
    from server.vault import keycheck
    from server.vault.crypto import load_master_key
    from server.vault.webhook_secrets import legacy_secrets, seal_legacy_secrets

    settings = _settings(args)
    await _operator_key(settings)

    async def seal(sessions: SessionFactory) -> int:
        if not await legacy_secrets(sessions):
            return 0  # no master key needed (a migration job may have none)
        master = load_master_key(settings.data_dir)
        await keycheck.verify(sessions, master, SystemClock().now())
        return await seal_legacy_secrets(sessions, master, SystemClock().now())

    sealed = await _with_sessions(settings, seal)
    if sealed:
        print(f"Sealed {sealed} webhook signing secrets stored in clear.")
    print("Database schema is up to date.")
    return 0


async def cmd_operator_key_rotate(args: argparse.Namespace) -> int:
    settings = _settings(args)
    path = await _with_sessions(
        settings,
        lambda sessions: rotate_operator_key(sessions, settings.data_dir, SystemClock().now()),
    )
    print(
        f"Operator key replaced: the new one is in {path} (mode 0600); the old one no longer works."
    )
    return 0


async def cmd_workspaces_create(args: argparse.Namespace) -> int:
    async def work(session: AsyncSession, now: datetime) -> Any:
        return await workspaces.create_workspace(
            session, args.name, now, intern_programme=args.intern_programme
        )

    workspace = await _with_session(args, work)
    print(f"Created workspace {workspace.name} ({workspace.id})")
    print(workspace.id)
    return 0


async def cmd_workspaces_update(args: argparse.Namespace) -> int:
    async def work(session: AsyncSession, now: datetime) -> Any:
        workspace = await workspaces.workspace_by_name(session, args.name)
        return await workspaces.update_workspace(
            session,
            workspace,
            intern_programme=args.intern_programme,
            vault_writes_disabled=None if args.vault_writes is None else not args.vault_writes,
            default_callback_url=args.default_callback_url,
            disabled=args.disabled,
        )

    workspace = await _with_session(args, work)
    state = "disabled (its keys are refused)" if workspace.disabled else "enabled"
    print(
        f"Workspace {workspace.name}: {state}, intern programme "
        f"{'on' if workspace.intern_programme else 'off'}, vault writes "
        f"{'off' if workspace.vault_writes_disabled else 'on'}, default callback URL "
        f"{workspace.default_callback_url or '(none)'}"
    )
    return 0


async def cmd_workspaces_webhook_secret(args: argparse.Namespace) -> int:
    from server.vault import keycheck
    from server.vault.crypto import load_master_key
    from server.vault.webhook_secrets import workspace_secret

    settings = _settings(args)
    master = load_master_key(settings.data_dir)  # the secret is sealed under it

    async def secret(sessions: SessionFactory) -> str:
        await keycheck.verify(sessions, master, SystemClock().now())
        async with sessions() as session:
            workspace = await workspaces.workspace_by_name(session, args.name)
        return await workspace_secret(sessions, master, workspace.id, SystemClock().now())

    print(await _with_sessions(settings, secret))
    return 0


async def cmd_vault_rotate(args: argparse.Namespace) -> int:
    from server.vault import keycheck
    from server.vault.crypto import MasterKey, load_master_key, replace_key_file
    from server.vault.store import rotate_master_key

    settings = _settings(args)
    old = load_master_key(settings.data_dir)
    generated = None
    if args.new_key_env:
        new_text = os.environ.get(args.new_key_env)
        if not new_text:
            raise GatewayError(400, f"the environment variable {args.new_key_env} is not set")
    else:
        new_text = generated = MasterKey.generate_base64()
    try:
        new = MasterKey.from_base64(new_text)
    except ValueError as exc:
        raise GatewayError(400, str(exc)) from exc

    async def work(sessions: SessionFactory) -> int:
        now = SystemClock().now()
        await keycheck.verify(sessions, old, now)  # a wrong key rotates nothing
        async with sessions() as session:
            count = await rotate_master_key(session, old, new)
            # With the re-wrap: a process still holding the old key refuses at its next start.
            await keycheck.record(session, new, now)
            await session.commit()
        return count

    count = await _with_sessions(settings, work)
    if os.environ.get("GATEWAY_VAULT_MASTER_KEY"):
        print(
            f"Re-wrapped {count} vault keys. Set GATEWAY_VAULT_MASTER_KEY to the new key "
            "before the next start."
        )
        if generated:
            print(generated)
    else:
        replace_key_file(settings.data_dir, new_text)
        print(f"Re-wrapped {count} vault keys; the new master key is in the data dir.")
    return 0


async def cmd_interns_create(args: argparse.Namespace) -> int:
    async def work(session: AsyncSession, now: datetime) -> Any:
        workspace = await workspaces.workspace_by_name(session, args.workspace)
        return await workspaces.create_intern(session, workspace, args.name, now)

    intern = await _with_session(args, work)
    print(f"Created intern {intern.name} in workspace {args.workspace}")
    print(intern.id)
    return 0


async def cmd_keys_create(args: argparse.Namespace) -> int:
    if args.limit_reset is not None and args.limit is None:
        raise GatewayError(400, "--limit-reset needs --limit")

    async def work(session: AsyncSession, now: datetime) -> Any:
        workspace = await _workspace(session, args.workspace, now)
        intern_id = None
        if args.intern is not None:
            intern_id = (await workspaces.intern_by_name(session, workspace, args.intern)).id
        limit = None if args.limit is None else exact_micros(args.limit)
        expires_at = (
            None
            if args.expires_at is None
            else key_store.parse_expiry(args.expires_at, "--expires-at")
        )
        return await key_store.create_key(
            session,
            workspace=workspace,
            name=args.name,
            now=now,
            limit=key_store.KeyLimit(limit, args.limit_reset),
            management=args.management,
            intern_id=intern_id,
            expires_at=expires_at,
        )

    key, plaintext = await _with_session(args, work)
    kind = "management key" if key.is_management else "API key"
    print(f"Created {kind} {key.name} (hash {key.hash}). It is shown once; store it now:")
    print(plaintext)
    return 0


async def cmd_keys_update(args: argparse.Namespace) -> int:
    changes = {
        name: value
        for name, value in (
            ("disabled", args.disabled),
            ("exempt_free_limits", args.exempt_free_limits),
        )
        if value is not None
    }

    async def work(session: AsyncSession, now: datetime) -> Any:
        key = await key_store.key_by_hash(session, args.hash)
        return await key_store.update_key(session, key, changes, now)

    key = await _with_session(args, work)
    print(
        f"Key {key.name} ({key.hash}): {'disabled' if key.disabled else 'enabled'}, "
        f"free-model limits {'exempt' if key.exempt_free_limits else 'apply'}"
    )
    return 0


async def cmd_keys_list(args: argparse.Namespace) -> int:
    async def work(session: AsyncSession, now: datetime) -> Any:
        workspace = await _workspace(session, args.workspace, now)
        return await key_store.list_keys(
            session, [workspace.id], now, include_disabled=True, include_expired=True
        )

    for key in await _with_session(args, work):
        flags = [
            f for f, on in (("management", key.is_management), ("disabled", key.disabled)) if on
        ]
        if key.expires_at is not None:
            flags.append(f"expires {rfc3339(key.expires_at)}")
        print(f"{key.hash}  {key.label}  {key.name}  {' '.join(flags)}".rstrip())
    return 0


def _names(text: str | None) -> list[str] | None:
    return None if text is None else [n.strip() for n in text.split(",") if n.strip()]


async def cmd_models(args: argparse.Namespace) -> int:
    """Each catalog model (the one `gateway up` would load), its endpoints and whether each
    is routable with the credentials in this environment, and why not."""
    from server.routing.catalog import load_catalog
    from server.routing.readiness import report

    catalog = load_catalog(load_settings(catalog_file=args.catalog).catalog_file)
    for line in report(catalog, SystemClock().now().date()):
        print(line)
    return 0


async def cmd_guardrails_create(args: argparse.Namespace) -> int:
    from server.guardrails import store
    from server.routing.catalog import load_catalog

    catalog = load_catalog(load_settings(args.data_dir, args.database_url).catalog_file)
    given: dict[str, Any] = {
        "name": args.name,
        "description": args.description,
        "allowed_models": _names(args.allowed_models),
        "ignored_models": _names(args.ignored_models),
        "allowed_providers": _names(args.allowed_providers),
        "ignored_providers": _names(args.ignored_providers),
        "max_cost_per_request_micros": None
        if args.max_cost_per_request is None
        else exact_micros(args.max_cost_per_request),
        "max_video_duration_seconds": args.max_video_duration,
        "limit_micros": None if args.limit_usd is None else exact_micros(args.limit_usd),
        "reset_interval": args.reset_interval,
    }
    changes = store.check_changes(catalog, given)
    store.check_budget(changes["limit_micros"], changes["reset_interval"])

    async def work(session: AsyncSession, now: datetime) -> Any:
        workspace = await _workspace(session, args.workspace, now)
        return await store.create_guardrail(session, workspace.id, changes, now)

    guardrail = await _with_session(args, work)
    print(f"Created guardrail {guardrail.name} in workspace {args.workspace or 'default'}")
    print(guardrail.id)
    return 0


async def cmd_guardrails_list(args: argparse.Namespace) -> int:
    from server.guardrails import store

    async def work(session: AsyncSession, now: datetime) -> Any:
        workspace = await _workspace(session, args.workspace, now)
        return await store.list_guardrails(session, workspace.id, limit=100)

    for guardrail in await _with_session(args, work):
        rules = {
            "allowed_models": guardrail.allowed_models,
            "ignored_models": guardrail.ignored_models,
            "allowed_providers": guardrail.allowed_providers,
            "ignored_providers": guardrail.ignored_providers,
            "max_cost_per_request_usd": None
            if guardrail.max_cost_per_request_micros is None
            else str(micros_to_usd(guardrail.max_cost_per_request_micros)),
            "max_video_duration_seconds": guardrail.max_video_duration_seconds,
            "limit_usd": None
            if guardrail.limit_micros is None
            else str(micros_to_usd(guardrail.limit_micros)),
            "reset_interval": guardrail.reset_interval,
        }
        shown = " ".join(f"{k}={v}" for k, v in rules.items() if v is not None)
        print(f"{guardrail.id}  {guardrail.name}  {shown}".rstrip())
    return 0


async def cmd_guardrails_delete(args: argparse.Namespace) -> int:
    from server.guardrails import store

    async def work(session: AsyncSession, now: datetime) -> Any:
        workspace = await _workspace(session, args.workspace, now)
        guardrail = await store.find_guardrail(session, args.id, [workspace.id])
        await store.delete_guardrail(session, guardrail)
        return guardrail

    guardrail = await _with_session(args, work)
    print(f"Deleted guardrail {guardrail.name} ({guardrail.id})")
    return 0


def _byok_key_text(args: argparse.Namespace) -> str:
    """The provider key, never from the command line (shell history, `ps`): the variable
    --key-env names, else the first line of stdin."""
    if args.key_env:
        value = os.environ.get(args.key_env)
        if not value:
            raise GatewayError(400, f"--key-env: {args.key_env} is not set")
        return value
    return sys.stdin.readline().rstrip("\r\n")


async def cmd_byok_create(args: argparse.Namespace) -> int:
    from server.byok import keys as store
    from server.routing.catalog import load_catalog
    from server.vault import keycheck
    from server.vault.crypto import load_master_key

    # The data dir checked against the database before the key file is created in it.
    settings = _settings(args)
    catalog = load_catalog(settings.catalog_file)
    master = load_master_key(settings.data_dir)
    changes = store.check_changes(
        catalog,
        {
            "name": args.name,
            "is_fallback": args.fallback,
            "is_required": args.always_use,
            "is_byok_only": args.byok_only,
            "allowed_models": _names(args.allowed_models),
        },
    )
    key = _byok_key_text(args)

    async def work(sessions: SessionFactory) -> Any:
        now = SystemClock().now()
        await keycheck.verify(sessions, master, now)  # the key is sealed under it
        async with sessions() as session:
            workspace = await _workspace(session, args.workspace, now)
            row = await store.create_key(
                session,
                master,
                catalog,
                workspace_id=workspace.id,
                provider=args.provider,
                key=key,
                changes=changes,
                now=now,
            )
            await session.commit()
            return row

    row = await _with_sessions(settings, work)
    print(f"Created BYOK key {row.label} for {row.provider} in {args.workspace or 'default'}")
    print(row.id)
    return 0


async def cmd_byok_list(args: argparse.Namespace) -> int:
    from server.byok import keys as store

    async def work(session: AsyncSession, now: datetime) -> Any:
        workspace = await _workspace(session, args.workspace, now)
        rows, _ = await store.list_keys(session, workspace.id, provider=args.provider, limit=100)
        return rows

    for row in await _with_session(args, work):
        flags = [
            flag
            for flag, on in (
                ("fallback", row.is_fallback),
                ("always-use", row.is_required),
                ("byok-only", row.is_byok_only),
                ("disabled", row.disabled),
            )
            if on
        ]
        models = f"models={','.join(row.allowed_models)}" if row.allowed_models else ""
        line = f"{row.id}  {row.provider}  {row.sort_order}  {row.label}  {row.name or ''}"
        print(f"{line}  {' '.join(flags)}  {models}".rstrip())
    return 0


async def cmd_byok_delete(args: argparse.Namespace) -> int:
    from server.byok import keys as store

    async def work(session: AsyncSession, now: datetime) -> Any:
        workspace = await _workspace(session, args.workspace, now)
        row = await store.find_key(session, args.id, [workspace.id])
        await store.delete_key(session, row)
        return row

    row = await _with_session(args, work)
    print(f"Deleted BYOK key {row.label} for {row.provider} ({row.id})")
    return 0


async def cmd_credits_add(args: argparse.Namespace) -> int:
    async def work(session: AsyncSession, now: datetime) -> Any:
        workspace = await _workspace(session, args.workspace, now)
        entry = await add_workspace_credits(
            session, workspace, args.amount, now, reference="operator CLI", param="--amount"
        )
        return workspace, entry

    workspace, entry = await _with_session(args, work)
    added = format(micros_to_usd(entry.amount_micros), "f")  # exactly what was stored
    print(f"Added {added} USD of credits to the account of workspace {workspace.name}")
    return 0


# --- parser ---------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--data-dir",
        help="folder of the embedded SQLite database and generated files "
        "(env GATEWAY_DATA_DIR, default ./gateway-data)",
    )
    common.add_argument(
        "--database-url",
        help="SQLAlchemy URL, e.g. postgresql://user@host/db (env GATEWAY_DATABASE_URL; "
        "default: SQLite in the data dir)",
    )
    parser = argparse.ArgumentParser(prog="gateway", description=__doc__)
    parser.add_argument(
        "--version",
        action="version",
        # the installed distribution's (pyproject.toml's); CHANGELOG.md says what it changed
        version=f"%(prog)s {importlib.metadata.version('inference-gateway')}",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = commands.add_parser("up", parents=[common], help="run the gRPC server and Envoy")
    up.add_argument(
        "--http-port",
        type=_port_or_any,
        default=8080,
        help="REST port (default 8080; 0: a free port, printed in the ready line)",
    )
    up.add_argument(
        "--grpc-port",
        type=_port_or_any,
        default=50051,
        help="gRPC port (default 50051; 0: a free port for each server process, printed "
        "in the ready line)",
    )
    up.add_argument(
        "--rest-port",
        type=_port_or_any,
        help="port of the server's REST listener, which Envoy proxies the hot routes to (env "
        "GATEWAY_REST_PORT; default 0: a free port for each server process; with --workers N, "
        "this one on)",
    )
    up.add_argument("--host", default="127.0.0.1", help="REST listen address")
    up.add_argument(
        "--catalog",
        metavar="FILE",
        help="operator provider catalog (TOML) adding to or replacing built-in "
        "models (env GATEWAY_CATALOG)",
    )
    up.add_argument(
        "--workers",
        type=_positive_int,
        default=1,
        help="server processes behind Envoy (gRPC ports --grpc-port onwards; each a free "
        "one with --grpc-port 0)",
    )
    up.add_argument(
        "--metrics-port",
        type=_port_or_off,
        help="Prometheus /metrics port (env GATEWAY_METRICS_PORT; default: off; with "
        "--workers N, one port per process from this one on; 0: off)",
    )
    up.set_defaults(run=cmd_up)

    serve_cmd = commands.add_parser(
        "serve", parents=[common], help="run only the gRPC server (no Envoy)"
    )
    serve_cmd.add_argument(
        "--grpc-port", type=_port_or_any, default=50051, help="default 50051; 0: a free port"
    )
    serve_cmd.add_argument(
        "--rest-port",
        type=_port_or_any,
        help="port of the REST listener for the hot routes Envoy proxies here, on the gRPC "
        "address (env GATEWAY_REST_PORT; default 0: a free port)",
    )
    serve_cmd.add_argument("--grpc-host", default="127.0.0.1")
    serve_cmd.add_argument(
        "--port-file",
        metavar="FILE",
        help="write the ports bound (gRPC, REST) to FILE once serving (how `up --workers N` "
        "learns the ports of its server processes)",
    )
    serve_cmd.add_argument("--catalog", metavar="FILE")
    serve_cmd.add_argument(
        "--metrics-port",
        type=_port_or_off,
        help="Prometheus /metrics port of this process (env GATEWAY_METRICS_PORT; "
        "default: off; 0: off)",
    )
    serve_cmd.set_defaults(run=cmd_serve)

    health = commands.add_parser(
        "health", help="check a server's gRPC health (exit 0 when SERVING)"
    )
    health.add_argument("--grpc-target", default="127.0.0.1:50051", metavar="HOST:PORT")
    health.add_argument("--timeout", type=float, default=3.0, help="seconds (default 3)")
    health.set_defaults(run=cmd_health)

    envoy_config = commands.add_parser(
        "envoy-config",
        help="print the Envoy config of the compose stack (envoy.yaml), or of the "
        "Kubernetes topology (--kubernetes)",
    )
    envoy_config.add_argument(
        "--kubernetes",
        action="store_true",
        help="the Kubernetes topology (deploy/kubernetes): replicas behind a headless "
        "Service, dropped as soon as they leave its DNS answer",
    )
    envoy_config.add_argument(
        "--upstream",
        type=_host_port,
        metavar="HOST:PORT",
        help="the DNS name every gRPC replica's address is found under, and their port "
        "(default server:50051; gateway-server:50051 with --kubernetes)",
    )
    envoy_config.add_argument(
        "--rest-port",
        type=_port,
        default=DEFAULT_REST_PORT,
        help=f"the port of every replica's REST listener (`gateway serve --rest-port`; "
        f"default {DEFAULT_REST_PORT})",
    )
    envoy_config.add_argument(
        "--listen",
        type=_host_port,
        metavar="HOST:PORT",
        help="where Envoy serves REST (default 0.0.0.0:8080)",
    )
    envoy_config.set_defaults(run=cmd_envoy_config)

    migrate = commands.add_parser("migrate", parents=[common], help="apply schema migrations")
    migrate.set_defaults(run=cmd_migrate)

    operator_key = commands.add_parser(
        "operator-key", help="the operator key (console and /api/v1/workspaces)"
    ).add_subparsers(dest="action", required=True, metavar="ACTION")
    operator_rotate = operator_key.add_parser(
        "rotate",
        parents=[common],
        help="issue a new operator key into <data dir>/operator-key (the old one stops working)",
    )
    operator_rotate.set_defaults(run=cmd_operator_key_rotate)

    ws = commands.add_parser("workspaces", help="manage workspaces").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    ws_create = ws.add_parser("create", parents=[common], help="create a workspace")
    ws_create.add_argument("name")
    ws_create.add_argument(
        "--intern-programme",
        action="store_true",
        help="give the workspace access to the intern programme (vault)",
    )
    ws_create.set_defaults(run=cmd_workspaces_create)
    ws_update = ws.add_parser("update", parents=[common], help="change a workspace")
    ws_update.add_argument("name")
    ws_update.add_argument("--intern-programme", type=_on_off, metavar="on|off")
    ws_update.add_argument("--vault-writes", type=_on_off, metavar="on|off")
    ws_update.add_argument(
        "--disabled",
        type=_on_off,
        metavar="on|off",
        help="on: every key of the workspace is refused (401) until off; nothing is deleted",
    )
    ws_update.add_argument(
        "--default-callback-url",
        metavar="URL",
        help="webhook URL for video jobs without callback_url ('' clears)",
    )
    ws_update.set_defaults(run=cmd_workspaces_update)
    ws_secret = ws.add_parser(
        "webhook-secret",
        parents=[common],
        help="print the workspace's webhook signing secret (whsec_...), creating it if needed",
    )
    ws_secret.add_argument("name")
    ws_secret.set_defaults(run=cmd_workspaces_webhook_secret)

    interns = commands.add_parser("interns", help="manage interns").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    intern_create = interns.add_parser("create", parents=[common], help="create an intern")
    intern_create.add_argument("--workspace", required=True)
    intern_create.add_argument("name")
    intern_create.set_defaults(run=cmd_interns_create)

    keys = commands.add_parser("keys", help="manage API keys").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    key_create = keys.add_parser(
        "create", parents=[common], help="issue a key (printed alone on the last line)"
    )
    key_create.add_argument("--name", required=True)
    key_create.add_argument("--workspace", help="workspace name (default: 'default')")
    key_create.add_argument("--intern", help="confine the key to this intern of the workspace")
    key_create.add_argument("--limit", type=_usd, help="credit cap in USD")
    key_create.add_argument("--limit-reset", choices=LIMIT_RESETS)
    key_create.add_argument(
        "--expires-at", metavar="YYYY-MM-DDTHH:MM:SSZ", help="refused with 401 from then on"
    )
    key_create.add_argument(
        "--management", action="store_true", help="a management key (may use /keys and /credits)"
    )
    key_create.set_defaults(run=cmd_keys_create)
    key_update = keys.add_parser("update", parents=[common], help="change a key")
    key_update.add_argument("hash")
    key_update.add_argument("--disabled", dest="disabled", action="store_true", default=None)
    key_update.add_argument("--enabled", dest="disabled", action="store_false")
    key_update.add_argument("--exempt-free-limits", type=_on_off, metavar="on|off")
    key_update.set_defaults(run=cmd_keys_update)
    key_list = keys.add_parser("list", parents=[common], help="list keys of a workspace")
    key_list.add_argument("--workspace")
    key_list.set_defaults(run=cmd_keys_list)

    vault = commands.add_parser("vault", help="vault administration").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    rotate = vault.add_parser(
        "rotate-master-key",
        parents=[common],
        help="re-wrap every vault data key under a new master key (ciphertexts untouched)",
    )
    rotate.add_argument(
        "--new-key-env",
        metavar="VAR",
        help="environment variable holding the new base64 key (default: generate one)",
    )
    rotate.set_defaults(run=cmd_vault_rotate)

    guardrails = commands.add_parser(
        "guardrails", help="manage a workspace's guardrails"
    ).add_subparsers(dest="action", required=True, metavar="ACTION")
    guardrail_create = guardrails.add_parser(
        "create", parents=[common], help="add a guardrail (the id is the last line)"
    )
    guardrail_create.add_argument("--name", required=True)
    guardrail_create.add_argument("--workspace", help="workspace name (default: 'default')")
    guardrail_create.add_argument("--description")
    for option, what in (
        ("--allowed-models", "only these model ids (comma-separated)"),
        ("--ignored-models", "never these model ids"),
        ("--allowed-providers", "only these provider slugs"),
        ("--ignored-providers", "never these provider slugs"),
    ):
        guardrail_create.add_argument(option, metavar="A,B", help=what)
    guardrail_create.add_argument(
        "--max-cost-per-request", type=_usd, metavar="USD", help="refuse dearer requests"
    )
    guardrail_create.add_argument(
        "--max-video-duration", type=_positive_seconds, metavar="S", help="refuse longer videos"
    )
    guardrail_create.add_argument(
        "--limit-usd", type=_usd, metavar="USD", help="a budget per key (with --reset-interval)"
    )
    guardrail_create.add_argument("--reset-interval", choices=LIMIT_RESETS)
    guardrail_create.set_defaults(run=cmd_guardrails_create)
    guardrail_list = guardrails.add_parser("list", parents=[common], help="list them")
    guardrail_list.add_argument("--workspace")
    guardrail_list.set_defaults(run=cmd_guardrails_list)
    guardrail_delete = guardrails.add_parser("delete", parents=[common], help="remove one")
    guardrail_delete.add_argument("id")
    guardrail_delete.add_argument("--workspace")
    guardrail_delete.set_defaults(run=cmd_guardrails_delete)

    byok = commands.add_parser(
        "byok", help="manage a workspace's own provider keys (BYOK)"
    ).add_subparsers(dest="action", required=True, metavar="ACTION")
    byok_create = byok.add_parser(
        "create",
        parents=[common],
        help="add a provider key, read from stdin or --key-env (the id is the last line)",
    )
    byok_create.add_argument("--provider", required=True, help="provider slug, e.g. openai")
    byok_create.add_argument("--key-env", metavar="VAR", help="read the key from this variable")
    byok_create.add_argument("--name")
    byok_create.add_argument("--workspace", help="workspace name (default: 'default')")
    byok_create.add_argument(
        "--fallback", action="store_true", help="try it after the operator's endpoints"
    )
    byok_create.add_argument(
        "--always-use",
        action="store_true",
        help="never fall back to the operator's credentials for its models",
    )
    byok_create.add_argument(
        "--byok-only", action="store_true", help="never the operator's, for any model"
    )
    byok_create.add_argument("--allowed-models", metavar="A,B", help="only for these models")
    byok_create.set_defaults(run=cmd_byok_create)
    byok_list = byok.add_parser("list", parents=[common], help="list them (masked)")
    byok_list.add_argument("--workspace")
    byok_list.add_argument("--provider")
    byok_list.set_defaults(run=cmd_byok_list)
    byok_delete = byok.add_parser("delete", parents=[common], help="remove one")
    byok_delete.add_argument("id")
    byok_delete.add_argument("--workspace")
    byok_delete.set_defaults(run=cmd_byok_delete)

    models = commands.add_parser(
        "models", help="list the catalog's models and which providers are configured"
    )
    models.add_argument(
        "--catalog",
        metavar="FILE",
        help="operator provider catalog, as for `gateway up` (env GATEWAY_CATALOG)",
    )
    models.set_defaults(run=cmd_models)

    credits = commands.add_parser("credits", help="manage credits").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    credits_add = credits.add_parser("add", parents=[common], help="record a credit purchase")
    credits_add.add_argument("--amount", type=_usd, required=True, help="USD")
    credits_add.add_argument("--workspace", help="workspace name (default: 'default')")
    credits_add.set_defaults(run=cmd_credits_add)
    return parser


def _database_failure(args: argparse.Namespace, error: DBAPIError) -> str:
    """One line for a database failure: which database (the URL without its password) and
    why, instead of a traceback."""
    try:
        given = getattr(args, "database_url", None) or os.environ.get("GATEWAY_DATABASE_URL")
        url = make_url(given or load_settings(args.data_dir, None).database_url)
        where = url.render_as_string(hide_password=True)
    except Exception:
        where = "(the configured URL)"
    cause = error.orig.__cause__ if error.orig is not None else None
    reason = str(cause or error.orig or error).strip().splitlines()
    text = reason[0] if reason else type(error).__name__
    connecting = isinstance(cause, _CONNECT_ERRORS) or "unable to open database" in text
    if connecting:
        return f"cannot connect to the database {where}: {text}"
    return f"database error ({where}): {text}"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging_from_environment()
    # Whatever the operator's umask: what the gateway (and Envoy, its child) writes is
    # its owner's only. Restored on return, for callers in-process.
    umask = os.umask(0o077)
    try:
        code: int = event_loop.run(args.run(args))
        return code
    except DataDirMismatch as error:
        print(f"gateway: error: {error}", file=sys.stderr)
        return 2
    except GatewayError as error:
        print(f"gateway: error: {error.message}", file=sys.stderr)
        return 2
    except SettingsError as error:
        print(f"gateway: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except DBAPIError as error:
        print(f"gateway: error: {_database_failure(args, error)}", file=sys.stderr)
        return 1
    except (OSError, TimeoutError, RuntimeError) as error:
        with contextlib.suppress(Exception):
            log.debug("failure", exc_info=True)
        print(f"gateway: error: {error}", file=sys.stderr)
        return 1
    finally:
        os.umask(umask)


if __name__ == "__main__":
    sys.exit(main())
