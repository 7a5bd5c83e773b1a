"""What a backend supplies to roll its change across nodes.

Nodes and pods are passed as the raw JSON mappings the apiserver returns (what
kopf hands to handlers), so a backend reads the fields it needs without a
client-library model in between.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

Obj = Mapping[str, Any]
"""A Kubernetes object as the API returns it (plain JSON)."""


@dataclass(frozen=True)
class Validated:
    """The swapped node is healthy.

    ``labels`` and ``annotations`` record on the node what it runs now: the rollout writes
    them with the node's move out of ``validating``, in the same patch, guarded like every
    state write. Written by the hook instead, they would land beside the move and make it
    stale (a refused write and one more pass per node); together, a crash never keeps one
    without the other."""

    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    annotations: Mapping[str, str] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class Pending:
    """Not healthy yet; ask again on the next pass (until the validation timeout)."""

    message: str = ""


@dataclass(frozen=True)
class Failed:
    """The swap failed; the node is marked failed with this reason (a CamelCase code)."""

    reason: str
    message: str = ""


Validation = Validated | Pending | Failed


class RolloutHooks(Protocol):
    """The backend's side of a rollout.

    ``needs_update`` and ``is_device_consumer`` are called for many objects every
    pass: answer from the object (and what the backend already holds), never with
    an API call. ``swap`` and ``validate`` are called only for the few nodes in
    those states and may do I/O.
    """

    def needs_update(self, node: Obj) -> bool:
        """Whether the node does not yet run the target."""
        ...

    def swap(self, node: Obj) -> None:
        """Start the disruptive action on a drained node.

        Must be idempotent: after an operator crash it is called again for a node
        whose action may already have started or finished (create a Job with a
        deterministic name, delete a driver pod only while it is stale, ...).
        Raising leaves the node in ``swapping`` to be retried on the next pass, and
        so does changing the Node object itself (the rollout's own write is guarded
        by the resourceVersion of the marker write it made just before the call),
        after which the repeated call finds nothing left to do. It is called only
        after that marker write, guarded by the resourceVersion the pass observed,
        has landed: never from a stale view of the node.
        """
        ...

    def validate(self, node: Obj) -> Validation:
        """Whether the swapped node is healthy."""
        ...

    def is_device_consumer(self, pod: Obj) -> bool:
        """Whether the pod holds the device and must leave before the swap."""
        ...
