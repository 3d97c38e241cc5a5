"""The loopback fakes take a burst of new connections at once (testkit/fakes/listener.py)."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

import httpx

from testkit.fakes.openai_stt import FakeSttProvider


async def test_the_fake_provider_answers_a_burst_of_new_connections() -> None:
    provider = FakeSttProvider().start()
    url = f"{provider.base_url}/audio/transcriptions"
    stop = threading.Event()

    def contend() -> None:  # the test process's own work, competing for the GIL
        while not stop.is_set():
            sum(range(10_000))

    threading.Thread(target=contend, daemon=True).start()
    outcomes: Counter[str] = Counter()
    try:
        for _ in range(6):
            # A new client each round: every request opens a new connection at once.
            async with httpx.AsyncClient(
                timeout=httpx.Timeout(30.0, connect=10.0),
                limits=httpx.Limits(max_connections=None),
            ) as client:
                answers = await asyncio.gather(
                    *(
                        client.post(url, files={"file": ("a.wav", b"x")}, data={"model": "ok"})
                        for _ in range(80)
                    ),
                    return_exceptions=True,
                )
            for answer in answers:
                failed = isinstance(answer, BaseException)
                outcomes[type(answer).__name__ if failed else "answered"] += 1
    finally:
        stop.set()
        provider.stop()
    assert outcomes == Counter(answered=480)
