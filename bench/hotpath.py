"""Issues 17 and 31's hot-path benchmark: the gateway against the floors of its own stack, and
two peers, LiteLLM and Portkey's open-source gateway.

One run starts, side by side on 127.0.0.1:
- the fast fake provider (bench/harness/stt.py);
- the floors (bench/floors.py): F1 = Envoy + JSON transcoder + a bare grpc.aio GET /key,
  F2 = F1's stack + one httpx call to the fake with the request's audio; F2-bare = F2 with
  that call on a bare asyncio stream; F3-http = F2-bare without the gRPC hop (Envoy as a
  plain HTTP/1.1 proxy to a Python HTTP/1.1 server: the floor of the design that would
  remove the hop); F2-bare and F3-http are not a target's floor (the least any provider call
  costs on this stack, shown beside the LiteLLM latency target);
- the gateway (`gateway up`, one server process, SQLite) with a funded key;
- LiteLLM's proxy (bench/litellm.py: its own venv under .bench-cache/, one worker, no
  database) routing a transcription model to the same fake;
- Portkey's open-source gateway (bench/portkey.py: npm @portkey-ai/gateway, pinned, installed
  into .bench-cache/portkey; one Node.js process; a pure proxy with no keys, metering or
  database) sending each request to the same fake, as its headers say
  (x-portkey-provider: openai, x-portkey-custom-host: the fake's URL). It needs node and npm
  on the machine (Debian: nodejs, npm); without them the run says so and goes on without it.
Each case first gets `--prewarm` unmeasured requests at concurrency 16 (Node's JIT needs
about 2,000 to warm up). Then it measures, in `--rounds` interleaved rounds (so drift of a
shared machine falls on every side), at concurrency 1 and 16: GET /key on F1 and the
gateway, and a transcription of the same 32 KB WAV (1 s, 16 kHz mono) directly to the
fake, on F2, on the gateway, on LiteLLM and on Portkey. Around each measurement it reads
the CPU time (user + system, from /proc) of the whole process tree serving the case (the
gateway: `gateway up`, its server process and Envoy; a floor: its process and Envoy;
Portkey: node and any children; LiteLLM: its tree), so each case also has requests per
CPU-second (the measurement's own warm-up included on both sides).
Each figure is the median over the rounds; ratios are taken within the run. Video
submissions (202 = durably stored) are measured by `python -m bench.videos` on SQLite and
PostgreSQL after the rounds (there is no floor to pair them with). Peak RSS (VmHWM) of each
server process is read before it stops.

Targets (issue 31 item 5; "added" p50 = the case's p50 at 1 minus the direct-to-fake p50):
GET /key req/s at 16 >= 50% of F1's and p50 at 1 <= 1.5x F1's; transcription req/s at 16
>= 80% of F2's and added p50 at 1 <= F2's + 1.5 ms; against LiteLLM >= 3x its req/s at 16
and <= 1/3 of its added p50; against Portkey >= its req/s at 16, >= 1.5x its requests per
CPU-second of the whole process tree (Envoy included) at 16, and added p50 at 1 <= its own;
peak RSS per server process <= 150 MiB; video submissions >= 500 accepted/s at 16.

    python -m bench.hotpath                    # 5 rounds, 500 requests per case
    python -m bench.hotpath --rounds 7 --json out.json
    python -m bench.hotpath --no-litellm --no-videos
    python -m bench.hotpath --rounds 1 --requests 100 --warmup 10 --prewarm 200 \
        --no-litellm --no-videos                # a small run, to see that it works

Every load loop is bounded by a request count and a time cap; only processes this run
started are stopped, by PID. Targets are reported, never enforced (exit status 1 only when
requests failed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import litellm as litellm_proxy
from bench import portkey as portkey_gateway
from bench.floors import FLOOR_READY
from bench.harness.cli import add_json_argument, positive_int
from bench.harness.load import (
    LOOPBACK,
    Call,
    CaseResult,
    LeanHttpClient,
    lean_call,
    measure,
)
from bench.harness.processes import (
    ENVOY_COMMAND,
    REPO_ROOT,
    LoopbackPeer,
    create_funded_key,
    process_tree,
    run_database,
    running_gateway,
    scratch,
)
from bench.harness.report import case_done, machine_info, markdown_table
from bench.harness.stt import (
    BENCH_MODEL,
    ROUTE,
    UPSTREAM_MODEL,
    FakeProviderProcess,
    multipart_upload,
    running_fake_provider,
    write_catalog,
)
from testkit.audio import speech
from testkit.catalog import FAKE_KEY_ENV

F1_KEY = "F1 GET /key"
GW_KEY = "gateway GET /key"
DIRECT_STT = "direct to fake"
F2_STT = "F2 transcription"
F2_BARE_STT = "F2-bare transcription"
F3_HTTP_STT = "F3-http transcription"
GW_STT = "gateway transcription"
LITELLM_STT = "LiteLLM transcription"
PORTKEY_STT = "Portkey transcription"
AUDIO_SECONDS = 1.0  # 16 kHz mono s16 WAV: 32,078 bytes


# --- the floors' process --------------------------------------------------------------------


@dataclass
class FloorProcess(LoopbackPeer):
    provider: FakeProviderProcess
    bare: bool = False  # F2-bare: the provider call on a bare stream
    plain_http: bool = False  # F3-http: no gRPC hop (Envoy as a plain HTTP/1.1 proxy)
    process: subprocess.Popen[str] | None = None
    port: int = 0  # once it said it is ready

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}/api/v1"

    def start(self, ready_within: float = 60.0) -> FloorProcess:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.floors",
                "--provider-url",
                self.provider.base_url,
                "--provider-key",
                self.provider.api_key,
                *(["--bare-provider-call"] if self.bare else []),
                *(["--plain-http"] if self.plain_http else []),
            ],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        ready = threading.Event()

        def pump() -> None:
            assert self.process is not None and self.process.stdout is not None
            for line in self.process.stdout:
                if line.startswith(FLOOR_READY):
                    self.port = int(line.rsplit(":", 1)[1])
                    ready.set()

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(ready_within):
            self.stop()
            raise RuntimeError("the floors did not start")
        return self


# --- the cases ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    path: str
    open_call: Callable[[int], Awaitable[tuple[Call, Callable[[], Awaitable[None]]]]]
    # The process tree serving the case (its CPU is read from /proc around each measurement).
    root_pid: int | None = None


@dataclass(frozen=True)
class CpuSeconds:
    """CPU seconds (user + system) a process tree has used: its server processes and Envoy."""

    server: float
    envoy: float


_TICKS = os.sysconf("SC_CLK_TCK")


def stat_cpu_seconds(stat: str, ticks_per_second: int = _TICKS) -> float:
    """User + system CPU seconds of a /proc/<pid>/stat line."""
    # Fields after the command's closing parenthesis (the command may hold parentheses and
    # spaces): utime and stime are 14 and 15.
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / ticks_per_second


def cpu_seconds(root_pid: int) -> CpuSeconds:
    server = envoy = 0.0
    for pid in process_tree(root_pid):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
            command = Path(f"/proc/{pid}/comm").read_text(encoding="utf-8").strip()
        except OSError:  # gone
            continue
        used = stat_cpu_seconds(stat)
        if command == ENVOY_COMMAND:
            envoy += used
        else:
            server += used
    return CpuSeconds(server, envoy)


def largest_process_mib(root_pid: int) -> float | None:
    """The largest peak RSS (VmHWM) of one Python process in `root_pid`'s tree (Envoy
    excluded): the target is per server process."""
    peaks: list[float] = []
    for pid in process_tree(root_pid):
        try:
            if Path(f"/proc/{pid}/comm").read_text(encoding="utf-8").strip() == ENVOY_COMMAND:
                continue
            status = Path(f"/proc/{pid}/status").read_text(encoding="utf-8")
        except OSError:  # gone
            continue
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                peaks.append(round(int(line.split()[1]) / 1024, 1))
    return max(peaks) if peaks else None


def get_case(path: str, base_url: str, key: str, root_pid: int | None = None) -> Case:
    async def open_call(concurrency: int) -> tuple[Call, Callable[[], Awaitable[None]]]:
        # The lean client, as for the uploads: httpx's own CPU (~0.8 ms a request) would
        # cap both sides at the load generator's rate.
        client = LeanHttpClient(base_url + "/key", [key], "", b"", method="GET")
        return lean_call(client), client.aclose

    return Case(path, open_call, root_pid)


def post_case(
    path: str,
    url: str,
    key: str,
    model: str,
    audio: bytes,
    root_pid: int | None = None,
    headers: Mapping[str, str] | None = None,
) -> Case:
    upload = multipart_upload(model, audio)

    async def open_call(concurrency: int) -> tuple[Call, Callable[[], Awaitable[None]]]:
        client = LeanHttpClient(url, [key], upload.content_type, upload.content, headers=headers)
        return lean_call(client), client.aclose

    return Case(path, open_call, root_pid)


async def preflight(case: Case) -> None:
    call, close = await case.open_call(1)
    try:
        failure = await call()
    finally:
        await close()
    if failure is not None:
        raise RuntimeError(f"{case.path} preflight failed: {failure}")


@dataclass(frozen=True)
class CaseCpu:
    """CPU milliseconds per request of one measurement, and requests per CPU-second of the
    whole process tree (warm-up included in both counts)."""

    path: str
    concurrency: int
    server_ms: float
    envoy_ms: float
    requests_per_cpu_second: float | None = None  # None: no CPU time counted

    @classmethod
    def of(
        cls,
        path: str,
        concurrency: int,
        server_seconds: float,
        envoy_seconds: float,
        served: int,
    ) -> CaseCpu:
        """From the CPU seconds the tree's processes used while serving `served` requests."""
        if served <= 0:  # cut off by the time cap before any answer
            return cls(path, concurrency, 0.0, 0.0, None)
        used = server_seconds + envoy_seconds
        return cls(
            path,
            concurrency,
            round(server_seconds * 1000 / served, 3),
            round(envoy_seconds * 1000 / served, 3),
            round(served / used, 1) if used > 0 else None,
        )


