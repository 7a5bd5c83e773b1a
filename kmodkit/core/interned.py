"""Strings a fleet repeats, kept once.

The caches hold one decoded answer per node and per pod, each with its own copy of every
string in it: the keys of every map (a pod has a hundred), label keys and values (NFD
alone gives a node dozens), images, hashes, conditions. Interned, each distinct string is
kept once for the whole fleet; only what is unique to an object (its name, uid,
timestamps) is kept per object.
"""

from __future__ import annotations

from collections.abc import Mapping
from sys import intern
from typing import Any


def interned(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """``mapping`` with its keys and string values interned (one level)."""
    return {intern(k): intern(v) if isinstance(v, str) else v for k, v in mapping.items()}


def interned_tree(value: Any) -> Any:
    """``value`` (decoded JSON) rebuilt with every key and string in it interned."""
    if isinstance(value, str):
        return intern(value)
    if isinstance(value, Mapping):
        return {intern(k): interned_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [interned_tree(v) for v in value]
    return value
