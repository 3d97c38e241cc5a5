"""The speech-to-text adapters (deepgram, elevenlabs, assemblyai, azure-openai) against fakes
written from each provider's documentation (tests/fakes/), in-process over
httpx.MockTransport: the request each sends, the verbose_json mapping, and how each
provider's failures become the routing rules' failure kinds."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from opentelemetry.trace import NoOpTracer

from server.compute import ComputePool
from server.providers.assemblyai_stt import AssemblyAISttAdapter
from server.providers.azure_openai_stt import DEFAULT_API_VERSION, AzureOpenAISttAdapter
from server.providers.deepgram_stt import DeepgramSttAdapter
from server.providers.elevenlabs_stt import ElevenLabsSttAdapter
from server.providers.endpoint import Endpoint
from server.providers.failures import (
    CLIENT_ERROR,
    INVALID_RESPONSE,
    RATE_LIMITED,
    REJECTED_CREDENTIALS,
    SERVER_ERROR,
    TIMEOUT,
    ProviderFailure,
)
from server.providers.http import retry_hint
from server.providers.openai_stt import OpenAISttAdapter
from server.providers.stt import SttCall, Word, segments_from_words
from server.routing.catalog import load_catalog
from server.transcription.request import TranscriptionInput
from server.transcription.transcriber import Transcriber
from testkit.audio import fixture
from testkit.domain import Domain, InlinePool
from testkit.fakes import openai_stt
from tests.fakes import assemblyai, azure_openai, deepgram, elevenlabs

HELLO_SECONDS = Decimal("1.075125")  # testkit/fixtures/hello.wav, as the gateway decodes it
KEY_ENV = "UNIT_STT_VENDOR_KEY"
Handler = Callable[[httpx.Request], httpx.Response]


def _call(model: str, **changes: object) -> SttCall:
    call = SttCall(audio=fixture("hello"), format="wav", filename="hello.wav", model=model)
    return replace(call, **changes)  # type: ignore[arg-type]


def _endpoint(adapter: str, base_url: str, **changes: object) -> Endpoint:
    endpoint = Endpoint(provider=adapter, adapter=adapter, base_url=base_url, api_key_env=KEY_ENV)
    return replace(endpoint, **changes)  # type: ignore[arg-type]


@pytest_asyncio.fixture
async def mock_http() -> AsyncIterator[Callable[[Handler], httpx.AsyncClient]]:
    clients: list[httpx.AsyncClient] = []

    def client(handle: Handler) -> httpx.AsyncClient:
        clients.append(httpx.AsyncClient(transport=httpx.MockTransport(handle)))
        return clients[-1]

    yield client
    for opened in clients:
        await opened.aclose()


def _timeout(request: httpx.Request) -> httpx.Response:
    raise httpx.ReadTimeout("no answer", request=request)


# --- Deepgram -----------------------------------------------------------------------------


async def test_deepgram_sends_raw_audio_with_token_auth_and_maps_utterances(
    monkeypatch: pytest.MonkeyPatch, mock_http: Callable[[Handler], httpx.AsyncClient]
) -> None:
    monkeypatch.setenv(KEY_ENV, deepgram.API_KEY)
    fake = deepgram.FakeDeepgram()
    adapter = DeepgramSttAdapter(mock_http(fake.handle))
    options = {"keyterm": ["Acme", "Zorp"], "diarize": True, "model": "evil", "callback": "x"}
    call = _call("nova-3", verbose=True, options=options)
    transcript = await adapter.transcribe(_endpoint("deepgram", "http://dg.test"), call)

    (sent,) = fake.requests
    assert sent.url.path == "/v1/listen"
    assert sent.headers["authorization"] == f"Token {deepgram.API_KEY}"
    assert sent.headers["content-type"] == "audio/wav"
    assert sent.content == fixture("hello")
    assert sent.url.params.get_list("keyterm") == ["Acme", "Zorp"]
    assert sent.url.params["diarize"] == "true"
    assert sent.url.params.get_list("model") == ["nova-3"]  # options cannot replace it
    assert "callback" not in sent.url.params  # the answer must come back on this request
    assert sent.url.params["detect_language"] == "true"
    assert sent.url.params["utterances"] == "true"
    assert sent.url.params["smart_format"] == "true"

    assert transcript.text == "Hello, world."
    assert transcript.language == "en"  # detected
    assert [(w.word, w.start, w.end) for w in transcript.words] == [
        ("Hello,", 0.08, 0.48),
        ("world.", 0.56, 1.02),
    ]
    assert transcript.words[0].extra["confidence"] == 0.99
    (segment,) = transcript.segments
    assert (segment.id, segment.start, segment.end, segment.text) == (
        0,
        0.08,
        1.02,
        "Hello, world.",
    )
    assert transcript.duration is None  # metadata.duration is never taken


async def test_deepgram_plain_json_names_the_language_and_asks_no_utterances(
    monkeypatch: pytest.MonkeyPatch, mock_http: Callable[[Handler], httpx.AsyncClient]
) -> None:
    monkeypatch.setenv(KEY_ENV, deepgram.API_KEY)
    fake = deepgram.FakeDeepgram()
    adapter = DeepgramSttAdapter(mock_http(fake.handle))
    call = _call("nova-3", language="de", options={"smart_format": False})
    transcript = await adapter.transcribe(_endpoint("deepgram", "http://dg.test"), call)
    params = fake.requests[0].url.params
    assert (params["language"], params["smart_format"]) == ("de", "false")
    assert "detect_language" not in params and "utterances" not in params
    assert transcript.text == "hello world"  # no smart formatting: plain words
    assert (transcript.language, transcript.words, transcript.segments) == ("de", [], [])


# --- ElevenLabs ---------------------------------------------------------------------------


async def test_elevenlabs_sends_multipart_with_xi_api_key_and_builds_segments(
    monkeypatch: pytest.MonkeyPatch, mock_http: Callable[[Handler], httpx.AsyncClient]
) -> None:
    monkeypatch.setenv(KEY_ENV, elevenlabs.API_KEY)
    fake = elevenlabs.FakeElevenLabs()
    adapter = ElevenLabsSttAdapter(mock_http(fake.handle))
    options = {"diarize": True, "num_speakers": 2, "model_id": "evil", "webhook": True}
    call = _call("scribe_v2", verbose=True, language="en", temperature=0.2, options=options)
    transcript = await adapter.transcribe(_endpoint("elevenlabs", "http://el.test"), call)

    (sent,) = fake.requests
    assert sent.url.path == "/v1/speech-to-text"
    assert sent.headers["xi-api-key"] == elevenlabs.API_KEY
    assert "authorization" not in sent.headers
    (fields,) = fake.forms
    assert fields == {
        "model_id": ["scribe_v2"],
        "timestamps_granularity": ["word"],
        "language_code": ["en"],
        "temperature": ["0.2"],
        "diarize": ["true"],
        "num_speakers": ["2"],
    }
    assert transcript.text == "Hello, world. (laughs) Bye."
    assert transcript.language == "en"
    # Words are the entries of type "word" (no spacing, no audio event).
    assert [(w.word, w.start, w.end) for w in transcript.words] == [
        ("Hello,", 0.1, 0.45),
        ("world.", 0.5, 0.9),
        ("Bye.", 1.3, 1.6),
    ]
    assert transcript.words[0].extra == {"speaker_id": "speaker_0"}
    # Segments end after a sentence's last word.
    assert [(s.id, s.start, s.end, s.text) for s in transcript.segments] == [
        (0, 0.1, 0.9, "Hello, world."),
        (1, 1.3, 1.6, "Bye."),
    ]


async def test_elevenlabs_plain_json_asks_no_timestamps(
    monkeypatch: pytest.MonkeyPatch, mock_http: Callable[[Handler], httpx.AsyncClient]
) -> None:
    monkeypatch.setenv(KEY_ENV, elevenlabs.API_KEY)
    fake = elevenlabs.FakeElevenLabs()
    adapter = ElevenLabsSttAdapter(mock_http(fake.handle))
    transcript = await adapter.transcribe(
        _endpoint("elevenlabs", "http://el.test"), _call("scribe_v2")
    )
    assert fake.forms[0]["timestamps_granularity"] == ["none"]
    assert "language_code" not in fake.forms[0]
    assert (transcript.language, transcript.words, transcript.segments) == ("eng", [], [])


def test_segments_from_words_split_at_sentence_ends_and_pauses() -> None:
    words = [
        Word("one", 0.0, 0.3),
        Word("two", 0.4, 0.6),
        Word("three", 1.7, 2.0),  # after a pause of 1.1 s
        Word("four.", 2.1, 2.4),
        Word("five", 2.5, 2.8),
    ]
    assert [(s.start, s.end, s.text) for s in segments_from_words(words)] == [
        (0.0, 0.6, "one two"),
        (1.7, 2.4, "three four."),
        (2.5, 2.8, "five"),
    ]
    assert segments_from_words([]) == []


# --- AssemblyAI ---------------------------------------------------------------------------


class RecordedSleeps:
    """asyncio.sleep for the adapter: records each pause and advances a fake monotonic."""

    def __init__(self) -> None:
        self.pauses: list[float] = []
        self.now = 1000.0

    async def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds

    def monotonic(self) -> float:
        return self.now


async def test_assemblyai_uploads_submits_and_polls_until_completed(
    monkeypatch: pytest.MonkeyPatch, mock_http: Callable[[Handler], httpx.AsyncClient]
) -> None:
    monkeypatch.setenv(KEY_ENV, assemblyai.API_KEY)
    fake = assemblyai.FakeAssemblyAI()
    clock = RecordedSleeps()
    adapter = AssemblyAISttAdapter(mock_http(fake.handle), clock.sleep, clock.monotonic)
    options = {"speaker_labels": True, "audio_url": "https://evil.test/a.wav", "webhook_url": "x"}
    call = _call("polls-3", verbose=True, options=options)
    transcript = await adapter.transcribe(_endpoint("assemblyai", "http://aai.test"), call)

    upload, submit, *looks, sentences = fake.requests
    assert all(r.headers["authorization"] == assemblyai.API_KEY for r in fake.requests)
    assert (upload.method, upload.url.path, upload.content) == ("POST", "/v2/upload", fixture())
    assert (submit.method, submit.url.path) == ("POST", "/v2/transcript")
    assert json.loads(submit.content) == {
        "audio_url": "https://cdn.assemblyai.test/upload/00000001",
        "speech_models": ["polls-3"],
        "language_detection": True,
        "speaker_labels": True,
    }
    # The first look at once, then growing pauses: three "processing" answers, then done.
    assert [r.url.path for r in looks] == ["/v2/transcript/tr_000002"] * 4
    assert clock.pauses == [0.5, 1.0, 2.0]
    assert sentences.url.path == "/v2/transcript/tr_000002/sentences"

    assert transcript.text == "Hello, world."
    assert transcript.language == "en_us"
    assert [(w.word, w.start, w.end) for w in transcript.words] == [
        ("Hello,", 0.08, 0.48),
        ("world.", 0.56, 1.02),
    ]
    assert transcript.words[0].extra == {"confidence": 0.99, "speaker": None}
    (segment,) = transcript.segments
    assert (segment.start, segment.end, segment.text) == (0.08, 1.02, "Hello, world.")
    assert segment.extra == {"confidence": 0.98, "speaker": None}


async def test_assemblyai_plain_json_names_the_language_and_fetches_no_sentences(
    monkeypatch: pytest.MonkeyPatch, mock_http: Callable[[Handler], httpx.AsyncClient]
) -> None:
    monkeypatch.setenv(KEY_ENV, assemblyai.API_KEY)
    fake = assemblyai.FakeAssemblyAI()
    clock = RecordedSleeps()
    adapter = AssemblyAISttAdapter(mock_http(fake.handle), clock.sleep, clock.monotonic)
    call = _call("universal", language="fr")
    transcript = await adapter.transcribe(_endpoint("assemblyai", "http://aai.test"), call)
    assert json.loads(fake.requests[1].content)["language_code"] == "fr"
    assert "language_detection" not in json.loads(fake.requests[1].content)
    assert len(fake.requests) == 3 and clock.pauses == []  # completed at the first look
    assert (transcript.text, transcript.language, transcript.segments) == (
        "Hello, world.",
        "fr",
        [],
    )


async def test_assemblyai_gives_up_within_the_endpoint_timeout(
    monkeypatch: pytest.MonkeyPatch, mock_http: Callable[[Handler], httpx.AsyncClient]
) -> None:
    monkeypatch.setenv(KEY_ENV, assemblyai.API_KEY)
    fake = assemblyai.FakeAssemblyAI()
    clock = RecordedSleeps()
    adapter = AssemblyAISttAdapter(mock_http(fake.handle), clock.sleep, clock.monotonic)
    endpoint = _endpoint("assemblyai", "http://aai.test", timeout_seconds=10.0)
    with pytest.raises(ProviderFailure) as failure:
        await adapter.transcribe(endpoint, _call("polls-1000"))
    assert failure.value.kind == TIMEOUT
    assert sum(clock.pauses) < 10.0  # never sleeps past the bound
    assert clock.pauses == [0.5, 1.0, 2.0, 3.0, 3.0]  # 9.5 s; one more would pass 10


async def test_assemblyai_transcript_error_is_a_provider_failure(
    monkeypatch: pytest.MonkeyPatch, mock_http: Callable[[Handler], httpx.AsyncClient]
) -> None:
    monkeypatch.setenv(KEY_ENV, assemblyai.API_KEY)
    fake = assemblyai.FakeAssemblyAI()
    clock = RecordedSleeps()
    adapter = AssemblyAISttAdapter(mock_http(fake.handle), clock.sleep, clock.monotonic)
    with pytest.raises(ProviderFailure) as failure:
        await adapter.transcribe(_endpoint("assemblyai", "http://aai.test"), _call("fails"))
    assert failure.value.kind == SERVER_ERROR  # routing tries the next endpoint
    assert "Download error" in failure.value.message


# --- Azure OpenAI -------------------------------------------------------------------------


async def test_azure_openai_names_deployment_and_api_version_with_api_key(
    monkeypatch: pytest.MonkeyPatch, mock_http: Callable[[Handler], httpx.AsyncClient]
) -> None:
    monkeypatch.setenv(KEY_ENV, azure_openai.API_KEY)
    fake = azure_openai.FakeAzureOpenAI()
    adapter = AzureOpenAISttAdapter(mock_http(fake.handle))
    call = _call(
        "whisper",
        verbose=True,
        language="en",
        prompt="greetings",
        timestamp_granularities=("word", "segment"),
        options={"response_format": "srt", "seed": 3},
    )
    transcript = await adapter.transcribe(_endpoint("azure-openai", "https://res.test"), call)
    (sent,) = fake.requests
    assert sent.url.path == "/openai/deployments/whisper/audio/transcriptions"
    assert sent.url.params["api-version"] == DEFAULT_API_VERSION
    assert sent.headers["api-key"] == azure_openai.API_KEY
    assert "authorization" not in sent.headers
    (fields,) = fake.forms
    assert fields["response_format"] == ["verbose_json"]  # options cannot replace it
    assert fields["timestamp_granularities[]"] == ["word", "segment"]
    assert (fields["prompt"], fields["language"], fields["seed"]) == (["greetings"], ["en"], ["3"])
    assert transcript.text == "Hello, world."
    assert transcript.language == "english"
    assert [w.word for w in transcript.words] == ["Hello", "world"]
    assert transcript.segments[0].text == " Hello, world."
    assert transcript.segments[0].extra["avg_logprob"] == -0.3


async def test_azure_openai_uses_the_catalogs_api_version(
    monkeypatch: pytest.MonkeyPatch, mock_http: Callable[[Handler], httpx.AsyncClient]
) -> None:
    monkeypatch.setenv(KEY_ENV, azure_openai.API_KEY)
    fake = azure_openai.FakeAzureOpenAI()
    adapter = AzureOpenAISttAdapter(mock_http(fake.handle))
    endpoint = _endpoint("azure-openai", "https://res.test", api_version="2024-06-01")
    transcript = await adapter.transcribe(endpoint, _call("whisper"))
    assert fake.requests[0].url.params["api-version"] == "2024-06-01"
    assert transcript.text == "Hello, world." and transcript.words == []


# --- failures -----------------------------------------------------------------------------

ADAPTERS = {
    "deepgram": (DeepgramSttAdapter, deepgram.FakeDeepgram, "nova-3"),
    "elevenlabs": (ElevenLabsSttAdapter, elevenlabs.FakeElevenLabs, "scribe_v2"),
    "assemblyai": (AssemblyAISttAdapter, assemblyai.FakeAssemblyAI, "universal"),
    "azure-openai": (AzureOpenAISttAdapter, azure_openai.FakeAzureOpenAI, "whisper"),
}
# (adapter, model, expected kind, status, provider_code, retry_after)
FAILURES = [
    ("deepgram", "nova-3", REJECTED_CREDENTIALS, 401, "INVALID_AUTH", None),
    ("deepgram", "ratelimit", RATE_LIMITED, 429, "TOO_MANY_REQUESTS", None),
    ("deepgram", "error-503", SERVER_ERROR, 503, "INTERNAL_SERVER_ERROR", None),
    ("deepgram", "garbage", INVALID_RESPONSE, None, None, None),
    ("elevenlabs", "scribe_v2", REJECTED_CREDENTIALS, 401, "invalid_api_key", None),
    ("elevenlabs", "ratelimit", RATE_LIMITED, 429, "rate_limit_exceeded", None),
    ("elevenlabs", "concurrency", RATE_LIMITED, 429, "concurrent_limit_exceeded", None),
    ("elevenlabs", "error-500", SERVER_ERROR, 500, "internal_error", None),
    ("elevenlabs", "garbage", INVALID_RESPONSE, None, None, None),
    ("assemblyai", "universal", REJECTED_CREDENTIALS, 401, 401, None),
    ("assemblyai", "ratelimit-9", RATE_LIMITED, 429, 429, 9),
    ("assemblyai", "error-502", SERVER_ERROR, 502, 502, None),
    ("azure-openai", "whisper", REJECTED_CREDENTIALS, 401, "401", None),
    ("azure-openai", "ratelimit-6", RATE_LIMITED, 429, "429", 6),
    ("azure-openai", "error-500", SERVER_ERROR, 500, "InternalServerError", None),
]


@pytest.mark.parametrize(("adapter", "model", "kind", "status", "code", "retry"), FAILURES)
async def test_provider_failures_become_routing_failure_kinds(
    monkeypatch: pytest.MonkeyPatch,
    mock_http: Callable[[Handler], httpx.AsyncClient],
    adapter: str,
    model: str,
    kind: str,
    status: int | None,
    code: str | int | None,
    retry: int | None,
) -> None:
    build, fake_of, _ = ADAPTERS[adapter]
    fake = fake_of()
    # The credential scripts are the rejected ones: a wrong key.
    monkeypatch.setenv(KEY_ENV, "wrong" if kind == REJECTED_CREDENTIALS else fake_key(adapter))
    instance = build(mock_http(fake.handle))
    with pytest.raises(ProviderFailure) as failure:
        await instance.transcribe(_endpoint(adapter, "http://p.test"), _call(model))
    assert failure.value.kind == kind
    if kind != INVALID_RESPONSE:
        assert failure.value.status == status
        assert failure.value.provider_code == code
    assert failure.value.retry_after == retry
    assert "wrong" not in failure.value.message and fake_key(adapter) not in failure.value.message


def fake_key(adapter: str) -> str:
    modules = {
        "deepgram": deepgram,
        "elevenlabs": elevenlabs,
        "assemblyai": assemblyai,
        "azure-openai": azure_openai,
    }
    return str(modules[adapter].API_KEY)  # type: ignore[attr-defined]


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
async def test_a_provider_timeout_is_a_timeout_failure(
    monkeypatch: pytest.MonkeyPatch, mock_http: Callable[[Handler], httpx.AsyncClient], adapter: str
) -> None:
    monkeypatch.setenv(KEY_ENV, fake_key(adapter))
    build, _, model = ADAPTERS[adapter]
    with pytest.raises(ProviderFailure) as failure:
        await build(mock_http(_timeout)).transcribe(
            _endpoint(adapter, "http://p.test"), _call(model)
        )
    assert failure.value.kind == TIMEOUT


# --- through the Transcriber --------------------------------------------------------------


async def test_usage_seconds_come_from_the_decoded_audio_not_the_providers_claim(
    domain: Domain,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    mock_http: Callable[[Handler], httpx.AsyncClient],
) -> None:
    monkeypatch.setenv(KEY_ENV, deepgram.API_KEY)
    catalog_file = tmp_path / "vendors.toml"
    catalog_file.write_text(
        f"""
