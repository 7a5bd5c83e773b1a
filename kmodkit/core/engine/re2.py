"""Kernel-mapping regexps: RE2 syntax, checked strictly, matched by RE2 itself.

KMM matches mappings with Go's RE2 engine, so a Module is only portable if its
regexps are RE2. We refuse, with advice, every construct Go's RE2 refuses (which
C++ RE2 may accept or explain less clearly), then compile and match with RE2
(the ``google-re2`` bindings): matching takes time linear in the kernel string,
so no pattern can stall a pass and no clock is involved. Matching is unanchored,
as in KMM: ``5.14`` matches ``5.14.0-284.el9`` and also ``15.14.1``.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import re2

# Escapes RE2 understands besides escaped punctuation: character codes, Perl
# classes, assertions, Unicode classes and \Q...\E quoting.
_RE2_ESCAPES = frozenset("aftnrvx0dDsSwWbBAzpPQE")
_REPEAT = re.compile(r"\{(\d+)(,(\d*))?\}")
_FLAGS = re.compile(r"\(\?([imsU]*)(?:-([imsU]*))?([:)])")
_NAMED_GROUP = re.compile(r"\(\?P?<([A-Za-z_][A-Za-z0-9_]*)>")
_MAX_REPEAT = 1000
# Go's RE2 nests deeper; no kernel regexp comes near this.
_MAX_NESTING = 100
_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a refused pattern is reported to its author, not to stderr

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
    """A regexp that is not RE2; says why and what to do."""


def check_re2(pattern: str) -> None:
    """Raise RegexpError unless ``pattern`` is valid RE2 syntax."""
    _check(pattern)


@functools.lru_cache(maxsize=1024)
def compile_re2(pattern: str) -> Any:
    """Compile an RE2 ``pattern`` (cached)."""
    _check(pattern)
    try:
        return re2.compile(pattern, options=_OPTIONS)
    except re2.error as err:
        reason = err.args[0].decode() if err.args and isinstance(err.args[0], bytes) else err
        raise RegexpError(f"is not a valid regular expression: {reason}") from None


def re2_search(pattern: str, text: str) -> bool:
    """Whether RE2 ``pattern`` matches anywhere in ``text``."""
    return compile_re2(pattern).search(text) is not None


def _check(pattern: str) -> None:
    """Check ``pattern`` against Go RE2's grammar, naming the first thing it refuses."""
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
                i = repeat.end()
            else:
                i += 1
            continue
        state = "atom"
        if char == "\\":
            i = _escape(pattern, i)
        elif char == "[":
            i = _char_class(pattern, i)
        elif char == "(":
            name, i = _group_open(pattern, i)
            depth += 1
            if depth > _MAX_NESTING:
                raise RegexpError(f"nests groups more than {_MAX_NESTING} deep; simplify it")
            if name in group_names:
                raise RegexpError(f"names two groups {name!r}; RE2 needs unique group names")
            if name:
                group_names.add(name)
        else:
            if char == ")":
                depth -= 1
            i += 1


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


def _escape(pattern: str, i: int) -> int:
    """The escape at ``i`` checked; where the next token starts."""
    if i + 1 >= len(pattern):
        raise RegexpError("ends with a lone backslash; escape it as \\\\")
    letter = pattern[i + 1]
    if not letter.isalnum():
        return i + 2
    if letter.isdigit() and letter != "0":
        raise RegexpError(
            f"uses \\{letter}, a backreference, which RE2 does not support; "
            "match the text explicitly instead (write \\x.. for a character code)"
        )
    if letter not in _RE2_ESCAPES:
        raise RegexpError(f"uses the escape \\{letter}, which RE2 does not support")
    if letter == "Q":
        end = pattern.find(r"\E", i + 2)
        return len(pattern) if end < 0 else end + 2
    if letter == "E":
        raise RegexpError("has \\E without a \\Q before it")
    if letter == "x" and pattern.startswith("{", i + 2):
        end = pattern.find("}", i + 3)
        code = pattern[i + 3 : end] if end > 0 else ""
        if not code or not all(c in "0123456789abcdefABCDEF" for c in code) or len(code) > 6:
            raise RegexpError(f"has a malformed character code at position {i}")
        return end + 1
    return i + 2


def _char_class(pattern: str, i: int) -> int:
    """The class opened at ``i`` checked; where the next token starts."""
    j = i + 1
    if pattern.startswith("^", j):
        j += 1
    if pattern.startswith("]", j):
        j += 1
    while j < len(pattern):
        char = pattern[j]
        if char == "]":
            return j + 1
        if char == "\\":
            j = _escape(pattern, j)
        elif pattern.startswith("[:", j) and (end := pattern.find(":]", j + 2)) > 0:
            j = end + 2
        else:
            j += 1
    raise RegexpError(f"has a '[' at position {i} that is never closed; add the closing ']'")


def _group_open(pattern: str, i: int) -> tuple[str, int]:
    """The group opened at ``i`` checked; its name (empty: none) and where it goes on."""
    if not pattern.startswith("(?", i):
        return "", i + 1
    for prefix, what in _UNSUPPORTED_GROUPS:
        if pattern.startswith(prefix, i):
            raise RegexpError(f"uses a {what}, which RE2 does not support")
    if (named := _NAMED_GROUP.match(pattern, i)) is not None:
        return named.group(1), named.end()
    if (flags := _FLAGS.match(pattern, i)) is not None:
        return "", flags.end()
    raise RegexpError(
        f"has a group '(?' at position {i} RE2 does not understand; RE2 groups are (...), "
        "(?:...), (?P<name>...) and flag groups such as (?i)"
    )
