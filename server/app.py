"""Builds and runs the grpc.aio server: services, health, reflection, error handling."""

from __future__ import annotations

import asyncio
import gc
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import grpc
import httpx
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Tracer
from sqlalchemy.ext.asyncio import AsyncEngine

from server.auth import Authenticator
from server.billing.holds import FINISH_TIMEOUT_SECONDS
from server.billing.settlements import Settlements
from server.byok.cache import ByokKeysCache
from server.byok.fees import ByokFees
from server.byok.routing import ByokRouting
from server.clock import Clock, SystemClock
from server.compute import ComputePool, release_free_memory
from server.config import EdgePolicy, Settings
from server.console import ConsoleAssets
from server.contract import (
    SERVICES,
    audio_pb2_grpc,
    byok_pb2_grpc,
    console_pb2_grpc,
    generations_pb2_grpc,
    guardrails_pb2_grpc,
    keys_pb2_grpc,
    management_pb2_grpc,
    models_pb2_grpc,
    vault_pb2_grpc,
    videos_pb2_grpc,
)
from server.db.clockcheck import check_clock
from server.db.driver import HotReads
from server.db.engine import SessionFactory, create_engine, session_factory
from server.db.migrate import upgrade
from server.db.stamp import PrincipalStampView
from server.db.stamp import watch as watch_principal_changes
from server.db.writer import Writer
from server.guardrails.cache import GuardrailsCache
from server.guardrails.policy import guardrails_of
from server.limits.admission import EnforcedLimits, Limits
from server.limits.key_status import warm_key_status
from server.limits.leases import BudgetLeases
from server.maintenance import Maintenance
from server.observability.in_flight import RequestsInFlight
from server.observability.metrics import Metrics
from server.observability.monitor import DatabaseMonitor, recovery_retry_seconds
from server.observability.tracing import tracer_of, tracer_provider_from_environment
from server.ports import GRPC_PORT, METRICS_PORT, REST_PORT, ServedPorts, ensure_free, listen_error
from server.providers.assemblyai_stt import AssemblyAISttAdapter
from server.providers.azure_openai_stt import AzureOpenAISttAdapter
from server.providers.dashscope_video import DashScopeVideoAdapter
from server.providers.deepgram_stt import DeepgramSttAdapter
from server.providers.elevenlabs_stt import ElevenLabsSttAdapter
from server.providers.fal_video import QUEUE_SPEC, FalVideoAdapter
from server.providers.gemini_video import GeminiVideoAdapter
from server.providers.http import Downloads, ImageFetcher, provider_client
from server.providers.kling_video import KlingVideoAdapter
from server.providers.local_video import LocalVideoAdapter
from server.providers.minimax_video import MiniMaxVideoAdapter
from server.providers.openai_stt import OpenAISttAdapter
from server.providers.openai_video import OpenAIVideoAdapter
from server.providers.pocketsphinx_stt import PocketsphinxAdapter
from server.providers.replicate_video import ReplicateVideoAdapter
from server.providers.seedance_video import SeedanceVideoAdapter
from server.providers.stt import SttAdapter
from server.providers.vertex_video import VertexVideoAdapter
from server.providers.video import VideoAdapter
from server.rest.api import RestApi
from server.rest.listener import RestListener
from server.routing.catalog import Catalog, load_catalog, served_by
from server.routing.cooldowns import Cooldowns
from server.services.activity import ActivityService
from server.services.audio import AudioService
from server.services.byok import ByokService
from server.services.console import ConsoleService
from server.services.generations import GenerationsService
from server.services.guardrails import GuardrailsService
from server.services.keys import KeysService
from server.services.management import KeyRotation, ManagementService
from server.services.models import ModelsService
from server.services.operator import OperatorService
from server.services.rpc import MethodTable, ObservedServer, RequestObserver, TableServer
from server.services.vault import VaultService
from server.services.videos import VideosService
from server.transcription.body import BodyBudget, retry_after_for, workspace_share
from server.transcription.transcriber import Transcriber
from server.transcription.upload import Uploads
from server.vault import keycheck
from server.vault.crypto import MasterKey, load_master_key
from server.vault.webhook_secrets import seal_legacy_secrets
from server.videos.content import ContentStore, content_store
from server.workers.video_worker import VideoWorker
from server.workers.webhook_dispatcher import WebhookDispatcher

