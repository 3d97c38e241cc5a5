"""BYOK in-process: keys sealed at rest, the order a request tries them around the operator's
endpoints, "always use", and the accounting (BYOK counters, the key's limit, the platform
fee and the free BYOK requests of a month)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from opentelemetry.trace import NoOpTracer

from server.auth import Authenticator
from server.billing.usage import KEY, read_usage
from server.byok import keys as store
from server.byok.fees import ByokFees
from server.byok.routing import ByokRouting, UsableKey, billing_plan, plan
from server.compute import ComputePool
from server.db.models import ApiKey, ByokKey, CreditHold, Generation, VideoJob
from server.errors import GatewayError
from server.limits.key_status import limit_remaining
from server.providers.endpoint import Endpoint
from server.providers.openai_stt import OpenAISttAdapter
from server.routing.catalog import Catalog, Model
from server.transcription.request import TranscriptionInput
from server.transcription.transcriber import Transcriber, TranscriptionResult
from server.vault.crypto import MasterKey
from server.videos import jobs
from server.videos.content import LocalContentStore
from server.workers.video_worker import VideoWorker
from testkit.admin import IssuedKey
from testkit.audio import fixture
from testkit.domain import PROVIDER_KEY, Domain, InlinePool, video_input

BYOK_KEY = "sk-workspace-own-key-0123456789abcd"
OTHER_BYOK_KEY = "sk-workspace-second-key-9876543210wxyz"
MASTER = MasterKey(b"\x01" * 32)


@dataclass
class Providers:
    """OpenAI-compatible providers by host: stt-ok.test answers whichever key it is given
    (and records it); stt-429.test rate-limits; a key listed in `refused` gets a 401."""

    keys_used: list[tuple[str, str]] = field(default_factory=list)
    refused: set[str] = field(default_factory=set)

    def handle(self, request: httpx.Request) -> httpx.Response:
        key = request.headers.get("authorization", "").removeprefix("Bearer ")
        self.keys_used.append((request.url.host, key))
        if key in self.refused:
            return httpx.Response(401, json={"error": {"message": "bad key"}})
        if request.url.host == "stt-429.test":
            return httpx.Response(429, json={"error": {"message": "slow down"}})
        return httpx.Response(200, json={"text": "own key transcript"})


def _transcriber(domain: Domain, providers: Providers, fees: ByokFees) -> Transcriber:
    http = httpx.AsyncClient(transport=httpx.MockTransport(providers.handle))
    decoder: ComputePool = InlinePool()  # type: ignore[assignment]
    return Transcriber(
        domain.catalog,
        {"openai": OpenAISttAdapter(http)},
        domain.clock,
        domain.limits,
        domain.metrics,
        NoOpTracer(),
        decoder,
        byok=ByokRouting(MASTER, fees),
        writer=domain.writer,
    )


async def _add_key(
    domain: Domain, issued: IssuedKey, provider: str, key: str = BYOK_KEY, **flags: object
) -> ByokKey:
    async with domain.sessions() as session:
        row = await store.create_key(
            session,
            MASTER,
            domain.catalog,
            workspace_id=issued.workspace.id,
            provider=provider,
            key=key,
            changes=store.check_changes(domain.catalog, dict(flags)),
            now=domain.clock.now(),
        )
        await session.commit()
        return row


async def _transcribe(
    domain: Domain, transcriber: Transcriber, issued: IssuedKey, model: str = "unit/ok"
) -> TranscriptionResult:
    request = TranscriptionInput(
        model=model,
        audio=fixture("hello"),
        claimed_format="wav",
        filename="hello.wav",
        audio_param="file",
    )
    async with domain.sessions() as session:
        principal = await Authenticator(domain.clock).authenticate(session, issued.metadata)
        return await transcriber.transcribe(session, principal, request)


async def _byok_usage(domain: Domain, issued: IssuedKey) -> tuple[int, int]:
    """The key's all-time (spend, BYOK) counters."""
    async with domain.sessions() as session:
        usage = await read_usage(session, KEY, issued.hash, domain.clock.now())
    return usage.spend["all"], usage.byok["all"]


# --- storage --------------------------------------------------------------------------------


