"""Benchmark video jobs: durable submissions per second, and provider completion -> webhook.

Starts an HTTPS webhook receiver (testkit/fakes/webhook_receiver.py, a trustme CA) and a fake
OpenAI videos API provider (testkit/fakes/video_providers.py), both in this process on
127.0.0.1, writes a catalog with two video models, starts its own gateway (`gateway up`, gRPC
server + Envoy) on a fresh temporary data dir, issues an API key with `gateway keys create`,
funds its account with `gateway credits add` and reads the workspace's webhook signing secret
with `gateway workspaces webhook-secret default`. Then:

1. Accepted submissions per second. For each concurrency, the same valid
   POST /api/v1/videos (model `bench/unserved`, 1 s, 480p 16:9) through Envoy: a short
   warm-up, then a bounded run (a fixed number of requests, cut off by a hard time cap). Only
   HTTP 202 counts; a 202 means the job row and its credit hold are committed
   (server/videos/jobs.py, submit_job). Latency percentiles are over the 202s. The load
   generator is the lean keep-alive HTTP/1.1 client of bench/harness/load.py (httpx would cost more
   client CPU than the gateway takes per request). `bench/unserved` has one endpoint, an
   `openai` adapter at a port of 127.0.0.1 nobody listens on, whose `api_key_env` names a
   variable that is not set: the background worker cannot use it and fails each job at once
   with "No available provider ..." - no rendering, no provider call, but still a claim and
   a finish transaction per job in the same process. Between cases the bench waits for the
   worker to finish the backlog, so each case starts with an idle worker; the backlog left at
   the end of each case is reported. Afterwards every 202 must have its row in the database.

2. Provider completion -> webhook delivery. N jobs (a few at a time) on `bench/provider`,
   served by the fake provider ("ok": completes on the second status look), each with a
   callback_url on the receiver. For each job: the moment the fake answered a GET with status
   "completed" (its handler is wrapped to note it) to the moment the receiver had read the
   webhook. Each webhook's Standard Webhooks signature is verified with the workspace secret.
   The fake is matched to the gateway's job through video_jobs.provider_job_id.

The issue's target is reported, met or not, without failing the run: >= 500 accepted jobs/s
at concurrency 16, on SQLite and on PostgreSQL, on a 2-core machine. Only 127.0.0.1 is
contacted.

Run from the repository root:

    python -m bench.videos                         # SQLite in the temp data dir
    python -m bench.videos --database-url postgresql://postgres@127.0.0.1:5432/test
    python -m bench.videos --database-url postgresql --requests 300 --webhook-jobs 5
    python -m bench.videos --workers 2             # `gateway up --workers 2`

With --database-url the URL names a PostgreSQL server and a database to connect to for
administration (`postgresql` alone means postgresql://postgres@127.0.0.1:5432/test); a fresh
database is created there for the run and dropped at the end. With --workers N the gateway
runs N server processes (each with its own background worker) behind one Envoy. The peak RSS
(VmHWM) of the gateway's processes is read before it is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine
from standardwebhooks import Webhook

from bench.harness.cli import (
    add_concurrency_argument,
    add_gateway_arguments,
    add_json_argument,
    add_load_arguments,
    count,
    positive_int,
)
from bench.harness.load import (
    LOOPBACK,
    Call,
    CaseResult,
    LeanHttpClient,
    bearer,
    loopback_client,
    measure,
    percentile,
)
from bench.harness.processes import (
    PeakRss,
    begin,
    create_funded_key,
    gateway_cli,
    last_line,
    run_database,
    running_gateway,
    scratch,
)
from bench.harness.report import (
    TargetCheck,
    error_lines,
    fmt,
    gateway_lines,
    kinds,
    load_settings,
    machine_info,
    machine_line,
    markdown_table,
    progress,
    requests_cell,
    rss_json,
    write_json,
)
from bench.harness.stt import PRICE_PER_SECOND
from server.db.engine import create_engine
from server.db.models import VideoJob
from server.videos import jobs
from testkit.catalog import FAKE_KEY_ENV
from testkit.fakes.openai_stt import API_KEY as FAKE_PROVIDER_KEY
from testkit.fakes.video_providers import FakeVideoProviders
from testkit.fakes.webhook_receiver import ReceivedHook, WebhookReceiver
from testkit.processes import GatewayProcess, free_port

SUBMIT_PATH = "REST POST /api/v1/videos (Envoy)"
VIDEOS_ROUTE = "/videos"  # under the gateway's base URL (…/api/v1)
UNSERVED_MODEL = "bench/unserved"
PROVIDER_MODEL = "bench/provider"
UPSTREAM_MODEL = "ok"  # the fake provider's model that completes on the second look
WORKSPACE = "default"  # where `gateway keys create` puts the key when none is named
COMPLETED_TYPE = f"video.generation.{jobs.COMPLETED}"
WEBHOOK_INTERVAL = "provider completed -> webhook received"
WHOLE_JOB_INTERVAL = "202 -> webhook received (whole job)"
DRAIN_CAP = 120.0  # seconds to wait for the worker to finish the submitted backlog
SETTLE = 1.0  # seconds to wait after the last webhook for duplicates

# The target: reported, never a failure.
TARGET_RPS = 500.0
TARGET_CONCURRENCY = 16
TARGET_NPROC = 2

_JOBS = VideoJob.__table__
_OPEN = (jobs.PENDING, jobs.IN_PROGRESS)


# --- catalog --------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchCatalog:
    path: Path
    unserved_base_url: str  # nobody listens there
    unset_key_env: str  # set to a dummy key for the gateway only: the model is routable


def write_catalog(path: Path, provider_base_url: str) -> BenchCatalog:
    unserved = f"http://{LOOPBACK}:{free_port()}/v1"
    unset_env = f"BENCH_VIDEOS_UNSET_KEY_{secrets.token_hex(4).upper()}"
    common = [
        'kind = "video"',
        f'price_per_second = "{PRICE_PER_SECOND}"',
        'resolutions = ["480p"]',
        'aspect_ratios = ["16:9"]',
        "durations = [1]",
        "default_duration = 1",
    ]
    lines = [
        "[[models]]",
        f'id = "{UNSERVED_MODEL}"',
        'name = "Benchmark: a video model the worker cannot serve (no credential)"',
        *common,
        "[[models.endpoints]]",
        'provider = "nowhere"',
        'adapter = "openai"',
        f'base_url = "{unserved}"',
        f'api_key_env = "{unset_env}"',
        'model = "none"',
        "",
        "[[models]]",
        f'id = "{PROVIDER_MODEL}"',
        'name = "Benchmark: fake OpenAI videos API provider"',
        *common,
        "[[models.endpoints]]",
        'provider = "openai"',
        'adapter = "openai"',
        f'base_url = "{provider_base_url}"',
        f'api_key_env = "{FAKE_KEY_ENV}"',
        f'model = "{UPSTREAM_MODEL}"',
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return BenchCatalog(path, unserved, unset_env)


def worker_note(catalog: BenchCatalog) -> str:
    return (
        f"Submissions use {UNSERVED_MODEL}: its only endpoint is an openai adapter at "
        f"{catalog.unserved_base_url} (nothing listens; its api_key_env "
        f"{catalog.unset_key_env} holds a dummy key, as a model without credentials is "
        "refused with 503), so the background worker fails each job at once (a refused "
        "connection, no rendering) but still runs a claim and a finish transaction per job "
        "in the server process while the submissions are measured."
    )


# --- the fakes, timestamped -----------------------------------------------------------------


@dataclass
class TimedVideoProviders(FakeVideoProviders):
    """FakeVideoProviders noting when it first answered a status GET with "completed"
    (time.perf_counter(), after the answer was written), per provider job id. Its answers
    leave with TCP_NODELAY: the handler writes headers and body separately, and Nagle's wait
    for a delayed ACK would otherwise add ~40 ms to the gateway's side of the interval."""

    completed_at: dict[str, float] = field(default_factory=dict)

    def start(self) -> TimedVideoProviders:
        super().start()
        assert self.server is not None
        base: Any = self.server.RequestHandlerClass  # the fake's own handler class
        completed_at = self.completed_at
        lock = threading.Lock()

        def _json(handler: BaseHTTPRequestHandler, status: int, body: Any) -> None:
            base._json(handler, status, body)
            if (
                handler.command == "GET"
                and isinstance(body, dict)
                and body.get("status") == jobs.COMPLETED
            ):
                at = time.perf_counter()
                with lock:
                    completed_at.setdefault(str(body.get("id")), at)

        # Swapped in before any request arrives; each connection reads it when accepted.
        self.server.RequestHandlerClass = type(
            "TimedHandler", (base,), {"_json": _json, "disable_nagle_algorithm": True}
        )
        return self


