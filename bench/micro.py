"""Micro-benchmarks behind the figures of docs/performance.md, "Figures behind the code's
choices": each measures, in this process (or in short-lived child interpreters), one thing a
choice in server/ was made on, against the code as it is now; where the choice rejected an
alternative, that alternative is written out here and measured beside it. Nothing talks to
the network: SQLite files in a temporary folder, child interpreters, and no server.

    python -m bench.micro NAME [--json FILE]    # one measurement (NAME: see --help)
    python -m bench.micro all                   # every one, in turn (about two minutes)

CPU figures are this process's CPU clock (time.process_time: every thread of it, aiosqlite's
included) per call, the median of several rounds; wall figures are time.perf_counter. Each
measurement takes a few seconds on a 2-core VM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import http.cookiejar
import importlib
import io
import json
import os
import re
import secrets
import sqlite3
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from fractions import Fraction
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql.asyncpg import PGDialect_asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlmodel.ext.asyncio.session import AsyncSession

import server.db.writer as writer_module
from bench.harness.cli import add_json_argument
from bench.harness.processes import PgServer
from bench.request_steps import transcription_rig
from server.billing.holds import _settlement
from server.billing.ledger import CHARGE, COUNTERS, INSERT_ENTRY
from server.compute import ComputePool
from server.db import migrate
from server.db.driver import (
    HotReads,
    _compile,
    _for_dialect,
    _inline,
    _processor,
    fetch_rows,
    read_rows,
)
from server.db.engine import SQLITE_PRAGMAS, create_engine, session_factory
from server.db.models import Generation, LedgerEntry, UtcDateTime, WebhookDelivery
from server.limits.key_status import _STATUS, _params_of
from server.observability.generations import GENERATIONS, store_generation_row
from server.observability.logs import _ANY_SECRET, _SECRETS, JsonFormatter, may_hold_secret, redact
from server.providers.http import _RefuseCookies, multipart_form, parsed_url, provider_client
from server.providers.local_video import render_mp4
from server.providers.openai_stt import MIME, form_fields
from server.providers.stt import SttCall
from server.transcription.request import from_http_in_worker, from_json
from server.transcription.session import LazySession
from server.transcription.transcriber import _end_reads
from server.vault.crypto import MasterKey
from server.workers.webhook_dispatcher import WORKSPACE_CONCURRENCY, WebhookDispatcher
from server.workers.webhook_dispatcher import _claimer as webhook_dispatcher_claimer

REPO_ROOT = Path(__file__).resolve().parent.parent
PROVIDER_URL = "https://api.openai.com/v1/audio/transcriptions"
AUDIO = bytes(range(256)) * 128  # 32 KiB, as the transcription benchmarks upload

# One row of the output: what was measured, its figure and unit.
Row = tuple[str, float, str]


# --- timing -----------------------------------------------------------------------------------


def cpu_us(fn: Callable[[], object], calls: int, rounds: int = 5) -> float:
    """CPU microseconds per call of `fn`: the median of `rounds` rounds of `calls` calls."""
    for _ in range(min(calls, 200)):
        fn()
    per_round = []
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(calls):
            fn()
        per_round.append((time.process_time() - started) / calls * 1e6)
    return statistics.median(per_round)


async def interleaved(
    variants: Mapping[str, Callable[[], Awaitable[object]]], calls: int, rounds: int = 7
) -> dict[str, tuple[float, float]]:
    """CPU and wall microseconds per awaited call of each variant: medians of `rounds`
    rounds of `calls` calls, the variants taking turns in each round (so that the noise of a
    shared machine falls on all of them)."""
    for fn in variants.values():
        for _ in range(min(calls, 100)):
            await fn()
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    wall: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(rounds):
        for name in list(variants) if round_ % 2 == 0 else reversed(list(variants)):
            fn = variants[name]
            started_cpu, started_wall = time.process_time(), time.perf_counter()
            for _ in range(calls):
                await fn()
            cpu[name].append((time.process_time() - started_cpu) / calls * 1e6)
            wall[name].append((time.perf_counter() - started_wall) / calls * 1e6)
    return {
        name: (statistics.median(cpu[name]), statistics.median(wall[name])) for name in variants
    }


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@contextlib.contextmanager
def folder(prefix: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix=f"micro-{prefix}-") as path:
        yield Path(path)


@contextlib.asynccontextmanager
async def rig(*, inline_sqlite: bool = True) -> Any:
    """bench.request_steps' Rig (a migrated SQLite file, one funded key, the transcriber),
    closed after."""
    built = await transcription_rig(inline_sqlite=inline_sqlite)
    try:
        yield built
    finally:
        await built.close()


# --- the provider client (server/providers/http.py) -------------------------------------------


def provider_call_pieces() -> list[Row]:
    """The CPU of each piece of an OpenAI-style provider call that a bare socket does not
    pay (bench.provider_call: the whole call), in-process: the multipart form, the request
    built by the client and by httpx.Request directly, the transport's head and its checks,
    the answer's Response read whole, the JSON answer parsed into a Transcript."""
    from server.providers.openai_stt import parse
    from server.providers.transport import _head

    client = provider_client(ssl.create_default_context())
    call = SttCall(audio=AUDIO, format="wav", filename="audio.wav", model="whisper-1")
    content_type, body = multipart_form(
        form_fields(call), "file", call.filename, call.audio, MIME["wav"]
    )
    url = parsed_url(PROVIDER_URL)
    headers = {"Authorization": "Bearer sk-provider", "Content-Type": content_type}
    request = client.build_request("POST", url, content=body, headers=headers, timeout=120.0)
    answer = json.dumps({"text": "hello world, a transcript of a few words"}).encode()
    answer_headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(answer)).encode()),
        (b"date", b"Sat, 28 Nov 2026 08:00:00 GMT"),
    ]
    loop = asyncio.new_event_loop()

    async def read_answer() -> httpx.Response:
        response = httpx.Response(
            200, headers=answer_headers, stream=httpx.ByteStream(answer), request=request
        )
        await response.aread()
        return response

    response = loop.run_until_complete(read_answer())
    try:
        return [
            (
                "multipart_form (3 fields, 32 KiB)",
                cpu_us(
                    lambda: multipart_form(
                        form_fields(call), "file", call.filename, call.audio, MIME["wav"]
                    ),
                    20_000,
                ),
                "us",
            ),
            (
                "the client's build_request",
                cpu_us(
                    lambda: client.build_request(
                        "POST", url, content=body, headers=headers, timeout=120.0
                    ),
                    20_000,
                ),
                "us",
            ),
            (
                "httpx.Request directly (not used: the client's defaults would be copied)",
                cpu_us(lambda: httpx.Request("POST", url, content=body, headers=headers), 20_000),
                "us",
            ),
            (
                "the transport's head and its checks (_head)",
                cpu_us(lambda: _head(request), 20_000),
                "us",
            ),
            (
                "the answer's Response, read whole (a loop turn included)",
                cpu_us(lambda: loop.run_until_complete(read_answer()), 5_000)
                - cpu_us(lambda: loop.run_until_complete(asyncio.sleep(0)), 5_000),
                "us",
            ),
            ("the JSON answer parsed", cpu_us(lambda: parse(response.json(), False), 20_000), "us"),
        ]
    finally:
        loop.close()