async def test_a_key_is_sealed_at_rest_shown_masked_and_opens_for_its_workspace(
    domain: Domain,
) -> None:
    issued = await domain.funded_key("byok-store")
    row = await _add_key(domain, issued, "alpha", name="mine")
    assert row.label == "...abcd"
    async with domain.sessions() as session:
        raw = (
            await session.exec(sa.text("SELECT ciphertext, nonce, label FROM byok_keys"))  # type: ignore[call-overload]
        ).one()
        listed, total = await store.list_keys(session, issued.workspace.id)
        opened = await ByokRouting(MASTER, ByokFees()).usable_keys(
            session, issued.workspace.id, domain.clock.now()
        )
    stored = b"".join(bytes(part) if isinstance(part, bytes) else part.encode() for part in raw)
    assert BYOK_KEY.encode() not in stored and b"workspace-own-key" not in stored
    assert [(k.id, k.label, k.name) for k in listed] == [(row.id, "...abcd", "mine")]
    assert total == 1
    assert [k.plaintext for k in opened] == [BYOK_KEY]
    assert BYOK_KEY not in repr(opened)


async def test_bad_keys_are_refused_without_echoing_them(domain: Domain) -> None:
    issued = await domain.funded_key("byok-bad")
    with pytest.raises(GatewayError) as refused:
        await _add_key(domain, issued, "alpha", key="has a space in it")
    assert refused.value.status == 400 and "space in it" not in refused.value.message
    with pytest.raises(GatewayError) as unknown:
        await _add_key(domain, issued, "no-such-provider")
    assert (unknown.value.metadata or {}).get("param") == "provider"
    with pytest.raises(GatewayError):
        await _add_key(domain, issued, "alpha", is_fallback=True, is_required=True)
    assert await domain.count(ByokKey) == 0


def test_an_endpoint_with_a_workspace_key_hides_it_from_repr() -> None:
    endpoint = Endpoint("alpha", "openai", "http://x.test", api_key_env="UNSET_ENV_VAR")
    assert not endpoint.available and not endpoint.is_byok
    own = replace(endpoint, byok_credential=BYOK_KEY)
    assert own.available and own.is_byok and own.credential() == BYOK_KEY
    assert BYOK_KEY not in repr(own)


# --- routing order --------------------------------------------------------------------------


def _usable(provider: str, key: str, order: int, **flags: object) -> UsableKey:
    row = ByokKey(
        id=f"byok_{key}",
        workspace_id="ws",
        provider=provider,
        label="",
        ciphertext=b"",
        nonce=b"",
        sort_order=order,
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        **flags,
    )
    return UsableKey(row, key)


def _route(endpoints: list[Endpoint], keys: list[UsableKey]) -> list[tuple[str, str | None]]:
    tried = plan(endpoints, keys, model_id="m/x", key_hash="h")
    return [(e.provider, e.byok_credential) for e in tried]


def test_prioritized_keys_then_the_operator_then_fallback_keys() -> None:
    alpha = Endpoint("alpha", "openai", "http://a.test", api_key_env="A")
    beta = Endpoint("beta", "openai", "http://b.test", api_key_env="B")
    keys = [
        _usable("alpha", "a1", 0),
        _usable("alpha", "a2", 1),
        _usable("alpha", "a-fallback", 2, is_fallback=True),
        _usable("beta", "b1", 0),
        _usable("beta", "b-other-model", 1, allowed_models=["m/other"]),
        _usable("beta", "b-other-key", 2, allowed_api_key_hashes=["someone-else"]),
    ]
    assert _route([alpha, beta], keys) == [
        ("alpha", "a1"),
        ("alpha", "a2"),
        ("beta", "b1"),
        ("alpha", None),
        ("beta", None),
        ("alpha", "a-fallback"),
    ]


def test_an_always_use_key_removes_the_operators_endpoints_of_its_provider() -> None:
    alpha = Endpoint("alpha", "openai", "http://a.test", api_key_env="A")
    beta = Endpoint("beta", "openai", "http://b.test", api_key_env="B")
    required = [_usable("alpha", "a1", 0, is_required=True)]
    assert _route([alpha, beta], required) == [("alpha", "a1"), ("beta", None)]
    # is_byok_only: for every model, even one outside the key's allowed_models
    only = [_usable("alpha", "a1", 0, is_byok_only=True, allowed_models=["m/other"])]
    assert _route([alpha, beta], only) == [("beta", None)]
    # a two-key provider takes the access key as credential, the secret key as secret
    kling = Endpoint("kling", "kling", "http://k.test", api_key_env="K", secret_key_env="S")
    pair = _usable("kling", '{"access_key": "ak-1", "secret_key": "sk-1"}', 0)
    (tried, _) = plan([kling], [pair], model_id="m/x", key_hash="h")
    assert (tried.credential(), tried.secret(), tried.is_byok) == ("ak-1", "sk-1", True)


# --- transcription with the workspace's keys ------------------------------------------------


