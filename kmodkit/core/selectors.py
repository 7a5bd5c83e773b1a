"""Syntax checks for label keys, values and label-selector strings.

Selectors are matched by the apiserver (pods are listed with them), so a bad one
would only surface mid-rollout as a failed list. Checking the syntax when the
policy is loaded turns that into an error that names the field.
"""

from __future__ import annotations

import re

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_PREFIX = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_KEY = rf"({_PREFIX}/)?{_NAME}"
_VALUE = rf"({_NAME})?"
_KEY_RE = re.compile(rf"^{_KEY}$")
_VALUE_RE = re.compile(rf"^{_VALUE}$")
_REQUIREMENT = re.compile(
    rf"^\s*(?:"
    rf"!\s*{_KEY}"
    rf"|{_KEY}"
    rf"|{_KEY}\s*(?:==|=|!=)\s*{_VALUE}"
    rf"|{_KEY}\s+(?:in|notin)\s*\(\s*{_VALUE}(?:\s*,\s*{_VALUE})*\s*\)"
    rf")\s*$"
)
_MAX_PREFIX = 253


def is_label_key(key: str) -> bool:
    prefix, _, _name = key.rpartition("/")
    return len(prefix) <= _MAX_PREFIX and bool(_KEY_RE.match(key))


def is_label_value(value: str) -> bool:
    return bool(_VALUE_RE.match(value))


def _split_requirements(selector: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(selector):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(selector[start:i])
            start = i + 1
    parts.append(selector[start:])
    return parts


def selector_error(selector: str) -> str | None:
    """Why a label-selector string is invalid, or None if it is valid (empty selects all)."""
    if not selector.strip():
        return None
    for requirement in _split_requirements(selector):
        if not _REQUIREMENT.match(requirement):
            return (
                f"{requirement.strip()!r} is not a label requirement; use key, !key, key=value, "
                "key!=value, key in (a,b) or key notin (a,b), separated by commas"
            )
    return None