def upload_parts() -> list[Row]:
    """The parts of a transcription's 32 KiB multipart upload, in-process: python-multipart
    (what the gateway uses: multipart_parts), and, when installed, the `multipart` package
    (defnull's push parser) and werkzeug's sans-io decoder, for comparison."""
    from server.transcription.request import multipart_parts

    content_type, body = multipart_form(
        [("model", "openai/whisper-1"), ("response_format", "json")],
        "file",
        "audio.wav",
        AUDIO,
        MIME["wav"],
    )
    boundary = content_type.split("boundary=")[1]
    rows: list[Row] = [
        (
            "python-multipart (multipart_parts)",
            cpu_us(lambda: multipart_parts(body, boundary.encode()), 20_000),
            "us",
        )
    ]
    try:
        multipart: Any = importlib.import_module("multipart")  # optional: not a dependency
    except ImportError:
        rows.append(("multipart (defnull): not installed", float("nan"), "us"))
    else:

        def defnull() -> list[bytes]:
            parser = multipart.PushMultipartParser(boundary)
            parts: list[bytes] = []
            data: list[bytes] = []
            for event in parser.parse(body):
                if event is None:
                    parts.append(b"".join(data))
                    data = []
                elif isinstance(event, bytes | bytearray):
                    data.append(bytes(event))
            parser.close()
            return parts

        rows.append(("multipart (defnull) PushMultipartParser", cpu_us(defnull, 20_000), "us"))
    return rows


def url_parse() -> list[Row]:
    """Provider URLs kept parsed (`parsed_url`): httpx parses a str URL on every
    build_request; an httpx.URL it takes as it is."""
    client = provider_client(ssl.create_default_context())
    headers = {"Authorization": "Bearer sk-provider", "Content-Type": "audio/wav"}
    rows: list[Row] = [
        (
            "httpx.URL(str): parsing a provider URL",
            cpu_us(lambda: httpx.URL(PROVIDER_URL), 20_000),
            "us",
        ),
        ("parsed_url(str): the kept one", cpu_us(lambda: parsed_url(PROVIDER_URL), 20_000), "us"),
        (
            "build_request with the str URL",
            cpu_us(
                lambda: client.build_request("POST", PROVIDER_URL, content=AUDIO, headers=headers),
                10_000,
            ),
            "us",
        ),
        (
            "build_request with the kept httpx.URL (now)",
            cpu_us(
                lambda: client.build_request(
                    "POST", parsed_url(PROVIDER_URL), content=AUDIO, headers=headers
                ),
                10_000,
            ),
            "us",
        ),
    ]
    asyncio.run(client.aclose())
    return rows


def cookie_jar() -> list[Row]:
    """What the client does with each response's cookies: httpx's Cookies over a jar that
    refuses every cookie by policy (the client before issue 17) against the client's own
    `_NoCookies`, which does not look at the response."""
    request = httpx.Request("POST", PROVIDER_URL, content=AUDIO)
    response = httpx.Response(
        200,
        headers={"content-type": "application/json", "content-length": "52"},
        content=b'{"text":"hello world, a transcript of a few words."}',
        request=request,
    )
    refusing = httpx.Cookies(http.cookiejar.CookieJar(policy=_RefuseCookies()))
    client = provider_client(ssl.create_default_context())
    rows: list[Row] = [
        (
            "httpx's Cookies, a refusing jar: extract_cookies (before)",
            cpu_us(lambda: refusing.extract_cookies(response), 20_000),
            "us",
        ),
        (
            "the provider client's cookies: extract_cookies (now)",
            cpu_us(lambda: client.cookies.extract_cookies(response), 20_000),
            "us",
        ),
    ]
    asyncio.run(client.aclose())
    return rows


def multipart() -> list[Row]:
    """A transcription's upload built as one piece (`multipart_form`, then build_request with
    the bytes: transcribe_form) against httpx's multipart encoder (data= and files=, read)."""
    client = provider_client(ssl.create_default_context())
    call = SttCall(audio=AUDIO, format="wav", filename="audio.wav", model="whisper-1")
    headers = {"Authorization": "Bearer sk-provider"}

    def ours() -> httpx.Request:
        content_type, body = multipart_form(
            form_fields(call), "file", call.filename, call.audio, MIME["wav"]
        )
        return client.build_request(
            "POST",
            parsed_url(PROVIDER_URL),
            content=body,
            headers={**headers, "Content-Type": content_type},
        )

    def httpx_encoder() -> httpx.Request:
        form: dict[str, str | list[str]] = {}
        for name, value in form_fields(call):
            known = form.get(name)
            form[name] = (
                value if known is None else [*([known] if isinstance(known, str) else known), value]
            )
        request = client.build_request(
            "POST",
            parsed_url(PROVIDER_URL),
            data=form,
            files={"file": (call.filename, call.audio, MIME["wav"])},
            headers=headers,
        )
        request.read()
        return request

    rows: list[Row] = [
        (
            "httpx's multipart encoder, request built and read (before)",
            cpu_us(httpx_encoder, 5_000),
            "us",
        ),
        ("multipart_form + build_request (now)", cpu_us(ours, 5_000), "us"),
    ]
    asyncio.run(client.aclose())
    return rows


# --- logs (server/observability/logs.py) ------------------------------------------------------


def _joined_patterns() -> re.Pattern[str]:
    """The secret patterns joined into one regex (the alternative to a scan of literals)."""
    sources = []
    for pattern, _ in _SECRETS:
        source = pattern.pattern
        if source.startswith("(?i)"):
            source = f"(?i:{source[4:]})"
        sources.append(f"(?:{source})")
    return re.compile("|".join(sources))


def redaction() -> list[Row]:
    """The redaction shortcut on an access line (what nearly every line is): whether it may
    hold a secret, by a search of literals (now), by one regex of where the patterns start,
    and by the patterns joined into one regex."""
    line = JsonFormatter().access_line(
        "gateway.access",
        time.time(),
        "/api/v1/audio/transcriptions",
        200,
        3.2,
        secrets.token_hex(16),
    )
    joined = _joined_patterns()
    return [
        (
            "may_hold_secret: ASCII literal search (now)",
            cpu_us(lambda: may_hold_secret(line), 50_000),
            "us",
        ),
        (
            "one regex of the patterns' starts (_ANY_SECRET)",
            cpu_us(lambda: _ANY_SECRET.search(line), 50_000),
            "us",
        ),
        ("the patterns joined into one regex", cpu_us(lambda: joined.search(line), 50_000), "us"),
        ("redact(line), whole (now)", cpu_us(lambda: redact(line), 50_000), "us"),
        (f"(the line: {len(line)} characters)", float(len(line)), "chars"),
    ]


# --- statements (server/db/driver.py) ---------------------------------------------------------


def date_binds() -> list[Row]:
    """One date or UTC datetime bound to a SQLite statement: the dialect's own conversion
    (%-formatting) against the driver's isoformat one (`_processor`)."""
    with folder("dates") as path:
        engine = create_engine(f"sqlite+aiosqlite:///{path / 'g.db'}")
        dialect = engine.sync_engine.dialect
        when = datetime.now(UTC)
        today = date.today()
        rows: list[Row] = []
        for label, type_, value in (
            ("UTC datetime", UtcDateTime(), when),
            ("date", sa.Date(), today),
        ):
            own = type_.dialect_impl(dialect).bind_processor(dialect)
            fast = _processor(type_, dialect)
            assert own is not None and fast is not None and own(value) == fast(value)
            for variant, convert in (("the dialect's conversion", own), ("isoformat (now)", fast)):
                rows.append(
                    (f"{label}: {variant}", cpu_us(functools.partial(convert, value), 50_000), "us")
                )
        asyncio.run(engine.dispose())
    return rows


