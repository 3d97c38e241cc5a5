"""server/ and facade/ use other packages through their public API only (issue 31): no
private member of another package's object (ruff's SLF001, configured in pyproject.toml),
no import from another package's private module (`httpx._client`), no private state a
subclass of another package's class inherits (`self._headers` of an httpx client), and no
coroutine stepped by hand. What a package does not document may change in any release."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OURS = ("server", "facade")


def _sources() -> Iterator[Path]:
    for package in OURS:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "_generated" not in path.parts:
                yield path


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"


def test_ruff_checks_private_member_access_in_server_and_facade() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    lint = config["tool"]["ruff"]["lint"]
    selected = lint.get("select", []) + lint.get("extend-select", [])
    assert any("SLF001".startswith(code) for code in selected), selected
    for pattern, ignored in lint.get("per-file-ignores", {}).items():
        if any(pattern.startswith(package) for package in OURS):
            assert not any("SLF001".startswith(code) for code in ignored), pattern
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    found = subprocess.run(
        [ruff, "check", "--select", "SLF001", "--output-format", "concise", *OURS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert found.returncode == 0, found.stdout + found.stderr


def test_no_import_from_another_package_s_private_module() -> None:
    found = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            for name in names:
                parts = name.split(".")
                if parts[0] not in OURS and any(
                    part.startswith("_") and not part.startswith("__") for part in parts
                ):
                    found.append(f"{_where(path, node)} imports {name}")
    assert not found, found


def _own_names(cls: ast.ClassDef) -> set[str]:
    """What a class defines itself: its methods and class attributes, and every
    `self.<name>` it assigns."""
    names: set[str] = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _local_classes(tree: ast.Module) -> set[str]:
    """The classes of this package: defined in the module, or imported from server/facade."""
    defined = {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and node.level == 0
        and (node.module or "").split(".")[0] in ("server", "facade")
        for alias in node.names
    }
    return defined | imported


def test_no_subclass_reads_private_state_it_inherits_from_another_package() -> None:
    """A subclass of another package's class (an httpx client, a SQLAlchemy dialect) uses
    only the private names it defines itself: httpx's `self._transport` is httpx's."""
    found = []
    for path in _sources():
        tree = ast.parse(path.read_text(), str(path))
        local = _local_classes(tree)
        for cls in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
            foreign = [
                base
                for base in cls.bases
                if isinstance(base, ast.Attribute)
                or (isinstance(base, ast.Name) and base.id not in local)
            ]
            foreign = [
                base
                for base in foreign
                if ast.unparse(base)
                not in {"object", "Exception", "RuntimeError", "ValueError", "Generic", "Protocol"}
            ]
            if not foreign:
                continue
            own = _own_names(cls)
            for node in ast.walk(cls):
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name)
                    and node.value.id in ("self", "super")
                    and node.attr.startswith("_")
                    and not node.attr.startswith("__")
                    and node.attr not in own
                ):
                    found.append(f"{_where(path, node)} {cls.name} reads inherited {node.attr}")
    assert not found, found


def test_no_coroutine_is_stepped_by_hand() -> None:
    found = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("send", "throw")
                and len(node.args) == 1
                and isinstance(node.args[0], ast.Constant)
                and node.args[0].value is None
            ):
                found.append(f"{_where(path, node)} steps a coroutine")
            if isinstance(node, ast.Attribute) and ast.unparse(node) == "types.coroutine":
                found.append(f"{_where(path, node)} uses types.coroutine")
    assert not found, found


def test_requires_python_names_only_the_python_ci_runs() -> None:
    """CI (.ci/run) runs the suite on the machine's python3 alone: the project claims that
    minor release and no later one it never ran on (a later Python changes asyncio's
    documented behaviour, as 3.12's wait_for did)."""
    from packaging.specifiers import SpecifierSet

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    supported = SpecifierSet(config["project"]["requires-python"])
    major, minor = sys.version_info[:2]
    assert f"{major}.{minor}.{sys.version_info[2]}" in supported
    assert f"{major}.{minor + 1}.0" not in supported, supported
    tool = config["tool"]
    assert tool["ruff"]["target-version"] == f"py{major}{minor}"
    assert tool["mypy"]["python_version"] == f"{major}.{minor}"
