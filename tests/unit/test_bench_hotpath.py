"""The parsing and report code of bench.hotpath and bench.profile (no load, no timing)."""

from __future__ import annotations

from bench.harness.load import CaseResult
from bench.hotpath import (
    DIRECT_STT,
    F1_KEY,
    F2_BARE_STT,
    F2_STT,
    GW_KEY,
    GW_STT,
    LITELLM_STT,
    evaluate,
    summarise,
)
from bench.profile import IDLE, ORM_UNATTRIBUTED, POOL_IPC, parse_raw, phase_of


def _result(path: str, concurrency: int, rps: float, p50: float) -> CaseResult:
    return CaseResult(path, concurrency, 10, 10, 0, 1.0, rps, p50, p50, False)


def test_phase_is_the_deepest_named_frame() -> None:
    frames = [
        "_handle_rpc (grpc/aio/_server.py:1)",
        "Transcribe (server/services/audio.py:30)",
        "transcribe (server/transcription/transcriber.py:195)",
        "admit (server/limits/admission.py:80)",
        "execute (sqlalchemy/ext/asyncio/session.py:1)",
    ]
    assert phase_of(frames) == "admission (limits, guardrails, hold)"
    assert phase_of(frames[:2]) == "response building"
    assert phase_of(["run_forever (asyncio/base_events.py:1)", "select (selectors.py:468)"]) != IDLE
    assert (
        phase_of(["_run_once (asyncio/base_events.py:1)", "EpollSelector.select (x.py:1)"]) == IDLE
    )
    assert phase_of(["send_bytes (multiprocessing/connection.py:1)"]) == POOL_IPC
    assert phase_of(["greenlet_spawn (sqlalchemy/util/concurrency.py:1)"]) == ORM_UNATTRIBUTED


def test_parse_raw_counts_samples_and_sql_and_leaves_idle_out_of_the_total() -> None:
    raw = "\n".join(
        [
            "a (server/auth.py:1);b (sqlalchemy/orm/session.py:2) 3",
            "a (server/auth.py:1) 1",
            "x (asyncio/base_events.py:1);EpollSelector.select (selectors.py:1) 5",
            "garbage line",
        ]
    )
    breakdown = parse_raw(raw)
    assert breakdown.samples["auth / principal lookup"] == 4
    assert breakdown.sql_samples["auth / principal lookup"] == 3
    assert breakdown.samples[IDLE] == 5
    assert breakdown.total == 4


def test_targets_are_ratios_of_medians_within_the_run() -> None:
    results = [
        _result(F1_KEY, 16, 400, 10),
        _result(F1_KEY, 16, 600, 10),
        _result(GW_KEY, 16, 200, 20),
        _result(F1_KEY, 1, 100, 2.0),
        _result(GW_KEY, 1, 50, 4.0),
        _result(DIRECT_STT, 1, 1000, 0.2),
        _result(F2_STT, 1, 300, 2.2),
        _result(GW_STT, 1, 100, 3.5),
        _result(F2_BARE_STT, 1, 500, 1.2),
        _result(LITELLM_STT, 1, 50, 9.2),
        _result(F2_STT, 16, 400, 30),
        _result(GW_STT, 16, 100, 90),
    ]
    figures = summarise(results)
    assert figures[(F1_KEY, 16)].requests_per_second == 500
    targets = {t.name: t for t in evaluate(figures, {"SQLite": 600.0}, {"gateway": 200.0})}
    key_rps = targets["GET /key req/s at 16 >= 50% of F1"]
    assert (key_rps.ratio, key_rps.met) == (0.4, False)
    assert targets["GET /key p50 at 1 <= 1.5x F1"].met is False
    added = targets["transcription added p50 at 1 <= F2's + 1.5 ms"]
    assert (added.figure, added.floor, added.met) == (3.3, 2.0, True)
    assert targets["video submissions at 16 >= 500 accepted/s (SQLite)"].met is True
    assert targets["peak RSS <= 150 MiB (gateway)"].met is False
    assert targets["transcription req/s at 16 >= 3x LiteLLM's"].met is None  # not measured
    latency = targets["transcription added p50 at 1 <= 1/3 of LiteLLM's"]
    assert (latency.figure, latency.floor, latency.ratio, latency.met) == (3.3, 9.0, 0.367, False)
    # The stack with a bare provider call, beside it: reported, never a target.
    bare = targets["(not a target) F2-bare added p50 at 1 vs 1/3 of LiteLLM's"]
    assert (bare.figure, bare.ratio, bare.met) == (1.0, 0.111, None)
