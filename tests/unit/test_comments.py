"""Comments and docstrings in server/ and facade/ state invariants and reasons, not timings:
a measured figure ages with the machine and the code, and two copies of it disagree. The
figures live on the documentation's performance page (docs/performance.md), each with the
command that produced it and its date."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# a measured duration in micro- or nanoseconds, or an approximate figure ("~40 us",
# "~7 MiB", "~1.2 s of CPU"); bounds the code enforces ("64 KiB", "every 2 s") are not these
FIGURE = re.compile(
    r"\d[\d.,]*\s?(?:us|µs|μs|ns)\b"
    r"|~\s?\d[\d.,]*\s?(?:[µμun]?s|ms|[KMG]iB|MB|KB|%|x)\b"
    r"|\d[\d.,]*\s?(?:us|µs|μs|ms|s) of CPU"
)


def test_no_comment_quotes_a_measured_timing() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for top in ("server", "facade")
        for path in sorted((ROOT / top).rglob("*"))
        if path.suffix in (".py", ".lua") and "_generated" not in path.parts
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if FIGURE.search(line)
    ]
    assert found == [], "move the figure to docs/performance.md with its command and date"
