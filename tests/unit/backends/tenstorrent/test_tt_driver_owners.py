"""Overlapping driver policies: one builder per node, the oldest policy's, with no pass needed."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kmodkit.backends import tenstorrent
from kmodkit.backends.tenstorrent import driver_plan, names
from kmodkit.backends.tenstorrent.driver_api import TenstorrentDriverPolicyStatus
from kmodkit.backends.tenstorrent.keys import TT_DRIVER_SKIP_LABEL, TT_PCI_PRESENT_LABEL
from kmodkit.backends.tenstorrent.node_owners import Claim, owners
from kmodkit.backends.tenstorrent.owned_affinity import matches, owned_terms, render
from kmodkit.backends.tenstorrent.selection import NodeLabelSelector
from kmodkit.backends.tenstorrent.status_common import Row, transition_events
from kmodkit.core.contract.backend import ClusterView
from kmodkit.core.nodes import NodeView
from kmodkit.sdk import RolloutKeys
from tests.unit.backends.cached import as_cached

NOW = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
PCI = {TT_PCI_PRESENT_LABEL: "true"}
KEYS = ["pool", "zone", TT_PCI_PRESENT_LABEL, TT_DRIVER_SKIP_LABEL]
VALUES = ["a", "b", "true"]

values = st.lists(st.sampled_from(VALUES), min_size=1, max_size=2, unique=True)
requirement = st.one_of(
    st.fixed_dictionaries(
        {
            "key": st.sampled_from(KEYS),
            "operator": st.sampled_from(["In", "NotIn"]),
            "values": values,
        }
    ),
    st.fixed_dictionaries(
        {"key": st.sampled_from(KEYS), "operator": st.sampled_from(["Exists", "DoesNotExist"])}
    ),
)
selectors = st.builds(
    lambda labels, exprs: NodeLabelSelector.model_validate(
        {"matchLabels": labels, "matchExpressions": exprs}
    ),
    st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=2),
    st.lists(requirement, max_size=3),
)
label_sets = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=4)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(selectors, min_size=1, max_size=4),
    st.lists(label_sets, min_size=1, max_size=8),
    st.booleans(),
)
def test_each_builder_affinity_matches_exactly_the_nodes_its_policy_owns(
    policy_selectors: list[NodeLabelSelector],
    node_labels: list[dict[str, str]],
    require_pci: bool,
) -> None:
    """The DaemonSet controller, reading the affinity alone, puts a policy's builder on a node
    exactly when ``node_owners`` gives the node to that policy (and it is not skipped)."""
    ordered = [
        Claim(f"p{i}", f"2026-11-0{i + 1}T00:00:00Z", s) for i, s in enumerate(policy_selectors)
    ]
    nodes = [
        NodeView(name=f"n{i}", labels=labels, ready=True) for i, labels in enumerate(node_labels)
    ]
    owner = owners(ordered, nodes, require_pci)
    for index, claim in enumerate(ordered):
        terms = owned_terms(
            claim.selector,
            [c.selector for c in ordered[:index]],
            TT_DRIVER_SKIP_LABEL,
            require_pci,
            cap=10_000,
        )
        assert terms is not None
        rendered = render(terms)
        for node in nodes:
            expected = owner.get(node.name) == claim.name and (
                node.labels.get(TT_DRIVER_SKIP_LABEL) != "true"
            )
            assert matches(rendered, node.name, node.labels) == expected, (claim.name, node)


def _selector(**labels: str) -> NodeLabelSelector:
    return NodeLabelSelector(match_labels=labels or None)


def test_disjoint_selectors_leave_the_affinity_as_the_selector_alone() -> None:
    alone = owned_terms(_selector(pool="a"), [], TT_DRIVER_SKIP_LABEL, True)
    beside = owned_terms(_selector(pool="a"), [_selector(pool="b")], TT_DRIVER_SKIP_LABEL, True)
    assert alone is not None and beside == alone and len(alone) == 1
    # Covered entirely by an older policy: an affinity that matches no node, still valid.
    (never,) = render(
        owned_terms(_selector(pool="a"), [_selector()], TT_DRIVER_SKIP_LABEL, True) or []
    )
    assert [e["operator"] for e in never["matchExpressions"]] == ["Exists", "DoesNotExist"]


def test_an_overlap_past_the_cap_is_reported_not_expressed() -> None:
    older = [
        NodeLabelSelector.model_validate({"matchLabels": {f"k{i}": "v", f"j{i}": "w"}})
        for i in range(7)
    ]
    assert owned_terms(_selector(), older, TT_DRIVER_SKIP_LABEL, True) is None  # 2**7 > 64


def _node(name: str, **labels: str) -> NodeView:
    return NodeView(name=name, labels={**PCI, **labels}, ready=True)


def _ttdp(name: str, created: str, **match: str) -> dict[str, Any]:
    return {
        "apiVersion": "driver.tenstorrent.com/v1alpha1",
        "kind": "TenstorrentDriverPolicy",
        "metadata": {
            "name": name,
            "generation": 1,
            "uid": f"uid-{name}",
            "creationTimestamp": created,
        },
        "spec": {"version": "2.9.0", "nodeAffinity": {"matchLabels": match}},
    }


OLDER = _ttdp("older", "2026-11-01T00:00:00Z", pool="tt")
YOUNGER = _ttdp("younger", "2026-11-02T00:00:00Z")


def _ds(plan: Any) -> dict[str, Any]:
    return next(o for o in plan.objects if o["kind"] == "DaemonSet")


def _terms(ds: dict[str, Any]) -> list[dict[str, Any]]:
    return ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]


def _builder(policy: str, node: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"ttdrv-{policy}-{node}",
            "namespace": "ops",
            "labels": {"driver.tenstorrent.com/cr": policy},
        },
        "spec": {"nodeName": node},
    }


def _view(
    nodes: list[NodeView],
    policies: list[dict[str, Any]],
    sets: list[dict[str, Any]] = (),  # type: ignore[assignment]
    pods: list[dict[str, Any]] = (),  # type: ignore[assignment]
    owned: list[dict[str, Any]] = (),  # type: ignore[assignment]
) -> ClusterView:
    return ClusterView(
        nodes=nodes,
        api_groups=frozenset(),
        operator_namespace="ops",
        watched=as_cached(
            tenstorrent.backend,
            {
                driver_plan.POLICIES: policies,
                driver_plan.BUILDER_SETS: sets,
                driver_plan.BUILDERS: pods,
            },
        ),
        owned=list(owned),
    )


def _placed(plan: Any, node: NodeView) -> bool:
    return matches(_terms(_ds(plan)), node.name, node.labels)


def test_the_younger_driver_policy_leaves_a_shared_node_to_the_older_and_reports_it() -> None:
    shared, own = _node("shared", pool="tt"), _node("own", pool="other")
    view = _view([shared, own], [OLDER, YOUNGER])
    winner = driver_plan.plan_at(OLDER, view, NOW)
    loser = driver_plan.plan_at(YOUNGER, view, NOW)
    assert _placed(winner, shared) and not _placed(loser, shared)
    assert _placed(loser, own) and not _placed(winner, own)
    assert loser.rollout is not None and loser.rollout.nodes == ["own"]
    entry = next(n for n in loser.status["nodes"] if n["name"] == "shared")
    assert (entry["state"], entry["reason"]) == ("Conflict", "NodeConflict")
    assert "older" in entry["message"]
    assert loser.status["summary"]["conflicts"] == 1
    assert loser.status["summary"]["matched"] == 2
    TenstorrentDriverPolicyStatus.model_validate(loser.status)  # the CRD admits the state
    # Already in conflict at the first pass: announced once, then not again.
    assert [(e.node, e.reason, e.warning) for e in loser.events] == [
        ("shared", "NodeConflict", True)
    ]
    again = driver_plan.plan_at({**YOUNGER, "status": loser.status}, view, NOW)
    assert again.events == []
    # Who else covers the node changes where the builder goes, never the template hash (no
    # builder restart, no reload for it).
    alone = driver_plan.plan_at(YOUNGER, _view([shared, own], [YOUNGER]), NOW)
    hash_key = "driver.tenstorrent.com/template-hash"
    assert (
        _ds(alone)["metadata"]["annotations"][hash_key]
        == (_ds(loser)["metadata"]["annotations"][hash_key])
    )
    assert _placed(alone, shared)


def test_the_hooks_restart_no_builder_on_a_node_another_policy_owns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    restarted: list[Any] = []
    monkeypatch.setattr(driver_plan.DriverHooks, "restart", lambda _, pods: restarted.extend(pods))
    # The shared node sorts first: with a budget of one restart it would be the one restarted.
    shared, own = _node("a-shared", pool="tt"), _node("own", pool="other")
    stale = [_builder("younger", "a-shared"), _builder("younger", "own")]
    for pod in stale:
        pod["metadata"]["annotations"] = {"driver.tenstorrent.com/template-hash": "stale"}
        pod["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
    driver_plan.hooks(YOUNGER, _view([shared, own], [OLDER, YOUNGER], pods=stale), api=None)
    assert [p.node for p in restarted] == ["own"]


def test_a_new_owner_takes_a_node_only_once_the_old_owners_builder_has_left() -> None:
    """The older policy is gone: the younger owns the node now, but its DaemonSet takes the
    node only when the older's DaemonSet no longer places a builder there and its pod left."""
    shared = _node("shared", pool="tt")
    before = driver_plan.plan_at(OLDER, _view([shared], [OLDER, YOUNGER]), NOW)
    old_set = {**_ds(before), "metadata": {**_ds(before)["metadata"]}}
    mine = _ds(driver_plan.plan_at(YOUNGER, _view([shared], [OLDER, YOUNGER]), NOW))

    held = driver_plan.plan_at(YOUNGER, _view([shared], [YOUNGER], [old_set], owned=[mine]), NOW)
    assert not _placed(held, shared)
    entry = held.status["nodes"][0]
    assert (entry["state"], entry["reason"]) == ("Pending", "WaitingForHandover")
    assert "older" in entry["message"]
    assert held.rollout is not None and held.rollout.nodes == []
    # A node this policy's rollout already works on stays in it, held or not.
    state = RolloutKeys.for_policy(names.driver_policy_id("younger")).state
    working = _node("shared", pool="tt", **{state: "draining"})
    in_flight = driver_plan.plan_at(
        YOUNGER, _view([working], [YOUNGER], [old_set], owned=[mine]), NOW
    )
    assert not _placed(in_flight, working)
    assert in_flight.rollout is not None and in_flight.rollout.nodes == ["shared"]

    pod_left = _view([shared], [YOUNGER], pods=[_builder("older", "shared")], owned=[mine])
    assert not _placed(driver_plan.plan_at(YOUNGER, pod_left, NOW), shared)

    free = driver_plan.plan_at(YOUNGER, _view([shared], [YOUNGER], owned=[mine]), NOW)
    assert _placed(free, shared)
    assert free.rollout is not None and free.rollout.nodes == ["shared"]


