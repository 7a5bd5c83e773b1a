"""Kernel-mapping regexps: RE2 only, unanchored, linear in time."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kmodkit.core.engine.re2 import RegexpError, check_re2, re2_search


@pytest.mark.parametrize(
    ("pattern", "kernel", "matches"),
    [
        (r"5.14", "5.14.0-284.el9.x86_64", True),
        (r"5.14", "15.14.1", True),
        (r"^5\.14\.", "15.14.1", False),
        (r"^6\.[0-9]+\.0-\d+-generic$", "6.8.0-45-generic", True),
        (r"el9_[[:digit:]]+", "5.14.0-284.el9_2.x86_64", True),
        (r"(?i)GENERIC$", "6.8.0-45-generic", True),
        (r"^6\.(?:8|9)\.", "6.9.1", True),
        (r"(?P<major>6)\.(?<minor>8)", "6.8.0", True),
        (r"x86_64\z", "5.14.0.x86_64", True),
        (r"\Q6.8.0+\E", "6.8.0+rt", True),
        (r"\Q6.8.0+\E", "6.8.0-rt", False),
        (r"(?U)^6.*?8", "6.8.0", True),
        (r"\x{36}\.8", "6.8.0", True),
        (r"^[^5]", "6.8.0", True),
        (r"[]a]", "]", True),
        (r"a{2,3}", "aaa", True),
        (r"\pN+", "6", True),
    ],
)
def test_search(pattern: str, kernel: str, matches: bool) -> None:
    assert re2_search(pattern, kernel) is matches


@pytest.mark.parametrize(
    ("pattern", "complaint"),
    [
        (r"(\d)\.\1", "backreference"),
        (r"(?P<v>\d)(?P=v)", "named backreference"),
        (r"\k<v>", "\\k"),
        (r"^6(?=\.8)", "lookahead"),
        (r"^6(?!\.8)", "negative lookahead"),
        (r"(?<=6)\.8", "lookbehind"),
        (r"(?<!6)\.8", "negative lookbehind"),
        (r"(?>6|6\.8)", "atomic group"),
        (r"6.*+8", "possessive"),
        (r"6.++", "possessive"),
        (r"6.{1,2}+", "possessive"),
        (r"6**", "repetition applied to a repetition"),
        (r"6*??", "repetition applied to a repetition"),
        (r"(?(1)a|b)", "conditional"),
        (r"(?R)", "recursion"),
        (r"(?x) 6 . 8", "group '(?'"),
        (r"(?#comment)6", "comment"),
        (r"\Z", "\\Z"),
        (r"\G6", "\\G"),
        (r"6\.8\K", "\\K"),
        (r"a{1001}", "limit of 1000"),
        (r"a{3,2}", "maximum below its minimum"),
        (r"[6", "never closed"),
        ("6\\", "lone backslash"),
        (r"(6", "not a valid regular expression"),
        (r"(?P<n>6)(?<n>8)", "unique group names"),
        ("(" * 101 + ")" * 101, "more than 100 deep"),
        (r"\x{110000}", "not a valid regular expression"),
    ],
)
def test_non_re2_constructs_are_refused(pattern: str, complaint: str) -> None:
    with pytest.raises(RegexpError) as err:
        check_re2(pattern)
        re2_search(pattern, "6.8.0")
    assert complaint in str(err.value)


def test_a_pattern_that_backtracks_elsewhere_matches_in_linear_time() -> None:
    # A backtracking engine takes about 2**n steps here (never ending at this length);
    # RE2 answers at once, so matching needs no clock that a loaded machine could trip.
    assert re2_search(r"^(a|aa)+$", "a" * 100_000 + "!") is False
    assert re2_search(r"^(a|aa)+$", "a" * 100_000) is True


_regexp_text = st.lists(
    st.sampled_from(
        [
            "(",
            ")",
            "(?",
            "[",
            "]",
            "\\",
            "*",
            "+",
            "?",
            "{",
            "}",
            "1",
            ",",
            ":",
            "<",
            ">",
            "=",
            "!",
            "P",
            "i",
            "U",
            "x",
            "z",
            "Q",
            "E",
            "^",
            "$",
            ".",
            "|",
            "a",
            "-",
            "[:",
            ":]",
        ]
    ),
    max_size=16,
).map("".join)


@settings(max_examples=500)
@given(_regexp_text, st.text(max_size=20))
def test_any_pattern_matches_or_raises_regexp_error(pattern: str, text: str) -> None:
    try:
        re2_search(pattern, text)
    except RegexpError as err:
        assert str(err)
