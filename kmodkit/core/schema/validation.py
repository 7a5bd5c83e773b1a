"""Offline validation of Kubernetes objects, by (apiVersion, kind).

The same checks the apiserver applies at admission, plus those CEL cannot
express, run here without a cluster (``kmodkit validate``). Each kind
registers one validator; backends register theirs for the kinds they serve.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an object: the field path, and what is wrong and what to do."""

    path: str
    message: str


Validator = Callable[[Mapping[str, Any]], list[Problem]]


class ValidatorRegistry:
    """Validators by (apiVersion, kind)."""

    def __init__(self) -> None:
        self._validators: dict[tuple[str, str], Validator] = {}

    def register(self, api_version: str, kind: str, validator: Validator) -> None:
        """Validate objects of ``api_version``/``kind`` with ``validator``."""
        if (api_version, kind) in self._validators:
            raise ValueError(f"a validator for {api_version} {kind} is already registered")
        self._validators[(api_version, kind)] = validator

    def kinds(self) -> list[tuple[str, str]]:
        """The (apiVersion, kind) pairs this registry validates, sorted."""
        return sorted(self._validators)

    def validate(self, obj: object) -> list[Problem]:
        """Every problem with ``obj``; an empty list means it is valid."""
        if not isinstance(obj, Mapping):
            return [Problem("", f"is a {type(obj).__name__}, not a Kubernetes object")]
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        validator = self._validators.get((str(api_version), str(kind)))
        if validator is None:
            known = ", ".join(f"{v} {k}" for v, k in self.kinds())
            return [
                Problem(
                    "apiVersion",
                    f"{api_version} {kind} is not a kind kmodkit validates; it validates {known}",
                )
            ]
        return validator(obj)


def field_path(loc: Iterable[str | int]) -> str:
    """A dotted field path with list indexes, e.g. ``spec.tolerations[0].key``."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else part)
    return path


# Pydantic names the branch of a union it tried ("int", "str") in an error's
# location; those are not fields.
_UNION_BRANCHES = {
    "int": "integer",
    "str": "string",
    "bool": "boolean",
    "float": "number",
    "list": "list",
    "dict": "mapping",
    "none": "null",
}


def schema_problems(
    error: ValidationError, unknown_field_hint: Callable[[str], str] | None = None
) -> list[Problem]:
    """Problems for a model's validation errors, one per field.

    ``unknown_field_hint`` may add advice for a field the model does not know,
    given its name.
    """
    messages: dict[str, str] = {}
    union_branches: dict[str, list[str]] = {}
    for detail in error.errors():
        loc = [p for p in detail["loc"] if not (isinstance(p, str) and p in _UNION_BRANCHES)]
        path = field_path(loc)
        if len(loc) != len(detail["loc"]):
            union_branches.setdefault(path, []).append(_UNION_BRANCHES[str(detail["loc"][-1])])
            continue
        if path in messages:
            continue
        kind = detail["type"]
        if kind == "missing":
            messages[path] = "is required"
        elif kind == "extra_forbidden":
            hint = unknown_field_hint(str(loc[-1])) if unknown_field_hint and loc else ""
            messages[path] = hint or "is not a known field; check its spelling and indentation"
        else:
            messages[path] = _lower_first(detail["msg"])
    for path, branches in union_branches.items():
        messages.setdefault(path, f"has the wrong type; expected {' or '.join(branches)}")
    return [Problem(path, message) for path, message in messages.items()]


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]
