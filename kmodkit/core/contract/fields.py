"""The fields of an object a plan reads: dotted paths, and the object cut down to them.

A path names a field from the object's top (``spec.nodeName``); a segment ending in ``[]``
is a list whose every element keeps the rest of the path (``spec.containers[].env``). What
is kept has the object's shape, so code that reads the whole object reads the kept one the
same way. Keys with a dot of their own (annotation and label keys) cannot be named: keep
their map whole (``metadata.annotations``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

Tree = dict[str, "Tree | None"]
"""Each kept key and what to keep under it; None: all of it."""

EACH = "[]"


def field_tree(paths: Iterable[str]) -> Tree:
    """The paths as a tree; a path that keeps a field whole wins over a deeper one."""
    tree: Tree = {}
    for path in paths:
        segments = path.split(".")
        if not all(s.removesuffix(EACH) for s in segments):
            raise ValueError(f"field path {path!r} has an empty segment")
        node = tree
        for i, segment in enumerate(segments):
            if i == len(segments) - 1:
                node[segment] = None
                break
            below = node.setdefault(segment, {})
            if below is None:
                break  # kept whole already
            node = below
    return tree


def cut(obj: Mapping[str, Any], tree: Tree) -> dict[str, Any]:
    """``obj`` with only the fields of ``tree``; a field of another shape than the path
    says (a list where a map is named, a scalar) is kept as it is."""
    kept: dict[str, Any] = {}
    for key, below in tree.items():
        each = key.endswith(EACH)
        name = key.removesuffix(EACH)
        if name not in obj:
            continue
        value = obj[name]
        if below is None:
            kept[name] = value
        elif each and isinstance(value, list):
            kept[name] = [cut(v, below) if isinstance(v, Mapping) else v for v in value]
        elif not each and isinstance(value, Mapping):
            kept[name] = cut(value, below)
        else:
            kept[name] = value
    return kept
