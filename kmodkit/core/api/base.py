"""The base every kmodkit API model shares, and the bounded string types.

Kubernetes objects are camelCase JSON; Python code reads better in snake_case.
The alias generator bridges the two, and ``populate_by_name`` lets tests and
backends build models with Python names. Unknown fields are refused rather than
ignored, because a misspelt field that is silently dropped (as the apiserver's
pruning does) is the most common way a driver rollout ends up doing nothing.

Every string and list carries an upper bound: the apiserver estimates the cost
of each CEL rule from these bounds and refuses a CRD whose rules could run
unboundedly, so the bounds are part of the schema contract, not decoration.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

# A Kubernetes object name (DNS-1123 subdomain).
ObjectName = Annotated[str, Field(max_length=253)]
# Kernel module names, in-tree module names, node names: short identifiers.
ShortName = Annotated[str, Field(max_length=256)]
# Image references, including template variables before they are substituted.
ImageRef = Annotated[str, Field(max_length=512)]
# Node selectors: label values are at most 63 characters.
LabelSelector = Annotated[dict[str, Annotated[str, Field(max_length=63)]], Field(max_length=64)]
# Free text a user writes: regexps, modprobe arguments, build-arg values.
Text = Annotated[str, Field(max_length=4096)]
# An absolute path in an image: plain path characters only, so no tool ever sees a
# space, a quote or a shell character in one (paths are arguments, never parsed).
AbsolutePath = Annotated[str, Field(max_length=4096, pattern=r"^/[A-Za-z0-9._+@=/-]*$")]


def cel(
    rule: str, message: str, *, subject: str | None = None, field_path: str | None = None
) -> dict[str, str]:
    """One ``x-kubernetes-validations`` entry.

    The message starts with ``subject``, the field it is about, if given, so
    it reads well wherever it is shown. ``field_path`` points the apiserver's error at
    the offending child field, so ``kubectl apply`` reports
    ``...kernelMappings[2].literal`` rather than the enclosing object.
    """
    entry = {"rule": rule, "message": f"{subject}: {message}" if subject else message}
    if field_path is not None:
        entry["fieldPath"] = field_path
    return entry


def cel_rules(*rules: dict[str, str]) -> dict[str, Any]:
    """The ``json_schema_extra`` that attaches CEL rules to a model or field."""
    return {"x-kubernetes-validations": list(rules)}


class KubeModel(BaseModel):
    """Base for the API models: camelCase on the wire, no unknown fields."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
        extra="forbid",
    )

    def to_wire(self) -> dict[str, Any]:
        """The object as the apiserver expects it: camelCase, unset fields left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")