async def test_a_request_served_by_a_byok_key_pays_the_fee_and_counts_as_byok(
    domain: Domain,
) -> None:
    issued = await domain.funded_key("byok-served")
    await _add_key(domain, issued, "alpha")
    providers = Providers()
    fees = ByokFees(percent=Decimal(5), free_requests_per_month=0)
    result = await _transcribe(domain, _transcriber(domain, providers, fees), issued)
    assert providers.keys_used == [("stt-ok.test", BYOK_KEY)]
    provider_cost = domain.catalog.models["unit/ok"].price_per_second * result.seconds
    cost = int(provider_cost * 1_000_000)
    assert result.is_byok and result.body()["usage"]["is_byok"] is True
    assert result.cost_micros == fees.fee(cost) > 0
    account = issued.workspace.account_id
    assert sorted(await domain.charges(account)) == sorted([fees.fee(cost), cost])
    assert await _byok_usage(domain, issued) == (fees.fee(cost), cost)
    assert await domain.count(CreditHold, CreditHold.account_id == account) == 0
    (generation,) = await domain.rows(Generation, Generation.account_id == account)
    assert (generation.is_byok, generation.cost_micros) == (True, fees.fee(cost))


async def test_a_failing_key_falls_back_to_the_operator_unless_always_use(
    domain: Domain,
) -> None:
    issued = await domain.funded_key("byok-fallback")
    row = await _add_key(domain, issued, "alpha")
    providers = Providers(refused={BYOK_KEY})
    transcriber = _transcriber(domain, providers, ByokFees())
    result = await _transcribe(domain, transcriber, issued)
    assert providers.keys_used == [("stt-ok.test", BYOK_KEY), ("stt-ok.test", PROVIDER_KEY)]
    assert not result.is_byok
    assert await _byok_usage(domain, issued) == (result.cost_micros, 0)

    async with domain.sessions() as session:
        stored = await session.get(ByokKey, row.id)
        assert stored is not None
        changes = store.check_changes(domain.catalog, {"is_required": True})
        await store.update_key(session, MASTER, domain.catalog, stored, changes, domain.clock.now())
        await session.commit()
    providers.keys_used.clear()
    with pytest.raises(GatewayError) as failed:
        await _transcribe(domain, transcriber, issued)
    assert providers.keys_used == [("stt-ok.test", BYOK_KEY)]  # never the operator's key
    assert failed.value.status == 502
    assert (failed.value.metadata or {}).get("provider_name") == "alpha"
    assert await domain.count(CreditHold) == 0