async def run_rounds(
    cases: Sequence[Case], args: argparse.Namespace, cpu: list[CaseCpu] | None = None
) -> list[CaseResult]:
    """Measure each case; where a case names its process tree, its CPU per request goes to
    `cpu`."""
    for case in cases:
        await preflight(case)
    # Unmeasured, before round 1: Node's JIT (Portkey) took about 2,000 requests here to
    # reach its steady CPU per request, so a first round alone would count it cold.
    if args.prewarm > 0:
        print(f"warm-up: {args.prewarm} requests per case", file=sys.stderr, flush=True)
        for case in cases:
            call, close = await case.open_call(16)
            try:
                await measure(case.path, call, 16, args.prewarm, 0, args.time_cap)
            finally:
                await close()
    results: list[CaseResult] = []
    for round_index in range(args.rounds):
        print(f"round {round_index + 1}/{args.rounds}", file=sys.stderr, flush=True)
        for concurrency in (1, 16):
            for case in cases:
                call, close = await case.open_call(concurrency)
                before = None if case.root_pid is None else cpu_seconds(case.root_pid)
                try:
                    result = await measure(
                        case.path, call, concurrency, args.requests, args.warmup, args.time_cap
                    )
                finally:
                    await close()
                if before is not None and case.root_pid is not None and cpu is not None:
                    after = cpu_seconds(case.root_pid)
                    cpu.append(
                        CaseCpu.of(
                            case.path,
                            concurrency,
                            after.server - before.server,
                            after.envoy - before.envoy,
                            result.requests + args.warmup,
                        )
                    )
                results.append(result)
                case_done(result)
    return results


