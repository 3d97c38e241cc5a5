"""`gateway envoy-config`: the compose stack's config by default (envoy.yaml, unchanged), the
Kubernetes topology's with --kubernetes, and other upstream and listen addresses; bad
addresses are refused naming the flag."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from facade.compose import compose_envoy_yaml
from facade.kubernetes import kubernetes_envoy_yaml
from server.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _print(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["envoy-config", *args]) == 0
    return capsys.readouterr().out


def _config(text: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(text[text.index("{") :])
    return loaded


@pytest.fixture(autouse=True)
def _default_edge(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GATEWAY_CORS_ORIGINS", "GATEWAY_EDGE_CLIENT_RPS"):
        monkeypatch.delenv(name, raising=False)


def test_the_default_is_the_compose_stacks_checked_in_config(
    capsys: pytest.CaptureFixture[str],
) -> None:
    printed = _print(capsys)
    assert printed == compose_envoy_yaml() == (ROOT / "envoy.yaml").read_text()
    for cluster in _config(printed)["static_resources"]["clusters"]:
        assert "ignore_health_on_host_removal" not in cluster


def test_kubernetes_finds_replicas_by_the_headless_service_and_drops_leavers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    printed = _print(capsys, "--kubernetes")
    assert printed == kubernetes_envoy_yaml()
    assert "`gateway envoy-config --kubernetes`" in printed.splitlines()[2]
    clusters = _config(printed)["static_resources"]["clusters"]
    assert [cluster["name"] for cluster in clusters] == ["gateway_grpc", "gateway_rest"]
    for cluster, port in zip(clusters, (50051, 50052), strict=True):
        assert cluster["type"] == "STRICT_DNS"
        assert cluster["ignore_health_on_host_removal"] is True
        [endpoint] = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
        assert endpoint["endpoint"]["address"]["socket_address"] == {
            "address": "gateway-server",
            "port_value": port,
        }


@pytest.mark.parametrize("topology", [(), ("--kubernetes",)])
def test_upstream_and_listen_addresses(
    capsys: pytest.CaptureFixture[str], topology: tuple[str, ...]
) -> None:
    printed = _print(
        capsys,
        *topology,
        "--upstream",
        "gw-grpc.prod.svc.cluster.local:7000",
        "--rest-port",
        "7001",
        "--listen",
        "[::]:8443",
    )
    config = _config(printed)
    clusters = config["static_resources"]["clusters"]
    for cluster, port in zip(clusters, (7000, 7001), strict=True):
        [endpoint] = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
        assert endpoint["endpoint"]["address"]["socket_address"] == {
            "address": "gw-grpc.prod.svc.cluster.local",
            "port_value": port,
        }
    [listener] = config["static_resources"]["listeners"]
    assert listener["address"]["socket_address"] == {"address": "::", "port_value": 8443}
    # The header names the command that renders it again.
    assert (
        "--upstream gw-grpc.prod.svc.cluster.local:7000 --rest-port 7001 --listen [::]:8443"
        in printed[:400]
    )


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--upstream", "gateway-server", "expected HOST:PORT, not 'gateway-server'"),
        ("--upstream", "bad host:50051", "expected HOST:PORT"),
        ("--upstream", ":50051", "expected HOST:PORT"),
        ("--upstream", "gateway-server:0", "port must be 1-65535"),
        ("--listen", "0.0.0.0:http", "not a port number"),
        ("--listen", "0.0.0.0:70000", "port must be 1-65535"),
    ],
)
def test_bad_addresses_are_refused_naming_the_flag(
    capsys: pytest.CaptureFixture[str], flag: str, value: str, message: str
) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["envoy-config", "--kubernetes", flag, value])
    assert exit.value.code == 2
    stderr = capsys.readouterr().err
    assert f"argument {flag}: {message}" in stderr
    assert "Traceback" not in stderr