def test_the_old_owner_lets_a_node_go_at_once_while_the_new_owner_waits_for_it() -> None:
    """The older policy's selector grows onto a node the younger runs a builder on: the
    younger's DaemonSet drops the node in its next pass whatever else is seen, and the older's
    takes it only after that."""
    shared = _node("shared", pool="tt")
    narrow = _ttdp("older", "2026-11-01T00:00:00Z", pool="none")
    younger_before = _ds(driver_plan.plan_at(YOUNGER, _view([shared], [narrow, YOUNGER]), NOW))
    older_before = _ds(driver_plan.plan_at(narrow, _view([shared], [narrow, YOUNGER]), NOW))

    grown = _view(
        [shared],
        [OLDER, YOUNGER],
        sets=[younger_before, older_before],
        pods=[_builder("younger", "shared")],
    )
    loser = driver_plan.plan_at(
        YOUNGER, ClusterView(**{**grown.__dict__, "owned": [younger_before]}), NOW
    )
    assert not _placed(loser, shared)
    winner = driver_plan.plan_at(
        OLDER, ClusterView(**{**grown.__dict__, "owned": [older_before]}), NOW
    )
    assert not _placed(winner, shared)
    assert winner.status["nodes"][0]["reason"] == "WaitingForHandover"

    after = _view([shared], [OLDER, YOUNGER], sets=[_ds(loser)], owned=[older_before])
    assert _placed(driver_plan.plan_at(OLDER, after, NOW), shared)


