"""The console's read routes' domain: activity per day (server/observability/activity.py),
the generation list, the video job list and a job's webhook deliveries
(server/videos/listing.py) — confined to a workspace, filtered, paged, newest first."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from openrouter import components

from server.accounts.interns import intern_document, list_interns
from server.billing.purchases import list_purchases, purchase_document, purchases_page
from server.db.models import Generation, VideoJob, WebhookDelivery
from server.errors import GatewayError
from server.observability.activity import activity, list_generations, page_of
from server.observability.generations import store_generation
from server.videos.listing import delivery_document, job_deliveries, job_summary, list_jobs
from testkit.admin import IssuedKey
from testkit.domain import Domain


async def _generation(
    domain: Domain,
    issued: IssuedKey,
    number: int,
    *,
    days_ago: int = 0,
    model: str = "unit/ok",
    provider: str = "alpha",
    cost: int = 1000,
    is_byok: bool = False,
    status: str = "completed",
    kind: str = "stt",
) -> str:
    record = Generation(
        id=f"gen_{issued.hash[:6]}_{number}",
        account_id=issued.workspace.account_id,
        workspace_id=issued.workspace.id,
        key_hash=issued.hash,
        kind=kind,
        model=model,
        provider=provider,
        status=status,
        cost_micros=cost,
        is_byok=is_byok,
        created_at=domain.clock.now() - timedelta(days=days_ago, seconds=-number),
    )
    async with domain.sessions() as session:
        await store_generation(session, record)
        await session.commit()
    return record.id


async def test_activity_is_spend_per_day_model_and_provider_of_the_last_30_days(
    any_domain: Domain,
) -> None:
    domain = any_domain  # the sums are SQL: on each backend
    first = await domain.funded_key("act-first")
    second = await domain.admin.key(first.workspace, "act-second")
    outsider = await domain.funded_key("act-outsider")
    await _generation(domain, first, 1, cost=1000)
    await _generation(domain, first, 2, cost=2500)
    await _generation(domain, first, 3, cost=700, is_byok=True)
    await _generation(domain, first, 4, model="unit/other", provider="beta", cost=10)
    await _generation(domain, first, 5, days_ago=29, cost=5)
    await _generation(domain, first, 6, days_ago=30, cost=99)  # outside the window
    await _generation(domain, second, 8, cost=4000)
    await _generation(domain, outsider, 7, cost=123456)
    now = domain.clock.now()
    today = now.date().isoformat()
    async with domain.sessions() as session:
        rows = await activity(session, first.workspace.id, now)
        one_day = await activity(session, first.workspace.id, now, wanted_date=today)
        by_key = await activity(session, first.workspace.id, now, group_by="api_key")
        other_key = await activity(session, first.workspace.id, now, key_hash=outsider.hash)
        for wrong in (
            {"wanted_date": "2020-01-01"},
            {"wanted_date": "today"},
            {"group_by": "model"},
        ):
            with pytest.raises(GatewayError) as refused:
                await activity(session, first.workspace.id, now, **wrong)  # type: ignore[arg-type]
            assert refused.value.status == 400
    summary = {(r["date"], r["model"], r["provider_name"]): r for r in rows}
    assert len(rows) == 3  # today's two models, and the day 29 days ago
    today_ok = summary[(today, "unit/ok", "alpha")]
    assert today_ok["usage"] == 0.0075 and today_ok["byok_usage_inference"] == 0.0007
    assert today_ok["requests"] == 4 and today_ok["api_key_hash"] is None
    assert summary[(today, "unit/other", "beta")]["usage"] == 0.00001
    assert rows[0]["date"] < today  # oldest day first
    assert [r for r in one_day if r["date"] != today] == [] and len(one_day) == 2
    split = {(r["api_key_hash"], r["model"]): r for r in by_key if r["date"] == today}
    assert split[(second.hash, "unit/ok")]["usage"] == 0.004
    assert split[(first.hash, "unit/ok")]["requests"] == 3
    assert other_key == []  # another workspace's key: nothing of this workspace
    # The official SDK's model reads the answer.
    parsed = components.ActivityResponse.model_validate({"data": by_key}).data
    assert {item.model for item in parsed} == {"unit/ok", "unit/other"}


async def test_generations_are_listed_newest_first_filtered_and_paged(domain: Domain) -> None:
    issued = await domain.funded_key("list-gen")
    outsider = await domain.funded_key("list-gen-out")
    ids = [await _generation(domain, issued, n) for n in range(5)]
    failed = await _generation(domain, issued, 9, status="failed", model="unit/other")
    await _generation(domain, outsider, 10)
    workspace = issued.workspace.id
    async with domain.sessions() as session:
        page, total = await list_generations(session, workspace, page_of(0, 2))
        rest, _ = await list_generations(session, workspace, page_of(2, 10))
        failures, failed_total = await list_generations(
            session, workspace, page_of(None, None), status="failed"
        )
        by_model, _ = await list_generations(
            session, workspace, page_of(None, None), model="unit/ok", api_type="stt"
        )
        none_of_key, none_total = await list_generations(
            session, workspace, page_of(None, None), key_hash=outsider.hash
        )
        with pytest.raises(GatewayError):
            await list_generations(session, workspace, page_of(None, None), status="running")
    assert total == 6 and [g.id for g in page] == [failed, ids[4]]
    assert [g.id for g in rest] == ids[3::-1]
    assert [g.id for g in failures] == [failed] and failed_total == 1
    assert {g.id for g in by_model} == set(ids)
    assert none_of_key == [] and none_total == 0
    for offset, limit in ((-1, None), (None, 0), (None, 101)):
        with pytest.raises(GatewayError) as refused:
            page_of(offset, limit)
        assert refused.value.status == 400


async def test_video_jobs_and_their_webhook_deliveries_are_listed(domain: Domain) -> None:
    issued = await domain.funded_key("list-videos")
    outsider = await domain.funded_key("list-videos-out")
    now = domain.clock.now()

    def job(number: int, owner: IssuedKey, status: str) -> VideoJob:
        return VideoJob(
            id=f"vid_{owner.hash[:6]}_{number}",
            account_id=owner.workspace.account_id,
            workspace_id=owner.workspace.id,
            key_hash=owner.hash,
            model="unit/video",
            status=status,
            params={"prompt": f"prompt {number}", "duration": 4, "resolution": "720p"},
            callback_url="https://hooks.example.com/in" if number == 1 else None,
            next_run_at=now,
            created_at=now + timedelta(seconds=number),
            updated_at=now,
            cost_micros=1500 if status == "completed" else None,
            content_count=1 if status == "completed" else 0,
        )

    jobs = [job(1, issued, "completed"), job(2, issued, "pending"), job(3, outsider, "failed")]
    delivery = WebhookDelivery(
        id="whd_1",
        workspace_id=issued.workspace.id,
        job_id=jobs[0].id,
        url="https://hooks.example.com/in",
        payload='{"type": "video.generation.completed"}',
        status="pending",
        attempts=2,
        last_status=500,
        next_attempt_at=now + timedelta(minutes=5),
        created_at=now,
    )
    async with domain.sessions() as session:
        session.add_all([*jobs, delivery])
        await session.commit()
    principal = await domain.principal(issued)
    async with domain.sessions() as session:
        listed, total = await list_jobs(session, issued.workspace.id, page_of(None, None))
        pending, _ = await list_jobs(
            session, issued.workspace.id, page_of(None, None), status="pending"
        )
        one, one_total = await list_jobs(
            session, issued.workspace.id, page_of(None, None), job_id=jobs[0].id
        )
        foreign, _ = await list_jobs(
            session, issued.workspace.id, page_of(None, None), job_id=jobs[2].id
        )
        deliveries = await job_deliveries(session, principal, jobs[0].id)
        with pytest.raises(GatewayError) as hidden:
            await job_deliveries(session, principal, jobs[2].id)
        with pytest.raises(GatewayError):
            await list_jobs(session, issued.workspace.id, page_of(None, None), status="done")
    assert [j.id for j in listed] == [jobs[1].id, jobs[0].id] and total == 2
    assert [j.id for j in pending] == [jobs[1].id]
    assert hidden.value.status == 404  # another workspace's job
    summary = job_summary(listed[1])
    assert summary["cost"] == 0.0015 and summary["api_key_hash"] == issued.hash
    # What was asked and where its webhooks go, so the console can tell jobs apart.
    assert summary["prompt"] == "prompt 1" and summary["duration"] == 4
    assert summary["resolution"] == "720p" and summary["aspect_ratio"] is None
    assert summary["callback_url"] == "https://hooks.example.com/in"
    assert job_summary(listed[0])["callback_url"] is None
    assert [j.id for j in one] == [jobs[0].id] and one_total == 1
    assert foreign == []  # another workspace's job, by id: not listed
    [document] = [delivery_document(d) for d in deliveries]
    assert document["event"] == "video.generation.completed" and document["attempts"] == 2
    assert document["last_status"] == 500 and document["next_attempt_at"] is not None


async def test_purchases_are_the_account_s_own_newest_first(domain: Domain) -> None:
    issued = await domain.funded_key("purchases", usd="3")
    other = await domain.funded_key("purchases-other", usd="7")
    domain.clock.advance(timedelta(minutes=1))
    await domain.admin.credits(issued.workspace, "1.5")
    async with domain.sessions() as session:
        entries, total = await list_purchases(session, issued.workspace.account_id, 0, 20)
        second_page, _ = await list_purchases(session, issued.workspace.account_id, 1, 1)
    assert [purchase_document(e)["amount"] for e in entries] == [1.5, 3] and total == 2
    assert [e.id for e in second_page] == [entries[1].id]
    assert other.workspace.account_id not in {e.account_id for e in entries}


async def test_purchases_are_read_by_their_index_in_page_order(domain: Domain) -> None:
    """The purchases list seeks the account's purchases in the index made for it (migration
    0018), already in the order it pages them: no scan of the account's charges, no sort."""
    issued = await domain.funded_key("purchases-plan", usd="3")
    statement = purchases_page(issued.workspace.account_id, 0, 20)
    async with domain.sessions() as session:
        connection = await session.connection()
        sql = str(statement.compile(connection.engine, compile_kwargs={"literal_binds": True}))
        plan = " | ".join(
            str(row[-1]) for row in await connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}")
        )
    assert "ix_ledger_entries_account_kind_created" in plan, plan
    assert "TEMP B-TREE" not in plan, plan


