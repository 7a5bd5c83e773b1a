"""The fields of an object a plan reads: dotted paths, and the object cut down to them.

A path names a field from the object's top (``spec.nodeName``). A segment ending in ``[]``
is a list whose every element keeps the rest of the path (``spec.containers[].env``); one
ending in ``[key=value]`` keeps only the elements whose ``key`` is ``value``
(``status.conditions[type=Ready]``, ``spec.containers[name=agent].env``). What is kept has
the object's shape, so code that reads the whole object reads the kept one the same way
(a reader that looks an element up by that key finds it; one that counts elements does
not count the others). Keys with a dot of their own (annotation and label keys) cannot be
named: keep their map whole (``metadata.annotations``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple


class Segment(NamedTuple):
    name: str
    each: bool = False
    """A list: its elements (those ``key`` picks, if any) keep the rest of the path."""
    key: str | None = None
    value: str = ""


Tree = dict[Segment, "Tree | None"]
"""Each kept segment and what to keep under it; None: all of it."""

_SEGMENT = re.compile(
    r"(?P<name>[^.\[\]=]+)(?P<list>\[(?:(?P<key>[^.\[\]=]+)=(?P<value>[^.\[\]=]*))?\])?"
)


def _segment(path: str, text: str) -> Segment:
    parts = _SEGMENT.fullmatch(text)
    if parts is None:
        raise ValueError(
            f"field path {path!r}: segment {text!r} is not a name, name[] or name[key=value]"
        )
    return Segment(parts["name"], parts["list"] is not None, parts["key"], parts["value"] or "")


def field_tree(paths: Iterable[str]) -> Tree:
    """The paths as a tree; a path that keeps a field whole wins over a deeper one."""
    tree: Tree = {}
    for path in paths:
        segments = [_segment(path, text) for text in path.split(".")]
        node = tree
        for i, segment in enumerate(segments):
            if any(s.name == segment.name and s != segment for s in node):
                raise ValueError(f"field path {path!r}: {segment.name} is named another way too")
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
    for (name, each, key, wanted), below in tree.items():
        if name not in obj:
            continue
        value = obj[name]
        if each and isinstance(value, list):
            kept[name] = [
                cut(v, below) if below is not None and isinstance(v, Mapping) else v
                for v in value
                if key is None or (isinstance(v, Mapping) and v.get(key) == wanted)
            ]
        elif below is not None and not each and isinstance(value, Mapping):
            kept[name] = cut(value, below)
        else:
            kept[name] = value
    return kept
