"""The per-node rollout states, as written in the node's state label.

A node with no state label is idle: the rollout has never needed to touch it,
or an admin cleared the label to ask for a fresh start.
"""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    REQUIRED = "required"
    """Needs the change; waits for a slot in the budget."""
    CORDONING = "cordoning"
    """Holds a slot; the next pass records the cordon owner and cordons."""
    GATING = "gating"
    """Cordoned; deploy-gate labels are being set so sibling DaemonSets leave."""
    WAITING_FOR_JOBS = "waiting-for-jobs"
    """Waiting for selected pods to finish on their own (timeout means proceed)."""
    EVICTING = "evicting"
    """Drain pass 1: evicting device consumers, waiting for every one to be gone."""
    DRAINING = "draining"
    """Drain pass 2: kubectl-drain semantics over the selected pods."""
    SWAPPING = "swapping"
    """The backend's disruptive action (reload a driver, flash firmware) is started."""
    VALIDATING = "validating"
    """Waiting for the backend to report the swapped node healthy."""
    UNCORDONING = "uncordoning"
    """Healthy; restoring gates and the cordon the rollout made."""
    DONE = "done"
    """Up to date; the rollout has finished here."""
    FAILED = "failed"
    """Stopped; the reason annotation says why. Kept cordoned until an admin acts."""


IN_FLIGHT = frozenset(
    {
        State.CORDONING,
        State.GATING,
        State.WAITING_FOR_JOBS,
        State.EVICTING,
        State.DRAINING,
        State.SWAPPING,
        State.VALIDATING,
        State.UNCORDONING,
    }
)
"""States that hold a maxParallel slot."""

BEFORE_SWAP = frozenset(
    {State.CORDONING, State.GATING, State.WAITING_FOR_JOBS, State.EVICTING, State.DRAINING}
)
"""In-flight states from which a node may still back out without being changed."""

NEEDS_PODS = frozenset({State.WAITING_FOR_JOBS, State.EVICTING, State.DRAINING})
"""States whose decision needs the pods on the node (listed only for these nodes)."""


def parse_state(value: str | None) -> State | None:
    """The state a label value names; None (idle) for a missing or unknown value."""
    if value is None:
        return None
    try:
        return State(value)
    except ValueError:
        return None
