"""Which nodes' changes can change a Module's plan.

Those of the nodes its selector picks (before the change or after it), of the nodes
carrying one of its labels (loaded, version, device plugin) and of the nodes its pods
are on. A label, taint or kernel change on any other node cannot: the plan neither
reads nor writes such a node. So it wakes no pass over the Module, and a fleet of many
Modules, or one whose other nodes another controller keeps relabelling, costs each
Module its own nodes' changes only.

A backend resource says which node labels its objects read (``label_interest``): a change
that moves only other labels of a node wakes none of its passes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import fields
from typing import Any

from kmodkit.core import labels
from kmodkit.core.nodes import NodeView, selector_matches

NOT_LABELS = tuple(f.name for f in fields(NodeView) if f.name != "labels")
OWN_KEYS = (labels.READY, labels.VERSION_READY, labels.MODULE_VERSION, labels.DEVICE_PLUGIN_READY)

Moved = Sequence[tuple[NodeView | None, NodeView | None]]
"""Nodes' changes: each node's view before and after (None where it is absent)."""
Interest = Callable[[Moved], bool]
"""Whether any of the nodes' changes can change a reconcile loop's plan."""


def module_interest(
    namespace: str, name: str, selector: Callable[[], Any], hosts: Callable[[], Iterable[str]]
) -> Interest:
    """Whether any of the changes concerns the Module; ``selector`` reads its
    ``spec.selector`` as it is now, ``hosts`` the nodes its pods are on."""
    try:
        own = tuple(key.key(namespace, name) for key in OWN_KEYS)
    except labels.LabelKeyError:
        return lambda _moved: True  # its passes must run, to report the name

    def concerns(moved: Moved) -> bool:
        chosen = selector()
        if not isinstance(chosen, Mapping):
            return True  # not a selector the plan can use: its pass says so
        hosting: set[str] | None = None  # read once a batch, and only when needed
        for view in (v for pair in moved for v in pair if v is not None):
            if selector_matches(chosen, view.labels) or any(k in view.labels for k in own):
                return True
            hosting = set(hosts()) if hosting is None else hosting
            if view.name in hosting:
                return True
        return False

    return concerns


def moved_labels(old: NodeView | None, new: NodeView | None) -> set[str] | None:
    """The label keys whose values differ between the two views of a node; None when more
    than its labels moved (it came or went, its kernel, readiness, taints, ...)."""
    if old is None or new is None or any(getattr(old, f) != getattr(new, f) for f in NOT_LABELS):
        return None
    keys = old.labels.keys() | new.labels.keys()
    return {k for k in keys if old.labels.get(k) != new.labels.get(k)}


def label_interest(reads: Callable[[], Callable[[str], bool]]) -> Interest:
    """Whether any change moved more of a node than its labels, or a label ``reads()`` (asked
    once a batch, and only when needed: the keys a backend resource's object reads now) names."""

    def concerns(moved: Moved) -> bool:
        read: Callable[[str], bool] | None = None
        for old, new in moved:
            changed = moved_labels(old, new)
            if changed is None:
                return True
            read = reads() if read is None else read
            if any(read(k) for k in changed):
                return True
        return False

    return concerns
