"""The pure planner: from what is observed now to one step per node.

Every pass rebuilds the whole picture from the cluster, so the planner holds no
memory: each node moves at most one state per pass, and each move is a single
merge patch of the node (state label, annotations and cordon together), so a
crash between passes never leaves a half-made transition. The swap alone is
preceded by a write, its marker, that must land before the backend's swap hook
is called (``Step.swap_marker``). A node is started only when the budgets have
room after counting every node already in flight or unavailable, so no
interleaving of passes can overrun them. A node that is down, or cordoned by
someone else, is not started at all (see ``hold_of``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kmodkit.core.contract.hooks import Failed, Pending, Validated
from kmodkit.core.contract.policy import UpgradePolicy
from kmodkit.core.rollout.keys import HOLDER_ANNOTATION, RolloutKeys
from kmodkit.core.rollout.observed import NodeView, PodView, encode_gates
from kmodkit.core.rollout.states import IN_FLIGHT, State

MAX_MESSAGE = 1024
MAX_NAMED_PODS = 10


@dataclass(frozen=True)
class NodePatch:
    """One merge patch of a node; None values remove the key."""

    labels: Mapping[str, str | None] = field(default_factory=dict)
    annotations: Mapping[str, str | None] = field(default_factory=dict)
    unschedulable: bool | None = None


@dataclass(frozen=True)
class Step:
    """What to do on one node this pass."""

    node: str
    before: State | None
    after: State | None
    reason: str = ""
    message: str = ""
    patch: NodePatch | None = None
    evict: tuple[PodView, ...] = ()
    swap_marker: NodePatch | None = None
    """For a swap step: written first, guarded by the observed resourceVersion. Only once it
    lands is the backend's swap hook called, and ``patch`` is then guarded by the
    resourceVersion that write returned: a pass planning from a stale view (a replica that
    lost leadership, a lagging cache) is refused before it swaps anything."""

    @property
    def moves(self) -> bool:
        return self.patch is not None

    @property
    def swap(self) -> bool:
        """Whether the step calls the backend's swap hook (between its two writes)."""
        return self.swap_marker is not None


@dataclass(frozen=True)
class Budget:
    max_parallel: int
    in_progress: int
    max_unavailable: int
    unavailable: int


@dataclass(frozen=True)
class Context:
    policy: UpgradePolicy
    keys: RolloutKeys
    target: str
    now: float
    paused: bool = False


@dataclass(frozen=True)
class Hold:
    """Why a node that needs the change is not started, whatever the budgets."""

    reason: str
    message: str


NOT_READY = Hold(
    "NodeNotReady",
    "the node is not Ready; the rollout starts it once it is Ready again "
    "(repair or remove the node, or give it the skip label to leave it out)",
)
EXTERNAL_CORDON = Hold(
    "ExternalCordon",
    "cordoned by someone else, not this rollout: left alone until it is uncordoned "
    "(or set upgradeCordonedNodes to change it under that cordon, which then stays)",
)


def node_busy(holder: str) -> Hold:
    return Hold(
        "NodeBusy",
        f"another rollout ({holder}) is changing this node; this one starts it "
        "once that rollout has released it",
    )


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]
    budget: Budget
    halted: bool
    paused: bool
    held: Mapping[str, Hold] = field(default_factory=dict)
    """Nodes waiting in ``required`` that this pass may not start, and why."""


def _elapsed(view: NodeView, now: float) -> float:
    # A missing or unreadable timer never fires a timeout early (and _advance
    # writes a fresh one).
    return 0.0 if view.record.since is None else now - view.record.since


