"""The parsing and report code of bench.hotpath and bench.profile (no load, no timing)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from bench import portkey
from bench.harness.load import LOOPBACK, Call, CaseResult, LeanHttpClient
from bench.hotpath import (
    DIRECT_STT,
    F1_KEY,
    F2_BARE_STT,
    F2_STT,
    GW_KEY,
    GW_STT,
    LITELLM_STT,
    PORTKEY_STT,
    Case,
    CaseCpu,
    added_p50_by_round,
    build_parser,
    evaluate,
    run_rounds,
    stat_cpu_seconds,
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
    # The writer's COMMIT is its own phase; a unit's statements are its caller's.
    writer = ["run (server/db/writer.py:300)", "_lead (server/db/writer.py:350)"]
    commit = [*writer, "commit (server/db/driver.py:520)"]
    assert phase_of(commit) == "group commit (the writer's BEGIN and COMMIT)"
    unit = [*writer, "settle_hold (server/billing/holds.py:419)", "run (server/db/driver.py:1)"]
    assert phase_of(unit) == "settlement / ledger"
    checkpoint = [
        "_worker (concurrent/futures/thread.py:83)",
        "_checkpoint (server/db/driver.py:368)",
    ]
    assert phase_of(checkpoint) == "WAL checkpoint (a thread beside the batches)"


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


def _cpu(path: str, server_ms: float, envoy_ms: float) -> CaseCpu:
    # 1,200 requests at these CPU milliseconds each.
    return CaseCpu.of(path, 16, server_ms * 1.2, envoy_ms * 1.2, 1200)


def test_requests_per_cpu_second_count_the_whole_process_tree() -> None:
    # 1,200 requests served on 1.2 s of the server's CPU and 0.6 s of Envoy's: 666.7 per
    # CPU-second of the tree, not the 1,000 of the server alone.
    used = CaseCpu.of(GW_STT, 16, 1.2, 0.6, 1200)
    assert (used.server_ms, used.envoy_ms, used.requests_per_cpu_second) == (1.0, 0.5, 666.7)
    assert CaseCpu.of(GW_STT, 16, 0.0, 0.0, 1200).requests_per_cpu_second is None
    assert CaseCpu.of(GW_STT, 16, 0.5, 0.0, 0).requests_per_cpu_second is None  # none served
    rounds = [CaseCpu.of(GW_STT, 16, s, 0.0, 1000) for s in (1.0, 2.0, 4.0)]
    figure = summarise([_result(GW_STT, 16, 500, 30)] * 3, rounds)[(GW_STT, 16)]
    assert figure.requests_per_cpu_second == 500  # the median of 1000, 500 and 250


def test_stat_cpu_seconds_reads_utime_and_stime_after_the_command() -> None:
    # A command may hold spaces and parentheses: the fields are counted after the last ")".
    stat = "4242 (node (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 11 0"
    assert stat_cpu_seconds(stat, 100) == 3.0


def test_portkey_targets_are_ratios_within_the_run() -> None:
    results = [
        _result(DIRECT_STT, 1, 1000, 0.5),
        _result(F2_STT, 1, 300, 2.2),
        _result(F2_BARE_STT, 1, 400, 1.5),
        _result(GW_STT, 1, 300, 3.0),
        _result(PORTKEY_STT, 1, 500, 2.0),
        _result(F2_STT, 16, 700, 20),
        _result(GW_STT, 16, 600, 25),
        _result(PORTKEY_STT, 16, 580, 26),
    ]
    cpu = [
        # The gateway: 1.0 ms of server and 0.4 of Envoy per request (714.3 per CPU-second).
        _cpu(GW_STT, 1.0, 0.4),
        # Portkey: one node process, 1.0 ms (1,000 per CPU-second).
        _cpu(PORTKEY_STT, 1.0, 0.0),
    ]
    targets = {t.name: t for t in evaluate(summarise(results, cpu), {}, {})}
    rps = targets["transcription req/s at 16 >= Portkey's"]
    assert (rps.figure, rps.floor, rps.ratio, rps.met) == (600, 580, 1.034, True)
    per_cpu = targets["transcription req per CPU-second at 16 >= 1.5x Portkey's (whole tree)"]
    assert (per_cpu.figure, per_cpu.floor, per_cpu.ratio, per_cpu.met) == (
        714.3,
        1000,
        0.714,
        False,
    )
    latency = targets["transcription added p50 at 1 <= Portkey's"]
    assert (latency.figure, latency.floor, latency.ratio, latency.met) == (2.5, 1.5, 1.667, False)
    # The floors beside it, never targets: can this stack reach Portkey's latency at all?
    for floor, added in ((F2_STT, 1.7), (F2_BARE_STT, 1.0)):
        beside = targets[f"(not a target) {floor} added p50 at 1 vs Portkey's"]
        assert (beside.figure, beside.floor, beside.met) == (added, 1.5, None)
    # The issue's transcription throughput target is 80% of F2's.
    f2 = targets["transcription req/s at 16 >= 80% of F2"]
    assert (f2.ratio, f2.met) == (0.857, True)


def test_the_portkey_latency_ratio_is_also_given_round_by_round() -> None:
    """Each round's added p50s (less that round's direct call) as a ratio: the spread of the
    figure the target takes the median of. A round without a peer's figure is left out."""
    results = [
        _result(DIRECT_STT, 1, 100, 0.2),
        _result(GW_STT, 1, 100, 1.2),
        _result(PORTKEY_STT, 1, 100, 1.0),
        _result(GW_STT, 16, 100, 9.0),  # concurrency 16: not this ratio's
        _result(DIRECT_STT, 1, 100, 0.1),
        _result(GW_STT, 1, 100, 1.0),
        _result(PORTKEY_STT, 1, 100, 1.1),
    ]
    assert added_p50_by_round(results, GW_STT, PORTKEY_STT) == [1.25, 0.9]
    assert added_p50_by_round(results, GW_STT, "nobody") == []


