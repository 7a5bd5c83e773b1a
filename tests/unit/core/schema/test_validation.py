"""The validator registry that backends extend with their own kinds."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from pydantic import ValidationError

from kmodkit.core.api import Module
from kmodkit.core.schema.validation import Problem, ValidatorRegistry, field_path, schema_problems


def _always(problem: Problem) -> Any:
    def validator(obj: Mapping[str, Any]) -> list[Problem]:
        return [problem]

    return validator


def test_dispatches_on_api_version_and_kind() -> None:
    registry = ValidatorRegistry()
    registry.register("example.com/v1", "Widget", _always(Problem("spec.size", "too big")))
    assert registry.validate({"apiVersion": "example.com/v1", "kind": "Widget"}) == [
        Problem("spec.size", "too big")
    ]


def test_unknown_kind_lists_the_known_ones() -> None:
    registry = ValidatorRegistry()
    registry.register("example.com/v1", "Widget", _always(Problem("", "")))
    (problem,) = registry.validate({"apiVersion": "v1", "kind": "ConfigMap"})
    assert problem.path == "apiVersion"
    assert "example.com/v1 Widget" in problem.message


def test_non_objects_are_problems() -> None:
    (problem,) = ValidatorRegistry().validate(["not", "an", "object"])
    assert "not a Kubernetes object" in problem.message


def test_a_kind_registers_once() -> None:
    registry = ValidatorRegistry()
    registry.register("example.com/v1", "Widget", _always(Problem("", "")))
    with pytest.raises(ValueError, match="already registered"):
        registry.register("example.com/v1", "Widget", _always(Problem("", "")))


def test_field_path() -> None:
    assert field_path(["spec", "tolerations", 0, "key"]) == "spec.tolerations[0].key"
    assert field_path([]) == ""


def test_schema_problems_are_one_per_field() -> None:
    with pytest.raises(ValidationError) as err:
        Module.model_validate({"spec": {"selector": {}, "moduleLoader": {"container": {}}}})
    problems = schema_problems(err.value)
    assert {p.path: p.message for p in problems} == {
        "spec.moduleLoader.container.modprobe": "is required",
        "spec.moduleLoader.container.kernelMappings": "is required",
    }
