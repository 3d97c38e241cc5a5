"""Benchmark the cost of the limit checks: requests/s with and without them (issue 6).

The same multipart POST /api/v1/audio/transcriptions as bench.transcription (hello.wav, the
fast fake provider in a process of its own, the lean keep-alive client), through Envoy, at
one concurrency (16), for two models of one catalog on that provider: `bench/fast`
(paid, 0.0001 USD/s) and its variant `bench/fast:free` (price 0), against two gateways
running side by side, each on a fresh database of its own, measured one right after the
other for each model, in rounds (3 by default) whose order alternates (without limits first,
then with limits first, ...); the cost is the median of the rounds' own costs:

- limits enforced: `gateway up`, the server as shipped (server/limits/admission.py,
  EnforcedLimits): the free-model gate (per-minute and daily counters) for `:free`, then a
  credit hold against the account balance and the key's cap for both;
- limits off: `python -m bench.unlimited up`, the same stack whose servers admit with
  NoLimits (no gate, no hold, no database access at admission; settlement still records the
  charge). It lives in bench/: no operator switch of the gateway turns limits off.

The free-model limits are per account (20 requests per UTC minute, 1000 per UTC day with 9
purchased credits). So that the `:free` case measures admitted requests, not cheap 429s,
each database gets enough accounts that none sees more than 20 `:free` requests in all the
rounds, whatever minutes they fall in: ceil((warm-up + requests) / floor(20 / rounds)) of
them, and at least one per concurrent request. They are written in one transaction with the
domain functions the operator CLI uses (`gateway workspaces create` + `credits add --amount
10` + `keys create --limit 5` per account would take a process start each): each workspace
has its own account,
10 purchased credits and one key capped at 5 USD, far above what the run spends, so every
hold checks both the balance and the cap and passes. Requests go round-robin over the keys;
one more account serves the preflight checks. Both models use the same keys.

Every response must be HTTP 200; anything else is counted as an error (and req/s counts only
the 200s). Latency percentiles are over the successful requests. After each gateway, the
free requests the per-minute windows counted are read back: the served `:free` requests
with limits, none without (so the seam really was replaced). The issue's target is
reported, met or not, without failing the run: the limit checks cost < 15% of the
throughput (1 - req/s with limits / req/s without, the median over the rounds), for
`:free` and for paid requests.
Only 127.0.0.1 is contacted.

Run from the repository root:

    python -m bench.limits                          # SQLite in temp data dirs
    python -m bench.limits --database-url postgresql --requests 300 --json out.json
    python -m bench.limits --workers 2              # both gateways with 2 server processes

With --database-url the URL names a PostgreSQL server and a database to connect to for
administration (`postgresql` alone means postgresql://postgres@127.0.0.1:5432/test); a fresh
database is created there for each gateway and dropped at the end. The peak RSS (VmHWM) of
each gateway's processes is read before it is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import statistics
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bench.harness.cli import (
    add_gateway_arguments,
    add_json_argument,
    add_load_arguments,
    positive_int,
)
from bench.harness.load import (
    CaseResult,
    LeanHttpClient,
    bearer,
    lean_call,
    loopback_client,
    measure,
)
from bench.harness.processes import (
    GatewayRun,
    PeakRss,
    PgServer,
    RunDatabase,
    begin,
    run_database,
    running_gateway,
    scratch,
)
from bench.harness.report import (
    TargetCheck,
    fmt,
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
from bench.harness.stt import (
    AUDIO_NAME,
    BENCH_MODEL,
    PRICE_PER_SECOND,
    ROUTE,
    TRANSCRIPT,
    multipart_upload,
    running_fake_provider,
    write_catalog,
)
from server.accounts import keys as key_store
from server.accounts import workspaces
from server.billing.ledger import add_credits
from server.billing.money import usd_to_micros
from server.clock import SystemClock
from server.db.engine import create_engine, session_factory
from server.db.migrate import upgrade
from server.db.models import RateWindow
from server.limits.free_models import FREE_SUFFIX, REQUESTS_PER_MINUTE
from testkit.audio import fixture
from testkit.catalog import FAKE_KEY_ENV
from testkit.processes import GatewayProcess

PAID_MODEL = BENCH_MODEL
FREE_MODEL = BENCH_MODEL + FREE_SUFFIX
MODELS = {FREE_MODEL: "`:free`", PAID_MODEL: "paid"}  # model id -> label in the report
CREDITS_USD = "10"  # per account: >= 9 purchased credits, the 1000-a-day free tier
KEY_CAP_USD = "5"  # per key: a cap every hold checks, far above what the run spends

# The target: reported, never a failure.
TARGET_COST = 0.15  # of the throughput without limit checks
TARGET_CONCURRENCY = 16


@dataclass(frozen=True)
class Variant:
    name: str  # "enforced" | "none", in the report and the JSON
    title: str
    command: tuple[str, ...]  # what GatewayProcess runs instead of `gateway up`


ENFORCED = Variant("enforced", "limits enforced (`gateway up`)", ("-m", "server.cli", "up"))
NO_LIMITS = Variant(
    "none", "limits off (`python -m bench.unlimited up`)", ("-m", "bench.unlimited", "up")
)
# Measured in this order for each model: a drift in the machine's state then falls on the
# enforced side, which errs towards a higher measured cost.
VARIANTS = (NO_LIMITS, ENFORCED)


# --- accounts -------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchKeys:
    preflight: str  # the preflight checks' own account
    load: list[str]  # the measured requests go round-robin over these


def accounts_needed(requests: int, warmup: int, concurrency: int, rounds: int) -> int:
    """Load accounts: none gets more `:free` requests in all the rounds (warm-ups included)
    than the per-minute limit allows, and concurrent requests rarely share one. Each round
    starts again at the first key, so each may give a key its share rounded up."""
    per_round = REQUESTS_PER_MINUTE // rounds
    return max(concurrency, math.ceil((warmup + requests) / per_round))


async def create_accounts(database_url: str, count: int) -> BenchKeys:
    """`count` + 1 workspaces, each with its own account, CREDITS_USD purchased and one key
    capped at KEY_CAP_USD, in one transaction."""
    await upgrade(database_url)
    engine = create_engine(database_url)
    keys: list[str] = []
    try:
        async with session_factory(engine)() as session:
            now = SystemClock().now()
            for index in range(count + 1):
                workspace = await workspaces.create_workspace(session, f"bench-{index:04d}", now)
                await add_credits(
                    session,
                    workspace.account_id,
                    usd_to_micros(CREDITS_USD),
                    now,
                    reference="bench.limits",
                )
                _, plaintext = await key_store.create_key(
                    session,
                    workspace=workspace,
                    name="bench",
                    now=now,
                    limit=key_store.KeyLimit(usd_to_micros(KEY_CAP_USD), None),
                )
                keys.append(plaintext)
            await session.commit()
    finally:
        await engine.dispose()
    return BenchKeys(preflight=keys[0], load=keys[1:])


async def counted_free_requests(database_url: str) -> int:
    """What the per-minute windows of the free-model limit counted, over all accounts."""
    windows = RateWindow.__table__
    engine = create_engine(database_url)
    try:
        async with engine.connect() as connection:
            total = await connection.scalar(
                sa.select(sa.func.coalesce(sa.func.sum(windows.c.count), 0)).where(
                    windows.c.period == "minute"
                )
            )
    finally:
        await engine.dispose()
    return int(total or 0)


# --- one gateway ----------------------------------------------------------------------------


@dataclass
class LimitsCase:
    model: str
    limits: str  # Variant.name
    round: int
    result: CaseResult

    @property
    def served_per_second(self) -> float:
        """200s per second: errors do not count as served."""
        r = self.result
        return round((r.requests - r.errors) / r.seconds, 1) if r.seconds > 0 else 0.0


@dataclass(frozen=True)
class LimitsSummary:
    """One model and variant over all rounds: medians of the rounds, errors summed."""

    model: str
    limits: str
    rounds: list[LimitsCase]

    @property
    def served_per_second(self) -> float:
        return statistics.median(c.served_per_second for c in self.rounds)

    @property
    def concurrency(self) -> int:
        return self.rounds[0].result.concurrency

    @property
    def requests(self) -> int:
        return sum(c.result.requests for c in self.rounds)

    @property
    def errors(self) -> int:
        return sum(c.result.errors for c in self.rounds)

    @property
    def hit_time_cap(self) -> bool:
        return any(c.result.hit_time_cap for c in self.rounds)

    def median_ms(self, name: str) -> float | None:
        values = [getattr(c.result, name) for c in self.rounds]
        present = [v for v in values if v is not None]
        return round(statistics.median(present), 2) if present else None

    def as_json(self) -> dict[str, Any]:
        error_kinds: Counter[str] = Counter()
        for case in self.rounds:
            error_kinds.update(case.result.error_kinds)
        return {
            "model": self.model,
            "limits": self.limits,
            "path": self.rounds[0].result.path,
            "concurrency": self.concurrency,
            "target_requests": sum(c.result.target_requests for c in self.rounds),
            "requests": self.requests,
            "error_kinds": dict(error_kinds),
            "errors": self.errors,
            "served_per_second": self.served_per_second,
            "p50_ms": self.median_ms("p50_ms"),
            "p99_ms": self.median_ms("p99_ms"),
            "hit_time_cap": self.hit_time_cap,
            "rounds": [
                {"round": c.round, "served_per_second": c.served_per_second, **asdict(c.result)}
                for c in self.rounds
            ],
        }


async def preflight(base_url: str, key: str, model: str) -> None:
    """One request through httpx, checked, so a broken setup fails loudly instead of as 100%
    errors; a paid request must have been billed."""
    upload = multipart_upload(model, fixture(AUDIO_NAME))
    async with loopback_client(base_url, bearer(key, upload.content_type)) as client:
        response = await client.post(ROUTE, content=upload.content)
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.status_code != 200 or not isinstance(body, dict):
        raise RuntimeError(f"{model} preflight failed: {response.status_code} {response.text}")
    usage = body.get("usage")
    billed = isinstance(usage, dict) and bool(usage.get("cost"))
    if body.get("text") != TRANSCRIPT or (model == PAID_MODEL and not billed):
        raise RuntimeError(f"{model} preflight: unexpected answer {response.text}")


@dataclass
class GatewayUnderTest:
    """One gateway of the comparison, running on a fresh database of its own."""

    variant: Variant
    gateway: GatewayProcess
    database: RunDatabase
    keys: BenchKeys
    run: GatewayRun  # its peak RSS once stopped


@contextlib.contextmanager
def gateway_under_test(
    variant: Variant,
    pg: PgServer | None,
    data_dir: Path,
    catalog: Path,
    fake_key: str,
    args: argparse.Namespace,
) -> Iterator[GatewayUnderTest]:
    with run_database(pg, data_dir) as database:
        count = accounts_needed(args.requests, args.warmup, args.concurrency, args.rounds)
        keys = asyncio.run(create_accounts(database.url, count))
        with running_gateway(
            data_dir,
            database,
            args.workers,
            {"GATEWAY_CATALOG": str(catalog), FAKE_KEY_ENV: fake_key},
            command=variant.command,
            name=f"the gateway, {variant.title}",
        ) as run:
            yield GatewayUnderTest(variant, run.gateway, database, keys, run)


async def run_cases(
    gateways: Sequence[GatewayUnderTest], args: argparse.Namespace
) -> list[LimitsCase]:
    for under_test in gateways:
        for model in MODELS:
            await preflight(under_test.gateway.base_url, under_test.keys.preflight, model)
    audio = fixture(AUDIO_NAME)
    cases: list[LimitsCase] = []
    for model, label in MODELS.items():
        upload = multipart_upload(model, audio)
        for round_index in range(args.rounds):
            # The gateways right after one another, in turn first (A B B A ...): a drift in
            # the machine's other load falls on both sides of the comparison alike.
            order = gateways if round_index % 2 == 0 else list(reversed(gateways))
            for under_test in order:
                async with LeanHttpClient(
                    under_test.gateway.base_url + ROUTE,
                    under_test.keys.load,
                    upload.content_type,
                    upload.content,
                ) as client:
                    result = await measure(
                        f"{label} model, limits {under_test.variant.name}",
                        lean_call(client),
                        args.concurrency,
                        args.requests,
                        args.warmup,
                        args.time_cap,
                    )
                cases.append(LimitsCase(model, under_test.variant.name, round_index, result))
                progress(
                    f"  done: {result.path} (round {round_index + 1}/{args.rounds}): "
                    f"{result.requests_per_second} req/s, p50 {result.p50_ms} ms"
                )
    return cases


@dataclass
class VariantRun:
    variant: Variant
    cases: list[LimitsCase]
    counted_free: int  # free requests the per-minute windows counted
    peak_rss: PeakRss | None


# --- report ---------------------------------------------------------------------------------


def _case(runs: Sequence[VariantRun], model: str, limits: str) -> LimitsSummary | None:
    rounds = [c for run in runs for c in run.cases if c.model == model and c.limits == limits]
    return LimitsSummary(model, limits, rounds) if rounds else None


def throughput_cost(runs: Sequence[VariantRun], model: str) -> float | None:
    """The median over the rounds of 1 - served req/s with limits / served req/s without,
    each round's two measurements taken right after one another (a paired comparison: a
    drift in the machine's speed between rounds cancels out)."""
    enforced = _case(runs, model, ENFORCED.name)
    none = _case(runs, model, NO_LIMITS.name)
    if enforced is None or none is None:
        return None
    without = {c.round: c.served_per_second for c in none.rounds}
    costs = [
        1 - c.served_per_second / without[c.round]
        for c in enforced.rounds
        if without.get(c.round, 0) > 0
    ]
    return round(statistics.median(costs), 4) if costs else None


