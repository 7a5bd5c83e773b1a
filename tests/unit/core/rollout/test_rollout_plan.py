"""Every transition of the rollout planner, by example."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kmodkit.core.contract.hooks import Failed, Pending, Validated
from kmodkit.core.contract.policy import UpgradePolicy
from kmodkit.core.rollout.keys import HOLDER_ANNOTATION, RolloutKeys
from kmodkit.core.rollout.observed import NodeRecord, NodeView, PodView
from kmodkit.core.rollout.plan import Context, NodePatch, Plan, Step, plan
from kmodkit.core.rollout.states import State
from kmodkit.core.rollout.status import summarize

KEYS = RolloutKeys.for_policy("ttdp.default")
NOW = 1_000_000.0
TARGET = "2.8.0"


def node(name: str = "n1", state: State | None = None, **kw: Any) -> NodeView:
    kw.setdefault("needs_update", True)
    return NodeView(name=name, state=state, **kw)


def record(**kw: Any) -> NodeRecord:
    kw.setdefault("since", NOW)
    kw.setdefault("target", TARGET)
    return NodeRecord(**kw)


def pod(name: str, **kw: Any) -> PodView:
    return PodView(namespace="work", name=name, **kw)


def ctx(policy: UpgradePolicy | None = None, *, now: float = NOW, **kw: Any) -> Context:
    return Context(policy or UpgradePolicy(), KEYS, TARGET, now, **kw)


def run(views: list[NodeView], policy: UpgradePolicy | None = None, **kw: Any) -> Plan:
    return plan(views, ctx(policy, **kw))


def only_step(views: list[NodeView], policy: UpgradePolicy | None = None, **kw: Any) -> Step:
    steps = run(views, policy, **kw).steps
    assert len(steps) == 1, steps
    return steps[0]


def later(view: NodeView, seconds: float) -> NodeView:
    """The same node, with its current state entered ``seconds`` before NOW."""
    return replace(view, record=replace(view.record, since=NOW - seconds))


def reported(views: list[NodeView], policy: UpgradePolicy | None = None) -> dict[str, Any]:
    """What the status says of each node after the pass (the planned steps applied)."""
    p = run(views, policy)
    return {n.name: (n.state, n.reason, n.message) for n in summarize(views, p, p.steps).nodes}


def starts(views: list[NodeView], policy: UpgradePolicy | None = None) -> list[str]:
    return [s.node for s in run(views, policy).steps if s.after is State.CORDONING]


def labels_of(step: Step) -> dict[str, str | None]:
    assert step.patch is not None
    return dict(step.patch.labels)


def annotations_of(step: Step) -> dict[str, str | None]:
    assert step.patch is not None
    return dict(step.patch.annotations)


# Idle and required.


def test_an_up_to_date_node_with_no_state_costs_nothing() -> None:
    assert run([node(needs_update=False)]).steps == ()


def test_a_done_node_that_stays_up_to_date_costs_nothing() -> None:
    assert run([node(state=State.DONE, needs_update=False, record=record())]).steps == ()


def test_a_node_that_needs_the_change_is_marked_required() -> None:
    step = only_step([node()])
    assert (step.before, step.after) == (None, State.REQUIRED)
    assert labels_of(step)[KEYS.state] == "required"
    assert annotations_of(step)[KEYS.since] == str(int(NOW))


def test_a_done_node_whose_target_moves_on_is_required_again() -> None:
    step = only_step([node(state=State.DONE, record=record())])
    assert step.after is State.REQUIRED


def test_a_required_node_no_longer_needing_the_change_goes_back_to_idle() -> None:
    step = only_step([node(state=State.REQUIRED, needs_update=False)])
    assert step.after is None
    assert labels_of(step)[KEYS.state] is None


def test_starting_claims_a_slot_and_records_target_and_attempt() -> None:
    step = only_step([node(state=State.REQUIRED)])
    assert (step.before, step.after) == (State.REQUIRED, State.CORDONING)
    ann = annotations_of(step)
    assert ann[KEYS.target] == TARGET
    assert ann[KEYS.attempt] == "1"
    assert step.patch is not None and step.patch.unschedulable is None


def test_a_retry_of_the_same_target_counts_the_attempt() -> None:
    view = node(state=State.REQUIRED, record=record(attempt=2))
    assert annotations_of(only_step([view]))[KEYS.attempt] == "3"


# Budgets.


def _required(n: int, **kw: Any) -> list[NodeView]:
    return [node(f"n{i:02}", State.REQUIRED, **kw) for i in range(n)]


def test_max_parallel_bounds_how_many_nodes_start() -> None:
    steps = run(_required(5), UpgradePolicy(max_parallel=2, max_unavailable=10)).steps
    assert [s.node for s in steps] == ["n00", "n01"]


def test_nodes_in_flight_use_up_max_parallel() -> None:
    views = [node("busy", State.EVICTING, unschedulable=True, pods=None), *_required(3)]
    steps = run(views, UpgradePolicy(max_parallel=2, max_unavailable=10)).steps
    assert [s.node for s in steps if s.after is State.CORDONING] == ["n00"]


def test_nodes_cordoned_or_not_ready_outside_the_rollout_use_up_max_unavailable() -> None:
    views = [
        node("down", ready=False, needs_update=False),
        node("admin", unschedulable=True, needs_update=False),
        *_required(3),
    ]
    steps = run(views, UpgradePolicy(max_parallel=5, max_unavailable=3)).steps
    assert [s.node for s in steps] == ["n00"]


def test_nodes_the_rollout_is_through_with_hold_no_unavailability() -> None:
    # Upgraded and left cordoned by its admin; failed and kept cordoned (no halt).
    views = [
        node("admin", State.DONE, unschedulable=True, needs_update=False),
        node("broken", State.FAILED, unschedulable=True, record=record()),
        *_required(2),
    ]
    policy = UpgradePolicy(max_parallel=5, max_unavailable=1, halt_on_failure=False)
    assert [s.node for s in run(views, policy).steps] == ["n00"]


def test_a_finished_node_taken_back_this_pass_counts_again() -> None:
    # Failed for an earlier target, kept cordoned: this pass retries it, so it is
    # unavailable and in the rollout again, and no available node may start beside it.
    retried = node("broken", State.FAILED, unschedulable=True, record=record(target="2.7.0"))
    upgraded = node("admin", State.DONE, unschedulable=True)  # the target moved on
    policy = UpgradePolicy(max_parallel=5, max_unavailable=2, halt_on_failure=False)
    steps = run([retried, upgraded, *_required(1)], policy).steps
    assert [(s.node, s.after) for s in steps] == [
        ("broken", State.REQUIRED),
        ("admin", State.REQUIRED),
    ]


def test_a_percentage_budget_rounds_up() -> None:
    steps = run(_required(10), UpgradePolicy(max_parallel=10, max_unavailable="25%")).steps
    assert len(steps) == 3


# Order: healthy nodes first, nodes already out of service after them.


def _retried(name: str, **kw: Any) -> NodeView:
    """Failed for an earlier target, still cordoned by the rollout, waiting to start again."""
    kw.setdefault("unschedulable", True)
    return node(name, State.REQUIRED, record=record(target="2.7.0", cordon="rollout"), **kw)


def test_healthy_nodes_start_before_nodes_already_out_of_service() -> None:
    # A node still cordoned after a failure is the likeliest to fail again: it goes
    # after the healthy ones, whatever its name.
    views = [_retried("aa-retried"), *_required(2)]
    assert starts(views, UpgradePolicy(max_parallel=1, max_unavailable=3)) == ["n00"]


def test_a_node_already_out_of_service_still_starts_beside_them_at_no_cost() -> None:
    views = [_retried("aa-retried"), *_required(2)]
    # The retried node already holds one of the two units of unavailability, so
    # only one healthy node fits; the retried node takes the spare parallel slot.
    assert starts(views, UpgradePolicy(max_parallel=3, max_unavailable=2)) == [
        "n00",
        "aa-retried",
    ]


# Nodes that are down: not started, reported, started once they are back.


def test_a_node_that_is_down_is_not_started_and_the_status_says_why() -> None:
    views = [node("aa-down", State.REQUIRED, ready=False), *_required(2)]
    policy = UpgradePolicy(max_parallel=1, max_unavailable=3)
    assert starts(views, policy) == ["n00"]
    state, reason, message = reported(views, policy)["aa-down"]
    assert (state, reason) == ("required", "NodeNotReady")
    assert "not Ready" in message and "once it is Ready" in message


def test_a_down_node_is_never_started_even_with_room_to_spare() -> None:
    views = [node("down", State.REQUIRED, ready=False), _retried("retried-down", ready=False)]
    assert starts(views, UpgradePolicy(max_parallel=5, max_unavailable=5)) == []


def test_a_node_that_is_back_is_started() -> None:
    assert starts([node("back", State.REQUIRED, ready=True)]) == ["back"]


def test_a_node_that_goes_down_before_the_rollout_cordons_it_backs_out() -> None:
    step = only_step([node(state=State.CORDONING, ready=False, record=record())])
    assert (step.after, step.reason) == (State.REQUIRED, "NodeNotReady")
    assert step.patch is not None and step.patch.unschedulable is None
    assert KEYS.cordon not in annotations_of(step)


# A failed node stops others only through haltOnFailure.


def test_without_halt_on_failure_failed_nodes_hold_up_no_one() -> None:
    views = [
        # Failed for this target, and down: through with, it counts nowhere.
        node("aa-failed", State.FAILED, ready=False, unschedulable=True, record=record()),
        # Failed for an earlier target and down: retried, but not started while down.
        _retried("ab-retried", ready=False),
        *_required(1),
    ]
    policy = UpgradePolicy(max_parallel=1, max_unavailable=2, halt_on_failure=False)
    p = run(views, policy)
    assert not p.halted
    assert [s.node for s in p.steps if s.after is State.CORDONING] == ["n00"]
    halting = UpgradePolicy(max_parallel=1, max_unavailable=2, halt_on_failure=True)
    assert run(views, halting).halted and starts(views, halting) == []
    assert reported(views, halting)["n00"][1] == "RolloutHalted"


# An admin's cordon: left alone unless the policy opts in.


def test_a_node_cordoned_by_someone_else_is_left_alone_and_reported() -> None:
    views = [node("aa-admin", State.REQUIRED, unschedulable=True), *_required(2)]
    policy = UpgradePolicy(max_parallel=5, max_unavailable=5)
    assert starts(views, policy) == ["n00", "n01"]
    state, reason, message = reported(views, policy)["aa-admin"]
    assert (state, reason) == ("required", "ExternalCordon")
    assert "uncordon" in message and "upgradeCordonedNodes" in message


def test_a_node_the_rollout_cordoned_itself_is_not_an_external_cordon() -> None:
    assert starts([_retried("retried")]) == ["retried"]


def test_an_admins_cordon_that_lands_before_the_rollouts_own_backs_the_node_out() -> None:
    step = only_step([node(state=State.CORDONING, unschedulable=True, record=record())])
    assert (step.after, step.reason) == (State.REQUIRED, "ExternalCordon")
    assert step.patch is not None and step.patch.unschedulable is None
    assert KEYS.cordon not in annotations_of(step)


def opted_in() -> UpgradePolicy:
    return UpgradePolicy(max_parallel=5, max_unavailable=5, upgrade_cordoned_nodes=True)


def test_opted_in_a_cordoned_node_is_upgraded_after_the_healthy_ones() -> None:
    views = [node("aa-admin", State.REQUIRED, unschedulable=True), *_required(2)]
    assert starts(views, opted_in()) == ["n00", "n01", "aa-admin"]
    assert reported(views, opted_in())["aa-admin"][:2] == ("cordoning", "")


def test_paused_starts_nothing_but_in_flight_nodes_go_on() -> None:
    views = [*_required(2), node("busy", State.CORDONING)]
    steps = run(views, UpgradePolicy(max_parallel=5, max_unavailable=5), paused=True).steps
    assert [(s.node, s.after) for s in steps] == [("busy", State.EVICTING)]


def test_a_failed_node_halts_new_starts_under_halt_on_failure() -> None:
    views = [*_required(2), node("broken", State.FAILED, record=record())]
    plan_ = run(views, UpgradePolicy(max_parallel=5, max_unavailable=5))
    assert plan_.halted and plan_.steps == ()


def test_without_halt_on_failure_other_nodes_carry_on() -> None:
    views = [*_required(2), node("broken", State.FAILED, unschedulable=True, record=record())]
    policy = UpgradePolicy(max_parallel=5, max_unavailable=5, halt_on_failure=False)
    assert len(run(views, policy).steps) == 2


def test_a_skipped_node_is_left_alone_whatever_its_state() -> None:
    for state in (None, State.REQUIRED, State.EVICTING, State.VALIDATING, State.UNCORDONING):
        assert run([node(state=state, skipped=True, pods=())]).steps == ()


def test_a_skipped_failed_node_does_not_halt_the_rollout() -> None:
    views = [node("a", State.REQUIRED), node("b", State.FAILED, skipped=True, record=record())]
    assert [s.node for s in run(views).steps] == ["a"]


# Cordon.


def test_cordoning_cordons_and_records_that_the_rollout_did_it() -> None:
    step = only_step([node(state=State.CORDONING, record=record())])
    assert step.after is State.EVICTING
    assert step.patch is not None and step.patch.unschedulable is True
    assert annotations_of(step)[KEYS.cordon] == "rollout"


def test_opted_in_an_admins_cordon_is_recorded_as_external_and_not_taken_over() -> None:
    view = node(state=State.CORDONING, unschedulable=True, record=record())
    step = only_step([view], opted_in())
    assert step.after is State.EVICTING
    assert annotations_of(step)[KEYS.cordon] == "external"
    assert step.reason == "ExternalCordon"
    assert step.patch is not None and step.patch.unschedulable is None


def test_a_retry_keeps_the_cordon_it_made_in_an_earlier_attempt() -> None:
    view = node(state=State.CORDONING, unschedulable=True, record=record(cordon="rollout"))
    assert annotations_of(only_step([view]))[KEYS.cordon] == "rollout"


UNCORDONED = UpgradePolicy(cordon=False, device_eviction={"enable": False})


def test_without_cordon_and_device_eviction_a_node_goes_straight_to_the_swap() -> None:
    step = only_step([node(state=State.CORDONING, record=record())], UNCORDONED)
    assert step.after is State.SWAPPING
    assert step.patch is not None and step.patch.unschedulable is None
    assert KEYS.cordon not in annotations_of(step)


def test_without_cordon_an_admins_cordon_is_still_recorded_and_kept() -> None:
    policy = UNCORDONED.model_copy(update={"upgrade_cordoned_nodes": True})
    view = node(state=State.CORDONING, unschedulable=True, record=record())
    step = only_step([view], policy)
    assert annotations_of(step)[KEYS.cordon] == "external"
    assert step.patch is not None and step.patch.unschedulable is None


def test_a_node_evicting_when_device_eviction_is_switched_off_moves_on_unlisted() -> None:
    step = only_step([node(state=State.EVICTING, record=record())], UNCORDONED)
    assert step.after is State.SWAPPING and step.evict == ()


# Deploy gates.

GATED = UpgradePolicy(deploy_gates={"tenstorrent.com/deploy.tt-telemetry": "false"})
GATE = "tenstorrent.com/deploy.tt-telemetry"


def test_cordoning_leads_to_gating_when_gates_are_configured() -> None:
    assert only_step([node(state=State.CORDONING)], GATED).after is State.GATING


def test_gating_sets_the_gates_and_saves_the_previous_values() -> None:
    view = node(
        state=State.GATING,
        unschedulable=True,
        gate_values={GATE: "true"},
        record=record(cordon="rollout"),
    )
    step = only_step([view], GATED)
    assert step.after is State.EVICTING
    assert labels_of(step)[GATE] == "false"
    assert annotations_of(step)[KEYS.gates] == '{"tenstorrent.com/deploy.tt-telemetry":"true"}'


def test_a_retry_keeps_the_values_saved_before_the_first_attempt() -> None:
    view = node(
        state=State.GATING,
        unschedulable=True,
        gate_values={GATE: "false"},
        record=record(cordon="rollout", gates={GATE: None}),
    )
    step = only_step([view], GATED)
    assert annotations_of(step)[KEYS.gates] == '{"tenstorrent.com/deploy.tt-telemetry":null}'


# Waiting for jobs.

WAITING = UpgradePolicy(wait_for_completion={"podSelector": "job=train", "timeoutSeconds": 60})


def test_waiting_for_jobs_holds_while_a_selected_pod_runs() -> None:
    view = node(state=State.WAITING_FOR_JOBS, record=record(), pods=(pod("train"),))
    assert run([view], WAITING).steps == ()


def test_waiting_for_jobs_goes_on_once_they_finish() -> None:
    view = node(
        state=State.WAITING_FOR_JOBS, record=record(), pods=(pod("train", phase="Succeeded"),)
    )
    assert only_step([view], WAITING).after is State.EVICTING


def test_waiting_for_jobs_times_out_into_evicting_not_failure() -> None:
    view = later(node(state=State.WAITING_FOR_JOBS, record=record(), pods=(pod("train"),)), 61)
    step = only_step([view], WAITING)
    assert (step.after, step.reason) == (State.EVICTING, "WaitTimeout")
    assert "work/train" in step.message


# Drain pass 1: device consumers.


def test_evicting_evicts_device_consumers_only() -> None:
    pods = (pod("gpu", device_consumer=True), pod("web"))
    step = only_step([node(state=State.EVICTING, record=record(), pods=pods)])
    assert step.patch is None
    assert [p.name for p in step.evict] == ["gpu"]


def test_evicting_moves_on_when_no_device_consumer_is_left() -> None:
    pods = (pod("web"), pod("done", device_consumer=True, phase="Succeeded"))
    step = only_step([node(state=State.EVICTING, record=record(), pods=pods)])
    assert step.after is State.SWAPPING


def test_evicting_leads_to_draining_when_the_full_drain_is_on() -> None:
    policy = UpgradePolicy(drain={"enable": True})
    assert only_step([node(state=State.EVICTING, record=record(), pods=())], policy).after is (
        State.DRAINING
    )


def test_evicting_waits_for_terminating_and_gated_daemonset_consumers() -> None:
    pods = (
        pod("going", device_consumer=True, terminating=True),
        pod("telemetry", device_consumer=True, daemonset=True),
    )
    assert run([node(state=State.EVICTING, record=record(), pods=pods)]).steps == ()


def test_a_bare_device_consumer_is_evicted_only_with_force() -> None:
    pods = (pod("bare", device_consumer=True, bare=True),)
    view = node(state=State.EVICTING, record=record(), pods=pods)
    assert run([view]).steps == ()
    forced = UpgradePolicy(device_eviction={"force": True})
    assert [p.name for p in only_step([view], forced).evict] == ["bare"]


def test_a_refused_eviction_past_the_timeout_fails_with_eviction_blocked() -> None:
    view = later(
        node(state=State.EVICTING, record=record(), pods=(pod("db-0", device_consumer=True),)), 301
    )
    step = only_step([view])
    assert (step.after, step.reason) == (State.FAILED, "EvictionBlocked")
    assert "work/db-0" in step.message
    assert step.evict == ()


def test_pods_that_cannot_be_evicted_past_the_timeout_fail_with_drain_timeout() -> None:
    pods = (
        pod("stuck", device_consumer=True, terminating=True),
        pod("bare", device_consumer=True, bare=True),
    )
    step = only_step([later(node(state=State.EVICTING, record=record(), pods=pods), 301)])
    assert (step.after, step.reason) == (State.FAILED, "DrainTimeout")
    assert "work/stuck (terminating)" in step.message
    assert "work/bare (no controller; set force to evict it)" in step.message


def test_an_unlisted_node_waits_for_the_next_pass() -> None:
    assert run([later(node(state=State.EVICTING, record=record(), pods=None), 999)]).steps == ()


def test_a_failure_message_names_a_bounded_number_of_pods() -> None:
    pods = tuple(pod(f"p{i:02}", device_consumer=True) for i in range(25))
    step = only_step([later(node(state=State.EVICTING, record=record(), pods=pods), 301)])
    assert "work/p09" in step.message and "work/p10" not in step.message
    assert step.message.endswith("and 15 more")


# Drain pass 2: kubectl drain semantics.

DRAIN = UpgradePolicy(drain={"enable": True, "timeoutSeconds": 30})


def test_draining_spares_the_namespaces_the_policy_names() -> None:
    policy = UpgradePolicy(drain={"enable": True, "sparedNamespaces": ["ops"]})
    pods = (pod("web"), PodView(namespace="ops", name="flash"))
    step = only_step([node(state=State.DRAINING, record=record(), pods=pods)], policy)
    assert [p.ref for p in step.evict] == ["work/web"]


def test_draining_moves_on_with_only_spared_pods_left() -> None:
    policy = UpgradePolicy(drain={"enable": True, "sparedNamespaces": ["ops"]})
    pods = (PodView(namespace="ops", name="operator"),)
    step = only_step([node(state=State.DRAINING, record=record(), pods=pods)], policy)
    assert step.after is State.SWAPPING


def test_draining_skips_daemonset_mirror_bare_and_emptydir_pods_by_default() -> None:
    pods = (
        pod("web"),
        pod("ds", daemonset=True),
        pod("static", mirror=True),
        pod("bare", bare=True),
        pod("cache", empty_dir=True),
        pod("old", phase="Failed"),
    )
    step = only_step([node(state=State.DRAINING, record=record(), pods=pods)], DRAIN)
    assert [p.name for p in step.evict] == ["web"]


def test_force_and_delete_empty_dir_widen_the_drain() -> None:
    policy = UpgradePolicy(drain={"enable": True, "force": True, "deleteEmptyDir": True})
    pods = (pod("bare", bare=True), pod("cache", empty_dir=True), pod("ds", daemonset=True))
    step = only_step([node(state=State.DRAINING, record=record(), pods=pods)], policy)
    assert sorted(p.name for p in step.evict) == ["bare", "cache"]


def test_draining_moves_on_to_the_swap_when_nothing_selected_is_left() -> None:
    pods = (pod("ds", daemonset=True), pod("bare", bare=True))
    step = only_step([node(state=State.DRAINING, record=record(), pods=pods)], DRAIN)
    assert step.after is State.SWAPPING


def test_a_slow_drain_fails_with_drain_timeout() -> None:
    view = later(
        node(state=State.DRAINING, record=record(), pods=(pod("web", terminating=True),)), 31
    )
    step = only_step([view], DRAIN)
    assert (step.after, step.reason) == (State.FAILED, "DrainTimeout")


# Swap and validation.


def test_swapping_calls_the_backend_then_validates() -> None:
    step = only_step([node(state=State.SWAPPING, record=record())])
    assert step.swap and step.after is State.VALIDATING


def test_a_swap_is_preceded_by_a_marker_write_naming_the_target() -> None:
    step = only_step([node(state=State.SWAPPING, record=record())])
    assert step.swap_marker == NodePatch(annotations={KEYS.swap: TARGET})
    # The state write that follows the swap removes the marker again.
    assert annotations_of(step)[KEYS.swap] is None


def test_a_swap_that_cannot_start_in_time_fails() -> None:
    step = only_step([later(node(state=State.SWAPPING, record=record(swap=TARGET)), 601)])
    assert (step.after, step.reason, step.swap) == (State.FAILED, "SwapFailed", False)
    assert annotations_of(step)[KEYS.swap] is None


def test_no_move_before_the_swap_carries_the_marker() -> None:
    draining = node(state=State.DRAINING, record=record(), pods=())
    step = only_step([draining], UpgradePolicy(drain={"enable": True}))
    assert step.after is State.SWAPPING and not step.swap
    assert KEYS.swap not in annotations_of(step)


def test_a_marker_left_on_an_idle_node_is_removed() -> None:
    # An admin cleared the state label mid-swap, on a node the rollout neither
    # cordoned nor gated: nothing else is left to undo.
    view = node(needs_update=False, record=record(swap=TARGET))
    assert annotations_of(only_step([view]))[KEYS.swap] is None


def test_a_swapped_node_is_not_backed_out_even_if_it_no_longer_needs_the_change() -> None:
    view = node(state=State.SWAPPING, needs_update=False, record=record())
    assert only_step([view]).after is State.VALIDATING


def test_validated_moves_to_uncordoning() -> None:
    view = node(state=State.VALIDATING, needs_update=False, validation=Validated(), record=record())
    assert only_step([view]).after is State.UNCORDONING


def test_what_the_backend_records_rides_on_the_move_out_of_validating() -> None:
    """One patch, guarded like every move: written by the hook beside it, the record made
    the move stale; and the move's own keys are not the backend's to write."""
    verdict = Validated(
        labels={"fw.example.com/version": "19.9.0", KEYS.state: "done"},
        annotations={"fw.example.com/job": "flash-n1", KEYS.reason: "Mine"},
    )
    view = node(state=State.VALIDATING, needs_update=False, validation=verdict, record=record())
    step = only_step([view])
    assert step.after is State.UNCORDONING
    assert labels_of(step) == {"fw.example.com/version": "19.9.0", KEYS.state: "uncordoning"}
    assert annotations_of(step)["fw.example.com/job"] == "flash-n1"
    assert annotations_of(step)[KEYS.reason] is None


def test_pending_validation_waits_then_times_out() -> None:
    view = node(state=State.VALIDATING, validation=Pending("module loading"), record=record())
    assert run([view]).steps == ()
    step = only_step([later(view, 600)])
    assert (step.after, step.reason) == (State.FAILED, "ValidationTimeout")
    assert "module loading" in step.message


def test_a_failed_validation_fails_with_the_backends_reason() -> None:
    view = node(
        state=State.VALIDATING,
        validation=Failed("BuilderCrashLoop", "rmmod failed"),
        record=record(),
    )
    step = only_step([view])
    assert (step.after, step.reason, step.message) == (
        State.FAILED,
        "BuilderCrashLoop",
        "rmmod failed",
    )


# Uncordon and done.


def test_uncordoning_lifts_the_rollouts_cordon_and_restores_gates() -> None:
    view = node(
        state=State.UNCORDONING,
        unschedulable=True,
        needs_update=False,
        record=record(cordon="rollout", gates={GATE: "true", "other/gate": None}),
    )
    step = only_step([view], GATED)
    assert step.after is State.DONE
    assert step.patch is not None and step.patch.unschedulable is False
    labels = labels_of(step)
    assert labels[GATE] == "true" and labels["other/gate"] is None
    ann = annotations_of(step)
    assert ann[KEYS.cordon] is None and ann[KEYS.gates] is None


def test_a_cordon_the_node_was_upgraded_under_stays_and_is_reported() -> None:
    view = node(
        state=State.UNCORDONING,
        unschedulable=True,
        needs_update=False,
        record=record(cordon="external"),
    )
    step = only_step([view])
    assert step.patch is not None and step.patch.unschedulable is None
    assert step.reason == "ExternalCordon"


# Failure and retry.


def test_a_failed_node_stays_failed_and_cordoned() -> None:
    view = node(state=State.FAILED, unschedulable=True, record=record(cordon="rollout"))
    assert run([view], UpgradePolicy(halt_on_failure=False)).steps == ()


def test_a_failed_node_is_retried_when_the_target_changes() -> None:
    view = node(state=State.FAILED, record=record(target="2.7.0", cordon="rollout"))
    step = only_step([view])
    assert (step.after, step.reason) == (State.REQUIRED, "TargetChanged")


def test_clearing_a_failed_nodes_state_retries_it() -> None:
    view = node(state=None, unschedulable=True, record=record(cordon="rollout"))
    assert only_step([view]).after is State.REQUIRED


def test_clearing_the_state_of_a_node_fixed_by_hand_undoes_the_rollouts_changes() -> None:
    view = node(
        state=None,
        needs_update=False,
        unschedulable=True,
        record=record(cordon="rollout", gates={GATE: "true"}),
    )
    step = only_step([view])
    assert step.after is State.DONE
    assert step.patch is not None and step.patch.unschedulable is False
    assert labels_of(step)[GATE] == "true"


def test_a_node_no_longer_needing_the_change_before_the_swap_backs_out() -> None:
    for state in (State.CORDONING, State.GATING, State.EVICTING, State.DRAINING):
        view = node(
            state=state,
            needs_update=False,
            unschedulable=True,
            pods=(),
            record=record(cordon="rollout"),
        )
        step = only_step([view], GATED)
        assert (step.after, step.reason) == (State.UNCORDONING, "NoLongerNeeded")


def test_an_unknown_state_value_counts_as_cleared() -> None:
    from kmodkit.core.rollout.states import parse_state

    assert parse_state("upgrading") is None


def test_a_node_whose_step_the_policy_dropped_mid_rollout_moves_on() -> None:
    view = node(state=State.GATING, unschedulable=True, record=record(cordon="rollout"))
    assert only_step([view]).after is State.EVICTING
    waiting = node(state=State.WAITING_FOR_JOBS, record=record(), pods=None)
    assert only_step([waiting]).after is State.EVICTING
    draining = node(state=State.DRAINING, record=record(), pods=None)
    assert only_step([draining]).after is State.SWAPPING


def test_a_state_set_by_hand_without_a_timer_gets_one_so_its_timeout_can_fire() -> None:
    view = node(
        state=State.EVICTING, record=record(since=None), pods=(pod("x", device_consumer=True),)
    )
    step = only_step([view])
    assert step.after is State.EVICTING
    assert annotations_of(step)[KEYS.since] == str(int(NOW))


# One rollout per node: the holder claim.

OTHER = "ttfw.fw"


def test_starting_a_node_claims_it_in_the_same_patch() -> None:
    step = only_step([node(state=State.REQUIRED)])
    assert step.after is State.CORDONING
    assert step.patch is not None
    assert step.patch.annotations[HOLDER_ANNOTATION] == KEYS.holder_id


def test_a_node_held_by_another_rollout_is_not_started_and_is_reported_busy() -> None:
    busy = node("busy", State.REQUIRED, holder=OTHER, unschedulable=True)
    p = run([busy, node("free", State.REQUIRED)], UpgradePolicy(upgrade_cordoned_nodes=True))
    assert [(s.node, s.after) for s in p.steps] == [("free", State.CORDONING)]
    assert p.held["busy"].reason == "NodeBusy"
    assert OTHER in p.held["busy"].message
    assert reported([busy], UpgradePolicy())["busy"][1] == "NodeBusy"


def test_a_node_held_by_another_rollout_does_not_use_up_this_ones_budget() -> None:
    busy = node("busy", State.REQUIRED, holder=OTHER, unschedulable=True)
    p = run([busy, node("free", State.REQUIRED)], UpgradePolicy(max_unavailable=1))
    assert p.budget.unavailable == 0
    assert [(s.node, s.after) for s in p.steps] == [("free", State.CORDONING)]


def test_a_node_claimed_between_start_and_cordon_backs_out_without_touching_the_claim() -> None:
    step = only_step([node(state=State.CORDONING, record=record(), holder=OTHER)])
    assert step.after is State.REQUIRED
    assert step.reason == "NodeBusy"
    assert step.patch is not None
    assert HOLDER_ANNOTATION not in step.patch.annotations


def test_finishing_a_node_releases_the_claim_in_the_same_patch() -> None:
    view = node(
        state=State.UNCORDONING,
        record=record(cordon="rollout"),
        unschedulable=True,
        holder=KEYS.holder_id,
    )
    step = only_step([view])
    assert step.after is State.DONE
    assert step.patch is not None
    assert step.patch.annotations[HOLDER_ANNOTATION] is None
    assert step.patch.unschedulable is False


def test_a_failed_node_keeps_its_claim_while_the_rollouts_cordon_stays() -> None:
    view = later(
        node(
            state=State.VALIDATING,
            record=record(cordon="rollout"),
            unschedulable=True,
            holder=KEYS.holder_id,
        ),
        10_000,
    )
    step = only_step([view], UpgradePolicy(halt_on_failure=False))
    assert step.after is State.FAILED
    assert step.patch is not None
    assert HOLDER_ANNOTATION not in step.patch.annotations
    failed = replace(view, state=State.FAILED)
    assert run([failed], UpgradePolicy(halt_on_failure=False)).steps == ()


def test_a_failed_node_an_admin_uncordoned_is_released_with_its_failure_kept() -> None:
    view = node(
        state=State.FAILED,
        record=record(cordon="rollout", reason="ValidationTimeout", message="not healthy"),
        unschedulable=False,
        holder=KEYS.holder_id,
    )
    step = only_step([view])
    assert (step.before, step.after) == (State.FAILED, State.FAILED)
    assert step.patch == NodePatch(annotations={HOLDER_ANNOTATION: None})
    assert (step.reason, step.message) == ("ValidationTimeout", "not healthy")


def test_a_failed_node_without_the_rollouts_cordon_releases_the_claim_as_it_fails() -> None:
    view = later(
        node(state=State.VALIDATING, record=record(), holder=KEYS.holder_id),
        10_000,
    )
    step = only_step([view], UpgradePolicy(cordon=False))
    assert step.after is State.FAILED
    assert step.patch is not None
    assert step.patch.annotations[HOLDER_ANNOTATION] is None


def test_another_rollouts_claim_is_never_released_by_this_one() -> None:
    view = node(state=State.DONE, needs_update=False, holder=OTHER)
    assert run([view]).steps == ()
