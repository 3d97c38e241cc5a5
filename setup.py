"""Build hook: compile proto/ into the contract the server imports and Envoy loads.

`build_py` runs `grpc_tools.protoc` (a build requirement, pinned in pyproject.toml, never a
run-time dependency) on proto/ and writes the Python stubs, their .pyi files, the
descriptor set `gateway.pb` and a STAMP (the .proto files' fingerprint) to
`server/_generated/` of the source tree (gitignored; what an editable install and a test
run from the checkout import) and, for a wheel, into the wheel too. Nothing is compiled at
run time.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from types import ModuleType

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PROTO_ROOT = ROOT / "proto"
SOURCE_GENERATED = ROOT / "server" / "_generated"


def _stamp_module() -> ModuleType:
    """server/contract_stamp.py, loaded by path: importing `server` needs its dependencies."""
    spec = importlib.util.spec_from_file_location(
        "_contract_stamp", ROOT / "server" / "contract_stamp.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compile_contract(out: Path) -> None:
    """protoc: stubs, .pyi, and the descriptor set (with imports and source info) into `out`."""
    import google.api  # googleapis-common-protos ships google/api/*.proto beside its modules
    from grpc_tools import protoc

    stamp = _stamp_module()
    google_protos = Path(protoc.__file__).resolve().parent / "_proto"
    googleapis_root = Path(next(iter(google.api.__path__))).parent.parent
    files = [str(p.relative_to(PROTO_ROOT)) for p in stamp.proto_files(PROTO_ROOT)]
    if not files:
        raise RuntimeError(f"no .proto files under {PROTO_ROOT}")
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
    (out / stamp.STAMP_NAME).write_text(stamp.fingerprint(PROTO_ROOT))


def _replace_tree(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".generated-", dir=target.parent))
    try:
        shutil.copytree(source, scratch, dirs_exist_ok=True)
        if target.exists():
            shutil.rmtree(target)
        os.replace(scratch, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


class BuildWithContract(build_py):
    """build_py, plus the compiled contract in server/_generated (source tree and wheel)."""

    def run(self) -> None:
        super().run()
        with tempfile.TemporaryDirectory(prefix="contract-") as scratch:
            compiled = Path(scratch)
            compile_contract(compiled)
            try:
                _replace_tree(compiled, SOURCE_GENERATED)
            except OSError:
                if self.editable_mode:
                    raise  # an editable install imports it from the source tree
                self.announce(f"could not write {SOURCE_GENERATED}; the wheel has it", 3)
            if not self.editable_mode:
                _replace_tree(compiled, Path(self.build_lib) / "server" / "_generated")


setup(cmdclass={"build_py": BuildWithContract})
