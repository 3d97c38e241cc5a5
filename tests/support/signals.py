"""Deterministic signals that a gateway in a subprocess has processed past a point: what a
test waits for instead of sleeping and then asserting that nothing (more) happened."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from testkit.eventually import eventually
from testkit.processes import GatewayProcess


async def metric_total(gateway: GatewayProcess, name: str, **labels: str) -> int:
    """The sum of the gateway's `name` samples whose labels include `labels`."""
    async with httpx.AsyncClient() as client:
        response = await client.get(gateway.metrics_url)
    response.raise_for_status()
    total = 0.0
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                total += sample.value
    return int(total)


async def admitted(gateway: GatewayProcess) -> int:
    """Billable requests the gateway's limits admitted (a hold was placed)."""
    return await metric_total(gateway, "gateway_admissions_total", outcome="admitted")


async def logged_past(gateway: GatewayProcess, within: float = 10.0) -> None:
    """Wait until the server has written its log lines for every request answered before
    this call: one more request's access log line has arrived (the server logs a call before
    its answer goes out, and its output is read in order)."""
    async with httpx.AsyncClient() as client:
        response = await client.get(f"{gateway.base_url}/key")  # 401, and logged
    request_id = response.headers["x-request-id"]
    await eventually(
        lambda: request_id in gateway.log(), within=within, message="the marker request logged"
    )
