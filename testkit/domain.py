"""The domain objects built in-process, for the fast test layer (tests/unit): a migrated
database, a ManualClock, the real catalog parser on a small catalog, and providers played by
an `httpx.MockTransport` that scripts each one by host name and records what it was sent."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
from opentelemetry.trace import NoOpTracer
from sqlmodel import SQLModel, select

from server.auth import Authenticator, Principal
from server.billing.settlements import Settlements
from server.clock import ManualClock
from server.compute import ComputePool
from server.db.engine import SessionFactory
from server.db.models import LedgerEntry, UsageCounter
from server.db.writer import Writer
from server.limits.admission import EnforcedLimits
from server.limits.leases import BudgetLeases
from server.observability.metrics import Metrics
from server.providers.openai_stt import OpenAISttAdapter
from server.providers.openai_video import OpenAIVideoAdapter
from server.routing.catalog import Catalog, Model, load_catalog
from server.transcription.request import TranscriptionInput
from server.transcription.transcriber import Transcriber, TranscriptionResult
from server.videos.request import VideoInput
from testkit.admin import Admin, IssuedKey
from testkit.audio import fixture

T = TypeVar("T")
PROVIDER_KEY_ENV = "UNIT_PROVIDER_KEY"
PROVIDER_KEY = "unit-provider-secret"

# Hosts script the providers: stt-ok answers, stt-429 rate-limits, stt-500 fails; the video
# host runs jobs whose provider model is "ok" (completes on the second poll) or "fail".
UNIT_CATALOG = f"""
[[models]]
id = "unit/ok"
kind = "stt"
price_per_second = "0.01"
[[models.endpoints]]
provider = "alpha"
adapter = "openai"
base_url = "http://stt-ok.test/v1/"
api_key_env = "{PROVIDER_KEY_ENV}"
model = "whisper-a"

[[models]]
id = "unit/fallback-429"
kind = "stt"
price_per_second = "0.01"
[[models.endpoints]]
provider = "alpha"
adapter = "openai"
base_url = "http://stt-429.test/v1"
api_key_env = "{PROVIDER_KEY_ENV}"
[[models.endpoints]]
provider = "beta"
adapter = "openai"
base_url = "http://stt-ok.test/v1"
api_key_env = "{PROVIDER_KEY_ENV}"

[[models]]
id = "unit/all-fail"
kind = "stt"
price_per_second = "0.01"
[[models.endpoints]]
provider = "alpha"
adapter = "openai"
base_url = "http://stt-500.test/v1"
api_key_env = "{PROVIDER_KEY_ENV}"
[[models.endpoints]]
provider = "beta"
adapter = "openai"
base_url = "http://stt-429.test/v1"
api_key_env = "{PROVIDER_KEY_ENV}"

[[models]]
id = "unitvideo/ok"
kind = "video"
price_per_second = "0.05"
resolutions = ["480p"]
aspect_ratios = ["16:9"]
durations = [2]
[[models.endpoints]]
provider = "vidco"
adapter = "openai"
base_url = "http://video.test/v1"
api_key_env = "{PROVIDER_KEY_ENV}"
model = "ok"

