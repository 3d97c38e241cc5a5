"""CPU per call of each request-side step of a transcription, in-process (issue 17).

Builds what app.build_core wires for a transcription (principal stamp, Authenticator,
GuardrailsCache, ByokRouting with its key cache, BudgetLeases, Metrics) on a migrated
SQLite file with one funded key, then times each step the service runs for a 32 KB WAV
multipart upload, thousands of times: CPU microseconds per call (time.process_time).

    python -m bench.request_steps [--iterations 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from opentelemetry.trace import NoOpTracer
from sqlalchemy.ext.asyncio import AsyncEngine

from bench.harness.stt import multipart_upload
from server.auth import Authenticator, _presented_hash
from server.billing.money import usd_to_micros
from server.byok.cache import ByokKeysCache
from server.byok.fees import ByokFees
from server.byok.routing import ByokRouting, billing_plan
from server.clock import SystemClock
from server.db.engine import SessionFactory, create_engine, session_factory
from server.db.migrate import upgrade
from server.db.models import Account  # noqa: F401 (registers every table)
from server.db.stamp import PrincipalStampView
from server.db.writer import Writer
from server.guardrails.cache import GuardrailsCache
from server.limits.admission import EnforcedLimits, is_plain_credit_hold
from server.limits.leases import BudgetLeases
from server.observability.logs import configure_logging, log_access
from server.observability.metrics import Metrics
from server.providers.stt import Transcript
from server.routing.catalog import load_catalog
from server.routing.cooldowns import Cooldowns
from server.transcription import transcriber as transcriber_module
from server.transcription.request import from_http
from server.transcription.transcriber import Transcriber, TranscriptionResult, price
from server.vault.crypto import MasterKey
from testkit.admin import Admin, IssuedKey
from testkit.domain import InlinePool, write_unit_catalog


def _audio_32k() -> bytes:
    """A 32 KB PCM WAV (16 kHz mono 16-bit, ~1 s), as the benchmarks send."""
    frames = 16_000
    payload = bytes(range(256)) * (frames * 2 // 256)
    from server.transcription.wav import canonical_wav

    return canonical_wav(1, 1, 16_000, 16, payload)


async def _time_async(fn: Callable[[], Awaitable[Any]], n: int) -> float:
    for _ in range(min(200, n)):
        await fn()
    start = time.process_time()
    for _ in range(n):
        await fn()
    return (time.process_time() - start) / n * 1e6


def _time_sync(fn: Callable[[], Any], n: int) -> float:
    for _ in range(min(200, n)):
        fn()
    start = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - start) / n * 1e6


@dataclass
class Rig:
    """What app.build_core wires for a transcription, on a migrated SQLite file with one funded
    key (`issued`); `bench.micro` runs its settlements too."""

    folder: Path
    engine: AsyncEngine
    sessions: SessionFactory
    clock: SystemClock
    writer: Writer
    metrics: Metrics
    auth: Authenticator
    byok: ByokRouting
    leases: BudgetLeases
    transcriber: Transcriber
    issued: IssuedKey

    async def settlement(self) -> Callable[[], Awaitable[None]]:
        """A charge as a request makes it with nothing else queued (concurrency 1): its own
        batch through the writer, committed; as many at once as are awaited together."""
        upload = multipart_upload("unit/ok", _audio_32k())
        parsed = from_http(upload.content, upload.content_type, None)
        audio = Transcriber._measure_wav(parsed)
        assert audio is not None
        model = self.transcriber._model(parsed)
        cost = price(model, audio.seconds)
        async with self.sessions() as session:
            principal = await self.auth.authenticate(session, self.issued.metadata)
        transcriber, leases, clock = self.transcriber, self.leases, self.clock

        async def settle() -> None:
            held = await leases.admit(principal, cost)
            assert held is not None
            unit = functools.partial(
                transcriber._settle,
                holds=(held, None),
                principal=principal,
                request=parsed,
                model=model,
                generation_id=f"gen_{secrets.token_hex(12)}",
                provider="alpha",
                is_byok=False,
                cost=cost,
                seconds=audio.seconds,
                started=time.perf_counter(),
                started_at=clock.now(),
            )
            await transcriber._settle_through(unit, held)

        return settle

    async def close(self) -> None:
        await self.leases.close()
        await self.writer.close()
        await self.engine.dispose()
        shutil.rmtree(self.folder, ignore_errors=True)


async def transcription_rig(*, inline_sqlite: bool = True) -> Rig:
    """A Rig in a new temporary folder; `inline_sqlite` as Writer takes it."""
    folder = Path(tempfile.mkdtemp(prefix="request-steps-"))
    url = f"sqlite+aiosqlite:///{folder / 'gateway.db'}"
    await upgrade(url)
    engine = create_engine(url)
    sessions = session_factory(engine)
    clock = SystemClock()
    writer = Writer(sessions, inline_sqlite=inline_sqlite)
    admin = Admin(sessions, clock)
    workspace = await admin.workspace("steps")
    await admin.credits(workspace, "1000000")
    issued = await admin.key(workspace)
    catalog = load_catalog(write_unit_catalog(folder))
    metrics = Metrics()
    stamp = PrincipalStampView(clock)
    auth = Authenticator(clock, stamp)
    guardrails = GuardrailsCache(stamp)
    byok = ByokRouting(
        MasterKey.from_base64(MasterKey.generate_base64()),
        ByokFees(Decimal(5), 1000),
        ByokKeysCache(stamp),
    )
    leases = BudgetLeases(writer, clock, metrics)
    transcriber = Transcriber(
        catalog,
        {},
        clock,
        EnforcedLimits(metrics),
        metrics,
        NoOpTracer(),
        InlinePool(),  # type: ignore[arg-type]
        writer=writer,
        byok=byok,
        guardrails=guardrails,
        leases=leases,
    )
    return Rig(
        folder,
        engine,
        sessions,
        clock,
        writer,
        metrics,
        auth,
        byok,
        leases,
        transcriber,
        issued,
    )


async def main(iterations: int) -> dict[str, float]:
    rig = await transcription_rig()
    sessions, clock, metrics, auth = rig.sessions, rig.clock, rig.metrics, rig.auth
    byok, leases, transcriber, issued = rig.byok, rig.leases, rig.transcriber, rig.issued
    upload = multipart_upload("unit/ok", _audio_32k())
    metadata = (("authorization", f"Bearer {issued.key}"), ("x-request-id", "r-1"))
    n = iterations
    results: dict[str, float] = {}

    results["from_http (multipart 32 KB)"] = _time_sync(
        lambda: from_http(upload.content, upload.content_type, None), n
    )
    parsed = from_http(upload.content, upload.content_type, None)
    results["_measure_wav"] = _time_sync(lambda: Transcriber._measure_wav(parsed), n)
    audio = Transcriber._measure_wav(parsed)
    assert audio is not None
    results["_presented_hash"] = _time_sync(lambda: _presented_hash(metadata), n)

    async with sessions() as session:
        principal = await auth.authenticate(session, metadata)
        results["authenticate (cached)"] = await _time_async(
            lambda: auth.authenticate(session, metadata), n
        )
        results["_model"] = _time_sync(lambda: transcriber._model(parsed), n)
        model = transcriber._model(parsed)
        results["guardrails_of (cached)"] = await _time_async(
            lambda: transcriber._guardrails_of(session, principal), n
        )
        rails = await transcriber._guardrails_of(session, principal)
        results["guardrails.endpoints"] = _time_sync(lambda: rails.endpoints(model), n)
        results["price"] = _time_sync(lambda: price(model, audio.seconds), n)
        cost = price(model, audio.seconds)
        results["check_cost"] = _time_sync(lambda: rails.check_cost(cost), n)
        endpoints = rails.endpoints(model)
        now = clock.now()

        def byok_endpoints() -> Awaitable[Any]:
            return byok.endpoints(
                session,
                workspace_id=principal.workspace.id,
                key_hash=principal.key.hash,
                model_id=model.id,
                endpoints=endpoints,
                user=None,
                now=now,
            )

        results["byok.endpoints (no keys)"] = await _time_async(byok_endpoints, n)
        planned = await byok_endpoints()
        results["billing_plan"] = _time_sync(lambda: billing_plan(planned, cost, byok.fees), n)
        results["budgets + is_plain_credit_hold"] = _time_sync(
            lambda: is_plain_credit_hold(model.id, rails.budgets, byok=False), n
        )
        await session.commit()

    hold = await leases.admit(principal, cost)
    assert hold is not None
    leases.released(hold)

    async def admit_release() -> None:
        held = await leases.admit(principal, cost)
        assert held is not None
        leases.released(held)

    results["leases.admit + released"] = await _time_async(admit_release, n)

    settle_alone = await rig.settlement()
    results["settlement alone (writer batch + commit)"] = await _time_async(
        settle_alone, min(n, 2000)
    )
    results["_call (SttCall)"] = _time_sync(lambda: transcriber._call(parsed, model, planned[0]), n)
    result = TranscriptionResult(
        request=parsed,
        transcript=Transcript(text="hello world, a transcript of a few words"),
        seconds=audio.seconds,
        cost_micros=cost,
        provider="alpha",
        generation_id="gen_0123456789abcdef01234567",
    )
    encode = getattr(result, "json_body", None) or (
        lambda: json.dumps(result.body(), separators=(",", ":")).encode()  # before json_body
    )
    results["body() + json.dumps"] = _time_sync(encode, n)
    configure_logging("json")
    access = logging.getLogger("gateway.access")
    results["log_access"] = _time_sync(
        lambda: log_access(access, "/api/v1/audio/transcriptions", 200, 3.2, "r-1"), n
    )
    results["metrics.request_done"] = _time_sync(
        lambda: metrics.request_done("/api/v1/audio/transcriptions", 200, 0.003), n
    )

    def provider_call() -> None:
        with metrics.provider_call("alpha", "transcription"):
            pass

    results["metrics.provider_call"] = _time_sync(provider_call, n)

    async def request_session() -> None:
        try:  # what the audio service opens per request (LazySession: made on first use)
            from server.transcription.session import LazySession
        except ImportError:  # before it
            async with sessions():
                return
        async with LazySession(sessions) as session:
            assert not session.in_transaction()

    results["request session open+close"] = await _time_async(request_session, n)
    # The commit before admission, of a session that read nothing (a cached caller).
    end_reads = getattr(transcriber_module, "_end_reads", None)
    if end_reads is None:  # before it: a commit every time

        async def end_reads(session: Any) -> None:
            await session.commit()

    async with sessions() as unused:
        results["commit before admission"] = await _time_async(lambda: end_reads(unused), n)
    cooldowns = Cooldowns(clock)
    results["cooldowns.remaining"] = _time_sync(lambda: cooldowns.remaining(planned[0]), n)
    results["usd_to_micros"] = _time_sync(lambda: usd_to_micros(audio.seconds), n)
    await rig.close()
    return results


def run() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iterations", type=int, default=5000)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    results = asyncio.run(main(args.iterations))
    if args.json:
        print(json.dumps(results))
    else:
        for name, micros in results.items():
            print(f"{micros:9.2f} us  {name}", file=sys.stdout)
        print(f"{sum(results.values()):9.2f} us  total")
    return 0


if __name__ == "__main__":
    sys.exit(run())