log = logging.getLogger("gateway.server")
DECODE_QUEUE = 512
# A gRPC health service that is SERVING while the process runs, whatever the database does:
# what a liveness probe asks (restarting replicas cures no database outage). The overall
# health ("" and each service) follows the database and the drain.
LIVENESS_SERVICE = "liveness"


@dataclass
class Core:
    """The dependencies every service gets, built once."""

    settings: Settings
    engine: AsyncEngine
    sessions: SessionFactory
    writer: Writer  # the process's group-commit writer (server/db/writer.py)
    clock: Clock
    auth: Authenticator
    catalog: Catalog
    http: httpx.AsyncClient  # the one pooled client for every provider call
    limits: Limits
    uploads: Uploads  # POST /audio/transcriptions, for both ways in (gRPC and REST)
    content: ContentStore
    video_worker: VideoWorker
    webhooks: WebhookDispatcher
    maintenance: Maintenance
    vault_master: MasterKey
    byok: ByokRouting  # a workspace's own provider keys, and the platform fee on them
    metrics: Metrics
    tracer: Tracer
    tracer_provider: TracerProvider | None  # None: traces are not exported
    # The requests the process is answering: the observer counts them, the writer reads.
    in_flight: RequestsInFlight
    pools: tuple[ComputePool, ...] = ()  # every pool of worker processes, to close
    hot_reads: HotReads | None = None  # GET /key's one read (server/db/driver.py)
    guardrails: GuardrailsCache | None = None  # callers' guardrails, under the auth's stamp
    leases: BudgetLeases | None = None  # slices of callers' budgets (limits/leases.py)
    # Leased requests' charges still committing after their answers (billing/settlements.py).
    settlements: Settlements = field(default_factory=Settlements)

    async def close(self) -> None:
        # Every charge still committing first: it needs its lease and the writer.
        await self.settlements.close(FINISH_TIMEOUT_SECONDS)
        for pool in self.pools:
            await pool.close()
        await self.http.aclose()
        await self.content.close()
        if self.leases is not None:
            await self.leases.close()  # the rows go back before the writer's last commit
        await self.writer.close()
        if self.hot_reads is not None:
            self.hot_reads.close()
        await self.engine.dispose()
        if self.tracer_provider is not None:
            # Export what is still buffered; the exporter blocks, so off the event loop.
            await asyncio.to_thread(self.tracer_provider.shutdown)


