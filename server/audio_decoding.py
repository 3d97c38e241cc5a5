"""How the gateway opens audio it is given, with PyAV: one set of opening options and one tuple
of errors that mean "does not decode", for both sides that decode it — the probe before
admission (server/transcription/media.py) and the local recognizer (server/providers/
pocketsphinx_stt.py) — so the provider may decode what the gateway decoded.

PyAV (and the FFmpeg libraries it loads, large in memory) is imported only where audio is
decoded:
in the worker processes, never in the server process by importing this module."""

from __future__ import annotations

from functools import cache

OPEN_OPTIONS: dict[str, str] = {}


@cache
def audio_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean "this audio does not decode" (imports PyAV)."""
    import av

    return (av.error.FFmpegError, ValueError, OverflowError, UnicodeDecodeError, EOFError)