def test_portkey_targets_without_portkey_are_not_judged() -> None:
    results = [_result(DIRECT_STT, 1, 1000, 0.5), _result(GW_STT, 1, 300, 3.0)]
    targets = {t.name: t for t in evaluate(summarise(results), {}, {})}
    assert targets["transcription added p50 at 1 <= Portkey's"].met is None
    assert targets["transcription req/s at 16 >= Portkey's"].met is None


def test_the_help_documents_portkey() -> None:
    text = build_parser().format_help()
    assert "--no-portkey" in text
    assert "@portkey-ai/gateway" in text
    assert "CPU-second" in text


def test_missing_node_gets_a_clear_line() -> None:
    everything = {"node": "/usr/bin/node", "npm": "/usr/bin/npm"}
    assert portkey.missing_tools(everything.get) is None
    line = portkey.missing_tools({"npm": "/usr/bin/npm"}.get)
    assert line is not None and "node" in line and "nodejs" in line
    line = portkey.missing_tools({}.get)
    assert line is not None and "node, npm" in line


def test_installed_version_reads_the_package_json(tmp_path: Path) -> None:
    assert portkey.installed_version(tmp_path) is None
    package = tmp_path / "node_modules" / "@portkey-ai" / "gateway" / "package.json"
    package.parent.mkdir(parents=True)
    package.write_text(json.dumps({"name": "@portkey-ai/gateway", "version": "0.1.0"}))
    assert portkey.installed_version(tmp_path) == "0.1.0"
    package.write_text("{not json")
    assert portkey.installed_version(tmp_path) is None


def test_portkey_is_pointed_at_the_fake_by_headers() -> None:
    assert portkey.provider_headers("http://127.0.0.1:4000/v1") == {
        "x-portkey-provider": "openai",
        "x-portkey-custom-host": "http://127.0.0.1:4000/v1",
    }


async def test_the_lean_client_sends_extra_headers() -> None:
    heads: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(4)
        heads.append(head)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, LOOPBACK, 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with asyncio.timeout(10):
            async with LeanHttpClient(
                f"http://{LOOPBACK}:{port}/v1/x",
                ["k"],
                "text/plain",
                b"body",
                headers={"x-portkey-provider": "openai"},
            ) as client:
                assert await client.post() == 200
    finally:
        server.close()
        await server.wait_closed()
    assert b"\r\nx-portkey-provider: openai\r\n" in heads[0]
    assert b"Authorization: Bearer k\r\n" in heads[0]


def test_peers_peak_rss_is_shown_but_not_judged() -> None:
    targets = {
        t.name: t
        for t in evaluate({}, {}, {"gateway": 120.0}, {"Portkey (node)": 160.0, "LiteLLM": None})
    }
    assert targets["peak RSS <= 150 MiB (gateway)"].met is True
    peer = targets["(not a target) peak RSS (Portkey (node))"]
    assert (peer.figure, peer.met) == (160.0, None)
    assert targets["(not a target) peak RSS (LiteLLM)"].figure is None
    assert not any(name.startswith("peak RSS <= 150 MiB (Portkey") for name in targets)


async def test_every_case_is_warmed_up_before_the_first_round() -> None:
    # Node's JIT (Portkey) reached its steady CPU per request only after about 2,000
    # requests here: each case gets --prewarm requests, unmeasured, before round 1.
    calls: dict[str, int] = {}

    def counting_case(path: str) -> Case:
        async def open_call(concurrency: int) -> tuple[Call, Callable[[], Awaitable[None]]]:
            async def call() -> str | None:
                calls[path] = calls.get(path, 0) + 1
                return None

            async def close() -> None:
                return None

            return call, close

        return Case(path, open_call)

    args = build_parser().parse_args(["--rounds", "1", "--requests", "5", "--warmup", "0"])
    assert args.prewarm == 2000
    args.prewarm = 7
    results = await run_rounds([counting_case("a"), counting_case("b")], args)
    # 1 preflight + 7 warm-up + 5 at concurrency 1 + 5 at 16; only the rounds are results.
    assert calls == {"a": 18, "b": 18}
    assert [(r.path, r.concurrency, r.requests) for r in results] == [
        ("a", 1, 5),
        ("b", 1, 5),
        ("a", 16, 5),
        ("b", 16, 5),
    ]


def test_the_preload_keeps_portkey_on_loopback() -> None:
    # Portkey's start script listens as @hono/node-server does: listen(port, undefined, cb),
    # which Node alone binds to every interface.
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (the bench then runs without Portkey)")
    script = (
        "const server = require('node:net').createServer();"
        "server.listen(0, undefined, () => {"
        " console.log(server.address().address); server.close(); });"
    )
    done = subprocess.run(
        [node, "--import", portkey.LOOPBACK_PRELOAD, "-e", script],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert done.stdout.strip() == "127.0.0.1"


def test_portkey_runs_without_proxies_and_trusts_only_loopback() -> None:
    env = portkey.portkey_environment(
        {
            "PATH": "/usr/bin",
            "https_proxy": "http://proxy:3128",
            "HTTP_PROXY": "http://proxy:3128",
            "TRUSTED_CUSTOM_HOSTS": "example.com",
            "NODE_OPTIONS": "--inspect",
        }
    )
    assert env == {"PATH": "/usr/bin", "TRUSTED_CUSTOM_HOSTS": "127.0.0.1", "NO_PROXY": "*"}
