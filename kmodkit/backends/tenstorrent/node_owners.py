"""Which policy of a kind owns each node when several cover it.

Two firmware policies on one node would each flash their own version over the
other's, and two driver policies would run two builders; so a node belongs to
one policy of a kind: the oldest by creation time, then by name. The choice is
a function of the policies and the node labels only, so every pass and every
replica computes the same owner, and when the owner is deleted or stops
covering the node the next oldest takes it on its next pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from kmodkit.backends.tenstorrent.keys import tenstorrent_label
from kmodkit.backends.tenstorrent.selection import NodeLabelSelector, covers
from kmodkit.sdk import NodeView, Obj

CONFLICT_STATE = "Conflict"
CONFLICT_REASON = "NodeConflict"
FIRST_SIGHT_REASONS = frozenset({CONFLICT_REASON})
"""Reasons announced by an Event also on a node the policy lists for the first time: a node
already owned by another policy at a policy's first pass never changes to the conflict."""


@dataclass(frozen=True)
class Claim:
    """A policy's claim on nodes: its name, creation time and selector."""

    name: str
    created: str
    """``metadata.creationTimestamp`` (RFC 3339 in UTC, so it sorts as a string)."""
    selector: NodeLabelSelector


def claims(
    policies: Sequence[Obj], selector_of: Callable[[Obj], NodeLabelSelector | None]
) -> list[Claim]:
    """The claims of the policies whose spec gives a selector, oldest first."""
    found = []
    for body in policies:
        selector = selector_of(body)
        if selector is None:
            continue
        meta = body.get("metadata") or {}
        found.append(
            Claim(str(meta.get("name", "")), str(meta.get("creationTimestamp") or ""), selector)
        )
    return sorted(found, key=lambda c: (c.created, c.name))


def owners(
    ordered: Sequence[Claim], nodes: Sequence[NodeView], require_pci: bool
) -> Mapping[str, str]:
    """Each covered node's owner: the first claim (oldest, then name) that covers it."""
    found: dict[str, str] = {}
    for node in nodes:
        for claim in ordered:
            if covers(claim.selector, node.labels, require_pci):
                found[node.name] = claim.name
                break
    return found


def conflict_message(winner: str, kind: str) -> str:
    return (
        f"the node is also covered by the older {kind} {winner}, which owns it; narrow one "
        f"policy's node selector, or delete {winner} to hand the node to this policy"
    )


def labels_read(
    policies: Iterable[Obj],
    selector_of: Callable[[Obj], NodeLabelSelector | None],
    more: Iterable[str] = (),
) -> Callable[[str], bool]:
    """The node labels a policy's passes read: Tenstorrent's own, every key a policy of its
    kind selects by (who owns a node turns on all of them), and ``more``."""
    named = set(more)
    for body in policies:
        if (selector := selector_of(body)) is not None:
            named |= selector.keys()
    return lambda key: key in named or tenstorrent_label(key)
