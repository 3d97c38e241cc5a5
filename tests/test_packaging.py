"""Packaging: what `pip install .` (not editable) brings is what the gateway needs to run.

The run-time imports of server/ and facade/ are all declared dependencies; the contract
is generated at build time (setup.py) into the wheel, and the installed package is never
compiled into or written to; a checkout whose proto/ changed after the build says so.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import os
import re
import shutil
import stat
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
OWN_TOP_LEVEL = {"server", "facade", "gateway"}  # gateway: the generated gateway.v1 stubs


def _requirement_name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert match is not None, requirement
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def _bound(requirements: list[str], name: str, operator: str) -> tuple[int, ...]:
    for requirement in requirements:
        if _requirement_name(requirement) == name:
            version = re.search(rf"{re.escape(operator)}\s*([0-9.]+)", requirement)
            assert version is not None, f"{requirement} has no {operator} bound"
            return tuple(int(part) for part in version.group(1).split("."))
    raise AssertionError(f"{name} is not listed")


TYPE_CHECKING_TESTS = ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def _imports(path: Path) -> set[str]:
    """Every absolute module imported anywhere in the file (lazy imports included); for
    `from a import b`, `a.b` (b may be a module of a namespace package such as google)."""
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    # Imports under `if TYPE_CHECKING:` are the type checker's, never run.
    for guarded in ast.walk(tree):
        if isinstance(guarded, ast.If) and ast.unparse(guarded.test) in TYPE_CHECKING_TESTS:
            guarded.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


@functools.cache
def _top_level_owners() -> dict[str, list[str]]:
    return dict(importlib.metadata.packages_distributions())


@functools.cache
def _files_of(name: str) -> tuple[str, ...]:
    return tuple(str(f) for f in importlib.metadata.distribution(name).files or [])


def _distributions_of(module: str) -> set[str]:
    """The installed distributions that provide `module`: the one owning its top-level
    name, or, for a namespace package split among several (google, opentelemetry), those
    holding its longest existing folder or file."""
    parts = module.split(".")
    candidates = set(_top_level_owners().get(parts[0], []))
    if len(candidates) <= 1:
        return {_requirement_name(name) for name in candidates}
    files = {name: _files_of(name) for name in candidates}
    for depth in range(len(parts), 0, -1):
        prefix = "/".join(parts[:depth])
        owners = {
            _requirement_name(name)
            for name, listed in files.items()
            if any(f.startswith(prefix + "/") or f == prefix + ".py" for f in listed)
        }
        if owners and (depth > 1 or len(owners) == 1):
            return owners
    return set()


def test_every_run_time_import_is_a_declared_dependency() -> None:
    declared = {_requirement_name(r) for r in PYPROJECT["project"]["dependencies"]}
    # The provider transports measured beside the gateway's own (GATEWAY_PROVIDER_TRANSPORT)
    # come with the `bench` extra, imported only when chosen.
    optional = {
        _requirement_name(r) for r in PYPROJECT["project"]["optional-dependencies"]["bench"]
    }
    declared |= optional
    undeclared: set[str] = set()
    for folder in ("server", "facade"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "_generated" in path.parts:
                continue
            for module in _imports(path):
                top = module.split(".")[0]
                if top in sys.stdlib_module_names or top in OWN_TOP_LEVEL:
                    continue
                owners = _distributions_of(module)
                if not owners and _requirement_name(top) in optional:
                    continue  # the bench extra's, not installed here
                assert owners, f"{path.relative_to(ROOT)}: {module} is not installed at all"
                if not owners & declared:
                    undeclared.add(f"{path.relative_to(ROOT)}: {' or '.join(sorted(owners))}")
    assert not undeclared, "imported at run time, not in [project].dependencies:\n" + "\n".join(
        sorted(undeclared)
    )


def test_generated_code_fits_the_run_time_lower_bounds() -> None:
    """The pinned grpcio-tools generates code for protobuf 5.29.0 / grpcio 1.70.0: the
    run-time lower bounds must be at least those (else an old runtime refuses the stubs)."""
    build = PYPROJECT["build-system"]["requires"]
    runtime = PYPROJECT["project"]["dependencies"]
    assert not any(_requirement_name(r) == "grpcio-tools" for r in runtime)
    tools = _bound(build, "grpcio-tools", "==")
    assert tools == (1, 70, 0), "update the gencode versions below with the pin"
    assert _bound(runtime, "protobuf", ">=") >= (5, 29)
    assert _bound(runtime, "grpcio", ">=") >= tools[:2]
    generated = ROOT / "server" / "_generated" / "gateway" / "v1"
    assert "# Protobuf Python Version: 5.29.0" in (generated / "keys_pb2.py").read_text()
    assert "GRPC_GENERATED_VERSION = '1.70.0'" in (generated / "keys_pb2_grpc.py").read_text()


def _tracked_copy(target: Path) -> Path:
    """The checkout's committed and staged files (what a fresh clone has), copied."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from a fresh copy of the checkout, with the ordinary client."""
    work = tmp_path_factory.mktemp("wheel")
    source = _tracked_copy(work / "src")
    assert not (source / "server" / "_generated").exists()
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(work), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    [path] = work.glob("inference_gateway-*.whl")
    return path


