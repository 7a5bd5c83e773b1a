"""Status pieces both policies share: per-node rows, their order and bound, conditions.

A plan builds one ``Row`` per covered node from what it observes; the rows
become ``status.nodes`` with transition times carried over from the previous
status while a node's state is unchanged, so a converged policy writes the
same status again and the runtime skips the write.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kmodkit.backends.tenstorrent.api_common import MAX_STATUS_NODES
from kmodkit.sdk import NodeEvent, RolloutStatus, State

IN_PROGRESS = frozenset({"Cordoning", "Draining", "Upgrading", "Flashing", "Uncordoning"})
_RANK = {"Failed": 0, **dict.fromkeys(IN_PROGRESS, 1), "Pending": 2, "Conflict": 2}
"""Order of ``status.nodes``; a node another policy owns is listed before done ones, so an
admin sees it."""


@dataclass(frozen=True)
class Row:
    name: str
    state: str
    reason: str = ""
    message: str = ""
    current_version: str = ""
    extra: Mapping[str, str] = field(default_factory=dict)
    """More wire fields of the entry (``lastFlashJob``)."""
    rollout_state: State | None = None
    """The node's rollout state this row was derived from, if any."""


def stamp(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def node_entries(
    rows: Sequence[Row], previous_status: Mapping[str, Any], now: datetime
) -> tuple[list[dict[str, Any]], int]:
    """``status.nodes`` (failed, in progress, pending, then the rest; at most 100) and how
    many rows did not fit."""
    before = {str(e.get("name")): e for e in previous_status.get("nodes") or []}
    ordered = sorted(rows, key=lambda r: (_RANK.get(r.state, 3), r.name))
    entries = []
    for row in ordered[:MAX_STATUS_NODES]:
        old = before.get(row.name) or {}
        since = old.get("lastTransitionTime") if old.get("state") == row.state else None
        entry: dict[str, Any] = {
            "name": row.name,
            "state": row.state,
            "reason": row.reason,
            "currentVersion": row.current_version,
            "message": row.message,
            "lastTransitionTime": since or stamp(now),
            **row.extra,
        }
        entries.append(entry)
    return entries, max(0, len(ordered) - MAX_STATUS_NODES)


def transition_events(
    rows: Sequence[Row],
    previous_status: Mapping[str, Any],
    observed: Mapping[str, bool],
    announce_new: frozenset[str] = frozenset(),
) -> list[NodeEvent]:
    """An Event for each listed node whose (state, reason) changed to one of the ``observed``
    reasons (those the plan sees on the node or its pods, each with whether it is a
    warning). The rollout posts its own moves.

    Only nodes the previous status listed are compared, so the unlisted rest of a large
    fleet (done nodes beyond the first 100) cannot look new on every pass. The exception is
    a reason in ``announce_new`` on a node the previous status did not list although it
    left none out (the policy's first pass, or a node it newly covers): that node is new,
    and an admin must hear of it even if it never passes through another state.
    """
    before = {str(e.get("name")): e for e in previous_status.get("nodes") or []}
    complete = not previous_status.get("nodesOmitted")
    events = []
    for row in rows:
        old = before.get(row.name)
        if row.reason not in observed:
            continue
        if old is None and not (complete and row.reason in announce_new):
            continue
        old = old or {}
        if (old.get("state"), old.get("reason")) == (row.state, row.reason):
            continue
        message = f"{row.state}: {row.message}" if row.message else row.state
        events.append(NodeEvent(row.name, row.reason, message, warning=observed[row.reason]))
    return events


def condition(
    previous_status: Mapping[str, Any],
    kind: str,
    status: str,
    reason: str,
    message: str,
    generation: int | None,
    now: datetime,
) -> dict[str, Any]:
    """One condition; its transition time moves only when its status does."""
    old: Mapping[str, Any] = next(
        (c for c in previous_status.get("conditions") or [] if c.get("type") == kind), {}
    )
    since = old.get("lastTransitionTime") if old.get("status") == status else None
    cond: dict[str, Any] = {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since or stamp(now),
    }
    if generation is not None:
        cond["observedGeneration"] = generation
    return cond


def count(rows: Iterable[Row], *states: str) -> int:
    return sum(1 for r in rows if r.state in states)


def paused_ready(done: int, total: int) -> tuple[str, str, str]:
    """Ready while paused with nodes still to do (a failure is reported instead)."""
    return ("False", "Paused", f"{done}/{total} nodes up to date; spec.paused is true")


def paused_progressing(in_flight: int) -> tuple[str, str, str]:
    """Progressing while paused: nodes already in flight still finish."""
    if in_flight:
        return (
            "True",
            "Paused",
            f"spec.paused is true; {in_flight} node(s) in flight finish, no further node starts",
        )
    return ("False", "Paused", "spec.paused is true; no further node starts")


def overlay_rollout(
    status: Mapping[str, Any], result: RolloutStatus, state_of: Mapping[State, str]
) -> dict[str, Any]:
    """The plan's status with the reasons and messages of this rollout pass.

    The plan reads the nodes' rollout states from their labels but not the
    reasons the rollout keeps in annotations; the pass reports those. A node
    whose state moved during the pass keeps the plan's entry until the next
    reconcile, which the node's change triggers.
    """
    detail = {n.name: n for n in result.nodes}
    nodes = []
    for entry in status.get("nodes") or []:
        info = detail.get(entry["name"])
        if info is not None and info.reason:
            try:
                mapped = state_of.get(State(info.state))
            except ValueError:
                mapped = None
            if mapped == entry["state"]:
                entry = {**entry, "reason": info.reason, "message": info.message}
        nodes.append(entry)
    return {**status, "nodes": nodes}
