"""The rollout planner over many passes: a stateful property test.

Hypothesis drives a simulated fleet (raw Node objects, pods, a backend whose
swap is idempotent) through arbitrary interleavings of operator passes, kills
in the middle of a pass (only a prefix of its writes lands, and a kill can fall
after a swap's marker write or between the swap and the write that records it),
pod and node events, admin cordons, nodes leaving the rollout's request (its
policy's selector shrinks, the node is relabelled) and coming back, and the
clock. The world changes between
passes: a pass's writes take milliseconds, and a node changed under one is
refused by the resourceVersion guard every write carries (modelled: a swap that
touches the node makes the write that follows it stale). Every pass goes through
the product's own path: the departures of the nodes no longer targeted
(``release.departures``, written first, as reconcile does), views from the raw
nodes (``node_view_from``), ``plan``, and ``reconcile.write_step`` (the merge
patches of ``apply.patch_body``, the swap only after its guarded marker write has
landed). The simulated cluster and
backend are stand-ins for the apiserver and a driver; what is under test is the
planner's decisions and the order of a swap step's writes.

Safety, checked at every write: the in-flight and unavailability budgets, legal
state moves only, an admin's cordon never lifted, the swap hook called only in
``swapping``, with the marker for the current target on the node, and never
again for a node whose swap was recorded for the same target, the marker gone
once the node leaves ``swapping``, no start while paused or halted, no start of
a node that is NotReady or that an admin cordoned (unless the policy upgrades
cordoned nodes), and no swap under an admin's cordon either. A node that leaves
the request is released with nothing of the rollout left on it (cordon, gates,
keys, claim), except one the rollout failed, or one that left during its change
(``validating``, or ``swapping`` once the swap's marker is written), which stays
failed, cordoned and claimed. Every pass reports
the nodes it holds back for being down (``NodeNotReady``) or cordoned
(``ExternalCordon``). Liveness, at the end: once the cluster behaves (nodes
Ready, disruptions allowed, swaps healthy), every node finishes except those an
admin keeps cordoned and those waiting only because such nodes fill
maxUnavailable; once the admins uncordon too, every node finishes and the
rollout leaves no cordon of its own behind. A node no longer targeted is then
clean, or failed and kept; once the admin uncordons that one, clean too.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
)

from kmodkit.core.contract.hooks import Failed, Pending, Validated, Validation
from kmodkit.core.contract.policy import UpgradePolicy
from kmodkit.core.rollout.keys import HOLDER_ANNOTATION, RolloutKeys
from kmodkit.core.rollout.observed import NodeView, PodView, node_view_from
from kmodkit.core.rollout.plan import Context, Step, plan
from kmodkit.core.rollout.reconcile import write_step
from kmodkit.core.rollout.release import Departure, departures
from kmodkit.core.rollout.states import BEFORE_SWAP, IN_FLIGHT, NEEDS_PODS, State
from kmodkit.core.rollout.status import summarize

KEYS = RolloutKeys.for_policy("machine")
OLD, FIRST, SECOND = "v1", "v2", "v3"
GATE = "example.com/deploy.telemetry"

# Every move the planner may make: forward along the states (skipping those the
# policy does not use), backing out before the swap, going back to wait when the
# node went down or an admin cordoned it before the rollout's cordon, failing
# where a step can fail, retrying for a new target, and leaving a node that
# needs nothing.
_ORDER = (
    State.CORDONING,
    State.GATING,
    State.WAITING_FOR_JOBS,
    State.EVICTING,
    State.DRAINING,
    State.SWAPPING,
)
LEGAL = {
    (None, State.REQUIRED),
    (None, State.DONE),
    (State.REQUIRED, None),
    (State.REQUIRED, State.DONE),
    (State.REQUIRED, State.CORDONING),
    (State.CORDONING, State.REQUIRED),
    *((a, b) for i, a in enumerate(_ORDER) for b in _ORDER[i + 1 :]),
    *((a, State.UNCORDONING) for a in BEFORE_SWAP),
    (State.EVICTING, State.FAILED),
    (State.DRAINING, State.FAILED),
    (State.SWAPPING, State.VALIDATING),
    (State.SWAPPING, State.FAILED),
    (State.VALIDATING, State.UNCORDONING),
    (State.VALIDATING, State.FAILED),
    (State.UNCORDONING, State.DONE),
    (State.DONE, State.REQUIRED),
    (State.FAILED, State.REQUIRED),
}

# What a departure (a node no longer targeted) may do: release the node from any state,
# or fail it when it left during its change.
DEPARTURES = {
    *((state, None) for state in (None, *State)),
    (State.SWAPPING, State.FAILED),
    (State.VALIDATING, State.FAILED),
}

policies = st.builds(
    UpgradePolicy,
    max_parallel=st.integers(1, 3),
    max_unavailable=st.one_of(st.integers(1, 3), st.sampled_from(["25%", "50%"])),
    halt_on_failure=st.booleans(),
    upgrade_cordoned_nodes=st.booleans(),
    deploy_gates=st.sampled_from([{}, {GATE: "false"}]),
    wait_for_completion=st.sampled_from([None, {"podSelector": "job", "timeoutSeconds": 60}]),
    drain=st.sampled_from([{}, {"enable": True, "timeoutSeconds": 120}]),
    device_eviction=st.just({"timeoutSeconds": 120}),
    validation_timeout_seconds=st.just(300),
)


@dataclass
class SimNode:
    """A node as the apiserver holds it, plus what the simulated world knows of it."""

    raw: dict[str, Any]
    version: str = OLD
    pods: list[PodView] = field(default_factory=list)
    blocked: bool = False
    """A PodDisruptionBudget refuses every eviction from this node."""
    verdict: Validation = field(default_factory=lambda: Pending("starting"))
    admin_cordon: bool = False

    @property
    def name(self) -> str:
        return str(self.raw["metadata"]["name"])

    @property
    def state(self) -> State | None:
        value = self.raw["metadata"]["labels"].get(KEYS.state)
        return State(value) if value else None

    @property
    def cordoned(self) -> bool:
        return bool(self.raw["spec"].get("unschedulable"))

    @property
    def ready(self) -> bool:
        return self.raw["status"]["conditions"][0]["status"] == "True"


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """An RFC 7386 merge patch, as the apiserver applies it."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict):
            _merge(target.setdefault(key, {}), value)
        else:
            target[key] = value