@dataclass(frozen=True)
class Arrival:
    at: float  # time.perf_counter() when the receiver had read the request
    hook: ReceivedHook


class TimedHooks(list[ReceivedHook]):
    """The receiver's `received` list, noting when each webhook arrived, by path."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._by_path: dict[str, list[Arrival]] = {}

    def append(self, hook: ReceivedHook, /) -> None:
        at = time.perf_counter()
        with self._lock:
            super().append(hook)
            self._by_path.setdefault(hook.path, []).append(Arrival(at, hook))

    def arrivals(self, path: str) -> list[Arrival]:
        with self._lock:
            return list(self._by_path.get(path, ()))


# --- the jobs table -------------------------------------------------------------------------


class JobsTable:
    """Read-only looks at video_jobs, on the run's database, between measurements."""

    def __init__(self, database_url: str) -> None:
        self._engine: AsyncEngine = create_engine(database_url, pool_size=1, max_overflow=0)

    async def close(self) -> None:
        await self._engine.dispose()

    async def statuses(self, model: str) -> Counter[str]:
        query = (
            sa.select(_JOBS.c.status, sa.func.count())
            .where(_JOBS.c.model == model)
            .group_by(_JOBS.c.status)
        )
        async with self._engine.connect() as connection:
            rows = (await connection.execute(query)).all()
        return Counter({str(status): int(count) for status, count in rows})

    async def errors(self, model: str) -> Counter[str]:
        query = (
            sa.select(_JOBS.c.error, sa.func.count())
            .where(_JOBS.c.model == model, _JOBS.c.status == jobs.FAILED)
            .group_by(_JOBS.c.error)
        )
        async with self._engine.connect() as connection:
            rows = (await connection.execute(query)).all()
        return Counter({str(error): int(count) for error, count in rows})

    async def backlog(self, model: str) -> int:
        counts = await self.statuses(model)
        return sum(counts[status] for status in _OPEN)

    async def provider_job_ids(self, job_ids: Sequence[str]) -> dict[str, str | None]:
        if not job_ids:
            return {}
        query = sa.select(_JOBS.c.id, _JOBS.c.provider_job_id).where(_JOBS.c.id.in_(job_ids))
        async with self._engine.connect() as connection:
            rows = (await connection.execute(query)).all()
        return {str(job_id): provider_id for job_id, provider_id in rows}

    async def drain(self, model: str, cap: float) -> tuple[int, float, bool]:
        """Wait until the worker has finished `model`'s jobs: (backlog at the start, seconds
        waited, drained)."""
        started = time.perf_counter()
        first = backlog = await self.backlog(model)
        while backlog and time.perf_counter() - started < cap:
            await asyncio.sleep(0.1)
            backlog = await self.backlog(model)
        return first, round(time.perf_counter() - started, 2), backlog == 0


