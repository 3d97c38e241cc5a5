"""Prometheus metrics of one server process, served on the operator's metrics port.

Every process keeps its own registry (passed in, never the library's global one) and serves
it on its own port; Prometheus scrapes each process. The queue gauges are read from the
shared database, so every process reports the same cluster-wide value (take max() over
processes, not sum())."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from server.billing.money import micros_to_json_number
from server.db.driver import InlineStats

# Request latencies from a fast key lookup to a slow provider call.
_LATENCY_BUCKETS = (0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "gateway_requests",
            "Requests by route (REST route, or gRPC method without one) and HTTP status "
            "(499: the caller went away, or the server stopped, before the answer)",
            ["route", "status"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "gateway_request_duration_seconds",
            "Time the server took to answer, by route",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.provider_calls = Counter(
            "gateway_provider_calls",
            "Calls to model providers by provider, operation and outcome (ok or a failure kind)",
            ["provider", "operation", "outcome"],
            registry=r,
        )
        self.provider_seconds = Histogram(
            "gateway_provider_call_duration_seconds",
            "Provider call latency by provider and operation",
            ["provider", "operation"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.fallbacks = Counter(
            "gateway_provider_fallbacks",
            "Requests moved on to the next endpoint after this provider failed",
            ["model", "provider"],
            registry=r,
        )
        self.admissions = Counter(
            "gateway_admissions",
            "Billable requests admitted or refused by the limits "
            "(admitted, credits, key_limit, in_flight_budget, free_minute, free_day)",
            ["outcome"],
            registry=r,
        )
        self.charges_lost = Counter(
            "gateway_charges_lost",
            "Requests answered whose charge could not be recorded after the answer (tried "
            "again, then given up: not charged)",
            registry=r,
        )
        self.charges_lost_usd = Counter(
            "gateway_charges_lost_usd",
            "What the requests of gateway_charges_lost would have been charged, in USD",
            registry=r,
        )
        self.holds_open = Gauge(
            "gateway_credit_holds_open",
            "Credit holds of requests still running and budget leases (all processes)",
            registry=r,
        )
        self.holds_open_usd = Gauge(
            "gateway_credit_holds_open_usd",
            "USD held by requests still running and by budget leases (all processes)",
            registry=r,
        )
        self.video_jobs = Gauge(
            "gateway_video_jobs",
            "Video jobs waiting or running, by status: the job queue depth (all processes)",
            ["status"],
            registry=r,
        )
        self.webhook_backlog = Gauge(
            "gateway_webhook_backlog",
            "Webhook deliveries not yet delivered, stopped or given up (all processes)",
            registry=r,
        )
        self.database_up = Gauge(
            "gateway_database_up",
            "1 while the database answers this process, else 0",
            registry=r,
        )
        self.maintenance_rows = Counter(
            "gateway_maintenance_rows",
            "Rows the housekeeping of this process deleted or expired, by task (holds: lapsed "
            "credit holds, videos: videos past retention, rate_windows: ended free windows)",
            ["task"],
            registry=r,
        )
        self.maintenance_failures = Counter(
            "gateway_maintenance_failures",
            "Housekeeping steps of this process that failed, by task",
            ["task"],
            registry=r,
        )
        self.maintenance_last_run = Gauge(
            "gateway_maintenance_last_run_timestamp_seconds",
            "When the housekeeping of this process last completed every step (Unix time)",
            registry=r,
        )
        self._request_children: dict[tuple[str, int], tuple[Any, Any]] = {}
        # Labelled children looked up once (labels() costs microseconds per call); the label
        # sets are small and fixed: providers of the catalog, operations, outcomes.
        self._call_counts: dict[tuple[str, str, str], Any] = {}
        self._call_seconds: dict[tuple[str, str], Any] = {}
        self._admission_counts: dict[str, Any] = {}
        for task in ("holds", "videos", "rate_windows"):  # exported from the start, at 0
            self.maintenance_rows.labels(task)
            self.maintenance_failures.labels(task)

    def charge_lost(self, micros: int) -> None:
        """Count an answered request whose charge was given up (not charged)."""
        self.charges_lost.inc()
        self.charges_lost_usd.inc(micros_to_json_number(micros))  # a metric, not a record

    def request_done(self, route: str, status: int, seconds: float) -> None:
        """Count one answered rpc and its duration. The labelled children are looked up once
        per (route, status) — both sets are small and fixed — not on every request."""
        key = (route, status)
        children = self._request_children.get(key)
        if children is None:
            children = (
                self.requests.labels(route, str(status)),
                self.request_seconds.labels(route),
            )
            self._request_children[key] = children
        count, duration = children
        count.inc()
        duration.observe(seconds)

    def admission(self, outcome: str) -> None:
        """Count one admission decision (admitted, or the limit that refused)."""
        child = self._admission_counts.get(outcome)
        if child is None:
            child = self._admission_counts[outcome] = self.admissions.labels(outcome)
        child.inc()

    @contextmanager
    def provider_call(self, provider: str, operation: str) -> Iterator[None]:
        """Time one provider call; the outcome is the failure's kind, if it raised one."""
        started = time.perf_counter()
        outcome = "ok"
        try:
            yield
        except BaseException as exc:
            outcome = str(getattr(exc, "kind", None) or "error")
            raise
        finally:
            elapsed = time.perf_counter() - started
            key = (provider, operation, outcome)
            count = self._call_counts.get(key)
            if count is None:
                count = self._call_counts[key] = self.provider_calls.labels(*key)
            count.inc()
            seconds = self._call_seconds.get(key[:2])
            if seconds is None:
                seconds = self._call_seconds[key[:2]] = self.provider_seconds.labels(*key[:2])
            seconds.observe(elapsed)

    def watch_sqlite_writer(self, stats: InlineStats) -> None:
        """Report the group-commit writer's own SQLite connection (a SQLite file only): its
        WAL checkpoints, the TRUNCATE ones that hold every process's writers off, and its
        waits for another process's write lock. Read at each scrape."""
        self.registry.register(_SqliteWriterCollector(stats))

    def serve(self, host: str, port: int) -> Any:
        """Serve /metrics on host:port from a daemon thread; returns the HTTP server."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return server


class _SqliteWriterCollector(Collector):
    def __init__(self, stats: InlineStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats
        checkpoints = CounterMetricFamily(
            "gateway_sqlite_wal_checkpoints",
            "WAL checkpoints of this process's writer: beside its batches, or between them "
            "(the WAL past its bound: the writer's batches waited)",
            labels=["when"],
        )
        between = stats.checkpoints_between_batches
        checkpoints.add_metric(["beside"], stats.checkpoints - between)
        checkpoints.add_metric(["between"], between)
        yield checkpoints
        yield CounterMetricFamily(
            "gateway_sqlite_wal_checkpoint_seconds",
            "Time this process's writer spent in WAL checkpoints",
            value=stats.checkpoint_seconds,
        )
        yield CounterMetricFamily(
            "gateway_sqlite_wal_truncations",
            "TRUNCATE checkpoints (the WAL file past its bound): every process's writers wait "
            "while one runs",
            value=stats.truncations,
        )
        yield CounterMetricFamily(
            "gateway_sqlite_wal_truncation_seconds",
            "Time those TRUNCATE checkpoints took",
            value=stats.truncation_seconds,
        )
        yield GaugeMetricFamily(
            "gateway_sqlite_wal_truncation_longest_seconds",
            "The longest TRUNCATE checkpoint since the process started",
            value=stats.longest_truncation_seconds,
        )
        yield CounterMetricFamily(
            "gateway_sqlite_lock_waits",
            "Batches of this process's writer that found the write lock held by another "
            "process and waited for it",
            value=stats.busy_waits,
        )
        yield CounterMetricFamily(
            "gateway_sqlite_lock_wait_seconds",
            "Time those batches waited",
            value=stats.busy_wait_seconds,
        )
