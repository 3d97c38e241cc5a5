"""Offline English speech-to-text on pocketsphinx (its wheel ships the model), so the
embedded default transcribes real speech with no account. Any supported container is
decoded with PyAV to 16 kHz mono 16-bit PCM first."""

from __future__ import annotations

import asyncio
import io

import av
from pocketsphinx import Decoder

from server.providers.stt import (
    CLIENT_ERROR,
    INVALID_RESPONSE,
    ProviderFailure,
    Segment,
    SttCall,
    Transcript,
    Word,
)
from server.routing.catalog import Endpoint

SAMPLE_RATE = 16000
FRAMES_PER_SECOND = 100  # pocketsphinx's default frame rate
_FILLERS = {"<s>", "</s>", "<sil>"}


def pcm_16k_mono(audio: bytes) -> bytes:
    resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
    pcm = bytearray()
    with av.open(io.BytesIO(audio), mode="r") as container:
        for frame in container.decode(audio=0):
            for out in resampler.resample(frame):
                pcm += bytes(out.planes[0])[: out.samples * 2]
    for out in resampler.resample(None):
        pcm += bytes(out.planes[0])[: out.samples * 2]
    return bytes(pcm)


def _word_text(raw: str) -> str:
    # Alternate pronunciations are marked "word(2)".
    return raw.split("(", 1)[0]


def recognize(audio: bytes, verbose: bool) -> Transcript:
    pcm = pcm_16k_mono(audio)
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


class PocketsphinxAdapter:
    """Recognition is CPU-bound: it runs in worker threads, a bounded number at once."""

    def __init__(self, max_parallel: int = 2) -> None:
        self._slots = asyncio.Semaphore(max_parallel)

    async def transcribe(self, endpoint: Endpoint, call: SttCall) -> Transcript:
        if call.language and call.language.lower() != "en":
            raise ProviderFailure(
                CLIENT_ERROR, "The local model only transcribes English (language 'en')"
            )
        async with self._slots:
            try:
                return await asyncio.to_thread(recognize, call.audio, call.verbose)
            except av.error.FFmpegError as exc:
                raise ProviderFailure(INVALID_RESPONSE, "The audio could not be decoded") from exc