def compile_once() -> list[Row]:
    """Statements SQLAlchemy's cache cannot hold (no cache key: a multi-row VALUES), on
    PostgreSQL: the counters' upsert (billing/ledger.py COUNTERS) and a leased settlement's
    one statement (billing/holds.py, the counters' upsert with the lease's change, the
    ledger row and the generation record as CTEs). Compiled as a session's execution
    compiles them, on every call, against the driver's compiled-once memo (`_compile`)."""
    dialect = PGDialect_asyncpg()  # type: ignore[no-untyped-call]
    rows: list[Row] = []
    statements: tuple[tuple[str, sa.Insert], ...] = (
        ("the counters' upsert", COUNTERS["postgresql"]),
        ("a leased settlement's statement", _settlement("lease", GENERATIONS)),
    )
    for label, statement in statements:
        assert statement._generate_cache_key() is None  # SQLAlchemy does not cache it
        _compile(statement, dialect)
        compile_ = functools.partial(statement.compile, dialect=dialect)
        rows.append((f"{label}: compiled on every call", cpu_us(compile_, 50) / 1000, "ms"))
        memo = functools.partial(_compile, statement, dialect)
        rows.append(
            (f"{label}: compiled once (now), the memo's lookup", cpu_us(memo, 50_000), "us")
        )
    return rows


async def _sqlite_reads() -> list[Row]:
    async with rig() as built:
        engine = built.engine
        account_id = built.issued.workspace.account_id
        params = _params_of(built.issued.hash, account_id, datetime.now(UTC))
        compiled = _compile(_for_dialect(_STATUS, "sqlite"), engine.sync_engine.dialect)
        arguments = compiled.arguments(params)
        reads = HotReads(engine)
        path = str(built.folder / "gateway.db")
        inline = sqlite3.connect(path, isolation_level=None)
        import aiosqlite

        async with aiosqlite.connect(path) as handed_off:

            async def on_the_loop() -> object:
                return inline.execute(compiled.sql, arguments).fetchall()

            async def through_aiosqlite() -> object:
                return await handed_off.execute_fetchall(compiled.sql, arguments)

            measured = await interleaved(
                {
                    "GET /key's statement on a sqlite3 connection on the loop": on_the_loop,
                    "the same through aiosqlite's thread (execute_fetchall)": through_aiosqlite,
                    "HotReads.rows (now: GET /key)": lambda: reads.rows(_STATUS, params),
                    "read_rows: the engine's pooled aiosqlite connection": lambda: read_rows(
                        engine, _STATUS, params
                    ),
                },
                500,
            )
            rows: list[Row] = []
            for label, (cpu, wall) in measured.items():
                rows += [(f"{label}: CPU", cpu, "us"), (f"{label}: wall", wall, "us")]
        inline.close()
        reads.close()
        return rows


def sqlite_reads() -> list[Row]:
    """One statement on SQLite run on the event loop's thread against the same handed to
    aiosqlite's thread and back: GET /key's status read (HotReads), on the Rig's database."""
    return asyncio.run(_sqlite_reads())


# --- the group-commit writer (server/db/writer.py, InlineSqlite) ------------------------------


async def _commit_in_a_thread(session: AsyncSession) -> None:
    """commit_batch with the inline COMMIT handed to a thread (the alternative rejected)."""
    inline = _inline(session)
    assert inline is not None
    await asyncio.to_thread(inline.commit)


async def _nested_savepoint(session: AsyncSession, index: int) -> None:
    """next_unit as savepoints nested under each other, never released before the COMMIT
    (the alternative rejected)."""
    inline = _inline(session)
    assert inline is not None
    inline.execute(f"SAVEPOINT u{index}")


@contextlib.contextmanager
def patched(name: str, replacement: object) -> Iterator[None]:
    original = getattr(writer_module, name)
    setattr(writer_module, name, replacement)
    try:
        yield
    finally:
        setattr(writer_module, name, original)


