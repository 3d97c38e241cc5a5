"""The documentation's generated references (docs/hooks/reference.py, run by MkDocs) from
their one source each: the configuration page from the settings classes, the gRPC page from
the comments in proto/. Rendered here without MkDocs; .ci/run builds the whole site in
strict mode."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from server.config import READ_ELSEWHERE, EdgePolicy, Settings
from server.contract import DESCRIPTOR_SET, SERVICES, http_routes

ROOT = Path(__file__).resolve().parents[2]
# a variable name in a string literal: what the code reads
VARIABLE = re.compile(r"""["'](GATEWAY_[A-Z0-9_]*[A-Z0-9])["']""")


@pytest.fixture(scope="module")
def reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reference", ROOT / "docs/hooks/reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("model", [Settings, EdgePolicy])
def test_every_setting_says_what_it_is(model: type[Settings] | type[EdgePolicy]) -> None:
    undescribed = [
        name for name, field in model.model_fields.items() if not (field.description or "").strip()
    ]
    assert undescribed == [], "add Field(description=...): the configuration page shows it"


def test_the_configuration_page_names_every_variable_the_gateway_reads(
    reference: ModuleType,
) -> None:
    page = reference.configuration_page()
    read = {
        name
        for top in ("server", "facade")
        for path in (ROOT / top).rglob("*")
        if path.suffix in (".py", ".lua") and "_generated" not in path.parts
        for name in VARIABLE.findall(path.read_text())
    }
    assert read, "no variable found: the pattern no longer matches the code"
    missing = sorted(name for name in read | set(READ_ELSEWHERE) if f"`{name}`" not in page)
    assert missing == [], "a setting in server/config.py (or READ_ELSEWHERE) documents each"
    for name in ("GATEWAY_JOB_LEASE_SECONDS", "GATEWAY_CATALOG", "GATEWAY_EDGE_CLIENT_RPS"):
        assert f"| `{name}` |" in page
    row = next(line for line in page.splitlines() if "`GATEWAY_WEBHOOK_CONCURRENCY`" in line)
    assert "`16`" in row and "at least 2, at most 1024" in row
    assert Settings.model_fields["webhook_concurrency"].description in row


def test_the_grpc_page_shows_every_service_method_and_route(reference: ModuleType) -> None:
    page = reference.grpc_page(DESCRIPTOR_SET)
    for service in SERVICES:
        assert f"### service {service.removeprefix('gateway.v1.')} {{" in page, service
    for path, route in http_routes().items():
        method = path.rsplit("/", 1)[1]
        row = next(line for line in page.splitlines() if line.startswith(f"| `{method}` |"))
        assert f"`{route}`" in row, (path, row)
    # the comment beside the service and beside a field in proto/ (keys.proto)
    assert "Status of the API key used on the request (GET /api/v1/key)." in page
    assert "free-model requests recorded in the current UTC day" in page


def test_the_readme_is_a_two_minute_read_with_the_two_commands() -> None:
    """The README says what the gateway is, the two commands, a first request and where to
    go next; everything else is a page of the site (docs/)."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for command in ("pip install . && gateway up", "pip install '.[test]' && pytest"):
        assert f"```sh\n{command}\n```" in readme, command
    for sdk in ("from openrouter import OpenRouter", "from openai import OpenAI", "curl -s"):
        assert sdk in readme, sdk
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    missing = [link for link in links if "://" not in link and not (ROOT / link).exists()]
    assert missing == [], "the README links to files that are not in the repository"


def test_the_benchmarks_write_into_the_performance_page() -> None:
    from bench.all import END_MARKER, PERFORMANCE_PAGE, START_MARKER

    page = PERFORMANCE_PAGE.read_text()
    assert page.index(START_MARKER) < page.index(END_MARKER)
    assert "`python -m bench.all`" in page.split(START_MARKER, 1)[1]


def test_the_rest_page_lists_every_route_of_the_contract(reference: ModuleType) -> None:
    table = reference.routes_table(DESCRIPTOR_SET)
    for path, route in http_routes().items():
        verb, url = route.split(" ", 1)
        service, method = path.rsplit("/", 2)[1:]
        row = next(line for line in table.splitlines() if f"| `{verb}` | `{url}` |" in line)
        assert f"`{service.removeprefix('gateway.v1.')}.{method}`" in row, row
    assert reference.ROUTES_MARK in (ROOT / "docs" / reference.REST_PAGE).read_text()


def test_every_figure_behind_a_choice_names_its_command_and_date() -> None:
    """Each row of the performance page's "Figures behind the code's choices" names the
    command that measures its figure, one a reader can run (a benchmark in bench/, and for
    `bench.micro` one of its measurements), and the day it was measured (issue 32): a figure
    whose command was never written down is measured again with one, or dropped."""
    from bench.micro import MEASUREMENTS

    page = (ROOT / "docs/performance.md").read_text()
    section = page.split("\n## Figures behind the code's choices\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    columns = [cell.strip() for cell in lines[0].strip("|").split(" | ")]
    rows = [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines[2:]]
    assert len(rows) >= 20 and all(len(row) == len(columns) for row in rows)
    commands = [row[columns.index("command")] for row in rows]
    unrecorded = [command for command in commands if "not recorded" in command]
    assert unrecorded == [], "measure these again with a command (bench/micro.py), or drop them"
    assert columns == ["where", "figure", "command", "measured", "choice"]
    for row in rows:
        _where, figure, command, measured, _choice = row
        assert figure and re.fullmatch(r"\d{4}-\d{2}-\d{2}", measured), row
        modules = re.findall(r"`python -m bench\.(\w+)([^`]*)`", command)
        assert modules, f"no `python -m bench.…` command: {row}"
        for module, arguments in modules:
            assert (ROOT / "bench" / f"{module}.py").is_file(), module
            if module == "micro":
                assert arguments.split()[0] in MEASUREMENTS, arguments
