"""The compiled protobuf contract: Python stubs and the descriptor set Envoy loads.

Both are generated from `proto/` at build time by the build hook (setup.py) into
`server/_generated/`: shipped in the wheel, and written to the source tree for editable
installs and for tests run from a checkout. Nothing is compiled, or written, at run time.
In a checkout, a proto/ that changed after the build is an error that says to reinstall.
"""

from __future__ import annotations

import sys
from pathlib import Path

from server.contract_stamp import STAMP_NAME, fingerprint

PROTO_ROOT = Path(__file__).resolve().parent.parent / "proto"  # only in a checkout
GENERATED = Path(__file__).resolve().parent / "_generated"
DESCRIPTOR_SET = GENERATED / "gateway.pb"
REINSTALL = "reinstall to generate it: pip install -e . (or pip install .)"
SERVICES = (
    "gateway.v1.Keys",
    "gateway.v1.Management",
    "gateway.v1.Operator",
    "gateway.v1.Videos",
    "gateway.v1.Audio",
    "gateway.v1.Vault",
    "gateway.v1.Guardrails",
    "gateway.v1.Models",
    "gateway.v1.Generations",
    "gateway.v1.Byok",
    "gateway.v1.Activity",
    "gateway.v1.Console",
)


class ContractError(RuntimeError):
    """The generated contract is missing, or older than the checkout's proto/."""


def check_generated(generated: Path = GENERATED, proto_root: Path = PROTO_ROOT) -> None:
    """Raise ContractError unless the build's output is there and, in a checkout (proto/
    beside the package), was generated from the .proto files it now holds."""
    stamp = generated / STAMP_NAME
    if not (stamp.is_file() and (generated / "gateway.pb").is_file()):
        raise ContractError(
            f"the generated contract is missing ({generated} was not built); {REINSTALL}"
        )
    if (proto_root / "gateway" / "v1").is_dir() and stamp.read_text() != fingerprint(proto_root):
        raise ContractError(
            f"{proto_root} changed after the contract was generated into {generated}; {REINSTALL}"
        )


check_generated()
if str(GENERATED) not in sys.path:
    # protoc's Python output imports its siblings as `gateway.v1.x_pb2`.
    sys.path.insert(0, str(GENERATED))

from gateway.v1 import (  # noqa: E402
    audio_pb2,
    audio_pb2_grpc,
    byok_pb2,
    byok_pb2_grpc,
    common_pb2,
    console_pb2,
    console_pb2_grpc,
    generations_pb2,
    generations_pb2_grpc,
    guardrails_pb2,
    guardrails_pb2_grpc,
    keys_pb2,
    keys_pb2_grpc,
    management_pb2,
    management_pb2_grpc,
    models_pb2,
    models_pb2_grpc,
    vault_pb2,
    vault_pb2_grpc,
    videos_pb2,
    videos_pb2_grpc,
)


def http_routes() -> dict[str, str]:
    """Each public rpc's REST route: "/gateway.v1.Keys/GetCurrentKey" -> "GET /api/v1/key"."""
    from google.api import annotations_pb2

    routes: dict[str, str] = {}
    for module in (
        audio_pb2,
        byok_pb2,
        console_pb2,
        generations_pb2,
        guardrails_pb2,
        keys_pb2,
        management_pb2,
        models_pb2,
        vault_pb2,
        videos_pb2,
    ):
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                rule = method.GetOptions().Extensions[annotations_pb2.http]
                pattern = rule.WhichOneof("pattern")
                if pattern is not None and pattern != "custom":
                    path = f"/{service.full_name}/{method.name}"
                    routes[path] = f"{pattern.upper()} {getattr(rule, pattern)}"
    return routes


# The rpcs whose REST routes the server processes' REST listener answers (server/rest/): the
# facade proxies those routes there as they came instead of transcoding them into these
# calls (facade/envoy_config.py). One list for both sides.
REST_LISTENER_METHODS = ("/gateway.v1.Audio/Transcribe", "/gateway.v1.Keys/GetCurrentKey")
# The REST listener's health, which the facade checks (200 while the process serves).
REST_HEALTH_PATH = "/healthz"


def rest_listener_routes() -> tuple[tuple[str, str], ...]:
    """(HTTP method, path) of each of REST_LISTENER_METHODS' REST routes."""
    routes = http_routes()
    return tuple(
        (method, path)
        for method, _, path in (routes[rpc].partition(" ") for rpc in REST_LISTENER_METHODS)
    )


__all__ = [
    "DESCRIPTOR_SET",
    "REST_HEALTH_PATH",
    "REST_LISTENER_METHODS",
    "SERVICES",
    "ContractError",
    "audio_pb2",
    "audio_pb2_grpc",
    "byok_pb2",
    "byok_pb2_grpc",
    "common_pb2",
    "console_pb2",
    "console_pb2_grpc",
    "generations_pb2",
    "generations_pb2_grpc",
    "guardrails_pb2",
    "guardrails_pb2_grpc",
    "http_routes",
    "keys_pb2",
    "keys_pb2_grpc",
    "management_pb2",
    "management_pb2_grpc",
    "models_pb2",
    "models_pb2_grpc",
    "rest_listener_routes",
    "vault_pb2",
    "vault_pb2_grpc",
    "videos_pb2",
    "videos_pb2_grpc",
]
