"""One rollout pass against the cluster: observe, plan, apply.

``reconcile`` is what a backend's kopf timer (or any loop) calls per policy. It
keeps nothing between calls: everything it needs is on the nodes, so the process
may be killed at any instant and the next call carries on. Once every node has
converged a pass reads but writes nothing.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kmodkit.core import events
from kmodkit.core.contract.hooks import Obj, RolloutHooks
from kmodkit.core.contract.policy import UpgradePolicy
from kmodkit.core.rollout import apply
from kmodkit.core.rollout.keys import RolloutKeys
from kmodkit.core.rollout.observed import NodeView, node_view_from, pod_view_from
from kmodkit.core.rollout.plan import Context, Step, plan
from kmodkit.core.rollout.release import Departure, departures
from kmodkit.core.rollout.states import IN_FLIGHT, State
from kmodkit.core.rollout.status import RolloutStatus, summarize

log = logging.getLogger("kmodkit.rollout")

NO_RESOURCE_VERSION = (
    "the apiserver's answer carries no resourceVersion (a swap is never started on such an answer)"
)


@dataclass
class _Pass:
    """Counters of one pass, for the status."""

    applied: list[Step] = field(default_factory=list)
    evictions: int = 0
    evictions_blocked: int = 0
    writes: int = 0
    errors: list[str] = field(default_factory=list)
    departed: list[Departure] = field(default_factory=list)
    """Untargeted nodes this pass released or failed (the writes that landed) or holds."""

    def error(self, what: str, err: Exception) -> None:
        text = f"{what}: {err.reason if isinstance(err, ApiException) else err}"
        log.warning(text)
        self.errors.append(text)

    def add(self, other: _Pass) -> None:
        """Count in what ``other`` (one node's steps, applied beside others) did."""
        self.applied += other.applied
        self.evictions += other.evictions
        self.evictions_blocked += other.evictions_blocked
        self.writes += other.writes
        self.errors += other.errors
        self.departed += other.departed


Concurrently = Callable[[Sequence[Callable[[], None]]], None]
"""Runs independent calls, some at once, and returns once every one is done."""


def one_by_one(calls: Sequence[Callable[[], None]]) -> None:
    for call in calls:
        call()


def _pod_selector(state: State | None, policy: UpgradePolicy) -> str | None:
    """Which pods a node in ``state`` needs listed (None: none)."""
    if state is State.WAITING_FOR_JOBS and policy.wait_for_completion is not None:
        return policy.wait_for_completion.pod_selector
    if state is State.EVICTING and policy.device_eviction.enable:
        return ""
    if state is State.DRAINING:
        return policy.drain.pod_selector
    return None


def _observe(
    core: client.CoreV1Api,
    node: Obj,
    keys: RolloutKeys,
    policy: UpgradePolicy,
    hooks: RolloutHooks,
    skip_label: str | None,
    run: _Pass,
) -> NodeView:
    name = str((node.get("metadata") or {}).get("name", ""))
    gate_keys = tuple(policy.deploy_gates)
    try:
        needs_update = hooks.needs_update(node)
    except Exception as err:
        run.error(f"needs_update({name})", err)
        view = node_view_from(node, keys, gate_keys, skip_label=skip_label, needs_update=False)
        # Frozen for this pass, but still counted against the budgets.
        return replace(view, skipped=True)
    view = node_view_from(node, keys, gate_keys, skip_label=skip_label, needs_update=needs_update)
    if view.skipped:
        return view
    selector = _pod_selector(view.state, policy)
    if selector is not None:
        try:
            device = view.state is State.EVICTING
            pods = tuple(
                pod_view_from(p, device_consumer=device and hooks.is_device_consumer(p))
                for p in apply.list_pods_on_node(core, name, selector)
            )
            view = replace(view, pods=pods)
        except Exception as err:
            run.error(f"listing pods on {name}", err)
    if view.state is State.VALIDATING:
        try:
            view = replace(view, validation=hooks.validate(node))
        except Exception as err:
            run.error(f"validate({name})", err)
    return view


def _starts_are_safe(
    core: client.CoreV1Api, keys: RolloutKeys, views: Sequence[NodeView], run: _Pass
) -> bool:
    """Whether the nodes in flight are the ones the plan counted.

    Starts are decided from the in-flight count. If the nodes handed in were
    older than the cluster (a lagging watch cache), a fresh list of the few
    nodes in flight disagrees, and starting waits a pass rather than risk
    overrunning the budget.
    """
    states = ",".join(sorted(s.value for s in IN_FLIGHT))
    try:
        listed = apply.node_names(core, f"{keys.state} in ({states})")
    except Exception as err:
        run.error("checking the nodes in flight", err)
        return False
    fresh = listed & {v.name for v in views}
    expected = {v.name for v in views if v.state in IN_FLIGHT}
    for step in run.applied:
        if step.after in IN_FLIGHT:
            expected.add(step.node)
        else:
            expected.discard(step.node)
    return fresh == expected


def _describe(step: Step, policy_id: str) -> tuple[str, str]:
    before = step.before.value if step.before is not None else "idle"
    after = step.after.value if step.after is not None else "idle"
    reason = step.reason or f"Rollout{after.title().replace('-', '')}"
    message = f"rollout {policy_id} on node {step.node}: {before} -> {after}"
    if step.message:
        message += f": {step.message}"
    return reason, message


def _evict(core: client.CoreV1Api, step: Step, run: _Pass) -> None:
    for pod in step.evict:
        try:
            outcome = apply.evict(core, pod)
        except Exception as err:
            run.error(f"evicting {pod.ref} from {step.node}", err)
            continue
        run.writes += 1
        run.evictions += 1
        if outcome is apply.EvictionOutcome.BLOCKED:
            run.evictions_blocked += 1


def write_step(
    step: Step,
    resource_version: str,
    write: Callable[[dict[str, Any]], str | None],
    swap: Callable[[], bool],
) -> bool:
    """Write ``step``'s patch, and for a swap step call ``swap`` only once a write has
    proven the view current; whether the step's patch landed.

    ``write`` sends one merge patch and returns the node's resourceVersion after it
    (None: refused as stale, or failed); ``swap`` calls the backend's hook and says
    whether it did. The swap comes after its marker write, guarded by the observed
    ``resource_version``, and before the state write, guarded by the resourceVersion
    the marker write returned: a view that is not current never swaps, and a swap
    that changed the node leaves it in ``swapping`` for the next pass.
    """
    assert step.patch is not None
    if step.swap_marker is not None:
        if not resource_version:
            return False  # unguarded, the marker write would prove nothing
        proof = write(apply.patch_body(step.swap_marker, resource_version))
        if not proof or not swap():
            return False
        resource_version = proof
    return write(apply.patch_body(step.patch, resource_version)) is not None


def _move(
    core: client.CoreV1Api,
    step: Step,
    node: Obj,
    view: NodeView,
    swap_hook: Callable[[Obj], None],
    policy_id: str,
    target: str,
    involved: Mapping[str, str] | None,
    run: _Pass,
) -> None:
    def write(body: dict[str, Any]) -> str | None:
        try:
            resource_version = apply.patch_node(core, step.node, body)
        except Exception as err:
            run.error(f"patching node {step.node}", err)
            return None
        run.writes += 1
        if resource_version == "":
            run.error(f"patching node {step.node}", ValueError(NO_RESOURCE_VERSION))
        return resource_version

    def swap() -> bool:
        # Every call, effective or not, so a crash's repeated swap can be told from the log.
        log.info("rollout %s on node %s: swap hook called for %s", policy_id, step.node, target)
        try:
            swap_hook(node)
        except Exception as err:
            run.error(f"swap({step.node})", err)
            return False
        return True

    if not write_step(step, view.resource_version, write, swap):
        return
    run.applied.append(step)
    reason, message = _describe(step, policy_id)
    log.info(message)
    recorder = events.Recorder(core)  # a refused event is logged; the pass goes on
    refs = [events.node_reference(node)]
    if involved and (step.reason or step.after in (State.DONE, State.FAILED)):
        # The policy hears of each node's outcome and of every exception (a blocked
        # eviction, a timeout, a changed target), not of each routine move: those are
        # the node's, and on the policy would be 7 writes a node of a fleet's rollout.
        refs.append(dict(involved))
    for ref in refs:
        recorder.post(ref, reason, message, warning=step.after is State.FAILED)


def _depart(
    core: client.CoreV1Api,
    departure: Departure,
    node: Obj,
    involved: Mapping[str, str] | None,
    run: _Pass,
) -> None:
    """Write one untargeted node's departure (guarded), and report it once it landed."""
    recorder = events.Recorder(core)
    refs = [events.node_reference(node), *([dict(involved)] if involved else [])]
    if departure.body is None:
        # Held while the admin looks at it: said again at most every 10 minutes, not
        # on every pass.
        run.departed.append(departure)
        for ref in refs:
            recorder.post(
                ref,
                departure.reason,
                departure.message,
                warning=True,
                repeat_after=events.CONDITION_REPEAT_SECONDS,
            )
        return
    if not departure.body["metadata"].get("resourceVersion"):
        # Unguarded, the patch could undo marks the node no longer has, or miss new ones.
        run.error(f"releasing node {departure.node}", ValueError("no resourceVersion observed"))
        return
    try:
        landed = apply.patch_node(core, departure.node, departure.body)
    except Exception as err:
        run.error(f"releasing node {departure.node}", err)
        return
    run.writes += 1
    if landed is None:
        return  # the node changed since it was observed; the next pass decides again
    run.departed.append(departure)
    log.info(departure.message)
    for ref in refs:
        recorder.post(ref, departure.reason, departure.message, warning=departure.warning)


def reconcile(
    api: Any,
    policy_id: str,
    policy: UpgradePolicy,
    target_nodes: Sequence[Obj],
    hooks: RolloutHooks,
    *,
    target: str,
    paused: bool = False,
    skip_label: str | None = None,
    involved: Mapping[str, str] | None = None,
    now: float | None = None,
    known_nodes: Iterable[Obj] = (),
    concurrently: Concurrently = one_by_one,
) -> RolloutStatus:
    """Advance the rollout ``policy_id`` by one pass and report where it stands.

    ``api`` is a kubernetes ``ApiClient``. ``target_nodes`` are the nodes the
    policy covers, as raw JSON, at least as fresh as the previous pass's writes.
    ``target`` names what is being delivered (a version, a spec hash); a failed
    node is retried when it changes. ``skip_label`` is the backend's opt-out node
    label (nodes with it set to ``"true"`` are left alone). ``involved`` is an
    object reference (apiVersion, kind, name, namespace, uid) of the policy
    object that also receives the Events of each node's outcome and of every transition
    with a reason of its own.

    ``known_nodes`` are every node the caller knows of (its node cache), as fresh as
    ``target_nodes``: those outside ``target_nodes`` that carry this rollout's marks
    (a node that left the request mid-rollout) are released first (``release``).
    Scanning the caller's cache finds every such node, with the state label or
    without it, at no API cost; a list by the state label would return every node
    the rollout has ever reached (each ``done`` or ``required``).

    ``concurrently`` applies the pass's steps: a fleet's rollout has hundreds of nodes
    in flight, each move a guarded node patch and its Events, and one after another
    they made a pass of tens of seconds. The starts follow once all the other steps
    are done, and the swap hook is still called one node at a time.
    """
    core = client.CoreV1Api(api)
    keys = RolloutKeys.for_policy(policy_id)
    run = _Pass()
    clock = time.time() if now is None else now
    targeted = {str((n.get("metadata") or {}).get("name", "")) for n in target_nodes}
    by_name = {str((n.get("metadata") or {}).get("name", "")): n for n in known_nodes}
    for departure in departures(by_name.values(), targeted, keys, clock):
        _depart(core, departure, by_name[departure.node], involved, run)
    views = [_observe(core, n, keys, policy, hooks, skip_label, run) for n in target_nodes]
    ctx = Context(policy, keys, target, clock, paused)
    the_plan = plan(views, ctx)
    nodes = {v.name: (v, n) for v, n in zip(views, target_nodes, strict=True)}

    swapping = threading.Lock()

    def swap_hook(node: Obj) -> None:
        with swapping:  # hooks are called one at a time: a backend need not make them thread-safe
            hooks.swap(node)

    def apply_all(steps: Sequence[Step]) -> None:
        """Each node's step (its own node, its own guard) beside the others'; counted
        in plan order once all are done."""
        done = [_Pass() for _ in steps]

        def apply_one(step: Step, mine: _Pass) -> None:
            view, node = nodes[step.node]
            _evict(core, step, mine)
            if step.patch is not None:
                _move(core, step, node, view, swap_hook, policy_id, target, involved, mine)

        concurrently([functools.partial(apply_one, s, d) for s, d in zip(steps, done, strict=True)])
        for mine in done:
            run.add(mine)

    def is_start(step: Step) -> bool:
        return step.before is State.REQUIRED and step.after is State.CORDONING

    apply_all([s for s in the_plan.steps if not is_start(s)])
    starts = [s for s in the_plan.steps if is_start(s)]
    if starts and _starts_are_safe(core, keys, views, run):
        apply_all(starts)
    return summarize(
        views,
        the_plan,
        run.applied,
        evictions=run.evictions,
        evictions_blocked=run.evictions_blocked,
        writes=run.writes,
        errors=run.errors,
        departed=run.departed,
    )
