"""Which nodes' changes can change a Module's plan.

Those of the nodes its selector picks (before the change or after it), of the nodes
carrying one of its labels (loaded, version, device plugin) and of the nodes its pods
are on. A label, taint or kernel change on any other node cannot: the plan neither
reads nor writes such a node. So it wakes no pass over the Module, and a fleet of many
Modules, or one whose other nodes another controller keeps relabelling, costs each
Module its own nodes' changes only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from kmodkit.core import labels
from kmodkit.core.nodes import NodeView, selector_matches

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