def _apply(raw: dict[str, Any], body: dict[str, Any]) -> str | None:
    """A node patch as the apiserver takes it: refused (None) when the resourceVersion it
    carries is not the node's; else applied, the resourceVersion raised only if something
    changed (a no-op write leaves it), and the node's resourceVersion returned."""
    meta = raw["metadata"]
    guard = body["metadata"].get("resourceVersion")
    if guard and guard != meta["resourceVersion"]:
        return None
    before = copy.deepcopy(raw)
    _merge(raw, body)
    meta["resourceVersion"] = before["metadata"]["resourceVersion"]
    if raw != before:
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
    return str(meta["resourceVersion"])


class RolloutMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.nodes: dict[str, SimNode] = {}
        self.policy = UpgradePolicy()
        self.now = 1_000_000.0
        self.paused = False
        self.recorded_swap: set[str] = set()
        """Nodes whose swap was followed by the write that records it."""
        self.target = FIRST
        self.targeted: set[str] = set()
        """The nodes in the rollout's request (the policy's selector, as it stands)."""

    # -- the fleet --------------------------------------------------------------

    @initialize(
        policy=policies,
        count=st.integers(2, 6),
        workloads=st.lists(st.tuples(st.booleans(), st.booleans()), min_size=6, max_size=6),
    )
    def fleet(self, policy: UpgradePolicy, count: int, workloads: list[tuple[bool, bool]]) -> None:
        self.policy = policy
        for i in range(count):
            consumer, job = workloads[i]
            name = f"n{i}"
            pods = [PodView("w", f"{name}-app", device_consumer=consumer)]
            if job:
                pods.append(PodView("w", f"{name}-job"))
            raw = {
                "metadata": {"name": name, "uid": f"u{i}", "resourceVersion": "1"},
                "spec": {},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
            }
            raw["metadata"]["labels"] = {}
            raw["metadata"]["annotations"] = {}
            self.nodes[name] = SimNode(raw, pods=pods)
            self.targeted.add(name)

    def _node(self, data: st.DataObject) -> SimNode:
        return self.nodes[data.draw(st.sampled_from(sorted(self.nodes)), label="node")]

    # -- the operator -----------------------------------------------------------

    def _view(self, sim: SimNode) -> NodeView:
        state = sim.state
        view = node_view_from(
            sim.raw,
            KEYS,
            tuple(self.policy.deploy_gates),
            skip_label=None,
            needs_update=sim.version != self.target,
            pods=tuple(
                PodView(
                    p.namespace,
                    p.name,
                    device_consumer=p.device_consumer and (state is State.EVICTING),
                )
                for p in sim.pods
            )
            if state in NEEDS_PODS
            else None,
            validation=sim.verdict if state is State.VALIDATING else None,
        )
        return view

    @rule(
        kill_at=st.one_of(st.none(), st.integers(0, 6)),
        kill_in_swap=st.sampled_from([None, "after-marker", "after-swap"]),
    )
    def operator_pass(self, kill_at: int | None, kill_in_swap: str | None) -> None:
        """One pass; killed after ``kill_at`` writes, or in a swap step: once its marker
        landed (before the swap), or between the swap and the write that records it."""
        self._pass(kill_at, kill_in_swap)

    def _targets(self) -> list[SimNode]:
        return [s for name, s in self.nodes.items() if name in self.targeted]

    def _pass(self, kill_at: int | None = None, kill_in_swap: str | None = None) -> int:
        """One pass, as reconcile makes it; how many steps it planned (departures included,
        the held ones not: they write nothing)."""
        # As reconcile: the nodes no longer targeted depart first, from the same snapshot.
        gone = departures(
            copy.deepcopy([s.raw for s in self.nodes.values()]), self.targeted, KEYS, self.now
        )
        writes = [d for d in gone if d.body is not None]
        for i, departure in enumerate(writes):
            if i == kill_at:
                return len(writes)
            self._depart(departure)
        if kill_at is not None:
            kill_at -= len(writes)
        views = [self._view(s) for s in self._targets()]
        by_name = {v.name: v for v in views}
        p = plan(views, Context(self.policy, KEYS, self.target, self.now, self.paused))
        starts = [s for s in p.steps if _is_start(s)]
        failed = any(s.state is State.FAILED for s in self._targets())
        if starts:
            assert not self.paused, "started a node while paused"
            assert not (self.policy.halt_on_failure and failed), "started a node while halted"
        self._check_held(views, p)
        # As reconcile: every other step first, then the starts.
        for i, step in enumerate([s for s in p.steps if not _is_start(s)] + starts):
            if i == kill_at or not self._write(step, by_name[step.node], kill_in_swap):
                break
        return len(p.steps) + len(writes)

    def _depart(self, departure: Departure) -> None:
        """Write one untargeted node's departure, as reconcile does (guarded)."""
        sim = self.nodes[departure.node]
        assert departure.node not in self.targeted, f"{departure.node}: targeted, yet departed"
        before = sim.state
        ours = sim.cordoned and sim.raw["metadata"]["annotations"].get(KEYS.cordon) == "rollout"
        changing = before is State.VALIDATING or (
            before is State.SWAPPING and KEYS.swap in sim.raw["metadata"]["annotations"]
        )
        assert departure.body is not None
        if _apply(sim.raw, departure.body) is None:
            return  # refused: the node changed since the snapshot
        meta = sim.raw["metadata"]
        after = sim.state
        assert (before, after) in DEPARTURES, f"{sim.name}: departed {before} -> {after}"
        if sim.admin_cordon:
            assert sim.cordoned, f"{sim.name}: the admin's cordon was lifted"
        if ours and (changing or before is State.FAILED):
            # Possibly half-changed: never handed back to workloads or to another rollout
            # before the admin has looked at it.
            assert after is State.FAILED, f"{sim.name}: released from {before} under its cordon"
        if after is None:
            assert meta["annotations"].get(HOLDER_ANNOTATION) != KEYS.holder_id, (
                f"{sim.name}: released, claim left behind"
            )
            assert not any(k in meta["annotations"] for k in KEYS.annotations()), sim.name
            assert sim.cordoned == sim.admin_cordon, f"{sim.name}: released, left cordoned"
            assert not meta["labels"].get(GATE), f"{sim.name}: released, gate kept"
        else:  # left during its change: failed, still cordoned and claimed by the rollout
            assert sim.cordoned and meta["annotations"].get(KEYS.cordon) == "rollout", sim.name
            assert meta["annotations"].get(HOLDER_ANNOTATION) == KEYS.holder_id, sim.name

    def _write(self, step: Step, view: NodeView, kill_in_swap: str | None) -> bool:
        """Apply one step as reconcile does; False when the operator died doing it."""
        sim = self.nodes[step.node]
        for pod in step.evict:
            if not sim.blocked:
                sim.pods = [p for p in sim.pods if p.ref != pod.ref]
        if step.patch is None:
            return True
        disrupted_before = _disrupted(sim)
        killed = False

        def swap() -> bool:
            nonlocal killed
            killed = kill_in_swap is not None
            if kill_in_swap != "after-marker":
                self._swap(sim)
            return not killed

        # The product's own order of the marker write, the swap and the state write.
        if not write_step(step, view.resource_version, lambda body: _apply(sim.raw, body), swap):
            return not killed  # refused over a newer node (the next pass re-plans it)
        annotations = sim.raw["metadata"]["annotations"]
        if sim.state is not State.SWAPPING:
            assert KEYS.swap not in annotations, f"{step.node}: swap marker left in {sim.state}"
        assert (step.before, step.after) in LEGAL, f"{step.node}: {step.before} -> {step.after}"
        if sim.admin_cordon:
            assert sim.cordoned, f"{step.node}: the admin's cordon was lifted"
        if _is_start(step):
            assert sim.ready, f"{step.node}: started while NotReady"
            assert self.policy.upgrade_cordoned_nodes or not sim.admin_cordon, (
                f"{step.node}: started under an admin's cordon"
            )
        if step.before not in IN_FLIGHT and step.after in IN_FLIGHT:
            in_flight = sum(1 for s in self._targets() if s.state in IN_FLIGHT)
            assert in_flight <= self.policy.max_parallel, f"{step.node}: over maxParallel"
        if not disrupted_before and _disrupted(sim):
            self._check_unavailable(step)
        if step.swap:
            self.recorded_swap.add(step.node)
        return True

    def _swap(self, sim: SimNode) -> None:
        assert sim.state is State.SWAPPING, f"{sim.name}: swapped in state {sim.state}"
        marker = sim.raw["metadata"]["annotations"].get(KEYS.swap)
        assert marker == self.target, f"{sim.name}: swapped with marker {marker!r} on the node"
        assert sim.name not in self.recorded_swap, f"{sim.name}: swapped twice"
        assert self.policy.upgrade_cordoned_nodes or not sim.admin_cordon, (
            f"{sim.name}: swapped under an admin's cordon"
        )
        if sim.version != self.target:  # the backend's swap is idempotent
            sim.version = self.target
            sim.verdict = Pending("loading")
            self._changed(sim)  # the swap itself may touch the node object

    def _check_held(self, views: list[NodeView], p: Any) -> None:
        """A node waiting to start that is down, or that an admin cordoned, is reported so."""
        moved = {s.node for s in p.steps}
        reasons = {n.name: n.reason for n in summarize(views, p, p.steps).nodes}
        for view in views:
            if view.state is not State.REQUIRED or not view.needs_update or view.name in moved:
                continue
            sim = self.nodes[view.name]
            if not sim.ready:
                assert reasons[view.name] == "NodeNotReady", (view.name, reasons)
            elif sim.admin_cordon and not self.policy.upgrade_cordoned_nodes:
                assert reasons[view.name] == "ExternalCordon", (view.name, reasons)

    def _unavailable(self) -> int:
        """What the budget counts: every node in flight, cordoned or NotReady, except
        those the rollout is through with (done and current, failed for this target)."""
        return sum(
            1
            for s in self._targets()
            if s.state in IN_FLIGHT or ((s.cordoned or not s.ready) and not self._through_with(s))
        )

    def _check_unavailable(self, step: Step) -> None:
        """A write that takes a node out of service must keep the budget."""
        counted = self._unavailable()
        limit = self.policy.max_unavailable_nodes(len(self.targeted))
        assert counted <= limit, (
            f"{step.node} {step.before} -> {step.after}: {counted} unavailable, "
            f"maxUnavailable {limit}"
        )

    def _through_with(self, sim: SimNode) -> bool:
        if sim.state is State.DONE:
            return sim.version == self.target
        annotations = sim.raw["metadata"]["annotations"]
        return sim.state is State.FAILED and annotations.get(KEYS.target) == self.target

    def _changed(self, sim: SimNode) -> None:
        meta = sim.raw["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)

    # -- the world --------------------------------------------------------------

    @rule(seconds=st.sampled_from([5, 30, 90, 400]))
    def time_passes(self, seconds: int) -> None:
        self.now += seconds

    @rule(data=st.data(), healthy=st.booleans())
    def backend_verdict(self, data: st.DataObject, healthy: bool) -> None:
        sim = self._node(data)
        if sim.version == self.target:
            sim.verdict = Validated() if healthy else Failed("Broken", "device not found")

    @rule(data=st.data())
    def pods_finish(self, data: st.DataObject) -> None:
        self._node(data).pods = []

    @rule(data=st.data(), blocked=st.booleans())
    def disruption_budget(self, data: st.DataObject, blocked: bool) -> None:
        self._node(data).blocked = blocked

    @rule(data=st.data())
    def admin_cordons(self, data: st.DataObject) -> None:
        sim = self._node(data)
        if not sim.cordoned:
            sim.raw["spec"]["unschedulable"] = True
            sim.admin_cordon = True
            self._changed(sim)

    @rule(data=st.data())
    def admin_uncordons(self, data: st.DataObject) -> None:
        sim = self._node(data)
        if sim.admin_cordon:
            sim.raw["spec"].pop("unschedulable", None)
            sim.admin_cordon = False
            self._changed(sim)

    @rule(data=st.data(), ready=st.booleans())
    def node_readiness(self, data: st.DataObject, ready: bool) -> None:
        sim = self._node(data)
        sim.raw["status"]["conditions"][0]["status"] = "True" if ready else "False"
        self._changed(sim)

    @rule(paused=st.booleans())
    def pause(self, paused: bool) -> None:
        self.paused = paused

    @rule(data=st.data())
    def node_leaves_the_request(self, data: st.DataObject) -> None:
        """The policy's selector shrinks, the node is relabelled, or another policy takes
        it over: whatever state the rollout has it in."""
        self.targeted.discard(self._node(data).name)

    @rule(data=st.data())
    def node_rejoins_the_request(self, data: st.DataObject) -> None:
        self.targeted.add(self._node(data).name)

    @precondition(lambda self: self.target == FIRST)
    @rule()
    def new_target(self) -> None:
        """A new version is asked for mid-rollout: every node is swapped again, once."""
        self.target = SECOND
        self.recorded_swap.clear()

    # -- liveness ---------------------------------------------------------------

    def teardown(self) -> None:
        """Once the world behaves, the rollout finishes (halted only by a real failure),
        except on nodes an admin keeps cordoned; once those are uncordoned, there too."""
        if not self.nodes:
            return
        self.paused = False
        for sim in self.nodes.values():
            sim.raw["status"]["conditions"][0]["status"] = "True"
            sim.blocked = False
            sim.pods = []
            self._changed(sim)
        self._settle()
        self._check_finished(cordons_kept=True)
        self._check_untargeted(held_kept=True)
        for sim in self.nodes.values():
            if sim.admin_cordon:
                sim.raw["spec"].pop("unschedulable", None)
                sim.admin_cordon = False
                self._changed(sim)
            elif sim.name not in self.targeted and sim.state is State.FAILED:
                # The admin has looked at the node the rollout failed and kept, and
                # uncordons it: that lets the rollout release it.
                sim.raw["spec"].pop("unschedulable", None)
                self._changed(sim)
        self._settle()
        self._check_finished(cordons_kept=False)
        self._check_untargeted(held_kept=False)

    def _check_untargeted(self, held_kept: bool) -> None:
        """A node no longer targeted carries nothing of the rollout: no cordon of its own,
        no gate, no key, no claim; except, until the admin uncordons it, one the rollout
        failed (it may be half-changed), which stays cordoned and claimed."""
        for name in sorted(set(self.nodes) - self.targeted):
            sim = self.nodes[name]
            meta = sim.raw["metadata"]
            annotations = meta["annotations"]
            if held_kept and sim.state is State.FAILED:
                assert sim.cordoned and annotations.get(KEYS.cordon) == "rollout", name
                assert annotations.get(HOLDER_ANNOTATION) == KEYS.holder_id, name
                continue
            assert sim.cordoned == sim.admin_cordon, f"{name}: left cordoned"
            assert annotations.get(HOLDER_ANNOTATION) is None, f"{name}: claim left behind"
            assert sim.state is None, f"{name}: left in {sim.state}"
            assert not meta["labels"].get(GATE), f"{name}: gate kept"
            kept = [k for k in KEYS.annotations() if k in annotations]
            assert not kept, f"{name}: keys left behind: {kept}"

    def _settle(self) -> None:
        # Each node needs about ten passes; more than that for every node is a stall.
        for _ in range(12 * len(self.nodes)):
            # Every swap turns out healthy, also one made for a target since replaced
            # (a pass that only waits on a verdict plans nothing, which ends this loop).
            for sim in self.nodes.values():
                if sim.version != OLD and isinstance(sim.verdict, Pending):
                    sim.verdict = Validated()
            if not self._pass():
                break
            self.now += 30

    def _check_finished(self, cordons_kept: bool) -> None:
        states = {s.name: s.state for s in self._targets()}
        halted = self.policy.halt_on_failure and State.FAILED in states.values()
        # Nodes an admin keeps cordoned still count against maxUnavailable, so they
        # may hold the others back; nothing else may.
        full = self._unavailable() >= self.policy.max_unavailable_nodes(len(self.targeted))
        for sim in self._targets():
            left_alone = sim.admin_cordon and not self.policy.upgrade_cordoned_nodes
            if sim.state is None:  # idle: it needed nothing (any more)
                assert sim.version == self.target, f"{sim.name}: never upgraded"
            elif sim.state is State.REQUIRED:
                assert halted or left_alone or (cordons_kept and full), (
                    f"{sim.name}: left waiting, not halted: {states}"
                )
            else:
                assert sim.state in (State.DONE, State.FAILED), states
        for sim in self._targets():
            if sim.state is State.DONE:
                assert sim.version == self.target, f"{sim.name}: done without the swap"
                assert sim.cordoned == sim.admin_cordon, f"{sim.name}: left cordoned"
            if sim.state is not State.FAILED:
                assert not sim.raw["metadata"]["labels"].get(GATE), f"{sim.name}: gate kept"


def _disrupted(sim: SimNode) -> bool:
    """Out of service: in flight, cordoned or NotReady."""
    return sim.state in IN_FLIGHT or sim.cordoned or not sim.ready


def _is_start(step: Step) -> bool:
    return step.before is State.REQUIRED and step.after is State.CORDONING


RolloutMachine.TestCase.settings = settings(
    max_examples=400,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_rollout_machine = pytest.mark.timeout(120)(RolloutMachine.TestCase)


# Two rollouts over the same nodes (a driver and a firmware policy, say), each run by
# two operator replicas that may plan from the same snapshot and race their writes.

ROLLOUTS = {
    "driver": RolloutKeys.for_policy("machine-driver"),
    "firmware": RolloutKeys.for_policy("machine-firmware"),
}
two_policies = st.builds(
    UpgradePolicy,
    max_parallel=st.integers(1, 3),
    max_unavailable=st.integers(1, 3),
    drain=st.sampled_from([{}, {"enable": True, "timeoutSeconds": 120}]),
)


@dataclass(frozen=True)
class Snapshot:
    """What one replica saw: the views of the nodes in its request, every raw node, and
    which nodes its request had."""

    views: list[NodeView]
    raw: list[dict[str, Any]]
    targeted: frozenset[str]


class SharedNodesMachine(RuleBasedStateMachine):
    """Safety, at every write: no node is ever in flight for both rollouts, a node in
    flight for one carries that rollout's claim, a swap happens only on a node in
    ``swapping`` for that rollout alone (a replica's stale snapshot never swaps), and
    no marker outlives the swap. Nodes leave and rejoin each rollout's request; the
    departures are planned from the same snapshots. Liveness: once passes run
    uninterrupted, both rollouts finish every node they cover and no claim or cordon is
    left, so a node one rollout let go is the other's to take; a node a rollout failed
    and kept (left during its change) is released once the admin uncordons it."""

    def __init__(self) -> None:
        super().__init__()
        self.raw: dict[str, dict[str, Any]] = {}
        self.versions: dict[tuple[str, str], str] = {}
        self.policies: dict[str, UpgradePolicy] = {}
        self.now = 1_000_000.0
        self.snapshots: dict[str, Snapshot] = {}
        """A replica's views, planned later: a second replica racing the first."""
        self.targeted: dict[str, set[str]] = {}
        """Each rollout's request: the nodes its policy covers, as it stands."""

    @initialize(driver=two_policies, firmware=two_policies, count=st.integers(2, 5))
    def fleet(self, driver: UpgradePolicy, firmware: UpgradePolicy, count: int) -> None:
        self.policies = {"driver": driver, "firmware": firmware}
        self.targeted = {r: {f"n{i}" for i in range(count)} for r in ROLLOUTS}
        for i in range(count):
            self.raw[f"n{i}"] = {
                "metadata": {
                    "name": f"n{i}",
                    "uid": f"u{i}",
                    "resourceVersion": "1",
                    "labels": {},
                    "annotations": {},
                },
                "spec": {},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
            }
            for rollout in ROLLOUTS:
                self.versions[(f"n{i}", rollout)] = OLD

    def _snapshot(self, rollout: str) -> Snapshot:
        targeted = frozenset(self.targeted[rollout])
        return Snapshot(self._views(rollout), copy.deepcopy(list(self.raw.values())), targeted)

    def _views(self, rollout: str) -> list[NodeView]:
        keys = ROLLOUTS[rollout]
        views = []
        for name, raw in self.raw.items():
            if name not in self.targeted[rollout]:
                continue
            state = raw["metadata"]["labels"].get(keys.state)
            views.append(
                node_view_from(
                    raw,
                    keys,
                    (),
                    skip_label=None,
                    needs_update=self.versions[(name, rollout)] != FIRST,
                    pods=() if state in {s.value for s in NEEDS_PODS} else None,
                    validation=Validated() if state == State.VALIDATING.value else None,
                )
            )
        return views

    def _pass(self, rollout: str, snapshot: Snapshot, kill_at: int | None = None) -> int:
        keys = ROLLOUTS[rollout]
        # As reconcile: the nodes the snapshot has out of the request depart first; from an
        # older snapshot than the cluster, their guarded patches are refused.
        gone = [d for d in departures(snapshot.raw, snapshot.targeted, keys, self.now) if d.body]
        for departure in gone:
            assert departure.body is not None
            raw = self.raw[departure.node]
            if _apply(raw, departure.body) is not None:
                self._check_shared(departure.node)
        views = snapshot.views
        p = plan(views, Context(self.policies[rollout], keys, FIRST, self.now))
        by_name = {v.name: v for v in views}
        ordered = [s for s in p.steps if not _is_start(s)] + [s for s in p.steps if _is_start(s)]
        for i, step in enumerate(ordered):
            if i == kill_at:
                break
            self._write(rollout, step, by_name[step.node])
        return len(p.steps) + len(gone)

    def _write(self, rollout: str, step: Step, view: NodeView) -> None:
        raw = self.raw[step.node]
        if step.patch is None:
            return

        def swap() -> bool:
            assert self._in_flight(step.node) == [rollout], f"{step.node}: swapped while shared"
            state = raw["metadata"]["labels"].get(ROLLOUTS[rollout].state)
            assert state == State.SWAPPING, f"{step.node}: {rollout} swapped in state {state}"
            self.versions[(step.node, rollout)] = FIRST
            return True

        # The product's own order: the swap only once its marker write, guarded by the
        # view's resourceVersion, has landed, so a stale snapshot swaps nothing.
        if not write_step(step, view.resource_version, lambda body: _apply(raw, body), swap):
            return  # refused by the resourceVersion precondition
        meta = raw["metadata"]
        if meta["labels"].get(ROLLOUTS[rollout].state) != State.SWAPPING.value:
            assert ROLLOUTS[rollout].swap not in meta["annotations"], f"{step.node}: marker kept"
        self._check_shared(step.node)

    def _check_shared(self, node: str) -> None:
        meta = self.raw[node]["metadata"]
        in_flight = self._in_flight(node)
        assert len(in_flight) <= 1, f"{node}: in flight for {in_flight}"
        holder = meta["annotations"].get(HOLDER_ANNOTATION)
        for name in in_flight:
            assert holder == ROLLOUTS[name].holder_id, f"{node}: {name} without its claim"

    def _in_flight(self, node: str) -> list[str]:
        node_labels = self.raw[node]["metadata"]["labels"]
        in_flight = {s.value for s in IN_FLIGHT}
        return [r for r, keys in ROLLOUTS.items() if node_labels.get(keys.state) in in_flight]

    @rule(
        rollout=st.sampled_from(sorted(ROLLOUTS)), kill_at=st.one_of(st.none(), st.integers(0, 4))
    )
    def operator_pass(self, rollout: str, kill_at: int | None) -> None:
        self._pass(rollout, self._snapshot(rollout), kill_at)

    @rule(rollout=st.sampled_from(sorted(ROLLOUTS)))
    def replica_observes(self, rollout: str) -> None:
        self.snapshots[rollout] = self._snapshot(rollout)

    @rule(rollout=st.sampled_from(sorted(ROLLOUTS)), data=st.data(), leaves=st.booleans())
    def request_changes(self, rollout: str, data: st.DataObject, leaves: bool) -> None:
        """A node leaves one rollout's request (its policy's selector shrinks, the node is
        relabelled) or comes back; the other rollout may then take it over."""
        node = data.draw(st.sampled_from(sorted(self.raw)), label="node")
        if leaves:
            self.targeted[rollout].discard(node)
        else:
            self.targeted[rollout].add(node)

    @precondition(lambda self: any(self._swapping(r) for r in ROLLOUTS))
    @rule(data=st.data())
    def replica_observes_a_swap(self, data: st.DataObject) -> None:
        """As ``replica_observes``, while a node is in ``swapping``: the snapshot that,
        planned from once the node has moved on, would call the swap hook again."""
        rollout = data.draw(st.sampled_from([r for r in sorted(ROLLOUTS) if self._swapping(r)]))
        self.snapshots[rollout] = self._snapshot(rollout)

    def _swapping(self, rollout: str) -> bool:
        key = ROLLOUTS[rollout].state
        return any(r["metadata"]["labels"].get(key) == State.SWAPPING for r in self.raw.values())

    @precondition(lambda self: bool(self.snapshots))
    @rule(data=st.data(), lagging=st.booleans())
    def replica_plans_from_its_older_snapshot(self, data: st.DataObject, lagging: bool) -> None:
        """A pass from the replica's snapshot; a lagging cache (or a replica that lost
        leadership and has not noticed) plans from the same old views again later."""
        rollout = data.draw(st.sampled_from(sorted(self.snapshots)))
        snapshot = self.snapshots[rollout] if lagging else self.snapshots.pop(rollout)
        self._pass(rollout, snapshot)

    @rule(seconds=st.sampled_from([5, 30, 400]))
    def time_passes(self, seconds: int) -> None:
        self.now += seconds

    def teardown(self) -> None:
        if not self.raw:
            return
        self._settle()
        self._check_settled()
        # The admin looks at each node a rollout failed and kept after it left that
        # rollout's request, and uncordons it: the rollout then releases it, and the other
        # rollout, if it covers the node, may take it.
        for name, raw in self.raw.items():
            labels = raw["metadata"]["labels"]
            if any(
                labels.get(keys.state) == State.FAILED.value and name not in self.targeted[r]
                for r, keys in ROLLOUTS.items()
            ):
                raw["spec"].pop("unschedulable", None)
                meta = raw["metadata"]
                meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        self._settle()
        self._check_settled()

    def _settle(self) -> None:
        for _ in range(30 * len(self.raw)):
            moved = sum(self._pass(r, self._snapshot(r)) for r in ROLLOUTS)
            if not moved:
                break
            self.now += 30

    def _check_settled(self) -> None:
        failed_value = State.FAILED.value
        halted = {
            r
            for r, keys in ROLLOUTS.items()
            if self.policies[r].halt_on_failure
            and any(
                raw["metadata"]["labels"].get(keys.state) == failed_value
                for name, raw in self.raw.items()
                if name in self.targeted[r]
            )
        }
        for name, raw in self.raw.items():
            meta = raw["metadata"]
            states = {r: meta["labels"].get(k.state) for r, k in ROLLOUTS.items()}
            failed = [r for r, state in states.items() if state == State.FAILED.value]
            if failed:
                # Timed out while passes stopped (or left its request during the change):
                # the node stays cordoned and claimed by the rollout that failed it, so the
                # other one never starts it.
                assert len(failed) == 1, states
                assert meta["annotations"].get(HOLDER_ANNOTATION) == ROLLOUTS[failed[0]].holder_id
                assert raw["spec"].get("unschedulable"), f"{name}: failed, not cordoned"
                assert not self._in_flight(name), states
                continue
            for rollout in ROLLOUTS:
                if name not in self.targeted[rollout]:
                    assert states[rollout] is None, f"{name}: left in {rollout} {states}"
                    continue
                if rollout in halted and states[rollout] == State.REQUIRED.value:
                    continue  # halted by its failure elsewhere, as haltOnFailure says
                assert self.versions[(name, rollout)] == FIRST, f"{name}: {rollout} never ran"
                assert states[rollout] in (None, State.DONE.value), states
            assert HOLDER_ANNOTATION not in meta["annotations"], f"{name}: claim left behind"
            assert not raw["spec"].get("unschedulable"), f"{name}: left cordoned"


SharedNodesMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_shared_nodes_machine = pytest.mark.timeout(120)(SharedNodesMachine.TestCase)