# --- summary --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    path: str
    concurrency: int
    rounds: int
    requests_per_second: float
    p50_ms: float | None
    errors: int
    server_cpu_ms: float | None = None  # CPU ms per request of the serving process(es)
    envoy_cpu_ms: float | None = None
    requests_per_cpu_second: float | None = None  # of the whole process tree


def summarise(
    results: Sequence[CaseResult], cpu: Sequence[CaseCpu] = ()
) -> dict[tuple[str, int], Figure]:
    """The median over the rounds of each (path, concurrency)."""
    grouped: dict[tuple[str, int], list[CaseResult]] = {}
    for result in results:
        grouped.setdefault((result.path, result.concurrency), []).append(result)
    cpu_of: dict[tuple[str, int], list[CaseCpu]] = {}
    for used in cpu:
        cpu_of.setdefault((used.path, used.concurrency), []).append(used)
    figures = {}
    for (path, concurrency), group in grouped.items():
        p50s = [r.p50_ms for r in group if r.p50_ms is not None]
        used_by = cpu_of.get((path, concurrency), [])
        per_cpu = [u.requests_per_cpu_second for u in used_by]
        rates = [rate for rate in per_cpu if rate is not None]
        figures[(path, concurrency)] = Figure(
            path,
            concurrency,
            len(group),
            round(statistics.median(r.requests_per_second for r in group), 1),
            round(statistics.median(p50s), 2) if p50s else None,
            sum(r.errors for r in group),
            round(statistics.median(u.server_ms for u in used_by), 2) if used_by else None,
            round(statistics.median(u.envoy_ms for u in used_by), 2) if used_by else None,
            round(statistics.median(rates), 1) if rates else None,
        )
    return figures


