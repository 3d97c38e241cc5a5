"""How the gateway opens audio it is given, with PyAV: one set of opening options and one tuple
of errors that mean "does not decode", for both sides that decode it — the probe before
admission (server/transcription/media.py) and the local recognizer (server/providers/
pocketsphinx_stt.py) — so the provider may decode what the gateway decoded."""

from __future__ import annotations

import av

OPEN_OPTIONS: dict[str, str] = {}
AUDIO_ERRORS = (av.error.FFmpegError, ValueError, OverflowError, UnicodeDecodeError, EOFError)