# --- part 1: accepted submissions per second ------------------------------------------------


def submission_body(model: str, prompt: str, **extra: object) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": prompt,
        "duration": 1,
        "resolution": "480p",
        "aspect_ratio": "16:9",
        **extra,
    }


@dataclass
class Accepted:
    """202s seen by the load generator, warm-ups included, for the durability check."""

    count: int = 0


def _accepted_call(client: LeanHttpClient, accepted: Accepted) -> Call:
    async def call() -> str | None:
        status = await client.post()
        if status != 202:
            return f"HTTP {status}"
        accepted.count += 1
        return None

    return call


@dataclass
class SubmitCase:
    result: CaseResult
    accepted: int  # 202s in the measured run
    accepted_per_second: float
    backlog_at_end: int  # jobs the worker had not finished when the measured run ended
    drain_seconds: float  # how long the worker then took to finish them
    drained: bool


async def submit_preflight(base_url: str, key: str, body: bytes) -> str:
    """One submission through httpx, checked, so a broken setup fails loudly."""
    async with loopback_client(base_url, bearer(key, "application/json")) as client:
        response = await client.post(VIDEOS_ROUTE, content=body)
    try:
        document = response.json()
    except ValueError:
        document = None
    if (
        response.status_code != 202
        or not isinstance(document, dict)
        or document.get("status") != jobs.PENDING
    ):
        raise RuntimeError(f"submission preflight failed: {response.status_code} {response.text}")
    return str(document["id"])


