"""Kernel-mapping regexps: RE2 syntax, checked strictly, matched with a time bound.

KMM matches mappings with Go's RE2 engine, so a Module is only portable if its
regexps are RE2. Python's engines accept more (backreferences, lookaround,
possessive quantifiers, ...) and backtrack, so we first refuse everything RE2
refuses, then translate the few RE2 spellings the ``regex`` package reads
differently, and always search with a timeout. Matching is unanchored, as in
KMM: ``5.14`` matches ``5.14.0-284.el9`` and also ``15.14.1``.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import regex

MATCH_TIMEOUT_SECONDS = 0.05

# Escapes RE2 understands besides escaped punctuation: character codes, Perl
# classes, assertions, Unicode classes and \Q...\E quoting.
_RE2_ESCAPES = frozenset("aftnrvx0dDsSwWbBAzpPQE")
_REPEAT = re.compile(r"\{(\d+)(,(\d*))?\}")
_FLAGS = re.compile(r"\(\?([imsU]*)(?:-([imsU]*))?([:)])")
_NAMED_GROUP = re.compile(r"\(\?P?<([A-Za-z_][A-Za-z0-9_]*)>")
_MAX_REPEAT = 1000
# RE2 allows deeper nesting, but the regex package parses groups recursively;
# no kernel regexp comes near this.
_MAX_NESTING = 100

_UNSUPPORTED_GROUPS = (
    ("(?=", "lookahead (?=...)"),
    ("(?!", "negative lookahead (?!...)"),
    ("(?<=", "lookbehind (?<=...)"),
    ("(?<!", "negative lookbehind (?<!...)"),
    ("(?>", "atomic group (?>...)"),
    ("(?#", "comment (?#...)"),
    ("(?(", "conditional (?(...)...)"),
    ("(?P=", "named backreference (?P=...)"),
    ("(?P>", "subroutine call (?P>...)"),
    ("(?&", "subroutine call (?&...)"),
    ("(?R", "recursion (?R)"),
    ("(?|", "branch reset (?|...)"),
)


class RegexpError(ValueError):
    """A regexp that is not RE2, or that cannot be matched; says why and what to do."""


def check_re2(pattern: str) -> None:
    """Raise RegexpError unless ``pattern`` is valid RE2 syntax."""
    _translate(pattern)


@functools.lru_cache(maxsize=1024)
def compile_re2(pattern: str) -> Any:
    """Compile an RE2 ``pattern`` for the ``regex`` package (cached)."""
    translated = _translate(pattern)
    try:
        return regex.compile(translated, flags=regex.VERSION0)
    except (regex.error, OverflowError, ValueError) as err:
        raise RegexpError(f"is not a valid regular expression: {err}") from None


def re2_search(pattern: str, text: str) -> bool:
    """Whether RE2 ``pattern`` matches anywhere in ``text``."""
    compiled = compile_re2(pattern)
    try:
        return compiled.search(text, timeout=MATCH_TIMEOUT_SECONDS) is not None
    except TimeoutError:
        raise RegexpError(
            f"took longer than {int(MATCH_TIMEOUT_SECONDS * 1000)} ms to match {text!r}; "
            "simplify it (avoid repeating overlapping alternatives such as (a|aa)+)"
        ) from None


def _translate(pattern: str) -> str:
    """Check ``pattern`` against RE2's grammar and spell it for ``regex``."""
    out: list[str] = []
    i = 0
    # What the previous token was: an atom, a quantifier, or a quantifier
    # made lazy by '?'. RE2 allows one quantifier per atom, optionally lazy.
    state = "atom"
    depth = 0
    group_names: set[str] = set()
    while i < len(pattern):
        char = pattern[i]
        repeat = _REPEAT.match(pattern, i) if char == "{" else None
        if char in "*+?" or repeat is not None:
            if state == "quantified" and char == "?":
                state = "lazy"
            elif state != "atom":
                raise _nested_repeat(i)
            else:
                state = "quantified"
            if repeat is not None:
                _check_repeat_bounds(repeat)
                out.append(repeat.group())
                i = repeat.end()
            else:
                out.append(char)
                i += 1
            continue
        state = "atom"
        if char == "\\":
            text, i = _escape(pattern, i)
        elif char == "[":
            text, i = _char_class(pattern, i)
        elif char == "(":
            text, i = _group_open(pattern, i)
            depth += 1
            if depth > _MAX_NESTING:
                raise RegexpError(f"nests groups more than {_MAX_NESTING} deep; simplify it")
            if text.startswith("(?P<"):
                name = text[4:-1]
                if name in group_names:
                    raise RegexpError(f"names two groups {name!r}; RE2 needs unique group names")
                group_names.add(name)
        else:
            if char == ")":
                depth -= 1
            text, i = char, i + 1
        out.append(text)
    return "".join(out)


