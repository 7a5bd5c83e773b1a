"""Shell-style ``$VAR`` substitution for image names and build arguments.

The syntax is the subset of shell parameter expansion KMM accepts: ``$VAR``,
``${VAR}``, ``${VAR-word}``, ``${VAR:-word}``, ``${VAR=word}``,
``${VAR:=word}``, ``${VAR+word}``, ``${VAR:+word}``, and ``$$`` for a literal
dollar. A ``$`` that starts no reference (``$-``, ``$1``, a trailing ``$``)
stays as it is, as in the shell.

KMM silently expands an unknown variable to the empty string, which turns a
typo such as ``$KERNEL_VER`` into an image tag like ``driver:`` that fails much
later on a node. Here an unknown variable is an error that names it and lists
the valid ones.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPERATORS = (":-", ":=", ":+", "-", "=", "+")
# Deep nesting (${A:-${B:-...}}) has no real use; the bound keeps the parser's
# recursion shallow whatever the input.
_MAX_NESTING = 8


class TemplateError(ValueError):
    """A template that cannot be expanded; the message says why and what to do."""


@dataclass(frozen=True)
class _Reference:
    name: str
    operator: str
    word: tuple[str | _Reference, ...]


_Part = str | _Reference


def _parse(text: str, start: int, depth: int) -> tuple[list[_Part], int]:
    """Parse from ``start`` to the end, or to the ``}`` closing a nested word."""
    parts: list[_Part] = []
    literal: list[str] = []
    i = start
    while i < len(text):
        char = text[i]
        if char == "}" and depth > 0:
            break
        if char != "$":
            literal.append(char)
            i += 1
            continue
        following = text[i + 1 : i + 2]
        if following == "$":
            literal.append("$")
            i += 2
            continue
        if following == "{":
            reference, i = _parse_braced(text, i, depth)
        elif (match := _NAME.match(text, i + 1)) is not None:
            reference, i = _Reference(match.group(), "", ()), match.end()
        else:
            literal.append("$")
            i += 1
            continue
        if literal:
            parts.append("".join(literal))
            literal = []
        parts.append(reference)
    if literal:
        parts.append("".join(literal))
    return parts, i


def _parse_braced(text: str, dollar: int, depth: int) -> tuple[_Reference, int]:
    match = _NAME.match(text, dollar + 2)
    if match is None:
        raise TemplateError(
            f"'${{' at position {dollar} must be followed by a variable name, as in "
            "${KERNEL_FULL_VERSION}; write $$ for a literal '$'"
        )
    name, i = match.group(), match.end()
    if i >= len(text):
        raise _unclosed(dollar)
    if text[i] == "}":
        return _Reference(name, "", ()), i + 1
    operator = next((op for op in _OPERATORS if text.startswith(op, i)), None)
    if operator is None:
        raise TemplateError(
            f"unexpected {text[i]!r} after '${{{name}' at position {dollar}; write ${{{name}}}"
        )
    if depth + 1 > _MAX_NESTING:
        raise TemplateError(f"references nest more than {_MAX_NESTING} deep at position {dollar}")
    word, end = _parse(text, i + len(operator), depth + 1)
    if end >= len(text):
        raise _unclosed(dollar)
    return _Reference(name, operator, tuple(word)), end + 1


def _unclosed(dollar: int) -> TemplateError:
    return TemplateError(f"'${{' at position {dollar} is never closed; add the closing '}}'")


def _parse_template(text: str) -> list[_Part]:
    parts, _ = _parse(text, 0, 0)
    return parts


def _references(parts: Iterable[_Part]) -> Iterator[_Reference]:
    for part in parts:
        if isinstance(part, _Reference):
            yield part
            yield from _references(part.word)


def referenced_variables(text: str) -> list[str]:
    """Names of the variables ``text`` refers to, in order of appearance.

    Raises TemplateError when ``text`` is not a well-formed template.
    """
    return [reference.name for reference in _references(_parse_template(text))]


def unknown_variable_error(name: str, known: Iterable[str]) -> TemplateError:
    valid = ", ".join(f"${v}" for v in known)
    return TemplateError(
        f"unknown variable ${name}; valid variables are {valid} (write $$ for a literal '$')"
    )


def check_template(text: str, known: Iterable[str]) -> None:
    """Check syntax and that every variable is one of ``known``, without values."""
    known = tuple(known)
    for name in referenced_variables(text):
        if name not in known:
            raise unknown_variable_error(name, known)


def substitute(
    text: str,
    values: Mapping[str, str],
    unavailable: Mapping[str, str] | None = None,
) -> str:
    """Expand every reference in ``text``.

    ``values`` holds the variables that are set. ``unavailable`` maps a known
    variable that has no value in this context to the reason, which becomes
    the error message when the template needs it.
    """
    unavailable = unavailable or {}
    known = (*values, *unavailable)
    return _expand(_parse_template(text), values, unavailable, known)


def _expand(
    parts: Iterable[_Part],
    values: Mapping[str, str],
    unavailable: Mapping[str, str],
    known: tuple[str, ...],
) -> str:
    out: list[str] = []
    for part in parts:
        if isinstance(part, str):
            out.append(part)
            continue
        if part.name in unavailable:
            raise TemplateError(f"${part.name} is not available: {unavailable[part.name]}")
        if part.name not in values:
            raise unknown_variable_error(part.name, known)
        value = values[part.name]
        operator = part.operator
        # Every known variable is set, so only the ':' forms can fall back,
        # and only when the value is empty.
        if operator in ("", "-", "="):
            out.append(value)
        elif operator in (":-", ":="):
            out.append(value or _expand(part.word, values, unavailable, known))
        elif operator == "+":
            out.append(_expand(part.word, values, unavailable, known))
        else:
            out.append(_expand(part.word, values, unavailable, known) if value else "")
    return "".join(out)