def _bounded(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


def _name_pods(pods: Sequence[PodView], note: dict[str, str] | None = None) -> str:
    refs = sorted(pods, key=lambda p: p.ref)
    named = [
        f"{p.ref}{(' (' + note[p.ref] + ')') if note and p.ref in note else ''}"
        for p in refs[:MAX_NAMED_PODS]
    ]
    more = len(refs) - MAX_NAMED_PODS
    return ", ".join(named) + (f" and {more} more" if more > 0 else "")


def _move(
    view: NodeView,
    ctx: Context,
    to: State | None,
    *,
    reason: str = "",
    message: str = "",
    labels: Mapping[str, str | None] | None = None,
    annotations: Mapping[str, str | None] | None = None,
    unschedulable: bool | None = None,
    swap: bool = False,
) -> Step:
    keys = ctx.keys
    message = _bounded(message)
    # What rides on the move first: the move's own keys win over a backend's record.
    ann: dict[str, str | None] = {
        **(annotations or {}),
        keys.since: None if to is None else str(int(ctx.now)),
        keys.reason: reason or None,
        keys.message: message or None,
    }
    if to is not State.SWAPPING and (view.state is State.SWAPPING or view.record.swap is not None):
        # The swap's marker lives only while the node is in ``swapping``. A swap step's
        # view predates its own marker, so leaving ``swapping`` always removes it.
        ann[keys.swap] = None
    ann.update(_claim(view, ctx, to))
    lab: dict[str, str | None] = {**(labels or {}), keys.state: None if to is None else to.value}
    patch = NodePatch(labels=lab, annotations=ann, unschedulable=unschedulable)
    marker = NodePatch(annotations={keys.swap: ctx.target}) if swap else None
    return Step(view.name, view.state, to, reason, message, patch, swap_marker=marker)


def _cordoned_by_rollout(view: NodeView) -> bool:
    return view.unschedulable and view.record.cordon == "rollout"


def _claim(view: NodeView, ctx: Context, to: State | None) -> dict[str, str | None]:
    """The holder change riding on a move: the claim is taken by the patch that starts
    the node and dropped by the one that ends it, so a claim never outlives its state
    or precedes it. A failed node keeps it while this rollout's cordon stays, since
    the node may be half-changed; another policy's claim is never touched."""
    me = ctx.keys.holder_id
    if view.holder not in (None, me):
        return {}
    keep = to in IN_FLIGHT or (to is State.FAILED and _cordoned_by_rollout(view))
    if keep and view.holder is None:
        return {HOLDER_ANNOTATION: me}
    if not keep and view.holder == me:
        return {HOLDER_ANNOTATION: None}
    return {}


_ORDER = (
    State.CORDONING,
    State.GATING,
    State.WAITING_FOR_JOBS,
    State.EVICTING,
    State.DRAINING,
    State.SWAPPING,
    State.VALIDATING,
    State.UNCORDONING,
    State.DONE,
)


_TIMED = frozenset(
    {State.WAITING_FOR_JOBS, State.EVICTING, State.DRAINING, State.SWAPPING, State.VALIDATING}
)


def _configured(state: State, policy: UpgradePolicy) -> bool:
    if state is State.GATING:
        return bool(policy.deploy_gates)
    if state is State.WAITING_FOR_JOBS:
        return policy.wait_for_completion is not None
    if state is State.EVICTING:
        return policy.device_eviction.enable
    if state is State.DRAINING:
        return policy.drain.enable
    return True


def _next_after(state: State, policy: UpgradePolicy) -> State:
    """The next state the policy uses; a node whose own step the policy has since
    dropped (gates removed mid-rollout, say) still finds its way on."""
    later = _ORDER[_ORDER.index(state) + 1 :]
    return next(s for s in later if _configured(s, policy))


def _start(view: NodeView, ctx: Context) -> Step:
    same_target = view.record.target == ctx.target
    attempt = view.record.attempt + 1 if same_target else 1
    return _move(
        view,
        ctx,
        State.CORDONING,
        annotations={ctx.keys.attempt: str(attempt), ctx.keys.target: ctx.target},
    )


def _back_out(view: NodeView, ctx: Context) -> Step | None:
    """Leave the rollout: undo what it did, or just forget a node it never touched."""
    reason = "NoLongerNeeded"
    message = "the node already runs the target; undoing the rollout's changes"
    if view.state in IN_FLIGHT:
        return _move(view, ctx, State.UNCORDONING, reason=reason, message=message)
    if view.record.leftovers:
        return _finish(view, ctx)
    if view.state is not None or view.record.swap is not None:
        return _move(view, ctx, None)
    return None


def hold_of(view: NodeView, policy: UpgradePolicy, holder_id: str = "") -> Hold | None:
    """Why the rollout may not start this node now, if it may not.

    A node that is down cannot be drained or checked: started, it would hold a
    slot until its timeout fails it (and, with ``haltOnFailure``, the rollout).
    A cordon the rollout did not make is someone's decision about the node
    (maintenance, repair, another rollout); it is honoured unless the policy
    says to upgrade such nodes. A node claimed by another policy's rollout is that
    rollout's until it releases it, whatever this policy allows.
    """
    if not view.ready:
        return NOT_READY
    if view.holder is not None and view.holder != holder_id:
        return node_busy(view.holder)
    if view.cordoned_by_others and not policy.upgrade_cordoned_nodes:
        return EXTERNAL_CORDON
    return None


def _cordon(view: NodeView, ctx: Context) -> Step:
    # Started but not touched yet: a node that has gone down, or that someone else
    # has cordoned, since its start goes back to wait instead of being taken over.
    hold = hold_of(view, ctx.policy, ctx.keys.holder_id)
    if hold is not None:
        return _move(view, ctx, State.REQUIRED, reason=hold.reason, message=hold.message)
    following = _next_after(State.CORDONING, ctx.policy)
    if view.cordoned_by_others:
        return _move(
            view,
            ctx,
            following,
            reason="ExternalCordon",
            message="the node was already cordoned; it stays cordoned afterwards",
            annotations={ctx.keys.cordon: "external"},
        )
    if not ctx.policy.cordon:
        return _move(view, ctx, following)
    return _move(view, ctx, following, annotations={ctx.keys.cordon: "rollout"}, unschedulable=True)


def _gate(view: NodeView, ctx: Context) -> Step:
    gates = ctx.policy.deploy_gates
    saved = dict(view.record.gates or {})
    # Keep values saved by an earlier attempt: they are the pre-rollout ones,
    # while the node's labels may still hold this rollout's gate values.
    for key in gates:
        saved.setdefault(key, view.gate_values.get(key))
    return _move(
        view,
        ctx,
        _next_after(State.GATING, ctx.policy),
        labels=dict(gates),
        annotations={ctx.keys.gates: encode_gates(saved)},
    )


def _wait_for_jobs(view: NodeView, ctx: Context) -> Step | None:
    wait = ctx.policy.wait_for_completion
    following = _next_after(State.WAITING_FOR_JOBS, ctx.policy)
    if wait is None:
        return _move(view, ctx, following)
    if view.pods is None:
        return None
    running = [p for p in view.pods if p.phase in ("Running", "Pending") and not p.terminating]
    if not running:
        return _move(view, ctx, following)
    if wait.timeout_seconds and _elapsed(view, ctx.now) >= wait.timeout_seconds:
        return _move(
            view,
            ctx,
            following,
            reason="WaitTimeout",
            message=f"stopped waiting after {wait.timeout_seconds}s for "
            f"{_name_pods(running)}; evicting",
        )
    return None


def _why_left(pods: Sequence[PodView], force: bool) -> dict[str, str]:
    notes = {}
    for p in pods:
        if p.terminating:
            notes[p.ref] = "terminating"
        elif p.daemonset:
            notes[p.ref] = "DaemonSet pod; gate it with a deploy gate"
        elif p.bare and not force:
            notes[p.ref] = "no controller; set force to evict it"
    return notes


def _evict_or_fail(
    view: NodeView,
    ctx: Context,
    remaining: Sequence[PodView],
    evictable: Sequence[PodView],
    timeout: int,
    force: bool,
    what: str,
) -> Step | None:
    if _elapsed(view, ctx.now) < timeout:
        return (
            Step(view.name, view.state, view.state, evict=tuple(evictable)) if evictable else None
        )
    if evictable:
        return _move(
            view,
            ctx,
            State.FAILED,
            reason="EvictionBlocked",
            message=f"{what}: evictions still refused after {timeout}s "
            f"(a PodDisruptionBudget allows no disruption): {_name_pods(evictable)}",
        )
    return _move(
        view,
        ctx,
        State.FAILED,
        reason="DrainTimeout",
        message=f"{what}: pods still on the node after {timeout}s: "
        f"{_name_pods(remaining, _why_left(remaining, force))}",
    )


def _evict_consumers(view: NodeView, ctx: Context) -> Step | None:
    rule = ctx.policy.device_eviction
    if not rule.enable:
        return _move(view, ctx, _next_after(State.EVICTING, ctx.policy))
    if view.pods is None:
        return None
    consumers = [p for p in view.pods if p.device_consumer and not p.finished and not p.mirror]
    if not consumers:
        return _move(view, ctx, _next_after(State.EVICTING, ctx.policy))
    evictable = [
        p for p in consumers if not p.terminating and not p.daemonset and (rule.force or not p.bare)
    ]
    return _evict_or_fail(
        view,
        ctx,
        consumers,
        evictable,
        rule.timeout_seconds,
        rule.force,
        "evicting device consumers",
    )


def _drain(view: NodeView, ctx: Context) -> Step | None:
    rule = ctx.policy.drain
    if not rule.enable:
        return _move(view, ctx, _next_after(State.DRAINING, ctx.policy))
    if view.pods is None:
        return None
    # kubectl drain semantics: DaemonSet and mirror pods stay; bare pods and pods
    # with emptyDir data are left alone unless the policy allows evicting them.
    selected = [
        p
        for p in view.pods
        if not p.finished
        and not p.mirror
        and not p.daemonset
        and p.namespace not in rule.spared_namespaces
        and (rule.force or not p.bare)
        and (rule.delete_empty_dir or not p.empty_dir)
    ]
    if not selected:
        return _move(view, ctx, _next_after(State.DRAINING, ctx.policy))
    evictable = [p for p in selected if not p.terminating]
    return _evict_or_fail(
        view, ctx, selected, evictable, rule.timeout_seconds, rule.force, "draining"
    )


def _validate(view: NodeView, ctx: Context) -> Step | None:
    verdict = view.validation
    if isinstance(verdict, Validated):
        return _move(
            view, ctx, State.UNCORDONING, labels=verdict.labels, annotations=verdict.annotations
        )
    if isinstance(verdict, Failed):
        return _move(view, ctx, State.FAILED, reason=verdict.reason, message=verdict.message)
    timeout = ctx.policy.validation_timeout_seconds
    if _elapsed(view, ctx.now) >= timeout:
        detail = verdict.message if isinstance(verdict, Pending) and verdict.message else ""
        return _move(
            view,
            ctx,
            State.FAILED,
            reason="ValidationTimeout",
            message=f"not healthy {timeout}s after the swap" + (f": {detail}" if detail else ""),
        )
    return None


def _swap(view: NodeView, ctx: Context) -> Step:
    timeout = ctx.policy.validation_timeout_seconds
    if _elapsed(view, ctx.now) >= timeout:
        return _move(
            view,
            ctx,
            State.FAILED,
            reason="SwapFailed",
            message=f"the backend could not start the change within {timeout}s; "
            "see the operator log",
        )
    # The swap hook runs only after the marker write, guarded by the observed
    # resourceVersion, has landed: a stale view never swaps. If the swap itself
    # changed the node, the state write (guarded by the marker write's
    # resourceVersion) is refused; the next pass rewrites the marker (a no-op that
    # still proves its view current), calls the idempotent swap again and moves on.
    # Never writing over a newer node is worth it.
    return _move(view, ctx, State.VALIDATING, swap=True)


def _finish(view: NodeView, ctx: Context) -> Step:
    record = view.record
    external = record.cordon == "external"
    return _move(
        view,
        ctx,
        State.DONE,
        reason="ExternalCordon" if external else "",
        message="left cordoned: it was cordoned before the rollout" if external else "",
        labels=dict(record.gates or {}),
        annotations={ctx.keys.cordon: None, ctx.keys.gates: None},
        unschedulable=False if record.cordon == "rollout" else None,
    )


def _advance(view: NodeView, ctx: Context) -> Step | None:
    """The step of one node, except starting (which the budget decides)."""
    state = view.state
    if state is None:
        return _move(view, ctx, State.REQUIRED) if view.needs_update else _back_out(view, ctx)
    if (
        state
        in (
            State.REQUIRED,
            State.CORDONING,
            State.GATING,
            State.WAITING_FOR_JOBS,
            State.EVICTING,
            State.DRAINING,
        )
        and not view.needs_update
    ):
        return _back_out(view, ctx)
    if state is State.DONE:
        return _move(view, ctx, State.REQUIRED) if view.needs_update else None
    if state is State.FAILED:
        if view.record.target == ctx.target:
            return _release_failed(view, ctx)
        return _move(
            view,
            ctx,
            State.REQUIRED,
            reason="TargetChanged",
            message=f"retrying for the new target {ctx.target}",
        )
    if state in _TIMED and view.record.since is None:
        # Someone set the state label by hand: start the clock its timeout needs.
        return _move(view, ctx, state)
    handlers = {
        State.CORDONING: _cordon,
        State.GATING: _gate,
        State.WAITING_FOR_JOBS: _wait_for_jobs,
        State.EVICTING: _evict_consumers,
        State.DRAINING: _drain,
        State.SWAPPING: _swap,
        State.VALIDATING: _validate,
        State.UNCORDONING: _finish,
    }
    handler = handlers.get(state)
    return handler(view, ctx) if handler else None


def _release_failed(view: NodeView, ctx: Context) -> Step | None:
    """Once an admin uncordons a failed node, other rollouts may have it; the failure
    itself (state, reason, message) stays for the admin to read."""
    if view.holder != ctx.keys.holder_id or _cordoned_by_rollout(view):
        return None
    patch = NodePatch(annotations={HOLDER_ANNOTATION: None})
    return Step(view.name, view.state, view.state, view.record.reason, view.record.message, patch)


def _through_with(view: NodeView, ctx: Context) -> bool:
    """The rollout has finished with this node, and this pass does not take it back."""
    if view.state is State.DONE:
        return not view.needs_update
    return view.state is State.FAILED and view.record.target == ctx.target


def _held_by_other(view: NodeView, ctx: Context) -> bool:
    return view.holder is not None and view.holder != ctx.keys.holder_id


def budget_of(views: Iterable[NodeView], ctx: Context) -> Budget:
    """In flight, and unavailable: in flight, or cordoned or NotReady for any reason,
    except on a node the rollout is through with or another rollout holds (that
    rollout counts it against its own budget). A node left cordoned by its admin
    after its upgrade, or kept cordoned because it failed (which halts the rollout
    when ``haltOnFailure`` says so), would otherwise hold a slot forever."""
    views = list(views)
    return Budget(
        max_parallel=ctx.policy.max_parallel,
        in_progress=sum(1 for v in views if v.state in IN_FLIGHT),
        max_unavailable=ctx.policy.max_unavailable_nodes(len(views)),
        unavailable=sum(
            1
            for v in views
            if v.state in IN_FLIGHT
            or (not v.available and not _through_with(v, ctx) and not _held_by_other(v, ctx))
        ),
    )


def is_halted(views: Iterable[NodeView], policy: UpgradePolicy) -> bool:
    return policy.halt_on_failure and any(v.state is State.FAILED and not v.skipped for v in views)


def _held(views: Iterable[NodeView], ctx: Context) -> dict[str, Hold]:
    held = {}
    for view in views:
        if view.state is State.REQUIRED and view.needs_update and not view.skipped:
            hold = hold_of(view, ctx.policy, ctx.keys.holder_id)
            if hold is not None:
                held[view.name] = hold
    return held


def _starts(
    views: Sequence[NodeView], ctx: Context, budget: Budget, held: Mapping[str, Hold]
) -> list[Step]:
    candidates = sorted(
        (
            v
            for v in views
            if v.state is State.REQUIRED and v.needs_update and not v.skipped and v.name not in held
        ),
        # Healthy nodes first, then those already out of service (cordoned by the rollout
        # after a failure, or by someone else under upgradeCordonedNodes): the likeliest
        # to fail or time out, holding a slot no healthy node gets meanwhile, and under
        # haltOnFailure stopping the fleet before any healthy node had the change. They
        # cost no availability, so they still start in the same pass when a parallel
        # slot is left: the loop passes over a node the unavailability budget cannot take.
        key=lambda v: (not v.available, v.name),
    )
    in_progress, unavailable = budget.in_progress, budget.unavailable
    starts = []
    for view in candidates:
        if in_progress >= budget.max_parallel:
            break
        if view.available:
            if unavailable >= budget.max_unavailable:
                continue
            unavailable += 1
        in_progress += 1
        starts.append(_start(view, ctx))
    return starts


def plan(views: Sequence[NodeView], ctx: Context) -> Plan:
    """One pass: a step for every node that has something to do."""
    budget = budget_of(views, ctx)
    halted = is_halted(views, ctx.policy)
    held = _held(views, ctx)
    steps = []
    for view in views:
        if view.skipped:
            continue
        step = _advance(view, ctx)
        if step is not None:
            steps.append(step)
    if not ctx.paused and not halted:
        steps += _starts(views, ctx, budget, held)
    return Plan(tuple(steps), budget, halted, ctx.paused, held)