async def run_submissions(
    gateway: GatewayProcess, key: str, table: JobsTable, args: argparse.Namespace
) -> tuple[list[SubmitCase], int]:
    """The measured cases; also the number of 202s seen in all (warm-ups included)."""
    body = json.dumps(submission_body(UNSERVED_MODEL, "a benchmark kite over the sea")).encode()
    await submit_preflight(gateway.base_url, key, body)
    accepted = Accepted(count=1)
    cases: list[SubmitCase] = []
    for concurrency in args.concurrency:
        await table.drain(UNSERVED_MODEL, DRAIN_CAP)
        async with LeanHttpClient(
            gateway.base_url + VIDEOS_ROUTE, [key], "application/json", body
        ) as client:
            result = await measure(
                SUBMIT_PATH,
                _accepted_call(client, accepted),
                concurrency,
                args.requests,
                args.warmup,
                args.time_cap,
            )
        backlog, drain_seconds, drained = await table.drain(UNSERVED_MODEL, DRAIN_CAP)
        ok = result.requests - result.errors
        cases.append(
            SubmitCase(
                result=result,
                accepted=ok,
                accepted_per_second=round(ok / result.seconds, 1) if result.seconds else 0.0,
                backlog_at_end=backlog,
                drain_seconds=drain_seconds,
                drained=drained,
            )
        )
        progress(
            f"  done: {SUBMIT_PATH}, concurrency {concurrency}: "
            f"{cases[-1].accepted_per_second} accepted/s, p50 {result.p50_ms} ms; "
            f"worker backlog {backlog}, drained in {drain_seconds} s"
        )
    return cases, accepted.count


@dataclass
class Durability:
    accepted: int  # 202s seen, warm-ups and preflight included
    rows: int  # bench/unserved rows in video_jobs
    statuses: dict[str, int]
    worker_errors: dict[str, int]

    @property
    def ok(self) -> bool:
        return self.rows >= self.accepted


async def durability(table: JobsTable, accepted: int) -> Durability:
    statuses = await table.statuses(UNSERVED_MODEL)
    return Durability(
        accepted=accepted,
        rows=statuses.total(),
        statuses=dict(statuses),
        worker_errors=dict(await table.errors(UNSERVED_MODEL)),
    )


# --- part 2: provider completion -> webhook -------------------------------------------------