async def test_interns_are_listed_only_inside_the_intern_programme(domain: Domain) -> None:
    programme = await domain.admin.workspace("interns-on", intern_programme=True)
    outside = await domain.admin.workspace("interns-off")
    for name in ("zoe", "ada"):
        await domain.admin.intern(programme, name)
    await domain.admin.intern(outside, "bob")
    async with domain.sessions() as session:
        listed = await list_interns(session, programme)
        hidden = await list_interns(session, outside)
    assert [intern_document(i)["name"] for i in listed] == ["ada", "zoe"]
    assert hidden == []


async def test_activity_days_are_utc_days_summed_exactly_by_the_database(
    any_domain: Domain,
) -> None:
    """Two generations 20 minutes apart across UTC midnight fall on two days, whatever the
    database session's time zone; large sums stay exact to the micro-dollar."""
    domain = any_domain
    today = domain.clock.now().astimezone(UTC).date()
    midnight = datetime(today.year, today.month, today.day, tzinfo=UTC)
    domain.clock.set(midnight + timedelta(minutes=30))
    issued = await domain.funded_key("act-midnight")
    big = 123_456_789_012_345  # 123456789.012345 USD: 15 significant digits
    # 00:30 today (big), 23:50 yesterday (twice, 1 each), 00:10 today (2)
    await _generation(domain, issued, 1, cost=big, days_ago=0)
    for number, minutes in ((2, -10), (3, -10), (4, 10)):
        record = Generation(
            id=f"gen_mid_{number}",
            account_id=issued.workspace.account_id,
            workspace_id=issued.workspace.id,
            key_hash=issued.hash,
            kind="stt",
            model="unit/ok",
            provider="alpha",
            status="completed",
            cost_micros=1 if minutes < 0 else 2,
            created_at=midnight + timedelta(minutes=minutes),
        )
        async with domain.sessions() as session:
            await store_generation(session, record)
            await session.commit()
    async with domain.sessions() as session:
        if domain.dialect == "postgres":
            connection = await session.connection()
            await connection.execute(sa.text("SET TIME ZONE 'America/New_York'"))
        rows = await activity(session, issued.workspace.id, domain.clock.now())
    by_day = {r["date"]: r for r in rows}
    yesterday = (today - timedelta(days=1)).isoformat()
    assert by_day[yesterday]["requests"] == 2 and by_day[yesterday]["usage"] == 0.000002
    assert by_day[today.isoformat()]["requests"] == 2
    assert by_day[today.isoformat()]["usage"] == float("123456789.012347")