def test_the_wheel_ships_the_generated_contract(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
        requires = [
            line.split(":", 1)[1].strip()
            for line in archive.read(metadata).decode().splitlines()
            if line.startswith("Requires-Dist:")
        ]
    for name in ("gateway.pb", "STAMP", "gateway/v1/keys_pb2.py", "gateway/v1/keys_pb2_grpc.py"):
        assert f"server/_generated/{name}" in names, name
    assert "server/routing/catalog.toml" in names and "facade/error_rewrite.lua" in names
    # the console's files, vendored libraries included (nothing comes from a CDN)
    console_files = ("index.html", "app.js", "money.js", "sw.js", "app.css")
    for name in (*console_files, "vendor/preact-10.29.8.js"):
        assert f"server/console/static/{name}" in names, name
    assert not any(n.startswith("proto/") for n in names)
    runtime = {_requirement_name(r) for r in requires if "extra ==" not in r}
    assert "grpcio-tools" not in runtime and "numpy" in runtime


def test_the_installed_package_runs_read_only_and_compiles_nothing(
    wheel: Path, tmp_path: Path
) -> None:
    """Installed (no proto/ beside it) and read-only, the package imports its contract and
    builds the server; grpc_tools is never imported and no file appears."""
    site = tmp_path / "site"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), wheel],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    before = sorted(str(p.relative_to(site)) for p in site.rglob("*"))
    for path in site.rglob("*"):
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    script = (
        "import sys, server.contract as c, server.app, facade.stack\n"
        "assert c.__file__.startswith(sys.argv[1]), c.__file__\n"
        "assert c.DESCRIPTOR_SET.is_file() and c.http_routes()\n"
        "assert 'grpc_tools' not in sys.modules\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        ran = subprocess.run(
            [sys.executable, "-c", script, str(site)],
            cwd=tmp_path,  # not the checkout: `server` must come from the install
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert ran.returncode == 0, ran.stderr
        assert sorted(str(p.relative_to(site)) for p in site.rglob("*")) == before
    finally:
        for path in site.rglob("*"):
            path.chmod(path.stat().st_mode | stat.S_IWUSR)


def test_the_installed_gateway_reports_the_release_it_is(wheel: Path, tmp_path: Path) -> None:
    """`gateway --version` of the installed wheel: pyproject.toml's version (CHANGELOG.md
    has its entry, tests/unit/test_version.py)."""
    site = tmp_path / "site"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), wheel],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    ran = subprocess.run(
        [sys.executable, "-m", "server", "--version"],
        cwd=tmp_path,  # not the checkout: the installed package and its metadata
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(site)},
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == f"gateway {PYPROJECT['project']['version']}"


def test_a_checkout_whose_proto_changed_says_to_reinstall(tmp_path: Path) -> None:
    """A checkout built before a .proto edit: a clear error, nothing compiled or written."""
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT / "proto", checkout / "proto")
    shutil.copytree(
        ROOT / "server", checkout / "server", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copytree(
        ROOT / "facade", checkout / "facade", ignore=shutil.ignore_patterns("__pycache__")
    )
    generated = checkout / "server" / "_generated"
    stamp = (generated / "STAMP").read_text()
    keys = checkout / "proto" / "gateway" / "v1" / "keys.proto"
    keys.write_text(keys.read_text() + "\n// edited after the build\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    ran = subprocess.run(
        [sys.executable, "-m", "server.cli", "up", "--data-dir", str(tmp_path / "data")],
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert ran.returncode != 0
    assert ran.stderr.startswith("gateway: error: "), ran.stderr
    assert "changed after the contract was generated" in ran.stderr
    assert "pip install -e ." in ran.stderr and "Traceback" not in ran.stderr
    assert (generated / "STAMP").read_text() == stamp
    assert not (checkout / "server" / ".contract.lock").exists()
