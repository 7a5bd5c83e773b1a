"""Spec fields a newer release's CRD carries that this operator does not know.

Helm never changes the CRDs on a rollback, so after an operator downgrade the
apiserver keeps admitting and storing fields the running operator's models
forbid. A policy with such fields is served with them ignored and named in its
status, instead of being frozen as InvalidSpec with a rollout half done. The
apiserver prunes fields that no CRD declares, so only a newer CRD brings them
here; offline (``kmodkit validate``) they are still errors, since there they are
typos.
"""

from __future__ import annotations

import types
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from kmodkit.backends.tenstorrent.status_common import condition

M = TypeVar("M", bound=BaseModel)

CONDITION = "FieldsIgnored"
MAX_NAMED = 10
"""Ignored fields named in the condition's message; the rest are counted."""


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    """The models an annotation holds (``X``, ``X | None``, ``list[X]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    elif get_origin(annotation) in (Union, types.UnionType, list):
        for arg in get_args(annotation):
            yield from _models_in(arg)


def _known(model: type[BaseModel], raw: Mapping[str, Any], path: str) -> tuple[Any, list[str]]:
    fields: dict[str, FieldInfo] = {}
    for name, field in model.model_fields.items():
        fields[name] = field
        if field.alias:
            fields[field.alias] = field
    kept: dict[str, Any] = {}
    unknown: list[str] = []
    for key, value in raw.items():
        info = fields.get(key)
        if info is None:
            unknown.append(f"{path}.{key}")
            continue
        nested = next(_models_in(info.annotation), None)
        if nested is not None and isinstance(value, Mapping):
            value, more = _known(nested, value, f"{path}.{key}")
            unknown += more
        elif nested is not None and isinstance(value, list):
            items = []
            for i, item in enumerate(value):
                if isinstance(item, Mapping):
                    item, more = _known(nested, item, f"{path}.{key}[{i}]")
                    unknown += more
                items.append(item)
            value = items
        kept[key] = value
    return kept, unknown


def parse_spec(model: type[M], raw: Mapping[str, Any]) -> tuple[M, list[str]]:
    """The spec with the fields ``model`` does not know left out, and their paths
    (``spec.foo``); a ValidationError for anything else wrong."""
    known, unknown = _known(model, raw, "spec")
    return model.model_validate(known), unknown


def ignored_condition(
    unknown: list[str], previous: Mapping[str, Any], generation: int | None, now: datetime
) -> list[dict[str, Any]]:
    """The FieldsIgnored condition while the spec has fields this operator ignores."""
    if not unknown:
        return []
    named = ", ".join(unknown[:MAX_NAMED])
    if len(unknown) > MAX_NAMED:
        named += f" and {len(unknown) - MAX_NAMED} more"
    message = (
        f"{named}: not known to this operator version, ignored (no data is "
        "lost; upgrade the operator to have them enforced)"
    )
    return [condition(previous, CONDITION, "True", "UnknownFields", message, generation, now)]
