"""Provider cooldowns: a provider that said "retry after N s" is skipped for N s; when every
endpoint is cooling down the request is 503 with Retry-After, without calling anyone."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from server.clock import ManualClock
from server.db.models import VideoJob
from server.errors import GatewayError
from server.observability.metrics import Metrics
from server.providers.endpoint import Endpoint
from server.providers.failures import (
    OVERLOADED,
    RATE_LIMITED,
    SERVER_ERROR,
    ProviderFailure,
)
from server.routing.cooldowns import MAX_COOLDOWN_SECONDS, Cooldowns
from server.routing.fallback import route
from server.videos import jobs
from server.videos.content import LocalContentStore
from server.workers.video_worker import VideoWorker
from testkit.domain import Domain, video_input

FIRST = Endpoint(provider="first", adapter="openai", base_url="https://first.example/v1")
SECOND = Endpoint(provider="second", adapter="openai", base_url="https://second.example/v1")


@pytest.fixture
def clock() -> ManualClock:  # overrides tests/unit/conftest.py's: a fixed instant suffices
    return ManualClock(datetime(2026, 11, 23, 12, 0, tzinfo=UTC))


def limited(seconds: int | None, kind: str = RATE_LIMITED) -> ProviderFailure:
    return ProviderFailure(kind, "Provider said wait", status=429, retry_after=seconds)


class Providers:
    """Answers per provider slug: a failure to raise, or the provider's name."""

    def __init__(self, failures: dict[str, ProviderFailure]) -> None:
        self.failures = failures
        self.calls: list[str] = []

    async def __call__(self, endpoint: Endpoint) -> str:
        self.calls.append(endpoint.provider)
        failure = self.failures.get(endpoint.provider)
        if failure is not None:
            raise failure
        return endpoint.provider


def test_a_hint_cools_the_endpoint_until_it_passes(clock: ManualClock) -> None:
    cooldowns = Cooldowns(clock)
    cooldowns.note(FIRST, limited(30))
    assert cooldowns.remaining(FIRST) == 30
    assert cooldowns.remaining(SECOND) is None
    clock.advance(timedelta(seconds=29))
    assert cooldowns.remaining(FIRST) == 1
    clock.advance(timedelta(seconds=1))
    assert cooldowns.remaining(FIRST) is None


def test_only_a_wait_with_a_hint_cools(clock: ManualClock) -> None:
    cooldowns = Cooldowns(clock)
    cooldowns.note(FIRST, limited(None))  # no hint: nothing to go by
    cooldowns.note(FIRST, ProviderFailure(SERVER_ERROR, "boom", status=500, retry_after=60))
    assert cooldowns.remaining(FIRST) is None
    cooldowns.note(FIRST, limited(20, OVERLOADED))
    assert cooldowns.remaining(FIRST) == 20


def test_a_hint_is_capped(clock: ManualClock) -> None:
    cooldowns = Cooldowns(clock)
    cooldowns.note(FIRST, limited(86_400))
    assert cooldowns.remaining(FIRST) == MAX_COOLDOWN_SECONDS


def test_a_workspace_key_and_the_operator_key_cool_apart(
    clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FIRST_KEY", "operator-key")
    operator = dataclasses.replace(FIRST, api_key_env="FIRST_KEY")
    workspace = dataclasses.replace(operator, byok_credential="workspace-key")
    cooldowns = Cooldowns(clock)
    cooldowns.note(workspace, limited(30))
    assert cooldowns.remaining(workspace) == 30
    assert cooldowns.remaining(operator) is None


async def test_routing_skips_a_cooling_provider_then_refuses_when_all_cool(
    clock: ManualClock,
) -> None:
    cooldowns = Cooldowns(clock)
    providers = Providers({"first": limited(30)})
    routed = await route("m", [FIRST, SECOND], providers, Metrics(), "transcription", cooldowns)
    assert routed.value == "second" and providers.calls == ["first", "second"]

    providers.calls.clear()
    routed = await route("m", [FIRST, SECOND], providers, Metrics(), "transcription", cooldowns)
    assert routed.value == "second" and providers.calls == ["second"]  # first not called

    providers.failures["second"] = limited(10)
    with pytest.raises(GatewayError) as rate_limited:  # both said wait, as they answered
        await route("m", [FIRST, SECOND], providers, Metrics(), "transcription", cooldowns)
    assert rate_limited.value.status == 429

    providers.calls.clear()
    with pytest.raises(GatewayError) as refused:
        await route("m", [FIRST, SECOND], providers, Metrics(), "transcription", cooldowns)
    assert providers.calls == []  # nobody is called while all are cooling down
    assert refused.value.status == 503
    assert refused.value.retry_after_seconds == 10  # the earliest of the two
    assert "No available provider" in refused.value.message

    clock.advance(timedelta(seconds=10))
    providers.failures.clear()
    routed = await route("m", [FIRST, SECOND], providers, Metrics(), "transcription", cooldowns)
    assert routed.value == "second" and providers.calls == ["second"]


async def test_a_video_job_waits_for_its_cooling_provider_instead_of_failing(
    domain: Domain, tmp_path: Path
) -> None:
    cooldowns = Cooldowns(domain.clock)
    worker = VideoWorker(
        domain.sessions,
        domain.clock,
        domain.catalog,
        domain.video_adapters(),
        LocalContentStore(tmp_path / "content"),
        cooldowns=cooldowns,
    )
    model = domain.catalog.get("unitvideo/ok")
    assert model is not None
    cooldowns.note(model.endpoints[0], limited(30))
    issued = await domain.funded_key("video-cooling")
    video = video_input(model)
    async with domain.sessions() as session:
        job = await jobs.submit_job(
            session, await domain.principal(issued), video, domain.clock.now(), None, domain.limits
        )

    claimed = await worker.claim()
    assert claimed is not None
    await worker.step(claimed)
    (waiting,) = await domain.rows(VideoJob, VideoJob.id == job.id)
    assert waiting.status != jobs.FAILED and waiting.provider_job_id is None
    assert domain.providers.sent_to("video.test") == []  # the provider was not called
    assert await worker.claim() is None  # not due before the provider's hint has passed

    domain.clock.advance(timedelta(seconds=30))
    claimed = await worker.claim()
    assert claimed is not None and claimed.id == job.id
    await worker.step(claimed)
    (submitted,) = await domain.rows(VideoJob, VideoJob.id == job.id)
    assert submitted.provider_job_id is not None