def _nested_repeat(i: int) -> RegexpError:
    return RegexpError(
        f"has a repetition applied to a repetition at position {i} (a possessive quantifier "
        "such as a*+ or a nested one such as a**), which RE2 does not support; "
        "use a single quantifier"
    )


def _check_repeat_bounds(repeat: re.Match[str]) -> None:
    low = int(repeat.group(1))
    high = int(repeat.group(3)) if repeat.group(3) else low
    if low > _MAX_REPEAT or high > _MAX_REPEAT:
        raise RegexpError(f"repeat count {repeat.group()} exceeds RE2's limit of {_MAX_REPEAT}")
    if repeat.group(3) and high < low:
        raise RegexpError(f"repeat count {repeat.group()} has its maximum below its minimum")


def _escape(pattern: str, i: int) -> tuple[str, int]:
    if i + 1 >= len(pattern):
        raise RegexpError("ends with a lone backslash; escape it as \\\\")
    letter = pattern[i + 1]
    if not letter.isalnum():
        return pattern[i : i + 2], i + 2
    if letter.isdigit() and letter != "0":
        raise RegexpError(
            f"uses \\{letter}, a backreference, which RE2 does not support; "
            "match the text explicitly instead (write \\x.. for a character code)"
        )
    if letter not in _RE2_ESCAPES:
        raise RegexpError(f"uses the escape \\{letter}, which RE2 does not support")
    if letter == "z":
        return r"\Z", i + 2
    if letter == "Q":
        end = pattern.find(r"\E", i + 2)
        stop = len(pattern) if end < 0 else end
        literal = regex.escape(pattern[i + 2 : stop])
        return literal, len(pattern) if end < 0 else end + 2
    if letter == "E":
        raise RegexpError("has \\E without a \\Q before it")
    if letter == "x" and pattern.startswith("{", i + 2):
        end = pattern.find("}", i + 3)
        code = pattern[i + 3 : end] if end > 0 else ""
        if not code or not all(c in "0123456789abcdefABCDEF" for c in code) or len(code) > 6:
            raise RegexpError(f"has a malformed character code at position {i}")
        return f"\\U{int(code, 16):08x}", end + 1
    return pattern[i : i + 2], i + 2


def _char_class(pattern: str, i: int) -> tuple[str, int]:
    out = ["["]
    j = i + 1
    if pattern.startswith("^", j):
        out.append("^")
        j += 1
    if pattern.startswith("]", j):
        out.append(r"\]")
        j += 1
    while j < len(pattern):
        char = pattern[j]
        if char == "]":
            out.append("]")
            return "".join(out), j + 1
        if char == "\\":
            text, j = _escape(pattern, j)
            out.append(text)
        elif pattern.startswith("[:", j) and (end := pattern.find(":]", j + 2)) > 0:
            out.append(pattern[j : end + 2])
            j = end + 2
        else:
            # '[' inside a class is literal in RE2 but opens a nested set in
            # the regex package, so escape it.
            out.append("\\[" if char == "[" else char)
            j += 1
    raise RegexpError(f"has a '[' at position {i} that is never closed; add the closing ']'")


def _group_open(pattern: str, i: int) -> tuple[str, int]:
    if not pattern.startswith("(?", i):
        return "(", i + 1
    for prefix, what in _UNSUPPORTED_GROUPS:
        if pattern.startswith(prefix, i):
            raise RegexpError(f"uses a {what}, which RE2 does not support")
    if (named := _NAMED_GROUP.match(pattern, i)) is not None:
        return f"(?P<{named.group(1)}>", named.end()
    if (flags := _FLAGS.match(pattern, i)) is not None:
        # Greediness never changes whether a search finds a match, so RE2's
        # U (ungreedy) flag can be dropped; regex reads U as something else.
        on = flags.group(1).replace("U", "")
        off = (flags.group(2) or "").replace("U", "")
        spelled = on + (f"-{off}" if off else "")
        if flags.group(3) == ")":
            return (f"(?{spelled})" if spelled else ""), flags.end()
        return f"(?{spelled}:", flags.end()
    raise RegexpError(
        f"has a group '(?' at position {i} RE2 does not understand; RE2 groups are (...), "
        "(?:...), (?P<name>...) and flag groups such as (?i)"
    )