[[models]]
id = "deepgram/nova-3"
kind = "stt"
price_per_second = "0.01"
verbose_json = true
[[models.endpoints]]
provider = "deepgram"
adapter = "deepgram"
base_url = "http://dg.test"
api_key_env = "{KEY_ENV}"
"""
    )
    fake = deepgram.FakeDeepgram()
    decoder: ComputePool = InlinePool()  # type: ignore[assignment]
    transcriber = Transcriber(
        load_catalog(catalog_file),
        {"deepgram": DeepgramSttAdapter(mock_http(fake.handle))},
        domain.clock,
        domain.limits,
        domain.metrics,
        NoOpTracer(),
        decoder,
        writer=domain.writer,
    )
    issued = await domain.funded_key("stt-vendor")
    request = TranscriptionInput(
        model="deepgram/nova-3",
        audio=fixture("hello"),
        claimed_format="wav",
        filename="hello.wav",
        audio_param="file",
        response_format="verbose_json",
    )
    async with domain.sessions() as session:
        principal = await domain.principal(issued)
        result = await transcriber.transcribe(session, principal, request)
    assert fake.requests[0].url.params["model"] == "nova-3"  # the id's part after the slash
    assert result.seconds == HELLO_SECONDS  # Deepgram claimed 99.5 s
    assert result.cost_micros == 10_751  # 0.01 USD/s * 1.075125 s, rounded
    body = result.body()
    assert body["duration"] == float(HELLO_SECONDS)
    assert body["usage"]["seconds"] == float(HELLO_SECONDS)
    assert body["language"] == "en"
    assert body["segments"][0]["text"] == "Hello, world."
    assert await domain.charges(issued.workspace.account_id) == [result.cost_micros]


async def test_deepgram_language_option_replaces_detection_when_the_request_names_none(
    monkeypatch: pytest.MonkeyPatch, mock_http: Callable[[Handler], httpx.AsyncClient]
) -> None:
    monkeypatch.setenv(KEY_ENV, deepgram.API_KEY)
    fake = deepgram.FakeDeepgram()
    adapter = DeepgramSttAdapter(mock_http(fake.handle))
    endpoint = _endpoint("deepgram", "http://dg.test")
    await adapter.transcribe(endpoint, _call("nova-3", options={"language": "multi"}))
    await adapter.transcribe(endpoint, _call("nova-3", language="en", options={"language": "de"}))
    first, second = (request.url.params for request in fake.requests)
    assert first.get_list("language") == ["multi"] and "detect_language" not in first
    assert second.get_list("language") == ["en"]  # the request's own language stands


async def test_assemblyai_language_code_option_replaces_detection(
    monkeypatch: pytest.MonkeyPatch, mock_http: Callable[[Handler], httpx.AsyncClient]
) -> None:
    monkeypatch.setenv(KEY_ENV, assemblyai.API_KEY)
    fake = assemblyai.FakeAssemblyAI()
    clock = RecordedSleeps()
    adapter = AssemblyAISttAdapter(mock_http(fake.handle), clock.sleep, clock.monotonic)
    call = _call("universal", options={"language_code": "en_au"})
    transcript = await adapter.transcribe(_endpoint("assemblyai", "http://aai.test"), call)
    submitted = json.loads(fake.requests[1].content)
    assert submitted["language_code"] == "en_au" and "language_detection" not in submitted
    assert transcript.language == "en_au"


def test_the_catalog_names_an_azure_deployment_and_its_api_version(tmp_path: Path) -> None:
    catalog_file = tmp_path / "azure.toml"
    catalog_file.write_text(
        """
