"""Operating the gateway: Prometheus metrics, JSON logs with request ids, OTLP traces,
health that follows the database, and a SIGTERM that drains."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import pytest_asyncio
import sqlalchemy as sa
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from server.contract import keys_pb2, keys_pb2_grpc
from server.db.engine import create_engine, session_factory
from server.db.models import CreditHold, VideoJob
from testkit.admin import Admin, IssuedKey
from testkit.catalog import write_test_catalog
from testkit.eventually import eventually
from testkit.fakes.openai_stt import FakeSttProvider
from testkit.fakes.webhook_receiver import WebhookReceiver
from testkit.processes import GatewayProcess, refusing_port
from tests.conftest import Databases, Stack, gateway_env, own_gateway
from tests.fakes.otlp_collector import OtlpCollector
from tests.support.tcp_proxy import TcpProxy
from tests.test_transcription import audio_body

W3C_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
W3C_PARENT = "00f067aa0ba902b7"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


async def scrape(gateway: GatewayProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with httpx.AsyncClient() as client:
        response = await client.get(gateway.metrics_url)
    assert response.status_code == 200
    return samples(response.text)


def value(found: dict[Any, float], name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


# --- metrics ----------------------------------------------------------------------------------


async def test_metrics_count_routes_providers_fallbacks_and_admissions(
    stack: Stack, funded: IssuedKey, unique: str
) -> None:
    before = await scrape(stack.gateway)
    broke = await stack.admin.key(await stack.admin.workspace(f"broke-{unique}"), "broke")
    async with httpx.AsyncClient(timeout=60) as client:
        url = f"{stack.base_url}/audio/transcriptions"
        assert (
            await client.get(f"{stack.base_url}/key", headers=funded.headers)
        ).status_code == 200
        assert (await client.get(f"{stack.base_url}/key")).status_code == 401
        served = await client.post(url, json=audio_body("fake/500-then-ok"), headers=funded.headers)
        assert served.status_code == 200, served.text
        refused = await client.post(url, json=audio_body("fake/ok"), headers=broke.headers)
        assert refused.status_code == 402
    after = await scrape(stack.gateway)

    def grew(name: str, by: float = 1, **labels: str) -> bool:
        return value(after, name, **labels) - value(before, name, **labels) >= by

    assert grew("gateway_requests_total", route="GET /api/v1/key", status="200")
    assert grew("gateway_requests_total", route="GET /api/v1/key", status="401")
    route = "POST /api/v1/audio/transcriptions"
    assert grew("gateway_requests_total", route=route, status="200")
    assert grew("gateway_requests_total", route=route, status="402")
    assert grew("gateway_request_duration_seconds_count", 2, route=route)
    calls = "gateway_provider_calls_total"
    stt = "transcription"
    assert grew(calls, provider="alpha", operation=stt, outcome="server_error")
    assert grew(calls, provider="beta", operation=stt, outcome="ok")
    assert grew(
        "gateway_provider_call_duration_seconds_count", provider="beta", operation="transcription"
    )
    assert grew("gateway_provider_fallbacks_total", model="fake/500-then-ok", provider="alpha")
    assert grew("gateway_admissions_total", outcome="admitted")
    assert grew("gateway_admissions_total", outcome="credits")
    # The queue gauges and the database probe are there from the start.
    assert value(after, "gateway_database_up") == 1
    for name, labels in (
        ("gateway_video_jobs", {"status": "pending"}),
        ("gateway_video_jobs", {"status": "in_progress"}),
        ("gateway_webhook_backlog", {}),
        ("gateway_credit_holds_open", {}),
        ("gateway_credit_holds_open_usd", {}),
        # The stack runs on a SQLite file: its writer's connection is reported too.
        ("gateway_sqlite_wal_checkpoints_total", {"when": "beside"}),
        ("gateway_sqlite_wal_truncations_total", {}),
        ("gateway_sqlite_lock_waits_total", {}),
    ):
        assert (name, tuple(sorted(labels.items()))) in after, name


async def test_a_202_and_a_204_are_counted_as_such(stack: Stack, funded: IssuedKey) -> None:
    before = await scrape(stack.gateway)
    async with httpx.AsyncClient(timeout=30) as client:
        submitted = await client.post(
            f"{stack.base_url}/videos",
            json={"model": "fakevideo/provider-fails", "prompt": "a cat", "duration": 1},
            headers=funded.headers,
        )
    assert submitted.status_code == 202, submitted.text
    after = await scrape(stack.gateway)
    key = ("gateway_requests_total", (("route", "POST /api/v1/videos"), ("status", "202")))
    assert after[key] - before.get(key, 0) == 1


# --- logs ----------------------------------------------------------------------------------------


def log_entries(gateway: GatewayProcess) -> list[dict[str, Any]]:
    entries = []
    for line in gateway.log().splitlines():
        if line.startswith("{"):
            entries.append(json.loads(line))
    return entries


async def test_json_logs_carry_the_request_id_envoy_returns(
    stack: Stack, funded: IssuedKey
) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.get(f"{stack.base_url}/key", headers=funded.headers)
    request_id = response.headers["x-request-id"]
    assert request_id
    matching = await eventually(
        lambda: [e for e in log_entries(stack.gateway) if e.get("request_id") == request_id],
        within=5,
        message="the request's access log line",
    )
    assert len(matching) == 1, "one access log line per request"
    entry = matching[0]
    assert entry["route"] == "GET /api/v1/key"
    assert entry["status"] == 200
    assert entry["level"] == "info" and entry["logger"] == "gateway.rpc"
    assert entry["time"].endswith("Z") and entry["duration_ms"] >= 0
    assert funded.key not in stack.gateway.log()


async def test_a_direct_grpc_callers_request_id_is_logged(stack: Stack, funded: IssuedKey) -> None:
    async with grpc.aio.insecure_channel(stack.grpc_target) as channel:
        await keys_pb2_grpc.KeysStub(channel).GetCurrentKey(
            keys_pb2.GetCurrentKeyRequest(),
            metadata=(*funded.metadata, ("x-request-id", "batch-7.item-42")),
        )
    await eventually(
        lambda: any(e.get("request_id") == "batch-7.item-42" for e in log_entries(stack.gateway)),
        within=5,
        message="the caller's request id logged",
    )


# --- traces --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def collector() -> Any:
    running = OtlpCollector().start()
    yield running
    running.stop()


@pytest_asyncio.fixture(scope="module")
async def traced(
    databases: Databases,
    tmp_path_factory: pytest.TempPathFactory,
    fake_stt: FakeSttProvider,
    webhook_receiver: WebhookReceiver,
    collector: OtlpCollector,
) -> AsyncIterator[tuple[GatewayProcess, Admin]]:
    """A gateway exporting traces to the collector."""
    url = await databases.new("sqlite")
    data_dir = tmp_path_factory.mktemp("traced")
    catalog = write_test_catalog(data_dir / "catalog.toml", fake_stt.base_url)
    env = {
        **gateway_env(catalog, webhook_receiver),
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": collector.traces_endpoint,
        "OTEL_SERVICE_NAME": "gateway-under-test",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    gateway = GatewayProcess(data_dir=data_dir, database_url=url, extra_env=env)
    await asyncio.to_thread(gateway.start)
    engine = create_engine(url)
    try:
        yield gateway, Admin(session_factory(engine))
    finally:
        await engine.dispose()
        await asyncio.to_thread(gateway.stop)


async def _traced_key(admin: Admin, name: str) -> IssuedKey:
    workspace = await admin.workspace(name)
    await admin.credits(workspace, "10")
    return await admin.key(workspace, name)


async def test_a_generation_span_carries_trace_session_and_user(
    traced: tuple[GatewayProcess, Admin], collector: OtlpCollector
) -> None:
    gateway, admin = traced
    issued = await _traced_key(admin, "traced-stt")
    trace = {
        "trace_id": W3C_TRACE_ID,
        "parent_span_id": W3C_PARENT,
        "trace_name": "nightly-eval",
        "span_name": "stt-step",
        "generation_name": "transcribe-door",
        "team": "speech",
        "attempt": 3,
    }
    async with httpx.AsyncClient(timeout=60) as client:
        response = await client.post(
            f"{gateway.base_url}/audio/transcriptions",
            json=audio_body("fake/ok", session_id="sess-1", user="user-9", trace=trace),
            headers=issued.headers,
        )
    assert response.status_code == 200, response.text
    [generation] = await collector.wait_for("transcribe-door")
    [step] = await collector.wait_for("stt-step")
    [server_span] = await collector.wait_for(
        "POST /api/v1/audio/transcriptions",
        where=lambda s: s.attributes.get("gateway.request_id") == response.headers["x-request-id"],
    )
    # In the caller's trace, under its parent span, wrapped by the span_name span.
    assert step.trace_id == generation.trace_id == W3C_TRACE_ID
    assert step.parent_span_id == W3C_PARENT
    assert generation.parent_span_id == step.span_id
    assert step.links == ((server_span.trace_id, server_span.span_id),)
    assert generation.service_name == "gateway-under-test"
    attributes = generation.attributes
    assert attributes["session.id"] == "sess-1"
    assert attributes["user.id"] == "user-9"
    assert attributes["gen_ai.operation.name"] == "transcription"
    assert attributes["gen_ai.request.model"] == "fake/ok"
    assert attributes["gen_ai.provider.name"] == "fakeai"
    assert attributes["gateway.cost_usd"] == response.json()["usage"]["cost"]
    assert attributes["gateway.trace.trace_name"] == "nightly-eval"
    assert attributes["gateway.trace.metadata.team"] == "speech"
    assert attributes["gateway.trace.metadata.attempt"] == 3
    assert attributes["gateway.generation.status"] == "completed"
    # The server span: SERVER kind, the route, the status.
    assert server_span.kind == 2  # SPAN_KIND_SERVER
    assert server_span.attributes["http.response.status_code"] == 200


async def test_requests_sharing_a_free_form_trace_id_share_a_trace(
    traced: tuple[GatewayProcess, Admin], collector: OtlpCollector
) -> None:
    gateway, admin = traced
    issued = await _traced_key(admin, "traced-shared")
    async with httpx.AsyncClient(timeout=60) as client:
        for index in range(2):
            trace = {"trace_id": "run-2026-11-23", "generation_name": f"shared-{index}"}
            response = await client.post(
                f"{gateway.base_url}/audio/transcriptions",
                json=audio_body("fake/ok", trace=trace),
                headers=issued.headers,
            )
            assert response.status_code == 200
    [first] = await collector.wait_for("shared-0")
    [second] = await collector.wait_for("shared-1")
    assert first.trace_id == second.trace_id
    assert first.parent_span_id == second.parent_span_id != ""


async def test_a_failed_generation_and_the_callers_traceparent(
    traced: tuple[GatewayProcess, Admin], collector: OtlpCollector
) -> None:
    gateway, admin = traced
    issued = await _traced_key(admin, "traced-failed")
    traceparent = f"00-{'ab' * 16}-{'cd' * 8}-01"
    async with httpx.AsyncClient(timeout=60) as client:
        response = await client.post(
            f"{gateway.base_url}/audio/transcriptions",
            json=audio_body("fake/all-5xx", trace={"generation_name": "doomed"}),
            headers={**issued.headers, "traceparent": traceparent},
        )
    assert response.status_code == 502
    [doomed] = await collector.wait_for("doomed")
    assert doomed.status_code == 2  # STATUS_CODE_ERROR
    assert doomed.attributes["gateway.generation.status"] == "failed"
    # No trace_id in the body: the generation is a child of the rpc, in the caller's trace.
    assert doomed.trace_id == "ab" * 16
    [server_span] = await collector.wait_for(
        "POST /api/v1/audio/transcriptions", where=lambda s: s.span_id == doomed.parent_span_id
    )
    assert server_span.parent_span_id == "cd" * 8
    assert server_span.status_code == 2


async def test_a_finished_video_job_is_a_generation_span(
    traced: tuple[GatewayProcess, Admin], collector: OtlpCollector
) -> None:
    gateway, admin = traced
    issued = await _traced_key(admin, "traced-video")
    async with httpx.AsyncClient(timeout=60) as client:
        submitted = await client.post(
            f"{gateway.base_url}/videos",
            json={
                "model": "fakevideo/frames",
                "prompt": "a lighthouse",
                "duration": 1,
                "session_id": "video-session",
                "trace": {"generation_name": "render-lighthouse"},
            },
            headers=issued.headers,
        )
    assert submitted.status_code == 202, submitted.text
    [span] = await collector.wait_for("render-lighthouse", within=60)
    assert span.attributes["gen_ai.operation.name"] == "video_generation"
    assert span.attributes["session.id"] == "video-session"
    assert span.attributes["gateway.generation.status"] == "completed"


# --- health --------------------------------------------------------------------------------------


async def _health(target: str, service: str = "") -> int:
    async with grpc.aio.insecure_channel(target) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5
        )
    return reply.status


async def _not_serving(target: str) -> bool:
    """The server reports NOT_SERVING (it sets that as it stops), or no longer answers."""
    try:
        return await _health(target) != health_pb2.HealthCheckResponse.SERVING
    except grpc.aio.AioRpcError:
        return True


async def _until_health(target: str, wanted: int, within: float = 20) -> None:
    async def reached() -> bool:
        return await _health(target) == wanted

    await eventually(reached, within=within, interval=0.2, message=f"health {wanted}")


async def test_health_follows_database_reachability(databases: Databases, tmp_path: Path) -> None:
    url = await databases.new("postgres")
    proxy = TcpProxy("127.0.0.1", 5432).start()
    proxied = url.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}")
    gateway = GatewayProcess(
        data_dir=tmp_path / "gw",
        database_url=proxied,
        extra_env={"GATEWAY_HEALTH_INTERVAL_SECONDS": "0.3"},
    )
    await asyncio.to_thread(gateway.start)
    engine = create_engine(url)  # the test's own connection, not through the proxy
    try:
        admin = Admin(session_factory(engine))
        issued = await admin.key(await admin.workspace("health"))
        serving = health_pb2.HealthCheckResponse.SERVING
        assert await _health(gateway.grpc_target) == serving
        proxy.cut()
        await _until_health(gateway.grpc_target, health_pb2.HealthCheckResponse.NOT_SERVING)
        # Liveness (Kubernetes restarts a container that fails it) is the process's own: a
        # database outage is no reason to restart every replica.
        assert await _health(gateway.grpc_target, "liveness") == serving
        async with httpx.AsyncClient(timeout=30) as client:
            down = await client.get(f"{gateway.base_url}/key", headers=issued.headers)
        assert down.status_code == 503
        assert down.json() == {"error": {"code": 503, "message": "Service temporarily unavailable"}}
        assert int(down.headers["retry-after"]) >= 1  # the monitor or health check looks again
        assert value(await scrape(gateway), "gateway_database_up") == 0
        proxy.start()
        await _until_health(gateway.grpc_target, serving)
        async with httpx.AsyncClient(timeout=30) as client:
            up = await client.get(f"{gateway.base_url}/key", headers=issued.headers)
        assert up.status_code == 200, up.text
    finally:
        await engine.dispose()
        await asyncio.to_thread(gateway.stop)
        proxy.cut()
    assert "Traceback" not in gateway.log(), "an unreachable database is not a crash"


# --- shutdown ------------------------------------------------------------------------------------


async def test_sigterm_lets_requests_in_flight_finish_and_charges_them(
    databases: Databases,
    tmp_path: Path,
    fake_stt: FakeSttProvider,
    webhook_receiver: WebhookReceiver,
) -> None:
    async with own_gateway(databases, "sqlite", tmp_path, fake_stt, webhook_receiver) as stopping:
        base_url, headers = stopping.gateway.base_url, stopping.issued.headers
        calls_before = len(fake_stt.calls_for("slow-2"))
        async with httpx.AsyncClient(timeout=60) as client:
            in_flight = asyncio.create_task(
                client.post(
                    f"{base_url}/audio/transcriptions",
                    json=audio_body("fake/slow-ok"),
                    headers=headers,
                )
            )
            await eventually(
                lambda: len(fake_stt.calls_for("slow-2")) > calls_before,
                within=10,
                message="the call is at the provider",
            )
            stopping.terminate()
            await eventually(
                lambda: _not_serving(stopping.gateway.grpc_target),
                within=10,
                message="the gateway began to stop",
            )
            try:
                late = await client.get(f"{base_url}/key", headers=headers)
                assert late.status_code == 503, "a stopping gateway takes no new requests"
                assert late.json()["error"]["code"] == 503
            except httpx.TransportError:
                pass  # or the listener is already closed
            answered = await in_flight
        assert answered.status_code == 200, answered.text
        assert answered.json()["text"] == "late"
        assert await stopping.exit_code(within=30) == 0
        assert await stopping.charges() == 1
        assert await stopping.count(CreditHold) == 0
    assert "stopping: draining in-flight requests" in stopping.gateway.log()


async def test_sigterm_finishes_the_video_step_in_hand(
    databases: Databases,
    tmp_path: Path,
    fake_stt: FakeSttProvider,
    webhook_receiver: WebhookReceiver,
) -> None:
    async with own_gateway(databases, "postgres", tmp_path, fake_stt, webhook_receiver) as stopping:
        async with httpx.AsyncClient(timeout=30) as client:
            submitted = await client.post(
                f"{stopping.gateway.base_url}/videos",
                json={"model": "fakevideo/frames", "prompt": "a long render", "duration": 4},
                headers=stopping.issued.headers,
            )
        assert submitted.status_code == 202
        job_id = submitted.json()["id"]
        taken = sa.and_(VideoJob.id == job_id, VideoJob.status != "pending")
        await eventually(  # the worker renders it now
            lambda: stopping.count(VideoJob, taken), within=20, interval=0.02, message="job taken"
        )
        stopping.terminate()
        assert await stopping.exit_code(within=60) == 0
        async with stopping.admin.sessions() as session:
            job = await session.get(VideoJob, job_id)
        # The render in hand was finished and charged once, not left half-done under a lease.
        assert job is not None and job.status == "completed", job
        assert job.lease_owner is None
        assert await stopping.charges() == 1


def test_gateway_health_command_for_container_checks(stack: Stack) -> None:
    def health(target: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "server.cli", "health", "--grpc-target", target],
            capture_output=True,
            text=True,
            timeout=30,
        )

    serving = health(stack.grpc_target)
    assert serving.returncode == 0 and "SERVING" in serving.stdout
    nobody = health(f"127.0.0.1:{refusing_port()}")
    assert nobody.returncode == 1 and "unreachable" in nobody.stdout