async def _settlements_cpu(
    settle: Callable[[], Awaitable[None]], count: int, at_once: int
) -> float:
    """CPU microseconds per settlement, `at_once` awaited together (one batch each)."""
    started = time.process_time()
    for _ in range(count // at_once):
        await asyncio.gather(*(settle() for _ in range(at_once)))
    return (time.process_time() - started) / (count // at_once * at_once) * 1e6


async def _settlements(rounds: int, count: int) -> list[Row]:
    async with rig() as inline_rig, rig(inline_sqlite=False) as pool_rig:
        inline_settle = await inline_rig.settlement()
        pool_settle = await pool_rig.settlement()
        assert inline_rig.writer.inline is not None
        connection = inline_rig.writer.inline.connection
        lone: dict[str, list[float]] = {"inline": [], "thread": [], "aiosqlite": []}
        batched: dict[str, list[float]] = {"now": [], "nested": []}
        sizes: dict[str, list[float]] = {"now": [], "nested": []}
        for settle in (inline_settle, pool_settle):  # warm
            await _settlements_cpu(settle, 200, 1)
        for _ in range(rounds):
            lone["inline"].append(await _settlements_cpu(inline_settle, count, 1))
            with patched("commit_batch", _commit_in_a_thread):
                lone["thread"].append(await _settlements_cpu(inline_settle, count, 1))
            lone["aiosqlite"].append(await _settlements_cpu(pool_settle, count, 1))
            for variant in ("now", "nested"):
                stats = inline_rig.writer.stats
                units, batches = stats.units, stats.batches
                if variant == "nested":
                    connection.execute("PRAGMA temp_store=DEFAULT")
                    with patched("next_unit", _nested_savepoint):
                        batched[variant].append(await _settlements_cpu(inline_settle, count, 8))
                    connection.execute("PRAGMA temp_store=MEMORY")
                else:
                    batched[variant].append(await _settlements_cpu(inline_settle, count, 8))
                sizes[variant].append(
                    round((stats.units - units) / max(1, stats.batches - batches))
                )
        median = statistics.median
        return [
            ("a lone settlement, COMMIT inline (now)", median(lone["inline"]), "us"),
            ("a lone settlement, COMMIT in a thread", median(lone["thread"]), "us"),
            (
                "a lone settlement, the writer on aiosqlite's thread",
                median(lone["aiosqlite"]),
                "us",
            ),
            (
                "8 at once, one savepoint at a time, sub-journal in memory (now)",
                median(batched["now"]),
                "us",
            ),
            (
                "8 at once, nested savepoints, sub-journal in a temporary file",
                median(batched["nested"]),
                "us",
            ),
            (
                "(units per batch, 8 at once)",
                float(median(sizes["now"] + sizes["nested"])),
                "units",
            ),
        ]


def settlements() -> list[Row]:
    """CPU per settlement (bench.request_steps' "settlement alone": the writer's batch and
    its commit) on SQLite: alone, with the COMMIT inline (now), in a thread, and with the
    writer on aiosqlite's thread (Writer(inline_sqlite=False)); 8 at once (batches of 8),
    with one savepoint at a time and the sub-journal in memory (now) or nested savepoints and
    the sub-journal in a temporary file (SQLite's default). Interleaved rounds."""
    return asyncio.run(_settlements(rounds=5, count=400))


def _checkpoint_racing(path: str, stop: threading.Event) -> None:
    connection = sqlite3.connect(path, isolation_level=None)
    while not stop.is_set():
        connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
    connection.close()


async def _wal_commits(variant: str, count: int) -> list[Row]:
    async with rig() as built:
        settle = await built.settlement()
        inline = built.writer.inline
        assert inline is not None
        await settle()
        durations: list[float] = []
        commit = inline.commit

        def timed_commit() -> None:
            started = time.perf_counter()
            commit()
            durations.append(time.perf_counter() - started)

        inline.commit = timed_commit
        path = str(built.folder / "gateway.db")
        stop = threading.Event()
        racing = threading.Thread(target=_checkpoint_racing, args=(path, stop))
        if variant != "now":  # checkpoints by SQLite inside a commit, or racing the batches
            inline.checkpoint_after_changes = 1 << 62
        if variant == "automatic":
            inline.connection.execute("PRAGMA wal_autocheckpoint=1000")
        elif variant == "racing":
            racing.start()
        try:
            for _ in range(count):
                await settle()
        finally:
            stop.set()
            if racing.is_alive():
                racing.join()
        wal = (built.folder / "gateway.db-wal").stat().st_size / 2**20
        ms = [d * 1000 for d in durations]
        return [
            (f"{variant}: COMMIT p50", quantile(ms, 0.5), "ms"),
            (f"{variant}: COMMIT p99", quantile(ms, 0.99), "ms"),
            (f"{variant}: COMMIT p99.9", quantile(ms, 0.999), "ms"),
            (f"{variant}: COMMIT max", max(ms), "ms"),
            (f"{variant}: WAL file after {count} settlements", wal, "MiB"),
        ]


def wal_commits() -> list[Row]:
    """The writer's inline COMMIT of a lone settlement (WAL, synchronous=NORMAL), 4,000 in a
    row on a new database: with the automatic checkpoint off and PASSIVE ones beside the
    batches, on a connection and a thread of their own, and between two batches only once
    the WAL passed its bound (now: InlineSqlite), with SQLite's automatic checkpoint inside
    the commit
    (wal_autocheckpoint=1000, SQLite's default), and with PASSIVE checkpoints racing the
    batches from another thread; the WAL file's size at the end."""
    rows: list[Row] = []
    for variant in ("now", "automatic", "racing"):
        rows += asyncio.run(_wal_commits(variant, 4_000))
    return rows


def _statement_label(statement: object) -> str:
    if isinstance(statement, dict):  # one statement per dialect (ledger.COUNTERS)
        statement = statement["sqlite"]
    table = getattr(statement, "table", None)
    kind = type(statement).__name__.lower()
    return f"{kind} {table.name}" if isinstance(table, sa.Table) else kind


async def _settlement_statements(count: int) -> list[Row]:
    async with rig() as built:
        settle = await built.settlement()
        inline = built.writer.inline
        assert inline is not None
        for _ in range(200):
            await settle()
        times: dict[str, list[float]] = {}
        run, commit = inline.run, inline.commit

        def timed_run(statement: Any, rows: Any, *, many: bool) -> Any:
            started = time.perf_counter()
            result = run(statement, rows, many=many)
            times.setdefault(_statement_label(statement), []).append(time.perf_counter() - started)
            return result

        def timed_commit() -> None:
            started = time.perf_counter()
            commit()
            times.setdefault("COMMIT", []).append(time.perf_counter() - started)

        inline.run = timed_run
        inline.commit = timed_commit
        for _ in range(count):  # checkpoints between batches as in the server
            await settle()
        inline.run, inline.commit = run, commit
        # The WAL frames a commit appends, with checkpoints off (the WAL only grows: a
        # commit past its end costs more than one into a restarted WAL, hence apart).
        inline.checkpoint_after_changes = 1 << 62
        wal = built.folder / "gateway.db-wal"
        before = wal.stat().st_size
        for _ in range(500):
            await settle()
        frames = (wal.stat().st_size - before) / (4096 + 24) / 500
        rows: list[Row] = [
            (
                f"{label} (x{len(values) / count:.2f} per settlement), median",
                1e6 * statistics.median(values),
                "us",
            )
            for label, values in sorted(times.items(), key=lambda item: -sum(item[1]))
        ]
        rows.append(("WAL frames (4 KiB pages) one settlement's commit appends", frames, "frames"))
        return rows


def settlement_statements() -> list[Row]:
    """A lone settlement on SQLite (bench.request_steps' rig), statement by statement: each
    statement's wall time on the writer's inline connection (its arguments included) and the
    COMMIT's, with checkpoints between batches as in the server; then how many WAL frames a
    settlement's commit appends (checkpoints off for that count)."""
    return asyncio.run(_settlement_statements(2_000))


# --- sessions (server/db/engine.py, server/transcription/session.py) --------------------------


async def _idle_ends() -> list[Row]:
    with folder("idle-ends") as path:
        url = f"sqlite+aiosqlite:///{path / 'g.db'}"
        setup = sqlite3.connect(path / "g.db")
        setup.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
        setup.execute("INSERT INTO t VALUES (1, 'x')")
        setup.commit()
        setup.close()
        (path / "g.db").chmod(0o600)  # as the gateway keeps its database files
        ours = create_engine(url)
        # SQLAlchemy's own aiosqlite dialect, with the same pool as create_engine's
        theirs = create_async_engine(url, pool_size=1, max_overflow=0, pool_reset_on_return=None)
        read = sa.text("SELECT v FROM t WHERE id = 1")

        def read_only_session(engine: AsyncEngine) -> Callable[[], Awaitable[None]]:
            sessions = session_factory(engine)

            async def session() -> None:
                async with sessions() as session:
                    await session.scalar(read)

            return session

        measured = await interleaved(
            {
                "SQLAlchemy's aiosqlite dialect: ROLLBACK at close (before)": read_only_session(
                    theirs
                ),
                "IdleEndsSkipped: none when SQLite holds no transaction (now)": read_only_session(
                    ours
                ),
            },
            500,
        )
        rows: list[Row] = []
        for label, (cpu, wall) in measured.items():
            rows += [(f"{label}: CPU", cpu, "us"), (f"{label}: wall", wall, "us")]
        await ours.dispose()
        await theirs.dispose()
        return rows


def idle_ends() -> list[Row]:
    """A session that reads one row and closes, on SQLite's one pooled connection: with
    SQLAlchemy's aiosqlite dialect (a ROLLBACK handed to aiosqlite's thread at close) and
    with the gateway's (IdleEndsSkipped: no ROLLBACK when SQLite holds no transaction)."""
    return asyncio.run(_idle_ends())


async def _sessions() -> list[Row]:
    with folder("sessions") as path:
        engine = create_engine(f"sqlite+aiosqlite:///{path / 'g.db'}")
        sessions = session_factory(engine)

        async def unused_session() -> None:
            async with sessions():
                pass

        async def lazy_session() -> None:
            async with LazySession(sessions):
                pass

        async def built_and_closed() -> None:
            await AsyncSession(bind=engine, expire_on_commit=False).close()

        async with sessions() as idle:  # a session that began no transaction
            measured = await interleaved(
                {
                    "an AsyncSession made and closed, unused (before)": unused_session,
                    "LazySession, unused (now)": lazy_session,
                    "AsyncSession(...) built and closed (a writer batch's, before)": (
                        built_and_closed
                    ),
                    "commit of a session with no transaction (before)": idle.commit,
                    "_end_reads of it (now)": lambda: _end_reads(idle),
                },
                2_000,
            )
        rows: list[Row] = [(label, cpu, "us") for label, (cpu, _wall) in measured.items()]
        await engine.dispose()
        return rows


def sessions() -> list[Row]:
    """SQLAlchemy sessions nobody uses: an AsyncSession made and closed per request (before)
    against LazySession (made on first use); a session built per writer batch; the commit
    of a session that began no transaction against `_end_reads`."""
    return asyncio.run(_sessions())


def generation_row(
    row_id: str, account_id: str, workspace_id: str, key_hash: str, created_at: datetime
) -> dict[str, Any]:
    """A completed transcription's generation row, as the transcriber records one."""
    return {
        "id": row_id,
        "account_id": account_id,
        "workspace_id": workspace_id,
        "key_hash": key_hash,
        "kind": "stt",
        "model": "unit/ok",
        "provider": "alpha",
        "status": "completed",
        "cost_micros": 10_000,
        "is_byok": False,
        "seconds": None,
        "latency_ms": 3,
        "session_id": None,
        "user": None,
        "trace": None,
        "error": None,
        "created_at": created_at,
    }


async def _orm_rows(count: int) -> list[Row]:
    async with rig() as built:
        account_id = built.issued.workspace.account_id
        now = datetime.now(UTC)

        def generation() -> dict[str, Any]:
            return generation_row(
                f"gen_{secrets.token_hex(12)}",
                account_id,
                built.issued.workspace.id,
                built.issued.hash,
                now,
            )

        def entry() -> dict[str, Any]:
            return {
                "account_id": account_id,
                "key_hash": built.issued.hash,
                "kind": CHARGE,
                "amount_micros": 10_000,
                "is_byok": False,
                "reference": None,
                "created_at": now,
            }

        async def per_row(insert: Callable[[AsyncSession], Awaitable[None]]) -> float:
            async with built.sessions() as session:
                for _ in range(50):
                    await insert(session)
                started = time.process_time()
                for _ in range(count):
                    await insert(session)
                cpu = (time.process_time() - started) / count * 1e6
                await session.commit()
            return cpu

        # Each ORM object leaves the session once flushed: a request's session held one.
        async def orm_generation(session: AsyncSession) -> None:
            record = Generation(**generation())
            session.add(record)
            await session.flush()
            session.expunge(record)

        async def mapped_generation(session: AsyncSession) -> None:
            await store_generation_row(session, generation())

        async def orm_entry(session: AsyncSession) -> None:
            row = LedgerEntry(**entry())
            session.add(row)
            await session.flush()
            session.expunge(row)

        async def mapped_entry(session: AsyncSession) -> None:
            await fetch_rows(session, INSERT_ENTRY, {f"entry_{k}": v for k, v in entry().items()})

        results: dict[str, list[float]] = {}
        variants = {
            "generation record: ORM object, add + flush (before)": orm_generation,
            "generation record: plain mapping, driver INSERT (now)": mapped_generation,
            "ledger row: ORM object, add + flush (before)": orm_entry,
            "ledger row: plain mapping, driver INSERT (now)": mapped_entry,
        }
        for _ in range(3):
            for label, insert in variants.items():
                results.setdefault(label, []).append(await per_row(insert))
        return [(label, statistics.median(values), "us") for label, values in results.items()]


def orm_rows() -> list[Row]:
    """A settlement's rows inserted in a session's transaction (SQLite, the pooled aiosqlite
    connection): an ORM object added and flushed against a plain mapping on the driver
    (`store_generation_row`, INSERT_ENTRY); CPU per row."""
    return asyncio.run(_orm_rows(1_000))


def generation_index() -> list[Row]:
    """One INSERT of a generation record (the gateway's compiled statement) at 50,000 rows,
    WAL, each committed: with the table's one secondary index (now, migration 0013) and
    with the three single-column ones it replaced (account, time, key)."""
    rows: list[Row] = []
    with folder("generation-index") as path:
        engine = create_engine(f"sqlite+aiosqlite:///{path / 'unused.db'}")
        dialect = engine.sync_engine.dialect
        compiled = _compile(
            sa.insert(Generation.__table__).values(
                {c.name: sa.bindparam(c.name, type_=c.type) for c in Generation.__table__.c}
            ),
            dialect,
        )
        for variant in ("before", "now"):
            database = path / f"{variant}.db"
            sa_engine = sa.create_engine(f"sqlite:///{database}")
            Generation.__table__.create(sa_engine)
            sa_engine.dispose()
            connection = sqlite3.connect(database, isolation_level=None)
            for pragma in SQLITE_PRAGMAS:
                connection.execute(pragma)
            if variant == "before":
                connection.execute("DROP INDEX ix_generations_workspace_created")
                for column in ("account_id", "created_at", "key_hash"):
                    connection.execute(
                        f"CREATE INDEX ix_generations_{column} ON generations ({column})"
                    )
            made = 0

            def row(n: int) -> list[Any]:
                return compiled.arguments(
                    generation_row(
                        f"gen_{n:024d}",
                        f"acct_{n % 50}",
                        f"ws_{n % 50}",
                        f"{n % 500:064d}",
                        datetime.now(UTC),
                    )
                )

            connection.execute("BEGIN")
            connection.executemany(compiled.sql, (row(n) for n in range(50_000)))
            connection.execute("COMMIT")
            made = 50_000
            timings = []
            for _ in range(5_000):
                values = row(made)
                made += 1
                connection.execute("BEGIN")
                started = time.perf_counter()
                connection.execute(compiled.sql, values)
                timings.append(time.perf_counter() - started)
                connection.execute("COMMIT")
            connection.close()
            label = (
                "one secondary index (now)"
                if variant == "now"
                else "three single-column indexes (before)"
            )
            rows.append((f"INSERT at 50,000 rows, {label}", statistics.median(timings) * 1e6, "us"))
        asyncio.run(engine.dispose())
    return rows


# --- the webhook claim (server/workers/webhook_dispatcher.py) ---------------------------------


OTHER = "ws_other_"  # the workspaces of the deliveries after a capped backlog


def _delivery(
    key: str, workspace: str, due_at: datetime, now: datetime, leased: bool = False
) -> dict[str, Any]:
    """A pending webhook_deliveries row; `leased`: in flight (for a year) elsewhere."""
    return {
        "id": f"whd_{key}",
        "workspace_id": workspace,
        "job_id": f"vid_{key}",
        "url": "https://receiver.example/hook",
        "payload": '{"type":"video.completed","data":{"status":"completed"}}',
        "status": "pending",
        "attempts": 0,
        "lease_owner": "someone" if leased else None,
        "lease_expires_at": now.replace(year=now.year + 1) if leased else None,
        "next_attempt_at": due_at,
        "created_at": now,
    }


def _capped_backlog(due: int, now: datetime) -> list[dict[str, Any]]:
    """`due` deliveries of one workspace due a year ago, behind its cap's 4 in flight; then
    20 of other workspaces (one each: a workspace's cap is 4), due after that backlog."""
    backlog = now.replace(year=now.year - 1)
    later = now.replace(day=1) if now.day > 1 else now
    return [
        _delivery(f"{n:020d}", "ws_capped", backlog, now, leased=n < 4) for n in range(due + 4)
    ] + [_delivery(f"other_{n:02d}", f"{OTHER}{n:02d}", later, now) for n in range(20)]


async def _timed(
    claim: Callable[[], Awaitable[WebhookDelivery | None]],
    taken: Callable[[WebhookDelivery | None], bool],
) -> list[float]:
    """20 claims' seconds, each claimed delivery checked with `taken`."""
    timings = []
    for _ in range(20):
        started = time.perf_counter()
        claimed = await claim()
        timings.append(time.perf_counter() - started)
        assert taken(claimed), claimed
    return timings


def _claim_rows(what: str, timings: list[float]) -> list[Row]:
    return [
        (f"{what}: median", statistics.median(timings) * 1000, "ms"),
        ("  the slowest of 20", max(timings) * 1000, "ms"),
    ]


@contextlib.asynccontextmanager
async def _dispatcher(built: Any, rows: list[dict[str, Any]]) -> AsyncIterator[WebhookDispatcher]:
    """The rig's webhook dispatcher (SQLite), `rows` in its outbox."""
    async with built.engine.begin() as connection:
        await connection.execute(sa.insert(WebhookDelivery.__table__), rows)
    async with httpx.AsyncClient() as client:
        yield WebhookDispatcher(
            built.sessions,
            built.clock,
            client,
            master=MasterKey.from_base64(MasterKey.generate_base64()),
        )


def _is_none(claimed: WebhookDelivery | None) -> bool:
    return claimed is None


def _is_other(claimed: WebhookDelivery | None) -> bool:
    return claimed is not None and claimed.workspace_id.startswith(OTHER)


async def _webhook_claim(due: int) -> list[Row]:
    now = datetime.now(UTC)
    rows = _capped_backlog(due, now)
    async with rig() as built:
        # The others' deliveries come in after the claims that find nothing.
        async with _dispatcher(built, rows[: due + 4]) as dispatcher:
            nothing = await _timed(dispatcher.claim, _is_none)
            async with built.engine.begin() as connection:
                await connection.execute(sa.insert(WebhookDelivery.__table__), rows[due + 4 :])
            taken = await _timed(dispatcher.claim, _is_other)
    return _claim_rows(
        f"a claim finding nothing it may take, {due:,} due of one capped workspace", nothing
    ) + _claim_rows("a claim taking another workspace's delivery, due after them", taken)


def webhook_claim() -> list[Row]:
    """The webhook dispatcher's claim (SQLite) with 20,000 pending deliveries due, all of
    one workspace that has its cap (4) in flight: a claim that finds nothing it may take,
    then claims that take another workspace's delivery, due after that backlog."""
    return asyncio.run(_webhook_claim(20_000))


async def _webhook_claim_many(workspaces: int) -> list[Row]:
    now = datetime.now(UTC)
    due = now.replace(year=now.year - 1)
    rows = [_delivery(f"{n:020d}", f"ws_many_{n:08d}", due, now) for n in range(workspaces)]
    async with rig() as built, _dispatcher(built, rows) as dispatcher:
        timings = await _timed(dispatcher.claim, lambda claimed: claimed is not None)
    return _claim_rows(f"a claim with {workspaces:,} workspaces each with a delivery due", timings)


def webhook_claim_many() -> list[Row]:
    """The webhook dispatcher's claim (SQLite) when 10,000 workspaces each have one delivery
    due and none is at its cap: the head of the queue answers it."""
    return asyncio.run(_webhook_claim_many(10_000))


async def _webhook_claim_pg(due: int) -> list[Row]:
    server = PgServer.parse("postgresql")
    name = f"bench_claim_{secrets.token_hex(6)}"
    await server.create(name)
    url = server.database_url(name)
    try:
        await migrate.upgrade(url)
        engine = create_engine(url)
        async with engine.begin() as connection:
            await connection.execute(
                sa.insert(WebhookDelivery.__table__), _capped_backlog(due, datetime.now(UTC))
            )
            await connection.execute(sa.text("ANALYZE webhook_deliveries"))
        claimer = webhook_dispatcher_claimer(WORKSPACE_CONCURRENCY)
        sessions = session_factory(engine)

        async def claim() -> WebhookDelivery | None:
            async with sessions() as session:
                claimed: WebhookDelivery | None = await claimer.claim(
                    session, owner="bench", now=datetime.now(UTC), lease=timedelta(minutes=1)
                )
                return claimed

        taken = await _timed(claim, _is_other)
        nothing = await _timed(claim, _is_none)
        await engine.dispose()
    finally:
        await server.drop(name)
    return _claim_rows(
        "a claim taking another workspace's delivery, due after the backlog", taken
    ) + _claim_rows(
        f"a claim finding nothing it may take, {due:,} due of one capped workspace", nothing
    )


def webhook_claim_pg() -> list[Row]:
    """webhook-claim on PostgreSQL at 127.0.0.1:5432 (a database of its own, dropped after):
    the claims taking other workspaces' deliveries first, then ones finding nothing."""
    return asyncio.run(_webhook_claim_pg(20_000))


# --- audio timestamps (server/transcription/media.py) -----------------------------------------


def _encoded(codec: str, container: str, rate: int, seconds: float) -> bytes:
    """`seconds` of a 440 Hz tone, mono at `rate`, encoded with FFmpeg's `codec` (PyAV)."""
    import av
    import numpy as np

    out_buffer = io.BytesIO()
    with av.open(out_buffer, "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate)
        assert isinstance(stream, av.AudioStream)
        stream.layout = "mono"
        count = int(rate * seconds)
        tone = (np.sin(np.arange(count) * 2 * np.pi * 440 / rate) * 0.3).astype(np.float32)
        size = stream.codec_context.frame_size or 1024
        for start in range(0, count, size):
            frame = av.AudioFrame.from_ndarray(
                tone[start : start + size].reshape(1, -1), format="flt", layout="mono"
            )
            frame.sample_rate, frame.pts = rate, start
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return out_buffer.getvalue()


def codec_priming() -> list[Row]:
    """How far an encoded file's packet timestamps end from its decoded samples (what
    media.py's TIMESTAMP_TOLERANCE must leave room for): one second of a tone at 8 kHz, the
    lowest common speech rate, through FFmpeg's MP3 (LAME) and AAC encoders."""
    import av

    rows: list[Row] = []
    for codec, container in (("libmp3lame", "mp3"), ("aac", "mp4"), ("aac", "adts")):
        data = _encoded(codec, container, 8000, 1.0)
        with av.open(io.BytesIO(data), "r") as opened:
            stream = opened.streams.audio[0]
            decoded, packets_end = 0, Fraction(0)
            for packet in opened.demux(stream):
                if packet.pts is not None and packet.duration and packet.time_base:
                    end = (packet.pts + packet.duration) * packet.time_base
                    packets_end = max(packets_end, Fraction(end))
                decoded += sum(frame.samples for frame in packet.decode())
        rows.append(
            (
                f"{codec} in {container}: packets end minus decoded samples (1 s at 8 kHz)",
                float(packets_end - Fraction(decoded, 8000)) * 1000,
                "ms",
            )
        )
    return rows


# --- request bodies (server/transcription/request.py) -----------------------------------------


async def _longest_stall(work: Callable[[], object]) -> tuple[float, float, float]:
    """Run `work` in a thread while the loop ticks (`asyncio.sleep(0)` in a loop): (its wall
    seconds, the loop's longest wait between two ticks, the 99th percentile of the waits)."""
    return await _stalled_by(lambda: asyncio.to_thread(work))


async def _stalled_by(work: Callable[[], Awaitable[object]]) -> tuple[float, float, float]:
    """Await `work()` while the loop ticks: (its wall seconds, the loop's longest wait
    between two ticks, the 99th percentile of the waits)."""
    gaps: list[float] = []
    done = False

    async def tick() -> None:
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0)
    started = time.perf_counter()
    await work()
    took = time.perf_counter() - started
    done = True
    await ticker
    return took, max(gaps), quantile(gaps, 0.99)


async def _in_a_decoder(body: bytes) -> tuple[float, float, float]:
    """The body parsed as Transcriber.parse hands a large one over: in a decoder process
    (a ComputePool of one worker, started before the measurement)."""
    pool = ComputePool("audio decoding", workers=1, queue=1)
    try:
        await pool.run(abs, -1)  # the worker started
        return await _stalled_by(
            lambda: pool.run(from_http_in_worker, body, "application/json", None)
        )
    finally:
        await pool.close()


def json_body() -> list[Row]:
    """A JSON transcription body of about 30 MB (base64 audio in input_audio.data) through
    `from_json`: on the loop's thread; in a thread, with the loop's longest wait; and as
    the server parses it (Transcriber.parse: in a decoder process), with the loop's longest
    wait."""
    audio = os.urandom(22 * 2**20)
    import base64

    body = json.dumps(
        {
            "model": "unit/ok",
            "input_audio": {"data": base64.b64encode(audio).decode(), "format": "wav"},
        }
    ).encode()
    timings = []
    for _ in range(3):
        started = time.perf_counter()
        from_json(body, None)
        timings.append(time.perf_counter() - started)
    took, longest, _p99 = asyncio.run(_longest_stall(lambda: from_json(body, None)))
    in_worker, worker_longest, _ = asyncio.run(_in_a_decoder(body))
    return [
        (f"from_json of a {len(body) / 1e6:.1f} MB body", statistics.median(timings) * 1000, "ms"),
        ("the same in a thread: its wall time", took * 1000, "ms"),
        ("  the event loop's longest wait meanwhile", longest * 1000, "ms"),
        ("the same in a decoder process: its wall time", in_worker * 1000, "ms"),
        ("  the event loop's longest wait meanwhile", worker_longest * 1000, "ms"),
    ]


# --- local video (server/providers/local_video.py) --------------------------------------------


def render_gil() -> list[Row]:
    """render_mp4 at 1280x720 for 4 s in a thread (as LocalVideoAdapter runs it) while the
    event loop ticks, three times: the longest wait of the loop between two ticks in each
    render, and the 99th percentile of the waits."""
    params = {
        "width": 1280,
        "height": 720,
        "duration": 4,
        "prompt": "a lighthouse at dusk",
        "seed": 7,
    }
    render_mp4({**params, "duration": 1, "width": 320, "height": 240})  # imports, warm
    runs = [asyncio.run(_longest_stall(lambda: render_mp4(params))) for _ in range(3)]
    rows: list[Row] = []
    for n, (took, longest, p99) in enumerate(runs, 1):
        rows += [
            (f"render {n}: 1280x720, 4 s, in a thread: wall", took * 1000, "ms"),
            (f"render {n}: the event loop's longest wait between two ticks", longest * 1000, "ms"),
            (f"render {n}: the 99th percentile of those waits", p99 * 1000, "ms"),
        ]
    return rows


# --- processes: child interpreters ------------------------------------------------------------


@dataclass
class Child:
    cpu_seconds: float  # user + system, from its end (wait4)
    peak_rss_mib: float  # VmHWM as its code ended (NaN if it exited before)
    output: str


# Appended to a child's code: its peak RSS (VmHWM) on the last line of its output. (wait4's
# ru_maxrss would count the pages of this process the child had before its exec.)
_PEAK = """
for _line in open("/proc/self/status"):
    if _line.startswith("VmHWM:"):
        print("peak-kib", _line.split()[1])
"""


def child(code: str, *args: str) -> Child:
    """Run `code` in a new interpreter of this checkout; its CPU, peak RSS and stdout."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-c", code + _PEAK, *args],
        stdout=subprocess.PIPE,
        env=env,
        cwd=REPO_ROOT,
    )
    assert process.stdout is not None
    output = process.stdout.read().decode()
    _pid, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"the child failed ({process.returncode}): {code[:80]}")
    peak = float("nan")
    lines = output.splitlines()
    if lines and lines[-1].startswith("peak-kib "):
        peak = int(lines.pop().split()[1]) / 1024
    return Child(usage.ru_utime + usage.ru_stime, peak, "\n".join(lines))


def main_module() -> list[Row]:
    """What a worker process started with `spawn` pays before its first job: it re-imports
    the parent's main module. server.__main__ (the `gateway` command's, now) against
    server.cli (the main module before); CPU and peak RSS of a new interpreter that imports
    it, median of 5."""
    rows: list[Row] = []
    for module, label in (
        ("server.cli", "server.cli (before)"),
        ("server.__main__", "server.__main__ (now)"),
    ):
        children = [child(f"import {module}") for _ in range(5)]
        rows.append(
            (f"importing {label}: CPU", statistics.median(c.cpu_seconds for c in children), "s")
        )
        rows.append(
            (
                f"importing {label}: peak RSS",
                statistics.median(c.peak_rss_mib for c in children),
                "MiB",
            )
        )
    bare = [child("pass") for _ in range(5)]
    rows.append(
        (
            "an interpreter importing nothing: CPU",
            statistics.median(c.cpu_seconds for c in bare),
            "s",
        )
    )
    rows.append(
        (
            "an interpreter importing nothing: peak RSS",
            statistics.median(c.peak_rss_mib for c in bare),
            "MiB",
        )
    )
    return rows


_TEARDOWN = """
import gc, sys, time
import server.cli, server.app
print(len(gc.get_objects()), time.process_time())
sys.stdout.flush()
if sys.argv[1] == "freeze":
    gc.freeze()
sys.exit(0)
"""


def exit_teardown() -> list[Row]:
    """The interpreter's teardown after the server's modules are loaded (server.cli and
    server.app imported: what a stopping `gateway` has at least): CPU from sys.exit to the
    end of the process, with the heap frozen first (exit_with_frozen_heap, now) and
    without; median of 3 each."""
    results: dict[str, list[float]] = {"plain": [], "freeze": []}
    objects = 0
    for _ in range(3):
        for variant in results:
            ran = child(_TEARDOWN, variant)
            count, before_exit = ran.output.split()
            objects = int(count)
            results[variant].append(ran.cpu_seconds - float(before_exit))
    return [
        ("objects tracked by the collector at exit", float(objects), "objects"),
        ("teardown CPU, plain exit (before)", statistics.median(results["plain"]) * 1000, "ms"),
        (
            "teardown CPU, gc.freeze() then exit (now)",
            statistics.median(results["freeze"]) * 1000,
            "ms",
        ),
    ]


_MIGRATE = """
import asyncio, sys
import server.app
from server.db import migrate
url = sys.argv[2]
if sys.argv[1] == "in-process":
    migrate.upgrade_sync(url)
else:
    asyncio.run(migrate.upgrade(url))
"""


def migrate_rss() -> list[Row]:
    """Peak RSS of a process that imported the server (server.app) and brought a new SQLite
    database to head: the migrations run in it (before) or in a child process (now,
    `upgrade`); the mean of 2 each."""
    rows: list[Row] = []
    with folder("migrate") as path:
        for variant, label in (
            ("in-process", "in the process (before)"),
            ("child", "in a child process (now)"),
        ):
            peaks = [
                child(
                    _MIGRATE, variant, f"sqlite+aiosqlite:///{path / f'{variant}{n}.db'}"
                ).peak_rss_mib
                for n in range(2)
            ]
            rows.append((f"peak RSS, migrations {label}", statistics.fmean(peaks), "MiB"))
    return rows


_IMPORT_RSS = """
import sys
import server.app

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

before = rss()
for name in sys.argv[1:]:
    __import__(name)
print(rss() - before)
"""


def import_rss() -> list[Row]:
    """RSS a server process (server.app imported) gains by importing what three providers
    import on first use; the mean of 2 new interpreters each."""
    groups = (
        (
            "Vertex's token refresh: google.auth.transport.requests (requests, urllib3)",
            ["google.auth.transport.requests"],
        ),
        (
            "the local video renderer: PyAV, numpy, Pillow",
            ["av", "numpy", "PIL.Image", "PIL.ImageDraw", "PIL.ImageFont"],
        ),
        ("audio decoding: PyAV (and FFmpeg's libraries)", ["av"]),
    )
    return [
        (
            label,
            statistics.fmean(float(child(_IMPORT_RSS, *modules).output) for _ in range(2)),
            "MiB",
        )
        for label, modules in groups
    ]


# --- the command ------------------------------------------------------------------------------


def _gateway_methods() -> int:
    """How many methods the gateway serves: its services' (server/contract.py), plus grpc's
    health (Check, Watch, List) and reflection (ServerReflectionInfo)."""
    from google.protobuf import descriptor_pb2

    from server.contract import DESCRIPTOR_SET, SERVICES

    files = descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTOR_SET.read_bytes())
    methods = sum(
        len(service.method)
        for file in files.file
        for service in file.service
        if f"{file.package}.{service.name}" in SERVICES
    )
    return methods + 3 + 1


async def _grpc_dispatch(methods: int) -> list[Row]:
    loop = asyncio.get_running_loop()

    def waiting_on(count: int) -> Callable[[], Awaitable[object]]:
        pending = [loop.create_future() for _ in range(count)]

        async def call_arrives() -> object:
            # As grpc.aio's _server_main_loop for each call: the request of one method
            # completes, the loop waits on every pending request, then asks again for it.
            loop.call_soon(pending[0].set_result, None)
            done = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            pending[0] = loop.create_future()
            return done

        return call_arrives

    timings = await interleaved(
        {"registered": waiting_on(methods), "one table": waiting_on(1)}, calls=3000
    )
    return [
        (
            f"a call's dispatch wait, every method registered ({methods} pending)",
            timings["registered"][0],
            "µs CPU",
        ),
        (
            "a call's dispatch wait, one generic handler (MethodTable)",
            timings["one table"][0],
            "µs CPU",
        ),
    ]


def grpc_dispatch() -> list[Row]:
    """server/services/rpc.py MethodTable: grpc.aio's server keeps one request pending per
    registered method and, for every call that arrives, waits on all of them at once
    (asyncio.wait adds and removes a callback on each); with one generic handler, on one.
    CPU per call of that wait alone, with the gateway's method count and with one."""
    return asyncio.run(_grpc_dispatch(_gateway_methods()))


def key_json() -> list[Row]:
    """server/rest/api.py json_of: GET /key's answer (a key with a limit, two budgets)
    printed as the transcoder prints it, with json_format, in the server process now that
    the REST listener answers the route — beside what the gRPC method cost there before,
    serializing the message for Envoy to print."""
    from server.clock import SystemClock
    from server.contract import keys_pb2
    from server.rest.api import json_of
    from server.services.keys import LEGACY_RATE_LIMIT
    from server.services.rpc import null, nullable_string, nullable_usd

    message = keys_pb2.CurrentKeyResponse()
    data = message.data
    data.label = "sk-gw-v1-0a1…f9e"
    data.limit.CopyFrom(nullable_usd(5_000_000))
    data.limit_reset.CopyFrom(nullable_string("monthly"))
    data.limit_remaining.CopyFrom(nullable_usd(4_250_000))
    data.workspace_id.CopyFrom(nullable_string("ws_" + secrets.token_hex(8)))
    for field in (data.organization_id, data.creator_user_id, data.expires_at):
        field.CopyFrom(null())
    data.allowed_data_regions.append("global")
    data.rate_limit.CopyFrom(LEGACY_RATE_LIMIT)
    data.usage = 0.75
    data.free_model_daily_requests.limit = 50
    for scope in ("workspace", "key"):
        budget = data.budgets.add(scope=scope, limit_usd=10.0, spend_usd=0.75)
        budget.budget_id.CopyFrom(null())
        budget.guardrail_id.CopyFrom(nullable_string("gr_" + scope))
        budget.reset_interval.CopyFrom(nullable_string("monthly"))
        budget.resets_at.CopyFrom(nullable_string(SystemClock().now().isoformat()))
    data.effective_budget.CopyFrom(null())
    return [
        (
            "GET /key printed with json_format (REST listener)",
            cpu_us(lambda: json_of(message), 3000),
            "µs",
        ),
        ("GET /key serialized (gRPC, before)", cpu_us(message.SerializeToString, 3000), "µs"),
    ]


MEASUREMENTS: dict[str, Callable[[], list[Row]]] = {
    "url-parse": url_parse,
    "cookie-jar": cookie_jar,
    "multipart": multipart,
    "redaction": redaction,
    "date-binds": date_binds,
    "compile-once": compile_once,
    "sqlite-reads": sqlite_reads,
    "settlements": settlements,
    "wal-commits": wal_commits,
    "idle-ends": idle_ends,
    "sessions": sessions,
    "orm-rows": orm_rows,
    "generation-index": generation_index,
    "webhook-claim": webhook_claim,
    "webhook-claim-pg": webhook_claim_pg,
    "webhook-claim-many": webhook_claim_many,
    "codec-priming": codec_priming,
    "provider-call-pieces": provider_call_pieces,
    "upload-parts": upload_parts,
    "settlement-statements": settlement_statements,
    "json-body": json_body,
    "render-gil": render_gil,
    "main-module": main_module,
    "exit-teardown": exit_teardown,
    "migrate-rss": migrate_rss,
    "import-rss": import_rss,
    "grpc-dispatch": grpc_dispatch,
    "key-json": key_json,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.micro",
        description=(__doc__ or "").split("\n\n")[0],
        epilog="What each NAME measures: its function's docstring in bench/micro.py.",
    )
    parser.add_argument("name", choices=[*MEASUREMENTS, "all"], help="what to measure")
    add_json_argument(parser)
    args = parser.parse_args(argv)
    names = list(MEASUREMENTS) if args.name == "all" else [args.name]
    results: dict[str, list[dict[str, object]]] = {}
    for name in names:
        started = time.perf_counter()
        rows = MEASUREMENTS[name]()
        print(f"{name} ({time.perf_counter() - started:.1f} s):", flush=True)
        for label, value, unit in rows:
            print(f"  {value:10.2f} {unit:<7} {label}", flush=True)
        results[name] = [
            {"what": label, "value": value, "unit": unit} for label, value, unit in rows
        ]
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
