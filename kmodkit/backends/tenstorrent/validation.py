"""Offline checks of Tenstorrent policies (``kmodkit validate``): the CRD's rules and more.

The models carry every rule the apiserver applies (patterns, minimums, the
"exactly one of nodeAffinity or nodeSelector" rule) plus the label-selector
syntax of ``drain.podSelectorLabel``, which the CRD cannot check.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from kmodkit.sdk import Problem, schema_problems

_PYDANTIC_PREFIX = "value error, "
_PATTERN_MESSAGES = {
    "version": "must be a release number MAJOR.MINOR.PATCH, e.g. 2.8.0",
    "readbackVersion": "must be the version tt-smi reports, e.g. 19.9.0.0",
    "bundleURL": "must be an http(s) URL without spaces",
    "imagePullPolicy": "must be Always, IfNotPresent or Never",
}


def _readable(problem: Problem) -> Problem:
    message = problem.message.removeprefix(_PYDANTIC_PREFIX)
    if message.startswith("string should match pattern"):
        message = _PATTERN_MESSAGES.get(problem.path.rsplit(".", 1)[-1], message)
    return Problem(problem.path, message)


def problems_of(model: type[BaseModel], obj: Mapping[str, Any]) -> list[Problem]:
    try:
        model.model_validate(obj)
    except ValidationError as err:
        return [_readable(p) for p in schema_problems(err)]
    return []
