"""The status of one rollout pass, shaped for a backend's custom-resource status.

Per-node detail is bounded (failed nodes first, then nodes in flight, then nodes
waiting), so a 10,000-node fleet never produces an oversized status object; the
counts cover every node. Counts carry no node names, so they map straight onto
metrics without per-node labels.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from pydantic import Field

from kmodkit.core.api.base import KubeModel
from kmodkit.core.rollout.observed import NodeView
from kmodkit.core.rollout.plan import Plan, Step
from kmodkit.core.rollout.release import Action, Departure
from kmodkit.core.rollout.states import IN_FLIGHT, State

MAX_NODES = 100
MAX_ERRORS = 20
IDLE = "idle"


class NodeRolloutStatus(KubeModel):
    name: str
    state: str
    """The node's state label value, or ``idle``."""
    reason: str = ""
    message: str = ""
    attempt: int = 0
    skipped: bool = False


class RolloutSummary(KubeModel):
    targeted: int = 0
    up_to_date: int = 0
    """Done, or idle and not needing the change."""
    pending: int = 0
    """Needing the change, not started yet."""
    in_progress: int = 0
    failed: int = 0
    skipped: int = 0


class RolloutStatus(KubeModel):
    summary: RolloutSummary = Field(default_factory=RolloutSummary)
    nodes_by_state: dict[str, int] = Field(default_factory=dict)
    """Gauge: nodes in each state after this pass (``idle`` for no state label)."""
    transitions: dict[str, int] = Field(default_factory=dict)
    """Counter increments: transitions into each state made by this pass."""
    evictions: int = 0
    """Eviction requests sent this pass."""
    evictions_blocked: int = 0
    """Of those, refused because a PodDisruptionBudget allowed no disruption."""
    writes: int = 0
    """API writes made this pass (node patches, evictions, events); 0 once converged."""
    last_transition: float | None = None
    """Unix seconds of the latest state change recorded on any targeted node, as the pass
    observed them (this pass's own steps show in the next one); None before any."""
    halted: bool = False
    paused: bool = False
    complete: bool = False
    """Every targeted, non-skipped node is up to date."""
    nodes: list[NodeRolloutStatus] = Field(default_factory=list)
    nodes_omitted: int = 0
    """Nodes with detail to report that did not fit in ``nodes``."""
    errors: list[str] = Field(default_factory=list)
    """API or hook errors of this pass (bounded); the pass retries them next time."""
    released: int = 0
    """Counter increment: nodes no longer targeted that this pass took the rollout off."""
    untargeted: list[NodeRolloutStatus] = Field(default_factory=list)
    """Nodes no longer targeted that this pass released, failed (they left while their
    change was under way) or keeps cordoned because the rollout failed there (bounded;
    the held ones first). None of them counts in ``summary``."""


def _waiting_reason(plan: Plan) -> tuple[str, str]:
    if plan.paused:
        return "Paused", "the policy is paused; no new node starts"
    if plan.halted:
        return "RolloutHalted", "a node failed and haltOnFailure is set; no new node starts"
    return "WaitingForSlot", "waiting for room in maxParallel / maxUnavailable"


def _rank(state: str) -> int:
    if state == State.FAILED:
        return 0
    if state in IN_FLIGHT:
        return 1
    if state == State.REQUIRED:
        return 2
    return 3


def summarize(
    views: Sequence[NodeView],
    plan: Plan,
    applied: Iterable[Step],
    *,
    evictions: int = 0,
    evictions_blocked: int = 0,
    writes: int = 0,
    errors: Sequence[str] = (),
    departed: Sequence[Departure] = (),
) -> RolloutStatus:
    """The status after the steps in ``applied`` (the ones the apiserver accepted)."""
    done: Mapping[str, Step] = {s.node: s for s in applied if s.moves}
    by_state: Counter[str] = Counter()
    summary = RolloutSummary(targeted=len(views))
    details = []
    wait_reason, wait_message = _waiting_reason(plan)
    for view in views:
        step = done.get(view.name)
        state = step.after if step is not None else view.state
        label = state.value if state is not None else IDLE
        by_state[label] += 1
        if view.skipped:
            summary.skipped += 1
        elif state in (State.DONE, None) and not view.needs_update:
            summary.up_to_date += 1
        elif state is State.FAILED:
            summary.failed += 1
        elif state in IN_FLIGHT:
            summary.in_progress += 1
        else:
            summary.pending += 1
        if step is not None:
            reason, message = step.reason, step.message
        else:
            reason, message = view.record.reason, view.record.message
        if view.skipped:
            reason, message = "Skipped", "the node carries the skip label; the rollout leaves it be"
        elif state is State.REQUIRED and step is None:
            # What holds the node itself outlasts a pause or a halt, so it is said first.
            hold = plan.held.get(view.name)
            reason, message = (hold.reason, hold.message) if hold else (wait_reason, wait_message)
        if state in (None, State.DONE) and not reason:
            continue
        details.append(
            NodeRolloutStatus(
                name=view.name,
                state=label,
                reason=reason,
                message=message,
                attempt=view.record.attempt,
                skipped=view.skipped,
            )
        )
    details.sort(key=lambda d: (_rank(d.state), d.name))
    transitions = Counter((s.after.value if s.after is not None else IDLE) for s in done.values())
    # A released node goes idle, one that left during its change goes to failed.
    moved = {Action.RELEASE: IDLE, Action.FAIL: State.FAILED.value}
    transitions.update(moved[d.action] for d in departed if d.action in moved)
    untargeted = sorted(
        (
            NodeRolloutStatus(
                name=d.node,
                state=IDLE if d.action is Action.RELEASE else State.FAILED.value,
                reason=d.reason,
                message=d.message,
            )
            for d in departed
        ),
        key=lambda n: (n.state != State.FAILED.value, n.name),
    )
    return RolloutStatus(
        summary=summary,
        nodes_by_state=dict(sorted(by_state.items())),
        transitions=dict(sorted(transitions.items())),
        evictions=evictions,
        evictions_blocked=evictions_blocked,
        writes=writes,
        last_transition=max(
            (v.record.since for v in views if v.record.since is not None), default=None
        ),
        halted=plan.halted,
        paused=plan.paused,
        complete=summary.up_to_date == summary.targeted - summary.skipped,
        nodes=details[:MAX_NODES],
        nodes_omitted=max(0, len(details) - MAX_NODES),
        errors=list(errors)[:MAX_ERRORS],
        released=sum(1 for d in departed if d.action is Action.RELEASE),
        untargeted=untargeted[:MAX_NODES],
    )
