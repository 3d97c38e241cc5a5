"""Comments and docstrings in server/ and facade/ state invariants and reasons, not timings:
a measured figure ages with the machine and the code, and two copies of it disagree. The
figures live on the documentation's performance page (docs/performance.md), each with the
command that produced it and its date."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# A figure: a number or a range of them ("1,400", "0.3-0.7", "2-3") with a unit of time,
# size, share, ratio or rate. A figure alone is often a bound the code enforces or a
# protocol's constant ("a 16 KiB prefix", "every 2 s", "5%", "4x its bytes"); what makes it a
# measurement is the way it is said, below.
_NUMBER = r"\d[\d,]*(?:\.\d+)?"
_SPAN = rf"{_NUMBER}(?:\s?[-\u2013]\s?{_NUMBER})?"
_RATIO = r"(?:%|x|\u00d7)(?![\w/])"  # a share, or a multiple ("3x", "3\u00d7")
_RATE = r"(?:batches|commits|settlements|transactions|calls|rows|req|requests)/s(?![\w/])"
_SMALL = r"(?:[\u00b5\u03bcun]s|ms|[KMG]i?B|[KMG]B)(?![\w/])"  # all but whole seconds
_UNIT = rf"(?:(?:s|min)(?![\w/])|{_SMALL}|{_RATIO}|{_RATE})"
_FIGURE = rf"{_SPAN}\s?{_UNIT}"
# how a measurement is said on one line (or across the line breaks of one comment)
MEASURED = re.compile(
    # a duration in micro- or nanoseconds: nothing the gateway bounds is that short
    rf"{_NUMBER}\s?(?:us|\u00b5s|\u03bcs|ns)(?![\w/])"
    # an approximate figure ("~40 us", "~2-3x", "about 0.1 ms"); "about" before whole
    # seconds is left to a format's or a protocol's rounding ("about 0.15 s of priming")
    rf"|(?:~|\u2248)\s?{_FIGURE}"
    rf"|\b(?:about|roughly|nearly|almost|around)\s{_SPAN}\s?(?:{_SMALL}|{_RATIO}|{_RATE})"
    # the spread of several runs: a range of decimals, or of shares and multiples
    # ("0.3-0.7 s", "21-32%", "2-3x"); a protocol's ranges are whole ("durations 2-15 s")
    rf"|\d+\.\d+\s?[-\u2013]\s?{_NUMBER}\s?{_UNIT}"
    rf"|\d+\s?[-\u2013]\s?\d+\s?{_RATIO}"
    # what it cost or how it compared ("1.2 s of CPU", "25% less CPU", "3x slower",
    # "costs 4 ms", "grew to 240 MB", "cost three times the line itself")
    rf"|{_FIGURE} of (?:CPU|wall)"
    rf"|{_SPAN}\s?{_RATIO}\s(?:slower|faster|cheaper|(?:less|more) (?:CPU|time|memory|latency))"
    rf"|\b(?:costs?|took|grew to|peaked at|spent|stalled for)\s(?:about\s|~\s?)?{_FIGURE}"
    r"|\bcosts?\s(?:about\s)?(?:twice|(?:two|three|four|five|ten)\s+times)\b"
    # a throughput of the gateway's own work ("at 1,400 batches/s"); req/s counts above only
    # where it is said as a measurement, since a client's rate limit is one too
    rf"|{_NUMBER}\s?(?:batches|commits|settlements|transactions)/s(?![\w/])"
)
# a figure said to be measured ("measured: ...", "measured, ..."), or in a parenthesis that
# names the measurement or the machine it ran on ("(a 23 s recording ... on a loaded machine)")
_SAID_MEASURED = re.compile(rf"\bmeasured[:,][^;()]{{0,160}}?(?P<figure>{_FIGURE})")
_ASIDE = re.compile(r"\([^()]*\)")
_WITNESS = re.compile(r"\b(?:measured|machine|VM|load average|bench\.\w+)\b")
_FIGURE_ALONE = re.compile(_FIGURE)


def measured_lines(text: str) -> list[int]:
    """The lines of `text` (1-based) on which a measured figure is quoted."""
    starts = [match.start() for match in MEASURED.finditer(text)]
    starts += [match.start("figure") for match in _SAID_MEASURED.finditer(text)]
    for aside in _ASIDE.finditer(text):
        if _WITNESS.search(aside.group()):
            starts += [aside.start() + m.start() for m in _FIGURE_ALONE.finditer(aside.group())]
    return sorted({text.count("\n", 0, start) + 1 for start in starts})


@pytest.mark.parametrize(
    "said",
    [
        "one statement costs ~40 us",
        "a lone unit's 60 µs",
        "~7 MiB",
        "~1.2 s of CPU",
        "(measured: 0.3-0.7 s at 1,400 batches/s)",
        "(measured: the\n#   WAL grew to 240 MB over 4,000 commits)",
        "(measured, a\n# batch of 8 settlements: ~25% less CPU)",
        "the 8th unit's statements ~2-3x slower than a lone unit's",
        "(measured: a thread running a\n23 s recognition left the loop without the GIL for 57 s)",
        "(a 23 s recording: one stretch of about a minute\non a loaded machine)",
        "a hand-off and back (about 0.1 ms on the one pooled connection)",
        "21\u201332% less in each run",
        "1.5\u20132.7\u00d7 faster",
        "the formatting costs three times the line itself",
        "measured: 3 ms per call",
    ],
)
def test_the_pattern_finds_a_measurement(said: str) -> None:
    assert measured_lines(said), said


@pytest.mark.parametrize(
    "said",
    [
        "a 16 KiB prefix",
        "the 64 KiB window",
        "a 2 GiB bound",
        "a 10 s deadline",
        "provider polling backoff: 1 s doubling to 30 s",
        "refused with 429, or 503 with Retry-After (RFC 9110)",
        "S3's parts: 5 MiB to 5 GiB",
        "Durations 5 / 10 s (kling-v3: 3-15 s)",
        "OpenRouter's fee: 5%, the heap is shrunk from 90%",
        "each counted as 4x its bytes",
        "young collections run 10x less often",
        "sleeps in steps of up to 100 ms",
        "cut off at 300 requests/s",
        "AAC's priming at 8 kHz is about 0.15 s",
        "(bench.videos: fewer 202s/s, no less work)",
        "the frames measured, in a worker process",
        'f"%{code:02X}" for code in range(0x20)',
    ],
)
def test_the_pattern_leaves_a_bound_alone(said: str) -> None:
    assert measured_lines(said) == [], said


def test_no_comment_quotes_a_measured_timing() -> None:
    found = []
    for top in ("server", "facade"):
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix not in (".py", ".lua") or "_generated" in path.parts:
                continue
            lines = path.read_text().splitlines()
            for number in measured_lines("\n".join(lines)):
                found.append(f"{path.relative_to(ROOT)}:{number}: {lines[number - 1].strip()}")
    assert found == [], "\n".join(
        ["move the figure to docs/performance.md with its command and date:", *found]
    )
