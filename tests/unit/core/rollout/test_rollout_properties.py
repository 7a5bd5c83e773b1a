"""Properties of the rollout planner over arbitrary cluster states and policies."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kmodkit.core.contract.hooks import Failed, Pending, Validated
from kmodkit.core.contract.policy import UpgradePolicy
from kmodkit.core.rollout.keys import RolloutKeys
from kmodkit.core.rollout.observed import NodeRecord, NodeView, PodView
from kmodkit.core.rollout.plan import Context, Plan, Step, plan
from kmodkit.core.rollout.states import IN_FLIGHT, State

KEYS = RolloutKeys.for_policy("prop")
NOW = 1_000_000.0
TARGETS = ("v2", "v1")

policies = st.builds(
    UpgradePolicy,
    max_parallel=st.integers(1, 6),
    max_unavailable=st.one_of(st.integers(1, 8), st.sampled_from(["10%", "25%", "50%", "100%"])),
    halt_on_failure=st.booleans(),
    upgrade_cordoned_nodes=st.booleans(),
    cordon=st.booleans(),
    device_eviction=st.sampled_from([{}, {"enable": False}]),
    deploy_gates=st.sampled_from([{}, {"example.com/deploy.telemetry": "false"}]),
    wait_for_completion=st.sampled_from([None, {"podSelector": "job", "timeoutSeconds": 30}]),
    drain=st.sampled_from([{}, {"enable": True, "force": True}]),
)

pods = st.builds(
    PodView,
    namespace=st.just("w"),
    name=st.text("abc", min_size=1, max_size=3),
    phase=st.sampled_from(["Running", "Pending", "Succeeded", "Failed"]),
    terminating=st.booleans(),
    daemonset=st.booleans(),
    mirror=st.booleans(),
    bare=st.booleans(),
    empty_dir=st.booleans(),
    device_consumer=st.booleans(),
)

records = st.builds(
    NodeRecord,
    since=st.one_of(st.none(), st.floats(NOW - 2000, NOW)),
    cordon=st.sampled_from([None, "rollout", "external"]),
    attempt=st.integers(0, 3),
    target=st.sampled_from([None, *TARGETS]),
    gates=st.sampled_from([None, {}, {"example.com/deploy.telemetry": "true"}]),
)


@st.composite
def clusters(draw: st.DrawFn) -> list[NodeView]:
    count = draw(st.integers(0, 14))
    return [
        NodeView(
            name=f"node-{i:02}",
            state=draw(st.sampled_from([None, *State])),
            record=draw(records),
            unschedulable=draw(st.booleans()),
            ready=draw(st.booleans()),
            skipped=draw(st.booleans()),
            needs_update=draw(st.booleans()),
            pods=draw(st.one_of(st.none(), st.lists(pods, max_size=4).map(tuple))),
            validation=draw(
                st.sampled_from([None, Validated(), Pending("x"), Failed("Broken", "x")])
            ),
        )
        for i in range(count)
    ]


def _plan(views: list[NodeView], policy: UpgradePolicy, paused: bool = False) -> Plan:
    return plan(views, Context(policy, KEYS, TARGETS[0], NOW, paused))


def _starts(p: Plan) -> list[Step]:
    return [s for s in p.steps if s.before is State.REQUIRED and s.after is State.CORDONING]


@settings(max_examples=200)
@given(clusters(), policies, st.booleans())
def test_a_step_never_exceeds_the_budgets(
    views: list[NodeView], policy: UpgradePolicy, paused: bool
) -> None:
    p = _plan(views, policy, paused)
    by_name = {v.name: v for v in views}
    starts = _starts(p)
    in_flight = sum(1 for v in views if v.state in IN_FLIGHT)
    # Nodes the rollout is through with (done and current, failed for this target)
    # are not counted: they would hold a slot forever.
    through = {
        v.name
        for v in views
        if (v.state is State.DONE and not v.needs_update)
        or (v.state is State.FAILED and v.record.target == TARGETS[0])
    }
    unavailable = sum(
        1 for v in views if v.state in IN_FLIGHT or (not v.available and v.name not in through)
    )
    if starts:
        assert in_flight + len(starts) <= policy.max_parallel
        # Starting a node that is already cordoned or NotReady disrupts nothing more,
        # so only starts of available nodes must fit the unavailability budget.
        newly_unavailable = sum(1 for s in starts if by_name[s.node].available)
        if newly_unavailable:
            assert unavailable + newly_unavailable <= policy.max_unavailable_nodes(len(views))
    for step in p.steps:
        view = by_name[step.node]
        # Only a start brings a node into flight, and only a node in flight is
        # cordoned, so every intermediate order of the writes stays in budget.
        if step.after in IN_FLIGHT and view.state not in IN_FLIGHT:
            assert step in starts
        if step.patch is not None and step.patch.unschedulable:
            assert view.state in IN_FLIGHT


@settings(max_examples=200)
@given(clusters(), policies)
def test_the_rollout_never_uncordons_a_node_it_did_not_cordon(
    views: list[NodeView], policy: UpgradePolicy
) -> None:
    by_name = {v.name: v for v in views}
    for step in _plan(views, policy).steps:
        if step.patch is None:
            continue
        if step.patch.unschedulable is False:
            assert by_name[step.node].record.cordon == "rollout"
        if step.patch.unschedulable is True:
            assert step.patch.annotations[KEYS.cordon] == "rollout"


@settings(max_examples=200)
@given(clusters(), policies)
def test_a_node_that_is_down_or_cordoned_by_others_is_never_started(
    views: list[NodeView], policy: UpgradePolicy
) -> None:
    by_name = {v.name: v for v in views}
    for step in _plan(views, policy).steps:
        view = by_name[step.node]
        starts = step.before is State.REQUIRED and step.after is State.CORDONING
        # Nor is a started one carried past the cordon it would take over (a node
        # that no longer needs the change may still back out through uncordoning).
        cordons = step.before is State.CORDONING and step.after in IN_FLIGHT - {State.UNCORDONING}
        if starts or cordons:
            assert view.ready
            assert policy.upgrade_cordoned_nodes or not view.cordoned_by_others


@settings(max_examples=150)
@given(clusters(), policies)
def test_paused_starts_nothing_new(views: list[NodeView], policy: UpgradePolicy) -> None:
    assert _starts(_plan(views, policy, paused=True)) == []


@settings(max_examples=150)
@given(clusters(), policies)
def test_halted_starts_nothing_new(views: list[NodeView], policy: UpgradePolicy) -> None:
    p = _plan(views, policy)
    if policy.halt_on_failure and any(v.state is State.FAILED and not v.skipped for v in views):
        assert p.halted
        assert _starts(p) == []


@settings(max_examples=150)
@given(clusters(), policies, st.booleans())
def test_each_node_takes_at_most_one_step_and_skipped_nodes_none(
    views: list[NodeView], policy: UpgradePolicy, paused: bool
) -> None:
    p = _plan(views, policy, paused)
    names = [s.node for s in p.steps]
    assert len(names) == len(set(names))
    skipped = {v.name for v in views if v.skipped}
    assert not skipped & set(names)
    for step in p.steps:
        if step.patch is not None:
            value = step.patch.labels[KEYS.state]
            assert value is None or State(value) == step.after


@settings(max_examples=150)
@given(clusters(), policies)
def test_a_converged_fleet_needs_no_writes(views: list[NodeView], policy: UpgradePolicy) -> None:
    converged = [
        NodeView(
            name=v.name,
            state=v.state if v.state is State.DONE else None,
            unschedulable=v.unschedulable,
            ready=v.ready,
            skipped=v.skipped,
            record=NodeRecord(target=TARGETS[0], cordon=None, gates=None),
        )
        for v in views
    ]
    assert _plan(converged, policy).steps == ()
