"""Offline English speech-to-text on pocketsphinx (its wheel ships the model), so the
embedded default transcribes real speech with no account and no network. Any supported
container is decoded with PyAV to 16 kHz mono 16-bit PCM first. There is no provider
reference to check (checked 2026-11-27: this docstring against the code below).

Recognition holds the GIL from start to end, in one stretch as long as the whole
recognition, so it runs in worker processes (server.compute): a few at once, a few more
queued, and a request arriving when both are full is answered at once as a rate-limited
provider with Retry-After (the routing rules then try the next endpoint, or answer 429).

A request naming a language other than English, or audio longer than MAX_SECONDS, is refused
as a client error (400); `prompt`, `temperature` and provider options are not used. verbose_json
gets the words with their times (frames of 1/100 s) and one segment spanning them."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from server.audio_decoding import OPEN_OPTIONS, audio_errors
from server.compute import ComputePool, PoolBusy, WorkerLost
from server.providers.endpoint import Endpoint
from server.providers.failures import CLIENT_ERROR, RATE_LIMITED, SERVER_ERROR, ProviderFailure
from server.providers.stt import Segment, SttCall, Transcript, Word

if TYPE_CHECKING:
    import av

SAMPLE_RATE = 16000
FRAMES_PER_SECOND = 100  # pocketsphinx's default frame rate
_FILLERS = {"<s>", "</s>", "<sil>"}
MAX_SECONDS = 600.0  # longer audio is refused (400): see recognize_in_worker


def pcm_16k_mono(audio: bytes) -> bytes:
    import av  # PyAV and pocketsphinx load in the worker processes only

    pcm = bytearray()
    resampler: av.AudioResampler | None = None
    shape: tuple[str, str, int] | None = None

    def drain() -> None:
        if resampler is not None:
            for out in resampler.resample(None):
                pcm.extend(bytes(out.planes[0])[: out.samples * 2])

    with av.open(io.BytesIO(audio), mode="r", options=OPEN_OPTIONS) as container:
        stream = container.streams.audio[0]
        if stream.codec_context is None:
            raise av.error.InvalidDataError(0, "no decoder for the audio stream")
        stream.codec_context.thread_count = 1
        for frame in container.decode(stream):
            # A stream may change its sample rate or layout midway; a resampler takes one.
            current = (frame.format.name, frame.layout.name, frame.sample_rate)
            if current != shape:
                drain()
                resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
                shape = current
            assert resampler is not None
            for out in resampler.resample(frame):
                pcm.extend(bytes(out.planes[0])[: out.samples * 2])
    drain()
    return bytes(pcm)


def _word_text(raw: str) -> str:
    # Alternate pronunciations are marked "word(2)".
    return raw.split("(", 1)[0]


def recognize(audio: bytes, verbose: bool) -> Transcript:
    return recognize_pcm(pcm_16k_mono(audio), verbose)


def recognize_pcm(pcm: bytes, verbose: bool) -> Transcript:
    from pocketsphinx import Decoder

    decoder = Decoder(samprate=SAMPLE_RATE, logfn="/dev/null")
    decoder.start_utt()
    decoder.process_raw(pcm, full_utt=True)
    decoder.end_utt()
    hypothesis = decoder.hyp()
    text = hypothesis.hypstr if hypothesis is not None else ""
    duration = len(pcm) / 2 / SAMPLE_RATE
    transcript = Transcript(text=text, language="en", duration=duration)
    if not verbose:
        return transcript
    words = [
        Word(
            word=_word_text(seg.word),
            start=seg.start_frame / FRAMES_PER_SECOND,
            end=(seg.end_frame + 1) / FRAMES_PER_SECOND,
        )
        for seg in decoder.seg()
        if seg.word not in _FILLERS and not seg.word.startswith("[")
    ]
    transcript.words = words
    if words:
        transcript.segments = [Segment(id=0, start=words[0].start, end=words[-1].end, text=text)]
    return transcript


def recognize_in_worker(audio: bytes, verbose: bool, max_seconds: float) -> Transcript | str:
    """`recognize` as a worker process runs it, on at most `max_seconds` of audio: a job
    cannot be stopped once running, so its length is what bounds how long a worker is
    taken (recognition runs at about real time on a busy machine). A string: why the
    audio is refused."""
    try:
        pcm = pcm_16k_mono(audio)
    except audio_errors():
        return "The audio could not be decoded"
    if len(pcm) / 2 / SAMPLE_RATE > max_seconds:
        return f"The local model transcribes at most {max_seconds:g} seconds of audio"
    return recognize_pcm(pcm, verbose)


class PocketsphinxAdapter:
    """Recognition runs in `pool`'s worker processes."""

    def __init__(self, pool: ComputePool, max_seconds: float = MAX_SECONDS) -> None:
        self._pool = pool
        self._max_seconds = max_seconds

    async def transcribe(self, endpoint: Endpoint, call: SttCall) -> Transcript:
        if call.language and call.language.lower() != "en":
            raise ProviderFailure(
                CLIENT_ERROR, "The local model only transcribes English (language 'en')"
            )
        try:
            transcript = await self._pool.run(
                recognize_in_worker, call.audio, call.verbose, self._max_seconds
            )
        except PoolBusy as busy:
            raise ProviderFailure(
                RATE_LIMITED,
                "The local model is busy",
                status=429,
                provider_code="local_model_busy",
                retry_after=busy.retry_after,
            ) from busy
        except WorkerLost as exc:
            raise ProviderFailure(SERVER_ERROR, "The local model's worker stopped") from exc
        if isinstance(transcript, str):
            # Too long, or (the gateway decoded this audio before admitting it) a decoder
            # that now disagrees: either way the audio is at fault.
            raise ProviderFailure(CLIENT_ERROR, transcript)
        return transcript