def target_checks(runs: Sequence[VariantRun], concurrency: int) -> list[TargetCheck]:
    checks = []
    for model, label in MODELS.items():
        cost = throughput_cost(runs, model)
        errors = any(c.result.errors for run in runs for c in run.cases if c.model == model)
        measured = cost is not None and concurrency == TARGET_CONCURRENCY
        checks.append(
            TargetCheck(
                f"limit checks cost < {TARGET_COST:.0%} of the throughput, {label} requests, "
                f"concurrency {TARGET_CONCURRENCY}",
                None if cost is None or not measured else round(cost * 100, 2),
                None if cost is None or not measured else cost < TARGET_COST and not errors,
            )
        )
    return checks


def limits_table(runs: Sequence[VariantRun]) -> str:
    rows = []
    for model, label in MODELS.items():
        for variant in (ENFORCED, NO_LIMITS):
            case = _case(runs, model, variant.name)
            if case is not None:
                rows.append(
                    [
                        label,
                        variant.name,
                        case.concurrency,
                        requests_cell(case.requests, case.hit_time_cap),
                        f"{case.served_per_second:.1f}",
                        " / ".join(f"{c.served_per_second:.1f}" for c in case.rounds),
                        fmt(case.median_ms("p50_ms")),
                        fmt(case.median_ms("p99_ms")),
                        case.errors,
                    ]
                )
    columns = ["model", "limits", "concurrency", "requests", "req/s (median)", "req/s by round"]
    return markdown_table([*columns, "p50 ms", "p99 ms", "errors"], rows, text=(0, 1, 5))


