"""A backend's watched objects in its plan tests, as the runtime's caches hand them over."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kmodkit.core.runtime.resource_controller import watched_view
from kmodkit.sdk import Backend, Obj


def as_cached(backend: Backend, watched: Mapping[str, Sequence[Obj]]) -> dict[str, list[Obj]]:
    """Each object cut to the fields its ``Watch`` names and kept as the runtime keeps it, so
    that a plan test sees only what the plan sees in the operator (a field the plan reads
    but its Watch does not name reads as absent here too)."""
    watches = {w.name: w for r in backend.resources for w in r.watches}
    return {name: [watched_view(watches[name], o) for o in objs] for name, objs in watched.items()}