def build_core(
    settings: Settings, clock: Clock | None = None, limits: Limits | None = None
) -> Core:
    """`limits` replaces the enforced limits only to measure what they cost (bench/)."""
    engine = create_engine(settings.database_url)
    sessions = session_factory(engine)
    in_flight = RequestsInFlight()
    writer = Writer(sessions, alone=in_flight.alone)
    clock = clock or SystemClock()
    principals = PrincipalStampView(clock)
    watch_principal_changes(engine, principals)
    catalog = load_catalog(settings.catalog_file)
    tls = ssl.create_default_context()
    if settings.webhook_ca_bundle:
        tls.load_verify_locations(cafile=settings.webhook_ca_bundle)
    http = provider_client(tls, transport=settings.provider_transport)
    # A queued decode holds only a reference to audio the request already holds in memory:
    # the queue is long (a burst of small files is decoded in turn), the caller's deadline
    # bounds the wait, and beyond it the answer is 503 with Retry-After (nothing held).
    decoder = ComputePool("audio decoding", settings.decode_workers, queue=DECODE_QUEUE)
    local_stt = ComputePool(
        "local speech-to-text", settings.local_stt_workers, queue=settings.local_stt_queue
    )
    stt_adapters: dict[str, SttAdapter] = {
        "openai": OpenAISttAdapter(http),
        "pocketsphinx": PocketsphinxAdapter(local_stt),
        "azure-openai": AzureOpenAISttAdapter(http),
        "deepgram": DeepgramSttAdapter(http),
        "elevenlabs": ElevenLabsSttAdapter(http),
        "assemblyai": AssemblyAISttAdapter(http),
    }
    # Result URLs off the endpoint's own origin: https to public addresses, DNS-pinned.
    allow_private = settings.provider_downloads_allow_private
    downloads = Downloads(http, allow_private=allow_private)
    images = ImageFetcher(
        http,
        allow_private=allow_private,
        max_bytes=settings.video_image_max_bytes,
        seconds=settings.video_image_fetch_seconds,
    )
    video_adapters: dict[str, VideoAdapter] = {
        "local": LocalVideoAdapter(),
        "openai": OpenAIVideoAdapter(http, downloads),
        "queue": FalVideoAdapter(http, downloads, spec=QUEUE_SPEC),
        "gemini": GeminiVideoAdapter(http, images=images, downloads=downloads),
        "vertex": VertexVideoAdapter(http, images=images, downloads=downloads),
        "kling": KlingVideoAdapter(http, clock, downloads),
        "minimax": MiniMaxVideoAdapter(http, downloads),
        "seedance": SeedanceVideoAdapter(http, downloads),
        "dashscope": DashScopeVideoAdapter(http, downloads),
        "fal": FalVideoAdapter(http, downloads),
        "replicate": ReplicateVideoAdapter(http, downloads),
    }
    # Every catalog endpoint must name a registered adapter (startup error otherwise).
    catalog = served_by(catalog, stt_adapters.keys(), video_adapters.keys())
    content = content_store(
        settings.content_url,
        settings.content_dir,
        check_seconds=settings.content_check_seconds,
        part_bytes=settings.content_part_bytes,
    )
    vault_master = load_master_key(settings.data_dir)  # also seals BYOK keys
    byok = ByokRouting(
        vault_master,
        ByokFees(settings.byok_fee_percent, settings.byok_free_requests_per_month),
        ByokKeysCache(principals),  # sealed; opened by each request that uses them
    )
    guardrails = GuardrailsCache(principals)
    cooldowns = Cooldowns(clock)  # shared by transcription and video submission routing
    metrics = Metrics()
    if writer.inline is not None:
        metrics.watch_sqlite_writer(writer.inline.stats)
    tracer_provider = tracer_provider_from_environment()
    tracer = tracer_of(tracer_provider)
    # Leases are part of the enforced limits: a stand-in `limits` (bench/) admits alone.
    leases = BudgetLeases(writer, clock, metrics) if limits is None else None
    settlements = Settlements()
    limits = limits or EnforcedLimits(metrics)
    webhooks = WebhookDispatcher(
        sessions,
        clock,
        http,
        master=vault_master,
        allow_private=settings.webhook_allow_private,
        deadline=settings.webhook_deadline_seconds,
        concurrency=settings.webhook_concurrency,
        workspace_concurrency=settings.webhook_workspace_concurrency,
        max_answer_bytes=settings.webhook_max_answer_bytes,
    )
    auth = Authenticator(clock, principals)
    return Core(
        settings=settings,
        in_flight=in_flight,
        engine=engine,
        sessions=sessions,
        writer=writer,
        clock=clock,
        auth=auth,
        hot_reads=HotReads(engine),
        catalog=catalog,
        http=http,
        limits=limits,
        uploads=Uploads(
            auth,
            sessions,
            Transcriber(
                catalog,
                stt_adapters,
                clock,
                limits,
                metrics,
                tracer,
                decoder,
                byok=byok,
                cooldowns=cooldowns,
                writer=writer,
                guardrails=guardrails,
                leases=leases,
                settlements=settlements,
            ),
            BodyBudget(
                settings.body_budget_bytes,
                settings.body_budget_wait_seconds,
                retry_after_for(settings.body_budget_wait_seconds),
                trim=release_free_memory,
                share=settings.body_budget_workspace_bytes
                or workspace_share(settings.body_budget_bytes, settings.max_request_bytes),
            ),
            settings.max_request_bytes,
            settings.edge.request_timeout_seconds,
        ),
        content=content,
        video_worker=VideoWorker(
            sessions,
            clock,
            catalog,
            video_adapters,
            content,
            lease=timedelta(seconds=settings.job_lease_seconds),
            retention=timedelta(seconds=settings.video_retention_seconds),
            on_webhook_queued=webhooks.wake.set,
            metrics=metrics,
            tracer=tracer,
            byok=byok,
            cooldowns=cooldowns,
            writer=writer,
            max_video_bytes=settings.video_max_bytes,
            workspace_jobs_at_once=settings.video_workspace_jobs_at_once,
            download_seconds=settings.video_download_seconds,
            jobs_at_once=settings.video_jobs_at_once,
            drain_seconds=settings.shutdown_grace_seconds,
        ),
        webhooks=webhooks,
        maintenance=Maintenance(
            sessions,
            clock,
            content,
            metrics,
            interval=settings.maintenance_interval_seconds,
        ),
        vault_master=vault_master,
        byok=byok,
        metrics=metrics,
        tracer=tracer,
        tracer_provider=tracer_provider,
        leases=leases,
        settlements=settlements,
        pools=(decoder, local_stt),
        guardrails=guardrails,
    )


