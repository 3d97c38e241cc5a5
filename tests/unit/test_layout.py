"""The layout is the architecture: every import (module-level and function-local, read with
ast) runs down the layers below, and no two of server's packages import each other, however
indirectly. docs/architecture.md draws the same table; change both together.

A new arrow the wrong way (a domain package importing a handler, the contract or the wiring;
a facade module reaching past the server's foundation) fails here, naming the module, the
line and the import."""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# server's packages (a top-level module such as server/auth.py counts as one) in layers, top
# to bottom. A package may import its own layer (sideways, without cycles) and the layers
# below it, never one above.
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    # what starts things: the `gateway` command and the wiring of one server process
    ("entry", frozenset({"__main__", "cli", "app"})),
    # what runs on the domain: gRPC handlers (one per proto service), the REST listener's
    # (the hot routes Envoy proxies over HTTP/1.1) and background loops
    ("handlers", frozenset({"services", "rest", "workers", "maintenance"})),
    # the protobuf contract compiled from proto/: gRPC types stop at the handlers
    ("contract", frozenset({"contract", "contract_stamp"})),
    # the domain, testable without gRPC, from the billable operations down:
    ("operations", frozenset({"transcription", "videos"})),
    ("policy", frozenset({"byok", "guardrails", "limits", "routing", "vault"})),
    ("identity", frozenset({"auth", "accounts"})),
    # money and its records, webhook rules, what is observed, the provider adapters
    (
        "domain base",
        frozenset({"billing", "console", "webhooks", "observability", "providers"}),
    ),
    # what everything stands on
    (
        "foundation",
        frozenset(
            {
                "audio_decoding",
                "clock",
                "compute",
                "config",
                "db",
                "errors",
                "event_loop",
                "hostnames",
                "ports",
                "validation",
            }
        ),
    ),
)
# facade/ renders and runs Envoy in front of the server: it reads the server's contract and
# its foundation (settings, the error table, ports). Only the embedded stack of `gateway up`
# (facade/stack.py) runs a server process too, so it may import the server's entry.
FACADE_MAY_IMPORT = ("contract", "foundation")
FACADE_ENTRY = frozenset({"facade.stack"})
# The one arrow from server to facade: the `gateway` command starts the embedded stack
# (`gateway up`) and prints Envoy's config (`gateway envoy-config`).
SERVER_MAY_IMPORT_FACADE = frozenset({"server.cli"})


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, e.g. server.limits.admission
    line: int
    target: str  # the imported module (or module.name), absolute

    def __str__(self) -> str:
        return f"{self.module}:{self.line} imports {self.target}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(top: str) -> Iterator[Import]:
    for path in sorted((ROOT / top).rglob("*.py")):
        if "_generated" in path.parts:
            continue
        module = _module_name(path)
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):  # function-local too
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield Import(module, node.lineno, alias.name)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join(package[: len(package) - node.level + 1])
                    source = f"{base}.{node.module}" if node.module else base
                else:
                    source = node.module or ""
                for alias in node.names:  # `from server.x import y`: y may be a module
                    yield Import(module, node.lineno, f"{source}.{alias.name}")


def _server_package(dotted: str) -> str | None:
    parts = dotted.split(".")
    return parts[1] if parts[0] == "server" and len(parts) > 1 else None


def _layer(package: str) -> str:
    for layer, packages in LAYERS:
        if package in packages:
            return layer
    raise AssertionError(f"server/{package} is in no layer of LAYERS: place it")


def _depth(layer: str) -> int:
    return [name for name, _ in LAYERS].index(layer)


def _is_package_of(name: str, top: str) -> bool:
    return name == top or name.startswith(top + ".")


def test_every_server_package_has_a_layer() -> None:
    on_disk = {
        p.stem if p.is_file() else p.name
        for p in (ROOT / "server").iterdir()
        if (p.suffix == ".py" and p.stem != "__init__")
        or (p.is_dir() and (p / "__init__.py").exists() and p.name != "_generated")
    }
    layered = set().union(*(packages for _, packages in LAYERS))
    assert on_disk - layered == set(), "server packages missing from LAYERS"
    assert layered - on_disk == set(), "LAYERS names packages that are gone"


def test_server_imports_run_down_the_layers() -> None:
    wrong = []
    for imp in _imports("server"):
        source, target = _server_package(imp.module), _server_package(imp.target)
        if source is None or target is None or source == target:
            continue
        if _depth(_layer(target)) < _depth(_layer(source)):
            wrong.append(f"{imp} ({_layer(source)} → {_layer(target)}, a layer above)")
    assert wrong == []


def test_no_import_cycle_between_server_packages() -> None:
    arrows: dict[str, dict[str, Import]] = defaultdict(dict)
    for imp in _imports("server"):
        source, target = _server_package(imp.module), _server_package(imp.target)
        if source is not None and target is not None and source != target:
            arrows[source].setdefault(target, imp)

    def path_back(start: str) -> list[Import] | None:
        """A chain of imports from `start` back to `start`, if there is one."""
        stack: list[tuple[str, list[Import]]] = [(start, [])]
        seen: set[str] = set()
        while stack:
            package, chain = stack.pop()
            for target, imp in arrows[package].items():
                if target == start:
                    return [*chain, imp]
                if target not in seen:
                    seen.add(target)
                    stack.append((target, [*chain, imp]))
        return None

    cycles = {start: chain for start in list(arrows) if (chain := path_back(start))}
    assert not cycles, "import cycles:\n" + "\n".join(
        f"{start}: " + " → ".join(str(i) for i in chain) for start, chain in cycles.items()
    )


def test_server_never_imports_facade_bench_or_tests() -> None:
    wrong = [
        str(imp)
        for imp in _imports("server")
        if any(_is_package_of(imp.target, top) for top in ("bench", "tests"))
        or (_is_package_of(imp.target, "facade") and imp.module not in SERVER_MAY_IMPORT_FACADE)
    ]
    assert wrong == []


def test_facade_reads_only_the_server_contract_and_foundation() -> None:
    wrong = []
    for imp in _imports("facade"):
        if any(_is_package_of(imp.target, top) for top in ("bench", "tests")):
            wrong.append(str(imp))
            continue
        target = _server_package(imp.target)
        if target is None or imp.module in FACADE_ENTRY:
            continue
        if _layer(target) not in FACADE_MAY_IMPORT:
            wrong.append(f"{imp} (facade → {_layer(target)})")
    assert wrong == []


def test_the_reader_sees_function_local_imports() -> None:
    """`gateway up` imports the embedded stack inside its command function."""
    found = {i.target for i in _imports("server") if i.module == "server.cli"}
    assert "facade.stack.run_stack" in found


def test_bench_and_testkit_never_import_tests() -> None:
    """The benchmarks run from a checkout without the test suite's internals: what both
    need (starting a gateway, fakes, audio, the test catalog) lives in testkit/, which
    stands on server/ alone."""
    wrong = [
        str(imp)
        for top in ("bench", "testkit")
        for imp in _imports(top)
        if _is_package_of(imp.target, "tests")
    ]
    assert wrong == []
    wrong = [str(imp) for imp in _imports("testkit") if _is_package_of(imp.target, "bench")]
    assert wrong == [], "testkit is below bench and tests: bench imports it, not the reverse"
