"""A backend's watched objects in its plan tests, as the runtime's caches hand them over."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from kmodkit.core.runtime.resource_controller import watched_view
from kmodkit.sdk import Backend, Obj


def as_cached(backend: Backend, watched: Mapping[str, Sequence[Obj]]) -> dict[str, list[Obj]]:
    """Each object cut to the fields its ``Watch`` names and kept as the runtime keeps it, so
    that a plan test sees only what the plan sees in the operator (a field the plan reads
    but its Watch does not name reads as absent here too); an object its field selector
    leaves out is not there at all, as the apiserver never sends it."""
    watches = {w.name: w for r in backend.resources for w in r.watches}
    return {
        name: [
            watched_view(watches[name], o)
            for o in objs
            if selected(watches[name].field_selector, o)
        ]
        for name, objs in watched.items()
    }


# Selector fields the apiserver computes rather than reads at their own path: the
# object's field and what an absent one reads as.
_COMPUTED = {"status.successful": ("status.succeeded", "0")}  # a Job's


def selected(field_selector: str, obj: Obj) -> bool:
    """Whether ``obj`` matches a field selector as the apiserver reads one: terms of
    ``path=value``, ``path==value`` or ``path!=value``, comma-separated, all of them."""
    for term in filter(None, field_selector.split(",")):
        match = re.fullmatch(r"([^!=]+)(!=|==|=)(.*)", term)
        assert match is not None, f"not a field selector term: {term!r}"
        field, op, value = match.groups()
        path, absent = _COMPUTED.get(field, (field, ""))
        found: Any = obj
        for part in path.split("."):
            found = found.get(part) if isinstance(found, Mapping) else None
        if ((absent if found is None else str(found)) == value) == (op == "!="):
            return False
    return True
