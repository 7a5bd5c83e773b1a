"""Template substitution: shell-style, strict about names, never crashing."""

from __future__ import annotations

import contextlib
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kmodkit.core.engine.templating import (
    TemplateError,
    check_template,
    referenced_variables,
    substitute,
)
from kmodkit.core.kernel import TEMPLATE_VARIABLES, template_values

VALUES = {"KERNEL_FULL_VERSION": "6.8.0-45", "KERNEL_X": "6", "MOD_NAME": "xe", "EMPTY": ""}


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("img:$KERNEL_FULL_VERSION", "img:6.8.0-45"),
        ("img:${KERNEL_FULL_VERSION}", "img:6.8.0-45"),
        ("${MOD_NAME}-${KERNEL_X}", "xe-6"),
        ("$MOD_NAME.$KERNEL_X", "xe.6"),
        ("cost $$5 for $$MOD_NAME", "cost $5 for $MOD_NAME"),
        ("trailing $", "trailing $"),
        ("$-x $1 $}", "$-x $1 $}"),
        ("literal } brace", "literal } brace"),
        ("${MOD_NAME-x}${MOD_NAME:-x}${MOD_NAME=x}${MOD_NAME:=x}", "xexexexe"),
        ("${EMPTY-x}|${EMPTY:-x}|${EMPTY:=y}", "|x|y"),
        ("${MOD_NAME+alt}|${EMPTY+alt}|${EMPTY:+alt}|${MOD_NAME:+alt}", "alt|alt||alt"),
        ("${EMPTY:-${MOD_NAME}-${KERNEL_X}}", "xe-6"),
        ("", ""),
    ],
)
def test_substitute(template: str, expected: str) -> None:
    assert substitute(template, VALUES) == expected


@pytest.mark.parametrize(
    ("template", "complaint"),
    [
        ("img:${KERNEL_XYZ", "never closed"),
        ("img:${EMPTY:-${MOD_NAME}", "never closed"),
        ("img:${}", "must be followed by a variable name"),
        ("img:${1}", "must be followed by a variable name"),
        ("img:${MOD_NAME?x}", "unexpected '?'"),
        ("img:$KERNEL_VER", "unknown variable $KERNEL_VER"),
        ("img:${kernel}", "unknown variable $kernel"),
    ],
)
def test_substitute_errors(template: str, complaint: str) -> None:
    with pytest.raises(TemplateError, match=re.escape(complaint)):
        substitute(template, VALUES)


def test_unknown_variable_error_lists_the_valid_ones() -> None:
    with pytest.raises(TemplateError) as err:
        check_template("img:$KERNEL_VER", TEMPLATE_VARIABLES)
    assert all(f"${name}" in str(err.value) for name in TEMPLATE_VARIABLES)


def test_unavailable_variable_says_why() -> None:
    with pytest.raises(TemplateError, match="fewer than three"):
        substitute("$KERNEL_Z", {}, {"KERNEL_Z": "kernel '6.8' has fewer than three components"})


def test_referenced_variables_include_nested_ones() -> None:
    assert referenced_variables("$A ${B:-${C}} $$D") == ["A", "B", "C"]


def test_deep_nesting_is_refused_not_a_crash() -> None:
    with pytest.raises(TemplateError, match="nest"):
        substitute("${MOD_NAME:-" * 50 + "}" * 50, VALUES)


_names = st.sampled_from(TEMPLATE_VARIABLES)
_literals = st.text(st.characters(blacklist_characters="$"), max_size=8)
_kernels = st.text(max_size=40)


@given(st.text(max_size=200))
def test_any_text_substitutes_or_raises_template_error(text: str) -> None:
    values = template_values("6.8.0-45", name="m", namespace="n", for_tag=True)
    with contextlib.suppress(TemplateError):
        substitute(text, values.values, values.unavailable)


@given(st.lists(st.tuples(_literals, _names, st.booleans()), max_size=6), _kernels)
def test_every_reference_is_replaced(parts: list[tuple[str, str, bool]], kernel: str) -> None:
    values = template_values(kernel, name="mod", namespace="ns", for_tag=True)
    # A literal that follows a bare $NAME must not extend the name.
    template = "".join(
        lit + (f"${{{name}}}" if braced else f"${name}") + "." for lit, name, braced in parts
    )
    if any(name in values.unavailable for _, name, _ in parts):
        with pytest.raises(TemplateError):
            substitute(template, values.values, values.unavailable)
        return
    result = substitute(template, values.values, values.unavailable)
    assert "$" not in result
    assert result == "".join(lit + values.values[name] + "." for lit, name, _ in parts)