def added_p50_by_round(results: Sequence[CaseResult], path: str, peer: str) -> list[float]:
    """`path`'s added p50 at concurrency 1 over `peer`'s, round by round (each round's p50s
    less that round's direct call): how far the run's noise moves the ratio the target is
    judged on (the median's)."""
    by_path: dict[str, list[float | None]] = {}
    for result in results:
        if result.concurrency == 1:
            by_path.setdefault(result.path, []).append(result.p50_ms)
    ratios = []
    for ours, theirs, direct in zip(
        by_path.get(path, []), by_path.get(peer, []), by_path.get(DIRECT_STT, []), strict=False
    ):
        if ours is None or theirs is None or direct is None or theirs <= direct:
            continue
        ratios.append(round((ours - direct) / (theirs - direct), 3))
    return ratios


@dataclass(frozen=True)
class Target:
    name: str
    figure: float | None
    floor: float | None
    ratio: float | None
    met: bool | None
    unit: str


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else round(a / b, 3)


def evaluate(
    figures: dict[tuple[str, int], Figure],
    videos: dict[str, float | None],
    rss: dict[str, float | None],
    peer_rss: Mapping[str, float | None] | None = None,
) -> list[Target]:
    """The issue's targets (and a few figures beside them, named "(not a target)") from the
    run's medians; `rss` is judged against the per-process bound, `peer_rss` only shown."""

    def rps(path: str) -> float | None:
        figure = figures.get((path, 16))
        return None if figure is None else figure.requests_per_second

    def p50(path: str) -> float | None:
        figure = figures.get((path, 1))
        return None if figure is None else figure.p50_ms

    def cpu_ms(path: str) -> float | None:
        figure = figures.get((path, 16))
        return None if figure is None else figure.server_cpu_ms

    def per_cpu(path: str) -> float | None:
        figure = figures.get((path, 16))
        return None if figure is None else figure.requests_per_cpu_second

    def added(path: str) -> float | None:
        through, direct = p50(path), p50(DIRECT_STT)
        return None if through is None or direct is None else round(through - direct, 2)

    def compared(
        name: str,
        figure: float | None,
        floor: float | None,
        unit: str,
        met: Callable[[float], bool] | None,
    ) -> Target:
        """A target judged on figure / floor (`met` None: a figure shown, not judged)."""
        ratio = _ratio(figure, floor)
        return Target(
            name, figure, floor, ratio, None if ratio is None or met is None else met(ratio), unit
        )

    targets: list[Target] = []
    targets.append(
        compared(
            "GET /key req/s at 16 >= 50% of F1",
            rps(GW_KEY),
            rps(F1_KEY),
            "req/s",
            lambda ratio: ratio >= 0.5,
        )
    )
    targets.append(
        compared(
            "GET /key p50 at 1 <= 1.5x F1",
            p50(GW_KEY),
            p50(F1_KEY),
            "ms",
            lambda ratio: ratio <= 1.5,
        )
    )
    targets.append(
        compared(
            "transcription req/s at 16 >= 80% of F2",
            rps(GW_STT),
            rps(F2_STT),
            "req/s",
            lambda ratio: ratio >= 0.8,
        )
    )
    # Not a target: what the req/s ratio comes from, steadier than req/s on a shared machine.
    for path, floor_path in ((GW_KEY, F1_KEY), (GW_STT, F2_STT), (LITELLM_STT, F2_STT)):
        used, floor_used = cpu_ms(path), cpu_ms(floor_path)
        if used is not None:
            targets.append(
                compared(
                    f"(not a target) server CPU per request at 16: {path} vs {floor_path}",
                    used,
                    floor_used,
                    "ms",
                    None,
                )
            )
    gw_added, f2_added = added(GW_STT), added(F2_STT)
    targets.append(
        Target(
            "transcription added p50 at 1 <= F2's + 1.5 ms",
            gw_added,
            f2_added,
            _ratio(gw_added, f2_added),
            None if gw_added is None or f2_added is None else gw_added <= f2_added + 1.5,
            "ms",
        )
    )
    for backend, accepted in videos.items():
        targets.append(
            Target(
                f"video submissions at 16 >= 500 accepted/s ({backend})",
                accepted,
                None,
                None,
                None if accepted is None else accepted >= 500,
                "/s",
            )
        )
    targets.append(
        compared(
            "transcription req/s at 16 >= 3x LiteLLM's",
            rps(GW_STT),
            rps(LITELLM_STT),
            "req/s",
            lambda ratio: ratio >= 3,
        )
    )
    ll_added = added(LITELLM_STT)
    targets.append(
        compared(
            "transcription added p50 at 1 <= 1/3 of LiteLLM's",
            gw_added,
            ll_added,
            "ms",
            lambda ratio: ratio <= 1 / 3,
        )
    )
    bare_added = added(F2_BARE_STT)
    if bare_added is not None:
        # Not a target: whether the stack itself, with the least possible provider call,
        # is within the bound (if not, no gateway on this stack can meet it here).
        targets.append(
            compared(
                "(not a target) F2-bare added p50 at 1 vs 1/3 of LiteLLM's",
                bare_added,
                ll_added,
                "ms",
                None,
            )
        )
    targets.append(
        compared(
            "transcription req/s at 16 >= Portkey's",
            rps(GW_STT),
            rps(PORTKEY_STT),
            "req/s",
            lambda ratio: ratio >= 1,
        )
    )
    targets.append(
        compared(
            "transcription req per CPU-second at 16 >= 1.5x Portkey's (whole tree)",
            per_cpu(GW_STT),
            per_cpu(PORTKEY_STT),
            "req/CPU-s",
            lambda ratio: ratio >= 1.5,
        )
    )
    # Not targets: the floors' requests per CPU-second against Portkey's — what is left,
    # within 1.5x of it, for the gateway's own work on each design (with and without the
    # gRPC hop).
    for floor_path in (F2_BARE_STT, F3_HTTP_STT):
        if per_cpu(floor_path) is not None and per_cpu(PORTKEY_STT) is not None:
            targets.append(
                compared(
                    f"(not a target) {floor_path} req per CPU-second at 16 vs Portkey's",
                    per_cpu(floor_path),
                    per_cpu(PORTKEY_STT),
                    "req/CPU-s",
                    None,
                )
            )
    pk_added = added(PORTKEY_STT)
    targets.append(
        Target(
            "transcription added p50 at 1 <= Portkey's",
            gw_added,
            pk_added,
            _ratio(gw_added, pk_added),
            None if gw_added is None or pk_added is None else gw_added <= pk_added,
            "ms",
        )
    )
    if pk_added is not None:
        # Not targets: whether the stack itself (Envoy + gRPC), with one httpx call (F2) or
        # the least possible provider call (F2-bare), is within Portkey's latency; if even
        # F2-bare is not, no gateway on this stack can meet that target here. F3-http: the
        # same without the gRPC hop (Envoy as a plain HTTP/1.1 proxy to Python).
        for floor_path in (F2_STT, F2_BARE_STT, F3_HTTP_STT):
            floor_added = added(floor_path)
            if floor_added is not None:
                targets.append(
                    compared(
                        f"(not a target) {floor_path} added p50 at 1 vs Portkey's",
                        floor_added,
                        pk_added,
                        "ms",
                        None,
                    )
                )
    for process, mib in rss.items():
        targets.append(
            Target(
                f"peak RSS <= 150 MiB ({process})",
                mib,
                None,
                None,
                None if mib is None else mib <= 150,
                "MiB",
            )
        )
    for peer, mib in (peer_rss or {}).items():
        targets.append(Target(f"(not a target) peak RSS ({peer})", mib, None, None, None, "MiB"))
    return targets


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def report(
    figures: dict[tuple[str, int], Figure],
    targets: Sequence[Target],
    machine: dict[str, Any],
    load_at_start: Sequence[float] = (),
    notes: Sequence[str] = (),
) -> str:
    table = markdown_table(
        [
            "path",
            "concurrency",
            "rounds",
            "req/s (median)",
            "p50 ms (median)",
            "server CPU ms/req",
            "Envoy CPU ms/req",
            "req/CPU-s (tree)",
            "errors",
        ],
        [
            [
                f.path,
                f.concurrency,
                f.rounds,
                f"{f.requests_per_second:.1f}",
                _cell(f.p50_ms),
                _cell(f.server_cpu_ms),
                _cell(f.envoy_cpu_ms),
                _cell(f.requests_per_cpu_second),
                f.errors,
            ]
            for f in sorted(figures.values(), key=lambda f: (f.concurrency, f.path))
        ],
    )
    checks = markdown_table(
        ["target", "figure", "floor / reference", "ratio", "met"],
        [
            [
                t.name,
                f"{_cell(t.figure)} {t.unit}",
                _cell(t.floor),
                _cell(t.ratio),
                "-" if t.met is None else ("met" if t.met else "NOT met"),
            ]
            for t in targets
        ],
    )
    start = " ".join(f"{x:.2f}" for x in load_at_start)
    load = f"at the start {start}, at the end " + " ".join(f"{x:.2f}" for x in os.getloadavg())
    return "\n".join(
        [
            table,
            "",
            checks,
            "",
            f"Machine: {machine.get('cpu')} x{machine.get('nproc')}, Python "
            f"{machine.get('python')}; load average {load}",
            *notes,
        ]
    )