def test_a_node_already_placed_is_never_held_back() -> None:
    """A builder already running for its owner stays, whatever pod of another policy lingers
    on the node (holding would delete the owner's builder)."""
    shared = _node("shared", pool="tt")
    mine = _ds(driver_plan.plan_at(OLDER, _view([shared], [OLDER]), NOW))
    view = _view([shared], [OLDER], pods=[_builder("younger", "shared")], owned=[mine])
    assert _placed(driver_plan.plan_at(OLDER, view, NOW), shared)


def test_too_complex_an_overlap_is_degraded_and_kept_off_by_node_name() -> None:
    older = _ttdp("older", "2026-11-01T00:00:00Z")
    older["spec"]["nodeAffinity"] = {"matchLabels": {f"k{i}": "v" for i in range(3)}}
    many = [older] + [
        {
            **_ttdp(f"o{i}", f"2026-11-01T00:0{i}:01Z"),
            "spec": {
                "version": "2.9.0",
                "nodeAffinity": {"matchLabels": {f"a{i}": "v", f"b{i}": "v", f"c{i}": "v"}},
            },
        }
        for i in range(4)
    ]
    taken = _node("taken", **{f"k{i}": "v" for i in range(3)})
    free = _node("free")
    plan = driver_plan.plan_at(YOUNGER, _view([taken, free], [*many, YOUNGER]), NOW)
    degraded = next(c for c in plan.status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "OverlapTooComplex")
    assert "older" in degraded["message"] and "disjoint" in degraded["message"]
    assert not _placed(plan, taken) and _placed(plan, free)


def test_a_new_conflict_is_not_announced_when_the_last_status_left_nodes_out() -> None:
    row = Row("n", "Conflict", "NodeConflict", "owned elsewhere")
    observed = {"NodeConflict": True}
    announce = frozenset({"NodeConflict"})
    assert transition_events([row], {"nodes": []}, observed, announce_new=announce)
    assert not transition_events(
        [row], {"nodes": [], "nodesOmitted": 3}, observed, announce_new=announce
    )
    assert not transition_events([row], {"nodes": []}, observed)