async def warm_hot_paths(core: Core) -> None:
    """Compile the statements every caller's first requests run (the principal and
    guardrails lookups, GET /key's status read) before serving, so that no request pays
    for it: each is run once for no key, and nothing is cached from it."""
    async with core.sessions() as session:
        await core.auth.warm(session)
        await guardrails_of(session, "", "")
    if core.hot_reads is not None:
        await warm_key_status(core.hot_reads, core.clock.now())


# Young collections every this many net allocations (CPython's default: 700). A request
# allocates thousands of short-lived objects that die by reference counting anyway.
GC_YOUNG_THRESHOLD = 7_000


def tune_garbage_collector() -> None:
    """Before serving: what start-up built (modules, the catalog, compiled statements) is
    moved out of the collector's sight (gc.freeze), and young collections run 10x less
    often (cycles are still collected, later): otherwise the collector walks what start-up
    built again and again, on every request's allocations."""
    gc.freeze()
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


def metadata_limit_bytes(edge: EdgePolicy) -> int:
    """The request metadata a server accepts: all Envoy may forward of a request within the
    edge's header limit — the client's headers, the host again (x-gateway-authority) and the
    headers Envoy adds — with room to spare."""
    return 2 * edge.max_request_headers_kb * 1024 + 64 * 1024


# The HTTP/2 window of each stream from Envoy (see build_server).
STREAM_WINDOW_BYTES = 256 * 1024