async def test_a_key_makes_a_provider_usable_without_the_operators_credential(
    domain: Domain, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("UNIT_PROVIDER_KEY")
    issued = await domain.funded_key("byok-only")
    providers = Providers()
    transcriber = _transcriber(domain, providers, ByokFees())
    with pytest.raises(GatewayError) as unusable:
        await _transcribe(domain, transcriber, issued)
    assert unusable.value.status == 503
    await _add_key(domain, issued, "alpha")
    result = await _transcribe(domain, transcriber, issued)
    assert result.is_byok and providers.keys_used == [("stt-ok.test", BYOK_KEY)]


# --- the platform fee and the free requests of a month --------------------------------------


def test_the_fee_is_a_percentage_of_the_provider_cost_rounded_half_even() -> None:
    fees = ByokFees(percent=Decimal(5), free_requests_per_month=2)
    assert fees.fee(1_000_000) == 50_000
    assert fees.fee(10) == 0  # 0.5 micro-dollars: half-even to 0
    assert fees.fee(30) == 2  # 1.5 -> 2
    assert ByokFees(percent=Decimal("2.5")).fee(123_457) == 3_086  # 3086.425
    assert [fees.charged(1_000_000, n) for n in (1, 2, 3)] == [0, 0, 50_000]


async def test_free_byok_requests_start_again_each_utc_month(any_domain: Domain) -> None:
    # Both backends: the month's count is each dialect's insert-or-increment.
    domain = any_domain
    domain.clock.set(datetime(2026, 1, 31, 23, 59, tzinfo=UTC))
    issued = await domain.funded_key("byok-month")
    await _add_key(domain, issued, "alpha")
    transcriber = _transcriber(
        domain, Providers(), ByokFees(percent=Decimal(10), free_requests_per_month=1)
    )
    first = await _transcribe(domain, transcriber, issued)
    second = await _transcribe(domain, transcriber, issued)
    domain.clock.advance(timedelta(minutes=2))  # February
    third = await _transcribe(domain, transcriber, issued)
    assert first.cost_micros == 0
    assert second.cost_micros > 0
    assert third.cost_micros == 0


# --- the key's limit ------------------------------------------------------------------------


@pytest.mark.parametrize("include", [True, False])
async def test_byok_usage_counts_into_the_keys_limit_only_when_included(
    domain: Domain, include: bool
) -> None:
    issued = await domain.funded_key(f"byok-limit-{include}")
    await domain.admin.update_key(issued, include_byok_in_limit=include, limit_micros=10_000_000)
    await _add_key(domain, issued, "alpha", is_required=True)
    transcriber = _transcriber(domain, Providers(), ByokFees(free_requests_per_month=0))
    result = await _transcribe(domain, transcriber, issued)
    async with domain.sessions() as session:
        key = await session.get(ApiKey, issued.hash)
        usage = await read_usage(session, KEY, issued.hash, domain.clock.now())
    assert key is not None
    cost = usage.byok["all"]
    assert cost > 0 and usage.spend["all"] == result.cost_micros
    used = result.cost_micros + (cost if include else 0)
    assert limit_remaining(key, usage) == 10_000_000 - used

    # A limit below the provider cost (but above the fee) refuses only when BYOK counts.
    await domain.admin.update_key(issued, limit_micros=used + cost - 1)
    if include:
        with pytest.raises(GatewayError) as refused:
            await _transcribe(domain, transcriber, issued)
        assert (refused.value.metadata or {}).get("limit_source") == "openrouter_key_limit"
    else:
        assert (await _transcribe(domain, transcriber, issued)).is_byok
    assert await domain.count(CreditHold) == 0


# --- a video job ----------------------------------------------------------------------------


async def test_a_video_job_submitted_and_polled_with_the_workspace_key(
    domain: Domain, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No operator credential: only the workspace's key (the one the scripted provider
    # accepts) can submit and poll.
    monkeypatch.delenv("UNIT_PROVIDER_KEY")
    issued = await domain.funded_key("byok-video")
    await _add_key(domain, issued, "vidco", key=PROVIDER_KEY)
    fees = ByokFees(percent=Decimal(5), free_requests_per_month=0)
    byok = ByokRouting(MASTER, fees)
    model = domain.catalog.models["unitvideo/ok"]
    video = video_input(model)
    principal = await domain.principal(issued)
    async with domain.sessions() as session:
        planned = await byok.endpoints(
            session,
            workspace_id=issued.workspace.id,
            key_hash=issued.hash,
            model_id=model.id,
            endpoints=model.endpoints,
            user=None,
            now=domain.clock.now(),
        )
        cost = jobs.estimate_micros(video)
        billing = billing_plan(planned, cost, fees)
        assert (billing.credit_hold, billing.byok_hold) == (fees.fee(cost), True)
        job = await jobs.submit_job(
            session, principal, video, domain.clock.now(), None, domain.limits, billing=billing
        )
    worker = VideoWorker(
        domain.sessions,
        domain.clock,
        domain.catalog,
        domain.video_adapters(),
        LocalContentStore(tmp_path / "content"),
        byok=byok,
    )
    for _ in range(3):  # submit, then poll until the provider says completed
        claimed = await worker.claim()
        assert claimed is not None
        await worker.step(claimed)
        domain.clock.advance(timedelta(seconds=30))
    (done,) = await domain.rows(VideoJob, VideoJob.id == job.id)
    assert (done.status, done.is_byok, done.cost_micros) == ("completed", True, fees.fee(cost))
    sent = domain.providers.sent_to("video.test")  # submitted and polled with the key
    assert [r.method for r in sent] == ["POST", "GET", "GET", "GET"]
    assert {r.headers["authorization"] for r in sent} == {f"Bearer {PROVIDER_KEY}"}
    assert sorted(await domain.charges(issued.workspace.account_id)) == [fees.fee(cost), cost]
    assert await _byok_usage(domain, issued) == (fees.fee(cost), cost)
    assert await domain.count(CreditHold) == 0
    (generation,) = await domain.rows(Generation, Generation.id == done.generation_id)
    assert (generation.is_byok, generation.cost_micros) == (True, fees.fee(cost))


def test_a_two_key_provider_takes_its_key_as_json() -> None:
    kling = Endpoint("kling", "kling", "http://k.test", api_key_env="K", secret_key_env="S")
    catalog = Catalog({"kling/v": Model("kling/v", "v", "video", Decimal(1), (kling,))})
    with pytest.raises(GatewayError) as plain:
        store.parse_key(catalog, "kling", "just-one-access-key-0000")
    assert (plain.value.metadata or {}).get("param") == "key"
    assert "just-one" not in plain.value.message
    pair = store.parse_key(
        catalog, "kling", '{"access_key": "ak-0123456789abcdef", "secret_key": "sk-secret"}'
    )
    assert (pair.credential, pair.secret) == ("ak-0123456789abcdef", "sk-secret")
    assert store.mask(pair) == "...cdef" and "sk-secret" not in repr(pair)
