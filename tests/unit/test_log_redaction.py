"""The log redaction's one-scan shortcut (server/observability/logs.py) never lets a line
through that one of the secret patterns would have changed."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from server.observability.logs import _ANY_SECRET, _SECRETS, may_hold_secret, redact


@settings(max_examples=300, deadline=None, database=None)
@given(data=st.data(), index=st.integers(0, len(_SECRETS) - 1), around=st.text(max_size=20))
def test_every_secret_pattern_is_caught_by_the_shortcut(
    data: st.DataObject, index: int, around: str
) -> None:
    pattern = _SECRETS[index][0]
    secret = data.draw(st.from_regex(pattern, fullmatch=True))
    line = f"{around} {secret} {around}"
    assert _ANY_SECRET.search(line) is not None
    assert may_hold_secret(line)
    assert redact(line) == _full_redaction(line)


_WORDS = st.sampled_from(["sk-gw-", "SK-GW-", "whsec_", "WHSEC_", "bearer", "basic", "x"])


@settings(max_examples=500, deadline=None, database=None)
@given(
    pieces=st.lists(
        st.one_of(
            _WORDS,
            _WORDS.map(lambda w: "".join(c.upper() if i % 2 else c for i, c in enumerate(w))),
            st.text(max_size=8),
            st.text(alphabet="bBeEaArRsSiIcC\u017f\u0131\u0130-_kK", max_size=8),
        ),
        max_size=8,
    )
)
def test_the_literal_search_agrees_with_the_shortcut_regex(pieces: list[str]) -> None:
    line = "".join(pieces)
    assert may_hold_secret(line) == (_ANY_SECRET.search(line) is not None)


def _full_redaction(text: str) -> str:
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text


def test_a_line_without_secrets_is_returned_as_it_is() -> None:
    line = '{"message": "POST /api/v1/audio/transcriptions 200 12.3 ms", "status": 200}'
    assert redact(line) is line
    assert "[redacted]" in redact("Authorization: Bearer abc.def")
    assert "sk-gw-v1-[redacted]" in redact("key sk-gw-v1-abcDEF123")
