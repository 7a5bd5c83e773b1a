"""Views of a Module's own objects (loader pods, build Jobs, ...), grouped by Module.

Fed by an informer whose projection makes ``(group, view)`` per object, the
group being the Module the object belongs to ((namespace, name), from its
labels); a change reports which groups it touched, so only their reconcile
loops are woken.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Generic, TypeVar

from kmodkit.core.runtime.informer_cache import Change, Key

G = TypeVar("G", bound=Hashable)
V = TypeVar("V")


class OwnedIndex(Generic[G, V]):
    def __init__(self) -> None:
        self._groups: dict[G, dict[Key, V]] = {}

    def get(self, group: G) -> list[V]:
        return list(self._groups.get(group, {}).values())

    def apply(self, changes: Sequence[Change[tuple[G, V]]]) -> set[G]:
        """The groups whose views changed.

        A relist's difference is applied to a copy that then replaces the index,
        so a pass reading it from its thread sees one listing or the other.
        """
        whole = len(changes) > 1
        groups = {g: dict(m) for g, m in self._groups.items()} if whole else self._groups
        touched: set[G] = set()
        for change in changes:
            if change.old is not None:
                group = change.old[0]
                members = groups.get(group, {})
                members.pop(change.key, None)
                if not members:
                    groups.pop(group, None)
                touched.add(group)
            if change.new is not None:
                group, view = change.new
                groups.setdefault(group, {})[change.key] = view
                touched.add(group)
        self._groups = groups
        return touched

    def clear(self) -> None:
        self._groups = {}