@dataclass
class _JobRun:
    index: int
    path: str
    job_id: str | None = None
    accepted_at: float | None = None
    arrival: Arrival | None = None
    error: str | None = None


@dataclass
class WebhookResult:
    jobs: int
    accepted: int  # 202s
    delivered: int  # jobs whose webhook arrived within the per-job timeout
    measured: int  # of those, with a provider completion time to measure from
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    whole_p50_ms: float | None  # 202 -> webhook, for context
    whole_p99_ms: float | None
    whole_max_ms: float | None
    signature_failures: int
    wrong_payloads: int  # verified, but not "completed" for this job
    missing: int  # no webhook within the per-job timeout (or not submitted)
    duplicates: int  # webhooks beyond the first per job
    hit_time_cap: bool
    error_kinds: dict[str, int] = field(default_factory=dict)
    latencies_ms: list[float] = field(default_factory=list)

    @property
    def failures(self) -> int:
        return self.signature_failures + self.wrong_payloads + self.missing + self.duplicates


async def _run_webhook_job(
    client: httpx.AsyncClient,
    run: _JobRun,
    receiver: WebhookReceiver,
    hooks: TimedHooks,
    within: float,
) -> None:
    body = submission_body(
        PROVIDER_MODEL,
        f"benchmark webhook job {run.index}",
        callback_url=f"https://{LOOPBACK}:{receiver.port}{run.path}",
    )
    try:
        response = await client.post(VIDEOS_ROUTE, json=body)
    except httpx.HTTPError as exc:
        run.error = type(exc).__name__
        return
    if response.status_code != 202:
        run.error = f"HTTP {response.status_code}"
        return
    run.accepted_at = time.perf_counter()
    run.job_id = str(response.json()["id"])
    deadline = run.accepted_at + within
    while time.perf_counter() < deadline:
        arrivals = hooks.arrivals(run.path)
        if arrivals:
            run.arrival = arrivals[0]
            return
        await asyncio.sleep(0.01)
    run.error = "no webhook in time"


async def run_webhook_jobs(
    gateway: GatewayProcess,
    key: str,
    receiver: WebhookReceiver,
    hooks: TimedHooks,
    args: argparse.Namespace,
) -> tuple[list[_JobRun], bool]:
    runs = [_JobRun(index, f"/ok/bench-{index}") for index in range(args.webhook_jobs)]
    pending = iter(runs)
    hit_cap = False
    async with loopback_client(gateway.base_url, bearer(key)) as client:

        async def worker() -> None:
            for run in pending:
                await _run_webhook_job(client, run, receiver, hooks, args.webhook_timeout)

        try:
            async with asyncio.timeout(args.webhook_time_cap):
                await asyncio.gather(*(worker() for _ in range(args.webhook_parallel)))
        except TimeoutError:
            hit_cap = True
    await asyncio.sleep(SETTLE)  # late duplicates
    return runs, hit_cap


def _verified(secret: str, run: _JobRun) -> tuple[bool, bool]:
    """(signature valid, payload says this job completed)."""
    assert run.arrival is not None
    try:
        payload = Webhook(secret).verify(run.arrival.hook.body, run.arrival.hook.headers)
    except Exception:
        return False, False
    data = payload.get("data") if isinstance(payload, dict) else None
    completed = (
        isinstance(data, dict)
        and payload.get("type") == COMPLETED_TYPE
        and data.get("id") == run.job_id
        and data.get("status") == jobs.COMPLETED
    )
    return True, completed


def _stats(values: Sequence[float]) -> tuple[float | None, float | None, float | None]:
    ordered = sorted(values)
    rounded = [percentile(ordered, 50), percentile(ordered, 99), ordered[-1] if ordered else None]
    return tuple(None if v is None else round(v, 2) for v in rounded)  # type: ignore[return-value]  # 3 in, 3 out