def report(
    runs: Sequence[VariantRun], machine: dict[str, Any], args: argparse.Namespace, accounts: int
) -> str:
    lines = [
        limits_table(runs),
        "",
        "Cost of the limit checks (median over the rounds of 1 - req/s with / without, "
        f"{args.rounds} rounds):",
    ]
    for model, label in MODELS.items():
        cost = throughput_cost(runs, model)
        enforced = _case(runs, model, ENFORCED.name)
        none = _case(runs, model, NO_LIMITS.name)
        p50 = "-"
        with_p50 = enforced.median_ms("p50_ms") if enforced else None
        without_p50 = none.median_ms("p50_ms") if none else None
        if with_p50 is not None and without_p50 is not None:
            p50 = f"{with_p50 - without_p50:+.2f} ms"
        lines.append(
            f"- {label}: {'-' if cost is None else f'{cost:.1%}'} of the throughput, p50 {p50}"
        )
    lines += ["", "Target of the issue (reported, not enforced):"]
    lines += [check.line("%") for check in target_checks(runs, args.concurrency)]
    lines += [
        "",
        machine_line(
            {**machine, "database": f"{machine['database']} (one per gateway)"},
            "load generator: lean",
        ),
        f"Gateways: {args.workers} server process(es) behind one Envoy each; {accounts} load "
        f"accounts (+1 for the preflight), {CREDITS_USD} credits and a {KEY_CAP_USD} USD key "
        "cap each, requests round-robin over their keys",
    ]
    for run in runs:
        lines.append(
            f"{run.variant.title}: the free-model windows counted {run.counted_free} requests"
            + (" - LIMITS WERE CHECKED" if run.variant is NO_LIMITS and run.counted_free else "")
        )
        if run.peak_rss is not None:
            lines.append(f"  {run.peak_rss.line()}")
    for run in runs:
        for case in run.cases:
            if case.result.error_kinds:
                lines.append(f"Errors in {case.result.path}: {kinds(case.result.error_kinds)}")
    return "\n".join(lines)


