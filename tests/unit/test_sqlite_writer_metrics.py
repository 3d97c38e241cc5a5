"""The group-commit writer's SQLite connection as metrics (Metrics.watch_sqlite_writer): its
stats (server/db/driver.py InlineStats) read at each scrape."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from server.db.driver import InlineStats
from server.observability.metrics import Metrics


def _scrape(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(metrics.registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_the_writers_checkpoints_truncations_and_lock_waits_are_scraped_as_they_are_now() -> None:
    stats = InlineStats()
    metrics = Metrics()
    metrics.watch_sqlite_writer(stats)
    assert _scrape(metrics)[("gateway_sqlite_wal_truncations_total", ())] == 0
    stats.checkpoints, stats.checkpoints_between_batches = 7, 2
    stats.checkpoint_seconds = 0.5
    stats.truncations, stats.truncation_seconds = 3, 0.09
    stats.longest_truncation_seconds = 0.05
    stats.busy_waits, stats.busy_wait_seconds = 4, 0.02
    found = _scrape(metrics)  # read again at this scrape, not kept from the first
    assert found[("gateway_sqlite_wal_checkpoints_total", (("when", "beside"),))] == 5
    assert found[("gateway_sqlite_wal_checkpoints_total", (("when", "between"),))] == 2
    assert found[("gateway_sqlite_wal_checkpoint_seconds_total", ())] == 0.5
    assert found[("gateway_sqlite_wal_truncations_total", ())] == 3
    assert found[("gateway_sqlite_wal_truncation_seconds_total", ())] == 0.09
    assert found[("gateway_sqlite_wal_truncation_longest_seconds", ())] == 0.05
    assert found[("gateway_sqlite_lock_waits_total", ())] == 4
    assert found[("gateway_sqlite_lock_wait_seconds_total", ())] == 0.02