async def analyse_webhooks(
    runs: Sequence[_JobRun],
    hit_cap: bool,
    fake: TimedVideoProviders,
    hooks: TimedHooks,
    table: JobsTable,
    secret: str,
) -> WebhookResult:
    provider_ids = await table.provider_job_ids([r.job_id for r in runs if r.job_id])
    errors: Counter[str] = Counter(r.error for r in runs if r.error)
    latencies: list[float] = []
    whole: list[float] = []
    signature_failures = wrong_payloads = duplicates = 0
    for run in runs:
        if run.arrival is None or run.job_id is None:
            continue
        duplicates += len(hooks.arrivals(run.path)) - 1
        signed, completed = _verified(secret, run)
        signature_failures += not signed
        wrong_payloads += signed and not completed
        if run.accepted_at is not None:
            whole.append((run.arrival.at - run.accepted_at) * 1000)
        provider_id = provider_ids.get(run.job_id)
        finished = fake.completed_at.get(provider_id) if provider_id else None
        if finished is None:
            errors["no provider completion time"] += 1
        else:
            latencies.append((run.arrival.at - finished) * 1000)
    p50, p99, worst = _stats(latencies)
    whole_p50, whole_p99, whole_max = _stats(whole)
    delivered = sum(r.arrival is not None for r in runs)
    return WebhookResult(
        jobs=len(runs),
        accepted=sum(r.job_id is not None for r in runs),
        delivered=delivered,
        measured=len(latencies),
        p50_ms=p50,
        p99_ms=p99,
        max_ms=worst,
        whole_p50_ms=whole_p50,
        whole_p99_ms=whole_p99,
        whole_max_ms=whole_max,
        signature_failures=signature_failures,
        wrong_payloads=wrong_payloads,
        missing=len(runs) - delivered,
        duplicates=duplicates,
        hit_time_cap=hit_cap,
        error_kinds=dict(errors),
        latencies_ms=[round(v, 2) for v in latencies],
    )


# --- both parts -----------------------------------------------------------------------------


@dataclass
class Results:
    submissions: list[SubmitCase]
    durability: Durability | None
    webhooks: WebhookResult | None
    worker_drained_before_webhooks: bool = True


async def run_all(
    gateway: GatewayProcess,
    key: str,
    secret: str,
    fake: TimedVideoProviders,
    receiver: WebhookReceiver,
    hooks: TimedHooks,
    args: argparse.Namespace,
) -> Results:
    table = JobsTable(gateway.database_url)
    try:
        cases: list[SubmitCase] = []
        durable: Durability | None = None
        if args.requests > 0:
            cases, accepted = await run_submissions(gateway, key, table, args)
            durable = await durability(table, accepted)
        drained = (await table.drain(UNSERVED_MODEL, DRAIN_CAP))[2]
        webhooks: WebhookResult | None = None
        if args.webhook_jobs > 0:
            runs, hit_cap = await run_webhook_jobs(gateway, key, receiver, hooks, args)
            webhooks = await analyse_webhooks(runs, hit_cap, fake, hooks, table, secret)
            progress(
                f"  done: {WEBHOOK_INTERVAL}: {webhooks.delivered}/{webhooks.jobs} webhooks, "
                f"p50 {webhooks.p50_ms} ms"
            )
        return Results(cases, durable, webhooks, drained)
    finally:
        await table.close()


# --- report ---------------------------------------------------------------------------------


def target_check(cases: Sequence[SubmitCase]) -> TargetCheck:
    case = next((c for c in cases if c.result.concurrency == TARGET_CONCURRENCY), None)
    value = None if case is None else case.accepted_per_second
    return TargetCheck(
        f">= {TARGET_RPS:g} accepted jobs/s at concurrency {TARGET_CONCURRENCY} "
        f"(on a {TARGET_NPROC}-core machine)",
        value,
        None if value is None else value >= TARGET_RPS,
    )