# --- main -----------------------------------------------------------------------------------


def rounds_count(text: str) -> int:
    """1..20: every account must keep room for a request in each round's minute."""
    value = positive_int(text)
    if value > REQUESTS_PER_MINUTE:
        raise argparse.ArgumentTypeError(f"at most {REQUESTS_PER_MINUTE} rounds")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.limits",
        description="Benchmark the cost of the limit checks: a `:free` and a paid "
        "transcription request through Envoy, against a gateway with limits and one without.",
    )
    add_gateway_arguments(parser)
    add_load_arguments(parser, requests=1000, warmup=100)
    parser.add_argument(
        "--concurrency", type=positive_int, default=TARGET_CONCURRENCY, help="concurrency (16)"
    )
    parser.add_argument(
        "--rounds",
        type=rounds_count,
        default=3,
        help="measurements of each gateway per model, taken in turn; medians are compared (3)",
    )
    add_json_argument(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    pg = begin("limits", args.database_url)
    with (
        scratch("bench-limits-") as tmp,
        running_fake_provider() as fake,
        contextlib.ExitStack() as started,
    ):
        catalog = write_catalog(
            tmp / "catalog.toml",
            fake.base_url,
            {PAID_MODEL: PRICE_PER_SECOND, FREE_MODEL: "0"},
        )
        gateways = [
            started.enter_context(
                gateway_under_test(variant, pg, tmp / variant.name, catalog, fake.api_key, args)
            )
            for variant in VARIANTS
        ]
        cases = asyncio.run(run_cases(gateways, args))
        counted = [asyncio.run(counted_free_requests(g.database.url)) for g in gateways]
    runs = [
        VariantRun(
            g.variant, [c for c in cases if c.limits == g.variant.name], free, g.run.peak_rss
        )
        for g, free in zip(gateways, counted, strict=True)
    ]
    database = gateways[0].database.label

    accounts = accounts_needed(args.requests, args.warmup, args.concurrency, args.rounds)
    machine = machine_info(database)
    print(report(runs, machine, args, accounts))
    write_json(
        args.json,
        "limits",
        load_settings(
            args,
            rounds=args.rounds,
            workers=args.workers,
            client="lean",
            models=dict(MODELS),
            audio=f"testkit/fixtures/{AUDIO_NAME}.wav",
            load_accounts=accounts,
            credits_usd_per_account=CREDITS_USD,
            key_cap_usd=KEY_CAP_USD,
        ),
        machine,
        {run.variant.name: rss_json(run.peak_rss) for run in runs},
        counted_free_requests={run.variant.name: run.counted_free for run in runs},
        results=[
            summary.as_json()
            for model in MODELS
            for variant in VARIANTS
            if (summary := _case(runs, model, variant.name)) is not None
        ],
        throughput_cost={model: throughput_cost(runs, model) for model in MODELS},
        targets=[asdict(check) for check in target_checks(runs, args.concurrency)],
    )
    return 1 if any(case.result.errors for run in runs for case in run.cases) else 0


if __name__ == "__main__":
    sys.exit(main())
