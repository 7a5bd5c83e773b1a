"""The pure half of an informer: what a list or a watch event does to the cache.

The cache holds, per object (keyed by namespace and name), its uid, its
resourceVersion and a slim view made by a projection; never the object itself.
It also holds the resourceVersion a watch resumes from: the list's, then each
event's or bookmark's.

resourceVersions are opaque: they are only stored, sent back to the apiserver
and compared for equality (an event that repeats what the cache holds changes
nothing). Ordering comes from the list/watch protocol itself: a watch started
at a list's resourceVersion delivers every later change once, in order, so no
event needs an older/newer judgement here. Deletes missed while a watch was
down cannot be replayed; a relist replaces the whole cache, and the difference
to the old one is reported as changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from kmodkit.core.interned import interned_tree

V = TypeVar("V")
Key = tuple[str, str]
"""(namespace, name); namespace is "" for cluster-scoped kinds."""

ADDED, MODIFIED, DELETED, BOOKMARK = "ADDED", "MODIFIED", "DELETED", "BOOKMARK"


@dataclass(frozen=True)
class Entry(Generic[V]):
    uid: str
    resource_version: str
    view: V


@dataclass(frozen=True)
class Change(Generic[V]):
    """A view that appeared (old None), went (new None) or changed."""

    key: Key
    old: V | None
    new: V | None


def key_of(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def meta_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


class InformerCache(Generic[V]):
    """Views of one kind's objects, as of ``resource_version``.

    ``entries`` is replaced by a new dict on every list, never emptied in place,
    so a reader holding it (a pass in another thread) sees one listing or the
    other, whole.
    """

    def __init__(self, view: Callable[[Mapping[str, Any]], V]) -> None:
        self._view = view
        self.entries: dict[Key, Entry[V]] = {}
        self.resource_version = ""

    def views(self) -> dict[Key, V]:
        return {k: e.view for k, e in self.entries.items()}

    def entry(self, obj: Mapping[str, Any]) -> Entry[V]:
        meta = meta_of(obj)
        return Entry(
            str(meta.get("uid") or ""), str(meta.get("resourceVersion") or ""), self._view(obj)
        )

    def replace(self, items: Iterable[Mapping[str, Any]], resource_version: str) -> list[Change[V]]:
        """A full list landed (at ``resource_version``): it becomes the cache."""
        return self.replace_entries(
            {key_of(obj): self.entry(obj) for obj in items}, resource_version
        )

    def replace_entries(self, fresh: dict[Key, Entry[V]], resource_version: str) -> list[Change[V]]:
        """``replace`` with the objects already projected (a paged list projects each
        page as it lands, so whole objects never pile up).

        Objects missing from it were deleted (perhaps while no watch ran): they
        are reported gone. Only views that differ are reported.
        """
        old = self.entries
        changes = [Change(k, e.view, None) for k, e in old.items() if k not in fresh]
        for k, e in fresh.items():
            before = old.get(k)
            if before is None or before.view != e.view:
                changes.append(Change(k, None if before is None else before.view, e.view))
        self.entries = fresh
        self.resource_version = resource_version
        return changes

    def apply(self, event_type: str, obj: Mapping[str, Any]) -> Change[V] | None:
        """One watch event; the change it makes to a view, if any.

        A DELETED for another uid than the one cached (an older incarnation of a
        name re-created since) removes nothing.
        """
        rv = str(meta_of(obj).get("resourceVersion") or "")
        if rv:
            self.resource_version = rv
        if event_type == BOOKMARK:
            return None
        key = key_of(obj)
        before = self.entries.get(key)
        if event_type == DELETED:
            uid = str(meta_of(obj).get("uid") or "")
            if before is None or (uid and before.uid and uid != before.uid):
                return None
            del self.entries[key]
            return Change(key, before.view, None)
        if event_type not in (ADDED, MODIFIED):
            raise ValueError(f"unknown watch event type {event_type!r}")
        if before is not None and rv and before.resource_version == rv:
            return None  # a repeat of what the cache holds
        entry = self.entry(obj)
        self.entries[key] = entry
        if before is not None and before.view == entry.view:
            return None
        return Change(key, None if before is None else before.view, entry.view)


def kept_whole(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The object as listed, less ``metadata.managedFields`` (often its largest part, and
    read by no plan), its strings interned: a DaemonSet's pods, one per node, differ in
    little but their names (a pod's dicts about halve)."""
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    kept: dict[str, Any] = interned_tree({**obj, "metadata": meta})  # a new dict already
    return kept
