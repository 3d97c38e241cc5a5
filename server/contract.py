"""The compiled protobuf contract: Python stubs and the descriptor set Envoy loads.

Both are produced from `proto/` by `grpc_tools.protoc` the first time they are needed (or
when a .proto file changed), into `server/_generated/`, so a fresh clone works right after
`pip install`. A file lock keeps parallel server processes from compiling at once.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.resources
import os
import shutil
import sys
import tempfile
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent.parent / "proto"
GENERATED = Path(__file__).resolve().parent / "_generated"
DESCRIPTOR_SET = GENERATED / "gateway.pb"
SERVICES = (
    "gateway.v1.Keys",
    "gateway.v1.Management",
    "gateway.v1.Videos",
    "gateway.v1.Audio",
    "gateway.v1.Vault",
    "gateway.v1.Guardrails",
)


def _proto_files() -> list[Path]:
    return sorted(PROTO_ROOT.rglob("*.proto"))


def _fingerprint() -> str:
    digest = hashlib.sha256()
    for path in _proto_files():
        digest.update(str(path.relative_to(PROTO_ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _compile(out: Path) -> None:
    from grpc_tools import protoc  # imported lazily: only needed when compiling

    google_protos = Path(importlib.resources.files("grpc_tools") / "_proto")
    # googleapis-common-protos installs google/api/*.proto beside its modules.
    import google.api

    googleapis_root = Path(google.api.__path__[0]).parent.parent
    files = [str(p.relative_to(PROTO_ROOT)) for p in _proto_files()]
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{googleapis_root}",
        f"-I{google_protos}",
        "--include_imports",
        "--include_source_info",
        f"--descriptor_set_out={out / 'gateway.pb'}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *files,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed to compile proto/")


def ensure_compiled() -> Path:
    """Compile proto/ when the generated code is missing or stale; return its folder."""
    stamp = GENERATED / "STAMP"
    wanted = _fingerprint()
    if stamp.is_file() and stamp.read_text() == wanted:
        return GENERATED
    GENERATED.parent.mkdir(parents=True, exist_ok=True)
    lock_path = GENERATED.parent / ".contract.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.is_file() and stamp.read_text() == wanted:
            return GENERATED
        scratch = Path(tempfile.mkdtemp(prefix="contract-", dir=GENERATED.parent))
        try:
            _compile(scratch)
            (scratch / "STAMP").write_text(wanted)
            if GENERATED.exists():
                shutil.rmtree(GENERATED)
            os.replace(scratch, GENERATED)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return GENERATED


_generated = str(ensure_compiled())
if _generated not in sys.path:
    # protoc's Python output imports its siblings as `gateway.v1.x_pb2`.
    sys.path.insert(0, _generated)

from gateway.v1 import (  # noqa: E402
    audio_pb2,
    audio_pb2_grpc,
    common_pb2,
    guardrails_pb2,
    guardrails_pb2_grpc,
    keys_pb2,
    keys_pb2_grpc,
    management_pb2,
    management_pb2_grpc,
    vault_pb2,
    vault_pb2_grpc,
    videos_pb2,
    videos_pb2_grpc,
)


def http_routes() -> dict[str, str]:
    """Each public rpc's REST route: "/gateway.v1.Keys/GetCurrentKey" -> "GET /api/v1/key"."""
    from google.api import annotations_pb2

    routes: dict[str, str] = {}
    for module in (audio_pb2, guardrails_pb2, keys_pb2, management_pb2, vault_pb2, videos_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                rule = method.GetOptions().Extensions[annotations_pb2.http]
                pattern = rule.WhichOneof("pattern")
                if pattern is not None and pattern != "custom":
                    path = f"/{service.full_name}/{method.name}"
                    routes[path] = f"{pattern.upper()} {getattr(rule, pattern)}"
    return routes


__all__ = [
    "DESCRIPTOR_SET",
    "SERVICES",
    "audio_pb2",
    "audio_pb2_grpc",
    "common_pb2",
    "guardrails_pb2",
    "guardrails_pb2_grpc",
    "http_routes",
    "keys_pb2",
    "keys_pb2_grpc",
    "management_pb2",
    "management_pb2_grpc",
    "vault_pb2",
    "vault_pb2_grpc",
    "videos_pb2",
    "videos_pb2_grpc",
]
