"""The housekeeping task (server/maintenance/), in-process on a real SQLite file and
PostgreSQL with a manual clock: each step, its metrics, two processes sharing the work, and
its loop stopping on drain."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from server.billing.holds import place_hold
from server.billing.money import usd_to_micros
from server.clock import ManualClock
from server.db.engine import create_engine, session_factory
from server.db.models import Account, ApiKey, CreditHold, RateWindow, VideoJob, WebhookDelivery
from server.errors import GatewayError
from server.limits.free_models import admit_free_request, free_requests_today
from server.limits.key_status import key_status
from server.maintenance import Maintenance
from server.maintenance.maintenance import BATCH
from server.observability.metrics import Metrics
from server.videos import jobs
from server.videos.content import LocalContentStore
from testkit.admin import Admin, IssuedKey

NOW = datetime(2026, 7, 2, 10, 30, 20, tzinfo=UTC)
_WINDOWS = RateWindow.__table__  # type: ignore[attr-defined]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(NOW)


@pytest.fixture
async def admin(admin_db: Admin, clock: ManualClock) -> Admin:
    admin_db.clock = clock
    return admin_db


@pytest.fixture
def content(tmp_path: Path) -> LocalContentStore:
    return LocalContentStore(tmp_path / "content")


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
def maintenance(
    admin: Admin, clock: ManualClock, content: LocalContentStore, metrics: Metrics
) -> Maintenance:
    return Maintenance(admin.sessions, clock, content, metrics)


def rows_metric(metrics: Metrics, task: str) -> float | None:
    return metrics.registry.get_sample_value("gateway_maintenance_rows_total", {"task": task})


def last_run(metrics: Metrics) -> float | None:
    return metrics.registry.get_sample_value("gateway_maintenance_last_run_timestamp_seconds")


async def _funded_key(admin: Admin, usd: str = "2") -> IssuedKey:
    workspace = await admin.workspace(f"maint-{secrets.token_hex(4)}")
    await admin.credits(workspace, usd)
    return await admin.key(workspace)


async def _hold(admin: Admin, issued: IssuedKey, usd: str, ttl: timedelta) -> None:
    async with admin.sessions() as session:
        await place_hold(
            session,
            account_id=issued.workspace.account_id,
            key_hash=issued.hash,
            amount_micros=usd_to_micros(usd),
            now=admin.clock.now(),
            ttl=ttl,
        )
        await session.commit()


# --- holds ------------------------------------------------------------------------------------


async def test_lapsed_holds_are_swept_and_their_budget_is_free(
    admin: Admin, clock: ManualClock, maintenance: Maintenance, metrics: Metrics
) -> None:
    issued = await _funded_key(admin, "2")
    await _hold(admin, issued, "1.5", timedelta(minutes=1))  # its process dies
    await _hold(admin, issued, "0.4", timedelta(minutes=10))  # still running
    with pytest.raises(GatewayError) as refused:
        await _hold(admin, issued, "1", timedelta(minutes=10))
    assert refused.value.metadata == {"limit_source": "openrouter_in_flight_budget"}

    assert (await maintenance.run_once(clock.now()))["holds"] == 0  # nothing lapsed yet
    assert await admin.count(CreditHold) == 2

    clock.advance(timedelta(minutes=2))
    done = await maintenance.run_once(clock.now())
    assert done["holds"] == 1
    assert await admin.count(CreditHold) == 1  # the running request's hold is untouched
    assert await admin.count(CreditHold, CreditHold.amount_micros == usd_to_micros("0.4")) == 1
    await _hold(admin, issued, "1.5", timedelta(minutes=10))  # the lapsed 1.5 is free again
    assert rows_metric(metrics, "holds") == 1
    assert (await maintenance.run_once(clock.now()))["holds"] == 0  # nothing twice


# --- videos -----------------------------------------------------------------------------------


async def test_an_expired_job_with_a_callback_queues_the_expired_webhook(
    admin: Admin, clock: ManualClock, maintenance: Maintenance
) -> None:
    now = clock.now()
    hooked = await _job(admin, jobs.COMPLETED, now - timedelta(seconds=1), None, "https://h.test/")
    silent = await _job(admin, jobs.COMPLETED, now - timedelta(seconds=1))
    assert (await maintenance.run_once(now))["videos"] == 2
    async with admin.sessions() as session:
        rows = (await session.exec(sa.select(WebhookDelivery))).scalars().all()
    sent = [(r.job_id, json.loads(r.payload)) for r in rows if r.job_id in (hooked, silent)]
    assert [(job, body["type"], body["data"]["status"]) for job, body in sent] == [
        (hooked, "video.generation.expired", "expired")
    ]


async def _job(
    admin: Admin,
    status: str,
    expires_at: datetime | None,
    content: LocalContentStore | None = None,
    callback_url: str | None = None,
) -> str:
    job_id = f"video_{secrets.token_hex(8)}"
    now = admin.clock.now()
    async with admin.sessions() as session:
        session.add(
            VideoJob(
                id=job_id,
                account_id="acct",
                workspace_id="ws",
                key_hash="k" * 64,
                model="local/renderer",
                status=status,
                params={"prompt": "a lighthouse", "duration": 2},
                content_count=1 if content is not None else 0,
                next_run_at=now,
                created_at=now - timedelta(hours=2),
                updated_at=now - timedelta(hours=1),
                completed_at=now - timedelta(hours=1) if status != jobs.PENDING else None,
                expires_at=expires_at,
                callback_url=callback_url,
            )
        )
        await session.commit()
    if content is not None:
        stored = content.path(job_id, 0)
        stored.parent.mkdir(parents=True, exist_ok=True)
        stored.write_bytes(b"\x00\x00\x00\x18ftypmp42")
    return job_id


async def _status(admin: Admin, job_id: str) -> str:
    async with admin.sessions() as session:
        job = await session.get(VideoJob, job_id)
        assert job is not None
        return job.status


async def test_videos_past_retention_expire_and_their_content_is_deleted(
    admin: Admin,
    clock: ManualClock,
    maintenance: Maintenance,
    metrics: Metrics,
    content: LocalContentStore,
) -> None:
    now = clock.now()
    past = await _job(admin, jobs.COMPLETED, now - timedelta(seconds=1), content)
    kept = await _job(admin, jobs.COMPLETED, now + timedelta(hours=1), content)
    failed = await _job(admin, jobs.FAILED, None)
    running = await _job(admin, jobs.IN_PROGRESS, None)

    done = await maintenance.run_once(now)
    assert done["videos"] == 1
    assert await _status(admin, past) == jobs.EXPIRED
    assert not content.path(past, 0).is_file() and not (content.root / past).exists()
    assert await _status(admin, kept) == jobs.COMPLETED and content.path(kept, 0).is_file()
    assert await _status(admin, failed) == jobs.FAILED
    assert await _status(admin, running) == jobs.IN_PROGRESS
    assert rows_metric(metrics, "videos") == 1

    assert (await maintenance.run_once(now))["videos"] == 0  # an expired job stays expired
    clock.advance(timedelta(hours=1))  # the second one's retention ends: exactly then
    assert (await maintenance.run_once(clock.now()))["videos"] == 1
    assert await _status(admin, kept) == jobs.EXPIRED and not content.path(kept, 0).is_file()
    assert rows_metric(metrics, "videos") == 2


# --- rate windows -----------------------------------------------------------------------------


async def _windows(admin: Admin, subject: str) -> set[tuple[str, datetime]]:
    async with admin.sessions() as session:
        rows = (
            await session.exec(  # type: ignore[call-overload]
                sa.select(_WINDOWS.c.period, _WINDOWS.c.window_start).where(
                    _WINDOWS.c.subject_id == subject
                )
            )
        ).all()
    return {(period, start.astimezone(UTC)) for period, start in rows}


async def _seed_windows(admin: Admin, subject: str, rows: list[tuple[str, datetime, int]]) -> None:
    async with admin.sessions() as session:
        await session.exec(
            sa.insert(_WINDOWS),
            params=[
                {"subject_id": subject, "period": p, "window_start": s, "count": c}
                for p, s, c in rows
            ],
        )
        await session.commit()


async def _admit(admin: Admin, account_id: str, now: datetime) -> None:
    async with admin.sessions() as session:
        account = await session.get(Account, account_id)
        assert account is not None
        await admit_free_request(
            session,
            account_id=account_id,
            credits_purchased_micros=account.credits_purchased_micros,
            exempt=False,
            now=now,
        )
        await session.commit()


async def _used_today(admin: Admin, issued: IssuedKey, now: datetime) -> tuple[int, int]:
    """What GET /key reports of the free-model day, and the counter it reads."""
    async with admin.sessions() as session:
        key = await session.get(ApiKey, issued.hash)
        account = await session.get(Account, issued.workspace.account_id)
        assert key is not None and account is not None
        status = await key_status(session, key, account, now)
        return (
            status.free_model_daily_requests.used,
            await free_requests_today(session, account.id, now),
        )


async def test_ended_rate_windows_are_pruned_and_current_counts_kept(
    admin: Admin, clock: ManualClock, maintenance: Maintenance, metrics: Metrics
) -> None:
    issued = await _funded_key(admin, "1")  # 50 free requests a day, 20 a minute
    account = issued.workspace.account_id
    now = clock.now()  # 10:30:20 on 2 July
    minute = now.replace(second=0)
    midnight = now.replace(hour=0, minute=0, second=0)
    await _seed_windows(
        admin,
        account,
        [
            ("minute", minute - timedelta(minutes=2), 20),  # ended 80 s ago: pruned
            ("minute", minute - timedelta(minutes=1), 20),  # ended 20 s ago: within the grace
            ("minute", minute, 18),  # the current minute
            ("day", midnight - timedelta(days=2), 50),  # pruned
            ("day", midnight - timedelta(days=1), 50),  # ended 10 h ago: pruned
            ("day", midnight, 40),  # today
        ],
    )
    await _seed_windows(admin, "another-account", [("minute", minute - timedelta(hours=3), 1)])
    await _admit(admin, account, now)  # 19 this minute, 41 today
    before = await _used_today(admin, issued, now)
    assert before == (41, 41)

    done = await maintenance.run_once(now)
    assert done["rate_windows"] == 4
    assert rows_metric(metrics, "rate_windows") == 4
    assert await _windows(admin, account) == {
        ("minute", minute - timedelta(minutes=1)),
        ("minute", minute),
        ("day", midnight),
    }
    assert await _windows(admin, "another-account") == set()
    assert await _used_today(admin, issued, now) == before  # GET /key reads the same

    # The counts went on where they were: one more this minute, then the minute is full.
    await _admit(admin, account, now)
    with pytest.raises(GatewayError) as limited:
        await _admit(admin, account, now)
    assert limited.value.status == 429
    assert await _used_today(admin, issued, now) == (42, 42)

    clock.advance(timedelta(minutes=1))  # 10:31:20: the 10:29 window ended 80 s ago
    assert (await maintenance.run_once(clock.now()))["rate_windows"] == 1
    assert ("minute", minute) in await _windows(admin, account)  # ended only 20 s ago


async def test_a_large_backlog_of_windows_is_pruned_in_batches(
    admin: Admin, clock: ManualClock, maintenance: Maintenance, metrics: Metrics
) -> None:
    old = clock.now() - timedelta(days=3)
    backlog = 2 * BATCH + 7
    await _seed_windows(
        admin, "busy-account", [("minute", old + timedelta(minutes=i), 1) for i in range(backlog)]
    )
    assert (await maintenance.run_once(clock.now()))["rate_windows"] == backlog
    assert await admin.count(RateWindow, RateWindow.subject_id == "busy-account") == 0
    assert rows_metric(metrics, "rate_windows") == backlog


# --- metrics, several processes, the loop -----------------------------------------------------


async def test_metrics_start_at_zero_and_record_the_last_complete_run(
    maintenance: Maintenance, metrics: Metrics, clock: ManualClock
) -> None:
    for task in ("holds", "videos", "rate_windows"):
        assert rows_metric(metrics, task) == 0
    assert last_run(metrics) == 0
    await maintenance.run_once(clock.now())
    assert last_run(metrics) == clock.now().timestamp()


async def test_a_failing_step_is_counted_and_the_others_still_run(
    admin: Admin,
    maintenance: Maintenance,
    metrics: Metrics,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    issued = await _funded_key(admin)
    await _hold(admin, issued, "1", timedelta(minutes=1))

    async def broken(now: datetime) -> int:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(maintenance, "prune_rate_windows", broken)
    clock.advance(timedelta(minutes=2))
    done = await maintenance.run_once(clock.now())
    assert done == {"holds": 1, "videos": 0}
    assert (
        metrics.registry.get_sample_value(
            "gateway_maintenance_failures_total", {"task": "rate_windows"}
        )
        == 1
    )
    assert last_run(metrics) == 0  # not a complete run


@pytest.fixture
async def second_process(db_url: str) -> AsyncIterator[Admin]:
    """Another server process on the same database: its own engine and connections."""
    engine = create_engine(db_url)
    yield Admin(session_factory(engine))
    await engine.dispose()


async def test_two_processes_share_the_work_without_doing_anything_twice(
    admin: Admin,
    second_process: Admin,
    clock: ManualClock,
    content: LocalContentStore,
    maintenance: Maintenance,
    metrics: Metrics,
) -> None:
    now = clock.now()
    videos = [
        await _job(admin, jobs.COMPLETED, now - timedelta(minutes=1), content) for _ in range(6)
    ]
    issued = await _funded_key(admin, "10")
    for _ in range(5):
        await _hold(admin, issued, "1", timedelta(seconds=1))
    old = now - timedelta(days=3)
    await _seed_windows(
        admin, "two-procs", [("minute", old + timedelta(minutes=i), 1) for i in range(300)]
    )

    other_metrics = Metrics()
    other = Maintenance(second_process.sessions, clock, content, other_metrics)
    clock.advance(timedelta(seconds=2))
    results = await asyncio.gather(maintenance.run_once(clock.now()), other.run_once(clock.now()))
    for task, expected in (("holds", 5), ("videos", 6), ("rate_windows", 300)):
        assert sum(r[task] for r in results) == expected, task
        assert (rows_metric(metrics, task) or 0) + (rows_metric(other_metrics, task) or 0) == (
            expected
        )
    assert await admin.count(CreditHold) == 0
    assert await admin.count(VideoJob, VideoJob.status == jobs.EXPIRED) == 6
    assert not any(content.path(job_id, 0).is_file() for job_id in videos)


async def test_the_loop_runs_at_its_interval_and_stops_on_drain(
    admin: Admin, clock: ManualClock, content: LocalContentStore, metrics: Metrics
) -> None:
    maintenance = Maintenance(admin.sessions, clock, content, metrics, interval=0.05)
    issued = await _funded_key(admin)
    stop = asyncio.Event()
    task = asyncio.create_task(maintenance.run(stop))
    try:
        for _ in range(200):  # the first run is at once
            if last_run(metrics) == clock.now().timestamp():
                break
            await asyncio.sleep(0.01)
        assert last_run(metrics) == clock.now().timestamp()

        await _hold(admin, issued, "1", timedelta(seconds=1))
        clock.advance(timedelta(seconds=5))  # the next run, within the interval, sweeps it
        for _ in range(200):
            if last_run(metrics) == clock.now().timestamp():
                break
            await asyncio.sleep(0.01)
        assert last_run(metrics) == clock.now().timestamp()
        assert await admin.count(CreditHold) == 0
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)  # drained: the loop returns


async def test_a_content_delete_that_fails_leaves_the_other_expired_videos_deleted(
    admin: Admin, clock: ManualClock, metrics: Metrics, content: LocalContentStore
) -> None:
    """Object storage unreachable for one delete: that failure is logged and counted, the
    other expired jobs' content is still deleted (not left behind for good)."""
    calls: list[str] = []

    class FlakyStore(LocalContentStore):
        async def delete(self, job_id: str) -> None:
            calls.append(job_id)
            if len(calls) == 1:
                raise OSError("storage unreachable")
            await super().delete(job_id)

    store = FlakyStore(content.root)
    maintenance = Maintenance(admin.sessions, clock, store, metrics)
    now = clock.now()
    expired = [await _job(admin, jobs.COMPLETED, now - timedelta(seconds=1), store) for _ in "ab"]
    done = await maintenance.run_once(now)
    assert done["videos"] == 2
    assert sorted(calls) == sorted(expired)
    assert [store.path(job, 0).is_file() for job in calls] == [True, False]
    assert (
        metrics.registry.get_sample_value("gateway_maintenance_failures_total", {"task": "videos"})
        == 1
    )