def submissions_table(cases: Sequence[SubmitCase]) -> str:
    return markdown_table(
        [
            "path",
            "concurrency",
            "requests",
            "accepted (202)",
            "accepted/s",
            "p50 ms",
            "p99 ms",
            "errors",
            "worker backlog at end",
        ],
        [
            [
                c.result.path,
                c.result.concurrency,
                requests_cell(c.result.requests, c.result.hit_time_cap),
                c.accepted,
                f"{c.accepted_per_second:.1f}",
                fmt(c.result.p50_ms),
                fmt(c.result.p99_ms),
                c.result.errors,
                c.backlog_at_end,
            ]
            for c in cases
        ],
    )


def webhooks_table(w: WebhookResult) -> str:
    columns = ["interval", "jobs", "webhooks", "p50 ms", "p99 ms", "max ms", "bad signatures"]
    return markdown_table(
        [*columns, "missing"],
        [
            [
                name,
                requests_cell(w.jobs, w.hit_time_cap),
                count,
                fmt(p50),
                fmt(p99),
                fmt(worst),
                w.signature_failures,
                w.missing,
            ]
            for name, p50, p99, worst, count in (
                (WEBHOOK_INTERVAL, w.p50_ms, w.p99_ms, w.max_ms, w.measured),
                (WHOLE_JOB_INTERVAL, w.whole_p50_ms, w.whole_p99_ms, w.whole_max_ms, w.delivered),
            )
        ],
    )


def report(
    results: Results,
    machine: dict[str, Any],
    note: str,
    args: argparse.Namespace,
    rss: PeakRss | None,
) -> str:
    lines: list[str] = []
    if results.submissions:
        check = target_check(results.submissions)
        target = check.line("jobs/s")
        if machine["nproc"] != TARGET_NPROC:
            target += f" (this machine: nproc={machine['nproc']})"
        lines += [
            "Accepted video submissions (durable: the job row is committed before the 202)",
            "",
            submissions_table(results.submissions),
            "",
            "Target of the issue (reported, not enforced):",
            target,
            "",
        ]
    if results.webhooks is not None:
        w = results.webhooks
        lines += [
            f"Provider completion -> webhook delivery ({args.webhook_parallel} job(s) at a time, "
            "HTTPS receiver, Standard Webhooks signatures verified)",
            "",
            webhooks_table(w),
            "",
            f"Webhook checks: {w.signature_failures} bad signatures, {w.wrong_payloads} "
            f"payloads not 'completed' for their job, {w.missing} missing, {w.duplicates} "
            "duplicates",
            "",
        ]
    lines.append(machine_line(machine, "load generator: lean keep-alive HTTP/1.1 client"))
    lines += gateway_lines(args.workers, rss)
    lines.append(f"Worker: {note}")
    if results.durability is not None:
        d = results.durability
        statuses = ", ".join(f"{s} {n}" for s, n in sorted(d.statuses.items()))
        reasons = "; ".join(f"{e!r} x{n}" for e, n in sorted(d.worker_errors.items()))
        lines.append(
            f"Durability: {d.rows} {UNSERVED_MODEL} rows for {d.accepted} 202s "
            f"(warm-ups included) - {'ok' if d.ok else 'JOBS MISSING'}; statuses: {statuses}; "
            f"failed by the worker with: {reasons or '-'}"
        )
    for c in results.submissions:
        if not c.drained:
            lines.append(
                f"The worker had not finished the concurrency {c.result.concurrency} backlog "
                f"after {c.drain_seconds} s"
            )
        lines += error_lines([c.result])
    if results.webhooks is not None and results.webhooks.error_kinds:
        lines.append(f"Errors in the webhook jobs: {kinds(results.webhooks.error_kinds)}")
    if not results.worker_drained_before_webhooks:
        lines.append("The worker still had submission jobs when the webhook jobs started")
    return "\n".join(lines)