# --- videos ---------------------------------------------------------------------------------


def video_submissions(args: argparse.Namespace, database_url: str | None) -> float | None:
    """Accepted submissions/s at concurrency 16, from `python -m bench.videos`."""
    with tempfile.TemporaryDirectory(prefix="bench-hotpath-videos-") as tmp:
        out = Path(tmp) / "videos.json"
        command = [
            sys.executable,
            "-m",
            "bench.videos",
            "--requests",
            str(args.requests),
            "--warmup",
            str(args.warmup),
            "--time-cap",
            str(args.time_cap),
            "--concurrency",
            "16",
            "--webhook-jobs",
            "0",
            "--json",
            str(out),
        ]
        if database_url:
            command += ["--database-url", database_url]
        subprocess.run(command, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, timeout=600, check=False)
        if not out.exists():
            return None
        document = json.loads(out.read_text(encoding="utf-8"))
        cases = [c for c in document.get("submissions", []) if c.get("concurrency") == 16]
        return float(cases[0]["accepted_per_second"]) if cases else None


# --- main -----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.hotpath",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,  # the docstring as written
    )
    # 5: with 3, the concurrency-1 latency ratios moved by up to ±0.06 between runs of one
    # commit on a shared 2-core VM (a slower phase can fall on some cases of a round only).
    parser.add_argument("--rounds", type=positive_int, default=5, help="interleaved rounds (5)")
    parser.add_argument(
        "--requests",
        type=positive_int,
        default=500,
        help="measured requests per case and round (500)",
    )
    parser.add_argument("--warmup", type=int, default=50, help="warm-up requests per case (50)")
    parser.add_argument(
        "--prewarm",
        type=int,
        default=2000,
        help="unmeasured requests per case at concurrency 16 before the first round, within "
        "--time-cap (2000: Node's JIT warms up)",
    )
    parser.add_argument(
        "--time-cap", type=float, default=30.0, help="hard time cap per case in seconds (30)"
    )
    parser.add_argument("--no-litellm", action="store_true", help="skip LiteLLM")
    parser.add_argument(
        "--no-portkey",
        action="store_true",
        help=f"skip Portkey's gateway ({portkey_gateway.PACKAGE}@{portkey_gateway.VERSION}, "
        "needs node and npm)",
    )
    parser.add_argument("--no-videos", action="store_true", help="skip video submissions")
    parser.add_argument(
        "--pg-url",
        default="postgresql",
        help="PostgreSQL admin URL for the video run ('postgresql' = default)",
    )
    add_json_argument(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    started = time.monotonic()
    load_at_start = os.getloadavg()
    audio = speech(AUDIO_SECONDS)
    rss: dict[str, float | None] = {}
    peer_rss: dict[str, float | None] = {}
    notes: list[str] = []
    use_portkey = not args.no_portkey
    if use_portkey and (missing := portkey_gateway.missing_tools()) is not None:
        print(missing, file=sys.stderr, flush=True)
        notes.append(missing)
        use_portkey = False
    with (
        scratch("bench-hotpath-") as tmp,
        run_database(None, tmp / "data") as database,
        running_fake_provider() as fake,
        running_gateway(
            tmp / "data",
            database,
            1,
            {
                "GATEWAY_CATALOG": str(write_catalog(tmp / "catalog.toml", fake.base_url)),
                FAKE_KEY_ENV: fake.api_key,
            },
        ) as run,
    ):
        key = create_funded_key(tmp / "data", database.url)
        floor = FloorProcess(fake).start()
        bare_floor = FloorProcess(fake, bare=True).start()
        http_floor = FloorProcess(fake, plain_http=True).start()
        proxy = None if args.no_litellm else litellm_proxy.LiteLLMProxy(fake, tmp).start()
        peer: portkey_gateway.PortkeyGateway | None = None
        try:
            if use_portkey:
                peer = portkey_gateway.PortkeyGateway(fake, tmp).start()
            gateway_url = run.gateway.base_url
            assert floor.process is not None and run.gateway.process is not None
            assert bare_floor.process is not None and http_floor.process is not None
            floor_pid, gateway_pid = floor.process.pid, run.gateway.process.pid
            fake_pid = None if fake.process is None else fake.process.pid
            cases = [
                get_case(F1_KEY, floor.base_url, key, floor_pid),
                get_case(GW_KEY, gateway_url, key, gateway_pid),
                post_case(
                    DIRECT_STT,
                    fake.base_url + ROUTE,
                    fake.api_key,
                    UPSTREAM_MODEL,
                    audio,
                    fake_pid,
                ),
                post_case(F2_STT, floor.base_url + ROUTE, key, UPSTREAM_MODEL, audio, floor_pid),
                post_case(
                    F2_BARE_STT,
                    bare_floor.base_url + ROUTE,
                    key,
                    UPSTREAM_MODEL,
                    audio,
                    bare_floor.process.pid,
                ),
                post_case(
                    F3_HTTP_STT,
                    http_floor.base_url + ROUTE,
                    key,
                    UPSTREAM_MODEL,
                    audio,
                    http_floor.process.pid,
                ),
                post_case(GW_STT, gateway_url + ROUTE, key, BENCH_MODEL, audio, gateway_pid),
            ]
            if proxy is not None:
                assert proxy.process is not None
                cases.append(
                    post_case(
                        LITELLM_STT,
                        proxy.base_url + ROUTE,
                        "none",
                        litellm_proxy.MODEL,
                        audio,
                        proxy.process.pid,
                    )
                )
            if peer is not None:
                assert peer.process is not None
                cases.append(
                    post_case(
                        PORTKEY_STT,
                        peer.base_url + ROUTE,
                        fake.api_key,  # passed on to the provider as its key
                        UPSTREAM_MODEL,
                        audio,
                        peer.process.pid,
                        peer.headers,
                    )
                )
            cpu: list[CaseCpu] = []
            results = asyncio.run(run_rounds(cases, args, cpu))
            assert run.gateway.process is not None
            rss["gateway server process"] = largest_process_mib(run.gateway.process.pid)
            rss["floor server"] = floor.peak_rss_mib()
            if proxy is not None:
                peer_rss["LiteLLM"] = proxy.peak_rss_mib()
            if peer is not None:
                peer_rss["Portkey (node)"] = peer.peak_rss_mib()
        finally:
            if peer is not None:
                peer.stop()
            if proxy is not None:
                proxy.stop()
            floor.stop()
            bare_floor.stop()
            http_floor.stop()
    videos: dict[str, float | None] = {}
    if not args.no_videos:
        videos["SQLite"] = video_submissions(args, None)
        videos["PostgreSQL"] = video_submissions(args, args.pg_url)
    figures = summarise(results, cpu)
    targets = evaluate(figures, videos, rss, peer_rss)
    machine = machine_info(database.label)
    print(report(figures, targets, machine, load_at_start, notes))
    by_round = added_p50_by_round(results, GW_STT, PORTKEY_STT)
    if by_round:
        print(
            "transcription added p50 at 1 against Portkey's, round by round: "
            + ", ".join(f"{ratio:.3f}" for ratio in by_round)
        )
    print(f"Took {time.monotonic() - started:.0f} s", file=sys.stderr)
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "benchmark": "hotpath",
                    "date": time.strftime("%Y-%m-%d", time.gmtime()),
                    "load_average": {"start": load_at_start, "end": os.getloadavg()},
                    "machine": machine,
                    "settings": {
                        "rounds": args.rounds,
                        "requests": args.requests,
                        "warmup": args.warmup,
                        "prewarm": args.prewarm,
                        "audio_bytes": len(audio),
                        "litellm": None if args.no_litellm else litellm_proxy.VERSION,
                        "portkey": portkey_gateway.VERSION if use_portkey else None,
                    },
                    "results": [asdict(r) for r in results],
                    "cpu": [asdict(c) for c in cpu],
                    "figures": [asdict(f) for f in figures.values()],
                    "targets": [asdict(t) for t in targets],
                    "gateway_against_portkey_by_round": by_round,
                },
                indent=2,
            )
            + "\n",
            encoding="utf-8",
        )
    return 1 if any(r.errors for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
