"""The Module rules, checked offline: each rejection names its field and says what to do."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kmodkit.core.engine.module_rules import validate_module
from tests.unit.examples import kmm_example, kmodkit_example, minimal
from tests.unit.module_cases import CASES, Case


@pytest.mark.parametrize("body", [kmm_example(), kmodkit_example(), minimal()])
def test_valid_bodies(body: dict[str, Any]) -> None:
    assert validate_module(body) == []


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_invalid_body_is_rejected_at_its_field(case: Case) -> None:
    problems = validate_module(case.build("ns"))
    assert [problem.path for problem in problems] == [case.path]
    assert len(problems[0].message) > 20


def test_messages_say_what_to_do() -> None:
    body = minimal(containerImage="registry:5000/mod")
    (problem,) = validate_module(body)
    assert "has no tag or digest" in problem.message
    assert "registry:5000/mod:${KERNEL_FULL_VERSION}" in problem.message


def test_rollout_is_refused_on_a_kmm_module() -> None:
    body = kmm_example()
    body["spec"]["rollout"] = {"maxUnavailable": 2}
    assert [p.path for p in validate_module(body)] == ["spec.rollout"]


@pytest.mark.parametrize(
    ("where", "field", "advice"),
    [
        (("spec",), "dra", "DRA"),
        (("spec", "moduleLoader", "container"), "kernelMapings", "spelling"),
    ],
)
def test_unknown_fields_get_advice(where: tuple[str, ...], field: str, advice: str) -> None:
    body = kmm_example()
    target = body
    for key in where:
        target = target[key]
    target[field] = {}
    (problem,) = validate_module(body)
    assert problem.path == ".".join((*where, field))
    assert advice in problem.message


def test_wrong_type_in_int_or_string_field() -> None:
    body = minimal()
    body["spec"]["rollout"] = {"maxUnavailable": [1]}
    (problem,) = validate_module(body)
    assert problem.path == "spec.rollout.maxUnavailable"
    assert "expected integer or string" in problem.message


def test_name_length_counts_the_namespace() -> None:
    body = minimal()
    body["metadata"] = {"name": "m" * 20, "namespace": "n" * 21}
    assert validate_module(body) == []
    body["metadata"]["namespace"] += "n"
    assert [p.path for p in validate_module(body)] == ["metadata.name"]


# Leaf paths of the minimal body that random values are written into.
_PATHS = [
    ("metadata", "name"),
    ("spec", "selector"),
    ("spec", "tolerations"),
    ("spec", "rollout"),
    ("spec", "moduleLoader", "container", "containerImage"),
    ("spec", "moduleLoader", "container", "version"),
    ("spec", "moduleLoader", "container", "build"),
    ("spec", "moduleLoader", "container", "modprobe", "moduleName"),
    ("spec", "moduleLoader", "container", "modprobe", "modulesLoadingOrder"),
    ("spec", "moduleLoader", "container", "modprobe", "rawArgs"),
    ("spec", "moduleLoader", "container", "kernelMappings"),
]
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=30),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(["name", "key", "operator", "value", "regexp", "literal", "load", "x"]),
            children,
            max_size=3,
        )
    ),
    max_leaves=8,
)


@settings(max_examples=300)
@given(st.lists(st.tuples(st.sampled_from(_PATHS), _json), min_size=1, max_size=4))
def test_every_rejection_names_a_field(changes: list[tuple[tuple[str, ...], Any]]) -> None:
    body = minimal()
    for path, value in changes:
        target = body
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    for problem in validate_module(body):
        assert problem.path.split(".")[0].split("[")[0] in {"metadata", "spec"}
        assert problem.message