def build_server(core: Core) -> tuple[grpc.aio.Server, health.aio.HealthServicer, RestApi]:
    """The gRPC server with every service, its health servicer, and the REST listener's
    routes (the hot REST routes: the same services' code, the same observer)."""
    limit = core.settings.max_request_bytes + 1024 * 1024  # the body plus envelope
    metadata_limit = metadata_limit_bytes(core.settings.edge)
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            # gRPC refuses metadata over 8 KiB at random (16 KiB always) by default, while the
            # edge lets 60 KiB of headers through: accept whatever Envoy forwards (soft limit =
            # hard limit, so nothing is refused at random).
            ("grpc.max_metadata_size", metadata_limit),
            ("grpc.absolute_max_metadata_size", metadata_limit),
            ("grpc.so_reuseport", 0),
            # A stream's unread bytes are held by gRPC (Envoy sends as far as the window
            # lets it): a fixed window, not one BDP probing grows to megabytes, bounds what
            # a body nobody reads yet (waiting for the body budget, or refused unread) costs.
            ("grpc.http2.bdp_probe", 0),
            ("grpc.http2.lookahead_bytes", STREAM_WINDOW_BYTES),
        ],
    )
    # Every gateway service is registered through the observer (server/services/rpc.py):
    # request ids, metrics, access log, spans and errors, wrapped once per method here.
    observer = RequestObserver(
        core.metrics,
        core.tracer,
        database_retry_seconds=recovery_retry_seconds(core.settings.health_interval_seconds),
        in_flight=core.in_flight,
    )
    # Every method, the gateway's and grpc's health and reflection, is found in one table,
    # the server's only handler (MethodTable says why).
    table = MethodTable()
    server.add_generic_rpc_handlers((table,))
    observed: Any = ObservedServer(table, observer)  # the generated functions' `server`
    keys = KeysService(
        core.auth,
        core.sessions,
        core.clock,
        core.hot_reads,
        core.guardrails,
        settlements=core.settlements,
    )
    keys_pb2_grpc.add_KeysServicer_to_server(keys, observed)
    management_pb2_grpc.add_ManagementServicer_to_server(
        ManagementService(
            core.auth,
            core.sessions,
            core.clock,
            KeyRotation(
                core.settings.key_rotation_grace_seconds,
                core.settings.key_rotation_max_grace_seconds,
            ),
            settlements=core.settlements,
        ),
        observed,
    )
    management_pb2_grpc.add_OperatorServicer_to_server(
        OperatorService(core.auth, core.sessions, core.clock), observed
    )
    videos_pb2_grpc.add_VideosServicer_to_server(
        VideosService(
            core.auth,
            core.sessions,
            core.clock,
            core.catalog,
            core.content,
            core.limits,
            core.writer,
            core.video_worker.wake,
            core.byok,
            adapters=core.video_worker.adapters,
            provider_cancel=core.video_worker.cancel_at_provider,
            guardrails=core.guardrails,
            metrics=core.metrics,
        ),
        observed,
    )
    audio_pb2_grpc.add_AudioServicer_to_server(
        AudioService(core.auth, core.sessions, core.uploads),
        observed,
    )
    byok_pb2_grpc.add_ByokServicer_to_server(
        ByokService(core.auth, core.sessions, core.clock, core.catalog, core.vault_master),
        observed,
    )
    guardrails_pb2_grpc.add_GuardrailsServicer_to_server(
        GuardrailsService(core.auth, core.sessions, core.clock, core.catalog), observed
    )
    generations_pb2_grpc.add_GenerationsServicer_to_server(
        GenerationsService(core.auth, core.sessions, core.settlements), observed
    )
    console_pb2_grpc.add_ActivityServicer_to_server(
        ActivityService(core.auth, core.sessions, core.clock, core.settlements), observed
    )
    console_pb2_grpc.add_ConsoleServicer_to_server(ConsoleService(ConsoleAssets()), observed)
    models_pb2_grpc.add_ModelsServicer_to_server(
        ModelsService(core.auth, core.sessions, core.catalog, core.clock, core.guardrails), observed
    )
    vault_pb2_grpc.add_VaultServicer_to_server(
        VaultService(
            core.auth, core.sessions, core.clock, core.vault_master, core.settings.regional_hosts
        ),
        observed,
    )

    health_servicer = health.aio.HealthServicer()
    plain: Any = TableServer(table)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, plain)
    reflection.enable_server_reflection(
        (
            *SERVICES,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ),
        plain,
    )
    return server, health_servicer, RestApi(core.uploads, keys, observer)


async def prepare_vault(settings: Settings, master: MasterKey) -> int:
    """Refuse a master key that is not the database's (MasterKeyMismatch), then seal what an
    older gateway stored in clear (webhook signing secrets), with an engine of its own:
    `gateway up --workers N` does it once before its server processes start."""
    engine = create_engine(settings.database_url)
    try:
        sessions = session_factory(engine)
        await keycheck.verify(sessions, master, SystemClock().now())
        return await seal_legacy_secrets(sessions, master, SystemClock().now())
    finally:
        await engine.dispose()