def failed(results: Results) -> bool:
    errors = any(c.result.errors for c in results.submissions)
    lost = results.durability is not None and not results.durability.ok
    hooks = results.webhooks is not None and (
        results.webhooks.failures > 0 or bool(results.webhooks.error_kinds)
    )
    return errors or lost or hooks


# --- main -----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.videos",
        description="Benchmark durable video submissions (POST /api/v1/videos via Envoy) and "
        "the time from provider completion to webhook delivery, against a gateway started "
        "for the run.",
    )
    add_gateway_arguments(parser)
    add_load_arguments(parser, requests=2000, warmup=200, noun="submissions", zero_skips="part 1")
    add_concurrency_argument(parser, of=" of the submissions")
    parser.add_argument(
        "--webhook-jobs",
        type=count,
        default=30,
        help="jobs for the completion -> webhook measurement (30); 0 skips part 2",
    )
    parser.add_argument(
        "--webhook-parallel",
        type=positive_int,
        default=3,
        help="webhook jobs in flight at a time (3)",
    )
    parser.add_argument(
        "--webhook-timeout",
        type=float,
        default=60.0,
        help="seconds to wait for one job's webhook after its 202 (60)",
    )
    parser.add_argument(
        "--webhook-time-cap",
        type=float,
        default=300.0,
        help="hard time cap of the whole webhook measurement in seconds (300)",
    )
    add_json_argument(parser)
    return parser


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    return load_settings(
        args,
        client="lean",
        workers=args.workers,
        submission_model=UNSERVED_MODEL,
        webhook_jobs=args.webhook_jobs,
        webhook_parallel=args.webhook_parallel,
        webhook_timeout_seconds=args.webhook_timeout,
        webhook_time_cap_seconds=args.webhook_time_cap,
        webhook_model=PROVIDER_MODEL,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    pg = begin("videos", args.database_url)
    with scratch("bench-videos-") as tmp:
        data_dir = tmp / "data"
        hooks = TimedHooks()
        receiver = WebhookReceiver(tmp / "webhook-ca.pem", received=hooks)
        fake = TimedVideoProviders()
        with run_database(pg, data_dir) as database:
            try:
                progress("Starting the webhook receiver and the fake provider...")
                receiver.start()
                fake.start()
                catalog = write_catalog(tmp / "catalog.toml", f"{fake.base}/v1")
                environment = {
                    "GATEWAY_CATALOG": str(catalog.path),
                    FAKE_KEY_ENV: FAKE_PROVIDER_KEY,
                    catalog.unset_key_env: "bench-dummy-key",
                    "GATEWAY_WEBHOOK_CA_BUNDLE": str(receiver.ca_file),
                    "GATEWAY_WEBHOOK_ALLOW_PRIVATE": "1",
                }
                with running_gateway(data_dir, database, args.workers, environment) as run:
                    key = create_funded_key(data_dir, database.url)
                    secret = last_line(
                        gateway_cli(
                            data_dir, database.url, "workspaces", "webhook-secret", WORKSPACE
                        )
                    )
                    results = asyncio.run(
                        run_all(run.gateway, key, secret, fake, receiver, hooks, args)
                    )
            finally:
                fake.stop()
                receiver.stop()

    machine = machine_info(database.label)
    note = worker_note(catalog)
    print(report(results, machine, note, args, run.peak_rss))
    write_json(
        args.json,
        "videos",
        _settings(args),
        machine,
        rss_json(run.peak_rss),
        worker_note=note,
        submissions=[
            {**asdict(c.result), **{k: v for k, v in asdict(c).items() if k != "result"}}
            for c in results.submissions
        ],
        durability=None if results.durability is None else asdict(results.durability),
        webhooks=None if results.webhooks is None else asdict(results.webhooks),
        targets=[asdict(target_check(results.submissions))] if results.submissions else [],
    )
    return 1 if failed(results) else 0


if __name__ == "__main__":
    sys.exit(main())