[[models]]
id = "azure/whisper"
kind = "stt"
price_per_second = "0.0001"
[[models.endpoints]]
provider = "azure"
adapter = "azure-openai"
base_url = "https://my-resource.openai.azure.com/"
api_key_env = "AZURE_OPENAI_API_KEY"
model = "my-whisper"
api_version = "2025-03-01-preview"
"""
    )
    model = load_catalog(catalog_file).get("azure/whisper")
    assert model is not None
    (endpoint,) = model.endpoints
    assert endpoint.base_url == "https://my-resource.openai.azure.com"
    assert (endpoint.model, endpoint.api_version) == ("my-whisper", "2025-03-01-preview")


def test_azures_retry_after_ms_is_a_retry_hint_in_whole_seconds() -> None:
    assert retry_hint(httpx.Response(429, headers={"retry-after-ms": "2500"})) == 3
    assert retry_hint(httpx.Response(429, headers={"retry-after": "4", "retry-after-ms": "1"})) == 4
    assert retry_hint(httpx.Response(429)) is None


async def test_a_rate_limited_vendor_falls_back_to_the_next_one(
    domain: Domain,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    mock_http: Callable[[Handler], httpx.AsyncClient],
) -> None:
    monkeypatch.setenv("UNIT_DEEPGRAM_KEY", deepgram.API_KEY)
    monkeypatch.setenv("UNIT_ELEVENLABS_KEY", elevenlabs.API_KEY)
    catalog_file = tmp_path / "fallback.toml"
    catalog_file.write_text(
        """