async def serve(
    settings: Settings,
    started: asyncio.Event | None = None,
    stop: asyncio.Event | None = None,
    limits: Limits | None = None,
    listening: Callable[[ServedPorts], None] | None = None,
) -> None:
    """Migrate, serve until `stop` is set, then drain: report NOT_SERVING, stop claiming
    jobs and webhooks and stop the housekeeping (the current step finishes), let in-flight
    calls finish within the shutdown grace, and close. `listening` is told the ports
    actually bound (gRPC's and the REST listener's: the ones picked for port 0) once the
    server serves, before `started` is set."""
    # Taken ports are refused before anything else, naming the address and the flag.
    ensure_free(settings.grpc_host, settings.grpc_port, GRPC_PORT)
    ensure_free(settings.grpc_host, settings.rest_port, REST_PORT)
    ensure_free(settings.metrics_host, settings.metrics_port, METRICS_PORT)
    await upgrade(settings.database_url)
    core = build_core(settings, limits=limits)
    try:
        # Before serving: the master key is the database's and the clock agrees with the
        # database server's (else refuse to start), the content store is usable (an object
        # store's bucket exists and answers; else one line naming GATEWAY_CONTENT_URL), and
        # what an older gateway stored in clear is sealed (once).
        await keycheck.verify(core.sessions, core.vault_master, core.clock.now())
        await check_clock(core.sessions, core.clock, settings.max_clock_skew_seconds)
        await core.content.start()
        await seal_legacy_secrets(core.sessions, core.vault_master, core.clock.now())
    except BaseException:
        await core.close()
        raise
    # The pools of worker processes start when first used: a WAV (the common upload) is
    # measured in this process, so the decoders are only for compressed audio, and a server
    # that never sees any keeps neither their memory nor their start-up CPU.
    server, health_servicer, rest_api = build_server(core)
    rest = RestListener(
        rest_api,
        settings.grpc_host,
        settings.rest_port,
        metadata_limit_bytes(settings.edge),
        settings.edge.listener_idle_seconds,
    )
    await warm_hot_paths(core)
    tune_garbage_collector()
    try:
        bound = server.add_insecure_port(settings.grpc_target)
    except RuntimeError as error:  # grpcio raises "Failed to bind to address ..."
        raise listen_error(settings.grpc_host, settings.grpc_port, GRPC_PORT, error) from None
    if bound == 0:
        raise listen_error(settings.grpc_host, settings.grpc_port, GRPC_PORT, None)
    metrics_server = None
    if settings.metrics_port:
        try:
            metrics_server = core.metrics.serve(settings.metrics_host, settings.metrics_port)
        except OSError as error:
            raise listen_error(
                settings.metrics_host, settings.metrics_port, METRICS_PORT, error
            ) from None
        log.info("metrics on http://%s:%s/metrics", settings.metrics_host, settings.metrics_port)
    await server.start()
    try:
        rest_bound = await rest.start()
    except BaseException:
        await server.stop(None)
        await core.close()
        raise

    async def set_serving(serving: bool) -> None:
        rest_api.serving = serving
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for service in ("", *SERVICES):
            await health_servicer.set(service, status)

    await health_servicer.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
    await set_serving(True)
    log.info("gRPC server listening on %s:%s", settings.grpc_host, bound)
    log.info("REST listener on http://%s:%s", settings.grpc_host, rest_bound)
    workers_stop = asyncio.Event()
    monitor = DatabaseMonitor(
        core.sessions,
        core.clock,
        core.metrics,
        set_serving,
        interval=settings.health_interval_seconds,
    )
    background = [
        asyncio.create_task(core.video_worker.run(workers_stop)),
        asyncio.create_task(core.webhooks.run(workers_stop)),
        asyncio.create_task(core.maintenance.run(workers_stop)),
        asyncio.create_task(monitor.run(workers_stop)),
    ]
    if listening is not None:
        listening(ServedPorts(grpc=bound, rest=rest_bound))
    if started is not None:
        started.set()
    try:
        if stop is None:
            await server.wait_for_termination()
        else:
            await stop.wait()
    finally:
        log.info("stopping: draining in-flight requests")
        await health_servicer.enter_graceful_shutdown()
        rest_api.serving = False
        workers_stop.set()  # finish the current step, claim nothing new
        await asyncio.gather(
            server.stop(grace=settings.shutdown_grace_seconds),
            rest.stop(settings.shutdown_grace_seconds),
        )
        await asyncio.gather(*background)
        await core.close()
        if metrics_server is not None:
            metrics_server.shutdown()
            metrics_server.server_close()
        log.info("stopped")