[[models]]
id = "unitvideo/fail"
kind = "video"
price_per_second = "0.05"
resolutions = ["480p"]
aspect_ratios = ["16:9"]
durations = [2]
[[models.endpoints]]
provider = "vidco"
adapter = "openai"
base_url = "http://video.test/v1"
api_key_env = "{PROVIDER_KEY_ENV}"
model = "fail"
"""

VIDEO_BYTES = b"\x00\x00\x00\x18ftypmp42 not really a video"


def write_unit_catalog(folder: Path) -> Path:
    path = folder / "catalog.toml"
    path.write_text(UNIT_CATALOG)
    return path


@dataclass
class ScriptedProviders:
    """Every provider and webhook target, in-process. `requests` is what each was sent."""

    requests: list[httpx.Request] = field(default_factory=list)
    video_jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    webhook_answers: dict[str, list[int]] = field(default_factory=dict)  # path -> statuses

    def sent_to(self, host: str) -> list[httpx.Request]:
        return [r for r in self.requests if r.url.host == host]

    def webhooks(self, path: str) -> list[httpx.Request]:
        return [r for r in self.requests if r.url.path == path]

    def handle(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        host = request.url.host
        if host.startswith("stt-") or host == "video.test":
            if request.headers.get("authorization") != f"Bearer {PROVIDER_KEY}":
                return _error(401, "bad key", "invalid_api_key")
        if host == "stt-ok.test":
            return httpx.Response(200, json={"text": "in-process transcript"})
        if host == "stt-429.test":
            return _error(429, "slow down", "rate_limit_exceeded", {"Retry-After": "7"})
        if host == "stt-500.test":
            return _error(500, "upstream broke", "server_error")
        if host == "video.test":
            return self._video(request)
        # A webhook target: the scripted statuses of its path, in turn; then 200.
        answers = self.webhook_answers.get(request.url.path, [])
        return httpx.Response(answers.pop(0) if answers else 200)

    def _video(self, request: httpx.Request) -> httpx.Response:
        parts = request.url.path.strip("/").split("/")  # v1 videos [id [content]]
        if request.method == "POST":
            job_id = f"pv_{len(self.video_jobs) + 1}"
            if parts[-1] == "remix":  # POST /v1/videos/{id}/remix {prompt}: a new job
                model = self.video_jobs[parts[2]]["model"]
            else:
                model = json.loads(request.content)["model"]
            self.video_jobs[job_id] = {"model": model, "polls": 0}
            return httpx.Response(200, json={"id": job_id, "status": "queued"})
        job = self.video_jobs[parts[2]]
        if parts[-1] == "content":
            return httpx.Response(200, content=VIDEO_BYTES)
        job["polls"] += 1
        if job["polls"] < 2:
            return httpx.Response(200, json={"id": parts[2], "status": "in_progress"})
        if job["model"] == "fail":
            body = {"id": parts[2], "status": "failed", "error": {"message": "content policy"}}
            return httpx.Response(200, json=body)
        return httpx.Response(200, json={"id": parts[2], "status": "completed"})


def _error(
    status: int, message: str, code: str, headers: dict[str, str] | None = None
) -> httpx.Response:
    body = {"error": {"message": message, "type": code, "code": code}}
    return httpx.Response(status, json=body, headers=headers)


class InlinePool:
    """A ComputePool that runs its work in this process (audio decoding in unit tests)."""

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(*args)


@dataclass
class Domain:
    """What app.build_core wires, built here from its parts."""

    sessions: SessionFactory
    writer: Writer  # the process's group-commit writer over `sessions`
    clock: ManualClock
    catalog: Catalog
    providers: ScriptedProviders
    http: httpx.AsyncClient
    metrics: Metrics
    admin: Admin
    dialect: str
    leases: BudgetLeases | None = None  # as build_core wires them (server/limits/leases.py)
    # Leased charges committing after their answers (server/billing/settlements.py).
    settlements: Settlements = field(default_factory=Settlements)
    # False: every charge commits before its answer, as a request that is not leased does.
    charges_beside_answers: bool = True

    @property
    def limits(self) -> EnforcedLimits:
        return EnforcedLimits(self.metrics)

    def transcriber(self) -> Transcriber:
        adapters = {"openai": OpenAISttAdapter(self.http)}
        decoder: ComputePool = InlinePool()  # type: ignore[assignment]
        return Transcriber(
            self.catalog,
            adapters,
            self.clock,
            self.limits,
            self.metrics,
            NoOpTracer(),
            decoder,
            writer=self.writer,
            leases=self.leases,
            settlements=self.settlements if self.charges_beside_answers else None,
        )

    def video_adapters(self) -> dict[str, OpenAIVideoAdapter]:
        return {"openai": OpenAIVideoAdapter(self.http)}

    async def principal(self, issued: IssuedKey) -> Principal:
        async with self.sessions() as session:
            return await Authenticator(self.clock).authenticate(session, issued.metadata)

    async def funded_key(self, name: str, usd: str = "10", **key: Any) -> IssuedKey:
        workspace = await self.admin.workspace(name)
        if usd != "0":
            await self.admin.credits(workspace, usd)
        return await self.admin.key(workspace, **key)

    async def transcribe(self, issued: IssuedKey, model: str = "unit/ok") -> TranscriptionResult:
        """One transcription of the `hello` fixture by `issued`, as the audio service runs it;
        returned once its charge has committed, as a reader of its account then sees it."""
        async with self.sessions() as session:
            principal = await self.principal(issued)
            result = await self.transcriber().transcribe(session, principal, stt_input(model))
        await self.settlements.settled(principal.account.id)
        return result

    async def drain_leases(self) -> None:
        """Give back this process's budget leases that no request runs on, as an idle lease
        is a second later: after it, a credit hold left over is a request's that never
        ended (a lease with a request still running on it stays too)."""
        if self.leases is not None:
            await self.leases.drain()

    async def rows(self, table: type[SQLModel], *where: Any) -> list[Any]:
        async with self.sessions() as session:
            return list((await session.exec(select(table).where(*where))).all())

    async def count(self, table: type[SQLModel], *where: Any) -> int:
        return await self.admin.count(table, *where)

    async def charges(self, account_id: str) -> list[int]:
        """The account's ledger charges, in micros."""
        rows = await self.rows(
            LedgerEntry, LedgerEntry.account_id == account_id, LedgerEntry.kind == "charge"
        )
        return [row.amount_micros for row in rows]

    async def counted_spend(self, subject_id: str, period: str = "all") -> int:
        rows = await self.rows(
            UsageCounter, UsageCounter.subject_id == subject_id, UsageCounter.period == period
        )
        return sum(row.spend_micros for row in rows)


def stt_input(model: str) -> TranscriptionInput:
    """A parsed transcription request of the `hello` fixture (a WAV) for `model`."""
    return TranscriptionInput(
        model=model,
        audio=fixture("hello"),
        claimed_format="wav",
        filename="hello.wav",
        audio_param="file",
    )


def video_input(model: Model) -> VideoInput:
    """A parsed video request for `model`: a 2 s, 854x480 lighthouse, no callback."""
    return VideoInput(
        model=model,
        params={"prompt": "a lighthouse", "duration": 2, "width": 854, "height": 480},
        duration=2,
        callback_url=None,
        session_id=None,
        user=None,
        trace=None,
    )


def unit_catalog(folder: Path) -> Catalog:
    return load_catalog(write_unit_catalog(folder))


def start_clock() -> ManualClock:
    """A ManualClock at the current second (webhook signatures are checked against real time)."""
    return ManualClock(datetime.now().astimezone().replace(microsecond=0))