[[models]]
id = "vendors/fallback"
kind = "stt"
price_per_second = "0.01"
[[models.endpoints]]
provider = "deepgram"
adapter = "deepgram"
base_url = "http://dg.test"
api_key_env = "UNIT_DEEPGRAM_KEY"
model = "ratelimit"
[[models.endpoints]]
provider = "elevenlabs"
adapter = "elevenlabs"
base_url = "http://el.test"
api_key_env = "UNIT_ELEVENLABS_KEY"
model = "scribe_v2"
"""
    )
    dg, el = deepgram.FakeDeepgram(), elevenlabs.FakeElevenLabs()

    def by_host(request: httpx.Request) -> httpx.Response:
        return (dg if request.url.host == "dg.test" else el).handle(request)

    http = mock_http(by_host)
    decoder: ComputePool = InlinePool()  # type: ignore[assignment]
    transcriber = Transcriber(
        load_catalog(catalog_file),
        {"deepgram": DeepgramSttAdapter(http), "elevenlabs": ElevenLabsSttAdapter(http)},
        domain.clock,
        domain.limits,
        domain.metrics,
        NoOpTracer(),
        decoder,
        writer=domain.writer,
    )
    issued = await domain.funded_key("stt-vendor-fallback")
    request = TranscriptionInput(
        model="vendors/fallback",
        audio=fixture("hello"),
        claimed_format="wav",
        filename="hello.wav",
        audio_param="file",
        provider_options={"elevenlabs": {"diarize": True}, "deepgram": {"diarize": True}},
    )
    async with domain.sessions() as session:
        principal = await domain.principal(issued)
        result = await transcriber.transcribe(session, principal, request)
    assert (len(dg.requests), len(el.requests)) == (1, 1)
    assert result.provider == "elevenlabs"
    assert result.transcript.text == "Hello, world. (laughs) Bye."
    assert el.forms[0]["diarize"] == ["true"]  # that provider's own options
    assert domain.metrics.fallbacks.labels("vendors/fallback", "deepgram")._value.get() == 1


# (adapter, model, status, provider_code, the provider's message) for a request it refuses
CLIENT_ERRORS = [
    ("deepgram", "nova-3", 400, "Bad Request", "failed to process audio"),
    ("elevenlabs", "scribe_v2", 422, "value_error", "Field required"),
    ("assemblyai", "universal", 400, 400, "Upload failed: empty body"),
    ("azure-openai", "not-deployed", 404, "DeploymentNotFound", "does not exist"),
]


@pytest.mark.parametrize(("adapter", "model", "status", "code", "message"), CLIENT_ERRORS)
async def test_a_refused_request_carries_the_providers_code_and_message(
    monkeypatch: pytest.MonkeyPatch,
    mock_http: Callable[[Handler], httpx.AsyncClient],
    adapter: str,
    model: str,
    status: int,
    code: str | int,
    message: str,
) -> None:
    monkeypatch.setenv(KEY_ENV, fake_key(adapter))
    build, fake_of, _ = ADAPTERS[adapter]
    fake = fake_of()
    with pytest.raises(ProviderFailure) as failure:
        await build(mock_http(fake.handle)).transcribe(
            _endpoint(adapter, "http://p.test"), _call(model, audio=b"")
        )
    assert failure.value.kind == CLIENT_ERROR  # not tried elsewhere: the gateway answers 400
    assert (failure.value.status, failure.value.provider_code) == (status, code)
    assert message in failure.value.message


# --- issue 29 item 12/14: each adapter against its provider's current reference -----------


async def test_assemblyai_names_its_model_in_speech_models_never_the_retired_speech_model(
    monkeypatch: pytest.MonkeyPatch, mock_http: Callable[[Handler], httpx.AsyncClient]
) -> None:
    """AssemblyAI refuses `speech_model` (400 "speech_model is deprecated. Use
    'speech_models' instead"); the model goes in the `speech_models` list, and an option
    cannot bring the retired parameter back."""
    monkeypatch.setenv(KEY_ENV, assemblyai.API_KEY)
    fake = assemblyai.FakeAssemblyAI()
    clock = RecordedSleeps()
    adapter = AssemblyAISttAdapter(mock_http(fake.handle), clock.sleep, clock.monotonic)
    endpoint = _endpoint("assemblyai", "http://aai.test")
    transcript = await adapter.transcribe(endpoint, _call("universal-2"))
    submitted = json.loads(fake.requests[1].content)
    assert submitted["speech_models"] == ["universal-2"] and "speech_model" not in submitted
    assert transcript.text == "Hello, world."

    options = {"speech_model": "best", "speech_models": ["evil"]}
    await adapter.transcribe(endpoint, _call("universal-2", options=options))
    submitted = json.loads(fake.requests[4].content)
    assert submitted["speech_models"] == ["universal-2"] and "speech_model" not in submitted


async def test_the_assemblyai_fake_refuses_the_retired_speech_model_as_assemblyai_does(
    mock_http: Callable[[Handler], httpx.AsyncClient],
) -> None:
    fake = assemblyai.FakeAssemblyAI()
    http = mock_http(fake.handle)
    headers = {"authorization": assemblyai.API_KEY}
    body = {"audio_url": "https://cdn.assemblyai.test/upload/1", "speech_model": "universal"}
    answer = await http.post("http://aai.test/v2/transcript", json=body, headers=headers)
    assert answer.status_code == 400
    assert answer.json() == {"error": "speech_model is deprecated. Use 'speech_models' instead"}


def test_the_built_in_stt_entries_name_models_their_providers_serve_today() -> None:
    """A built-in AssemblyAI or ElevenLabs entry names a model the provider's current
    documentation lists (AssemblyAI: no bare `universal`; ElevenLabs removed `scribe_v1` on
    2026-07-09). Since issue 34 the built-in catalog has none (their prices were not
    confirmed): this guards any that comes back."""
    upstream = [
        (endpoint.adapter, endpoint.model or model.id.split("/", 1)[1])
        for model in load_catalog().models.values()
        for endpoint in model.endpoints
        if endpoint.adapter in ("assemblyai", "elevenlabs")
    ]
    for adapter, name in upstream:
        if adapter == "assemblyai":
            assert name in assemblyai.DOCUMENTED_MODELS, name
        else:
            assert name not in elevenlabs.REMOVED_MODELS, name


async def test_elevenlabs_failures_carry_the_documented_code_not_the_legacy_status(
    monkeypatch: pytest.MonkeyPatch, mock_http: Callable[[Handler], httpx.AsyncClient]
) -> None:
    """ElevenLabs' error detail names the error in `code` (`status` is a legacy field "no
    longer used"); a removed model is a refused request carrying that code."""
    monkeypatch.setenv(KEY_ENV, elevenlabs.API_KEY)
    adapter = ElevenLabsSttAdapter(mock_http(elevenlabs.FakeElevenLabs().handle))
    with pytest.raises(ProviderFailure) as failure:
        await adapter.transcribe(_endpoint("elevenlabs", "http://el.test"), _call("scribe_v1"))
    assert failure.value.kind == CLIENT_ERROR
    assert (failure.value.status, failure.value.provider_code) == (400, "invalid_parameters")
    assert "scribe_v1" in failure.value.message


async def test_elevenlabs_options_cannot_name_another_audio_source_or_an_asynchronous_answer(
    monkeypatch: pytest.MonkeyPatch, mock_http: Callable[[Handler], httpx.AsyncClient]
) -> None:
    """The gateway bills the audio it measured and waits for the answer on this request:
    `source_url` / `cloud_storage_url` (other audio) and `webhook` / `webhook_id` /
    `webhook_metadata` (an answer elsewhere) are not forwarded."""
    monkeypatch.setenv(KEY_ENV, elevenlabs.API_KEY)
    fake = elevenlabs.FakeElevenLabs()
    adapter = ElevenLabsSttAdapter(mock_http(fake.handle))
    options = {
        "source_url": "https://evil.test/long.mp3",
        "cloud_storage_url": "https://evil.test/long.mp3",
        "webhook": True,
        "webhook_id": "hook",
        "webhook_metadata": {"a": 1},
        "tag_audio_events": False,
    }
    await adapter.transcribe(
        _endpoint("elevenlabs", "http://el.test"), _call("scribe_v2", options=options)
    )
    (fields,) = fake.forms
    assert fields == {
        "model_id": ["scribe_v2"],
        "timestamps_granularity": ["none"],
        "tag_audio_events": ["false"],
    }


@pytest_asyncio.fixture
async def openai_fake() -> AsyncIterator[openai_stt.FakeSttProvider]:
    fake = openai_stt.FakeSttProvider().start()
    try:
        yield fake
    finally:
        fake.stop()


async def test_openai_options_are_sent_as_openais_form_encodes_arrays_and_objects(
    monkeypatch: pytest.MonkeyPatch, openai_fake: openai_stt.FakeSttProvider
) -> None:
    """openai-python sends an array as `name[]` once per value and an object's members as
    `name[key]` (the same rule as `timestamp_granularities[]`), not as JSON text."""
    monkeypatch.setenv(KEY_ENV, openai_stt.API_KEY)
    options = {
        "include": ["logprobs"],
        "chunking_strategy": {"type": "server_vad", "threshold": 0.5},
        "known_speaker_names": ["agent", "customer"],
        "seed": 3,
    }
    async with httpx.AsyncClient() as http:
        await OpenAISttAdapter(http).transcribe(
            _endpoint("openai", openai_fake.base_url), _call("echo", options=options)
        )
    (received,) = openai_fake.calls
    assert received.fields["include[]"] == ["logprobs"]
    assert received.fields["chunking_strategy[type]"] == ["server_vad"]
    assert received.fields["chunking_strategy[threshold]"] == ["0.5"]
    assert received.fields["known_speaker_names[]"] == ["agent", "customer"]
    assert received.fields["seed"] == ["3"]
    assert not {"include", "chunking_strategy", "known_speaker_names"} & set(received.fields)


async def test_openai_options_cannot_ask_for_a_streamed_answer(
    monkeypatch: pytest.MonkeyPatch, openai_fake: openai_stt.FakeSttProvider
) -> None:
    """`stream=true` makes OpenAI answer server-sent events, not the one JSON body the
    gateway reads: the option is not forwarded (nor on Azure, which shares the form)."""
    monkeypatch.setenv(KEY_ENV, openai_stt.API_KEY)
    async with httpx.AsyncClient() as http:
        transcript = await OpenAISttAdapter(http).transcribe(
            _endpoint("openai", openai_fake.base_url), _call("ok", options={"stream": True})
        )
    assert transcript.text == "fake transcript"
    assert "stream" not in openai_fake.calls[0].fields
